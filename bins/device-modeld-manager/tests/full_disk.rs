//! A full `/data` (docs/device.md, *Free space*): a download cut by a full disk leaves its
//! preallocated staging file; once space is freed, the update installs without a manual step
//! (no `gc`, nothing removed by hand). A refresh blocked on space exits 8 with the amount
//! needed, and the daemon logs it and shows it in `ModelDownloadProgress`. On a small tmpfs
//! mounted over the models directory; for v25 and a made-up v26.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;
use test_support::http_server::FaultServer;
use test_support::published::{artifact_bytes, manifest_json, publish_model, write_manifest};

const MIB: u64 = 1024 * 1024;

/// A tmpfs of `size` over `dir`, unmounted when dropped (also when the test fails).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: u64) -> Option<Tmpfs> {
        fs::create_dir_all(dir).unwrap();
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            .then(|| Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The binary as `Device::command` runs it, with a free-space margin of 1 MiB instead of none.
fn with_margin(device: &Device, base: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--data-dir")
        .arg(device.data())
        .arg("--openpilot-dir")
        .arg(device.openpilot())
        .arg("--hf-base")
        .arg(format!("{base}/hf"))
        .arg("--github-base")
        .arg(format!("{base}/gh"))
        .args(["--space-margin-mib", "1"])
        .arg("--builtin-dir")
        .arg(device.builtin())
        .arg("--memory-params-dir")
        .arg(device.memory())
        .arg("--sysfs-root")
        .arg(device.dir.path().join("sys"))
        .args(args);
    c
}

fn a_full_disk_blocks_with_exit_8_and_the_update_installs_once_space_is_freed(generation: &str) {
    let device = Device::new();
    if generation != "v25" {
        set_tree(&device.openpilot(), V26_PIN, Some(&v26_pins()));
    }
    // 5 MiB of /data, a 3 MiB model and a 1 MiB free-space margin.
    let Some(_tmpfs) = Tmpfs::mount(&device.models(), 5 * MIB) else {
        let reason = "cannot mount a 5 MiB tmpfs over the models directory (needs root: run as \
                      root, as .ci/run does); the full-disk case is not run";
        assert!(
            std::env::var("STARPILOT_REQUIRE_TMPFS").as_deref() != Ok("1"),
            "{reason} (STARPILOT_REQUIRE_TMPFS=1: CI requires this test to run)"
        );
        test_support::skip::skipped(reason);
        return;
    };
    let root = device.dir.path().join("origin");
    let bytes = artifact_bytes(7, (3 * MIB) as usize - 1000);
    let m = publish_model(&root, generation, "pop223", &bytes, Some(MIB as usize));
    write_manifest(
        &root,
        generation,
        manifest_json(generation, std::slice::from_ref(&m), true).as_bytes(),
    );
    for (k, v) in [("Model", "pop223"), ("DrivingModel", "pop223")] {
        device.set_param(k, v);
    }
    let server = FaultServer::start(&root).unwrap();
    let run = |args: &[&str]| {
        with_margin(&device, &server.url(), args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };

    // What a download cut by a full disk leaves: its staging file, preallocated to the
    // artifact's size, no completion record; and whatever filled the disk (1.5 MiB).
    let staging = device.models().join(".starpilot-staging");
    fs::create_dir_all(&staging).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&staging, fs::Permissions::from_mode(0o700)).unwrap();
    }
    let leftover = staging.join(format!("{}-pop223_driving_tinygrad.pkl", &m.sha256[..16]));
    fs::write(&leftover, vec![0u8; m.size as usize]).unwrap();
    let filler = device.models().join("filler.bin");
    fs::write(&filler, vec![1u8; (3 * MIB / 2) as usize]).unwrap();

    // The daemon: blocked on space, it logs the amount and shows it to the UI.
    let log = device.dir.path().join("daemon.log");
    let mut daemon = with_margin(
        &device,
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
    let log_text = || fs::read_to_string(&log).unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !log_text().contains("not enough free space") {
        assert!(
            std::time::Instant::now() < deadline,
            "no refresh blocked on space: {}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: a plain kill(2) of our own child.
    unsafe { libc::kill(daemon.id() as libc::pid_t, libc::SIGTERM) };
    daemon.wait().unwrap();
    let text = log_text();
    let line = text
        .lines()
        .find(|l| l.contains("not enough free space"))
        .unwrap();
    assert!(
        line.contains(&format!("need {} bytes", m.size + MIB)),
        "{line}"
    );
    let progress = device.mem("ModelDownloadProgress").unwrap_or_default();
    assert!(
        progress.starts_with("Not enough free space: ") && progress.contains("KiB more needed;"),
        "{progress}"
    );
    assert_eq!(device.installed("pop223"), None);
    assert!(
        !leftover.exists(),
        "the unresumable staging file was removed"
    );

    // A person's refresh: exit 8, the amount needed on stderr.
    let out = run(&["refresh"]);
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("need {} bytes", m.size + MIB)),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        device.param("Model").as_deref(),
        Some("rdf43"),
        "the built-in stands in"
    );

    // Space freed (the filler gone, nothing else touched): the next refresh installs it.
    fs::remove_file(&filler).unwrap();
    let out = run(&["refresh"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(device.installed("pop223").as_deref(), Some(&bytes[..]));
    assert_eq!(device.param("Model").as_deref(), Some("pop223"));

    // `gc` removes staged files no plan can use (another digest of the model, a model gone
    // from the catalog) and keeps what a download of the catalog's artifact resumes.
    let stale = format!("{}-pop223_driving_tinygrad.pkl", "0f".repeat(8));
    let gone = format!("{}-gone223_driving_tinygrad.pkl.state", "1e".repeat(8));
    let kept = format!("{}-pop223_driving_tinygrad.pkl.state", &m.sha256[..16]);
    for name in [&stale, &gone, &kept] {
        fs::write(staging.join(name), b"x").unwrap();
    }
    let dry = run(&["gc", "--dry-run", "--json"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    let removed = |out: &std::process::Output, key: &str| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut r: Vec<String> = v[key]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .filter(|n| n.starts_with(".starpilot-staging/"))
            .collect();
        r.sort();
        r
    };
    let want = vec![
        format!(".starpilot-staging/{stale}"),
        format!(".starpilot-staging/{gone}"),
    ];
    assert_eq!(removed(&dry, "would_remove"), want);
    assert!(staging.join(&stale).exists(), "a dry run removes nothing");
    let out = run(&["gc", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(removed(&out, "removed"), want);
    assert!(!staging.join(&stale).exists() && !staging.join(&gone).exists());
    assert!(staging.join(&kept).exists());
}

mod a_full_disk_blocks_with_exit_8_and_the_update_installs_once_space_is_freed {
    #[test]
    fn v25() {
        super::a_full_disk_blocks_with_exit_8_and_the_update_installs_once_space_is_freed("v25")
    }
    #[test]
    fn v26() {
        super::a_full_disk_blocks_with_exit_8_and_the_update_installs_once_space_is_freed("v26")
    }
}
