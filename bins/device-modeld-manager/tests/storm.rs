//! No download storm (docs/device.md, *Origin policy*): when both origins serve bytes of the
//! right length that do not match the manifest (a republish interrupted and left alone), the
//! daemon transfers the artifact at most once per origin per store change, however often it
//! asks again, and across a restart; a changed store is worth one transfer more, and a
//! completed one installs. Bytes
//! served are counted by the fault-injecting server over a fixed window. For v25 and a made-up
//! v26.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;
use test_support::http_server::FaultServer;
use test_support::published::{
    GH_DIR, HF_DIR, artifact_bytes, manifest_json, publish_model, write_manifest,
};

const CHUNK: usize = 128 * 1024;

/// The manifest of `bytes` on both origins, the files left as they are; the files of the
/// republish go to a directory returned, to land later (or never).
fn half_republish(root: &Path, generation: &str, bytes: &[u8]) -> tempfile::TempDir {
    let staged = tempfile::tempdir().unwrap();
    let m = publish_model(staged.path(), generation, "pop223", bytes, Some(CHUNK));
    write_manifest(
        root,
        generation,
        manifest_json(generation, &[m], true).as_bytes(),
    );
    staged
}

fn complete(root: &Path, staged: &Path, generation: &str) {
    for layout in [HF_DIR, GH_DIR] {
        let dir = match layout {
            HF_DIR => format!("{layout}/models/{generation}/pop223"),
            _ => format!("{layout}/{generation}/pop223"),
        };
        let to = root.join(&dir);
        let _ = fs::remove_dir_all(&to);
        fs::create_dir_all(&to).unwrap();
        for e in fs::read_dir(staged.join(&dir)).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Body bytes each origin served under the model's directory so far (payload and small files).
fn served(server: &FaultServer, generation: &str) -> (u64, u64) {
    (
        server.body_bytes_under(&format!("/{HF_DIR}/models/{generation}/pop223/")),
        server.body_bytes_under(&format!("/{GH_DIR}/{generation}/pop223/")),
    )
}

/// What one download attempt may cost an origin: the artifact, plus one refetch of each chunk
/// that failed its digest (the downloader retries a chunk once within an attempt), plus small
/// files.
fn one_attempt(size: usize) -> u64 {
    2 * size as u64 + 16 * 1024
}

/// Small files only (manifest-side requests of a refresh that transfers nothing).
const SMALL: u64 = 16 * 1024;

fn not_yet_lines(log: &Path) -> usize {
    fs::read_to_string(log)
        .unwrap_or_default()
        .matches("refresh: not yet (")
        .count()
}

fn both_origins_serving_other_bytes_cost_one_transfer_per_store_change(generation: &str) {
    let device = Device::new();
    if generation != "v25" {
        set_tree(&device.openpilot(), V26_PIN, Some(&v26_pins()));
    }
    let root: PathBuf = device.dir.path().join("origin");
    fs::create_dir_all(&root).unwrap();
    let size = 2 * CHUNK;
    let old = artifact_bytes(1, size);
    let m = publish_model(&root, generation, "pop223", &old, Some(CHUNK));
    write_manifest(
        &root,
        generation,
        manifest_json(generation, &[m], true).as_bytes(),
    );
    for (k, v) in [("Model", "pop223"), ("DrivingModel", "pop223")] {
        device.set_param(k, v);
    }
    let server = FaultServer::start(&root).unwrap();
    let out = device
        .command(&server.url(), &["refresh"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    // Interrupted and left alone: the manifest names new bytes of the same length, both
    // origins still serve the old ones.
    let new = artifact_bytes(7, size);
    let _abandoned = half_republish(&root, generation, &new);
    server.clear_requests();
    let log = device.dir.path().join("daemon.log");
    let mut daemon = device
        .command(
            &server.url(),
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
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // The first refresh transfers once from each origin; then a fixed window of 10 s (about
    // five more refreshes at the daemon's 2 s interval) transfers nothing more.
    let text = || fs::read_to_string(&log).unwrap_or_default();
    wait_for("the first not-yet", Duration::from_secs(30), || {
        not_yet_lines(&log) >= 1
    });
    let first = served(&server, generation);
    assert!(
        first.0 > 0 && first.1 > 0 && first.0 <= one_attempt(size) && first.1 <= one_attempt(size),
        "{generation}: served {first:?}: {}",
        text()
    );
    let (start, asked) = (Instant::now(), not_yet_lines(&log));
    std::thread::sleep(Duration::from_secs(10));
    let asked = not_yet_lines(&log) - asked;
    assert!(asked >= 3, "the daemon kept asking ({asked}): {}", text());
    let window = served(&server, generation);
    assert!(
        window.0 - first.0 <= SMALL && window.1 - first.1 <= SMALL,
        "{generation}: no transfer in {:?} and {asked} refreshes, served {first:?} then \
         {window:?} of a {size}-byte artifact: {}",
        start.elapsed(),
        text()
    );
    assert!(
        text().contains("the store says exactly what it said when it served other bytes"),
        "{}",
        text()
    );
    assert_eq!(device.installed("pop223").as_deref(), Some(&old[..]));

    // Restarted, the daemon still remembers the store (its file): nothing transferred again.
    // SAFETY: our own child's pid.
    unsafe { libc::kill(daemon.id() as libc::pid_t, libc::SIGTERM) };
    assert!(daemon.wait().unwrap().success());
    let log = device.dir.path().join("daemon-restarted.log");
    let mut daemon = device
        .command(
            &server.url(),
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
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let text = || fs::read_to_string(&log).unwrap_or_default();
    wait_for(
        "two not-yets after the restart",
        Duration::from_secs(30),
        || not_yet_lines(&log) >= 2,
    );
    let restarted = served(&server, generation);
    assert!(
        restarted.0 - window.0 <= SMALL && restarted.1 - window.1 <= SMALL,
        "{generation}: no transfer after a restart, served {window:?} then {restarted:?}: {}",
        text()
    );
    assert!(
        text().contains("the store says exactly what it said when it served other bytes"),
        "{}",
        text()
    );
    let window = restarted;

    // The store changes (another interrupted republish): one transfer more per origin.
    let newer = artifact_bytes(8, size);
    let staged = half_republish(&root, generation, &newer);
    let seen = not_yet_lines(&log);
    wait_for("two more refreshes", Duration::from_secs(20), || {
        not_yet_lines(&log) >= seen + 3
    });
    let second = served(&server, generation);
    for (before, after) in [(window.0, second.0), (window.1, second.1)] {
        assert!(
            after > before + SMALL && after - before <= one_attempt(size),
            "{generation}: one more attempt per origin, served {window:?} then {second:?}: {}",
            text()
        );
    }

    // Completed: the next refresh installs it.
    complete(&root, staged.path(), generation);
    wait_for("the new bytes", Duration::from_secs(30), || {
        device.installed("pop223").as_deref() == Some(&newer[..])
    });
    // SAFETY: our own child's pid.
    unsafe { libc::kill(daemon.id() as libc::pid_t, libc::SIGTERM) };
    assert!(daemon.wait().unwrap().success());
    let last = served(&server, generation);
    assert!(
        last.0 - second.0 <= size as u64 + SMALL,
        "{last:?}: {}",
        text()
    );
}

mod both_origins_serving_other_bytes_cost_one_transfer_per_store_change {
    #[test]
    fn v25() {
        super::both_origins_serving_other_bytes_cost_one_transfer_per_store_change("v25")
    }
    #[test]
    fn v26() {
        super::both_origins_serving_other_bytes_cost_one_transfer_per_store_change("v26")
    }
}

/// The daily byte budget holds across daemon restarts even when the stale-store memory is lost
/// each time (its file removed): restarted after each "not yet", the daemon transfers again only
/// while the day's count leaves room for one more artifact, then starts none; the whole day
/// costs at most the budget plus one download from each origin. Held back is no failure: one
/// log line for the day, no retry scheduled. `status` shows the exact bytes (`--json`) and that
/// the automatic refresh holds the artifact back.
fn the_daily_budget_holds_across_restarts(generation: &str) {
    let device = Device::new();
    if generation != "v25" {
        set_tree(&device.openpilot(), V26_PIN, Some(&v26_pins()));
    }
    let root: PathBuf = device.dir.path().join("origin");
    fs::create_dir_all(&root).unwrap();
    let size = 2 * CHUNK;
    let m = publish_model(
        &root,
        generation,
        "pop223",
        &artifact_bytes(1, size),
        Some(CHUNK),
    );
    write_manifest(
        &root,
        generation,
        manifest_json(generation, &[m], true).as_bytes(),
    );
    for (k, v) in [("Model", "pop223"), ("DrivingModel", "pop223")] {
        device.set_param(k, v);
    }
    let server = FaultServer::start(&root).unwrap();
    let out = device
        .command(&server.url(), &["refresh"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let _abandoned = half_republish(&root, generation, &artifact_bytes(7, size));
    server.clear_requests();
    let mut logs = String::new();
    let mut refused = None;
    for run in 0..6 {
        // The stale-store memory lost each time (a file that cannot be kept): the budget alone.
        let _ = fs::remove_file(device.models().join(".stale-stores.json"));
        let log = device.dir.path().join(format!("daemon{run}.log"));
        let mut child = device
            .command(
                &server.url(),
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
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let text = || fs::read_to_string(&log).unwrap_or_default();
        let until = Instant::now() + Duration::from_secs(30);
        // Held back, the refresh keeps the installed model and ends without a transfer.
        let held = || text().contains(&format!("refresh: {generation} manifest from"));
        while !(not_yet_lines(&log) >= 1 || held()) {
            assert!(
                Instant::now() < until,
                "{generation} run {run}: neither a not-yet nor the budget: {logs}{}",
                text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let before = served(&server, generation);
        let over = held();
        if over {
            // Held back: nothing more over a window of a few refreshes.
            std::thread::sleep(Duration::from_secs(5));
        }
        // SAFETY: our own child's pid.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        assert!(child.wait().unwrap().success());
        logs += &text();
        if over {
            let after = served(&server, generation);
            assert!(
                after.0 - before.0 <= SMALL && after.1 - before.1 <= SMALL,
                "{generation}: held back, served {before:?} then {after:?}: {logs}"
            );
            // Held back is not a failure: one log line for the day however many refreshes
            // meet it, in human sizes, and no failure counted (no retry scheduled).
            let text = text();
            let refreshes = text
                .matches(&format!("refresh: {generation} manifest from"))
                .count();
            let held: Vec<&str> = text.lines().filter(|l| l.contains("held back")).collect();
            assert!(
                refreshes >= 2,
                "{generation}: {refreshes} refreshes: {text}"
            );
            assert_eq!(held.len(), 1, "{generation}: {text}");
            assert!(
                held[0].contains(&format!("{generation}/"))
                    && held[0].contains("pop223_driving_tinygrad.pkl: held back, fetched ")
                    && held[0].contains(" MiB of today's 2.50 MiB budget; tries again after ")
                    && held[0].contains("T00:00:00Z"),
                "{generation}: {text}"
            );
            // The UI says why, not "download failed".
            assert_eq!(
                device.mem("ModelDownloadProgress").as_deref(),
                Some(
                    "Today's download budget for this model is used up; it downloads tomorrow, or now if you ask for it."
                ),
                "{generation}: {text}"
            );
            let choice = fs::read_to_string(device.models().join(".choice.json")).unwrap();
            let choice: serde_json::Value = serde_json::from_str(&choice).unwrap();
            assert!(
                choice["retry"].get("pop223").is_none(),
                "{generation}: no failure counted for a hold-back: {choice}"
            );
            refused = Some((run, after));
            break;
        }
    }
    let Some((run, total)) = refused else {
        panic!("{generation}: six restarts, never held back: {logs}")
    };
    assert!(
        run >= 1,
        "{generation}: the first run already over budget: {logs}"
    );
    // The refresh by hand (one size) is counted too; the day is bounded by the budget (10
    // sizes) plus one download from each origin.
    let bound = 10 * size as u64 + 2 * one_attempt(size);
    assert!(
        total.0 + total.1 <= bound,
        "{generation}: {total:?} over {bound}: {logs}"
    );

    let out = device
        .command(&server.url(), &["status", "--json"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["fetched_today"]["artifacts"].as_array().unwrap().clone();
    let row = rows
        .iter()
        .find(|r| {
            r["artifact"]
                .as_str()
                .is_some_and(|a| a.ends_with("pop223_driving_tinygrad.pkl"))
        })
        .unwrap_or_else(|| panic!("{v}"));
    let bytes = row["bytes"].as_u64().unwrap();
    // Every payload byte the daemons received, and the refresh by hand's.
    assert!(bytes > 9 * size as u64, "{row}");
    assert!(bytes <= total.0 + total.1 + size as u64, "{row} {total:?}");
    assert_eq!(row["budget"].as_u64(), Some(10 * size as u64), "{row}");
    assert_eq!(row["held_back"], true, "{row}");
    let out = device
        .command(&server.url(), &["status"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let human = String::from_utf8_lossy(&out.stdout).to_string() + &stderr(&out);
    assert!(
        human.contains("fetched today:") && human.contains("fetches it again tomorrow"),
        "{human}"
    );
}

mod the_daily_budget_holds_across_restarts {
    #[test]
    fn v25() {
        super::the_daily_budget_holds_across_restarts("v25")
    }
    #[test]
    fn v26() {
        super::the_daily_budget_holds_across_restarts("v26")
    }
}
