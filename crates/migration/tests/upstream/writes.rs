//! What StarPilot's Python manager writes in `update_model_params`, written from the description
//! of it (`docs/device.md`, *Params and files*; the reference notes on the Python manager: its
//! catalog lists, its three caches, local-model discovery, `json.dumps` with default settings)
//! and NOT from the `migration` crate: it uses none of its code. Given the manifest's model list
//! as served and the names in `/data/models` (with the local sidecars), it answers the exact
//! bytes of every catalog param and cache file.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// Truth as Python sees it.
fn truth(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        _ => false,
    }
}

/// `str(v or fallback).strip()` for the value kinds a test manifest holds.
fn s(v: Option<&Value>, fallback: &str) -> String {
    let raw = if truth(v) {
        match v.unwrap() {
            Value::String(x) => x.clone(),
            Value::Bool(_) => "True".to_string(),
            other => other.to_string(),
        }
    } else {
        fallback.to_string()
    };
    raw.trim().to_string()
}

fn first<'a>(a: Option<&'a Value>, b: Option<&'a Value>) -> Option<&'a Value> {
    if truth(a) { a } else { b }
}

fn n(v: Option<&Value>) -> u64 {
    if truth(v) {
        v.and_then(Value::as_u64).unwrap_or(0)
    } else {
        0
    }
}

/// `_clean_model_name`: the characters of `[🗺️👀📡]` removed, then stripped.
fn cleaned(v: Option<&Value>) -> String {
    s(v, "")
        .chars()
        .filter(|c| !matches!(*c, '🗺' | '\u{fe0f}' | '👀' | '📡'))
        .collect::<String>()
        .trim()
        .to_string()
}

fn canonical(id: &str) -> String {
    match id {
        "sc" => "sc2".into(),
        "rdf" => "rdf43".into(),
        x if x.starts_with("napv") && ["1", "2", "3", "4"].contains(&&x[4..]) => {
            format!("remove-avgpoolv{}", &x[4..])
        }
        x => x.into(),
    }
}

const FORMAT: &str = "tinygrad_single_v1";

/// `_discover_local_models`: `local-*_driving_*` names sorted, one dict per key (first file
/// wins), keys with a comma skipped, the sidecar `<key>.json` read when it is an object.
pub fn locals(names: &[String], sidecars: &BTreeMap<String, Value>) -> Vec<Map<String, Value>> {
    let mut sorted: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("local-") && n.contains("_driving_"))
        .collect();
    sorted.sort();
    let mut seen: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for name in sorted {
        let key = name.split("_driving_").next().unwrap().to_string();
        if key.contains(',') || seen.contains(&key) {
            continue;
        }
        seen.push(key.clone());
        let info = sidecars
            .get(&key)
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let fallback = key["local-".len()..]
            .replace(['_', '-'], " ")
            .trim()
            .to_string();
        let name_v = if truth(info.get("name")) {
            info["name"].clone()
        } else if !fallback.is_empty() {
            Value::String(fallback)
        } else {
            Value::String(key.clone())
        };
        let gpu = truth(info.get("uses_external_gpu"));
        let mut m = Map::new();
        m.insert("id".into(), key.clone().into());
        m.insert(
            "name".into(),
            cleaned(Some(&name_v)).replace(',', " ").into(),
        );
        m.insert("version".into(), s(info.get("version"), "").into());
        m.insert(
            "series".into(),
            s(info.get("series"), "Local Series")
                .replace(',', " ")
                .into(),
        );
        m.insert(
            "released".into(),
            s(info.get("released"), "2100-01-01").into(),
        );
        m.insert("community_favorite".into(), false.into());
        m.insert("artifact_format".into(), FORMAT.into());
        m.insert("uses_external_gpu".into(), gpu.into());
        m.insert(
            "model_size".into(),
            s(info.get("model_size"), "small").into(),
        );
        let lab = match info.get("model_lab_eligible") {
            None => !gpu,
            v => truth(v),
        };
        m.insert("model_lab_eligible".into(), lab.into());
        m.insert(
            "accelerator_artifacts".into(),
            info.get("accelerator_artifacts")
                .cloned()
                .unwrap_or(Value::Object(Map::new())),
        );
        out.push(m);
    }
    out
}

/// The bytes `update_model_params` writes for `manifest_models` (the manifest's `models`, after
/// upstream's format filter) plus the discovered local models: `(param or file name, bytes)`,
/// params first (`AvailableModels` … `CommunityFavorites`), then the three caches.
pub fn update_model_params(
    manifest_models: &[Value],
    local_models: Vec<Map<String, Value>>,
) -> Vec<(String, Vec<u8>)> {
    let mut models: Vec<Map<String, Value>> = manifest_models
        .iter()
        .filter_map(|m| m.as_object().cloned())
        .filter(|m| {
            let f = m
                .get("artifact_format")
                .and_then(Value::as_str)
                .unwrap_or("");
            f.is_empty() || f == FORMAT
        })
        .collect();
    models.extend(local_models);

    let column = |f: &dyn Fn(&Map<String, Value>) -> String| -> String {
        models.iter().map(f).collect::<Vec<_>>().join(",")
    };
    let mut out: Vec<(String, Vec<u8>)> = vec![
        ("AvailableModels", column(&|m| s(m.get("id"), ""))),
        ("AvailableModelNames", column(&|m| cleaned(m.get("name")))),
        (
            "AvailableModelSeries",
            column(&|m| s(m.get("series"), "Custom Series")),
        ),
        (
            "AvailableModelArtifactFormats",
            column(&|m| s(m.get("artifact_format"), FORMAT)),
        ),
        (
            "ModelReleasedDates",
            column(&|m| s(m.get("released"), "2023-01-01")),
        ),
        ("ModelVersions", column(&|m| s(m.get("version"), ""))),
        (
            "CommunityFavorites",
            models
                .iter()
                .filter(|m| truth(m.get("community_favorite")))
                .map(|m| s(m.get("id"), ""))
                .collect::<Vec<_>>()
                .join(","),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_bytes()))
    .collect();

    // .model_versions.json: {id: version} over the zipped lists.
    let mut versions: Vec<(String, Value)> = Vec::new();
    for m in &models {
        let id = s(m.get("id"), "");
        let v = Value::String(s(m.get("version"), ""));
        match versions.iter_mut().find(|(k, _)| *k == id) {
            Some(slot) => slot.1 = v,
            None => versions.push((id, v)),
        }
    }

    // .model_artifact_urls.json
    let mut urls: Vec<(String, Value)> = Vec::new();
    for m in &models {
        let key = canonical(&s(m.get("id"), ""));
        let format = s(m.get("artifact_format"), "");
        if key.is_empty() || !(format.is_empty() || format == FORMAT) {
            continue;
        }
        let required = format!("{key}_driving_tinygrad.pkl");
        let mut map: Vec<(String, Value)> = Vec::new();
        let set_default = |map: &mut Vec<(String, Value)>, k: String, v: String| {
            if !map.iter().any(|(x, _)| *x == k) {
                map.push((k, Value::String(v)));
            }
        };
        if let Some(Value::Object(explicit)) = first(m.get("artifact_urls"), m.get("download_urls"))
        {
            for (file, url) in explicit {
                if !file.is_empty() && truth(Some(url)) {
                    let (k, v) = (file.trim().to_string(), s(Some(url), ""));
                    match map.iter_mut().find(|(x, _)| *x == k) {
                        Some(slot) => slot.1 = Value::String(v),
                        None => map.push((k, Value::String(v))),
                    }
                }
            }
        }
        let base = s(
            first(m.get("artifact_base_url"), m.get("download_base_url")),
            "",
        );
        if !base.is_empty() {
            let base = base.trim_end_matches('/').to_string();
            set_default(&mut map, required.clone(), format!("{base}/{required}"));
        }
        let direct = s(first(m.get("artifact_url"), m.get("download_url")), "");
        if !direct.is_empty() {
            set_default(&mut map, required.clone(), direct);
        }
        if !map.is_empty() {
            urls.retain(|(k, _)| *k != key);
            urls.push((key, Value::Object(map.into_iter().collect())));
        }
    }

    // .model_artifacts.json
    let mut artifacts: Vec<(String, Value)> = Vec::new();
    for m in &models {
        let key = canonical(&s(m.get("id"), ""));
        let format = s(m.get("artifact_format"), FORMAT);
        if key.is_empty() || format != FORMAT {
            continue;
        }
        let gpu = truth(m.get("uses_external_gpu"));
        let size_class = first(m.get("model_size"), m.get("size_class"));
        let mut acc = Map::new();
        if let Some(Value::Object(raw)) = m.get("accelerator_artifacts") {
            for (name, a) in raw {
                let name = name.trim().to_lowercase();
                let Some(a) = a.as_object() else { continue };
                let af = s(a.get("artifact_format"), FORMAT);
                if name.is_empty() || af != FORMAT {
                    continue;
                }
                let mut o = Map::new();
                o.insert("artifact_format".into(), af.into());
                o.insert(
                    "artifact_filename".into(),
                    s(a.get("artifact_filename"), "").into(),
                );
                o.insert("artifact_size".into(), n(a.get("artifact_size")).into());
                o.insert(
                    "artifact_sha256".into(),
                    s(a.get("artifact_sha256"), "").to_lowercase().into(),
                );
                o.insert(
                    "artifact_chunk_count".into(),
                    n(a.get("artifact_chunk_count")).into(),
                );
                o.insert(
                    "artifact_url".into(),
                    s(first(a.get("artifact_url"), a.get("download_url")), "").into(),
                );
                o.insert(
                    "execution_device".into(),
                    s(first(a.get("execution_device"), a.get("device")), "")
                        .to_uppercase()
                        .into(),
                );
                acc.insert(name, Value::Object(o));
            }
        }
        let mut o = Map::new();
        o.insert("artifact_format".into(), format.into());
        o.insert(
            "artifact_filename".into(),
            s(m.get("artifact_filename"), "").into(),
        );
        o.insert("artifact_size".into(), n(m.get("artifact_size")).into());
        o.insert(
            "artifact_sha256".into(),
            s(m.get("artifact_sha256"), "").to_lowercase().into(),
        );
        o.insert(
            "artifact_chunk_count".into(),
            n(m.get("artifact_chunk_count")).into(),
        );
        o.insert(
            "artifact_url".into(),
            s(first(m.get("artifact_url"), m.get("download_url")), "").into(),
        );
        o.insert("uses_external_gpu".into(), gpu.into());
        o.insert(
            "model_size".into(),
            s(size_class, if gpu { "chestnut" } else { "small" }).into(),
        );
        o.insert("model_size_declared".into(), truth(size_class).into());
        let lab = match m.get("model_lab_eligible") {
            None => !gpu,
            v => truth(v),
        };
        o.insert("model_lab_eligible".into(), lab.into());
        o.insert("accelerator_artifacts".into(), Value::Object(acc));
        match artifacts.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = Value::Object(o),
            None => artifacts.push((key, Value::Object(o))),
        }
    }

    for (file, entries) in [
        (".model_versions.json", versions),
        (".model_artifact_urls.json", urls),
        (".model_artifacts.json", artifacts),
    ] {
        let obj = Value::Object(entries.into_iter().collect());
        out.push((file.to_string(), python_dumps(&obj).into_bytes()));
    }
    out
}

/// `json.dumps(value)` with Python's defaults (`ensure_ascii=True`, separators `", "` and
/// `": "`, no indent, no newline).
pub fn python_dumps(v: &Value) -> String {
    match v {
        Value::Object(o) => {
            let items: Vec<String> = o
                .iter()
                .map(|(k, x)| format!("{}: {}", quoted(k), python_dumps(x)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(python_dumps).collect();
            format!("[{}]", items.join(", "))
        }
        Value::String(x) => quoted(x),
        other => other.to_string(),
    }
}

fn quoted(x: &str) -> String {
    let mut q = String::from("\"");
    for c in x.chars() {
        let code = c as u32;
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\r' => q.push_str("\\r"),
            '\t' => q.push_str("\\t"),
            '\u{08}' => q.push_str("\\b"),
            '\u{0c}' => q.push_str("\\f"),
            _ if (0x20..0x7f).contains(&code) => q.push(c),
            _ if code > 0xffff => {
                let v = code - 0x10000;
                q.push_str(&format!(
                    "\\u{:04x}\\u{:04x}",
                    0xd800 + (v >> 10),
                    0xdc00 + (v & 0x3ff)
                ));
            }
            _ => q.push_str(&format!("\\u{code:04x}")),
        }
    }
    q.push('"');
    q
}
