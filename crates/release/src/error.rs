//! The crate's one error type.

use std::path::PathBuf;

use manifest::{Generation, GitCommit, ModelId};

/// What went wrong in a release step. Every message names the file, model or value involved and,
/// where there is one, the next step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading or writing a local file failed. Every filesystem call of this crate goes
    /// through `fs-err`, whose message names the operation and the path ("failed to open file
    /// `…`: …") and keeps the `kind()`; child processes have their own variants ([`Error::Spawn`],
    /// [`Error::Git`]).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A gate record in the workspace that does not parse.
    #[error(
        "{path}: not a readable record ({reason}); rerun the command that writes it (`release-cli \
         preflight`, or `release-cli validate` for a .validation.json or .check.json)"
    )]
    Record {
        path: std::path::PathBuf,
        reason: String,
    },
    /// `preflight --openpilot` is not an openpilot checkout it can test.
    #[error("--openpilot {openpilot}: {reason}; pass the openpilot checkout (with ./dev, .venv and tinygrad_repo/TINYGRAD_COMMIT)", openpilot = openpilot.display())]
    NotACheckout {
        openpilot: std::path::PathBuf,
        reason: String,
    },
    /// A preflight command could not be started or waited for.
    #[error("cannot run `{command}` in {dir}: {source}; is the checkout set up (`./dev` executable, `.venv` made by `./dev sync`)?", dir = dir.display())]
    Spawn {
        command: String,
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The validation gate refused a publish: every missing, failed or stale cell, one per line.
    #[error(
        "publish refused: the records in {workspace} do not cover the seed's validation matrix \
         for this manifest:\n  {}\nnext: run what each line says, or publish with \
         --skip-validation \"REASON\" (the reason is written into the publish record)",
        gaps.join("\n  "),
        workspace = workspace.display()
    )]
    ValidationGate {
        workspace: std::path::PathBuf,
        gaps: Vec<String>,
    },

    /// A directory the command works in does not exist.
    #[error("{flag} {}: not a directory", path.display())]
    NotADirectory { flag: &'static str, path: PathBuf },

    /// `--openpilot` is not an openpilot checkout.
    #[error("{} does not exist; is --openpilot the openpilot tree?", path.display())]
    NotAnOpenpilotTree { path: PathBuf },

    /// A source map that cannot be used as it is.
    #[error("{}: {problem}", path.display())]
    SourceMap { path: PathBuf, problem: String },

    /// A `--model` without a source-map entry.
    #[error("{id} has no entry in the source map; add its source_id, input_format and ref")]
    NotInSourceMap { id: ModelId },

    /// A `--model` the base catalog does not list.
    #[error(
        "{id} is not in the base manifest; models absent from the catalog are not added unless \
         the release asks for them"
    )]
    NotInCatalog { id: ModelId },

    /// A base catalog entry without a behaviour version.
    #[error("{id}: the base manifest entry has no behaviour version")]
    NoBehaviourVersion { id: ModelId },

    /// A manifest file that does not parse.
    #[error("{}: {source}", path.display())]
    ManifestFile {
        path: PathBuf,
        #[source]
        source: manifest::Error,
    },

    /// A manifest value the crate computed was refused by the manifest model.
    #[error(transparent)]
    Manifest(#[from] manifest::Error),

    /// No build record to take a value from.
    #[error("{} is missing or unreadable; pass --version vN", path.display())]
    RecordMissing { path: PathBuf },

    /// The recorded generation↔pin pairs (`tinygrad_pins.json`) do not parse or conflict.
    #[error("{}: {problem}", path.display())]
    Pins { path: PathBuf, problem: String },

    /// `tinygrad bump` would record a pair the pin rules refuse.
    #[error("tinygrad bump refused: {refusal}")]
    BumpRefused { refusal: manifest::PinRefusal },

    /// There is no generation after this one.
    #[error("{generation} is the last generation number")]
    LastGeneration { generation: Generation },

    /// The tinygrad checkout is not at the commit being recorded.
    #[error("{} is at {head:?}, not {commit}; check out the commit first", path.display())]
    CheckoutAtOtherCommit {
        path: PathBuf,
        head: String,
        commit: GitCommit,
    },

    /// `git` could not be run.
    #[error("git rev-parse in {}: {source}", path.display())]
    Git {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The artifact's bytes do not match its own `.sha256` sidecar.
    #[error(
        "{}: SHA-256 {actual} does not match its .sha256 ({expected}); the built-in model was \
         not changed",
        path.display()
    )]
    SidecarMismatch {
        path: PathBuf,
        actual: chunker::Sha256Digest,
        expected: chunker::Sha256Digest,
    },

    /// `reuse` into the current generation with another tinygrad revision.
    #[error(
        "reuse refused: generation {generation} is pinned to tinygrad {pinned}, not {given}; an \
         artifact from another tinygrad revision is never renamed into this generation"
    )]
    ReuseOtherPin {
        generation: Generation,
        pinned: GitCommit,
        given: GitCommit,
    },

    /// `reuse --manifest` names a manifest built with another tinygrad.
    #[error("reuse refused: {} records tinygrad {recorded}, not {given}", path.display())]
    ReuseManifestPin {
        path: PathBuf,
        recorded: GitCommit,
        given: GitCommit,
    },

    /// A rebuild stopped: every further model would have failed the same way.
    #[error("the run stopped: {reason}; fix it and rerun the same command to resume")]
    RunStopped { reason: String },

    /// Some models of a rebuild failed; the others are done.
    #[error(
        "{} model(s) failed: {}; see {}/<id>.failure.json and the logs; rerun the same command \
         to retry them",
        ids.len(),
        ids.iter().map(ModelId::as_str).collect::<Vec<_>>().join(", "),
        results.display()
    )]
    ModelsFailed { ids: Vec<ModelId>, results: PathBuf },

    /// `uses_external_gpu` in the manifest is not what the build records say was built.
    #[error(
        "publish refused: uses_external_gpu disagrees with the build record:\n  {}\nnext: set \
         uses_external_gpu to what was built (rerun `release-cli rebuild`, which writes it from \
         the record), or rebuild the model for the target the catalog says (the source map's \
         uses_external_gpu)",
        mismatches.join("\n  ")
    )]
    GpuFlag { mismatches: Vec<String> },

    /// A chunk-set operation failed (its error names the file).
    #[error(transparent)]
    Chunk(#[from] chunker::Error),

    /// A store operation failed or was refused (its error names the store and path).
    #[error(transparent)]
    Store(#[from] artifact_store::Error),

    /// The compiler refused or failed (its error names the host and command).
    #[error(transparent)]
    Compiler(#[from] compiler_remote::Error),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
