//! An independent checker of the v26 manifest schema, written from the contract's description
//! (docs/formats.md, "Generation contracts") with serde_json only, so that tests judge what we
//! publish by what a v26 device reads, not by our own validator.
//!
//! It answers like the device: the whole manifest is accepted (its rows, each with the runtime
//! variant a runner of revision 2 loads folded in) or refused with one reason.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

/// What the device's runtime is built for.
pub struct Runtime<'a> {
    pub generation: &'a str,
    pub compiler_revision: &'a str,
    pub artifact_abi: &'a str,
    /// The bundled model's id, never downloadable.
    pub bundled: &'a str,
    /// The reviewed catalog: id → (version, uses_external_gpu).
    pub catalog: BTreeMap<String, (String, bool)>,
}

const RUNNER_REVISION: i64 = 2;
const MAX_MANIFEST: usize = 2 * 1024 * 1024;
const MAX_ARTIFACT: i64 = 2 * 1024 * 1024 * 1024;

/// The reviewed catalog's rows (`{"models": [{"id", "version", "uses_external_gpu"?}, …]}`).
pub fn catalog_rows(bytes: &[u8]) -> BTreeMap<String, (String, bool)> {
    let doc: Value = serde_json::from_slice(bytes).expect("catalog is JSON");
    doc["models"]
        .as_array()
        .expect("catalog has models")
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_owned(),
                (
                    r["version"].as_str().unwrap().to_owned(),
                    r.get("uses_external_gpu").and_then(Value::as_bool) == Some(true),
                ),
            )
        })
        .collect()
}

fn truth(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

fn int(v: Option<&Value>) -> Option<i64> {
    v.and_then(Value::as_i64)
}

/// Accepts the whole manifest (its rows by id) or refuses it with a reason.
pub fn check_manifest(bytes: &[u8], rt: &Runtime<'_>) -> Result<BTreeMap<String, Value>, String> {
    if bytes.len() > MAX_MANIFEST {
        return Err("manifest too large".into());
    }
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let top = doc.as_object().ok_or("not an object")?;
    if top.get("generation").and_then(Value::as_str) != Some(rt.generation)
        || top.get("compiler_revision").and_then(Value::as_str) != Some(rt.compiler_revision)
        || top.get("artifact_abi").and_then(Value::as_str) != Some(rt.artifact_abi)
    {
        return Err("targets a different runtime".into());
    }
    let models = top
        .get("models")
        .and_then(Value::as_array)
        .ok_or("no models list")?;
    let mut rows = BTreeMap::new();
    for entry in models {
        let entry = entry.as_object().ok_or("entry not an object")?;
        let id = entry
            .get("id")
            .and_then(Value::as_str)
            .ok_or("id not a string")?;
        let Some((version, gpu)) = rt.catalog.get(id) else {
            return Err(format!("unknown model {id}"));
        };
        if id == rt.bundled || rows.contains_key(id) {
            return Err(format!("bundled or duplicate model {id}"));
        }
        if entry.get("version").and_then(Value::as_str) != Some(version.as_str())
            || truth(entry.get("uses_external_gpu")) != *gpu
        {
            return Err(format!("{id}: behaviour or hardware changed"));
        }
        let empty = Map::new();
        let variants = match entry.get("accelerator_artifacts") {
            None => &empty,
            Some(Value::Object(v)) => v,
            Some(_) => return Err(format!("{id}: accelerators not an object")),
        };
        if variants.keys().any(|k| k != "amd") {
            return Err(format!("{id}: unknown accelerator"));
        }
        if let Some(amd) = variants.get("amd") {
            let amd = amd.as_object().ok_or("amd not an object")?;
            if *gpu
                || entry.get("model_lab_eligible") != Some(&Value::Bool(true))
                || amd.get("execution_device").and_then(Value::as_str) != Some("AMD")
                || amd.get("compiler_revision").and_then(Value::as_str)
                    != Some(rt.compiler_revision)
            {
                return Err(format!("{id}: invalid amd variant"));
            }
        }
        let no_runtime = Vec::new();
        let runtime = match entry.get("runtime_artifacts") {
            None => &no_runtime,
            Some(Value::Array(a)) => a,
            Some(_) => return Err(format!("{id}: runtime artifacts not a list")),
        };
        let allowed: BTreeSet<&str> = [
            "min_runner_revision",
            "artifact_format",
            "artifact_sha256",
            "artifact_size",
            "artifact_chunk_count",
            "conversion_provenance",
            "validation",
        ]
        .into();
        let mut seen = BTreeSet::new();
        for r in runtime {
            let r = r.as_object().ok_or("runtime variant not an object")?;
            let rev = r.get("min_runner_revision");
            let is_int = rev.is_some_and(|v| v.is_i64() || v.is_u64());
            if r.keys().any(|k| !allowed.contains(k.as_str()))
                || [
                    "artifact_format",
                    "artifact_sha256",
                    "artifact_size",
                    "artifact_chunk_count",
                ]
                .iter()
                .any(|k| !r.contains_key(*k))
                || !is_int
                || int(rev).is_none_or(|n| n < 2)
                || !seen.insert(int(rev).unwrap_or(0))
            {
                return Err(format!("{id}: invalid runtime variant"));
            }
        }
        let mut artifacts: Vec<&Map<String, Value>> = vec![entry];
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
                .is_some_and(|s| s > 0 && s <= MAX_ARTIFACT);
            let chunks_ok = a
                .get("artifact_chunk_count")
                .filter(|v| v.is_i64() || v.is_u64())
                .and_then(Value::as_i64)
                .is_some_and(|c| (0..=99).contains(&c));
            let format_ok =
                a.get("artifact_format").and_then(Value::as_str) == Some(rt.artifact_abi);
            if !(sha_ok && size_ok && chunks_ok && format_ok) {
                return Err(format!("{id}: invalid artifact metadata"));
            }
        }
        let mut row = entry.clone();
        if let Some(best) = runtime
            .iter()
            .filter_map(Value::as_object)
            .filter(|r| int(r.get("min_runner_revision")).is_some_and(|n| n <= RUNNER_REVISION))
            .max_by_key(|r| int(r.get("min_runner_revision")))
        {
            for (k, v) in best {
                if k != "min_runner_revision" {
                    row.insert(k.clone(), v.clone());
                }
            }
        }
        rows.insert(id.to_owned(), Value::Object(row));
    }
    Ok(rows)
}

/// One row of a reviewed catalog fixture: id, name, version, uses_external_gpu,
/// model_lab_eligible.
pub type Row<'a> = (&'a str, &'a str, &'a str, bool, bool);

/// Writes what a tree of a v26-contract generation carries into the openpilot tree `dir`: the
/// catalog module `starpilot/models/catalog.py`, the reviewed `catalog-<generation>.json`
/// beside it (a manifest of the generation without artifacts) and `upstream-sync.json` naming
/// `revision` as the `tinygrad_repo` dependency's commit. Returns the catalog's bytes.
pub fn write_tree(
    dir: &std::path::Path,
    generation: &str,
    revision: &str,
    rows: &[Row<'_>],
) -> Vec<u8> {
    let models = dir.join("starpilot/models");
    std::fs::create_dir_all(&models).unwrap();
    // Upstream's catalog module states its generation as a constant (`GENERATION = "v26"`).
    std::fs::write(
        models.join("catalog.py"),
        format!(
            "# The reviewed model catalog of this tree (test fixture).\nGENERATION = \"{generation}\"\n"
        ),
    )
    .unwrap();
    let catalog = serde_json::json!({
        "generation": generation,
        "compiler_revision": revision,
        "artifact_abi": "tinygrad_single_v1_arena",
        "models": rows.iter().map(|(id, name, version, gpu, lab)| serde_json::json!({
            "id": id, "name": name, "version": version, "uses_external_gpu": gpu,
            "model_lab_eligible": lab,
        })).collect::<Vec<_>>(),
    });
    let bytes = serde_json::to_vec_pretty(&catalog).unwrap();
    std::fs::write(models.join(format!("catalog-{generation}.json")), &bytes).unwrap();
    std::fs::write(
        dir.join("upstream-sync.json"),
        serde_json::to_vec_pretty(&serde_json::json!({"dependencies": [
            {"path": "panda", "commit": "0".repeat(40)},
            {"path": "tinygrad_repo", "commit": revision},
        ]}))
        .unwrap(),
    )
    .unwrap();
    bytes
}
