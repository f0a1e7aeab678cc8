//! Progress, typed. Every text the manager shows in `ModelDownloadProgress` (the UI reads it
//! verbatim) is rendered here, in one place, with upstream's exact wording.

use std::fmt;

use manifest::ModelId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// `"42%"` of the current download.
    Percent(u64),
    /// `"Verifying authenticity..."`.
    Verifying,
    /// `"Downloaded!"`.
    Downloaded,
    /// `"Built-in model already downloaded."`.
    BuiltinAlreadyDownloaded,
    /// `"Local model, nothing to download."`.
    LocalNothingToDownload,
    /// `"Downloading selected model \"<id>\"..."` (a migration keeping the selection).
    DownloadingSelected(ModelId),
    /// `"Downloading \"<name>\"..."` (download-all, one model).
    Downloading(String),
    /// `"All models downloaded!"`.
    AllDownloaded,
    /// `"Download cancelled..."`.
    Cancelled,
    /// `"Hugging Face and GitHub are offline..."`.
    Offline,
    /// `"Selected model unavailable; using built-in model."`.
    SelectedUnavailable,
    /// `"Selected model download failed; using built-in model until it downloads."`: a
    /// temporary fallback (the model is in the catalog; later refreshes retry it).
    SelectedRetrying,
    /// `"Model update download failed; using the installed version until it downloads."`: the
    /// catalog republished the selected model, the new bytes could not be had yet, and the
    /// verified older copy stays in use.
    UpdateRetrying,
    /// `"External GPU required..."` (a GPU-only model without a ready Chestnut).
    ExternalGpuRequired,
    /// `"Download failed: <reason>"`.
    Failed(String),
    /// `"Model list refused: <why>"`: the manifest was not signed as the trusted keys require
    /// (`manifest::signature::Refusal::ui_text`).
    ManifestRefused(&'static str),
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Progress::Percent(p) => write!(f, "{p}%"),
            Progress::Verifying => f.write_str("Verifying authenticity..."),
            Progress::Downloaded => f.write_str("Downloaded!"),
            Progress::BuiltinAlreadyDownloaded => f.write_str("Built-in model already downloaded."),
            Progress::LocalNothingToDownload => f.write_str("Local model, nothing to download."),
            Progress::DownloadingSelected(id) => {
                write!(f, "Downloading selected model \"{id}\"...")
            }
            Progress::Downloading(name) => write!(f, "Downloading \"{name}\"..."),
            Progress::AllDownloaded => f.write_str("All models downloaded!"),
            Progress::Cancelled => f.write_str("Download cancelled..."),
            Progress::Offline => f.write_str("Hugging Face and GitHub are offline..."),
            Progress::SelectedUnavailable => {
                f.write_str("Selected model unavailable; using built-in model.")
            }
            Progress::SelectedRetrying => f.write_str(
                "Selected model download failed; using built-in model until it downloads.",
            ),
            Progress::UpdateRetrying => f.write_str(
                "Model update download failed; using the installed version until it downloads.",
            ),
            Progress::ExternalGpuRequired => f.write_str("External GPU required..."),
            Progress::Failed(reason) => write!(f, "Download failed: {reason}"),
            Progress::ManifestRefused(text) => f.write_str(text),
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
            (Progress::Percent(42), "42%"),
            (Progress::Verifying, "Verifying authenticity..."),
            (Progress::Downloaded, "Downloaded!"),
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
                Progress::Downloading("Pop".into()),
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
            (Progress::Failed("x".into()), "Download failed: x"),
        ] {
            assert_eq!(p.to_string(), text);
        }
    }
}
