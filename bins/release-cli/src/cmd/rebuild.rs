//! `release-cli rebuild`: the resumable bulk rebuild of a generation on the compiler comma.
//!
//! Workspace layout (everything a rerun needs to resume):
//!
//! ```text
//! <workspace>/onnx/<id>/<file>.onnx        sources fetched from <store>/onnx/<source-id>/
//! <workspace>/logs/<id>.log                the compile log of the latest attempt
//! <workspace>/results/<id>.json            success record (what was built, with which pin)
//! <workspace>/results/<id>.failure.json    failure record of the latest attempt
//! <workspace>/ready/<id>/<id>_driving_tinygrad.pkl.chunkNNofMM + .sha256 + .chunkmanifest
//! <workspace>/ready/model_names_<gen>.json the manifest for `release-cli publish`
//! ```
//!
//! A model is done when its success record names this generation and pin and its ready chunk
//! set still verifies against the record; anything else is (re)built. The pure parts — source
//! map parsing, the plan, the records and the manifest — are apart from the SSH loop and tested
//! without a compiler.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use artifact_store::{Store, StoreSpec};
use chunker::{Expected, atomic};
use clap::Args;
use compiler_remote::{CompileRequest, FetchedArtifact, InputFormat};
use manifest::{
    Artifact, ArtifactSize, BehaviorVersion, ChunkCount, FileName, Generation, GitCommit, Manifest,
    ModelId, keys,
};
use serde::{Deserialize, Serialize};

use crate::cmd::build::{RemoteArgs, io_err, live, remote_error};
use crate::output::print_json;
use crate::{CliError, CliResult};

/// The default source store: the bucket where the seed archives ONNX sources.
pub const DEFAULT_SOURCES: &str = "hf://buckets/StarPilot-Driving/StarPilot-Resources";

#[derive(Debug, Args)]
pub struct RebuildArgs {
    /// The rebuild workspace (created if missing; rerun with the same one to resume).
    #[arg(long, value_name = "DIR")]
    pub workspace: PathBuf,
    /// The source map: `{"<id>": {"source_id", "input_format", "ref", "uses_external_gpu"}}`.
    #[arg(long, value_name = "FILE")]
    pub source_map: PathBuf,
    /// The existing catalog; behaviour versions come from it and are never changed.
    #[arg(long, value_name = "FILE")]
    pub base_manifest: PathBuf,
    /// Where the ONNX sources are archived, as `onnx/<source-id>/<file>`.
    #[arg(long, value_name = "STORE", default_value = DEFAULT_SOURCES)]
    pub sources: String,
    /// The generation being built, e.g. v26.
    #[arg(long, value_name = "vNN")]
    pub generation: Generation,
    /// Only these models (default: every source-map model that is in the base manifest).
    #[arg(long = "model", value_name = "ID")]
    pub models: Vec<ModelId>,
    #[command(flatten)]
    pub access: crate::cmd::store::StoreAccess,
    /// Print the final summary `{"workspace","generation","tinygrad_commit","manifest","compiled",
    /// "skipped","failed","not_attempted","not_in_catalog","without_artifact",
    /// "models":[{"id","status","error"?}]}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten, next_help_heading = "Compiler options")]
    pub remote: RemoteArgs,
}

// ---- the pure core ------------------------------------------------------------------------

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

/// Parse a source map (an object keyed by model ID), keeping its order.
pub fn parse_source_map(bytes: &[u8], path: &Path) -> CliResult<Vec<SourceEntry>> {
    let bad = |what: String| CliError::usage(format!("{}: {what}", path.display()));
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
        let str_field = |name: &str| -> CliResult<Option<&str>> {
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

/// The models to build, in source-map order (or `--model` order), and the source-map models
/// left out because the base catalog does not have them (models are never added unasked).
pub fn plan(
    map: &[SourceEntry],
    base: &Manifest,
    only: &[ModelId],
) -> CliResult<(Vec<PlannedModel>, Vec<ModelId>)> {
    let planned_for = |s: &SourceEntry| -> CliResult<Option<PlannedModel>> {
        let Some(entry) = base.get(&s.id) else {
            return Ok(None);
        };
        let version = entry.version().ok_or_else(|| {
            CliError::usage(format!(
                "{}: the base manifest entry has no behaviour version",
                s.id
            ))
        })?;
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
            let s = map.iter().find(|s| &s.id == id).ok_or_else(|| {
                CliError::usage(format!(
                    "{id} has no entry in the source map; add its source_id, input_format and ref"
                ))
            })?;
            let p = planned_for(s)?.ok_or_else(|| {
                CliError::usage(format!(
                    "{id} is not in the base manifest; models absent from the catalog are not \
                     added unless the release asks for them"
                ))
            })?;
            if !models.contains(&p) {
                models.push(p);
            }
        }
    }
    Ok((models, not_in_catalog))
}

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
    pub log: PathBuf,
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

/// The SHA-256 of each chunk of the verified chunk set `out/<name>`, in order (one pass over
/// the chunks, which are small next to the compile that made them).
fn chunk_digests(out: &Path, name: &str, count: u32) -> Result<Vec<chunker::Sha256Digest>, String> {
    (1..=count)
        .map(|i| {
            let path = out.join(chunker::chunk_name(name, i, count));
            chunker::Sha256Digest::of_file(&path)
                .map(|(d, _)| d)
                .map_err(|e| e.to_string())
        })
        .collect()
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
/// dropped (they describe another generation's pickle). Behaviour versions are never touched.
pub fn build_manifest(
    base: &Manifest,
    records: &[BuildRecord],
    generation: Generation,
    pin: &GitCommit,
) -> CliResult<Manifest> {
    let mut m = base.clone();
    m.set_generation(generation);
    m.set_tinygrad_commit(pin);
    let ids: Vec<ModelId> = m.ids().cloned().collect();
    for id in ids {
        let entry = m.get_mut(&id).expect("listed");
        match records.iter().find(|r| r.id == id) {
            Some(r) => {
                let artifact = Artifact::tinygrad(
                    ArtifactSize::new(r.artifact.size).map_err(CliError::failure)?,
                    r.artifact.sha256,
                    ChunkCount::new(u64::from(r.artifact.chunk_count))
                        .map_err(CliError::failure)?,
                );
                if r.artifact.chunk_sha256.len() == r.artifact.chunk_count as usize
                    && r.artifact.chunk_count > 0
                {
                    entry
                        .set_artifact_with_chunks(&artifact, &r.artifact.chunk_sha256)
                        .map_err(CliError::failure)?;
                } else {
                    entry.set_artifact(&artifact);
                    entry
                        .remove(keys::ARTIFACT_CHUNK_SHA256)
                        .map_err(CliError::failure)?;
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
                    entry.remove(k).map_err(CliError::failure)?;
                }
            }
        }
    }
    Ok(m)
}

// ---- the I/O shell ------------------------------------------------------------------------

#[derive(Debug, Serialize)]
struct ModelOutcome {
    id: ModelId,
    /// `compiled`, `skipped` (already done) or `failed`.
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Summary {
    workspace: PathBuf,
    generation: Generation,
    tinygrad_commit: GitCommit,
    manifest: PathBuf,
    compiled: usize,
    skipped: usize,
    failed: usize,
    /// Models the run did not reach (after an error that stops the whole run).
    not_attempted: Vec<ModelId>,
    /// Source-map models the base catalog does not list (never added unasked).
    not_in_catalog: Vec<ModelId>,
    /// Catalog models without an artifact for this generation yet.
    without_artifact: Vec<ModelId>,
    models: Vec<ModelOutcome>,
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    let bytes = fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> CliResult {
    let mut text = serde_json::to_string_pretty(value).map_err(CliError::failure)?;
    text.push('\n');
    atomic::write_atomic(path, text.as_bytes()).map_err(|e| io_err(path, e))
}

/// The recorded behaviour version of a built model (for `validate --workspace`).
pub fn recorded_version(workspace: &Path, id: &ModelId) -> CliResult<BehaviorVersion> {
    let path = workspace.join("results").join(format!("{id}.json"));
    read_json::<BuildRecord>(&path)
        .map(|r| r.version)
        .ok_or_else(|| {
            CliError::usage(format!(
                "{} is missing or unreadable; pass --version vN",
                path.display()
            ))
        })
}

/// Whether `ready/<id>/` still holds exactly what the record says.
fn ready_verifies(workspace: &Path, r: &BuildRecord) -> bool {
    let logical = workspace
        .join("ready")
        .join(r.id.as_str())
        .join(&r.artifact.name);
    chunker::verify(
        &logical,
        &Expected {
            sha256: Some(r.artifact.sha256),
            size: Some(r.artifact.size),
            chunk_count: Some(r.artifact.chunk_count),
            chunk_sha256: (!r.artifact.chunk_sha256.is_empty())
                .then(|| r.artifact.chunk_sha256.clone()),
        },
    )
    .is_ok()
}

/// The success record at `path` if it still counts as done: made for this generation and pin,
/// accepted by `fits`, and its ready chunk set still verifies against it.
fn done_record(
    workspace: &Path,
    path: &Path,
    generation: Generation,
    pin: &GitCommit,
    fits: impl Fn(&BuildRecord) -> bool,
) -> Option<BuildRecord> {
    read_json::<BuildRecord>(path)
        .filter(|r| record_matches(r, generation, pin) && fits(r) && ready_verifies(workspace, r))
}

/// Errors after which every further model would fail the same way: stop the run.
fn stops_the_run(e: &compiler_remote::Error) -> bool {
    use compiler_remote::Error as E;
    matches!(
        e,
        E::MarkerMismatch { .. }
            | E::MarkerMissing { .. }
            | E::Connect { .. }
            | E::HostKeyNotKnown { .. }
            | E::Ssh { .. }
            | E::RsyncMissing { .. }
            | E::RsyncIncompatible { .. }
    )
}

/// Fetch `onnx/<source-id>/*.onnx` into `<workspace>/onnx/<id>/`, streamed; a file already there
/// with the listed size is kept (resume), anything else there is removed.
fn fetch_sources(store: &dyn Store, p: &PlannedModel, dir: &Path) -> Result<Vec<PathBuf>, String> {
    let prefix: manifest::StorePath = format!("onnx/{}", p.source.source_id)
        .parse()
        .map_err(|e: manifest::Error| e.to_string())?;
    let listed = store
        .list(&prefix)
        .map_err(|e| format!("listing {} {prefix}: {e}", store.describe()))?;
    let onnx: Vec<_> = listed
        .into_iter()
        .filter(|e| e.path.file_name().ends_with(".onnx"))
        .collect();
    if onnx.is_empty() {
        return Err(format!(
            "no ONNX sources under {} {prefix}/; archive them there or fix source_id",
            store.describe()
        ));
    }
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let wanted: Vec<String> = onnx
        .iter()
        .map(|e| e.path.file_name().to_string())
        .collect();
    for entry in fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        if !wanted.contains(&entry.file_name().to_string_lossy().into_owned()) {
            let _ = fs::remove_file(entry.path());
        }
    }
    let mut out = Vec::new();
    for e in &onnx {
        let name: FileName = e
            .path
            .file_name()
            .parse()
            .map_err(|err: manifest::Error| err.to_string())?;
        let local = dir.join(name.as_str());
        let have = fs::metadata(&local).map(|m| m.len()).ok();
        if have != Some(e.size) {
            let mut reader = store
                .open(&e.path)
                .map_err(|err| format!("{} {}: {err}", store.describe(), e.path))?;
            let mut f = atomic::AtomicFile::create(&local)
                .map_err(|err| format!("{}: {err}", local.display()))?;
            let n = std::io::copy(&mut reader, &mut f)
                .map_err(|err| format!("{} {}: {err}", store.describe(), e.path))?;
            if n != e.size {
                return Err(format!(
                    "{} {}: listed as {} bytes, read {n}",
                    store.describe(),
                    e.path,
                    e.size
                ));
            }
            f.commit_and_sync_dir()
                .map_err(|err| format!("{}: {err}", local.display()))?;
        }
        out.push(local);
    }
    Ok(out)
}

pub fn run(args: RebuildArgs) -> CliResult {
    let started = Instant::now();
    // The policy first: a refused compiler must not even get as far as fetching sources.
    args.remote
        .remote
        .check_policy(args.remote.allow_other_compiler)
        .map_err(remote_error)?;
    let pin = args.remote.pin()?;
    let map_bytes = fs::read(&args.source_map).map_err(|e| io_err(&args.source_map, e))?;
    let map = parse_source_map(&map_bytes, &args.source_map)?;
    let base_bytes = fs::read(&args.base_manifest).map_err(|e| io_err(&args.base_manifest, e))?;
    let base = Manifest::from_slice(&base_bytes)
        .map_err(|e| CliError::usage(format!("{}: {e}", args.base_manifest.display())))?;
    let (planned, not_in_catalog) = plan(&map, &base, &args.models)?;

    let ws = &args.workspace;
    for d in ["onnx", "logs", "results", "ready"] {
        fs::create_dir_all(ws.join(d)).map_err(|e| io_err(&ws.join(d), e))?;
    }
    let results = ws.join("results");
    let store_spec = StoreSpec::parse(&args.sources).map_err(CliError::usage)?;
    let mut store: Option<Box<dyn Store>> = None;
    let mut compiler: Option<compiler_remote::Compiler> = None;

    let n = planned.len();
    let mut outcomes = Vec::new();
    // Records this run checked (skipped) or built: the manifest below takes them as they are
    // rather than reading and re-hashing their ready chunk sets a second time.
    let mut this_run: Vec<BuildRecord> = Vec::new();
    let mut stopped: Option<String> = None;
    for (k, p) in planned.iter().enumerate() {
        let id = &p.source.id;
        let progress = |what: &str| {
            eprintln!(
                "[model {} of {n}] {id}: {what} ({}s elapsed)",
                k + 1,
                started.elapsed().as_secs()
            );
        };
        if stopped.is_some() {
            continue;
        }
        let record_path = results.join(format!("{id}.json"));
        let failure_path = results.join(format!("{id}.failure.json"));
        if let Some(r) = done_record(ws, &record_path, args.generation, &pin, |r| {
            record_fits(r, p)
        }) {
            progress("done earlier, skipped");
            let _ = atomic::remove_if_exists(&failure_path);
            outcomes.push(ModelOutcome {
                id: id.clone(),
                status: "skipped",
                error: None,
            });
            this_run.push(r);
            continue;
        }
        let log = ws.join("logs").join(format!("{id}.log"));
        let attempt = (|| -> Result<BuildRecord, (String, bool)> {
            progress("fetching sources");
            if store.is_none() {
                store = Some(
                    args.access
                        .open(&store_spec)
                        .map_err(|e| (e.to_string(), true))?,
                );
            }
            let sources = fetch_sources(
                store.as_deref().expect("opened"),
                p,
                &ws.join("onnx").join(id.as_str()),
            )
            .map_err(|e| (e, false))?;
            if compiler.is_none() {
                progress(&format!("connecting to {}", args.remote.remote));
                compiler = Some(args.remote.connect().map_err(|e| (e.message, true))?);
            }
            let c = compiler.as_ref().expect("connected");
            progress(&format!(
                "compiling ({}, {}{})",
                p.version,
                p.source.input_format,
                if p.gpu { ", gpu" } else { "" }
            ));
            let req = CompileRequest {
                id: id.clone(),
                version: p.version,
                gpu: p.gpu,
                input_format: p.source.input_format,
                local: false,
            };
            let out = ws.join("ready").join(id.as_str());
            let a: FetchedArtifact = c
                .compile(&req, &sources, &pin, &out, &log, &mut live)
                .map_err(|e| {
                    let stop = stops_the_run(&e);
                    (e.to_string(), stop)
                })?;
            let chunk_sha256 =
                chunk_digests(&out, &a.name, a.chunk_count).map_err(|e| (e, false))?;
            Ok(BuildRecord {
                id: id.clone(),
                status: "compiled".into(),
                generation: args.generation,
                tinygrad_commit: pin.clone(),
                version: p.version,
                source_id: p.source.source_id.clone(),
                input_format: p.source.input_format,
                uses_external_gpu: p.gpu,
                source_commit: p.source.source_commit.clone(),
                sources: sources
                    .iter()
                    .filter_map(|s| s.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .collect(),
                artifact: RecordedArtifact {
                    name: a.name,
                    size: a.size,
                    sha256: a.sha256,
                    chunk_count: a.chunk_count,
                    files: a.files,
                    chunk_sha256,
                },
                log: log.clone(),
            })
        })();
        match attempt {
            Ok(record) => {
                write_json(&record_path, &record)?;
                let _ = atomic::remove_if_exists(&failure_path);
                progress(&format!(
                    "compiled: {} bytes, {} chunk(s), sha256 {}",
                    record.artifact.size, record.artifact.chunk_count, record.artifact.sha256
                ));
                outcomes.push(ModelOutcome {
                    id: id.clone(),
                    status: "compiled",
                    error: None,
                });
                this_run.push(record);
            }
            Err((error, stop)) => {
                // A failed attempt invalidates an older success record of this model.
                let _ = atomic::remove_if_exists(&record_path);
                write_json(
                    &failure_path,
                    &FailureRecord {
                        id: id.clone(),
                        status: "failed".into(),
                        generation: args.generation,
                        error: error.clone(),
                        log: log.clone(),
                    },
                )?;
                progress(&format!("FAILED: {error}"));
                outcomes.push(ModelOutcome {
                    id: id.clone(),
                    status: "failed",
                    error: Some(error.clone()),
                });
                if stop {
                    stopped = Some(error);
                }
            }
        }
    }
    drop(compiler);

    // Every success record for this generation and pin counts, including models outside this
    // run's --model selection, so a partial rerun never drops finished work from the manifest;
    // but never a stale one (built for another behaviour version or from other sources than
    // the plan now says, e.g. a model a stopped run did not reach).
    let mut records = Vec::new();
    for id in base.ids() {
        if let Some(i) = this_run.iter().position(|r| &r.id == id) {
            records.push(this_run.swap_remove(i));
            continue;
        }
        let fits = |r: &BuildRecord| match planned.iter().find(|p| &p.source.id == id) {
            Some(p) => record_fits(r, p),
            None => base.get(id).and_then(|e| e.version()) == Some(r.version),
        };
        let path = results.join(format!("{id}.json"));
        if let Some(r) = done_record(ws, &path, args.generation, &pin, fits) {
            records.push(r);
        }
    }
    let m = build_manifest(&base, &records, args.generation, &pin)?;
    let manifest_path = ws
        .join("ready")
        .join(manifest::layout::manifest_file_name(args.generation).as_str());
    atomic::write_atomic(&manifest_path, &m.to_canonical_bytes())
        .map_err(|e| io_err(&manifest_path, e))?;

    let count = |s: &str| outcomes.iter().filter(|o| o.status == s).count();
    let attempted: Vec<&ModelId> = outcomes.iter().map(|o| &o.id).collect();
    let summary = Summary {
        workspace: ws.clone(),
        generation: args.generation,
        tinygrad_commit: pin.clone(),
        manifest: manifest_path.clone(),
        compiled: count("compiled"),
        skipped: count("skipped"),
        failed: count("failed"),
        not_attempted: planned
            .iter()
            .map(|p| p.source.id.clone())
            .filter(|id| !attempted.contains(&id))
            .collect(),
        not_in_catalog,
        without_artifact: base
            .ids()
            .filter(|id| !records.iter().any(|r| &r.id == *id))
            .cloned()
            .collect(),
        models: outcomes,
    };
    if args.json {
        print_json(&summary)?;
    } else {
        crate::outln!(
            "rebuild {} ({}): {} compiled, {} skipped (done earlier), {} failed, {} not attempted, in {}s",
            summary.generation,
            summary.tinygrad_commit,
            summary.compiled,
            summary.skipped,
            summary.failed,
            summary.not_attempted.len(),
            started.elapsed().as_secs()
        )?;
        for o in summary.models.iter().filter(|o| o.status == "failed") {
            crate::outln!(
                "  FAILED {}: {}",
                o.id,
                o.error.as_deref().unwrap_or_default()
            )?;
        }
        if !summary.not_in_catalog.is_empty() {
            crate::outln!(
                "  not in the base catalog (not added): {}",
                summary
                    .not_in_catalog
                    .iter()
                    .map(|i| i.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )?;
        }
        crate::outln!(
            "manifest: {} ({} of {} models have a {} artifact)",
            manifest_path.display(),
            records.len(),
            base.models().len(),
            args.generation
        )?;
    }
    let failed: Vec<&str> = summary
        .models
        .iter()
        .filter(|o| o.status == "failed")
        .map(|o| o.id.as_str())
        .collect();
    if let Some(reason) = stopped {
        // With --json the summary above already says what failed.
        return Err(CliError::failure(format!(
            "the run stopped: {reason}; fix it and rerun the same command to resume"
        ))
        .after_json_report());
    }
    if !failed.is_empty() {
        return Err(CliError::failure(format!(
            "{} model(s) failed: {}; see {}/<id>.failure.json and the logs; rerun the same \
             command to retry them",
            failed.len(),
            failed.join(", "),
            results.display()
        ))
        .after_json_report());
    }
    if summary.without_artifact.is_empty() {
        crate::outln!(
            "next: release-cli publish --artifacts {} --manifest {}",
            ws.join("ready").display(),
            manifest_path.display()
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIN: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";
    const REF: &str = "62bf6fb072880905a4c490f0f4f4a6b3c23346ec";

    fn base() -> Manifest {
        Manifest::from_slice(
            br#"{"models": [
  {"id": "pop223", "name": "Pop", "version": "v11", "series": "OP Series", "released": "2025-01-01", "community_favorite": true, "artifact_format": "tinygrad_single_v1", "artifact_size": 5, "artifact_sha256": "0000000000000000000000000000000000000000000000000000000000000000", "artifact_chunk_count": 1, "uses_external_gpu": false},
  {"id": "sc23", "name": "SC", "version": "v9", "series": "OP Series", "released": "2025-01-02", "community_favorite": false},
  {"id": "bmrlnapv6", "name": "B", "version": "v16", "series": "WM Series", "released": "2025-01-03", "community_favorite": false, "uses_external_gpu": true}
]}"#,
        )
        .unwrap()
    }

    #[test]
    fn source_map_shapes() {
        let map = parse_source_map(
            format!(
                r#"{{"pop223": {{"source_id": "pop22", "input_format": "split", "ref": "{REF}"}},
                    "sc23": {{"input_format": "supercombo"}},
                    "new1": {{"input_format": "auto", "uses_external_gpu": true}}}}"#
            )
            .as_bytes(),
            Path::new("m.json"),
        )
        .unwrap();
        assert_eq!(map.len(), 3);
        assert_eq!(map[0].source_id.as_str(), "pop22");
        assert_eq!(map[0].input_format, InputFormat::Split);
        assert_eq!(map[0].source_commit.as_ref().unwrap().as_str(), REF);
        assert_eq!(map[1].source_id.as_str(), "sc23");
        assert_eq!(map[2].uses_external_gpu, Some(true));
        for bad in [
            r#"[]"#,
            r#"{"Bad": {}}"#,
            r#"{"a": {"input_format": "onnx"}}"#,
            r#"{"a": {"ref": "62bf6fb"}}"#,
            r#"{"a": {"uses_external_gpu": "yes"}}"#,
        ] {
            assert!(
                parse_source_map(bad.as_bytes(), Path::new("m")).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn plan_keeps_versions_and_never_adds_models() {
        let map = parse_source_map(
            br#"{"pop223": {"input_format": "split"}, "new1": {}, "bmrlnapv6": {}}"#,
            Path::new("m"),
        )
        .unwrap();
        let (p, missing) = plan(&map, &base(), &[]).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].version.to_string(), "v11");
        assert!(!p[0].gpu);
        assert!(
            p[1].gpu,
            "uses_external_gpu comes from the catalog when the map is silent"
        );
        assert_eq!(missing, vec!["new1".parse::<ModelId>().unwrap()]);
        assert!(plan(&map, &base(), &["new1".parse().unwrap()]).is_err());
        assert!(plan(&map, &base(), &["sc23".parse().unwrap()]).is_err());
        let (p, _) = plan(&map, &base(), &["bmrlnapv6".parse().unwrap()]).unwrap();
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn manifest_from_records() {
        let pin: GitCommit = PIN.parse().unwrap();
        let g = Generation::new(26);
        let rec = BuildRecord {
            id: "sc23".parse().unwrap(),
            status: "compiled".into(),
            generation: g,
            tinygrad_commit: pin.clone(),
            version: "v9".parse().unwrap(),
            source_id: "sc23".parse().unwrap(),
            input_format: InputFormat::Supercombo,
            uses_external_gpu: false,
            source_commit: Some(REF.parse().unwrap()),
            sources: vec!["a.onnx".into()],
            artifact: RecordedArtifact {
                name: "sc23_driving_tinygrad.pkl".into(),
                size: 2500,
                sha256: chunker::Sha256Digest::of_bytes(b"x"),
                chunk_count: 3,
                files: vec![],
                // A record written before per-chunk digests were kept.
                chunk_sha256: vec![],
            },
            log: "l".into(),
        };
        assert!(record_matches(&rec, g, &pin));
        assert!(!record_matches(&rec, Generation::new(25), &pin));

        // A record only counts as done for the plan it was built from.
        let map = parse_source_map(
            format!(r#"{{"sc23": {{"input_format": "supercombo", "ref": "{REF}"}}}}"#).as_bytes(),
            Path::new("m"),
        )
        .unwrap();
        let (planned, _) = plan(&map, &base(), &[]).unwrap();
        assert!(record_fits(&rec, &planned[0]));
        let changed = [
            ("version", {
                let mut p = planned[0].clone();
                p.version = "v10".parse().unwrap();
                p
            }),
            ("input format", {
                let mut p = planned[0].clone();
                p.source.input_format = InputFormat::Split;
                p
            }),
            ("source id", {
                let mut p = planned[0].clone();
                p.source.source_id = "sc2".parse().unwrap();
                p
            }),
            ("ref", {
                let mut p = planned[0].clone();
                p.source.source_commit = None;
                p
            }),
            ("gpu", {
                let mut p = planned[0].clone();
                p.gpu = true;
                p
            }),
        ];
        for (what, p) in changed {
            assert!(!record_fits(&rec, &p), "{what} changed");
        }
        let m = build_manifest(&base(), std::slice::from_ref(&rec), g, &pin).unwrap();
        assert_eq!(m.generation(), Some(g));
        assert_eq!(m.tinygrad_commit(), Some(pin.clone()));
        let sc = m.get(&"sc23".parse().unwrap()).unwrap();
        assert_eq!(sc.version().unwrap().to_string(), "v9");
        assert_eq!(sc.artifact_size().unwrap().get(), 2500);
        assert_eq!(sc.artifact_chunk_count().unwrap().get(), 3);
        assert_eq!(sc.source_commit().unwrap().as_str(), REF);
        // The v25 digest of pop223 describes another generation's pickle: gone.
        let pop = m.get(&"pop223".parse().unwrap()).unwrap();
        assert!(pop.artifact_sha256().is_none() && pop.artifact_format().is_none());
        assert_eq!(pop.version().unwrap().to_string(), "v11");
        assert_eq!(m.models().len(), 3);
        assert!(
            sc.chunk_digests().is_none(),
            "no digests recorded, none written"
        );

        // With per-chunk digests recorded, they go into the manifest in chunk order.
        let digests: Vec<_> = [b"a", b"b", b"c"]
            .iter()
            .map(|b| chunker::Sha256Digest::of_bytes(&b[..]))
            .collect();
        let mut with = rec.clone();
        with.artifact.chunk_sha256 = digests.clone();
        let m = build_manifest(&base(), &[with], g, &pin).unwrap();
        let sc = m.get(&"sc23".parse().unwrap()).unwrap();
        assert_eq!(sc.chunk_digests().unwrap(), digests);
    }
}
