//! The first boot on a new tree is safe for every reader (issue 37): the tree moved to the next
//! generation, the origins hang (a refresh cannot get a manifest for its whole deadline), and
//! `run` has just started. Within a few seconds, before any origin has answered anything,
//! whoever reads the params as modeld's fallback does ("load `<id>_driving_tinygrad.pkl` when
//! present", upstream's own id map) finds the built-in or nothing, never the old generation's
//! pickle; once the origins answer, the device ends on the new generation's model. v25 → v26
//! and v26 → a made-up v27 (both through the pins file, as a tinygrad bump writes it).

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;
use manifest::layout::CURRENT_TINYGRAD_COMMIT;
use test_support::http_server::{Fault, FaultServer};
use test_support::published::{
    GH_DIR, HF_DIR, artifact_bytes, manifest_json, publish_model, write_manifest_at,
};

const CHUNK: usize = 64 * 1024;
const V27_PIN: &str = "27272727272727272727272727272727272727bb";

/// The pins file of a tree that knows v25, v26 and v27.
fn pins() -> String {
    format!(
        "{{\n  \"v25\": \"{CURRENT_TINYGRAD_COMMIT}\",\n  \"v26\": \"{V26_PIN}\",\n  \"v27\": \"{V27_PIN}\"\n}}\n"
    )
}

fn pin(generation: &str) -> &'static str {
    match generation {
        "v25" => CURRENT_TINYGRAD_COMMIT,
        "v26" => V26_PIN,
        _ => V27_PIN,
    }
}

fn pop_bytes(generation: &str) -> Vec<u8> {
    artifact_bytes(generation.as_bytes()[2].into(), 2 * CHUNK + 9)
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
    let op = device.openpilot();
    set_tree(&op, pin(from), Some(&pins()));
    let root = device.dir.path().join("origin");
    for generation in [from, to] {
        let m = publish_model(
            &root,
            generation,
            "pop223",
            &pop_bytes(generation),
            Some(CHUNK),
        );
        let body = manifest_json(generation, std::slice::from_ref(&m), true).replacen(
            "\"models\":",
            &format!(
                "\"tinygrad_commit\": \"{}\",\n  \"models\":",
                pin(generation)
            ),
            1,
        );
        for dir in [HF_DIR, GH_DIR] {
            write_manifest_at(&root, dir, generation, body.as_bytes());
        }
    }
    for (k, v) in [
        ("Model", "pop223"),
        ("DrivingModel", "pop223"),
        ("ActiveSmallModel", "pop223"),
    ] {
        device.set_param(k, v);
    }
    let server = FaultServer::start(&root).unwrap();
    let base = server.url();
    let out = device.command(&base, &["refresh"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(device.installed("pop223"), Some(pop_bytes(from)));
    let loads = fallback_loads(&device.params(), &device.models());
    assert!(
        loads
            .iter()
            .any(|(_, b)| b.as_deref() == Some(&pop_bytes(from)[..])),
        "the fixture: before the move the fallback loads {from}'s pop223"
    );

    // The tree moves; every origin hangs (accepts, never answers).
    set_tree(&op, pin(to), Some(&pins()));
    server.add_fault("/*", Fault::Stall, None);
    let sent_before = server.body_bytes_under("/");
    let mut daemon = device
        .command(&base, &["run", "--poll-ms", "50"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let old = pop_bytes(from);
    let until = Instant::now() + Duration::from_secs(10);
    let safe = loop {
        let loads = fallback_loads(&device.params(), &device.models());
        if loads.iter().all(|(_, b)| b.is_none()) {
            break loads;
        }
        for (k, b) in &loads {
            assert!(
                b.as_deref() != Some(&old[..]) || Instant::now() < until,
                "{from} -> {to}: 10 s after `run` started on the {to} tree, {k} still makes the \
                 fallback load {from}'s pickle"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!safe.is_empty(), "the selection params are still there");
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

    // Online again: the next refresh installs the new generation's model and selects it.
    server.clear_faults();
    let out = device.command(&base, &["refresh"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(device.installed("pop223"), Some(pop_bytes(to)));
    assert_eq!(device.param("ModelManifestVersion").as_deref(), Some(to));
    let loads = fallback_loads(&device.params(), &device.models());
    assert!(
        loads
            .iter()
            .any(|(_, b)| b.as_deref() == Some(&pop_bytes(to)[..])),
        "{loads:?}"
    );
}

#[test]
fn v25_to_v26() {
    first_boot_on_a_new_tree("v25", "v26");
}

#[test]
fn v26_to_v27() {
    first_boot_on_a_new_tree("v26", "v27");
}
