//! A generation's contract: the table of everything that differs between StarPilot's v25
//! contract and upstream's v26 one (docs/formats.md, "Generation contracts").
//!
//! A generation is a tinygrad pin ([`crate::pins`]) **and** a contract. The pin says which
//! tinygrad compiled the artifacts; the contract says what the manifest, the artifact and the
//! device's files look like. Two contracts exist:
//!
//! - [`ContractName::V25`]: today's manifest schema (`tinygrad_single_v1`, a `chestnut`
//!   accelerator variant, our `generation`/`tinygrad_commit` extensions), the flat device layout
//!   (`/data/models/<id>_driving_tinygrad.pkl`, the selection in the `Model` params), no stamp in
//!   the artifact.
//! - [`ContractName::V26`]: upstream's `starpilot/models/` (top-level `generation`,
//!   `compiler_revision`, `artifact_abi`; `tinygrad_single_v1_arena`; an `amd` accelerator
//!   variant; runtime variants; a stamp inside the artifact; build receipts; a per-generation
//!   device root with `preferences.json`, a job file, locks and modeld's load receipt).
//!
//! Every contract detail lives in [`CONTRACTS`]; code asks a [`Contract`] instead of naming a
//! generation. Which contract a generation runs is recorded in the pin table
//! ([`crate::PinTable::contract_of`]): `v25` is [`ContractName::V25`]; a tree carrying upstream's
//! v26 catalog module declares its generation's contract ([`TreeDeclaration`]); any other
//! generation inherits the contract of the nearest generation before it, so a made-up v27 after
//! a v26-contract v26 is a v26-contract generation without any code change.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::types::{BehaviorVersion, Generation, GitCommit, ModelId};

/// The contracts this code speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ContractName {
    /// The v25 contract: `tinygrad_single_v1`, the `chestnut` variant, the flat device layout, no
    /// stamp.
    V25,
    /// Upstream's v26 contract: `tinygrad_single_v1_arena`, `artifact_abi`, a stamp in the
    /// artifact, build receipts, the per-generation device layout.
    V26,
}

impl ContractName {
    /// Every contract, oldest first.
    pub const ALL: [ContractName; 2] = [ContractName::V25, ContractName::V26];

    /// The contract's name as written in the pin table and in messages (`v25`, `v26`).
    pub fn as_str(self) -> &'static str {
        self.contract().name_str
    }

    /// This contract's table row.
    pub fn contract(self) -> &'static Contract {
        CONTRACTS
            .iter()
            .find(|c| c.name == self)
            .expect("every ContractName has a row in CONTRACTS")
    }
}

impl fmt::Display for ContractName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ContractName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        CONTRACTS
            .iter()
            .find(|c| c.name_str == s)
            .map(|c| c.name)
            .ok_or_else(|| {
                let names = CONTRACTS.map(|c| c.name_str).join(", ");
                Error::invalid("contract", s, format!("must be one of {names}"))
            })
    }
}

impl serde::Serialize for ContractName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Where a device keeps a generation's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceLayout {
    /// `<models>/<id>_driving_tinygrad.pkl`, `.catalog.json`, the selection in the `Model`
    /// params (v25 and before).
    Flat,
    /// `<models>/<gen>/<id>/<id>_driving[_amd]_tinygrad.pkl`, `<gen>/catalog.json`,
    /// `<gen>/preferences.json`, `<gen>/.download-job.json`, `<gen>/.state.lock`,
    /// `<gen>/.download.lock` (upstream's v26 manager).
    PerGeneration,
}

// ---- (h8) where a layout puts a model's artifact ------------------------------------------

impl DeviceLayout {
    /// A model's artifact file `file` relative to the device's models directory: `<file>`
    /// (flat) or `<gen>/<id>/<file>` (per generation).
    pub fn artifact_rel_path(self, generation: Generation, id: &ModelId, file: &str) -> String {
        match self {
            Self::Flat => file.to_string(),
            Self::PerGeneration => format!("{generation}/{id}/{file}"),
        }
    }
}

/// The accelerator variant a contract's manifest may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceleratorRule {
    /// The key inside `accelerator_artifacts` (`chestnut`, `amd`).
    pub key: &'static str,
    /// The variant's `execution_device` (`"AMD"` for both).
    pub execution_device: &'static str,
    /// The variant's file: `<id>_driving_<infix>_tinygrad.pkl`.
    pub file_infix: &'static str,
    /// Only on a non-GPU model with `model_lab_eligible: true` (v26).
    pub requires_lab_eligible: bool,
    /// The variant carries `compiler_revision` equal to the manifest's (v26).
    pub carries_compiler_revision: bool,
}

/// The stamp the artifact carries in its top-level pickle dict (v26 runner's
/// `validate_artifact`): these keys must hold these values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StampRule {
    /// The dict key holding the ABI; its value must be [`Contract::artifact_abi`].
    pub abi_key: &'static str,
    /// The dict key holding the compiler (tinygrad) revision; its value must be the pin.
    pub compiler_revision_key: &'static str,
    /// The dict key holding the format version, and the value it must have.
    pub format_version_key: &'static str,
    /// The value the format-version key must hold.
    pub format_version: i64,
    /// The dict key holding the behaviour version; its value must be the entry's `version`.
    pub behavior_version_key: &'static str,
}

/// The device validator's latency bound and report, as upstream's v26 rebuild runs its
/// validator (`scripts/validate_driving_model.py … --max-p95-ms 50`): the bound is a flag of
/// the validator, which fails a camera whose p95 is over it, and its report holds one result
/// per camera resolution with its inference timings in milliseconds
/// (`cameras[i].inference_ms.p95`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyReport {
    /// The validator's flag taking the bound in milliseconds.
    pub bound_flag: &'static str,
    /// The report's list of per-camera results.
    pub cameras_key: &'static str,
    /// A camera result's timings object.
    pub timing_key: &'static str,
    /// The p95 inside the timings.
    pub p95_key: &'static str,
}

impl LatencyReport {
    /// The p95 a validator's report states, pure: the highest p95 over its cameras, or `None`
    /// when it states none for some camera (a camera the validator failed before timing it,
    /// no camera at all, a value that is not a finite non-negative number). A bound holds only
    /// where every camera was timed.
    pub fn p95_of(&self, report: &Value) -> Option<f64> {
        let cameras = report.get(self.cameras_key)?.as_array()?;
        let mut worst: Option<f64> = None;
        for c in cameras {
            let p = c
                .get(self.timing_key)?
                .get(self.p95_key)?
                .as_f64()
                .filter(|v| v.is_finite() && *v >= 0.0)?;
            worst = Some(worst.map_or(p, |w| w.max(p)));
        }
        worst
    }
}

/// What a tree that declares this contract carries (upstream's v26 catalog module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeMarkers {
    /// The catalog module, relative to the openpilot tree.
    pub catalog_module: &'static str,
    /// The reviewed catalog beside it, with `{gen}` for the generation (`catalog-v26.json`).
    pub catalog_json: &'static str,
    /// The file recording the tree's dependencies, tinygrad among them.
    pub sync_file: &'static str,
    /// The dependency path whose `commit` is the tinygrad (compiler) revision.
    pub tinygrad_dependency: &'static str,
}

/// modeld's load receipt (v26): what actually runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadReceiptRule {
    /// `/dev/shm/<dir_prefix><OPENPILOT_PREFIX or default_prefix>/<file>`.
    pub dir_prefix: &'static str,
    /// The `OPENPILOT_PREFIX` used when the environment sets none.
    pub default_prefix: &'static str,
    /// The receipt's file name inside its directory.
    pub file: &'static str,
    /// The largest receipt a reader accepts, in bytes.
    pub max_bytes: u64,
    /// The receipt `version` this rule describes.
    pub version: i64,
    /// Seconds between modeld's republications of the receipt.
    pub republish_secs: u64,
    // -- what a receipt of `version` holds (the load-receipt reader, `migration::load_receipt`)
    /// The root the receipt directory is under (`Paths.shm_path()`).
    pub shm_root: &'static str,
    /// The longest `OPENPILOT_PREFIX` (`[A-Za-z0-9_-]{1,N}`); another makes the receipt
    /// unavailable.
    pub prefix_max_len: usize,
    /// Exactly these keys, each once.
    pub keys: &'static [&'static str],
    /// `variant`'s values.
    pub variants: &'static [&'static str],
    /// `fallbackReason`'s values besides `null`.
    pub fallback_reasons: &'static [&'static str],
    /// The reason saying the selected model failed to load (the bundled one runs instead).
    pub selected_load_failed: &'static str,
    /// The variant an external-GPU model runs as (and only such a model).
    pub gpu_variant: &'static str,
}

/// One contract's row. Every field is a detail that differs between contracts; nothing here is
/// written as a constant anywhere else.
#[derive(Debug, PartialEq, Eq)]
pub struct Contract {
    /// Which contract this row is.
    pub name: ContractName,
    /// Its name as written (`v25`, `v26`); [`ContractName::as_str`] returns it.
    pub name_str: &'static str,
    /// The `artifact_format` every downloadable artifact carries.
    pub artifact_format: &'static str,
    /// The ABI named at the manifest's top level and in the artifact's stamp (v26).
    pub artifact_abi: Option<&'static str>,
    /// Top-level keys besides `models` that a manifest of this contract must carry.
    pub required_top_keys: &'static [&'static str],
    /// The top-level key holding the tinygrad (compiler) revision.
    pub revision_key: &'static str,
    /// The accelerator variant its manifest may carry (at most one kind).
    pub accelerator: AcceleratorRule,
    /// `runtime_artifacts` variants are understood up to this runner revision (v26: 2).
    pub runner_revision: Option<u32>,
    /// The smallest `min_runner_revision` a runtime variant may name.
    pub min_runtime_revision: u32,
    /// Any violation refuses the whole manifest (v26), rather than dropping one entry (v25).
    pub whole_manifest_refusal: bool,
    /// Entries must be rows of the tree's bundled catalog, with its version and GPU flag.
    pub entries_from_tree_catalog: bool,
    /// An artifact that fits one chunk may be published as one plain file (count 0).
    pub plain_file_when_one_chunk: bool,
    /// The device takes a chunked artifact's piece count from the manifest's
    /// `artifact_chunk_count` alone and never asks the origin for `.chunkmanifest` (v26: its
    /// origin is read as upstream's devices read it, which never fetch it).
    pub chunk_count_from_manifest: bool,
    /// Where a device keeps this contract's files.
    pub device_layout: DeviceLayout,
    /// The selection's "the bundled model" value in the device's selection store.
    pub bundled_selection: &'static str,
    /// Free space a download needs beyond the artifact's size.
    pub download_headroom_bytes: u64,
    /// `preferences.json`'s size cap (v26).
    pub preferences_max_bytes: u64,
    /// The stamp the artifact's top-level pickle dict must carry; `None` when the contract has none
    /// (v25).
    pub stamp: Option<StampRule>,
    /// `compile`, `dm` and `builtin` write `<file stem>.build.json` and publish requires it.
    pub build_receipts: bool,
    /// modeld's load receipt; `None` when the contract has none (v25).
    pub load_receipt: Option<LoadReceiptRule>,
    /// The device validation's p95 latency bound, in milliseconds.
    pub validation_p95_ms: Option<u32>,
    /// How the device validator is given that bound and where its report holds the p95
    /// (present exactly when there is a bound).
    pub validation_latency: Option<LatencyReport>,
    /// What a tree declaring this contract carries; `None` for a contract no tree declares (v25).
    pub tree: Option<TreeMarkers>,
    /// The per-generation root's files and formats ([`DeviceLayout::PerGeneration`]).
    pub generation_files: Option<GenerationFiles>,
}

/// The files of a per-generation device root (`<models>/<gen>/`) and their formats, as
/// upstream's v26 manager keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenerationFiles {
    /// The accepted manifest, as upstream writes it (sorted keys).
    pub catalog: &'static str,
    /// The selection (small/big profiles, favourites, sort mode, randomizer, exclusions).
    pub preferences: &'static str,
    /// The one download job.
    pub job: &'static str,
    /// `flock`ed around every state read-modify-write.
    pub state_lock: &'static str,
    /// `flock`ed by the one running download job.
    pub download_lock: &'static str,
    /// The job file's `schemaVersion`.
    pub job_schema_version: i64,
    /// The job id's length in lowercase hex digits.
    pub job_id_hex_digits: usize,
    /// The job's `progress` is cut to this many characters.
    pub job_progress_max_chars: usize,
    /// The job's `variant` for the standard artifact (the accelerator's is its key).
    pub standard_variant: &'static str,
    /// `preferences.json`'s `sortMode` values; the first is the default.
    pub sort_modes: &'static [&'static str],
}

const MIB: u64 = 1024 * 1024;

/// The table. Add a row for a new contract; never a constant elsewhere.
pub const CONTRACTS: [Contract; 2] = [
    Contract {
        name: ContractName::V25,
        name_str: "v25",
        artifact_format: "tinygrad_single_v1",
        artifact_abi: None,
        required_top_keys: &[],
        revision_key: crate::keys::TINYGRAD_COMMIT,
        accelerator: AcceleratorRule {
            key: "chestnut",
            execution_device: "AMD",
            file_infix: "chestnut",
            requires_lab_eligible: false,
            carries_compiler_revision: false,
        },
        runner_revision: None,
        min_runtime_revision: 0,
        whole_manifest_refusal: false,
        entries_from_tree_catalog: false,
        plain_file_when_one_chunk: false,
        chunk_count_from_manifest: false,
        device_layout: DeviceLayout::Flat,
        bundled_selection: "rdf43",
        download_headroom_bytes: 0,
        preferences_max_bytes: 0,
        stamp: None,
        build_receipts: false,
        load_receipt: None,
        validation_p95_ms: None,
        validation_latency: None,
        tree: None,
        generation_files: None,
    },
    Contract {
        name: ContractName::V26,
        name_str: "v26",
        artifact_format: "tinygrad_single_v1_arena",
        artifact_abi: Some("tinygrad_single_v1_arena"),
        required_top_keys: &["generation", "compiler_revision", "artifact_abi"],
        revision_key: "compiler_revision",
        accelerator: AcceleratorRule {
            key: "amd",
            execution_device: "AMD",
            file_infix: "amd",
            requires_lab_eligible: true,
            carries_compiler_revision: true,
        },
        runner_revision: Some(2),
        min_runtime_revision: 2,
        whole_manifest_refusal: true,
        entries_from_tree_catalog: true,
        plain_file_when_one_chunk: true,
        chunk_count_from_manifest: true,
        device_layout: DeviceLayout::PerGeneration,
        bundled_selection: "bundled-current",
        download_headroom_bytes: 256 * MIB,
        preferences_max_bytes: 16 * 1024,
        stamp: Some(StampRule {
            abi_key: "artifact_abi",
            compiler_revision_key: "compiler_revision",
            format_version_key: "format_version",
            format_version: 1,
            behavior_version_key: "behavior_version",
        }),
        build_receipts: true,
        load_receipt: Some(LoadReceiptRule {
            dir_prefix: "starpilot_modeld_",
            default_prefix: "d",
            file: "load-v1.json",
            max_bytes: 1024,
            version: 1,
            republish_secs: 5,
            shm_root: "/dev/shm",
            prefix_max_len: 32,
            keys: &[
                "version",
                "pid",
                "processStartTicks",
                "loadedMonoNs",
                "modelId",
                "variant",
                "artifactSha256",
                "fallbackReason",
            ],
            variants: &["small", "chestnut"],
            fallback_reasons: &[
                "chestnut-load-failed",
                "chestnut-run-stalled",
                "selected-load-failed",
            ],
            selected_load_failed: "selected-load-failed",
            gpu_variant: "chestnut",
        }),
        validation_p95_ms: Some(50),
        validation_latency: Some(LatencyReport {
            bound_flag: "--max-p95-ms",
            cameras_key: "cameras",
            timing_key: "inference_ms",
            p95_key: "p95",
        }),
        tree: Some(TreeMarkers {
            catalog_module: "starpilot/models/catalog.py",
            catalog_json: "starpilot/models/catalog-{gen}.json",
            sync_file: "upstream-sync.json",
            tinygrad_dependency: "tinygrad_repo",
        }),
        generation_files: Some(GenerationFiles {
            catalog: "catalog.json",
            preferences: "preferences.json",
            job: ".download-job.json",
            state_lock: ".state.lock",
            download_lock: ".download.lock",
            job_schema_version: 1,
            job_id_hex_digits: 32,
            job_progress_max_chars: 1000,
            standard_variant: "standard",
            sort_modes: &[
                "name",
                "date",
                "date_oldest",
                "community",
                "series",
                "favorites",
                "released",
            ],
        }),
    },
];

/// The contract generations inherit when nothing earlier is recorded.
pub const BASE_CONTRACT: ContractName = ContractName::V25;

impl Contract {
    /// Free space a download needs beyond the artifact on a device of this contract when
    /// `configured` is asked for: the contract's [`Contract::download_headroom_bytes`] is a floor,
    /// a larger configured margin stands.
    pub fn download_margin(&self, configured: u64) -> u64 {
        configured.max(self.download_headroom_bytes)
    }

    /// `<id>_driving_<infix>_tinygrad.pkl`, the accelerator variant's file.
    pub fn accelerator_file_name(&self, id: &ModelId) -> String {
        format!("{id}_driving_{}_tinygrad.pkl", self.accelerator.file_infix)
    }

    /// The reviewed catalog's path in the tree for `generation` (v26:
    /// `starpilot/models/catalog-v26.json`).
    pub fn tree_catalog_path(&self, generation: Generation) -> Option<String> {
        self.tree
            .map(|t| t.catalog_json.replace("{gen}", &generation.to_string()))
    }

    /// The load receipt's path for an `OPENPILOT_PREFIX` (`None`: unset).
    pub fn load_receipt_path(&self, prefix: Option<&str>) -> Option<std::path::PathBuf> {
        let root = self.load_receipt?.shm_root;
        self.load_receipt_path_in(std::path::Path::new(root), prefix)
    }

    /// [`Contract::load_receipt_path`] under `shm_root` instead of the rule's (tests, a device
    /// whose shared memory is mounted elsewhere).
    pub fn load_receipt_path_in(
        &self,
        shm_root: &std::path::Path,
        prefix: Option<&str>,
    ) -> Option<std::path::PathBuf> {
        self.load_receipt.map(|r| {
            shm_root
                .join(format!(
                    "{}{}",
                    r.dir_prefix,
                    prefix.filter(|p| !p.is_empty()).unwrap_or(r.default_prefix)
                ))
                .join(r.file)
        })
    }
}

/// One row of a tree's reviewed catalog (`catalog-v26.json`'s `models`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeCatalogRow {
    /// The model ID.
    pub id: ModelId,
    /// The display name.
    pub name: String,
    /// The behaviour version.
    pub version: BehaviorVersion,
    /// Whether the model runs on the external GPU.
    pub uses_external_gpu: bool,
    /// The row's `model_lab_eligible` (v26: an `amd` variant needs it true).
    pub model_lab_eligible: bool,
}

/// What a tree declares about its generation (upstream's v26 catalog module): read from the
/// catalog JSON beside the module and the tree's `upstream-sync.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeDeclaration {
    /// The generation the tree is for.
    pub generation: Generation,
    /// The contract the tree declares for it.
    pub contract: ContractName,
    /// `upstream-sync.json`'s `dependencies[path == "tinygrad_repo"].commit`.
    pub compiler_revision: GitCommit,
    /// The reviewed catalog's rows, in file order.
    pub catalog: Vec<TreeCatalogRow>,
}

impl TreeDeclaration {
    /// The catalog row of model `id`, if the tree's catalog has one.
    pub fn row(&self, id: &str) -> Option<&TreeCatalogRow> {
        self.catalog.iter().find(|r| r.id.as_str() == id)
    }
}

/// The generation a reviewed-catalog file name declares: `catalog-v26.json` → v26.
pub fn parse_tree_catalog_name(contract: &Contract, file_name: &str) -> Option<Generation> {
    let pattern = contract.tree?.catalog_json.rsplit('/').next()?;
    let (before, after) = pattern.split_once("{gen}")?;
    file_name
        .strip_prefix(before)?
        .strip_suffix(after)?
        .parse()
        .ok()
}

/// The tinygrad commit an `upstream-sync.json` records for `dependency`.
pub fn parse_sync_file(bytes: &[u8], dependency: &str) -> std::result::Result<GitCommit, String> {
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let deps = doc
        .get("dependencies")
        .and_then(Value::as_array)
        .ok_or("no `dependencies` list")?;
    let mut found = deps
        .iter()
        .filter(|d| d.get("path").and_then(Value::as_str) == Some(dependency));
    let dep = found
        .next()
        .ok_or_else(|| format!("no dependency with path {dependency:?}"))?;
    if found.next().is_some() {
        return Err(format!("more than one dependency with path {dependency:?}"));
    }
    let commit = dep
        .get("commit")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("dependency {dependency:?} has no `commit` string"))?;
    commit
        .parse()
        .map_err(|e| format!("dependency {dependency:?}: {e}"))
}

/// The rows of a reviewed catalog (`{"models": [{id, name, version, uses_external_gpu?,
/// model_lab_eligible?}, …]}`). Every row must parse; ids are unique.
pub fn parse_tree_catalog(bytes: &[u8]) -> std::result::Result<Vec<TreeCatalogRow>, String> {
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let models = doc
        .get("models")
        .and_then(Value::as_array)
        .ok_or("no `models` list")?;
    let mut rows: Vec<TreeCatalogRow> = Vec::with_capacity(models.len());
    for (i, m) in models.iter().enumerate() {
        let field = |k: &str| {
            m.get(k)
                .and_then(Value::as_str)
                .ok_or_else(|| format!("models[{i}]: no `{k}` string"))
        };
        let id: ModelId = field("id")?
            .parse()
            .map_err(|e| format!("models[{i}].id: {e}"))?;
        if rows.iter().any(|r| r.id == id) {
            return Err(format!("models[{i}]: id {id} is listed twice"));
        }
        let version = field("version")?
            .parse()
            .map_err(|e| format!("models[{i}].version: {e}"))?;
        let flag = |k: &str| match m.get(k) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(format!("models[{i}].{k}: not a boolean")),
        };
        rows.push(TreeCatalogRow {
            name: field("name")?.to_string(),
            version,
            uses_external_gpu: flag("uses_external_gpu")?,
            model_lab_eligible: flag("model_lab_eligible")?,
            id,
        });
    }
    Ok(rows)
}

/// What a tree holds of a contract's markers, as read by the caller's bounded reader.
#[derive(Debug, Clone, Default)]
pub struct TreeFiles {
    /// The catalog module exists (a regular file).
    pub catalog_module: bool,
    /// The reviewed catalogs beside it: (file name, bytes). Exactly one must be there.
    pub catalogs: Vec<(String, Vec<u8>)>,
    /// The sync file's bytes, when present.
    pub sync_file: Option<Vec<u8>>,
}

/// The tree's declaration from its files, for the contract whose markers they are: `Ok(None)`
/// when the tree does not carry that contract's catalog module (a v25 tree), `Err` with a
/// message when it carries it but the declaration cannot be read (no or several reviewed
/// catalogs, an unreadable sync file or catalog): a device pauses on that, release refuses.
pub fn declaration(
    contract: ContractName,
    files: &TreeFiles,
) -> std::result::Result<Option<TreeDeclaration>, String> {
    let c = contract.contract();
    let Some(markers) = c.tree else {
        return Ok(None);
    };
    if !files.catalog_module {
        return Ok(None);
    }
    let dir = markers
        .catalog_json
        .rsplit_once('/')
        .map(|(d, _)| d)
        .unwrap_or("");
    let mut found: Vec<(Generation, &[u8], &str)> = files
        .catalogs
        .iter()
        .filter_map(|(name, bytes)| {
            parse_tree_catalog_name(c, name).map(|g| (g, bytes.as_slice(), name.as_str()))
        })
        .collect();
    let (generation, bytes, name) = match found.len() {
        1 => found.remove(0),
        0 => {
            return Err(format!(
                "{} is there but no reviewed catalog ({}) beside it",
                markers.catalog_module, markers.catalog_json
            ));
        }
        _ => {
            return Err(format!(
                "{dir}/ holds several reviewed catalogs ({}); exactly one names the tree's generation",
                found.iter().map(|f| f.2).collect::<Vec<_>>().join(", ")
            ));
        }
    };
    let sync = files.sync_file.as_deref().ok_or_else(|| {
        format!(
            "{} declares {generation} but {} is missing: it records the tinygrad the tree runs",
            markers.catalog_module, markers.sync_file
        )
    })?;
    let compiler_revision = parse_sync_file(sync, markers.tinygrad_dependency)
        .map_err(|e| format!("{}: {e}", markers.sync_file))?;
    let catalog = parse_tree_catalog(bytes).map_err(|e| format!("{dir}/{name}: {e}"))?;
    Ok(Some(TreeDeclaration {
        generation,
        contract,
        compiler_revision,
        catalog,
    }))
}

/// The contracts whose trees declare themselves, in the order a reader tries them.
pub fn declaring_contracts() -> impl Iterator<Item = &'static Contract> {
    CONTRACTS.iter().filter(|c| c.tree.is_some())
}

// ---- Which contract judges a manifest (manifest validation, release side) ---------------

/// The contract a manifest's own top level names: the one whose ABI its `artifact_abi` is.
pub fn named_by_manifest(top: &serde_json::Map<String, Value>) -> Option<ContractName> {
    let abi = top.get(crate::keys::ARTIFACT_ABI)?.as_str()?;
    CONTRACTS
        .iter()
        .find(|c| c.artifact_abi == Some(abi))
        .map(|c| c.name)
}

/// The generation a manifest names and the contract that judges it: the contract the pin table
/// records for that generation; else the one the manifest names by its ABI (a v26 manifest
/// judged without its tree); else the table's inherited one ([`crate::PinTable::contract_of`]).
/// Bytes that are not a JSON object name nothing and get the contract of no generation
/// ([`BASE_CONTRACT`]), whose rules then report what is wrong.
pub fn for_manifest(pins: &crate::PinTable, bytes: &[u8]) -> (Option<Generation>, ContractName) {
    let top = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(top)) => top,
        _ => return (None, BASE_CONTRACT),
    };
    let generation = top
        .get(crate::keys::GENERATION)
        .and_then(Value::as_str)
        .and_then(|g| g.parse::<Generation>().ok());
    let recorded = generation.and_then(|g| pins.recorded_contract(g));
    let contract = recorded
        .or_else(|| named_by_manifest(&top))
        .unwrap_or_else(|| generation.map_or(BASE_CONTRACT, |g| pins.contract_of(g)));
    (generation, contract)
}

#[cfg(test)]
mod judging_tests {
    use super::*;

    #[test]
    fn which_contract_judges_a_manifest() {
        let v26_doc =
            br#"{"generation": "v26", "artifact_abi": "tinygrad_single_v1_arena", "models": []}"#;
        let v27_doc = br#"{"generation": "v27", "models": []}"#;
        let v25_doc =
            br#"{"generation": "v25", "artifact_abi": "tinygrad_single_v1_arena", "models": []}"#;
        let builtin = crate::PinTable::builtin();
        let mut declared = crate::PinTable::builtin();
        declared
            .record_contract(Generation::new(26), ContractName::V26)
            .unwrap();
        for (pins, doc, want) in [
            // Without a tree: the manifest's ABI names v26.
            (&builtin, &v26_doc[..], ContractName::V26),
            // Nothing recorded, nothing named: inherited (v25 from the built-in table).
            (&builtin, &v27_doc[..], ContractName::V25),
            // A made-up v27 after a v26-contract v26 inherits v26's contract.
            (&declared, &v27_doc[..], ContractName::V26),
            // A recorded contract wins over what the manifest names.
            (&builtin, &v25_doc[..], ContractName::V25),
            (&builtin, &b"[]"[..], BASE_CONTRACT),
        ] {
            assert_eq!(
                for_manifest(pins, doc).1,
                want,
                "{}",
                String::from_utf8_lossy(doc)
            );
        }
        assert_eq!(for_manifest(&builtin, v27_doc).0, Some(Generation::new(27)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_one_row_and_parses_back() {
        for name in ContractName::ALL {
            assert_eq!(name.contract().name, name);
            assert_eq!(name.as_str().parse::<ContractName>().unwrap(), name);
        }
        assert_eq!(CONTRACTS.len(), ContractName::ALL.len());
        assert!("v27".parse::<ContractName>().is_err());
    }

    /// A per-generation layout has its files in the row; a flat one has none.
    #[test]
    fn per_generation_layouts_name_their_files() {
        for c in &CONTRACTS {
            assert_eq!(
                c.generation_files.is_some(),
                c.device_layout == DeviceLayout::PerGeneration,
                "{}",
                c.name
            );
            if let Some(f) = c.generation_files {
                assert!(
                    !f.sort_modes.is_empty() && f.job_id_hex_digits > 0,
                    "{}",
                    c.name
                );
                assert_ne!(f.standard_variant, c.accelerator.key);
            }
        }
    }

    /// A contract bounds latency exactly when it says how to pass the bound and read the p95.
    /// The p95 is read where upstream's validator writes it (the highest over the cameras); a
    /// top-level `p95_ms` (which no validator writes), a camera without timings (failed before
    /// it was timed, e.g. over the bound), none at all or a value that is no latency state
    /// nothing.
    #[test]
    fn where_a_validation_report_states_its_p95() {
        for c in &CONTRACTS {
            assert_eq!(
                c.validation_p95_ms.is_some(),
                c.validation_latency.is_some(),
                "{}",
                c.name
            );
        }
        let r = ContractName::V26.contract().validation_latency.unwrap();
        assert_eq!(r.bound_flag, "--max-p95-ms");
        let cam = |p: Value| serde_json::json!({"passed": true, "camera": [1928, 1208], "inference_ms": {"min": 1.0, "median": 2.0, "p95": p, "max": 40.0}});
        for (report, want) in [
            (
                serde_json::json!({"passed": true, "cameras": [cam(12.5.into()), cam(31.25.into())]}),
                Some(31.25),
            ),
            (serde_json::json!({"cameras": [cam(0.into())]}), Some(0.0)),
            (serde_json::json!({"passed": true, "p95_ms": 12.5}), None),
            (serde_json::json!({"cameras": []}), None),
            (
                serde_json::json!({"cameras": [cam(12.5.into()), {"passed": false, "camera": [1344, 760],
                    "error": "ValueError: p95 latency 75.00 ms exceeds 50.00 ms"}]}),
                None,
            ),
            (serde_json::json!({"cameras": [cam((-1).into())]}), None),
            (serde_json::json!({"cameras": [cam("12".into())]}), None),
            (serde_json::json!({"cameras": {"a": cam(1.into())}}), None),
        ] {
            assert_eq!(r.p95_of(&report), want, "{report}");
        }
    }

    #[test]
    fn paths_from_the_table() {
        let v26 = ContractName::V26.contract();
        let id: ModelId = "sc2".parse().unwrap();
        assert_eq!(
            v26.accelerator_file_name(&id),
            "sc2_driving_amd_tinygrad.pkl"
        );
        assert_eq!(
            ContractName::V25.contract().accelerator_file_name(&id),
            "sc2_driving_chestnut_tinygrad.pkl"
        );
        assert_eq!(
            v26.tree_catalog_path(Generation::new(27)).unwrap(),
            "starpilot/models/catalog-v27.json"
        );
        assert_eq!(
            v26.load_receipt_path(None).unwrap(),
            std::path::Path::new("/dev/shm/starpilot_modeld_d/load-v1.json")
        );
        assert_eq!(
            v26.load_receipt_path(Some("t3")).unwrap(),
            std::path::Path::new("/dev/shm/starpilot_modeld_t3/load-v1.json")
        );
        assert_eq!(ContractName::V25.contract().load_receipt_path(None), None);
        assert_eq!(
            v26.load_receipt_path_in(std::path::Path::new("/tmp/x"), Some("t3"))
                .unwrap(),
            std::path::Path::new("/tmp/x/starpilot_modeld_t3/load-v1.json")
        );
        // The receipt's shape: eight keys, the selected-load-failed reason among the reasons.
        let r = v26.load_receipt.unwrap();
        assert_eq!(r.keys.len(), 8);
        assert!(r.fallback_reasons.contains(&r.selected_load_failed));
        assert!(r.variants.contains(&r.gpu_variant));
        assert_eq!((r.max_bytes, r.version, r.republish_secs), (1024, 1, 5));
        for (name, want) in [
            ("catalog-v26.json", Some(26)),
            ("catalog-v27.json", Some(27)),
            ("catalog-v026.json", None),
            ("catalog.json", None),
            ("catalog-v26.json.bak", None),
        ] {
            assert_eq!(
                parse_tree_catalog_name(v26, name).map(Generation::number),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn sync_file_cases() {
        let sha = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";
        let ok = format!(
            r#"{{"dependencies": [{{"path": "panda", "commit": "{}"}}, {{"path": "tinygrad_repo", "commit": "{sha}"}}]}}"#,
            "a".repeat(40)
        );
        assert_eq!(
            parse_sync_file(ok.as_bytes(), "tinygrad_repo")
                .unwrap()
                .as_str(),
            sha
        );
        for (bad, why) in [
            (&b"{"[..], "not JSON"),
            (br#"{"deps": []}"#, "no `dependencies`"),
            (br#"{"dependencies": [{"path": "panda"}]}"#, "no dependency"),
            (
                br#"{"dependencies": [{"path": "tinygrad_repo", "commit": 5}]}"#,
                "no `commit`",
            ),
            (
                br#"{"dependencies": [{"path": "tinygrad_repo", "commit": "abc"}]}"#,
                "tinygrad_repo",
            ),
        ] {
            let e = parse_sync_file(bad, "tinygrad_repo").unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        let twice = format!(
            r#"{{"dependencies": [{{"path": "tinygrad_repo", "commit": "{sha}"}}, {{"path": "tinygrad_repo", "commit": "{sha}"}}]}}"#
        );
        assert!(
            parse_sync_file(twice.as_bytes(), "tinygrad_repo")
                .unwrap_err()
                .contains("more than one")
        );
    }

    #[test]
    fn tree_catalog_cases() {
        let rows = parse_tree_catalog(
            br#"{"models": [{"id": "sc2", "name": "SC", "version": "v9"},
                {"id": "gwm8223", "name": "G", "version": "v12", "uses_external_gpu": true,
                 "model_lab_eligible": false}]}"#,
        )
        .unwrap();
        assert_eq!(rows.len(), 2);
        assert!(!rows[0].uses_external_gpu && rows[1].uses_external_gpu);
        assert_eq!(rows[1].version, BehaviorVersion::new(12));
        for (bad, why) in [
            (&br#"{"models": {}}"#[..], "no `models`"),
            (br#"{"models": [{"id": "x", "name": "X"}]}"#, "version"),
            (
                br#"{"models": [{"id": "x", "name": "X", "version": "v1"}, {"id": "x", "name": "Y", "version": "v1"}]}"#,
                "twice",
            ),
            (
                br#"{"models": [{"id": "x", "name": "X", "version": "v1", "uses_external_gpu": "yes"}]}"#,
                "boolean",
            ),
        ] {
            let e = parse_tree_catalog(bad).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn declaration_cases() {
        let sha = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";
        let sync =
            format!(r#"{{"dependencies": [{{"path": "tinygrad_repo", "commit": "{sha}"}}]}}"#)
                .into_bytes();
        let cat = br#"{"models": [{"id": "sc2", "name": "SC", "version": "v9"}]}"#.to_vec();
        let files = |module: bool, cats: &[&str], sync: Option<&Vec<u8>>| TreeFiles {
            catalog_module: module,
            catalogs: cats.iter().map(|n| (n.to_string(), cat.clone())).collect(),
            sync_file: sync.cloned(),
        };
        // A v25 tree: no module.
        assert_eq!(
            declaration(
                ContractName::V26,
                &files(false, &["catalog-v26.json"], Some(&sync))
            ),
            Ok(None)
        );
        assert_eq!(
            declaration(ContractName::V25, &files(true, &[], None)),
            Ok(None)
        );
        for (number, name) in [(26, "catalog-v26.json"), (27, "catalog-v27.json")] {
            let d = declaration(
                ContractName::V26,
                &files(true, &[name, "other.json"], Some(&sync)),
            )
            .unwrap()
            .unwrap();
            assert_eq!(d.generation, Generation::new(number));
            assert_eq!(d.compiler_revision.as_str(), sha);
            assert_eq!(d.catalog.len(), 1);
            assert!(d.row("sc2").is_some());
        }
        for (f, why) in [
            (files(true, &[], Some(&sync)), "no reviewed catalog"),
            (
                files(true, &["catalog-v26.json", "catalog-v27.json"], Some(&sync)),
                "several",
            ),
            (
                files(true, &["catalog-v26.json"], None),
                "upstream-sync.json is missing",
            ),
            (
                files(true, &["catalog-v26.json"], Some(&b"{}".to_vec())),
                "upstream-sync.json: no `dependencies`",
            ),
        ] {
            let e = declaration(ContractName::V26, &f).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }
}
