//! What `refresh`, `download` and `status` decide from, read once at their top: the stored
//! catalog, the journal, `ModelManifestVersion`, the remembered choice and the selection and
//! profile params. Each part is a [`Readable`]: its value or the error it could not be read
//! with, so `status` reports an unreadable part instead of failing while `refresh` stops on it
//! as before ([`DeviceView::strict`]). The safeguards read at the moment they guard (`IsOnroad`
//! before each purge and download, `NetworkMetered`, the rollback floor) stay outside: a value
//! read at the top would be stale by then. The decisions (`decisions`, `journal`) take the view
//! as a value; only the runs (`manager`, `downloads`, `report`) read the device.

use manifest::{Generation, Manifest};

use crate::error::{Error, Result};
use crate::rules::choice::{self, Choice, Slots};
use crate::rules::contract::{self, ProfilesRead, SelectionParams};
use crate::state::device::Device;
use crate::state::journal::{Journal, read_journal};
use crate::state::params::{Warnings, keys};

/// One part of the device's state as read: its value, or the error it could not be read with
/// (naming the path), and the warnings of what in it was read as absent because it could not be
/// read (an oversized param, a torn `.choice.json`). The warnings are noted on the device when
/// the value is used, as a direct read notes them, so reading a part a command does not use
/// warns of nothing.
#[derive(Debug)]
pub struct Readable<T> {
    value: Result<T>,
    warnings: Vec<String>,
    sink: Warnings,
}

impl<T> Readable<T> {
    /// The value (its warnings noted); `None` when it could not be read.
    pub fn value(&self) -> Option<&T> {
        let v = self.value.as_ref().ok()?;
        self.note();
        Some(v)
    }

    /// Why it could not be read: the error with its next step (`None`: it was read).
    pub fn problem(&self) -> Option<String> {
        let e = self.value.as_ref().err()?;
        Some(crate::rules::next_step::with_next(e))
    }

    /// The error it could not be read with, if any.
    pub fn error(&self) -> Option<&Error> {
        self.value.as_ref().err()
    }

    fn of(value: Result<T>, own: &Warnings, sink: &Warnings) -> Self {
        Readable {
            value,
            warnings: own.take(),
            sink: sink.clone(),
        }
    }

    /// The value, or the error it could not be read with.
    fn into_result(self) -> Result<Self> {
        let value = Ok(self.value?);
        Ok(Readable { value, ..self })
    }

    /// Note its warnings on the device.
    fn note(&self) {
        for w in &self.warnings {
            self.sink.add(w.clone());
        }
    }
}

#[derive(Debug)]
pub struct DeviceView {
    pub generation: Generation,
    /// The stored catalog of this generation (`None`: none stored yet).
    pub catalog: Readable<Option<Manifest>>,
    /// `ModelManifestVersion` as the param says it.
    pub previous: Readable<Option<String>>,
    pub journal: Readable<Option<Journal>>,
    /// The remembered choice (`.choice.json`).
    pub choice: Readable<Option<Choice>>,
    /// The five selection params as read.
    pub selection: Readable<SelectionParams>,
    /// `ActiveSmallModel` and `ActiveBigModel` as read.
    pub profiles: Readable<ProfilesRead>,
}

impl DeviceView {
    /// Every part, each read once; never an error (see [`DeviceView::strict`]).
    pub fn read(device: &Device) -> Self {
        // Read through a copy that notes its warnings apart, so each part keeps its own.
        let own = Warnings::default();
        let mut quiet = device.clone();
        quiet.params = quiet.params.sharing_warnings(&own);
        quiet.memory = quiet.memory.sharing_warnings(&own);
        let sink = device.warnings();
        DeviceView {
            generation: device.config.generation,
            catalog: Readable::of(quiet.catalog(), &own, sink),
            previous: Readable::of(
                quiet.params.get_str(keys::MODEL_MANIFEST_VERSION),
                &own,
                sink,
            ),
            journal: Readable::of(read_journal(&quiet), &own, sink),
            choice: Readable::of(quiet.choice(), &own, sink),
            selection: Readable::of(quiet.selection_params(), &own, sink),
            profiles: Readable::of(quiet.profiles_read(), &own, sink),
        }
    }

    /// The view as `refresh` decides from it: the first part that could not be read
    /// (`ModelManifestVersion`, journal, choice, params, in that order) is the error. The
    /// catalog is not among them: a refresh takes it with [`DeviceView::take_catalog`], its
    /// offline first boot does without it.
    pub fn strict(self) -> Result<Self> {
        Ok(DeviceView {
            generation: self.generation,
            catalog: self.catalog,
            previous: self.previous.into_result()?,
            journal: self.journal.into_result()?,
            choice: self.choice.into_result()?,
            selection: self.selection.into_result()?,
            profiles: self.profiles.into_result()?,
        })
    }

    /// The stored catalog, taken out of the view (which then has none): the error it could not
    /// be read with, or [`Error::NoCatalog`] when none is stored.
    pub fn take_catalog(&mut self) -> Result<Manifest> {
        let value = std::mem::replace(&mut self.catalog.value, Ok(None))?;
        self.catalog.note();
        value.ok_or_else(|| Error::NoCatalog {
            generation: self.generation.to_string(),
        })
    }

    /// The stored catalog (`None` also when it could not be read: the `catalog` field says
    /// why).
    pub fn catalog(&self) -> Option<&Manifest> {
        self.catalog.value().and_then(Option::as_ref)
    }

    /// The journal (`None` also when it could not be read: see [`DeviceView::strict`]).
    pub fn journal(&self) -> Option<&Journal> {
        self.journal.value().and_then(Option::as_ref)
    }

    /// The remembered choice (`None` also when it could not be read).
    pub fn choice(&self) -> Option<&Choice> {
        self.choice.value().and_then(Option::as_ref)
    }

    /// `ModelManifestVersion` (`None` also when it could not be read).
    pub fn previous(&self) -> Option<&str> {
        self.previous.value().and_then(Option::as_deref)
    }

    /// The selected ID as the params say it, under upstream's precedence (the built-in when
    /// they could not be read).
    pub fn selected(&self) -> String {
        let p = self.selection.value().cloned().unwrap_or_default();
        contract::selected(&p).0
    }

    /// The profiles as read (unset when they could not be read).
    pub fn profiles(&self) -> ProfilesRead {
        let unset = || ProfilesRead {
            small: None,
            big: None,
        };
        self.profiles.value().cloned().unwrap_or_else(unset)
    }

    /// The slots as the params say them now (selection under upstream's precedence).
    pub fn slots(&self) -> Slots {
        slots_of(self.selected(), self.profiles())
    }

    /// What the user wants now: the params, with slots still in a fallback taken from the
    /// remembered choice (see [`choice::remember`]).
    pub fn remembered(&self) -> Slots {
        choice::remember(self.choice(), &self.slots())
    }

    /// Why each part that could not be read was not (`what: why`), in reading order; the
    /// catalog's is the `catalog` field's [`Readable::problem`] (`status` reports it as the
    /// catalog's state).
    pub fn problems(&self) -> Vec<String> {
        let parts = [
            ("ModelManifestVersion", self.previous.problem()),
            ("journal", self.journal.problem()),
            ("choice", self.choice.problem()),
            ("selection params", self.selection.problem()),
            ("profile params", self.profiles.problem()),
        ];
        let named = parts.into_iter().filter_map(|(what, p)| Some((what, p?)));
        named.map(|(what, p)| format!("{what}: {p}")).collect()
    }
}

/// The slots as the params say them now (selection under upstream's precedence).
pub(crate) fn param_slots(device: &Device) -> Result<Slots> {
    let (selection, _) = contract::selected(&device.selection_params()?);
    Ok(slots_of(selection, device.profiles_read()?))
}

/// The slots of `selection` and the profiles as read (lower-cased).
pub(crate) fn slots_of(selection: String, p: ProfilesRead) -> Slots {
    Slots {
        selection: Some(selection),
        small: p.small.map(|s| s.to_ascii_lowercase()),
        big: p.big.map(|b| b.to_ascii_lowercase()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceConfig;
    use fs_err as fs;

    fn device(root: &std::path::Path, generation: Generation) -> Device {
        let d = Device::new(DeviceConfig {
            data_dir: root.join("data"),
            memory_params_dir: root.join("shm"),
            builtin_dir: root.join("builtin"),
            generation,
        });
        d.ensure_dirs().unwrap();
        d
    }

    /// `status` of `d` beside some openpilot tree.
    fn status_of(d: &Device) -> Result<crate::report::StatusReport> {
        let tree = crate::state::tree::TreeStatus {
            openpilot_dir: "/data/openpilot".into(),
            tinygrad_commit: None,
            generation: None,
            state: "known",
            problem: None,
            next: None,
        };
        crate::report::status(d, tree)
    }

    fn catalog() -> Manifest {
        Manifest::from_value(serde_json::json!({"models": [
            {"id": "pop223", "name": "Pop", "version": "v16"},
        ]}))
        .unwrap()
    }

    /// Each part is read once at the top; a journal that cannot be read is a problem `status`
    /// reports and the error `refresh` stops on; an unreadable param warns only once used; for
    /// v25 and a made-up v26.
    #[test]
    fn an_unreadable_part_is_reported_by_status_and_stops_refresh() {
        for generation in [manifest::layout::CURRENT_GENERATION, Generation::new(26)] {
            let t = tempfile::tempdir().unwrap();
            let d = device(t.path(), generation);
            d.store_catalog(&catalog()).unwrap();
            d.params.put(keys::MODEL, "pop223").unwrap();
            let journal = d.models_dir().join(crate::JOURNAL_FILE);
            fs::write(&journal, b"[]").unwrap();
            let big = d.params.path(keys::ACTIVE_BIG_MODEL);
            fs::File::create(&big)
                .unwrap()
                .set_len(crate::state::bounded::PARAM_LIMIT + 1)
                .unwrap();

            let view = DeviceView::read(&d);
            assert!(
                d.warnings().take().is_empty(),
                "{generation}: nothing used yet"
            );
            let problems = view.problems();
            assert_eq!(problems.len(), 1, "{generation}: {problems:?}");
            assert!(
                problems[0].starts_with("journal: ")
                    && problems[0].contains(&*journal.to_string_lossy())
                    && problems[0].contains("corrupt state file"),
                "{generation}: {problems:?}"
            );
            assert!(view.journal().is_none());
            assert_eq!(view.catalog().map(|c| c.models().len()), Some(1));
            assert_eq!(view.selected(), "pop223");
            assert_eq!(view.previous(), None);
            assert!(
                d.warnings().take().is_empty(),
                "{generation}: good params warn of nothing"
            );
            assert_eq!(view.profiles().big, None);
            let w = d.warnings().take();
            assert!(
                w.len() == 1 && w[0].contains("param ActiveBigModel read as unset"),
                "{generation}: {w:?}"
            );

            // `status` reports it; `refresh` stops on it.
            let status = status_of(&d).unwrap();
            assert_eq!(status.unreadable, problems, "{generation}");
            assert_eq!(status.interrupted_migration, None);
            assert_eq!(status.selected.id, "pop223");
            let e = DeviceView::read(&d).strict().unwrap_err();
            assert!(
                matches!(e, Error::CorruptState { ref path, .. } if *path == journal),
                "{e}"
            );

            // Readable again: nothing to report, and refresh's view is the same.
            fs::remove_file(&journal).unwrap();
            let mut view = DeviceView::read(&d).strict().unwrap();
            assert!(view.problems().is_empty());
            assert!(status_of(&d).unwrap().unreadable.is_empty());
            assert_eq!(view.take_catalog().unwrap().models().len(), 1);
            assert!(view.catalog().is_none(), "taken out");
        }
    }

    /// No catalog stored: `NoCatalog` naming the generation; a catalog that cannot be read:
    /// its own error, for `status` too (as before: a refresh stores it again).
    #[test]
    fn the_catalog_is_taken_with_its_own_error() {
        for generation in [manifest::layout::CURRENT_GENERATION, Generation::new(26)] {
            let t = tempfile::tempdir().unwrap();
            let d = device(t.path(), generation);
            let e = DeviceView::read(&d).take_catalog().unwrap_err();
            assert!(
                matches!(e, Error::NoCatalog { generation: ref g } if *g == generation.to_string()),
                "{e}"
            );
            let path = d.models_dir().join(crate::CATALOG_FILE);
            fs::write(&path, b"{not json").unwrap();
            let mut view = DeviceView::read(&d);
            let problem = view.catalog.problem().unwrap();
            assert!(problem.contains(".catalog.json"), "{problem}");
            let e = view.take_catalog().unwrap_err();
            assert!(!matches!(e, Error::NoCatalog { .. }), "{e}");
            let e = status_of(&d).unwrap_err();
            assert!(e.to_string().contains(".catalog.json"), "{e}");
        }
    }
}
