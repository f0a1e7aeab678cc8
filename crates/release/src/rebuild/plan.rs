//! The plan: the source map, and which models a run builds.

use std::path::Path;

use compiler_remote::InputFormat;
use manifest::{BehaviorVersion, GitCommit, Manifest, ModelId};

use crate::{Error, Result};

/// One entry of the source map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceEntry {
    pub id: ModelId,
    /// The archive directory `onnx/<source_id>/` (defaults to the model ID).
    pub source_id: ModelId,
    pub input_format: InputFormat,
    /// The openpilot commit holding the ONNX; becomes `source_commit` in the manifest.
    pub source_commit: Option<GitCommit>,
    pub uses_external_gpu: Option<bool>,
}

/// Parse a source map (an object keyed by model ID,
/// `{"<id>": {"source_id", "input_format", "ref", "uses_external_gpu"}}`), keeping its order.
pub fn parse_source_map(bytes: &[u8], path: &Path) -> Result<Vec<SourceEntry>> {
    let bad = |problem: String| Error::SourceMap {
        path: path.to_path_buf(),
        problem,
    };
    let doc: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    let obj = doc
        .as_object()
        .ok_or_else(|| bad("must be an object keyed by model ID".into()))?;
    let mut out = Vec::new();
    for (key, val) in obj {
        let id: ModelId = key.parse().map_err(|e| bad(format!("{e}")))?;
        let v = val
            .as_object()
            .ok_or_else(|| bad(format!("{key}: must be an object")))?;
        let str_field = |name: &str| -> Result<Option<&str>> {
            match v.get(name) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s)),
                Some(other) => Err(bad(format!("{key}.{name}: expected a string, got {other}"))),
            }
        };
        let source_id = match str_field("source_id")? {
            Some(s) => s
                .parse()
                .map_err(|e| bad(format!("{key}.source_id: {e}")))?,
            None => id.clone(),
        };
        let input_format = match str_field("input_format")? {
            // `auto` lets the compiler pick; with one staged model it finds the supercombo.
            None | Some("auto") | Some("supercombo") => InputFormat::Supercombo,
            Some("split") => InputFormat::Split,
            Some(other) => {
                return Err(bad(format!(
                    "{key}.input_format: {other:?} is not split, supercombo or auto"
                )));
            }
        };
        let source_commit = match str_field("ref")? {
            Some(r) => Some(r.parse().map_err(|e| {
                bad(format!(
                    "{key}.ref: {e} (the source map must record full commits)"
                ))
            })?),
            None => None,
        };
        let uses_external_gpu = match v.get("uses_external_gpu") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Bool(b)) => Some(*b),
            Some(other) => {
                return Err(bad(format!(
                    "{key}.uses_external_gpu: expected true or false, got {other}"
                )));
            }
        };
        out.push(SourceEntry {
            id,
            source_id,
            input_format,
            source_commit,
            uses_external_gpu,
        });
    }
    Ok(out)
}

/// One model to build, with everything the compile needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedModel {
    pub source: SourceEntry,
    pub version: BehaviorVersion,
    pub gpu: bool,
}

/// The models to build, in source-map order (or `only` order), and the source-map models left
/// out because the base catalog does not have them (models are never added unasked).
pub fn plan(
    map: &[SourceEntry],
    base: &Manifest,
    only: &[ModelId],
) -> Result<(Vec<PlannedModel>, Vec<ModelId>)> {
    let planned_for = |s: &SourceEntry| -> Result<Option<PlannedModel>> {
        let Some(entry) = base.get(&s.id) else {
            return Ok(None);
        };
        let version = entry
            .version()
            .ok_or_else(|| Error::NoBehaviourVersion { id: s.id.clone() })?;
        Ok(Some(PlannedModel {
            source: s.clone(),
            version,
            gpu: s.uses_external_gpu.unwrap_or(entry.uses_external_gpu()),
        }))
    };
    let mut models = Vec::new();
    let mut not_in_catalog = Vec::new();
    if only.is_empty() {
        for s in map {
            match planned_for(s)? {
                Some(p) => models.push(p),
                None => not_in_catalog.push(s.id.clone()),
            }
        }
    } else {
        for id in only {
            let s = map
                .iter()
                .find(|s| &s.id == id)
                .ok_or_else(|| Error::NotInSourceMap { id: id.clone() })?;
            let p = planned_for(s)?.ok_or_else(|| Error::NotInCatalog { id: id.clone() })?;
            if !models.contains(&p) {
                models.push(p);
            }
        }
    }
    Ok((models, not_in_catalog))
}
