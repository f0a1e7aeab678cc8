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
pub use signature::{ReleaseNumber, TrustedComment, UnixSeconds};
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
    pub const MODELS: &str = "models";

    pub const ID: &str = "id";
    pub const NAME: &str = "name";
    pub const VERSION: &str = "version";
    pub const SERIES: &str = "series";
    pub const RELEASED: &str = "released";
    pub const COMMUNITY_FAVORITE: &str = "community_favorite";
    pub const ARTIFACT_FORMAT: &str = "artifact_format";
    pub const ARTIFACT_SIZE: &str = "artifact_size";
    pub const ARTIFACT_SHA256: &str = "artifact_sha256";
    pub const ARTIFACT_CHUNK_COUNT: &str = "artifact_chunk_count";
    pub const USES_EXTERNAL_GPU: &str = "uses_external_gpu";

    pub const MODEL_SIZE: &str = "model_size";
    pub const MODEL_LAB_ELIGIBLE: &str = "model_lab_eligible";
    pub const ACCELERATOR_ARTIFACTS: &str = "accelerator_artifacts";
    pub const ARTIFACT_FILENAME: &str = "artifact_filename";
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
    pub const ENTRY_EXTENSIONS: [&str; 2] = [SOURCE_COMMIT, ARTIFACT_CHUNK_SHA256];
}
