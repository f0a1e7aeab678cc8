//! StarPilot model manifests, `model_names_<gen>.json` (docs/formats.md, "The manifest",
//! "Store layout" and "Release guard").
//!
//! What this crate does:
//! - parses a manifest into a typed [`Manifest`] of [`ModelEntry`]s, with newtypes that can only
//!   hold valid values ([`Generation`], [`ModelId`], [`BehaviorVersion`], [`Sha256Digest`], ...),
//!   while keeping every key — known or not — in its original order;
//! - writes it back byte-for-byte as the Python tools do ([`json`]), so a rewrite without changes
//!   is no change;
//! - validates at three levels and reports every problem with its JSON path ([`validate`]);
//! - names our extension fields once ([`keys`]) and the store layout once ([`layout`]);
//! - diffs two manifests and guards the live one against unintended changes ([`guard()`], [`diff()`]).
//!
//! What it does not do: no I/O beyond reading a byte slice or a bounded reader — fetching,
//! uploading and writing files belong to `downloader` and `artifact-store`; no chunk-set
//! handling (that is `chunker`); no filtering policy for devices beyond
//! [`ModelEntry::is_supported`].
//!
//! # Example
//!
//! Parse a manifest, read an entry through its typed getters, validate it at the release level,
//! and see a broken one refused with the JSON path of each problem:
//!
//! ```
//! use manifest::{Manifest, ModelId, ValidationMode};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let text = r#"{
//!   "models": [
//!     {
//!       "id": "pop223",
//!       "name": "Pop 223",
//!       "version": "v15",
//!       "series": "Pop",
//!       "released": "2025-06-01",
//!       "community_favorite": false,
//!       "artifact_format": "tinygrad_single_v1",
//!       "artifact_size": 94371840,
//!       "artifact_sha256": "1da45bc0a1fbaf4118e28c858f8f99c4a571fb630b6e7cfb44baf6fa106f759d",
//!       "artifact_chunk_count": 3,
//!       "uses_external_gpu": false
//!     }
//!   ]
//! }"#;
//!
//! // Parsing enforces the reader rules: every known field present is well-formed.
//! let manifest = Manifest::from_slice(text.as_bytes())?;
//! let id: ModelId = "pop223".parse()?;
//! let entry = manifest.get(&id).expect("pop223 is in the manifest");
//! assert_eq!(entry.version().map(|v| v.to_string()).as_deref(), Some("v15"));
//! assert_eq!(entry.artifact_chunk_count().map(|c| c.get()), Some(3));
//! assert_eq!(entry.file_name().as_str(), "pop223_driving_tinygrad.pkl");
//!
//! // The release level adds what publishing needs; this manifest has it all.
//! assert!(manifest.validate(ValidationMode::Release).is_empty());
//!
//! // Written back, a manifest without changes is byte-for-byte what was read.
//! assert_eq!(manifest.to_canonical_string().trim_end(), text);
//!
//! // A malformed field is refused with its JSON path; every problem is listed.
//! let broken = text.replace("\"v15\"", "\"15\"").replace("1da45bc0", "XYZ");
//! let err = Manifest::from_slice(broken.as_bytes()).unwrap_err();
//! let manifest::Error::Invalid(problems) = &err else { panic!("{err}") };
//! let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
//! assert_eq!(paths, ["models[0].version", "models[0].artifact_sha256"]);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod contract;
mod entry;
mod error;
pub mod guard;
pub mod json;
pub mod layout;
mod manifest;
mod named;
pub mod pins;
pub mod receipt;
pub mod signature;
pub mod stamp;
pub mod tolerant;
mod types;
pub mod validate;

pub use chunker::Sha256Digest;
pub use contract::{Contract, ContractName, DeviceLayout, TreeDeclaration, TreeFiles};
pub use entry::{AcceleratorArtifact, Artifact, ModelEntry, NewEntry};
pub use error::{Error, Result};
pub use guard::{
    FieldChange, GenerationChange, GenerationRefusal, GuardRefusal, ManifestDiff, ModelChange,
    UnexpectedChange, diff, generation_guard, guard,
};
pub use json::to_canonical_string;
pub use layout::{StoreLayout, StorePath};
pub use manifest::{Limits, Manifest};
pub use named::NamedModel;
pub use pins::{PinRefusal, PinTable, check_pin};
pub use signature::{ReleaseNumber, SignatureExpiry, TrustedComment, UnixSeconds};
pub use tolerant::{RefusedEntry, Tolerated};
pub use types::{
    ArtifactFormat, ArtifactSize, BehaviorVersion, ChunkCount, FileName, Generation, GitCommit,
    ModelId, ModelName, ReleaseDate,
};
pub use validate::{
    Expectation, Problem, ValidationMode, runtime_artifact, validate_bytes, validate_for_contract,
};

/// JSON keys of the manifest, each named once.
///
/// The Python fleet reads the documented keys (docs/formats.md, "Entry fields") and ignores
/// every other key, so our extensions ([`keys::GENERATION`], [`keys::TINYGRAD_COMMIT`],
/// [`keys::SOURCE_COMMIT`], [`keys::ARTIFACT_CHUNK_SHA256`]) are plain extra keys to it and safe
/// to add.
pub mod keys {
    /// Top level: the array of model entries.
    pub const MODELS: &str = "models";

    /// The model ID.
    pub const ID: &str = "id";
    /// The display name.
    pub const NAME: &str = "name";
    /// The behaviour version (`v15`).
    pub const VERSION: &str = "version";
    /// The series the model belongs to.
    pub const SERIES: &str = "series";
    /// The release date, `YYYY-MM-DD`.
    pub const RELEASED: &str = "released";
    /// Whether the model is a community favourite.
    pub const COMMUNITY_FAVORITE: &str = "community_favorite";
    /// The artifact's format (`tinygrad_single_v1`).
    pub const ARTIFACT_FORMAT: &str = "artifact_format";
    /// Bytes of the logical artifact.
    pub const ARTIFACT_SIZE: &str = "artifact_size";
    /// SHA-256 of the whole logical artifact.
    pub const ARTIFACT_SHA256: &str = "artifact_sha256";
    /// Number of chunks; 0 for one plain file.
    pub const ARTIFACT_CHUNK_COUNT: &str = "artifact_chunk_count";
    /// Whether the model runs on the external GPU.
    pub const USES_EXTERNAL_GPU: &str = "uses_external_gpu";

    /// `small` or `chestnut`.
    pub const MODEL_SIZE: &str = "model_size";
    /// A bool seen in the field; under the v26 contract an `amd` variant needs it true.
    pub const MODEL_LAB_ELIGIBLE: &str = "model_lab_eligible";
    /// Extra builds of the model for accelerators, keyed by variant (`chestnut`).
    pub const ACCELERATOR_ARTIFACTS: &str = "accelerator_artifacts";
    /// The logical artifact's file name, when not `<id>_driving_tinygrad.pkl`.
    pub const ARTIFACT_FILENAME: &str = "artifact_filename";
    /// An http(s) URL seen in the field; checked when present, never used to download.
    pub const ARTIFACT_URL: &str = "artifact_url";
    /// Inside an `accelerator_artifacts` variant (`"AMD"` for Chestnut).
    pub const EXECUTION_DEVICE: &str = "execution_device";

    /// Extension, top level: the generation this manifest belongs to (`"v25"`), so a file
    /// separated from its name still says which ABI it is for.
    pub const GENERATION: &str = "generation";
    /// Extension, top level: the full 40-hex tinygrad commit every artifact was compiled
    /// with. Reuse across catalogs requires it to be equal (docs/formats.md, "Artifact reuse").
    pub const TINYGRAD_COMMIT: &str = "tinygrad_commit";
    /// Extension, per entry: the full 40-hex commit of the source model (the openpilot commit
    /// holding the ONNX). Reuse requires it to be equal too.
    pub const SOURCE_COMMIT: &str = "source_commit";
    /// Extension, per entry: SHA-256 of each chunk, in chunk order; exactly
    /// `artifact_chunk_count` digests. Lets a reader reject a bad chunk as soon as it arrives
    /// instead of after the whole artifact.
    pub const ARTIFACT_CHUNK_SHA256: &str = "artifact_chunk_sha256";

    /// Order of the keys of a release-tool entry, then our extensions. New keys are appended
    /// in this order by the setters.
    pub const RELEASE_ORDER: [&str; 13] = [
        ID,
        NAME,
        VERSION,
        SERIES,
        RELEASED,
        COMMUNITY_FAVORITE,
        ARTIFACT_FORMAT,
        ARTIFACT_SIZE,
        ARTIFACT_SHA256,
        ARTIFACT_CHUNK_COUNT,
        USES_EXTERNAL_GPU,
        SOURCE_COMMIT,
        ARTIFACT_CHUNK_SHA256,
    ];

    /// Keys every entry of a complete catalog has.
    pub const CATALOG_REQUIRED: &[&str] =
        &[ID, NAME, VERSION, SERIES, RELEASED, COMMUNITY_FAVORITE];

    /// Our top-level extension keys.
    pub const TOP_LEVEL_EXTENSIONS: [&str; 2] = [GENERATION, TINYGRAD_COMMIT];

    // Keys of the v26 contract's schema (docs/formats.md, "Generation contracts"). Which
    // contract uses them, and with which values, is the contract table's business
    // (`crate::contract::CONTRACTS`); these are only the names.
    /// Top level: the ABI every artifact of the manifest is built for.
    pub const ARTIFACT_ABI: &str = "artifact_abi";
    /// Per entry: artifacts for newer runners, each with the runner revision it needs.
    pub const RUNTIME_ARTIFACTS: &str = "runtime_artifacts";
    /// Inside a `runtime_artifacts` variant: the lowest runner revision that can load it.
    pub const MIN_RUNNER_REVISION: &str = "min_runner_revision";
    /// Inside an `accelerator_artifacts` variant (v26): the compiler revision it was built with.
    pub const VARIANT_COMPILER_REVISION: &str = "compiler_revision";
    /// The keys a `runtime_artifacts` variant may carry.
    pub const RUNTIME_VARIANT_KEYS: [&str; 7] = [
        MIN_RUNNER_REVISION,
        ARTIFACT_FORMAT,
        ARTIFACT_SHA256,
        ARTIFACT_SIZE,
        ARTIFACT_CHUNK_COUNT,
        "conversion_provenance",
        "validation",
    ];
    /// The artifact keys every `runtime_artifacts` variant must carry.
    pub const RUNTIME_VARIANT_REQUIRED: [&str; 4] = [
        ARTIFACT_FORMAT,
        ARTIFACT_SHA256,
        ARTIFACT_SIZE,
        ARTIFACT_CHUNK_COUNT,
    ];
    /// Keys every entry of a catalog read from a tree's reviewed catalog has.
    pub const TREE_CATALOG_REQUIRED: &[&str] = &[ID, NAME, VERSION];
    /// Our per-entry extension keys.
    pub const ENTRY_EXTENSIONS: [&str; 2] = [SOURCE_COMMIT, ARTIFACT_CHUNK_SHA256];
}
