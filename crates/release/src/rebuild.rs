//! The resumable bulk rebuild of a generation.
//!
//! Everything a rerun needs to resume is in the workspace ([`crate::Workspace`] lays it out).
//!
//! The rules: a model is done (skipped) when its success record names this generation and pin,
//! was built from what the plan asks for now (behaviour version, sources, input format, GPU
//! target) and its ready chunk set still verifies against the record; anything else is
//! (re)built. A failure is recorded and the run goes on, unless it is one after which every
//! further model would fail the same way (no store, no compiler, a wrong tinygrad marker): then
//! the run stops. The building itself is a [`Builder`]: [`RemoteBuilder`] fetches from a store
//! and compiles on the compiler comma; the unit tests drive the rules with a fake.

mod dry_run;
mod overlap;
mod plan;
mod record;
mod remote;

use fs_err as fs;
use std::path::{Path, PathBuf};

use chunker::atomic;
use compiler_remote::FetchedArtifact;
use manifest::{Generation, GitCommit, Manifest, ModelId};
use serde::Serialize;

use crate::{Error, Result, Workspace};

pub use dry_run::{DryRun, Fetch, PlannedBuild};
pub use overlap::{
    SourceFetcher, StoreFetcher, StoreUploader, UploadOutcome, UploadRecord, UploadRow,
    UploadedFile, Uploader, known_files,
};
use overlap::{UploadJob, upload_worker};
pub use plan::{PlannedModel, SourceEntry, parse_source_map, plan};
pub use record::{
    BuildRecord, FailureRecord, RecordedArtifact, RecordedVariant, VariantDropped,
    build_manifest_for, record_fits, record_matches, recorded_version, tree_base,
    variant_block_for, variant_refusal, variants_to_build,
};
use record::{read_json, ready_verifies};
pub use remote::{DeviceCheck, RemoteBuilder, fetch_sources};

/// The default source store: the bucket where the seed archives ONNX sources.
pub const DEFAULT_SOURCES: &str = "hf://buckets/StarPilot-Driving/StarPilot-Resources";

/// What one planned model came to in a run.
enum Attempt {
    /// Its success record still counts: not built again.
    Skipped(BuildRecord),
    Compiled(BuildRecord),
    Failed(BuildError),
}

/// Why one model's build failed: one variant per step that fails, its text the cause's own
/// (which names the file, store or compiler and what to do). [`BuildError::stops_the_run`]
/// says whether every further model would fail the same way.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The source store (`--sources`) cannot be opened: no model's sources can be fetched.
    #[error(transparent)]
    SourceStore(artifact_store::Error),
    /// This model's ONNX sources could not be fetched from the source store.
    #[error(transparent)]
    Sources(Box<Error>),
    /// No session with the compiler: whatever the reason, no further model would get further.
    #[error(transparent)]
    Connect(compiler_remote::Error),
    /// The compiler failed on this model (its compile or its device validation); some of its
    /// errors every further model would meet too ([`BuildError::stops_the_run`]).
    #[error(transparent)]
    Compiler(#[from] compiler_remote::Error),
    /// The chunks of the compiled artifact could not be hashed for the record.
    #[error(transparent)]
    ChunkDigests(Box<Error>),
    /// The build receipt of an artifact could not be written (its stamp is not this pin's or
    /// this model's, or the file could not be written).
    #[error(transparent)]
    Receipt(Box<Error>),
    /// A compiled accelerator variant could not be installed under its own name.
    #[error(transparent)]
    InstallVariant(Box<Error>),
    /// The device validation job could not be made for this model.
    #[error(transparent)]
    ValidationJob(Box<Error>),
    /// The device's verdict could not be recorded (`results/<id>.validation.json`): no further
    /// verdict would be.
    #[error(transparent)]
    ValidationRecord(Box<Error>),
    /// `rebuild --validate` with a [`Builder`] that keeps [`Builder::validate`]'s default.
    #[error("this builder cannot validate on the device")]
    CannotValidate,
    /// `rebuild --validate` with a [`RemoteBuilder`] made without
    /// [`RemoteBuilder::with_device_check`].
    #[error("this builder was not given a device check")]
    NoDeviceCheck,
}

impl BuildError {
    /// Whether the run stops here: every further model would fail the same way (no source
    /// store, no compiler, a compiler at another tinygrad, no way to validate or record it).
    pub fn stops_the_run(&self) -> bool {
        match self {
            Self::SourceStore(_)
            | Self::Connect(_)
            | Self::ValidationRecord(_)
            | Self::CannotValidate
            | Self::NoDeviceCheck => true,
            // No session, no usable rsync, or a compiler at another tinygrad.
            Self::Compiler(e) => {
                use compiler_remote::Error as E;
                matches!(
                    e,
                    E::MarkerMismatch { .. }
                        | E::MarkerMissing { .. }
                        | E::MarkerUnreadable { .. }
                        | E::Connect { .. }
                        | E::HostKeyNotKnown { .. }
                        | E::Ssh { .. }
                        | E::RsyncMissing { .. }
                        | E::RsyncIncompatible { .. }
                )
            }
            Self::Sources(_)
            | Self::ChunkDigests(_)
            | Self::Receipt(_)
            | Self::InstallVariant(_)
            | Self::ValidationJob(_) => false,
        }
    }
}

/// `rebuild --generation` must be the generation of the tinygrad it builds with: `pin` (read
/// from `from`, the tree's marker or `--tinygrad-commit`) must be `generation`'s pin in `pins`.
pub fn generation_rule(
    pins: &manifest::PinTable,
    generation: Generation,
    pin: &GitCommit,
    from: &str,
) -> Result<()> {
    let owner = pins.owner_of(pin);
    if owner == Some(generation) {
        return Ok(());
    }
    Err(Error::RebuildGeneration {
        generation,
        pin: pin.clone(),
        from: from.to_string(),
        owner,
    })
}

/// The checks a rebuild makes of the tree before anything else (dry run or not): the
/// generation is the one of the tinygrad it builds with (pins: the built-in table plus
/// `openpilot`'s `tinygrad_pins.json`), and, with an openpilot tree, the tree is what its last
/// sync sent to this compiler. Reads only; writes nothing.
pub fn check_tree(
    generation: Generation,
    pin: &GitCommit,
    pin_from: &str,
    openpilot: Option<&Path>,
    connect: &compiler_remote::ConnectOptions,
) -> Result<()> {
    let pins = crate::tree::load_pins(openpilot)?;
    generation_rule(&pins, generation, pin, pin_from)?;
    if let Some(op) = openpilot {
        compiler_remote::synced::check_synced(
            op,
            &connect.destination.to_string(),
            connect.remote_root.as_str(),
        )?;
    }
    Ok(())
}

/// What builds one model: fetch its sources, compile them into a verified chunk set.
pub trait Builder {
    /// Put the model's ONNX sources in `dir` (what a resumed run finds there may be kept) and
    /// return their paths. `say` takes a status line ("connecting to …").
    fn fetch_sources(
        &mut self,
        model: &PlannedModel,
        dir: &Path,
        say: &mut dyn FnMut(&str),
    ) -> Result<Vec<PathBuf>, BuildError>;

    /// Compile `sources` for `model` and leave the verified chunk set in `out`, the build log in
    /// `log`.
    fn compile(
        &mut self,
        model: &PlannedModel,
        sources: &[PathBuf],
        out: &Path,
        log: &Path,
        say: &mut dyn FnMut(&str),
    ) -> Result<FetchedArtifact, BuildError>;

    /// Compile the `accelerator_artifacts` variant `variant` (v25: `chestnut`, an AMD build)
    /// of `model` from the same `sources`, leaving its verified artifact
    /// `<id>_driving_<variant>_tinygrad.pkl` in `out` beside the model's. `Ok(None)`: this
    /// builder cannot build that variant, and the rebuilt manifest drops it with a warning.
    fn compile_variant(
        &mut self,
        model: &PlannedModel,
        variant: &str,
        sources: &[PathBuf],
        out: &Path,
        log: &Path,
        say: &mut dyn FnMut(&str),
    ) -> Result<Option<FetchedArtifact>, BuildError> {
        let _ = (model, variant, sources, out, log, say);
        Ok(None)
    }

    /// A fetcher of sources that runs beside this builder's compiles (the next model's sources
    /// fetched while one compiles). `None`: each model's sources are fetched in turn.
    fn fetcher(&self) -> Option<Box<dyn SourceFetcher>> {
        None
    }

    /// Validate `model`'s ready chunk set in `ws` on the device, as `validate --model ID
    /// --workspace WS` does (the same job, the same record, `results/<id>.validation.json`);
    /// whether it passed.
    fn validate(
        &mut self,
        model: &PlannedModel,
        ws: &Workspace,
        say: &mut dyn FnMut(&str),
    ) -> Result<bool, BuildError> {
        let _ = (model, ws, say);
        Err(BuildError::CannotValidate)
    }
}

/// What a run overlaps with its compiles and checks after each (`rebuild --validate`,
/// `--upload-to`).
#[derive(Default)]
pub struct Overlap<'a> {
    /// Validate each model on the device right after its compile; only a passing model is
    /// uploaded.
    pub validate: bool,
    /// Upload each finished model's artifact files in the background while the next compiles.
    pub uploader: Option<Box<dyn Uploader + 'a>>,
}

// ---- the run ------------------------------------------------------------------------------

/// A rebuild, planned: what to build, for which generation and pin, into which workspace.
#[derive(Debug, Clone)]
pub struct Rebuild {
    pub workspace: Workspace,
    pub generation: Generation,
    pub pin: GitCommit,
    pub base: Manifest,
    pub planned: Vec<PlannedModel>,
    /// Source-map models the base catalog does not list (never added unasked).
    pub not_in_catalog: Vec<ModelId>,
    /// The contract the generation runs ([`Rebuild::under_contract`]; v25 until told).
    pub contract: &'static manifest::Contract,
    /// The source map and the `only` selection, to plan again under a contract.
    map: Vec<SourceEntry>,
    only: Vec<ModelId>,
}

/// How one model of a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelOutcome {
    pub id: ModelId,
    /// `compiled`, `skipped` (already done) or `failed`.
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With `--validate`: `passed` or `failed` (then not uploaded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation: Option<&'static str>,
}

/// What a run did. Serializes to the `release-cli rebuild --json` summary.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub workspace: Workspace,
    pub generation: Generation,
    pub tinygrad_commit: GitCommit,
    pub manifest: PathBuf,
    pub compiled: usize,
    pub skipped: usize,
    pub failed: usize,
    /// Models the run did not reach (after an error that stops the whole run).
    pub not_attempted: Vec<ModelId>,
    /// Source-map models the base catalog does not list (never added unasked).
    pub not_in_catalog: Vec<ModelId>,
    /// Catalog models without an artifact for this generation yet.
    pub without_artifact: Vec<ModelId>,
    /// `accelerator_artifacts` variants of the base catalog the manifest does not carry
    /// because they were not rebuilt for this generation (never copied from the base).
    pub variants_dropped: Vec<VariantDropped>,
    pub models: Vec<ModelOutcome>,
    /// With `--upload-to`: each model's upload to each store. A `failed` one is uploaded by
    /// publish.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uploads: Vec<UploadOutcome>,
    /// Where this run moved the previous generation's release to (`generations/<gen>/`), if it
    /// did ([`Workspace::set_aside`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set_aside: Option<PathBuf>,
    /// Why the run stopped early, if it did.
    #[serde(skip)]
    pub stopped: Option<String>,
    /// Catalog models with an artifact for this generation in the manifest.
    #[serde(skip)]
    pub with_artifact: usize,
}

impl Summary {
    /// The run as a result: [`Error::RunStopped`] if it stopped, [`Error::ModelsFailed`] if
    /// some model failed, else `Ok`.
    pub fn result(&self) -> Result<()> {
        if let Some(reason) = &self.stopped {
            return Err(Error::RunStopped {
                reason: reason.clone(),
            });
        }
        let ids: Vec<ModelId> = self
            .models
            .iter()
            .filter(|o| o.status == "failed" || o.validation == Some("failed"))
            .map(|o| o.id.clone())
            .collect();
        if ids.is_empty() {
            Ok(())
        } else {
            Err(Error::ModelsFailed {
                ids,
                results: self.workspace.results(),
            })
        }
    }

    /// Every catalog model has an artifact for this generation and nothing failed.
    pub fn complete(&self) -> bool {
        self.without_artifact.is_empty()
    }
}

/// A status line of a run, for the model `index` (0-based) of `total`.
pub struct Progress<'a> {
    pub index: usize,
    pub total: usize,
    pub id: &'a ModelId,
    pub message: &'a str,
}

/// The record of a compiled artifact, with its chunks' digests.
fn recorded(a: FetchedArtifact, chunk_sha256: Vec<chunker::Sha256Digest>) -> RecordedArtifact {
    RecordedArtifact {
        name: a.name,
        size: a.size,
        sha256: a.sha256,
        chunk_count: a.chunk_count,
        files: a.files,
        chunk_sha256,
    }
}

/// The SHA-256 of each chunk of the verified chunk set `out/<name>`, in order (one pass over
/// the chunks, which are small next to the compile that made them).
fn chunk_digests(out: &Path, name: &str, count: u32) -> Result<Vec<chunker::Sha256Digest>> {
    (1..=count)
        .map(|i| {
            let path = out.join(chunker::chunk_name(name, i, count));
            Ok(chunker::Sha256Digest::of_file(&path)?.0)
        })
        .collect()
}

/// A source map lists each model once; four megabytes is far beyond any real one.
pub const MAX_SOURCE_MAP_BYTES: u64 = 4 << 20;

/// An input file, size-capped and regular-file only; a file error stays an [`Error::Io`].
fn read_input(path: &Path, limit: u64) -> Result<Vec<u8>> {
    chunker::bounded::read_capped_existing(path, limit).map_err(|e| match e {
        chunker::Error::Io(io) => Error::Io(io),
        other => other.into(),
    })
}

/// What the models of a run came to (before the manifest).
#[derive(Default)]
struct Ran {
    outcomes: Vec<ModelOutcome>,
    /// Records this run checked (skipped) or built: the manifest takes them as they are
    /// rather than reading and re-hashing their ready chunk sets a second time.
    this_run: Vec<BuildRecord>,
    uploads: Vec<UploadOutcome>,
    /// Why the run stopped early, if it did.
    stopped: Option<String>,
}

/// The prefetch thread: the fetcher back, and the sources it fetched.
type Prefetch<'s> =
    std::thread::ScopedJoinHandle<'s, (Result<Vec<PathBuf>, BuildError>, Box<dyn SourceFetcher>)>;

/// The upload worker's finished models into `ran`, each said; with `wait`, until it is done.
fn drain(
    done: Option<&std::sync::mpsc::Receiver<Vec<UploadOutcome>>>,
    ran: &mut Ran,
    in_flight: &mut Vec<ModelId>,
    say: &mut dyn FnMut(&str),
    wait: bool,
) {
    let Some(done) = done else { return };
    let finished: Vec<Vec<UploadOutcome>> = if wait {
        done.iter().collect()
    } else {
        done.try_iter().collect()
    };
    for u in finished.into_iter().flatten() {
        in_flight.retain(|id| id != &u.id);
        say(&match &u.error {
            None => format!("{}: {} to {}", u.id, u.status, u.store),
            Some(e) => format!(
                "{}: upload to {} FAILED: {e}; publish will upload it",
                u.id, u.store
            ),
        });
        ran.uploads.push(u);
    }
}

impl Rebuild {
    /// Read the source map and the base catalog and plan the run (`only`: just these models).
    pub fn prepare(
        workspace: impl Into<Workspace>,
        source_map: &Path,
        base_manifest: &Path,
        only: &[ModelId],
        generation: Generation,
        pin: GitCommit,
    ) -> Result<Self> {
        if source_map.symlink_metadata().is_err() {
            return Err(Error::SourceMapMissing {
                path: source_map.to_path_buf(),
                generation,
            });
        }
        // Size-capped, regular files only; the chunker's error names the path and the limit.
        let map_bytes = read_input(source_map, MAX_SOURCE_MAP_BYTES)?;
        let map = parse_source_map(&map_bytes, source_map)?;
        let base_bytes = read_input(base_manifest, manifest::Limits::DEFAULT_MAX_MANIFEST_BYTES)?;
        let base = Manifest::from_slice(&base_bytes).map_err(|source| Error::ManifestFile {
            path: base_manifest.to_path_buf(),
            source,
        })?;
        let (planned, not_in_catalog) = plan(&map, &base, only)?;
        Ok(Self {
            workspace: workspace.into(),
            generation,
            pin,
            base,
            planned,
            not_in_catalog,
            contract: manifest::ContractName::V25.contract(),
            map,
            only: only.to_vec(),
        })
    }

    /// The same run under the contract `pins` records for the generation. When that contract
    /// takes its entries from the tree's reviewed catalog (v26) and `tree` declares this
    /// generation, the base becomes [`tree_base`] (ids, versions, GPU flags and lab eligibility
    /// from the tree's catalog) and the plan is made again from it; base models the tree's
    /// catalog does not list are returned (they are not built or published). A tree that
    /// declares another generation is refused.
    pub fn under_contract(
        mut self,
        pins: &manifest::PinTable,
        tree: Option<&manifest::TreeDeclaration>,
    ) -> Result<(Self, Vec<ModelId>)> {
        self.contract = pins.contract(self.generation);
        let mut dropped = Vec::new();
        if let Some(t) = tree {
            if t.generation != self.generation {
                return Err(Error::RebuildTreeGeneration {
                    generation: self.generation,
                    declared: t.generation,
                });
            }
            if self.contract.entries_from_tree_catalog {
                let (base, gone) = tree_base(&self.base, t)?;
                let (planned, not_in_catalog) = plan(&self.map, &base, &self.only)?;
                self.base = base;
                self.planned = planned
                    .into_iter()
                    .map(|mut p| {
                        if let Some(row) = t.row(p.source.id.as_str()) {
                            p.gpu = row.uses_external_gpu;
                            p.version = row.version;
                        }
                        p
                    })
                    .collect();
                self.not_in_catalog = not_in_catalog;
                dropped = gone;
            }
        }
        Ok((self, dropped))
    }

    /// The contract the generation runs (from the pin table the tree records).
    pub fn with_contract(mut self, contract: &'static manifest::Contract) -> Self {
        self.contract = contract;
        self
    }

    /// Write the build receipt of `artifact` (in `out`) when the contract has receipts: the
    /// stamp must be this pin's and this model's, else the build fails.
    fn receipt(
        &self,
        p: &PlannedModel,
        out: &Path,
        artifact: &str,
        sources: &[PathBuf],
    ) -> Result<(), BuildError> {
        let path = out.join(artifact);
        let built = crate::loadable::Built {
            model_id: p.source.id.as_str(),
            version: Some(p.version),
            artifact: &path,
            sources,
            stamped: true,
        };
        crate::loadable::write_build_receipt(&built, self.contract, &self.pin)
            .map(|_| ())
            .map_err(|e| BuildError::Receipt(e.into()))
    }

    /// The success record at `path` if it still counts as done: made for this generation and
    /// pin, accepted by `fits`, and its ready chunk set still verifies against it.
    fn done_record(&self, path: &Path, fits: impl Fn(&BuildRecord) -> bool) -> Option<BuildRecord> {
        read_json::<BuildRecord>(path).filter(|r| {
            record_matches(r, self.generation, &self.pin)
                && fits(r)
                && ready_verifies(&self.workspace, r)
        })
    }

    /// Whether a run would skip `p` as done (its success record still counts). Reads the record
    /// and verifies its ready chunk set; writes nothing (`rebuild --dry-run`).
    pub fn is_done(&self, p: &PlannedModel) -> bool {
        let path = self.workspace.build_record(&p.source.id);
        self.done_record(&path, |r| record_fits(r, p)).is_some()
    }

    /// Build every planned model that is not done, record each outcome, and write the
    /// manifest. Only I/O errors of the workspace itself end it with `Err`; model failures are
    /// in the summary ([`Summary::result`]). Overlapping with the compiles what `overlap` asks:
    /// the next model's sources fetched while one compiles (when the builder has a
    /// [`Builder::fetcher`]), each model validated right after its compile, each finished (and
    /// passing) model uploaded by a background worker while the next compiles. The manifest is
    /// written last; no store ever gets one from here.
    pub fn run_with(
        &self,
        builder: &mut dyn Builder,
        overlap: Overlap<'_>,
        on_progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<Summary> {
        let ws = &self.workspace;
        // One generation, one workspace: another generation's staged release moves to
        // generations/<gen>/ first, where it stays publishable.
        let set_aside = ws
            .set_aside(self.generation)?
            .map(|(_, w)| w.root().to_path_buf());
        for d in ws.rebuild_dirs() {
            fs::create_dir_all(d)?;
        }
        let ran = self.run_models(builder, overlap, on_progress)?;
        let (outcomes, records) = (ran.outcomes, self.manifest_records(ran.this_run));
        let manifest_path = self.write_manifest(&records)?;
        let count = |s: &str| outcomes.iter().filter(|o| o.status == s).count();
        Ok(Summary {
            workspace: ws.clone(),
            generation: self.generation,
            tinygrad_commit: self.pin.clone(),
            manifest: manifest_path,
            compiled: count("compiled"),
            skipped: count("skipped"),
            failed: count("failed"),
            not_attempted: self
                .planned
                .iter()
                .map(|p| p.source.id.clone())
                .filter(|id| !outcomes.iter().any(|o| &o.id == id))
                .collect(),
            not_in_catalog: self.not_in_catalog.clone(),
            without_artifact: self
                .base
                .ids()
                .filter(|id| !records.iter().any(|r| &r.id == *id))
                .cloned()
                .collect(),
            variants_dropped: self.variants_dropped(&records),
            set_aside,
            models: outcomes,
            uploads: ran.uploads,
            stopped: ran.stopped,
            with_artifact: records.len(),
        })
    }

    /// The models of the plan, one after another on the compiler, with the prefetch thread and
    /// the upload worker beside them (both joined before it returns).
    fn run_models(
        &self,
        builder: &mut dyn Builder,
        overlap: Overlap<'_>,
        on_progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<Ran> {
        let total = self.planned.len();
        let mut ran = Ran::default();
        let mut fetcher = builder.fetcher();
        let (ws, generation) = (&self.workspace, self.generation);
        std::thread::scope(|scope| {
            let (jobs, done) = match overlap.uploader {
                Some(mut up) => {
                    let (tx, rx) = std::sync::mpsc::channel::<UploadJob>();
                    let (done_tx, done) = std::sync::mpsc::channel();
                    scope.spawn(move || upload_worker(ws, generation, &mut *up, rx, done_tx));
                    (Some(tx), Some(done))
                }
                None => (None, None),
            };
            let mut prefetch: Option<(usize, Prefetch<'_>)> = None;
            let mut in_flight: Vec<ModelId> = Vec::new();
            for (index, p) in self.planned.iter().enumerate() {
                let id = &p.source.id;
                let mut say = |message: &str| {
                    on_progress(Progress {
                        index,
                        total,
                        id,
                        message,
                    })
                };
                // This model's prefetched sources; then the next one's fetch starts. A fetcher
                // that panicked (a bug in a store client) is dropped: sources come in turn.
                let fetched = prefetch.take().and_then(|(i, h)| {
                    let (r, f) = h.join().ok()?;
                    fetcher = Some(f);
                    (i == index).then_some(r)
                });
                if let Some(next) = self.planned.get(index + 1).filter(|n| self.may_build(n))
                    && let Some(mut f) = fetcher.take()
                {
                    let dir = ws.onnx(&next.source.id);
                    say(&format!(
                        "fetching the sources of {} meanwhile",
                        next.source.id
                    ));
                    prefetch = Some((index + 1, scope.spawn(move || (f.fetch(next, &dir), f))));
                }
                drain(done.as_ref(), &mut ran, &mut in_flight, &mut say, false);
                if !in_flight.is_empty() {
                    let ids: Vec<&str> = in_flight.iter().map(|i| i.as_str()).collect();
                    say(&format!(
                        "uploading {} in the background meanwhile",
                        ids.join(", ")
                    ));
                }
                let finished =
                    self.one_model(builder, p, fetched, overlap.validate, &mut say, &mut ran)?;
                if let (Some(r), Some(tx)) = (finished, &jobs) {
                    say("queued for upload; it uploads while the next model compiles");
                    in_flight.push(r.id.clone());
                    let _ = tx.send(self.upload_job(&r)?);
                }
                if ran.stopped.is_some() {
                    break;
                }
            }
            if let Some((_, h)) = prefetch.take() {
                let _ = h.join();
            }
            drop(jobs);
            // The last uploads, said as of the last model the run reached.
            let last = ran.outcomes.len().saturating_sub(1);
            if let Some(p) = self.planned.get(last) {
                let id = &p.source.id;
                let mut say = |message: &str| {
                    on_progress(Progress {
                        index: last,
                        total,
                        id,
                        message,
                    })
                };
                drain(done.as_ref(), &mut ran, &mut in_flight, &mut say, true);
            }
            Ok(ran)
        })
    }

    /// Whether a run may build `p` (no success record that fits it): worth fetching its
    /// sources ahead. Reads the record only; the run still verifies it in turn.
    fn may_build(&self, p: &PlannedModel) -> bool {
        let path = self.workspace.build_record(&p.source.id);
        !read_json::<BuildRecord>(&path)
            .is_some_and(|r| record_matches(&r, self.generation, &self.pin) && record_fits(&r, p))
    }

    /// What the upload worker needs of a finished model: its manifest row, and the artifacts
    /// (the model's and each rebuilt variant's) a store must hold.
    fn upload_job(&self, r: &BuildRecord) -> Result<UploadJob> {
        let manifest = build_manifest_for(
            &self.base,
            std::slice::from_ref(r),
            self.generation,
            &self.pin,
            self.contract,
        )?;
        let artifacts = std::iter::once(&r.artifact)
            .chain(r.variants.iter().map(|v| &v.artifact))
            .map(|a| (a.name.clone(), a.sha256))
            .collect();
        Ok(UploadJob {
            id: r.id.clone(),
            manifest,
            artifacts,
        })
    }

    /// One model of the run: attempted (skipped or built), then with `validate` checked on the
    /// device; its outcome and record go into `ran`. The record to upload when it is done and,
    /// with `validate`, passed.
    fn one_model(
        &self,
        builder: &mut dyn Builder,
        p: &PlannedModel,
        fetched: Option<Result<Vec<PathBuf>, BuildError>>,
        validate: bool,
        say: &mut dyn FnMut(&str),
        ran: &mut Ran,
    ) -> Result<Option<BuildRecord>> {
        let mut outcome = ModelOutcome {
            id: p.source.id.clone(),
            status: "failed",
            error: None,
            validation: None,
        };
        let (record, fresh) = match self.attempt(builder, p, fetched, say)? {
            Attempt::Skipped(r) => (r, false),
            Attempt::Compiled(r) => (r, true),
            Attempt::Failed(e) => {
                if e.stops_the_run() {
                    ran.stopped = Some(e.to_string());
                }
                outcome.error = Some(e.to_string());
                ran.outcomes.push(outcome);
                return Ok(None);
            }
        };
        outcome.status = if fresh { "compiled" } else { "skipped" };
        ran.this_run.push(record.clone());
        let passed = match validate {
            false => true,
            true if !fresh && self.validated_before(&record) => true,
            true => {
                say("validating on the device");
                match builder.validate(p, &self.workspace, say) {
                    Ok(passed) => {
                        outcome.validation = Some(if passed { "passed" } else { "failed" });
                        say(if passed {
                            "validation passed"
                        } else {
                            "FAILED device validation; not uploaded"
                        });
                        passed
                    }
                    Err(e) => {
                        if e.stops_the_run() {
                            ran.stopped = Some(e.to_string());
                        }
                        say(&format!("validation FAILED: {e}; not uploaded"));
                        outcome.validation = Some("failed");
                        outcome.error = Some(e.to_string());
                        false
                    }
                }
            }
        };
        ran.outcomes.push(outcome);
        Ok(passed.then_some(record))
    }

    /// Whether the workspace's validation record of `r`'s model is of these very bytes, with
    /// this pin, and passes under the contract (a rerun does not validate it again).
    fn validated_before(&self, r: &BuildRecord) -> bool {
        read_json::<crate::gate::ValidationRecord>(&self.workspace.validation(&r.id)).is_some_and(
            |v| {
                v.artifact_sha256 == r.artifact.sha256
                    && v.tinygrad_commit == self.pin
                    && crate::validate::passes(&v, self.contract)
            },
        )
    }
    /// One planned model: skipped when its success record still counts, else built, its
    /// success or failure record written (each replacing the other).
    fn attempt(
        &self,
        builder: &mut dyn Builder,
        p: &PlannedModel,
        fetched: Option<Result<Vec<PathBuf>, BuildError>>,
        say: &mut dyn FnMut(&str),
    ) -> Result<Attempt> {
        let ws = &self.workspace;
        let id = &p.source.id;
        let record_path = ws.build_record(id);
        let failure_path = ws.failure_record(id);
        if let Some(r) = self.done_record(&record_path, |r| record_fits(r, p)) {
            say("done earlier, skipped");
            let _ = atomic::remove_if_exists(&failure_path);
            return Ok(Attempt::Skipped(r));
        }
        let log = ws.build_log(id);
        match self.build_one(builder, p, fetched, &log, say) {
            Ok(record) => {
                crate::records::write(&record_path, &record)?;
                let _ = atomic::remove_if_exists(&failure_path);
                say(&format!(
                    "compiled: {} bytes, {} chunk(s), sha256 {}",
                    record.artifact.size, record.artifact.chunk_count, record.artifact.sha256
                ));
                Ok(Attempt::Compiled(record))
            }
            Err(e) => {
                // A failed attempt invalidates an older success record of this model.
                let _ = atomic::remove_if_exists(&record_path);
                crate::records::write(
                    &failure_path,
                    &FailureRecord {
                        id: id.clone(),
                        status: "failed".into(),
                        generation: self.generation,
                        error: e.to_string(),
                        log,
                    },
                )?;
                say(&format!("FAILED: {e}"));
                Ok(Attempt::Failed(e))
            }
        }
    }

    /// Write the generation's manifest of `records` to `ready/`.
    fn write_manifest(&self, records: &[BuildRecord]) -> Result<PathBuf> {
        let m = build_manifest_for(
            &self.base,
            records,
            self.generation,
            &self.pin,
            self.contract,
        )?;
        let manifest_path = self.workspace.ready_manifest(self.generation);
        atomic::write_atomic(&manifest_path, &m.to_canonical_bytes())?;
        Ok(manifest_path)
    }

    /// The variants the manifest of `records` leaves out, per base model.
    fn variants_dropped(&self, records: &[BuildRecord]) -> Vec<VariantDropped> {
        self.base
            .models()
            .iter()
            .flat_map(|e| {
                variant_block_for(
                    e,
                    records.iter().find(|r| &r.id == e.id()),
                    self.contract,
                    Some(&self.pin),
                )
                .1
            })
            .collect()
    }

    fn build_one(
        &self,
        builder: &mut dyn Builder,
        p: &PlannedModel,
        fetched: Option<Result<Vec<PathBuf>, BuildError>>,
        log: &Path,
        say: &mut dyn FnMut(&str),
    ) -> Result<BuildRecord, BuildError> {
        let id = &p.source.id;
        let sources = match fetched {
            Some(fetched) => {
                say("sources fetched while the model before compiled");
                fetched?
            }
            None => {
                say("fetching sources");
                builder.fetch_sources(p, &self.workspace.onnx(id), say)?
            }
        };
        say(&format!(
            "compiling ({}, {}{})",
            p.version,
            p.source.input_format,
            if p.gpu { ", gpu" } else { "" }
        ));
        let out = self.workspace.ready_model(id);
        let a = builder.compile(p, &sources, &out, log, say)?;
        let chunk_sha256 = chunk_digests(&out, &a.name, a.chunk_count)
            .map_err(|e| BuildError::ChunkDigests(e.into()))?;
        self.receipt(p, &out, &a.name, &sources)?;
        let variants = self.build_variants(builder, p, &sources, &out, log, say);
        Ok(BuildRecord {
            id: id.clone(),
            status: "compiled".into(),
            generation: self.generation,
            tinygrad_commit: self.pin.clone(),
            version: p.version,
            source_id: p.source.source_id.clone(),
            input_format: p.source.input_format,
            uses_external_gpu: p.gpu,
            source_commit: p.source.source_commit.clone(),
            sources: sources
                .iter()
                .filter_map(|s| s.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect(),
            artifact: recorded(a, chunk_sha256),
            variants,
            log: log.to_path_buf(),
        })
    }

    /// Rebuild each `accelerator_artifacts` variant the base catalog lists for `p`. A variant
    /// the builder cannot build, or whose build fails, is left out (the model still counts as
    /// built); [`Summary::variants_dropped`] names it.
    fn build_variants(
        &self,
        builder: &mut dyn Builder,
        p: &PlannedModel,
        sources: &[PathBuf],
        out: &Path,
        log: &Path,
        say: &mut dyn FnMut(&str),
    ) -> Vec<RecordedVariant> {
        let Some(entry) = self.base.get(&p.source.id) else {
            return Vec::new();
        };
        let mut built = Vec::new();
        for (variant, execution_device) in variants_to_build(entry, self.contract, p.gpu) {
            say(&format!("compiling accelerator variant {variant}"));
            let compiled = builder.compile_variant(p, &variant, sources, out, log, say);
            match compiled.and_then(|a| match a {
                Some(a) => self.receipt(p, out, &a.name, sources).map(|()| Some(a)),
                None => Ok(None),
            }) {
                Ok(Some(a)) => {
                    let chunk_sha256 =
                        chunk_digests(out, &a.name, a.chunk_count).unwrap_or_default();
                    built.push(RecordedVariant {
                        variant,
                        execution_device,
                        artifact: recorded(a, chunk_sha256),
                    });
                }
                Ok(None) => say(&format!(
                    "accelerator variant {variant}: this builder cannot build it; dropped"
                )),
                Err(e) => say(&format!(
                    "accelerator variant {variant} FAILED: {e}; dropped"
                )),
            }
        }
        built
    }

    /// Every success record for this generation and pin counts, including models outside this
    /// run's selection, so a partial rerun never drops finished work from the manifest; but
    /// never a stale one (built for another behaviour version or from other sources than the
    /// plan now says, e.g. a model a stopped run did not reach).
    fn manifest_records(&self, mut this_run: Vec<BuildRecord>) -> Vec<BuildRecord> {
        let mut records = Vec::new();
        for id in self.base.ids() {
            if let Some(i) = this_run.iter().position(|r| &r.id == id) {
                records.push(this_run.swap_remove(i));
                continue;
            }
            let fits = |r: &BuildRecord| match self.planned.iter().find(|p| &p.source.id == id) {
                Some(p) => record_fits(r, p),
                None => self.base.get(id).and_then(|e| e.version()) == Some(r.version),
            };
            let path = self.workspace.build_record(id);
            if let Some(r) = self.done_record(&path, fits) {
                records.push(r);
            }
        }
        records
    }
}

#[cfg(test)]
mod overlap_tests;
#[cfg(test)]
mod receipt_tests;
#[cfg(test)]
mod tests;
