//! `download <ID>`, `download --all` (and the daemon's `DownloadAllModels`), and their dry
//! run, each deciding from the catalog of the [`DeviceView`] read at its top. Each model goes
//! through `manager::install` (kept when a verified copy is there); the
//! dry run plans each artifact as the downloader would fetch it (the first answering origin,
//! size, pieces) and makes the real run's checks (catalog, external-GPU rule, free space)
//! without a payload byte.

use std::path::PathBuf;

use downloader::{CancelToken, DigestSource, Downloader, Installed, Target};
use manifest::{Manifest, ModelEntry, ModelId};
use serde::Serialize;

use crate::error::Result;
use crate::report::progress::{Progress, ProgressFn};
use crate::rules::contract::is_builtin_id;
use crate::rules::decisions::{Requested, gpu_rule, requested};
use crate::rules::plan::{self, InstallStep};
use crate::run::manager::{install, variant_in_place};
use crate::state::device::Device;
use crate::state::params::keys;
use crate::state::view::DeviceView;

/// `download <ID>`: the catalog entry, downloaded and verified.
pub fn download_model(
    device: &Device,
    dl: &Downloader,
    id: &ModelId,
    cancel: &CancelToken,
    progress: ProgressFn,
) -> Result<Option<Installed>> {
    let generation = device.config.generation;
    let mut view = DeviceView::read(device);
    let entry = match requested(id, generation, || view.take_catalog())? {
        Requested::BuiltIn(_) => {
            progress(&Progress::BuiltinAlreadyDownloaded);
            return Ok(None);
        }
        Requested::Local(_) => {
            progress(&Progress::LocalNothingToDownload);
            return Ok(None);
        }
        Requested::Catalog(entry) => entry,
    };
    // Upstream: a GPU-only model needs a ready Chestnut, unless the UI set the one-request
    // override (used up here, whatever the outcome).
    let allow = device.memory.get_bool(keys::ALLOW_GPU_WITHOUT_GPU)?;
    if allow {
        device.memory.remove(keys::ALLOW_GPU_WITHOUT_GPU)?;
    }
    gpu_rule(&entry, device.chestnut(), allow)?;
    let r = install(device, dl, &entry, cancel, progress)?;
    // A verified copy was there (`None`): nothing was fetched, so nothing says "Downloaded!"
    // here; the caller says what it did (the daemon ends a request with upstream's text).
    if r.is_some() {
        progress(&Progress::Downloaded);
    }
    Ok(r)
}

/// What [`download_all`] did: each model it went through and whether it was downloaded (a
/// verified copy is kept); `cancelled` when it stopped before the next model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllDownloads {
    pub models: Vec<(ModelId, bool)>,
    pub cancelled: bool,
}

/// `download --all` and the UI's `DownloadAllModels`: every [`downloadable`] model of the
/// stored catalog installed in turn. `around(entry, true)` is called before each model and
/// `around(entry, false)` after it (also when it failed); the first failure stops the run, and
/// a set `cancel` stops it before the next model.
pub fn download_all(
    device: &Device,
    dl: &Downloader,
    cancel: &CancelToken,
    around: &dyn Fn(&ModelEntry, bool),
    progress: ProgressFn,
) -> Result<AllDownloads> {
    let catalog = DeviceView::read(device).take_catalog()?;
    let mut all = AllDownloads::default();
    for entry in downloadable_on(device, &catalog) {
        // An artifact modeld could not start here is skipped, not a failure of the run.
        if crate::state::load_receipt::condemned(device, entry).is_some() {
            continue;
        }
        if cancel.is_cancelled() {
            all.cancelled = true;
            break;
        }
        around(entry, true);
        let r = install(device, dl, entry, cancel, progress);
        around(entry, false);
        all.models.push((entry.id().clone(), r?.is_some()));
    }
    Ok(all)
}

/// Every catalog model "download all" takes: downloadable, not the built-in, and an
/// external-GPU model only with a ready Chestnut (upstream's rule); on a `protected` device
/// (trusted keys) only models whose signed entry pins their bytes
/// (`downloader::trust::digest_rule`); `contract` is the device's (the artifact format it
/// loads).
pub fn downloadable<'a>(
    catalog: &'a Manifest,
    chestnut: downloader::egpu::Chestnut,
    protected: bool,
    contract: &manifest::Contract,
) -> Vec<&'a ModelEntry> {
    catalog
        .models()
        .iter()
        .filter(|e| {
            downloader::Target::from_entry_for(e, contract)
                .is_ok_and(|t| downloader::trust::target_rule(protected, &t).is_ok())
        })
        .filter(|e| {
            !crate::rules::contract::is_builtin_id(e.id().as_str())
                && downloader::egpu::unrequested_download(e.uses_external_gpu(), chestnut)
        })
        .collect()
}

/// [`downloadable`] on `device` (its Chestnut, keys and contract).
fn downloadable_on<'a>(device: &Device, catalog: &'a Manifest) -> Vec<&'a ModelEntry> {
    let (chestnut, protected) = (device.chestnut(), device.is_protected());
    downloadable(catalog, chestnut, protected, device.contract())
}

/// What `download <ID>` or `download --all` (`all`) did, as `download --json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct DownloadReport {
    #[serde(skip)]
    pub all: bool,
    pub models: Vec<Downloaded>,
}

/// One model of a [`DownloadReport`]: where modeld finds it, and whether it was fetched now.
#[derive(Debug, Clone, Serialize)]
pub struct Downloaded {
    pub id: ModelId,
    pub path: PathBuf,
    pub downloaded: bool,
}

impl DownloadReport {
    /// The report of `done` (each model and whether it was downloaded) on `device`.
    pub fn of(device: &Device, all: bool, done: &[(ModelId, bool)]) -> Self {
        let models = done.iter().map(|(id, downloaded)| Downloaded {
            id: id.clone(),
            path: match is_builtin_id(id.as_str()) {
                true => device.builtin_path(),
                false => device.artifact_path(id),
            },
            downloaded: *downloaded,
        });
        Self {
            all,
            models: models.collect(),
        }
    }
}

/// One model of `download --dry-run`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelDownload {
    pub id: ModelId,
    #[serde(flatten)]
    pub action: Action,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Built-in or local: nothing to download (the reason says which).
    #[serde(rename = "none")]
    Nothing { reason: &'static str },
    /// A verified copy is installed.
    Installed,
    /// Would be downloaded: each artifact (the model's, and its Chestnut build with a ready
    /// external GPU) with what the first answering origin publishes.
    Download { artifacts: Vec<Planned> },
}

/// One artifact `download` would fetch, from the first answering origin's plan.
#[derive(Debug, Clone, Serialize)]
pub struct Planned {
    /// The local file name.
    pub name: String,
    pub origin: String,
    pub size: u64,
    pub sha256: chunker::Sha256Digest,
    #[serde(serialize_with = "source_name")]
    pub digest_source: DigestSource,
    /// How many remote files it is fetched from.
    pub pieces: usize,
    /// Files it would write: the artifact, and the origin's digest beside it when the entry
    /// declares none.
    pub would_install: Vec<String>,
    /// Files of the models directory the install would remove (its other forms).
    pub would_remove: Vec<String>,
}

fn source_name<S: serde::Serializer>(
    s: &DigestSource,
    ser: S,
) -> std::result::Result<S::Ok, S::Error> {
    ser.serialize_str(s.as_str())
}

/// What `download` would do; serialized as `download --dry-run --json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct DownloadPlanReport {
    /// Always true: `"dry_run": true` leads its `--json`.
    pub dry_run: bool,
    pub models: Vec<ModelDownload>,
    /// Bytes the downloads would fetch.
    #[serde(rename = "download_bytes")]
    pub needed: u64,
    /// Bytes free in the models directory now.
    #[serde(rename = "free_bytes")]
    pub free: u64,
}

/// `download --dry-run` of `id` (`None` = `--all`): what each model would fetch, checked as the
/// real run checks it (catalog, GPU rule, free space with the downloader's margin), without a
/// payload byte.
pub fn plan(device: &Device, dl: &Downloader, id: Option<&ModelId>) -> Result<DownloadPlanReport> {
    device.ensure_offroad("download")?;
    let mut view = DeviceView::read(device);
    let nothing = |id: ModelId, why: &'static str| DownloadPlanReport {
        dry_run: true,
        models: vec![ModelDownload {
            id,
            action: Action::Nothing { reason: why },
        }],
        needed: 0,
        free: free_bytes(device),
    };
    let entries: Vec<ModelEntry> = match id {
        None => (downloadable_on(device, &view.take_catalog()?).into_iter())
            .cloned()
            .collect(),
        Some(id) => match requested(id, device.config.generation, || view.take_catalog())? {
            Requested::BuiltIn(id) => return Ok(nothing(id, "built-in")),
            Requested::Local(id) => return Ok(nothing(id, "local")),
            Requested::Catalog(entry) => {
                // Read, never used up (the real run removes the one-request override).
                let allow = device.memory.get_bool(keys::ALLOW_GPU_WITHOUT_GPU)?;
                gpu_rule(&entry, device.chestnut(), allow)?;
                vec![entry]
            }
        },
    };
    let cancel = CancelToken::new();
    let names = device.model_file_names()?;
    let mut space = SpaceUse {
        free: free_bytes(device),
        needed: 0,
        margin: dl.space_margin(),
    };
    let mut models = Vec::new();
    for entry in &entries {
        let targets: Vec<Target> =
            downloader::egpu::artifacts_to_fetch(entry, device.chestnut(), device.contract())?;
        // As `install`: the model's artifact unless a verified copy is there, its Chestnut
        // build unless that is in place.
        let main_kept = plan::install_step(device.planning().verify_entry(entry, false)?, true)
            == InstallStep::Keep;
        let mut planned = Vec::new();
        for (i, target) in targets.iter().enumerate() {
            // A variant the signature does not pin is left out, as `install` leaves it out.
            if (i == 0 && main_kept)
                || (i > 0 && (variant_in_place(device, target) || dl.check_signed(target).is_err()))
            {
                continue;
            }
            let plan = dl.plan_target(device.config.generation, target, &cancel)?;
            // A staging file of this artifact is reused or removed before the real check: its
            // blocks count as free for it.
            let staged = downloader::staged_bytes(
                &device.models_dir(),
                &plan.sha256.to_hex(),
                target.local_name.as_str(),
            );
            space.take(device, plan.size, staged)?;
            planned.push(Planned::of(plan, target, &names));
        }
        models.push(ModelDownload {
            id: entry.id().clone(),
            action: if planned.is_empty() {
                Action::Installed
            } else {
                Action::Download { artifacts: planned }
            },
        });
    }
    Ok(DownloadPlanReport {
        dry_run: true,
        models,
        needed: space.needed,
        free: space.free,
    })
}

/// The free space the planned downloads use, checked as the real run checks each download's
/// size plus the margin against what is free then: earlier downloads of the run have used
/// their share.
struct SpaceUse {
    free: u64,
    needed: u64,
    margin: u64,
}

impl SpaceUse {
    /// One more download of `size` bytes, `staged` of which are on disk already (they count as
    /// free for it); refused when it does not fit.
    fn take(&mut self, device: &Device, size: u64, staged: u64) -> Result<()> {
        let before = self.needed;
        self.needed = self.needed.saturating_add(size);
        if self.free.saturating_add(staged) < self.needed.saturating_add(self.margin) {
            return Err(downloader::Error::InsufficientSpace {
                path: device.models_dir(),
                needed: size.saturating_add(self.margin),
                available: self.free.saturating_sub(before).saturating_add(staged),
            }
            .into());
        }
        Ok(())
    }
}

impl Planned {
    /// The artifact `plan` fetches for `target`, with the files it would install and those of
    /// `names` (the models directory's) it would remove.
    fn of(plan: downloader::DownloadPlan, target: &Target, names: &[String]) -> Planned {
        let local = target.local_name.as_str();
        let mut would_install = vec![local.to_string()];
        if plan.digest_source == DigestSource::Sidecar {
            would_install.push(chunker::sidecar_name(local));
        }
        let mut would_remove = downloader::other_forms(names.iter().map(String::as_str), local);
        // The sidecar is rewritten, not removed, when the digest came from the origin's.
        would_remove.retain(|n| !would_install.contains(n));
        Planned {
            name: local.to_string(),
            origin: plan.origin,
            size: plan.size,
            sha256: plan.sha256,
            digest_source: plan.digest_source,
            pieces: plan.pieces.len(),
            would_install,
            would_remove,
        }
    }
}

fn free_bytes(device: &Device) -> u64 {
    downloader::space::available_bytes(&device.models_dir()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Regression: download-all compared ids with the built-in's literally, so a catalog entry
    /// under the built-in's alias (`rdf` for `rdf43`) was downloaded as if it were another model.
    #[test]
    fn download_all_leaves_out_the_builtin_under_any_of_its_names() {
        let entry = |id: &str| {
            json!({"id": id, "name": id, "version": "v16",
                "artifact_filename": format!("{id}_driving_tinygrad.pkl"),
                "artifact_size": 10, "artifact_chunk_count": 1,
                "artifact_sha256": "ab".repeat(32)})
        };
        let catalog = Manifest::from_value(json!({"models": [
            entry("rdf43"), entry("rdf"), entry("pop223"),
        ]}))
        .unwrap();
        let ids: Vec<&str> = downloadable(
            &catalog,
            downloader::egpu::Chestnut::Absent,
            false,
            manifest::contract::BASE_CONTRACT.contract(),
        )
        .into_iter()
        .map(|e| e.id().as_str())
        .collect();
        assert_eq!(ids, ["pop223"]);
    }
}
