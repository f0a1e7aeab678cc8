//! The one error type of the downloader.

use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use chunker::Sha256Digest;
use manifest::{ArtifactFormat, Problem};

/// This crate's result type, with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong fetching a manifest or downloading a model. Network errors name the
/// URL; file errors name the path; a failure on every origin lists each origin's error.
/// ([`Error::is_retryable`] says which are worth another try on the same URL.)
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A non-success HTTP status. 404/403/410 are final for that origin; 429 and 5xx are retried.
    #[error("{url}: HTTP {status}")]
    Status {
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
    },

    /// Connect/read failure, reset, timeout, or a body that ended early.
    #[error("{url}: transfer failed: {message}")]
    Transport {
        /// The URL asked.
        url: String,
        /// What failed.
        message: String,
    },

    /// No connection could be made: refused, no address for the name, or a connect that timed
    /// out (`timed_out`, not retried: the next origin is asked at once). Unlike a silent or
    /// slow origin, one of these does not give the origin up; several in a row do
    /// ([`crate::policy::after`]).
    #[error("{url}: cannot connect: {message}")]
    NoConnection {
        /// The URL asked.
        url: String,
        /// What failed.
        message: String,
        /// Whether the connect timed out.
        timed_out: bool,
    },

    /// A redirect the device refuses to follow (not http/https, no host, user info, a downgrade
    /// to http, too many hops, no Location). The next origin is tried.
    #[error("{url}: redirect to `{location}` refused: {reason}")]
    Redirect {
        /// The URL that answered with the redirect.
        url: String,
        /// Its `Location`, as sent.
        location: String,
        /// Why it is refused.
        reason: String,
    },

    /// This origin used up its time; the next origin is tried.
    #[error("{url}: this origin took longer than its deadline of {seconds} s; giving up on it")]
    Deadline {
        /// The URL being fetched when the deadline passed.
        url: String,
        /// The origin's deadline, in seconds.
        seconds: u64,
    },

    /// This origin answered nothing within the response timeout, or sent a body slower than
    /// the minimum rate: it is given up (not retried) and the other origin is asked first for
    /// the rest of the run (see [`crate::policy`]).
    #[error("{url}: {message}; giving up on this origin for this run")]
    TooSlow {
        /// The URL asked.
        url: String,
        /// What it did (or did not do) in time.
        message: String,
        /// Which criterion it missed.
        why: crate::policy::GiveUp,
    },

    /// A download moved to the other origin, far faster or not yet measured (see
    /// [`crate::policy::leave`]); the bytes it fetched are kept. Never the final error of a
    /// download: the origin it left is asked again if the other one fails.
    #[error(
        "{url}: {}/s here; moved to the other origin to compare",
        cli_support::progress::bytes(*.rate)
    )]
    LeftForFaster {
        /// The URL being fetched.
        url: String,
        /// Its measured rate, in bytes per second.
        rate: u64,
    },

    /// The server answered something no correct server would (wrong Content-Range, a body
    /// longer than asked for, a size other than the manifest's).
    #[error("{url}: protocol violation: {message}")]
    Protocol {
        /// The URL asked.
        url: String,
        /// What the server did wrong.
        message: String,
    },

    /// The published files have another size than the manifest implies (the first chunk's
    /// length cannot make up the artifact, or a piece is longer or shorter than planned).
    #[error("{url}: the published files do not match the manifest: {message}")]
    SizeMismatch {
        /// The URL of the piece.
        url: String,
        /// What does not match.
        message: String,
    },

    /// The manifest was refused by the reader rules or is too large or not JSON; the next origin is
    /// tried.
    #[error("{url}: manifest rejected: {source}")]
    BadManifest {
        /// The manifest's URL.
        url: String,
        /// Why it was refused.
        #[source]
        source: manifest::Error,
    },

    /// The manifest parsed, but not one entry in it is usable: each entry with why not (empty
    /// when the manifest lists no models). The next origin is tried.
    #[error("{url}: manifest has no usable model entry{}", UnusableList(.entries))]
    NoUsableEntries {
        /// The manifest's URL.
        url: String,
        /// Each entry left out, with why.
        entries: Vec<UnusableEntry>,
    },

    /// The manifest's `generation` is not the one the device reads; the next origin is tried.
    #[error(
        "{url}: manifest says generation {found} but this device reads {expected}; not using it"
    )]
    WrongGeneration {
        /// The manifest's URL.
        url: String,
        /// The generation this device reads.
        expected: String,
        /// The generation the manifest names.
        found: String,
    },

    /// The manifest's `tinygrad_commit` is not the tinygrad of this device's openpilot tree: its
    /// artifacts target another ABI. The next origin is tried.
    #[error(
        "{url}: manifest was built for tinygrad {found} but this device's openpilot tree runs tinygrad {expected}; not using it"
    )]
    WrongTinygrad {
        /// The manifest's URL.
        url: String,
        /// The tinygrad this device runs.
        expected: manifest::GitCommit,
        /// The manifest's `tinygrad_commit`.
        found: manifest::GitCommit,
    },

    /// The manifest is not signed as the device's trusted keys require (`trust`).
    #[error("{url}: manifest refused: {refusal}")]
    Refused {
        /// The manifest's URL.
        url: String,
        /// Why its signature was refused.
        refusal: manifest::signature::Refusal,
    },

    /// The trusted keys file cannot be used.
    #[error(
        "trusted keys {}: {message}",
        path.display()
    )]
    TrustedKeys {
        /// The trusted keys file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },

    /// No origin served a manifest this device accepts.
    #[error("no origin served a valid {generation} manifest:\n{}", AttemptList(.attempts))]
    ManifestUnavailable {
        /// The generation asked for.
        generation: String,
        /// Each origin (as displayed) with its error, in the order tried.
        attempts: Vec<(String, Error)>,
    },

    /// The origin's `.chunkmanifest` disagrees with the entry's `artifact_chunk_count`; nothing is
    /// downloaded from that origin.
    #[error(
        "{url}: remote .chunkmanifest says {remote} chunks, the manifest says {expected}; the published set is inconsistent"
    )]
    ChunkCountMismatch {
        /// The `.chunkmanifest`'s URL.
        url: String,
        /// The count the manifest entry declares.
        expected: u32,
        /// The count the origin publishes.
        remote: u32,
    },

    /// The origin's `.chunkmanifest` is not a chunk count.
    #[error("{url}: malformed .chunkmanifest: {source}")]
    BadChunkManifest {
        /// Its URL.
        url: String,
        /// The parse error.
        #[source]
        source: chunker::Error,
    },

    /// Bytes downloaded do not have the digest expected (a chunk's, or the whole artifact's); they
    /// were discarded, nothing was installed.
    #[error("{what}: SHA-256 is {actual}, expected {expected}; the download was discarded")]
    DigestMismatch {
        /// What was hashed (the file and the origin).
        what: String,
        /// The digest expected (the manifest's or the sidecar's).
        expected: Sha256Digest,
        /// The digest of the bytes received.
        actual: Sha256Digest,
    },

    /// The store serves the same manifest entry, `.sha256` and chunks as when it last served bytes
    /// that failed verification, so it is not downloaded from again until it changes
    /// ([`crate::stale_store`]).
    #[error(
        "{what}: the store says exactly what it said when it served other bytes{}; not downloaded again until it changes (its manifest, .sha256 or chunks)",
        served.map(|d| format!(" (SHA-256 {d})")).unwrap_or_default()
    )]
    StoreUnchanged {
        /// The artifact and origin.
        what: String,
        /// What it served last time, when known.
        served: Option<Sha256Digest>,
    },

    /// The entry cannot be downloaded by this device (a `local-` model, an unsupported format,
    /// inconsistent per-chunk digests).
    #[error("model {model} has no downloadable artifact in the manifest ({reason})")]
    NotDownloadable {
        /// The model.
        model: String,
        /// Why.
        reason: String,
    },

    /// A device with trusted keys installs only bytes its signed manifest pins: this artifact
    /// lacks a signed SHA-256, size or chunk count ([`crate::trust::digest_rule`]). Nothing was
    /// requested.
    #[error(
        "model {model}: {}",
        crate::unsigned::not_installable_text(file, missing)
    )]
    NotSigned {
        /// The model.
        model: String,
        /// The local file name (`<id>_driving_tinygrad.pkl`, or the Chestnut variant's).
        file: String,
        /// What the signed manifest does not give.
        missing: Vec<crate::unsigned::Unsigned>,
    },

    /// The filesystem holding the models lacks room for the artifact plus the download's margin; no
    /// staging file was made.
    #[error(
        "not enough free space in {}: need {needed} bytes ({}, artifact plus margin), {} available; free space or remove unused models (`device-modeld-manager gc`)",
        path.display(),
        cli_support::progress::bytes(*needed),
        cli_support::progress::bytes(*available)
    )]
    InsufficientSpace {
        /// The directory checked.
        path: PathBuf,
        /// Bytes needed, in all.
        needed: u64,
        /// Bytes available.
        available: u64,
    },

    /// The download was cancelled through its [`crate::CancelToken`].
    #[error("download of {model} was cancelled")]
    Cancelled {
        /// The model.
        model: String,
    },

    /// A file or directory operation on the device failed. File errors come from `fs-err` (or,
    /// for the staging directory's raw system calls, from a wrapper worded the same way), so
    /// the message names the operation and the path, and `kind()` is the OS error's. Network
    /// I/O never lands here: it is [`Error::Transport`], which names the URL.
    #[error(transparent)]
    Io(#[from] std::io::Error),

    /// Every origin failed; each attempt's error is listed. Nothing was installed.
    #[error("download of {model} failed on every origin:\n{}", AttemptList(.attempts))]
    AllOriginsFailed {
        /// The model.
        model: String,
        /// Each origin (as displayed) with its error, in the order tried.
        attempts: Vec<(String, Error)>,
    },
}

impl Error {
    /// [`Error::Transport`] at `url`.
    pub(crate) fn transport(url: &str, message: impl Into<String>) -> Self {
        let (url, message) = (url.to_string(), message.into());
        Error::Transport { url, message }
    }

    /// [`Error::Protocol`] at `url`.
    pub(crate) fn protocol(url: &str, message: impl Into<String>) -> Self {
        let (url, message) = (url.to_string(), message.into());
        Error::Protocol { url, message }
    }

    /// [`Error::SizeMismatch`] at `url`.
    pub(crate) fn size_mismatch(url: &str, message: String) -> Self {
        let url = url.to_string();
        Error::SizeMismatch { url, message }
    }

    /// [`Error::Cancelled`] of `model`.
    pub(crate) fn cancelled(model: impl fmt::Display) -> Self {
        let model = model.to_string();
        Error::Cancelled { model }
    }

    /// Whether another try against the same URL may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Status { status, .. } => *status == 429 || *status == 408 || *status >= 500,
            Error::Transport { .. } => true,
            Error::NoConnection { timed_out, .. } => !timed_out,
            _ => false,
        }
    }

    /// The published files disagree with the manifest: a chunk count, a chunk's or the whole
    /// artifact's digest, or the sizes the chunks imply. That is what a republish in progress
    /// looks like (one origin's manifest ahead of or behind its chunks), so it means "not yet":
    /// nothing was installed, what the device has is intact, and the caller should keep its
    /// current model and try again on a later refresh, never treat the model as gone or the
    /// installed copy as corrupt. For [`Error::AllOriginsFailed`], true when any origin failed
    /// this way (the others then failed for reasons that are also transient or local to them).
    pub fn is_not_yet(&self) -> bool {
        match self {
            Error::ChunkCountMismatch { .. }
            | Error::DigestMismatch { .. }
            | Error::StoreUnchanged { .. }
            | Error::BadChunkManifest { .. }
            | Error::SizeMismatch { .. } => true,
            Error::AllOriginsFailed { attempts, .. } => {
                attempts.iter().any(|(_, e)| e.is_not_yet())
            }
            _ => false,
        }
    }

    /// Whether this looks like no (usable) network: connection failures, timeouts, server
    /// trouble, on every origin tried. A caller keeps the request and tries again when the
    /// network may be back, instead of giving it up.
    pub fn is_offline(&self) -> bool {
        match self {
            Error::Transport { .. }
            | Error::NoConnection { .. }
            | Error::Deadline { .. }
            | Error::TooSlow { .. }
            | Error::LeftForFaster { .. } => true,
            Error::Status { .. } => self.is_retryable(),
            Error::ManifestUnavailable { attempts, .. }
            | Error::AllOriginsFailed { attempts, .. } => {
                !attempts.is_empty() && attempts.iter().all(|(_, e)| e.is_offline())
            }
            _ => false,
        }
    }

    /// Why this error gives its origin up for the run, if it does (see [`crate::policy`]).
    pub fn gives_up(&self) -> Option<crate::policy::GiveUp> {
        match self {
            Error::Deadline { .. } => Some(crate::policy::GiveUp::Deadline),
            Error::TooSlow { why, .. } => Some(*why),
            _ => None,
        }
    }

    /// What this failure says of its origin, for the give-up rule ([`crate::policy::after`]):
    /// a miss of the policy's own criteria, no connection, or otherwise that it answered.
    pub fn said(&self) -> crate::policy::Said {
        use crate::policy::Said;
        match (self, self.gives_up()) {
            (_, Some(why)) => Said::Failed(why),
            (Error::NoConnection { .. }, None) => Said::NoConnection,
            _ => Said::Answered,
        }
    }

    /// Errors that no other origin can fix: stop instead of trying the next one.
    pub fn is_local(&self) -> bool {
        matches!(
            self,
            Error::Cancelled { .. } | Error::InsufficientSpace { .. } | Error::Io(_)
        )
    }
}

/// A manifest entry the device cannot use, and why (see [`Error::NoUsableEntries`]).
#[derive(Debug, Clone, PartialEq)]
pub struct UnusableEntry {
    /// Position in the published `models` array.
    pub index: usize,
    /// The entry's `id` as published, when it had a string one (possibly not a valid ID).
    pub id: Option<String>,
    /// Why it is left out.
    pub reason: UnusableReason,
}

/// Why a manifest entry is not usable on this device.
#[derive(Debug, Clone, PartialEq)]
pub enum UnusableReason {
    /// The device's reading of the manifest left it out (`manifest::tolerant`): every problem,
    /// each with its JSON path (`models[3].artifact_sha256`).
    Refused {
        /// Every problem, each with its JSON path.
        problems: Vec<Problem>,
    },
    /// A valid entry in an `artifact_format` this device cannot load (it loads only
    /// `tinygrad_single_v1`, or no format given): a newer release of the manager may.
    UnsupportedFormat {
        /// The format the entry names.
        format: ArtifactFormat,
    },
}

impl fmt::Display for UnusableEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = format!("models[{}]", self.index);
        match &self.id {
            Some(id) => write!(f, "model {:?} ({at})", Shortened(id))?,
            None => write!(f, "{at}")?,
        }
        match &self.reason {
            UnusableReason::Refused { problems } => {
                f.write_str(" refused: ")?;
                for (i, p) in problems.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    // The entry is named already: its problems' paths are shown relative to it.
                    match p.path.strip_prefix(&at) {
                        Some("") => write!(f, "{}", p.message)?,
                        Some(rest) => write!(f, "{}: {}", rest.trim_start_matches('.'), p.message)?,
                        None => write!(f, "{p}")?,
                    }
                }
                Ok(())
            }
            UnusableReason::UnsupportedFormat { format } => write!(
                f,
                " skipped: artifact_format {:?} is not one this device loads (only {:?}); a newer device-modeld-manager may",
                format.as_str(),
                ArtifactFormat::TINYGRAD_SINGLE_V1
            ),
        }
    }
}

/// An ID from a hostile manifest is shown with at most this many characters.
struct Shortened<'a>(&'a str);

impl fmt::Debug for Shortened<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MAX: usize = 64;
        match self.0.char_indices().nth(MAX) {
            None => write!(f, "{:?}", self.0),
            Some((cut, _)) => write!(f, "{:?}…", &self.0[..cut]),
        }
    }
}

struct UnusableList<'a>(&'a [UnusableEntry]);

impl fmt::Display for UnusableList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 5;
        if self.0.is_empty() {
            return f.write_str(": it lists no models");
        }
        f.write_char(':')?;
        for r in self.0.iter().take(SHOWN) {
            write!(f, "\n    {r}")?;
        }
        if self.0.len() > SHOWN {
            write!(f, "\n    … and {} more", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}

struct AttemptList<'a>(&'a [(String, Error)]);

/// How an attempt names its origin: `Hugging Face (<base>)` shortened to `Hugging Face` when
/// the attempt's error already shows that base URL, so each URL is said once. Pure.
fn origin_label<'a>(origin: &'a str, error: &str) -> &'a str {
    match origin.rsplit_once(" (") {
        Some((name, rest))
            if rest
                .strip_suffix(')')
                .is_some_and(|base| !base.is_empty() && error.contains(base)) =>
        {
            name
        }
        _ => origin,
    }
}

impl fmt::Display for AttemptList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (origin, err)) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            let err = err.to_string();
            write!(f, "  {}: {err}", origin_label(origin, &err))?;
        }
        Ok(())
    }
}

/// An I/O error of a system call `fs-err` has no wrapper for, worded as `fs-err` words its own
/// (operation, path, OS error), with its `kind()` kept.
pub(crate) fn os_error(op: &'static str, path: &Path, source: std::io::Error) -> std::io::Error {
    std::io::Error::new(
        source.kind(),
        OsError {
            op,
            path: path.to_path_buf(),
            err: source,
        },
    )
}

#[derive(Debug, thiserror::Error)]
#[error("failed to {op} `{}`: {err}", path.display())]
struct OsError {
    op: &'static str,
    path: PathBuf,
    err: std::io::Error,
}

/// Every message of this crate says what to do where there is something to do; none carries a
/// separate next step.
impl cli_support::NextStep for Error {
    fn next_step(&self) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 37: the offline line named each URL twice (`Hugging Face (base): base/…: …`). An
    /// attempt whose error shows its origin's base names the origin once; one that does not
    /// keeps the base.
    #[test]
    fn each_origin_is_named_once() {
        let hf = "Hugging Face (http://127.0.0.1:9/hf)";
        let gh = "GitHub (http://127.0.0.1:9/gh)";
        let attempts = vec![
            (
                hf.to_string(),
                Error::Status {
                    url: "http://127.0.0.1:9/hf/manifests/model_names_v25.json".into(),
                    status: 503,
                },
            ),
            (
                gh.to_string(),
                Error::Cancelled {
                    model: "pop223".into(),
                },
            ),
        ];
        let text = Error::ManifestUnavailable {
            generation: "v25".into(),
            attempts,
        }
        .to_string();
        assert_eq!(text.matches("http://127.0.0.1:9/hf").count(), 1, "{text}");
        assert!(
            text.contains("  Hugging Face: http://127.0.0.1:9/hf/manifests"),
            "{text}"
        );
        assert!(
            text.contains("  GitHub (http://127.0.0.1:9/gh): download of pop223"),
            "{text}"
        );
        assert_eq!(origin_label("odd", "x"), "odd");
        assert_eq!(origin_label("A ()", "anything"), "A ()");
    }

    /// Issue 39: the rate is the human one every other message shows, not raw bytes/s.
    #[test]
    fn left_for_faster_names_a_human_rate() {
        let text = Error::LeftForFaster {
            url: "http://127.0.0.1:9/hf/x".into(),
            rate: 3 << 19,
        }
        .to_string();
        assert_eq!(
            text,
            "http://127.0.0.1:9/hf/x: 1.50 MiB/s here; moved to the other origin to compare"
        );
    }
}
