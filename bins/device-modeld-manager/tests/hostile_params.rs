//! The real binary with hostile params and state files (oversized, FIFOs, directories, symlinks
//! to `/dev/zero`, trailing NULs, stale cancels) and what the UI and the log see, for v25 and a
//! made-up v26 (the device's openpilot tree at [`V26_PIN`], its pins file recording it).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use test_support::http_server::{Fault, FaultServer};
use test_support::published::{artifact_bytes, manifest_json, publish_model, write_manifest};

const CHUNK: usize = 256 * 1024;
/// `bounded::PARAM_LIMIT`.
const PARAM_LIMIT: u64 = 256 * 1024;

struct World {
    device: Device,
    server: FaultServer,
    base: String,
    /// The daemon's log (its stderr).
    log: PathBuf,
}

impl std::ops::Deref for World {
    type Target = Device;
    fn deref(&self) -> &Device {
        &self.device
    }
}

impl World {
    /// A fresh device on `generation` (v25, or v26 by its tree) and an origin publishing
    /// `pop223` and `other` for it as chunk sets.
    fn new(generation: &str) -> World {
        let device = Device::new();
        if generation == "v26" {
            set_tree(&device.openpilot(), V26_PIN, Some(&v26_pins()));
        }
        let root = device.dir.path().join("origin");
        fs::create_dir_all(&root).unwrap();
        let p = publish_model(
            &root,
            generation,
            "pop223",
            &artifact_bytes(71, 2 * CHUNK + 7),
            Some(CHUNK),
        );
        let o = publish_model(
            &root,
            generation,
            "other",
            &artifact_bytes(72, 8 * CHUNK + 5),
            Some(CHUNK),
        );
        write_manifest(
            &root,
            generation,
            manifest_json(generation, &[p, o], true).as_bytes(),
        );
        let server = FaultServer::start(&root).unwrap();
        let base = server.url();
        let log = device.dir.path().join("daemon.log");
        World {
            device,
            server,
            base,
            log,
        }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        self.command(&self.base, args)
    }

    /// The command run to its end, which must come within `limit` (a FIFO must not hang it).
    fn run_within(&self, args: &[&str], limit: Duration) -> Output {
        let child = self
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        let pid = child.id();
        let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
        while !waiter.is_finished() {
            if start.elapsed() > limit {
                // SAFETY: a plain kill(2) of our own child.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                panic!("{args:?} did not finish within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        waiter.join().unwrap()
    }

    /// The daemon, its stderr to [`World::log`].
    fn daemon(&self) -> Child {
        let log = fs::File::create(&self.log).unwrap();
        self.cmd(&["run", "--poll-ms", "50", "--retry-secs", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap()
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn progress(&self) -> Option<String> {
        self.mem("ModelDownloadProgress")
    }

    /// Waits until the daemon has logged its first refresh's result.
    fn wait_first_refresh(&self) {
        wait_for("the first refresh", Duration::from_secs(30), || {
            self.log_text().contains("device-modeld-manager: refresh")
        });
    }
}

fn sigterm_and_wait(mut child: Child) -> std::process::ExitStatus {
    // SAFETY: a plain kill(2) of our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn alive(child: &mut Child, log: &str) {
    assert!(
        child.try_wait().unwrap().is_none(),
        "the daemon exited: {log}"
    );
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// What a hostile writer can leave at a param's path.
const HOSTILE: [&str; 4] = ["oversized", "fifo", "directory", "symlink to /dev/zero"];

fn plant(path: &Path, kind: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let _ = fs::remove_file(path); // the value a refresh wrote

    match kind {
        // Sparse: no disk used.
        "oversized" => fs::File::create(path)
            .unwrap()
            .set_len(PARAM_LIMIT + 1)
            .unwrap(),
        "fifo" => mkfifo(path),
        "directory" => {
            fs::create_dir_all(path.join("inner")).unwrap();
            fs::write(path.join("inner/value"), b"pop223").unwrap();
        }
        "symlink to /dev/zero" => std::os::unix::fs::symlink("/dev/zero", path).unwrap(),
        _ => unreachable!("{kind}"),
    }
}

fn gone(path: &Path) -> bool {
    fs::symlink_metadata(path).is_err()
}

/// Each test `$t` (a `fn(&str)`) as two tests, `<$t>::v25` and `<$t>::v26`.
macro_rules! both_generations {
    ($($t:ident),* $(,)?) => {$(
        mod $t {
            #[test]
            fn v25() {
                super::$t("v25")
            }
            #[test]
            fn v26() {
                super::$t("v26")
            }
        }
    )*};
}

both_generations!(
    a_bad_request_param_is_reported_removed_and_the_daemon_keeps_serving,
    bad_persistent_params_and_state_records_read_as_absent_with_a_warning,
    params_are_read_as_upstream_reads_them_and_installs_get_the_models_mode,
    a_request_is_acknowledged_at_once_and_a_cancel_stops_any_phase,
    a_cancel_written_before_a_request_does_not_cancel_it,
    a_failure_is_logged_with_each_origins_reason,
    status_reports_an_interrupted_download,
    an_unreadable_is_onroad_is_logged_once_and_requests_wait_until_it_recovers,
    an_is_onroad_that_becomes_unreadable_stops_a_running_download,
    status_reports_an_unreadable_journal_and_refresh_stops_on_it,
);

/// An `IsOnroad` that becomes unreadable while the daemon downloads a request is not taken as
/// offroad: the download stops as it does onroad (its finished pieces kept), the request waits,
/// and once `IsOnroad` reads offroad again the download finishes.
fn an_is_onroad_that_becomes_unreadable_stops_a_running_download(generation: &str) {
    let w = World::new(generation);
    let mut child = w.daemon();
    w.wait_first_refresh();
    // Slow enough to be running when IsOnroad breaks.
    w.server.set_rate_per_conn(Some(200 * 1024));
    w.set_mem("ModelToDownload", "other");
    wait_for("the download running", Duration::from_secs(20), || {
        w.progress().is_some_and(|p| p.contains('%'))
    });
    let path = w.params().join("IsOnroad");
    plant(&path, "directory");
    wait_for("the download stopped", Duration::from_secs(10), || {
        w.log_text()
            .contains("IsOnroad cannot be read, so it is not taken as offroad; kept")
    });
    assert_eq!(w.mem("ModelToDownload").as_deref(), Some("other"));
    assert_eq!(w.installed("other"), None);
    let served = w.server.requests().len();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        w.server.requests().len(),
        served,
        "nothing fetched while unreadable"
    );
    alive(&mut child, &w.log_text());

    w.server.set_rate_per_conn(None);
    fs::remove_dir_all(&path).unwrap();
    w.set_param("IsOnroad", "0");
    wait_for("other downloaded", Duration::from_secs(60), || {
        w.installed("other").is_some()
    });
    assert!(sigterm_and_wait(child).success());
    assert!(!w.log_text().contains("not served"), "{}", w.log_text());
}

/// A journal that cannot be read (torn, a FIFO): `status` reads it once, reports it and answers
/// (within seconds: nothing blocks on the FIFO); `refresh` stops on it, naming it, as before; once
/// it is gone `status --json` has no `unreadable` key.
fn status_reports_an_unreadable_journal_and_refresh_stops_on_it(generation: &str) {
    let w = World::new(generation);
    let out = w.run_within(&["refresh"], Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    let journal = w.models().join(".migration.json");
    for kind in ["torn", "fifo"] {
        match kind {
            "torn" => fs::write(&journal, b"{\"from\": ").unwrap(),
            _ => mkfifo(&journal),
        }
        let out = w.run_within(&["status"], Duration::from_secs(20));
        assert!(out.status.success(), "{kind}: {}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        let line = format!(
            "unreadable: journal: {}: corrupt state file",
            journal.display()
        );
        assert!(text.contains(&line), "{kind}: {line:?} not in:\n{text}");
        let out = w.run_within(&["status", "--json"], Duration::from_secs(20));
        assert!(out.status.success(), "{kind}: {}", stderr(&out));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["generation"], generation);
        assert_eq!(doc["interrupted_migration"], serde_json::Value::Null);
        let unreadable = doc["unreadable"].as_array().expect("an unreadable list");
        assert_eq!(unreadable.len(), 1, "{kind}: {doc}");
        assert!(
            unreadable[0].as_str().unwrap().contains(".migration.json"),
            "{doc}"
        );

        let out = w.run_within(&["refresh"], Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(1), "{kind}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(".migration.json: corrupt state file"),
            "{kind}: {}",
            stderr(&out)
        );
        fs::remove_file(&journal).unwrap();
    }
    let out = w.run_within(&["status", "--json"], Duration::from_secs(20));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc.get("unreadable").is_none(), "{doc}");
}

/// A `ModelToDownload`, `CancelModelDownload`, `DownloadAllModels` or
/// `AllowGpuModelDownloadWithoutGpu` over the size cap, a FIFO,
/// a directory or a symlink to `/dev/zero`, at start or while running: the daemon says so in
/// `ModelDownloadProgress` and its log, removes it (never the symlink's target) and serves the
/// next request.
fn a_bad_request_param_is_reported_removed_and_the_daemon_keeps_serving(generation: &str) {
    let w = World::new(generation);
    let memory = w.memory();
    // There before the daemon starts (the supervisor would crash-loop a daemon that exits).
    plant(&memory.join("ModelToDownload"), "oversized");
    let mut child = w.daemon();
    wait_for(
        "the oversized request removed",
        Duration::from_secs(10),
        || gone(&memory.join("ModelToDownload")),
    );
    wait_for("the failure shown", Duration::from_secs(5), || {
        w.progress().as_deref() == Some("Download failed: request could not be read")
    });
    alive(&mut child, &w.log_text());
    w.wait_first_refresh();
    for key in [
        "ModelToDownload",
        "CancelModelDownload",
        "DownloadAllModels",
        "AllowGpuModelDownloadWithoutGpu",
    ] {
        for kind in HOSTILE {
            w.set_mem("ModelDownloadProgress", "stale");
            let path = memory.join(key);
            plant(&path, kind);
            wait_for(
                &format!("{key} ({kind}) removed"),
                Duration::from_secs(5),
                || gone(&path),
            );
            wait_for(
                &format!("{key} ({kind}) reported"),
                Duration::from_secs(5),
                || w.progress().as_deref() == Some("Download failed: request could not be read"),
            );
            alive(&mut child, &w.log_text());
        }
    }
    assert_eq!(fs::metadata("/dev/zero").unwrap().len(), 0);
    // Still serving: a good request is downloaded.
    w.set_mem("ModelToDownload", "pop223");
    wait_for("pop223 downloaded", Duration::from_secs(30), || {
        w.progress().as_deref() == Some("Downloaded!")
    });
    assert!(w.installed("pop223").is_some());
    assert!(sigterm_and_wait(child).success());
    let log = w.log_text();
    for want in [
        "request param ModelToDownload ignored:",
        "request param CancelModelDownload ignored:",
        "request param DownloadAllModels ignored:",
        "request param AllowGpuModelDownloadWithoutGpu ignored:",
        "262145 bytes, over the 262144-byte limit; removed",
        "not a regular file; removed",
    ] {
        assert!(log.contains(want), "{want:?} not in the log:\n{log}");
    }
}

/// `Model` oversized, `DrivingModel` a FIFO, `.choice.json` torn, `.refused-manifest.json` a
/// FIFO: `status` and `refresh` finish (within seconds: nothing blocks on a FIFO), each bad one
/// read as absent with a warning naming it; the refresh writes good state over them. The
/// rollback floor is not read leniently (see `trust_state`; tested in the signed tests).
fn bad_persistent_params_and_state_records_read_as_absent_with_a_warning(generation: &str) {
    let w = World::new(generation);
    let out = w.run_within(&["refresh"], Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(w.models().join(".choice.json").is_file());

    plant(&w.params().join("Model"), "oversized");
    plant(&w.params().join("DrivingModel"), "fifo");
    fs::write(w.models().join(".choice.json"), b"{\"wanted\": ").unwrap();
    mkfifo(&w.models().join(".refused-manifest.json"));

    let out = w.run_within(&["status", "--json"], Duration::from_secs(20));
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["generation"], generation);
    // Both selection params unreadable: the default, as for a device that never chose.
    assert_eq!(doc["selected"]["id"], "rdf43", "{doc}");
    let err = stderr(&out);
    for want in [
        "warning: param Model read as unset",
        "warning: param DrivingModel read as unset",
        ".choice.json",
        ".refused-manifest.json",
        "not a regular file",
        "over the 262144-byte limit",
    ] {
        assert!(err.contains(want), "{want:?} not in:\n{err}");
    }

    let out = w.run_within(&["refresh"], Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("warning: param Model read as unset"));
    // The refresh wrote good state over the bad records.
    let choice = fs::read(w.models().join(".choice.json")).unwrap();
    serde_json::from_slice::<serde_json::Value>(&choice).expect("a valid .choice.json again");
    assert!(gone(&w.models().join(".refused-manifest.json")));
    let out = w.run_within(&["status"], Duration::from_secs(20));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains(".choice.json"), "{}", stderr(&out));
}

/// `Model`/`DrivingModel` written with a trailing NUL and newline select the model as upstream
/// reads them; the installed model gets the models directory's mode (0644); a `download` of a
/// verified install says so and fetches nothing; a model name never carries a control character
/// into `AvailableModelNames`.
fn params_are_read_as_upstream_reads_them_and_installs_get_the_models_mode(generation: &str) {
    let w = World::new(generation);
    w.set_param("Model", "pop223\0\n");
    w.set_param("DrivingModel", "pop223\0");
    let out = w.run_within(&["refresh", "--json"], Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["selected"], "pop223", "{r}");
    let installed = w.models().join("pop223_driving_tinygrad.pkl");
    let out = w.run_within(&["resolve"], Duration::from_secs(20));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        installed.to_string_lossy()
    );
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&installed), 0o644);
    assert_eq!(mode(&w.models().join(".catalog.json")), 0o644);

    w.server.clear_requests();
    let out = w.run_within(&["download", "pop223"], Duration::from_secs(30));
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("a verified copy is installed; nothing was downloaded"),
        "{err}"
    );
    assert!(!err.contains("Downloaded!"), "{err}");
    assert!(
        !w.server
            .requests()
            .iter()
            .any(|r| r.path.contains("pop223_driving")),
        "no byte of it fetched"
    );
    let out = w.run_within(&["download", "other"], Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(mode(&w.models().join("other_driving_tinygrad.pkl")), 0o644);
    let names = w.param("AvailableModelNames").unwrap();
    assert!(!names.chars().any(char::is_control), "{names:?}");
}

/// A UI request shows `Downloading "<name>"...` within a second even when the origins never
/// answer; a cancel stops the stalled download, and a cancel written while a refresh is stuck
/// on a silent origin stops the refresh; the daemon goes on serving.
fn a_request_is_acknowledged_at_once_and_a_cancel_stops_any_phase(generation: &str) {
    let w = World::new(generation);
    let out = w.run_within(&["refresh"], Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    // From now on no origin answers.
    w.server.add_fault("/*", Fault::Stall, None);
    let mut child = w.daemon();
    // The daemon's own refresh is stuck on the silent origins: a cancel stops it.
    wait_for("the refresh job", Duration::from_secs(10), || {
        w.log_text().contains("job: refresh")
    });
    std::thread::sleep(Duration::from_millis(300));
    w.set_mem("CancelModelDownload", "1");
    wait_for("the refresh cancelled", Duration::from_secs(5), || {
        w.log_text().contains("refresh cancelled from the UI")
    });
    wait_for("the cancel flag dropped", Duration::from_secs(5), || {
        w.mem("CancelModelDownload").is_none()
    });
    alive(&mut child, &w.log_text());

    w.set_mem("ModelDownloadProgress", "stale text of an earlier request");
    let asked = Instant::now();
    w.set_mem("ModelToDownload", "other");
    wait_for("the acknowledgement", Duration::from_secs(5), || {
        w.progress().as_deref() == Some("Downloading \"Model other\"...")
    });
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "acknowledged after {:?}",
        asked.elapsed()
    );
    std::thread::sleep(Duration::from_millis(300));
    w.set_mem("CancelModelDownload", "1");
    wait_for("the download cancelled", Duration::from_secs(5), || {
        w.progress().as_deref() == Some("Download cancelled...")
    });
    wait_for("the request cleared", Duration::from_secs(5), || {
        w.mem("ModelToDownload").is_none() && w.mem("CancelModelDownload").is_none()
    });
    assert!(w.installed("other").is_none());
    alive(&mut child, &w.log_text());
    assert!(sigterm_and_wait(child).success());
}

/// A `CancelModelDownload` written just before a new `ModelToDownload` (for the request before
/// it) does not cancel the new one, nor the refresh the daemon starts with; both are there
/// when the daemon first looks.
fn a_cancel_written_before_a_request_does_not_cancel_it(generation: &str) {
    let w = World::new(generation);
    w.set_mem("CancelModelDownload", "1");
    w.set_mem("ModelToDownload", "other");
    let child = w.daemon();
    w.wait_first_refresh();
    assert!(
        !w.log_text().contains("refresh cancelled"),
        "{}",
        w.log_text()
    );
    wait_for("other downloaded", Duration::from_secs(30), || {
        w.progress().as_deref() == Some("Downloaded!")
    });
    assert!(w.installed("other").is_some());
    assert_eq!(w.mem("CancelModelDownload"), None);
    assert!(sigterm_and_wait(child).success());
}

/// A request that fails on every origin is logged on one line naming each origin's reason.
fn a_failure_is_logged_with_each_origins_reason(generation: &str) {
    let w = World::new(generation);
    let child = w.daemon();
    w.wait_first_refresh();
    w.server.add_fault(
        &format!("/hf/models/{generation}/pop223/*"),
        Fault::Status(503),
        None,
    );
    w.server.add_fault(
        &format!("/gh/{generation}/pop223/*"),
        Fault::Status(404),
        None,
    );
    w.set_mem("ModelToDownload", "pop223");
    wait_for("the failure", Duration::from_secs(30), || {
        w.progress()
            .is_some_and(|p| p.starts_with("Download failed") || p.contains("offline"))
    });
    assert!(sigterm_and_wait(child).success());
    let log = w.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("download pop223:"))
        .unwrap_or_else(|| panic!("no result line for the request:\n{log}"));
    assert!(!line.trim_end().ends_with(':'), "{line}");
    assert!(line.contains("503") && line.contains("404"), "{line}");
}

/// A download killed half-way is reported by `status` (which file, how far, that the next
/// download resumes it), and `download` resumes it.
fn status_reports_an_interrupted_download(generation: &str) {
    let w = World::new(generation);
    let out = w.run_within(&["refresh"], Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    // Slow enough to be killed in the middle.
    w.server.set_rate_per_conn(Some(200 * 1024));
    let mut child = w
        .cmd(&["download", "other", "--connections", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let staging = w.models().join(".starpilot-staging");
    wait_for("a staged chunk", Duration::from_secs(30), || {
        fs::read_dir(&staging).is_ok_and(|rd| {
            rd.flatten().any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                // The record itself (not a temporary of its atomic rewrite) with a piece done.
                !n.starts_with('.')
                    && n.ends_with(".state")
                    && fs::read_to_string(e.path()).is_ok_and(|t| t.lines().count() >= 2)
            })
        })
    });
    child.kill().unwrap();
    child.wait().unwrap();
    w.server.set_rate_per_conn(None);

    let out = w.run_within(&["status", "--json"], Duration::from_secs(20));
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &doc["interrupted_downloads"][0];
    assert_eq!(d["id"], "other", "{doc}");
    assert_eq!(d["file"], "other_driving_tinygrad.pkl");
    assert_eq!(d["current"], true);
    let (done, size) = (
        d["done_bytes"].as_u64().unwrap(),
        d["size"].as_u64().unwrap(),
    );
    assert!(done >= CHUNK as u64 && done < size, "{d}");
    let out = w.run_within(&["status"], Duration::from_secs(20));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("interrupted download: other (other_driving_tinygrad.pkl)")
            && text.contains("the next download of it resumes there"),
        "{text}"
    );
    assert!(
        stderr(&out).contains("next: `download other` resumes"),
        "{}",
        stderr(&out)
    );

    let out = w.run_within(&["download", "other"], Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = w.run_within(&["status", "--json"], Duration::from_secs(20));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["interrupted_downloads"], serde_json::json!([]), "{doc}");
}

/// An `IsOnroad` that cannot be read (oversized, a FIFO, a directory, a symlink to
/// `/dev/zero`) is not taken as offroad: the daemon logs it once (not a "not served" line every
/// poll), a pending request waits untouched, and once `IsOnroad` can be read again (offroad) it
/// logs that once and serves the request.
fn an_unreadable_is_onroad_is_logged_once_and_requests_wait_until_it_recovers(generation: &str) {
    let w = World::new(generation);
    let mut child = w.daemon();
    w.wait_first_refresh();
    let path = w.params().join("IsOnroad");
    let count = |what: &str| w.log_text().matches(what).count();
    for (i, kind) in HOSTILE.iter().enumerate() {
        plant(&path, kind);
        wait_for(
            &format!("IsOnroad ({kind}) logged"),
            Duration::from_secs(10),
            || count("IsOnroad cannot be read") == i + 1,
        );
        if i == 0 {
            w.set_mem("ModelToDownload", "pop223");
            // Many polls (50 ms each) with the request pending.
            std::thread::sleep(Duration::from_millis(1500));
            assert_eq!(w.mem("ModelToDownload").as_deref(), Some("pop223"));
            assert_eq!(w.installed("pop223"), None);
        }
        assert_eq!(count("IsOnroad cannot be read"), i + 1, "{}", w.log_text());
        assert!(!w.log_text().contains("not served"), "{}", w.log_text());
        alive(&mut child, &w.log_text());
        if fs::symlink_metadata(&path).unwrap().is_dir() {
            fs::remove_dir_all(&path).unwrap();
        } else {
            fs::remove_file(&path).unwrap();
        }
        w.set_param("IsOnroad", "0");
        wait_for(
            &format!("IsOnroad ({kind}) readable again"),
            Duration::from_secs(10),
            || count("IsOnroad can be read again; offroad") == i + 1,
        );
        if i == 0 {
            wait_for("pop223 downloaded", Duration::from_secs(30), || {
                w.progress().as_deref() == Some("Downloaded!")
            });
            assert!(w.installed("pop223").is_some());
        }
    }
    assert_eq!(fs::metadata("/dev/zero").unwrap().len(), 0);
    assert!(sigterm_and_wait(child).success());
    let log = w.log_text();
    assert_eq!(
        log.matches("IsOnroad cannot be read").count(),
        HOSTILE.len(),
        "{log}"
    );
    assert!(!log.contains("not served"), "{log}");
}
