//! Pure decisions: over file names, what a generation change deletes and what `gc` deletes;
//! over an installed model's state, what a refresh does with it. No I/O here, so every rule is
//! tested on plain values. The real runs and their dry runs (the same runs in plan mode) take their
//! decisions from here.

use std::collections::BTreeSet;

use chunker::Form;
use chunker::atomic::is_temp_name;
use manifest::ModelId;

use serde::Serialize;

/// Verification state of one model for `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifyState {
    Verified,
    /// A verified copy of an earlier publish of this model in this generation: the catalog now
    /// names other bytes. Kept and used until the new ones verify.
    Outdated,
    Unverified,
    Corrupt,
    Missing,
}

const DRIVING: &str = "_driving_";

/// The model key of a driving artifact name: the text before `_driving_` (`pop223` for
/// `pop223_driving_tinygrad.pkl.chunk01of02`), `Some("")` for legacy keyless `driving_*` files,
/// `None` for anything that is not a driving artifact.
pub fn driving_key(name: &str) -> Option<&str> {
    if let Some(at) = name.find(DRIVING) {
        return Some(&name[..at]);
    }
    name.starts_with("driving_").then_some("")
}

fn is_chunk_manifest(name: &str) -> bool {
    matches!(chunker::member_form(name), Some((_, Form::ChunkManifest)))
}

fn is_local_key(key: &str) -> bool {
    key.starts_with(ModelId::LOCAL_PREFIX)
}

/// Files a generation change removes from `/data/models`: every driving artifact in every form
/// (plain PKLs, `.pNN` parts and `.sha256`, chunks, `.chunkmanifest`, eGPU variants, pre-v23
/// split files) except `local-*` models. Temporaries are left to `gc` (the current download's
/// staging file is one of them). DM files and everything else are kept.
pub fn purge_plan<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = names
        .into_iter()
        .filter(|n| !is_temp_name(n) && !n.starts_with('.'))
        .filter(|n| driving_key(n).is_some_and(|k| !is_local_key(k)))
        .map(str::to_string)
        .collect();
    // `.chunkmanifest` files first: a set without its manifest is "not present" to every
    // reader, so no reader can see a manifest whose chunks are already gone.
    out.sort_by_key(|n| (!is_chunk_manifest(n), n.clone()));
    out
}

/// Whether a name is one of the Python manager's temporaries (`NamedTemporaryFile` in the
/// models dir: `tmpXXXXXXXX`).
pub fn is_python_temp(name: &str) -> bool {
    name.starts_with("tmp") && !name.contains(DRIVING)
}

/// A Python download writes its current temporary at least every minute and a half (its read
/// timeout is 60 s, its HEAD and connect timeouts 10 s) and keeps it open; a temporary touched
/// within this window may belong to a download in flight.
pub const PYTHON_TEMP_QUIET: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// One Python temporary as `gc` found it: its age (now minus its mtime; `None` when the mtime
/// is in the future or unreadable) and whether any process holds it open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonTemp {
    pub name: String,
    pub age: Option<std::time::Duration>,
    pub open: bool,
}

/// The Python temporaries `gc` may remove: none while any of them is open or younger than
/// [`PYTHON_TEMP_QUIET`] (a chunked Python download keeps its finished chunks in closed
/// temporaries until it commits, so one live temporary protects them all); otherwise all of
/// them, leftovers of downloads that ended without cleaning up.
pub fn python_temps_to_remove(temps: &[PythonTemp]) -> BTreeSet<String> {
    let in_flight = temps
        .iter()
        .any(|t| t.open || t.age.is_none_or(|a| a < PYTHON_TEMP_QUIET));
    if in_flight {
        return BTreeSet::new();
    }
    temps.iter().map(|t| t.name.clone()).collect()
}

/// Files `gc` removes: our stray temporaries (`.tmp-`), the Python manager's temporaries
/// (`tmp*`) that `python_temps` allows ([`python_temps_to_remove`]), legacy keyless `driving_*`
/// files, and non-local driving artifacts whose model is not in the catalog. Never `local-*`.
pub fn gc_plan<'a>(
    names: impl IntoIterator<Item = &'a str>,
    catalog: &BTreeSet<String>,
    python_temps: &BTreeSet<String>,
) -> Vec<String> {
    let mut out: Vec<String> = names
        .into_iter()
        .filter(|n| {
            if is_temp_name(n) {
                return true;
            }
            if is_python_temp(n) {
                return python_temps.contains(*n);
            }
            match driving_key(n) {
                Some(k) if is_local_key(k) => false,
                Some("") => true,
                Some(k) => !catalog.contains(k),
                None => false,
            }
        })
        .map(str::to_string)
        .collect();
    out.sort_by_key(|n| (!is_chunk_manifest(n), n.clone()));
    out
}

/// What a refresh does with one wanted catalog model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallStep {
    /// A verified copy is installed: kept, nothing fetched.
    Keep,
    /// Its retry is not due yet: skipped this time (the built-in, or a verified older copy,
    /// stands in).
    Wait,
    /// Downloaded and verified.
    Fetch,
    /// A GPU-only model, and no Chestnut is ready: a refresh does not fetch it (upstream's
    /// rule, [`downloader::egpu::unrequested_download`]); the slot naming it is kept and the
    /// first refresh with a ready Chestnut fetches it.
    NeedsChestnut,
}

/// The step for a model in `state` whose retry is `due` (or that never failed).
pub fn install_step(state: VerifyState, due: bool) -> InstallStep {
    match (state, due) {
        (VerifyState::Verified, _) => InstallStep::Keep,
        (_, false) => InstallStep::Wait,
        (_, true) => InstallStep::Fetch,
    }
}

/// The step a refresh (or a migration) takes for a wanted catalog model: a verified copy is
/// kept; a GPU-only model (`uses_external_gpu`) without a ready Chestnut is not fetched,
/// whatever its retry state; anything else as [`install_step`].
pub fn refresh_step(
    state: VerifyState,
    due: bool,
    uses_external_gpu: bool,
    chestnut: downloader::egpu::Chestnut,
) -> InstallStep {
    match state {
        VerifyState::Verified => InstallStep::Keep,
        _ if !downloader::egpu::unrequested_download(uses_external_gpu, chestnut) => {
            InstallStep::NeedsChestnut
        }
        _ => install_step(state, due),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refresh_fetches_a_gpu_model_only_with_a_ready_chestnut() {
        use InstallStep::*;
        use VerifyState::*;
        use downloader::egpu::Chestnut::{Absent, Present, Ready};
        // (state, due, GPU model, chestnut) -> step
        for (state, due, gpu, chestnut, want) in [
            (Missing, true, true, Absent, NeedsChestnut),
            (Missing, true, true, Present, NeedsChestnut),
            (Missing, false, true, Absent, NeedsChestnut),
            (Corrupt, true, true, Absent, NeedsChestnut),
            (Outdated, true, true, Absent, NeedsChestnut),
            (Verified, true, true, Absent, Keep),
            (Missing, true, true, Ready, Fetch),
            (Missing, false, true, Ready, Wait),
            (Outdated, true, true, Ready, Fetch),
            (Missing, true, false, Absent, Fetch),
            (Missing, false, false, Absent, Wait),
            (Verified, true, false, Ready, Keep),
        ] {
            assert_eq!(
                refresh_step(state, due, gpu, chestnut),
                want,
                "{state:?} due={due} gpu={gpu} {chestnut:?}"
            );
        }
    }

    #[test]
    fn install_step_keeps_only_a_verified_copy_and_waits_for_a_due_retry() {
        use InstallStep::*;
        use VerifyState::*;
        for (state, due, want) in [
            (Verified, true, Keep),
            (Verified, false, Keep),
            (Outdated, true, Fetch),
            (Outdated, false, Wait),
            (Unverified, true, Fetch),
            (Unverified, false, Wait),
            (Corrupt, true, Fetch),
            (Corrupt, false, Wait),
            (Missing, true, Fetch),
            (Missing, false, Wait),
        ] {
            assert_eq!(install_step(state, due), want, "{state:?} due={due}");
        }
    }

    const OLD_DEVICE: &[&str] = &[
        "pop223_driving_tinygrad.pkl",
        "pop223_driving_tinygrad.pkl.p00",
        "pop223_driving_tinygrad.pkl.p01",
        "pop223_driving_tinygrad.pkl.sha256",
        "other_driving_tinygrad.pkl.chunk01of02",
        "other_driving_tinygrad.pkl.chunk02of02",
        "other_driving_tinygrad.pkl.chunkmanifest",
        "gpu_driving_chestnut_tinygrad.pkl",
        "driving_vision_tinygrad.pkl",
        "driving_off_policy_tinygrad.pkl.p00",
        "local-test_driving_tinygrad.pkl",
        "local-test.json",
        "dmonitoring_model_tinygrad.pkl",
        "dm_warp_1344x760_tinygrad.pkl",
        ".model_versions.json",
        ".tmp-partial-0123456789abcdef-pop223_driving_tinygrad.pkl",
        ".manager.lock",
        "notes.txt",
    ];

    #[test]
    fn purge_takes_every_old_driving_form_and_nothing_else() {
        let plan = purge_plan(OLD_DEVICE.iter().copied());
        assert_eq!(
            plan,
            [
                "other_driving_tinygrad.pkl.chunkmanifest",
                "driving_off_policy_tinygrad.pkl.p00",
                "driving_vision_tinygrad.pkl",
                "gpu_driving_chestnut_tinygrad.pkl",
                "other_driving_tinygrad.pkl.chunk01of02",
                "other_driving_tinygrad.pkl.chunk02of02",
                "pop223_driving_tinygrad.pkl",
                "pop223_driving_tinygrad.pkl.p00",
                "pop223_driving_tinygrad.pkl.p01",
                "pop223_driving_tinygrad.pkl.sha256",
            ]
        );
    }

    #[test]
    fn python_temporaries_are_removed_only_when_none_is_open_or_young() {
        use std::time::Duration;
        let t = |name: &str, age: Option<u64>, open: bool| PythonTemp {
            name: name.into(),
            age: age.map(Duration::from_secs),
            open,
        };
        let hour = Some(3600);
        let names = |v: BTreeSet<String>| v.into_iter().collect::<Vec<_>>();
        // (temporaries) -> removed
        let table: Vec<(Vec<PythonTemp>, Vec<&str>)> = vec![
            (vec![], vec![]),
            (vec![t("tmpa", hour, false)], vec!["tmpa"]),
            (
                vec![t("tmpa", hour, false), t("tmpb", hour, false)],
                vec!["tmpa", "tmpb"],
            ),
            // Open: a download in flight (its finished chunks are the closed ones).
            (vec![t("tmpa", hour, true), t("tmpb", hour, false)], vec![]),
            // Young: just written.
            (
                vec![t("tmpa", Some(5), false), t("tmpb", hour, false)],
                vec![],
            ),
            (vec![t("tmpa", Some(14 * 60 + 59), false)], vec![]),
            (vec![t("tmpa", Some(15 * 60), false)], vec!["tmpa"]),
            // An mtime in the future (clock stepped) or unreadable: kept.
            (vec![t("tmpa", None, false)], vec![]),
        ];
        for (temps, want) in table {
            assert_eq!(names(python_temps_to_remove(&temps)), want, "{temps:?}");
        }
        let catalog: BTreeSet<String> = BTreeSet::new();
        let allowed: BTreeSet<String> = ["tmpold".to_string()].into();
        assert_eq!(
            gc_plan(["tmpold", "tmpnew", ".tmp-1-2-x"], &catalog, &allowed),
            [".tmp-1-2-x", "tmpold"]
        );
        assert!(is_python_temp("tmpk3j4h5"));
        assert!(!is_python_temp("tmp_driving_tinygrad.pkl"));
        assert!(!is_python_temp(".tmp-1-2-x"));
    }

    #[test]
    fn gc_keeps_catalog_and_local_models() {
        let catalog: BTreeSet<String> = ["pop223".to_string()].into();
        let allowed: BTreeSet<String> = ["tmpab12cd".to_string()].into();
        let plan = gc_plan(
            OLD_DEVICE.iter().copied().chain(["tmpab12cd"]),
            &catalog,
            &allowed,
        );
        assert_eq!(
            plan,
            [
                "other_driving_tinygrad.pkl.chunkmanifest",
                ".tmp-partial-0123456789abcdef-pop223_driving_tinygrad.pkl",
                "driving_off_policy_tinygrad.pkl.p00",
                "driving_vision_tinygrad.pkl",
                "gpu_driving_chestnut_tinygrad.pkl",
                "other_driving_tinygrad.pkl.chunk01of02",
                "other_driving_tinygrad.pkl.chunk02of02",
                "tmpab12cd",
            ]
        );
    }

    #[test]
    fn keys() {
        assert_eq!(
            driving_key("pop223_driving_tinygrad.pkl.p00"),
            Some("pop223")
        );
        assert_eq!(driving_key("driving_policy_tinygrad.pkl"), Some(""));
        assert_eq!(driving_key("dmonitoring_model_tinygrad.pkl"), None);
        assert_eq!(driving_key("local-x_driving_tinygrad.pkl"), Some("local-x"));
    }
}
