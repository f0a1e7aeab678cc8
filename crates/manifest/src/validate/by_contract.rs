//! Validation against a generation's contract ([`crate::contract`]).
//!
//! A contract without whole-manifest refusal (v25) keeps [`super::validate_bytes`]'s rules
//! exactly; the [`Expectation`] adds only the checks asked for (the generation, the revision
//! under the contract's `revision_key`). A contract with whole-manifest refusal (v26) is the
//! schema its devices enforce (docs/formats.md, "Generation contracts"): every rule below is a
//! refusal of the whole manifest, and every one of them is reported with its JSON path:
//!
//! - the document is an object with a `models` list and every one of the contract's required
//!   top-level keys: `generation` (the expected one), the revision key (the expected revision),
//!   `artifact_abi` equal to the contract's ABI;
//! - every entry an object whose `id` is a string, not the bundled model's id, unique and (when
//!   the tree's declaration is given) a row of the tree's reviewed catalog, with that row's
//!   `version` and, read as a truth value, its `uses_external_gpu`;
//! - `accelerator_artifacts` an object whose only key may be the contract's accelerator key;
//!   that variant only on a non-GPU model with `model_lab_eligible: true`, carrying the
//!   contract's `execution_device` and the manifest's revision as `compiler_revision`;
//! - `runtime_artifacts` a list of objects with only the runtime variant keys, all four artifact
//!   keys, an integer `min_runner_revision` of at least the contract's minimum and unique;
//! - every artifact carrying `artifact_sha256` (entry, accelerator variant, runtime variant):
//!   64 lowercase hex digits, an integer size in (0, 2 GiB], an integer chunk count in 0..=99
//!   and the contract's `artifact_format`.
//!
//! Besides those, every level keeps the reader's well-formedness of known fields (what
//! [`crate::Manifest`] needs to hold the document); the catalog level adds at least one model,
//! the tree catalog's required keys and named typos; the release level adds what we publish:
//! no `local-` model and every entry and accelerator variant downloadable.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::{
    ENTRY_KEYS, ROOT, Sink, TOP_KEYS, VARIANT_RELEASE_REQUIRED, ValidationMode, abbreviate,
    check_entries, check_misspelt_keys, check_top_reader, join_key, kind_of, validate_bytes,
};
use crate::contract::{Contract, TreeCatalogRow};
use crate::entry::ModelEntry;
use crate::error::{Error, Problem, Result};
use crate::keys;
use crate::types::{ArtifactSize, ChunkCount, Generation, GitCommit, ModelId};
use crate::{Limits, TreeDeclaration};

/// What a caller knows the manifest must say. `None` is "not checked".
#[derive(Debug, Clone, Copy, Default)]
pub struct Expectation<'a> {
    /// The top-level `generation`.
    pub generation: Option<Generation>,
    /// The revision under the contract's `revision_key` (v25 `tinygrad_commit`, v26
    /// `compiler_revision`), and the one an accelerator variant carries where the contract
    /// says it does.
    pub revision: Option<&'a GitCommit>,
    /// The tree's declaration: entries must be rows of its reviewed catalog (where the
    /// contract takes its entries from the tree's catalog).
    pub tree: Option<&'a TreeDeclaration>,
}

/// Validates manifest bytes against `contract` at `mode`, with the checks `expect` asks for.
/// Empty means valid. See the module docs.
pub fn validate_for_contract(
    bytes: &[u8],
    mode: ValidationMode,
    contract: &Contract,
    expect: &Expectation<'_>,
    limits: &Limits,
) -> Vec<Problem> {
    if !contract.whole_manifest_refusal {
        let mut out = validate_bytes(bytes, mode, limits);
        if let Ok(Value::Object(top)) = serde_json::from_slice::<Value>(bytes) {
            check_expected_top(&top, contract, expect, &mut out);
        }
        return out;
    }
    // Size and JSON first, as every level does.
    let early = validate_bytes_shape(bytes, limits);
    let doc = match early {
        Ok(doc) => doc,
        Err(p) => return vec![p],
    };
    let mut out = Vec::new();
    check_whole(&doc, mode, contract, expect, &mut out);
    dedupe(&mut out);
    out
}

/// The size limit, then the JSON parse.
fn validate_bytes_shape(bytes: &[u8], limits: &Limits) -> std::result::Result<Value, Problem> {
    crate::Manifest::json_within(bytes, limits).map_err(|e| Problem {
        path: ROOT.into(),
        message: match e {
            Error::Json(e) => format!("not valid JSON: {e}"),
            other => other.to_string(),
        },
    })
}

/// One problem per path: the reader's and the contract's rules overlap on some fields; the
/// contract's message (it says the whole manifest is refused) wins.
fn dedupe(out: &mut Vec<Problem>) {
    let mut at: HashMap<String, usize> = HashMap::new();
    let mut kept: Vec<Problem> = Vec::with_capacity(out.len());
    for p in out.drain(..) {
        match at.get(&p.path) {
            Some(&i) => {
                if p.message.contains(WHOLE) && !kept[i].message.contains(WHOLE) {
                    kept[i] = p;
                }
            }
            None => {
                at.insert(p.path.clone(), kept.len());
                kept.push(p);
            }
        }
    }
    *out = kept;
}

/// The words every refusal of a whole-manifest contract carries.
const WHOLE: &str = "refuses the whole manifest";

/// The generation and revision asked for, where the top level carries them. A key the contract
/// requires is reported missing by the contract's own rules; one it does not is optional.
fn check_expected_top(
    top: &Map<String, Value>,
    contract: &Contract,
    expect: &Expectation<'_>,
    out: &mut Vec<Problem>,
) {
    let mut sink = Sink(out);
    if let (Some(want), Some(v)) = (expect.generation, top.get(keys::GENERATION))
        && v.as_str() != Some(want.to_string().as_str())
    {
        sink.push(
            join_key(ROOT, keys::GENERATION),
            format!("is {}, but this manifest must be {want}'s", kind_of(v)),
        );
    }
    if let (Some(want), Some(v)) = (expect.revision, top.get(contract.revision_key))
        && v.as_str() != Some(want.as_str())
    {
        sink.push(
            join_key(ROOT, contract.revision_key),
            format!(
                "is {}, but the generation's pinned revision is {want}: the artifacts were \
                 compiled with another tinygrad",
                kind_of(v)
            ),
        );
    }
}

/// A JSON value read as Python's `bool()` reads it.
fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// An integer (not a float, not a boolean).
fn int_of(v: Option<&Value>) -> Option<i128> {
    let n = v?.as_number()?;
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
}

fn check_whole(
    doc: &Value,
    mode: ValidationMode,
    contract: &Contract,
    expect: &Expectation<'_>,
    out: &mut Vec<Problem>,
) {
    let refusal = format!("the {} contract {WHOLE} for this", contract.name);
    let Value::Object(top) = doc else {
        out.push(Problem {
            path: ROOT.into(),
            message: format!(
                "expected an object with {} and a \"models\" list, found {}; {refusal}",
                contract
                    .required_top_keys
                    .iter()
                    .map(|k| format!("{k:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                kind_of(doc)
            ),
        });
        return;
    };
    check_top_reader(top, out);
    check_top(top, contract, expect, &refusal, out);
    let Some(entries) = models_list(top, &refusal, out) else {
        return;
    };
    let mut known_top: Vec<&'static str> = TOP_KEYS.to_vec();
    known_top.extend(contract.required_top_keys);
    if mode != ValidationMode::Reader {
        check_misspelt_keys(top, ROOT, &known_top, out);
        if entries.is_empty() {
            out.push(Problem {
                path: keys::MODELS.into(),
                message: "no models; devices ignore a manifest without entries".into(),
            });
        }
    }
    // The revision variants must carry: the expected one, else the manifest's own.
    let revision = expect.revision.map(|r| r.as_str().to_owned()).or_else(|| {
        top.get(contract.revision_key)
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let rules = EntryRules {
        contract,
        expect,
        revision: revision.as_deref(),
        refusal: &refusal,
    };
    check_entries(entries, &format!("; {refusal}"), out, |map, path, out| {
        check_entry(map, path, &rules, out);
        if mode != ValidationMode::Reader {
            check_entry_catalog(map, path, out);
        }
        if mode == ValidationMode::Release {
            check_entry_release(map, path, contract, out);
        }
    });
}

/// The top level's `models` list, or the refusal for its absence or its kind.
fn models_list<'v>(
    top: &'v Map<String, Value>,
    refusal: &str,
    out: &mut Vec<Problem>,
) -> Option<&'v [Value]> {
    match top.get(keys::MODELS) {
        Some(Value::Array(items)) => Some(items.as_slice()),
        Some(other) => {
            out.push(Problem {
                path: keys::MODELS.into(),
                message: format!(
                    "expected a list of model entries, found {}; {refusal}",
                    kind_of(other)
                ),
            });
            None
        }
        None => {
            out.push(Problem {
                path: ROOT.into(),
                message: format!("missing the \"models\" list; {refusal}"),
            });
            None
        }
    }
}

fn check_top(
    top: &Map<String, Value>,
    contract: &Contract,
    expect: &Expectation<'_>,
    refusal: &str,
    out: &mut Vec<Problem>,
) {
    let mut sink = Sink(&mut *out);
    for key in contract.required_top_keys {
        if !top.contains_key(*key) {
            sink.push(
                join_key(ROOT, key),
                format!("missing; {refusal} (it names the runtime the artifacts are built for)"),
            );
        }
    }
    if let Some(v) = top.get(contract.revision_key)
        && expect.revision.is_none()
        && let Err(m) = super::parsed::<GitCommit>(v)
    {
        sink.push(
            join_key(ROOT, contract.revision_key),
            format!("{m}; {refusal}"),
        );
    }
    if let (Some(abi), Some(v)) = (contract.artifact_abi, top.get(keys::ARTIFACT_ABI))
        && v.as_str() != Some(abi)
    {
        sink.push(
            join_key(ROOT, keys::ARTIFACT_ABI),
            format!("is {}, not {abi:?}; {refusal}", kind_of(v)),
        );
    }
    check_expected_top(top, contract, expect, out);
    // The expected values are refusals of the whole manifest too.
    for p in out.iter_mut() {
        if (p.path == keys::GENERATION || p.path == contract.revision_key)
            && !p.message.contains(refusal)
        {
            p.message.push_str(&format!("; {refusal}"));
        }
    }
}

/// What the contract's entry rules read besides the entry: the revision variants must carry
/// and the words every refusal ends with.
struct EntryRules<'a> {
    contract: &'a Contract,
    expect: &'a Expectation<'a>,
    revision: Option<&'a str>,
    refusal: &'a str,
}

/// An artifact that may name a digest, at its JSON path: the entry itself, an accelerator
/// variant or a runtime variant.
type Artifact<'v> = (String, &'v Map<String, Value>);

/// What `fields[key]` is, for a message: its kind, or "nothing".
fn got(fields: &Map<String, Value>, key: &str) -> String {
    fields
        .get(key)
        .map(kind_of)
        .unwrap_or_else(|| "nothing".into())
}

/// The contract's rules for one entry (see the module docs).
fn check_entry(
    map: &Map<String, Value>,
    path: &str,
    rules: &EntryRules<'_>,
    out: &mut Vec<Problem>,
) {
    let mut sink = Sink(out);
    let row = check_identity(map, path, rules, &mut sink);
    let gpu = row.map_or_else(
        || truthy(map.get(keys::USES_EXTERNAL_GPU)),
        |r| r.uses_external_gpu,
    );
    let mut artifacts: Vec<Artifact<'_>> = vec![(path.to_owned(), map)];
    check_accelerators(map, path, gpu, rules, &mut sink, &mut artifacts);
    if rules.contract.runner_revision.is_some() {
        check_runtime_variants(map, path, rules, &mut sink, &mut artifacts);
    }
    for (apath, fields) in artifacts {
        check_artifact(&apath, fields, rules, &mut sink);
    }
}

/// The entry's `id` (a string, not the bundled model's) and, where the contract takes entries
/// from the tree's catalog, its row there with the row's `version` and GPU flag. Returns the
/// row.
fn check_identity<'a>(
    map: &Map<String, Value>,
    path: &str,
    rules: &EntryRules<'a>,
    sink: &mut Sink<'_>,
) -> Option<&'a TreeCatalogRow> {
    let (contract, refusal) = (rules.contract, rules.refusal);
    let id = map.get(keys::ID).and_then(Value::as_str);
    let row = match (id, rules.expect.tree) {
        (Some(id), Some(tree)) if contract.entries_from_tree_catalog => {
            let row = tree.row(id);
            if row.is_none() {
                sink.push(
                    join_key(path, keys::ID),
                    format!(
                        "{:?} is not a row of the tree's reviewed catalog ({}); {refusal}: add \
                         the row to the catalog in the openpilot tree, or drop the entry",
                        abbreviate(id),
                        contract
                            .tree_catalog_path(tree.generation)
                            .unwrap_or_default()
                    ),
                );
            }
            row
        }
        _ => None,
    };
    match id {
        None if map.contains_key(keys::ID) => {
            // Not a string: the reader check names it; it is a refusal of the whole manifest.
            sink.push(join_key(path, keys::ID), format!("not a string; {refusal}"));
        }
        Some(id) if id == contract.bundled_selection => sink.push(
            join_key(path, keys::ID),
            format!(
                "{id:?} is the model bundled in the openpilot tree and is never downloaded; \
                 {refusal}"
            ),
        ),
        _ => {}
    }
    let row = row?;
    let want = row.version.to_string();
    if map.get(keys::VERSION).and_then(Value::as_str) != Some(want.as_str()) {
        sink.push(
            join_key(path, keys::VERSION),
            format!(
                "is {}, but the tree's reviewed catalog says {want}; {refusal}",
                map.get(keys::VERSION)
                    .map(kind_of)
                    .unwrap_or_else(|| "missing".into())
            ),
        );
    }
    if truthy(map.get(keys::USES_EXTERNAL_GPU)) != row.uses_external_gpu {
        sink.push(
            join_key(path, keys::USES_EXTERNAL_GPU),
            format!(
                "reads as {}, but the tree's reviewed catalog says {}; {refusal}",
                truthy(map.get(keys::USES_EXTERNAL_GPU)),
                row.uses_external_gpu
            ),
        );
    }
    Some(row)
}

/// `accelerator_artifacts`: only the contract's accelerator, on a model that may carry it, with
/// the contract's device and the manifest's revision. Adds each variant to `artifacts`.
fn check_accelerators<'v>(
    map: &'v Map<String, Value>,
    path: &str,
    gpu: bool,
    rules: &EntryRules<'_>,
    sink: &mut Sink<'_>,
    artifacts: &mut Vec<Artifact<'v>>,
) {
    let (contract, refusal) = (rules.contract, rules.refusal);
    let apath = join_key(path, keys::ACCELERATOR_ARTIFACTS);
    let rule = contract.accelerator;
    let variants = match map.get(keys::ACCELERATOR_ARTIFACTS) {
        None => return,
        Some(Value::Object(variants)) => variants,
        Some(other) => {
            return sink.push(
                &apath,
                format!("expected an object, found {}; {refusal}", kind_of(other)),
            );
        }
    };
    for (name, variant) in variants {
        let vpath = join_key(&apath, name);
        if name != rule.key {
            sink.push(
                &vpath,
                format!(
                    "unknown accelerator {:?}: the {} contract knows only {:?}; {refusal}",
                    abbreviate(name),
                    contract.name,
                    rule.key
                ),
            );
            continue;
        }
        let Value::Object(fields) = variant else {
            sink.push(
                &vpath,
                format!("expected an object, found {}; {refusal}", kind_of(variant)),
            );
            continue;
        };
        if rule.requires_lab_eligible && gpu {
            sink.push(
                &vpath,
                format!(
                    "a {:?} variant is only for a model without an external GPU; {refusal}",
                    rule.key
                ),
            );
        }
        if rule.requires_lab_eligible
            && map.get(keys::MODEL_LAB_ELIGIBLE) != Some(&Value::Bool(true))
        {
            sink.push(
                join_key(path, keys::MODEL_LAB_ELIGIBLE),
                format!(
                    "must be true for an entry with a {:?} variant; {refusal}",
                    rule.key
                ),
            );
        }
        if fields.get(keys::EXECUTION_DEVICE).and_then(Value::as_str) != Some(rule.execution_device)
        {
            sink.push(
                join_key(&vpath, keys::EXECUTION_DEVICE),
                format!(
                    "must be {:?} (got {}); {refusal}",
                    rule.execution_device,
                    got(fields, keys::EXECUTION_DEVICE)
                ),
            );
        }
        if rule.carries_compiler_revision {
            let revision = fields
                .get(keys::VARIANT_COMPILER_REVISION)
                .and_then(Value::as_str);
            if revision.is_none() || revision != rules.revision {
                sink.push(
                    join_key(&vpath, keys::VARIANT_COMPILER_REVISION),
                    format!(
                        "must be the manifest's revision {} (got {}); {refusal}",
                        rules.revision.unwrap_or("(none)"),
                        got(fields, keys::VARIANT_COMPILER_REVISION)
                    ),
                );
            }
        }
        artifacts.push((vpath, fields));
    }
}

/// `runtime_artifacts`: a list of objects with only the runtime variant keys, all the required
/// ones, and a unique integer `min_runner_revision` of at least the contract's minimum. Adds
/// each variant to `artifacts`.
fn check_runtime_variants<'v>(
    map: &'v Map<String, Value>,
    path: &str,
    rules: &EntryRules<'_>,
    sink: &mut Sink<'_>,
    artifacts: &mut Vec<Artifact<'v>>,
) {
    let (contract, refusal) = (rules.contract, rules.refusal);
    let rpath = join_key(path, keys::RUNTIME_ARTIFACTS);
    let variants = match map.get(keys::RUNTIME_ARTIFACTS) {
        None => return,
        Some(Value::Array(variants)) => variants,
        Some(other) => {
            return sink.push(
                &rpath,
                format!("expected a list, found {}; {refusal}", kind_of(other)),
            );
        }
    };
    let mut revisions = HashSet::new();
    for (i, variant) in variants.iter().enumerate() {
        let vpath = format!("{rpath}[{i}]");
        let Value::Object(fields) = variant else {
            sink.push(
                &vpath,
                format!("expected an object, found {}; {refusal}", kind_of(variant)),
            );
            continue;
        };
        for key in fields.keys() {
            if !keys::RUNTIME_VARIANT_KEYS.contains(&key.as_str()) {
                sink.push(
                    join_key(&vpath, key),
                    format!("not a runtime variant key; {refusal}"),
                );
            }
        }
        for key in keys::RUNTIME_VARIANT_REQUIRED {
            if !fields.contains_key(key) {
                sink.push(
                    join_key(&vpath, key),
                    format!("missing; every runtime variant needs it; {refusal}"),
                );
            }
        }
        let mpath = join_key(&vpath, keys::MIN_RUNNER_REVISION);
        match int_of(fields.get(keys::MIN_RUNNER_REVISION)) {
            None => sink.push(
                mpath,
                format!(
                    "must be an integer (got {}); {refusal}",
                    got(fields, keys::MIN_RUNNER_REVISION)
                ),
            ),
            Some(r) if r < i128::from(contract.min_runtime_revision) => sink.push(
                mpath,
                format!("is {r}, below {}; {refusal}", contract.min_runtime_revision),
            ),
            Some(r) if !revisions.insert(r) => sink.push(
                mpath,
                format!("{r} is named by another runtime variant; {refusal}"),
            ),
            Some(_) => {}
        }
        artifacts.push((vpath, fields));
    }
}

/// An artifact that names a digest: the digest, size, chunk count and format the contract
/// allows.
fn check_artifact(
    apath: &str,
    fields: &Map<String, Value>,
    rules: &EntryRules<'_>,
    sink: &mut Sink<'_>,
) {
    let (contract, refusal) = (rules.contract, rules.refusal);
    if !fields.contains_key(keys::ARTIFACT_SHA256) {
        return;
    }
    if super::check_digest(&fields[keys::ARTIFACT_SHA256]).is_err() {
        sink.push(
            join_key(apath, keys::ARTIFACT_SHA256),
            format!("not 64 lowercase hex digits; {refusal}"),
        );
    }
    let size = int_of(fields.get(keys::ARTIFACT_SIZE));
    if !size.is_some_and(|s| s > 0 && s <= i128::from(ArtifactSize::MAX)) {
        sink.push(
            join_key(apath, keys::ARTIFACT_SIZE),
            format!(
                "must be an integer in (0, {}] (got {}); {refusal}",
                ArtifactSize::MAX,
                got(fields, keys::ARTIFACT_SIZE)
            ),
        );
    }
    let count = int_of(fields.get(keys::ARTIFACT_CHUNK_COUNT));
    if !count.is_some_and(|c| (0..=i128::from(ChunkCount::MAX)).contains(&c)) {
        sink.push(
            join_key(apath, keys::ARTIFACT_CHUNK_COUNT),
            format!(
                "must be an integer in 0..={} (got {}); {refusal}",
                ChunkCount::MAX,
                got(fields, keys::ARTIFACT_CHUNK_COUNT)
            ),
        );
    }
    if fields.get(keys::ARTIFACT_FORMAT).and_then(Value::as_str) != Some(contract.artifact_format) {
        sink.push(
            join_key(apath, keys::ARTIFACT_FORMAT),
            format!(
                "must be {:?} (got {}); {refusal}",
                contract.artifact_format,
                got(fields, keys::ARTIFACT_FORMAT)
            ),
        );
    }
}

/// Catalog level: the tree catalog's keys in every entry, typos named.
fn check_entry_catalog(map: &Map<String, Value>, path: &str, out: &mut Vec<Problem>) {
    let mut sink = Sink(&mut *out);
    for key in keys::TREE_CATALOG_REQUIRED {
        if *key != keys::ID && !map.contains_key(*key) {
            sink.push(
                join_key(path, key),
                "missing; required in every catalog entry",
            );
        }
    }
    let mut known: Vec<&'static str> = ENTRY_KEYS.to_vec();
    known.push(keys::RUNTIME_ARTIFACTS);
    check_misspelt_keys(map, path, &known, out);
}

/// Release level: what we publish is downloadable and never a local build.
fn check_entry_release(
    map: &Map<String, Value>,
    path: &str,
    contract: &Contract,
    out: &mut Vec<Problem>,
) {
    let mut sink = Sink(out);
    let id = map.get(keys::ID).and_then(Value::as_str);
    if id.is_some_and(|id| id.starts_with(ModelId::LOCAL_PREFIX)) {
        sink.push(
            join_key(path, keys::ID),
            "local models are never published in a release manifest",
        );
        return;
    }
    for key in [
        keys::ARTIFACT_FORMAT,
        keys::ARTIFACT_SIZE,
        keys::ARTIFACT_SHA256,
        keys::ARTIFACT_CHUNK_COUNT,
    ] {
        if !map.contains_key(key) {
            sink.push(
                join_key(path, key),
                format!(
                    "missing; required for every published model (a {} artifact)",
                    contract.artifact_format
                ),
            );
        }
    }
    if let Some(Value::Object(variants)) = map.get(keys::ACCELERATOR_ARTIFACTS) {
        let apath = join_key(path, keys::ACCELERATOR_ARTIFACTS);
        for (name, variant) in variants {
            let Value::Object(fields) = variant else {
                continue;
            };
            let vpath = join_key(&apath, name);
            for key in std::iter::once(keys::ARTIFACT_FORMAT).chain(VARIANT_RELEASE_REQUIRED) {
                if !fields.contains_key(key) {
                    sink.push(
                        join_key(&vpath, key),
                        format!(
                            "missing; required for every published accelerator variant: run \
                             `release-cli rebuild` for this generation, or write them from the \
                             variant's files with `release-cli manifest set-artifact MANIFEST \
                             DIR --model {} --variant {}`",
                            abbreviate(id.unwrap_or("ID")),
                            abbreviate(name)
                        ),
                    );
                }
            }
        }
    }
}

/// The entry as a runner of `contract`'s revision loads it: the `runtime_artifacts` variant
/// with the highest `min_runner_revision` not above the contract's runner revision replaces the
/// entry's fields with its own (all but `min_runner_revision`); without such a variant, or for
/// a contract without runtime variants, the entry as it is. The variant's fields must pass the
/// reader rules (a validated manifest's do).
pub fn runtime_artifact(entry: &ModelEntry, contract: &Contract) -> Result<ModelEntry> {
    let Some(runner) = contract.runner_revision else {
        return Ok(entry.clone());
    };
    let Some(Value::Array(variants)) = entry.get(keys::RUNTIME_ARTIFACTS) else {
        return Ok(entry.clone());
    };
    let chosen = variants
        .iter()
        .filter_map(|v| {
            let fields = v.as_object()?;
            let r = int_of(fields.get(keys::MIN_RUNNER_REVISION))?;
            (r <= i128::from(runner)).then_some((r, fields))
        })
        .max_by_key(|(r, _)| *r);
    let Some((_, fields)) = chosen else {
        return Ok(entry.clone());
    };
    let mut out = entry.fields().clone();
    for (k, v) in fields {
        if k == keys::MIN_RUNNER_REVISION {
            continue;
        }
        out.insert(k.clone(), v.clone());
    }
    ModelEntry::from_map(out)
}
