//! Progress, typed. Every text the manager shows in `ModelDownloadProgress` (the UI reads it
//! verbatim) is rendered here, in one place, with upstream's exact wording.
//!
//! The type is closed: no variant carries free text. A failure is a [`FailReason`] (decided from
//! the error by [`FailReason::of`], never the error's own message, which speaks to an operator
//! at a shell: "run `refresh` first"), a refused manifest is its [`Refusal`] (rendered by
//! `Refusal::ui_text`), and a model name comes from the catalog entry ([`DisplayName::of`]).

use std::fmt;

use manifest::signature::Refusal;
use manifest::{GitCommit, ModelId};

use crate::error::Error;

/// A catalog model's name as the UI shows it (upstream's emoji stripped, see
/// `contract::clean_name`): made only from a catalog entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisplayName(String);

impl DisplayName {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn of(entry: &manifest::ModelEntry) -> Self {
        DisplayName(crate::rules::contract::clean_name(
            entry.name().unwrap_or(entry.id().as_str()),
        ))
    }
}

/// Why a download request failed, in words for the driver (`"Download failed: <reason>"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FailReason {
    /// Not enough free space for the model.
    #[error("not enough free space")]
    NoSpace,
    /// No origin delivered bytes that verify.
    #[error("model could not be downloaded and verified")]
    NotVerified,
    /// `ModelToDownload` does not name a model.
    #[error("not a model name")]
    NotAModel,
    /// The model is not in this generation's list.
    #[error("model not in the model list")]
    NotInList,
    /// No model list on the device yet (no refresh has succeeded).
    #[error("model list not downloaded yet")]
    NoModelList,
    /// The built-in model's files are missing.
    #[error("built-in model missing")]
    BuiltinMissing,
    /// Another manager holds the lock.
    #[error("another download is running")]
    Busy,
    /// The request param itself could not be read (over the size cap, not a regular file): it
    /// was removed.
    #[error("request could not be read")]
    BadRequest,
    /// Anything else on the device (storage, a corrupt state file): the log says which.
    #[error("device storage error")]
    DeviceError,
    /// With trusted keys: the signed model list gives no SHA-256, size or chunk count for it,
    /// so nothing the signature covers could check its bytes.
    #[error("not installable: the signed model list gives no SHA-256, size or chunk count for it")]
    NotSigned,
    /// With trusted keys: the model list stored on the device does not verify against its
    /// signature (changed on the device); a refresh fetches it again.
    #[error("model list on the device failed its signature check")]
    ModelListNotVerified,
    /// modeld could not start this artifact on this device; it is not downloaded again until
    /// the model list publishes other bytes for it.
    #[error("this model's file failed to start on this device; the built-in model stays in use")]
    FailedToStart,
}

impl FailReason {
    /// The reason a failed request shows, decided from the error's kind only.
    pub fn of(e: &Error) -> Self {
        use downloader::Error as D;
        match e {
            Error::Download(D::InsufficientSpace { .. }) => FailReason::NoSpace,
            Error::Download(D::Io(_)) => FailReason::DeviceError,
            Error::Download(D::NotSigned { .. }) => FailReason::NotSigned,
            Error::CatalogNotTrusted { .. } => FailReason::ModelListNotVerified,
            Error::Download(_) | Error::NotVerified { .. } => FailReason::NotVerified,
            Error::UnknownModel { .. } => FailReason::NotInList,
            Error::NoCatalog { .. } | Error::CatalogTooLarge { .. } => FailReason::NoModelList,
            Error::BuiltinMissing { .. } => FailReason::BuiltinMissing,
            Error::FailedToStart { .. } => FailReason::FailedToStart,
            Error::Busy { .. } => FailReason::Busy,
            Error::Io(_)
            | Error::Lock { .. }
            | Error::BadParamKey { .. }
            | Error::CorruptState { .. }
            | Error::TrustStateUnreadable { .. }
            | Error::Onroad { .. }
            | Error::ExternalGpuRequired { .. }
            | Error::Manifest(_)
            | Error::Crashed { .. }
            | Error::DataDir { .. }
            | Error::TrustedKeysUnusable(_)
            | Error::GenerationDisagrees { .. }
            | Error::HeldBack(_) => FailReason::DeviceError,
        }
    }
}

/// One finished transfer, as the log says it ([`Progress::Fetched`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The model (or variant file) fetched.
    pub what: String,
    /// The artifact's size.
    pub size: u64,
    /// The bytes this run moved (less than `size` for a resumed download).
    pub moved: u64,
    pub took: std::time::Duration,
    /// The origin that served it, by name.
    pub origin: String,
    /// The origins tried before it, by name: a fallback.
    pub after: Vec<String>,
}

impl fmt::Display for Fetched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use cli_support::progress as units;
        write!(
            f,
            "downloaded {}: {} in {} from {} ({})",
            self.what,
            units::bytes(self.size),
            units::took(self.took),
            self.origin,
            units::rate(self.moved, self.took)
        )?;
        if self.moved < self.size {
            write!(
                f,
                ", resumed: {} were staged",
                units::bytes(self.size - self.moved)
            )?;
        }
        if !self.after.is_empty() {
            write!(f, ", after {} failed", self.after.join(", "))?;
        }
        Ok(())
    }
}

/// How far the current download is: `done` of `total` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transferred {
    pub done: u64,
    pub total: u64,
}

impl Transferred {
    /// The whole percentage done (100 for an empty download).
    pub fn percent(self) -> u64 {
        match self.total {
            0 => 100,
            t => self.done.min(t) * 100 / t,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Progress {
    /// `"42%"` of the current download (the UI sees the percentage; a terminal the bytes).
    #[error("{}%", .0.percent())]
    Percent(Transferred),
    /// `"Verifying authenticity..."`.
    #[error("Verifying authenticity...")]
    Verifying,
    /// `"Downloaded!"`.
    #[error("Downloaded!")]
    Downloaded,
    /// A finished transfer, for the log and a terminal, never the UI (see [`Progress::for_ui`]):
    /// `"downloaded pop223: 12.00 MiB in 3.2 s from GitHub (3.75 MiB/s), after Hugging Face"`.
    #[error("{0}")]
    Fetched(Fetched),
    /// `"<name>: 42%"`: download-all's percentage, naming the model it is about.
    #[error("{}: {}%", .0.0, .1.percent())]
    PercentOf(DisplayName, Transferred),
    /// `"Built-in model already downloaded."`.
    #[error("Built-in model already downloaded.")]
    BuiltinAlreadyDownloaded,
    /// `"Local model, nothing to download."`.
    #[error("Local model, nothing to download.")]
    LocalNothingToDownload,
    /// `"Downloading selected model \"<id>\"..."` (a migration keeping the selection).
    #[error("Downloading selected model \"{0}\"...")]
    DownloadingSelected(ModelId),
    /// `"Downloading \"<name>\"..."` (download-all, one model).
    #[error("Downloading \"{}\"...", .0.0)]
    Downloading(DisplayName),
    /// `"All models downloaded!"`.
    #[error("All models downloaded!")]
    AllDownloaded,
    /// `"Request received; it starts when the model list check ends..."`: a request the daemon
    /// read while a refresh runs (acknowledged within a second, whatever the origins do).
    #[error("Request received; it starts when the model list check ends...")]
    AfterRefresh,
    /// `"Download cancelled..."`.
    #[error("Download cancelled...")]
    Cancelled,
    /// `"Hugging Face and GitHub are offline..."`.
    #[error("Hugging Face and GitHub are offline...")]
    Offline,
    /// `"Selected model unavailable; using built-in model."`.
    #[error("Selected model unavailable; using built-in model.")]
    SelectedUnavailable,
    /// `"Selected model download failed; using built-in model until it downloads."`: a
    /// temporary fallback (the model is in the catalog; later refreshes retry it).
    #[error("Selected model download failed; using built-in model until it downloads.")]
    SelectedRetrying,
    /// `"Model update download failed; using the installed version until it downloads."`: the
    /// catalog republished the selected model, the new bytes could not be had yet, and the
    /// verified older copy stays in use.
    #[error("Model update download failed; using the installed version until it downloads.")]
    UpdateRetrying,
    /// `"External GPU required..."` (a GPU-only model without a ready Chestnut).
    #[error("External GPU required...")]
    ExternalGpuRequired,
    /// `"Not yet: the model is still being published; trying again in 2 min..."`: the store's
    /// files do not match its manifest yet (a republish in progress). No failure; the request
    /// is kept and tried again after this long.
    #[error("Not yet: the model is still being published; trying again in {}...", Wait(*.0))]
    NotYet(std::time::Duration),
    /// `"Not enough free space: 1.20 GiB more needed; the update installs once it is free."`: a
    /// refresh blocked on space (`short` bytes beyond what is free now); nothing to do but free
    /// space, the daemon's next refresh installs it.
    #[error(
        "Not enough free space: {} more needed; the update installs once it is free.",
        cli_support::progress::bytes(*short)
    )]
    NoSpace { short: u64 },
    /// `"Today's download budget for this model is used up; it downloads tomorrow, or now if
    /// you ask for it."`: the automatic refresh held the selection back by the daily byte
    /// budget (`budget::HeldBack`). Not a failure; a request from the UI is served at once.
    #[error(
        "Today's download budget for this model is used up; it downloads tomorrow, or now if you ask for it."
    )]
    HeldBack,
    /// `"Download failed: <reason>"`.
    #[error("Download failed: {0}")]
    Failed(FailReason),
    /// `"Model list refused: <why>"`: the manifest was not signed as the trusted keys require
    /// (`manifest::signature::Refusal::ui_text`).
    #[error("{}", .0.ui_text())]
    ManifestRefused(Refusal),
    /// `"Model downloads paused: openpilot's tinygrad <12 hex> has no model generation; update
    /// openpilot."` (or, `None`, `"...tinygrad version cannot be read..."`): the openpilot tree's
    /// tinygrad is no generation's pin, so nothing is changed (see `tree`).
    #[error("{}", tree_unknown(.0.as_ref()))]
    TreeUnknown(Option<GitCommit>),
    /// `"Running <id> (<variant>, sha256 <12 hex>), fallback: <reason or none>"`: what modeld
    /// runs, from its load receipt (contracts with one), written when it changes.
    #[error(
        "Running {id} ({variant}, sha256 {}), fallback: {}",
        &sha256.to_hex()[..12],
        fallback.unwrap_or("none")
    )]
    Running {
        id: ModelId,
        variant: &'static str,
        sha256: manifest::Sha256Digest,
        fallback: Option<&'static str>,
    },
}

impl Progress {
    /// Whether the UI's `ModelDownloadProgress` shows it: everything but a finished transfer's
    /// log line ([`Progress::Fetched`]).
    pub fn for_ui(&self) -> bool {
        !matches!(self, Progress::Fetched(_))
    }
}

/// `Progress::TreeUnknown`'s text.
fn tree_unknown(commit: Option<&GitCommit>) -> String {
    match commit {
        Some(commit) => format!(
            "Model downloads paused: openpilot's tinygrad {} has no model generation; update openpilot.",
            &commit.as_str()[..12]
        ),
        None => "Model downloads paused: openpilot's tinygrad version cannot be read; update \
                 openpilot."
            .to_string(),
    }
}

/// A wait in the driver's words: whole seconds under a minute, else minutes rounded up.
struct Wait(std::time::Duration);

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_secs() {
            s if s < 60 => write!(f, "{} s", s.max(1)),
            s => write!(f, "{} min", s.div_ceil(60)),
        }
    }
}

/// Where progress goes: the UI's memory param, a terminal, a test's log.
pub type ProgressFn<'a> = &'a (dyn Fn(&Progress) + Sync);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_upstreams() {
        let id: ModelId = "pop223".parse().unwrap();
        for (p, text) in [
            (
                Progress::Percent(Transferred {
                    done: 420,
                    total: 1000,
                }),
                "42%",
            ),
            (Progress::Verifying, "Verifying authenticity..."),
            (Progress::Downloaded, "Downloaded!"),
            (
                Progress::Running {
                    id: "pop226".parse().unwrap(),
                    variant: "small",
                    sha256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
                        .parse()
                        .unwrap(),
                    fallback: Some("selected-load-failed"),
                },
                "Running pop226 (small, sha256 0123456789ab), fallback: selected-load-failed",
            ),
            (
                Progress::Failed(FailReason::FailedToStart),
                "Download failed: this model's file failed to start on this device; the built-in \
                 model stays in use",
            ),
            (
                Progress::Failed(FailReason::BadRequest),
                "Download failed: request could not be read",
            ),
            (
                Progress::BuiltinAlreadyDownloaded,
                "Built-in model already downloaded.",
            ),
            (
                Progress::LocalNothingToDownload,
                "Local model, nothing to download.",
            ),
            (
                Progress::DownloadingSelected(id),
                "Downloading selected model \"pop223\"...",
            ),
            (
                Progress::Downloading(DisplayName("Pop".into())),
                "Downloading \"Pop\"...",
            ),
            (Progress::AllDownloaded, "All models downloaded!"),
            (Progress::Cancelled, "Download cancelled..."),
            (Progress::Offline, "Hugging Face and GitHub are offline..."),
            (
                Progress::SelectedUnavailable,
                "Selected model unavailable; using built-in model.",
            ),
            (
                Progress::SelectedRetrying,
                "Selected model download failed; using built-in model until it downloads.",
            ),
            (
                Progress::UpdateRetrying,
                "Model update download failed; using the installed version until it downloads.",
            ),
            (Progress::ExternalGpuRequired, "External GPU required..."),
            (
                Progress::HeldBack,
                "Today's download budget for this model is used up; it downloads tomorrow, or now if you ask for it.",
            ),
            (
                Progress::NoSpace { short: 3 << 29 },
                "Not enough free space: 1.50 GiB more needed; the update installs once it is free.",
            ),
            (
                Progress::NotYet(std::time::Duration::from_secs(120)),
                "Not yet: the model is still being published; trying again in 2 min...",
            ),
            (
                Progress::NotYet(std::time::Duration::from_secs(2)),
                "Not yet: the model is still being published; trying again in 2 s...",
            ),
            (
                Progress::NotYet(std::time::Duration::from_secs(90)),
                "Not yet: the model is still being published; trying again in 2 min...",
            ),
            (
                Progress::NotYet(std::time::Duration::from_millis(300)),
                "Not yet: the model is still being published; trying again in 1 s...",
            ),
            (
                Progress::Failed(FailReason::NoSpace),
                "Download failed: not enough free space",
            ),
            (
                Progress::ManifestRefused(Refusal::Unsigned),
                "Model list refused: not signed",
            ),
        ] {
            assert_eq!(p.to_string(), text);
        }
    }

    /// The pause (see `tree`) names the tree's tinygrad, says what to do in the driver's words,
    /// and reads like no shell hint.
    #[test]
    fn the_pause_names_the_tinygrad() {
        let pin: GitCommit = "26262626262626262626262626262626262626aa".parse().unwrap();
        for (p, text) in [
            (
                Progress::TreeUnknown(Some(pin)),
                "Model downloads paused: openpilot's tinygrad 262626262626 has no model \
                 generation; update openpilot.",
            ),
            (
                Progress::TreeUnknown(None),
                "Model downloads paused: openpilot's tinygrad version cannot be read; update \
                 openpilot.",
            ),
        ] {
            let shown = p.to_string();
            assert_eq!(shown, text);
            assert!(
                !shown.contains('`') && !shown.contains("run ") && !shown.contains('/'),
                "{shown}"
            );
        }
    }

    /// Every error a request can end with maps to a reason, and no driver text reads like a
    /// shell hint (a backtick, "run", "--flag", a path).
    #[test]
    fn failures_are_driver_texts_never_cli_hints() {
        let io = || std::io::Error::other("disk");
        let g = || "v25".to_string();
        let cases = [
            (
                Error::NoCatalog { generation: g() },
                FailReason::NoModelList,
            ),
            (
                Error::UnknownModel {
                    id: "gone223".into(),
                    generation: g(),
                },
                FailReason::NotInList,
            ),
            (
                Error::Busy {
                    path: "/data/models/.manager.lock".into(),
                },
                FailReason::Busy,
            ),
            (
                Error::CorruptState {
                    path: "/data/models/x.json".into(),
                    message: "eof".into(),
                },
                FailReason::DeviceError,
            ),
            (Error::Io(io()), FailReason::DeviceError),
            (
                Error::Lock {
                    path: "/data/models".into(),
                    source: io(),
                },
                FailReason::DeviceError,
            ),
            (
                Error::BuiltinMissing {
                    path: "/data/openpilot".into(),
                },
                FailReason::BuiltinMissing,
            ),
            (
                Error::CatalogTooLarge { size: 9, limit: 1 },
                FailReason::NoModelList,
            ),
            (
                Error::Crashed {
                    effect: 1,
                    what: "x".into(),
                },
                FailReason::DeviceError,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(FailReason::of(&e), want, "{e}");
            // The operator's message says what to run; the driver's text never does.
            let operator = e.to_string();
            let driver = Progress::Failed(FailReason::of(&e)).to_string();
            assert!(
                !driver.contains('`') && !driver.contains("run ") && !driver.contains("--"),
                "{driver:?} (from {operator:?})"
            );
            assert!(!driver.contains('/'), "{driver:?} names a path");
        }
    }
}
