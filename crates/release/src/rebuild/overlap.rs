//! What a rebuild overlaps with its compiles (`rebuild --upload-to`, docs/release.md "Rebuild
//! a generation"): the next model's sources fetched on the release machine while the current
//! one compiles ([`SourceFetcher`]), and each finished model's artifact files uploaded by a
//! background worker while the next compiles ([`Uploader`]; [`StoreUploader`] is publish's own
//! upload code, never a manifest). What the worker uploaded is recorded in
//! `results/<id>.upload.json` ([`UploadRecord`]), written atomically once the store has the
//! files; a rerun skips what is recorded and still whole there, and publish reads the record
//! to skip reading those files back.

use std::path::{Path, PathBuf};

use artifact_store::publish::{KnownFiles, prepare_one, upload_artifacts, variant_targets};
use artifact_store::retry::RetryPolicy;
use artifact_store::{Store, StoreAccess, StoreSpec};
use chunker::Sha256Digest;
use manifest::{Generation, Manifest, ModelId, StoreLayout};
use serde::{Deserialize, Serialize};

use super::record::read_json;
use super::{BuildError, PlannedModel};
use crate::Workspace;

/// Fetches a model's sources on another thread while the builder compiles the one before.
pub trait SourceFetcher: Send {
    /// As [`super::Builder::fetch_sources`].
    fn fetch(&mut self, model: &PlannedModel, dir: &Path) -> Result<Vec<PathBuf>, BuildError>;
}

/// Sources from a store (`onnx/<source-id>/*.onnx`), the store opened on first use.
pub struct StoreFetcher {
    pub sources: StoreSpec,
    pub access: StoreAccess,
    store: Option<Box<dyn Store>>,
}

impl StoreFetcher {
    pub fn new(sources: StoreSpec, access: StoreAccess) -> Self {
        Self {
            sources,
            access,
            store: None,
        }
    }
}

impl SourceFetcher for StoreFetcher {
    fn fetch(&mut self, model: &PlannedModel, dir: &Path) -> Result<Vec<PathBuf>, BuildError> {
        if self.store.is_none() {
            let store = self
                .sources
                .open(&self.access)
                .map_err(BuildError::SourceStore)?;
            self.store = Some(store);
        }
        let store = self.store.as_deref().expect("opened");
        super::fetch_sources(store, &model.source.source_id, dir)
            .map_err(|e| BuildError::Sources(e.into()))
    }
}

/// One file an upload put in a store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadedFile {
    /// Its store path (`models/<gen>/<id>/<file>`).
    pub path: String,
    pub size: u64,
    pub sha256: Sha256Digest,
}

/// One artifact (the model's, or an accelerator variant) a store holds whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadRow {
    /// The store, as publish's record names it ([`crate::publish::canonical_store_name`]).
    pub store: String,
    /// The logical artifact name.
    pub artifact: String,
    pub sha256: Sha256Digest,
    pub size: u64,
    pub files: Vec<UploadedFile>,
}

/// `results/<id>.upload.json`: what `rebuild --upload-to` put in each store for the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadRecord {
    pub id: ModelId,
    pub generation: Generation,
    pub uploads: Vec<UploadRow>,
}

/// Where the background worker puts each finished model: the stores in order, each asked
/// whether a recorded row is still whole there and to upload a model's files.
pub trait Uploader: Send {
    /// The stores, as records name them, in upload order.
    fn stores(&self) -> Vec<String>;
    /// Whether store `store` holds every file of `row` at its recorded size.
    fn whole(&mut self, store: usize, row: &UploadRow) -> crate::Result<bool>;
    /// Upload the artifact files of `id` in the artifacts directory `ready` (each verified
    /// against its row in `manifest`) to store `store`; the rows it now holds whole.
    fn upload(
        &mut self,
        store: usize,
        ready: &Path,
        id: &ModelId,
        manifest: &Manifest,
    ) -> crate::Result<Vec<UploadRow>>;
}

/// A finished model handed to the worker: its manifest row and the artifacts it must find.
pub(super) struct UploadJob {
    pub id: ModelId,
    pub manifest: Manifest,
    /// (artifact name, SHA-256) of the model's artifact and each rebuilt variant.
    pub artifacts: Vec<(String, Sha256Digest)>,
}

/// How one model's upload to one store ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UploadOutcome {
    pub id: ModelId,
    pub store: String,
    /// `uploaded`, `recorded` (recorded earlier and still whole: skipped) or `failed` (publish
    /// will upload it).
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The worker's work for one model: per store, skip it when the record names every artifact
/// of the job and the store still holds them whole, else upload and record what the store
/// then holds. A failure is the outcome, never the end of the run.
fn upload_model(
    ws: &Workspace,
    generation: Generation,
    up: &mut dyn Uploader,
    job: &UploadJob,
) -> Vec<UploadOutcome> {
    let path = ws.upload_record(&job.id);
    let mut rec = read_json::<UploadRecord>(&path)
        .filter(|r| r.generation == generation && r.id == job.id)
        .unwrap_or_else(|| UploadRecord {
            id: job.id.clone(),
            generation,
            uploads: Vec::new(),
        });
    let mut out = Vec::new();
    for (i, store) in up.stores().into_iter().enumerate() {
        let outcome = |status, error| UploadOutcome {
            id: job.id.clone(),
            store: store.clone(),
            status,
            error,
        };
        let recorded = job.artifacts.iter().all(|(name, sha)| {
            rec.uploads.iter().any(|r| {
                r.store == store
                    && &r.artifact == name
                    && &r.sha256 == sha
                    && matches!(up.whole(i, r), Ok(true))
            })
        });
        if recorded {
            out.push(outcome("recorded", None));
            continue;
        }
        let done = up
            .upload(i, &ws.ready(), &job.id, &job.manifest)
            .and_then(|rows| {
                rec.uploads.retain(|r| r.store != store);
                rec.uploads.extend(rows);
                crate::records::write(&path, &rec)
            });
        out.push(match done {
            Ok(()) => outcome("uploaded", None),
            Err(e) => outcome("failed", Some(e.to_string())),
        });
    }
    out
}

/// The upload worker: each finished model of `jobs` through [`upload_model`], its outcomes
/// sent to `done`. A panic in the uploader (a bug in a store client) is that model's `failed`
/// outcome, not the end of the run; the uploader, its state unknown, is not used again, so
/// the models after it fail too (publish uploads them).
pub(super) fn upload_worker(
    ws: &Workspace,
    generation: Generation,
    up: &mut dyn Uploader,
    jobs: std::sync::mpsc::Receiver<UploadJob>,
    done: std::sync::mpsc::Sender<Vec<UploadOutcome>>,
) {
    let stores = up.stores();
    let mut panicked: Option<String> = None;
    for job in jobs {
        let ran = match &panicked {
            None => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                upload_model(ws, generation, up, &job)
            }))
            .map_err(|p| {
                let what = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown".into());
                format!("the upload worker panicked ({what})")
            }),
            Some(why) => Err(format!("not uploaded: {why} earlier")),
        };
        let outcomes = ran.unwrap_or_else(|error| {
            panicked.get_or_insert_with(|| error.clone());
            stores
                .iter()
                .map(|store| UploadOutcome {
                    id: job.id.clone(),
                    store: store.clone(),
                    status: "failed",
                    error: Some(error.clone()),
                })
                .collect()
        });
        if done.send(outcomes).is_err() {
            return;
        }
    }
}

/// Publish's [`KnownFiles`] for each `stores` entry (as publish's record names stores): the
/// files the workspace's upload records of `ids` say that store holds.
pub fn known_files(
    ws: &Workspace,
    generation: Generation,
    ids: impl Iterator<Item = ModelId>,
    stores: &[String],
) -> Vec<KnownFiles> {
    let mut known = vec![KnownFiles::new(); stores.len()];
    for id in ids {
        let Some(rec) = read_json::<UploadRecord>(&ws.upload_record(&id)) else {
            continue;
        };
        if rec.generation != generation {
            continue;
        }
        for row in &rec.uploads {
            if let Some(i) = stores.iter().position(|s| *s == row.store) {
                for f in &row.files {
                    known[i].insert(f.path.clone(), (f.size, f.sha256));
                }
            }
        }
    }
    known
}

/// The real [`Uploader`]: the `--upload-to` stores, through publish's upload code.
pub struct StoreUploader {
    names: Vec<String>,
    stores: Vec<Box<dyn Store>>,
    generation: Generation,
    contract: &'static manifest::Contract,
    retry: RetryPolicy,
}

impl StoreUploader {
    /// Open `specs` (refused in an order that puts GitHub ahead of the Hub, as publish).
    pub fn open(
        specs: &[StoreSpec],
        access: &StoreAccess,
        generation: Generation,
        contract: &'static manifest::Contract,
    ) -> crate::Result<Self> {
        Ok(Self {
            stores: crate::publish::open_stores(specs, access)?,
            names: specs
                .iter()
                .map(crate::publish::canonical_store_name)
                .collect(),
            generation,
            contract,
            retry: RetryPolicy::default(),
        })
    }
}

impl Uploader for StoreUploader {
    fn stores(&self) -> Vec<String> {
        self.names.clone()
    }

    fn whole(&mut self, store: usize, row: &UploadRow) -> crate::Result<bool> {
        for f in &row.files {
            let stat = self.stores[store].stat(&f.path.parse()?)?;
            if stat.map(|s| s.size) != Some(f.size) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn upload(
        &mut self,
        store: usize,
        ready: &Path,
        id: &ModelId,
        manifest: &Manifest,
    ) -> crate::Result<Vec<UploadRow>> {
        let local = prepare_one(ready, id, manifest, self.contract)?;
        let s = self.stores[store].as_ref();
        upload_artifacts(s, &local, self.generation, self.retry, &mut |_| {})?;
        let entry = manifest
            .get(id)
            .ok_or_else(|| crate::Error::NotInManifest {
                id: id.clone(),
                artifact: None,
            })?;
        let dir = StoreLayout::HfBucket.artifact_dir(self.generation, id);
        let mut rows = Vec::new();
        for a in local.iter().filter(|a| !a.files.is_empty()) {
            let (sha256, size) = match &a.variant {
                None => entry.artifact().map(|x| (x.sha256, x.size.get())),
                Some(_) => variant_targets(entry)
                    .into_iter()
                    .flatten()
                    .find(|t| t.file_name == a.name)
                    .map(|t| (t.sha256, t.size)),
            }
            .ok_or_else(|| crate::Error::NotInManifest {
                id: id.clone(),
                artifact: Some(a.name.clone()),
            })?;
            let files = a.files.iter().map(|f| UploadedFile {
                path: format!("{dir}/{}", f.name),
                size: f.size,
                sha256: f.sha256,
            });
            rows.push(UploadRow {
                store: self.names[store].clone(),
                artifact: a.name.clone(),
                sha256,
                size,
                files: files.collect(),
            });
        }
        Ok(rows)
    }
}
