//! The validation gate: the typed records `preflight` and `validate` leave in the rebuild
//! workspace's `results/`, and [`coverage`], the pure rule that decides whether they cover the
//! seed's validation matrix for one manifest.
//!
//! The matrix (seed, "Validation"): the repository tests passed in the openpilot checkout
//! (`preflight`); representative v8, v11, v12, v15, v16 and external-GPU artifacts validated at
//! both camera resolutions on the device with finite plan, lane-line, road-edge, lead, pose and
//! action outputs; a stable `modelV2` publication; DM `driverStateV2` at both resolutions. A
//! record counts only for the bytes and the tinygrad pin being published: a record of another
//! artifact SHA-256 or pin is stale. Every cell that is missing, failed or stale is reported, not
//! only the first.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use chunker::Sha256Digest;
use manifest::{BehaviorVersion, GitCommit, Manifest, ModelId, UnixSeconds};
use serde::{Deserialize, Serialize};

/// A camera resolution the driving model is compiled for (`1928x1208`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct CameraResolution {
    pub width: u32,
    pub height: u32,
}

/// The two camera resolutions every driving artifact and the DM warps are built for (the
/// `--camera-resolutions` of the compile and the `dm_warp_<W>x<H>_tinygrad.pkl` names).
pub const CAMERA_RESOLUTIONS: [CameraResolution; 2] = [
    CameraResolution {
        width: 1928,
        height: 1208,
    },
    CameraResolution {
        width: 1344,
        height: 760,
    },
];

impl fmt::Display for CameraResolution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.width, self.height)
    }
}

impl FromStr for CameraResolution {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("camera resolution {s:?}: expected WIDTHxHEIGHT, e.g. 1928x1208");
        let (w, h) = s.split_once('x').ok_or_else(bad)?;
        let num = |t: &str| {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            t.parse::<u32>().ok().filter(|n| *n > 0)
        };
        Ok(Self {
            width: num(w).ok_or_else(bad)?,
            height: num(h).ok_or_else(bad)?,
        })
    }
}

impl Serialize for CameraResolution {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CameraResolution {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// The behaviour versions the seed names as representative (each validated on one artifact).
pub const REPRESENTATIVE_VERSIONS: [BehaviorVersion; 5] = [
    BehaviorVersion::new(8),
    BehaviorVersion::new(11),
    BehaviorVersion::new(12),
    BehaviorVersion::new(15),
    BehaviorVersion::new(16),
];

/// The driving outputs the device must report finite at each resolution, as the verdict names
/// them.
pub const REQUIRED_OUTPUTS: [&str; 6] =
    ["plan", "lane_lines", "road_edges", "lead", "pose", "action"];

// ---- the records --------------------------------------------------------------------------

/// One command preflight ran in the openpilot checkout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandRun {
    /// The command line, as run from the checkout's root.
    pub argv: Vec<String>,
    /// Its exit code; `null` when it was killed by a signal or could not start.
    pub exit_code: Option<i32>,
    pub passed: bool,
    #[serde(with = "cli_support::time::rfc3339_field")]
    pub started_at: UnixSeconds,
    pub duration_ms: u64,
}

/// `results/preflight.json`: the repository tests in the openpilot checkout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreflightRecord {
    /// The checkout the commands ran in.
    pub openpilot: PathBuf,
    /// Its `HEAD`, when it is a git checkout.
    pub openpilot_commit: Option<GitCommit>,
    /// Whether `git status --porcelain` listed changes (tests ran on uncommitted work).
    pub openpilot_dirty: Option<bool>,
    /// The checkout's `tinygrad_repo/TINYGRAD_COMMIT`.
    pub tinygrad_commit: GitCommit,
    /// Every command run, in order; a failing command ends the run.
    pub commands: Vec<CommandRun>,
    /// Every command of the seed ran and exited 0.
    pub passed: bool,
    #[serde(with = "cli_support::time::rfc3339_field")]
    pub finished_at: UnixSeconds,
    /// The commands' combined output.
    pub log: PathBuf,
}

/// The device's verdict on one driving artifact at one camera resolution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolutionVerdict {
    pub resolution: CameraResolution,
    pub passed: bool,
    /// Why it did not pass (empty when it passed).
    pub problems: Vec<String>,
}

/// `results/<id>.validation.json`: one driving artifact validated on the device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidationRecord {
    pub model: ModelId,
    pub version: BehaviorVersion,
    /// The SHA-256 of the chunk set that was sent to the device.
    pub artifact_sha256: Sha256Digest,
    /// The tinygrad pin the device's marker was checked against.
    pub tinygrad_commit: GitCommit,
    #[serde(with = "cli_support::time::rfc3339_field")]
    pub checked_at: UnixSeconds,
    /// One verdict per camera resolution in [`CAMERA_RESOLUTIONS`].
    pub resolutions: Vec<ResolutionVerdict>,
    /// The device validator's own JSON, unchanged.
    pub verdict: serde_json::Value,
    pub log: PathBuf,
}

impl ValidationRecord {
    /// Every resolution passed.
    pub fn passed(&self) -> bool {
        CAMERA_RESOLUTIONS
            .iter()
            .all(|r| self.at(*r).is_some_and(|v| v.passed))
    }

    pub fn at(&self, r: CameraResolution) -> Option<&ResolutionVerdict> {
        self.resolutions.iter().find(|v| v.resolution == r)
    }
}

/// Read the device validator's verdict per camera resolution. The verdict passes a resolution
/// when `resolutions."<W>x<H>".passed` is true and every output in [`REQUIRED_OUTPUTS`] is
/// reported finite there (`finite.<output>: true`); when it names an `artifact_sha256`, that
/// must be the artifact that was sent. A top-level `passed` that is not true fails every
/// resolution unless a resolution's own failure explains it.
pub fn read_verdict(verdict: &serde_json::Value, sent: &Sha256Digest) -> Vec<ResolutionVerdict> {
    let mut common = Vec::new();
    if let Some(d) = verdict.get("artifact_sha256")
        && d.as_str() != Some(sent.to_string().as_str())
    {
        common.push(format!(
            "the device validated artifact_sha256 {d}, not the {sent} that was sent"
        ));
    }
    let mut verdicts: Vec<ResolutionVerdict> = CAMERA_RESOLUTIONS
        .iter()
        .map(|&resolution| {
            let mut problems = common.clone();
            let key = resolution.to_string();
            match verdict.get("resolutions").and_then(|r| r.get(&key)) {
                None => problems.push(format!(
                    "the verdict has no \"resolutions\".\"{key}\" result (the validator must \
                     report each camera resolution)"
                )),
                Some(r) => {
                    if r.get("passed").and_then(|v| v.as_bool()) != Some(true) {
                        problems.push(format!("{key}: not passed"));
                    }
                    for out in REQUIRED_OUTPUTS {
                        match r.get("finite").and_then(|f| f.get(out)) {
                            Some(serde_json::Value::Bool(true)) => {}
                            Some(serde_json::Value::Bool(false)) => {
                                problems.push(format!("{key}: {out} output is not finite"))
                            }
                            _ => problems.push(format!(
                                "{key}: the verdict does not say whether the {out} output is \
                                 finite"
                            )),
                        }
                    }
                }
            }
            ResolutionVerdict {
                resolution,
                passed: problems.is_empty(),
                problems,
            }
        })
        .collect();
    // An overall failure that no resolution explains fails them all; one that a resolution
    // explains leaves the other resolution's own result standing.
    if verdict.get("passed").and_then(|v| v.as_bool()) != Some(true)
        && verdicts.iter().all(|v| v.passed)
    {
        for v in &mut verdicts {
            v.passed = false;
            v.problems
                .push("the device's verdict is \"passed\": false".to_string());
        }
    }
    verdicts
}

/// A check that is not one artifact's validation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckKind {
    /// `modeld` publishes `modelV2` steadily (one record per generation).
    ModelV2,
    /// DM publishes `driverStateV2` (one record per camera resolution).
    DriverState,
}

impl CheckKind {
    /// Whether the check is made once per camera resolution.
    pub fn per_resolution(self) -> bool {
        matches!(self, CheckKind::DriverState)
    }
}

impl fmt::Display for CheckKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CheckKind::ModelV2 => "model-v2",
            CheckKind::DriverState => "driver-state",
        })
    }
}

impl FromStr for CheckKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "model-v2" => Ok(CheckKind::ModelV2),
            "driver-state" => Ok(CheckKind::DriverState),
            _ => Err(format!(
                "check {s:?}: expected model-v2 (stable modelV2 from modeld) or driver-state \
                 (DM driverStateV2)"
            )),
        }
    }
}

/// `results/<check>[.<W>x<H>].check.json`: a check made on the device by the release engineer
/// (starting `modeld` and watching `modelV2`; DM's `driverStateV2`), recorded with who made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckRecord {
    pub check: CheckKind,
    /// For `driver-state`: the camera resolution checked.
    pub resolution: Option<CameraResolution>,
    /// For `model-v2`: the model `modeld` ran.
    pub model: Option<ModelId>,
    pub passed: bool,
    /// The tinygrad pin of the build that was checked.
    pub tinygrad_commit: GitCommit,
    pub checked_by: String,
    #[serde(with = "cli_support::time::rfc3339_field")]
    pub checked_at: UnixSeconds,
    /// What was observed.
    pub note: String,
    /// The artifacts the check was made on: each model's chunk-set SHA-256 in the workspace's
    /// `ready/` when it was recorded (with `--model`, that model's only). The check is current
    /// only while the manifest still lists one of them (that model's, with `--model`): a rebuild
    /// of every artifact makes it stale. Empty in a record written before checks were bound to
    /// artifacts, which is stale.
    #[serde(default)]
    pub artifacts: BTreeMap<ModelId, Sha256Digest>,
}

/// Every record found in a workspace's `results/`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Records {
    pub preflight: Option<PreflightRecord>,
    pub validations: Vec<ValidationRecord>,
    pub checks: Vec<CheckRecord>,
    /// `results/rehearsal.json`, the last `release-cli rehearse`.
    pub rehearsal: Option<crate::recorded::RehearsalRecord>,
    /// The openpilot checkout as it is now, which the preflight record must be of
    /// ([`preflight_binding`]); `None`: not looked at (no tree to compare with).
    pub tree: Option<TreeNow>,
}

/// The openpilot checkout as it is when the gate runs, observed by
/// [`crate::preflight::tree_now`] (the I/O); the preflight record is compared with it by the
/// pure [`preflight_binding`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeNow {
    /// The checkout the release is cut from (`--openpilot`, else the one the record names).
    pub openpilot: PathBuf,
    /// The record names another checkout than `--openpilot` (both resolved to their real
    /// paths).
    pub foreign: bool,
    /// Its `HEAD` now (`None`: not a git checkout, or git could not tell).
    pub commit: Option<GitCommit>,
    /// Whether it has uncommitted changes now (`None`: not known).
    pub dirty: Option<bool>,
}

// ---- the coverage rule --------------------------------------------------------------------

/// What a driving-validation cell asks for.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Subject {
    /// One QCOM artifact of this behaviour version.
    Version(BehaviorVersion),
    /// One external-GPU (`uses_external_gpu`) artifact.
    Gpu,
    /// This artifact: the device failed it, and it is in the manifest being published.
    Model(ModelId),
}

/// One cell of the matrix.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Cell {
    Preflight,
    Driving(Subject, CameraResolution),
    ModelV2,
    DriverState(CameraResolution),
    /// `release-cli rehearse` of these manifest bytes on old-generation devices.
    Rehearsal,
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cell::Preflight => f.write_str("preflight (./dev sync and the repository tests)"),
            Cell::Driving(Subject::Version(v), r) => write!(f, "{v} artifact at {r}"),
            Cell::Driving(Subject::Gpu, r) => write!(f, "external-GPU artifact at {r}"),
            Cell::Driving(Subject::Model(id), r) => write!(f, "{id} at {r}"),
            Cell::ModelV2 => f.write_str("stable modelV2 from modeld"),
            Cell::DriverState(r) => write!(f, "DM driverStateV2 at {r}"),
            Cell::Rehearsal => f.write_str("rehearsal of this manifest on old-generation devices"),
        }
    }
}

/// Why a cell is not covered.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Gap {
    /// No record; `next` says which command makes one.
    Missing { next: String },
    /// A current record that did not pass.
    Failed { detail: String },
    /// A record of other bytes, another behaviour version or another pin.
    Stale { detail: String },
}

/// The gate's answer for one manifest.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Coverage {
    /// Covered cells, each with the record that covers it.
    pub covered: Vec<(Cell, String)>,
    /// Every cell that is missing, failed or stale, in matrix order.
    pub gaps: Vec<(Cell, Gap)>,
    /// Representative versions the manifest has no artifact of (nothing to validate).
    pub not_in_manifest: Vec<BehaviorVersion>,
    /// Whether the manifest has an external-GPU artifact.
    pub has_gpu: bool,
}

impl Coverage {
    pub fn is_complete(&self) -> bool {
        self.gaps.is_empty()
    }

    /// A cell's verdict: covered by the record named, or its gap.
    fn add(&mut self, cell: Cell, verdict: Result<String, Gap>) {
        match verdict {
            Ok(by) => self.covered.push((cell, by)),
            Err(gap) => self.gaps.push((cell, gap)),
        }
    }

    /// One line per gap: `<cell>: missing|failed|stale: <detail>`.
    pub fn gap_lines(&self) -> Vec<String> {
        self.gaps
            .iter()
            .map(|(cell, gap)| match gap {
                Gap::Missing { next } => format!("{cell}: missing: {next}"),
                Gap::Failed { detail } => format!("{cell}: failed: {detail}"),
                Gap::Stale { detail } => format!("{cell}: stale: {detail}"),
            })
            .collect()
    }
}

/// Whether `records` cover the seed's validation matrix for `manifest`: the pure rule behind
/// `publish`'s validation gate (see the module docs for the matrix).
///
/// A representative version (or the GPU row) is required when the manifest lists an artifact of
/// it; it is covered at a resolution by one current, passing validation of any such artifact.
/// Current means the record's `artifact_sha256` is the manifest entry's, its behaviour version
/// the entry's `version` and its pin the manifest's `tinygrad_commit`. Of several records of one
/// model and artifact digest the newest (`checked_at`; a failure on a tie) is the one that
/// counts, so an older pass never hides a current failure ([`newest`]). A current record that
/// failed an artifact the manifest lists is a gap of its own, even when another artifact covers
/// its row: a known-bad artifact is not published.
///
/// The device checks (`model-v2`, `driver-state`) count, newest first likewise, only while the
/// manifest lists an artifact they were made on ([`check_binding`]). A preflight record that
/// says `passed` although a command in it failed, or that lists no command, is refused as
/// failed ([`preflight_contradiction`]).
pub fn coverage(manifest: &Manifest, records: &Records) -> Coverage {
    let pin = manifest.own_revision();
    let pin = pin.as_ref();
    let mut cov = Coverage::default();
    cov.add(Cell::Preflight, preflight_cell(records, pin));
    let published = published(manifest);
    driving_cells(&mut cov, &published, records, pin);
    // modelV2 once, driverStateV2 per resolution.
    let model_v2 = check_cell(records, manifest, pin, CheckKind::ModelV2, None);
    cov.add(Cell::ModelV2, model_v2);
    for res in CAMERA_RESOLUTIONS {
        let state = check_cell(records, manifest, pin, CheckKind::DriverState, Some(res));
        cov.add(Cell::DriverState(res), state);
    }
    if let Some(gap) = rehearsal_gap(manifest, records.rehearsal.as_ref()) {
        cov.gaps.push((Cell::Rehearsal, gap));
    } else if let Some(r) = &records.rehearsal {
        cov.covered.push((
            Cell::Rehearsal,
            format!(
                "rehearsed {} -> {} at {}",
                r.previous_generation, r.generation, r.finished_at
            ),
        ));
    }
    cov
}

/// Why a record made with tinygrad `recorded` is not current for a manifest pinned to `pin`.
fn pin_problem(pin: Option<&GitCommit>, recorded: &GitCommit) -> Option<String> {
    match pin {
        None => Some(format!(
            "the manifest records no tinygrad revision ({}) to compare with",
            manifest::contract::CONTRACTS
                .iter()
                .map(|c| c.revision_key)
                .collect::<Vec<_>>()
                .join(" or ")
        )),
        Some(p) if p != recorded => Some(format!(
            "recorded with tinygrad {recorded}, the manifest is pinned to {p}"
        )),
        Some(_) => None,
    }
}

/// The preflight cell's verdict.
fn preflight_cell(records: &Records, pin: Option<&GitCommit>) -> Result<String, Gap> {
    let Some(p) = &records.preflight else {
        return Err(Gap::Missing {
            next: "run `release-cli preflight --openpilot DIR --workspace WS` (DIR: the \
                   openpilot checkout)"
                .into(),
        });
    };
    if let Some(detail) =
        pin_problem(pin, &p.tinygrad_commit).or_else(|| preflight_binding(p, records.tree.as_ref()))
    {
        return Err(Gap::Stale { detail });
    }
    if let Some(detail) = preflight_contradiction(p) {
        return Err(Gap::Failed {
            detail: format!(
                "{detail}; the record cannot be trusted: run `release-cli preflight \
                 --openpilot DIR --workspace WS` again (see {})",
                p.log.display()
            ),
        });
    }
    if !p.passed {
        let failed = p
            .commands
            .iter()
            .find(|c| !c.passed)
            .map(|c| {
                format!(
                    "`{}` exited {}",
                    c.argv.join(" "),
                    c.exit_code
                        .map_or("by a signal".to_string(), |c| c.to_string())
                )
            })
            .unwrap_or_else(|| "not every command ran".to_string());
        return Err(Gap::Failed {
            detail: format!("{failed} (see {})", p.log.display()),
        });
    }
    Ok(format!(
        "preflight of {} at {}",
        p.openpilot.display(),
        p.finished_at
    ))
}

/// An artifact the manifest publishes, with the row it belongs to: its model, behaviour
/// version, whether it is an external-GPU one, and its digest.
type Published<'a> = (&'a ModelId, BehaviorVersion, bool, Sha256Digest);

fn published(manifest: &Manifest) -> Vec<Published<'_>> {
    manifest
        .models()
        .iter()
        .filter(|e| !e.id().is_local())
        .filter_map(|e| {
            Some((
                e.id(),
                e.version()?,
                e.uses_external_gpu(),
                e.artifact_sha256()?,
            ))
        })
        .collect()
}

/// The record that counts for an entry: the newest of its bytes, else the newest of any.
fn record_of<'a>(
    records: &'a Records,
    id: &ModelId,
    sha: &Sha256Digest,
) -> Option<&'a ValidationRecord> {
    let of_model = || records.validations.iter().filter(|r| &r.model == id);
    newest(of_model().filter(|r| &r.artifact_sha256 == sha), |r| {
        (r.checked_at, r.passed())
    })
    .or_else(|| newest(of_model(), |r| (r.checked_at, r.passed())))
}

/// Why a record is not current for an entry: other bytes, version or pin.
fn staleness(
    r: &ValidationRecord,
    version: BehaviorVersion,
    sha: &Sha256Digest,
    pin: Option<&GitCommit>,
) -> Option<String> {
    if &r.artifact_sha256 != sha {
        return Some(format!(
            "{} was validated as artifact_sha256 {}, the manifest lists {sha}",
            r.model, r.artifact_sha256
        ));
    }
    if r.version != version {
        return Some(format!(
            "{} was validated as behaviour version {}, the manifest lists {version}",
            r.model, r.version
        ));
    }
    pin_problem(pin, &r.tinygrad_commit).map(|d| format!("{}: {d}", r.model))
}

/// The driving cells: each representative version's row (and the GPU row) at each resolution,
/// then every current failure of a published artifact outside its row's cover.
fn driving_cells(
    cov: &mut Coverage,
    published: &[Published<'_>],
    records: &Records,
    pin: Option<&GitCommit>,
) {
    // Failures already named in a row's gap, so they are not listed twice.
    let mut named_failures: BTreeSet<(ModelId, CameraResolution)> = BTreeSet::new();
    let mut rows: Vec<Subject> = Vec::new();
    for v in REPRESENTATIVE_VERSIONS {
        if published.iter().any(|(_, ver, gpu, _)| *ver == v && !gpu) {
            rows.push(Subject::Version(v));
        } else {
            cov.not_in_manifest.push(v);
        }
    }
    cov.has_gpu = published.iter().any(|(_, _, gpu, _)| *gpu);
    if cov.has_gpu {
        rows.push(Subject::Gpu);
    }
    for row in rows {
        let candidates: Vec<_> = published
            .iter()
            .filter(|(_, ver, gpu, _)| match row {
                Subject::Version(v) => *ver == v && !gpu,
                _ => *gpu,
            })
            .collect();
        for res in CAMERA_RESOLUTIONS {
            let verdict = row_cell(&candidates, records, pin, res, &mut named_failures);
            cov.add(Cell::Driving(row.clone(), res), verdict);
        }
    }
    for (id, version, _, sha) in published {
        let Some(r) = record_of(records, id, sha) else {
            continue;
        };
        if staleness(r, *version, sha, pin).is_some() {
            continue;
        }
        for v in &r.resolutions {
            if !v.passed && !named_failures.contains(&((*id).clone(), v.resolution)) {
                let cell = Cell::Driving(Subject::Model((*id).clone()), v.resolution);
                cov.gaps.push((
                    cell,
                    Gap::Failed {
                        detail: format!(
                            "the device failed this published artifact: {}",
                            v.problems.join("; ")
                        ),
                    },
                ));
            }
        }
    }
}

/// A row's cell at `res`: covered by one current pass of any of its `candidates`; else their
/// current failures (added to `named_failures`), else why their records are stale, else missing.
fn row_cell(
    candidates: &[&Published<'_>],
    records: &Records,
    pin: Option<&GitCommit>,
    res: CameraResolution,
    named_failures: &mut BTreeSet<(ModelId, CameraResolution)>,
) -> Result<String, Gap> {
    let mut failed = Vec::new();
    let mut stale = Vec::new();
    for (id, version, _, sha) in candidates {
        let Some(r) = record_of(records, id, sha) else {
            continue;
        };
        if let Some(s) = staleness(r, *version, sha, pin) {
            stale.push(s);
            continue;
        }
        match r.at(res) {
            Some(v) if v.passed => return Ok(format!("{id} validated at {}", r.checked_at)),
            Some(v) => failed.push(((*id).clone(), v.problems.join("; "))),
            None => failed.push(((*id).clone(), format!("the record has no {res} verdict"))),
        }
    }
    if !failed.is_empty() {
        let detail: Vec<String> = failed.iter().map(|(id, d)| format!("{id}: {d}")).collect();
        named_failures.extend(failed.into_iter().map(|(id, _)| (id, res)));
        return Err(Gap::Failed {
            detail: detail.join("; "),
        });
    }
    if !stale.is_empty() {
        return Err(Gap::Stale {
            detail: format!("{}; validate it again", stale.join("; ")),
        });
    }
    let ids: Vec<&str> = candidates.iter().map(|(id, ..)| id.as_str()).collect();
    Err(Gap::Missing {
        next: format!(
            "validate one of {} (`release-cli validate --model {} --workspace WS`)",
            ids.join(", "),
            ids.first().copied().unwrap_or("ID")
        ),
    })
}

/// A device check's cell (`kind` at `res`): the newest record, current and passed.
fn check_cell(
    records: &Records,
    manifest: &Manifest,
    pin: Option<&GitCommit>,
    kind: CheckKind,
    res: Option<CameraResolution>,
) -> Result<String, Gap> {
    let found = newest(
        records
            .checks
            .iter()
            .filter(|c| c.check == kind && c.resolution == res),
        |c| (c.checked_at, c.passed),
    );
    let Some(c) = found else {
        let flag = res.map_or(String::new(), |r| format!(" --resolution {r}"));
        // The record's pin: the manifest's, or the checkout's when the manifest has none.
        let pin_flag = pin.map_or(" --openpilot DIR".to_string(), |p| {
            format!(" --tinygrad-commit {p}")
        });
        return Err(Gap::Missing {
            next: format!(
                "check it on the device, then `release-cli validate --check {kind}{flag} \
                 --passed --note TEXT --by NAME{pin_flag} --workspace WS` (TEXT: what \
                 you saw; NAME: who checked)"
            ),
        });
    };
    if let Some(detail) = pin_problem(pin, &c.tinygrad_commit) {
        return Err(Gap::Stale { detail });
    }
    if let Some(detail) = check_binding(c, manifest) {
        return Err(Gap::Stale {
            detail: format!("{detail}; check it on the device again"),
        });
    }
    if !c.passed {
        return Err(Gap::Failed {
            detail: format!("{} recorded a failure: {}", c.checked_by, c.note),
        });
    }
    Ok(format!("checked by {} at {}", c.checked_by, c.checked_at))
}

/// The record that counts of several about the same thing: the newest by `checked_at`, and on
/// a tie the one that did not pass (`passed` is the second part of the key), so that an older
/// or equally old pass never hides a failure.
pub fn newest<'a, T>(
    records: impl Iterator<Item = &'a T>,
    key: impl Fn(&T) -> (UnixSeconds, bool),
) -> Option<&'a T>
where
    T: 'a,
{
    records.max_by(|a, b| {
        let (ta, pa) = key(a);
        let (tb, pb) = key(b);
        ta.cmp(&tb).then(pb.cmp(&pa))
    })
}

/// Why a preflight record that says `passed` cannot be believed: it lists no command, or one of
/// its commands did not pass or did not exit 0. `None` for a consistent record (and for one
/// that says it failed: that is a failure, not a contradiction).
pub fn preflight_contradiction(p: &PreflightRecord) -> Option<String> {
    if !p.passed {
        return None;
    }
    if p.commands.is_empty() {
        return Some("the record says passed but lists no command".into());
    }
    p.commands
        .iter()
        .find(|c| !c.passed || c.exit_code != Some(0))
        .map(|c| {
            format!(
                "the record says passed but `{}` {}",
                c.argv.join(" "),
                match c.exit_code {
                    Some(0) => "is marked failed".to_string(),
                    Some(code) => format!("exited {code}"),
                    None => "was killed by a signal or did not start".to_string(),
                }
            )
        })
}

/// Why a preflight record is not of the tree being released: it ran on uncommitted changes
/// (`openpilot_dirty`), in another checkout than `--openpilot` (foreign), at another commit than
/// the checkout's `HEAD` now (stale: something was committed since), or the checkout has
/// uncommitted changes now. Each says what to do; the command's `--workspace WS` is filled in
/// by [`fill_workspace`]. `None` when it binds (and when no tree was observed, only the record's
/// own dirtiness is judged). Pure.
pub fn preflight_binding(p: &PreflightRecord, now: Option<&TreeNow>) -> Option<String> {
    let again = |op: &std::path::Path| {
        let op = cli_support::shell_quote(&op.display().to_string());
        format!("run `release-cli preflight --openpilot {op} --workspace WS` again")
    };
    if p.openpilot_dirty == Some(true) {
        return Some(format!(
            "the repository tests ran on uncommitted changes in {}: commit them (or `git stash \
             --include-untracked`), then {}",
            p.openpilot.display(),
            again(now.map_or(&p.openpilot, |t| &t.openpilot))
        ));
    }
    let now = now?;
    if now.foreign {
        return Some(format!(
            "the repository tests ran in {}, not in the release's checkout {}: {}",
            p.openpilot.display(),
            now.openpilot.display(),
            again(&now.openpilot)
        ));
    }
    match (&p.openpilot_commit, &now.commit) {
        (Some(then), Some(head)) if then != head => {
            return Some(format!(
                "the repository tests ran at commit {then}, {} is at {head} now (committed \
                 since): {}",
                now.openpilot.display(),
                again(&now.openpilot)
            ));
        }
        (None, Some(head)) => {
            return Some(format!(
                "the record names no commit of {} (it was not a git checkout then), which is at \
                 {head} now: {}",
                now.openpilot.display(),
                again(&now.openpilot)
            ));
        }
        (Some(then), None) => {
            return Some(format!(
                "the repository tests ran at commit {then}, but the HEAD of {} cannot be read \
                 now; check `git -C {} rev-parse HEAD`, then {}",
                now.openpilot.display(),
                cli_support::shell_quote(&now.openpilot.display().to_string()),
                again(&now.openpilot)
            ));
        }
        _ => {}
    }
    if now.dirty == Some(true) {
        return Some(format!(
            "{} has uncommitted changes the repository tests did not run on: commit them, then {}",
            now.openpilot.display(),
            again(&now.openpilot)
        ));
    }
    None
}

/// Why a device check is not about the artifacts `manifest` lists: it names none (written
/// before checks were bound to artifacts), or, with a `model`, the manifest does not list that
/// model with the digest it was made on, or, without one, no artifact it was made on is still
/// listed (every one was rebuilt since). `None` when it is bound to a listed artifact.
pub fn check_binding(c: &CheckRecord, manifest: &Manifest) -> Option<String> {
    if c.artifacts.is_empty() {
        return Some(format!(
            "the {} record names no artifact it was made on (recorded before checks were bound \
             to artifact digests)",
            c.check
        ));
    }
    let listed = |id: &ModelId, sha: &Sha256Digest| {
        manifest
            .models()
            .iter()
            .any(|e| e.id() == id && e.artifact_sha256().as_ref() == Some(sha))
    };
    match &c.model {
        Some(id) => match c.artifacts.get(id) {
            Some(sha) if listed(id, sha) => None,
            Some(sha) => Some(format!(
                "{} was checked on {id} with artifact_sha256 {sha}, which the manifest does not \
                 list",
                c.check
            )),
            None => Some(format!(
                "{} was checked on {id} but the record names no digest of it",
                c.check
            )),
        },
        None if c.artifacts.iter().any(|(id, sha)| listed(id, sha)) => None,
        None => Some(format!(
            "{} was checked on {} artifact(s) of which the manifest lists none (rebuilt since)",
            c.check,
            c.artifacts.len()
        )),
    }
}

/// Why the rehearsal does not cover `manifest`: none recorded, one of other manifest bytes or
/// another generation (stale), or one that failed.
pub fn rehearsal_gap(
    manifest: &Manifest,
    rehearsal: Option<&crate::recorded::RehearsalRecord>,
) -> Option<Gap> {
    let Some(r) = rehearsal else {
        let generation = manifest
            .generation()
            .map_or("vNN".to_string(), |g| g.to_string());
        return Some(Gap::Missing {
            next: format!(
                "run `release-cli rehearse --generation {generation} --manifest MANIFEST \
                 --artifacts ARTIFACTS --openpilot OPENPILOT --workspace WS` (MANIFEST: this \
                 manifest's file; ARTIFACTS: the directory of its chunk sets; OPENPILOT: the \
                 openpilot checkout)"
            ),
        });
    };
    let sha = crate::recorded::manifest_digest(manifest);
    if r.manifest_sha256 != sha {
        return Some(Gap::Stale {
            detail: format!(
                "{} was rehearsed as manifest SHA-256 {}, this manifest is {sha}; rehearse it again",
                r.manifest.display(),
                r.manifest_sha256
            ),
        });
    }
    if let Some(g) = manifest.generation()
        && g != r.generation
    {
        return Some(Gap::Stale {
            detail: format!("rehearsed as {}, the manifest is {g}", r.generation),
        });
    }
    if !r.passed {
        let failed: Vec<String> = r
            .failures()
            .map(|c| format!("{} {}: {}", c.scenario, c.check, c.detail))
            .collect();
        return Some(Gap::Failed {
            detail: format!("{} (see {})", failed.join("; "), r.work_dir.display()),
        });
    }
    None
}

// ---- the decision and the publish record ------------------------------------------------

/// A covered cell, as the publish record lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoveredCell {
    pub cell: String,
    pub by: String,
}

/// What the validation gate decided for one publish; written into the publish record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum GateOutcome {
    /// The workspace's records cover the matrix.
    Passed {
        workspace: PathBuf,
        covered: Vec<CoveredCell>,
    },
    /// `--skip-validation REASON`: published without a covering record. `gaps` are the cells
    /// that were not covered when a workspace was given (empty without one: not checked).
    Skipped {
        reason: String,
        workspace: Option<PathBuf>,
        gaps: Vec<String>,
    },
}

/// A gap line with the placeholder `--workspace WS` of its command replaced by the workspace the
/// records were read from, so the command runs as printed (a path with a space is quoted).
pub fn fill_workspace(line: &str, workspace: Option<&std::path::Path>) -> String {
    let Some(ws) = workspace else {
        return line.to_string();
    };
    let quoted = cli_support::shell_quote(&ws.display().to_string());
    line.replace("--workspace WS`", &format!("--workspace {quoted}`"))
}

/// The gate: publish when the records cover the matrix, or when the release engineer skipped
/// validation with a reason; otherwise refuse with every gap. `coverage` is `None` when no
/// workspace was given (then only a skip lets the publish through).
pub fn decide(
    workspace: Option<&std::path::Path>,
    coverage: Option<&Coverage>,
    skip_reason: Option<&str>,
) -> crate::Result<GateOutcome> {
    let gaps: Vec<String> = coverage
        .map(Coverage::gap_lines)
        .unwrap_or_default()
        .into_iter()
        .map(|line| fill_workspace(&line, workspace))
        .collect();
    if let Some(reason) = skip_reason {
        return Ok(GateOutcome::Skipped {
            reason: reason.to_string(),
            workspace: workspace.map(|w| w.to_path_buf()),
            gaps,
        });
    }
    match (workspace, coverage) {
        (Some(ws), Some(cov)) if cov.is_complete() => Ok(GateOutcome::Passed {
            workspace: ws.to_path_buf(),
            covered: cov
                .covered
                .iter()
                .map(|(cell, by)| CoveredCell {
                    cell: cell.to_string(),
                    by: by.clone(),
                })
                .collect(),
        }),
        (ws, _) => Err(crate::Error::ValidationGate {
            workspace: ws.map_or_else(|| PathBuf::from("(no --workspace)"), |w| w.to_path_buf()),
            gaps: if coverage.is_none() {
                vec![
                    "no --workspace DIR given: pass the rebuild workspace whose results/ \
                      holds the preflight and validation records"
                        .to_string(),
                ]
            } else {
                gaps
            },
        }),
    }
}

/// `<manifest stem>.publish.json` beside the manifest: what one publish did and why it was
/// allowed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishRecord {
    pub generation: manifest::Generation,
    pub manifest: PathBuf,
    /// The SHA-256 of the canonical manifest that was published.
    pub manifest_sha256: Sha256Digest,
    pub tinygrad_commit: Option<GitCommit>,
    #[serde(with = "cli_support::time::rfc3339_field")]
    pub published_at: UnixSeconds,
    /// The stores, in the order published.
    pub stores: Vec<String>,
    /// The models uploaded from `--artifacts`.
    pub models: Vec<String>,
    pub validation: GateOutcome,
    /// Why GitHub could be published without the Hub (absent when a Hub store was published
    /// too, or in records written before the rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github_only: Option<artifact_store::publish::GithubOnly>,
    /// `publish --remove-signature REASON`: the generation was published unsigned on purpose
    /// and its signature removed from the stores; the reason given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature_removed: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIN: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";
    const OTHER_PIN: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";

    fn sha(n: u8) -> Sha256Digest {
        format!("{n:02x}").repeat(32).parse().unwrap()
    }

    /// (id, version, gpu, artifact digest byte)
    fn manifest(models: &[(&str, u32, bool, u8)]) -> Manifest {
        manifest_in(25, PIN, models)
    }

    /// A made-up next generation's made-up pin.
    const V26_PIN: &str = "0123456789abcdef0123456789abcdef01234567";

    /// [`manifest`] of generation `v<generation>` pinned to `pin`.
    fn manifest_in(generation: u32, pin: &str, models: &[(&str, u32, bool, u8)]) -> Manifest {
        let entries: Vec<serde_json::Value> = models
            .iter()
            .map(|(id, v, gpu, d)| {
                serde_json::json!({
                    "id": id, "name": id, "version": format!("v{v}"), "series": "OP Series",
                    "released": "2025-01-01", "community_favorite": false,
                    "artifact_format": "tinygrad_single_v1", "artifact_size": 5,
                    "artifact_sha256": sha(*d).to_string(), "artifact_chunk_count": 1,
                    "uses_external_gpu": gpu
                })
            })
            .collect();
        let doc = serde_json::json!({
            "generation": format!("v{generation}"), "tinygrad_commit": pin, "models": entries
        });
        Manifest::from_slice(doc.to_string().as_bytes()).unwrap()
    }

    fn full() -> Manifest {
        manifest(&[
            ("a8", 8, false, 1),
            ("a11", 11, false, 2),
            ("b11", 11, false, 3),
            ("a12", 12, false, 4),
            ("a15", 15, false, 5),
            ("a16", 16, false, 6),
            ("gpu16", 16, true, 7),
        ])
    }

    fn preflight(passed: bool, pin: &str) -> PreflightRecord {
        PreflightRecord {
            openpilot: "/op".into(),
            openpilot_commit: None,
            openpilot_dirty: None,
            tinygrad_commit: pin.parse().unwrap(),
            commands: vec![CommandRun {
                argv: vec!["./dev".into(), "sync".into()],
                exit_code: Some(if passed { 0 } else { 1 }),
                passed,
                started_at: UnixSeconds(0),
                duration_ms: 1,
            }],
            passed,
            finished_at: UnixSeconds(1),
            log: "logs/preflight.log".into(),
        }
    }

    fn validation(id: &str, v: u32, d: u8, pin: &str, pass: [bool; 2]) -> ValidationRecord {
        ValidationRecord {
            model: id.parse().unwrap(),
            version: BehaviorVersion::new(v),
            artifact_sha256: sha(d),
            tinygrad_commit: pin.parse().unwrap(),
            checked_at: UnixSeconds(2),
            resolutions: CAMERA_RESOLUTIONS
                .iter()
                .zip(pass)
                .map(|(r, p)| ResolutionVerdict {
                    resolution: *r,
                    passed: p,
                    problems: if p {
                        vec![]
                    } else {
                        vec![format!("{r}: lead output is not finite")]
                    },
                })
                .collect(),
            verdict: serde_json::json!({"passed": true}),
            log: "logs/x.validate.log".into(),
        }
    }

    fn check(
        kind: CheckKind,
        res: Option<CameraResolution>,
        passed: bool,
        pin: &str,
    ) -> CheckRecord {
        CheckRecord {
            check: kind,
            resolution: res,
            model: None,
            passed,
            tinygrad_commit: pin.parse().unwrap(),
            checked_by: "tester".into(),
            checked_at: UnixSeconds(3),
            note: "watched it".into(),
            artifacts: [
                ("a11".parse().unwrap(), sha(2)),
                ("a8".parse().unwrap(), sha(1)),
            ]
            .into_iter()
            .collect(),
        }
    }

    fn complete_records() -> Records {
        Records {
            preflight: Some(preflight(true, PIN)),
            validations: vec![
                validation("a8", 8, 1, PIN, [true, true]),
                validation("a11", 11, 2, PIN, [true, true]),
                validation("a12", 12, 4, PIN, [true, true]),
                validation("a15", 15, 5, PIN, [true, true]),
                validation("a16", 16, 6, PIN, [true, true]),
                validation("gpu16", 16, 7, PIN, [true, true]),
            ],
            checks: vec![
                check(CheckKind::ModelV2, None, true, PIN),
                check(
                    CheckKind::DriverState,
                    Some(CAMERA_RESOLUTIONS[0]),
                    true,
                    PIN,
                ),
                check(
                    CheckKind::DriverState,
                    Some(CAMERA_RESOLUTIONS[1]),
                    true,
                    PIN,
                ),
            ],
            rehearsal: Some(rehearsal(&full(), true)),
            tree: None,
        }
    }

    /// A rehearsal record of `m`'s bytes.
    fn rehearsal(m: &Manifest, passed: bool) -> crate::recorded::RehearsalRecord {
        use crate::rehearse::judge::{RehearsalCheck, Scenario};
        let g = m.generation().unwrap();
        crate::recorded::RehearsalRecord {
            generation: g,
            previous_generation: g.previous().unwrap(),
            manifest: "/ws/ready/model_names.json".into(),
            manifest_sha256: crate::recorded::manifest_digest(m),
            tinygrad_commit: m.tinygrad_commit(),
            openpilot: "/op".into(),
            device_manager: "/bin/device-modeld-manager".into(),
            device_args: vec![],
            selected: "a11".parse().unwrap(),
            dropped: "retired-rehearsal".parse().unwrap(),
            checks: vec![RehearsalCheck {
                scenario: Scenario::Kept,
                check: "selected_is_new_artifact".into(),
                passed,
                detail: if passed {
                    "ok".into()
                } else {
                    "a11 is missing".into()
                },
            }],
            passed,
            finished_at: UnixSeconds(9),
            work_dir: "/ws/rehearsal".into(),
        }
    }

    const HI: CameraResolution = CAMERA_RESOLUTIONS[0];
    const LO: CameraResolution = CAMERA_RESOLUTIONS[1];

    fn v(n: u32) -> Subject {
        Subject::Version(BehaviorVersion::new(n))
    }

    #[test]
    fn coverage_table() {
        type Edit = fn(&mut Records);
        type Case = (&'static str, Manifest, Edit, Vec<(Cell, &'static str)>);
        // (case, manifest, edit to the complete records, expected gaps as (cell, kind))
        let cases: Vec<Case> = vec![
            ("complete", full(), |_| {}, vec![]),
            (
                "no records at all: every cell is listed",
                full(),
                |r| *r = Records::default(),
                {
                    let mut g = vec![(Cell::Preflight, "missing")];
                    for s in [v(8), v(11), v(12), v(15), v(16), Subject::Gpu] {
                        g.push((Cell::Driving(s.clone(), HI), "missing"));
                        g.push((Cell::Driving(s, LO), "missing"));
                    }
                    g.push((Cell::ModelV2, "missing"));
                    g.push((Cell::DriverState(HI), "missing"));
                    g.push((Cell::DriverState(LO), "missing"));
                    g.push((Cell::Rehearsal, "missing"));
                    g
                },
            ),
            (
                "a failing preflight",
                full(),
                |r| r.preflight = Some(preflight(false, PIN)),
                vec![(Cell::Preflight, "failed")],
            ),
            (
                "a preflight of another pin",
                full(),
                |r| r.preflight = Some(preflight(true, OTHER_PIN)),
                vec![(Cell::Preflight, "stale")],
            ),
            (
                "one resolution failed",
                full(),
                |r| r.validations[1] = validation("a11", 11, 2, PIN, [true, false]),
                vec![(Cell::Driving(v(11), LO), "failed")],
            ),
            (
                "another v11 artifact covers the row",
                full(),
                |r| r.validations[1] = validation("b11", 11, 3, PIN, [true, true]),
                vec![],
            ),
            (
                "a failed artifact is refused even when another covers its row",
                full(),
                |r| {
                    r.validations
                        .push(validation("b11", 11, 3, PIN, [false, true]))
                },
                vec![(
                    Cell::Driving(Subject::Model("b11".parse().unwrap()), HI),
                    "failed",
                )],
            ),
            (
                "a record of other bytes is stale",
                full(),
                |r| r.validations[0] = validation("a8", 8, 9, PIN, [true, true]),
                vec![
                    (Cell::Driving(v(8), HI), "stale"),
                    (Cell::Driving(v(8), LO), "stale"),
                ],
            ),
            (
                "a record of another pin is stale",
                full(),
                |r| r.validations[5] = validation("gpu16", 16, 7, OTHER_PIN, [true, true]),
                vec![
                    (Cell::Driving(Subject::Gpu, HI), "stale"),
                    (Cell::Driving(Subject::Gpu, LO), "stale"),
                ],
            ),
            (
                "a GPU validation does not cover the QCOM v16 row",
                full(),
                |r| {
                    r.validations.retain(|x| x.model.as_str() != "a16");
                },
                vec![
                    (Cell::Driving(v(16), HI), "missing"),
                    (Cell::Driving(v(16), LO), "missing"),
                ],
            ),
            (
                "DM at one resolution only, modelV2 failed",
                full(),
                |r| {
                    r.checks.retain(|c| c.resolution != Some(LO));
                    r.checks[0] = check(CheckKind::ModelV2, None, false, PIN);
                },
                vec![
                    (Cell::ModelV2, "failed"),
                    (Cell::DriverState(LO), "missing"),
                ],
            ),
            (
                "a DM check of another pin",
                full(),
                |r| r.checks[1] = check(CheckKind::DriverState, Some(HI), true, OTHER_PIN),
                vec![(Cell::DriverState(HI), "stale")],
            ),
            (
                "a failed rehearsal",
                full(),
                |r| r.rehearsal = Some(rehearsal(&full(), false)),
                vec![(Cell::Rehearsal, "failed")],
            ),
            (
                "a rehearsal of other manifest bytes",
                full(),
                |r| r.rehearsal = Some(rehearsal(&manifest(&[("a11", 11, false, 2)]), true)),
                vec![(Cell::Rehearsal, "stale")],
            ),
            (
                "versions the manifest lacks are not required",
                manifest(&[("a11", 11, false, 2)]),
                |_| {},
                vec![],
            ),
        ];
        for (case, m, edit, want) in cases {
            let mut records = complete_records();
            records.rehearsal = Some(rehearsal(&m, true));
            edit(&mut records);
            let got: Vec<(Cell, &str)> = coverage(&m, &records)
                .gaps
                .into_iter()
                .map(|(c, g)| {
                    let kind = match g {
                        Gap::Missing { .. } => "missing",
                        Gap::Failed { .. } => "failed",
                        Gap::Stale { .. } => "stale",
                    };
                    (c, kind)
                })
                .collect();
            assert_eq!(got, want, "{case}");
        }
    }

    /// Records that cannot mislead, for v25 and a made-up v26 with a made-up pin: the newest
    /// record of one model and digest wins (a failure on a tie), a record of another behaviour
    /// version is stale, device checks are bound to the artifacts they were made on, and a
    /// preflight that says passed with a failing command is refused.
    #[test]
    fn records_that_cannot_mislead() {
        type Edit = fn(&mut Records, &'static str);
        type Case = (&'static str, Edit, Vec<(Cell, &'static str)>);
        let cases: Vec<Case> = vec![
            ("complete", |_, _| {}, vec![]),
            (
                "an older pass listed after a newer failure of the same bytes",
                |r, pin| {
                    let mut failed = validation("a11", 11, 2, pin, [true, false]);
                    failed.checked_at = UnixSeconds(5);
                    r.validations.insert(0, failed);
                },
                vec![(Cell::Driving(v(11), LO), "failed")],
            ),
            (
                "an older pass listed before a newer failure of the same bytes",
                |r, pin| {
                    let mut failed = validation("a11", 11, 2, pin, [false, true]);
                    failed.checked_at = UnixSeconds(5);
                    r.validations.push(failed);
                },
                vec![(Cell::Driving(v(11), HI), "failed")],
            ),
            (
                "a pass and a failure made at the same second: the failure",
                |r, pin| {
                    r.validations
                        .push(validation("a8", 8, 1, pin, [false, false]))
                },
                vec![
                    (Cell::Driving(v(8), HI), "failed"),
                    (Cell::Driving(v(8), LO), "failed"),
                ],
            ),
            (
                "a newer pass after an older failure of the same bytes counts",
                |r, pin| {
                    let mut failed = validation("a8", 8, 1, pin, [false, false]);
                    failed.checked_at = UnixSeconds(1);
                    r.validations.push(failed);
                },
                vec![],
            ),
            (
                "a newer record of other bytes does not hide the current one",
                |r, pin| {
                    let mut other = validation("a11", 11, 9, pin, [false, false]);
                    other.checked_at = UnixSeconds(7);
                    r.validations.insert(0, other);
                },
                vec![],
            ),
            (
                "a record of another behaviour version is stale",
                |r, pin| r.validations[1] = validation("a11", 12, 2, pin, [true, true]),
                vec![
                    (Cell::Driving(v(11), HI), "stale"),
                    (Cell::Driving(v(11), LO), "stale"),
                ],
            ),
            (
                "a passed preflight with a failing command",
                |r, _| {
                    let p = r.preflight.as_mut().unwrap();
                    p.commands[0].exit_code = Some(1);
                },
                vec![(Cell::Preflight, "failed")],
            ),
            (
                "a passed preflight with a command marked failed that exited 0",
                |r, _| r.preflight.as_mut().unwrap().commands[0].passed = false,
                vec![(Cell::Preflight, "failed")],
            ),
            (
                "a passed preflight with a command killed by a signal",
                |r, _| r.preflight.as_mut().unwrap().commands[0].exit_code = None,
                vec![(Cell::Preflight, "failed")],
            ),
            (
                "a passed preflight with no command",
                |r, _| r.preflight.as_mut().unwrap().commands.clear(),
                vec![(Cell::Preflight, "failed")],
            ),
            (
                "device checks after a rebuild of every artifact",
                |r, _| {
                    for c in &mut r.checks {
                        c.artifacts = [("a11".parse().unwrap(), sha(12))].into_iter().collect();
                    }
                },
                vec![
                    (Cell::ModelV2, "stale"),
                    (Cell::DriverState(HI), "stale"),
                    (Cell::DriverState(LO), "stale"),
                ],
            ),
            (
                "one artifact of several still listed keeps a check current",
                |r, _| {
                    r.checks[1]
                        .artifacts
                        .insert("a11".parse().unwrap(), sha(12));
                },
                vec![],
            ),
            (
                "model-v2 on a model whose artifact was rebuilt",
                |r, _| {
                    r.checks[0].model = Some("a8".parse().unwrap());
                    r.checks[0].artifacts.insert("a8".parse().unwrap(), sha(11));
                },
                vec![(Cell::ModelV2, "stale")],
            ),
            (
                "model-v2 on a listed model with its digest",
                |r, _| r.checks[0].model = Some("a8".parse().unwrap()),
                vec![],
            ),
            (
                "model-v2 on a model the record has no digest of",
                |r, _| r.checks[0].model = Some("b11".parse().unwrap()),
                vec![(Cell::ModelV2, "stale")],
            ),
            (
                "a check recorded before checks were bound to artifacts",
                |r, _| r.checks[2].artifacts.clear(),
                vec![(Cell::DriverState(LO), "stale")],
            ),
            (
                "an older passing check beside a newer failed one",
                |r, pin| {
                    let mut failed = check(CheckKind::DriverState, Some(HI), false, pin);
                    failed.checked_at = UnixSeconds(4);
                    r.checks.push(failed);
                },
                vec![(Cell::DriverState(HI), "failed")],
            ),
        ];
        for (generation, pin) in [(25, PIN), (26, V26_PIN)] {
            let m = manifest_in(
                generation,
                pin,
                &[("a8", 8, false, 1), ("a11", 11, false, 2)],
            );
            for (case, edit, want) in &cases {
                let mut records = Records {
                    preflight: Some(preflight(true, pin)),
                    validations: vec![
                        validation("a8", 8, 1, pin, [true, true]),
                        validation("a11", 11, 2, pin, [true, true]),
                    ],
                    checks: vec![
                        check(CheckKind::ModelV2, None, true, pin),
                        check(CheckKind::DriverState, Some(HI), true, pin),
                        check(CheckKind::DriverState, Some(LO), true, pin),
                    ],
                    rehearsal: Some(rehearsal(&m, true)),
                    tree: None,
                };
                edit(&mut records, pin);
                let cov = coverage(&m, &records);
                let got: Vec<(Cell, &str)> = cov
                    .gaps
                    .iter()
                    .map(|(c, g)| {
                        let kind = match g {
                            Gap::Missing { .. } => "missing",
                            Gap::Failed { .. } => "failed",
                            Gap::Stale { .. } => "stale",
                        };
                        (c.clone(), kind)
                    })
                    .collect();
                assert_eq!(&got, want, "v{generation}: {case}: {:#?}", cov.gap_lines());
            }
        }
    }

    /// The words of the new gaps: what is wrong, with which value, and what to do.
    #[test]
    fn misleading_records_are_named() {
        for (generation, pin) in [(25, PIN), (26, V26_PIN)] {
            let m = manifest_in(generation, pin, &[("a11", 11, false, 2)]);
            let mut p = preflight(true, pin);
            p.commands[0].exit_code = Some(2);
            let mut c = check(CheckKind::ModelV2, None, true, pin);
            c.artifacts = [("a11".parse().unwrap(), sha(12))].into_iter().collect();
            let records = Records {
                preflight: Some(p),
                validations: vec![validation("a11", 12, 2, pin, [true, true])],
                checks: vec![c],
                rehearsal: Some(rehearsal(&m, true)),
                tree: None,
            };
            let lines = coverage(&m, &records).gap_lines().join("\n");
            for want in [
                "preflight (./dev sync and the repository tests): failed: the record says passed \
                 but `./dev sync` exited 2; the record cannot be trusted: run `release-cli \
                 preflight --openpilot DIR --workspace WS` again",
                "a11 was validated as behaviour version v12, the manifest lists v11",
                "stable modelV2 from modeld: stale: model-v2 was checked on 1 artifact(s) of \
                 which the manifest lists none (rebuilt since); check it on the device again",
            ] {
                assert!(lines.contains(want), "v{generation}: {want}\n{lines}");
            }
        }
        // A check record written before the binding reads, and is stale.
        let old = serde_json::json!({
            "check": "model-v2", "resolution": null, "model": null, "passed": true,
            "tinygrad_commit": PIN, "checked_by": "dev", "checked_at": "2026-12-01T10:00:00Z",
            "note": "20 Hz"
        });
        let c: CheckRecord = serde_json::from_value(old).unwrap();
        assert!(c.artifacts.is_empty());
        let why = check_binding(&c, &full()).unwrap();
        assert!(why.contains("names no artifact it was made on"), "{why}");
    }

    #[test]
    fn rows_follow_the_manifest_and_gaps_say_what_to_run() {
        let m = manifest(&[("a11", 11, false, 2), ("x9", 9, false, 8)]);
        let cov = coverage(&m, &Records::default());
        let v = |n| BehaviorVersion::new(n);
        assert_eq!(cov.not_in_manifest, vec![v(8), v(12), v(15), v(16)]);
        assert!(!cov.has_gpu);
        let lines = cov.gap_lines();
        assert_eq!(lines.len(), 7, "{lines:#?}");
        assert!(lines[6].contains("release-cli rehearse"), "{lines:#?}");
        assert!(lines[0].starts_with("preflight"), "{lines:#?}");
        assert!(
            lines[1].contains("v11 artifact at 1928x1208: missing: validate one of a11"),
            "{lines:#?}"
        );
        assert!(
            lines[4].contains("--check driver-state --resolution 1928x1208"),
            "{lines:#?}"
        );
        let complete = coverage(&full(), &complete_records());
        assert!(complete.is_complete());
        assert_eq!(complete.covered.len(), 1 + 12 + 3 + 1);
    }

    fn resolution_result(finite: &[&str]) -> serde_json::Value {
        let f: serde_json::Map<String, serde_json::Value> = REQUIRED_OUTPUTS
            .iter()
            .map(|o| (o.to_string(), serde_json::Value::Bool(finite.contains(o))))
            .collect();
        serde_json::json!({"passed": true, "finite": f})
    }

    #[test]
    fn verdict_table() {
        let all = resolution_result(&REQUIRED_OUTPUTS);
        let good = serde_json::json!({"passed": true, "artifact_sha256": sha(1).to_string(),
            "resolutions": {"1928x1208": all, "1344x760": all}});
        let mut no_lead = good.clone();
        no_lead["resolutions"]["1344x760"] =
            resolution_result(&["plan", "lane_lines", "road_edges", "pose", "action"]);
        let mut unreported = good.clone();
        unreported["resolutions"]["1928x1208"]["finite"]
            .as_object_mut()
            .unwrap()
            .remove("pose");
        let mut other_bytes = good.clone();
        other_bytes["artifact_sha256"] = sha(2).to_string().into();
        let mut failed = good.clone();
        failed["passed"] = false.into();
        let mut explained = good.clone();
        explained["passed"] = false.into();
        explained["resolutions"]["1928x1208"]["passed"] = false.into();
        let cases: Vec<(&str, serde_json::Value, [bool; 2], &str)> = vec![
            ("both resolutions finite", good.clone(), [true, true], ""),
            (
                "lead not finite at 1344x760",
                no_lead,
                [true, false],
                "lead output is not finite",
            ),
            (
                "pose not reported",
                unreported,
                [false, true],
                "whether the pose output",
            ),
            (
                "the stand-in's old flat verdict",
                serde_json::json!({"passed": true}),
                [false, false],
                "no \"resolutions\"",
            ),
            ("other bytes", other_bytes, [false, false], "not the"),
            (
                "passed false, unexplained",
                failed,
                [false, false],
                "\"passed\": false",
            ),
            (
                "passed false, explained by 1928x1208",
                explained,
                [false, true],
                "1928x1208: not passed",
            ),
        ];
        for (case, verdict, want, problem) in cases {
            let got = read_verdict(&verdict, &sha(1));
            assert_eq!(got.len(), 2, "{case}");
            assert_eq!(got[0].resolution, HI);
            assert_eq!([got[0].passed, got[1].passed], want, "{case}: {got:?}");
            for r in &got {
                assert_eq!(r.passed, r.problems.is_empty(), "{case}");
                if !r.passed {
                    assert!(
                        r.problems.iter().any(|p| p.contains(problem)),
                        "{case}: {r:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn times_and_resolutions_round_trip() {
        for (secs, text) in [
            (0, "1970-01-01T00:00:00Z"),
            (951_868_799, "2000-02-29T23:59:59Z"),
            (1_796_238_295, "2026-12-02T19:04:55Z"),
        ] {
            assert_eq!(UnixSeconds(secs).to_string(), text);
            assert_eq!(text.parse::<UnixSeconds>().unwrap(), UnixSeconds(secs));
        }
        for bad in [
            "2026-02-30T00:00:00Z",
            "2026-12-02 19:04:55Z",
            "2026-12-02T24:00:00Z",
            "",
        ] {
            assert!(bad.parse::<UnixSeconds>().is_err(), "{bad}");
        }
        assert_eq!("1928x1208".parse::<CameraResolution>().unwrap(), HI);
        for bad in ["1928", "x1208", "1928x", "0x760", "+1x2", "1928X1208"] {
            assert!(bad.parse::<CameraResolution>().is_err(), "{bad}");
        }
        let r = complete_records().validations.remove(0);
        let back: ValidationRecord =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert_eq!(
            serde_json::to_value(CheckKind::DriverState).unwrap(),
            serde_json::json!("driver-state")
        );
    }

    #[test]
    fn the_rehearsal_binds_the_manifest_bytes_and_generation_for_any_generation() {
        let next_pin = "26".repeat(20);
        for (g, pin) in [("v25", PIN), ("v26", next_pin.as_str())] {
            let doc = |extra: &str| {
                Manifest::from_slice(
                    format!(
                        r#"{{"generation":"{g}","tinygrad_commit":"{pin}","models":[{{"id":"a11","name":"A{extra}","version":"v11"}}]}}"#
                    )
                    .as_bytes(),
                )
                .unwrap()
            };
            let m = doc("");
            assert_eq!(rehearsal_gap(&m, Some(&rehearsal(&m, true))), None, "{g}");
            assert!(
                matches!(rehearsal_gap(&m, None), Some(Gap::Missing { .. })),
                "{g}"
            );
            let failed = rehearsal_gap(&m, Some(&rehearsal(&m, false)));
            assert!(
                matches!(&failed, Some(Gap::Failed { detail }) if detail.contains("a11 is missing")),
                "{g}: {failed:?}"
            );
            // One changed byte of the manifest (a name) makes the rehearsal stale.
            let other = doc("x");
            assert!(
                matches!(
                    rehearsal_gap(&other, Some(&rehearsal(&m, true))),
                    Some(Gap::Stale { .. })
                ),
                "{g}"
            );
            // A record of the right bytes but another generation is stale too.
            let mut wrong = rehearsal(&m, true);
            wrong.generation = wrong.previous_generation;
            assert!(
                matches!(rehearsal_gap(&m, Some(&wrong)), Some(Gap::Stale { .. })),
                "{g}"
            );
        }
    }

    #[test]
    fn decide_table() {
        let ws = std::path::Path::new("/ws");
        let complete = coverage(&full(), &complete_records());
        let gappy = coverage(&full(), &Records::default());
        // Complete records pass, naming what covered each cell.
        match decide(Some(ws), Some(&complete), None).unwrap() {
            GateOutcome::Passed { workspace, covered } => {
                assert_eq!(workspace, ws);
                assert_eq!(covered.len(), complete.covered.len());
            }
            other => panic!("{other:?}"),
        }
        // Gaps refuse, listing every one of them.
        let e = decide(Some(ws), Some(&gappy), None).unwrap_err();
        let crate::Error::ValidationGate { gaps, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(gaps.len(), gappy.gaps.len());
        let next = cli_support::NextStep::next_step(&e).unwrap_or_default();
        assert!(next.contains("--skip-validation"), "{e}\nnext: {next}");
        // No workspace and no skip: refused, saying what to pass.
        let e = decide(None, None, None).unwrap_err();
        assert!(e.to_string().contains("no --workspace DIR"), "{e}");
        // A skip lets it through and keeps the reason and the gaps it skipped.
        match decide(Some(ws), Some(&gappy), Some("hotfix, validated by hand")).unwrap() {
            GateOutcome::Skipped { reason, gaps, .. } => {
                assert_eq!(reason, "hotfix, validated by hand");
                assert_eq!(gaps.len(), gappy.gaps.len());
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decide(None, None, Some("r")).unwrap(),
            GateOutcome::Skipped {
                workspace: None,
                ..
            }
        ));
    }

    /// The preflight record binds to the tree being released as it is now: a dirty preflight,
    /// one of another checkout, one made before a commit, or a tree with uncommitted changes now
    /// is stale, each line saying what to run; a record and tree that agree cover the cell. For
    /// v25, v26's contract and a made-up v27 (the rule is the same for every generation).
    #[test]
    fn the_preflight_is_of_the_tree_being_released() {
        const HEAD: &str = "1111111111111111111111111111111111111111";
        const LATER: &str = "2222222222222222222222222222222222222222";
        let now = |foreign: bool, commit: Option<&str>, dirty: Option<bool>| TreeNow {
            openpilot: "/home/me/openpilot".into(),
            foreign,
            commit: commit.map(|c| c.parse().unwrap()),
            dirty,
        };
        type Case<'a> = (
            &'a str,
            Option<&'a str>,
            Option<bool>,
            Option<TreeNow>,
            Option<&'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                "the tree as tested",
                Some(HEAD),
                Some(false),
                Some(now(false, Some(HEAD), Some(false))),
                None,
            ),
            ("no tree observed", Some(HEAD), Some(false), None, None),
            (
                "neither is a git checkout",
                None,
                None,
                Some(now(false, None, None)),
                None,
            ),
            (
                "tested on uncommitted changes",
                Some(HEAD),
                Some(true),
                Some(now(false, Some(HEAD), Some(true))),
                Some("ran on uncommitted changes"),
            ),
            (
                "tested dirty, no tree observed",
                Some(HEAD),
                Some(true),
                None,
                Some("ran on uncommitted changes"),
            ),
            (
                "another checkout",
                Some(HEAD),
                Some(false),
                Some(now(true, Some(HEAD), Some(false))),
                Some("not in the release's checkout /home/me/openpilot"),
            ),
            (
                "committed since",
                Some(HEAD),
                Some(false),
                Some(now(false, Some(LATER), Some(false))),
                Some(
                    "ran at commit 1111111111111111111111111111111111111111, /home/me/openpilot is at 2222222222222222222222222222222222222222 now",
                ),
            ),
            (
                "recorded without a commit",
                None,
                None,
                Some(now(false, Some(HEAD), Some(false))),
                Some("names no commit"),
            ),
            (
                "HEAD unreadable now",
                Some(HEAD),
                Some(false),
                Some(now(false, None, None)),
                Some("cannot be read"),
            ),
            (
                "uncommitted changes now",
                Some(HEAD),
                Some(false),
                Some(now(false, Some(HEAD), Some(true))),
                Some("has uncommitted changes the repository tests did not run on"),
            ),
        ];
        for (generation, pin) in [(25, PIN), (26, V26_PIN), (27, OTHER_PIN)] {
            let m = manifest_in(generation, pin, &[("a11", 11, false, 2)]);
            for (case, commit, dirty, tree, want) in &cases {
                let mut p = preflight(true, pin);
                p.openpilot = "/home/me/openpilot".into();
                p.openpilot_commit = commit.map(|c| c.parse().unwrap());
                p.openpilot_dirty = *dirty;
                let got = preflight_binding(&p, tree.as_ref());
                match (want, &got) {
                    (None, None) => {}
                    (Some(w), Some(line)) => {
                        assert!(line.contains(w), "v{generation} {case}: {line}");
                        assert!(
                            line.contains(
                                "run `release-cli preflight --openpilot /home/me/openpilot \
                                 --workspace WS` again"
                            ),
                            "v{generation} {case}: {line}"
                        );
                    }
                    _ => panic!("v{generation} {case}: {got:?}, want {want:?}"),
                }
                // The cell follows the rule, with the workspace filled in.
                let records = Records {
                    preflight: Some(p),
                    tree: tree.clone(),
                    ..Default::default()
                };
                let cov = coverage(&m, &records);
                let gap = cov.gaps.iter().find(|(c, _)| *c == Cell::Preflight);
                match want {
                    None => assert!(gap.is_none(), "v{generation} {case}: {gap:?}"),
                    Some(_) => {
                        assert!(
                            matches!(gap, Some((_, Gap::Stale { .. }))),
                            "v{generation} {case}: {gap:?}"
                        );
                        let line =
                            fill_workspace(&cov.gap_lines()[0], Some(std::path::Path::new("/w s")));
                        assert!(line.contains("--workspace '/w s'`"), "{line}");
                    }
                }
            }
        }
    }
}
