use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while talking to a store, publishing, reusing or serving.
/// Every message names the store, path or URL involved and, where there is one, what to do next.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("invalid store path {path:?}: {reason}")]
    InvalidPath { path: String, reason: String },

    #[error(
        "invalid store {spec:?}: {reason} (use a directory path, file://PATH, hf://buckets/NS/NAME or github:PATH)"
    )]
    InvalidStore { spec: String, reason: String },

    #[error("{store}: {path} not found")]
    NotFound { store: String, path: String },

    #[error("{store}: {path} cannot be stored here: {reason}")]
    Unsupported {
        store: String,
        path: String,
        reason: String,
    },

    #[error("HTTP request {method} {url} failed: {message}")]
    Http {
        method: &'static str,
        url: String,
        message: String,
    },

    #[error("HTTP {method} {url} answered {status}{hint}")]
    HttpStatus {
        method: &'static str,
        url: String,
        status: u16,
        hint: &'static str,
    },

    #[error("unexpected answer from {url}: {reason}")]
    BadResponse { url: String, reason: String },

    #[error(
        "could not run the Hugging Face CLI {program:?}: {source}; install it (pip install -U huggingface_hub) or pass --hf-cli PATH / set HF_CLI"
    )]
    HfCliMissing {
        program: String,
        #[source]
        source: io::Error,
    },

    #[error("`{command}` failed ({status}): {stderr}")]
    HfCli {
        command: String,
        status: String,
        stderr: String,
    },

    #[error("git checkout {checkout}: {reason}")]
    GitRefused { checkout: PathBuf, reason: String },

    #[error("`git {args}` in {checkout} failed ({status}): {stderr}")]
    Git {
        checkout: PathBuf,
        args: String,
        status: String,
        stderr: String,
    },

    #[error("{0}")]
    Manifest(#[from] manifest::Error),

    #[error("{0}")]
    Chunk(#[from] chunker::Error),

    #[error(
        "{store}: {refusal}\nnext: give each model meant to change an <id>/ directory in --artifacts (an empty one when its files are already in the store), or undo the other changes in the new manifest (`release-cli manifest diff LIVE NEW` shows them)"
    )]
    Guard {
        store: String,
        #[source]
        refusal: manifest::GuardRefusal,
    },

    #[error("{store}: upload of {path} failed after {attempts} attempts: {last}")]
    UploadFailed {
        store: String,
        path: String,
        attempts: u32,
        last: Box<Error>,
    },

    /// Publish refused before writing the manifest: what was checked and what is wrong.
    #[error("refusing to publish to {store}:\n{}", problems.join("\n"))]
    Incomplete {
        store: String,
        problems: Vec<String>,
    },

    #[error("{0}")]
    Refused(String),

    #[error("reuse refused: {0}")]
    ReuseRefused(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attach a path to an `io::Error`.
pub(crate) trait IoContext<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| Error::Io {
            path: path.into(),
            source,
        })
    }
}

impl Error {
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
                | Error::Manifest(_)
                | Error::Guard { .. }
                | Error::Chunk(
                    chunker::Error::MissingChunk { .. }
                        | chunker::Error::MalformedChunkManifest { .. }
                        | chunker::Error::MalformedSidecar { .. }
                        | chunker::Error::CountMismatch { .. }
                        | chunker::Error::SizeMismatch { .. }
                        | chunker::Error::DigestMismatch { .. }
                        | chunker::Error::NotFound { .. }
                )
        )
    }
}
