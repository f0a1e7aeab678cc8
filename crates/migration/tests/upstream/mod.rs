//! An independent reader of a device's state, written from the description of StarPilot's Python
//! side (modeld's model choice, the model UIs, `file_chunked_exists`; see `docs/device.md`,
//! *Params and files*) and NOT from the `migration` crate: it uses none of its code. It answers
//! two questions about a data dir: what would upstream modeld load, and what would the model UIs
//! list. The tests compare its answers with the published catalog.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub mod writes;

/// Where modeld's model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Load {
    /// The built-in RDF V4 in the openpilot checkout.
    BuiltIn,
    /// `/data/models/<id>_driving_tinygrad.pkl` (plain file or chunk set) exists: modeld opens it.
    File { id: String, path: PathBuf },
    /// The artifact is missing: upstream modeld would start the Python manager's synchronous
    /// download here (bypassing the Rust manager's verification and lock).
    SyncDownload { id: String },
}

/// What modeld loads: the small profile always, the big one only with a ready eGPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Modeld {
    pub small: Load,
    pub big: Option<Load>,
    /// The behaviour version modeld would take from params (`DrivingModelVersion`, else
    /// `ModelVersion`), before falling back to the artifact's own.
    pub param_version: Option<String>,
}

/// One row of the model list the UIs show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub id: String,
    pub name: String,
    pub series: String,
    pub released: String,
    pub format: String,
    pub version: String,
}

/// What the UIs show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ui {
    pub models: Vec<Listed>,
    pub favorites: Vec<String>,
    /// `(id, name, version)` of `ActiveSmallModel*`.
    pub small: Option<(String, String, String)>,
    /// `ActiveBigModel*`: `None` unset, `Some(("none",..))` disabled.
    pub big: Option<(String, String, String)>,
    pub selected: (String, String, String),
    pub versions_cache: BTreeMap<String, String>,
    pub artifacts_cache: serde_json::Map<String, Value>,
    pub urls_cache: serde_json::Map<String, Value>,
    pub manifest_version: Option<String>,
}

fn param(data: &Path, key: &str) -> Option<String> {
    fs::read(data.join("params/d").join(key))
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// modeld's own id map: lowercase, `rdf`/`rdf43` → `rdf43`, `sc` → `sc2`.
fn modeld_id(raw: &str) -> String {
    let id = raw.to_lowercase();
    match id.as_str() {
        "rdf" | "rdf43" => "rdf43".to_string(),
        "sc" => "sc2".to_string(),
        _ => id,
    }
}

/// `file_chunked_exists`: the plain file, or its `.chunkmanifest`.
pub fn file_chunked_exists(path: &Path) -> bool {
    path.is_file() || PathBuf::from(format!("{}.chunkmanifest", path.display())).is_file()
}

/// The artifact's bytes as modeld's chunk reader streams them: the plain file wins; otherwise
/// the `.chunkmanifest` count (whitespace trimmed) and `.chunkNNofMM` in order.
pub fn read_chunked(path: &Path) -> Option<Vec<u8>> {
    if path.is_file() {
        return fs::read(path).ok();
    }
    let count: usize = fs::read_to_string(format!("{}.chunkmanifest", path.display()))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let mut out = Vec::new();
    for i in 1..=count {
        out.extend(fs::read(format!("{}.chunk{i:02}of{count:02}", path.display())).ok()?);
    }
    Some(out)
}

fn artifacts_cache(data: &Path) -> serde_json::Map<String, Value> {
    fs::read(data.join("models/.model_artifacts.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default()
}

fn load(data: &Path, raw: &str, egpu_ready: bool) -> Load {
    let id = modeld_id(raw);
    if id == "rdf43" {
        return Load::BuiltIn;
    }
    // Missing ids count as non-GPU (upstream's cache reader).
    let gpu = artifacts_cache(data)
        .get(&id)
        .and_then(|e| e.get("uses_external_gpu"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if gpu && !egpu_ready {
        return Load::BuiltIn;
    }
    let path = data
        .join("models")
        .join(format!("{id}_driving_tinygrad.pkl"));
    if file_chunked_exists(&path) {
        Load::File { id, path }
    } else {
        Load::SyncDownload { id }
    }
}

/// What upstream modeld loads on this data dir.
pub fn modeld(data: &Path, egpu_ready: bool) -> Modeld {
    let small = load(
        data,
        &param(data, "ActiveSmallModel").unwrap_or_else(|| "rdf43".into()),
        egpu_ready,
    );
    let big = match param(data, "ActiveBigModel") {
        Some(b) if egpu_ready && !b.eq_ignore_ascii_case("none") => Some(load(data, &b, true)),
        _ => None,
    };
    Modeld {
        small,
        big,
        param_version: param(data, "DrivingModelVersion").or(param(data, "ModelVersion")),
    }
}

fn list(data: &Path, key: &str) -> Vec<String> {
    match param(data, key) {
        None => Vec::new(),
        Some(v) => v.split(',').map(str::to_string).collect(),
    }
}

fn cache(data: &Path, name: &str) -> serde_json::Map<String, Value> {
    fs::read(data.join("models").join(name))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default()
}

/// What the model UIs list on this data dir. Panics when the comma-joined params do not line up
/// (the UI zips them, so a length mismatch shifts every row).
pub fn ui(data: &Path) -> Ui {
    let ids = list(data, "AvailableModels");
    let names = list(data, "AvailableModelNames");
    let series = list(data, "AvailableModelSeries");
    let released = list(data, "ModelReleasedDates");
    let formats = list(data, "AvailableModelArtifactFormats");
    let versions = list(data, "ModelVersions");
    for (k, v) in [
        ("AvailableModelNames", &names),
        ("AvailableModelSeries", &series),
        ("ModelReleasedDates", &released),
        ("AvailableModelArtifactFormats", &formats),
        ("ModelVersions", &versions),
    ] {
        assert_eq!(
            v.len(),
            ids.len(),
            "{k} does not line up with AvailableModels"
        );
    }
    let models = (0..ids.len())
        .map(|i| Listed {
            id: ids[i].clone(),
            name: names[i].clone(),
            series: series[i].clone(),
            released: released[i].clone(),
            format: formats[i].clone(),
            version: versions[i].clone(),
        })
        .collect();
    let triple = |k: &str| {
        param(data, k).map(|id| {
            (
                id,
                param(data, &format!("{k}Name")).unwrap_or_default(),
                param(data, &format!("{k}Version")).unwrap_or_default(),
            )
        })
    };
    // `Model`/`DrivingModel`: the non-default value wins, preferring `DrivingModel`.
    let prefer = |d: Option<String>, l: Option<String>, default: &str| {
        let d = d.unwrap_or_else(|| default.to_string());
        let l = l.unwrap_or_else(|| default.to_string());
        if d == l || d != default { d } else { l }
    };
    let selected = (
        prefer(param(data, "DrivingModel"), param(data, "Model"), "rdf43"),
        param(data, "DrivingModelName").unwrap_or_else(|| "Regret Driven Framework V4".into()),
        prefer(
            param(data, "DrivingModelVersion"),
            param(data, "ModelVersion"),
            "v15",
        ),
    );
    Ui {
        models,
        favorites: list(data, "CommunityFavorites"),
        small: triple("ActiveSmallModel"),
        big: triple("ActiveBigModel"),
        selected,
        versions_cache: cache(data, ".model_versions.json")
            .into_iter()
            .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string()))
            .collect(),
        artifacts_cache: cache(data, ".model_artifacts.json"),
        urls_cache: cache(data, ".model_artifact_urls.json"),
        manifest_version: param(data, "ModelManifestVersion"),
    }
}

impl Ui {
    pub fn ids(&self) -> Vec<&str> {
        self.models.iter().map(|m| m.id.as_str()).collect()
    }

    pub fn row(&self, id: &str) -> Option<&Listed> {
        self.models.iter().find(|m| m.id == id)
    }
}
