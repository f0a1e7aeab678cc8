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
//!
//! # Reading order
//!
//! Four folders, read in this order; each folder's own page gives the order inside it.
//!
//! 1. [`state`]: what is on the device and how it is read and written (params, the files of each
//!    generation, the journal, the trust state, the openpilot tree, modeld's load receipt, the
//!    view a command decides from).
//! 2. [`rules`]: the decisions over values already read (the contract with modeld and the UIs,
//!    the user's choice, what is deleted, what a refresh or download does, the rollback floor,
//!    the byte budget, the exit codes). No module here depends on `run`.
//! 3. [`run`]: what acts on the device (the lock, opening the device, the operations and the
//!    migration's state machine, the dry runs, the daemon, each command).
//! 4. [`report`]: what a command reports (the typed reports, the UI's progress texts, and how
//!    the binary renders each).
//!
//! [`Error`] (at the root) is the one error type of all four.

mod error;
pub mod report;
pub mod rules;
pub mod run;
pub mod state;

pub use error::{Error, Result};
pub use report::progress::{DisplayName, FailReason, Progress, ProgressFn, Transferred};
pub use rules::contract::is_builtin_id;
pub use run::downloads::{
    AllDownloads, DownloadReport, download_all, download_model, downloadable,
};
pub use run::lock::ManagerLock;
pub use run::manager::{
    GcPlan, GcReport, RefreshReport, Run, gc, install, install_target, refresh,
};
pub use state::device::{
    CATALOG_FILE, CATALOG_SIGNATURE_FILE, Device, DeviceConfig, ExpectedDigest, JOURNAL_FILE,
    REFUSED_FILE, RefusedModel, VERIFIED_FILE, VerifyState,
};
pub use state::effects::{Effect, Effects};
pub use state::journal::{Journal, Phase, read_journal};
pub use state::params::Params;
