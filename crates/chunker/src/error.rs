use std::io;
use std::path::PathBuf;

use crate::Sha256Digest;

/// Everything that can go wrong while splitting, reading, joining or verifying a chunk set.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory operation failed. These come from `fs_err`, whose message names the
    /// operation and the path (`failed to open file `/x/y`: No such file or directory`); the
    /// `kind()` is the operating system's.
    #[error(transparent)]
    Io(#[from] io::Error),

    /// Reading the stream [`crate::split_reader`] splits failed. The stream may be any reader
    /// (stdin, a pipe), so its error carries no path of its own: `path` is `<input>` until
    /// [`Error::naming_input`] names the file it came from.
    #[error("failed to read the input {path}: {source}")]
    ReadInput {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("{path}: not found (no plain file, no complete chunk set, no legacy parts)")]
    NotFound { path: PathBuf },

    #[error(
        "{dir}: holds {} chunk sets ({}); name one of them, e.g. {}",
        sets.len(),
        sets.join(", "),
        dir.join(&sets[0]).display()
    )]
    AmbiguousDirectory { dir: PathBuf, sets: Vec<String> },

    #[error("chunk {index} of {count} is missing: {path}")]
    MissingChunk {
        index: u32,
        count: u32,
        path: PathBuf,
    },

    #[error("malformed chunk manifest {path}: content {content:?} is not a chunk count in 1..=99")]
    MalformedChunkManifest { path: PathBuf, content: String },

    #[error(
        "malformed SHA-256 sidecar {path}: content {content:?} does not start with 64 lowercase hex digits"
    )]
    MalformedSidecar { path: PathBuf, content: String },

    #[error("chunk count mismatch for {name}: expected {expected}, found {actual}")]
    CountMismatch {
        name: String,
        expected: u32,
        actual: u32,
    },

    #[error("size mismatch for {what}: expected {expected} bytes, found {actual}")]
    SizeMismatch {
        what: String,
        expected: u64,
        actual: u64,
    },

    #[error("SHA-256 mismatch for {what}: expected {expected}, actual {actual}")]
    DigestMismatch {
        what: String,
        expected: Sha256Digest,
        actual: Sha256Digest,
    },

    #[error(
        "{name}: {size} bytes need {needed} chunks of {chunk_size} bytes, more than the limit of {max}; use a larger --chunk-size"
    )]
    TooManyChunks {
        name: String,
        size: u64,
        chunk_size: u64,
        needed: u64,
        max: u32,
    },

    #[error("{name}: the input is empty; an artifact must have at least one byte")]
    EmptyInput { name: String },

    #[error("chunk size must be at least 1 byte")]
    ZeroChunkSize,

    #[error("{name:?} is not a valid artifact file name (it must be a bare file name)")]
    InvalidName { name: String },

    #[error(
        "{what}: not an out-of-band (OOB) pickle container at byte {offset}: {defect}; every v25 driving artifact is serialised OOB, so rebuild it with the generation's tinygrad (`release-cli compile --model ID --version vN --source ONNX --out DIR`, with ID the model, vN its behaviour version, ONNX its source model and DIR where its chunk set goes), never rename another file into place"
    )]
    NotOob {
        what: String,
        offset: u64,
        defect: crate::oob::OobDefect,
    },

    #[error(
        "{path}: not a regular file (a FIFO, device, socket or directory); pass the file itself"
    )]
    NotRegularFile { path: PathBuf },

    #[error(
        "{path}: {size} bytes, over the {limit}-byte limit for this kind of file; is it the right file?"
    )]
    FileTooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },

    #[error(
        "{path}: the input changed while it was being read (expected {expected} bytes, read {actual})"
    )]
    InputChanged {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every message of this crate says what to do where there is something to do; none carries a
/// separate next step.
impl cli_support::NextStep for Error {
    fn next_step(&self) -> Option<String> {
        None
    }
}
