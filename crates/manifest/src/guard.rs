//! Manifest diff and the release guard (SPEC.md section 5, point 3).
//!
//! Both compare JSON values, not text: key order and entry order are not changes (the Python
//! guard compares parsed values too). Nested objects such as `accelerator_artifacts` are
//! compared field by field so a change is named down to its leaf
//! (`accelerator_artifacts.chestnut.artifact_sha256`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

use crate::Manifest;
use crate::error::GuardRefusal;
use crate::keys;
use crate::types::ModelId;
use crate::validate::join_key;

/// One field that differs. `old`/`new` is `None` when the field is absent on that side.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldChange {
    /// Dotted path inside the entry (or the top level), e.g. `artifact_size`.
    pub field: String,
    pub old: Option<Value>,
    pub new: Option<Value>,
}

impl fmt::Display for FieldChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<Value>| match v {
            Some(v) => crate::validate::abbreviate(&v.to_string()),
            None => "(absent)".into(),
        };
        write!(
            f,
            "{}: {} -> {}",
            self.field,
            show(&self.old),
            show(&self.new)
        )
    }
}

/// The changes of one model present on both sides.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelChange {
    pub id: ModelId,
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnexpectedChange {
    Added(ModelId),
    Removed(ModelId),
    Changed { id: ModelId, field: String },
    TopLevel { field: String },
}

impl fmt::Display for UnexpectedChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Added(id) => write!(
                f,
                "model {id} would be added, but it is not among the intended models"
            ),
            Self::Removed(id) => write!(
                f,
                "model {id} would be removed, but it is not among the intended models"
            ),
            Self::Changed { id, field } => write!(
                f,
                "model {id}: field {field} would change, but {id} is not among the intended models"
            ),
            Self::TopLevel { field } => write!(f, "top-level field {field} would change"),
        }
    }
}

/// Refuses to replace `live` by `new` unless every difference is expected: a model may be
/// added, removed or changed only when its ID is in `intended`, and no other entry may change
/// in any field, including inside `accelerator_artifacts`.
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
    for m in d.changed.iter().filter(|m| !intended.contains(&m.id)) {
        for c in &m.fields {
            changes.push(UnexpectedChange::Changed {
                id: m.id.clone(),
                field: c.field.clone(),
            });
        }
    }
    if changes.is_empty() {
        Ok(())
    } else {
        Err(GuardRefusal { changes })
    }
}
