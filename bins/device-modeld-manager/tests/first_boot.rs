//! The first boot on a new tree is safe for every reader (issue 37): the tree moved to the next
//! generation, the origins hang (a refresh cannot get a manifest for its whole deadline), and
//! `run` has just started. Within a few seconds, before any origin has answered anything, the
//! new tree's modeld, reading the device as it does, finds the built-in or nothing, never the
//! old generation's pickle, and `run`'s offline first step is done; once the origins answer,
//! the device ends on the new generation's model. v25 (flat, modeld's fallback over the params)
//! → v26 and v26 → a made-up v27, both on a tree declaring upstream's v26 contract, read by the
//! independent checker (`test_support::upstream_v26`) as upstream's v26 modeld reads them.

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;
use test_support::http_server::{Fault, FaultServer};
use test_support::published::{
    GH_DIR, HF_DIR, artifact_bytes, manifest_json, publish_model, write_manifest_at,
};
use test_support::upstream_v26::{contract_manifest, python_dump};

const CHUNK: usize = 64 * 1024;

fn pop_bytes(generation: &str) -> Vec<u8> {
    artifact_bytes(generation.as_bytes()[2].into(), 2 * CHUNK + 9)
}

/// Move the device's tree to `generation`: v25's flat layout (the tree `Device::new` makes),
/// or a tree declaring it on upstream's v26 contract (the reviewed catalog lists `pop223`).
fn tree_at(device: &Device, generation: &str) {
    if generation != "v25" {
        device.declare(generation, &contract_rows(&["pop223"]));
    }
}

/// The bytes modeld of `generation` loads, read as that modeld reads the device: v25's
/// fallback over the params ([`fallback_loads`]), or upstream's v26 `resolve_runtime` over
/// `<gen>/` (preferences, catalog, verified artifact), by the independent checker. `None`: the
/// built-in (or nothing there).
fn modeld_loads(device: &Device, generation: &str) -> Vec<(String, Option<Vec<u8>>)> {
    if generation == "v25" {
        return fallback_loads(&device.params(), &device.models());
    }
    let sel = device
        .runtime(generation)
        .resolve_runtime(&device.root(generation), true);
    [("small", sel.small_path), ("big", sel.big_path)]
        .into_iter()
        .map(|(k, p)| (k.to_string(), p.map(|p| fs::read(p).unwrap())))
        .collect()
}

/// modeld's own id map (upstream): lowercase, `rdf`/`rdf43` → `rdf43`, `sc` → `sc2`.
fn modeld_id(raw: &str) -> String {
    match raw.trim().to_lowercase().as_str() {
        "rdf" | "rdf43" => "rdf43".into(),
        "sc" => "sc2".into(),
        id => id.into(),
    }
}

/// What a reader of the params that loads "the plain file when present" opens, for each
/// selection param modeld or its fallback may read: `None` for the built-in or a missing file,
/// else the bytes its chunk reader would stream (the plain file, or the chunk set).
fn fallback_loads(params: &Path, models: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    ["ActiveSmallModel", "Model", "DrivingModel"]
        .into_iter()
        .filter_map(|k| {
            let raw = fs::read_to_string(params.join(k)).ok()?;
            let id = modeld_id(&raw);
            if id.is_empty() || id == "rdf43" {
                return Some((k.to_string(), None));
            }
            let plain = models.join(format!("{id}_driving_tinygrad.pkl"));
            let bytes = fs::read(&plain).ok().or_else(|| {
                let count: u32 = fs::read_to_string(format!("{}.chunkmanifest", plain.display()))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()?;
                let mut all = Vec::new();
                for i in 1..=count {
                    all.extend(
                        fs::read(format!("{}.chunk{i:02}of{count:02}", plain.display())).ok()?,
                    );
                }
                Some(all)
            });
            Some((k.to_string(), bytes))
        })
        .collect()
}

fn first_boot_on_a_new_tree(from: &str, to: &str) {
    let device = Device::new();
    tree_at(&device, from);
    let root = device.dir.path().join("origin");
    let rows = contract_rows(&["pop223"]);
    for generation in [from, to] {
        let m = publish_model(
            &root,
            generation,
            "pop223",
            &pop_bytes(generation),
            Some(CHUNK),
        );
        let body = if generation == "v25" {
            manifest_json(generation, std::slice::from_ref(&m), true).into_bytes()
        } else {
            contract_manifest(&device.runtime(generation), &rows, &[m])
        };
        for dir in [HF_DIR, GH_DIR] {
            write_manifest_at(&root, dir, generation, &body);
        }
    }
    // The user selects pop223 where `from` keeps the selection.
    if from == "v25" {
        for k in ["Model", "DrivingModel", "ActiveSmallModel"] {
            device.set_param(k, "pop223");
        }
    } else {
        let prefs = serde_json::json!({"small": "pop223", "big": "", "userFavorites": [],
            "sortMode": "name", "randomizer": false, "blacklistedModels": []});
        fs::create_dir_all(device.root(from)).unwrap();
        fs::write(
            device.root(from).join("preferences.json"),
            python_dump(&prefs),
        )
        .unwrap();
    }
    let server = FaultServer::start(&root).unwrap();
    let base = server.url();
    let out = device.command(&base, &["refresh"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let old = pop_bytes(from);
    assert!(
        modeld_loads(&device, from)
            .iter()
            .any(|(_, b)| b.as_deref() == Some(&old[..])),
        "the fixture: before the move {from}'s modeld loads {from}'s pop223"
    );

    // The tree moves; every origin hangs (accepts, never answers).
    tree_at(&device, to);
    server.add_fault("/*", Fault::Stall, None);
    let sent_before = server.body_bytes_under("/");
    let mut daemon = device
        .command(&base, &["run", "--poll-ms", "50"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    // What modeld of the new tree would load, from the start: the built-in or nothing, never
    // the old generation's pickle (on upstream's v26 contract its modeld reads `<to>/` only).
    loop {
        let loads = modeld_loads(&device, to);
        if loads.iter().all(|(_, b)| b.is_none()) && first_step_taken(&device, to) {
            break;
        }
        for (k, b) in &loads {
            assert!(
                b.as_deref() != Some(&old[..]) || Instant::now() < until,
                "{from} -> {to}: 10 s after `run` started on the {to} tree, {k} still makes \
                 modeld load {from}'s pickle"
            );
        }
        assert!(
            Instant::now() < until,
            "{from} -> {to}: 10 s after `run` started, the offline first step was not taken"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // `resolve`, the reader docs/integration.md calls safe in any case, agrees: the built-in.
    let out = device
        .command(&base, &["resolve", "--json"])
        .output()
        .unwrap();
    let answer: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(answer["builtin"], true, "{from} -> {to}: {answer}");
    // No origin has sent a byte since the move: the step took no network.
    assert_eq!(
        server.body_bytes_under("/"),
        sent_before,
        "an origin answered"
    );
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let log = {
        use std::io::Read;
        let mut s = String::new();
        daemon
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        s
    };
    assert!(daemon.wait().unwrap().success(), "{log}");
    assert!(
        log.contains(&format!("new tree: the device was on {from}")),
        "{log}"
    );

    // Online again: the next refresh installs the new generation's model, modeld of the new
    // tree loads it, and the old generation's pickle is gone.
    server.clear_faults();
    let out = device.command(&base, &["refresh"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(device.param("ModelManifestVersion").as_deref(), Some(to));
    let loads = modeld_loads(&device, to);
    assert!(
        loads
            .iter()
            .any(|(_, b)| b.as_deref() == Some(&pop_bytes(to)[..])),
        "{loads:?}"
    );
    let mut dirs = vec![device.models()];
    while let Some(dir) = dirs.pop() {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                assert!(fs::read(&p).unwrap() != old, "{from}'s pickle left: {p:?}");
            }
        }
    }
}

/// Whether `run`'s offline first step on the `to` tree (upstream's v26 contract) is done, as
/// upstream reads it: the user's choice is already in `<to>/preferences.json`, while modeld
/// loads the built-in until the model is verified there.
fn first_step_taken(device: &Device, to: &str) -> bool {
    device.runtime(to).preferences(&device.root(to)).small == "pop223"
}

#[test]
fn v25_to_v26() {
    first_boot_on_a_new_tree("v25", "v26");
}

#[test]
fn v26_to_v27() {
    first_boot_on_a_new_tree("v26", "v27");
}
