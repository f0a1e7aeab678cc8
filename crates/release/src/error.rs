//! The crate's one error type.

use std::path::PathBuf;

use cli_support::NextStep;

use manifest::{Generation, GitCommit, ModelId, StorePath};

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
         for this manifest:\n  {}",
        gaps.join("\n  "),
        workspace = workspace.display()
    )]
    ValidationGate {
        workspace: std::path::PathBuf,
        gaps: Vec<String>,
    },

    /// `validate` cannot run or record with the flags it was given (nothing was run or written).
    #[error("{problem}")]
    ValidateInput { problem: String },

    /// `rehearse` cannot run with what it was given (nothing was recorded).
    #[error("rehearse: {problem}")]
    RehearseInput { problem: String },

    /// A directory the command works in does not exist.
    #[error("{flag} {}: not a directory", path.display())]
    NotADirectory { flag: &'static str, path: PathBuf },

    /// `--openpilot` is not an openpilot checkout.
    #[error("{} does not exist; is --openpilot the openpilot tree?", path.display())]
    NotAnOpenpilotTree { path: PathBuf },

    /// A source map that cannot be used as it is.
    #[error("{}: {problem}", path.display())]
    SourceMap { path: PathBuf, problem: String },

    /// `--source-map` names no file: the next generation's map is written by `source-map next`.
    #[error(
        "{path}: no such source map; write the {generation} map from the previous generation's \
         with `release-cli source-map next --openpilot DIR` (DIR: the openpilot checkout; it \
         writes scripts/model_source_map_{generation}.json there), then rerun this command",
        path = path.display()
    )]
    SourceMapMissing {
        path: PathBuf,
        generation: Generation,
    },

    /// A rebuild of a new generation would set the previous one's release aside where one is
    /// already (nothing was moved).
    #[error(
        "{from} holds {generation}'s release, but {to} is already there: nothing was moved; keep \
         one of the two (rename the other out of the workspace), then rerun the rebuild",
        from = from.display(),
        to = to.display()
    )]
    SetAsideTaken {
        generation: Generation,
        from: PathBuf,
        to: PathBuf,
    },

    /// `source-map next` would overwrite a map that is already there with other content.
    #[error(
        "{path} is already there with other content (it may hold hand edits); `release-cli \
         source-map next --openpilot {openpilot} --dry-run --json` lists what it would keep, \
         leave out and add: remove the file first if it should be written again",
        path = path.display(),
        openpilot = cli_support::shell_quote(&openpilot.display().to_string())
    )]
    SourceMapExists { path: PathBuf, openpilot: PathBuf },

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

    /// `rebuild --generation` differs from the generation the openpilot tree declares.
    #[error(
        "rebuild --generation {generation}, but the openpilot tree declares {declared} (its \
         reviewed catalog is catalog-{declared}.json): rebuild {declared}, or pass the tree of \
         {generation}"
    )]
    RebuildTreeGeneration {
        generation: manifest::Generation,
        declared: manifest::Generation,
    },

    /// The recorded generation↔pin pairs (`tinygrad_pins.json`) do not parse or conflict.
    #[error("{}: {problem}", path.display())]
    Pins { path: PathBuf, problem: String },

    /// The tree's generation selectors (`MANIFEST_CANDIDATES`, the catalog module's
    /// `GENERATION`, the reviewed catalog's name) do not name exactly the generation of its
    /// tinygrad.
    #[error(
        "{openpilot}: the tree's tinygrad is {generation}'s pin, but:\n  {}",
        problems.join("\n  "),
        openpilot = openpilot.display()
    )]
    GenerationSelector {
        openpilot: PathBuf,
        generation: Generation,
        problems: Vec<String>,
    },

    /// A first publish of a whole-manifest generation (no `--to` store holds the previous
    /// generation's manifest) leaves out models of the previous generation's staged manifest
    /// without `--drop-model` ([`crate::catalog_guard`]). `rerun`: this publish with each named.
    #[error(
        "refusing to publish {generation}: it leaves out {}, which {previous}'s manifest {} \
         lists (no --to store holds {previous}'s manifest, so the workspace's is compared); \
         model IDs stay stable across generations, and one retired on purpose is named with \
         --drop-model ID",
        models.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        path.display()
    )]
    LeftOutOfGeneration {
        generation: Generation,
        previous: Generation,
        path: PathBuf,
        models: Vec<ModelId>,
        rerun: String,
    },

    /// A tree that declares its generation (upstream's catalog module) records its tinygrad
    /// (the generation's compiler revision) in its sync file, and its tinygrad marker names
    /// another commit: which one the compiler builds with would be a guess.
    #[error(
        "{}: holds {found:?}, but {} records tinygrad {declared} for the tree's {generation} \
         (the compiler revision every artifact and receipt must name); the two must agree and \
         nothing was run or written. next: write {declared} into {} (or remove it: this tree \
         records its tinygrad in {} alone), or correct {} if {declared} is not the tinygrad the \
         tree runs",
        marker.display(),
        sync_file.display(),
        marker.display(),
        sync_file.display(),
        sync_file.display()
    )]
    TreePinDisagrees {
        marker: PathBuf,
        found: String,
        sync_file: PathBuf,
        declared: GitCommit,
        generation: Generation,
    },

    /// `tinygrad bump` would record a pair the pin rules refuse.
    #[error("tinygrad bump refused: {refusal}")]
    BumpRefused { refusal: manifest::PinRefusal },

    /// `tinygrad bump` to a new commit while the generation it would make already has a pin:
    /// either that pin was mistyped, or MANIFEST_CANDIDATES still names the older generation.
    #[error(
        "tinygrad bump refused: {generation} is already pinned (tinygrad_pins.json in {}), and \
         the current generation the bump starts from is the one before it; nothing was \
         changed. next: if {commit} is {generation}'s right pin, correct it with `release-cli \
         tinygrad pin --openpilot {} --generation {generation} --commit {commit} --store \
         STORE` (every store you publish to); if it is the tinygrad of the generation after \
         {generation}, first set MANIFEST_CANDIDATES to (\"{generation}\",) ({}), then run \
         the bump again",
        openpilot.display(),
        openpilot.display(),
        candidates.as_deref().unwrap_or("not found under starpilot/")
    )]
    BumpPinned {
        generation: Generation,
        commit: GitCommit,
        openpilot: PathBuf,
        /// Where MANIFEST_CANDIDATES is defined (`file:line`).
        candidates: Option<String>,
    },

    /// `tinygrad pin` of a generation whose pin is built into the tools.
    #[error(
        "{generation}'s pin {pin} is built into this release of the tools, not recorded in a \
         tree; it cannot be corrected (a new tinygrad is the next generation: `release-cli \
         tinygrad bump`)"
    )]
    PinBuiltin {
        generation: Generation,
        pin: GitCommit,
    },

    /// `tinygrad pin` of a generation without a recorded pin.
    #[error(
        "no pin for {generation} is recorded in --openpilot's tinygrad_pins.json; nothing to \
         correct: `release-cli tinygrad bump` records one"
    )]
    PinNotRecorded { generation: Generation },

    /// `tinygrad pin` without a store to check.
    #[error(
        "correcting {generation}'s pin needs at least one --store to check that no manifest \
         with it is live (pass every store you publish to)"
    )]
    PinNoStoreChecked { generation: Generation },

    /// `tinygrad pin` of a generation a store holds live.
    #[error(
        "{generation} is live in {store} ({path} records tinygrad {}); a published pin never \
         changes: the tree was left as it was. next: a new tinygrad is the next generation \
         (`release-cli tinygrad bump`)",
        recorded.as_ref().map_or("none".to_string(), |c| c.to_string())
    )]
    PinLive {
        generation: Generation,
        store: String,
        path: String,
        recorded: Option<GitCommit>,
    },

    /// A store's manifest of the generation cannot be read as one.
    #[error(
        "{store} {path}: not a readable manifest ({problem}); whether the pin is live cannot \
         be told, so nothing was changed"
    )]
    PinStoreUnreadable {
        store: String,
        path: String,
        problem: String,
    },

    /// The corrected pair is one the pin rules refuse (a pin another generation has).
    #[error("tinygrad pin refused: {refusal}; nothing was changed")]
    PinCorrectionRefused { refusal: manifest::PinRefusal },

    /// There is no generation after this one.
    #[error("{generation} is the last generation number")]
    LastGeneration { generation: Generation },

    /// The tinygrad checkout is not at the commit being recorded.
    #[error(
        "{} is a git checkout at {head}, not --commit {commit}; the commit of a checkout is its \
         HEAD: check out {commit} there, or leave --commit out to bump to {head}",
        path.display()
    )]
    CheckoutAtOtherCommit {
        path: PathBuf,
        head: String,
        commit: GitCommit,
    },

    /// A git checkout with changes its HEAD commit does not have: the copy would not be the
    /// commit it is recorded as.
    #[error(
        "{} is a git checkout at {head} with changes that commit does not have ({}); the copy \
         would not be tinygrad {head}, and nothing was changed. next: commit them (a new commit \
         is a new pin) or set them aside (`git -C {} stash --include-untracked`), then run the \
         bump again",
        path.display(),
        changes.join(", "),
        path.display()
    )]
    CheckoutDirty {
        path: PathBuf,
        head: GitCommit,
        /// `git status --porcelain` lines, at most ten (then `…`).
        changes: Vec<String>,
    },

    /// `tinygrad bump` from a tree without git metadata and without `--commit`.
    #[error(
        "{} is not a git checkout, so its commit cannot be read from it; pass --commit SHA (the \
         full tinygrad commit this tree is; the tree's digest is recorded with it), or bump from \
         a git checkout of that commit",
        path.display()
    )]
    BumpNeedsCommit { path: PathBuf },

    /// A git checkout whose HEAD is not a commit (a fresh `git init`, a broken repository).
    #[error(
        "{}: a git checkout without a readable HEAD commit ({detail}); check out the tinygrad \
         commit there, or pass a plain directory with --commit SHA",
        path.display()
    )]
    CheckoutWithoutCommit { path: PathBuf, detail: String },

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

    /// `reuse` into a generation whose pin is not the artifact's tinygrad (or that has no pin).
    #[error(
        "reuse refused: {refusal}; nothing was copied. An artifact is adopted only into the \
         generation whose tinygrad pin it was compiled with (pins: the built-in table plus \
         --openpilot DIR's tinygrad_pins.json); otherwise rebuild it for this generation with \
         `release-cli rebuild`"
    )]
    ReusePin { refusal: manifest::PinRefusal },

    /// `rebuild --generation` is not the generation of the tree's tinygrad.
    #[error(
        "rebuild --generation {generation} refused: the tinygrad to build with, {pin} (from \
         {from}), is {}; nothing was fetched, built or written. next: {}",
        match owner { Some(g) => format!("{g}'s pin"), None => "no generation's pin".to_string() },
        match owner {
            Some(g) if g < generation => format!("rerun with --generation {g}, or `release-cli tinygrad bump` the tree to {generation}'s tinygrad first"),
            Some(g) => format!("rerun with --generation {g}; {generation} is older than this tree's tinygrad and is rebuilt from an openpilot checkout still at {generation}'s pin (pass that checkout as --openpilot DIR)"),
            None => "`release-cli tinygrad bump` records a new pin in the tree's tinygrad_pins.json; pass that tree as --openpilot DIR".to_string(),
        }
    )]
    RebuildGeneration {
        generation: Generation,
        pin: GitCommit,
        from: String,
        owner: Option<Generation>,
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

    /// A rebuild could not list a model's ONNX sources in the sources store.
    #[error("listing {store} {prefix}: {source}")]
    SourcesUnlisted {
        store: String,
        prefix: StorePath,
        #[source]
        source: Box<artifact_store::Error>,
    },

    /// The sources store holds no ONNX file under the model's `source_id`.
    #[error("no ONNX sources under {store} {prefix}/; archive them there or fix source_id")]
    NoSources { store: String, prefix: StorePath },

    /// A source file could not be opened or read in the store.
    #[error("{store} {path}: {source}")]
    SourceRead {
        store: String,
        path: StorePath,
        #[source]
        source: Box<artifact_store::Error>,
    },

    /// A source file ended before the size the store's listing gave.
    #[error("{store} {path}: listed as {listed} bytes, read {read}")]
    SourceShort {
        store: String,
        path: StorePath,
        listed: u64,
        read: u64,
    },

    /// A file a rebuild fetched or installed could not be written.
    #[error("{}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The compiler's chunk set holds a file that is not of the set: the accelerator variant
    /// built from it is not installed.
    #[error("unexpected output file {file} for {artifact}")]
    UnexpectedOutput { file: String, artifact: String },

    /// An upload prepared an artifact of `id` the manifest has no row (`artifact: None`) or no
    /// digest for.
    #[error(
        "{}",
        if artifact.is_some() { "no digest in the manifest row" } else { "no manifest row" }
    )]
    NotInManifest {
        id: ModelId,
        artifact: Option<String>,
    },

    /// `uses_external_gpu` in the manifest is not what the build records say was built.
    #[error(
        "publish refused: uses_external_gpu disagrees with the build record:\n  {}",
        mismatches.join("\n  ")
    )]
    GpuFlag { mismatches: Vec<String> },

    /// `publish --skip-validation` with an empty reason.
    #[error(
        "--skip-validation needs a reason, e.g. --skip-validation \"hotfix: validated by hand on QCOM\"; it is written into the publish record"
    )]
    SkipValidationNoReason,

    /// `publish` without a workspace to read the gate records from, and without a skip reason.
    #[error(
        "publish needs --workspace DIR, the rebuild workspace whose results/ holds the \
         preflight and validation records (or --skip-validation \"REASON\")"
    )]
    PublishNeedsWorkspace,

    /// A publish input the engineer gave cannot be used: the store order, a signing key, the
    /// release number or the expiry (the store error names it and the next step).
    #[error(transparent)]
    PublishInput(artifact_store::Error),

    /// The manifest cannot be signed: it does not state what a signature covers.
    #[error(transparent)]
    SignRefused(artifact_store::Error),

    /// Reading the live signatures or making the signature failed.
    #[error(transparent)]
    SignFailed(artifact_store::Error),

    /// The runtime gate ([`crate::loadable`]): a file the pinned runtime cannot load, or one
    /// nothing ties to the pin. Nothing was uploaded, written or changed.
    #[error("refused: {subject} ({path}): {problem}", path = path.display())]
    NotLoadable {
        subject: String,
        path: PathBuf,
        problem: Box<crate::loadable::LoadProblem>,
    },
    /// The device validation's p95 latency is over the contract's bound.
    #[error("refused: model {model}'s device validation reports a p95 latency of {p95_ms} ms, over the {bound_ms} ms bound of the {contract} contract ({record})", record = record.display())]
    LatencyBound {
        model: ModelId,
        p95_ms: f64,
        bound_ms: u32,
        contract: manifest::ContractName,
        record: PathBuf,
    },
    /// A validation record that does not tie the validated bytes to the receipt and the
    /// artifact (validation SHA = receipt SHA = artifact digest), or lacks the latency the
    /// contract bounds.
    #[error("refused: model {model}: {problem} ({record})", record = record.display())]
    ValidationBinding {
        model: ModelId,
        problem: String,
        record: PathBuf,
    },

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

impl NextStep for Error {
    fn next_step(&self) -> Option<String> {
        match self {
            Error::ValidationGate { .. } => Some(
                "run what each line says, or publish with --skip-validation \"REASON\" (the \
                 reason is written into the publish record)"
                    .into(),
            ),
            Error::GpuFlag { .. } => Some(
                "set uses_external_gpu to what was built (rerun `release-cli rebuild`, which \
                 writes it from the record), or rebuild the model for the target the catalog \
                 says (the source map's uses_external_gpu)"
                    .into(),
            ),
            Error::PublishInput(e)
            | Error::SignRefused(e)
            | Error::SignFailed(e)
            | Error::Store(e) => e.next_step(),
            Error::NotLoadable { .. } => Some(
                "rebuild the file with the generation's pinned tinygrad (`release-cli rebuild`, \
                 `compile`, `dm` or `builtin` write its build receipt beside it), then run the \
                 command again"
                    .into(),
            ),
            Error::LatencyBound { .. } | Error::ValidationBinding { .. } => Some(
                "rerun `release-cli validate` for the model on the device (a model over the \
                 bound must be rebuilt or left out of the release)"
                    .into(),
            ),
            Error::LeftOutOfGeneration { models, rerun, .. } => Some(format!(
                "add {} back to the manifest, or retire {} on purpose: `{rerun}`",
                models
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                if models.len() == 1 { "it" } else { "them" }
            )),
            Error::GenerationSelector { generation, .. } => Some(format!(
                "make each edit named (the tree selects the single generation {generation}, never \
                 an older one kept as a fallback), commit it, and run the command again"
            )),
            Error::Chunk(e) => e.next_step(),
            Error::Manifest(e) => e.next_step(),
            _ => None,
        }
    }
}
