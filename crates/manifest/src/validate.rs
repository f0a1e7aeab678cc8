//! Validation: every problem of a manifest, each with its JSON path.
//!
//! There are three levels ([`ValidationMode`]); each includes the one before:
//!
//! - **Reader** — what every reader enforces and what [`crate::Manifest`] guarantees once parsed:
//!   the document shape (an object with a `models` array, or a bare array); every entry an
//!   object with a valid, unique `id`; and every *known* field that is present well-formed
//!   (types, `vN`, `YYYY-MM-DD`, digests, `(0, 2 GiB]` sizes, `0..=99` chunk counts, bare file
//!   names, names without commas, our extension fields). Fields may be missing, and an
//!   unsupported `artifact_format` is kept, because the Python fleet accepts both (it drops
//!   such an entry instead of failing): the downloader filters with
//!   [`crate::ModelEntry::is_supported`].
//! - **Catalog** — a complete catalog as the Python tools write one, with or without artifacts
//!   (the v25 catalog fixture passes): at least one model; `id`, `name`, `version`, `series`,
//!   `released`, `community_favorite` in every entry; `artifact_format` absent, `""` or
//!   `tinygrad_single_v1`; `model_size` `small`/`chestnut`; `artifact_size` and
//!   `artifact_sha256` together (also in each `accelerator_artifacts` variant);
//!   `artifact_chunk_sha256` only with `artifact_chunk_count`, one digest per chunk;
//!   `artifact_url` an http(s) URL.
//! - **Release** — what we publish: additionally, no `local-` model (local builds never leave
//!   their device) and every entry downloadable: `artifact_format` exactly `tinygrad_single_v1`
//!   plus `artifact_size`, `artifact_sha256` and `artifact_chunk_count`. A count of 0 (one plain
//!   file) is allowed because entries published earlier by the Python tools may use it; our
//!   own builds always publish chunk sets.
//!
//! The 2 MiB size limit applies at every level and is checked before parsing.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::Limits;
use crate::error::Error;
pub use crate::error::Problem;
pub(crate) use crate::error::abbreviate;

mod by_contract;
use crate::keys;
use crate::types::{
    ArtifactFormat, ArtifactSize, BehaviorVersion, ChunkCount, FileName, Generation, GitCommit,
    ModelId, ModelName, ReleaseDate,
};
pub use by_contract::{Expectation, runtime_artifact, validate_for_contract};

/// How much validation demands; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValidationMode {
    /// What every reader enforces; what a parsed [`crate::Manifest`] guarantees.
    Reader,
    /// A complete catalog as the Python tools write one, with or without artifacts.
    Catalog,
    /// What we publish: every entry downloadable, no `local-` model.
    Release,
}

/// Validates raw manifest bytes: size limit first, then JSON, then every rule of `mode`.
/// Returns every problem found; empty means valid.
pub fn validate_bytes(bytes: &[u8], mode: ValidationMode, limits: &Limits) -> Vec<Problem> {
    if bytes.len() as u64 > limits.max_manifest_bytes {
        return vec![Problem {
            path: ROOT.into(),
            message: format!(
                "manifest is {} bytes, more than the limit of {} bytes",
                bytes.len(),
                limits.max_manifest_bytes
            ),
        }];
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(doc) => check_document(&doc, mode),
        Err(e) => vec![Problem {
            path: ROOT.into(),
            message: format!("not valid JSON: {e}"),
        }],
    }
}

pub(crate) const ROOT: &str = "$";

pub(crate) fn join_key(parent: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    match (parent.is_empty() || parent == ROOT, plain) {
        (true, true) => key.to_owned(),
        (true, false) => format!("[{key:?}]"),
        (false, true) => format!("{parent}.{key}"),
        (false, false) => format!("{parent}[{key:?}]"),
    }
}

pub(crate) fn entry_path(index: usize) -> String {
    format!("{}[{index}]", keys::MODELS)
}

struct Sink<'a>(&'a mut Vec<Problem>);

impl Sink<'_> {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            path: path.into(),
            message: message.into(),
        });
    }
}

fn kind_of(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {:?}", abbreviate(s)),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// The reason of a newtype parse error, with the offending value.
fn reason(err: Error) -> String {
    match err {
        Error::InvalidValue { value, reason, .. } => format!("{reason} (got {value:?})"),
        other => other.to_string(),
    }
}

fn expect_str(v: &Value) -> Result<&str, String> {
    v.as_str()
        .ok_or_else(|| format!("expected a string, found {}", kind_of(v)))
}

fn expect_bool(v: &Value) -> Result<(), String> {
    v.as_bool()
        .map(drop)
        .ok_or_else(|| format!("expected true or false, found {}", kind_of(v)))
}

fn expect_uint(v: &Value) -> Result<u64, String> {
    v.as_u64()
        .ok_or_else(|| format!("expected a non-negative integer, found {}", kind_of(v)))
}

/// A string that parses as `T`.
fn parsed<T: std::str::FromStr<Err = Error>>(v: &Value) -> Result<(), String> {
    expect_str(v)?.parse::<T>().map(drop).map_err(reason)
}

/// Reader-level check of one scalar field, shared by entries and `accelerator_artifacts`
/// variants. Unknown keys are not ours to judge.
fn check_scalar(key: &str, v: &Value) -> Result<(), String> {
    match key {
        keys::ID => parsed::<ModelId>(v),
        keys::NAME => parsed::<ModelName>(v),
        keys::VERSION => parsed::<BehaviorVersion>(v),
        keys::RELEASED => parsed::<ReleaseDate>(v),
        // Listed in the device's comma-joined catalog params (`AvailableModelSeries`,
        // `AvailableModelArtifactFormats`) like the name: a newline or NUL would break them.
        keys::SERIES | keys::ARTIFACT_FORMAT => {
            let text = expect_str(v)?;
            match text.chars().any(char::is_control) {
                true => Err("must not contain control characters".into()),
                false => Ok(()),
            }
        }
        keys::MODEL_SIZE | keys::ARTIFACT_URL | keys::EXECUTION_DEVICE => expect_str(v).map(drop),
        keys::COMMUNITY_FAVORITE | keys::USES_EXTERNAL_GPU | keys::MODEL_LAB_ELIGIBLE => {
            expect_bool(v)
        }
        keys::ARTIFACT_SIZE => ArtifactSize::new(expect_uint(v)?).map(drop).map_err(reason),
        keys::ARTIFACT_CHUNK_COUNT => ChunkCount::new(expect_uint(v)?).map(drop).map_err(reason),
        keys::ARTIFACT_SHA256 => check_digest(v),
        keys::ARTIFACT_FILENAME => parsed::<FileName>(v),
        keys::SOURCE_COMMIT => parsed::<GitCommit>(v),
        _ => Ok(()),
    }
}

fn check_digest(v: &Value) -> Result<(), String> {
    let s = expect_str(v)?;
    s.parse::<crate::Sha256Digest>()
        .map(drop)
        .map_err(|_| format!("not 64 lowercase hex digits (got {:?})", abbreviate(s)))
}

/// Reader-level check of every known field of one entry (but not its `id`'s uniqueness).
pub(crate) fn check_entry_reader(map: &Map<String, Value>, path: &str, out: &mut Vec<Problem>) {
    let mut sink = Sink(out);
    if !map.contains_key(keys::ID) {
        sink.push(join_key(path, keys::ID), "missing; every entry needs an id");
    }
    for (key, v) in map {
        let here = join_key(path, key);
        match key.as_str() {
            keys::ACCELERATOR_ARTIFACTS => check_accelerators_reader(v, &here, &mut sink),
            keys::ARTIFACT_CHUNK_SHA256 => match v {
                Value::Array(items) => {
                    if items.len() > ChunkCount::MAX as usize {
                        sink.push(&here, "more than 99 chunk digests");
                    }
                    for (i, item) in items.iter().enumerate() {
                        if let Err(m) = check_digest(item) {
                            sink.push(format!("{here}[{i}]"), m);
                        }
                    }
                }
                other => sink.push(
                    here,
                    format!("expected an array of digests, found {}", kind_of(other)),
                ),
            },
            _ => {
                if let Err(m) = check_scalar(key, v) {
                    sink.push(here, m);
                }
            }
        }
    }
}

fn check_accelerators_reader(v: &Value, path: &str, sink: &mut Sink<'_>) {
    let Some(variants) = v.as_object() else {
        sink.push(path, format!("expected an object, found {}", kind_of(v)));
        return;
    };
    for (name, variant) in variants {
        let vpath = join_key(path, name);
        let Some(fields) = variant.as_object() else {
            sink.push(
                vpath,
                format!("expected an object, found {}", kind_of(variant)),
            );
            continue;
        };
        for (key, fv) in fields {
            if let Err(m) = check_scalar(key, fv) {
                sink.push(join_key(&vpath, key), m);
            }
        }
    }
}

fn check_top_reader(top: &Map<String, Value>, out: &mut Vec<Problem>) {
    let mut sink = Sink(out);
    for (key, v) in top {
        let r = match key.as_str() {
            keys::GENERATION => parsed::<Generation>(v),
            keys::TINYGRAD_COMMIT => parsed::<GitCommit>(v),
            _ => Ok(()),
        };
        if let Err(m) = r {
            sink.push(join_key(ROOT, key), m);
        }
    }
}

/// A document split into its top-level object (absent for a bare array) and its entries.
type Parts<'a> = (Option<&'a Map<String, Value>>, &'a [Value]);

/// The entries of a document, or a problem explaining why there are none.
fn entries_of(doc: &Value) -> Result<Parts<'_>, Problem> {
    let bad = |message: String| Problem {
        path: ROOT.into(),
        message,
    };
    match doc {
        Value::Array(items) => Ok((None, items)),
        Value::Object(top) => match top.get(keys::MODELS) {
            Some(Value::Array(items)) => Ok((Some(top), items)),
            Some(other) => Err(Problem {
                path: keys::MODELS.into(),
                message: format!(
                    "expected an array of model entries, found {}",
                    kind_of(other)
                ),
            }),
            None => Err(bad(
                match top
                    .keys()
                    .find(|k| closest_key(k, &[keys::MODELS]).is_some())
                {
                    Some(typo) => format!(
                        "missing the \"models\" array; found the unknown key {typo:?}: did you mean \"models\"?"
                    ),
                    None => "missing the \"models\" array".into(),
                },
            )),
        },
        other => Err(bad(format!(
            "expected an object with a \"models\" array, found {}",
            kind_of(other)
        ))),
    }
}

/// Every problem of a parsed document at the given level.
pub(crate) fn check_document(doc: &Value, mode: ValidationMode) -> Vec<Problem> {
    let mut out = Vec::new();
    let (top, entries) = match entries_of(doc) {
        Ok(x) => x,
        Err(p) => return vec![p],
    };
    if let Some(top) = top {
        check_top_reader(top, &mut out);
        if mode != ValidationMode::Reader {
            check_misspelt_keys(top, ROOT, &TOP_KEYS, &mut out);
        }
    }
    if mode != ValidationMode::Reader && entries.is_empty() {
        out.push(Problem {
            path: keys::MODELS.into(),
            message: "no models; devices ignore a manifest without entries".into(),
        });
    }
    check_entries(entries, "", &mut out, |map, path, out| {
        if mode != ValidationMode::Reader {
            check_entry_strict(map, path, mode, out);
            check_misspelt_keys(map, path, &ENTRY_KEYS, out);
        }
    });
    out
}

/// Every entry that is an object, after the checks every level and contract shares (an entry
/// that is not an object, a duplicate ID: their messages end in `suffix`), handed to `each`
/// with its path; the problems found in an entry then name its model.
fn check_entries<'v>(
    entries: &'v [Value],
    suffix: &str,
    out: &mut Vec<Problem>,
    mut each: impl FnMut(&'v Map<String, Value>, &str, &mut Vec<Problem>),
) {
    let mut first_seen: HashMap<&str, usize> = HashMap::new();
    for (i, entry) in entries.iter().enumerate() {
        let path = entry_path(i);
        let Some(map) = entry.as_object() else {
            out.push(Problem {
                path,
                message: format!("expected an object, found {}{suffix}", kind_of(entry)),
            });
            continue;
        };
        let first_problem = out.len();
        check_entry_reader(map, &path, out);
        if let Some(id) = map.get(keys::ID).and_then(Value::as_str) {
            match first_seen.get(id) {
                Some(first) => out.push(Problem {
                    path: join_key(&path, keys::ID),
                    message: format!(
                        "duplicate model ID {:?} (first at {}){suffix}",
                        abbreviate(id),
                        entry_path(*first)
                    ),
                }),
                None => {
                    first_seen.insert(id, i);
                }
            }
        }
        each(map, &path, out);
        // Name the model as well as its index: `models[6]` alone sends you counting.
        if let Some(id) = map.get(keys::ID).and_then(Value::as_str)
            && id.parse::<ModelId>().is_ok()
        {
            for p in out[first_problem..]
                .iter_mut()
                .filter(|p| !p.path.ends_with(".id"))
            {
                p.message
                    .push_str(&format!(" (model {:?})", abbreviate(id)));
            }
        }
    }
}

/// Every top-level key of a manifest object that this crate knows.
const TOP_KEYS: [&str; 3] = [keys::MODELS, keys::GENERATION, keys::TINYGRAD_COMMIT];

/// Every key an entry may carry that this crate knows.
const ENTRY_KEYS: [&str; 18] = [
    keys::ID,
    keys::NAME,
    keys::VERSION,
    keys::SERIES,
    keys::RELEASED,
    keys::COMMUNITY_FAVORITE,
    keys::ARTIFACT_FORMAT,
    keys::ARTIFACT_SIZE,
    keys::ARTIFACT_SHA256,
    keys::ARTIFACT_CHUNK_COUNT,
    keys::USES_EXTERNAL_GPU,
    keys::MODEL_SIZE,
    keys::MODEL_LAB_ELIGIBLE,
    keys::ACCELERATOR_ARTIFACTS,
    keys::ARTIFACT_FILENAME,
    keys::ARTIFACT_URL,
    keys::SOURCE_COMMIT,
    keys::ARTIFACT_CHUNK_SHA256,
];

/// The known key an unknown one is most likely a typo of: at most two edits away (one for
/// short keys), closest first. `None` for a known key or one unlike any.
pub fn closest_key(unknown: &str, known: &[&'static str]) -> Option<&'static str> {
    if known.contains(&unknown) {
        return None;
    }
    let limit = if unknown.chars().count() <= 4 { 1 } else { 2 };
    known
        .iter()
        .map(|k| (strsim::osa_distance(unknown, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Catalog and release rule: an unknown key close to a known one is a typo, named with the key
/// it was meant to be (devices ignore unknown keys, so the intended field is silently absent).
/// Unknown keys unlike any known one are extensions and pass.
fn check_misspelt_keys(
    map: &Map<String, Value>,
    path: &str,
    known: &[&'static str],
    out: &mut Vec<Problem>,
) {
    let mut sink = Sink(out);
    for key in map.keys() {
        if let Some(meant) = closest_key(key, known) {
            sink.push(
                join_key(path, key),
                format!("unknown key; did you mean {meant:?}? devices ignore unknown keys"),
            );
        }
    }
}

/// Catalog and release rules for one entry. Only reports what the reader check did not: a
/// missing key, or a well-typed value that breaks a stricter rule.
fn check_entry_strict(
    map: &Map<String, Value>,
    path: &str,
    mode: ValidationMode,
    out: &mut Vec<Problem>,
) {
    let mut sink = Sink(out);
    for key in keys::CATALOG_REQUIRED {
        // `id` missing is already a reader problem.
        if *key != keys::ID && !map.contains_key(*key) {
            sink.push(
                join_key(path, key),
                "missing; required in every catalog entry",
            );
        }
    }
    check_artifact_fields_strict(map, path, &mut sink);
    if let Some(Value::String(size)) = map.get(keys::MODEL_SIZE)
        && !matches!(size.as_str(), "small" | "chestnut")
    {
        sink.push(
            join_key(path, keys::MODEL_SIZE),
            format!(
                "must be \"small\" or \"chestnut\" (got {:?})",
                abbreviate(size)
            ),
        );
    }
    if let Some(Value::Array(digests)) = map.get(keys::ARTIFACT_CHUNK_SHA256) {
        let here = join_key(path, keys::ARTIFACT_CHUNK_SHA256);
        match map.get(keys::ARTIFACT_CHUNK_COUNT).and_then(Value::as_u64) {
            None if !map.contains_key(keys::ARTIFACT_CHUNK_COUNT) => {
                sink.push(here, "present without artifact_chunk_count");
            }
            Some(count) if count != digests.len() as u64 => sink.push(
                here,
                format!(
                    "has {} digests but artifact_chunk_count is {count}",
                    digests.len()
                ),
            ),
            _ => {}
        }
    }
    if let Some(Value::Object(variants)) = map.get(keys::ACCELERATOR_ARTIFACTS) {
        let apath = join_key(path, keys::ACCELERATOR_ARTIFACTS);
        for (name, variant) in variants {
            if let Value::Object(fields) = variant {
                check_artifact_fields_strict(fields, &join_key(&apath, name), &mut sink);
            }
        }
    }

    if mode != ValidationMode::Release {
        return;
    }
    let local = map
        .get(keys::ID)
        .and_then(Value::as_str)
        .is_some_and(|id| id.starts_with(ModelId::LOCAL_PREFIX));
    if local {
        sink.push(
            join_key(path, keys::ID),
            "local models are never published in a release manifest",
        );
        return;
    }
    match map.get(keys::ARTIFACT_FORMAT) {
        None => sink.push(
            join_key(path, keys::ARTIFACT_FORMAT),
            "missing; a release entry must be tinygrad_single_v1",
        ),
        Some(Value::String(f)) if f.is_empty() => sink.push(
            join_key(path, keys::ARTIFACT_FORMAT),
            "empty; a release entry must be tinygrad_single_v1",
        ),
        _ => {}
    }
    for key in [
        keys::ARTIFACT_SIZE,
        keys::ARTIFACT_SHA256,
        keys::ARTIFACT_CHUNK_COUNT,
    ] {
        if !map.contains_key(key) {
            sink.push(
                join_key(path, key),
                "missing; required for every published model",
            );
        }
    }
    check_variants_release(map, path, &mut sink);
}

/// Release rule for `accelerator_artifacts`: a variant is an artifact a device downloads, so it
/// needs its size, SHA-256 and chunk count like the entry itself. A variant without them makes
/// a Chestnut device fall back to RDF V4 silently.
fn check_variants_release(map: &Map<String, Value>, path: &str, sink: &mut Sink<'_>) {
    let Some(Value::Object(variants)) = map.get(keys::ACCELERATOR_ARTIFACTS) else {
        return;
    };
    let apath = join_key(path, keys::ACCELERATOR_ARTIFACTS);
    let id = map.get(keys::ID).and_then(Value::as_str).unwrap_or("ID");
    for (name, variant) in variants {
        let Value::Object(fields) = variant else {
            continue; // a reader problem already
        };
        let vpath = join_key(&apath, name);
        for key in VARIANT_RELEASE_REQUIRED {
            if !fields.contains_key(key) {
                sink.push(
                    join_key(&vpath, key),
                    format!(
                        "missing; required for every published accelerator variant: run \
                         `release-cli rebuild` for this generation (it rebuilds the variant or \
                         drops the block with a warning), or write them from the variant's \
                         files with `release-cli manifest set-artifact MANIFEST DIR --model {} \
                         --variant {}`",
                        abbreviate(id),
                        abbreviate(name)
                    ),
                );
            }
        }
    }
}

/// What release validation requires of each `accelerator_artifacts` variant.
pub const VARIANT_RELEASE_REQUIRED: [&str; 3] = [
    keys::ARTIFACT_SIZE,
    keys::ARTIFACT_SHA256,
    keys::ARTIFACT_CHUNK_COUNT,
];

/// Rules shared by an entry and its accelerator variants.
fn check_artifact_fields_strict(map: &Map<String, Value>, path: &str, sink: &mut Sink<'_>) {
    if let Some(Value::String(f)) = map.get(keys::ARTIFACT_FORMAT)
        && !ArtifactFormat::parse(f).is_supported()
    {
        sink.push(
                join_key(path, keys::ARTIFACT_FORMAT),
                format!(
                    "unknown artifact_format {:?} (allowed: absent, \"\", \"tinygrad_single_v1\"); devices would drop this entry",
                    abbreviate(f)
                ),
            );
    }
    let has_size = map.contains_key(keys::ARTIFACT_SIZE);
    let has_sha = map.contains_key(keys::ARTIFACT_SHA256);
    if has_size && !has_sha {
        sink.push(
            join_key(path, keys::ARTIFACT_SHA256),
            "missing; required when artifact_size is present",
        );
    }
    if has_sha && !has_size {
        sink.push(
            join_key(path, keys::ARTIFACT_SIZE),
            "missing; required when artifact_sha256 is present",
        );
    }
    if let Some(Value::String(url)) = map.get(keys::ARTIFACT_URL)
        && !(url.starts_with("https://") || url.starts_with("http://"))
    {
        sink.push(
            join_key(path, keys::ARTIFACT_URL),
            format!("not an http(s) URL (got {:?})", abbreviate(url)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closest_key_table() {
        for (unknown, want) in [
            ("versoin", Some("version")),
            ("verison", Some("version")),
            ("nme", Some("name")),
            ("artifact_sha265", Some("artifact_sha256")),
            ("relased", Some("released")),
            ("version", None),
            ("description", None),
            ("ix", Some("id")),
            ("zz", None),
            ("idx", Some("id")),
        ] {
            assert_eq!(closest_key(unknown, &ENTRY_KEYS), want, "{unknown}");
        }
    }

    /// Release validation of `accelerator_artifacts` variants: size, SHA-256 and chunk count
    /// are required, each missing one named by its JSON path with the command that fixes it;
    /// the catalog level does not require the count. Run for the v25 pin of the table and a
    /// made-up v26 with a made-up pin.
    #[test]
    fn release_requires_variant_size_digest_and_count() {
        let sha = "5198df6889af1244f1daa9cd29388e2a3992328f91d7f44d2633e8702a4e19d1";
        let full = serde_json::json!({
            "artifact_format": "tinygrad_single_v1",
            "artifact_filename": "gwm8223_driving_chestnut_tinygrad.pkl",
            "artifact_size": 67571389,
            "artifact_sha256": sha,
            "artifact_chunk_count": 0,
            "execution_device": "AMD"
        });
        let without = |keys: &[&str]| {
            let mut v = full.clone();
            for k in keys {
                v.as_object_mut().unwrap().remove(*k);
            }
            v
        };
        let vp = "models[0].accelerator_artifacts.chestnut";
        let cases: Vec<(&str, Value, Vec<String>)> = vec![
            ("complete variant", full.clone(), vec![]),
            (
                "no size",
                without(&["artifact_size", "artifact_sha256"]),
                vec![
                    format!("{vp}.artifact_size"),
                    format!("{vp}.artifact_sha256"),
                ],
            ),
            (
                "no count",
                without(&["artifact_chunk_count"]),
                vec![format!("{vp}.artifact_chunk_count")],
            ),
            (
                "only the device",
                serde_json::json!({"execution_device": "AMD"}),
                vec![
                    format!("{vp}.artifact_size"),
                    format!("{vp}.artifact_sha256"),
                    format!("{vp}.artifact_chunk_count"),
                ],
            ),
        ];
        let v25: Generation = "v25".parse().unwrap();
        let v25_pin = crate::PinTable::builtin().get(v25).unwrap().to_string();
        for (generation, pin) in [
            ("v25", v25_pin.as_str()),
            ("v26", "0123456789abcdef0123456789abcdef01234567"),
        ] {
            for (name, variant, want) in &cases {
                let doc = serde_json::json!({
                    "generation": generation,
                    "tinygrad_commit": pin,
                    "models": [{
                        "id": "gwm8223", "name": "GWM", "version": "v11", "series": "WM",
                        "released": "2025-09-28", "community_favorite": true,
                        "artifact_format": "tinygrad_single_v1", "artifact_size": 10,
                        "artifact_sha256": sha, "artifact_chunk_count": 1,
                        "accelerator_artifacts": {"chestnut": variant}
                    }]
                });
                let got = check_document(&doc, ValidationMode::Release);
                let paths: Vec<&str> = got.iter().map(|p| p.path.as_str()).collect();
                assert_eq!(paths, *want, "{generation} {name}: {got:#?}");
                for p in &got {
                    assert!(
                        p.message.contains("release-cli rebuild")
                            && p.message.contains("for this generation (it rebuilds")
                            && p.message.contains("--model gwm8223 --variant chestnut")
                            && p.message.contains("(model \"gwm8223\")"),
                        "{generation} {name}: {p}"
                    );
                }
                // Size and digest go together at the catalog level; the count is release-only.
                let catalog = check_document(&doc, ValidationMode::Catalog);
                assert!(
                    catalog
                        .iter()
                        .all(|p| !p.path.ends_with("artifact_chunk_count")),
                    "{generation} {name}: {catalog:#?}"
                );
            }
        }
    }

    /// Regression: `versoin` was reported only as "version missing", at `models[1]` without the
    /// model's id.
    #[test]
    fn a_misspelt_key_is_named_with_the_key_meant_and_the_model() {
        let doc: Value = serde_json::from_str(
            r#"{"models": [
                {"id": "a1", "name": "A", "version": "v8", "series": "S", "released": "2025-01-01", "community_favorite": false},
                {"id": "b1", "name": "B", "versoin": "v8", "series": "S", "released": "2025-01-01", "community_favorite": false, "notes": "extension"}
            ]}"#,
        )
        .unwrap();
        let problems = check_document(&doc, ValidationMode::Catalog);
        let texts: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(
            texts.contains(
                &"models[1].versoin: unknown key; did you mean \"version\"? devices ignore \
                  unknown keys (model \"b1\")"
                    .to_string()
            ),
            "{texts:#?}"
        );
        assert!(
            texts.contains(
                &"models[1].version: missing; required in every catalog entry (model \"b1\")"
                    .to_string()
            ),
            "{texts:#?}"
        );
        assert_eq!(texts.len(), 2, "the extension key passes: {texts:#?}");
        // A reader does not judge unknown keys.
        assert!(check_document(&doc, ValidationMode::Reader).is_empty());
    }

    /// Regression: a misspelt top-level key (`modles`, `generaton`) was reported only as
    /// "missing the models array", or not at all.
    #[test]
    fn a_misspelt_top_level_key_is_named_with_the_key_meant() {
        let entry = r#"{"id": "a1", "name": "A", "version": "v8", "series": "S", "released": "2025-01-01", "community_favorite": false}"#;
        let texts = |doc: &str, mode| -> Vec<String> {
            let doc: Value = serde_json::from_str(doc).unwrap();
            check_document(&doc, mode)
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(
            texts(
                &format!(r#"{{"modles": [{entry}]}}"#),
                ValidationMode::Catalog
            ),
            [
                "$: missing the \"models\" array; found the unknown key \"modles\": did you mean \"models\"?"
            ]
        );
        assert_eq!(
            texts(
                &format!(r#"{{"models": [{entry}], "generaton": "v25", "notes": "x"}}"#),
                ValidationMode::Catalog
            ),
            ["generaton: unknown key; did you mean \"generation\"? devices ignore unknown keys"]
        );
        assert!(
            texts(
                &format!(r#"{{"models": [{entry}], "generaton": "v25"}}"#),
                ValidationMode::Reader
            )
            .is_empty()
        );
    }
}
