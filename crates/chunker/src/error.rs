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
        /// The input's path (`<input>` for an unnamed stream).
        path: PathBuf,
        /// The read error.
        #[source]
        source: io::Error,
    },

    /// The input was absent in every form: no plain file, no complete chunk set, no legacy parts.
    /// Names the logical path asked for.
    #[error("{path}: not found (no plain file, no complete chunk set, no legacy parts)")]
    NotFound {
        /// The logical artifact path that was looked up.
        path: PathBuf,
    },

    /// A directory was given where one chunk set was expected, and it holds several; the message
    /// names one to pass instead.
    #[error(
        "{dir}: holds {} chunk sets ({}); name one of them, e.g. {}",
        sets.len(),
        sets.join(", "),
        dir.join(&sets[0]).display()
    )]
    AmbiguousDirectory {
        /// The directory given.
        dir: PathBuf,
        /// The logical names of the chunk sets it holds, sorted.
        sets: Vec<String>,
    },

    /// A chunk set's `.chunkmanifest` declares more chunks than are present.
    #[error("chunk {index} of {count} is missing: {path}")]
    MissingChunk {
        /// 1-based index of the first missing chunk.
        index: u32,
        /// The count the chunk manifest declares.
        count: u32,
        /// The path the missing chunk should have.
        path: PathBuf,
    },

    /// A `.chunkmanifest` whose body is not a decimal count in `1..=99`.
    #[error("malformed chunk manifest {path}: content {content:?} is not a chunk count in 1..=99")]
    MalformedChunkManifest {
        /// The chunk manifest's path.
        path: PathBuf,
        /// Its content (at most the first 64 bytes, lossily decoded).
        content: String,
    },

    /// A `.sha256` sidecar whose first token is not 64 lowercase hex digits.
    #[error(
        "malformed SHA-256 sidecar {path}: content {content:?} does not start with 64 lowercase hex digits"
    )]
    MalformedSidecar {
        /// The sidecar's path.
        path: PathBuf,
        /// Its content (at most the first 128 bytes, lossily decoded).
        content: String,
    },

    /// A chunk count other than the one expected (by [`crate::Expected::chunk_count`], or the
    /// number of per-chunk digests).
    #[error("chunk count mismatch for {name}: expected {expected}, found {actual}")]
    CountMismatch {
        /// The logical artifact (with `(per-chunk digests)` when that list's length was wrong).
        name: String,
        /// The count expected.
        expected: u32,
        /// The count found.
        actual: u32,
    },

    /// A size other than the one expected: of the whole artifact, or of one chunk of a set.
    #[error("size mismatch for {what}: expected {expected} bytes, found {actual}")]
    SizeMismatch {
        /// What had the wrong size (the artifact's name, or the chunk).
        what: String,
        /// The size expected, in bytes.
        expected: u64,
        /// The size found, in bytes.
        actual: u64,
    },

    /// A SHA-256 other than the one expected: of the whole artifact or of one chunk.
    #[error("SHA-256 mismatch for {what}: expected {expected}, actual {actual}")]
    DigestMismatch {
        /// What was hashed (`chunk I of N (PATH)` or `PATH (whole artifact)`).
        what: String,
        /// The digest expected (from the manifest or the sidecar).
        expected: Sha256Digest,
        /// The digest computed from the bytes on disk.
        actual: Sha256Digest,
    },

    /// An artifact that would need more than [`crate::MAX_CHUNKS`] chunks at this chunk size.
    #[error(
        "{name}: {size} bytes need {needed} chunks of {chunk_size} bytes, more than the limit of {max}; use a larger --chunk-size"
    )]
    TooManyChunks {
        /// The logical artifact name.
        name: String,
        /// Its size in bytes.
        size: u64,
        /// The chunk size asked for, in bytes.
        chunk_size: u64,
        /// How many chunks that would take.
        needed: u64,
        /// The limit, [`crate::MAX_CHUNKS`].
        max: u32,
    },

    /// An empty input: an artifact has at least one byte, so an empty one is never split.
    #[error("{name}: the input is empty; an artifact must have at least one byte")]
    EmptyInput {
        /// The logical artifact name.
        name: String,
    },

    /// A chunk size of 0 was asked for.
    #[error("chunk size must be at least 1 byte")]
    ZeroChunkSize,

    /// A logical name that is not a bare file name (empty, `.`, `..`, or with a separator or NUL).
    #[error("{name:?} is not a valid artifact file name (it must be a bare file name)")]
    InvalidName {
        /// The name refused.
        name: String,
    },

    /// The artifact is not an out-of-band pickle container ([`crate::oob`]); the message says how
    /// to rebuild it.
    #[error(
        "{what}: not an out-of-band (OOB) pickle container at byte {offset}: {defect}; every v25 driving artifact is serialised OOB, so rebuild it with the generation's tinygrad (`release-cli compile --model ID --version vN --source ONNX --out DIR`, with ID the model, vN its behaviour version, ONNX its source model and DIR where its chunk set goes), never rename another file into place"
    )]
    NotOob {
        /// The artifact checked.
        what: String,
        /// Byte offset of the field that is wrong.
        offset: u64,
        /// What is wrong there.
        defect: crate::oob::OobDefect,
    },

    /// A path that must be a regular file (a small file read with a limit, see [`crate::bounded`])
    /// is a FIFO, device, socket or directory.
    #[error(
        "{path}: not a regular file (a FIFO, device, socket or directory); pass the file itself"
    )]
    NotRegularFile {
        /// The path.
        path: PathBuf,
    },

    /// A small file (chunk manifest, sidecar, manifest) is over the size limit for its kind.
    #[error(
        "{path}: {size} bytes, over the {limit}-byte limit for this kind of file; is it the right file?"
    )]
    FileTooLarge {
        /// The file's path.
        path: PathBuf,
        /// Its size in bytes (at open, or as far as it had grown while read).
        size: u64,
        /// The limit for this kind of file, in bytes.
        limit: u64,
    },

    /// The input's size changed while a split read it (it was written to, truncated, or read from
    /// before the split).
    #[error(
        "{path}: the input changed while it was being read (expected {expected} bytes, read {actual})"
    )]
    InputChanged {
        /// The input's path.
        path: PathBuf,
        /// The size it had when the split started, in bytes.
        expected: u64,
        /// The bytes actually read.
        actual: u64,
    },
}

/// This crate's result type, with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every message of this crate says what to do where there is something to do; none carries a
/// separate next step.
impl cli_support::NextStep for Error {
    fn next_step(&self) -> Option<String> {
        None
    }
}
