//! `release-cli status`: where a release stands, read from the workspace, the openpilot tree and
//! the stores (nothing is connected to or written), and [`next_step`], the pure rule that says
//! which command to run next (docs/release.md, "Where the release stands").

use fs_err as fs;
use std::path::{Path, PathBuf};

use artifact_store::Store;
use chunker::Sha256Digest;
use manifest::{BehaviorVersion, Generation, GitCommit, Manifest, ModelId, layout};
use serde::Serialize;

use crate::gate::{Cell, Gap, coverage};
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
                    compiler_revision: None,
                    artifact_sha256: None,
                    matches_pin: None,
                    problem: Some(problem),
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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

/// A record of `results/`, or why it is not one (a problem line, not an error of `status`).
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

fn tree_status(op: &Path) -> Result<TreeStatus> {
    let pins = crate::tree::load_pins(Some(op))?;
    let (tinygrad_commit, problem) = match crate::tree::tree_pin(op) {
        Ok(p) => (Some(p.commit), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let pin_generation = tinygrad_commit.as_ref().and_then(|p| pins.owner_of(p));
    let record = crate::tree::sync_record(op)?;
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
        generation: None,
        tinygrad_commit: None,
        manifest_sha256: None,
        models: None,
        signature_release: None,
        holds_staged: false,
        problem: None,
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
    let tree = op.as_deref().map(tree_status).transpose()?;
    let generation = generation.or(tree.as_ref().and_then(|t| t.pin_generation));
    let tree_pin = tree.as_ref().and_then(|t| t.tinygrad_commit.clone());
    let manifest_path = generation
        .map(|g| workspace.ready_manifest(g))
        .filter(|p| p.symlink_metadata().is_ok());
    let manifest = match &manifest_path {
        Some(p) => match crate::rehearse::read_manifest(p) {
            Ok(m) => Some(m),
            Err(e) => {
                problems.push(e.to_string());
                None
            }
        },
        None => None,
    };
    let pin = manifest
        .as_ref()
        .and_then(Manifest::tinygrad_commit)
        .or(tree_pin.clone());
    let builds = builds(workspace, generation, pin.as_ref(), &mut problems)?;
    let unbuilt = manifest
        .as_ref()
        .map(|m| {
            m.models()
                .iter()
                .map(|e| e.id())
                .filter(|id| !id.is_local())
                .filter(|id| !builds.iter().any(|b| &b.id == *id && b.state == "built"))
                .cloned()
                .collect()
        })
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

    let mut receipt_files: Vec<(String, PathBuf)> = builds
        .iter()
        .filter(|b| b.state == "built")
        .map(|b| (format!("build {}", b.id), workspace.ready_artifact(&b.id)))
        .collect();
    if let Some(op) = &op {
        let models = op.join(crate::tree::BUILTIN_DIR);
        receipt_files.extend(
            layout::DM_FILES
                .iter()
                .map(|n| (format!("dm {n}"), models.join(n))),
        );
        receipt_files.push(("builtin".into(), models.join(crate::tree::BUILTIN_NAME)));
    }
    // The pin receipts are judged against: the release's, else the pin table's for the
    // generation.
    let receipt_pin = match (&pin, generation) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(g)) => crate::tree::load_pins(op.as_deref())
            .ok()
            .and_then(|pins| pins.get(g).cloned()),
        (None, None) => None,
    };
    let receipts = receipts(&receipt_files, receipt_pin.as_ref());
    let receipts_required = generation.is_some_and(|g| {
        crate::tree::load_pins(op.as_deref()).is_ok_and(|p| p.contract(g).build_receipts)
    });

    let manifest_sha256 = manifest.as_ref().map(crate::rehearse::manifest_digest);
    let (preflight, validation, rehearsal) = match &manifest {
        Some(m) => {
            let cov = coverage(m, &recs);
            let mut all: Vec<(Cell, Option<Gap>, String)> = cov
                .covered
                .iter()
                .map(|(c, by)| (c.clone(), None, by.clone()))
                .chain(
                    cov.gaps
                        .iter()
                        .map(|(c, g)| (c.clone(), Some(g.clone()), String::new())),
                )
                .collect();
            all.sort_by(|a, b| a.0.cmp(&b.0));
            let find = |want: &Cell| {
                all.iter()
                    .find(|(c, ..)| c == want)
                    .map(|(c, g, by)| cell(c, g.as_ref(), by))
                    .expect("coverage lists every cell")
            };
            let validation = all
                .iter()
                .filter(|(c, ..)| !matches!(c, Cell::Preflight | Cell::Rehearsal))
                .map(|(c, g, by)| cell(c, g.as_ref(), by))
                .collect();
            (find(&Cell::Preflight), validation, find(&Cell::Rehearsal))
        }
        None => {
            let pre = match &recs.preflight {
                None => cell(
                    &Cell::Preflight,
                    Some(&Gap::Missing {
                        next: "run `release-cli preflight --openpilot DIR --workspace WS` \
                               (DIR: the openpilot checkout)"
                            .into(),
                    }),
                    "",
                ),
                Some(p) if tree_pin.as_ref().is_some_and(|t| t != &p.tinygrad_commit) => cell(
                    &Cell::Preflight,
                    Some(&Gap::Stale {
                        detail: format!(
                            "recorded with tinygrad {}, the tree is at {}",
                            p.tinygrad_commit,
                            tree_pin.as_ref().expect("checked")
                        ),
                    }),
                    "",
                ),
                Some(p) if crate::gate::preflight_binding(p, recs.tree.as_ref()).is_some() => cell(
                    &Cell::Preflight,
                    Some(&Gap::Stale {
                        detail: crate::gate::fill_workspace(
                            &crate::gate::preflight_binding(p, recs.tree.as_ref())
                                .expect("checked"),
                            Some(workspace.root()),
                        ),
                    }),
                    "",
                ),
                Some(p) if !p.passed => cell(
                    &Cell::Preflight,
                    Some(&Gap::Failed {
                        detail: format!("see {}", p.log.display()),
                    }),
                    "",
                ),
                Some(p) => cell(
                    &Cell::Preflight,
                    None,
                    &format!(
                        "preflight of {} at {}",
                        p.openpilot.display(),
                        p.finished_at
                    ),
                ),
            };
            let reh = CellStatus {
                cell: Cell::Rehearsal.to_string(),
                state: "missing",
                detail: "no staged manifest to rehearse yet".into(),
            };
            (pre, Vec::new(), reh)
        }
    };
    let stores = match generation {
        Some(g) => stores
            .iter()
            .map(|(n, s)| store_status(n, *s, g, manifest_sha256.as_ref()))
            .collect(),
        // A store named without a generation to look for: said, not silently dropped.
        None => stores
            .iter()
            .map(|(n, _)| StoreStatus {
                store: n.clone(),
                generation: None,
                tinygrad_commit: None,
                manifest_sha256: None,
                models: None,
                signature_release: None,
                holds_staged: false,
                problem: Some(
                    "not read: no generation is known; pass --generation vNN, or --openpilot DIR \
                     whose tinygrad pin names one"
                        .into(),
                ),
            })
            .collect(),
    };
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
        next: NextStep {
            command: String::new(),
            why: String::new(),
        },
    };
    status.next = next_step(&status);
    Ok(status)
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

/// The next command, a pure function of the status: the first step of the runbook
/// (docs/release.md, "Bumping to the next generation") that is not done.
pub fn next_step(s: &Status) -> NextStep {
    let ws = s.workspace.display();
    let op = s.tree.as_ref().map_or("~/openpilot".to_string(), |t| {
        t.openpilot.display().to_string()
    });
    let g = s.generation.map_or("vNN".to_string(), |g| g.to_string());
    let step = |command: String, why: String| NextStep { command, why };
    let Some(tree) = &s.tree else {
        return step(
            format!("release-cli status --workspace {ws} --openpilot DIR"),
            "no openpilot tree is known (no --openpilot and no preflight record naming one); \
             DIR: the openpilot checkout the release is built from"
                .into(),
        );
    };
    let Some(pin) = &tree.tinygrad_commit else {
        return step(
            format!("release-cli tinygrad bump --openpilot {op} --tinygrad-src DIR --commit SHA"),
            format!(
                "the tree has no readable tinygrad marker: {}; DIR: the tinygrad checkout at the \
                 commit the tree should pin, SHA: that full commit",
                tree.problem.clone().unwrap_or_default()
            ),
        );
    };
    if tree.pin_generation.is_none() {
        return step(
            format!("release-cli tinygrad bump --openpilot {op} --tinygrad-src DIR --commit {pin}"),
            format!(
                "the tree's tinygrad {pin} is no generation's pin: record it; DIR: the tinygrad \
                 checkout at {pin}"
            ),
        );
    }
    if !tree.selector_problems.is_empty() {
        return step(
            format!("release-cli status --workspace {ws} --openpilot {op}"),
            format!(
                "the tree does not select the generation of its tinygrad: {}; make the edit, \
                 commit it, then run this again",
                tree.selector_problems.join("; ")
            ),
        );
    }
    let synced_ok = tree.compiler_marker.as_ref() == Some(pin)
        && tree.synced.as_ref().is_some_and(|x| x.tree_matches);
    if !synced_ok {
        let why = match (&tree.compiler_marker, &tree.synced) {
            (None, _) | (_, None) => "the tree was never synced to the compiler".to_string(),
            (Some(m), _) if m != pin => {
                format!("the compiler's marker is {m}, the tree's pin {pin}")
            }
            _ => "the files sync sends changed since the last sync".to_string(),
        };
        return step(format!("release-cli sync --openpilot {op}"), why);
    }
    let rebuild = |why: String| rebuild_step(&ws.to_string(), &g, &op, &why);
    if s.manifest.is_none() {
        // The generation's source map first (runbook step 4), then the rebuild from it.
        let Some(map) = &s.source_map else {
            return step(
                format!("release-cli source-map next --openpilot {op}"),
                format!(
                    "no source map scripts/model_source_map_{g}.json in the tree yet: it is \
                     written from the previous generation's (commit it, then rebuild)"
                ),
            );
        };
        return NextStep {
            command: format!(
                "release-cli rebuild --workspace {ws} --generation {g} --openpilot {op} \
                 --source-map {} --base-manifest BASE_MANIFEST",
                map.display()
            ),
            why: format!(
                "no staged manifest ready/model_names_{g}.json yet; BASE_MANIFEST: the manifest \
                 the models are rebuilt from (the live one)"
            ),
        };
    }
    if let Some(b) = s.builds.iter().find(|b| b.state != "built") {
        return rebuild(format!(
            "{} is {} ({})",
            b.id,
            b.state,
            b.error
                .clone()
                .unwrap_or_else(|| "another generation or pin".into())
        ));
    }
    if let Some(id) = s.unbuilt.first() {
        return rebuild(format!("{id} has no build of this generation and pin"));
    }
    // What a file's receipt says: `None` when it ties these bytes to the pin (or the contract
    // has no receipts), else why not.
    let unreceipted = |of: &str, sha: Option<&Sha256Digest>| -> Option<String> {
        if !s.receipts_required {
            return None;
        }
        match s.receipts.iter().find(|r| r.of == of) {
            None => Some(format!("{of} has no build receipt")),
            Some(r) if r.matches_pin != Some(true) => Some(format!(
                "{of}'s build receipt names tinygrad {}, not the pin {pin}",
                r.compiler_revision
                    .as_ref()
                    .map_or("(unreadable)".to_string(), |c| c.to_string())
            )),
            Some(r) if sha.is_some() && r.artifact_sha256.as_ref() != sha => {
                Some(format!("{of}'s build receipt is of other bytes"))
            }
            Some(_) => None,
        }
    };
    if let Some(why) = s
        .builds
        .iter()
        .find_map(|b| unreceipted(&format!("build {}", b.id), b.sha256.as_ref()))
    {
        return rebuild(why);
    }
    let dm_missing: Vec<&str> =
        s.dm.iter()
            .filter(|f| f.sha256.is_none())
            .map(|f| f.name.as_str())
            .collect();
    let dm_unbuilt =
        s.dm.iter()
            .find_map(|f| unreceipted(&format!("dm {}", f.name), f.sha256.as_ref()));
    if s.dm.is_empty() || !dm_missing.is_empty() || dm_unbuilt.is_some() {
        return step(
            format!(
                "release-cli dm --out {op}/{} --openpilot {op}",
                crate::tree::BUILTIN_DIR
            ),
            match dm_unbuilt {
                Some(why) if dm_missing.is_empty() && !s.dm.is_empty() => format!(
                    "the tree's DM files are not this pin's build: {why} (all four are rebuilt \
                     together)"
                ),
                _ => "the tree lacks DM files (all four are replaced together)".into(),
            },
        );
    }
    let builtin_unbuilt = s
        .builtin
        .as_ref()
        .and_then(|b| unreceipted("builtin", b.sha256.as_ref()));
    if s.builtin.is_none() || s.builtin_matches_build == Some(false) || builtin_unbuilt.is_some() {
        return step(
            format!(
                "release-cli builtin --artifact {ws}/ready/rdf43/rdf43_driving_tinygrad.pkl --openpilot {op}"
            ),
            "the tree's built-in RDF V4 is missing or not the workspace's rdf43 build of this pin \
             (build it with rebuild --model rdf43, or compile it and pass that artifact)"
                .into(),
        );
    }
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
    let manifest = s.manifest.as_ref().expect("checked").display();
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
    if s.stores.is_empty() || s.stores.iter().any(|x| !x.holds_staged) {
        let behind: Vec<&str> = s
            .stores
            .iter()
            .filter(|x| !x.holds_staged)
            .map(|x| x.store.as_str())
            .collect();
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
}
