//! An independent reader of a per-generation device root, written from the description of
//! StarPilot upstream's v26 model manager (its `catalog`, `preferences`, `verified_artifact`,
//! `resolve_runtime` and job-file reading) and NOT from the `migration` crate: it uses none of
//! its code, only serde_json and sha2. It answers what upstream's v26 code would see on a data
//! dir: which manifest it accepts, which selection it reads, which artifacts it trusts, what
//! modeld would load. [`declare_tree`] and [`contract_manifest`] write what such a device
//! starts from: a tree declaring a generation of that contract, and a manifest of it.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::published::PublishedModel;

/// Upstream's v26 `COMPILER_REVISION` (its catalog module).
pub const COMPILER_REVISION: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";
/// Upstream's v26 `ARTIFACT_ABI`.
pub const ARTIFACT_ABI: &str = "tinygrad_single_v1_arena";
/// Where upstream's tree keeps its catalog module and reviewed catalog.
const TREE_CATALOG_DIR: &str = "starpilot/models";

/// Make the openpilot checkout `op` a tree declaring `generation` on upstream's contract with
/// tinygrad `compiler`: the catalog module, `catalog-<gen>.json` with `rows` as its reviewed
/// models (another generation's catalog removed, as a checkout of the new tree has none) and
/// `upstream-sync.json`. Returns what a device on that tree runs.
pub fn declare_tree(op: &Path, generation: &str, compiler: &str, rows: &[Value]) -> Runtime {
    let dir = op.join(TREE_CATALOG_DIR);
    fs::create_dir_all(&dir).unwrap();
    for e in fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if name.starts_with("catalog-") && name.ends_with(".json") {
            fs::remove_file(dir.join(name)).unwrap();
        }
    }
    fs::write(dir.join("catalog.py"), "# reviewed catalog\n").unwrap();
    let catalog_path = Runtime::of_tree(op, generation, compiler).catalog_path;
    let catalog = json!({"generation": generation, "compiler_revision": compiler,
        "artifact_abi": ARTIFACT_ABI, "models": rows});
    fs::write(&catalog_path, serde_json::to_vec_pretty(&catalog).unwrap()).unwrap();
    let sync = json!({"dependencies": [{"path": "tinygrad_repo", "commit": compiler}]});
    fs::write(op.join("upstream-sync.json"), sync.to_string()).unwrap();
    Runtime::of_tree(op, generation, compiler)
}

/// A manifest of upstream's contract for `rt`: each of `published`, its reviewed row of
/// `rows` with the published artifact's fields.
pub fn contract_manifest(rt: &Runtime, rows: &[Value], published: &[PublishedModel]) -> Vec<u8> {
    let entries: Vec<Value> = published
        .iter()
        .map(|p| {
            let mut e = rows
                .iter()
                .find(|r| r["id"] == p.id.as_str())
                .unwrap()
                .clone();
            e["artifact_format"] = json!(ARTIFACT_ABI);
            e["artifact_sha256"] = json!(p.sha256);
            e["artifact_size"] = json!(p.size);
            e["artifact_chunk_count"] = json!(p.chunk_count);
            e
        })
        .collect();
    serde_json::to_vec_pretty(&json!({"generation": rt.generation,
        "compiler_revision": rt.compiler_revision, "artifact_abi": rt.artifact_abi,
        "models": entries}))
    .unwrap()
}

/// Upstream's constants, as its catalog module declares them (the tree gives them here).
#[derive(Debug, Clone)]
pub struct Runtime {
    pub generation: String,
    pub compiler_revision: String,
    pub artifact_abi: String,
    /// The reviewed catalog in the tree (`catalog-<gen>.json`).
    pub catalog_path: PathBuf,
}

pub const BUNDLED: &str = "bundled-current";
const MAX_MANIFEST: u64 = 2 * 1024 * 1024;
const MAX_ARTIFACT: i64 = 2 * 1024 * 1024 * 1024;
const RUNNER_REVISION: i64 = 2;
const SORT_MODES: [&str; 7] = [
    "name",
    "date",
    "date_oldest",
    "community",
    "series",
    "favorites",
    "released",
];

/// A row of the reviewed catalog.
#[derive(Debug, Clone)]
pub struct Known {
    pub version: String,
    pub gpu: bool,
}

fn read_json(path: &Path, limit: u64) -> Option<serde_json::Map<String, Value>> {
    let meta = fs::metadata(path).ok()?;
    if meta.len() > limit {
        return None;
    }
    match serde_json::from_slice(&fs::read(path).ok()?).ok()? {
        Value::Object(m) => Some(m),
        _ => None,
    }
}

impl Runtime {
    /// What a device on the tree `op` declaring `generation` with tinygrad `compiler` runs.
    pub fn of_tree(op: &Path, generation: &str, compiler: &str) -> Runtime {
        Runtime {
            generation: generation.into(),
            compiler_revision: compiler.into(),
            artifact_abi: ARTIFACT_ABI.into(),
            catalog_path: op
                .join(TREE_CATALOG_DIR)
                .join(format!("catalog-{generation}.json")),
        }
    }

    /// The catalog module's `BY_ID`: the bundled entry and the reviewed rows.
    pub fn by_id(&self) -> BTreeMap<String, Known> {
        let mut out = BTreeMap::new();
        out.insert(
            BUNDLED.to_string(),
            Known {
                version: "v15".into(),
                gpu: false,
            },
        );
        let doc = read_json(&self.catalog_path, MAX_MANIFEST).expect("the tree's catalog");
        for m in doc["models"].as_array().unwrap() {
            out.insert(
                m["id"].as_str().unwrap().to_string(),
                Known {
                    version: m["version"].as_str().unwrap().to_string(),
                    gpu: m.get("uses_external_gpu").and_then(Value::as_bool) == Some(true),
                },
            );
        }
        out
    }

    /// `validate_manifest`: the rows by id, or why the whole manifest is refused.
    pub fn validate_manifest(
        &self,
        data: &serde_json::Map<String, Value>,
    ) -> Result<BTreeMap<String, serde_json::Map<String, Value>>, String> {
        let by_id = self.by_id();
        let s = |k: &str| data.get(k).and_then(Value::as_str);
        if s("generation") != Some(&self.generation)
            || s("compiler_revision") != Some(&self.compiler_revision)
            || s("artifact_abi") != Some(&self.artifact_abi)
            || !data.get("models").is_some_and(Value::is_array)
        {
            return Err("different runtime".into());
        }
        let mut rows = BTreeMap::new();
        for entry in data["models"].as_array().unwrap() {
            let e = entry.as_object().ok_or("entry not an object")?;
            let id = e.get("id").and_then(Value::as_str).ok_or("no id")?;
            if !by_id.contains_key(id) || id == BUNDLED || rows.contains_key(id) {
                return Err(format!("unknown or duplicate {id}"));
            }
            let known = &by_id[id];
            let gpu = match e.get("uses_external_gpu") {
                None | Some(Value::Null) | Some(Value::Bool(false)) => false,
                Some(Value::Bool(true)) => true,
                Some(other) => other.as_i64().is_some_and(|n| n != 0),
            };
            if e.get("version").and_then(Value::as_str) != Some(&known.version) || gpu != known.gpu
            {
                return Err(format!("{id}: behaviour or hardware changed"));
            }
            let empty = serde_json::Map::new();
            let variants = match e.get("accelerator_artifacts") {
                None => &empty,
                Some(Value::Object(v)) => v,
                Some(_) => return Err("accelerators not an object".into()),
            };
            if variants.keys().any(|k| k != "amd") {
                return Err("unknown accelerator".into());
            }
            if let Some(amd) = variants.get("amd") {
                let a = amd.as_object().ok_or("amd not an object")?;
                if known.gpu
                    || e.get("model_lab_eligible") != Some(&Value::Bool(true))
                    || a.get("execution_device").and_then(Value::as_str) != Some("AMD")
                    || a.get("compiler_revision").and_then(Value::as_str)
                        != Some(&self.compiler_revision)
                {
                    return Err("bad amd variant".into());
                }
            }
            let runtime = match e.get("runtime_artifacts") {
                None => Vec::new(),
                Some(Value::Array(a)) => a.clone(),
                Some(_) => return Err("runtime artifacts not a list".into()),
            };
            let allowed = [
                "min_runner_revision",
                "artifact_format",
                "artifact_sha256",
                "artifact_size",
                "artifact_chunk_count",
                "conversion_provenance",
                "validation",
            ];
            let mut revisions = Vec::new();
            for r in &runtime {
                let r = r.as_object().ok_or("runtime artifact not an object")?;
                let rev = r.get("min_runner_revision").and_then(Value::as_i64);
                if r.keys().any(|k| !allowed.contains(&k.as_str()))
                    || ![
                        "artifact_format",
                        "artifact_sha256",
                        "artifact_size",
                        "artifact_chunk_count",
                    ]
                    .iter()
                    .all(|k| r.contains_key(*k))
                    || !r.get("min_runner_revision").is_some_and(Value::is_i64)
                    || rev.unwrap() < 2
                    || revisions.contains(&rev.unwrap())
                {
                    return Err("bad runtime artifact".into());
                }
                revisions.push(rev.unwrap());
            }
            let mut artifacts: Vec<&serde_json::Map<String, Value>> = vec![e];
            artifacts.extend(variants.values().filter_map(Value::as_object));
            artifacts.extend(runtime.iter().filter_map(Value::as_object));
            for a in artifacts {
                let Some(sha) = a.get("artifact_sha256") else {
                    continue;
                };
                let sha_ok = sha.as_str().is_some_and(|s| {
                    s.len() == 64
                        && s.bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                });
                let size_ok = a
                    .get("artifact_size")
                    .filter(|v| v.is_i64() || v.is_u64())
                    .and_then(Value::as_i64)
                    .is_some_and(|n| 0 < n && n <= MAX_ARTIFACT);
                let chunks_ok = a
                    .get("artifact_chunk_count")
                    .filter(|v| v.is_i64() || v.is_u64())
                    .and_then(Value::as_i64)
                    .is_some_and(|n| (0..=99).contains(&n));
                if !sha_ok
                    || !size_ok
                    || !chunks_ok
                    || a.get("artifact_format").and_then(Value::as_str) != Some(&self.artifact_abi)
                {
                    return Err(format!("{id}: bad artifact metadata"));
                }
            }
            let mut row = e.clone();
            if let Some(best) = runtime
                .iter()
                .filter_map(Value::as_object)
                .filter(|r| r["min_runner_revision"].as_i64().unwrap() <= RUNNER_REVISION)
                .max_by_key(|r| r["min_runner_revision"].as_i64().unwrap())
            {
                for (k, v) in best {
                    if k != "min_runner_revision" {
                        row.insert(k.clone(), v.clone());
                    }
                }
            }
            rows.insert(id.to_string(), row);
        }
        Ok(rows)
    }

    /// `catalog(root)`: the tree's catalog, updated with `root/catalog.json` when it validates.
    pub fn catalog(&self, root: &Path) -> BTreeMap<String, serde_json::Map<String, Value>> {
        let base = read_json(&self.catalog_path, MAX_MANIFEST).expect("the tree's catalog");
        let mut rows = self
            .validate_manifest(&base)
            .expect("the tree's catalog validates");
        if let Some(live) = read_json(&root.join("catalog.json"), MAX_MANIFEST)
            && let Ok(live) = self.validate_manifest(&live)
        {
            rows.extend(live);
        }
        rows
    }

    /// `preferences(root)`.
    pub fn preferences(&self, root: &Path) -> Preferences {
        let by_id = self.by_id();
        let mut p = Preferences {
            small: BUNDLED.into(),
            big: BUNDLED.into(),
            user_favorites: Vec::new(),
            sort_mode: "name".into(),
            randomizer: false,
            blacklisted: Vec::new(),
        };
        let Some(saved) = read_json(&root.join("preferences.json"), 16384) else {
            return p;
        };
        for (key, big) in [("small", false), ("big", true)] {
            if let Some(id) = saved.get(key).and_then(Value::as_str)
                && (id == BUNDLED
                    || (big && id.is_empty())
                    || by_id.get(id).is_some_and(|k| id != BUNDLED && k.gpu == big))
            {
                if big {
                    p.big = id.into()
                } else {
                    p.small = id.into()
                }
            }
        }
        for (key, out) in [
            ("userFavorites", &mut p.user_favorites),
            ("blacklistedModels", &mut p.blacklisted),
        ] {
            if let Some(list) = saved.get(key).and_then(Value::as_array) {
                out.clear();
                for id in list.iter().filter_map(Value::as_str) {
                    if by_id.contains_key(id) && !out.iter().any(|o| o == id) {
                        out.push(id.into());
                    }
                }
            }
        }
        if let Some(Value::Bool(b)) = saved.get("randomizer") {
            p.randomizer = *b;
        }
        if let Some(m) = saved.get("sortMode").and_then(Value::as_str)
            && SORT_MODES.contains(&m)
        {
            p.sort_mode = m.into();
        }
        p
    }

    /// `artifact_path(id, root, variant)`.
    pub fn artifact_path(root: &Path, id: &str, amd: bool) -> PathBuf {
        let infix = if amd { "amd_" } else { "" };
        root.join(id)
            .join(format!("{id}_driving_{infix}tinygrad.pkl"))
    }

    /// `verified_artifact(id, entries, root)` (standard variant).
    pub fn verified_artifact(
        root: &Path,
        id: &str,
        entries: &BTreeMap<String, serde_json::Map<String, Value>>,
    ) -> Option<PathBuf> {
        let row = entries.get(id)?;
        let sha = row.get("artifact_sha256")?.as_str()?;
        let size = row.get("artifact_size")?.as_u64()?;
        let path = Self::artifact_path(root, id, false);
        let meta = fs::symlink_metadata(&path).ok()?;
        if meta.file_type().is_symlink() || !meta.is_file() || meta.len() != size {
            return None;
        }
        let digest = hex_lower(&Sha256::digest(fs::read(&path).ok()?));
        (digest == sha).then_some(path)
    }

    /// `resolve_runtime(chestnut_available, root)`: what modeld loads.
    pub fn resolve_runtime(&self, root: &Path, chestnut: bool) -> RuntimeSelection {
        let prefs = self.preferences(root);
        let entries = self.catalog(root);
        let mut small = prefs.small.clone();
        let small_path = if small != BUNDLED {
            Self::verified_artifact(root, &small, &entries)
        } else {
            None
        };
        if small_path.is_none() {
            small = BUNDLED.into();
        }
        let big = prefs.big.clone();
        let big_path = if !big.is_empty() && big != BUNDLED && chestnut {
            Self::verified_artifact(root, &big, &entries)
        } else {
            None
        };
        let small_sha = small_path.as_ref().map(|_| {
            entries[&small]["artifact_sha256"]
                .as_str()
                .unwrap()
                .to_string()
        });
        RuntimeSelection {
            small_id: small,
            small_path,
            small_sha,
            big_id: if big.is_empty() { BUNDLED.into() } else { big },
            big_path,
        }
    }

    /// `_read_job`: the job file when it is one upstream accepts.
    pub fn read_job(&self, root: &Path) -> Option<serde_json::Map<String, Value>> {
        let by_id = self.by_id();
        let job = read_json(&root.join(".download-job.json"), 16384)?;
        let id_ok = job.get("jobId").and_then(Value::as_str).is_some_and(|s| {
            s.len() == 32
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        let ok = job.get("schemaVersion") == Some(&Value::from(1))
            && id_ok
            && job
                .get("state")
                .and_then(Value::as_str)
                .is_some_and(|s| ["running", "completed", "failed", "interrupted"].contains(&s))
            && job
                .get("model")
                .and_then(Value::as_str)
                .is_some_and(|m| m.is_empty() || by_id.contains_key(m))
            && job.get("progress").is_some_and(Value::is_string)
            && job.get("downloadAll").is_some_and(Value::is_boolean)
            && job.get("cancelRequested").is_some_and(Value::is_boolean)
            && job
                .get("variant")
                .map_or(Some("standard"), Value::as_str)
                .is_some_and(|v| v == "standard" || v == "amd");
        ok.then_some(job)
    }

    /// `_job_status` as the UI snapshot reports it, without its rewrite: whether the
    /// download lock is held (`flock` tried without waiting on `.download.lock`), and the job's
    /// state as reported (a `running` job nobody holds the lock of reads `interrupted`).
    /// `None` when there is no job upstream accepts.
    pub fn job_status(&self, root: &Path) -> (bool, Option<String>) {
        let busy = fs::OpenOptions::new()
            .append(true)
            .open(root.join(".download.lock"))
            .is_ok_and(|f| matches!(f.try_lock(), Err(fs::TryLockError::WouldBlock)));
        let state = self.read_job(root).map(|j| {
            let s = j["state"].as_str().unwrap_or_default().to_string();
            if s == "running" && !busy {
                "interrupted".to_string()
            } else {
                s
            }
        });
        (busy, state)
    }
}

/// What `preferences` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preferences {
    pub small: String,
    pub big: String,
    pub user_favorites: Vec<String>,
    pub sort_mode: String,
    pub randomizer: bool,
    pub blacklisted: Vec<String>,
}

/// What `resolve_runtime` returns (the fields the tests compare).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeSelection {
    pub small_id: String,
    pub small_path: Option<PathBuf>,
    pub small_sha: Option<String>,
    pub big_id: String,
    pub big_path: Option<PathBuf>,
}

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Upstream's `atomic_json` bytes for a JSON value: keys sorted, `", "` / `": "`, no newline
/// (Python's `json.dump(..., ensure_ascii=False, sort_keys=True)`), written here by hand.
pub fn python_dump(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}: {}", Value::String(k.clone()), python_dump(&m[k])))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(python_dump).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
    }
}
