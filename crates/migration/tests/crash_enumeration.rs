//! Crash safety by enumeration: for every durable effect of a refresh (each param written or
//! removed, each state or cache file written, each purged file, each install), crash right after
//! it, check what upstream modeld would load at that instant, then rerun and require the state
//! an uninterrupted run leaves. The effects are counted by the crate's own checkpoints
//! (`migration::Effects`, the one writer of device state, over its typed log of
//! `migration::state::effects::Effect`); the crash stops the refresh at once, as kill -9 would.

use std::collections::BTreeMap;

use crate::common::{Fixture, Origin, refresh};
use crate::upstream;
use crate::upstream::Load;
use migration::{Effects, Error, RefreshReport};

use crate::upstream_v26::BUNDLED;
use crate::v26_device::{V26, data_snapshot, v25_device_in, v26_device_in};
use std::fs;
use std::path::Path;

/// The starting devices: rich ones (two installs, both profiles) and a fallback.
type Params = &'static [(&'static str, &'static str)];

const STARTS: &[(&str, Params, bool)] = &[
    (
        "eGPU profile",
        &[
            ("Model", "big223"),
            ("DrivingModel", "big223"),
            ("ActiveSmallModel", "pop223"),
            ("ActiveBigModel", "big223"),
        ],
        true,
    ),
    (
        "legacy alias selection",
        &[("Model", "pop22"), ("DrivingModel", "pop22")],
        false,
    ),
    (
        "selection dropped from v25",
        &[("Model", "gone223"), ("DrivingModel", "gone223")],
        false,
    ),
];

/// What modeld may load right after a crash: the built-in, a verified v25 artifact, a local
/// model, or exactly what it loaded before the refresh started (the Python manager's state) —
/// never a missing file (a synchronous Python download) and never a half-migrated mix.
fn assert_modeld_safe(
    origin: &Origin,
    f: &Fixture,
    egpu: bool,
    before: &upstream::Modeld,
    ctx: &str,
) {
    let now = upstream::modeld(&f.data(), egpu);
    let slots = [
        (Some(&now.small), Some(&before.small)),
        (now.big.as_ref(), before.big.as_ref()),
    ];
    for (load, was) in slots {
        let Some(load) = load else { continue };
        if Some(load) == was {
            continue; // still what the Python manager left; the refresh has not touched it yet
        }
        match load {
            Load::BuiltIn => {}
            Load::File { id, path } if id.starts_with("local-") => assert!(path.is_file(), "{ctx}"),
            Load::File { id, path } => {
                let bytes = upstream::read_chunked(path).unwrap_or_default();
                assert_eq!(
                    test_support::published::sha256_hex(&bytes),
                    origin.sha(id),
                    "{ctx}: modeld would load {id} that is not the verified v25 artifact"
                );
            }
            Load::SyncDownload { id } => {
                panic!("{ctx}: modeld would find {id} missing and download it itself")
            }
        }
    }
}

/// One crash enumeration: `run` (a refresh under the given effects hook) on fresh devices from
/// `prepare`.
pub struct Enumeration<'a> {
    pub origin: &'a Origin,
    pub label: &'a str,
    pub prepare: &'a dyn Fn() -> Fixture,
    pub run: &'a dyn Fn(&Fixture, Effects) -> migration::Result<RefreshReport>,
    /// The run ends in an error, uninterrupted and on every rerun (an offline refresh).
    pub offline: bool,
    /// modeld runs with the external GPU (it loads the big profile too).
    pub egpu: bool,
    /// More checks right after each crash, before the rerun, given the uninterrupted run's end
    /// state ([`Fixture::snapshot`]); the `&str` names the crash.
    pub after_crash: &'a dyn Fn(&Fixture, &Snapshot, &str),
}

impl<'a> Enumeration<'a> {
    /// Online, no eGPU, no checks beyond the common ones.
    pub fn new(
        origin: &'a Origin,
        label: &'a str,
        prepare: &'a dyn Fn() -> Fixture,
        run: &'a dyn Fn(&Fixture, Effects) -> migration::Result<RefreshReport>,
    ) -> Self {
        Self {
            origin,
            label,
            prepare,
            run,
            offline: false,
            egpu: false,
            after_crash: &|_, _, _| {},
        }
    }
}

/// What the uninterrupted run did: its effects in order, and the state it ended in.
pub struct Uninterrupted {
    pub log: Vec<String>,
    pub end: Snapshot,
}

pub type Snapshot = BTreeMap<String, String>;

/// Run `e` uninterrupted, then for each of its effects: on a fresh device, crash right after
/// it, check what modeld would load at that instant (and `after_crash`), rerun, and require the
/// uninterrupted run's end state.
pub fn enumerate(e: &Enumeration) -> Uninterrupted {
    let label = e.label;
    let clean = (e.prepare)();
    let effects = Effects::recording();
    let r = (e.run)(&clean, effects.clone());
    assert_eq!(r.is_err(), e.offline, "{label}: {r:?}");
    let want = clean.snapshot();
    // The typed log, named as the crash report names each effect.
    let log: Vec<String> = effects.effects().iter().map(ToString::to_string).collect();
    assert!(!log.is_empty(), "{label}: no effects");
    for (n, what) in log.iter().enumerate() {
        let f = (e.prepare)();
        let before = upstream::modeld(&f.data(), e.egpu);
        let ctx = format!("{label}: crash after effect {n} ({what})");
        match (e.run)(&f, Effects::crash_after(n)) {
            Err(Error::Crashed { effect, .. }) => assert_eq!(effect, n, "{ctx}"),
            other => panic!("{ctx}: expected the simulated crash, got {other:?}"),
        }
        assert_modeld_safe(e.origin, &f, e.egpu, &before, &ctx);
        (e.after_crash)(&f, &want, &ctx);
        let r = (e.run)(&f, Effects::none());
        assert_eq!(r.is_err(), e.offline, "{ctx}: rerun {r:?}");
        assert_eq!(f.snapshot(), want, "{ctx}: rerun ends elsewhere");
    }
    Uninterrupted { log, end: want }
}

#[test]
fn a_crash_after_any_effect_then_a_rerun_ends_as_an_uninterrupted_refresh() {
    let origin = Origin::start();
    let run =
        |f: &Fixture, effects: Effects| refresh(&f.device_with(effects), &origin.downloader());
    let mut total = 0;
    for (name, params, egpu) in STARTS {
        let prepare = || {
            let f = Fixture::v24(params);
            if *egpu {
                f.plug_chestnut();
            }
            f
        };
        let Uninterrupted { log, .. } = enumerate(&Enumeration {
            egpu: *egpu,
            ..Enumeration::new(&origin, name, &prepare, &run)
        });
        assert!(
            log.len() > 20,
            "{name}: only {} effects: {log:?}",
            log.len()
        );
        for kind in [
            "param ",
            "write .model_artifacts.json",
            "remove ",
            "write .migration.json",
        ] {
            assert!(
                log.iter().any(|e| e.starts_with(kind)),
                "{name}: no {kind} in {log:?}"
            );
        }
        total += log.len();
    }
    eprintln!("crashed after each of {total} effects");
}

#[test]
fn a_crash_during_a_same_generation_repair_reruns_to_the_same_state() {
    let origin = Origin::start();
    let params: &[(&str, &str)] = &[("Model", "pop223"), ("DrivingModel", "pop223")];
    // Bring a device to v25, then delete its selected artifact and drop the model from the
    // UI's profile so the repair has params to rewrite as well as a model to fetch.
    let prepare = || {
        let f = origin.refreshed(params);
        std::fs::remove_file(f.models().join("pop223_driving_tinygrad.pkl")).unwrap();
        f.set("ActiveSmallModelName", "stale");
        f
    };
    let run =
        |f: &Fixture, effects: Effects| refresh(&f.device_with(effects), &origin.downloader());
    let Uninterrupted { log, .. } = enumerate(&Enumeration::new(&origin, "repair", &prepare, &run));
    assert!(log.iter().any(|e| e == "install pop223"), "{log:?}");
}

const T0: u64 = 1_000_000;

fn at(
    origin: &Origin,
    now: u64,
) -> impl Fn(&Fixture, Effects) -> migration::Result<RefreshReport> + '_ {
    move |f: &Fixture, effects: Effects| {
        migration::refresh(
            &f.device_with(effects),
            &migration::Run {
                now_unix: now,
                ..migration::Run::new(&origin.downloader())
            },
        )
    }
}

#[test]
fn an_offline_first_boot_survives_a_crash_after_any_effect_and_then_migrates_online() {
    let origin = Origin::start();
    let params: &[(&str, &str)] = &[
        ("Model", "pop22"),
        ("DrivingModel", "pop22"),
        ("ActiveSmallModel", "pop22"),
    ];
    let online_ref = Fixture::v24(params);
    at(&origin, T0)(&online_ref, Effects::none()).unwrap();
    origin.no_manifest();
    let n = enumerate(&Enumeration {
        offline: true,
        ..Enumeration::new(
            &origin,
            "offline first boot",
            &|| Fixture::v24(params),
            &at(&origin, T0),
        )
    })
    .log
    .len();
    assert!(n > 15, "{n}");
    // Every crashed-and-rerun offline device, once online, ends as one refreshed online at once
    // (checked on one; the offline end states are all equal to the clean one above).
    let f = Fixture::v24(params);
    at(&origin, T0)(&f, Effects::none()).unwrap_err();
    origin.server.clear_faults();
    at(&origin, T0)(&f, Effects::none()).unwrap();
    assert_eq!(f.snapshot(), online_ref.snapshot());
    eprintln!("offline first boot: crashed after each of {n} effects");
}

#[test]
fn a_temporary_fallback_and_its_switch_back_survive_a_crash_after_any_effect() {
    let origin = Origin::start();
    let sel: &[(&str, &str)] = &[("Model", "pop223"), ("DrivingModel", "pop223")];
    // 1. The fallback itself: the selected model is refused during the migration.
    origin.refuse("pop223");
    let n1 = enumerate(&Enumeration::new(
        &origin,
        "falling back",
        &|| Fixture::v24(sel),
        &at(&origin, T0),
    ))
    .log
    .len();
    // 2. The switch back: the model is served again, the retry is due.
    let fallen = || {
        let f = Fixture::v24(sel);
        origin.refuse("pop223");
        at(&origin, T0)(&f, Effects::none()).unwrap();
        origin.server.clear_faults();
        assert_eq!(f.param("Model").as_deref(), Some("rdf43"));
        f
    };
    origin.server.clear_faults();
    let n2 = enumerate(&Enumeration::new(
        &origin,
        "switching back",
        &fallen,
        &at(&origin, T0 + 300),
    ))
    .log
    .len();
    let f = fallen();
    at(&origin, T0 + 300)(&f, Effects::none()).unwrap();
    assert_eq!(f.param("Model").as_deref(), Some("pop223"));
    eprintln!("temporary fallback: crashed after each of {n1} + {n2} effects");
}

/// A named way to prepare a device directory.
type Start<'a> = (&'a str, &'a dyn Fn(&Path));

/// Crash safety by enumeration for the v25 → v26-contract move and for a v26 download (the
/// repair of a deleted install): crash right after each durable effect, check what upstream's
/// v26 code would see at that instant (modeld: the bundled model or a verified install of the
/// user's model; the saved selection: absent or the user's; a job file it accepts), rerun, and
/// require the uninterrupted run's end state. v26 and a made-up v27.
#[test]
fn the_move_and_a_v26_download_survive_a_crash_after_any_effect() {
    let mut total = 0;
    let mut jobs_crashed = 0;
    for generation in ["v26", "v27"] {
        let v = V26::start(generation);
        let rt = v.runtime();
        let run = |dir: &Path, effects: migration::Effects| {
            let (d, dl) = v.device_in(dir, effects);
            migration::refresh(&d, &migration::Run::new(&dl))
        };
        let migrated = |dir: &Path| {
            v25_device_in(dir);
            run(dir, migration::Effects::none()).unwrap();
        };
        let repair = |dir: &Path| {
            migrated(dir);
            let root = dir.join("data/models").join(generation);
            fs::remove_file(root.join("pop223/pop223_driving_tinygrad.pkl")).unwrap();
        };
        // The made-up v27 runs the moves only (from v25, and from a v26-contract v26): the
        // download's effects are the same code.
        let starts: [Start; 3] = [
            ("move", &v25_device_in),
            ("download", &repair),
            ("move from v26", &v26_device_in),
        ];
        let picked: Vec<Start> = match generation {
            "v26" => starts[..2].to_vec(),
            _ => vec![starts[0], starts[2]],
        };
        let starts = &picked[..];
        for &(label, prepare) in starts {
            let clean = tempfile::tempdir().unwrap();
            prepare(clean.path());
            let effects = migration::Effects::recording();
            run(clean.path(), effects.clone()).unwrap();
            let want = data_snapshot(clean.path());
            let log = effects.log();
            assert!(
                log.iter().any(|e| e == "install pop223"),
                "{generation} {label}: {log:?}"
            );
            // The job file is written through the effects: at the job's start (before the
            // install) and at its end, each a crash point.
            let job = format!("write {generation}/.download-job.json");
            let jobs: Vec<usize> = (0..log.len()).filter(|&i| log[i] == job).collect();
            let install = log.iter().position(|e| e == "install pop223").unwrap();
            assert!(
                jobs.len() >= 2 && jobs[0] < install && jobs[1] < install,
                "{generation} {label}: the job's start and end are not effects: {log:?}"
            );
            if label == "move" {
                for kind in [
                    format!("write {generation}/preferences.json"),
                    format!("write {generation}/catalog.json"),
                    "remove pop223_driving_tinygrad.pkl".to_string(),
                ] {
                    assert!(log.contains(&kind), "{generation}: no {kind} in {log:?}");
                }
                let install = log.iter().position(|e| e == "install pop223").unwrap();
                let purge = log
                    .iter()
                    .position(|e| e == "remove pop223_driving_tinygrad.pkl")
                    .unwrap();
                assert!(install < purge, "v25 files removed only after: {log:?}");
            }
            if label == "move from v26" {
                let install = log.iter().position(|e| e == "install pop223").unwrap();
                let purge = log
                    .iter()
                    .position(|e| e == "remove pop223_driving_tinygrad.pkl")
                    .unwrap_or_else(|| panic!("v26's artifacts are not removed: {log:?}"));
                assert!(install < purge, "v26 files removed only after: {log:?}");
                let v26 = clean.path().join("data/models/v26");
                assert!(!v26.join("pop223/pop223_driving_tinygrad.pkl").exists());
                assert!(!v26.join("sc2/sc2_driving_tinygrad.pkl").exists());
            }
            for (n, what) in log.iter().enumerate() {
                let t = tempfile::tempdir().unwrap();
                prepare(t.path());
                let ctx = format!("{generation} {label}: crash after effect {n} ({what})");
                match run(t.path(), migration::Effects::crash_after(n)) {
                    Err(migration::Error::Crashed { effect, .. }) => assert_eq!(effect, n, "{ctx}"),
                    other => panic!("{ctx}: expected the crash, got {other:?}"),
                }
                let root = t.path().join("data/models").join(generation);
                let sel = rt.resolve_runtime(&root, false);
                match sel.small_id.as_str() {
                    BUNDLED => {}
                    "pop223" => assert_eq!(
                        sel.small_sha.as_deref(),
                        Some(v.sha("pop223").as_str()),
                        "{ctx}"
                    ),
                    other => panic!("{ctx}: upstream would load {other}"),
                }
                if root.join("preferences.json").exists() {
                    assert_eq!(
                        rt.preferences(&root).small,
                        "pop223",
                        "{ctx}: the choice is kept"
                    );
                }
                if root.join(".download-job.json").exists() {
                    assert!(
                        rt.read_job(&root).is_some(),
                        "{ctx}: a job file upstream refuses"
                    );
                    // The crashed process holds no lock: upstream's UI shows no download
                    // running (ours, cut short, reads as interrupted) and may start its own.
                    let (busy, state) = rt.job_status(&root);
                    assert!(!busy, "{ctx}: the download lock is still held");
                    assert_ne!(state.as_deref(), Some("running"), "{ctx}");
                }
                if what.ends_with("/.download-job.json") {
                    jobs_crashed += 1;
                }
                run(t.path(), migration::Effects::none()).unwrap();
                assert_eq!(data_snapshot(t.path()), want, "{ctx}: rerun ends elsewhere");
                total += 1;
            }
            let root = clean.path().join("data/models").join(generation);
            assert_eq!(rt.resolve_runtime(&root, false).small_id, "pop223");
        }
    }
    assert!(
        jobs_crashed >= 8,
        "{jobs_crashed} crashes after a job-file write"
    );
    eprintln!(
        "v26 contract: crashed after each of {total} effects ({jobs_crashed} after a job-file \
         write), 0 violations"
    );
}
