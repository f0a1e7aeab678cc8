//! The migration journal (`<models>/.migration.json`): where a generation migration stands,
//! written atomically before each phase (see `manager`), and the rule of which journal a
//! refresh goes on with.

use manifest::{Generation, ModelId};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::rules::choice::Slots;
use crate::rules::contract::{
    self, BigProfile, Catalog, ProfilesRead, SelectionParams, Start, Wanted,
};
use crate::state::device::{Device, JOURNAL_FILE};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Purge,
    Download,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    /// `ModelManifestVersion` before the migration, as the param said it (the Python manager
    /// writes "unknown" when it found no manifest, so this is not a [`Generation`]).
    pub from: Option<String>,
    pub to: Generation,
    /// The selection to keep (already mapped into the new catalog's namespace).
    pub selected: ModelId,
    /// The small profile to keep (`None` in a journal written before profiles were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small: Option<ModelId>,
    /// The big profile to keep: a model id, `none` (disabled), or `None` (unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub big: Option<String>,
    /// The user's choice as the params (or `.choice.json`) said at the start, before any
    /// mapping: a migration started offline, without a catalog, maps it once the catalog is
    /// there (absent in a journal of an earlier build).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<Slots>,
    pub phase: Phase,
}

impl Journal {
    pub(crate) fn new(from: Option<String>, to: Generation, w: &Wanted, raw: &Slots) -> Self {
        Journal {
            raw: Some(raw.clone()),
            from,
            to,
            selected: w.selection.clone(),
            small: Some(w.profiles.small.clone()),
            big: match &w.profiles.big {
                BigProfile::Unset => None,
                BigProfile::Disabled => Some(contract::BIG_DISABLED.to_string()),
                BigProfile::Model(id) => Some(id.to_string()),
            },
            phase: Phase::Purge,
        }
    }

    /// The user's choice the journal keeps (before any mapping into the catalog).
    pub fn slots(&self) -> Slots {
        self.raw.clone().unwrap_or_else(|| Slots {
            selection: Some(self.selected.to_string()),
            small: self.small.as_ref().map(ModelId::to_string),
            big: self.big.clone(),
        })
    }

    /// What the journal says to keep, under the catalog's rules.
    pub(crate) fn wanted(&self, catalog: &Catalog) -> Wanted {
        wanted_of(&self.slots(), catalog)
    }
}

/// Read the journal, if any.
pub fn read_journal(device: &Device) -> Result<Option<Journal>> {
    device.read_json(JOURNAL_FILE, crate::state::bounded::JOURNAL_LIMIT)
}

pub(crate) fn write_journal(device: &Device, j: &Journal) -> Result<()> {
    device.write_json(JOURNAL_FILE, j)
}

/// What the device wants for these slots under the catalog's rules.
pub(crate) fn wanted_of(slots: &Slots, catalog: &Catalog) -> Wanted {
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
