//! What `status`, `verify` and `resolve` report, as typed values (the binary only renders them).
//! Names and versions come from the catalog, never from params, so a report cannot repeat a
//! stale param.
//!
//! The folder, read in this order: these typed reports, then [`progress`] (every text the UI
//! reads in `ModelDownloadProgress`), then [`render`] (each command's report as the binary
//! prints it).

pub mod progress;
pub mod render;

use serde::Serialize;

use manifest::{ModelId, NamedModel};

use crate::error::{Error, Result};
use crate::rules::contract::{self, ModelKind};
use crate::run::manager::entry_targets;
use crate::state::device::{Device, VerifyState};
use crate::state::journal::Journal;
use crate::state::view::DeviceView;

/// `resolve`: the path modeld should load and what it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResolveReport {
    pub path: std::path::PathBuf,
    /// `id`, `name`, `version` (from the catalog).
    #[serde(flatten)]
    pub model: NamedModel<String>,
    pub builtin: bool,
    /// Why the built-in was answered although something else may be selected: a param or state
    /// file could not be read (`resolve` answers the built-in when in doubt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub doubt: Option<String>,
}

/// A chosen model that cannot be had right now, as `status` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingModel {
    pub id: String,
    /// `temporary`: the built-in stands in; `update`: a verified older copy stands in.
    pub case: PendingCase,
    pub failures: u32,
    /// Unix seconds of the next attempt.
    pub next_retry: u64,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PendingCase {
    Temporary,
    Update,
}

/// The fallback state: what the user chose, what is retried, what was dropped for good.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FallbackReport {
    pub chosen: crate::rules::choice::Slots,
    pub pending: Vec<PendingModel>,
    pub dropped: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstalledModel {
    pub id: String,
    pub state: VerifyState,
    /// Where the digest it is checked against comes from: `"manifest"` (`artifact_sha256`),
    /// `"sidecar"` (the origin's `.sha256`, for an entry without one), or `null` (none known).
    pub digest_source: Option<&'static str>,
}

/// `status`, with the trust state and the openpilot tree (`status --json` is this report).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusReport {
    pub generation: String,
    pub manifest_version: Option<String>,
    /// `id` as the params hold it; `name` and `version` from the catalog (empty for an id that
    /// is not a valid one).
    pub selected: NamedModel<String>,
    pub resolved: std::path::PathBuf,
    pub catalog_models: Option<usize>,
    pub installed: Vec<InstalledModel>,
    pub free_bytes: Option<u64>,
    pub interrupted_migration: Option<Journal>,
    /// Downloads left unfinished in the staging directory (a refresh or `download` resumes
    /// them from what they recorded).
    pub interrupted_downloads: Vec<InterruptedDownload>,
    /// From `.choice.json`; `None` before the first refresh of this build.
    pub fallback: Option<FallbackReport>,
    /// Entries of the last accepted manifest this device left out, each with its reason.
    pub refused_entries: Vec<crate::state::device::RefusedModel>,
    /// With trusted keys: why the stored catalog is not used (it does not verify against the
    /// signature kept beside it); `resolve` answers the built-in meanwhile.
    pub catalog_problem: Option<String>,
    /// With trusted keys: the catalog's artifacts (and Chestnut variants) that are listed but
    /// not installable, because the signed manifest does not pin their bytes.
    pub not_installable: Vec<NotInstallable>,
    /// Chosen GPU-only models not installed because no Chestnut is ready (the big profile
    /// keeps naming its model; a refresh with a ready Chestnut downloads it).
    pub waiting_for_chestnut: Vec<WaitingForChestnut>,
    /// Parts of the device's state that could not be read (`what: why`, see
    /// [`DeviceView::problems`]): reported, read as absent; absent from `--json` when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
    /// What modeld runs, from its load receipt; absent on a contract without one (v25).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running: Option<crate::state::load_receipt::RunningReport>,
    /// Artifacts modeld could not start, not downloaded again while the catalog lists them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bad_artifacts: Vec<crate::state::load_receipt::BadArtifactReport>,
    /// Bytes fetched of each artifact today (UTC) against the daemon's daily budget
    /// ([`crate::rules::budget`]), exact.
    pub fetched_today: crate::rules::budget::TodayReport,
    pub trust: render::TrustReport,
    pub tree: crate::state::tree::TreeStatus,
    /// Another manager holding the lock now (the daemon, or a `refresh` or `download`
    /// elsewhere): its staged downloads are under way, not interrupted. Only in `--json` when
    /// there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub another_manager: Option<render::AnotherManager>,
}

/// A chosen GPU-only model that is not installed because no Chestnut is ready, as `status`
/// reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WaitingForChestnut {
    pub id: String,
    /// Which choice names it: `selection` or `big_profile`.
    pub slot: &'static str,
    pub reason: String,
}

/// The chosen models (`(slot, id)`, as the user chose them) that are GPU-only catalog models,
/// not installed (`installed` says), while `chestnut` is not ready; each once, in slot order.
/// Pure.
pub fn waiting_for_chestnut(
    chosen: &[(&'static str, Option<&str>)],
    catalog: &manifest::Manifest,
    chestnut: downloader::egpu::Chestnut,
    installed: &dyn Fn(&manifest::ModelEntry) -> bool,
) -> Vec<WaitingForChestnut> {
    let mut out: Vec<WaitingForChestnut> = Vec::new();
    for (slot, id) in chosen {
        let Some(id) = id.and_then(|i| i.to_ascii_lowercase().parse::<ModelId>().ok()) else {
            continue;
        };
        let Some(e) = catalog.get(&id) else { continue };
        if downloader::egpu::unrequested_download(e.uses_external_gpu(), chestnut)
            || installed(e)
            || out.iter().any(|w| w.id == id.as_str())
        {
            continue;
        }
        out.push(WaitingForChestnut {
            id: id.to_string(),
            slot,
            reason: format!(
                "not installed: {id} needs the external GPU (Chestnut) and none is ready; the \
                 first refresh with a ready Chestnut downloads it"
            ),
        });
    }
    out
}

/// A download left unfinished (`status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InterruptedDownload {
    /// The catalog model whose artifact (or Chestnut build) it is; `None` when the catalog
    /// lists no such file (it is removed when it goes stale).
    pub id: Option<String>,
    pub file: String,
    pub done_bytes: u64,
    pub size: u64,
    /// Whether it is for the bytes the catalog lists now (else a resume starts over).
    pub current: bool,
}

/// The staged downloads `staged` matched to the catalog's artifacts as a device of `contract`
/// fetches them. Pure.
pub fn interrupted_downloads(
    staged: &[downloader::interrupted::StagedDownload],
    catalog: Option<&manifest::Manifest>,
    contract: &'static manifest::Contract,
) -> Vec<InterruptedDownload> {
    let targets: Vec<downloader::Target> = (catalog.iter())
        .flat_map(|c| c.models().iter().flat_map(|e| entry_targets(e, contract)))
        .collect();
    staged
        .iter()
        .map(|s| {
            let target = targets.iter().find(|t| t.local_name.as_str() == s.file);
            InterruptedDownload {
                id: target.map(|t| t.id.to_string()),
                file: s.file.clone(),
                done_bytes: s.done_bytes,
                size: s.size,
                current: target
                    .and_then(|t| t.sha256)
                    .is_some_and(|d| d.to_hex().starts_with(&s.sha256_prefix)),
            }
        })
        .collect()
}

/// A catalog artifact a device with trusted keys does not install.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotInstallable {
    pub id: String,
    /// The local file it would be (`<id>_driving_tinygrad.pkl`, or the Chestnut variant's).
    pub file: String,
    pub reason: String,
}

/// The catalog's artifacts and accelerator variants (as a device of `contract` fetches them)
/// that `protected` rules out, in catalog order. Pure.
pub fn not_installable(
    catalog: &manifest::Manifest,
    protected: bool,
    contract: &'static manifest::Contract,
) -> Vec<NotInstallable> {
    let mut out = Vec::new();
    for e in catalog.models() {
        if contract::kind(e.id()) == ModelKind::BuiltIn {
            continue;
        }
        for t in entry_targets(e, contract) {
            if let Err(missing) = downloader::trust::target_rule(protected, &t) {
                out.push(NotInstallable {
                    id: e.id().to_string(),
                    file: t.local_name.to_string(),
                    reason: downloader::trust::not_installable_text(
                        t.local_name.as_str(),
                        &missing,
                    ),
                });
            }
        }
    }
    out
}

/// `verify` (`verify --dry-run` adds `"dry_run": true` to its `--json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    pub models: Vec<InstalledModel>,
}

impl VerifyReport {
    /// Every reported model verified (the built-in, which has no catalog digest, counts as
    /// verified: it ships with the checkout).
    pub fn all_verified(&self) -> bool {
        self.models.iter().all(|m| m.state == VerifyState::Verified)
    }
}

fn model_ref(device: &Device, id: &str) -> Result<NamedModel<String>> {
    // A per-generation layout names its models from its own accepted catalog.
    let files = device.files();
    // With trusted keys a stored catalog that does not verify names nothing (it is reported).
    let catalog = match files.generation_files() {
        Some(_) => files.accepted_catalog(),
        None => match device.catalog() {
            Err(Error::CatalogNotTrusted { .. }) => None,
            read => read?,
        },
    };
    model_ref_in(device, catalog.as_ref(), id)
}

/// [`model_ref`] with `catalog` already read.
fn model_ref_in(
    device: &Device,
    catalog: Option<&manifest::Manifest>,
    id: &str,
) -> Result<NamedModel<String>> {
    let named = match (catalog, id.parse::<ModelId>()) {
        (Some(m), Ok(id)) => device.device_catalog(m)?.named(&id),
        (None, Ok(id)) => contract::Catalog::default().named(&id),
        (_, Err(_)) => {
            return Ok(NamedModel {
                id: id.to_string(),
                name: String::new(),
                version: String::new(),
            });
        }
    };
    Ok(named.into_text())
}

impl InstalledModel {
    /// Catalog model `e` in `state` on `device`.
    fn of(device: &Device, e: &manifest::ModelEntry, state: VerifyState) -> Self {
        let digest_source = device.expected_digest(e).map(|d| d.source.as_str());
        let id = e.id().to_string();
        InstalledModel {
            id,
            state,
            digest_source,
        }
    }
}

/// What modeld should load. Always an answer: anything that cannot be read (an oversized or
/// unreadable param, a corrupt state file) makes it the built-in, with the reason in `doubt`.
/// The only error is a missing built-in ([`Error::BuiltinMissing`]).
pub fn resolve(device: &Device) -> Result<ResolveReport> {
    let builtin = || contract::Catalog::default().builtin().into_text();
    // modeld gets the built-in whenever anything it would decide from could not be read: a
    // param or record the other commands read as absent (with a warning) is a doubt here.
    device.warnings().take();
    let resolved = device.resolve();
    let unread = device.warnings().take();
    let (path, sel, doubt) = match resolved {
        Ok(_) if !unread.is_empty() => (
            device.builtin_path(),
            NamedModel::builtin(),
            Some(unread.join("; ")),
        ),
        Ok((path, sel)) => (path, sel, None),
        Err(e) => (
            device.builtin_path(),
            NamedModel::builtin(),
            Some(crate::rules::next_step::with_next(&e)),
        ),
    };
    let is_builtin = contract::is_builtin_id(sel.id.as_str());
    // The built-in chunk set is the one thing `resolve` cannot do without.
    if is_builtin && !matches!(chunker::resolve(&device.builtin_path()), Ok(Some(_))) {
        return Err(Error::BuiltinMissing {
            path: device.builtin_path(),
        });
    }
    let model = match model_ref(device, sel.id.as_str()) {
        Ok(r) => r,
        Err(_) if is_builtin => builtin(),
        Err(_) => sel.into_text(),
    };
    Ok(ResolveReport {
        path,
        builtin: is_builtin,
        model,
        doubt,
    })
}

fn fallback(
    device: &Device,
    choice: Option<&crate::rules::choice::Choice>,
    catalog: Option<&manifest::Manifest>,
) -> Result<Option<FallbackReport>> {
    let Some(c) = choice.cloned() else {
        return Ok(None);
    };
    let mut pending = Vec::new();
    for (id, r) in &c.retry {
        let case = match (catalog, id.parse::<ModelId>()) {
            (Some(m), Ok(mid)) => match m.get(&mid) {
                Some(e) if device.verify_entry(e, false)? == VerifyState::Outdated => {
                    PendingCase::Update
                }
                _ => PendingCase::Temporary,
            },
            _ => PendingCase::Temporary,
        };
        pending.push(PendingModel {
            id: id.clone(),
            case,
            failures: r.failures,
            next_retry: r.next_unix,
            reason: r.reason.clone(),
        });
    }
    Ok(Some(FallbackReport {
        chosen: c.wanted,
        pending,
        dropped: c.dropped.into_iter().collect(),
    }))
}

/// `status` of the device beside its openpilot `tree`, from the device's state read once
/// ([`DeviceView`]): a part that cannot be read is reported (`unreadable`; a catalog the trusted
/// keys refuse in `catalog_problem`), except the catalog itself.
pub fn status(device: &Device, tree: crate::state::tree::TreeStatus) -> Result<StatusReport> {
    let mut view = DeviceView::read(device);
    // A per-generation layout answers from its own files, as upstream reads them: the
    // selection from `preferences.json`, what is installed against `<gen>/catalog.json`.
    let per_generation = device.files().generation_files().is_some();
    let selected = match per_generation {
        true => device.layout_selection()?,
        false => view.selected(),
    };
    // A stored catalog that cannot be read is the error, named, as for every command that needs
    // it (a refresh stores it again); one the trusted keys refuse is reported.
    if (view.catalog.error()).is_some_and(|e| !matches!(e, Error::CatalogNotTrusted { .. })) {
        view.take_catalog()?;
    }
    let layout_catalog = per_generation
        .then(|| device.files().accepted_catalog())
        .flatten();
    let catalog = match per_generation {
        true => layout_catalog.as_ref(),
        false => view.catalog(),
    };
    let installed = match catalog {
        Some(c) => installed_models(device, c)?,
        None => Vec::new(),
    };
    let waiting = match catalog {
        Some(c) => chosen_waiting_for_chestnut(device, &view, &selected, c),
        None => Vec::new(),
    };
    // As `resolve` answers: the built-in when the answer cannot be had.
    let resolved = device
        .resolve()
        .map_or_else(|_| device.builtin_path(), |(path, _)| path);
    Ok(StatusReport {
        generation: device.config.generation.to_string(),
        manifest_version: view.previous().map(str::to_string),
        selected: model_ref_in(device, catalog, &selected)?,
        resolved,
        catalog_models: catalog.map(|c| c.models().len()),
        installed,
        free_bytes: downloader::space::available_bytes(&device.models_dir()).ok(),
        fallback: fallback(device, view.choice(), catalog)?,
        interrupted_migration: view.journal().cloned(),
        interrupted_downloads: interrupted_downloads(
            &staged_downloads(device),
            catalog,
            device.contract(),
        ),
        refused_entries: device.refused(),
        not_installable: catalog
            .map(|c| not_installable(c, device.is_protected(), device.contract()))
            .unwrap_or_default(),
        catalog_problem: view.catalog.problem(),
        waiting_for_chestnut: waiting,
        unreadable: view.problems(),
        running: crate::state::load_receipt::running_report(device),
        bad_artifacts: crate::state::load_receipt::bad_report(device, catalog),
        fetched_today: {
            let today = crate::rules::budget::today();
            let read = crate::rules::budget::read(&device.models_dir(), today);
            crate::rules::budget::report(&read, today, device.budget.unwrap_or_default())
        },
        trust: render::TrustReport::of(device)?,
        tree,
        another_manager: render::AnotherManager::of(device),
    })
}

/// The downloads left unfinished in the staging directory of every artifact directory the
/// device's layout downloads into (flat: `<models>`; per generation: each model's directory),
/// by file name.
fn staged_downloads(device: &Device) -> Vec<downloader::interrupted::StagedDownload> {
    let mut staged: Vec<_> = (device.files().staging_parents().iter())
        .flat_map(|dir| downloader::interrupted::staged_downloads(dir))
        .collect();
    staged.sort_by(|a, b| a.file.cmp(&b.file));
    staged
}

/// The catalog's models (but the built-in) that are on the device, each with its state.
fn installed_models(device: &Device, catalog: &manifest::Manifest) -> Result<Vec<InstalledModel>> {
    let mut installed = Vec::new();
    for e in catalog.models() {
        if contract::kind(e.id()) == ModelKind::BuiltIn {
            continue;
        }
        let state = device.verify_entry(e, false)?;
        if state != VerifyState::Missing {
            installed.push(InstalledModel::of(device, e, state));
        }
    }
    Ok(installed)
}

/// [`waiting_for_chestnut`] for the user's choice: `.choice.json`'s while a slot stands in as
/// the built-in, else the params (`selected` for the selection).
fn chosen_waiting_for_chestnut(
    device: &Device,
    view: &DeviceView,
    selected: &str,
    catalog: &manifest::Manifest,
) -> Vec<WaitingForChestnut> {
    let profiles = view.profiles();
    let chosen_rec = view.choice().map(|r| r.wanted.clone());
    let pick =
        |rec: Option<&Option<String>>, param: Option<String>| rec.cloned().flatten().or(param);
    let sel = pick(
        chosen_rec.as_ref().map(|w| &w.selection),
        Some(selected.to_string()),
    );
    let big = pick(chosen_rec.as_ref().map(|w| &w.big), profiles.big);
    waiting_for_chestnut(
        &[
            ("selection", sel.as_deref()),
            ("big_profile", big.as_deref()),
        ],
        catalog,
        device.chestnut(),
        &|e| {
            device
                .verify_entry(e, false)
                .is_ok_and(|s| s == VerifyState::Verified)
        },
    )
}

/// Re-hash installed catalog models (or the one named) against the catalog, recording what it
/// hashed in `.verified.json` unless `dry_run` (`verify --dry-run`: the same walk, states and
/// errors, nothing written). `on_hash` is called before a model that is present gets hashed
/// (that can take a while).
pub fn verify(
    device: &Device,
    only: Option<&str>,
    dry_run: bool,
    on_hash: &dyn Fn(&ModelId),
) -> Result<VerifyReport> {
    let catalog = device.require_catalog()?;
    let mut models = Vec::new();
    if let Some(want) = only
        && contract::is_builtin_id(want)
    {
        models.push(InstalledModel {
            id: contract::builtin_id().to_string(),
            state: VerifyState::Verified,
            digest_source: None,
        });
        return Ok(VerifyReport { dry_run, models });
    }
    for e in catalog.models() {
        if only.is_some_and(|want| e.id().as_str() != want) {
            continue;
        }
        // The built-in ships with the checkout and has no catalog digest: not a failure.
        if contract::kind(e.id()) == ModelKind::BuiltIn {
            continue;
        }
        if matches!(chunker::resolve(&device.artifact_path(e.id())), Ok(Some(_))) {
            on_hash(e.id());
        }
        // A dry run verifies in plan mode: the same answer, the cache read, nothing recorded.
        let state = match dry_run {
            true => device.planning().verify_entry(e, true)?,
            false => device.verify_entry(e, true)?,
        };
        if state == VerifyState::Missing && only.is_none() {
            continue;
        }
        models.push(InstalledModel::of(device, e, state));
    }
    if let Some(want) = only
        && models.is_empty()
    {
        return Err(Error::UnknownModel {
            id: want.to_string(),
            generation: device.config.generation.to_string(),
        });
    }
    Ok(VerifyReport { dry_run, models })
}

#[cfg(test)]
mod chestnut_tests {
    use super::*;
    use downloader::egpu::Chestnut::{Absent, Present, Ready};
    use serde_json::json;

    fn catalog() -> manifest::Manifest {
        manifest::Manifest::from_value(json!({"models": [
            {"id": "rdf43", "name": "RDF", "version": "v15"},
            {"id": "pop223", "name": "Pop", "version": "v16"},
            {"id": "big223", "name": "Big", "version": "v16", "uses_external_gpu": true},
            {"id": "big2", "name": "Big 2", "version": "v16", "uses_external_gpu": true},
        ]}))
        .unwrap()
    }

    #[test]
    fn status_lists_chosen_gpu_models_that_wait_for_a_ready_chestnut() {
        let c = catalog();
        let none = |_: &manifest::ModelEntry| false;
        let big_in = |e: &manifest::ModelEntry| e.id().as_str() == "big223";
        let ids = |chosen: &[(&'static str, Option<&str>)],
                   ch,
                   inst: &dyn Fn(&manifest::ModelEntry) -> bool| {
            waiting_for_chestnut(chosen, &c, ch, inst)
                .into_iter()
                .map(|w| (w.slot, w.id))
                .collect::<Vec<_>>()
        };
        let s = |x: &'static str| -> Option<&'static str> { Some(x) };
        // (chosen, chestnut, installed) -> waiting
        let chosen_big = [("selection", s("pop223")), ("big_profile", s("big223"))];
        assert_eq!(
            ids(&chosen_big, Absent, &none),
            [("big_profile", "big223".to_string())]
        );
        assert_eq!(ids(&chosen_big, Present, &none).len(), 1);
        assert!(ids(&chosen_big, Ready, &none).is_empty());
        assert!(ids(&chosen_big, Absent, &big_in).is_empty());
        // A legacy GPU selection names it twice: listed once, under the selection.
        let legacy = [("selection", s("BIG223")), ("big_profile", s("big223"))];
        assert_eq!(
            ids(&legacy, Absent, &none),
            [("selection", "big223".to_string())]
        );
        // Not in the catalog, disabled, unset, or not a GPU model: nothing.
        let other = [
            ("selection", s("gone223")),
            ("big_profile", s("none")),
            ("selection", None),
            ("selection", s("pop223")),
        ];
        assert!(ids(&other, Absent, &none).is_empty());
        let w = waiting_for_chestnut(&chosen_big, &c, Absent, &none);
        assert!(
            w[0].reason.contains("needs the external GPU (Chestnut)"),
            "{w:?}"
        );
    }
}
