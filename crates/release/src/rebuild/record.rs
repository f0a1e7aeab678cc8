//! The records a run keeps in the workspace, when one still counts as done, and the manifest
//! made from them.

use std::path::{Path, PathBuf};

use chunker::Expected;
use compiler_remote::InputFormat;
use manifest::{
    Artifact, ArtifactSize, BehaviorVersion, ChunkCount, Generation, GitCommit, Manifest, ModelId,
    keys,
};
use serde::{Deserialize, Serialize};

use super::PlannedModel;
use crate::{Error, Result, Workspace};

/// `results/<id>.json`: what was built, from what, with which pin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildRecord {
    pub id: ModelId,
    pub status: String,
    pub generation: Generation,
    pub tinygrad_commit: GitCommit,
    pub version: BehaviorVersion,
    pub source_id: ModelId,
    pub input_format: InputFormat,
    pub uses_external_gpu: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub source_commit: Option<GitCommit>,
    pub sources: Vec<String>,
    pub artifact: RecordedArtifact,
    /// The `accelerator_artifacts` variants rebuilt with the model, for this generation and
    /// pin. Empty in records made before variants were rebuilt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<RecordedVariant>,
    pub log: PathBuf,
}

/// One accelerator variant built with its model: the `accelerator_artifacts` key, the device
/// it runs on, and its artifact (`<id>_driving_<variant>_tinygrad.pkl` beside the model's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedVariant {
    pub variant: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_device: Option<String>,
    pub artifact: RecordedArtifact,
}

/// A variant of the base catalog that the new manifest does not carry, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VariantDropped {
    pub id: ModelId,
    pub variant: String,
    pub reason: String,
}

impl std::fmt::Display for VariantDropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "model {}: accelerator variant {:?} dropped from the manifest ({}); devices with that accelerator use the model's own artifact until a rebuilt variant is published",
            self.id, self.variant, self.reason
        )
    }
}

/// Why `contract` does not allow the accelerator variant `key` on an entry (GPU flag `gpu`,
/// `model_lab_eligible` `lab`), or `None` when it does. The v25 contract allows every variant
/// its catalog declares; the v26 contract only its accelerator key, only on a non-GPU model
/// that is lab-eligible. Pure.
pub fn variant_refusal(
    contract: &manifest::Contract,
    key: &str,
    gpu: bool,
    lab: bool,
) -> Option<String> {
    let rule = contract.accelerator;
    if contract.whole_manifest_refusal && key != rule.key {
        return Some(format!(
            "the {} contract knows only the {:?} accelerator",
            contract.name, rule.key
        ));
    }
    if rule.requires_lab_eligible && (gpu || !lab) {
        return Some(format!(
            "the {} contract allows a {:?} variant only on a model without an external GPU \
             that is model_lab_eligible",
            contract.name, rule.key
        ));
    }
    None
}

/// The accelerator variants a rebuild under `contract` builds for `entry` (key, execution
/// device): under a contract whose variant depends on the model (v26), its accelerator key
/// where [`variant_refusal`] allows it; otherwise (v25) the variants the base catalog declares.
pub fn variants_to_build(
    entry: &manifest::ModelEntry,
    contract: &manifest::Contract,
    gpu: bool,
) -> Vec<(String, Option<String>)> {
    let rule = contract.accelerator;
    if rule.requires_lab_eligible {
        let lab = entry.model_lab_eligible() == Some(true);
        return match variant_refusal(contract, rule.key, gpu, lab) {
            None => vec![(
                rule.key.to_string(),
                Some(rule.execution_device.to_string()),
            )],
            Some(_) => Vec::new(),
        };
    }
    entry
        .accelerators()
        .into_iter()
        .map(|(k, v)| (k, v.execution_device))
        .collect()
}

/// The `accelerator_artifacts` block of one entry in a rebuilt manifest under `contract`: only
/// variants rebuilt for this generation and pin (`record`, which the caller matched to them) and
/// that the contract allows on this entry are written, in its artifact format, with its
/// execution device and (v26) the `pin` as the variant's `compiler_revision`; every other
/// variant of the base entry is dropped and named. Never a block from the base catalog. Pure.
pub fn variant_block_for(
    base: &manifest::ModelEntry,
    record: Option<&BuildRecord>,
    contract: &manifest::Contract,
    pin: Option<&GitCommit>,
) -> (Option<serde_json::Value>, Vec<VariantDropped>) {
    let gpu = record.map_or(base.uses_external_gpu(), |r| r.uses_external_gpu);
    let lab = base.model_lab_eligible() == Some(true);
    let mut rebuilt: Vec<&RecordedVariant> = Vec::new();
    let mut dropped = Vec::new();
    for v in record.map_or(&[][..], |r| &r.variants) {
        match variant_refusal(contract, &v.variant, gpu, lab) {
            None => rebuilt.push(v),
            Some(reason) => dropped.push(VariantDropped {
                id: base.id().clone(),
                variant: v.variant.clone(),
                reason,
            }),
        }
    }
    for (variant, _) in base.accelerators() {
        if dropped.iter().any(|d| d.variant == variant) {
            continue;
        }
        if !rebuilt.iter().any(|v| v.variant == variant) {
            dropped.push(VariantDropped {
                id: base.id().clone(),
                reason: match (record, variant_refusal(contract, &variant, gpu, lab)) {
                    (_, Some(reason)) => reason,
                    (None, None) => "the model has no build for this generation".into(),
                    (Some(_), None) => "it was not rebuilt for this generation".into(),
                },
                variant,
            });
        }
    }
    if rebuilt.is_empty() {
        return (None, dropped);
    }
    let mut block = serde_json::Map::new();
    for v in rebuilt {
        let mut fields = serde_json::Map::new();
        fields.insert(
            keys::ARTIFACT_FORMAT.into(),
            contract.artifact_format.into(),
        );
        fields.insert(
            keys::ARTIFACT_FILENAME.into(),
            v.artifact.name.clone().into(),
        );
        fields.insert(keys::ARTIFACT_SIZE.into(), v.artifact.size.into());
        fields.insert(
            keys::ARTIFACT_SHA256.into(),
            v.artifact.sha256.to_hex().into(),
        );
        fields.insert(
            keys::ARTIFACT_CHUNK_COUNT.into(),
            v.artifact.chunk_count.into(),
        );
        let device = match contract.accelerator.carries_compiler_revision {
            true => Some(contract.accelerator.execution_device.to_string()),
            false => v.execution_device.clone(),
        };
        if let Some(d) = device {
            fields.insert(keys::EXECUTION_DEVICE.into(), d.into());
        }
        if contract.accelerator.carries_compiler_revision
            && let Some(pin) = pin
        {
            fields.insert(keys::VARIANT_COMPILER_REVISION.into(), pin.as_str().into());
        }
        block.insert(v.variant.clone(), fields.into());
    }
    (Some(block.into()), dropped)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedArtifact {
    pub name: String,
    pub size: u64,
    pub sha256: chunker::Sha256Digest,
    pub chunk_count: u32,
    pub files: Vec<String>,
    /// SHA-256 of each chunk, in order: written to the manifest as `artifact_chunk_sha256` so
    /// devices reject a bad chunk as soon as it arrives. Empty in records made before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunk_sha256: Vec<chunker::Sha256Digest>,
}

/// `results/<id>.failure.json`: the latest failed attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    pub id: ModelId,
    pub status: String,
    pub generation: Generation,
    pub error: String,
    pub log: PathBuf,
}

/// Whether a success record is for this build (same generation and pin).
pub fn record_matches(r: &BuildRecord, generation: Generation, pin: &GitCommit) -> bool {
    r.status == "compiled" && r.generation == generation && &r.tinygrad_commit == pin
}

/// Whether a success record was built from what the plan asks for now: the same behaviour
/// version, sources (`source_id`, `ref`), input format and GPU target. A record made before the
/// source map or the base catalog changed is stale, and the model is built again.
pub fn record_fits(r: &BuildRecord, p: &PlannedModel) -> bool {
    r.id == p.source.id
        && r.version == p.version
        && r.source_id == p.source.source_id
        && r.input_format == p.source.input_format
        && r.uses_external_gpu == p.gpu
        && r.source_commit == p.source.source_commit
}

/// The manifest for publish: the base catalog with, for every model built for this generation
/// and pin, its artifact fields and `source_commit`; artifact fields of every other model are
/// dropped, and so is every variant not rebuilt with its model. Behaviour versions are never
/// touched. Under `contract`: its top-level keys (v26: `generation`,
/// `compiler_revision`, `artifact_abi`; another contract's revision key is removed), its
/// artifact format, and only the accelerator variants it allows ([`variant_block_for`]). The
/// base is expected to hold the contract's entries already (for v26, the tree's reviewed
/// catalog: [`tree_base`]).
pub fn build_manifest_for(
    base: &Manifest,
    records: &[BuildRecord],
    generation: Generation,
    pin: &GitCommit,
    contract: &manifest::Contract,
) -> Result<Manifest> {
    let mut m = base.clone();
    m.set_contract_keys(generation, pin, contract);
    for other in manifest::contract::CONTRACTS.iter() {
        if other.revision_key != contract.revision_key {
            let _ = m.remove_top_level(other.revision_key);
        }
    }
    let ids: Vec<ModelId> = m.ids().cloned().collect();
    for id in ids {
        let record = records.iter().find(|r| r.id == id);
        // Under a contract whose entries are the tree's catalog rows (v26), devices read every
        // row from their tree: the manifest lists only the models built, so that every
        // manifest a run writes (after each model) is publishable.
        if record.is_none() && contract.entries_from_tree_catalog {
            m.remove(&id);
            continue;
        }
        let entry = m.get_mut(&id).expect("listed");
        match variant_block_for(entry, record, contract, Some(pin)).0 {
            Some(block) => entry.set(keys::ACCELERATOR_ARTIFACTS, block)?,
            None => {
                entry.remove(keys::ACCELERATOR_ARTIFACTS)?;
            }
        }
        match record {
            Some(r) => {
                let artifact = Artifact::for_contract(
                    contract,
                    ArtifactSize::new(r.artifact.size)?,
                    r.artifact.sha256,
                    ChunkCount::new(u64::from(r.artifact.chunk_count))?,
                );
                if r.artifact.chunk_sha256.len() == r.artifact.chunk_count as usize
                    && r.artifact.chunk_count > 0
                {
                    entry.set_artifact_with_chunks(&artifact, &r.artifact.chunk_sha256)?;
                } else {
                    entry.set_artifact(&artifact);
                    entry.remove(keys::ARTIFACT_CHUNK_SHA256)?;
                }
                if let Some(c) = &r.source_commit {
                    entry.set_source_commit(c);
                }
                entry.set_uses_external_gpu(r.uses_external_gpu);
            }
            None => {
                for k in [
                    keys::ARTIFACT_FORMAT,
                    keys::ARTIFACT_SIZE,
                    keys::ARTIFACT_SHA256,
                    keys::ARTIFACT_CHUNK_COUNT,
                    keys::ARTIFACT_URL,
                    keys::ARTIFACT_CHUNK_SHA256,
                ] {
                    entry.remove(k)?;
                }
            }
        }
    }
    Ok(m)
}

/// The base of a rebuild under a contract that takes its entries from the tree's reviewed
/// catalog (v26): the base catalog's entries that are rows of the tree's catalog, each with the
/// row's `version`, `uses_external_gpu` and (when true, or already present)
/// `model_lab_eligible`, then the rows the base lacks as new entries (`id`, `name`, `version`,
/// `uses_external_gpu`, `model_lab_eligible`), in the catalog's order. Returns it and the base's
/// ids the tree's catalog does not list (dropped). Pure.
pub fn tree_base(
    base: &Manifest,
    tree: &manifest::TreeDeclaration,
) -> Result<(Manifest, Vec<ModelId>)> {
    let mut m = base.clone();
    let mut dropped = Vec::new();
    for id in base.ids() {
        if tree.row(id.as_str()).is_none() {
            m.remove(id);
            dropped.push(id.clone());
        }
    }
    for row in &tree.catalog {
        match m.get_mut(&row.id) {
            Some(entry) => {
                entry.set_version(row.version);
                entry.set_uses_external_gpu(row.uses_external_gpu);
                if row.model_lab_eligible || entry.get(keys::MODEL_LAB_ELIGIBLE).is_some() {
                    entry.set(keys::MODEL_LAB_ELIGIBLE, row.model_lab_eligible.into())?;
                }
            }
            None => {
                let mut fields = serde_json::Map::new();
                fields.insert(keys::ID.into(), row.id.as_str().into());
                fields.insert(keys::NAME.into(), row.name.clone().into());
                fields.insert(keys::VERSION.into(), row.version.to_string().into());
                fields.insert(keys::USES_EXTERNAL_GPU.into(), row.uses_external_gpu.into());
                fields.insert(
                    keys::MODEL_LAB_ELIGIBLE.into(),
                    row.model_lab_eligible.into(),
                );
                m.insert(manifest::ModelEntry::from_map(fields)?)?;
            }
        }
    }
    Ok((m, dropped))
}

// ---- building -----------------------------------------------------------------------------

pub(super) fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    crate::records::read(path).ok()
}

/// The recorded behaviour version of a built model (for `validate --workspace`).
pub fn recorded_version(workspace: &Workspace, id: &ModelId) -> Result<BehaviorVersion> {
    let path = workspace.build_record(id);
    read_json::<BuildRecord>(&path)
        .map(|r| r.version)
        .ok_or(Error::RecordMissing { path })
}

/// Whether `ready/<id>/` still holds exactly what the record says.
pub(super) fn ready_verifies(workspace: &Workspace, r: &BuildRecord) -> bool {
    let logical = workspace.ready_model(&r.id).join(&r.artifact.name);
    chunker::verify(
        &logical,
        &Expected {
            sha256: Some(r.artifact.sha256),
            size: Some(r.artifact.size),
            chunk_count: Some(r.artifact.chunk_count),
            chunk_sha256: (!r.artifact.chunk_sha256.is_empty())
                .then(|| r.artifact.chunk_sha256.clone()),
            ..Expected::default()
        },
    )
    .is_ok()
}
