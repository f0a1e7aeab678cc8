//! `release-cli status`: where a release stands, read from the workspace, the openpilot tree and
//! the stores (nothing is connected to or written), and [`next_step`], the pure rule that says
//! which command to run next (docs/release.md, "Where the release stands").

use fs_err as fs;
use std::path::{Path, PathBuf};

use artifact_store::Store;
use chunker::Sha256Digest;
use manifest::{BehaviorVersion, Generation, GitCommit, Manifest, ModelId, PinTable, layout};
use serde::Serialize;

use crate::gate::{Cell, Gap, Records, coverage};
use crate::rebuild::{BuildRecord, FailureRecord};
use crate::{Result, Workspace, records};

/// The openpilot tree and what the compiler was last sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TreeStatus {
    pub openpilot: PathBuf,
    /// `tinygrad_repo/TINYGRAD_COMMIT` (`None`: missing or unreadable, see `problem`).
    pub tinygrad_commit: Option<GitCommit>,
    /// The generation whose pin that is (built-in table plus `tinygrad_pins.json`).
    pub pin_generation: Option<Generation>,
    /// What the tree's generation selectors (`MANIFEST_CANDIDATES`, the catalog module's
    /// `GENERATION`, the reviewed catalog) get wrong about `pin_generation`, each with its edit.
    pub selector_problems: Vec<String>,
    /// The tree ships release keys (`starpilot/assets/model_release_keys.pub`): its devices
    /// refuse an unsigned manifest, so rehearse and publish are signed.
    pub trusted_keys: bool,
    /// The compiler's marker as the last `sync` recorded it (no connection is made).
    pub compiler_marker: Option<GitCommit>,
    /// The last sync: where to and the digest of what it sent.
    pub synced: Option<SyncedStatus>,
    pub problem: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SyncedStatus {
    pub destination: String,
    pub remote_root: String,
    pub digest_sha256: Sha256Digest,
    pub files: u64,
    pub synced_at_unix: u64,
    /// Whether the files sync sends still have that digest.
    pub tree_matches: bool,
}

/// One model's build in the workspace (`results/<id>.json`, `results/<id>.failure.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BuildStatus {
    pub id: ModelId,
    /// `built` (record of this generation and pin), `stale` (another generation or pin),
    /// `failed` (only a failure record).
    pub state: &'static str,
    pub generation: Generation,
    pub version: Option<BehaviorVersion>,
    pub uses_external_gpu: Option<bool>,
    pub tinygrad_commit: Option<GitCommit>,
    pub sha256: Option<Sha256Digest>,
    pub error: Option<String>,
}

/// One file in the openpilot tree's `selfdrive/modeld/models` (DM set, built-in).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TreeFile {
    pub name: String,
    /// For a DM file: its size; for the built-in: the SHA-256 its `.sha256` names.
    pub size: Option<u64>,
    pub sha256: Option<Sha256Digest>,
}

/// A build receipt found beside an artifact.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReceiptStatus {
    /// What it is the receipt of (`build pop223`, `dm <file>`, `builtin`).
    pub of: String,
    pub receipt: PathBuf,
    pub compiler_revision: Option<GitCommit>,
    pub artifact_sha256: Option<Sha256Digest>,
    /// Whether it names the release's pin (`None`: no pin known, or unreadable).
    pub matches_pin: Option<bool>,
    /// Why it is not a receipt.
    pub problem: Option<String>,
}

/// The receipts beside `files` (label, logical artifact path), those present only.
fn receipts(files: &[(String, PathBuf)], pin: Option<&GitCommit>) -> Vec<ReceiptStatus> {
    files
        .iter()
        .filter_map(|(of, path)| {
            let found = crate::loadable::receipt_beside(path)?;
            let name = path.file_name()?.to_string_lossy().into_owned();
            let receipt = path.with_file_name(manifest::receipt::receipt_file_name(&name));
            Some(match found {
                Ok(r) => ReceiptStatus {
                    of: of.clone(),
                    receipt,
                    matches_pin: pin.map(|p| p == &r.compiler_revision),
                    compiler_revision: Some(r.compiler_revision),
                    artifact_sha256: Some(r.artifact_sha256),
                    problem: None,
                },
                Err(problem) => ReceiptStatus {
                    of: of.clone(),
                    receipt,
                    problem: Some(problem.to_string()),
                    ..Default::default()
                },
            })
        })
        .collect()
}

/// A gate cell and its state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CellStatus {
    pub cell: String,
    /// `covered`, `missing`, `failed` or `stale`.
    pub state: &'static str,
    pub detail: String,
}

/// What a store holds live for the generation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StoreStatus {
    pub store: String,
    pub generation: Option<Generation>,
    pub tinygrad_commit: Option<GitCommit>,
    pub manifest_sha256: Option<Sha256Digest>,
    pub models: Option<usize>,
    /// The release number in its signature's trusted comment (unverified), if signed.
    pub signature_release: Option<u64>,
    /// Whether it holds the workspace's staged manifest, byte for byte.
    pub holds_staged: bool,
    pub problem: Option<String>,
}

/// The next command and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NextStep {
    pub command: String,
    pub why: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Status {
    pub workspace: PathBuf,
    /// The generation being released (`--generation`, else the tree's pin's).
    pub generation: Option<Generation>,
    pub tree: Option<TreeStatus>,
    /// `ready/model_names_<gen>.json`, when it exists.
    pub manifest: Option<PathBuf>,
    pub manifest_sha256: Option<Sha256Digest>,
    /// The generation's source map in the tree (`scripts/model_source_map_<gen>.json`), when
    /// it is there (`None`: not written yet, or no tree or generation known).
    pub source_map: Option<PathBuf>,
    /// Catalog models without a build record of this generation and pin.
    pub unbuilt: Vec<ModelId>,
    pub builds: Vec<BuildStatus>,
    /// The four DM files in the tree (`sha256` null: not there).
    pub dm: Vec<TreeFile>,
    /// The built-in RDF V4 chunk set in the tree, and whether its digest is the workspace's
    /// `rdf43` build of this pin.
    pub builtin: Option<TreeFile>,
    pub builtin_matches_build: Option<bool>,
    /// The build receipts beside the built artifacts, the DM files and the built-in (only
    /// those present; see [`crate::loadable`]).
    pub receipts: Vec<ReceiptStatus>,
    /// The generation's contract ties every artifact, DM file and the built-in to the pin by a
    /// build receipt (v26's): then a file without a receipt of this pin and these bytes is not
    /// built yet, whatever lies there.
    pub receipts_required: bool,
    pub preflight: CellStatus,
    /// Every driving and device-check cell of the matrix (empty without a staged manifest).
    pub validation: Vec<CellStatus>,
    pub rehearsal: CellStatus,
    pub stores: Vec<StoreStatus>,
    pub problems: Vec<String>,
    pub next: NextStep,
}

/// A record of `results/`: `Err` (the status fails, naming the file) when it cannot be read,
/// `Ok(Err(why))` when it is no such record.
fn record<T: serde::de::DeserializeOwned>(path: &Path) -> Result<std::result::Result<T, String>> {
    let bytes = records::read_bytes(path)?;
    Ok(serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
}

fn cell(cell: &Cell, gap: Option<&Gap>, by: &str) -> CellStatus {
    let (state, detail) = match gap {
        None => ("covered", by.to_string()),
        Some(Gap::Missing { next }) => ("missing", next.clone()),
        Some(Gap::Failed { detail }) => ("failed", detail.clone()),
        Some(Gap::Stale { detail }) => ("stale", detail.clone()),
    };
    CellStatus {
        cell: cell.to_string(),
        state,
        detail,
    }
}

fn tree_status(op: &Path, pins: &PinTable) -> Result<TreeStatus> {
    let (tinygrad_commit, problem) = match crate::tree::tree_pin(op) {
        Ok(p) => (Some(p.commit), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let pin_generation = tinygrad_commit.as_ref().and_then(|p| pins.owner_of(p));
    let record = compiler_remote::synced::read_record(op)?;
    let synced = match &record {
        Some(r) => {
            let now = compiler_remote::tree_digest::sync_digest(op)?;
            Some(SyncedStatus {
                destination: r.destination.clone(),
                remote_root: r.remote_root.clone(),
                digest_sha256: r.digest.sha256,
                files: r.digest.files,
                synced_at_unix: r.synced_at_unix,
                tree_matches: now == r.digest,
            })
        }
        None => None,
    };
    let selector_problems = match pin_generation {
        Some(g) => crate::tree::selector_problems(&crate::tree::generation_selectors(op)?, g),
        None => Vec::new(),
    };
    Ok(TreeStatus {
        openpilot: op.to_path_buf(),
        tinygrad_commit,
        pin_generation,
        selector_problems,
        trusted_keys: op.join(crate::rehearse::TREE_TRUSTED_KEYS).is_file(),
        compiler_marker: record.map(|r| r.tinygrad_commit),
        synced,
        problem,
    })
}

fn builds(
    ws: &Workspace,
    generation: Option<Generation>,
    pin: Option<&GitCommit>,
    problems: &mut Vec<String>,
) -> Result<Vec<BuildStatus>> {
    let dir = ws.results();
    let mut out: Vec<BuildStatus> = Vec::new();
    let Ok(entries) = fs::read_dir(&dir) else {
        return Ok(out);
    };
    let mut paths: Vec<PathBuf> = Vec::new();
    // As the gate reads results/: bounded (records::load refuses a larger directory).
    // Anything but a directory is a record to read: one that cannot be read (a FIFO, a
    // dangling link, no permission) is an error naming it, never a missing build.
    for e in entries.take(records::MAX_RESULTS_ENTRIES) {
        let e = e?;
        if !e.file_type()?.is_dir() {
            paths.push(e.path());
        }
    }
    paths.sort();
    let mut failures = Vec::new();
    for p in paths {
        let name = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if let Some(id) = name.strip_suffix(".failure.json") {
            if id.parse::<ModelId>().is_ok() {
                failures.push(p);
            }
            continue;
        }
        let Some(id) = name.strip_suffix(".json") else {
            continue;
        };
        if id.contains('.')
            || id == "preflight"
            || id == "rehearsal"
            || id.parse::<ModelId>().is_err()
        {
            continue;
        }
        match record::<BuildRecord>(&p)? {
            Ok(r) => {
                let current = generation.is_none_or(|g| r.generation == g)
                    && pin.is_none_or(|p| &r.tinygrad_commit == p);
                out.push(BuildStatus {
                    id: r.id,
                    state: if current { "built" } else { "stale" },
                    generation: r.generation,
                    version: Some(r.version),
                    uses_external_gpu: Some(r.uses_external_gpu),
                    tinygrad_commit: Some(r.tinygrad_commit),
                    sha256: Some(r.artifact.sha256),
                    error: None,
                })
            }
            Err(e) => problems.push(format!("{}: not a build record ({e})", p.display())),
        }
    }
    for p in failures {
        match record::<FailureRecord>(&p)? {
            Ok(f) => {
                if out.iter().any(|b| b.id == f.id && b.state == "built") {
                    continue;
                }
                out.retain(|b| b.id != f.id);
                out.push(BuildStatus {
                    id: f.id,
                    state: "failed",
                    generation: f.generation,
                    version: None,
                    uses_external_gpu: None,
                    tinygrad_commit: None,
                    sha256: None,
                    error: Some(f.error),
                });
            }
            Err(e) => problems.push(format!("{}: not a failure record ({e})", p.display())),
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

fn dm_and_builtin(op: &Path) -> Result<(Vec<TreeFile>, Option<TreeFile>)> {
    let dir = op.join(crate::tree::BUILTIN_DIR);
    let mut dm = Vec::new();
    for name in layout::DM_FILES {
        let p = dir.join(name);
        let meta = fs::symlink_metadata(&p).ok().filter(|m| m.is_file());
        let (size, sha256) = match meta {
            Some(m) => (Some(m.len()), Some(Sha256Digest::of_file(&p)?.0)),
            None => (None, None),
        };
        dm.push(TreeFile {
            name: name.to_string(),
            size,
            sha256,
        });
    }
    let name = crate::tree::BUILTIN_NAME;
    let sidecar = dir.join(chunker::sidecar_name(name));
    let builtin = if sidecar.is_file() {
        let sha = chunker::parse_sidecar(
            &chunker::bounded::read_capped_existing(&sidecar, records::MAX_RECORD_BYTES)?,
            &sidecar,
        )
        .ok();
        Some(TreeFile {
            name: name.to_string(),
            size: None,
            sha256: sha,
        })
    } else {
        None
    };
    Ok((dm, builtin))
}

fn store_status(
    name: &str,
    store: &dyn Store,
    g: Generation,
    staged: Option<&Sha256Digest>,
) -> StoreStatus {
    let mut s = StoreStatus {
        store: name.to_string(),
        ..Default::default()
    };
    let hf = layout::StoreLayout::HfBucket;
    match store.read_small(&hf.manifest_path(g), 16 << 20) {
        Ok(None) => s.problem = Some(format!("no {} manifest", g)),
        Err(e) => s.problem = Some(e.to_string()),
        Ok(Some(bytes)) => {
            let sha = Sha256Digest::of_bytes(&bytes);
            s.holds_staged = staged == Some(&sha);
            s.manifest_sha256 = Some(sha);
            match Manifest::from_slice(&bytes) {
                Ok(m) => {
                    s.generation = m.generation();
                    s.tinygrad_commit = m.own_revision();
                    s.models = Some(m.models().len());
                }
                Err(e) => s.problem = Some(format!("the live manifest does not parse: {e}")),
            }
        }
    }
    if let Ok(Some(sig)) = store.read_small(&hf.signature_path(g), 64 << 10) {
        s.signature_release = manifest::signature::signature_blocks(&String::from_utf8_lossy(&sig))
            .ok()
            .and_then(|b| b.first().map(|b| b.trusted_comment().to_string()))
            .and_then(|c| c.parse::<manifest::signature::TrustedComment>().ok())
            .map(|c| c.release.get());
    }
    s
}

/// Read where the release stands. `openpilot` defaults to the tree the preflight record names;
/// `generation` to the one whose pin the tree's tinygrad is. A `generation` the rebuild of the
/// next one set aside is read from `generations/<gen>/` ([`Workspace::holding`]), which the
/// report then names as its workspace. Nothing is written or connected to except the given
/// stores, which are only read.
pub fn gather(
    workspace: &Workspace,
    openpilot: Option<&Path>,
    generation: Option<Generation>,
    stores: &[(String, &dyn Store)],
) -> Result<Status> {
    let workspace = &generation.map_or_else(|| workspace.clone(), |g| workspace.holding(g));
    let mut recs = records::load(workspace)?;
    // The preflight is judged against the checkout as it is now (commit, changes, which one).
    recs.tree = recs
        .preflight
        .as_ref()
        .map(|p| crate::preflight::tree_now(openpilot, p));
    let mut problems = Vec::new();
    let op: Option<PathBuf> = openpilot
        .map(Path::to_path_buf)
        .or_else(|| recs.preflight.as_ref().map(|p| p.openpilot.clone()))
        .filter(|p| p.is_dir());
    let pins = crate::tree::load_pins(op.as_deref())?;
    let tree = op.as_deref().map(|op| tree_status(op, &pins)).transpose()?;
    let generation = generation.or(tree.as_ref().and_then(|t| t.pin_generation));
    let tree_pin = tree.as_ref().and_then(|t| t.tinygrad_commit.clone());
    let manifest_path = generation
        .map(|g| workspace.ready_manifest(g))
        .filter(|p| p.symlink_metadata().is_ok());
    let manifest = manifest_path.as_ref().and_then(|p| {
        crate::rehearse::read_manifest(p)
            .map_err(|e| problems.push(e.to_string()))
            .ok()
    });
    let pin = manifest
        .as_ref()
        .and_then(Manifest::tinygrad_commit)
        .or(tree_pin.clone());
    let builds = builds(workspace, generation, pin.as_ref(), &mut problems)?;
    let unbuilt = manifest
        .as_ref()
        .map(|m| unbuilt(m, &builds))
        .unwrap_or_default();
    let (dm, builtin) = match &op {
        Some(op) => dm_and_builtin(op)?,
        None => (Vec::new(), None),
    };
    let builtin_matches_build = builtin.as_ref().and_then(|b| {
        let rdf = builds
            .iter()
            .find(|r| r.id.as_str() == layout::BUILTIN_MODEL_ID && r.state == "built")?;
        Some(b.sha256.is_some() && b.sha256 == rdf.sha256)
    });
    let (receipts, receipts_required) = receipts_of(
        workspace,
        op.as_deref(),
        generation,
        pin.as_ref(),
        &pins,
        &builds,
    );
    let manifest_sha256 = manifest.as_ref().map(crate::rehearse::manifest_digest);
    let (preflight, validation, rehearsal) = match &manifest {
        Some(m) => gate_cells(m, &recs),
        None => (
            preflight_unstaged(&recs, tree_pin.as_ref(), workspace),
            Vec::new(),
            CellStatus {
                cell: Cell::Rehearsal.to_string(),
                state: "missing",
                detail: "no staged manifest to rehearse yet".into(),
            },
        ),
    };
    let stores = stores_status(stores, generation, manifest_sha256.as_ref());
    let source_map = match (&op, generation) {
        (Some(op), Some(g)) => Some(crate::source_map::map_path(op, g)),
        _ => None,
    }
    .filter(|p| p.is_file());
    let mut status = Status {
        workspace: workspace.root().to_path_buf(),
        generation,
        source_map,
        tree,
        manifest: manifest_path,
        manifest_sha256,
        unbuilt,
        builds,
        dm,
        builtin,
        builtin_matches_build,
        receipts,
        receipts_required,
        preflight,
        validation,
        rehearsal,
        stores,
        problems,
        next: NextStep::default(),
    };
    status.next = next_step(&status);
    Ok(status)
}

/// The build receipts beside the built artifacts, the tree's DM files and its built-in, judged
/// against `pin` (else the pin table's for `generation`), and whether the generation's contract
/// requires them.
fn receipts_of(
    workspace: &Workspace,
    op: Option<&Path>,
    generation: Option<Generation>,
    pin: Option<&GitCommit>,
    pins: &PinTable,
    builds: &[BuildStatus],
) -> (Vec<ReceiptStatus>, bool) {
    // The pin receipts are judged against: the release's, else the pin table's for the
    // generation.
    let receipt_pin = pin.cloned().or_else(|| pins.get(generation?).cloned());
    let receipts = receipts(&receipt_files(workspace, op, builds), receipt_pin.as_ref());
    let required = generation.is_some_and(|g| pins.contract(g).build_receipts);
    (receipts, required)
}

/// What each store given holds live for `generation` (none read without one).
fn stores_status(
    stores: &[(String, &dyn Store)],
    generation: Option<Generation>,
    staged: Option<&Sha256Digest>,
) -> Vec<StoreStatus> {
    stores
        .iter()
        .map(|(n, s)| match generation {
            Some(g) => store_status(n, *s, g, staged),
            // A store named without a generation to look for: said, not silently dropped.
            None => StoreStatus {
                problem: Some(
                    "not read: no generation is known; pass --generation vNN, or --openpilot DIR \
                     whose tinygrad pin names one"
                        .into(),
                ),
                store: n.to_string(),
                ..Default::default()
            },
        })
        .collect()
}

/// The catalog models of `m` without a build of this generation and pin in `builds`.
fn unbuilt(m: &Manifest, builds: &[BuildStatus]) -> Vec<ModelId> {
    m.models()
        .iter()
        .map(|e| e.id())
        .filter(|id| !id.is_local())
        .filter(|id| !builds.iter().any(|b| &b.id == *id && b.state == "built"))
        .cloned()
        .collect()
}

/// The files whose build receipts the status reads (label, logical artifact path): the built
/// artifacts, then the tree's DM files and built-in.
fn receipt_files(
    ws: &Workspace,
    op: Option<&Path>,
    builds: &[BuildStatus],
) -> Vec<(String, PathBuf)> {
    let mut files: Vec<(String, PathBuf)> = builds
        .iter()
        .filter(|b| b.state == "built")
        .map(|b| (format!("build {}", b.id), ws.ready_artifact(&b.id)))
        .collect();
    if let Some(op) = op {
        let models = op.join(crate::tree::BUILTIN_DIR);
        files.extend(
            layout::DM_FILES
                .iter()
                .map(|n| (format!("dm {n}"), models.join(n))),
        );
        files.push(("builtin".into(), models.join(crate::tree::BUILTIN_NAME)));
    }
    files
}

/// The preflight, validation and rehearsal cells of the staged manifest `m`, as the gate
/// judges them (validation in matrix order).
fn gate_cells(m: &Manifest, recs: &Records) -> (CellStatus, Vec<CellStatus>, CellStatus) {
    let cov = coverage(m, recs);
    let mut all: Vec<(Cell, CellStatus)> = cov
        .covered
        .iter()
        .map(|(c, by)| (c.clone(), cell(c, None, by)))
        .chain(
            cov.gaps
                .iter()
                .map(|(c, g)| (c.clone(), cell(c, Some(g), ""))),
        )
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let find = |want: &Cell| {
        all.iter()
            .find(|(c, _)| c == want)
            .map(|(_, s)| s.clone())
            .expect("coverage lists every cell")
    };
    let (preflight, rehearsal) = (find(&Cell::Preflight), find(&Cell::Rehearsal));
    let validation = all
        .into_iter()
        .filter(|(c, _)| !matches!(c, Cell::Preflight | Cell::Rehearsal))
        .map(|(_, s)| s)
        .collect();
    (preflight, validation, rehearsal)
}

/// The preflight cell with no staged manifest for the gate to judge it by: its record against
/// the tree's pin and the checkout as it is now.
fn preflight_unstaged(recs: &Records, tree_pin: Option<&GitCommit>, ws: &Workspace) -> CellStatus {
    let Some(p) = &recs.preflight else {
        let next = "run `release-cli preflight --openpilot DIR --workspace WS` \
                    (DIR: the openpilot checkout)";
        return cell(
            &Cell::Preflight,
            Some(&Gap::Missing { next: next.into() }),
            "",
        );
    };
    let gap = if let Some(t) = tree_pin.filter(|t| *t != &p.tinygrad_commit) {
        Some(Gap::Stale {
            detail: format!(
                "recorded with tinygrad {}, the tree is at {t}",
                p.tinygrad_commit
            ),
        })
    } else if let Some(binding) = crate::gate::preflight_binding(p, recs.tree.as_ref()) {
        Some(Gap::Stale {
            detail: crate::gate::fill_workspace(&binding, Some(ws.root())),
        })
    } else if !p.passed {
        Some(Gap::Failed {
            detail: format!("see {}", p.log.display()),
        })
    } else {
        None
    };
    let by = match gap {
        Some(_) => String::new(),
        None => format!(
            "preflight of {} at {}",
            p.openpilot.display(),
            p.finished_at
        ),
    };
    cell(&Cell::Preflight, gap.as_ref(), &by)
}

/// The `rebuild` step of [`next_step`] for workspace `ws`, generation `g` and tree `op`:
/// each of its two input files has its own placeholder, named by `why`.
pub fn rebuild_step(ws: &str, g: &str, op: &str, why: &str) -> NextStep {
    NextStep {
        command: format!(
            "release-cli rebuild --workspace {ws} --generation {g} --openpilot {op} \
             --source-map SOURCE_MAP --base-manifest BASE_MANIFEST"
        ),
        why: format!(
            "{why}; SOURCE_MAP: the {g} source map (release model ID -> ONNX source), \
             BASE_MANIFEST: the manifest the models are rebuilt from (the live one)"
        ),
    }
}

/// Where the commands a step names point: the workspace, the openpilot tree and the generation,
/// or the placeholders a step leaves for them.
struct Places {
    ws: String,
    op: String,
    g: String,
}

impl Places {
    fn of(s: &Status) -> Self {
        Places {
            ws: s.workspace.display().to_string(),
            op: s.tree.as_ref().map_or("~/openpilot".to_string(), |t| {
                t.openpilot.display().to_string()
            }),
            g: s.generation.map_or("vNN".to_string(), |g| g.to_string()),
        }
    }

    fn rebuild(&self, why: &str) -> NextStep {
        rebuild_step(&self.ws, &self.g, &self.op, why)
    }
}

fn step(command: String, why: String) -> NextStep {
    NextStep { command, why }
}

/// Runbook steps 1-3 (the tree, its pin, the sync): `Ok` with the tree and its pin once the
/// compiler holds this tree, else the step that gets it there.
fn synced_tree<'a>(
    s: &'a Status,
    at: &Places,
) -> std::result::Result<(&'a TreeStatus, &'a GitCommit), NextStep> {
    let Places { ws, op, .. } = at;
    let Some(tree) = &s.tree else {
        return Err(step(
            format!("release-cli status --workspace {ws} --openpilot DIR"),
            "no openpilot tree is known (no --openpilot and no preflight record naming one); \
             DIR: the openpilot checkout the release is built from"
                .into(),
        ));
    };
    let Some(pin) = &tree.tinygrad_commit else {
        return Err(step(
            format!("release-cli tinygrad bump --openpilot {op} --tinygrad-src DIR --commit SHA"),
            format!(
                "the tree has no readable tinygrad marker: {}; DIR: the tinygrad checkout at the \
                 commit the tree should pin, SHA: that full commit",
                tree.problem.clone().unwrap_or_default()
            ),
        ));
    };
    if tree.pin_generation.is_none() {
        return Err(step(
            format!("release-cli tinygrad bump --openpilot {op} --tinygrad-src DIR --commit {pin}"),
            format!(
                "the tree's tinygrad {pin} is no generation's pin: record it; DIR: the tinygrad \
                 checkout at {pin}"
            ),
        ));
    }
    if !tree.selector_problems.is_empty() {
        return Err(step(
            format!("release-cli status --workspace {ws} --openpilot {op}"),
            format!(
                "the tree does not select the generation of its tinygrad: {}; make the edit, \
                 commit it, then run this again",
                tree.selector_problems.join("; ")
            ),
        ));
    }
    let why = match (&tree.compiler_marker, &tree.synced) {
        (None, _) | (_, None) => "the tree was never synced to the compiler".to_string(),
        (Some(m), _) if m != pin => format!("the compiler's marker is {m}, the tree's pin {pin}"),
        (_, Some(x)) if !x.tree_matches => {
            "the files sync sends changed since the last sync".to_string()
        }
        _ => return Ok((tree, pin)),
    };
    Err(step(format!("release-cli sync --openpilot {op}"), why))
}

/// Runbook step 4 when no manifest is staged: the generation's source map, then the rebuild
/// from it.
fn unstaged_step(s: &Status, at: &Places) -> NextStep {
    let Places { ws, op, g } = at;
    let Some(map) = &s.source_map else {
        return step(
            format!("release-cli source-map next --openpilot {op}"),
            format!(
                "no source map scripts/model_source_map_{g}.json in the tree yet: it is \
                 written from the previous generation's (commit it, then rebuild)"
            ),
        );
    };
    step(
        format!(
            "release-cli rebuild --workspace {ws} --generation {g} --openpilot {op} \
             --source-map {} --base-manifest BASE_MANIFEST",
            map.display()
        ),
        format!(
            "no staged manifest ready/model_names_{g}.json yet; BASE_MANIFEST: the manifest \
             the models are rebuilt from (the live one)"
        ),
    )
}

/// What a file's build receipt says of it against the release's pin.
enum Receipt<'a> {
    /// It ties these bytes to the pin, or the contract has no receipts.
    Ties,
    Absent,
    /// It names another compiler revision (`None`: unreadable).
    OtherPin(Option<&'a GitCommit>),
    OtherBytes,
}

impl<'a> Receipt<'a> {
    /// The receipt of the file called `of` whose bytes are `sha`.
    fn of(s: &'a Status, of: &str, sha: Option<&Sha256Digest>) -> Self {
        if !s.receipts_required {
            return Receipt::Ties;
        }
        match s.receipts.iter().find(|r| r.of == of) {
            None => Receipt::Absent,
            Some(r) if r.matches_pin != Some(true) => {
                Receipt::OtherPin(r.compiler_revision.as_ref())
            }
            Some(r) if sha.is_some() && r.artifact_sha256.as_ref() != sha => Receipt::OtherBytes,
            Some(_) => Receipt::Ties,
        }
    }

    /// Why the file called `of` is not the build of `pin` (`None`: it is).
    fn problem(&self, of: &str, pin: &GitCommit) -> Option<String> {
        match self {
            Receipt::Ties => None,
            Receipt::Absent => Some(format!("{of} has no build receipt")),
            Receipt::OtherPin(c) => Some(format!(
                "{of}'s build receipt names tinygrad {}, not the pin {pin}",
                c.map_or("(unreadable)".to_string(), |c| c.to_string())
            )),
            Receipt::OtherBytes => Some(format!("{of}'s build receipt is of other bytes")),
        }
    }
}

/// The first artifact whose build record or receipt is not this generation's and pin's, in the
/// order the runbook builds them (models, DM set, built-in).
enum Unbuilt<'a> {
    /// A model's record is stale, or only a failure.
    Record(&'a BuildStatus),
    /// A catalog model with no record of this generation and pin.
    NoRecord(&'a ModelId),
    /// A built model whose receipt is not of the pin (why).
    ModelReceipt(String),
    /// DM files missing from the tree.
    DmMissing,
    /// Every DM file there, one's receipt not of the pin (why).
    DmReceipt(String),
    /// The built-in missing, of another build, or its receipt not of the pin.
    Builtin,
}

impl<'a> Unbuilt<'a> {
    fn first(s: &'a Status, pin: &GitCommit) -> Option<Self> {
        let problem =
            |of: &str, sha: Option<&Sha256Digest>| Receipt::of(s, of, sha).problem(of, pin);
        if let Some(b) = s.builds.iter().find(|b| b.state != "built") {
            return Some(Unbuilt::Record(b));
        }
        if let Some(id) = s.unbuilt.first() {
            return Some(Unbuilt::NoRecord(id));
        }
        if let Some(why) = s
            .builds
            .iter()
            .find_map(|b| problem(&format!("build {}", b.id), b.sha256.as_ref()))
        {
            return Some(Unbuilt::ModelReceipt(why));
        }
        if s.dm.is_empty() || s.dm.iter().any(|f| f.sha256.is_none()) {
            return Some(Unbuilt::DmMissing);
        }
        if let Some(why) =
            s.dm.iter()
                .find_map(|f| problem(&format!("dm {}", f.name), f.sha256.as_ref()))
        {
            return Some(Unbuilt::DmReceipt(why));
        }
        let builtin_ok = s.builtin.as_ref().is_some_and(|b| {
            s.builtin_matches_build != Some(false)
                && problem("builtin", b.sha256.as_ref()).is_none()
        });
        (!builtin_ok).then_some(Unbuilt::Builtin)
    }

    fn step(&self, at: &Places) -> NextStep {
        let Places { ws, op, .. } = at;
        let dm = |why: String| {
            step(
                format!(
                    "release-cli dm --out {op}/{} --openpilot {op}",
                    crate::tree::BUILTIN_DIR
                ),
                why,
            )
        };
        match self {
            Unbuilt::Record(b) => at.rebuild(&format!(
                "{} is {} ({})",
                b.id,
                b.state,
                b.error
                    .clone()
                    .unwrap_or_else(|| "another generation or pin".into())
            )),
            Unbuilt::NoRecord(id) => {
                at.rebuild(&format!("{id} has no build of this generation and pin"))
            }
            Unbuilt::ModelReceipt(why) => at.rebuild(why),
            Unbuilt::DmMissing => dm("the tree lacks DM files (all four are replaced together)".into()),
            Unbuilt::DmReceipt(why) => dm(format!(
                "the tree's DM files are not this pin's build: {why} (all four are rebuilt \
                 together)"
            )),
            Unbuilt::Builtin => step(
                format!(
                    "release-cli builtin --artifact {ws}/ready/rdf43/rdf43_driving_tinygrad.pkl --openpilot {op}"
                ),
                "the tree's built-in RDF V4 is missing or not the workspace's rdf43 build of this pin \
                 (build it with rebuild --model rdf43, or compile it and pass that artifact)"
                    .into(),
            ),
        }
    }
}

/// Runbook steps 6-9 once every artifact is built: the preflight, the validation cells, the
/// rehearsal and the publish to every store given, each when its gate or store is not there yet.
fn gated_step(s: &Status, at: &Places, tree: &TreeStatus, manifest: &Path) -> NextStep {
    let Places { ws, op, g } = at;
    if s.preflight.state != "covered" {
        return step(
            format!("release-cli preflight --openpilot {op} --workspace {ws}"),
            format!("preflight is {}: {}", s.preflight.state, s.preflight.detail),
        );
    }
    if let Some(c) = s.validation.iter().find(|c| c.state != "covered") {
        return step(
            format!("release-cli validate --model ID --workspace {ws}"),
            format!(
                "{}: {}: {}; ID: a model of the generation that validates this cell",
                c.cell, c.state, c.detail
            ),
        );
    }
    let manifest = manifest.display();
    // A tree that ships release keys: its devices take only a signed manifest.
    let (sign, key_why) = if tree.trusted_keys {
        (
            " --sign-key KEY",
            "; KEY: the release secret key (the tree ships model_release_keys.pub, so devices \
             take only a signed manifest)",
        )
    } else {
        ("", "")
    };
    if s.rehearsal.state != "covered" {
        return step(
            format!(
                "release-cli rehearse --generation {g} --manifest {manifest} --artifacts {ws}/ready --openpilot {op} --workspace {ws}{sign}"
            ),
            format!(
                "the rehearsal is {}: {}{key_why}",
                s.rehearsal.state, s.rehearsal.detail
            ),
        );
    }
    let behind: Vec<&str> = s
        .stores
        .iter()
        .filter(|x| !x.holds_staged)
        .map(|x| x.store.as_str())
        .collect();
    if s.stores.is_empty() || !behind.is_empty() {
        return step(
            format!(
                "release-cli publish --generation {g} --manifest {manifest} --artifacts {ws}/ready --workspace {ws} --openpilot {op} --to hf://buckets/{} --to github:CHECKOUT{sign}",
                layout::HF_BUCKET
            ),
            if s.stores.is_empty() {
                format!(
                    "every gate is covered; no --store was given to check what is live{key_why}"
                )
            } else {
                format!(
                    "every gate is covered; not live yet in {}{key_why}",
                    behind.join(", ")
                )
            },
        );
    }
    step(
        String::new(),
        format!(
            "done: every store given holds the staged {g} manifest; devices pick it up on their next refresh (check one comma, docs/release.md)"
        ),
    )
}

/// The next command, a pure function of the status: the first step of the runbook
/// (docs/release.md, "Bumping to the next generation") that is not done.
pub fn next_step(s: &Status) -> NextStep {
    let at = Places::of(s);
    let (tree, pin) = match synced_tree(s, &at) {
        Ok(t) => t,
        Err(step) => return step,
    };
    let Some(manifest) = &s.manifest else {
        return unstaged_step(s, &at);
    };
    match Unbuilt::first(s, pin) {
        Some(unbuilt) => unbuilt.step(&at),
        None => gated_step(s, &at, tree, manifest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(c: &str) -> CellStatus {
        CellStatus {
            cell: c.into(),
            state: "covered",
            detail: "ok".into(),
        }
    }

    /// A release of `g` pinned to `pin` where everything is done.
    fn done(g: u32, pin: &str) -> Status {
        let pin: GitCommit = pin.parse().unwrap();
        let g = Generation::new(g);
        let sha = Sha256Digest::of_bytes(b"manifest");
        Status {
            workspace: "/ws".into(),
            generation: Some(g),
            source_map: Some(format!("/op/scripts/model_source_map_{g}.json").into()),
            tree: Some(TreeStatus {
                openpilot: "/op".into(),
                tinygrad_commit: Some(pin.clone()),
                pin_generation: Some(g),
                selector_problems: vec![],
                trusted_keys: false,
                compiler_marker: Some(pin.clone()),
                synced: Some(SyncedStatus {
                    destination: "comma".into(),
                    remote_root: "/data/openpilot".into(),
                    digest_sha256: sha,
                    files: 10,
                    synced_at_unix: 1,
                    tree_matches: true,
                }),
                problem: None,
            }),
            manifest: Some(format!("/ws/ready/model_names_{g}.json").into()),
            manifest_sha256: Some(sha),
            unbuilt: vec![],
            builds: vec![BuildStatus {
                id: "pop223".parse().unwrap(),
                state: "built",
                generation: g,
                version: Some(BehaviorVersion::new(11)),
                uses_external_gpu: Some(false),
                tinygrad_commit: Some(pin),
                sha256: Some(sha),
                error: None,
            }],
            dm: layout::DM_FILES
                .iter()
                .map(|n| TreeFile {
                    name: n.to_string(),
                    size: Some(1),
                    sha256: Some(sha),
                })
                .collect(),
            builtin: Some(TreeFile {
                name: "driving_tinygrad.pkl".into(),
                size: None,
                sha256: Some(sha),
            }),
            builtin_matches_build: Some(true),
            receipts: vec![],
            receipts_required: false,
            preflight: covered("preflight"),
            validation: vec![covered("v11 artifact at 1928x1208")],
            rehearsal: covered("rehearsal"),
            stores: vec![StoreStatus {
                store: "/store".into(),
                generation: Some(g),
                tinygrad_commit: None,
                manifest_sha256: Some(sha),
                models: Some(1),
                signature_release: None,
                holds_staged: true,
                problem: None,
            }],
            problems: vec![],
            next: NextStep {
                command: String::new(),
                why: String::new(),
            },
        }
    }

    #[test]
    fn the_next_step_is_the_first_runbook_step_not_done() {
        type Edit = fn(&mut Status);
        let table: Vec<(&str, Edit, &str)> = vec![
            ("everything done", |_| {}, ""),
            ("no tree", |s| s.tree = None, "release-cli status"),
            (
                "no marker",
                |s| s.tree.as_mut().unwrap().tinygrad_commit = None,
                "release-cli tinygrad bump",
            ),
            (
                "a pin no table knows",
                |s| s.tree.as_mut().unwrap().pin_generation = None,
                "release-cli tinygrad bump",
            ),
            (
                "never synced",
                |s| {
                    let t = s.tree.as_mut().unwrap();
                    t.synced = None;
                    t.compiler_marker = None;
                },
                "release-cli sync",
            ),
            (
                "the compiler has the old pin",
                |s| {
                    s.tree.as_mut().unwrap().compiler_marker = Some("e".repeat(40).parse().unwrap())
                },
                "release-cli sync",
            ),
            (
                "edited since the sync",
                |s| {
                    s.tree
                        .as_mut()
                        .unwrap()
                        .synced
                        .as_mut()
                        .unwrap()
                        .tree_matches = false
                },
                "release-cli sync",
            ),
            (
                "no staged manifest",
                |s| s.manifest = None,
                "release-cli rebuild",
            ),
            (
                "no staged manifest and no source map",
                |s| {
                    s.manifest = None;
                    s.source_map = None;
                },
                "release-cli source-map next",
            ),
            (
                "a failed build",
                |s| s.builds[0].state = "failed",
                "release-cli rebuild",
            ),
            (
                "a stale build",
                |s| s.builds[0].state = "stale",
                "release-cli rebuild",
            ),
            (
                "a model without a build",
                |s| s.unbuilt = vec!["sc23".parse().unwrap()],
                "release-cli rebuild",
            ),
            (
                "a DM file missing",
                |s| s.dm[2].sha256 = None,
                "release-cli dm",
            ),
            ("no built-in", |s| s.builtin = None, "release-cli builtin"),
            (
                "the built-in of another build",
                |s| s.builtin_matches_build = Some(false),
                "release-cli builtin",
            ),
            (
                "preflight missing",
                |s| s.preflight.state = "missing",
                "release-cli preflight",
            ),
            (
                "preflight stale",
                |s| s.preflight.state = "stale",
                "release-cli preflight",
            ),
            (
                "a validation cell failed",
                |s| s.validation[0].state = "failed",
                "release-cli validate",
            ),
            (
                "not rehearsed",
                |s| s.rehearsal.state = "missing",
                "release-cli rehearse",
            ),
            (
                "rehearsal stale",
                |s| s.rehearsal.state = "stale",
                "release-cli rehearse",
            ),
            (
                "no store given",
                |s| s.stores.clear(),
                "release-cli publish",
            ),
            (
                "a store behind",
                |s| s.stores[0].holds_staged = false,
                "release-cli publish",
            ),
            (
                "not rehearsed, the tree ships release keys",
                |s| {
                    s.rehearsal.state = "missing";
                    s.tree.as_mut().unwrap().trusted_keys = true;
                },
                "release-cli rehearse",
            ),
            (
                "a store behind, the tree ships release keys",
                |s| {
                    s.stores[0].holds_staged = false;
                    s.tree.as_mut().unwrap().trusted_keys = true;
                },
                "release-cli publish",
            ),
            (
                "the tree selects another generation",
                |s| {
                    s.tree.as_mut().unwrap().selector_problems =
                        vec!["x.py:3: MANIFEST_CANDIDATES names (\"v25\",)".into()]
                },
                "release-cli status",
            ),
            (
                "a later step undone does not jump ahead of an earlier one",
                |s| {
                    s.rehearsal.state = "missing";
                    s.preflight.state = "failed";
                },
                "release-cli preflight",
            ),
        ];
        for (g, pin) in [
            (25, "e837e367aac9e1a66e689f4f32ce20ca9367df13"),
            (26, &*"26".repeat(20)),
            (27, &*"27".repeat(20)),
        ] {
            for (case, edit, want) in &table {
                let mut s = done(g, pin);
                edit(&mut s);
                let n = next_step(&s);
                assert!(
                    n.command.starts_with(want) && (!want.is_empty() || n.command.is_empty()),
                    "v{g} {case}: {n:?}"
                );
                assert!(!n.why.is_empty(), "v{g} {case}");
                // A tree with release keys rehearses and publishes signed, in that order.
                if case.contains("release keys") {
                    assert!(n.command.ends_with(" --sign-key KEY"), "v{g} {case}: {n:?}");
                }
                // Each placeholder the command leaves is said in the why (`DIR: …`).
                for w in n.command.split_whitespace() {
                    if cli_support::hints::is_placeholder(w) {
                        assert!(
                            n.why.contains(&format!("{w}:")),
                            "v{g} {case}: {w} is not explained: {n:?}"
                        );
                    }
                }
                if !n.command.is_empty()
                    && *want != "release-cli status"
                    && *want != "release-cli tinygrad bump"
                    && *want != "release-cli sync"
                {
                    // Later steps name the generation they are for.
                    assert!(
                        !n.command.contains("--generation")
                            || n.command.contains(&format!("--generation v{g}")),
                        "v{g} {case}: {n:?}"
                    );
                }
            }
        }
    }

    /// Every artifact, DM file and the built-in with a receipt of `pin` and its bytes.
    fn with_receipts(s: &mut Status, pin: &str) {
        s.receipts_required = true;
        let pin: GitCommit = pin.parse().unwrap();
        let mut of: Vec<(String, Option<Sha256Digest>)> = s
            .builds
            .iter()
            .map(|b| (format!("build {}", b.id), b.sha256))
            .collect();
        of.extend(s.dm.iter().map(|f| (format!("dm {}", f.name), f.sha256)));
        of.push(("builtin".into(), s.builtin.as_ref().and_then(|b| b.sha256)));
        s.receipts = of
            .into_iter()
            .map(|(of, sha)| ReceiptStatus {
                receipt: format!("/r/{of}.build.json").into(),
                of,
                compiler_revision: Some(pin.clone()),
                artifact_sha256: sha,
                matches_pin: Some(true),
                problem: None,
            })
            .collect();
    }

    /// Under a contract with build receipts, the next step follows what each file's receipt
    /// says, not that a file is there: after a rebuild, the previous pin's DM set (present, its
    /// receipt of the old pin) asks for `dm`, and so on for each file. Without receipts (v25)
    /// the same status is done.
    #[test]
    fn the_next_step_reads_each_files_receipt() {
        type Edit = fn(&mut Status);
        let table: Vec<(&str, Edit, &str)> = vec![
            ("every receipt of this pin", |_| {}, ""),
            (
                "the previous pin's DM set",
                |s| {
                    for r in s.receipts.iter_mut().filter(|r| r.of.starts_with("dm ")) {
                        r.matches_pin = Some(false);
                        r.compiler_revision = Some("e".repeat(40).parse().unwrap());
                    }
                },
                "release-cli dm",
            ),
            (
                "a DM file without a receipt",
                |s| {
                    s.receipts
                        .retain(|r| !r.of.ends_with("dm_warp_1344x760_tinygrad.pkl"))
                },
                "release-cli dm",
            ),
            (
                "a DM receipt of other bytes",
                |s| {
                    let r = s
                        .receipts
                        .iter_mut()
                        .find(|r| r.of.starts_with("dm "))
                        .unwrap();
                    r.artifact_sha256 = Some(Sha256Digest::of_bytes(b"x"));
                },
                "release-cli dm",
            ),
            (
                "the built-in's receipt of the previous pin",
                |s| {
                    let r = s.receipts.iter_mut().find(|r| r.of == "builtin").unwrap();
                    r.matches_pin = Some(false);
                },
                "release-cli builtin",
            ),
            (
                "a model's receipt missing",
                |s| s.receipts.retain(|r| !r.of.starts_with("build ")),
                "release-cli rebuild",
            ),
            (
                "a model's receipt of the previous pin",
                |s| {
                    let r = s
                        .receipts
                        .iter_mut()
                        .find(|r| r.of.starts_with("build "))
                        .unwrap();
                    r.matches_pin = Some(false);
                },
                "release-cli rebuild",
            ),
            (
                "an unreadable DM receipt",
                |s| {
                    let r = s
                        .receipts
                        .iter_mut()
                        .find(|r| r.of.starts_with("dm "))
                        .unwrap();
                    (r.compiler_revision, r.matches_pin) = (None, None);
                },
                "release-cli dm",
            ),
            (
                "a model's receipt missing and the DM set of the previous pin",
                |s| {
                    s.receipts.retain(|r| !r.of.starts_with("build "));
                    for r in s.receipts.iter_mut().filter(|r| r.of.starts_with("dm ")) {
                        r.matches_pin = Some(false);
                    }
                },
                "release-cli rebuild",
            ),
        ];
        for (g, pin) in [
            (25, "e837e367aac9e1a66e689f4f32ce20ca9367df13"),
            (26, &*"26".repeat(20)),
            (27, &*"27".repeat(20)),
        ] {
            for (case, edit, want) in &table {
                let mut s = done(g, pin);
                with_receipts(&mut s, pin);
                edit(&mut s);
                let n = next_step(&s);
                assert!(
                    n.command.starts_with(want) && (!want.is_empty() || n.command.is_empty()),
                    "v{g} {case}: {n:?}"
                );
                // A contract without receipts judges by the files alone: done.
                s.receipts_required = false;
                assert_eq!(next_step(&s).command, "", "v{g} {case} without receipts");
            }
        }
    }

    /// The why says what the first file's receipt says, and a missing DM file outranks a DM
    /// receipt of another pin (the set is replaced whole).
    #[test]
    fn the_why_says_what_the_receipt_says() {
        let pin = "26".repeat(20);
        let why = |edit: fn(&mut Status)| {
            let mut s = done(26, &pin);
            with_receipts(&mut s, &pin);
            edit(&mut s);
            next_step(&s).why
        };
        let w = why(|s| s.receipts.retain(|r| r.of != "build pop223"));
        assert!(w.starts_with("build pop223 has no build receipt; "), "{w}");
        let w = why(|s| {
            let r = s
                .receipts
                .iter_mut()
                .find(|r| r.of.starts_with("dm "))
                .unwrap();
            (r.compiler_revision, r.matches_pin) = (None, None);
        });
        assert!(
            w.contains("build receipt names tinygrad (unreadable), not the pin 2626"),
            "{w}"
        );
        let w = why(|s| {
            let r = s
                .receipts
                .iter_mut()
                .find(|r| r.of == "build pop223")
                .unwrap();
            r.artifact_sha256 = Some(Sha256Digest::of_bytes(b"x"));
        });
        assert!(
            w.starts_with("build pop223's build receipt is of other bytes"),
            "{w}"
        );
        let w = why(|s| {
            s.dm[0].sha256 = None;
            for r in s.receipts.iter_mut().filter(|r| r.of.starts_with("dm ")) {
                r.matches_pin = Some(false);
            }
        });
        assert_eq!(
            w,
            "the tree lacks DM files (all four are replaced together)"
        );
    }
}
