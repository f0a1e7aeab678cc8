//! The real binary in the field's conditions, against the fault server on 127.0.0.1: the live
//! manifest shape, driving (`IsOnroad`), SIGTERM in the middle of a download, and no network.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use test_support::http_server::{FaultServer, ServerConfig};
use test_support::published::{artifact_bytes, manifest_json, publish_model, write_manifest};

const CHUNK: usize = 256 * 1024;

struct World {
    device: Device,
    root: PathBuf,
    server: Option<FaultServer>,
    base: String,
    other: Vec<u8>,
}

impl std::ops::Deref for World {
    type Target = Device;
    fn deref(&self) -> &Device {
        &self.device
    }
}

impl World {
    fn server(&self) -> &FaultServer {
        self.server.as_ref().unwrap()
    }

    fn cmd(&self, args: &[&str]) -> Command {
        self.command(&self.base, args)
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    fn daemon(&self) -> Child {
        self.cmd(&["run", "--poll-ms", "50", "--retry-secs", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// A v24 device selecting `pop223` (old artifacts in several forms, a local model, a DM file),
/// and an origin publishing `pop223` and `other` as chunk sets with per-chunk digests.
fn world() -> World {
    let device = Device::new();
    let root = device.dir.path().join("origin");
    fs::create_dir_all(&root).unwrap();
    let p = publish_model(
        &root,
        "v25",
        "pop223",
        &artifact_bytes(61, 2 * CHUNK + 7),
        Some(CHUNK),
    );
    let other = artifact_bytes(62, 10 * CHUNK + 99);
    let o = publish_model(&root, "v25", "other", &other, Some(CHUNK));
    write_manifest(&root, "v25", manifest_json("v25", &[p, o], true).as_bytes());
    let server = FaultServer::start(&root).unwrap();
    let base = server.url();
    device.make_v24(
        &[
            "pop223_driving_tinygrad.pkl",
            "pop223_driving_tinygrad.pkl.p00",
            "other_driving_tinygrad.pkl.chunk01of01",
            "other_driving_tinygrad.pkl.chunkmanifest",
            "local-test_driving_tinygrad.pkl",
            "dmonitoring_model_tinygrad.pkl",
        ],
        "1",
    );
    World {
        device,
        root,
        server: Some(server),
        base,
        other,
    }
}

/// Every file under `dir` with its bytes and mode (the staging directory included).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let m = fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                out.insert(p.clone(), (Vec::new(), m.permissions().mode()));
                stack.push(p);
            } else {
                out.insert(
                    p.clone(),
                    (fs::read(&p).unwrap_or_default(), m.permissions().mode()),
                );
            }
        }
    }
    out
}

fn sigterm(child: &Child) {
    // SAFETY: a plain kill(2) of our own child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
}

/// Waits for `child` to exit; its stderr and how long it took after the call.
fn finish(mut child: Child, limit: Duration) -> (std::process::ExitStatus, String, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status, err, start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("did not exit within {limit:?}: {}", stderr(&out));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn onroad_refresh_and_download_change_nothing_and_fetch_nothing_then_offroad_completes() {
    let w = world();
    w.set_param("IsOnroad", "1");
    let before = (snapshot(&w.data()), snapshot(&w.memory()));
    for args in [
        &["refresh"][..],
        &["refresh", "--json"],
        &["download", "other"],
        &["download", "--all"],
        &["gc"],
    ] {
        let out = w.run(args);
        assert_eq!(out.status.code(), Some(9), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("deferred while driving"),
            "{args:?}: {}",
            stderr(&out)
        );
        if args.contains(&"--json") {
            // With --json a failure prints one error document, exit code unchanged.
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(doc["error"]["kind"], "deferred", "{args:?}: {doc}");
        } else {
            assert!(out.stdout.is_empty(), "{args:?}");
        }
    }
    assert_eq!(
        (snapshot(&w.data()), snapshot(&w.memory())),
        before,
        "every file as it was"
    );
    assert!(
        w.server().requests().is_empty(),
        "not even the manifest was asked for"
    );

    // The same refresh offroad: migrated, the selection downloaded.
    w.set_param("IsOnroad", "0");
    let out = w.run(&["refresh", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["migrated_from"], "v24");
    assert_eq!(r["selected"], "pop223");
    assert!(w.installed("pop223").is_some());
    assert!(!w.models().join("pop223_driving_tinygrad.pkl.p00").exists());
}

#[test]
fn the_daemon_waits_while_driving_and_serves_the_request_once_offroad() {
    let w = world();
    w.set_param("IsOnroad", "1");
    w.set_mem("ModelToDownload", "other");
    let before = snapshot(&w.data());
    let child = w.daemon();
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        w.server().requests().is_empty(),
        "nothing fetched while driving"
    );
    // The daemon holds the one-manager lock for its whole life: the lock file is created
    // (empty, never written). Everything else is as it was.
    let mut now = snapshot(&w.data());
    assert_eq!(
        now.remove(&w.models().join(".manager.lock"))
            .map(|(b, _)| b),
        Some(Vec::new())
    );
    assert_eq!(now, before, "nothing changed while driving");
    assert_eq!(
        w.mem("ModelToDownload").as_deref(),
        Some("other"),
        "the request waits"
    );

    w.set_param("IsOnroad", "0");
    wait_for(
        "the request served offroad",
        Duration::from_secs(30),
        || w.mem("ModelToDownload").is_none() && w.installed("other").is_some(),
    );
    assert_eq!(w.installed("other").unwrap(), w.other);
    assert_eq!(
        w.mem("ModelDownloadProgress").as_deref(),
        Some("Downloaded!")
    );
    sigterm(&child);
    let (status, log, took) = finish(child, Duration::from_secs(5));
    assert!(status.success(), "{log}");
    assert!(took < Duration::from_secs(2), "stopped in {took:?}");
    for line in [
        "started: generation v25",
        "deferred while driving",
        "offroad: refreshing",
        "job: refresh",
        "job: download other",
        "download other: Downloaded!",
        "stopped:",
    ] {
        assert!(log.contains(line), "missing {line:?} in:\n{log}");
    }
}

/// The staging record: finished chunks and (chunk, bytes reached) of chunks cut off.
fn staging_record(models: &Path) -> (Vec<u32>, Vec<(u32, u64)>) {
    let dir = models.join(downloader::STAGING_DIR);
    let state = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(".state"))
        .expect("a stopped download leaves its record");
    let text = fs::read_to_string(state.path()).unwrap();
    let (mut done, mut partial) = (Vec::new(), Vec::new());
    for line in text.lines().skip(1) {
        let v: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        match v[..] {
            [i] => done.push(i as u32),
            [i, 0, b] => partial.push((i as u32, b)),
            _ => panic!("unexpected record line {line:?}"),
        }
    }
    (done, partial)
}

#[test]
fn sigterm_mid_download_stops_within_2s_and_a_restart_never_refetches_a_finished_chunk() {
    let w = world();
    let out = w.run(&["refresh"]);
    assert!(out.status.success(), "{}", stderr(&out));
    w.server().set_rate_per_conn(Some(160 * 1024));
    w.server().clear_requests();
    w.set_mem("ModelToDownload", "other");
    let child = w.daemon();
    wait_for("the download under way", Duration::from_secs(30), || {
        w.mem("ModelDownloadProgress")
            .and_then(|p| p.strip_suffix('%').and_then(|n| n.parse::<u32>().ok()))
            .is_some_and(|p| p >= 40)
    });
    sigterm(&child);
    let (status, log, took) = finish(child, Duration::from_secs(5));
    assert!(status.success(), "{log}");
    assert!(took < Duration::from_secs(2), "stopped in {took:?}:\n{log}");
    assert!(log.contains("download other: kept pending"), "{log}");
    // The UI's text for a download that stopped; the request stays for the next start.
    assert_eq!(
        w.mem("ModelDownloadProgress").as_deref(),
        Some("Download cancelled...")
    );
    assert_eq!(w.mem("ModelToDownload").as_deref(), Some("other"));
    assert!(w.installed("other").is_none());
    let (done, partial) = staging_record(&w.models());
    assert!(done.len() >= 2, "{done:?}");

    w.server().set_rate_per_conn(None);
    w.server().clear_requests();
    let child = w.daemon();
    wait_for("the resumed download", Duration::from_secs(30), || {
        w.mem("ModelToDownload").is_none() && w.installed("other").is_some()
    });
    sigterm(&child);
    let (status, log, _) = finish(child, Duration::from_secs(5));
    assert!(status.success(), "{log}");
    assert_eq!(w.installed("other").unwrap(), w.other);
    let chunk = |i: u32| format!("other_driving_tinygrad.pkl.chunk{i:02}of11");
    let gets: Vec<(String, Option<String>)> = w
        .server()
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET")
        .map(|r| (r.path, r.range))
        .collect();
    for i in &done {
        assert!(
            !gets.iter().any(|(p, _)| p.ends_with(&chunk(*i))),
            "finished chunk {i} fetched again: {gets:?}"
        );
    }
    for (i, reached) in &partial {
        let want = format!("bytes={reached}-");
        assert!(
            gets.iter().any(|(p, r)| p.ends_with(&chunk(*i))
                && r.as_deref().is_some_and(|r| r.starts_with(&want))),
            "chunk {i} should continue at {reached}: {gets:?}"
        );
    }
}

#[test]
fn without_network_a_request_waits_and_is_served_when_the_network_returns() {
    let mut w = world();
    let out = w.run(&["refresh"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The network goes away: the origins' port refuses connections.
    let addr = w.server().addr();
    w.server = None;
    w.set_mem("ModelToDownload", "other");
    let child = w.daemon();
    wait_for("the offline progress", Duration::from_secs(30), || {
        w.mem("ModelDownloadProgress").as_deref() == Some("Hugging Face and GitHub are offline...")
    });
    assert_eq!(
        w.mem("ModelToDownload").as_deref(),
        Some("other"),
        "never given up"
    );
    // The network returns on the same address.
    let mut cfg = ServerConfig::new(&w.root);
    cfg.addr = addr;
    w.server = Some(FaultServer::with_config(cfg).unwrap());
    wait_for("the request served", Duration::from_secs(30), || {
        w.mem("ModelToDownload").is_none() && w.installed("other").is_some()
    });
    assert_eq!(w.installed("other").unwrap(), w.other);
    sigterm(&child);
    let (status, log, _) = finish(child, Duration::from_secs(5));
    assert!(status.success(), "{log}");
    assert!(
        log.contains("kept pending (no network, will retry"),
        "{log}"
    );
    assert!(log.contains("download other: Downloaded!"), "{log}");
}

/// The live manifest's shape (no artifact fields) with one entry the fleet tolerates but a
/// device must not list: the rest installs, `status` says where each digest came from and why
/// the entry was left out.
#[test]
fn the_live_manifest_shape_through_the_binary() {
    let w = world();
    let live = serde_json::json!({"models": [
        {"id": "pop223", "name": "Pop 👀📡", "version": "v16", "series": "OP Series",
         "released": "2025-10-01", "community_favorite": 1},
        {"id": "odd223", "name": "Odd, really", "version": "v16", "series": "OP Series",
         "released": "2025-10-01", "community_favorite": false},
        {"id": "other", "name": "Other", "version": "v16", "series": "OP Series",
         "released": "2025-02-30", "community_favorite": false}
    ]});
    write_manifest(&w.root, "v25", live.to_string().as_bytes());
    let out = w.run(&["refresh", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["selected"], "pop223", "{r}");
    assert_eq!(r["fell_back_to_builtin"], false);
    assert_eq!(r["refused_entries"].as_array().unwrap().len(), 2, "{r}");
    assert!(w.installed("pop223").is_some());

    let out = w.run(&["status", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        s["installed"],
        serde_json::json!([{"id": "pop223", "state": "verified", "digest_source": "sidecar"}]),
        "{s}"
    );
    let refused = s["refused_entries"].as_array().unwrap();
    assert_eq!(refused[0]["id"], "odd223");
    assert!(
        refused[0]["reason"].as_str().unwrap().contains("comma"),
        "{s}"
    );
    assert_eq!(refused[1]["id"], "other");
    assert!(
        refused[1]["reason"].as_str().unwrap().contains("released"),
        "{s}"
    );
    // `resolve` hands the sidecar-verified model to modeld.
    let out = w.run(&["resolve"]);
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap()
        .to_string();
    assert_eq!(
        PathBuf::from(path),
        w.models().join("pop223_driving_tinygrad.pkl")
    );
    // And `download --all` is not empty any more.
    let out = w.run(&["download", "--all", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["models"].as_array().unwrap().len(), 1, "{d}");
}

/// The external GPU through the binary: a GPU-only model is refused without a ready Chestnut
/// (unless the one-request override is set), download-all leaves it out; with a ready one,
/// download-all takes it and its Chestnut build.
#[test]
fn a_chestnut_decides_gpu_downloads_through_the_binary() {
    let w = world();
    let gpu_main = artifact_bytes(71, CHUNK + 5);
    let gpu_amd = artifact_bytes(72, CHUNK / 3);
    let p = publish_model(
        &w.root,
        "v25",
        "pop223",
        &artifact_bytes(61, 2 * CHUNK + 7),
        Some(CHUNK),
    );
    let g = publish_model(&w.root, "v25", "gpu223", &gpu_main, Some(CHUNK));
    for dir in test_support::published::artifact_dirs(&w.root, "v25", "gpu223") {
        fs::write(dir.join("gpu223_amd.pkl"), &gpu_amd).unwrap();
    }
    let mut m: serde_json::Value =
        serde_json::from_str(&manifest_json("v25", &[p, g], true)).unwrap();
    m["models"][1]["uses_external_gpu"] = true.into();
    m["models"][1]["accelerator_artifacts"] = serde_json::json!({"chestnut": {
        "artifact_format": "tinygrad_single_v1", "artifact_filename": "gpu223_amd.pkl",
        "artifact_size": gpu_amd.len(),
        "artifact_sha256": test_support::published::sha256_hex(&gpu_amd),
        "artifact_chunk_count": 0, "execution_device": "AMD"}});
    write_manifest(&w.root, "v25", m.to_string().as_bytes());
    let out = w.run(&["refresh"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // No Chestnut: refused, nothing fetched for it; download-all leaves it out.
    w.server().clear_requests();
    let out = w.run(&["download", "gpu223"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("needs the external GPU"),
        "{}",
        stderr(&out)
    );
    assert!(
        w.server()
            .requests()
            .iter()
            .all(|r| !r.path.contains("gpu223"))
    );
    let out = w.run(&["download", "--all", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = d["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["pop223"]);
    // The override lets one request through, and is used up by it.
    w.set_mem("AllowGpuModelDownloadWithoutGpu", "1");
    let out = w.run(&["download", "gpu223"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(w.mem("AllowGpuModelDownloadWithoutGpu").is_none());
    assert_eq!(w.installed("gpu223").unwrap(), gpu_main);
    assert!(
        !w.models()
            .join("gpu223_driving_chestnut_tinygrad.pkl")
            .exists()
    );

    // A ready Chestnut: download-all takes the GPU model and its Chestnut build.
    let usb = w.dir.path().join("sys/bus/usb/devices/2-1");
    fs::create_dir_all(&usb).unwrap();
    fs::write(usb.join("idVendor"), "add1\n").unwrap();
    fs::write(usb.join("idProduct"), "0001\n").unwrap();
    fs::write(usb.join("product"), "custom ed4e39b7-CLEAN\n").unwrap();
    let out = w.run(&["download", "--all", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = d["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["pop223", "gpu223"]);
    assert_eq!(
        fs::read(w.models().join("gpu223_driving_chestnut_tinygrad.pkl")).unwrap(),
        gpu_amd
    );
}
