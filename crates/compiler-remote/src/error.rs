use std::io;
use std::path::PathBuf;

use chunker::Sha256Digest;

/// Which end of an rsync transfer a problem is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Side {
    #[error("this machine")]
    Local,
    #[error("the compiler")]
    Remote,
}

/// Why a compile's source files cannot be staged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SourceProblem {
    /// No source file was given at all.
    #[error("no source files given; pass the model's ONNX file(s)")]
    NoneGiven,
    /// The path is not a regular file, or the file is empty.
    #[error("not a non-empty file")]
    NotANonEmptyFile,
    /// Two sources have the same file name, so staging one would overwrite the other.
    #[error("two sources share this file name; staging would overwrite one")]
    DuplicateName,
}

/// Why the tinygrad pin cannot be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinProblem {
    /// Neither `--tinygrad-commit` nor `--openpilot` was given.
    #[error(
        "no tinygrad pin: pass --tinygrad-commit SHA or --openpilot DIR (whose \
         tinygrad_repo/TINYGRAD_COMMIT is the pin)"
    )]
    NotGiven,
    /// The openpilot tree has no `tinygrad_repo/TINYGRAD_COMMIT`.
    #[error(
        "no tinygrad marker in this tree; pass --tinygrad-commit SHA or run \
         `release-cli tinygrad bump`"
    )]
    MarkerMissing,
    /// The marker does not hold a full 40-hex commit.
    #[error("the tinygrad marker holds {found:?}, not a commit: {reason}")]
    NotACommit { found: String, reason: String },
}

/// Everything that can go wrong talking to the compiler comma.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "refusing to build on {destination}: the only supported compiler is {supported}; \
         pass --allow-other-compiler only if the release owner approved {destination}"
    )]
    OtherCompiler {
        destination: String,
        supported: &'static str,
    },

    #[error("invalid --remote {value:?}: {reason}; use [USER@]HOST, e.g. comma@192.168.3.110")]
    InvalidDestination { value: String, reason: &'static str },

    #[error("invalid remote path {value:?}: {reason}")]
    InvalidRemotePath { value: String, reason: &'static str },

    /// The compiler's host key is not in known_hosts (or does not match it). The key is never
    /// trusted on first use: the whole fleet runs what that machine builds.
    #[error(
        "refusing to connect to {destination}: its host key is not known or does not match \
         known_hosts{detail}; the compiler's key is never accepted on first use. First connect: \
         read the key's fingerprint on the comma (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), \
         then run `ssh {destination}` once by hand and accept only that fingerprint, or pin it \
         in a known_hosts file named by --ssh-config (docs/release.md, \"First connect\")"
    )]
    HostKeyNotKnown { destination: String, detail: String },

    /// ssh's configuration for the compiler could not be read (`ssh -G`, a dry run's host-key
    /// check), or ssh-keygen could not run.
    #[error("could not read ssh's configuration for {destination}: {detail}")]
    SshConfig { destination: String, detail: String },

    #[error(
        "could not open an SSH session to {destination}: {source}{detail}; check that the comma \
         is on, reachable, and that `ssh {destination}` works without a password"
    )]
    Connect {
        destination: String,
        #[source]
        source: openssh::Error,
        detail: String,
    },

    #[error("SSH to {destination} failed while running `{command}`: {source}")]
    Ssh {
        destination: String,
        command: String,
        #[source]
        source: openssh::Error,
    },

    #[error("`{command}` on {destination} exited with {status}: {stderr}")]
    RemoteCommand {
        destination: String,
        command: String,
        status: String,
        stderr: String,
    },

    #[error(
        "rsync is missing on {side}{host}: {detail}; install rsync 3.x there (apt-get install rsync, or brew install rsync on a Mac)"
    )]
    RsyncMissing {
        side: Side,
        host: String,
        detail: String,
    },

    #[error(
        "rsync on {side}{host} is not compatible: {version:?}; {detail}. Install rsync 3.x \
         (on a Mac: brew install rsync, then put it first on PATH or pass --rsync)"
    )]
    RsyncIncompatible {
        side: Side,
        host: String,
        version: String,
        detail: String,
    },

    #[error("rsync {what} failed ({status}): {stderr}")]
    Rsync {
        what: String,
        status: String,
        stderr: String,
    },

    #[error(
        "{destination}:{path} is missing: the compiler has no tinygrad marker; run \
         `release-cli sync` first"
    )]
    MarkerMissing { destination: String, path: String },

    /// The compiler's record of its tinygrad (its tree's sync file) names no commit.
    #[error(
        "{destination}:{path} records no tinygrad commit ({problem}); refusing to build. Run \
         `release-cli sync` with the right tree"
    )]
    MarkerUnreadable {
        destination: String,
        path: String,
        problem: String,
    },

    #[error(
        "tinygrad marker mismatch on {destination}:{path}: found {found:?}, expected {expected}; \
         refusing to build. Run `release-cli sync` with the right tree, or fix the pin"
    )]
    MarkerMismatch {
        destination: String,
        path: String,
        found: String,
        expected: String,
    },

    /// The tinygrad pin cannot be had: no `--tinygrad-commit` and no `--openpilot`, no marker
    /// in the tree, or a marker that is not a commit. Only the pin: other problems with local
    /// inputs have their own variants ([`Error::TreeIncomplete`], [`Error::Source`]).
    #[error("{path}: {problem}")]
    Pin { path: PathBuf, problem: PinProblem },

    /// A part of the openpilot tree that `sync` transfers is not there.
    #[error(
        "{path}: missing from the openpilot tree; sync needs tinygrad_repo/, selfdrive/modeld/, \
         scripts/model_compiler.py and models (is --openpilot the right directory?)"
    )]
    TreeIncomplete { path: PathBuf },

    /// The local tree is not what its last sync sent to this compiler (`compile`, `rebuild`).
    #[error(
        "{openpilot}: not what the compiler {destination}:{remote_root} has: {why}; nothing was \
         sent or run. next: `release-cli sync --openpilot {openpilot} --remote {destination} \
         --remote-root {remote_root}` (add --allow-other-compiler/--ssh-config as you use them), \
         then run this again"
    )]
    NotSynced {
        openpilot: PathBuf,
        destination: String,
        remote_root: String,
        why: Box<crate::unsynced::Unsynced>,
    },

    /// The sync record in the tree cannot be read as one.
    #[error("{path}: not a sync record ({problem}); remove it and run `release-cli sync` again")]
    SyncRecord { path: PathBuf, problem: String },

    /// The files sync sends changed while it was sending them: what the compiler has is not
    /// known, so no record was written.
    #[error(
        "{openpilot}: the tree changed while it was being synced; nothing was recorded. next: \
         finish your edits and run `release-cli sync` again"
    )]
    TreeChangedDuringSync { openpilot: PathBuf },

    /// A model source given to `compile` cannot be staged.
    #[error("{path}: {problem}")]
    Source {
        path: PathBuf,
        problem: SourceProblem,
    },

    /// A local file or directory operation failed. These come from `fs-err`, whose message
    /// names the operation and the path ("failed to open file `/x/y`: …") and keeps the
    /// `io::ErrorKind`.
    #[error(transparent)]
    Io(#[from] io::Error),

    /// Reading a remote command's output through the SSH session failed (a stream, not a file).
    #[error("reading the output of `{command}` from {destination} failed: {source}")]
    Stream {
        destination: String,
        command: String,
        #[source]
        source: io::Error,
    },

    #[error("could not start the async runtime for SSH: {0}")]
    Runtime(#[source] io::Error),

    #[error("compile of {model} failed on the compiler ({status}); see {log}")]
    CompileFailed {
        model: String,
        status: String,
        log: PathBuf,
    },

    #[error("the compiler produced no {expected} output for {model} in {remote_dir}; see {log}")]
    MissingOutputs {
        model: String,
        expected: String,
        remote_dir: String,
        log: PathBuf,
    },

    #[error("the compiler returned invalid output for {model}: {detail}; see {log}")]
    InvalidOutputs {
        model: String,
        detail: String,
        log: PathBuf,
    },

    #[error(
        "SHA-256 mismatch for {model}: the compiler's .sha256 says {expected}, the fetched \
         artifact is {actual}; see {log}"
    )]
    DigestMismatch {
        model: String,
        expected: Sha256Digest,
        actual: Sha256Digest,
        log: PathBuf,
    },

    #[error(
        "the DM build is incomplete: missing {missing:?}; all four files must be replaced \
         together, nothing was written to {out}; see {log}"
    )]
    DmIncomplete {
        missing: Vec<String>,
        out: PathBuf,
        log: PathBuf,
    },

    #[error("the validator for {model} failed: {detail}; see {log}")]
    Validator {
        model: String,
        detail: String,
        log: PathBuf,
    },

    #[error(transparent)]
    Chunker(#[from] chunker::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
