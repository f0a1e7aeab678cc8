//! The dry run against the real run. `refresh --dry-run` is the refresh in plan mode
//! (`Device::planning`): on each starting device the planned run's typed effect log must equal
//! the log of the real run from the same start, and the plan must change nothing. The report
//! the dry run renders is read off that log; it is checked against the real run's report.

use std::collections::{BTreeMap, BTreeSet};

use crate::common::{Fixture, Origin};
use downloader::CancelToken;
use migration::{Effect, Effects};

/// `Model` and `DrivingModel` selecting `id`.
fn selecting(id: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![("Model", id), ("DrivingModel", id)]
}

/// Plan, then apply, from the same start at the same instant: the same typed log, nothing
/// changed by the plan, and the dry-run report agreeing with the real run's.
fn agree(label: &str, f: &Fixture, origin: &Origin, now: u64) {
    let dl = origin.downloader();
    let at_now = migration::Run {
        now_unix: now,
        ..migration::Run::new(&dl)
    };
    let before = f.snapshot();
    let planning = f.device().planning();
    let planned = migration::refresh(&planning, &at_now);
    let plan = migration::run::preview::refresh(&f.device(), &at_now).unwrap();
    assert_eq!(
        f.snapshot(),
        before,
        "{label}: the dry run changed the device"
    );
    let applying = Effects::recording();
    let r = migration::refresh(&f.device_with(applying.clone()), &at_now).unwrap();
    assert_eq!(
        planned.unwrap(),
        r,
        "{label}: the planned run reports otherwise"
    );
    let log = applying.effects();
    assert_eq!(
        planning.effects().effects(),
        log,
        "{label}: plan log != apply log"
    );
    assert!(!log.is_empty() || plan.would_write.is_empty(), "{label}");

    assert_eq!(plan.selected, r.selected, "{label}");
    assert_eq!(plan.fell_back_to_builtin, r.fell_back_to_builtin, "{label}");
    assert_eq!(plan.would_purge, r.purged, "{label}");
    assert_eq!(plan.migrated_from, r.migrated_from, "{label}");
    // What the report names is what the log holds: each download an install, each changed
    // param written, each file written or removed.
    for migration::run::preview::PlannedDownload { id, .. } in &plan.would_download {
        let install = Effect::Install {
            what: id.to_string(),
        };
        assert!(
            log.contains(&install),
            "{label}: {id} planned, not installed"
        );
    }
    for id in &plan.would_keep {
        let install = Effect::Install {
            what: id.to_string(),
        };
        assert!(!log.contains(&install), "{label}: {id} kept, yet installed");
    }
    let after = f.snapshot();
    let named: BTreeSet<String> = log
        .iter()
        .filter_map(|e| match e {
            Effect::WriteFile { name, .. } | Effect::RemoveFile { name } => Some(name.clone()),
            _ => None,
        })
        .collect();
    for n in plan.would_write.iter().chain(&plan.would_remove) {
        assert!(named.contains(n), "{label}: {n} named, not in the log");
    }

    // Params: exactly the ones that changed, with their new values.
    let params = |s: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        s.iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("d/")?.to_string(), v.clone())))
            .collect()
    };
    let (p0, p1) = (params(&before), params(&after));
    let keys: BTreeSet<&String> = p0.keys().chain(p1.keys()).collect();
    let changed: BTreeMap<String, Option<String>> = keys
        .into_iter()
        .filter(|k| p0.get(*k) != p1.get(*k))
        .map(|k| (k.clone(), p1.get(k).cloned()))
        .collect();
    let planned: BTreeMap<String, Option<String>> = plan
        .would_set_params
        .iter()
        .map(|c| (c.key.clone(), c.value.clone()))
        .collect();
    assert_eq!(planned, changed, "{label}: params");

    // State and cache files (not the artifacts, which the purge and the downloads account
    // for): written ones and removed ones. A new journal is written and removed again.
    let files = |s: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        s.iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("models/")?.to_string(), v.clone())))
            .filter(|(k, _)| migration::rules::plan::driving_key(k).is_none() && !k.ends_with('/'))
            // The daily byte budget's ledger: a count of what was fetched, not named by a dry
            // run (docs/device.md, *The daily byte budget*).
            .filter(|(k, _)| k != migration::rules::budget::LEDGER_FILE)
            .collect()
    };
    let (f0, f1) = (files(&before), files(&after));
    let written: BTreeSet<String> = f1
        .iter()
        .filter(|(k, v)| f0.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .collect();
    let removed: BTreeSet<String> = f0
        .keys()
        .filter(|k| !f1.contains_key(*k))
        .cloned()
        .collect();
    let journal = migration::JOURNAL_FILE.to_string();
    let would_write: BTreeSet<String> = plan
        .would_write
        .iter()
        .filter(|n| **n != journal)
        .cloned()
        .collect();
    assert_eq!(would_write, written, "{label}: files written");
    assert_eq!(
        plan.would_remove.iter().cloned().collect::<BTreeSet<_>>(),
        removed,
        "{label}: files removed"
    );
    assert_eq!(
        plan.migrating,
        plan.would_write.contains(&journal) || plan.would_remove.contains(&journal),
        "{label}: a migration journals"
    );

    // Downloads: each one's artifact is new; each kept one is untouched.
    let artifact = |id: &manifest::ModelId| format!("models/{id}_driving_tinygrad.pkl");
    for migration::run::preview::PlannedDownload { id, .. } in &plan.would_download {
        let k = artifact(id);
        assert!(
            after.contains_key(&k) && before.get(&k) != after.get(&k),
            "{label}: {id} planned for download, not installed"
        );
    }
    for id in &plan.would_keep {
        let k = artifact(id);
        assert_eq!(before.get(&k), after.get(&k), "{label}: {id} kept");
    }
    // And afterwards nothing is left to do.
    let again = migration::run::preview::refresh(&f.device(), &at_now).unwrap();
    assert!(!again.migrating, "{label}: {again:?}");
    assert!(again.would_download.is_empty(), "{label}: {again:?}");
    assert!(again.would_write.is_empty(), "{label}: {again:?}");
    assert!(again.would_set_params.is_empty(), "{label}: {again:?}");
}

#[test]
fn the_dry_run_names_exactly_what_the_refresh_then_changes() {
    let now = manifest::UnixSeconds::now().0;
    let origin = Origin::start();
    // A generation migration, with each kind of selection.
    for (label, params) in [
        ("migration keeping pop223", selecting("pop223")),
        ("migration of a legacy alias", selecting("pop22")),
        ("migration, selection dropped", selecting("gone223")),
        (
            "migration with profiles",
            vec![
                ("Model", "tr14223"),
                ("DrivingModel", "tr14223"),
                ("ActiveSmallModel", "pop223"),
            ],
        ),
        ("migration to a local model", selecting("local-mine")),
    ] {
        agree(label, &Fixture::v24(&params), &origin, now);
    }

    // The same generation: a device refreshed once, then its selected artifact damaged.
    let f = origin.refreshed(&selecting("pop223"));
    std::fs::write(f.models().join("pop223_driving_tinygrad.pkl"), b"damaged").unwrap();
    agree("same generation, repair", &f, &origin, now);

    // A selection switched by the UI since the last refresh.
    let f = origin.refreshed(&selecting("pop223"));
    f.set("Model", "tr14223");
    f.set("DrivingModel", "tr14223");
    agree("same generation, new selection", &f, &origin, now);

    // An interrupted migration (journal in the download phase) resumed.
    // The crash is right after the journal's second write (phase `download`), after the purge.
    let recording = migration::Effects::recording();
    let f = Fixture::v24(&selecting("pop223"));
    let run = |effects: migration::Effects| {
        migration::refresh(
            &f.device_with(effects),
            &migration::Run {
                now_unix: now,
                ..migration::Run::new(&origin.downloader())
            },
        )
    };
    run(recording.clone()).unwrap();
    let phase_written = recording
        .log()
        .iter()
        .enumerate()
        .filter(|(_, e)| *e == "write .migration.json")
        .nth(1)
        .map(|(n, _)| n)
        .expect("the journal is written twice");
    let f = Fixture::v24(&selecting("pop223"));
    let crashed = migration::refresh(
        &f.device_with(migration::Effects::crash_after(phase_written)),
        &migration::Run {
            now_unix: now,
            ..migration::Run::new(&origin.downloader())
        },
    );
    assert!(
        matches!(crashed, Err(migration::Error::Crashed { .. })),
        "{crashed:?}"
    );
    agree("resumed migration", &f, &origin, now);
}

#[test]
fn a_retry_not_due_is_waited_for_and_an_outdated_copy_stays_in_use() {
    let mut origin = Origin::start();
    let f = origin.refreshed(&selecting("pop223"));
    // pop223 republished with other bytes, and both origins refuse it: the verified older copy
    // stays in use and the model is retried later.
    origin.republish("pop223", 7);
    origin.refuse("pop223");
    let now = manifest::UnixSeconds::now().0;
    migration::refresh(
        &f.device(),
        &migration::Run {
            now_unix: now,
            ..migration::Run::new(&origin.downloader())
        },
    )
    .unwrap();
    let plan = migration::run::preview::refresh(
        &f.device(),
        &migration::Run {
            now_unix: now + 1,
            ..migration::Run::new(&origin.downloader())
        },
    )
    .unwrap();
    assert_eq!(
        plan.not_due,
        ["pop223".parse::<manifest::ModelId>().unwrap()],
        "{plan:?}"
    );
    assert_eq!(plan.selected.as_str(), "pop223", "{plan:?}");
    agree("retry not due, old copy in use", &f, &origin, now + 1);
}

/// `download` after its dry run: the files it names to install appear, the ones it names to
/// remove go, and nothing else of the models directory changes but the verification cache.
fn download_agrees(
    label: &str,
    f: &Fixture,
    origin: &Origin,
    id: Option<&str>,
) -> migration::run::preview::DownloadPlanReport {
    let device = f.device();
    let dl = origin.downloader();
    let id: Option<manifest::ModelId> = id.map(|i| i.parse().unwrap());
    let before = f.snapshot();
    let plan = migration::run::preview::download(&device, &dl, id.as_ref()).unwrap();
    assert_eq!(
        f.snapshot(),
        before,
        "{label}: the dry run changed the device"
    );
    match &id {
        Some(id) => {
            migration::download_model(&device, &dl, id, &CancelToken::new(), &|_| {}).unwrap();
        }
        None => {
            let catalog = device.require_catalog().unwrap();
            for e in migration::downloadable(
                &catalog,
                device.chestnut(),
                device.is_protected(),
                device.contract(),
            ) {
                migration::install(&device, &dl, e, &CancelToken::new(), &|_| {}).unwrap();
            }
        }
    }
    let after = f.snapshot();
    let mut install = BTreeSet::new();
    let mut remove = BTreeSet::new();
    for m in &plan.models {
        if let migration::run::preview::Action::Download { artifacts: planned } = &m.action {
            for p in planned {
                install.extend(p.would_install.iter().map(|n| format!("models/{n}")));
                remove.extend(p.would_remove.iter().map(|n| format!("models/{n}")));
            }
        }
    }
    // The daily byte budget's ledger counts what was fetched; a dry run fetches nothing and
    // does not name it (docs/device.md, *The daily byte budget*).
    let ledger = format!("models/{}", migration::rules::budget::LEDGER_FILE);
    let changed: BTreeSet<String> = after
        .iter()
        .filter(|(k, _)| **k != ledger)
        .filter(|(k, v)| before.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .collect();
    let gone: BTreeSet<String> = before
        .keys()
        .filter(|k| !after.contains_key(*k))
        .cloned()
        .collect();
    assert_eq!(changed, install, "{label}: installed");
    assert_eq!(gone, remove, "{label}: removed");
    plan
}

/// How many models the plan downloads.
fn downloads(plan: &migration::run::preview::DownloadPlanReport) -> usize {
    plan.models
        .iter()
        .filter(|m| matches!(m.action, migration::run::preview::Action::Download { .. }))
        .count()
}

#[test]
fn the_download_dry_run_names_what_the_download_installs_and_removes() {
    let origin = Origin::start();
    let f = origin.refreshed(&selecting("pop223"));
    assert_eq!(
        downloads(&download_agrees(
            "verified copy",
            &f,
            &origin,
            Some("pop223")
        )),
        0
    );
    assert_eq!(
        downloads(&download_agrees("built-in", &f, &origin, Some("rdf"))),
        0
    );
    // Chunk-set leftovers of the chunked model in place of its plain file.
    let models = f.models();
    std::fs::remove_file(models.join("pop223_driving_tinygrad.pkl")).unwrap();
    std::fs::write(models.join("pop223_driving_tinygrad.pkl.chunk01of02"), b"x").unwrap();
    assert_eq!(
        downloads(&download_agrees("leftovers", &f, &origin, Some("pop223"))),
        1
    );
    // Damaged bytes of one model, another not installed yet: `--all`.
    std::fs::write(models.join("pop223_driving_tinygrad.pkl"), b"damaged").unwrap();
    let all = download_agrees("all", &f, &origin, None);
    assert!(downloads(&all) >= 2, "{all:?}");
}

/// Offline, a device on another generation still migrates to the built-in (the offline first
/// boot) before the refresh fails: its dry run fails the same way and names those effects.
#[test]
fn an_offline_dry_run_fails_as_the_refresh_and_names_its_first_boot() {
    let origin = Origin::start();
    origin.no_manifest();
    let f = Fixture::v24(&selecting("pop223"));
    let device = f.device();
    let dl = origin.downloader();
    let before = f.snapshot();
    let e = migration::run::preview::refresh(&device, &migration::Run::new(&dl)).unwrap_err();
    let plan = migration::run::preview::refresh_failure(&device, &e).unwrap();
    assert_eq!(f.snapshot(), before, "the dry run changed the device");
    assert_eq!(plan.migrate_from, Some(Some("v24".to_string())), "{plan:?}");

    let real = migration::refresh(&device, &migration::Run::new(&dl)).unwrap_err();
    assert_eq!(e.to_string(), real.to_string());
    let after = f.snapshot();
    let purged: Vec<String> = migration::rules::plan::purge_plan(
        before
            .keys()
            .filter_map(|k| k.strip_prefix("models/"))
            .filter(|k| !k.ends_with('/')),
    );
    assert_eq!(plan.would_purge, purged);
    for name in &plan.would_purge {
        assert!(!after.contains_key(&format!("models/{name}")), "{name}");
    }
    let changed_params: BTreeMap<String, Option<String>> = before
        .keys()
        .chain(after.keys())
        .filter_map(|k| k.strip_prefix("d/"))
        .filter(|k| before.get(&format!("d/{k}")) != after.get(&format!("d/{k}")))
        .map(|k| (k.to_string(), after.get(&format!("d/{k}")).cloned()))
        .collect();
    let planned: BTreeMap<String, Option<String>> = plan
        .would_set_params
        .iter()
        .map(|c| (c.key.clone(), c.value.clone()))
        .collect();
    assert_eq!(planned, changed_params);
    let written: BTreeSet<String> = after
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("models/")?, v)))
        .filter(|(k, v)| before.get(&format!("models/{k}")) != Some(*v))
        .map(|(k, _)| k.to_string())
        .collect();
    assert_eq!(
        plan.would_write.iter().cloned().collect::<BTreeSet<_>>(),
        written
    );

    // Now on the way (journal past its purge): offline again, nothing more is written.
    let e = migration::run::preview::refresh(&device, &migration::Run::new(&dl)).unwrap_err();
    let again = migration::run::preview::refresh_failure(&device, &e).unwrap();
    assert!(again.is_empty(), "{again:?}");
}
