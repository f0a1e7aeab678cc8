//! The real `device-modeld-manager` binary against a real HTTP server on 127.0.0.1, on a
//! temporary data dir with the comma's layout.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use test_support::http_server::{Fault, FaultServer};
use test_support::published::{artifact_bytes, manifest_json, publish_model, write_manifest};

const CHUNK: usize = 256 * 1024;

struct World {
    device: Device,
    server: FaultServer,
    pop_new: Vec<u8>,
    other_new: Vec<u8>,
}

impl std::ops::Deref for World {
    type Target = Device;
    fn deref(&self) -> &Device {
        &self.device
    }
}

impl World {
    fn cmd(&self, args: &[&str]) -> Command {
        self.command(&self.server.url(), args)
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }
}

/// A v24 device (selected `pop223`, old artifacts in every form, a local model, a DM file) and
/// a server publishing the v25 catalog with `pop223` and `other` as chunk sets.
fn world(size: usize) -> World {
    let device = Device::new();
    let root = device.dir.path().join("origin");
    fs::create_dir_all(&root).unwrap();
    let pop_new = artifact_bytes(25, size);
    let other_new = artifact_bytes(26, size / 2 + 17);
    let p = publish_model(&root, "v25", "pop223", &pop_new, Some(CHUNK));
    let o = publish_model(&root, "v25", "other", &other_new, Some(CHUNK));
    write_manifest(&root, "v25", manifest_json("v25", &[p, o], true).as_bytes());
    let server = FaultServer::start(&root).unwrap();
    device.make_v24(
        &[
            "pop223_driving_tinygrad.pkl",
            "pop223_driving_tinygrad.pkl.p00",
            "pop223_driving_tinygrad.pkl.sha256",
            "other_driving_tinygrad.pkl.chunk01of02",
            "other_driving_tinygrad.pkl.chunk02of02",
            "other_driving_tinygrad.pkl.chunkmanifest",
            "driving_vision_tinygrad.pkl",
            "local-test_driving_tinygrad.pkl",
            "dmonitoring_model_tinygrad.pkl",
        ],
        "2",
    );
    World {
        device,
        server,
        pop_new,
        other_new,
    }
}

fn last_line(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

/// The invariants that must hold after any run that completed, whatever crashed before it.
fn assert_consistent(w: &World, context: &str) {
    let files = w.model_files();
    assert!(
        !files.iter().any(|f| f == ".migration.json"),
        "{context}: journal left: {files:?}"
    );
    for f in &files {
        let driving = f.contains("_driving_") || f.starts_with("driving_");
        if driving && !f.starts_with("local-") && !f.starts_with(".tmp-") {
            assert_eq!(
                f, "pop223_driving_tinygrad.pkl",
                "{context}: old artifact {f} survived"
            );
            assert_eq!(
                fs::read(w.models().join(f)).unwrap(),
                w.pop_new,
                "{context}: {f} is not the v25 artifact"
            );
        }
    }
    assert_eq!(
        fs::read(w.models().join("local-test_driving_tinygrad.pkl")).unwrap(),
        b"old",
        "{context}"
    );
    assert_eq!(
        fs::read(w.models().join("dmonitoring_model_tinygrad.pkl")).unwrap(),
        b"old",
        "{context}"
    );
    let model = w.param("Model").unwrap();
    assert_eq!(Some(model.clone()), w.param("DrivingModel"), "{context}");
    assert_eq!(
        w.param("ModelVersion"),
        w.param("DrivingModelVersion"),
        "{context}"
    );
    assert_eq!(
        w.param("ModelManifestVersion").as_deref(),
        Some("v25"),
        "{context}"
    );
    let resolved = last_line(&w.run(&["resolve"]));
    match model.as_str() {
        "pop223" => {
            assert_eq!(
                w.param("DrivingModelName").as_deref(),
                Some("Model pop223"),
                "{context}"
            );
            assert_eq!(
                PathBuf::from(&resolved),
                w.models().join("pop223_driving_tinygrad.pkl"),
                "{context}"
            );
        }
        "rdf43" => {
            assert_eq!(
                w.param("DrivingModelName").as_deref(),
                Some("Regret Driven Framework V4"),
                "{context}"
            );
            assert_eq!(w.param("ModelVersion").as_deref(), Some("v15"), "{context}");
            assert_eq!(
                PathBuf::from(&resolved),
                w.builtin().join("driving_tinygrad.pkl"),
                "{context}"
            );
        }
        other => panic!("{context}: unexpected selection {other}"),
    }
}

#[test]
fn refresh_migrates_v24_to_v25_keeping_the_selection() {
    let w = world(3 * CHUNK + 1000);
    let out = w.run(&["refresh", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["migrated_from"], "v24");
    assert_eq!(report["selected"], "pop223");
    assert_eq!(report["fell_back_to_builtin"], false);
    assert_consistent(&w, "plain run");
    assert_eq!(
        w.model_files()
            .iter()
            .filter(|f| f.contains("other_"))
            .count(),
        0
    );
    // The catalog, then the device's local models (upstream lists them so the UI can pick one).
    assert_eq!(
        w.param("AvailableModels").as_deref(),
        Some("pop223,other,local-test")
    );
    // Only v25 versioned paths were ever requested.
    assert!(
        w.server.requests().iter().all(|r| r.path.contains("v25")),
        "{:?}",
        w.server.requests()
    );

    // Second refresh: nothing to migrate, nothing downloaded again.
    w.server.clear_requests();
    assert!(w.run(&["refresh"]).status.success());
    assert!(
        w.server
            .requests()
            .iter()
            .all(|r| r.path.ends_with(".json"))
    );

    let status = w.run(&["status", "--json"]);
    let s: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(s["selected"]["id"], "pop223");
    assert_eq!(s["installed"][0]["state"], "verified");
    assert!(s["interrupted_migration"].is_null());

    // A same-size corruption is caught by verify (and resolve then falls back).
    let path = w.models().join("pop223_driving_tinygrad.pkl");
    let mut bytes = fs::read(&path).unwrap();
    bytes[10] ^= 1;
    fs::write(&path, bytes).unwrap();
    let v = w.run(&["verify", "pop223"]);
    assert_eq!(v.status.code(), Some(6));
    assert_eq!(
        PathBuf::from(last_line(&w.run(&["resolve"]))),
        w.builtin().join("driving_tinygrad.pkl")
    );
}

#[test]
fn unavailable_selection_falls_back_to_builtin() {
    let w = world(2 * CHUNK);
    w.server
        .add_fault("/hf/models/v25/pop223/*", Fault::Status(404), None);
    w.server
        .add_fault("/gh/v25/pop223/*", Fault::Status(500), None);
    let out = w.run(&["refresh", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["fell_back_to_builtin"], true);
    assert_eq!(w.param("Model").as_deref(), Some("rdf43"));
    assert_consistent(&w, "fallback");
}

#[test]
fn both_origins_offline_purges_the_old_generation_and_the_next_online_refresh_migrates() {
    let w = world(CHUNK);
    w.server.add_fault("/*", Fault::Status(503), None);
    let out = w.run(&["refresh"]);
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("now uses the built-in model"));
    // The offline first boot: no v24 pickle left, the built-in named, the choice journaled.
    assert_eq!(w.param("ModelManifestVersion").as_deref(), Some("v24"));
    assert!(
        !w.model_files()
            .iter()
            .any(|n| n.starts_with("pop223_driving")),
        "{:?}",
        w.model_files()
    );
    assert_eq!(w.param("Model").as_deref(), Some("rdf43"));
    assert_eq!(
        PathBuf::from(last_line(&w.run(&["resolve"]))),
        w.builtin().join("driving_tinygrad.pkl")
    );
    // Online again: the user's model comes back.
    w.server.clear_faults();
    let out = w.run(&["refresh"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(w.param("Model").as_deref(), Some("pop223"));
    assert_eq!(w.param("ModelManifestVersion").as_deref(), Some("v25"));
    assert_consistent(&w, "offline first boot, then online");
}

#[test]
fn second_manager_is_busy() {
    let w = world(CHUNK);
    let _held = migration::ManagerLock::acquire(&w.models()).unwrap();
    let out = w.run(&["refresh"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("another model manager is running"));
    assert_eq!(w.param("ModelManifestVersion").as_deref(), Some("v24"));
}

#[test]
fn gc_removes_strays_but_never_local_models() {
    let w = world(CHUNK);
    assert!(w.run(&["refresh"]).status.success());
    fs::write(w.models().join(".tmp-123-0-x"), b"stray").unwrap();
    fs::write(w.models().join("gone_driving_tinygrad.pkl"), b"x").unwrap();
    let out = w.run(&["gc", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["removed"],
        serde_json::json!([".tmp-123-0-x", "gone_driving_tinygrad.pkl"])
    );
    assert!(w.models().join("local-test_driving_tinygrad.pkl").exists());
    assert!(w.models().join("pop223_driving_tinygrad.pkl").exists());
}

#[test]
fn daemon_serves_download_requests_and_clears_them() {
    let w = world(CHUNK);
    w.set_mem("CancelModelDownload", "1"); // stale: must not cancel the next download
    let mut child = w
        .cmd(&["run", "--poll-ms", "20"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("migration", Duration::from_secs(30), || {
        w.param("ModelManifestVersion").as_deref() == Some("v25")
    });
    wait_for("stale cancel cleared", Duration::from_secs(30), || {
        w.mem("CancelModelDownload").is_none()
    });
    w.set_mem("ModelToDownload", "other");
    wait_for("download", Duration::from_secs(30), || {
        w.mem("ModelDownloadProgress").as_deref() == Some("Downloaded!")
    });
    wait_for("request cleared", Duration::from_secs(30), || {
        w.mem("ModelToDownload").is_none()
    });
    assert_eq!(
        fs::read(w.models().join("other_driving_tinygrad.pkl")).unwrap(),
        w.other_new
    );

    w.set_mem("ModelToDownload", "nosuchmodel");
    wait_for("failure text", Duration::from_secs(30), || {
        w.mem("ModelDownloadProgress")
            .is_some_and(|p| p.starts_with("Download failed"))
    });
    wait_for("request cleared", Duration::from_secs(30), || {
        w.mem("ModelToDownload").is_none()
    });
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Kill the real binary with SIGKILL at many instants of a migration, re-run it, and check the
/// device always ends in the same consistent state.
#[test]
fn kill_9_at_any_point_then_rerun_is_consistent() {
    let size = 6 * CHUNK + 333;
    // Measure one slow, uninterrupted run to spread the kill points over it.
    let probe = world(size);
    probe.server.set_rate_per_conn(Some(1024 * 1024));
    probe.server.set_latency(Duration::from_millis(15));
    let start = Instant::now();
    assert!(probe.run(&["refresh"]).status.success());
    let total = start.elapsed();
    assert_consistent(&probe, "probe");

    let points = 14;
    for k in 0..points {
        let w = world(size);
        w.server.set_rate_per_conn(Some(1024 * 1024));
        w.server.set_latency(Duration::from_millis(15));
        let delay = total.mul_f64(k as f64 / points as f64);
        let mut child = w
            .cmd(&["refresh"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL
        child.wait().unwrap();
        // Whatever state the kill left must never make resolve return an unverified file.
        let resolved = PathBuf::from(last_line(&w.run(&["resolve"])));
        if resolved != w.builtin().join("driving_tinygrad.pkl") {
            assert_eq!(fs::read(&resolved).unwrap(), w.pop_new, "kill at {delay:?}");
        }
        w.server.set_rate_per_conn(None);
        let out = w.run(&["refresh"]);
        assert!(
            out.status.success(),
            "rerun after kill at {delay:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_consistent(&w, &format!("kill at {delay:?}"));
        assert_eq!(
            w.param("Model").as_deref(),
            Some("pop223"),
            "kill at {delay:?}"
        );
    }
}

/// Regression: the UI replaced `ModelToDownload` while another download ran, and the daemon
/// cleared the new request along with the old one, so the second model was never downloaded.
#[test]
fn a_request_replaced_during_a_download_is_served_next_not_dropped() {
    let w = world(4 * CHUNK);
    assert!(w.run(&["refresh"]).status.success());
    let pop = w.models().join("pop223_driving_tinygrad.pkl");
    fs::remove_file(&pop).unwrap();
    // Select the built-in everywhere, so the daemon's start-up refresh has nothing to repair
    // and both models are fetched only on request.
    for key in ["Model", "DrivingModel", "ActiveSmallModel"] {
        w.set_param(key, "rdf43");
    }
    w.server.set_rate_per_conn(Some(128 * 1024));
    let mut child = w
        .cmd(&["run", "--poll-ms", "20"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    w.set_mem("ModelToDownload", "other");
    wait_for(
        "the first download to be under way",
        Duration::from_secs(30),
        || {
            w.mem("ModelDownloadProgress")
                .is_some_and(|p| p.ends_with('%') && p != "100%")
        },
    );
    w.set_mem("ModelToDownload", "pop223");
    wait_for(
        "the replacing request to be served",
        Duration::from_secs(30),
        || fs::read(&pop).is_ok_and(|b| b == w.pop_new),
    );
    wait_for("the request to be cleared", Duration::from_secs(30), || {
        w.mem("ModelToDownload").is_none()
    });
    assert_eq!(
        fs::read(w.models().join("other_driving_tinygrad.pkl")).unwrap(),
        w.other_new
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Regression: a journal left by an interrupted migration to another generation was resumed
/// as is, so `ModelManifestVersion` was set to that generation instead of ours and `resolve`
/// kept answering the built-in until a second migration deleted and re-fetched everything.
#[test]
fn a_journal_for_another_generation_is_migrated_to_ours() {
    let w = world(2 * CHUNK);
    fs::write(
        w.models().join(".migration.json"),
        r#"{"from":"v24","to":"v23","selected":"pop223","phase":"download"}"#,
    )
    .unwrap();
    let out = w.run(&["refresh", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_consistent(&w, "journal for v23");
    assert_eq!(w.param("Model").as_deref(), Some("pop223"));
}
