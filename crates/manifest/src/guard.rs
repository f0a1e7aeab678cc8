//! Manifest diff and the release guard (docs/formats.md, "Release guard" and
//! "Publish order", point 3).
//!
//! Both compare JSON values, not text: key order and entry order are not changes (the Python
//! guard compares parsed values too). Nested objects such as `accelerator_artifacts` are
//! compared field by field so a change is named down to its leaf
//! (`accelerator_artifacts.chestnut.artifact_sha256`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

use crate::Manifest;
use crate::error::Lines;
use crate::keys;
use crate::types::ModelId;
use crate::validate::join_key;

/// One field that differs. `old`/`new` is `None` when the field is absent on that side.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldChange {
    /// Dotted path inside the entry (or the top level), e.g. `artifact_size`.
    pub field: String,
    /// The value on the old side; `None` when absent there.
    pub old: Option<Value>,
    /// The value on the new side; `None` when absent there.
    pub new: Option<Value>,
}

impl fmt::Display for FieldChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (old, new) = (shown(&self.old), shown(&self.new));
        write!(f, "{}: {old} -> {new}", self.field)
    }
}

/// A value as a change shows it: abbreviated JSON, or `(absent)`.
fn shown(v: &Option<Value>) -> String {
    match v {
        Some(v) => crate::validate::abbreviate(&v.to_string()),
        None => "(absent)".into(),
    }
}

/// The changes of one model present on both sides.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelChange {
    /// The model.
    pub id: ModelId,
    /// Its fields that differ, in the new entry's key order.
    pub fields: Vec<FieldChange>,
}

/// What changed from one manifest to another.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ManifestDiff {
    /// Top-level keys other than `models`.
    pub top_level: Vec<FieldChange>,
    /// In the new manifest's order.
    pub added: Vec<ModelId>,
    /// In the old manifest's order.
    pub removed: Vec<ModelId>,
    /// In the new manifest's order.
    pub changed: Vec<ModelChange>,
}

impl ManifestDiff {
    /// Whether the two manifests are the same in every key.
    pub fn is_empty(&self) -> bool {
        self.top_level.is_empty()
            && self.added.is_empty()
            && self.removed.is_empty()
            && self.changed.is_empty()
    }
}

impl fmt::Display for ManifestDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return writeln!(f, "no changes");
        }
        for c in &self.top_level {
            writeln!(f, "~ top level {c}")?;
        }
        for id in &self.added {
            writeln!(f, "+ model {id}")?;
        }
        for id in &self.removed {
            writeln!(f, "- model {id}")?;
        }
        for m in &self.changed {
            writeln!(f, "~ model {}", m.id)?;
            for c in &m.fields {
                writeln!(f, "    {c}")?;
            }
        }
        Ok(())
    }
}

/// Field-by-field differences of two JSON objects, descending into nested objects.
fn diff_maps(
    old: &Map<String, Value>,
    new: &Map<String, Value>,
    prefix: &str,
    out: &mut Vec<FieldChange>,
) {
    for (key, ov) in old {
        let field = join_key(prefix, key);
        match (ov, new.get(key)) {
            (_, None) => out.push(FieldChange {
                field,
                old: Some(ov.clone()),
                new: None,
            }),
            (Value::Object(a), Some(Value::Object(b))) => diff_maps(a, b, &field, out),
            (a, Some(b)) if a != b => out.push(FieldChange {
                field,
                old: Some(a.clone()),
                new: Some(b.clone()),
            }),
            _ => {}
        }
    }
    for (key, nv) in new {
        if !old.contains_key(key) {
            out.push(FieldChange {
                field: join_key(prefix, key),
                old: None,
                new: Some(nv.clone()),
            });
        }
    }
}

/// The structured difference from `old` to `new`.
pub fn diff(old: &Manifest, new: &Manifest) -> ManifestDiff {
    let top = |m: &Manifest| -> Map<String, Value> {
        m.top_level()
            .map(|(k, v)| (k.to_owned(), v.clone()))
            .collect()
    };
    let mut out = ManifestDiff::default();
    diff_maps(&top(old), &top(new), "", &mut out.top_level);

    let old_by_id: BTreeMap<&ModelId, _> = old.models().iter().map(|e| (e.id(), e)).collect();
    let new_ids: BTreeSet<&ModelId> = new.ids().collect();
    for entry in new.models() {
        match old_by_id.get(entry.id()) {
            None => out.added.push(entry.id().clone()),
            Some(before) => {
                let mut fields = Vec::new();
                diff_maps(before.fields(), entry.fields(), "", &mut fields);
                if !fields.is_empty() {
                    out.changed.push(ModelChange {
                        id: entry.id().clone(),
                        fields,
                    });
                }
            }
        }
    }
    out.removed = old
        .ids()
        .filter(|id| !new_ids.contains(id))
        .cloned()
        .collect();
    out
}

/// One change the release guard did not expect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnexpectedChange {
    /// A model the new manifest adds that is not among the intended ones.
    #[error("model {0} would be added, but it is not among the intended models")]
    Added(ModelId),
    /// A model the new manifest removes that is not among the intended ones.
    #[error("model {0} would be removed, but it is not among the intended models")]
    Removed(ModelId),
    /// A field of a model that is not among the intended ones would change.
    #[error("model {id}: field {field} would change, but {id} is not among the intended models")]
    Changed {
        /// The model.
        id: ModelId,
        /// The field's dotted path inside the entry.
        field: String,
    },
    /// A top-level key other than `models` would change (adding `generation` or `tinygrad_commit`
    /// is allowed).
    #[error("top-level field {field} would change")]
    TopLevel {
        /// The key.
        field: String,
    },
    /// The behaviour version or `uses_external_gpu` of a model would change within the
    /// generation: refused for every model, intended or not.
    #[error(
        "model {id}: {field} {} -> {} would change within the generation, which devices running \
         it cannot tell apart; keep {field} as it is live (rerun `release-cli rebuild` with the \
         live manifest as --base-manifest), or publish the change as a new model ID",
        shown(.old), shown(.new)
    )]
    Fixed {
        /// The model.
        id: ModelId,
        /// The field: `version` or `uses_external_gpu`.
        field: String,
        /// The live value; `None` when absent.
        old: Option<Value>,
        /// The new value; `None` when absent.
        new: Option<Value>,
    },
}

/// Refuses to replace `live` by `new` unless every difference is expected: a model may be
/// added, removed or changed only when its ID is in `intended`, and no other entry may change
/// in any field, including inside `accelerator_artifacts`. The behaviour version and
/// `uses_external_gpu` of a model on both sides never change within a generation, whether its
/// ID is intended or not ([`fixed_within_generation`]): `rebuild` gives every model a
/// directory, so "intended" alone would let them drift.
///
/// At the top level, our extension keys `generation` and `tinygrad_commit` may be *added* (the
/// first publish by this tool onto a manifest the Python tools wrote); any other top-level
/// change is refused, because one manifest file is one generation and one tinygrad pin.
pub fn guard(
    live: &Manifest,
    new: &Manifest,
    intended: &BTreeSet<ModelId>,
) -> Result<(), GuardRefusal> {
    let d = diff(live, new);
    let mut changes = Vec::new();
    for c in &d.top_level {
        let extension_added =
            c.old.is_none() && (c.field == keys::GENERATION || c.field == keys::TINYGRAD_COMMIT);
        if !extension_added {
            changes.push(UnexpectedChange::TopLevel {
                field: c.field.clone(),
            });
        }
    }
    for id in d.added.iter().filter(|id| !intended.contains(*id)) {
        changes.push(UnexpectedChange::Added(id.clone()));
    }
    for id in d.removed.iter().filter(|id| !intended.contains(*id)) {
        changes.push(UnexpectedChange::Removed(id.clone()));
    }
    for m in &d.changed {
        let (before, after) = (live.get(&m.id), new.get(&m.id));
        for c in &m.fields {
            let really_differs = match (before, after) {
                (Some(b), Some(a)) => fixed_values_differ(&c.field, b, a),
                _ => true,
            };
            if fixed_within_generation(&c.field) && really_differs {
                changes.push(UnexpectedChange::Fixed {
                    id: m.id.clone(),
                    field: c.field.clone(),
                    old: c.old.clone(),
                    new: c.new.clone(),
                });
            } else if !intended.contains(&m.id) {
                changes.push(UnexpectedChange::Changed {
                    id: m.id.clone(),
                    field: c.field.clone(),
                });
            }
        }
    }
    if changes.is_empty() {
        Ok(())
    } else {
        Err(GuardRefusal { changes })
    }
}

/// The entry fields that never change within a generation, for any model: its behaviour
/// version and `uses_external_gpu`.
pub fn fixed_within_generation(field: &str) -> bool {
    field == keys::VERSION || field == keys::USES_EXTERNAL_GPU
}

/// Whether a fixed field differs in meaning: an absent `uses_external_gpu` is `false` (what
/// devices read), so writing the flag out where the Python tools left it absent is no change of
/// target.
fn fixed_values_differ(field: &str, before: &crate::ModelEntry, after: &crate::ModelEntry) -> bool {
    if field == keys::USES_EXTERNAL_GPU {
        before.uses_external_gpu() != after.uses_external_gpu()
    } else {
        before.get(field) != after.get(field)
    }
}

/// One way a new generation's manifest departs from the previous generation's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerationChange {
    /// In the new generation but not the old, and not named with `--add-model`.
    #[error("+ model {0} is new (name it with --add-model {0})")]
    Added(ModelId),
    /// In the old generation but not the new, and not named with `--drop-model`.
    #[error(
        "- model {0} is missing (model IDs stay stable across generations; name it with \
         --drop-model {0} to retire it)"
    )]
    Dropped(ModelId),
    /// Named with `--add-model` but already in the old generation (or absent from the new).
    #[error("--add-model {0}, but {0} is not a new model in this manifest")]
    NamedAddNotAdded(ModelId),
    /// Named with `--drop-model` but not in the old generation (or still in the new).
    #[error(
        "--drop-model {0}, but {0} is not a model the previous generation had and this one lacks"
    )]
    NamedDropNotDropped(ModelId),
    /// The behaviour version changed: it must stay when only tinygrad changes.
    #[error(
        "~ model {id}: version {} -> {} (behaviour versions stay unchanged when only tinygrad \
         changes)",
        .old.as_deref().unwrap_or("(absent)"), .new.as_deref().unwrap_or("(absent)")
    )]
    Version {
        /// The model.
        id: ModelId,
        /// Its `version` in the old generation; `None` when absent.
        old: Option<String>,
        /// Its `version` in the new one; `None` when absent.
        new: Option<String>,
    },
    /// `uses_external_gpu` changed: a Chestnut build stays a Chestnut build.
    #[error(
        "~ model {id}: uses_external_gpu {old} -> {new} (only Chestnut builds set it, and a \
         model keeps its target)"
    )]
    ExternalGpu {
        /// The model.
        id: ModelId,
        /// `uses_external_gpu` in the old generation.
        old: bool,
        /// `uses_external_gpu` in the new one.
        new: bool,
    },
    /// An artifact (the model's own, or an `accelerator_artifacts` variant: `variant`) whose
    /// `artifact_sha256` is one the previous generation published (`from`, `from_variant`): a
    /// pickle compiled with the previous tinygrad, carried into the new generation.
    #[error(
        "~ model {id}: {} artifact_sha256 {sha256} is the previous generation's {} of model \
         {from}, compiled with the previous tinygrad (rebuild it for this generation with \
         `release-cli rebuild --workspace WS --generation vNN --source-map FILE --base-manifest \
         FILE --model {id}`, WS: the rebuild workspace, vNN: this generation, FILE: the source \
         map, then the previous generation's live manifest; or drop the variant; never carry an \
         artifact across generations)",
        artifact_kind(.variant), artifact_kind(.from_variant)
    )]
    Carried {
        /// The model in the new generation carrying the artifact.
        id: ModelId,
        /// `None` for the entry's own artifact, else the `accelerator_artifacts` key.
        variant: Option<String>,
        /// The carried digest.
        sha256: crate::Sha256Digest,
        /// The model of the previous generation that published it.
        from: ModelId,
        /// `None` when it was that model's own artifact, else its `accelerator_artifacts` key.
        from_variant: Option<String>,
    },
}

/// An entry's own artifact, or its accelerator variant `v`.
fn artifact_kind(v: &Option<String>) -> String {
    match v {
        Some(v) => format!("accelerator variant {v:?}"),
        None => "artifact".to_string(),
    }
}

/// Every departure of a new generation from the previous one, refused together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", Lines(changes, "  "))]
pub struct GenerationRefusal {
    /// Every change refused, in the order found.
    pub changes: Vec<GenerationChange>,
}

/// The rule between generations: a new generation keeps the previous one's model IDs (except
/// those named in `add` and `drop`), every behaviour version and every `uses_external_gpu`,
/// and publishes no artifact or accelerator variant whose SHA-256 the previous generation
/// published (its bytes were compiled with the previous tinygrad). Local models (`local-…`)
/// are not published and are ignored.
pub fn generation_guard(
    previous: &Manifest,
    new: &Manifest,
    add: &BTreeSet<ModelId>,
    drop: &BTreeSet<ModelId>,
) -> Result<(), GenerationRefusal> {
    let (old, cur) = (published(previous), published(new));
    let mut changes = Vec::new();
    for id in cur.keys().filter(|id| !old.contains_key(*id)) {
        if !add.contains(*id) {
            changes.push(GenerationChange::Added((*id).clone()));
        }
    }
    for id in old.keys().filter(|id| !cur.contains_key(*id)) {
        if !drop.contains(*id) {
            changes.push(GenerationChange::Dropped((*id).clone()));
        }
    }
    for id in add {
        if old.contains_key(id) || !cur.contains_key(id) {
            changes.push(GenerationChange::NamedAddNotAdded(id.clone()));
        }
    }
    for id in drop {
        if !old.contains_key(id) || cur.contains_key(id) {
            changes.push(GenerationChange::NamedDropNotDropped(id.clone()));
        }
    }
    for (id, before) in &old {
        let Some(after) = cur.get(id) else { continue };
        let raw = |e: &crate::ModelEntry| {
            e.fields().get(keys::VERSION).map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
        };
        let (ov, nv) = (raw(before), raw(after));
        if ov != nv {
            changes.push(GenerationChange::Version {
                id: (*id).clone(),
                old: ov,
                new: nv,
            });
        }
        let (og, ng) = (before.uses_external_gpu(), after.uses_external_gpu());
        if og != ng {
            changes.push(GenerationChange::ExternalGpu {
                id: (*id).clone(),
                old: og,
                new: ng,
            });
        }
    }
    changes.extend(carried(&old, &cur));
    if changes.is_empty() {
        Ok(())
    } else {
        Err(GenerationRefusal { changes })
    }
}

/// The entries of `m` that are published (not `local-`), by ID.
fn published(m: &Manifest) -> BTreeMap<&ModelId, &crate::ModelEntry> {
    let entries = m.models().iter().filter(|e| !e.id().is_local());
    entries.map(|e| (e.id(), e)).collect()
}

/// Every artifact of `cur` (each model's own and each accelerator variant) whose SHA-256 is one
/// of `old`'s, in `cur`'s order.
fn carried(
    old: &BTreeMap<&ModelId, &crate::ModelEntry>,
    cur: &BTreeMap<&ModelId, &crate::ModelEntry>,
) -> Vec<GenerationChange> {
    let digests = |e: &crate::ModelEntry| {
        let mut all = Vec::new();
        if let Some(d) = e.artifact_sha256() {
            all.push((None, d));
        }
        for (variant, a) in e.accelerators() {
            if let Some(d) = a.sha256 {
                all.push((Some(variant), d));
            }
        }
        all
    };
    let mut published = BTreeMap::new();
    for (id, e) in old {
        for (variant, d) in digests(e) {
            published.entry(d).or_insert(((*id).clone(), variant));
        }
    }
    let mut changes = Vec::new();
    for (id, e) in cur {
        for (variant, sha256) in digests(e) {
            if let Some((from, from_variant)) = published.get(&sha256) {
                changes.push(GenerationChange::Carried {
                    id: (*id).clone(),
                    variant,
                    sha256,
                    from: from.clone(),
                    from_variant: from_variant.clone(),
                });
            }
        }
    }
    changes
}

/// Why [`crate::guard()`] refuses to publish: every unexpected change, named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refusing to publish: the new manifest makes {} unexpected change{} to the live one:\n{}",
    .changes.len(), if .changes.len() == 1 { "" } else { "s" }, Lines(changes, "  - "))]
pub struct GuardRefusal {
    /// Every unexpected change, in the order found.
    pub changes: Vec<UnexpectedChange>,
}

#[cfg(test)]
mod within_generation_tests {
    use super::*;
    use serde_json::json;

    /// (id, version, uses_external_gpu: None = absent)
    fn m(generation: &str, pin: &str, entries: &[(&str, &str, Option<bool>)]) -> Manifest {
        let models: Vec<Value> = entries
            .iter()
            .map(|(id, v, gpu)| {
                let mut e = json!({"id": id, "name": id, "version": v});
                if let Some(g) = gpu {
                    e["uses_external_gpu"] = json!(g);
                }
                e
            })
            .collect();
        Manifest::from_value(
            json!({"generation": generation, "tinygrad_commit": pin, "models": models}),
        )
        .unwrap()
    }

    fn ids(list: &[&str]) -> BTreeSet<ModelId> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    /// Version and GPU flag are fixed for every model, intended (a directory in --artifacts)
    /// or not; other fields of intended models may change. For v25 and a made-up v26.
    #[test]
    fn version_and_gpu_flag_are_fixed_for_every_model() {
        let v25_pin = crate::PinTable::builtin()
            .get("v25".parse().unwrap())
            .unwrap()
            .to_string();
        for (generation, pin) in [
            ("v25", v25_pin.as_str()),
            ("v26", "00112233445566778899aabbccddeeff00112233"),
        ] {
            let live = m(
                generation,
                pin,
                &[("pop", "v15", None), ("chest", "v16", Some(true))],
            );
            type Case<'a> = (&'a str, Manifest, &'a [&'a str], Vec<(&'a str, &'a str)>);
            let cases: Vec<Case> = vec![
                ("unchanged", live.clone(), &["pop", "chest"], vec![]),
                (
                    "absent flag written as false: same target",
                    m(
                        generation,
                        pin,
                        &[("pop", "v15", Some(false)), ("chest", "v16", Some(true))],
                    ),
                    &["pop"],
                    vec![],
                ),
                (
                    "intended model changes its version",
                    m(
                        generation,
                        pin,
                        &[("pop", "v16", None), ("chest", "v16", Some(true))],
                    ),
                    &["pop", "chest"],
                    vec![("pop", "version")],
                ),
                (
                    "intended model becomes a Chestnut build",
                    m(
                        generation,
                        pin,
                        &[("pop", "v15", Some(true)), ("chest", "v16", Some(true))],
                    ),
                    &["pop", "chest"],
                    vec![("pop", "uses_external_gpu")],
                ),
                (
                    "intended Chestnut model becomes QCOM",
                    m(
                        generation,
                        pin,
                        &[("pop", "v15", None), ("chest", "v16", Some(false))],
                    ),
                    &["pop", "chest"],
                    vec![("chest", "uses_external_gpu")],
                ),
                (
                    "not intended: fixed field named as fixed",
                    m(
                        generation,
                        pin,
                        &[("pop", "v14", None), ("chest", "v16", Some(true))],
                    ),
                    &[],
                    vec![("pop", "version")],
                ),
            ];
            for (name, new, intended, want) in cases {
                let got: Vec<(String, String)> = match guard(&live, &new, &ids(intended)) {
                    Ok(()) => vec![],
                    Err(r) => r
                        .changes
                        .iter()
                        .map(|c| match c {
                            UnexpectedChange::Fixed { id, field, .. } => {
                                (id.to_string(), field.clone())
                            }
                            other => panic!("{generation} {name}: unexpected {other}"),
                        })
                        .collect(),
                };
                let want: Vec<(String, String)> = want
                    .iter()
                    .map(|(i, f)| (i.to_string(), f.to_string()))
                    .collect();
                assert_eq!(got, want, "{generation} {name}");
            }
        }
    }

    #[test]
    fn the_fixed_refusal_says_what_to_do() {
        let live = m(
            "v26",
            "00112233445566778899aabbccddeeff00112233",
            &[("pop", "v15", None)],
        );
        let new = m(
            "v26",
            "00112233445566778899aabbccddeeff00112233",
            &[("pop", "v16", None)],
        );
        let text = guard(&live, &new, &ids(&["pop"])).unwrap_err().to_string();
        assert!(
            text.contains(
                "model pop: version \"v15\" -> \"v16\" would change within the generation"
            ) && text.contains("new model ID"),
            "{text}"
        );
    }
}

#[cfg(test)]
mod generation_tests {
    use super::*;
    use serde_json::json;

    fn m(entries: &[(&str, &str, bool)]) -> Manifest {
        let models: Vec<Value> = entries
            .iter()
            .map(|(id, v, gpu)| json!({"id": id, "name": id, "version": v, "uses_external_gpu": gpu}))
            .collect();
        Manifest::from_value(json!({ "models": models })).unwrap()
    }

    fn ids(list: &[&str]) -> BTreeSet<ModelId> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn id(s: &str) -> ModelId {
        s.parse().unwrap()
    }

    #[test]
    fn the_generation_rule() {
        let v25 = m(&[
            ("pop", "v15", false),
            ("gwm", "v8", false),
            ("chest", "v16", true),
        ]);
        type Case<'a> = (
            &'a str,
            Manifest,
            &'a [&'a str],
            &'a [&'a str],
            Vec<GenerationChange>,
        );
        let cases: Vec<Case> = vec![
            ("same ids and versions", v25.clone(), &[], &[], vec![]),
            (
                "new pin only (artifacts change, versions stay)",
                m(&[
                    ("gwm", "v8", false),
                    ("chest", "v16", true),
                    ("pop", "v15", false),
                ]),
                &[],
                &[],
                vec![],
            ),
            (
                "an id appears and one vanishes, unnamed",
                m(&[
                    ("pop", "v15", false),
                    ("chest", "v16", true),
                    ("new", "v16", false),
                ]),
                &[],
                &[],
                vec![
                    GenerationChange::Added(id("new")),
                    GenerationChange::Dropped(id("gwm")),
                ],
            ),
            (
                "both named",
                m(&[
                    ("pop", "v15", false),
                    ("chest", "v16", true),
                    ("new", "v16", false),
                ]),
                &["new"],
                &["gwm"],
                vec![],
            ),
            (
                "names that do not match a difference",
                v25.clone(),
                &["pop"],
                &["ghost"],
                vec![
                    GenerationChange::NamedAddNotAdded(id("pop")),
                    GenerationChange::NamedDropNotDropped(id("ghost")),
                ],
            ),
            (
                "version and external GPU changes, each listed",
                m(&[
                    ("pop", "v16", false),
                    ("gwm", "v8", true),
                    ("chest", "v16", false),
                ]),
                &[],
                &[],
                vec![
                    GenerationChange::ExternalGpu {
                        id: id("chest"),
                        old: true,
                        new: false,
                    },
                    GenerationChange::ExternalGpu {
                        id: id("gwm"),
                        old: false,
                        new: true,
                    },
                    GenerationChange::Version {
                        id: id("pop"),
                        old: Some("v15".into()),
                        new: Some("v16".into()),
                    },
                ],
            ),
        ];
        for (name, new, add, drop, want) in cases {
            let got = generation_guard(&v25, &new, &ids(add), &ids(drop))
                .err()
                .map(|r| r.changes)
                .unwrap_or_default();
            assert_eq!(got, want, "{name}");
        }
    }

    /// A manifest of `generation` (pinned to `pin`) whose models carry the given artifact
    /// digests: (id, own SHA-256, Chestnut variant SHA-256).
    fn built(
        generation: &str,
        pin: &str,
        entries: &[(&str, Option<char>, Option<char>)],
    ) -> Manifest {
        let sha = |c: char| c.to_string().repeat(64);
        let models: Vec<Value> = entries
            .iter()
            .map(|(id, own, chestnut)| {
                let mut e = json!({"id": id, "name": id, "version": "v16"});
                if let Some(c) = own {
                    e["artifact_sha256"] = json!(sha(*c));
                }
                if let Some(c) = chestnut {
                    e["accelerator_artifacts"] = json!({"chestnut": {
                        "artifact_filename": format!("{id}_driving_chestnut_tinygrad.pkl"),
                        "artifact_size": 100, "artifact_sha256": sha(*c),
                        "artifact_chunk_count": 0, "execution_device": "AMD"}});
                }
                e
            })
            .collect();
        Manifest::from_value(
            json!({"generation": generation, "tinygrad_commit": pin, "models": models}),
        )
        .unwrap()
    }

    /// No artifact or accelerator variant of the previous generation is published again in the
    /// next one: for v25 -> v26 and for a made-up v26 -> v27 alike.
    #[test]
    fn an_artifact_the_previous_generation_published_is_refused() {
        let v25_pin = crate::pins::PinTable::builtin()
            .get("v25".parse().unwrap())
            .unwrap()
            .to_string();
        let generations = [
            (
                "v25",
                v25_pin.as_str(),
                "v26",
                "2626262626262626262626262626262626262626",
            ),
            (
                "v26",
                "2626262626262626262626262626262626262626",
                "v27",
                "2727272727272727272727272727272727272727",
            ),
        ];
        let carried = |id: &str, variant: Option<&str>, c: char, from: &str, fv: Option<&str>| {
            GenerationChange::Carried {
                id: id.parse().unwrap(),
                variant: variant.map(str::to_owned),
                sha256: c.to_string().repeat(64).parse().unwrap(),
                from: from.parse().unwrap(),
                from_variant: fv.map(str::to_owned),
            }
        };
        for (old_gen, old_pin, new_gen, new_pin) in generations {
            let old = built(
                old_gen,
                old_pin,
                &[("gwm", Some('a'), Some('b')), ("pop", Some('c'), None)],
            );
            type Case<'a> = (
                &'a str,
                &'a [(&'a str, Option<char>, Option<char>)],
                Vec<GenerationChange>,
            );
            let cases: Vec<Case> = vec![
                (
                    "all rebuilt",
                    &[("gwm", Some('1'), Some('2')), ("pop", Some('3'), None)],
                    vec![],
                ),
                (
                    "variant dropped, artifacts not yet built",
                    &[("gwm", None, None), ("pop", None, None)],
                    vec![],
                ),
                (
                    "the model's own artifact carried",
                    &[("gwm", Some('1'), Some('2')), ("pop", Some('c'), None)],
                    vec![carried("pop", None, 'c', "pop", None)],
                ),
                (
                    "a stale Chestnut variant carried",
                    &[("gwm", Some('1'), Some('b')), ("pop", Some('3'), None)],
                    vec![carried(
                        "gwm",
                        Some("chestnut"),
                        'b',
                        "gwm",
                        Some("chestnut"),
                    )],
                ),
                (
                    "another model's old artifact, as a variant",
                    &[("gwm", Some('1'), Some('a')), ("pop", Some('3'), None)],
                    vec![carried("gwm", Some("chestnut"), 'a', "gwm", None)],
                ),
            ];
            for (name, entries, want) in cases {
                let new = built(new_gen, new_pin, entries);
                let got = generation_guard(&old, &new, &BTreeSet::new(), &BTreeSet::new())
                    .err()
                    .map(|r| r.changes)
                    .unwrap_or_default();
                assert_eq!(got, want, "{old_gen} -> {new_gen}: {name}");
            }
            let new = built(
                new_gen,
                new_pin,
                &[("gwm", Some('1'), Some('b')), ("pop", Some('3'), None)],
            );
            let text = generation_guard(&old, &new, &BTreeSet::new(), &BTreeSet::new())
                .unwrap_err()
                .to_string();
            assert!(
                text.contains(&format!(
                    "model gwm: accelerator variant \"chestnut\" artifact_sha256 {}",
                    "b".repeat(64)
                )) && text.contains("release-cli rebuild"),
                "{text}"
            );
        }
    }

    #[test]
    fn the_refusal_lists_every_difference_with_its_flag() {
        let old = m(&[("a", "v8", false), ("b", "v8", false)]);
        let new = m(&[("a", "v9", false), ("c", "v8", false)]);
        let text = generation_guard(&old, &new, &BTreeSet::new(), &BTreeSet::new())
            .unwrap_err()
            .to_string();
        assert!(text.contains("--add-model c"), "{text}");
        assert!(text.contains("--drop-model b"), "{text}");
        assert!(text.contains("version v8 -> v9"), "{text}");
        assert_eq!(text.lines().count(), 3, "{text}");
    }
}
