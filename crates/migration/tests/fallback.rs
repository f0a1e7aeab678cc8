//! A fallback is temporary, an offline first boot purges the old generation, and state reads
//! are bounded: each against the fault-injecting server on 127.0.0.1, in-process.

use crate::upstream;
use std::fs;
use std::sync::Mutex;

use crate::common::{Fixture, Origin, sha_of};
use migration::report::PendingCase;
use migration::{Progress, VerifyState};

const T0: u64 = 1_000_000;
const SEL_POP: &[(&str, &str)] = &[("Model", "pop223"), ("DrivingModel", "pop223")];

fn refresh_at(
    f: &Fixture,
    origin: &Origin,
    now: u64,
) -> (migration::Result<migration::RefreshReport>, Vec<Progress>) {
    let seen = Mutex::new(Vec::new());
    let r = migration::refresh(
        &f.device(),
        &migration::Run {
            progress: &|p| seen.lock().unwrap().push(p.clone()),
            now_unix: now,
            ..migration::Run::new(&origin.downloader())
        },
    );
    (r, seen.into_inner().unwrap())
}

fn pop_requests(origin: &Origin) -> usize {
    origin
        .server
        .requests()
        .iter()
        .filter(|r| r.path.contains("/pop223/"))
        .count()
}

#[test]
fn a_failed_download_falls_back_for_now_is_retried_with_backoff_and_switches_back_offroad() {
    let origin = Origin::start();
    origin.refuse("pop223");
    let f = Fixture::v24(SEL_POP);

    // Migration with the selected model refused by both origins: the built-in stands in.
    let (r, seen) = refresh_at(&f, &origin, T0);
    let r = r.unwrap();
    assert!(r.fell_back_to_builtin);
    assert_eq!(r.retrying, ["pop223"]);
    assert!(r.dropped.is_empty());
    assert!(seen.contains(&Progress::SelectedRetrying), "{seen:?}");
    assert!(!seen.contains(&Progress::SelectedUnavailable), "{seen:?}");
    assert_eq!(
        Progress::SelectedRetrying.to_string(),
        "Selected model download failed; using built-in model until it downloads."
    );
    assert_eq!(f.param("Model").as_deref(), Some("rdf43"));
    assert_eq!(
        upstream::modeld(&f.data(), false).small,
        upstream::Load::BuiltIn
    );
    let s = migration::report::status(&f.device(), crate::common::tree()).unwrap();
    let fb = s.fallback.expect("choice recorded");
    assert_eq!(fb.chosen.selection.as_deref(), Some("pop223"));
    assert_eq!(fb.pending.len(), 1);
    assert_eq!(fb.pending[0].case, PendingCase::Temporary);
    assert_eq!(fb.pending[0].failures, 1);
    assert_eq!(fb.pending[0].next_retry, T0 + 300);

    // Before the backoff ends, a refresh does not ask for the model at all.
    origin.server.clear_requests();
    let (r, _) = refresh_at(&f, &origin, T0 + 299);
    assert_eq!(r.unwrap().retrying, ["pop223"]);
    assert_eq!(pop_requests(&origin), 0, "retried before the backoff ended");

    // Due, still refused: one more failure, the wait doubles.
    let (r, _) = refresh_at(&f, &origin, T0 + 300);
    assert!(r.unwrap().fell_back_to_builtin);
    assert!(pop_requests(&origin) > 0);
    let fb = migration::report::status(&f.device(), crate::common::tree())
        .unwrap()
        .fallback
        .unwrap();
    assert_eq!(
        (fb.pending[0].failures, fb.pending[0].next_retry),
        (2, T0 + 300 + 600)
    );

    // The origin serves it again, but the car is onroad: a refresh is deferred (only offroad),
    // nothing is fetched or changed.
    origin.server.clear_faults();
    origin.server.clear_requests();
    f.set("IsOnroad", "1");
    let (r, _) = refresh_at(&f, &origin, T0 + 900);
    assert!(matches!(r, Err(migration::Error::Onroad { .. })), "{r:?}");
    assert!(origin.server.requests().is_empty(), "fetched while onroad");
    assert_eq!(f.param("Model").as_deref(), Some("rdf43"));

    // Offroad at the start, but the car goes onroad while the model downloads: downloaded and
    // verified, not switched.
    f.set("IsOnroad", "0");
    let r = migration::refresh(
        &f.device(),
        &migration::Run {
            progress: &|p| {
                if matches!(p, Progress::Percent(_) | Progress::Verifying) {
                    f.set("IsOnroad", "1");
                }
            },
            now_unix: T0 + 900,
            ..migration::Run::new(&origin.downloader())
        },
    );
    let r = r.unwrap();
    assert_eq!(r.selected.as_str(), "rdf43", "no switch while onroad");
    assert_eq!(f.param("Model").as_deref(), Some("rdf43"));
    assert_eq!(
        sha_of(&f.models().join("pop223_driving_tinygrad.pkl")).as_deref(),
        Some(origin.sha("pop223"))
    );

    // Offroad: the next refresh switches back, without downloading again.
    f.set("IsOnroad", "0");
    origin.server.clear_requests();
    let (r, _) = refresh_at(&f, &origin, T0 + 901);
    let r = r.unwrap();
    assert_eq!(r.selected.as_str(), "pop223");
    assert!(!r.fell_back_to_builtin && r.retrying.is_empty());
    assert_eq!(pop_requests(&origin), 0);
    for k in ["Model", "DrivingModel", "ActiveSmallModel"] {
        assert_eq!(f.param(k).as_deref(), Some("pop223"), "{k}");
    }
    assert!(matches!(
        upstream::modeld(&f.data(), false).small,
        upstream::Load::File { ref id, .. } if id == "pop223"
    ));
    assert!(
        migration::report::status(&f.device(), crate::common::tree())
            .unwrap()
            .fallback
            .unwrap()
            .pending
            .is_empty()
    );
}

#[test]
fn a_same_generation_repair_that_fails_keeps_the_choice_and_a_new_pick_replaces_it() {
    let origin = Origin::start();
    let f = Fixture::v24(SEL_POP);
    refresh_at(&f, &origin, T0).0.unwrap();
    // The installed model is lost and the origins answer 404 (issue 9's lost choice).
    fs::remove_file(f.models().join("pop223_driving_tinygrad.pkl")).unwrap();
    origin.refuse("pop223");
    let r = refresh_at(&f, &origin, T0 + 10).0.unwrap();
    assert_eq!(r.selected.as_str(), "rdf43");
    assert_eq!(r.retrying, ["pop223"]);
    let fb = migration::report::status(&f.device(), crate::common::tree())
        .unwrap()
        .fallback
        .unwrap();
    assert_eq!(fb.chosen.selection.as_deref(), Some("pop223"));

    // The user picks tr14223 in the UI while pop223 is pending: that is the choice now.
    f.set("Model", "tr14223");
    f.set("DrivingModel", "tr14223");
    f.set("ActiveSmallModel", "tr14223");
    let r = refresh_at(&f, &origin, T0 + 20).0.unwrap();
    assert_eq!(r.selected.as_str(), "tr14223");
    assert!(!r.fell_back_to_builtin && r.retrying.is_empty());
    origin.server.clear_faults();
    let r = refresh_at(&f, &origin, T0 + 100_000).0.unwrap();
    assert_eq!(
        r.selected.as_str(),
        "tr14223",
        "the old choice does not come back"
    );
}

#[test]
fn a_model_absent_from_the_catalog_is_dropped_for_good_and_status_says_so() {
    let origin = Origin::start();
    let f = Fixture::v24(&[("Model", "gone223"), ("DrivingModel", "gone223")]);
    let (r, seen) = refresh_at(&f, &origin, T0);
    let r = r.unwrap();
    assert!(r.fell_back_to_builtin);
    assert_eq!(r.dropped, ["gone223"]);
    assert!(r.retrying.is_empty());
    assert!(seen.contains(&Progress::SelectedUnavailable), "{seen:?}");
    let fb = migration::report::status(&f.device(), crate::common::tree())
        .unwrap()
        .fallback
        .unwrap();
    assert_eq!(fb.dropped, ["gone223"]);
    assert_eq!(fb.chosen.selection.as_deref(), Some("rdf43"));
    assert!(fb.pending.is_empty());
}

#[test]
fn a_republished_model_is_fetched_and_switched_to_keeping_the_verified_old_copy_meanwhile() {
    let mut origin = Origin::start();
    let f = Fixture::v24(SEL_POP);
    refresh_at(&f, &origin, T0).0.unwrap();
    let old = origin.sha("pop223").to_string();
    origin.republish("pop223", 42);
    assert_ne!(old, origin.sha("pop223"));
    origin.refuse("pop223");

    let (r, seen) = refresh_at(&f, &origin, T0 + 10);
    let r = r.unwrap();
    assert_eq!(r.selected.as_str(), "pop223", "the old copy stays in use");
    assert!(!r.fell_back_to_builtin);
    assert_eq!(r.retrying, ["pop223"]);
    assert!(seen.contains(&Progress::UpdateRetrying), "{seen:?}");
    let device = f.device();
    let s = migration::report::status(&device, crate::common::tree()).unwrap();
    assert_eq!(s.installed[0].state, VerifyState::Outdated, "never corrupt");
    assert_eq!(
        s.fallback.unwrap().pending[0].case,
        PendingCase::Update,
        "status says an update is pending"
    );
    let resolved = migration::report::resolve(&device).unwrap();
    assert!(!resolved.builtin);
    assert_eq!(sha_of(&resolved.path).as_deref(), Some(old.as_str()));

    // The new bytes are served: downloaded, verified, switched to.
    origin.server.clear_faults();
    let r = refresh_at(&f, &origin, T0 + 10 + 300).0.unwrap();
    assert!(r.retrying.is_empty());
    assert_eq!(
        sha_of(&f.models().join("pop223_driving_tinygrad.pkl")).as_deref(),
        Some(origin.sha("pop223"))
    );
    let s = migration::report::status(&device, crate::common::tree()).unwrap();
    assert_eq!(s.installed[0].state, VerifyState::Verified);
}

#[test]
fn an_offline_first_boot_purges_the_old_generation_and_the_first_online_refresh_restores_the_choice()
 {
    let origin = Origin::start();
    // The same device, refreshed online right away, is the reference end state.
    let params: &[(&str, &str)] = &[
        ("Model", "pop22"),
        ("DrivingModel", "pop22"),
        ("ActiveSmallModel", "pop22"),
        ("ActiveBigModel", "big223"),
    ];
    let online = Fixture::v24(params);
    refresh_at(&online, &origin, T0).0.unwrap();

    let f = Fixture::v24(params);
    origin.no_manifest();
    let (r, _) = refresh_at(&f, &origin, T0);
    let e = r.expect_err("offline");
    assert!(
        matches!(
            e,
            migration::Error::Download(downloader::Error::ManifestUnavailable { .. })
        ),
        "{e}"
    );
    // No driving artifact of v24 is left; local models and DM files are.
    let left: Vec<String> = fs::read_dir(f.models())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("_driving_") || n.starts_with("driving_"))
        .collect();
    let mut left = left;
    left.sort();
    assert_eq!(
        left,
        [
            "local-bare_model_driving_tinygrad.pkl",
            "local-mine_driving_tinygrad.pkl"
        ]
    );
    assert!(f.models().join("dmonitoring_model_tinygrad.pkl").exists());
    // Everything modeld and the UIs read names the built-in (and the local models).
    for k in ["Model", "DrivingModel", "ActiveSmallModel"] {
        assert_eq!(f.param(k).as_deref(), Some("rdf43"), "{k}");
    }
    assert_eq!(f.param("ActiveBigModel"), None);
    assert_eq!(
        f.param("AvailableModels").as_deref(),
        Some("rdf43,local-bare_model,local-mine")
    );
    let artifacts = fs::read_to_string(f.models().join(".model_artifacts.json")).unwrap();
    assert!(
        !artifacts.contains("pop223") && !artifacts.contains("gone223"),
        "{artifacts}"
    );
    assert_eq!(f.param("ModelManifestVersion").as_deref(), Some("v24"));
    assert_eq!(
        upstream::modeld(&f.data(), true).small,
        upstream::Load::BuiltIn
    );
    assert!(upstream::modeld(&f.data(), true).big.is_none());
    let device = f.device();
    let resolved = migration::report::resolve(&device).unwrap();
    assert!(resolved.builtin && resolved.doubt.is_none());
    // A second offline boot changes nothing.
    let before = f.snapshot();
    refresh_at(&f, &origin, T0).0.unwrap_err();
    assert_eq!(f.snapshot(), before);

    // Online: the user's model (pre-v23 alias, eGPU profile) is downloaded and selected, and the
    // device ends exactly as one refreshed online from the start.
    origin.server.clear_faults();
    let r = refresh_at(&f, &origin, T0).0.unwrap();
    assert_eq!(r.selected.as_str(), "pop223");
    assert_eq!(f.param("ActiveBigModel").as_deref(), Some("big223"));
    assert_eq!(f.snapshot(), online.snapshot());
}

#[test]
fn a_compact_manifest_just_under_the_limit_is_stored_as_received_and_read_back() {
    let origin = Origin::start();
    // Pad the served manifest with listed, artifact-less models (long names, so there are only
    // a few thousand) until its compact form is just under 2 MiB; pretty-printed it would be
    // above.
    let mut m = origin.manifest.clone();
    let limit = manifest::Limits::DEFAULT_MAX_MANIFEST_BYTES as usize;
    let mut len = serde_json::to_vec(&m).unwrap().len();
    let mut n = 0;
    while len < limit - 1200 {
        let pad = serde_json::json!({"id": format!("pad{n:05}"), "name": "P".repeat(1000), "version": "v1"});
        len += serde_json::to_vec(&pad).unwrap().len() + 1;
        m["models"].as_array_mut().unwrap().push(pad);
        n += 1;
    }
    let models = m["models"].as_array_mut().unwrap();
    let last = models.last_mut().unwrap();
    let short = limit - 1 - len;
    last["name"] = serde_json::json!("P".repeat(1000 + short));
    let body = serde_json::to_vec(&m).unwrap();
    assert_eq!(body.len(), limit - 1);
    assert!(serde_json::to_vec_pretty(&m).unwrap().len() > limit);
    test_support::published::write_manifest(&origin.dir.path().join("origin"), "v25", &body);

    let f = Fixture::v24(SEL_POP);
    refresh_at(&f, &origin, T0).0.unwrap();
    assert_eq!(fs::read(f.models().join(".catalog.json")).unwrap(), body);
    let device = f.device();
    assert!(device.catalog().unwrap().is_some(), "read back");
    let r = refresh_at(&f, &origin, T0 + 1).0.unwrap();
    assert_eq!(r.selected.as_str(), "pop223");
    let resolved = migration::report::resolve(&device).unwrap();
    assert!(!resolved.builtin, "{resolved:?}");
}

#[test]
fn resolve_answers_the_builtin_when_in_doubt_and_fails_only_without_it() {
    let origin = Origin::start();
    let f = Fixture::v24(SEL_POP);
    refresh_at(&f, &origin, T0).0.unwrap();
    let device = f.device();
    assert!(!migration::report::resolve(&device).unwrap().builtin);

    let params = f.data().join("params/d");
    // A 1 GiB param (sparse): refused by size, never read.
    let big = fs::File::create(params.join("DrivingModel")).unwrap();
    big.set_len(1 << 30).unwrap();
    let r = migration::report::resolve(&device).unwrap();
    assert!(r.builtin && r.path == device.builtin_path(), "{r:?}");
    assert!(r.doubt.as_deref().unwrap().contains("limit"), "{r:?}");
    // The manager rewrites it on the next refresh.
    drop(big);
    fs::remove_file(params.join("DrivingModel")).unwrap();
    f.set("DrivingModel", "pop223");

    // Corrupt or oversized state files: still the built-in, with the reason.
    for (name, body) in [
        (".catalog.json", b"{not json".to_vec()),
        (".migration.json", b"[]".to_vec()),
    ] {
        let p = f.models().join(name);
        let saved = fs::read(&p).ok();
        fs::write(&p, &body).unwrap();
        let r = migration::report::resolve(&device).unwrap();
        // A corrupt catalog is a doubt; any journal at all means "mid-migration": the built-in.
        assert!(r.builtin, "{name}: {r:?}");
        assert_eq!(r.doubt.is_some(), name == ".catalog.json", "{name}: {r:?}");
        match saved {
            Some(b) => fs::write(&p, b).unwrap(),
            None => fs::remove_file(&p).unwrap(),
        }
    }
    let verified = f.models().join(".verified.json");
    fs::File::create(&verified)
        .unwrap()
        .set_len(migration::state::bounded::VERIFIED_LIMIT + 1)
        .unwrap();
    // An oversized verification cache is ignored (re-hash), not trusted and not fatal.
    assert!(!migration::report::resolve(&device).unwrap().builtin);

    // Without the built-in there is nothing safe to answer.
    fs::remove_dir_all(f.builtin()).unwrap();
    fs::write(f.models().join(".migration.json"), b"[]").unwrap();
    assert!(matches!(
        migration::report::resolve(&device),
        Err(migration::Error::BuiltinMissing { .. })
    ));
}
