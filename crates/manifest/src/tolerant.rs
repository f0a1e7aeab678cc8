//! The device's reading of a live manifest: refuse the entry, not the manifest.
//!
//! The Python fleet reads a manifest entry by entry and shrugs at most oddities: an uppercase
//! digest (it compares case-insensitively), `community_favorite: 1` (Python truthiness), an
//! empty accelerator digest (an empty string is "not declared" to it). A device that refused the
//! whole manifest for one such entry would lose every model the others describe. So a device
//! reads a manifest with [`Manifest::from_slice_tolerant`], which:
//!
//! - refuses the **whole** manifest only for what makes it unusable or unsafe as a whole: too
//!   large, not JSON, no `models` array, a malformed top-level `generation`/`tinygrad_commit`
//!   (the caller then refuses another generation), two entries with the same `id`, or an `id`
//!   that looks like a path (`/`, `\`, `..`, NUL): a publisher that writes those is not one to
//!   take any entry from;
//! - **normalises** what upstream normalises, and says so ([`Tolerated::normalised`]): a digest
//!   in any case becomes lowercase, an empty digest becomes "not declared", `0`/`1` in a boolean
//!   field become `false`/`true`;
//! - **refuses one entry**, with every reason ([`RefusedEntry`]), for anything else: a comma in
//!   a name (it would shift the device's comma-joined lists), a date that does not exist
//!   (`2025-02-30`), a version that is not `vN` (`v013`), an `id` outside `[a-z0-9-]` (it names
//!   files: `_` would confuse the `<key>_driving_` rule every cleanup uses), and every hostile
//!   value the reader rules keep out (sizes beyond 2 GiB, chunk counts over 99, bad file names).
//!
//! The entries that remain pass the strict reader rules, so the result is an ordinary
//! [`Manifest`]: written back, it reads strictly.

use std::collections::HashMap;
use std::fmt;

use serde_json::{Map, Value};

use crate::entry::ModelEntry;
use crate::error::{Error, Result};
use crate::keys;
use crate::manifest::{Limits, Manifest};
use crate::validate::{Problem, ROOT, abbreviate, check_entry_reader, entry_path, join_key};

/// An entry a device leaves out of its catalog, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedEntry {
    /// Position in the published `models` array.
    pub index: usize,
    /// The entry's `id` as published, when it had a string one (possibly not a valid ID).
    pub id: Option<String>,
    /// Every reason, each with its JSON path (`models[3].released`).
    pub problems: Vec<Problem>,
}

impl RefusedEntry {
    /// One line for a status report or a log.
    pub fn reason(&self) -> String {
        self.problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl fmt::Display for RefusedEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.id {
            Some(id) => write!(f, "model {:?} left out: {}", abbreviate(id), self.reason()),
            None => write!(f, "{} left out: {}", entry_path(self.index), self.reason()),
        }
    }
}

/// A manifest read the device's way: the usable entries, what was left out, what was fixed.
#[derive(Debug, Clone, PartialEq)]
pub struct Tolerated {
    /// The usable entries, as a manifest.
    pub manifest: Manifest,
    /// The entries left out, each with why.
    pub refused: Vec<RefusedEntry>,
    /// Values changed to what upstream reads them as (path and what was done).
    pub normalised: Vec<Problem>,
}

/// Whether an ID is one a device takes from a server: `[a-z0-9][a-z0-9-]*`, at most 128 bytes.
pub fn served_id_problem(id: &str) -> Option<&'static str> {
    if id.is_empty() {
        Some("must not be empty")
    } else if id.len() > crate::ModelId::MAX_LEN {
        Some("longer than 128 bytes")
    } else if !id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        || id.starts_with('-')
    {
        Some("must match ^[a-z0-9][a-z0-9-]*$ (it names files on the device)")
    } else {
        None
    }
}

/// An ID that tries to be a path: reason enough to distrust the whole manifest.
fn is_path_like(id: &str) -> bool {
    id.contains(['/', '\\', '\0']) || id.contains("..") || id == "."
}

const DIGEST_KEYS: [&str; 1] = [keys::ARTIFACT_SHA256];
const BOOL_KEYS: [&str; 3] = [
    keys::COMMUNITY_FAVORITE,
    keys::USES_EXTERNAL_GPU,
    keys::MODEL_LAB_ELIGIBLE,
];

/// 64 hex digits, some uppercase: a digest upstream reads case-insensitively.
fn upper_hex_digest(s: &str) -> bool {
    s.len() == 64
        && s.bytes().all(|b| b.is_ascii_hexdigit())
        && s.bytes().any(|b| b.is_ascii_uppercase())
}

/// Upstream's reading of one object's scalar fields, applied in place. Pure.
fn normalise_fields(map: &mut Map<String, Value>, path: &str, out: &mut Vec<Problem>) {
    let mut note = |key: &str, message: String| {
        out.push(Problem {
            path: join_key(path, key),
            message,
        })
    };
    for key in DIGEST_KEYS {
        let Some(Value::String(s)) = map.get(key) else {
            continue;
        };
        if s.trim().is_empty() {
            map.shift_remove(key);
            note(key, "empty; read as not declared".into());
        } else if upper_hex_digest(s) {
            let lower = s.to_ascii_lowercase();
            map.insert(key.to_owned(), Value::String(lower));
            note(key, "uppercase hex; lowercased".into());
        }
    }
    for key in BOOL_KEYS {
        let Some(Value::Number(n)) = map.get(key).cloned() else {
            continue;
        };
        let b = match n.as_u64() {
            Some(0) => false,
            Some(1) => true,
            _ => continue,
        };
        map.insert(key.to_owned(), Value::Bool(b));
        note(key, format!("integer {n}; read as {b}"));
    }
    if let Some(Value::Array(list)) = map.get_mut(keys::ARTIFACT_CHUNK_SHA256) {
        let mut changed = false;
        for item in list.iter_mut() {
            if let Value::String(s) = item
                && upper_hex_digest(s)
            {
                *s = s.to_ascii_lowercase();
                changed = true;
            }
        }
        if changed {
            note(
                keys::ARTIFACT_CHUNK_SHA256,
                "uppercase hex; lowercased".into(),
            );
        }
    }
}

/// [`normalise_fields`] on an entry and each of its accelerator variants. Pure.
pub(crate) fn normalise_entry(map: &mut Map<String, Value>, path: &str, out: &mut Vec<Problem>) {
    normalise_fields(map, path, out);
    if let Some(Value::Object(variants)) = map.get_mut(keys::ACCELERATOR_ARTIFACTS) {
        let apath = join_key(path, keys::ACCELERATOR_ARTIFACTS);
        for (name, v) in variants.iter_mut() {
            if let Value::Object(fields) = v {
                normalise_fields(fields, &join_key(&apath, name), out);
            }
        }
    }
}

fn whole(path: String, message: String) -> Error {
    Error::Invalid(vec![Problem { path, message }])
}

impl Manifest {
    /// Reads a manifest the device's way (see [`crate::tolerant`]): only a manifest that is
    /// unusable as a whole is an error; a bad entry is left out with its reasons.
    pub fn from_slice_tolerant(bytes: &[u8], limits: &Limits) -> Result<Tolerated> {
        Self::from_value_tolerant(Self::json_within(bytes, limits)?)
    }

    /// [`Manifest::from_slice_tolerant`] on an already parsed document.
    pub fn from_value_tolerant(doc: Value) -> Result<Tolerated> {
        let (top, items) = top_and_items(doc)?;
        refuse_whole_for_ids(&items)?;
        let mut models = Vec::new();
        let mut refused = Vec::new();
        let mut normalised = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            match read_entry(i, item) {
                Ok((entry, fixes)) => {
                    normalised.extend(fixes);
                    models.push(entry);
                }
                Err(r) => refused.push(r),
            }
        }
        Ok(Tolerated {
            manifest: Manifest::from_parts(top, models),
            refused,
            normalised,
        })
    }
}

/// The document's top level (its `models` key kept, as `null`) and its entries; a document
/// without a `models` array, or whose top level breaks our rules, is refused whole. A bare array
/// is the entries of an empty top level.
pub(crate) fn top_and_items(doc: Value) -> Result<(Map<String, Value>, Vec<Value>)> {
    let (mut top, items) = match doc {
        Value::Array(items) => (Map::new(), items),
        Value::Object(mut top) => match top.get_mut(keys::MODELS).map(Value::take) {
            Some(Value::Array(items)) => (top, items),
            Some(other) => {
                return Err(whole(
                    keys::MODELS.into(),
                    format!(
                        "expected an array of model entries, found {}",
                        abbreviate(&other.to_string())
                    ),
                ));
            }
            None => return Err(whole(ROOT.into(), "missing the \"models\" array".into())),
        },
        _ => {
            return Err(whole(
                ROOT.into(),
                "expected an object with a \"models\" array".into(),
            ));
        }
    };
    top.entry(keys::MODELS).or_insert(Value::Null);
    // Top-level rules (our extensions) are whole-manifest rules: checked on the document with no
    // entries, so entry problems cannot leak in.
    let mut probe = top.clone();
    probe.insert(keys::MODELS.into(), Value::Array(Vec::new()));
    let top_problems = crate::validate::check_document(
        &Value::Object(probe),
        crate::validate::ValidationMode::Reader,
    );
    if !top_problems.is_empty() {
        return Err(Error::Invalid(top_problems));
    }
    Ok((top, items))
}

/// The whole-manifest refusals among the entries: duplicate and path-like IDs.
fn refuse_whole_for_ids(items: &[Value]) -> Result<()> {
    let mut first_seen: HashMap<&str, usize> = HashMap::new();
    let mut fatal = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Some(id) = item.get(keys::ID).and_then(Value::as_str) else {
            continue;
        };
        let path = join_key(&entry_path(i), keys::ID);
        if is_path_like(id) {
            fatal.push(Problem {
                path: path.clone(),
                message: format!(
                    "ID {:?} looks like a path; not taking any entry from this manifest",
                    abbreviate(id)
                ),
            });
        }
        match first_seen.get(id) {
            Some(first) => fatal.push(Problem {
                path,
                message: format!(
                    "duplicate model ID {:?} (first at {}); not taking any entry from this manifest",
                    abbreviate(id),
                    entry_path(*first)
                ),
            }),
            None => {
                first_seen.insert(id, i);
            }
        }
    }
    if fatal.is_empty() {
        Ok(())
    } else {
        Err(Error::Invalid(fatal))
    }
}

/// Entry `i` read the device's way: the entry with the fixes normalising made, or the entry
/// refused with its reasons.
fn read_entry(
    i: usize,
    item: Value,
) -> std::result::Result<(ModelEntry, Vec<Problem>), RefusedEntry> {
    let path = entry_path(i);
    let id = item
        .get(keys::ID)
        .and_then(Value::as_str)
        .map(str::to_owned);
    let refuse = |id, problems| RefusedEntry {
        index: i,
        id,
        problems,
    };
    let Value::Object(mut map) = item else {
        let message = "expected an object".into();
        return Err(refuse(id, vec![Problem { path, message }]));
    };
    let mut fixes = Vec::new();
    normalise_entry(&mut map, &path, &mut fixes);
    let mut problems = Vec::new();
    if let Some(s) = &id
        && let Some(why) = served_id_problem(s)
    {
        problems.push(Problem {
            path: join_key(&path, keys::ID),
            message: format!("{why} (got {:?})", abbreviate(s)),
        });
    }
    check_entry_reader(&map, &path, &mut problems);
    problems.dedup_by(|a, b| a.path == b.path);
    if !problems.is_empty() {
        return Err(refuse(id, problems));
    }
    match ModelEntry::from_map(map) {
        Ok(entry) => Ok((entry, fixes)),
        Err(e) => {
            let message = e.to_string();
            Err(refuse(id, vec![Problem { path, message }]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Value) -> Result<Tolerated> {
        Manifest::from_value_tolerant(v)
    }

    fn entry(extra: Value) -> Value {
        let mut base = json!({"id": "ok1", "name": "OK", "version": "v16", "series": "S",
            "released": "2025-01-01", "community_favorite": false});
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        base
    }

    /// Each irregularity alone, next to a good entry: what becomes of the odd one.
    #[test]
    fn per_entry_table() {
        let sha_upper = "AB".repeat(32);
        // (entry fields, kept?, expected problem or normalisation path suffix)
        let cases: Vec<(Value, bool, &str)> = vec![
            (json!({"name": "a,b"}), false, "name"),
            (json!({"released": "2025-02-30"}), false, "released"),
            (json!({"version": "v013"}), false, "version"),
            (
                json!({"artifact_sha256": sha_upper}),
                true,
                "artifact_sha256",
            ),
            (json!({"community_favorite": 1}), true, "community_favorite"),
            (json!({"uses_external_gpu": 0}), true, "uses_external_gpu"),
            (
                json!({"community_favorite": 2}),
                false,
                "community_favorite",
            ),
            (
                json!({"community_favorite": "true"}),
                false,
                "community_favorite",
            ),
            (
                json!({"accelerator_artifacts": {"chestnut": {"artifact_sha256": ""}}}),
                true,
                "accelerator_artifacts.chestnut.artifact_sha256",
            ),
            (json!({"artifact_sha256": ""}), true, "artifact_sha256"),
            (json!({"id": "Pop223"}), false, "id"),
            (json!({"id": "pop_223"}), false, "id"),
            (json!({"id": "-pop"}), false, "id"),
            (json!({"id": "a,b"}), false, "id"),
            (json!({"artifact_size": 3u64 << 30}), false, "artifact_size"),
            (json!({"artifact_size": -1}), false, "artifact_size"),
            (
                json!({"artifact_chunk_count": 100}),
                false,
                "artifact_chunk_count",
            ),
            (
                json!({"artifact_filename": "../x"}),
                false,
                "artifact_filename",
            ),
            (json!({"artifact_sha256": "xyz"}), false, "artifact_sha256"),
        ];
        for (extra, kept, path) in cases {
            let mut odd = entry(extra.clone());
            if odd["id"] == "ok1" {
                odd["id"] = json!("odd1");
            }
            let t = read(json!({"models": [entry(json!({})), odd]})).unwrap();
            assert_eq!(t.manifest.models()[0].id().as_str(), "ok1", "{extra}");
            if kept {
                assert_eq!(t.manifest.models().len(), 2, "{extra}: {:?}", t.refused);
                assert!(t.refused.is_empty());
                assert!(
                    t.normalised
                        .iter()
                        .any(|p| p.path == format!("models[1].{path}")),
                    "{extra}: {:?}",
                    t.normalised
                );
                // The normalised manifest reads strictly.
                Manifest::from_slice(t.manifest.to_canonical_string().as_bytes()).unwrap();
            } else {
                assert_eq!(t.manifest.models().len(), 1, "{extra}");
                assert_eq!(t.refused.len(), 1);
                assert_eq!(t.refused[0].index, 1);
                assert!(
                    t.refused[0]
                        .problems
                        .iter()
                        .any(|p| p.path == format!("models[1].{path}")),
                    "{extra}: {}",
                    t.refused[0]
                );
            }
        }
    }

    #[test]
    fn normalised_values_are_upstreams() {
        let t = read(json!([entry(json!({"artifact_sha256": "AB".repeat(32),
            "artifact_size": 5, "community_favorite": 1,
            "accelerator_artifacts": {"chestnut": {"artifact_sha256": "", "artifact_size": 3}}}))]))
        .unwrap();
        let e = &t.manifest.models()[0];
        assert_eq!(e.artifact_sha256().unwrap().to_hex(), "ab".repeat(32));
        assert_eq!(e.community_favorite(), Some(true));
        assert_eq!(e.accelerators()[0].1.sha256, None);
    }

    /// What refuses the whole manifest.
    #[test]
    fn whole_manifest_table() {
        let cases: Vec<(Value, &str)> = vec![
            (
                json!({"models": [entry(json!({})), entry(json!({}))]}),
                "duplicate",
            ),
            (
                json!({"models": [entry(json!({"id": "../etc"}))]}),
                "looks like a path",
            ),
            (json!({"models": [entry(json!({"id": "a/b"}))]}), "path"),
            (json!({"models": [entry(json!({"id": "a\\b"}))]}), "path"),
            (json!({"generation": "25", "models": []}), "generation"),
            (json!({"models": {}}), "array"),
            (json!({"other": []}), "models"),
            (json!("x"), "object"),
        ];
        for (doc, want) in cases {
            let err = read(doc.clone()).unwrap_err().to_string();
            assert!(err.contains(want), "{doc}: {err}");
        }
        assert!(matches!(
            Manifest::from_slice_tolerant(b"{", &Limits::default()),
            Err(Error::Json(_))
        ));
        let limits = Limits {
            max_manifest_bytes: 4,
        };
        assert!(matches!(
            Manifest::from_slice_tolerant(b"[   ]", &limits),
            Err(Error::TooLarge { .. })
        ));
    }

    #[test]
    fn non_objects_and_missing_ids_are_refused_alone() {
        let t = read(json!([7, {"name": "no id"}, entry(json!({}))])).unwrap();
        assert_eq!(t.manifest.models().len(), 1);
        assert_eq!(
            t.refused.iter().map(|r| r.index).collect::<Vec<_>>(),
            [0, 1]
        );
        assert!(t.refused[1].to_string().contains("models[1] left out"));
    }
}
