//! A model as a device names it: id, display name and behaviour version — the triple the
//! selection and profile params carry (`DrivingModel`, `DrivingModelName`,
//! `DrivingModelVersion`, ...), that `status` and `resolve` report, and that a device of an
//! earlier generation was left with. One type for all of them (docs/device.md, "Persistent
//! params").

use serde::Serialize;

use crate::entry::ModelEntry;
use crate::layout;
use crate::types::ModelId;

/// A model as named: `id`, `name` (the id when nothing better is known) and `version`
/// (`v15`; empty when unknown, which devices read as "the artifact's").
///
/// `I` is the id's type: a [`ModelId`], or `String` for the id exactly as the params hold it
/// (reported as read even when it is not a valid id). Serializes as
/// `{"id","name","version"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct NamedModel<I = ModelId> {
    /// The model ID.
    pub id: I,
    /// The display name; the ID when nothing better is known.
    pub name: String,
    /// The behaviour version (`v15`); empty when unknown.
    pub version: String,
}

impl NamedModel {
    /// The built-in model as the params name it (`rdf43`, "Regret Driven Framework V4", `v15`).
    pub fn builtin() -> Self {
        NamedModel {
            id: layout::builtin_model_id(),
            name: layout::BUILTIN_MODEL_NAME.to_string(),
            version: layout::BUILTIN_MODEL_VERSION.to_string(),
        }
    }

    /// A manifest entry as named: its name (else its id) and its version (else empty).
    pub fn of_entry(entry: &ModelEntry) -> Self {
        NamedModel {
            id: entry.id().clone(),
            name: entry.name().unwrap_or(entry.id().as_str()).to_string(),
            version: entry.version().map(|v| v.to_string()).unwrap_or_default(),
        }
    }

    /// The same model with its id as text, as the params hold it.
    pub fn into_text(self) -> NamedModel<String> {
        NamedModel {
            id: self.id.to_string(),
            name: self.name,
            version: self.version,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Manifest;
    use serde_json::json;

    #[test]
    fn a_named_model_serializes_as_id_name_version_whatever_its_id_type() {
        let m = Manifest::from_value(json!({"models": [
            {"id": "pop223", "name": "Pop", "version": "v16"},
            {"id": "bare1"},
        ]}))
        .unwrap();
        for (model, want) in [
            (
                NamedModel::of_entry(&m.models()[0]),
                json!({"id": "pop223", "name": "Pop", "version": "v16"}),
            ),
            (
                NamedModel::of_entry(&m.models()[1]),
                json!({"id": "bare1", "name": "bare1", "version": ""}),
            ),
            (
                NamedModel::builtin(),
                json!({"id": "rdf43", "name": "Regret Driven Framework V4", "version": "v15"}),
            ),
        ] {
            assert_eq!(serde_json::to_value(&model).unwrap(), want);
            assert_eq!(serde_json::to_value(model.into_text()).unwrap(), want);
        }
        let raw = NamedModel {
            id: "not an id".to_string(),
            name: String::new(),
            version: String::new(),
        };
        assert_eq!(
            serde_json::to_value(raw).unwrap(),
            json!({"id": "not an id", "name": "", "version": ""})
        );
    }
}
