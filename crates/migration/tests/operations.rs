//! refresh, install, gc, verify and the daemon's request protocol, in-process against the
//! fault-injecting server (no binary is spawned).

use crate::common;
use std::fs;
use std::sync::Mutex;

use crate::common::{Fixture, Origin, refresh, sha_of};
use downloader::CancelToken;
use manifest::ModelId;
use migration::run::daemon::{self, Request};
use migration::state::params::keys;
use migration::{FailReason, Progress, VerifyState};
use test_support::http_server::Fault;

/// The driver-facing text the daemon left in `ModelDownloadProgress`.
fn progress_text(device: &migration::Device) -> Option<String> {
    device
        .memory
        .get_str(keys::MODEL_DOWNLOAD_PROGRESS)
        .unwrap()
}

#[test]
fn refresh_falls_through_to_github_when_hugging_face_fails() {
    let origin = Origin::start();
    origin.server.add_fault(
        "/hf/manifests/model_names_v25.json",
        Fault::Status(500),
        None,
    );
    origin
        .server
        .add_fault("/hf/models/*", Fault::Status(503), None);
    let f = Fixture::v24(&[("Model", "pop223"), ("DrivingModel", "pop223")]);
    let r = refresh(&f.device(), &origin.downloader()).unwrap();
    assert!(
        r.manifest_origin.starts_with("GitHub"),
        "{}",
        r.manifest_origin
    );
    assert!(!r.fell_back_to_builtin);
    assert_eq!(
        sha_of(&f.models().join("pop223_driving_tinygrad.pkl")).as_deref(),
        Some(origin.sha("pop223"))
    );
}

#[test]
fn install_survives_a_truncated_chunk_and_reports_upstreams_texts() {
    let origin = Origin::start();
    let f = origin.refreshed(&[]);
    origin.server.add_fault(
        "/hf/models/v25/tr14223/tr14223_driving_tinygrad.pkl",
        Fault::Truncate(100),
        Some(1),
    );
    let seen = Mutex::new(Vec::new());
    let id: ModelId = "tr14223".parse().unwrap();
    migration::download_model(
        &f.device(),
        &origin.downloader(),
        &id,
        &CancelToken::new(),
        &|p| seen.lock().unwrap().push(p.clone()),
    )
    .unwrap();
    assert_eq!(
        sha_of(&f.models().join("tr14223_driving_tinygrad.pkl")).as_deref(),
        Some(origin.sha("tr14223"))
    );
    let seen = seen.into_inner().unwrap();
    assert!(seen.contains(&Progress::Verifying), "{seen:?}");
    assert_eq!(seen.last(), Some(&Progress::Downloaded));
    assert!(
        matches!(seen.first(), Some(Progress::Percent(_))),
        "{seen:?}"
    );

    for (raw, text) in [
        ("rdf", Progress::BuiltinAlreadyDownloaded),
        ("local-mine", Progress::LocalNothingToDownload),
    ] {
        let last = Mutex::new(None);
        let id: ModelId = raw.parse().unwrap();
        let r = migration::download_model(
            &f.device(),
            &origin.downloader(),
            &id,
            &CancelToken::new(),
            &|p| *last.lock().unwrap() = Some(p.clone()),
        )
        .unwrap();
        assert!(r.is_none());
        assert_eq!(last.into_inner().unwrap(), Some(text));
    }
}

#[test]
fn gc_removes_strays_and_unlisted_models_but_never_local_ones() {
    let origin = Origin::start();
    let f = origin.refreshed(&[("Model", "pop223"), ("DrivingModel", "pop223")]);
    for stray in [
        "tmpa1b2c3",
        "gone223_driving_tinygrad.pkl",
        "driving_policy_tinygrad.pkl",
    ] {
        fs::write(f.models().join(stray), b"x").unwrap();
    }
    // The Python manager's temporaries, left an hour ago (a young one would be kept).
    for t in ["tmpa1b2c3", "tmpk3j4h5"] {
        fs::File::options()
            .write(true)
            .open(f.models().join(t))
            .unwrap()
            .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(3600))
            .unwrap();
    }
    let mut removed = migration::gc(&f.device()).unwrap();
    removed.sort();
    assert_eq!(
        removed,
        [
            "driving_policy_tinygrad.pkl",
            "gone223_driving_tinygrad.pkl",
            "tmpa1b2c3",
            "tmpk3j4h5", // the Python manager's temporary, left by the fixture
        ]
    );
    for kept in [
        "pop223_driving_tinygrad.pkl",
        "local-mine_driving_tinygrad.pkl",
        "local-mine.json",
        "local-bare_model_driving_tinygrad.pkl",
        ".model_artifacts.json",
    ] {
        assert!(f.models().join(kept).exists(), "{kept}");
    }
}

#[test]
fn verify_passes_on_a_fully_installed_device_whose_catalog_lists_the_builtin() {
    let origin = Origin::start();
    let f = origin.refreshed(&[("Model", "pop223"), ("DrivingModel", "pop223")]);
    let device = f.device();
    let r = migration::report::verify(&device, None, false, &|_| {}).unwrap();
    assert!(r.all_verified(), "{r:?}");
    assert_eq!(r.models.len(), 1, "{r:?}");
    let one = migration::report::verify(&device, Some("rdf43"), false, &|_| {}).unwrap();
    assert!(one.all_verified());
    fs::write(f.models().join("pop223_driving_tinygrad.pkl"), b"bad").unwrap();
    let r = migration::report::verify(&device, None, false, &|_| {}).unwrap();
    assert_eq!(r.models[0].state, VerifyState::Corrupt);
    assert!(!r.all_verified());

    // status and resolve name the model from the catalog, not from a stale param.
    f.set(keys::DRIVING_MODEL_NAME, "a stale name");
    let s = migration::report::status(&device, crate::common::tree()).unwrap();
    assert_eq!(s.selected.name, "Pop");
    assert_eq!(s.selected.version, "v16");
    let resolved = migration::report::resolve(&device).unwrap();
    assert!(
        resolved.builtin,
        "a corrupt selection resolves to the built-in"
    );
    assert_eq!(resolved.model.name, "Regret Driven Framework V4");
}

#[test]
fn the_daemon_serves_one_request_clears_it_and_drops_a_stale_cancel() {
    let origin = Origin::start();
    let f = origin.refreshed(&[]);
    let device = f.device();
    let dl = origin.downloader();

    device.memory.put(keys::CANCEL_MODEL_DOWNLOAD, "1").unwrap();
    assert_eq!(common::poll_once(&device, &dl).unwrap(), None);
    assert_eq!(
        device.memory.get(keys::CANCEL_MODEL_DOWNLOAD).unwrap(),
        None
    );

    device
        .memory
        .put(keys::MODEL_TO_DOWNLOAD, "TR14223")
        .unwrap();
    let (req, last) = common::poll_once(&device, &dl).unwrap().unwrap();
    assert!(matches!(req, Request::Download { .. }));
    assert_eq!(last, Progress::Downloaded);
    assert_eq!(device.memory.get(keys::MODEL_TO_DOWNLOAD).unwrap(), None);
    assert_eq!(progress_text(&device).as_deref(), Some("Downloaded!"));

    // An old alias of a catalog id is canonicalised before it is looked up.
    device.memory.put(keys::MODEL_TO_DOWNLOAD, "rdf").unwrap();
    let (_, last) = common::poll_once(&device, &dl).unwrap().unwrap();
    assert_eq!(last, Progress::BuiltinAlreadyDownloaded);

    device.memory.put(keys::DOWNLOAD_ALL_MODELS, "1").unwrap();
    let (req, last) = common::poll_once(&device, &dl).unwrap().unwrap();
    assert_eq!(req, Request::DownloadAll);
    assert_eq!(last, Progress::AllDownloaded);
    assert!(f.models().join("pop223_driving_tinygrad.pkl").is_file());
    assert!(
        !f.models().join("big223_driving_tinygrad.pkl").exists(),
        "download-all skips eGPU models"
    );

    device
        .memory
        .put(keys::MODEL_TO_DOWNLOAD, "gone223")
        .unwrap();
    let (_, last) = common::poll_once(&device, &dl).unwrap().unwrap();
    assert_eq!(last, Progress::Failed(FailReason::NotInList));
    assert_eq!(device.memory.get(keys::MODEL_TO_DOWNLOAD).unwrap(), None);
}

/// Regression (issue 15): "download all" on a device that never got this generation's catalog
/// left the operator's hint "no v25 catalog on this device yet; run `refresh` while online" in
/// `ModelDownloadProgress`, which the driver reads. The origin is down as well.
#[test]
fn requests_without_a_catalog_leave_driver_texts_not_cli_hints() {
    let origin = Origin::start();
    origin.server.add_fault("/*", Fault::Status(503), None);
    let f = Fixture::v24(&[("Model", "pop223"), ("DrivingModel", "pop223")]);
    let device = f.device();
    let dl = origin.downloader();
    // Served directly (`daemon::serve`, no offline retry around it): the catalog is missing.
    let last = daemon::serve(&device, &dl, &Request::DownloadAll, &CancelToken::new());
    assert_eq!(last, Progress::Failed(FailReason::NoModelList));
    assert_eq!(
        progress_text(&device).as_deref(),
        Some("Download failed: model list not downloaded yet")
    );
    // Through the daemon's poll: offline is kept for a retry, a bad id ends the request.
    for (key, value, want) in [
        (
            keys::MODEL_TO_DOWNLOAD,
            "pop223",
            "Hugging Face and GitHub are offline...",
        ),
        (
            keys::MODEL_TO_DOWNLOAD,
            "not a model!",
            "Download failed: not a model name",
        ),
    ] {
        device.memory.put(key, value).unwrap();
        let (_, last) = common::poll_once(&device, &dl).unwrap().unwrap();
        let shown = progress_text(&device).unwrap();
        assert_eq!(shown, last.to_string());
        assert_eq!(shown, want, "{key}={value}");
        device.memory.remove(key).unwrap();
    }
}

#[test]
fn a_republish_in_progress_keeps_the_selection_for_the_next_refresh() {
    let origin = Origin::start();
    // The origins' chunks do not match the manifest yet (a republish between its steps).
    for prefix in ["/hf/models/v25/pop223/", "/gh/v25/pop223/"] {
        for chunk in ["chunk01of03", "chunk02of03", "chunk03of03"] {
            origin.server.add_fault(
                &format!("{prefix}pop223_driving_tinygrad.pkl.{chunk}"),
                Fault::Body(vec![7u8; common::CHUNK]),
                None,
            );
        }
    }
    let f = Fixture::v24(&[("Model", "pop223"), ("DrivingModel", "pop223")]);
    let device = f.device();
    let err = refresh(&device, &origin.downloader())
        .expect_err("the artifact does not match its manifest yet");
    assert!(
        matches!(&err, migration::Error::Download(e) if e.is_not_yet()),
        "{err}"
    );
    // Mid-migration: the journal keeps pop223, everything modeld reads says the built-in.
    let journal = migration::read_journal(&device)
        .unwrap()
        .expect("journal kept");
    assert_eq!(journal.selected.as_str(), "pop223");
    assert_eq!(f.param("ActiveSmallModel").as_deref(), Some("rdf43"));
    assert_eq!(f.param("ModelManifestVersion").as_deref(), Some("v24"));
    assert!(migration::report::resolve(&device).unwrap().builtin);

    // The republish finished: the next refresh installs pop223 and selects it again.
    origin.server.clear_faults();
    let r = refresh(&device, &origin.downloader()).unwrap();
    assert_eq!(r.selected.as_str(), "pop223");
    assert!(!r.fell_back_to_builtin);
    assert_eq!(f.param("ActiveSmallModel").as_deref(), Some("pop223"));
    assert_eq!(
        sha_of(&f.models().join("pop223_driving_tinygrad.pkl")).as_deref(),
        Some(origin.sha("pop223"))
    );
}
