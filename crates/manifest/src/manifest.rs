//! The whole manifest document.

use std::io::Read;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::entry::ModelEntry;
use crate::error::{Error, Result};
use crate::keys;
use crate::types::{Generation, GitCommit, ModelId};
use crate::validate::{Problem, ValidationMode, check_document};

/// Bounds a reader puts on what a server can make it process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest manifest accepted, checked before parsing. Default 2 MiB: the real v25 catalog
    /// with artifact fields is under 100 KiB.
    pub max_manifest_bytes: u64,
}

impl Limits {
    /// The default of [`Limits::max_manifest_bytes`]: 2 MiB.
    pub const DEFAULT_MAX_MANIFEST_BYTES: u64 = 2 * 1024 * 1024;
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_manifest_bytes: Self::DEFAULT_MAX_MANIFEST_BYTES,
        }
    }
}

/// A parsed `model_names_<gen>.json`: top-level keys in order (unknown ones kept) and the model
/// entries. Always written in the object form, whatever was read.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// Every top-level key in order; the `models` slot holds `Null` and is filled from
    /// `models` on output, so the array's position among the other keys is kept.
    top: Map<String, Value>,
    models: Vec<ModelEntry>,
}

impl Default for Manifest {
    fn default() -> Self {
        Self::new()
    }
}

impl Manifest {
    /// An empty manifest: `{"models": []}`.
    pub fn new() -> Self {
        let mut top = Map::new();
        top.insert(keys::MODELS.into(), Value::Null);
        Self {
            top,
            models: Vec::new(),
        }
    }

    /// An empty manifest for a generation built with the given tinygrad commit:
    /// `{"generation": ..., "tinygrad_commit": ..., "models": []}`.
    pub fn for_generation(generation: Generation, tinygrad_commit: &GitCommit) -> Self {
        let v25 = crate::ContractName::V25.contract();
        Self::for_contract(generation, tinygrad_commit, v25)
    }

    /// An empty manifest of a generation under `contract`: the contract's required top-level
    /// keys in its order, then `models` (v26: `{"generation", "compiler_revision",
    /// "artifact_abi", "models": []}`). A contract without required keys (v25) gets
    /// [`Manifest::for_generation`]'s extensions, the revision under its `revision_key`.
    pub fn for_contract(
        generation: Generation,
        revision: &GitCommit,
        contract: &crate::Contract,
    ) -> Self {
        let mut m = Self {
            top: Map::new(),
            models: Vec::new(),
        };
        let keys_in_order: Vec<&str> = if contract.required_top_keys.is_empty() {
            vec![keys::GENERATION, contract.revision_key]
        } else {
            contract.required_top_keys.to_vec()
        };
        for key in keys_in_order {
            if key == keys::GENERATION {
                m.put_top(key, generation.to_string().into());
            } else if key == contract.revision_key {
                m.put_top(key, revision.as_str().into());
            } else if key == keys::ARTIFACT_ABI
                && let Some(abi) = contract.artifact_abi
            {
                m.put_top(key, abi.into());
            }
        }
        m.top.insert(keys::MODELS.into(), Value::Null);
        m
    }

    /// The revision under the contract's `revision_key` (v25 `tinygrad_commit`, v26
    /// `compiler_revision`), when present and a full commit.
    pub fn revision(&self, contract: &crate::Contract) -> Option<GitCommit> {
        self.top.get(contract.revision_key)?.as_str()?.parse().ok()
    }

    /// The revision under the key of the contract the manifest itself names by its
    /// `artifact_abi` (v26: `compiler_revision`), else under the base contract's
    /// (`tinygrad_commit`): what a tool without the generation's pin table reads.
    pub fn own_revision(&self) -> Option<GitCommit> {
        let named =
            crate::contract::named_by_manifest(&self.top).unwrap_or(crate::contract::BASE_CONTRACT);
        self.revision(named.contract())
    }

    /// Sets the revision under the contract's `revision_key`, in place or appended.
    pub fn set_revision(&mut self, contract: &crate::Contract, commit: &GitCommit) {
        self.put_top(contract.revision_key, commit.as_str().into());
    }

    /// The top-level `artifact_abi`, when present (v26).
    pub fn artifact_abi(&self) -> Option<&str> {
        self.top.get(keys::ARTIFACT_ABI)?.as_str()
    }

    /// Writes every top-level key the contract requires with its value for `generation` and
    /// `revision` (in place where present, else appended before nothing else changes).
    pub fn set_contract_keys(
        &mut self,
        generation: Generation,
        revision: &GitCommit,
        contract: &crate::Contract,
    ) {
        self.set_generation(generation);
        self.set_revision(contract, revision);
        if let Some(abi) = contract.artifact_abi {
            self.put_top(keys::ARTIFACT_ABI, abi.into());
        }
    }

    /// Every problem under `contract` at the given level, with the checks `expect` asks for.
    pub fn validate_for_contract(
        &self,
        mode: ValidationMode,
        contract: &crate::Contract,
        expect: &crate::Expectation<'_>,
    ) -> Vec<Problem> {
        crate::validate_for_contract(
            &self.to_canonical_bytes(),
            mode,
            contract,
            expect,
            &Limits::default(),
        )
    }

    /// Parses manifest bytes with the default [`Limits`] and the reader rules.
    pub fn from_slice(bytes: &[u8]) -> Result<Self> {
        Self::from_slice_limited(bytes, &Limits::default())
    }

    /// Parses manifest bytes: size limit first, then JSON, then the reader rules
    /// ([`ValidationMode::Reader`]), reporting every problem at once.
    pub fn from_slice_limited(bytes: &[u8], limits: &Limits) -> Result<Self> {
        Self::from_value(Self::json_within(bytes, limits)?)
    }

    /// The JSON document in `bytes`: the size limit first ([`Error::TooLarge`]), then the
    /// parse ([`Error::Json`]). Every byte-level read of a manifest starts here.
    pub(crate) fn json_within(bytes: &[u8], limits: &Limits) -> Result<Value> {
        if bytes.len() as u64 > limits.max_manifest_bytes {
            return Err(Error::TooLarge {
                limit: limits.max_manifest_bytes,
                actual: bytes.len() as u64,
            });
        }
        serde_json::from_slice(bytes).map_err(Error::Json)
    }

    /// Reads at most `limits.max_manifest_bytes + 1` bytes, so an endless body is cut off
    /// instead of being buffered, then parses as [`Manifest::from_slice_limited`].
    pub fn from_reader_limited(reader: impl Read, limits: &Limits) -> Result<Self> {
        let max = limits.max_manifest_bytes;
        match chunker::bounded::read_up_to(reader, max).map_err(Error::Read)? {
            Some(buf) => Self::from_slice_limited(&buf, limits),
            None => Err(Error::TooLarge {
                limit: max,
                actual: max.saturating_add(1),
            }),
        }
    }

    /// Builds a manifest from a JSON document (object with `models`, or a bare array),
    /// enforcing the reader rules.
    pub fn from_value(doc: Value) -> Result<Self> {
        let problems = check_document(&doc, ValidationMode::Reader);
        if !problems.is_empty() {
            return Err(Error::Invalid(problems));
        }
        let (top, items) = crate::tolerant::top_and_items(doc)?;
        let models = items.into_iter().map(|item| match item {
            Value::Object(map) => ModelEntry::from_map(map),
            _ => unreachable!("check_document checked every entry is an object"),
        });
        let models = models.collect::<Result<_>>()?;
        Ok(Self { top, models })
    }

    /// A manifest of entries that already passed the reader rules, under top-level keys that did
    /// (with a `models` slot).
    pub(crate) fn from_parts(top: Map<String, Value>, models: Vec<ModelEntry>) -> Self {
        Self { top, models }
    }

    /// The canonical text (see [`crate::json`]): what the Python tools would write.
    pub fn to_canonical_string(&self) -> String {
        crate::json::to_canonical_string(self)
    }

    /// [`Manifest::to_canonical_string`] as UTF-8 bytes: what is published.
    pub fn to_canonical_bytes(&self) -> Vec<u8> {
        self.to_canonical_string().into_bytes()
    }

    /// The manifest as a JSON value, keys in order.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a manifest always converts to a JSON value")
    }

    /// Every problem at the given level (see [`crate::validate`]). A parsed manifest already
    /// passes [`ValidationMode::Reader`], so only catalog and release rules can fail here.
    pub fn validate(&self, mode: ValidationMode) -> Vec<Problem> {
        check_document(&self.to_value(), mode)
    }

    /// The entries, in file order.
    pub fn models(&self) -> &[ModelEntry] {
        &self.models
    }

    /// The model IDs, in file order.
    pub fn ids(&self) -> impl Iterator<Item = &ModelId> {
        self.models.iter().map(ModelEntry::id)
    }

    /// The entry of model `id`.
    pub fn get(&self, id: &ModelId) -> Option<&ModelEntry> {
        self.models.iter().find(|e| e.id() == id)
    }

    /// Mutable access to one entry; its ID cannot change, so IDs stay unique.
    pub fn get_mut(&mut self, id: &ModelId) -> Option<&mut ModelEntry> {
        self.models.iter_mut().find(|e| e.id() == id)
    }

    /// Replaces the entry with the same ID where it stands, or appends it — the release tool's
    /// update rule. Returns the replaced entry.
    pub fn upsert(&mut self, entry: ModelEntry) -> Option<ModelEntry> {
        match self.models.iter_mut().find(|e| e.id() == entry.id()) {
            Some(slot) => Some(std::mem::replace(slot, entry)),
            None => {
                self.models.push(entry);
                None
            }
        }
    }

    /// Appends a model that must not be there yet.
    pub fn insert(&mut self, entry: ModelEntry) -> Result<()> {
        if self.get(entry.id()).is_some() {
            return Err(Error::DuplicateId(entry.id().to_string()));
        }
        self.models.push(entry);
        Ok(())
    }

    /// Removes and returns the entry of model `id`; the other entries keep their order.
    pub fn remove(&mut self, id: &ModelId) -> Option<ModelEntry> {
        let pos = self.models.iter().position(|e| e.id() == id)?;
        Some(self.models.remove(pos))
    }

    /// Extension `generation`, when present.
    pub fn generation(&self) -> Option<Generation> {
        self.top.get(keys::GENERATION)?.as_str()?.parse().ok()
    }

    /// Extension `tinygrad_commit`, when present.
    pub fn tinygrad_commit(&self) -> Option<GitCommit> {
        self.top.get(keys::TINYGRAD_COMMIT)?.as_str()?.parse().ok()
    }

    /// Sets `generation` in place, or appends it after the existing keys.
    pub fn set_generation(&mut self, generation: Generation) {
        self.put_top(keys::GENERATION, generation.to_string().into());
    }

    /// Sets `tinygrad_commit` in place, or appends it after the existing keys.
    pub fn set_tinygrad_commit(&mut self, commit: &GitCommit) {
        self.put_top(keys::TINYGRAD_COMMIT, commit.as_str().into());
    }

    /// In place, or appended (the map keeps insertion order).
    fn put_top(&mut self, key: &str, value: Value) {
        self.top.insert(key.into(), value);
    }

    /// Removes a top-level key other than `models`, keeping the order of the others.
    pub fn remove_top_level(&mut self, key: &str) -> Option<Value> {
        if key == keys::MODELS {
            return None;
        }
        self.top.shift_remove(key)
    }

    /// Top-level keys other than `models`, in order.
    pub fn top_level(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.top
            .iter()
            .filter(|(k, _)| *k != keys::MODELS)
            .map(|(k, v)| (k.as_str(), v))
    }

    /// Sets any top-level key except `models`; the extension keys must be valid.
    pub fn set_top_level(&mut self, key: &str, value: Value) -> Result<()> {
        let problem = |message: String| Error::InvalidField {
            key: key.into(),
            problems: vec![Problem {
                path: key.into(),
                message,
            }],
        };
        match key {
            keys::MODELS => return Err(problem("use upsert/insert/remove for models".into())),
            keys::GENERATION | keys::TINYGRAD_COMMIT => {
                let s = value
                    .as_str()
                    .ok_or_else(|| problem("expected a string".into()))?;
                let ok = if key == keys::GENERATION {
                    s.parse::<Generation>().map(drop)
                } else {
                    s.parse::<GitCommit>().map(drop)
                };
                ok.map_err(|e| problem(e.to_string()))?;
            }
            _ => {}
        }
        self.put_top(key, value);
        Ok(())
    }
}

impl Serialize for Manifest {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.top.len()))?;
        for (k, v) in &self.top {
            if k == keys::MODELS {
                map.serialize_entry(k, &self.models)?;
            } else {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}
