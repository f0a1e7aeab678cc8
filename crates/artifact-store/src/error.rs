use std::io;

use cli_support::NextStep;
use std::path::PathBuf;

/// Everything that can go wrong while talking to a store, publishing, reusing or serving.
/// Every message names the store, path or URL involved and, where there is one, what to do next.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory operation failed. These come from `fs_err`, whose message names the
    /// operation and the path (`failed to open file `/x/y`: No such file or directory`); the
    /// `kind()` is the operating system's.
    #[error(transparent)]
    Io(#[from] io::Error),

    /// Reading a store's stream failed (an HTTP body, a CLI's pipe, a file behind a store):
    /// `what` names the store and the path in it.
    #[error("reading {what} failed: {source}")]
    StoreRead {
        /// The store and the path in it.
        what: String,
        /// The read error.
        #[source]
        source: io::Error,
    },

    /// A child process (`git`) could not be started or waited for.
    #[error("could not run {program}: {source}")]
    Child {
        /// The program.
        program: String,
        /// Why it could not run.
        #[source]
        source: io::Error,
    },

    /// `serve`'s listening socket or accept thread could not be set up.
    #[error("serve: could not {what}: {source}")]
    Serve {
        /// What was being set up (`bind the listen address`, `start the accept thread`, ...).
        what: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },

    /// A string that is not a valid store path (absolute, `..`, empty segments, control
    /// characters).
    #[error("invalid store path {path:?}: {reason}")]
    InvalidPath {
        /// The string.
        path: String,
        /// Why it is refused.
        reason: String,
    },

    /// A store name that does not parse, or a store that cannot be opened as named; the message
    /// lists the accepted forms.
    #[error(
        "invalid store {spec:?}: {reason}; accepted forms: {}",
        crate::refusal::ACCEPTED_STORE_FORMS
    )]
    InvalidStore {
        /// The store name as given.
        spec: String,
        /// Why it is refused.
        reason: String,
    },

    /// The file is not in the store: a definite answer (see [`Error::is_not_found`]).
    #[error("{store}: {path} not found")]
    NotFound {
        /// The store, as described.
        store: String,
        /// The store path.
        path: String,
    },

    /// The store cannot hold this path or operation (a GitHub branch holds only the branch layout;
    /// a Hub repository is read-only).
    #[error("{store}: {path} cannot be stored here: {reason}")]
    Unsupported {
        /// The store, as described.
        store: String,
        /// The store path.
        path: String,
        /// Why not.
        reason: String,
    },

    /// An HTTP request could not be made or its body not read (connect, TLS, timeout, reset).
    #[error("HTTP request {method} {url} failed: {message}")]
    Http {
        /// The method (`GET`, `HEAD`, ...).
        method: &'static str,
        /// The URL.
        url: String,
        /// What failed.
        message: String,
    },

    /// An HTTP request answered with a status that is not success.
    #[error("HTTP {method} {url} answered {status}{hint}")]
    HttpStatus {
        /// The method.
        method: &'static str,
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
        /// A next step for the status (for 401/403: the token), or empty.
        hint: &'static str,
    },

    /// An HTTP answer that is not what the API promises (a listing that is not JSON, a pagination
    /// link leaving the API, ...).
    #[error("unexpected answer from {url}: {reason}")]
    BadResponse {
        /// The URL.
        url: String,
        /// What is wrong with the answer.
        reason: String,
    },

    /// The `hf` CLI could not be started; the message says how to install it or point at it.
    #[error(
        "could not run the Hugging Face CLI {program:?}: {source}; install it (pip install huggingface_hub==2.4.0 hf-xet==1.8.0, the versions tested) or pass --hf-cli PATH / set HF_CLI"
    )]
    HfCliMissing {
        /// The program tried.
        program: String,
        /// Why it could not be started.
        #[source]
        source: io::Error,
    },

    /// The `hf` CLI ran and failed.
    #[error("`{command}` failed ({status}): {kind}: {stderr}")]
    HfCli {
        /// The command line, with any token redacted.
        command: String,
        /// Its exit status.
        status: String,
        /// What the failure means, read from the CLI's own words.
        kind: HfFailure,
        /// The CLI's error lines (no traceback), with any token redacted.
        stderr: String,
    },

    /// The GitHub checkout cannot be published from (dirty, another branch, not in sync with its
    /// origin, locked by another publish, ...); nothing was written.
    #[error("git checkout {checkout}: {reason}")]
    GitRefused {
        /// The checkout.
        checkout: PathBuf,
        /// Why.
        reason: String,
    },

    /// `git push` was rejected (the branch moved, protection, no permission); the commit stays
    /// in the checkout.
    #[error("git checkout {checkout}: push to {remote}/{branch} was rejected: {stderr}")]
    PushRejected {
        /// The checkout.
        checkout: PathBuf,
        /// The remote pushed to.
        remote: String,
        /// The branch pushed.
        branch: String,
        /// git's error output.
        stderr: String,
    },

    /// A git command failed.
    #[error("`git {args}` in {checkout} failed ({status}): {stderr}")]
    Git {
        /// The checkout it ran in.
        checkout: PathBuf,
        /// Its arguments.
        args: String,
        /// Its exit status.
        status: String,
        /// git's error output.
        stderr: String,
    },

    /// A manifest could not be parsed, or a value is invalid.
    #[error("{0}")]
    Manifest(#[from] manifest::Error),

    /// A chunk set could not be read, split or verified.
    #[error("{0}")]
    Chunk(#[from] chunker::Error),

    /// The release guard refused to replace the store's live manifest: it lists every unexpected
    /// change.
    #[error("{store}: {refusal}")]
    Guard {
        /// The store.
        store: String,
        /// Every unexpected change.
        #[source]
        refusal: manifest::GuardRefusal,
    },

    /// Writing a file failed on every attempt of the [`crate::retry::RetryPolicy`].
    #[error("{store}: upload of {path} failed after {attempts} attempts: {last}")]
    UploadFailed {
        /// The store.
        store: String,
        /// The store path.
        path: String,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        last: Box<Error>,
    },

    /// Publish refused before writing the manifest: what was checked and what is wrong.
    #[error("refusing to publish to {store}:{}", problem_lines(problems))]
    Incomplete {
        /// The store.
        store: String,
        /// Every problem found, per model.
        problems: Vec<crate::refusal::StoreProblem>,
    },

    /// The manifest's tinygrad pin is not its generation's, or the pin table refuses it.
    #[error("publish refused: {refusal}")]
    Pin {
        /// Why.
        #[source]
        refusal: manifest::PinRefusal,
    },

    /// The new generation departs from the previous one's live manifest in a way the release
    /// contract does not allow (a version or GPU flag changed, a model added or dropped without
    /// being named, an artifact carried over).
    #[error(
        "refusing to publish {generation} to {store}: it departs from {previous} ({path}):\n{refusal}"
    )]
    GenerationGuard {
        /// The store.
        store: String,
        /// The generation published.
        generation: manifest::Generation,
        /// The generation before it, whose live manifest was compared.
        previous: manifest::Generation,
        /// The previous manifest's store path.
        path: String,
        /// Every departure.
        #[source]
        refusal: manifest::GenerationRefusal,
    },

    /// GitHub would be published without the Hub and the Hub's manifest, which decides whether
    /// that is allowed, cannot be read (a network error, an unreadable `--hub`).
    #[error(
        "cannot tell whether GitHub would be ahead of the Hub: reading {hub} {path} failed: {source}; nothing was written"
    )]
    HubUnreadable {
        /// The Hub store.
        hub: String,
        /// The manifest's store path on it.
        path: String,
        /// Why it could not be read.
        #[source]
        source: Box<Error>,
    },

    /// Publish or signing refused before anything was written; match on the [`Refusal`].
    #[error("{0}")]
    Refused(Refusal),

    /// A signing or verifying key that cannot be used (never shows the key itself).
    #[error("key {}: {message}", path.display())]
    Signing {
        /// The key file.
        path: PathBuf,
        /// What is wrong (never the key itself).
        message: String,
    },

    /// A public key file that cannot be read (missing, not a regular file, too large) or holds
    /// no key.
    #[error("key {}: {message}", path.display())]
    PublicKeyFile {
        /// The public key file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },

    /// A secret key that cannot sign; the [`crate::signing::KeyProblem`] is the cause and the
    /// next step (never the key itself).
    #[error("key {}: {problem}", path.display())]
    Key {
        /// The key file.
        path: PathBuf,
        /// Why it cannot sign.
        problem: crate::refusal::KeyProblem,
    },

    /// A reuse refused before anything was written; match on the [`crate::reuse::ReuseRefusal`].
    #[error("reuse refused: {0}")]
    ReuseRefused(crate::refusal::ReuseRefusal),
}

/// Why a publish (or its signing step) was refused before it wrote anything. `Display` names
/// the path, store or value involved and the next step.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A directory in the artifacts directory whose name is not a model ID.
    #[error("{}: directory name is not a model ID ({source}); the artifacts directory holds one <id>/ per model", path.display())]
    NotAModelId {
        /// The directory.
        path: PathBuf,
        /// Why its name is not a model ID.
        source: manifest::Error,
    },
    /// A model directory in the artifacts directory without an entry in the new manifest.
    #[error("{}: model {model} has no entry in the new manifest; add the entry or remove the directory", path.display())]
    NoManifestEntry {
        /// The model directory.
        path: PathBuf,
        /// The model it is named for.
        model: manifest::ModelId,
    },
    /// Artifact files lying directly in the artifacts directory (a flat `chunk split` output).
    #[error("{}", loose_files(dir, loose))]
    LooseFiles {
        /// The artifacts directory.
        dir: PathBuf,
        /// The loose file names.
        loose: Vec<String>,
    },
    /// A model to upload whose manifest entry has no artifact fields.
    #[error(
        "model {model}: the manifest entry has no artifact_size/artifact_sha256/artifact_chunk_count; fill them in (release-cli chunk verify prints them)"
    )]
    NoArtifactFields {
        /// The model.
        model: manifest::ModelId,
    },
    /// A model to upload whose entry says one plain file (`artifact_chunk_count` 0).
    #[error(
        "model {model}: artifact_chunk_count is 0 (one plain file); release builds are published as chunk sets"
    )]
    PlainFileCount {
        /// The model.
        model: manifest::ModelId,
    },
    /// A model to upload whose local artifact is not a chunk set.
    #[error("{}: found a {form} artifact; publish needs a chunk set (release-cli chunk split)", path.display())]
    NotAChunkSet {
        /// The local artifact.
        path: PathBuf,
        /// The form found instead (`plain`, `legacy`).
        form: &'static str,
    },
    /// The previous generation's live manifest, which the generation guard needs, does not parse.
    #[error(
        "{store}: the previous generation's manifest {path} does not parse ({source}); the new generation is checked against it, so fix it first"
    )]
    PreviousUnparsable {
        /// The store.
        store: String,
        /// The previous generation's manifest path.
        path: manifest::StorePath,
        /// Why it does not parse.
        source: manifest::Error,
    },
    /// The live manifest to be replaced does not parse.
    #[error(
        "{store}: the live manifest {path} does not parse ({source}); fix it by hand before publishing over it"
    )]
    LiveUnparsable {
        /// The store.
        store: String,
        /// The live manifest's path.
        path: manifest::StorePath,
        /// Why it does not parse.
        source: manifest::Error,
    },
    /// A Hugging Face store given after a GitHub one.
    #[error(
        "store order: {hf} comes after {github}; publish to Hugging Face first and GitHub second (give the hf:// --to before the github: one)"
    )]
    StoreOrder {
        /// The Hugging Face store.
        hf: String,
        /// The GitHub store before it.
        github: String,
    },
    /// GitHub without the Hub, and the Hub does not serve this manifest.
    #[error("GitHub would be ahead of the Hub: {hub} {} {path}, and devices try the Hub first; next: publish to the Hub first (--to hf://buckets/NS/NAME before the github: store), or pass --github-only \"REASON\" (written into the publish record)", if *hub_has_one { "holds another" } else { "holds no" })]
    GithubAheadOfHub {
        /// The Hub store.
        hub: String,
        /// The manifest's store path.
        path: String,
        /// Whether the Hub serves a manifest there at all (another one than this).
        hub_has_one: bool,
    },
    /// `--github-only` with an empty reason.
    #[error(
        "--github-only needs a reason, e.g. --github-only \"Hub outage, republished there later\"; it is written into the publish record"
    )]
    GithubOnlyNoReason,
    /// The manifest's own `generation` is not `--generation`.
    #[error("the manifest says generation {manifest} but --generation is {flag}; fix one of them")]
    GenerationMismatch {
        /// The manifest's `generation`.
        manifest: manifest::Generation,
        /// The `--generation` given.
        flag: manifest::Generation,
    },
    /// Signing was asked for with no key.
    #[error("no signing key given")]
    NoSigningKey,
    /// A live signature none of the signing keys verifies hides its release number.
    #[error(
        "{store}: the live signature does not verify with the signing key(s) (its comment says {comment:?}); if it was made with another key (a rotation), check it with `release-cli manifest verify --key OLD.pub`, then pass --release with a number above its release"
    )]
    LiveSignatureUnverified {
        /// The store.
        store: String,
        /// The signature's trusted comment, unverified.
        comment: String,
    },
    /// An unsigned publish to a store that holds a signature for the generation: the old
    /// signature would stay beside the new manifest and every device with keys would refuse it.
    #[error(
        "{store}: holds {path}, so this generation is signed; publishing without --sign-key would leave that signature beside the new manifest and every device with trusted keys would refuse the generation. Nothing was uploaded."
    )]
    SignedStore {
        /// The store.
        store: String,
        /// The signature file's path.
        path: manifest::StorePath,
    },
    /// Signing a manifest some of whose downloadable artifacts lack a size, SHA-256 or chunk
    /// count: the signature would not cover their bytes.
    #[error("{}", uncovered_text(manifest, uncovered))]
    Uncovered {
        /// The manifest, as named in messages.
        manifest: String,
        /// Each artifact the signature would not cover, with the missing fields.
        uncovered: Vec<manifest::signature::Uncovered>,
    },
}

/// [`Refusal::LooseFiles`]: names the files and the layout publish expects, with the command
/// that fixes it.
fn loose_files(dir: &std::path::Path, loose: &[String]) -> String {
    let suffix = manifest::layout::ARTIFACT_SUFFIX;
    let shown: Vec<&str> = loose.iter().take(5).map(String::as_str).collect();
    let more = if loose.len() > shown.len() {
        format!(" and {} more", loose.len() - shown.len())
    } else {
        String::new()
    };
    format!(
        "{}: the artifacts directory holds one <id>/ directory per model (<id>/<id>{suffix}.chunkNNofMM and .chunkmanifest), not loose files; found {}{more} at its top level, nothing was published",
        dir.display(),
        shown.join(", ")
    )
}

/// [`Refusal::Uncovered`]: each artifact the signature would not cover, with its fix.
fn uncovered_text(manifest: &str, uncovered: &[manifest::signature::Uncovered]) -> String {
    let each: String = uncovered
        .iter()
        .map(|u| format!("\n  {u}\n    next: {}", u.fix_command(manifest)))
        .collect();
    format!(
        "{manifest}: not signed: a signature covers only what the manifest states, and {} \
         downloadable artifact(s) lack a size, SHA-256 or chunk count (a device with keys would \
         have to trust the store for them):{each}\n(DIR is the directory holding that artifact's \
         chunk set, e.g. ready/<id>/); nothing was written",
        uncovered.len()
    )
}

/// [`Refusal::LooseFiles`]' next step: the commands that move each model's files into its
/// `<id>/` directory.
fn loose_files_fix(dir: &std::path::Path, loose: &[String]) -> String {
    let suffix = manifest::layout::ARTIFACT_SUFFIX;
    let ids: std::collections::BTreeSet<&str> = loose
        .iter()
        .filter_map(|n| n.split_once(suffix).map(|(id, _)| id))
        .filter(|id| id.parse::<manifest::ModelId>().is_ok())
        .collect();
    if ids.is_empty() {
        "move each model's files into <DIR>/<id>/".to_string()
    } else {
        ids.iter()
            .map(|id| {
                let d = dir.display();
                format!("mkdir -p {d}/{id} && mv {d}/{id}{suffix}* {d}/{id}/")
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// What a failed `hf` CLI call means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HfFailure {
    #[error("bucket not found")]
    /// The bucket (or repository) does not exist.
    BucketMissing,
    #[error("the Hub refused the token")]
    /// The token was refused (401/403).
    AuthRefused,
    #[error("the Hub refused part of the change")]
    /// The Hub refused some operations of a batch.
    BatchFailed,
    #[error("the CLI asked for confirmation")]
    /// The CLI asked for a confirmation it could not get.
    ConfirmationRequired,
    #[error("source not found")]
    /// The source of a copy is not there.
    SourceMissing,
    #[error("error")]
    /// Any other failure.
    Other,
}

impl HfFailure {
    /// Whether trying again cannot help.
    pub fn is_permanent(self) -> bool {
        !matches!(self, HfFailure::Other | HfFailure::BatchFailed)
    }

    /// What to do about this failure, as one sentence for the user.
    pub fn next_step(self) -> &'static str {
        match self {
            HfFailure::BucketMissing => {
                "create the bucket first (`hf buckets create NS/NAME`), or check the name and HF_ENDPOINT"
            }
            HfFailure::AuthRefused => {
                "set HF_TOKEN to a token with write access to this bucket (or run `hf auth login`)"
            }
            HfFailure::BatchFailed => {
                "the Hub refused the change named above; run the command again, and check the path if it persists"
            }
            HfFailure::ConfirmationRequired => {
                "the CLI asked for a confirmation; this is a bug in how we call it, please report it"
            }
            HfFailure::SourceMissing => "check the source path; it is not on the Hub",
            HfFailure::Other => {
                "run the command again; if it keeps failing, run it by hand with HF_DEBUG=1"
            }
        }
    }
}

/// This crate's result type, with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `Incomplete`'s problems, one indented line each.
fn problem_lines(problems: &[crate::refusal::StoreProblem]) -> String {
    problems.iter().map(|p| format!("\n  - {p}")).collect()
}

impl Error {
    /// Whether trying the same call again cannot help (a refused token, a missing bucket).
    pub fn is_permanent(&self) -> bool {
        matches!(self, Error::HfCli { kind, .. } if kind.is_permanent())
    }

    /// Whether the error is a plain "it is not there" (as opposed to "could not find out").
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// Whether this error means a check failed (as opposed to an operation failing): a refusal,
    /// an incomplete store, a guard, a bad manifest or a bad chunk set.
    pub fn is_check_failure(&self) -> bool {
        matches!(
            self,
            Error::Incomplete { .. }
                | Error::Refused(_)
                | Error::ReuseRefused(_)
                | Error::GitRefused { .. }
                | Error::PushRejected { .. }
                | Error::Manifest(_)
                | Error::Guard { .. }
                | Error::Pin { .. }
                | Error::GenerationGuard { .. }
                | Error::Chunk(
                    chunker::Error::MissingChunk { .. }
                        | chunker::Error::MalformedChunkManifest { .. }
                        | chunker::Error::MalformedSidecar { .. }
                        | chunker::Error::CountMismatch { .. }
                        | chunker::Error::SizeMismatch { .. }
                        | chunker::Error::DigestMismatch { .. }
                        | chunker::Error::NotOob { .. }
                        | chunker::Error::NotFound { .. }
                )
        )
    }
}

impl NextStep for Error {
    fn next_step(&self) -> Option<String> {
        match self {
            Error::HfCli { kind, .. } => Some(kind.next_step().to_string()),
            Error::Guard { .. } => Some(
                "give each model meant to change an <id>/ directory in --artifacts (an empty one \
                 when its files are already in the store), or undo the other changes in the new \
                 manifest (`release-cli manifest diff LIVE NEW` shows them; LIVE: the live \
                 manifest's file, NEW: the new one)"
                    .into(),
            ),
            Error::Pin { .. } => Some(
                "publish with the manifest's own generation, or record the new generation's pin \
                 with `release-cli tinygrad bump --openpilot DIR --tinygrad-src TINYGRAD` (DIR: \
                 the openpilot checkout; TINYGRAD: a tinygrad tree at the manifest's \
                 tinygrad_commit) and pass --openpilot DIR"
                    .into(),
            ),
            Error::GenerationGuard {
                generation,
                previous,
                ..
            } => Some(format!(
                "keep every {previous} model ID, version and uses_external_gpu, or name each \
                 intended addition/removal with --add-model ID / --drop-model ID; rebuild any \
                 artifact {previous} published (`release-cli rebuild --generation {generation}`)"
            )),
            Error::HubUnreadable { .. } => Some(
                "pass --hub STORE naming a readable copy of the Hub (e.g. an offline mirror), \
                 publish to the Hub in the same run (--to hf://buckets/NS/NAME before the github: \
                 store), or pass --github-only \"REASON\" (written into the publish record)"
                    .into(),
            ),
            Error::PushRejected {
                checkout,
                remote,
                branch,
                ..
            } => Some(format!(
                "the commit stays in the checkout; if the branch moved, `git -C {} pull --rebase \
                 {remote} {branch}`; if access or branch protection refused it, fix that; then \
                 rerun the same publish, which pushes the local commits first",
                checkout.display()
            )),
            Error::PublicKeyFile { .. } => {
                Some("pass the public key file `minisign -G` wrote (e.g. release.pub)".into())
            }
            Error::UploadFailed { last, .. } => last.next_step(),
            Error::Refused(r) => r.next_step(),
            Error::Key {
                path,
                problem: crate::refusal::KeyProblem::WrongPassphrase,
            } => Some(format!(
                "retype it, or correct {env} (unset it to be asked on a terminal); try the \
                 passphrase alone with `minisign -S -s {key} -m /dev/null -x /dev/null` (signs \
                 nothing, writes nothing); a forgotten passphrase cannot be recovered: make a new \
                 key and rotate to it (docs/release.md, \"Key rotation\")",
                env = crate::refusal::PASSPHRASE_ENV,
                key = path.display()
            )),
            Error::Key { problem, .. } => problem.next_step(),
            Error::ReuseRefused(r) => r.next_step(),
            Error::Manifest(e) => e.next_step(),
            Error::Chunk(e) => e.next_step(),
            _ => None,
        }
    }
}

impl NextStep for Refusal {
    fn next_step(&self) -> Option<String> {
        match self {
            Refusal::LooseFiles { dir, loose } => Some(loose_files_fix(dir, loose)),
            Refusal::SignedStore { .. } => Some(
                "add --sign-key release.key; or, to stop signing this generation on purpose, \
                 --remove-signature \"REASON\" (recorded; devices with keys will then refuse \
                 the generation as not signed)"
                    .into(),
            ),
            _ => None,
        }
    }
}
