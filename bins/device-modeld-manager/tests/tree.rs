//! The device follows its openpilot tree: the generation is the one whose tinygrad pin is the
//! tree's `tinygrad_repo/TINYGRAD_COMMIT` (the built-in pins plus the tree's
//! `tinygrad_pins.json`), never a compiled-in constant. The real binary, run as the documented
//! service entry runs it (no `--generation`), on a temporary device and tree, against a local
//! origin publishing v25 and a made-up v26.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::common::*;
use manifest::layout::CURRENT_TINYGRAD_COMMIT;
use serde_json::Value;
use test_support::http_server::FaultServer;
use test_support::published::{
    GH_DIR, HF_DIR, artifact_bytes, manifest_json, publish_model, write_manifest_at,
};

const CHUNK: usize = 64 * 1024;

/// The selected model's bytes as each generation publishes them.
fn pop_bytes(generation: &str) -> Vec<u8> {
    artifact_bytes(if generation == "v25" { 25 } else { 26 }, 2 * CHUNK + 9)
}

/// `generation`'s manifest listing `pop223`, naming `pin` as its tinygrad.
fn manifest_with_pin(
    generation: &str,
    model: &test_support::published::PublishedModel,
    pin: &str,
) -> String {
    manifest_json(generation, std::slice::from_ref(model), true).replacen(
        "\"models\":",
        &format!("\"tinygrad_commit\": \"{pin}\",\n  \"models\":"),
        1,
    )
}

/// A device selecting `pop223`, an origin publishing it in v25 (v25's pin) and in v26 (the
/// made-up pin), both layouts.
struct World {
    device: Device,
    server: FaultServer,
    root: PathBuf,
}

impl std::ops::Deref for World {
    type Target = Device;
    fn deref(&self) -> &Device {
        &self.device
    }
}

impl World {
    fn new() -> World {
        let device = Device::new();
        let root = device.dir.path().join("origin");
        fs::create_dir_all(&root).unwrap();
        for (generation, pin) in [("v25", CURRENT_TINYGRAD_COMMIT), ("v26", V26_PIN)] {
            let m = publish_model(
                &root,
                generation,
                "pop223",
                &pop_bytes(generation),
                Some(CHUNK),
            );
            for layout_dir in [HF_DIR, GH_DIR] {
                write_manifest_at(
                    &root,
                    layout_dir,
                    generation,
                    manifest_with_pin(generation, &m, pin).as_bytes(),
                );
            }
        }
        for (k, v) in [
            ("Model", "pop223"),
            ("DrivingModel", "pop223"),
            ("DrivingModelName", "Model pop223"),
            ("ModelVersion", "v16"),
            ("DrivingModelVersion", "v16"),
        ] {
            device.set_param(k, v);
        }
        let server = FaultServer::start(&root).unwrap();
        World {
            device,
            server,
            root,
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(&self.server.url(), args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        out
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_slice(&self.ok(args).stdout).unwrap()
    }

    /// Move the tree to the made-up v26: the marker at its pin, the pins file recording it.
    fn tree_at_v26(&self) {
        set_tree(&self.openpilot(), V26_PIN, Some(&v26_pins()));
    }

    /// The data root and the memory params, every file with its bytes.
    fn snapshot(&self) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
        let mut out = BTreeMap::new();
        for dir in [self.data(), self.memory()] {
            walk(&dir, &mut out);
        }
        out
    }
}

fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, Option<Vec<u8>>>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.insert(p.clone(), None);
            walk(&p, out);
        } else {
            out.insert(p.clone(), Some(fs::read(&p).unwrap()));
        }
    }
}

fn code(out: &Output) -> Option<i32> {
    out.status.code()
}

/// The documented service entry (`device-modeld-manager run`, no `--generation`) migrates a v25
/// device to v26 once its tree's marker moves to the v26 pin and the pins file records v26: the
/// v26 build of the selected model is installed, the v25 one purged, `resolve` answers it.
#[test]
fn a_v25_device_migrates_to_v26_when_its_tree_moves() {
    let w = World::new();
    let out = w.json(&["refresh", "--json"]);
    assert_eq!(out["generation"], "v25", "{out}");
    assert_eq!(w.installed("pop223"), Some(pop_bytes("v25")));
    assert_eq!(w.param("ModelManifestVersion").as_deref(), Some("v25"));

    w.tree_at_v26();
    let mut daemon = w
        .command(&w.server.url(), &["run", "--poll-ms", "20"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the migration to v26", Duration::from_secs(60), || {
        w.param("ModelManifestVersion").as_deref() == Some("v26")
            && w.installed("pop223") == Some(pop_bytes("v26"))
    });
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
        log.contains(&format!("runs tinygrad {V26_PIN} (v26's pin)")),
        "{log}"
    );
    let r = w.json(&["resolve", "--json"]);
    assert_eq!(r["id"], "pop223", "{r}");
    assert_eq!(r["builtin"], false, "{r}");
    let s = w.json(&["status", "--json"]);
    assert_eq!(s["generation"], "v26", "{s}");
    assert_eq!(s["tree"]["state"], "known", "{s}");
    assert_eq!(s["tree"]["tinygrad_commit"], V26_PIN, "{s}");
    assert_eq!(s["tree"]["generation"], "v26", "{s}");
}

/// This build knows only v25's pin, yet on a device whose tree is at v26 (marker and pins file)
/// it reads v26: it never "migrates" the device back to v25, though the origin serves both.
#[test]
fn a_v25_binary_on_a_v26_tree_stays_on_v26() {
    let w = World::new();
    w.tree_at_v26();
    let first = w.json(&["refresh", "--json"]);
    assert_eq!(first["generation"], "v26", "{first}");
    assert_eq!(w.installed("pop223"), Some(pop_bytes("v26")));
    let files = w.model_files();
    let again = w.json(&["refresh", "--json"]);
    assert_eq!(again["generation"], "v26", "{again}");
    assert_eq!(again["migrated_from"], Value::Null, "{again}");
    assert_eq!(again["purged"], serde_json::json!([]), "{again}");
    assert_eq!(
        w.installed("pop223"),
        Some(pop_bytes("v26")),
        "v26 files kept"
    );
    assert_eq!(w.model_files(), files);
    assert_eq!(w.param("ModelManifestVersion").as_deref(), Some("v26"));
    // The v25 manifest was never asked for.
    assert!(
        !w.server
            .requests()
            .iter()
            .any(|r| r.path.contains("model_names_v25.json")),
        "{:?}",
        w.server.requests()
    );
}

/// `--generation` is a check, not a switch: one the tree disagrees with is a usage error (exit
/// 2, `kind` usage) for every command, and not a byte of the device changes.
#[test]
fn a_generation_the_tree_disagrees_with_is_a_usage_error_and_touches_nothing() {
    let w = World::new();
    w.ok(&["refresh"]);
    w.set_mem("ModelToDownload", "pop223");
    for (tree_v26, flag) in [(false, "v26"), (true, "v25")] {
        if tree_v26 {
            w.tree_at_v26();
        }
        let before = w.snapshot();
        for sub in [
            &["refresh"][..],
            &["refresh", "--json"],
            &["download", "pop223"],
            &["gc"],
            &["status"],
            &["resolve"],
            &["run", "--poll-ms", "20"],
        ] {
            let mut args = vec!["--generation", flag];
            args.extend_from_slice(sub);
            let out = w.run(&args);
            assert_eq!(code(&out), Some(2), "{args:?}: {}", stderr(&out));
            let err = stderr(&out);
            assert!(
                err.contains(&format!("--generation {flag} disagrees")) && err.contains("next: "),
                "{err}"
            );
            if sub.contains(&"--json") {
                let v: Value = serde_json::from_slice(&out.stdout).unwrap();
                assert_eq!(v["error"]["kind"], "usage", "{v}");
            }
            assert_eq!(w.snapshot(), before, "{args:?} changed the device");
        }
    }
    // The flag that agrees is accepted.
    w.ok(&["--generation", "v26", "status"]);
}

/// A tinygrad no table knows (the marker moved, no pins file records it), and a marker that
/// cannot be read: nothing on the device changes, `resolve` answers the built-in, and `status`,
/// the error, and `ModelDownloadProgress` say which tinygrad and what to do. `refresh` exits 10.
#[test]
fn an_unknown_tinygrad_changes_nothing_and_says_so() {
    let w = World::new();
    w.ok(&["refresh"]);
    assert_eq!(w.installed("pop223"), Some(pop_bytes("v25")));
    let op = w.openpilot();
    // v26's pin, but the pins file does not record it.
    set_tree(&op, V26_PIN, None);
    let data_before = {
        let mut m = BTreeMap::new();
        walk(&w.data(), &mut m);
        m
    };
    let data_now = || {
        let mut m = BTreeMap::new();
        walk(&w.data(), &mut m);
        m
    };
    // The dry runs write nothing at all, the memory params included.
    let before = w.snapshot();
    for sub in [
        &["refresh", "--dry-run"][..],
        &["download", "--dry-run", "pop223"],
        &["gc", "--dry-run"],
        &["verify", "--dry-run"],
    ] {
        let out = w.run(sub);
        assert_eq!(code(&out), Some(10), "{sub:?}: {}", stderr(&out));
        assert_eq!(w.snapshot(), before, "{sub:?}");
    }
    for sub in [
        &["refresh"][..],
        &["download", "pop223"],
        &["gc"],
        &["verify"],
    ] {
        let out = w.run(sub);
        assert_eq!(code(&out), Some(10), "{sub:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(V26_PIN)
                && err.contains("nothing on this device was changed")
                && err.contains("next: ")
                && err.contains("tinygrad_pins.json"),
            "{err}"
        );
        assert_eq!(data_now(), data_before, "{sub:?} changed the data dir");
    }
    let out = w.run(&["refresh", "--json"]);
    assert_eq!(code(&out), Some(10));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["kind"], "paused", "{v}");
    assert!(
        v["error"]["next"]
            .as_str()
            .unwrap()
            .contains("update the openpilot tree"),
        "{v}"
    );
    let progress = w.mem("ModelDownloadProgress").unwrap();
    assert!(
        progress.contains(&V26_PIN[..12]) && progress.contains("update openpilot"),
        "{progress}"
    );
    // modeld gets the built-in, though pop223 is selected and verified (for v25).
    let r = w.json(&["resolve", "--json"]);
    assert_eq!(r["builtin"], true, "{r}");
    assert_eq!(
        r["path"],
        w.builtin().join("driving_tinygrad.pkl").to_str().unwrap()
    );
    assert!(r["doubt"].as_str().unwrap().contains(V26_PIN), "{r}");
    let s = w.json(&["status", "--json"]);
    assert_eq!(s["generation"], Value::Null, "{s}");
    assert_eq!(s["manifest_version"], "v25", "{s}");
    assert_eq!(s["tree"]["state"], "unknown", "{s}");
    assert_eq!(s["tree"]["tinygrad_commit"], V26_PIN, "{s}");
    assert!(
        s["tree"]["next"]
            .as_str()
            .unwrap()
            .contains("tinygrad_pins.json"),
        "{s}"
    );
    let text = String::from_utf8(w.ok(&["status"]).stdout).unwrap();
    assert!(
        text.contains("no known generation's pin: paused") && text.contains(V26_PIN),
        "{text}"
    );
    // The daemon waits: a UI request is answered with the pause and cleared, nothing fetched.
    let requests = w.server.requests().len();
    w.set_mem("ModelDownloadProgress", "");
    w.set_mem("ModelToDownload", "pop223");
    let mut daemon = w
        .command(&w.server.url(), &["run", "--poll-ms", "20"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(
        "the request to be answered",
        Duration::from_secs(30),
        || w.mem("ModelToDownload").is_none(),
    );
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    assert!(daemon.wait().unwrap().success());
    assert!(
        w.mem("ModelDownloadProgress")
            .unwrap()
            .starts_with("Model downloads paused")
    );
    assert_eq!(
        w.server.requests().len(),
        requests,
        "the paused daemon fetched something"
    );
    assert_eq!(
        data_now(),
        data_before,
        "the paused daemon changed the data dir"
    );

    // No marker at all: unreadable, the same pause.
    fs::remove_file(op.join("tinygrad_repo/TINYGRAD_COMMIT")).unwrap();
    let out = w.run(&["refresh"]);
    assert_eq!(code(&out), Some(10), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("TINYGRAD_COMMIT: not found"),
        "{}",
        stderr(&out)
    );
    let s = w.json(&["status", "--json"]);
    assert_eq!(s["tree"]["state"], "unreadable", "{s}");
    assert_eq!(w.json(&["resolve", "--json"])["builtin"], true);
    assert_eq!(data_now(), data_before);
    // The tree fixed (the pins file records v26): the device follows it.
    w.tree_at_v26();
    assert_eq!(w.json(&["refresh", "--json"])["generation"], "v26");
    assert_eq!(w.installed("pop223"), Some(pop_bytes("v26")));
}

/// A manifest naming another tinygrad than the tree's is refused like one of another
/// generation: the other origin's is used; when every origin serves one, `refresh` fails (exit
/// 5) and nothing on the device changes.
#[test]
fn a_manifest_for_another_tinygrad_is_refused_and_the_other_origin_tried() {
    let w = World::new();
    w.ok(&["refresh"]);
    // Hugging Face's v25 manifest now names the v26 pin (and lists nothing the device has).
    let other = publish_model(&w.root, "v25", "x9223", &artifact_bytes(9, 100), None);
    write_manifest_at(
        &w.root,
        HF_DIR,
        "v25",
        manifest_with_pin("v25", &other, V26_PIN).as_bytes(),
    );
    let r = w.json(&["refresh", "--json"]);
    assert!(
        r["manifest_origin"].as_str().unwrap().starts_with("GitHub"),
        "{r}"
    );
    assert_eq!(r["models"], 1, "{r}");
    assert_eq!(w.installed("pop223"), Some(pop_bytes("v25")));
    // Both origins: no manifest, nothing changed.
    write_manifest_at(
        &w.root,
        GH_DIR,
        "v25",
        manifest_with_pin("v25", &other, V26_PIN).as_bytes(),
    );
    let before = w.snapshot();
    let out = w.run(&["refresh"]);
    assert_eq!(code(&out), Some(5), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("built for tinygrad {V26_PIN}"))
            && err.contains(CURRENT_TINYGRAD_COMMIT),
        "{err}"
    );
    assert_eq!(w.snapshot(), before);
    assert_eq!(w.json(&["resolve", "--json"])["id"], "pop223");
}

/// A tree that carries upstream's v26 catalog module but whose declaration cannot be read (the
/// sync file naming its tinygrad is missing, then malformed) pauses the device as an unknown
/// tinygrad does: `refresh` exits 10 saying which file and why, the data dir is untouched, and
/// `resolve` answers the built-in.
#[test]
fn a_tree_whose_contract_declaration_cannot_be_read_pauses() {
    let w = World::new();
    w.ok(&["refresh"]);
    let op = w.openpilot();
    let models = op.join("starpilot/models");
    fs::create_dir_all(&models).unwrap();
    fs::write(models.join("catalog.py"), "# reviewed catalog\n").unwrap();
    fs::write(
        models.join("catalog-v26.json"),
        r#"{"models": [{"id": "pop223", "name": "Pop", "version": "v16"}]}"#,
    )
    .unwrap();
    let data_now = || {
        let mut m = BTreeMap::new();
        walk(&w.data(), &mut m);
        m
    };
    let before = data_now();
    for (sync, says) in [
        (None, "upstream-sync.json is missing"),
        (Some("{\"dependencies\": 3}"), "no `dependencies` list"),
    ] {
        if let Some(body) = sync {
            fs::write(op.join("upstream-sync.json"), body).unwrap();
        }
        let out = w.run(&["refresh"]);
        assert_eq!(code(&out), Some(10), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(says)
                && err.contains("catalog.py")
                && err.contains("nothing on this device was changed"),
            "{err}"
        );
        assert_eq!(data_now(), before, "{says}: the data dir changed");
        assert_eq!(w.json(&["resolve", "--json"])["builtin"], true, "{says}");
    }
}
