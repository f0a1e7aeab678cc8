//! "Not yet" through the real binary (docs/device.md, *Origin policy*): while a store is half
//! republished (the manifest already new, the files still old: other digests, a shorter or longer
//! file, another chunk count) a refresh installs nothing, keeps the model in use, counts no
//! failure and records no backoff; once the store is complete the next `refresh` installs the
//! new bytes at once. A real failure is retried at once by a person's `refresh`, whatever its
//! backoff. For v25 and a made-up v26.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use crate::common::*;
use test_support::http_server::{Fault, FaultServer};
use test_support::published::{
    GH_DIR, HF_DIR, artifact_bytes, manifest_json, publish_model, write_manifest,
};

const CHUNK: usize = 128 * 1024;

struct World {
    device: Device,
    root: PathBuf,
    server: FaultServer,
    generation: &'static str,
}

impl World {
    /// A device selecting `pop223`, installed from an origin publishing `old` in `generation`.
    fn new(generation: &'static str, old: &[u8]) -> World {
        let device = Device::new();
        if generation != "v25" {
            set_tree(&device.openpilot(), V26_PIN, Some(&v26_pins()));
        }
        let root = device.dir.path().join("origin");
        fs::create_dir_all(&root).unwrap();
        let m = publish_model(&root, generation, "pop223", old, Some(CHUNK));
        write_manifest(
            &root,
            generation,
            manifest_json(generation, &[m], true).as_bytes(),
        );
        for (k, v) in [("Model", "pop223"), ("DrivingModel", "pop223")] {
            device.set_param(k, v);
        }
        let server = FaultServer::start(&root).unwrap();
        let w = World {
            device,
            root,
            server,
            generation,
        };
        w.ok(&["refresh"]);
        assert_eq!(w.device.installed("pop223").as_deref(), Some(old));
        w
    }

    fn run(&self, args: &[&str]) -> Output {
        self.device
            .command(&self.server.url(), args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        out
    }

    /// The manifest of `new` on both origins, the files still the old ones; returns a directory
    /// holding the new files, to complete the republish with.
    fn half_republish(&self, new: &[u8]) -> tempfile::TempDir {
        let staged = tempfile::tempdir().unwrap();
        let m = publish_model(staged.path(), self.generation, "pop223", new, Some(CHUNK));
        write_manifest(
            &self.root,
            self.generation,
            manifest_json(self.generation, &[m], true).as_bytes(),
        );
        staged
    }

    /// The files of the republish land: the store is complete.
    fn complete(&self, staged: &Path) {
        self.complete_model(staged, "pop223");
    }

    /// The files of `id`'s republish land.
    fn complete_model(&self, staged: &Path, id: &str) {
        for layout in [HF_DIR, GH_DIR] {
            let dir = match layout {
                HF_DIR => format!("{layout}/models/{}/{id}", self.generation),
                _ => format!("{layout}/{}/{id}", self.generation),
            };
            let to = self.root.join(&dir);
            let _ = fs::remove_dir_all(&to);
            fs::create_dir_all(&to).unwrap();
            for e in fs::read_dir(staged.join(&dir)).unwrap() {
                let e = e.unwrap();
                fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    }

    /// The daemon (polling every 50 ms, refreshing every 2 s), its log to `log_path`.
    fn daemon(&self, log_path: &Path) -> std::process::Child {
        self.device
            .command(
                &self.server.url(),
                &[
                    "run",
                    "--poll-ms",
                    "50",
                    "--retry-secs",
                    "1",
                    "--refresh-secs",
                    "2",
                ],
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(log_path).unwrap())
            .spawn()
            .unwrap()
    }

    /// `.choice.json`'s retry record of `pop223`, if any.
    fn retry(&self) -> Option<serde_json::Value> {
        let body = fs::read(self.device.models().join(".choice.json")).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        v.get("retry").and_then(|r| r.get("pop223")).cloned()
    }
}

#[test]
fn a_half_republished_store_is_not_yet_and_the_next_refresh_installs_the_new_bytes() {
    let len = 3 * CHUNK - 1000;
    for generation in ["v25", "v26"] {
        let cases: [(&str, Vec<u8>); 4] = [
            ("other digests, same sizes", artifact_bytes(2, len)),
            ("the served files are longer", artifact_bytes(3, len - 5000)),
            ("the served files are shorter", artifact_bytes(4, len + 900)),
            ("another chunk count", artifact_bytes(5, 4 * CHUNK - 10)),
        ];
        let old = artifact_bytes(1, len);
        for (what, new) in cases {
            let w = World::new(generation, &old);
            let staged = w.half_republish(&new);
            let out = w.run(&["refresh"]);
            let err = stderr(&out);
            assert!(!out.status.success(), "{generation} {what}: {err}");
            assert!(
                err.contains("nothing was counted as a failure"),
                "{generation} {what}: {err}"
            );
            assert!(err.contains("tries at once"), "{generation} {what}: {err}");
            assert_eq!(
                w.device.installed("pop223").as_deref(),
                Some(&old[..]),
                "{generation} {what}: the model in use is kept"
            );
            assert_eq!(w.retry(), None, "{generation} {what}: no failure counted");
            assert_eq!(w.device.param("Model").as_deref(), Some("pop223"));

            // The store completes: the very next refresh installs the new bytes.
            w.complete(staged.path());
            w.ok(&["refresh"]);
            assert_eq!(
                w.device.installed("pop223").as_deref(),
                Some(&new[..]),
                "{generation} {what}"
            );
            assert_eq!(w.retry(), None, "{generation} {what}");
        }
    }
}

/// A real failure (every origin refuses the new files) counts and gets a backoff for the
/// daemon, and the refresh says when the next try is; a person's next `refresh` tries again at
/// once and installs the bytes once the origin serves them.
#[test]
fn a_refresh_by_hand_retries_a_pending_model_at_once() {
    for generation in ["v25", "v26"] {
        let old = artifact_bytes(1, 2 * CHUNK);
        let new = artifact_bytes(6, 2 * CHUNK);
        let w = World::new(generation, &old);
        let staged = w.half_republish(&new);
        w.complete(staged.path());
        w.server.add_fault(
            &format!("/{HF_DIR}/models/{generation}/pop223/*"),
            Fault::Status(403),
            None,
        );
        w.server.add_fault(
            &format!("/{GH_DIR}/{generation}/pop223/*"),
            Fault::Status(403),
            None,
        );
        let out = w.ok(&["refresh"]);
        let err = stderr(&out);
        assert!(
            err.contains("`refresh` tries it again at once, and the daemon retries it on its own after a backoff"),
            "{err}"
        );
        assert!(!err.contains("every refresh retries it"), "{err}");
        let retry = w.retry().expect("a real failure is recorded");
        assert_eq!(retry["failures"], 1, "{retry}");
        assert!(
            retry["next_unix"].as_u64().unwrap() > manifest::UnixSeconds::now().0 + 200,
            "{retry}"
        );
        assert_eq!(w.device.installed("pop223").as_deref(), Some(&old[..]));

        // Well inside the backoff, a person's refresh asks the origin again at once.
        w.server.clear_faults();
        w.server.clear_requests();
        w.ok(&["refresh"]);
        assert!(
            w.server
                .requests()
                .iter()
                .any(|r| r.path.contains("pop223_driving_tinygrad.pkl.chunk")),
            "not retried at once"
        );
        assert_eq!(w.device.installed("pop223").as_deref(), Some(&new[..]));
        assert_eq!(w.retry(), None);
    }
}

/// The daemon meets a half-republished store: its log says "not yet" and when it asks again
/// (its refresh interval here, shorter than the 2 minutes), nothing is counted, and once the
/// store completes its next refresh installs the new bytes.
#[test]
fn the_daemon_asks_a_half_republished_store_again_soon_and_installs_once_it_completes() {
    for generation in ["v25", "v26"] {
        let old = artifact_bytes(1, 2 * CHUNK);
        let new = artifact_bytes(7, 2 * CHUNK);
        let w = World::new(generation, &old);
        let staged = w.half_republish(&new);
        let log_path = w.device.dir.path().join("daemon.log");
        let mut daemon = w.daemon(&log_path);
        let log = || fs::read_to_string(&log_path).unwrap_or_default();
        wait_for(
            "the not-yet log line",
            std::time::Duration::from_secs(30),
            || log().contains("refresh: not yet ("),
        );
        assert!(log().contains("next try in 2 s"), "{}", log());
        assert_eq!(w.retry(), None, "{generation}: nothing counted");
        assert_eq!(w.device.installed("pop223").as_deref(), Some(&old[..]));

        w.complete(staged.path());
        wait_for("the new bytes", std::time::Duration::from_secs(30), || {
            w.device.installed("pop223").as_deref() == Some(&new[..])
        });
        // SAFETY: our own child's pid.
        unsafe { libc::kill(daemon.id() as libc::pid_t, libc::SIGTERM) };
        assert!(daemon.wait().unwrap().success());
        assert_eq!(w.retry(), None, "{generation}: {}", log());
    }
}

/// A request from the UI that meets a store half-way through publishing its model is "not
/// yet", never "Download failed": `ModelDownloadProgress` says so with the real retry time (here
/// the daemon's 2 s refresh interval, shorter than 2 minutes), the request stays pending, and the
/// daemon's retry installs the bytes once the store is complete and ends with "Downloaded!".
#[test]
fn a_ui_request_that_meets_a_half_published_model_says_not_yet_and_is_retried() {
    for generation in ["v25", "v26"] {
        let old = artifact_bytes(1, 2 * CHUNK);
        let w = World::new(generation, &old);
        // `fresh1` joins the catalog; the store still serves other bytes for it.
        let described = artifact_bytes(9, 2 * CHUNK + 300);
        let pop = publish_model(&w.root, generation, "pop223", &old, Some(CHUNK));
        publish_model(
            &w.root,
            generation,
            "fresh1",
            &artifact_bytes(8, 2 * CHUNK + 300),
            Some(CHUNK),
        );
        let staged = tempfile::tempdir().unwrap();
        let fresh = publish_model(staged.path(), generation, "fresh1", &described, Some(CHUNK));
        write_manifest(
            &w.root,
            generation,
            manifest_json(generation, &[pop, fresh], true).as_bytes(),
        );
        let log_path = w.device.dir.path().join("daemon.log");
        let mut daemon = w.daemon(&log_path);
        let log = || fs::read_to_string(&log_path).unwrap_or_default();
        wait_for(
            "the first refresh",
            std::time::Duration::from_secs(30),
            || log().contains("refresh: "),
        );
        w.device.set_mem("ModelToDownload", "fresh1");
        let not_yet = "Not yet: the model is still being published; trying again in 2 s...";
        wait_for(
            "the not-yet text",
            std::time::Duration::from_secs(30),
            || w.device.mem("ModelDownloadProgress").as_deref() == Some(not_yet),
        );
        assert_eq!(
            w.device.mem("ModelToDownload").as_deref(),
            Some("fresh1"),
            "{generation}: the request is kept"
        );
        wait_for("the kept line", std::time::Duration::from_secs(5), || {
            log().contains("download fresh1: kept pending (not yet: ")
        });
        assert!(log().contains("next try in 2 s"), "{generation}: {}", log());
        assert!(
            !log().contains("Download failed"),
            "{generation}: {}",
            log()
        );
        assert_eq!(w.device.installed("fresh1"), None);

        w.complete_model(staged.path(), "fresh1");
        wait_for("the retry", std::time::Duration::from_secs(30), || {
            w.device.installed("fresh1").as_deref() == Some(&described[..])
        });
        wait_for(
            "the request done",
            std::time::Duration::from_secs(10),
            || {
                w.device.mem("ModelToDownload").is_none()
                    && w.device.mem("ModelDownloadProgress").as_deref() == Some("Downloaded!")
            },
        );
        // SAFETY: our own child's pid.
        unsafe { libc::kill(daemon.id() as libc::pid_t, libc::SIGTERM) };
        assert!(daemon.wait().unwrap().success());
        assert!(
            !log().contains("Download failed"),
            "{generation}: {}",
            log()
        );
    }
}
