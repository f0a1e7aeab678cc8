//! Issue 23 item 5, against the real binary: the release number has a ceiling relative to the
//! live release, a signature must stay valid at least a day, and every signature, key, record,
//! pin table and manifest a user or attacker can plant is read size-capped and regular-file
//! only: a FIFO does not hang the tool, `/dev/zero` behind a symlink does not fill memory.

use crate::common::{cli, command, covering_records, release, snapshot, text};

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use test_support::published::artifact_bytes;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Run `cmd`, failing the test if it has not finished within 30 s (a read that blocks on a FIFO
/// or never ends on /dev/zero would hang here).
fn within_deadline(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            let _ = child.wait();
            panic!("release-cli hung: {cmd:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mkfifo(p: &Path) {
    assert!(Command::new("mkfifo").arg(p).status().unwrap().success());
}

fn keypair(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let kp = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
    let (sk, pk) = (dir.join("a.key"), dir.join("a.pub"));
    std::fs::write(&sk, kp.sk.to_box(None).unwrap().into_string()).unwrap();
    std::fs::write(&pk, kp.pk.to_box().unwrap().into_string()).unwrap();
    (sk, pk)
}

#[test]
fn release_numbers_have_a_ceiling_and_signatures_last_a_day() {
    let t = tempfile::tempdir().unwrap();
    let (artifacts, manifest) = release(t.path(), &artifact_bytes(11, 2500));
    let k = tempfile::tempdir().unwrap();
    let (key, _) = keypair(k.path());
    let m = s(&manifest);
    let ws = covering_records(&t.path().join("ws"), &manifest);
    let store = t.path().join("store");
    let before = snapshot(t.path());

    // `manifest sign`: no live release yet, so at most 1000; u64::MAX is refused.
    for (release, ok) in [("18446744073709551615", false), ("1001", false)] {
        let o = cli(&[
            "manifest",
            "sign",
            "--key",
            s(&key),
            "--release",
            release,
            m,
        ]);
        assert_eq!(o.status.success(), ok, "{}", text(&o.stderr));
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("--release 1000 or less"), "{err}");
    }
    let o = cli(&["manifest", "sign", "--key", s(&key), "--expires-in", "0", m]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    // And at most ten years.
    for days in ["3651", "999999999999"] {
        let o = cli(&[
            "manifest",
            "sign",
            "--key",
            s(&key),
            "--expires-in",
            days,
            m,
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains("--expires-in 3650 or less"),
            "{}",
            text(&o.stderr)
        );
    }
    assert_eq!(snapshot(t.path()), before, "a refused sign wrote something");

    // `publish --sign-key`: the same bounds, refused before any upload.
    let publish = |extra: &[&str]| {
        let mut a = vec![
            "publish",
            "--generation",
            "v25",
            "--manifest",
            m,
            "--artifacts",
            s(&artifacts),
            "--workspace",
            s(&ws),
            "--to",
            s(&store),
            "--sign-key",
            s(&key),
        ];
        a.extend_from_slice(extra);
        cli(&a)
    };
    for extra in [
        &["--release", "18446744073709551615"][..],
        &["--expires-in", "0"][..],
        &["--expires-in", "999999999999"][..],
    ] {
        let o = publish(extra);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", text(&o.stderr));
        assert!(!store.exists(), "{extra:?}: something was uploaded");
    }
    // Within the ceiling it publishes; the next ceiling is relative to that live release.
    let o = publish(&["--release", "1000"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = publish(&["--release", "2001"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--release 2000 or less"), "{err}");
    let o = publish(&["--release", "2000", "--expires-in", "1"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
}

#[test]
fn planted_files_are_refused_without_hanging_or_reading_them() {
    let t = tempfile::tempdir().unwrap();
    let (artifacts, manifest) = release(t.path(), &artifact_bytes(12, 2500));
    let k = tempfile::tempdir().unwrap();
    let (key, public) = keypair(k.path());
    let m = s(&manifest);
    let o = cli(&["manifest", "sign", "--key", s(&key), m]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let planted = tempfile::tempdir().unwrap();
    let zero = planted.path().join("zero");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let fifo = planted.path().join("fifo");
    mkfifo(&fifo);

    // A signature that is /dev/zero or a FIFO (`manifest verify` reached 19 GB on /dev/zero).
    for bad in [&zero, &fifo] {
        let mut c = command();
        c.args([
            "manifest",
            "verify",
            "--key",
            s(&public),
            "--signature",
            s(bad),
            m,
        ]);
        let o = within_deadline(c);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{err}");
        assert!(
            err.contains("not a regular file") && err.contains("next:"),
            "{err}"
        );
    }
    // A signature far over the cap.
    let big = planted.path().join("big.minisig");
    std::fs::write(&big, vec![b'a'; 100_000]).unwrap();
    let o = cli(&[
        "manifest",
        "verify",
        "--key",
        s(&public),
        "--signature",
        s(&big),
        m,
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("limit"), "{}", text(&o.stderr));

    // A public or secret key file that is a FIFO or /dev/zero; a manifest that is one.
    let sig_before = std::fs::read(manifest.with_extension("json.minisig")).unwrap();
    for bad in [&fifo, &zero] {
        for sub in ["verify", "sign"] {
            let mut c = command();
            c.args(["manifest", sub, "--key", s(bad), m]);
            let o = within_deadline(c);
            assert_eq!(o.status.code(), Some(2), "{sub}: {}", text(&o.stderr));
            assert!(
                text(&o.stderr).contains("not a regular file") && text(&o.stderr).contains("next:"),
                "{sub}: {}",
                text(&o.stderr)
            );
        }
    }
    assert_eq!(
        std::fs::read(manifest.with_extension("json.minisig")).unwrap(),
        sig_before
    );
    for sub in ["validate", "fmt"] {
        let mut c = command();
        c.args(["manifest", sub, s(&fifo)]);
        let o = within_deadline(c);
        assert!(!o.status.success());
        assert!(
            text(&o.stderr).contains("not a regular file"),
            "{sub}: {}",
            text(&o.stderr)
        );
    }

    // A validation record that is a FIFO, and a pin table that is /dev/zero: publish refuses
    // before any upload.
    let store = t.path().join("store");
    let ws = covering_records(&t.path().join("ws"), &manifest);
    mkfifo(&ws.join("results/planted.validation.json"));
    let publish = |ws: &Path, extra: &[&str]| {
        let mut c = command();
        c.args([
            "publish",
            "--generation",
            "v25",
            "--manifest",
            m,
            "--artifacts",
            s(&artifacts),
            "--workspace",
            s(ws),
            "--to",
            s(&store),
        ]);
        c.args(extra);
        within_deadline(c)
    };
    let o = publish(&ws, &[]);
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("planted.validation.json") && err.contains("not a regular file"),
        "{err}"
    );
    std::fs::remove_file(ws.join("results/planted.validation.json")).unwrap();
    let openpilot = planted.path().join("openpilot");
    std::fs::create_dir(&openpilot).unwrap();
    std::os::unix::fs::symlink("/dev/zero", openpilot.join("tinygrad_pins.json")).unwrap();
    let o = publish(&ws, &["--openpilot", s(&openpilot)]);
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("tinygrad_pins.json") && err.contains("not a regular file"),
        "{err}"
    );
    assert!(!store.exists(), "something was uploaded");
}

/// A FIFO where `publish`, `audit`, `status` and `rehearse` read inside a store, a workspace or
/// an openpilot tree is an error naming it, returned at once (each run has 30 s, each returns
/// in well under that): a live manifest in the store, a record in `results/`, the tree's
/// tinygrad marker.
#[test]
fn fifos_in_a_store_a_workspace_or_a_tree_are_errors_not_hangs() {
    let t = tempfile::tempdir().unwrap();
    let (artifacts, manifest) = release(t.path(), &artifact_bytes(13, 2500));
    let m = s(&manifest);
    let ws = covering_records(&t.path().join("ws"), &manifest);
    let store = t.path().join("store");
    std::fs::create_dir_all(store.join("manifests")).unwrap();
    mkfifo(&store.join("manifests/model_names_v25.json"));
    let run = |args: &[&str]| {
        let mut c = command();
        c.args(args);
        let started = Instant::now();
        let o = within_deadline(c);
        assert!(started.elapsed() < Duration::from_secs(10), "{args:?}");
        (o.status.code(), text(&o.stdout), text(&o.stderr))
    };
    let (code, out, err) = run(&[
        "publish",
        "--generation",
        "v25",
        "--manifest",
        m,
        "--artifacts",
        s(&artifacts),
        "--workspace",
        s(&ws),
        "--to",
        s(&store),
    ]);
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(
        err.contains("manifests/model_names_v25.json") && err.contains("not a regular file"),
        "{err}"
    );
    let (code, out, err) = run(&[
        "audit",
        "--generation",
        "v25",
        "--json",
        "--store",
        s(&store),
        "--workspace",
        s(&ws),
    ]);
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(out.contains("not a regular file"), "{out}{err}");

    // The workspace: a FIFO as the preflight record is an error naming it, not "missing".
    let preflight = ws.join("results/preflight.json");
    std::fs::remove_file(&preflight).unwrap();
    mkfifo(&preflight);
    let (code, out, err) = run(&["status", "--workspace", s(&ws)]);
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(
        err.contains("preflight.json") && err.contains("not a regular file"),
        "{out}{err}"
    );
    std::fs::remove_file(&preflight).unwrap();
    // A build record that is a FIFO: the same.
    let record = ws.join("results/pop223.json");
    mkfifo(&record);
    let (code, out, err) = run(&["status", "--workspace", s(&ws)]);
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(
        err.contains("pop223.json") && err.contains("not a regular file"),
        "{out}{err}"
    );
    std::fs::remove_file(&record).unwrap();

    // The tree: a FIFO as its tinygrad marker.
    let op = t.path().join("openpilot");
    std::fs::create_dir_all(op.join("tinygrad_repo")).unwrap();
    mkfifo(&op.join("tinygrad_repo/TINYGRAD_COMMIT"));
    let (_, out, err) = run(&["status", "--workspace", s(&ws), "--openpilot", s(&op)]);
    assert!(
        format!("{out}{err}").contains("TINYGRAD_COMMIT"),
        "{out}{err}"
    );
    let (code, out, err) = run(&[
        "rehearse",
        "--generation",
        "v25",
        "--manifest",
        m,
        "--artifacts",
        s(&artifacts),
        "--openpilot",
        s(&op),
        "--workspace",
        s(&ws),
        "--device-manager",
        crate::common::BIN,
    ]);
    // The unreadable marker fails the rehearsal's release check, naming it.
    assert_ne!(code, Some(0), "{out}{err}");
    let record = std::fs::read_to_string(ws.join("results/rehearsal.json")).unwrap();
    assert!(
        record.contains("TINYGRAD_COMMIT") && record.contains("not a regular file"),
        "{record}"
    );
}
