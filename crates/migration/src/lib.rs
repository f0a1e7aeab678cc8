//! Device state and the crash-safe generation migration of the StarPilot model manager.
//!
//! It owns the comma's layout (`<data>/models`, `<data>/params/d`, the memory params), reads and
//! writes params the way openpilot does, keeps one manager at a time with a file lock, decides
//! what a generation change deletes (a pure plan over file names), runs the migration as a
//! journaled state machine that survives kill -9 at any instant, and answers `resolve` with a
//! verified path only.
//!
//! It does not speak HTTP (that is `downloader`) or parse command lines (that is the
//! `device-modeld-manager` binary).

pub mod bounded;
pub mod budget;
pub mod choice;
pub mod commands;
pub mod contract;
pub mod daemon;
mod decisions;
mod device;
pub mod downloads;
pub mod effects;
mod error;
mod floor;
mod journal;
pub mod layout;
pub mod load_receipt;
pub mod lock;
mod manager;
pub mod next_step;
mod offline;
pub mod open;
pub mod params;
pub mod plan;
pub mod preview;
pub mod progress;
pub mod render;
pub mod report;
mod resolve;
pub mod shape;
pub mod tree;
pub mod trust_state;
mod verify;
pub mod view;

pub use contract::is_builtin_id;
pub use device::{
    CATALOG_FILE, CATALOG_SIGNATURE_FILE, Device, DeviceConfig, ExpectedDigest, JOURNAL_FILE,
    REFUSED_FILE, RefusedModel, VERIFIED_FILE, VerifyState,
};
pub use downloads::{AllDownloads, DownloadReport, download_all, download_model, downloadable};
pub use effects::{Effect, Effects};
pub use error::{Error, Result};
pub use journal::{Journal, Phase, read_journal};
pub use lock::ManagerLock;
pub use manager::{
    GcPlan, GcReport, RefreshReport, gc, install, install_target, refresh, refresh_as, refresh_at,
};
pub use params::Params;
pub use progress::{DisplayName, FailReason, Progress, ProgressFn, Transferred};
