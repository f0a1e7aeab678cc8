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

mod error;
pub mod report;
pub mod rules;
pub mod run;
pub mod state;

// The modules' paths before the folders (updated in the next commit).
pub use report::{progress, render};
pub use rules::{budget, choice, contract, next_step, plan, shape};
use rules::{decisions, floor};
pub use run::{commands, daemon, downloads, lock, open, preview};
use run::{manager, offline};
pub use state::{bounded, effects, layout, load_receipt, params, tree, trust_state, view};
use state::{device, journal};

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
    GcPlan, GcReport, RefreshReport, Run, gc, install, install_target, refresh, unix_now,
};
pub use params::Params;
pub use progress::{DisplayName, FailReason, Progress, ProgressFn, Transferred};
