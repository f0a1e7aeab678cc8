//! The decisions of `refresh` and `download`, taken from what was read: the real runs
//! (`manager`) act on them in their crash-safe order, the dry runs (`preview`) report them, so
//! the two cannot disagree. Apart from the reads they are given, they change nothing.

use std::collections::{BTreeMap, BTreeSet};

use manifest::{Generation, ModelEntry, ModelId};

use crate::choice::{self, Fate, Slots};
use crate::contract::{self, Catalog, ModelKind, Outcome, Start, Wanted};
use crate::device::{Device, VerifyState};
use crate::error::{Error, Result};
use crate::manager::{Journal, Phase, is_builtin_id, read_journal, remembered, wanted_of};
use crate::params::keys;
use crate::plan::{self, InstallStep};

/// The journal a refresh goes on with, read-only: from where the device stands
/// ([`contract::start`] over the journal read and `ModelManifestVersion`) and the journal read.
/// `true` when it must be written before anything else (`manager::begin_migration` writes it; a dry run
/// reports it).
pub(crate) fn journal_now(device: &Device, catalog: &Catalog) -> Result<(Option<Journal>, bool)> {
    let generation = device.config.generation;
    let previous = device.params.get_str(keys::MODEL_MANIFEST_VERSION)?;
    let journal = read_journal(device)?;
    let start = contract::start(
        journal.as_ref().map(|j| j.to.to_string()).as_deref(),
        previous.as_deref(),
        &generation.to_string(),
    );
    journal_step(start, journal, generation, catalog, || remembered(device))
}

/// The journal a refresh goes on with, given where it starts and the journal read, and whether
/// it must be written first. `remembered` (the user's choice now) is asked for on a new
/// migration only.
pub(crate) fn journal_step(
    start: Start,
    journal: Option<Journal>,
    generation: Generation,
    catalog: &Catalog,
    remembered: impl FnOnce() -> Result<Slots>,
) -> Result<(Option<Journal>, bool)> {
    Ok(match (start, journal) {
        (Start::SameGeneration, _) => (None, false),
        (Start::Migrate { from }, _) => {
            let raw = remembered()?;
            let j = Journal::new(from, generation, &wanted_of(&raw, catalog), &raw);
            (Some(j), true)
        }
        (Start::Resume, j) => (j, false),
        (Start::Retarget, Some(mut j)) => {
            // A migration to another generation was interrupted and this build reads a
            // different one: whatever that run downloaded is another generation's pickle, so
            // migrate again from the purge, keeping the selection it recorded.
            j.to = generation;
            j.phase = Phase::Purge;
            (Some(j), true)
        }
        (Start::Retarget, None) => unreachable!("retarget needs a journal"),
    })
}

/// What the user chose, and what the device wants for it under the catalog's rules: the
/// journal's record during a migration (the params say the built-in then), else the params
/// (`slots_now`) with `.choice.json` filling slots still in a fallback.
pub(crate) fn chosen(
    journal: Option<&Journal>,
    record: Option<&choice::Choice>,
    slots_now: &Slots,
    catalog: &Catalog,
) -> (Slots, Wanted) {
    match journal {
        Some(j) => (j.slots(), j.wanted(catalog)),
        None => {
            let raw = choice::remember(record, slots_now);
            let wanted = wanted_of(&raw, catalog);
            (raw, wanted)
        }
    }
}

/// What the installs of a refresh came to, per wanted catalog model.
#[derive(Debug, Default)]
pub(crate) struct Installs {
    /// Verified: kept, or installed now.
    pub ok: BTreeSet<ModelId>,
    /// A verified copy of an earlier publish is there.
    pub old_copy: BTreeSet<ModelId>,
    /// Not had this time: `(attempted, reason)`.
    pub failed: BTreeMap<ModelId, (bool, String)>,
}

impl Installs {
    /// [`plan::install_step`] for one wanted catalog model, recorded: a kept model is ok, one
    /// whose retry is not due failed without an attempt, an outdated copy is noted.
    pub fn step(
        &mut self,
        id: &ModelId,
        state: VerifyState,
        retry: Option<&choice::Retry>,
        now_unix: u64,
    ) -> InstallStep {
        if state == VerifyState::Outdated {
            self.old_copy.insert(id.clone());
        }
        let step = plan::install_step(state, choice::due(retry, now_unix));
        match step {
            InstallStep::Keep => {
                self.ok.insert(id.clone());
            }
            InstallStep::Wait => {
                let reason = retry.map(|r| r.reason.clone()).unwrap_or_default();
                self.failed.insert(id.clone(), (false, reason));
            }
            InstallStep::Fetch => {}
        }
        step
    }
}

/// Where a refresh ends, from what its installs came to: each wanted model's fate, what is
/// written (`contract::decide`, held while driving when `onroad_slots`, the params then, are
/// given) and the remembered choice after it.
pub(crate) struct Settled {
    pub fates: BTreeMap<ModelId, Fate>,
    pub outcome: Outcome,
    pub next: choice::Choice,
}

pub(crate) fn settle(
    (raw, wanted): (&Slots, &Wanted),
    catalog: &Catalog,
    installs: &Installs,
    local_present: &dyn Fn(&ModelId) -> bool,
    record: Option<&choice::Choice>,
    onroad_slots: Option<&Slots>,
    now_unix: u64,
) -> Settled {
    let available = |id: &ModelId| match contract::kind(id) {
        ModelKind::BuiltIn => true,
        ModelKind::Catalog => installs.ok.contains(id) || installs.old_copy.contains(id),
        ModelKind::Local => local_present(id),
    };
    let mut fates: BTreeMap<ModelId, Fate> = BTreeMap::new();
    for id in wanted.all() {
        let f = choice::fate(
            &id,
            catalog,
            available(&id),
            installs.old_copy.contains(&id),
            installs.failed.get(&id).cloned(),
        );
        fates.insert(id, f);
    }
    let mut outcome = contract::decide(wanted, catalog, &available);
    if let Some(slots_now) = onroad_slots {
        outcome = choice::hold_onroad(outcome, slots_now, record, catalog);
    }
    let written = choice::written_slots(&outcome);
    let next = choice::after_refresh(record, raw, wanted, &fates, &written, now_unix);
    Settled {
        fates,
        outcome,
        next,
    }
}

/// The bytes `.catalog.json` gets for a fetched manifest: as received, unless entries were left
/// out or values normalised (the raw bytes would bring the refused entries back when read):
/// then what this device accepted, canonical.
pub(crate) fn accepted_catalog_body(
    fetched: &downloader::FetchedManifest,
    generation: Generation,
) -> Result<Vec<u8>> {
    let raw = (fetched.refused_entries.is_empty() && fetched.normalised.is_empty())
        .then_some(fetched.raw.as_slice());
    crate::device::catalog_body(raw, &fetched.manifest, generation)
}

/// Whether a refresh whose manifest fetch failed with `e` runs the offline first boot
/// (`offline::first_boot`) before returning it: offline, or every manifest unusable; not on a
/// cancel, and not when a manifest was refused on trust grounds.
pub(crate) fn offline_first_boot_due(e: &Error) -> bool {
    matches!(e, Error::Download(d)
        if !matches!(d, downloader::Error::Cancelled { .. })
            && downloader::trust::refusals(d).is_empty())
}

/// What `manager::write_contract` writes, in its order: the params (`None`: removed), then the files
/// of the models directory with their bytes.
pub(crate) type ContractWrites = (
    Vec<(&'static str, Option<String>)>,
    Vec<(&'static str, Vec<u8>)>,
);

pub(crate) fn contract_writes(catalog: &Catalog, outcome: &Outcome) -> ContractWrites {
    let mut params = contract::selection_writes(outcome);
    params.extend(catalog.params().into_iter().map(|(k, v)| (k, Some(v))));
    let files = catalog
        .caches()
        .into_iter()
        .map(|(name, body)| (name, contract::cache_bytes(&body)))
        .collect();
    (params, files)
}

/// What `download <ID>` is asked for, canonical (upstream canonicalises the requested key
/// first: `sc`→`sc2`, `napv4`→`remove-avgpoolv4`).
pub(crate) enum Requested {
    /// Nothing to download.
    BuiltIn(ModelId),
    /// Nothing to download.
    Local(ModelId),
    Catalog(ModelEntry),
}

/// The model `download <ID>` works on; a catalog model must be in the stored catalog.
pub(crate) fn requested(device: &Device, id: &ModelId) -> Result<Requested> {
    let canonical: ModelId = contract::canonical_id(id.as_str())
        .parse()
        .unwrap_or_else(|_| id.clone());
    if is_builtin_id(canonical.as_str()) {
        return Ok(Requested::BuiltIn(canonical));
    }
    if canonical.is_local() {
        return Ok(Requested::Local(canonical));
    }
    let catalog = device.require_catalog()?;
    let entry = catalog
        .get(&canonical)
        .cloned()
        .ok_or_else(|| Error::UnknownModel {
            id: canonical.to_string(),
            generation: device.config.generation.to_string(),
        })?;
    Ok(Requested::Catalog(entry))
}

/// A GPU-only model needs a ready Chestnut, unless the one-request override is set (`allow`).
pub(crate) fn gpu_rule(device: &Device, entry: &ModelEntry, allow: bool) -> Result<()> {
    downloader::egpu::single_download(entry.uses_external_gpu(), device.chestnut(), allow).map_err(
        |_| Error::ExternalGpuRequired {
            id: entry.id().to_string(),
        },
    )
}

#[cfg(test)]
mod journal_tests {
    use super::*;

    /// (start, journal read, journal gone on with as (to, phase, from), written first)
    type Case = (
        Start,
        Option<Journal>,
        Option<(Generation, Phase, &'static str)>,
        bool,
    );

    /// Which journal a refresh goes on with, and whether it is written first, for every start.
    #[test]
    fn journal_step_writes_a_new_or_retargeted_journal_and_resumes_an_interrupted_one() {
        let v25: Generation = "v25".parse().unwrap();
        let v26: Generation = "v26".parse().unwrap();
        let catalog = Catalog::default();
        let mine = Slots {
            selection: Some("pop223".into()),
            ..Slots::default()
        };
        let recorded = |to: Generation, phase: Phase| Journal {
            to,
            phase,
            ..Journal::new(Some("v24".into()), to, &wanted_of(&mine, &catalog), &mine)
        };
        let from_v23 = Start::Migrate {
            from: Some("v23".into()),
        };
        let cases: Vec<Case> = vec![
            (Start::SameGeneration, None, None, false),
            (from_v23, None, Some((v25, Phase::Purge, "v23")), true),
            (
                Start::Resume,
                Some(recorded(v25, Phase::Download)),
                Some((v25, Phase::Download, "v24")),
                false,
            ),
            (
                Start::Resume,
                Some(recorded(v25, Phase::Purge)),
                Some((v25, Phase::Purge, "v24")),
                false,
            ),
            (
                Start::Retarget,
                Some(recorded(v26, Phase::Download)),
                Some((v25, Phase::Purge, "v24")),
                true,
            ),
        ];
        for (start, journal, want, write) in cases {
            let label = format!("{start:?}");
            let (got, w) =
                journal_step(start, journal, v25, &catalog, || Ok(mine.clone())).unwrap();
            assert_eq!(w, write, "{label}");
            let got = got.map(|j| {
                assert_eq!(j.slots(), mine, "{label}: the choice is kept");
                (j.to, j.phase, j.from.unwrap_or_default())
            });
            assert_eq!(
                got,
                want.map(|(to, phase, from)| (to, phase, from.to_string())),
                "{label}"
            );
        }
    }
}
