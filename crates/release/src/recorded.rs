//! Values more than one part of the gate records and reads: the rehearsal's record ([`RehearsalRecord`], its checks and the manifest
//! digest it binds). A leaf: it uses no other module of this crate, so `gate`, `records` and
//! `rehearse` (which re-export these) do not import each other in a circle.

use std::fmt;
use std::path::PathBuf;

use chunker::Sha256Digest;
use manifest::{Generation, GitCommit, Manifest, ModelId, UnixSeconds};
use serde::{Deserialize, Serialize};

/// Which device a check was made on.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    /// The staged release and the openpilot tree, before any device.
    Release,
    /// An old device whose selected model is in the new catalog: it must end on the new bytes.
    Kept,
    /// An old device whose selected model the new catalog dropped: it must end on the built-in.
    Dropped,
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scenario::Release => "release",
            Scenario::Kept => "kept",
            Scenario::Dropped => "dropped",
        })
    }
}

/// One check of the rehearsal and what was seen.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct RehearsalCheck {
    pub scenario: Scenario,
    /// A short stable name (`no_old_driving_artifact`, `selected_is_new_artifact`, …).
    pub check: String,
    pub passed: bool,
    /// What was seen (on failure: what is wrong and where).
    pub detail: String,
}

/// `results/rehearsal.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RehearsalRecord {
    pub generation: Generation,
    /// The generation the old devices were on.
    pub previous_generation: Generation,
    pub manifest: PathBuf,
    /// The SHA-256 of the manifest's canonical bytes (what `publish` writes and records).
    pub manifest_sha256: Sha256Digest,
    pub tinygrad_commit: Option<GitCommit>,
    pub openpilot: PathBuf,
    pub device_manager: PathBuf,
    /// How the device was told where its tree is: `--openpilot-dir DIR` (it follows the tree:
    /// generation and built-in come from it).
    pub device_args: Vec<String>,
    /// The `kept` device's selected model, and the `dropped` device's (absent from the catalog).
    pub selected: ModelId,
    pub dropped: ModelId,
    pub checks: Vec<RehearsalCheck>,
    pub passed: bool,
    #[serde(with = "cli_support::time::rfc3339_field")]
    pub finished_at: UnixSeconds,
    /// The devices, the staged store and the manager's logs.
    pub work_dir: PathBuf,
}

impl RehearsalRecord {
    pub fn failures(&self) -> impl Iterator<Item = &RehearsalCheck> {
        self.checks.iter().filter(|c| !c.passed)
    }
}

/// The SHA-256 the rehearsal and the publish record bind a manifest by.
pub fn manifest_digest(m: &Manifest) -> Sha256Digest {
    Sha256Digest::of_bytes(&m.to_canonical_bytes())
}
