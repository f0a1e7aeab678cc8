//! `refresh --dry-run` and `download --dry-run`: every read and check the real command makes
//! that changes nothing (the onroad refusal, the manifest fetch with its signature check, the
//! catalog and the installed models read, the space check, the GPU rule), then what the real
//! run would write, remove and download. Nothing is written: no lock file, no param, no cache,
//! no trust record, not the verification cache either (installed models are re-hashed here
//! instead of going through `Device::verify_entry`, which records what it hashed). `verify
//! --dry-run` is the same re-hash.
//!
//! Built from `migration`'s and `downloader`'s public, read-only functions, in the order
//! `migration::refresh` / `migration::download_model` call them.
// Issue 15: this mirrors `migration::refresh_at`'s decisions; it belongs next to it in
// `migration` (as a plan the real run also executes) once that crate is free to change.

use std::collections::BTreeMap;

use downloader::{CancelToken, Downloader, Target};
use manifest::{Manifest, ModelEntry, ModelId};
use migration::contract::{self, ModelKind, ProfilesRead, SelectionParams, Start};
use migration::params::keys;
use migration::{Device, VerifyState, choice, plan, trust_state};
use serde_json::{Value, json};

/// What `refresh` would do.
pub struct RefreshPreview {
    pub generation: String,
    pub manifest_origin: String,
    pub manifest_url: String,
    pub models: usize,
    pub refused_entries: Vec<migration::RefusedModel>,
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

/// The state of `entry`'s installed artifact, read-only: re-hashed as `Device::verify_entry`
/// hashes it (against the catalog's digest, or the install's sidecar digest), without
/// recording the result in `.verified.json`. That file is only read, to tell a verified copy
/// of an earlier publish (`outdated`) from corrupt bytes.
pub fn installed_state(device: &Device, entry: &ModelEntry) -> VerifyState {
    let path = device.artifact_path(entry.id());
    match chunker::resolve(&path) {
        Ok(Some(_)) => {}
        Ok(None) => return VerifyState::Missing,
        Err(_) => return VerifyState::Corrupt,
    }
    let Some(expected) = device.expected_digest(entry) else {
        return VerifyState::Unverified;
    };
    let any = chunker::Expected {
        sha256: None,
        size: None,
        chunk_count: None,
        chunk_sha256: None,
    };
    let Ok(report) = chunker::verify(&path, &any) else {
        return VerifyState::Corrupt;
    };
    if report.sha256 == expected.sha256 && expected.size.is_none_or(|s| s == report.size) {
        return VerifyState::Verified;
    }
    // `.verified.json` (docs/device.md): `{"<file name>": {"sha256", "size", "catalog_verified",
    // …}}`; the same bytes verified against an earlier catalog are that verified copy.
    let name = manifest::layout::artifact_file_name(entry.id());
    let cache: Value = std::fs::read(device.models_dir().join(migration::VERIFIED_FILE))
        .ok()
        .filter(|b| b.len() as u64 <= migration::bounded::VERIFIED_LIMIT)
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let c = &cache[name.as_str()];
    if c["catalog_verified"] == true
        && c["sha256"] == report.sha256.to_hex().as_str()
        && c["size"] == report.size
    {
        VerifyState::Outdated
    } else {
        VerifyState::Corrupt
    }
}

/// Whether the file `name` of the models directory would get other bytes than `body`.
fn differs(device: &Device, name: &str, body: &[u8]) -> bool {
    std::fs::read(device.models_dir().join(name)).map_or(true, |old| old != body)
}

fn wanted_of(slots: &choice::Slots, catalog: &contract::Catalog) -> contract::Wanted {
    let sel = SelectionParams {
        model: slots.selection.clone(),
        driving_model: slots.selection.clone(),
        ..SelectionParams::default()
    };
    let profiles = ProfilesRead {
        small: slots.small.clone(),
        big: slots.big.clone(),
    };
    contract::wanted(&sel, &profiles, catalog)
}

/// `refresh --dry-run`: the manifest fetched and checked as `refresh` fetches it, then what the
/// run would write. Errors are the ones the real run gives for the same checks.
pub fn refresh(
    device: &Device,
    dl: &Downloader,
    now_unix: u64,
) -> Result<RefreshPreview, migration::Error> {
    device.ensure_offroad("refresh")?;
    let generation = device.config.generation;
    // As `trust_state::fetch_accepted`, without recording the accepted release or a refusal.
    let floor = match dl.trusted_keys() {
        Some(_) => trust_state::accepted_release(device, generation)?.map(|a| a.release),
        None => None,
    };
    let fetched = dl.fetch_manifest_accepting(generation, floor, &CancelToken::new())?;
    let mut would_write = Vec::new();
    if let Some(signed) = &fetched.signed
        && floor != Some(signed.release)
    {
        would_write.push(trust_state::ACCEPTED_RELEASE_FILE.to_string());
    }
    let mut would_remove = Vec::new();
    if !fetched.refused.is_empty() {
        would_write.push(trust_state::REFUSED_MANIFEST_FILE.to_string());
    } else if std::fs::exists(device.models_dir().join(trust_state::REFUSED_MANIFEST_FILE))
        .unwrap_or(false)
    {
        would_remove.push(trust_state::REFUSED_MANIFEST_FILE.to_string());
    }

    // The catalog as `Device::store_catalog_bytes` / `store_catalog` would store it.
    let mut manifest: Manifest = fetched.manifest.clone();
    let raw_as_is = fetched.refused_entries.is_empty()
        && fetched.normalised.is_empty()
        && manifest.generation() == Some(generation)
        && fetched.raw.len() as u64 <= migration::bounded::CATALOG_LIMIT;
    let catalog_bytes = if raw_as_is {
        fetched.raw.clone()
    } else {
        manifest.set_generation(generation);
        manifest.to_canonical_string().into_bytes()
    };
    if differs(device, migration::CATALOG_FILE, &catalog_bytes) {
        would_write.push(migration::CATALOG_FILE.to_string());
    }
    let refused: Vec<migration::RefusedModel> =
        fetched.refused_entries.iter().map(Into::into).collect();
    let refused_bytes = serde_json::to_vec_pretty(&refused).expect("serializable");
    if differs(device, migration::REFUSED_FILE, &refused_bytes) {
        would_write.push(migration::REFUSED_FILE.to_string());
    }
    let catalog = device.device_catalog(&manifest)?;

    // Where a migration stands (`contract::start`, as `begin_migration` decides).
    let journal = migration::read_journal(device)?;
    let previous = device.params.get_str(keys::MODEL_MANIFEST_VERSION)?;
    let start = contract::start(
        journal.as_ref().map(|j| j.to.to_string()).as_deref(),
        previous.as_deref(),
        &generation.to_string(),
    );
    let record = device.choice()?;
    let (selection, _) = contract::selected(&device.selection_params()?);
    let profiles = device.profiles_read()?;
    let slots_now = choice::Slots {
        selection: Some(selection),
        small: profiles.small.map(|s| s.to_ascii_lowercase()),
        big: profiles.big.map(|b| b.to_ascii_lowercase()),
    };
    let remembered = choice::remember(record.as_ref(), &slots_now);
    let journal_slots = |j: &migration::Journal| {
        j.raw.clone().unwrap_or_else(|| choice::Slots {
            selection: Some(j.selected.to_string()),
            small: j.small.as_ref().map(ModelId::to_string),
            big: j.big.clone(),
        })
    };
    let (migrate_from, purging, raw) = match (&start, &journal) {
        (Start::SameGeneration, _) => (None, false, remembered),
        (Start::Migrate { from }, _) => (Some(from.clone()), true, remembered),
        (Start::Resume, Some(j)) => (
            Some(j.from.clone()),
            j.phase == migration::Phase::Purge,
            journal_slots(j),
        ),
        (Start::Retarget, Some(j)) => (Some(j.from.clone()), true, journal_slots(j)),
        (Start::Resume | Start::Retarget, None) => (None, false, remembered),
    };
    let would_purge = if purging {
        plan::purge_plan(device.model_file_names()?.iter().map(String::as_str))
    } else {
        Vec::new()
    };
    if migrate_from.is_some() {
        // Written before the purge, removed once the migration is done.
        would_write.push(migration::JOURNAL_FILE.to_string());
    }
    let wanted = wanted_of(&raw, &catalog);

    let mut would_download = Vec::new();
    let mut would_keep = Vec::new();
    let mut not_due = Vec::new();
    for id in wanted.to_install() {
        let Some(entry) = manifest.get(&id) else {
            continue;
        };
        let state = if would_purge.iter().any(|n| n.starts_with(&format!("{id}_"))) {
            VerifyState::Missing
        } else {
            installed_state(device, entry)
        };
        if state == VerifyState::Verified {
            would_keep.push(id);
            continue;
        }
        let retry = record.as_ref().and_then(|r| r.retry.get(id.as_str()));
        if !choice::due(retry, now_unix) {
            not_due.push(id);
            continue;
        }
        would_download.push((id, state));
    }
    // Assuming every download succeeds: what `contract::decide` then writes.
    let available = |id: &ModelId| match contract::kind(id) {
        ModelKind::BuiltIn => true,
        ModelKind::Catalog => {
            would_keep.contains(id) || would_download.iter().any(|(d, _)| d == id)
        }
        ModelKind::Local => device.local_present(id),
    };
    let outcome = contract::decide(&wanted, &catalog, &available);
    // The remembered choice, as the real run records it after these fates.
    let mut fates = BTreeMap::new();
    for id in wanted.all() {
        let failure = not_due.contains(&id).then(|| {
            let retry = record.as_ref().and_then(|r| r.retry.get(id.as_str()));
            (false, retry.map(|r| r.reason.clone()).unwrap_or_default())
        });
        let fate = choice::fate(&id, &catalog, available(&id), false, failure);
        fates.insert(id, fate);
    }
    let written = choice::written_slots(&outcome);
    let next = choice::after_refresh(record.as_ref(), &raw, &wanted, &fates, &written, now_unix);
    let next_bytes = serde_json::to_vec_pretty(&next).expect("serializable");
    if differs(device, choice::CHOICE_FILE, &next_bytes) {
        would_write.push(choice::CHOICE_FILE.to_string());
    }

    let mut params: BTreeMap<String, Option<String>> = BTreeMap::new();
    for (key, value) in contract::selection_writes(&outcome) {
        params.insert(key.to_string(), value);
    }
    for (key, value) in catalog.params() {
        params.insert(key.to_string(), Some(value));
    }
    if migrate_from.is_some() {
        params.insert(
            keys::MODEL_MANIFEST_VERSION.to_string(),
            Some(generation.to_string()),
        );
    }
    let mut would_set_params = Vec::new();
    for (key, value) in params {
        let now = device.params.get(&key)?;
        if now != value {
            would_set_params.push((key, value));
        }
    }
    for (name, body) in catalog.caches() {
        if differs(device, name, &contract::cache_bytes(&body)) {
            would_write.push(name.to_string());
        }
    }
    Ok(RefreshPreview {
        generation: generation.to_string(),
        manifest_origin: fetched.origin,
        manifest_url: fetched.url,
        models: manifest.models().len(),
        refused_entries: refused,
        migrate_from,
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

impl RefreshPreview {
    pub fn to_json(&self) -> Value {
        json!({
            "dry_run": true,
            "generation": self.generation,
            "manifest_origin": self.manifest_origin,
            "manifest_url": self.manifest_url,
            "models": self.models,
            "refused_entries": self.refused_entries,
            "migrating": self.migrate_from.is_some(),
            "migrated_from": self.migrate_from.clone().flatten(),
            "would_purge": self.would_purge,
            "would_download": self.would_download.iter()
                .map(|(id, state)| json!({"id": id.as_str(), "installed": state_name(*state)}))
                .collect::<Vec<_>>(),
            "would_keep": self.would_keep.iter().map(ModelId::as_str).collect::<Vec<_>>(),
            "not_due": self.not_due.iter().map(ModelId::as_str).collect::<Vec<_>>(),
            "selected": self.selected.as_str(),
            "fell_back_to_builtin": self.fell_back_to_builtin,
            "would_write": self.would_write,
            "would_remove": self.would_remove,
            "would_set_params": self.would_set_params.iter()
                .map(|(k, v)| json!({"key": k, "value": v}))
                .collect::<Vec<_>>(),
        })
    }

    /// The human form: one `would …` line per effect.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "{} manifest from {}: {} models",
            self.generation, self.manifest_origin, self.models
        )];
        if let Some(from) = &self.migrate_from {
            out.push(format!(
                "would migrate from {} to {}",
                from.as_deref().unwrap_or("unknown"),
                self.generation
            ));
        }
        out.extend(self.would_purge.iter().map(|n| format!("would purge {n}")));
        out.extend(
            self.would_download.iter().map(|(id, state)| {
                format!("would download {id} (installed: {})", state_name(*state))
            }),
        );
        out.extend(
            self.would_keep
                .iter()
                .map(|id| format!("would keep {id} (verified)")),
        );
        out.extend(
            self.not_due
                .iter()
                .map(|id| format!("would not retry {id} yet (its retry is not due)")),
        );
        out.extend(self.would_write.iter().map(|n| format!("would write {n}")));
        out.extend(
            self.would_remove
                .iter()
                .map(|n| format!("would remove {n}")),
        );
        out.extend(self.would_set_params.iter().map(|(k, v)| match v {
            Some(v) => format!("would set param {k} = {v}"),
            None => format!("would remove param {k}"),
        }));
        out.push(format!(
            "would select {}{}",
            self.selected,
            if self.fell_back_to_builtin {
                " (falling back to the built-in model)"
            } else {
                ""
            }
        ));
        out
    }
}

pub fn state_name(s: VerifyState) -> &'static str {
    match s {
        VerifyState::Verified => "verified",
        VerifyState::Outdated => "outdated",
        VerifyState::Unverified => "unverified",
        VerifyState::Corrupt => "corrupt",
        VerifyState::Missing => "missing",
    }
}

/// One model of `download --dry-run`.
pub struct DownloadPreview {
    pub id: ModelId,
    pub action: Action,
}

pub enum Action {
    /// Built-in or local: nothing to download.
    Nothing(&'static str),
    /// A verified copy is installed.
    Installed,
    /// Would be downloaded: each artifact (the model's, and its Chestnut build with a ready
    /// external GPU) with what the first answering origin publishes.
    Download(Vec<Planned>),
}

pub struct Planned {
    pub local_name: String,
    pub plan: downloader::DownloadPlan,
    /// Files of the models directory the install would remove (its other forms).
    pub would_remove: Vec<String>,
    /// Files it would write: the artifact, and the origin's digest beside it when the entry
    /// declares none.
    pub would_install: Vec<String>,
}

/// `download --dry-run` of `ids` (already canonical, `None` = `--all`): what each would fetch,
/// checked as the real run checks it (catalog, GPU rule, free space), without a payload byte.
pub fn download(
    device: &Device,
    dl: &Downloader,
    ids: Option<&ModelId>,
    space_margin: u64,
) -> Result<(Vec<DownloadPreview>, u64, u64), migration::Error> {
    device.ensure_offroad("download")?;
    let cancel = CancelToken::new();
    let mut out = Vec::new();
    let entries: Vec<&ModelEntry>;
    let catalog;
    match ids {
        None => {
            catalog = device.require_catalog()?;
            entries = migration::downloadable(&catalog, device.chestnut());
        }
        Some(id) => {
            let canonical: ModelId = contract::canonical_id(id.as_str())
                .parse()
                .unwrap_or_else(|_| id.clone());
            if migration::is_builtin_id(canonical.as_str()) {
                out.push(DownloadPreview {
                    id: canonical,
                    action: Action::Nothing("built-in"),
                });
                return Ok((out, 0, free_bytes(device)));
            }
            if canonical.is_local() {
                out.push(DownloadPreview {
                    id: canonical,
                    action: Action::Nothing("local"),
                });
                return Ok((out, 0, free_bytes(device)));
            }
            catalog = device.require_catalog()?;
            let entry = catalog
                .get(&canonical)
                .ok_or_else(|| migration::Error::UnknownModel {
                    id: canonical.to_string(),
                    generation: device.config.generation.to_string(),
                })?;
            // Read, never used up (the real run removes the one-request override).
            let allow = device.memory.get_bool(keys::ALLOW_GPU_WITHOUT_GPU)?;
            if downloader::egpu::single_download(
                entry.uses_external_gpu(),
                device.chestnut(),
                allow,
            )
            .is_err()
            {
                return Err(migration::Error::ExternalGpuRequired {
                    id: canonical.to_string(),
                });
            }
            entries = vec![entry];
        }
    }
    let names = device.model_file_names()?;
    let available = free_bytes(device);
    let mut needed = 0u64;
    for entry in entries {
        let id = entry.id().clone();
        let targets: Vec<Target> = downloader::egpu::artifacts_to_fetch(entry, device.chestnut())?;
        let main_verified = installed_state(device, entry) == VerifyState::Verified;
        let mut planned = Vec::new();
        for (i, target) in targets.iter().enumerate() {
            if i == 0 && main_verified {
                continue;
            }
            if i > 0 && variant_in_place(device, target) {
                continue;
            }
            let plan = dl.plan_target(device.config.generation, target, &cancel)?;
            // The real run checks each download's size plus the margin against what is free
            // then: earlier downloads of this run have used their share.
            needed = needed.saturating_add(plan.size);
            if available < needed.saturating_add(space_margin) {
                return Err(downloader::Error::InsufficientSpace {
                    path: device.models_dir(),
                    needed: plan.size.saturating_add(space_margin),
                    available: available.saturating_sub(needed - plan.size),
                }
                .into());
            }
            let local = target.local_name.as_str();
            let mut would_install = vec![local.to_string()];
            if plan.digest_source == downloader::DigestSource::Sidecar {
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
        let action = if planned.is_empty() {
            Action::Installed
        } else {
            Action::Download(planned)
        };
        out.push(DownloadPreview { id, action });
    }
    Ok((out, needed, available))
}

/// As `install_variant` decides: the Chestnut build is there and matches its digest.
fn variant_in_place(device: &Device, target: &Target) -> bool {
    let path = device.models_dir().join(target.local_name.as_str());
    target.sha256.is_some_and(|want| {
        chunker::Sha256Digest::of_file(&path)
            .is_ok_and(|(got, size)| got == want && target.size.is_none_or(|s| s == size))
    })
}

fn free_bytes(device: &Device) -> u64 {
    downloader::space::available_bytes(&device.models_dir()).unwrap_or(0)
}

pub fn download_json(models: &[DownloadPreview], needed: u64, free: u64) -> Value {
    let models: Vec<Value> = models
        .iter()
        .map(|m| match &m.action {
            Action::Nothing(why) => json!({"id": m.id.as_str(), "action": "none", "reason": why}),
            Action::Installed => json!({"id": m.id.as_str(), "action": "installed"}),
            Action::Download(planned) => json!({
                "id": m.id.as_str(),
                "action": "download",
                "artifacts": planned.iter().map(|p| json!({
                    "name": p.local_name,
                    "origin": p.plan.origin,
                    "size": p.plan.size,
                    "sha256": p.plan.sha256.to_hex(),
                    "digest_source": p.plan.digest_source.as_str(),
                    "pieces": p.plan.pieces.len(),
                    "would_install": p.would_install,
                    "would_remove": p.would_remove,
                })).collect::<Vec<_>>(),
            }),
        })
        .collect();
    json!({"dry_run": true, "models": models, "download_bytes": needed, "free_bytes": free})
}

pub fn download_lines(models: &[DownloadPreview], needed: u64, free: u64) -> Vec<String> {
    let mut out = Vec::new();
    for m in models {
        match &m.action {
            Action::Nothing(why) => out.push(format!("{}: {why}, nothing to download", m.id)),
            Action::Installed => out.push(format!("{}: verified copy installed, kept", m.id)),
            Action::Download(planned) => {
                for p in planned {
                    out.push(format!(
                        "would download {} ({} bytes in {} file(s) from {}, digest from the {})",
                        p.local_name,
                        p.plan.size,
                        p.plan.pieces.len(),
                        p.plan.origin,
                        p.plan.digest_source
                    ));
                    out.extend(p.would_install.iter().map(|n| format!("would install {n}")));
                    out.extend(p.would_remove.iter().map(|n| format!("would remove {n}")));
                }
            }
        }
    }
    out.push(format!("would download {needed} bytes; {free} bytes free"));
    out
}

/// `verify --dry-run`: `migration::report::verify`'s walk over the catalog, each installed model
/// re-hashed by [`installed_state`], so `.verified.json` is not rewritten.
pub fn verify(
    device: &Device,
    only: Option<&str>,
    on_hash: &dyn Fn(&ModelId),
) -> Result<migration::report::VerifyReport, migration::Error> {
    use migration::report::{InstalledModel, VerifyReport};
    let catalog = device.require_catalog()?;
    if let Some(want) = only
        && contract::canonical_id(want) == manifest::layout::BUILTIN_MODEL_ID
    {
        return Ok(VerifyReport {
            models: vec![InstalledModel {
                id: contract::builtin_id().to_string(),
                state: VerifyState::Verified,
                digest_source: None,
            }],
        });
    }
    let mut models = Vec::new();
    for e in catalog.models() {
        if only.is_some_and(|want| e.id().as_str() != want)
            || contract::kind(e.id()) == ModelKind::BuiltIn
        {
            continue;
        }
        if matches!(chunker::resolve(&device.artifact_path(e.id())), Ok(Some(_))) {
            on_hash(e.id());
        }
        let state = installed_state(device, e);
        if state == VerifyState::Missing && only.is_none() {
            continue;
        }
        models.push(InstalledModel {
            id: e.id().to_string(),
            state,
            digest_source: device.expected_digest(e).map(|d| d.source.as_str()),
        });
    }
    if let Some(want) = only
        && models.is_empty()
    {
        return Err(migration::Error::UnknownModel {
            id: want.to_string(),
            generation: device.config.generation.to_string(),
        });
    }
    Ok(VerifyReport { models })
}
