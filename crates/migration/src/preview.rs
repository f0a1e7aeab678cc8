//! What `refresh`, `download` and `verify` would do, read-only (their `--dry-run`).
//!
//! `refresh --dry-run` is the refresh itself in plan mode ([`Device::planning`],
//! [`crate::Effects::plan`]): the same reads and checks (the onroad refusal, the manifest fetch
//! with its signature check, the catalog and the installed models read), the same decisions,
//! every effect recorded in the typed log and skipped, later reads seeing the planned values;
//! where the real run downloads, the plan assumes the download succeeds. The report is read
//! off the log, so it cannot drift from what the run does. `download --dry-run` plans each
//! download as the downloader would fetch it (origin, size, pieces, the space check).

use std::collections::BTreeSet;

use downloader::{CancelToken, DigestSource, Downloader, Target};
use manifest::{ModelEntry, ModelId};
use serde::Serialize;

use crate::bounded::CATALOG_LIMIT;
use crate::decisions::{Requested, gpu_rule, requested, variant_in_place};
use crate::device::{
    CATALOG_FILE, CATALOG_SIGNATURE_FILE, Device, JOURNAL_FILE, REFUSED_FILE, RefusedModel,
    VerifyState,
};
use crate::effects::Effect;
use crate::error::{Error, Result};
use crate::manager::{downloadable, failed_fetch, read_journal, refresh_run};
use crate::params::keys;
use crate::plan::{self, InstallStep};
use crate::{choice, trust_state};

/// A dry run's JSON document: `"dry_run": true`, then the plan's own fields.
#[derive(Serialize)]
pub struct DryRun<'a, T: Serialize> {
    pub dry_run: bool,
    #[serde(flatten)]
    pub plan: &'a T,
}

impl<'a, T: Serialize> DryRun<'a, T> {
    pub fn of(plan: &'a T) -> Self {
        Self {
            dry_run: true,
            plan,
        }
    }

    /// The document, compact, on one line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plans serialize")
    }
}

/// What `gc` would remove (`gc` on [`Device::planning`]).
#[derive(Debug, Clone, Serialize)]
pub struct GcPlan {
    pub would_remove: Vec<String>,
}

/// What `refresh` would do; serialized as `refresh --dry-run --json` prints it (after
/// `"dry_run": true`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefreshPlan {
    pub generation: String,
    pub manifest_origin: String,
    pub manifest_url: String,
    pub models: usize,
    pub refused_entries: Vec<RefusedModel>,
    /// A generation migration would start or resume ...
    pub migrating: bool,
    /// ... from this generation, as the param says it (`None` when unknown).
    pub migrated_from: Option<String>,
    pub would_purge: Vec<String>,
    /// Catalog models the run would download, with the state of what is installed now.
    pub would_download: Vec<PlannedDownload>,
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
    /// Params whose value would change.
    pub would_set_params: Vec<ParamChange>,
}

/// A catalog model a refresh would download, and the state of what is installed now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedDownload {
    pub id: ModelId,
    pub installed: VerifyState,
}

/// A param whose value would change: the new value, or `None` for a removal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParamChange {
    pub key: String,
    pub value: Option<String>,
}

/// `refresh --dry-run`: the refresh itself on [`Device::planning`] (every effect recorded and
/// skipped, later reads seeing what was planned, downloads assumed to succeed), reported from
/// its typed log. Errors are the real run's: [`refresh_failure`] says what it writes then.
pub fn refresh(device: &Device, dl: &Downloader, now_unix: u64) -> Result<RefreshPlan> {
    let plan = device.planning();
    let (r, run) = refresh_run(&plan, dl, &CancelToken::new(), &|_| {}, now_unix)?;
    let (would_write, would_remove) = files(device, &plan)?;
    let step = |want: InstallStep| -> Vec<PlannedDownload> {
        let steps = run.steps.iter().filter(move |(_, _, s)| *s == want);
        let planned = |(id, state, _): &(ModelId, VerifyState, InstallStep)| PlannedDownload {
            id: id.clone(),
            installed: *state,
        };
        steps.map(planned).collect()
    };
    let ids = |want| step(want).into_iter().map(|p| p.id).collect();
    Ok(RefreshPlan {
        generation: r.generation.to_string(),
        manifest_origin: r.manifest_origin,
        manifest_url: run.manifest_url,
        models: r.models,
        refused_entries: r.refused_entries,
        migrating: run.journal.is_some(),
        migrated_from: run.journal.and_then(|j| j.from),
        would_purge: r.purged,
        would_download: step(InstallStep::Fetch),
        would_keep: ids(InstallStep::Keep),
        not_due: ids(InstallStep::Wait),
        selected: r.selected,
        fell_back_to_builtin: r.fell_back_to_builtin,
        would_write,
        would_remove,
        would_set_params: params(device, &plan)?,
    })
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
    pub would_set_params: Vec<ParamChange>,
}

impl FailedRefreshPlan {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// What `refresh` writes when its manifest fetch fails with `e` (the error [`refresh`]
/// returned): the real run's failure tail (`manager::failed_fetch`: the refusal report, the
/// offline first boot) on [`Device::planning`].
pub fn refresh_failure(device: &Device, e: &Error) -> Result<FailedRefreshPlan> {
    let plan = device.planning();
    failed_fetch(&plan, e)?;
    let effects = plan.effects().effects();
    let journaled = effects
        .iter()
        .any(|e| matches!(e, Effect::WriteFile { name, .. } if name == JOURNAL_FILE));
    Ok(FailedRefreshPlan {
        migrate_from: match journaled {
            true => read_journal(&plan)?.map(|j| j.from),
            false => None,
        },
        would_purge: effects
            .iter()
            .filter_map(|e| match e {
                Effect::Purge { name } => Some(name.clone()),
                _ => None,
            })
            .collect(),
        would_write: files(device, &plan)?.0,
        would_set_params: params(device, &plan)?,
    })
}

/// The params a planned run changed, with their value after it (`None`: removed), in key
/// order: those it wrote whose value then differs from the device's now.
fn params(device: &Device, plan: &Device) -> Result<Vec<ParamChange>> {
    let keys: BTreeSet<String> = (plan.effects().effects().into_iter())
        .filter_map(|e| match e {
            Effect::SetParam { key, .. } | Effect::RemoveParam { key } => Some(key),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for key in keys {
        let after = plan.params.get(&key)?;
        if device.params.get(&key)? != after {
            out.push(ParamChange { key, value: after });
        }
    }
    Ok(out)
}

/// The state files of the models directory a planned run writes and removes: written, those
/// whose bytes then differ from the device's now, or that it wrote and removed again (a new
/// journal); removed, those there now and gone after it. In the order the trust, catalog,
/// journal and choice files are stored, then the caches.
fn files(device: &Device, plan: &Device) -> Result<(Vec<String>, Vec<String>)> {
    const ORDER: [&str; 7] = [
        trust_state::ACCEPTED_RELEASE_FILE,
        trust_state::REFUSED_MANIFEST_FILE,
        CATALOG_FILE,
        CATALOG_SIGNATURE_FILE,
        REFUSED_FILE,
        JOURNAL_FILE,
        choice::CHOICE_FILE,
    ];
    let mut names: Vec<(String, bool)> = Vec::new();
    for e in plan.effects().effects() {
        let (name, written) = match e {
            Effect::WriteFile { name, .. } => (name, true),
            Effect::RemoveFile { name } => (name, false),
            _ => continue,
        };
        match names.iter_mut().find(|(n, _)| *n == name) {
            Some((_, w)) => *w |= written,
            None => names.push((name, written)),
        }
    }
    let (mut would_write, mut would_remove) = (Vec::new(), Vec::new());
    let dir = device.models_dir();
    for (name, written) in names {
        let read = |d: &Device| d.effects().read(&dir.join(&name), CATALOG_LIMIT).ok();
        let (now, after) = (read(device), read(plan));
        if written && (now != after || after == Some(None)) {
            would_write.push(name.clone());
        }
        if matches!(now, Some(Some(_))) && after == Some(None) {
            would_remove.push(name);
        }
    }
    let rank = |n: &String| ORDER.iter().position(|o| o == n).unwrap_or(ORDER.len());
    would_write.sort_by_key(rank);
    Ok((would_write, would_remove))
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

/// What `download` would do; serialized as `download --dry-run --json` prints it (after
/// `"dry_run": true`).
#[derive(Debug, Clone, Serialize)]
pub struct DownloadPlanReport {
    pub models: Vec<ModelDownload>,
    /// Bytes the downloads would fetch.
    #[serde(rename = "download_bytes")]
    pub needed: u64,
    /// Bytes free in the models directory now.
    #[serde(rename = "free_bytes")]
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
            action: Action::Nothing { reason: why },
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
                name: local.to_string(),
                origin: plan.origin,
                size: plan.size,
                sha256: plan.sha256,
                digest_source: plan.digest_source,
                pieces: plan.pieces.len(),
                would_install,
                would_remove,
            });
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
        models,
        needed,
        free,
    })
}

fn free_bytes(device: &Device) -> u64 {
    downloader::space::available_bytes(&device.models_dir()).unwrap_or(0)
}
