//! What actually runs: a fake modeld writes its load receipt in every shape (good, fallback,
//! stalled, stale, malformed, symlinked file or directory, oversized, foreign owner, wrong
//! mode, FIFO), and the real binary's `status` says the right thing every time and never
//! follows a link. On a v26-contract tree and a made-up v27 that inherits v26's contract; on a
//! v25 tree `status` is unchanged (no `running` at all, even with a receipt there).
//!
//! The receipt is checked here against the format as the reference states it, not through the
//! manager's own parser: each test writes the JSON itself.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{Value, json};

use crate::common::{Device, set_tree};

const V26_PIN: &str = "26262626262626262626262626262626262626aa";
const V27_PIN: &str = "27272727272727272727272727272727272727bb";
const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// The generations a test runs on: `v26` declared with v26's contract, and a made-up `v27`
/// after it, which inherits that contract.
fn pins() -> String {
    json!({
        "v25": manifest::layout::CURRENT_TINYGRAD_COMMIT,
        "v26": {"tinygrad": V26_PIN, "contract": "v26"},
        "v27": V27_PIN,
    })
    .to_string()
}

struct Car {
    device: Device,
}

impl Car {
    fn on(pin: &str) -> Car {
        let device = Device::new();
        set_tree(&device.openpilot(), pin, Some(&pins()));
        Car { device }
    }
    fn shm(&self) -> PathBuf {
        self.device.dir.path().join("shm")
    }
    fn receipt_dir(&self) -> PathBuf {
        self.shm().join("starpilot_modeld_d")
    }
    fn receipt(&self) -> PathBuf {
        self.receipt_dir().join("load-v1.json")
    }
    /// The fake modeld: the directory 0700, the file 0600, as modeld makes them.
    fn modeld_writes(&self, body: &[u8]) {
        let dir = self.receipt_dir();
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let tmp = dir.join(".load-tmp");
        fs::write(&tmp, body).unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600)).unwrap();
        fs::rename(&tmp, self.receipt()).unwrap();
    }
    fn status(&self) -> Output {
        let shm = self.shm();
        let mut c = self
            .device
            .command("http://127.0.0.1:9", &["status", "--json"]);
        c.arg("--shm-dir").arg(&shm).env_remove("OPENPILOT_PREFIX");
        c.output().unwrap()
    }
    fn status_json(&self) -> Value {
        let out = self.status();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
    fn status_text(&self) -> String {
        let mut c = self.device.command("http://127.0.0.1:9", &["status"]);
        c.arg("--shm-dir")
            .arg(self.shm())
            .env_remove("OPENPILOT_PREFIX");
        let out = c.output().unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// This test process: alive, with its real start ticks (field 22 of `/proc/self/stat`).
fn me() -> (u64, u64) {
    let stat = fs::read_to_string("/proc/self/stat").unwrap();
    let tail = &stat[stat.rfind(')').unwrap() + 2..];
    let ticks = tail.split_whitespace().nth(19).unwrap().parse().unwrap();
    (std::process::id() as u64, ticks)
}

fn receipt(model: &str, variant: &str, reason: Value) -> Value {
    let (pid, ticks) = me();
    json!({"version": 1, "pid": pid, "processStartTicks": ticks, "loadedMonoNs": 123456789,
           "modelId": model, "variant": variant, "artifactSha256": SHA, "fallbackReason": reason})
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

fn running(car: &Car) -> Value {
    car.status_json()["running"].clone()
}

fn unavailable_because(car: &Car, word: &str) {
    let r = running(car);
    assert_eq!(r["state"], "unavailable", "{r}");
    assert!(r["id"].is_null() && r["artifact_sha256"].is_null(), "{r}");
    let why = r["why"].as_str().unwrap();
    assert!(why.contains(word), "{word:?} not in {why:?}");
    assert!(r["matches_selection"].is_null(), "{r}");
}

fn every_shape(pin: &str) {
    let car = Car::on(pin);
    // Nothing written yet.
    unavailable_because(&car, "does not exist");

    // Good: the bundled model, as resolve answers on a device with no catalog yet.
    car.modeld_writes(&bytes(&receipt("bundled-current", "small", Value::Null)));
    let r = running(&car);
    assert_eq!(
        (&r["state"], &r["id"], &r["variant"], &r["artifact_sha256"]),
        (
            &json!("running"),
            &json!("bundled-current"),
            &json!("small"),
            &json!(SHA)
        )
    );
    assert_eq!(r["fallback_reason"], Value::Null);
    assert_eq!(r["pid"], json!(me().0));
    assert_eq!(r["matches_selection"], json!(true));
    let text = car.status_text();
    assert!(
        text.contains(&format!(
            "running: bundled-current (small variant, sha256 {SHA}), fallback: none"
        )),
        "{text}"
    );

    // Fallback: the selected model failed; the bundled one runs.
    car.modeld_writes(&bytes(&receipt(
        "bundled-current",
        "small",
        json!("selected-load-failed"),
    )));
    let r = running(&car);
    assert_eq!(r["fallback_reason"], "selected-load-failed");
    assert!(car.status_text().contains("fallback: selected-load-failed"));

    // Stalled: Chestnut's output stopped, Small restarted.
    car.modeld_writes(&bytes(&receipt(
        "bundled-current",
        "small",
        json!("chestnut-run-stalled"),
    )));
    assert_eq!(running(&car)["fallback_reason"], "chestnut-run-stalled");

    // Another model runs than the device would load: flagged.
    car.modeld_writes(&bytes(&receipt("pop226", "small", Value::Null)));
    let r = running(&car);
    assert_eq!(r["matches_selection"], json!(false), "{r}");
    assert!(
        r["difference"]
            .as_str()
            .unwrap()
            .contains("modeld runs pop226")
    );

    // Stale: the process that wrote it is gone (start ticks of another process).
    let mut stale = receipt("bundled-current", "small", Value::Null);
    stale["processStartTicks"] = json!(me().1 + 1);
    car.modeld_writes(&bytes(&stale));
    let r = running(&car);
    assert_eq!(
        (&r["state"], &r["id"]),
        (&json!("stale"), &json!("bundled-current"))
    );
    assert!(r["matches_selection"].is_null());

    // Malformed, each way: unavailable, never a guess.
    for (body, word) in [
        (b"{".to_vec(), "not a JSON object"),
        (bytes(&json!({"version": 1})), "keys"),
        (
            bytes(&{
                let mut v = receipt("bundled-current", "small", Value::Null);
                v["fallbackReason"] = json!("invented-reason");
                v
            }),
            "fallbackReason",
        ),
        (
            bytes(&{
                let mut v = receipt("bundled-current", "small", Value::Null);
                v["version"] = json!(2);
                v
            }),
            "version",
        ),
    ] {
        car.modeld_writes(&body);
        unavailable_because(&car, word);
    }

    // Oversized.
    let mut big = bytes(&receipt("bundled-current", "small", Value::Null));
    big.resize(1025, b' ');
    car.modeld_writes(&big);
    unavailable_because(&car, "limit");

    // Wrong mode: the file readable by others, then the directory open to others.
    car.modeld_writes(&bytes(&receipt("bundled-current", "small", Value::Null)));
    fs::set_permissions(car.receipt(), fs::Permissions::from_mode(0o644)).unwrap();
    unavailable_because(&car, "mode 644");
    fs::set_permissions(car.receipt(), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(car.receipt_dir(), fs::Permissions::from_mode(0o755)).unwrap();
    unavailable_because(&car, "mode 755");
    fs::set_permissions(car.receipt_dir(), fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(running(&car)["state"], "running");

    // Foreign owner (as root, the file then the directory given to another uid).
    if unsafe { libc::geteuid() } == 0 {
        chown(&car.receipt(), 4321);
        unavailable_because(&car, "owner 4321");
        chown(&car.receipt(), 0);
        chown(&car.receipt_dir(), 4321);
        unavailable_because(&car, "owner 4321");
        chown(&car.receipt_dir(), 0);
        assert_eq!(running(&car)["state"], "running");
    }

    // A symlinked file: the link names a good receipt, and is not followed.
    let elsewhere = car.device.dir.path().join("elsewhere");
    fs::create_dir_all(&elsewhere).unwrap();
    fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o700)).unwrap();
    let target = elsewhere.join("load-v1.json");
    fs::write(
        &target,
        bytes(&receipt("bundled-current", "small", Value::Null)),
    )
    .unwrap();
    fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).unwrap();
    fs::remove_file(car.receipt()).unwrap();
    symlink(&target, car.receipt()).unwrap();
    unavailable_because(&car, "symbolic link");
    fs::remove_file(car.receipt()).unwrap();

    // A FIFO at the receipt's path: refused at once, nothing blocks.
    mkfifo(&car.receipt());
    let t = std::time::Instant::now();
    unavailable_because(&car, "not a regular file");
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
    fs::remove_file(car.receipt()).unwrap();

    // A symlinked directory holding a good receipt: not followed.
    fs::remove_dir_all(car.receipt_dir()).unwrap();
    symlink(&elsewhere, car.receipt_dir()).unwrap();
    unavailable_because(&car, "symbolic link");
}

fn chown(p: &Path, uid: u32) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::lchown(c.as_ptr(), uid, uid) }, 0);
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn status_says_what_runs_on_a_v26_contract_tree() {
    every_shape(V26_PIN);
}

#[test]
fn status_says_what_runs_on_a_made_up_v27_with_v26s_contract() {
    every_shape(V27_PIN);
}

/// `OPENPILOT_PREFIX` names the receipt's directory; one modeld would refuse is unavailable.
#[test]
fn the_prefix_names_the_directory() {
    let car = Car::on(V26_PIN);
    let dir = car.shm().join("starpilot_modeld_t3");
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    let f = dir.join("load-v1.json");
    fs::write(&f, bytes(&receipt("bundled-current", "small", Value::Null))).unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    let run = |prefix: &str| -> Value {
        let mut c = car
            .device
            .command("http://127.0.0.1:9", &["status", "--json"]);
        c.arg("--shm-dir")
            .arg(car.shm())
            .env("OPENPILOT_PREFIX", prefix);
        let out = c.output().unwrap();
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["running"].clone()
    };
    assert_eq!(run("t3")["state"], "running");
    let r = run("../t3");
    assert_eq!(r["state"], "unavailable");
    assert!(
        r["why"].as_str().unwrap().contains("OPENPILOT_PREFIX"),
        "{r}"
    );
}

/// v25: nothing read, nothing shown, even with a good receipt in place.
#[test]
fn a_v25_tree_shows_nothing_new() {
    let car = Car {
        device: Device::new(),
    };
    car.modeld_writes(&bytes(&receipt("bundled-current", "small", Value::Null)));
    let j = car.status_json();
    assert!(
        j.get("running").is_none() && j.get("bad_artifacts").is_none(),
        "{j}"
    );
    assert!(!car.status_text().contains("running:"));
}

/// The daemon (`run`) says what runs in its log and in `ModelDownloadProgress`, and flags a
/// difference from what it would have modeld load within the contract's 5 s.
#[test]
fn the_daemon_flags_a_difference_within_five_seconds() {
    use std::time::{Duration, Instant};
    let car = Car::on(V26_PIN);
    car.modeld_writes(&bytes(&receipt("bundled-current", "small", Value::Null)));
    let log = car.device.dir.path().join("daemon.log");
    let mut c = car
        .device
        .command("http://127.0.0.1:9", &["run", "--poll-ms", "20"]);
    c.arg("--shm-dir")
        .arg(car.shm())
        .env_remove("OPENPILOT_PREFIX")
        .stdout(std::process::Stdio::null())
        .stderr(fs::File::create(&log).unwrap());
    let mut child = c.spawn().unwrap();
    let progress = || car.device.mem("ModelDownloadProgress").unwrap_or_default();
    let sha12 = &SHA[..12];
    crate::common::wait_for("the running model shown", Duration::from_secs(30), || {
        progress() == format!("Running bundled-current (small, sha256 {sha12}), fallback: none")
    });
    let text = || fs::read_to_string(&log).unwrap_or_default();
    // The param is written before the log line (`load_receipt::Watcher::tick`): wait for it.
    crate::common::wait_for("the running model logged", Duration::from_secs(30), || {
        text().contains("running: bundled-current (small variant")
    });
    // modeld restarts on another model than the device would have it load.
    let t = Instant::now();
    car.modeld_writes(&bytes(&receipt(
        "pop226",
        "small",
        json!("selected-load-failed"),
    )));
    crate::common::wait_for("the difference flagged", Duration::from_secs(30), || {
        text().contains(
            "differs: the bundled model is selected and installed, but modeld runs pop226",
        )
    });
    let took = t.elapsed();
    // The daemon logs the line first, then writes the param: wait for that too.
    crate::common::wait_for(
        "the new running model shown",
        Duration::from_secs(30),
        || progress().starts_with("Running pop226 (small, sha256"),
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // The contract's republish interval, plus a poll and a scheduling margin.
    assert!(took < Duration::from_millis(6500), "flagged after {took:?}");
}
