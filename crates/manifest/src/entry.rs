//! One model entry of a manifest.
//!
//! An entry keeps its JSON object as read (keys in their original order, unknown keys in place)
//! and answers typed questions about it. Every known field in that object passed the reader
//! checks when the entry was built, and every setter only writes valid values, so the typed
//! getters cannot meet a malformed value.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::Sha256Digest;
use crate::error::{Error, Result};
use crate::keys;
use crate::types::{
    ArtifactFormat, ArtifactSize, BehaviorVersion, ChunkCount, FileName, GitCommit, ModelId,
    ModelName, ReleaseDate,
};
use crate::validate::check_entry_reader;

/// The fields every release-tool entry starts with (see [`ModelEntry::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEntry {
    /// The model ID; fixed for the entry's life.
    pub id: ModelId,
    /// The display name.
    pub name: ModelName,
    /// The behaviour version.
    pub version: BehaviorVersion,
    /// The `series` (model family) it belongs to.
    pub series: String,
    /// The `released` date.
    pub released: ReleaseDate,
    /// Whether the model is marked a community favourite.
    pub community_favorite: bool,
    /// Whether it runs on the external GPU (`uses_external_gpu`).
    pub uses_external_gpu: bool,
}

/// What a manifest says about a logical artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// `artifact_format`.
    pub format: ArtifactFormat,
    /// `artifact_size`: bytes of the logical artifact.
    pub size: ArtifactSize,
    /// `artifact_sha256`: SHA-256 of the whole logical artifact.
    pub sha256: Sha256Digest,
    /// `artifact_chunk_count`: 0 for one plain file, else the number of chunks.
    pub chunk_count: ChunkCount,
}

impl Artifact {
    /// A `tinygrad_single_v1` artifact, the only format we publish.
    pub fn tinygrad(size: ArtifactSize, sha256: Sha256Digest, chunk_count: ChunkCount) -> Self {
        Self {
            format: ArtifactFormat::TinygradSingleV1,
            size,
            sha256,
            chunk_count,
        }
    }

    /// An artifact in the format `contract` publishes (v25 `tinygrad_single_v1`, v26
    /// `tinygrad_single_v1_arena`).
    pub fn for_contract(
        contract: &crate::Contract,
        size: ArtifactSize,
        sha256: Sha256Digest,
        chunk_count: ChunkCount,
    ) -> Self {
        Self {
            format: ArtifactFormat::parse(contract.artifact_format),
            size,
            sha256,
            chunk_count,
        }
    }
}

/// One `accelerator_artifacts` variant (v25: `chestnut`, a precompiled eGPU build).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceleratorArtifact {
    /// `artifact_format`, when the variant has one.
    pub format: Option<ArtifactFormat>,
    /// `artifact_filename`: the variant's logical file name, when not the default.
    pub filename: Option<FileName>,
    /// `artifact_size` in bytes.
    pub size: Option<ArtifactSize>,
    /// `artifact_sha256` of the whole variant artifact.
    pub sha256: Option<Sha256Digest>,
    /// `artifact_chunk_count` (0 for a plain file).
    pub chunk_count: Option<ChunkCount>,
    /// `execution_device` (`"AMD"` for Chestnut).
    pub execution_device: Option<String>,
}

/// One model of a manifest: its ID and its JSON object as read, every key in its original order
/// (unknown keys kept in place).
/// Every known field present passed the reader checks ([`crate::ValidationMode::Reader`]) when the
/// entry was built, and every setter writes only valid values, so the typed getters return `None`
/// only for an absent field, never for a malformed one. The `id` cannot change: build a new entry
/// instead.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelEntry {
    id: ModelId,
    fields: Map<String, Value>,
}

impl ModelEntry {
    /// A new entry with the release tool's keys in its order: `id, name, version, series,
    /// released, community_favorite, [artifact_format, artifact_size, artifact_sha256,
    /// artifact_chunk_count,] uses_external_gpu`.
    pub fn new(new: NewEntry, artifact: Option<&Artifact>) -> Self {
        let mut fields = Map::new();
        fields.insert(keys::ID.into(), new.id.as_str().into());
        fields.insert(keys::NAME.into(), new.name.as_str().into());
        fields.insert(keys::VERSION.into(), new.version.to_string().into());
        fields.insert(keys::SERIES.into(), new.series.into());
        fields.insert(keys::RELEASED.into(), new.released.to_string().into());
        fields.insert(
            keys::COMMUNITY_FAVORITE.into(),
            new.community_favorite.into(),
        );
        let mut entry = Self { id: new.id, fields };
        if let Some(a) = artifact {
            entry.set_artifact(a);
        }
        entry.put(keys::USES_EXTERNAL_GPU, new.uses_external_gpu.into());
        entry
    }

    /// Builds an entry from a JSON object, enforcing the reader rules (see
    /// [`crate::ValidationMode::Reader`]). Problem paths are relative to the entry.
    pub fn from_map(fields: Map<String, Value>) -> Result<Self> {
        let mut problems = Vec::new();
        check_entry_reader(&fields, "", &mut problems);
        if !problems.is_empty() {
            return Err(Error::Invalid(problems));
        }
        let id = fields
            .get(keys::ID)
            .and_then(Value::as_str)
            .ok_or_else(|| Error::invalid("model entry", "", "missing id"))?
            .parse()?;
        Ok(Self { id, fields })
    }

    /// The model ID.
    pub fn id(&self) -> &ModelId {
        &self.id
    }

    /// The raw JSON object, keys in order.
    pub fn fields(&self) -> &Map<String, Value> {
        &self.fields
    }

    /// The raw value of `key`, known or not.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.fields.get(key)
    }

    /// The JSON object, keys in order.
    pub fn into_fields(self) -> Map<String, Value> {
        self.fields
    }

    fn str_field(&self, key: &str) -> Option<&str> {
        self.fields.get(key).and_then(Value::as_str)
    }

    /// Parses a field that the reader checks already proved valid.
    fn typed<T: std::str::FromStr>(&self, key: &str) -> Option<T> {
        let parsed = self.str_field(key)?.parse().ok();
        debug_assert!(
            parsed.is_some(),
            "{key} was validated when the entry was built"
        );
        parsed
    }

    fn uint(&self, key: &str) -> Option<u64> {
        self.fields.get(key).and_then(Value::as_u64)
    }

    fn flag(&self, key: &str) -> Option<bool> {
        self.fields.get(key).and_then(Value::as_bool)
    }

    /// `name`, when present.
    pub fn name(&self) -> Option<&str> {
        self.str_field(keys::NAME)
    }

    /// `version`, when present.
    pub fn version(&self) -> Option<BehaviorVersion> {
        self.typed(keys::VERSION)
    }

    /// `series`, when present.
    pub fn series(&self) -> Option<&str> {
        self.str_field(keys::SERIES)
    }

    /// `released`, when present.
    pub fn released(&self) -> Option<ReleaseDate> {
        self.typed(keys::RELEASED)
    }

    /// `community_favorite`, when present.
    pub fn community_favorite(&self) -> Option<bool> {
        self.flag(keys::COMMUNITY_FAVORITE)
    }

    /// `uses_external_gpu`, false when absent (as on devices).
    pub fn uses_external_gpu(&self) -> bool {
        self.flag(keys::USES_EXTERNAL_GPU).unwrap_or(false)
    }

    /// `model_size` (`small` or `chestnut`), when present.
    pub fn model_size(&self) -> Option<&str> {
        self.str_field(keys::MODEL_SIZE)
    }

    /// `model_lab_eligible`, when present.
    pub fn model_lab_eligible(&self) -> Option<bool> {
        self.flag(keys::MODEL_LAB_ELIGIBLE)
    }

    /// `artifact_format`, when present (an unknown value is [`ArtifactFormat::Unsupported`]).
    pub fn artifact_format(&self) -> Option<ArtifactFormat> {
        self.str_field(keys::ARTIFACT_FORMAT)
            .map(ArtifactFormat::parse)
    }

    /// Whether devices keep this entry: `artifact_format` absent, empty or `tinygrad_single_v1`.
    pub fn is_supported(&self) -> bool {
        self.artifact_format().is_none_or(|f| f.is_supported())
    }

    /// Whether a device of `contract` loads this entry's artifact: `artifact_format` absent or
    /// the contract's (v25 also takes an empty one, as [`ModelEntry::is_supported`] does).
    pub fn is_supported_by(&self, contract: &crate::Contract) -> bool {
        self.artifact_format().is_none_or(|f| {
            f.as_str() == contract.artifact_format
                || (f == ArtifactFormat::Empty && !contract.whole_manifest_refusal)
        })
    }

    /// `artifact_size` in bytes, when present.
    pub fn artifact_size(&self) -> Option<ArtifactSize> {
        self.uint(keys::ARTIFACT_SIZE)
            .and_then(|n| ArtifactSize::new(n).ok())
    }

    /// `artifact_sha256`, when present.
    pub fn artifact_sha256(&self) -> Option<Sha256Digest> {
        self.typed(keys::ARTIFACT_SHA256)
    }

    /// `artifact_chunk_count`, when present (absent means one plain file to devices).
    pub fn artifact_chunk_count(&self) -> Option<ChunkCount> {
        self.uint(keys::ARTIFACT_CHUNK_COUNT)
            .and_then(|n| ChunkCount::new(n).ok())
    }

    /// The artifact when size and digest are both known. A missing format means "" and a
    /// missing chunk count means 0 (one plain file), as devices read them.
    pub fn artifact(&self) -> Option<Artifact> {
        Some(Artifact {
            format: self.artifact_format().unwrap_or(ArtifactFormat::Empty),
            size: self.artifact_size()?,
            sha256: self.artifact_sha256()?,
            chunk_count: self
                .artifact_chunk_count()
                .unwrap_or(ChunkCount::PLAIN_FILE),
        })
    }

    /// `artifact_filename`, when present (see [`ModelEntry::file_name`] for the default).
    pub fn artifact_filename(&self) -> Option<FileName> {
        self.typed(keys::ARTIFACT_FILENAME)
    }

    /// The name of the logical artifact file: `artifact_filename`, else
    /// `<id>_driving_tinygrad.pkl`.
    pub fn file_name(&self) -> FileName {
        self.artifact_filename()
            .unwrap_or_else(|| crate::layout::artifact_file_name(&self.id))
    }

    /// `artifact_url`, when present (an http(s) URL the Python tools may write).
    pub fn artifact_url(&self) -> Option<&str> {
        self.str_field(keys::ARTIFACT_URL)
    }

    /// Extension: the commit of the source model this artifact was built from.
    pub fn source_commit(&self) -> Option<GitCommit> {
        self.typed(keys::SOURCE_COMMIT)
    }

    /// Extension: the SHA-256 of each chunk, in chunk order.
    pub fn chunk_digests(&self) -> Option<Vec<Sha256Digest>> {
        let items = self.fields.get(keys::ARTIFACT_CHUNK_SHA256)?.as_array()?;
        items
            .iter()
            .map(|v| v.as_str().and_then(|s| s.parse().ok()))
            .collect()
    }

    /// The `accelerator_artifacts` variants, in order.
    pub fn accelerators(&self) -> Vec<(String, AcceleratorArtifact)> {
        let Some(Value::Object(variants)) = self.fields.get(keys::ACCELERATOR_ARTIFACTS) else {
            return Vec::new();
        };
        variants
            .iter()
            .filter_map(|(name, v)| {
                let f = v.as_object()?;
                let s = |k: &str| f.get(k).and_then(Value::as_str);
                let u = |k: &str| f.get(k).and_then(Value::as_u64);
                Some((
                    name.clone(),
                    AcceleratorArtifact {
                        format: s(keys::ARTIFACT_FORMAT).map(ArtifactFormat::parse),
                        filename: s(keys::ARTIFACT_FILENAME).and_then(|x| x.parse().ok()),
                        size: u(keys::ARTIFACT_SIZE).and_then(|n| ArtifactSize::new(n).ok()),
                        sha256: s(keys::ARTIFACT_SHA256).and_then(|x| x.parse().ok()),
                        chunk_count: u(keys::ARTIFACT_CHUNK_COUNT)
                            .and_then(|n| ChunkCount::new(n).ok()),
                        execution_device: s(keys::EXECUTION_DEVICE).map(str::to_owned),
                    },
                ))
            })
            .collect()
    }

    /// Replaces a key's value where it stands, or appends the key at the end — what a Python
    /// `entry[key] = value` does (the map keeps insertion order), so our rewrites order keys
    /// like the Python tools' do.
    fn put(&mut self, key: &str, value: Value) {
        self.fields.insert(key.to_owned(), value);
    }

    /// Sets `artifact_format`, `artifact_size`, `artifact_sha256` and `artifact_chunk_count`;
    /// keys that are new are appended in that (the release tool's) order. Per-chunk digests
    /// that no longer match the count are dropped rather than left stale.
    pub fn set_artifact(&mut self, artifact: &Artifact) {
        put_artifact(&mut self.fields, artifact);
        if let Some(Value::Array(d)) = self.fields.get(keys::ARTIFACT_CHUNK_SHA256)
            && d.len() != artifact.chunk_count.get() as usize
        {
            self.fields.shift_remove(keys::ARTIFACT_CHUNK_SHA256);
        }
    }

    /// Sets the artifact together with its per-chunk digests (extension field), which must be
    /// one per chunk.
    pub fn set_artifact_with_chunks(
        &mut self,
        artifact: &Artifact,
        chunk_digests: &[Sha256Digest],
    ) -> Result<()> {
        if chunk_digests.len() != artifact.chunk_count.get() as usize {
            return Err(Error::invalid(
                "chunk digest list",
                &format!("{} digests", chunk_digests.len()),
                format!("artifact_chunk_count is {}", artifact.chunk_count),
            ));
        }
        self.set_artifact(artifact);
        let list = chunk_digests
            .iter()
            .map(|d| Value::String(d.to_hex()))
            .collect();
        self.put(keys::ARTIFACT_CHUNK_SHA256, Value::Array(list));
        Ok(())
    }

    /// The remote file name of an `accelerator_artifacts` variant: its `artifact_filename`, else
    /// `<id>_driving_<variant>_tinygrad.pkl`. `None` when the entry has no such variant.
    pub fn accelerator_file_name(&self, variant: &str) -> Option<FileName> {
        let (_, v) = self
            .accelerators()
            .into_iter()
            .find(|(name, _)| name == variant)?;
        v.filename.or_else(|| {
            format!("{}_driving_{variant}_tinygrad.pkl", self.id)
                .parse()
                .ok()
        })
    }

    /// Sets an existing `accelerator_artifacts` variant's `artifact_format`, `artifact_size`,
    /// `artifact_sha256` and `artifact_chunk_count` (in place, other keys kept). The variant must
    /// exist: its `execution_device` is not ours to invent.
    pub fn set_accelerator_artifact(&mut self, variant: &str, artifact: &Artifact) -> Result<()> {
        let slot = self
            .fields
            .get_mut(keys::ACCELERATOR_ARTIFACTS)
            .and_then(Value::as_object_mut)
            .and_then(|m| m.get_mut(variant))
            .and_then(Value::as_object_mut)
            .ok_or_else(|| {
                Error::invalid(
                    "accelerator variant",
                    variant,
                    format!(
                        "model {} has no accelerator_artifacts.{variant} object; add the variant \
                         (with its execution_device) to the entry first",
                        self.id
                    ),
                )
            })?;
        put_artifact(slot, artifact);
        Ok(())
    }

    /// Sets `source_commit` (our extension) in place, or appends it.
    pub fn set_source_commit(&mut self, commit: &GitCommit) {
        self.put(keys::SOURCE_COMMIT, commit.as_str().into());
    }

    /// Sets `name` in place, or appends it.
    pub fn set_name(&mut self, name: &ModelName) {
        self.put(keys::NAME, name.as_str().into());
    }

    /// Sets `version` in place, or appends it.
    pub fn set_version(&mut self, version: BehaviorVersion) {
        self.put(keys::VERSION, version.to_string().into());
    }

    /// Sets `community_favorite` in place, or appends it.
    pub fn set_community_favorite(&mut self, favorite: bool) {
        self.put(keys::COMMUNITY_FAVORITE, favorite.into());
    }

    /// Sets `uses_external_gpu` in place, or appends it.
    pub fn set_uses_external_gpu(&mut self, gpu: bool) {
        self.put(keys::USES_EXTERNAL_GPU, gpu.into());
    }

    /// Sets any key, known or not. A known key's value must pass the reader checks; `id`
    /// cannot be changed (build a new entry instead).
    pub fn set(&mut self, key: &str, value: Value) -> Result<()> {
        if key == keys::ID {
            return Err(Error::IdIsFixed);
        }
        let mut probe = Map::new();
        probe.insert(keys::ID.into(), self.id.as_str().into());
        probe.insert(key.into(), value);
        let mut problems = Vec::new();
        check_entry_reader(&probe, "", &mut problems);
        if !problems.is_empty() {
            return Err(Error::InvalidField {
                key: key.into(),
                problems,
            });
        }
        let value = probe.shift_remove(key).expect("just inserted");
        self.put(key, value);
        Ok(())
    }

    /// Removes a key, keeping the order of the others. `id` cannot be removed.
    pub fn remove(&mut self, key: &str) -> Result<Option<Value>> {
        if key == keys::ID {
            return Err(Error::IdIsFixed);
        }
        Ok(self.fields.shift_remove(key))
    }
}

/// The four artifact keys of `artifact`, each in place or appended in the release tool's order.
fn put_artifact(map: &mut Map<String, Value>, artifact: &Artifact) {
    map.insert(
        keys::ARTIFACT_FORMAT.into(),
        artifact.format.as_str().into(),
    );
    map.insert(keys::ARTIFACT_SIZE.into(), artifact.size.get().into());
    map.insert(
        keys::ARTIFACT_SHA256.into(),
        artifact.sha256.to_hex().into(),
    );
    map.insert(
        keys::ARTIFACT_CHUNK_COUNT.into(),
        artifact.chunk_count.get().into(),
    );
}

impl Serialize for ModelEntry {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.fields.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ModelEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let map = Map::deserialize(d)?;
        Self::from_map(map).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::to_canonical_string;
    use serde_json::json;

    fn digest(c: char) -> Sha256Digest {
        c.to_string().repeat(64).parse().unwrap()
    }

    fn catalog_entry() -> ModelEntry {
        let v = json!({"id": "tr16223", "name": "TR16 👀📡", "version": "v8", "series": "TR Series",
            "released": "2025-07-21", "community_favorite": false, "uses_external_gpu": false,
            "x_note": "kept"});
        ModelEntry::from_map(v.as_object().unwrap().clone()).unwrap()
    }

    #[test]
    fn an_accelerator_variant_gets_its_artifact_fields_in_place() {
        let v = json!({"id": "gwm8223", "name": "G", "accelerator_artifacts": {"chestnut": {
            "artifact_filename": "gwm8223_driving_chestnut_tinygrad.pkl", "execution_device": "AMD"}}});
        let mut e = ModelEntry::from_map(v.as_object().unwrap().clone()).unwrap();
        assert_eq!(
            e.accelerator_file_name("chestnut").unwrap().as_str(),
            "gwm8223_driving_chestnut_tinygrad.pkl"
        );
        assert_eq!(e.accelerator_file_name("other"), None);
        let a = Artifact::tinygrad(
            ArtifactSize::new(5).unwrap(),
            digest('a'),
            ChunkCount::new(2).unwrap(),
        );
        e.set_accelerator_artifact("chestnut", &a).unwrap();
        let (_, got) = e.accelerators().remove(0);
        assert_eq!(
            (got.size, got.sha256, got.chunk_count),
            (Some(a.size), Some(a.sha256), Some(a.chunk_count))
        );
        assert_eq!(got.execution_device.as_deref(), Some("AMD"));
        // The entry's own artifact is untouched, and a missing variant is refused.
        assert_eq!(e.artifact_size(), None);
        let err = e
            .set_accelerator_artifact("rocm", &a)
            .unwrap_err()
            .to_string();
        assert!(err.contains("accelerator_artifacts.rocm"), "{err}");
        // Without artifact_filename, the default name.
        let v = json!({"id": "sc23", "name": "S", "accelerator_artifacts": {"chestnut": {}}});
        let e = ModelEntry::from_map(v.as_object().unwrap().clone()).unwrap();
        assert_eq!(
            e.accelerator_file_name("chestnut").unwrap().as_str(),
            "sc23_driving_chestnut_tinygrad.pkl"
        );
    }

    #[test]
    fn new_entries_have_the_release_tool_key_order() {
        let e = ModelEntry::new(
            NewEntry {
                id: "pop223".parse().unwrap(),
                name: "Pop 👀📡".parse().unwrap(),
                version: "v16".parse().unwrap(),
                series: "OP Series".into(),
                released: "2025-10-01".parse().unwrap(),
                community_favorite: false,
                uses_external_gpu: false,
            },
            Some(&Artifact::tinygrad(
                ArtifactSize::new(10).unwrap(),
                digest('a'),
                ChunkCount::new(1).unwrap(),
            )),
        );
        let keys: Vec<_> = e.fields().keys().map(String::as_str).collect();
        assert_eq!(keys, &keys::RELEASE_ORDER[..11]);
        assert_eq!(e.artifact().unwrap().size.get(), 10);
        assert_eq!(e.file_name().as_str(), "pop223_driving_tinygrad.pkl");
    }

    #[test]
    fn setters_keep_order_and_append_new_keys_in_release_order() {
        let mut e = catalog_entry();
        e.set_name(&"TR16 v2".parse().unwrap());
        let a = Artifact::tinygrad(
            ArtifactSize::new(99).unwrap(),
            digest('b'),
            ChunkCount::new(2).unwrap(),
        );
        e.set_artifact_with_chunks(&a, &[digest('c'), digest('d')])
            .unwrap();
        e.set_source_commit(&"1".repeat(40).parse().unwrap());
        let keys: Vec<_> = e.fields().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "id",
                "name",
                "version",
                "series",
                "released",
                "community_favorite",
                "uses_external_gpu",
                "x_note",
                "artifact_format",
                "artifact_size",
                "artifact_sha256",
                "artifact_chunk_count",
                "artifact_chunk_sha256",
                "source_commit",
            ]
        );
        assert_eq!(e.name(), Some("TR16 v2"));
        assert_eq!(e.chunk_digests().unwrap(), vec![digest('c'), digest('d')]);
        assert!(e.set_artifact_with_chunks(&a, &[digest('c')]).is_err());
        // A new count without digests drops the stale list.
        e.set_artifact(&Artifact::tinygrad(
            ArtifactSize::new(5).unwrap(),
            digest('e'),
            ChunkCount::new(1).unwrap(),
        ));
        assert!(e.get(keys::ARTIFACT_CHUNK_SHA256).is_none());
        // Re-setting keeps positions: serialization is stable.
        let before = to_canonical_string(&e);
        e.set_uses_external_gpu(false);
        assert_eq!(to_canonical_string(&e), before);
    }

    #[test]
    fn generic_set_validates_known_keys_and_protects_id() {
        let mut e = catalog_entry();
        let err = e
            .set("artifact_sha256", json!("ABC"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("artifact_sha256: not 64 lowercase hex digits"),
            "{err}"
        );
        assert!(e.set("name", json!("a,b")).is_err());
        assert!(matches!(e.set("id", json!("x")), Err(Error::IdIsFixed)));
        assert!(matches!(e.remove("id"), Err(Error::IdIsFixed)));
        e.set("unknown_thing", json!({"any": [1, 2]})).unwrap();
        assert_eq!(e.remove("x_note").unwrap(), Some(json!("kept")));
        let keys: Vec<_> = e.fields().keys().cloned().collect();
        assert_eq!(keys.last().unwrap(), "unknown_thing");
        assert_eq!(keys[6], "uses_external_gpu");
    }

    #[test]
    fn from_map_reports_every_problem() {
        let v = json!({"id": "A", "name": "a,b", "artifact_size": 0, "artifact_chunk_count": 100});
        let Err(Error::Invalid(problems)) = ModelEntry::from_map(v.as_object().unwrap().clone())
        else {
            panic!("expected problems");
        };
        let paths: Vec<_> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            ["id", "name", "artifact_size", "artifact_chunk_count"]
        );
    }

    #[test]
    fn accelerator_variants_are_typed() {
        let v = json!({"id": "gwm8223", "accelerator_artifacts": {"chestnut": {
            "artifact_format": "tinygrad_single_v1",
            "artifact_filename": "gwm8223_driving_chestnut_tinygrad.pkl",
            "artifact_size": 67571389, "artifact_sha256": "5".repeat(64),
            "artifact_chunk_count": 0, "execution_device": "AMD"}}});
        let e = ModelEntry::from_map(v.as_object().unwrap().clone()).unwrap();
        let acc = e.accelerators();
        assert_eq!(acc.len(), 1);
        assert_eq!(acc[0].0, "chestnut");
        assert_eq!(acc[0].1.size.unwrap().get(), 67571389);
        assert_eq!(acc[0].1.execution_device.as_deref(), Some("AMD"));
        assert!(e.artifact().is_none());
        assert!(e.is_supported());
    }
}
