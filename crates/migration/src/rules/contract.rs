//! The device contract, as pure decisions over typed values: what StarPilot's modeld and model
//! UIs read (the selection params, the Small/Big profile params, the comma-joined catalog
//! params and the three JSON caches in `/data/models`) and what this manager writes there.
//!
//! Every rule here is upstream's (StarPilot's Python model manager and modeld, as described in
//! `docs/device.md`, *Params and files*), with two deliberate differences, both documented there:
//! the replacement for a selection that left the catalog is always the built-in (upstream takes
//! the first catalog entry when the catalog does not list `rdf43`), and a model is "available"
//! only once its artifact verified against the catalog (upstream checks the size only).
//!
//! No I/O: the shell in `manager.rs` reads params and files, calls these functions and writes
//! what they return.

use std::collections::BTreeSet;

use manifest::{Manifest, ModelEntry, ModelId, NamedModel, layout};
use serde_json::{Map, Value};

use crate::state::params::keys;

/// Built-in, catalog or local: decides how a model is obtained and where modeld loads it from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// `rdf43` (alias `rdf`): shipped in the openpilot checkout, never downloaded.
    BuiltIn,
    /// Published in the generation's catalog; downloaded and verified into `/data/models`.
    Catalog,
    /// `local-*`: compiled on this device; never downloaded, purged or migrated.
    Local,
}

pub fn kind(id: &ModelId) -> ModelKind {
    if is_builtin_id(id.as_str()) {
        ModelKind::BuiltIn
    } else if id.is_local() {
        ModelKind::Local
    } else {
        ModelKind::Catalog
    }
}

/// The built-in model's id.
pub use layout::builtin_model_id as builtin_id;

// ---------------------------------------------------------------------------------------------
// Ids and aliases (upstream `canonical`, `aliases`, v23 namespace)

use crate::rules::shape::CANONICAL;
pub use crate::rules::shape::canonical_id;

/// The aliases of a key, in upstream's order: its canonical form, every key mapping to it, the
/// key without `_default`, and the key with `2` appended unless it already ends in `2`.
pub fn aliases(id: &str) -> Vec<String> {
    let canonical = canonical_id(id);
    let mut out: Vec<String> = vec![canonical.to_string()];
    for (from, to) in CANONICAL {
        if to == canonical {
            out.push(from.to_string());
        }
    }
    if id.contains("_default") {
        out.push(id.replace("_default", ""));
    }
    if !id.ends_with('2') {
        out.push(format!("{id}2"));
    }
    let mut seen = BTreeSet::new();
    out.retain(|a| !a.is_empty() && seen.insert(a.clone()));
    out
}

/// Map an id into the catalog's namespace the way upstream does on a refresh: an id (or an
/// alias of it) listed in the catalog is kept in that form; otherwise a pre-v23 id becomes the
/// first alias that the catalog lists with the suffix `3` (`pop22→pop223`, `tr1422→tr14223`).
/// One step only (`deeprl3→deeprl33`, never on to `deeprl333`); unknown ids stay unchanged.
pub fn map_to_catalog(id: &str, catalog: &BTreeSet<String>) -> String {
    let canonical = canonical_id(id);
    if catalog.contains(canonical) || is_builtin_id(canonical) {
        return canonical.to_string();
    }
    let all = aliases(id);
    if let Some(a) = all.iter().find(|a| catalog.contains(a.as_str())) {
        return a.clone();
    }
    all.iter()
        .map(|a| format!("{a}3"))
        .find(|a| catalog.contains(a))
        .unwrap_or_else(|| canonical.to_string())
}

// ---------------------------------------------------------------------------------------------
// The selection (`Model`/`DrivingModel` pairs)

/// The five selection params as read (trimmed; `None` when unset or empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SelectionParams {
    pub model: Option<String>,
    pub driving_model: Option<String>,
    pub model_version: Option<String>,
    pub driving_model_version: Option<String>,
    pub driving_model_name: Option<String>,
}

/// Upstream's rule for a mirrored pair: unset means the default; when the two differ the
/// non-default value wins, preferring `DrivingModel*`.
pub fn prefer(driving: Option<&str>, legacy: Option<&str>, default: &str) -> String {
    let d = driving.unwrap_or(default);
    let l = legacy.unwrap_or(default);
    if d == l || d != default { d } else { l }.to_string()
}

/// The selected id (lower-cased, canonical) and version under upstream's precedence.
pub fn selected(p: &SelectionParams) -> (String, String) {
    let id = prefer(
        p.driving_model.as_deref(),
        p.model.as_deref(),
        layout::BUILTIN_MODEL_ID,
    );
    let version = prefer(
        p.driving_model_version.as_deref(),
        p.model_version.as_deref(),
        &layout::BUILTIN_MODEL_VERSION.to_string(),
    );
    (canonical_id(&id.to_ascii_lowercase()).to_string(), version)
}

/// `rdf43` and its old alias `rdf`.
pub fn is_builtin_id(id: &str) -> bool {
    canonical_id(id) == layout::BUILTIN_MODEL_ID
}

// ---------------------------------------------------------------------------------------------
// Profiles (`ActiveSmallModel*`, `ActiveBigModel*`)

/// The big profile: unset, disabled by the user (`none`), or a GPU model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BigProfile {
    Unset,
    Disabled,
    Model(ModelId),
}

/// The profile params as read (ids only; names and versions are derived from the catalog).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfilesRead {
    pub small: Option<String>,
    pub big: Option<String>,
}

/// The profiles to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profiles {
    pub small: ModelId,
    pub big: BigProfile,
}

pub const BIG_DISABLED: &str = "none";

/// What the profiles become, with upstream's rules: a device with neither profile param migrates
/// from its legacy selection (a GPU selection becomes the big profile with the built-in as the
/// small one; any other becomes the small profile); only non-GPU models may be the small profile
/// (else the built-in) and only GPU models the big one (else unset); `none` stays disabled.
pub fn ensure_profiles(read: &ProfilesRead, selection: &ModelId, catalog: &Catalog) -> Profiles {
    let parse = |s: &str| s.to_ascii_lowercase().parse::<ModelId>().ok();
    let is_gpu = |id: &ModelId| catalog.uses_external_gpu(id);
    let legacy = read.small.is_none() && read.big.is_none();
    let (small, big) = if legacy {
        if is_gpu(selection) {
            (builtin_id(), BigProfile::Model(selection.clone()))
        } else {
            (selection.clone(), BigProfile::Unset)
        }
    } else {
        let small = read
            .small
            .as_deref()
            .and_then(parse)
            .unwrap_or_else(builtin_id);
        let big = match read.big.as_deref() {
            None => BigProfile::Unset,
            Some(b) if b.eq_ignore_ascii_case(BIG_DISABLED) => BigProfile::Disabled,
            Some(b) => parse(b).map_or(BigProfile::Unset, BigProfile::Model),
        };
        (small, big)
    };
    let small = canonicalise(&small);
    let small = if is_gpu(&small) { builtin_id() } else { small };
    let big = match big {
        // An id the catalog does not list stays, so `decide` reports it as a fallback.
        BigProfile::Model(id) if is_gpu(&id) || !catalog.contains(&id) => {
            BigProfile::Model(canonicalise(&id))
        }
        BigProfile::Model(_) => BigProfile::Unset,
        other => other,
    };
    Profiles { small, big }
}

/// `id` under upstream's canonical map ([`canonical_id`]).
pub(crate) fn canonicalise(id: &ModelId) -> ModelId {
    canonical_id(id.as_str())
        .parse()
        .unwrap_or_else(|_| id.clone())
}

// ---------------------------------------------------------------------------------------------
// What a refresh keeps

/// The models a device wants: the selection and the two profiles, as recorded in the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub selection: ModelId,
    pub profiles: Profiles,
}

impl Wanted {
    /// The distinct catalog models that must be installed and verified, selection first.
    pub fn to_install(&self) -> Vec<ModelId> {
        let mut out: Vec<ModelId> = Vec::new();
        let mut push = |id: &ModelId| {
            if kind(id) == ModelKind::Catalog && !out.contains(id) {
                out.push(id.clone());
            }
        };
        push(&self.selection);
        push(&self.profiles.small);
        if let BigProfile::Model(b) = &self.profiles.big {
            push(b);
        }
        out
    }

    /// Every model named, for the "is it available" question.
    pub fn all(&self) -> Vec<ModelId> {
        let mut out = vec![self.selection.clone(), self.profiles.small.clone()];
        if let BigProfile::Model(b) = &self.profiles.big {
            out.push(b.clone());
        }
        out
    }
}

/// What the device wants, read from params against the catalog: the selection mapped into the
/// catalog's namespace (aliases, pre-v23 ids), then the profiles kept in step with it.
pub fn wanted(sel: &SelectionParams, profiles: &ProfilesRead, catalog: &Catalog) -> Wanted {
    let ids = catalog.id_set();
    let map = |raw: &str| -> ModelId {
        map_to_catalog(&raw.to_ascii_lowercase(), &ids)
            .parse()
            .unwrap_or_else(|_| builtin_id())
    };
    let (id, _) = selected(sel);
    let selection = map(&id);
    let read = ProfilesRead {
        small: profiles.small.as_deref().map(|s| map(s).to_string()),
        big: profiles.big.as_deref().map(|b| {
            if b.eq_ignore_ascii_case(BIG_DISABLED) {
                BIG_DISABLED.to_string()
            } else {
                map(b).to_string()
            }
        }),
    };
    let profiles = ensure_profiles(&read, &selection, catalog);
    Wanted {
        selection,
        profiles,
    }
}

/// The end state of a refresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub selection: NamedModel,
    pub small: NamedModel,
    pub big: BigOutcome,
    /// A wanted model could not be had and the built-in (or no big model) took its place.
    pub fell_back: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BigOutcome {
    Unset,
    Disabled,
    Model(NamedModel),
}

/// Decide the selection and profiles after the installs: a model that is neither the built-in
/// nor available (a catalog model that did not verify, a catalog id no longer listed, a local
/// model whose file is gone) is replaced by the built-in (selection, small profile) or dropped
/// (big profile), so what modeld loads is always something that is there. A big profile naming
/// a model for which `keep_big` holds stays as it is although the model is not available (a
/// GPU-only model waiting for a ready Chestnut: modeld loads the big profile only with one, and
/// the first refresh with one fetches it). `avail`: whether a wanted model can be loaded after
/// the refresh's installs.
pub fn decide(
    w: &Wanted,
    catalog: &Catalog,
    avail: &dyn Fn(&ModelId) -> bool,
    keep_big: &dyn Fn(&ModelId) -> bool,
) -> Outcome {
    let ok = |id: &ModelId| match kind(id) {
        ModelKind::BuiltIn => true,
        ModelKind::Catalog => catalog.contains(id) && avail(id),
        ModelKind::Local => avail(id),
    };
    let builtin = catalog.builtin();
    let mut fell_back = false;
    let mut pick = |id: &ModelId| {
        if ok(id) {
            catalog.named(id)
        } else {
            fell_back = true;
            builtin.clone()
        }
    };
    let selection = pick(&w.selection);
    let small = pick(&w.profiles.small);
    let big = match &w.profiles.big {
        BigProfile::Unset => BigOutcome::Unset,
        BigProfile::Disabled => BigOutcome::Disabled,
        BigProfile::Model(id) if ok(id) || (catalog.contains(id) && keep_big(id)) => {
            BigOutcome::Model(catalog.named(id))
        }
        BigProfile::Model(_) => {
            fell_back = true;
            BigOutcome::Unset
        }
    };
    Outcome {
        selection,
        small,
        big,
        fell_back,
    }
}

/// What the params say while a migration runs: the built-in everywhere modeld reads (a big
/// profile the user disabled stays disabled). The journal holds [`Wanted`] until the end.
pub fn interim(w: &Wanted, catalog: &Catalog) -> Outcome {
    let builtin = catalog.builtin();
    Outcome {
        selection: builtin.clone(),
        small: builtin,
        big: match w.profiles.big {
            BigProfile::Disabled => BigOutcome::Disabled,
            _ => BigOutcome::Unset,
        },
        fell_back: false,
    }
}

/// The param writes that make the params say `o`, in order: names and versions before ids, so a
/// reader that sees a new id also sees its name and version. `None` = remove the key.
pub fn selection_writes(o: &Outcome) -> Vec<(&'static str, Option<String>)> {
    let s = &o.selection;
    let mut w: Vec<(&'static str, Option<String>)> = vec![
        (keys::DRIVING_MODEL_NAME, Some(s.name.clone())),
        (keys::MODEL_VERSION, Some(s.version.clone())),
        (keys::DRIVING_MODEL_VERSION, Some(s.version.clone())),
        (keys::MODEL, Some(s.id.to_string())),
        (keys::DRIVING_MODEL, Some(s.id.to_string())),
        (keys::ACTIVE_SMALL_MODEL_NAME, Some(o.small.name.clone())),
        (
            keys::ACTIVE_SMALL_MODEL_VERSION,
            Some(o.small.version.clone()),
        ),
        (keys::ACTIVE_SMALL_MODEL, Some(o.small.id.to_string())),
    ];
    match &o.big {
        BigOutcome::Unset => w.extend([
            (keys::ACTIVE_BIG_MODEL, None),
            (keys::ACTIVE_BIG_MODEL_NAME, None),
            (keys::ACTIVE_BIG_MODEL_VERSION, None),
        ]),
        BigOutcome::Disabled => w.extend([
            (keys::ACTIVE_BIG_MODEL_NAME, None),
            (keys::ACTIVE_BIG_MODEL_VERSION, None),
            (keys::ACTIVE_BIG_MODEL, Some(BIG_DISABLED.to_string())),
        ]),
        BigOutcome::Model(b) => w.extend([
            (keys::ACTIVE_BIG_MODEL_NAME, Some(b.name.clone())),
            (keys::ACTIVE_BIG_MODEL_VERSION, Some(b.version.clone())),
            (keys::ACTIVE_BIG_MODEL, Some(b.id.to_string())),
        ]),
    }
    w
}

// ---------------------------------------------------------------------------------------------
// The catalog as the device lists it: the manifest's supported entries plus local models

/// A discovered local model: its key and its sidecar `local-<id>.json`, if it parsed as an
/// object.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalModel {
    pub id: ModelId,
    pub sidecar: Option<Map<String, Value>>,
}

/// Local models among the file names of `/data/models`: `local-*_driving_*` files, keyed by
/// the text before `_driving_`, each once, in the order upstream lists them (its discovery
/// walks the file names sorted and keeps each key's first file). Keys with a comma (they would
/// shift every comma-joined list) or that are not valid ids are left out.
pub fn discover_locals<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<ModelId> {
    let mut names: Vec<&str> = names.into_iter().collect();
    names.sort_unstable();
    let mut keys: Vec<ModelId> = Vec::new();
    for n in names {
        if !n.starts_with(ModelId::LOCAL_PREFIX) || chunker::atomic::is_temp_name(n) {
            continue;
        }
        let Some(at) = n.find("_driving_") else {
            continue;
        };
        let key = &n[..at];
        if key.contains(',') {
            continue;
        }
        if let Ok(id) = key.parse::<ModelId>()
            && !keys.contains(&id)
        {
            keys.push(id);
        }
    }
    keys
}

/// One row of the device's catalog, with upstream's defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Id, the name as upstream shows it, and the version (empty when none is given).
    pub model: NamedModel,
    pub uses_external_gpu: bool,
    /// The model as upstream's `update_model_params` reads it: the manifest entry's fields, or
    /// the dict upstream synthesises for a local model (`shape::local_model`). The catalog
    /// params and caches are written from it, exactly as upstream writes them.
    pub source: Map<String, Value>,
    pub local: bool,
}

const STRIPPED_EMOJI: [char; 4] = ['\u{1F5FA}', '\u{FE0F}', '\u{1F440}', '\u{1F4E1}'];

/// A manifest name as upstream shows it: the emoji `🗺️👀📡` removed, then trimmed.
pub fn clean_name(name: &str) -> String {
    name.chars()
        .filter(|c| !STRIPPED_EMOJI.contains(c))
        .collect::<String>()
        .trim()
        .to_string()
}

impl Row {
    pub fn of_entry(e: &ModelEntry) -> Self {
        let model = NamedModel::of_entry(e);
        Row {
            model: NamedModel {
                name: clean_name(&model.name),
                ..model
            },
            uses_external_gpu: e.uses_external_gpu(),
            source: e.fields().clone(),
            local: false,
        }
    }

    /// A local model, from its sidecar (name, version, series, released, uses_external_gpu,
    /// model_size, model_lab_eligible, accelerator_artifacts) with upstream's defaults.
    pub fn of_local(local: &LocalModel) -> Self {
        let source = crate::rules::shape::local_model(local.id.as_str(), local.sidecar.as_ref());
        let listed = crate::rules::shape::listed(&source);
        Row {
            model: NamedModel {
                id: local.id.clone(),
                name: listed.name,
                version: listed.version,
            },
            uses_external_gpu: source.get("uses_external_gpu").and_then(Value::as_bool)
                == Some(true),
            source,
            local: true,
        }
    }
}

/// The device catalog: supported manifest entries in manifest order, then local models.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Catalog {
    pub rows: Vec<Row>,
}

#[cfg(test)]
impl Catalog {
    /// [`Catalog::for_contract`] of the base contract (the tests' catalogs).
    pub fn new(manifest: &Manifest, locals: &[LocalModel]) -> Self {
        Self::for_contract(
            manifest,
            locals,
            manifest::contract::BASE_CONTRACT.contract(),
        )
    }
}

impl Catalog {
    /// The catalog of a device of `contract`: the entries whose format it loads.
    pub fn for_contract(
        manifest: &Manifest,
        locals: &[LocalModel],
        contract: &manifest::Contract,
    ) -> Self {
        let mut rows: Vec<Row> = manifest
            .models()
            .iter()
            .filter(|e| e.is_supported_by(contract) && !e.id().is_local())
            .map(Row::of_entry)
            .collect();
        rows.extend(locals.iter().map(Row::of_local));
        Catalog { rows }
    }

    pub fn row(&self, id: &ModelId) -> Option<&Row> {
        self.rows.iter().find(|r| &r.model.id == id)
    }

    pub fn contains(&self, id: &ModelId) -> bool {
        self.row(id).is_some()
    }

    pub fn id_set(&self) -> BTreeSet<String> {
        self.rows.iter().map(|r| r.model.id.to_string()).collect()
    }

    pub fn uses_external_gpu(&self, id: &ModelId) -> bool {
        self.row(id).is_some_and(|r| r.uses_external_gpu)
    }

    /// Name and version as the params carry them: from the catalog; the built-in falls back to
    /// "Regret Driven Framework V4"/`v15` when the catalog does not list it.
    pub fn named(&self, id: &ModelId) -> NamedModel {
        match (self.row(id), kind(id)) {
            (Some(r), ModelKind::BuiltIn) if r.model.version.is_empty() => NamedModel {
                version: layout::BUILTIN_MODEL_VERSION.to_string(),
                ..r.model.clone()
            },
            (Some(r), _) => r.model.clone(),
            (None, ModelKind::BuiltIn) => NamedModel::builtin(),
            (None, _) => NamedModel {
                id: id.clone(),
                name: id.to_string(),
                version: String::new(),
            },
        }
    }

    /// The built-in as the params name it ([`Catalog::named`] of its id).
    pub fn builtin(&self) -> NamedModel {
        self.named(&builtin_id())
    }

    fn sources(&self) -> Vec<Map<String, Value>> {
        self.rows.iter().map(|r| r.source.clone()).collect()
    }

    /// The comma-joined catalog params, in catalog order, exactly as upstream writes them
    /// (`shape::params`).
    pub fn params(&self) -> Vec<(&'static str, String)> {
        crate::rules::shape::params(&self.sources())
    }

    /// The three caches, `(file name, JSON body)`, as upstream writes them (`shape::caches`):
    /// `.model_versions.json` (`{id: version}`, every model), `.model_artifact_urls.json`
    /// (`{id: {file: url}}`, models with a URL) and `.model_artifacts.json` (`{id: {...}}`,
    /// every model). Rebuilt from this catalog alone, so no entry of another generation or of
    /// a dropped model survives.
    pub fn caches(&self) -> Vec<(&'static str, Value)> {
        crate::rules::shape::caches(&self.sources())
    }
}

pub use crate::rules::shape::{ARTIFACTS_CACHE, URLS_CACHE, VERSIONS_CACHE};

// ---------------------------------------------------------------------------------------------
// Where a refresh starts

/// What a refresh does first, given the journal and `ModelManifestVersion`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// The device is on this generation: re-check and repair the selection only.
    SameGeneration,
    /// A new migration from `from` (purge first).
    Migrate { from: Option<String> },
    /// An interrupted migration to this generation: carry on at its recorded phase.
    Resume,
    /// An interrupted migration to another generation: start over at the purge for ours,
    /// keeping the recorded selection.
    Retarget,
}

pub fn start(journal_to: Option<&str>, manifest_version: Option<&str>, target: &str) -> Start {
    match journal_to {
        Some(to) if to == target => Start::Resume,
        Some(_) => Start::Retarget,
        None if manifest_version == Some(target) => Start::SameGeneration,
        None => Start::Migrate {
            from: manifest_version.map(str::to_string),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn id(s: &str) -> ModelId {
        s.parse().unwrap()
    }

    fn catalog() -> Catalog {
        let m = Manifest::from_value(json!({"models": [
            {"id": "rdf43", "name": "Regret Driven Framework V4", "version": "v15"},
            {"id": "pop223", "name": "Pop 👀📡", "version": "v16", "series": "Pop Series",
             "released": "2025-05-01", "community_favorite": true,
             "artifact_format": "tinygrad_single_v1"},
            {"id": "tr14223", "name": "TR14", "version": "v8"},
            {"id": "sc2", "name": "SC2", "version": "v9"},
            {"id": "remove-avgpoolv4", "name": "NAP4", "version": "v9"},
            {"id": "big1", "name": "Big 🗺️", "version": "v16", "uses_external_gpu": true,
             "artifact_urls": {"big1_driving_tinygrad.pkl": "https://x/big1"}},
            {"id": "odd", "name": "Odd", "artifact_format": "split"},
        ]}))
        .unwrap();
        Catalog::new(
            &m,
            &[
                LocalModel {
                    id: id("local-mine"),
                    sidecar: Some(
                        json!({"name": "Mine, built here", "version": "v16",
                               "uses_external_gpu": false})
                        .as_object()
                        .unwrap()
                        .clone(),
                    ),
                },
                LocalModel {
                    id: id("local-bare_one"),
                    sidecar: None,
                },
            ],
        )
    }

    /// A name with a control character is refused per entry (the tolerant read leaves that
    /// entry out, with its reason) and never reaches `AvailableModelNames`; a local model's
    /// sidecar name with one gives way to the name made from its id. For v25 and a made-up v26.
    #[test]
    fn names_with_control_characters_never_reach_the_name_list() {
        for generation in ["v25", "v26"] {
            let body = serde_json::to_vec(&json!({"generation": generation, "models": [
                {"id": "pop223", "name": "Pop", "version": "v16"},
                {"id": "nl1", "name": "New\nLine", "version": "v16"},
                {"id": "nul1", "name": "Nul\u{0}", "version": "v16"},
                {"id": "sc2", "name": "SC2", "version": "v9"},
            ]}))
            .unwrap();
            let read = Manifest::from_slice_tolerant(&body, &manifest::Limits::default()).unwrap();
            let refused: Vec<(usize, Option<&str>)> = read
                .refused
                .iter()
                .map(|r| (r.index, r.id.as_deref()))
                .collect();
            assert_eq!(
                refused,
                [(1, Some("nl1")), (2, Some("nul1"))],
                "{generation}"
            );
            assert!(
                read.refused
                    .iter()
                    .all(|r| r.reason().contains("control characters")),
                "{generation}"
            );
            let local = LocalModel {
                id: id("local-bad_name"),
                sidecar: Some(
                    json!({"name": "Bad\nName\u{0}"})
                        .as_object()
                        .unwrap()
                        .clone(),
                ),
            };
            let params = Catalog::new(&read.manifest, &[local]).params();
            let names = &params
                .iter()
                .find(|(k, _)| *k == keys::AVAILABLE_MODEL_NAMES)
                .unwrap()
                .1;
            assert_eq!(names, "Pop,SC2,bad name", "{generation}");
            for (key, value) in &params {
                assert!(
                    !value.chars().any(char::is_control),
                    "{generation} {key}: {value:?}"
                );
            }
        }
    }

    #[test]
    fn aliases_and_namespace_follow_upstream() {
        let ids: BTreeSet<String> = [
            "pop223",
            "tr14223",
            "sc2",
            "remove-avgpoolv4",
            "deeprl33",
            "deeprl333",
        ]
        .map(String::from)
        .into();
        for (from, to) in [
            ("pop22", "pop223"),
            ("tr1422", "tr14223"),
            ("pop223", "pop223"),
            ("sc", "sc2"),
            ("napv4", "remove-avgpoolv4"),
            ("rdf", "rdf43"),
            ("rdf43", "rdf43"),
            ("deeprl3", "deeprl33"),
            ("deeprl33", "deeprl33"),
            ("missing", "missing"),
        ] {
            assert_eq!(map_to_catalog(from, &ids), to, "{from}");
        }
        assert_eq!(aliases("rdf43"), ["rdf43", "rdf", "rdf432"]);
        assert_eq!(aliases("sc2"), ["sc2", "sc"]);
        assert_eq!(
            aliases("pop_default"),
            ["pop_default", "pop", "pop_default2"]
        );
    }

    #[test]
    fn selection_precedence_non_default_wins_preferring_driving_model() {
        let p = |m: Option<&str>, d: Option<&str>| SelectionParams {
            model: m.map(String::from),
            driving_model: d.map(String::from),
            ..Default::default()
        };
        for (m, d, want) in [
            (None, None, "rdf43"),
            (Some("pop223"), None, "pop223"),
            (None, Some("pop223"), "pop223"),
            (Some("pop223"), Some("rdf43"), "pop223"),
            (Some("rdf43"), Some("pop223"), "pop223"),
            (Some("tr14223"), Some("pop223"), "pop223"),
            (Some("RDF"), None, "rdf43"),
        ] {
            assert_eq!(selected(&p(m, d)).0, want, "{m:?} {d:?}");
        }
    }

    #[test]
    fn profiles_table() {
        let c = catalog();
        let read = |s: Option<&str>, b: Option<&str>| ProfilesRead {
            small: s.map(String::from),
            big: b.map(String::from),
        };
        let big = |s: &str| BigProfile::Model(id(s));
        for (r, sel, small, bigp) in [
            // legacy small selection
            (read(None, None), "pop223", "pop223", BigProfile::Unset),
            // legacy GPU selection: built-in small, the model big
            (read(None, None), "big1", "rdf43", big("big1")),
            // disabled big never migrates
            (
                read(None, Some("none")),
                "big1",
                "rdf43",
                BigProfile::Disabled,
            ),
            // set profiles are kept
            (
                read(Some("tr14223"), Some("big1")),
                "pop223",
                "tr14223",
                big("big1"),
            ),
            // a GPU model may not be small, a non-GPU one not big
            (
                read(Some("big1"), Some("pop223")),
                "pop223",
                "rdf43",
                BigProfile::Unset,
            ),
            (
                read(Some("rdf"), None),
                "pop223",
                "rdf43",
                BigProfile::Unset,
            ),
        ] {
            let p = ensure_profiles(&r, &id(sel), &c);
            assert_eq!((p.small.as_str(), &p.big), (small, &bigp), "{r:?} {sel}");
        }
    }

    #[test]
    fn decide_falls_back_to_the_builtin_everywhere_modeld_reads() {
        let c = catalog();
        let sel = |m: &str| SelectionParams {
            model: Some(m.into()),
            driving_model: Some(m.into()),
            ..Default::default()
        };
        let no_profiles = ProfilesRead {
            small: None,
            big: None,
        };
        let up = |ok: &'static [&'static str]| move |i: &ModelId| ok.contains(&i.as_str());
        // (selection, profiles, available) -> (selection, small, big, fell back)
        type Case = (
            SelectionParams,
            ProfilesRead,
            &'static [&'static str],
            &'static str,
            &'static str,
            Option<&'static str>,
            bool,
        );
        let cases: Vec<Case> = vec![
            (
                sel("pop22"),
                no_profiles.clone(),
                &["pop223"],
                "pop223",
                "pop223",
                None,
                false,
            ),
            (
                sel("pop223"),
                no_profiles.clone(),
                &[],
                "rdf43",
                "rdf43",
                None,
                true,
            ),
            (
                sel("gone"),
                no_profiles.clone(),
                &[],
                "rdf43",
                "rdf43",
                None,
                true,
            ),
            (
                sel("big1"),
                no_profiles.clone(),
                &["big1"],
                "big1",
                "rdf43",
                Some("big1"),
                false,
            ),
            (
                sel("big1"),
                no_profiles.clone(),
                &[],
                "rdf43",
                "rdf43",
                None,
                true,
            ),
            (
                sel("local-mine"),
                no_profiles.clone(),
                &["local-mine"],
                "local-mine",
                "local-mine",
                None,
                false,
            ),
            (
                sel("local-gone"),
                no_profiles.clone(),
                &[],
                "rdf43",
                "rdf43",
                None,
                true,
            ),
            (
                sel("pop223"),
                ProfilesRead {
                    small: Some("tr1422".into()),
                    big: Some("big1".into()),
                },
                &["pop223", "tr14223"],
                "pop223",
                "tr14223",
                None,
                true,
            ),
        ];
        for (s, p, ok, want_sel, want_small, want_big, fell) in cases {
            let w = wanted(&s, &p, &c);
            let o = decide(&w, &c, &up(ok), &|_| false);
            let big = match &o.big {
                BigOutcome::Model(n) => Some(n.id.as_str()),
                _ => None,
            };
            assert_eq!(
                (
                    o.selection.id.as_str(),
                    o.small.id.as_str(),
                    big,
                    o.fell_back
                ),
                (want_sel, want_small, want_big, fell),
                "{s:?} {p:?} {ok:?}"
            );
        }
        let o = decide(
            &wanted(&sel("gone"), &no_profiles, &c),
            &c,
            &up(&[]),
            &|_| false,
        );
        assert_eq!(o.selection.name, "Regret Driven Framework V4");
        assert_eq!(o.selection.version, "v15");
    }

    #[test]
    fn a_big_profile_waiting_for_a_chestnut_is_kept_anything_else_unavailable_is_not() {
        let c = catalog();
        let w = wanted(
            &SelectionParams {
                model: Some("pop223".into()),
                driving_model: Some("pop223".into()),
                ..Default::default()
            },
            &ProfilesRead {
                small: Some("pop223".into()),
                big: Some("big1".into()),
            },
            &c,
        );
        let pop_only = |i: &ModelId| i.as_str() == "pop223";
        let big = |o: &Outcome| match &o.big {
            BigOutcome::Model(n) => Some(n.id.to_string()),
            _ => None,
        };
        // (keep_big) -> (big profile written, fell back)
        for (keep, want_big, fell) in [(true, Some("big1".to_string()), false), (false, None, true)]
        {
            let o = decide(&w, &c, &pop_only, &|i: &ModelId| {
                keep && i.as_str() == "big1"
            });
            assert_eq!((big(&o), o.fell_back), (want_big, fell), "keep={keep}");
            assert_eq!(o.selection.id.as_str(), "pop223");
        }
        // An id the catalog does not list is never kept.
        let gone = Wanted {
            profiles: Profiles {
                big: BigProfile::Model(id("gone1")),
                ..w.profiles.clone()
            },
            ..w.clone()
        };
        let o = decide(&gone, &c, &pop_only, &|_| true);
        assert_eq!((big(&o), o.fell_back), (None, true));
    }

    #[test]
    fn selection_writes_put_ids_last_and_clear_an_unset_big_profile() {
        let c = catalog();
        let o = Outcome {
            selection: c.named(&id("pop223")),
            small: c.named(&id("pop223")),
            big: BigOutcome::Disabled,
            fell_back: false,
        };
        let w = selection_writes(&o);
        let pos = |k: &str| w.iter().position(|(key, _)| *key == k).unwrap();
        assert!(pos(keys::DRIVING_MODEL_NAME) < pos(keys::MODEL));
        assert!(pos(keys::ACTIVE_SMALL_MODEL_NAME) < pos(keys::ACTIVE_SMALL_MODEL));
        assert_eq!(w[pos(keys::ACTIVE_BIG_MODEL)].1.as_deref(), Some("none"));
        assert_eq!(w[pos(keys::ACTIVE_BIG_MODEL_NAME)].1, None);
        assert_eq!(w[pos(keys::DRIVING_MODEL_NAME)].1.as_deref(), Some("Pop"));
    }

    #[test]
    fn catalog_params_and_caches_as_upstream_writes_them() {
        let c = catalog();
        let p: BTreeMap<_, _> = c.params().into_iter().collect();
        for (key, want) in [
            (
                keys::AVAILABLE_MODELS,
                "rdf43,pop223,tr14223,sc2,remove-avgpoolv4,big1,local-mine,local-bare_one",
            ),
            (
                keys::AVAILABLE_MODEL_NAMES,
                "Regret Driven Framework V4,Pop,TR14,SC2,NAP4,Big,Mine  built here,bare one",
            ),
            (
                keys::AVAILABLE_MODEL_SERIES,
                "Custom Series,Pop Series,Custom Series,Custom Series,Custom Series,Custom Series,Local Series,Local Series",
            ),
            (
                keys::MODEL_RELEASED_DATES,
                "2023-01-01,2025-05-01,2023-01-01,2023-01-01,2023-01-01,2023-01-01,2100-01-01,2100-01-01",
            ),
            (keys::MODEL_VERSIONS, "v15,v16,v8,v9,v9,v16,v16,"),
            (
                keys::AVAILABLE_MODEL_ARTIFACT_FORMATS,
                // Upstream's default for an entry without a format, never an empty item.
                "tinygrad_single_v1,tinygrad_single_v1,tinygrad_single_v1,tinygrad_single_v1,tinygrad_single_v1,tinygrad_single_v1,tinygrad_single_v1,tinygrad_single_v1",
            ),
            (keys::COMMUNITY_FAVORITES, "pop223"),
        ] {
            assert_eq!(p[key], want, "{key}");
        }

        let caches: BTreeMap<_, _> = c.caches().into_iter().collect();
        assert_eq!(caches[VERSIONS_CACHE]["local-mine"], "v16");
        // Every listed model, an empty version included (upstream zips ids with versions).
        assert_eq!(caches[VERSIONS_CACHE]["local-bare_one"], "");
        assert!(
            caches[VERSIONS_CACHE].get("odd").is_none(),
            "unsupported format dropped"
        );
        let a = &caches[ARTIFACTS_CACHE];
        assert_eq!(a["big1"]["model_size"], "chestnut");
        assert_eq!(a["big1"]["model_lab_eligible"], false);
        assert_eq!(a["pop223"]["model_size"], "small");
        assert_eq!(a["pop223"]["model_size_declared"], false);
        assert_eq!(a["pop223"]["model_lab_eligible"], true);
        // Upstream does not derive a file name: "" when the catalog gives none.
        assert_eq!(a["pop223"]["artifact_filename"], "");
        assert_eq!(a["tr14223"]["artifact_format"], "tinygrad_single_v1");
        assert_eq!(a["local-mine"]["uses_external_gpu"], false);
        // A discovered local model is "small", declared.
        assert_eq!(a["local-mine"]["model_size"], "small");
        assert_eq!(a["local-mine"]["model_size_declared"], true);
        assert_eq!(a["local-mine"]["artifact_size"], 0);
        assert_eq!(
            caches[URLS_CACHE],
            json!({"big1": {"big1_driving_tinygrad.pkl": "https://x/big1"}})
        );
    }

    #[test]
    fn locals_are_discovered_once_each_and_never_with_a_comma() {
        let names = [
            "local-a_driving_tinygrad.pkl",
            "local-a.json",
            "local-b_driving_tinygrad.pkl.chunk01of02",
            "local-b_driving_tinygrad.pkl.chunkmanifest",
            "local-c,d_driving_tinygrad.pkl",
            "local-e_driving_chestnut_tinygrad.pkl",
            "local-a-b_driving_tinygrad.pkl",
            "pop223_driving_tinygrad.pkl",
            ".tmp-x-local-f_driving_tinygrad.pkl",
        ];
        let got: Vec<String> = discover_locals(names)
            .iter()
            .map(|i| i.to_string())
            .collect();
        // Sorted by file name, as upstream walks them: `local-a-b_…` sorts before `local-a_…`.
        assert_eq!(got, ["local-a-b", "local-a", "local-b", "local-e"]);
    }

    #[test]
    fn where_a_refresh_starts() {
        for (journal, mv, want) in [
            (None, Some("v25"), Start::SameGeneration),
            (
                None,
                Some("v24"),
                Start::Migrate {
                    from: Some("v24".into()),
                },
            ),
            (None, None, Start::Migrate { from: None }),
            (Some("v25"), Some("v24"), Start::Resume),
            (Some("v25"), Some("v25"), Start::Resume),
            (Some("v26"), Some("v24"), Start::Retarget),
        ] {
            assert_eq!(start(journal, mv, "v25"), want, "{journal:?} {mv:?}");
        }
    }
}
