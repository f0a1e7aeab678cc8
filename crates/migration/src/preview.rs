//! What `refresh`, `download` and `verify` would do, read-only (their `--dry-run`): every read
//! and check the real run makes that changes nothing (the onroad refusal, the manifest fetch
//! with its signature check, the catalog and the installed models read, the GPU rule, the space
//! check), then what the real run would write, remove and download. Nothing is written: no
//! param, no cache, no trust record, not the verification cache either
//! ([`Device::verify_entry_read_only`]).
//!
//! The decisions are the real run's own functions (`decisions::journal_now`, `chosen`,
//! `Installs::step` over [`plan::install_step`], `settle`, `contract_writes`,
//! `accepted_catalog_body`, `requested`, `gpu_rule`, `variant_in_place`, the trust floor), so a
//! dry run cannot drift from what the run does; only the effects are left out. Where the real
//! run downloads, the plan assumes the download succeeds.

use std::collections::BTreeMap;

use downloader::{CancelToken, DigestSource, DownloadPlan, Downloader, Target};
use manifest::{ModelEntry, ModelId};

use crate::decisions::{
    ContractWrites, Installs, Requested, Settled, accepted_catalog_body, chosen, contract_writes,
    gpu_rule, journal_now, offline_first_boot_due, requested, settle, variant_in_place,
};
use crate::device::{Device, JOURNAL_FILE, REFUSED_FILE, RefusedModel, VerifyState};
use crate::error::{Error, Result};
use crate::manager::{Phase, downloadable, param_slots};
use crate::offline::offline_catalog;
use crate::params::keys;
use crate::plan::{self, InstallStep};
use crate::{choice, trust_state};

/// What `refresh` would do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefreshPlan {
    pub generation: String,
    pub manifest_origin: String,
    pub manifest_url: String,
    pub models: usize,
    pub refused_entries: Vec<RefusedModel>,
    /// `Some(from)` when a generation migration would start or resume (`from` as the param
    /// says it; `None` inside when unknown).
    pub migrate_from: Option<Option<String>>,
    pub would_purge: Vec<String>,
    /// Catalog models the run would download, with the state of what is installed now.
    pub would_download: Vec<(ModelId, VerifyState)>,
    /// Catalog models already installed and verified: kept.
    pub would_keep: Vec<ModelId>,
    /// Models whose retry is not due yet: the run skips them.
    pub not_due: Vec<ModelId>,
    /// The selection the run would write, assuming every download succeeds.
    pub selected: ModelId,
    pub fell_back_to_builtin: bool,
    /// Files of the models directory whose bytes would change (or appear).
    pub would_write: Vec<String>,
    /// State files of the models directory that would be removed.
    pub would_remove: Vec<String>,
    /// Params whose value would change: `(key, Some(new))`, or `(key, None)` for a removal.
    pub would_set_params: Vec<(String, Option<String>)>,
}

/// `refresh --dry-run`: the manifest fetched and checked as `refresh` fetches it, then what the
/// run would write. Errors are the ones the real run gives for the same checks.
pub fn refresh(device: &Device, dl: &Downloader, now_unix: u64) -> Result<RefreshPlan> {
    device.ensure_offroad("refresh")?;
    let generation = device.config.generation;
    // As `trust_state::fetch_accepted`, without recording the accepted release or a refusal.
    let floor = trust_state::release_floor(device, dl)?;
    let fetched = dl.fetch_manifest_accepting(generation, floor, &CancelToken::new())?;
    let mut would_write = Vec::new();
    let mut would_remove = Vec::new();
    if let Some(signed) = &fetched.signed
        && let Some(all) =
            trust_state::accepted_after(trust_state::accepted_releases(device)?, generation, signed)
        && device.would_change(trust_state::ACCEPTED_RELEASE_FILE, &pretty(&all))
    {
        would_write.push(trust_state::ACCEPTED_RELEASE_FILE.to_string());
    }
    if !fetched.refused.is_empty() {
        would_write.push(trust_state::REFUSED_MANIFEST_FILE.to_string());
    } else if exists(device, trust_state::REFUSED_MANIFEST_FILE) {
        would_remove.push(trust_state::REFUSED_MANIFEST_FILE.to_string());
    }
    // As `trust_state::store_accepted`: a signed catalog is stored as signed, beside its
    // signature block.
    let body = match &fetched.signed {
        Some(_) => fetched.raw.clone(),
        None => accepted_catalog_body(&fetched, generation)?,
    };
    if device.would_change(crate::CATALOG_FILE, &body) {
        would_write.push(crate::CATALOG_FILE.to_string());
    }
    if let Some(signed) = &fetched.signed
        && device.would_change(
            crate::device::CATALOG_SIGNATURE_FILE,
            signed.block.as_str().as_bytes(),
        )
    {
        would_write.push(crate::device::CATALOG_SIGNATURE_FILE.to_string());
    }
    let refused: Vec<RefusedModel> = fetched.refused_entries.iter().map(Into::into).collect();
    if device.would_change(REFUSED_FILE, &pretty(&refused)) {
        would_write.push(REFUSED_FILE.to_string());
    }
    // The catalog as the real run reads it back once stored.
    let mut manifest = fetched.manifest.clone();
    manifest.set_generation(generation);
    let catalog = device.device_catalog(&manifest)?;

    let (journal, journal_written) = journal_now(device, &catalog)?;
    let purging = journal.as_ref().is_some_and(|j| j.phase == Phase::Purge);
    let would_purge = if purging {
        plan::purge_plan(device.model_file_names()?.iter().map(String::as_str))
    } else {
        Vec::new()
    };
    if journal.is_some() {
        if journal_written || purging {
            would_write.push(JOURNAL_FILE.to_string());
        }
        if exists(device, JOURNAL_FILE) {
            would_remove.push(JOURNAL_FILE.to_string());
        }
    }
    let record = device.choice()?;
    let slots_now = param_slots(device)?;
    let (raw, wanted) = chosen(journal.as_ref(), record.as_ref(), &slots_now, &catalog);

    let mut installs = Installs::default();
    let mut would_download = Vec::new();
    let mut would_keep = Vec::new();
    let mut not_due = Vec::new();
    for id in wanted.to_install() {
        let Some(entry) = manifest.get(&id) else {
            continue;
        };
        // The purge removes every catalog model's artifact before the installs look.
        let state = if purging {
            VerifyState::Missing
        } else {
            device.verify_entry_read_only(entry, false)?
        };
        let retry = record.as_ref().and_then(|r| r.retry.get(id.as_str()));
        match installs.step(&id, state, retry, now_unix) {
            InstallStep::Keep => would_keep.push(id),
            InstallStep::Wait => not_due.push(id),
            InstallStep::Fetch => {
                // Assuming the download succeeds.
                installs.ok.insert(id.clone());
                would_download.push((id, state));
            }
        }
    }
    // Refused onroad above, so nothing is held for driving.
    let Settled { outcome, next, .. } = settle(
        (&raw, &wanted),
        &catalog,
        &installs,
        &|id| device.local_present(id),
        record.as_ref(),
        None,
        now_unix,
    );
    if device.would_change(choice::CHOICE_FILE, &pretty(&next)) {
        would_write.push(choice::CHOICE_FILE.to_string());
    }
    let (mut params, files) = contract_writes(&catalog, &outcome);
    if let Some(j) = &journal {
        params.push((keys::MODEL_MANIFEST_VERSION, Some(j.to.to_string())));
    }
    let would_set_params = changes(device, (params, files), &mut would_write)?;
    Ok(RefreshPlan {
        generation: generation.to_string(),
        manifest_origin: fetched.origin,
        manifest_url: fetched.url,
        models: manifest.models().len(),
        refused_entries: refused,
        migrate_from: journal.map(|j| j.from),
        would_purge,
        would_download,
        would_keep,
        not_due,
        selected: outcome.selection.id.clone(),
        fell_back_to_builtin: outcome.fell_back,
        would_write,
        would_remove,
        would_set_params,
    })
}

/// The params of `writes` whose value would change (the last write of a key counts), in key
/// order; the files whose bytes would change are added to `would_write`.
fn changes(
    device: &Device,
    (params, files): ContractWrites,
    would_write: &mut Vec<String>,
) -> Result<Vec<(String, Option<String>)>> {
    let params: BTreeMap<&str, Option<String>> = params.into_iter().collect();
    let mut out = Vec::new();
    for (key, value) in params {
        if device.params.get(key)? != value {
            out.push((key.to_string(), value));
        }
    }
    for (name, body) in files {
        if device.would_change(name, &body) {
            would_write.push(name.to_string());
        }
    }
    Ok(out)
}

/// What a refresh whose manifest fetch failed writes before it returns the error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailedRefreshPlan {
    /// `Some(from)`: the offline first boot would start (or carry on with) the migration.
    pub migrate_from: Option<Option<String>>,
    pub would_purge: Vec<String>,
    /// State and cache files whose bytes would change (or appear).
    pub would_write: Vec<String>,
    /// As [`RefreshPlan::would_set_params`].
    pub would_set_params: Vec<(String, Option<String>)>,
}

impl FailedRefreshPlan {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// What `refresh` writes when its manifest fetch fails with `e` (the error
/// [`refresh`] returned): the refusal report on a trust refusal; offline, on a device not on
/// this generation, the offline first boot (journal, everything pointed at the built-in, the
/// old generation's artifacts purged). Read-only.
pub fn refresh_failure(device: &Device, e: &Error) -> Result<FailedRefreshPlan> {
    let mut plan = FailedRefreshPlan::default();
    if let Error::Download(d) = e
        && !downloader::trust::refusals(d).is_empty()
    {
        plan.would_write
            .push(trust_state::REFUSED_MANIFEST_FILE.to_string());
    }
    if !offline_first_boot_due(e) {
        return Ok(plan);
    }
    let catalog = offline_catalog(device)?;
    let (journal, written) = journal_now(device, &catalog)?;
    let Some(j) = journal else {
        return Ok(plan);
    };
    // As `begin_migration`: a journal past its purge phase is left as it is.
    if j.phase == Phase::Purge {
        plan.would_write.push(JOURNAL_FILE.to_string());
        let interim = crate::contract::interim(&j.wanted(&catalog), &catalog);
        plan.would_set_params = changes(
            device,
            contract_writes(&catalog, &interim),
            &mut plan.would_write,
        )?;
        plan.would_purge = plan::purge_plan(device.model_file_names()?.iter().map(String::as_str));
        plan.migrate_from = Some(j.from);
    } else if written {
        plan.would_write.push(JOURNAL_FILE.to_string());
    }
    Ok(plan)
}

fn pretty<T: serde::Serialize + ?Sized>(v: &T) -> Vec<u8> {
    serde_json::to_vec_pretty(v).expect("state serializes")
}

fn exists(device: &Device, name: &str) -> bool {
    fs_err::exists(device.models_dir().join(name)).unwrap_or(false)
}

/// One model of `download --dry-run`.
#[derive(Debug, Clone)]
pub struct ModelDownload {
    pub id: ModelId,
    pub action: Action,
}

#[derive(Debug, Clone)]
pub enum Action {
    /// Built-in or local: nothing to download (the text says which).
    Nothing(&'static str),
    /// A verified copy is installed.
    Installed,
    /// Would be downloaded: each artifact (the model's, and its Chestnut build with a ready
    /// external GPU) with what the first answering origin publishes.
    Download(Vec<Planned>),
}

#[derive(Debug, Clone)]
pub struct Planned {
    pub local_name: String,
    pub plan: DownloadPlan,
    /// Files of the models directory the install would remove (its other forms).
    pub would_remove: Vec<String>,
    /// Files it would write: the artifact, and the origin's digest beside it when the entry
    /// declares none.
    pub would_install: Vec<String>,
}

/// What `download` would do.
#[derive(Debug, Clone)]
pub struct DownloadPlanReport {
    pub models: Vec<ModelDownload>,
    /// Bytes the downloads would fetch.
    pub needed: u64,
    /// Bytes free in the models directory now.
    pub free: u64,
}

/// `download --dry-run` of `id` (`None` = `--all`): what each model would fetch, checked as the
/// real run checks it (catalog, GPU rule, free space), without a payload byte. `space_margin`
/// is the downloader's.
pub fn download(
    device: &Device,
    dl: &Downloader,
    id: Option<&ModelId>,
    space_margin: u64,
) -> Result<DownloadPlanReport> {
    device.ensure_offroad("download")?;
    let nothing = |id: ModelId, why: &'static str| DownloadPlanReport {
        models: vec![ModelDownload {
            id,
            action: Action::Nothing(why),
        }],
        needed: 0,
        free: free_bytes(device),
    };
    let entries: Vec<ModelEntry> = match id {
        None => {
            let catalog = device.require_catalog()?;
            downloadable(&catalog, device.chestnut(), device.is_protected())
                .into_iter()
                .cloned()
                .collect()
        }
        Some(id) => match requested(device, id)? {
            Requested::BuiltIn(id) => return Ok(nothing(id, "built-in")),
            Requested::Local(id) => return Ok(nothing(id, "local")),
            Requested::Catalog(entry) => {
                // Read, never used up (the real run removes the one-request override).
                let allow = device.memory.get_bool(keys::ALLOW_GPU_WITHOUT_GPU)?;
                gpu_rule(device, &entry, allow)?;
                vec![entry]
            }
        },
    };
    let cancel = CancelToken::new();
    let names = device.model_file_names()?;
    let free = free_bytes(device);
    let mut needed = 0u64;
    let mut models = Vec::new();
    for entry in &entries {
        let targets: Vec<Target> = downloader::egpu::artifacts_to_fetch(entry, device.chestnut())?;
        // As `install`: the model's artifact unless a verified copy is there, its Chestnut
        // build unless that is in place.
        let main_kept = plan::install_step(device.verify_entry_read_only(entry, false)?, true)
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
            // The real run checks each download's size plus the margin against what is free
            // then: earlier downloads of this run have used their share.
            let before = needed;
            needed = needed.saturating_add(plan.size);
            if free < needed.saturating_add(space_margin) {
                return Err(downloader::Error::InsufficientSpace {
                    path: device.models_dir(),
                    needed: plan.size.saturating_add(space_margin),
                    available: free.saturating_sub(before),
                }
                .into());
            }
            let local = target.local_name.as_str();
            let mut would_install = vec![local.to_string()];
            if plan.digest_source == DigestSource::Sidecar {
                would_install.push(chunker::sidecar_name(local));
            }
            let mut would_remove = downloader::other_forms(names.iter().map(String::as_str), local);
            // The sidecar is rewritten, not removed, when the digest came from the origin's.
            would_remove.retain(|n| !would_install.contains(n));
            planned.push(Planned {
                local_name: local.to_string(),
                plan,
                would_remove,
                would_install,
            });
        }
        models.push(ModelDownload {
            id: entry.id().clone(),
            action: if planned.is_empty() {
                Action::Installed
            } else {
                Action::Download(planned)
            },
        });
    }
    Ok(DownloadPlanReport {
        models,
        needed,
        free,
    })
}

fn free_bytes(device: &Device) -> u64 {
    downloader::space::available_bytes(&device.models_dir()).unwrap_or(0)
}
