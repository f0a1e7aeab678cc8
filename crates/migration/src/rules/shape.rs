//! The catalog params and the three JSON caches byte for byte as upstream's Python manager
//! (`update_model_params`) writes them for the same catalog, so that a run of either manager
//! after the other changes no byte (see `docs/device.md`, *Params and files*, and
//! `docs/integration.md`).
//!
//! Upstream reads every manifest field loosely (`str(x or default).strip()`, `int(x or 0)`,
//! `bool(x)`): the helpers here apply those conversions to JSON values, so an entry whose
//! fields are of the expected types gives exactly upstream's text. Upstream serialises each cache
//! with Python's default `json.dumps`: one line, `", "` between items and `": "` after keys,
//! keys in insertion order, non-ASCII and control characters as `\uXXXX`, no trailing newline
//! ([`dumps`]).
//!
//! Pure: values in, values and bytes out.

use std::io::{self, Write};

use serde_json::{Map, Value, json};

/// The only artifact format devices load; upstream's default for an entry without one.
pub const UNIFIED_FORMAT: &str = "tinygrad_single_v1";

/// Python's truth value of a JSON value (`None`, `False`, `0`, `""`, `[]`, `{}` are false).
pub fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// Python's `a or b` over optional JSON values.
pub fn or<'a>(a: Option<&'a Value>, b: Option<&'a Value>) -> Option<&'a Value> {
    if truthy(a) { a } else { b }
}

/// Python's `str(v)` of a truthy value (`True`, integers, strings as they are). Floats and
/// containers, which no manifest field of ours holds, are written as JSON.
fn py_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Null => "None".into(),
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(0.0);
            if f.fract() == 0.0 && f.abs() < 1e16 {
                format!("{f:.1}")
            } else {
                n.to_string()
            }
        }
        other => other.to_string(),
    }
}

/// Python's `str.strip()`: whitespace as `str.isspace` sees it.
pub fn strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// `str(v or default).strip()`.
pub fn text_or(v: Option<&Value>, default: &str) -> String {
    match v {
        Some(x) if truthy(Some(x)) => strip(&py_str(x)).to_string(),
        _ => strip(default).to_string(),
    }
}

/// `str(v or "").strip()`.
pub fn text(v: Option<&Value>) -> String {
    text_or(v, "")
}

/// `int(v or 0)` for the values a manifest holds (integers; a float is truncated; a decimal
/// string is parsed); anything else counts as 0.
pub fn int(v: Option<&Value>) -> i64 {
    match v {
        Some(x) if truthy(Some(x)) => match x {
            Value::Bool(true) => 1,
            Value::Number(n) => n
                .as_i64()
                .or_else(|| n.as_f64().map(|f| f.trunc() as i64))
                .unwrap_or(0),
            Value::String(s) => strip(s).parse().unwrap_or(0),
            _ => 0,
        },
        _ => 0,
    }
}

/// The emoji upstream strips from names: `🗺`, the variation selector, `👀`, `📡`.
const STRIPPED: [char; 4] = ['\u{1F5FA}', '\u{FE0F}', '\u{1F440}', '\u{1F4E1}'];

/// Upstream's name cleaning: `str(name or "")`, the emoji removed, stripped.
pub fn clean_name(v: Option<&Value>) -> String {
    let raw = match v {
        Some(x) if truthy(Some(x)) => py_str(x),
        _ => String::new(),
    };
    let kept: String = raw.chars().filter(|c| !STRIPPED.contains(c)).collect();
    strip(&kept).to_string()
}

/// Whether upstream keeps an artifact format (absent, empty or `tinygrad_single_v1`).
pub fn supported_format(format: &str) -> bool {
    format.is_empty() || format == UNIFIED_FORMAT
}

/// The model dict upstream synthesises for a discovered local model `key` from its sidecar
/// (`None`: no sidecar, or one that is not a JSON object), before `update_model_params` reads
/// it like any manifest entry.
pub fn local_model(key: &str, sidecar: Option<&Map<String, Value>>) -> Map<String, Value> {
    let empty = Map::new();
    let info = sidecar.unwrap_or(&empty);
    let fallback = strip(
        &key.strip_prefix(manifest::ModelId::LOCAL_PREFIX)
            .unwrap_or(key)
            .replace(['_', '-'], " "),
    )
    .to_string();
    let fallback = Value::String(fallback);
    let key_value = Value::String(key.to_string());
    // A sidecar name or series with a control character (newline, NUL) is refused: the id's
    // name, or the default series, stands in, so such a value never reaches
    // `AvailableModelNames` or `AvailableModelSeries`.
    let clean = |key: &str| {
        info.get(key)
            .filter(|n| !n.as_str().is_some_and(|t| t.chars().any(char::is_control)))
    };
    let given = clean("name");
    let name_src = or(or(given, Some(&fallback)), Some(&key_value));
    let gpu = truthy(info.get("uses_external_gpu"));
    object(json!({
        "id": key,
        "name": clean_name(name_src).replace(',', " "),
        "version": text(info.get("version")),
        "series": text_or(clean("series"), "Local Series").replace(',', " "),
        "released": text_or(info.get("released"), "2100-01-01"),
        "community_favorite": false,
        "artifact_format": UNIFIED_FORMAT,
        "uses_external_gpu": gpu,
        "model_size": text_or(info.get("model_size"), "small"),
        "model_lab_eligible": lab_eligible(info, gpu),
        "accelerator_artifacts": info.get("accelerator_artifacts").cloned().unwrap_or(json!({})),
    }))
}

/// `model_lab_eligible` as upstream reads it: the field's truth, else whether it is not a GPU
/// model.
fn lab_eligible(m: &Map<String, Value>, gpu: bool) -> bool {
    m.get("model_lab_eligible")
        .map_or(!gpu, |v| truthy(Some(v)))
}

/// The object `json!` built.
fn object(v: Value) -> Map<String, Value> {
    let Value::Object(m) = v else {
        unreachable!("json! of an object literal is an object")
    };
    m
}

/// The artifact fields upstream's caches carry, for a model or one of its accelerator builds.
fn artifact_fields(a: &Map<String, Value>, format: String) -> Map<String, Value> {
    object(json!({
        "artifact_format": format,
        "artifact_filename": text(a.get("artifact_filename")),
        "artifact_size": int(a.get("artifact_size")),
        "artifact_sha256": text(a.get("artifact_sha256")).to_lowercase(),
        "artifact_chunk_count": int(a.get("artifact_chunk_count")),
        "artifact_url": text(or(a.get("artifact_url"), a.get("download_url"))),
    }))
}

/// One model's values in the comma-joined params.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub id: String,
    pub name: String,
    pub series: String,
    pub format: String,
    pub released: String,
    pub version: String,
    pub favorite: bool,
}

/// What `update_model_params` lists for one model dict.
pub fn listed(m: &Map<String, Value>) -> Listed {
    Listed {
        id: text(m.get("id")),
        name: clean_name(m.get("name")),
        series: text_or(m.get("series"), "Custom Series"),
        format: text_or(m.get("artifact_format"), UNIFIED_FORMAT),
        released: text_or(m.get("released"), "2023-01-01"),
        version: text(m.get("version")),
        favorite: truthy(m.get("community_favorite")),
    }
}

pub(crate) const CANONICAL: [(&str, &str); 6] = [
    ("sc", "sc2"),
    ("napv1", "remove-avgpoolv1"),
    ("napv2", "remove-avgpoolv2"),
    ("napv3", "remove-avgpoolv3"),
    ("napv4", "remove-avgpoolv4"),
    ("rdf", "rdf43"),
];

/// Upstream's canonical map: `sc→sc2`, `napv1..4→remove-avgpoolv1..4`, `rdf→rdf43`.
pub fn canonical_id(id: &str) -> &str {
    CANONICAL
        .iter()
        .find(|(from, _)| *from == id)
        .map_or(id, |(_, to)| to)
}

/// The three cache files' names (`caches` writes them in this order).
pub const VERSIONS_CACHE: &str = ".model_versions.json";
pub const ARTIFACTS_CACHE: &str = ".model_artifacts.json";
pub const URLS_CACHE: &str = ".model_artifact_urls.json";

/// The cache key of a model dict: its id, canonical (`sc`→`sc2`, …).
fn cache_key(m: &Map<String, Value>) -> String {
    canonical_id(&text(m.get("id"))).to_string()
}

/// The normalised `accelerator_artifacts` of a model dict: each variant (name lower-cased)
/// that is an object in a supported format, with its fields in upstream's order.
fn accelerators(m: &Map<String, Value>) -> Value {
    let mut out = Map::new();
    if let Some(Value::Object(raw)) = m.get("accelerator_artifacts") {
        for (name, v) in raw {
            let name = strip(name).to_lowercase();
            let Some(a) = v.as_object() else { continue };
            if name.is_empty() {
                continue;
            }
            let format = text_or(a.get("artifact_format"), UNIFIED_FORMAT);
            if !supported_format(&format) {
                continue;
            }
            let mut o = artifact_fields(a, format);
            let device = text(or(a.get("execution_device"), a.get("device")));
            o.insert("execution_device".into(), device.to_uppercase().into());
            out.insert(name, Value::Object(o));
        }
    }
    Value::Object(out)
}

/// `.model_artifacts.json`'s object for one model dict (`None`: upstream leaves it out).
pub fn artifacts_entry(m: &Map<String, Value>) -> Option<(String, Map<String, Value>)> {
    let key = cache_key(m);
    let format = text_or(m.get("artifact_format"), UNIFIED_FORMAT);
    if key.is_empty() || !supported_format(&format) {
        return None;
    }
    let gpu = truthy(m.get("uses_external_gpu"));
    let size_src = or(m.get("model_size"), m.get("size_class"));
    let mut o = artifact_fields(m, format);
    o.extend(object(json!({
        "uses_external_gpu": gpu,
        "model_size": text_or(size_src, if gpu { "chestnut" } else { "small" }),
        "model_size_declared": truthy(size_src),
        "model_lab_eligible": lab_eligible(m, gpu),
        "accelerator_artifacts": accelerators(m),
    })));
    Some((key, o))
}

/// `.model_artifact_urls.json`'s object for one model dict (`None`: no URL, or left out): the
/// explicit map (`artifact_urls`, else `download_urls`), then the base URL joined with the
/// artifact's logical name, then the direct URL for that name.
pub fn urls_entry(m: &Map<String, Value>) -> Option<(String, Map<String, Value>)> {
    let key = cache_key(m);
    let format = text(m.get("artifact_format"));
    if key.is_empty() || !supported_format(&format) {
        return None;
    }
    let file = format!("{key}_driving_tinygrad.pkl");
    let mut urls = Map::new();
    if let Some(Value::Object(explicit)) = or(m.get("artifact_urls"), m.get("download_urls")) {
        for (name, url) in explicit {
            if !name.is_empty() && truthy(Some(url)) {
                urls.insert(strip(name).to_string(), text(Some(url)).into());
            }
        }
    }
    let base = text(or(m.get("artifact_base_url"), m.get("download_base_url")));
    if !base.is_empty() {
        let base = base.trim_end_matches('/');
        urls.entry(file.clone())
            .or_insert_with(|| format!("{base}/{file}").into());
    }
    let direct = text(or(m.get("artifact_url"), m.get("download_url")));
    if !direct.is_empty() {
        urls.entry(file).or_insert_with(|| direct.into());
    }
    (!urls.is_empty()).then_some((key, urls))
}

/// The comma-joined params for these model dicts, in upstream's write order.
pub fn params(models: &[Map<String, Value>]) -> Vec<(&'static str, String)> {
    use crate::state::params::keys;
    let rows: Vec<Listed> = models.iter().map(listed).collect();
    let join = |f: &dyn Fn(&Listed) -> &str| rows.iter().map(f).collect::<Vec<_>>().join(",");
    vec![
        (keys::AVAILABLE_MODELS, join(&|r| &r.id)),
        (keys::AVAILABLE_MODEL_NAMES, join(&|r| &r.name)),
        (keys::AVAILABLE_MODEL_SERIES, join(&|r| &r.series)),
        (keys::AVAILABLE_MODEL_ARTIFACT_FORMATS, join(&|r| &r.format)),
        (keys::MODEL_RELEASED_DATES, join(&|r| &r.released)),
        (keys::MODEL_VERSIONS, join(&|r| &r.version)),
        (
            keys::COMMUNITY_FAVORITES,
            rows.iter()
                .filter(|r| r.favorite)
                .map(|r| r.id.as_str())
                .collect::<Vec<_>>()
                .join(","),
        ),
    ]
}

/// The three caches for these model dicts: `(file name, JSON body)`, in upstream's write order
/// (`.model_versions.json`, `.model_artifact_urls.json`, `.model_artifacts.json`).
pub fn caches(models: &[Map<String, Value>]) -> Vec<(&'static str, Value)> {
    let mut versions = Map::new();
    let mut urls = Map::new();
    let mut artifacts = Map::new();
    for m in models {
        let l = listed(m);
        versions.insert(l.id, l.version.into());
        if let Some((k, u)) = urls_entry(m) {
            urls.insert(k, Value::Object(u));
        }
        if let Some((k, a)) = artifacts_entry(m) {
            artifacts.insert(k, Value::Object(a));
        }
    }
    vec![
        (VERSIONS_CACHE, Value::Object(versions)),
        (URLS_CACHE, Value::Object(urls)),
        (ARTIFACTS_CACHE, Value::Object(artifacts)),
    ]
}

/// Python's default `json.dumps(v)`: `", "` and `": "` separators, keys in order, every
/// character outside printable ASCII escaped as `\uXXXX` (surrogate pairs above the BMP), no
/// trailing newline.
pub fn dumps(v: &Value) -> String {
    use serde::Serialize;
    let mut out = Vec::new();
    (v.serialize(&mut serde_json::Serializer::with_formatter(
        &mut out, PyDumps,
    )))
    .expect("serializing into memory does not fail");
    String::from_utf8(out).expect("every byte written is ASCII")
}

/// [`dumps`]'s layout: `", "` and `": "`, and every character outside printable ASCII as
/// `\uXXXX` (serde_json escapes `"`, `\\` and the control characters as Python does).
struct PyDumps;

impl serde_json::ser::Formatter for PyDumps {
    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
    fn write_string_fragment<W: ?Sized + Write>(&mut self, w: &mut W, s: &str) -> io::Result<()> {
        for c in s.chars() {
            match c {
                ' '..='~' => w.write_all(&[c as u8])?,
                _ => {
                    for u in c.encode_utf16(&mut [0; 2]) {
                        write!(w, "\\u{u:04x}")?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dumps_is_pythons_default_layout() {
        let v = json!({"b": {"x": [1, true, null], "y": ""}, "a": "é\u{1F440}\"\\\n\u{7f}/"});
        assert_eq!(
            dumps(&v),
            r#"{"b": {"x": [1, true, null], "y": ""}, "a": "\u00e9\ud83d\udc40\"\\\n\u007f/"}"#
        );
        assert_eq!(dumps(&json!({})), "{}");
    }

    #[test]
    fn loose_reads_follow_python() {
        for (v, want) in [
            (json!(null), ""),
            (json!(false), ""),
            (json!(0), ""),
            (json!(""), ""),
            (json!("  v16 "), "v16"),
            (json!(16), "16"),
            (json!(true), "True"),
            (json!(2.0), "2.0"),
        ] {
            assert_eq!(text(Some(&v)), want, "{v}");
        }
        assert_eq!(text_or(None, "Custom Series"), "Custom Series");
        assert_eq!(text_or(Some(&json!("")), "Custom Series"), "Custom Series");
        for (v, want) in [
            (json!(12), 12),
            (json!("12"), 12),
            (json!(2.9), 2),
            (json!(null), 0),
            (json!("x"), 0),
        ] {
            assert_eq!(int(Some(&v)), want, "{v}");
        }
        assert_eq!(clean_name(Some(&json!(" TR14 👀📡 "))), "TR14".to_string());
        assert_eq!(clean_name(Some(&json!("🗺️Map"))), "Map");
        assert_eq!(clean_name(None), "");
    }

    #[test]
    fn a_local_model_is_listed_as_upstream_synthesises_it() {
        let side = json!({"name": "Mine, tuned", "version": "v16", "model_size": "big"});
        let m = local_model("local-my_model", side.as_object());
        let (k, a) = artifacts_entry(&m).unwrap();
        assert_eq!(k, "local-my_model");
        assert_eq!(
            dumps(&Value::Object(a)),
            r#"{"artifact_format": "tinygrad_single_v1", "artifact_filename": "", "artifact_size": 0, "artifact_sha256": "", "artifact_chunk_count": 0, "artifact_url": "", "uses_external_gpu": false, "model_size": "big", "model_size_declared": true, "model_lab_eligible": true, "accelerator_artifacts": {}}"#
        );
        let l = listed(&m);
        assert_eq!(
            (l.name.as_str(), l.series.as_str(), l.released.as_str()),
            ("Mine  tuned", "Local Series", "2100-01-01")
        );
        let bare = local_model("local-bare_one-x", None);
        assert_eq!(listed(&bare).name, "bare one x");
        assert_eq!(artifacts_entry(&bare).unwrap().1["model_size"], "small");
        assert_eq!(
            artifacts_entry(&bare).unwrap().1["model_size_declared"],
            true
        );
        assert!(urls_entry(&bare).is_none());
    }

    /// A series (or artifact format) with a control character is refused per entry, like a
    /// name: the tolerant read leaves that entry out with its reason, and a local model's sidecar
    /// series with one gives way to the default. No control character reaches
    /// `AvailableModelSeries` (or any catalog param). For v25 and a made-up v26.
    #[test]
    fn series_with_control_characters_never_reach_the_series_list() {
        use crate::rules::contract::{Catalog, LocalModel};
        use crate::state::params::keys;
        for generation in ["v25", "v26"] {
            let body = serde_json::to_vec(&json!({"generation": generation, "models": [
                {"id": "pop223", "name": "Pop", "version": "v16", "series": "Pop Series"},
                {"id": "nl1", "name": "NL", "version": "v16", "series": "New\nLine"},
                {"id": "nul1", "name": "NUL", "version": "v16", "series": "Nul\u{0}"},
                {"id": "esc1", "name": "ESC", "version": "v16", "artifact_format": "x\u{1b}"},
                {"id": "sc2", "name": "SC2", "version": "v9"},
            ]}))
            .unwrap();
            let read = manifest::Manifest::from_slice_tolerant(&body, &manifest::Limits::default())
                .unwrap();
            let refused: Vec<(usize, Option<&str>)> = read
                .refused
                .iter()
                .map(|r| (r.index, r.id.as_deref()))
                .collect();
            assert_eq!(
                refused,
                [(1, Some("nl1")), (2, Some("nul1")), (3, Some("esc1"))],
                "{generation}"
            );
            assert!(
                read.refused
                    .iter()
                    .all(|r| r.reason().contains("control characters")),
                "{generation}"
            );
            let local = LocalModel {
                id: "local-bad_series".parse().unwrap(),
                sidecar: Some(
                    json!({"name": "Bad", "series": "Tab\tbed"})
                        .as_object()
                        .unwrap()
                        .clone(),
                ),
            };
            let params = Catalog::new(&read.manifest, &[local]).params();
            let series = &params
                .iter()
                .find(|(k, _)| *k == keys::AVAILABLE_MODEL_SERIES)
                .unwrap()
                .1;
            assert_eq!(
                series, "Pop Series,Custom Series,Local Series",
                "{generation}"
            );
            for (key, value) in &params {
                assert!(
                    !value.chars().any(char::is_control),
                    "{generation} {key}: {value:?}"
                );
            }
        }
    }
}
