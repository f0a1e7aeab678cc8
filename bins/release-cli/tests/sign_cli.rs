//! `release-cli manifest sign|verify` and `publish --sign-key` as a release engineer runs them,
//! and the signatures checked with the real `minisign` tool (Debian package `minisign`).

use crate::common::{cli, command, covering_records, release, release_in, snapshot, text};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use test_support::published::artifact_bytes;
use test_support::release_stores::GitRemote;

/// Set to `1` (as `.ci/run` does) to make a missing `minisign` binary a failure, not a skip.
const REQUIRE_MINISIGN: &str = "STARPILOT_REQUIRE_MINISIGN";

/// The real `minisign`, or `None` (after saying why) when it is not installed and not required.
fn minisign_binary() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("minisign"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        if std::env::var(REQUIRE_MINISIGN).as_deref() == Ok("1") {
            panic!("{REQUIRE_MINISIGN}=1 but `minisign` is not on PATH; apt-get install minisign");
        }
        test_support::skip::skipped(&format!(
            "`minisign` is not installed (apt-get install minisign); set \
             {REQUIRE_MINISIGN}=1 to make this a failure"
        ));
    }
    found
}

/// An unencrypted key pair written as `minisign -G` writes it: `<name>.key`, `<name>.pub`.
fn keypair(dir: &Path, name: &str) -> (PathBuf, PathBuf, String) {
    let kp = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
    let sk_text = kp.sk.to_box(None).unwrap().into_string();
    let (sk, pk) = (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.pub")),
    );
    std::fs::write(&sk, &sk_text).unwrap();
    std::fs::write(&pk, kp.pk.to_box().unwrap().into_string()).unwrap();
    // The secret's base64 line: what must never leave this process.
    let secret_line = sk_text.lines().nth(1).unwrap().to_string();
    (sk, pk, secret_line)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn sign_then_verify_and_every_refusal() {
    let t = tempfile::tempdir().unwrap();
    let (_, manifest) = release(t.path(), &artifact_bytes(1, 2500));
    let (a_key, a_pub, secret) = keypair(t.path(), "a");
    let (_, b_pub, _) = keypair(t.path(), "b");
    let m = s(&manifest);

    let o = cli(&["manifest", "sign", "--key", s(&a_key), "--json", m]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["release"], 1);
    assert_eq!(r["generation"], "v25");
    let sig_path = t.path().join("model_names_v25.json.minisig");
    let sig = std::fs::read_to_string(&sig_path).unwrap();
    assert!(
        sig.contains("trusted comment: generation=v25 release=1 expires="),
        "{sig}"
    );
    assert!(!sig.contains(&secret) && !text(&o.stdout).contains(&secret));

    // Signing again is the next release; a lower explicit release is refused.
    let o = cli(&["manifest", "sign", "--key", s(&a_key), m]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        std::fs::read_to_string(&sig_path)
            .unwrap()
            .contains("release=2 ")
    );
    let o = cli(&["manifest", "sign", "--key", s(&a_key), "--release", "2", m]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("--release 3"),
        "{}",
        text(&o.stderr)
    );

    let o = cli(&["manifest", "verify", "--key", s(&a_pub), "--json", m]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["accepted"], true);
    assert_eq!(r["release"], 2);

    // Another key, a changed manifest, the wrong generation, an expired signature: exit 3.
    let o = cli(&["manifest", "verify", "--key", s(&b_pub), m]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("does not verify"),
        "{}",
        text(&o.stderr)
    );
    let o = cli(&[
        "manifest",
        "verify",
        "--key",
        s(&a_pub),
        "--generation",
        "v26",
        m,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    // `--expires-in 0` would publish a signature every device refuses: refused, nothing
    // written. An expired signature (made with the key directly) is what verify refuses.
    let sig_before = std::fs::read(&sig_path).unwrap();
    let o = cli(&[
        "manifest",
        "sign",
        "--key",
        s(&a_key),
        "--expires-in",
        "0",
        m,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("--expires-in 1"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(std::fs::read(&sig_path).unwrap(), sig_before);
    let sk = minisign::SecretKeyBox::from_string(&std::fs::read_to_string(&a_key).unwrap())
        .unwrap()
        .into_unencrypted_secret_key()
        .unwrap();
    let expired = minisign::sign(
        None,
        &sk,
        std::fs::File::open(&manifest).unwrap(),
        Some("generation=v25 release=3 expires=1000"),
        None,
    )
    .unwrap();
    std::fs::write(&sig_path, expired.into_string()).unwrap();
    let o = cli(&["manifest", "verify", "--key", s(&a_pub), m]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("expired"), "{}", text(&o.stderr));
    let o = cli(&["manifest", "sign", "--key", s(&a_key), m]);
    assert!(o.status.success());
    let mut changed = std::fs::read(&manifest).unwrap();
    changed.extend_from_slice(b" ");
    let other = t.path().join("changed.json");
    std::fs::write(&other, changed).unwrap();
    let o = cli(&[
        "manifest",
        "verify",
        "--key",
        s(&a_pub),
        "--signature",
        s(&sig_path),
        "--generation",
        "v25",
        s(&other),
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));

    // A public key given as the signing key, and a manifest not in canonical form: refused.
    let o = cli(&["manifest", "sign", "--key", s(&a_pub), m]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("this is a minisign public key"),
        "{}",
        text(&o.stderr)
    );
    let o = cli(&["manifest", "sign", "--key", s(&a_key), s(&other)]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("canonical"), "{}", text(&o.stderr));
}

#[test]
fn publish_signs_each_release_and_uploads_the_signature_before_the_manifest() {
    let t = tempfile::tempdir().unwrap();
    let (artifacts, manifest) = release(t.path(), &artifact_bytes(2, 2500));
    let (a_key, a_pub, secret) = keypair(t.path(), "a");
    let (b_key, b_pub, secret_b) = keypair(t.path(), "b");
    let store = t.path().join("store");
    let remote = GitRemote::new(&t.path().join("git"), "Models", None);
    let gh = format!("github:{}", remote.checkout.display());
    let ws = covering_records(&t.path().join("ws"), &manifest);
    let publish = |keys: &[&Path], extra: &[&str]| {
        let mut a = vec![
            "publish".to_string(),
            "--generation".into(),
            "v25".into(),
            "--manifest".into(),
            s(&manifest).into(),
            "--artifacts".into(),
            s(&artifacts).into(),
            "--workspace".into(),
            s(&ws).into(),
            "--to".into(),
            s(&store).into(),
            "--to".into(),
            gh.clone(),
            // No Hub store here: GitHub goes with the local store only.
            "--github-only".into(),
            "test: no Hub in this test".into(),
        ];
        for k in keys {
            a.push("--sign-key".into());
            a.push(s(k).into());
        }
        a.extend(extra.iter().map(|x| x.to_string()));
        cli(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let live_manifest = store.join("manifests/model_names_v25.json");
    let live_sig = store.join("manifests/model_names_v25.json.minisig");
    let verify = |key: &Path| {
        let o = cli(&[
            "manifest",
            "verify",
            "--key",
            s(key),
            "--signature",
            s(&live_sig),
            "--json",
            s(&live_manifest),
        ]);
        // The report (a refusal carries it; no error document follows).
        let out = text(&o.stdout);
        serde_json::from_str::<Value>(out.lines().next().unwrap()).unwrap()
    };

    let o = publish(&[&a_key], &[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("release 1"), "{}", text(&o.stderr));
    // Human output gives the expiry as an RFC 3339 time, not Unix seconds.
    let err = text(&o.stderr);
    let expires = err
        .split("(expires ")
        .nth(1)
        .map(|r| &r[..20])
        .unwrap_or("");
    assert!(
        expires.parse::<manifest::UnixSeconds>().is_ok() && !err.contains("Unix seconds"),
        "{err}"
    );
    assert_eq!(verify(&a_pub)["release"], 1);
    // The GitHub checkout got the same signature, in a commit before (or with) the manifest.
    let gh_sig = remote.checkout.join("model_names_v25.json.minisig");
    assert_eq!(
        std::fs::read(&gh_sig).unwrap(),
        std::fs::read(&live_sig).unwrap()
    );
    let commits = remote.remote_files_per_commit();
    let when = |f: &str| {
        commits
            .iter()
            .position(|c| c.iter().any(|x| x == f))
            .unwrap_or_else(|| panic!("{f} never committed: {commits:?}"))
    };
    assert!(
        when("model_names_v25.json.minisig") <= when("model_names_v25.json"),
        "{commits:?}"
    );

    // The next publish reads release 1 from the live signature: release 2.
    let o = publish(&[&a_key], &["--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let first: Value = serde_json::from_str(text(&o.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(first["event"], "signed");
    assert_eq!(first["release"], 2);
    assert_eq!(verify(&a_pub)["release"], 2);

    // Rotation: the new key cannot read the old key's release, so it must be told.
    let o = publish(&[&b_key], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("--release"), "{}", text(&o.stderr));
    // Signing with both keys works on its own: the old key vouches for release 2.
    let o = publish(&[&b_key, &a_key], &[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(verify(&a_pub)["release"], 3);
    assert_eq!(verify(&b_pub)["release"], 3);
    let o = publish(&[&b_key], &["--release", "4"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(verify(&b_pub)["release"], 4);
    assert_eq!(verify(&a_pub)["accepted"], false);

    // A dry run signs nothing into the store.
    let before = std::fs::read(&live_sig).unwrap();
    let o = publish(&[&b_key], &["--dry-run"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(std::fs::read(&live_sig).unwrap(), before);

    // The secret keys are nowhere in either store.
    for root in [&store, &remote.checkout] {
        for f in walk(root) {
            let bytes = std::fs::read(&f).unwrap();
            let body = String::from_utf8_lossy(&bytes);
            assert!(
                !body.contains(&secret) && !body.contains(&secret_b),
                "{}",
                f.display()
            );
        }
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn real_minisign_keys_load_and_real_minisign_verifies_our_signatures() {
    let Some(minisign) = minisign_binary() else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let (artifacts, manifest) = release(t.path(), &artifact_bytes(3, 2500));
    let (key, public) = (t.path().join("release.key"), t.path().join("release.pub"));
    // An encrypted key, as a release engineer makes it (the passphrase typed twice).
    let mut g = Command::new(&minisign)
        .args(["-G", "-p", s(&public), "-s", s(&key)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = g.stdin.take().unwrap();
        stdin.write_all(b"correct horse\ncorrect horse\n").unwrap();
    }
    let g = g.wait_with_output().unwrap();
    assert!(g.status.success(), "minisign -G: {}", text(&g.stderr));
    assert!(
        std::fs::read_to_string(&key)
            .unwrap()
            .contains("encrypted secret key")
    );

    // Without a passphrase and without a terminal: a clear error, nothing written.
    let o = command()
        .args(["manifest", "sign", "--key", s(&key), s(&manifest)])
        .env_remove("STARPILOT_SIGN_PASSPHRASE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("STARPILOT_SIGN_PASSPHRASE"),
        "{}",
        text(&o.stderr)
    );
    assert!(!t.path().join("model_names_v25.json.minisig").exists());

    // Published with the passphrase from the environment; the real tool verifies the result.
    let store = t.path().join("store");
    let ws = covering_records(&t.path().join("ws"), &manifest);
    let o = command()
        .args([
            "publish",
            "--generation",
            "v25",
            "--manifest",
            s(&manifest),
            "--artifacts",
            s(&artifacts),
            "--workspace",
            s(&ws),
            "--to",
            s(&store),
            "--sign-key",
            s(&key),
        ])
        .env("STARPILOT_SIGN_PASSPHRASE", "correct horse")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(!text(&o.stderr).contains("correct horse"));
    let v = Command::new(&minisign)
        .args(["-V", "-p", s(&public)])
        .arg("-m")
        .arg(store.join("manifests/model_names_v25.json"))
        .arg("-x")
        .arg(store.join("manifests/model_names_v25.json.minisig"))
        .output()
        .unwrap();
    assert!(v.status.success(), "minisign -V: {}", text(&v.stderr));
    let said = format!("{}{}", text(&v.stdout), text(&v.stderr));
    assert!(
        said.contains("Trusted comment: generation=v25 release=1 expires="),
        "{said}"
    );

    // A wrong passphrase is refused with the key's path and the real cause, not a garbage
    // signature, and not "generate a key".
    let o = command()
        .args(["manifest", "sign", "--key", s(&key), s(&manifest)])
        .env("STARPILOT_SIGN_PASSPHRASE", "wrong")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains("release.key") && err.contains("wrong passphrase"),
        "{err}"
    );
    assert!(
        err.contains("STARPILOT_SIGN_PASSPHRASE") && !err.contains("generate a key"),
        "{err}"
    );
    assert!(!t.path().join("model_names_v25.json.minisig").exists());

    // The next step's command runs as printed: it refuses the wrong passphrase and accepts the
    // right one, and writes nothing.
    let next = err.lines().find(|l| l.starts_with("next:")).expect(&err);
    let try_it = next.split('`').nth(1).expect(next);
    let words: Vec<&str> = try_it.split_whitespace().collect();
    assert_eq!(words[..4], ["minisign", "-S", "-s", s(&key)], "{next}");
    let before = walk(t.path());
    for (typed, ok) in [(&b"wrong\n"[..], false), (&b"correct horse\n"[..], true)] {
        let mut m = Command::new(&minisign)
            .args(&words[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            m.stdin.take().unwrap().write_all(typed).unwrap();
        }
        let m = m.wait_with_output().unwrap();
        assert_eq!(m.status.success(), ok, "{try_it}: {}", text(&m.stderr));
    }
    assert_eq!(walk(t.path()), before, "the passphrase try wrote something");
}

/// Run the real `minisign -G`, with `stdin` fed to it (the passphrase twice, or nothing for -W).
fn minisign_generate(minisign: &Path, dir: &Path, name: &str, extra: &[&str], stdin: &[u8]) {
    use std::io::Write;
    let (sk, pk) = (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.pub")),
    );
    let mut g = Command::new(minisign)
        .args(["-G", "-p", s(&pk), "-s", s(&sk)])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    g.stdin.take().unwrap().write_all(stdin).unwrap();
    let g = g.wait_with_output().unwrap();
    assert!(g.status.success(), "minisign -G: {}", text(&g.stderr));
}

/// `minisign -V -p PUB -m FILE` (the signature at FILE.minisig): its stdout+stderr on success.
fn minisign_verify(minisign: &Path, public: &Path, file: &Path) -> String {
    let v = Command::new(minisign)
        .args(["-V", "-p", s(public), "-m", s(file)])
        .output()
        .unwrap();
    let said = format!("{}{}", text(&v.stdout), text(&v.stderr));
    assert!(v.status.success(), "minisign -V: {said}");
    said
}

/// Issue 23: a key made by `minisign -G -W` (no passphrase, as unattended CI makes one) signs,
/// without a terminal and without STARPILOT_SIGN_PASSPHRASE, and the real `minisign -V` accepts
/// the result; so does a passphrase key made by the real tool. minisign 0.11 labels both
/// "encrypted secret key" and leaves a -W key's checksum zero.
#[test]
fn real_minisign_unattended_and_passphrase_keys_both_sign() {
    let Some(minisign) = minisign_binary() else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let (_, manifest) = release(t.path(), &artifact_bytes(4, 2500));
    minisign_generate(&minisign, t.path(), "ci", &["-W"], b"");
    minisign_generate(&minisign, t.path(), "pw", &[], b"pw one\npw one\n");
    let ci_key = t.path().join("ci.key");
    assert!(
        std::fs::read_to_string(&ci_key)
            .unwrap()
            .contains("encrypted secret key"),
        "minisign 0.11 labels -W keys this way; the test would not cover the bug otherwise"
    );

    // The -W key: no passphrase anywhere, no terminal.
    let o = command()
        .args(["manifest", "sign", "--key", s(&ci_key), s(&manifest)])
        .env_remove("STARPILOT_SIGN_PASSPHRASE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let said = minisign_verify(&minisign, &t.path().join("ci.pub"), &manifest);
    assert!(
        said.contains("Trusted comment: generation=v25 release=1 expires="),
        "{said}"
    );
    // The next step names the .pub beside the key, and works when copied.
    let err = text(&o.stderr);
    let next = err
        .lines()
        .find_map(|l| l.strip_prefix("next: check it with `"))
        .and_then(|l| l.split('`').next())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(next.contains(s(&t.path().join("ci.pub"))), "{next}");
    let argv: Vec<&str> = next.split(' ').collect();
    assert_eq!(argv[0], "minisign", "{next}");
    let v = Command::new(&minisign).args(&argv[1..]).output().unwrap();
    assert!(v.status.success(), "{next}: {}", text(&v.stderr));

    // The passphrase key, then both during a rotation: the first key's block is what
    // `minisign -V` checks, and each key verifies its own block with our verifier.
    let o = command()
        .args([
            "manifest",
            "sign",
            "--key",
            s(&t.path().join("pw.key")),
            "--key",
        ])
        .arg(&ci_key)
        .arg(&manifest)
        .env("STARPILOT_SIGN_PASSPHRASE", "pw one")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let said = minisign_verify(&minisign, &t.path().join("pw.pub"), &manifest);
    assert!(said.contains("release=2 "), "{said}");
    for public in ["pw.pub", "ci.pub"] {
        let o = cli(&[
            "manifest",
            "verify",
            "--key",
            s(&t.path().join(public)),
            s(&manifest),
        ]);
        assert!(o.status.success(), "{public}: {}", text(&o.stderr));
    }
}

/// Every way a key file can be unusable, each refused with its cause and next step, and no
/// signature written.
#[test]
fn each_key_error_names_its_cause_and_next_step() {
    let t = tempfile::tempdir().unwrap();
    let (_, manifest) = release(t.path(), &artifact_bytes(5, 2500));
    // The keys live apart from the manifest: the snapshot below must not read the FIFO.
    let k = tempfile::tempdir().unwrap();
    let (good, public, _) = keypair(k.path(), "a");
    let good_text = std::fs::read_to_string(&good).unwrap();
    let write = |name: &str, body: &str| {
        let p = k.path().join(name);
        std::fs::write(&p, body).unwrap();
        p
    };
    // A damaged key: one byte of the secret half changed (the checksum catches it).
    let lines: Vec<&str> = good_text.lines().collect();
    let mut raw = lines[1].as_bytes().to_vec();
    raw[100] = if raw[100] == b'A' { b'B' } else { b'A' };
    let damaged = write(
        "damaged.key",
        &format!("{}\n{}\n", lines[0], String::from_utf8(raw).unwrap()),
    );
    let zero = k.path().join("zero.key");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let fifo = k.path().join("fifo.key");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let cases: Vec<(PathBuf, &[&str])> = vec![
        (public.clone(), &["public key", ".key file"]),
        (
            write("junk.key", "hello\n"),
            &["not a minisign secret key", "minisign -G"],
        ),
        (
            write("b64.key", "untrusted comment: x\nAAAA\n"),
            &["3 bytes", "minisign -G -W"],
        ),
        (damaged, &["damaged", "backup"]),
        (zero, &["not a regular file", "next:"]),
        (fifo, &["not a regular file", "next:"]),
        (
            write("big.key", &"x".repeat(20_000)),
            &["too large", "next:"],
        ),
        (k.path().join("absent.key"), &["No such file", "next:"]),
    ];
    let before = snapshot(t.path());
    for (key, needles) in cases {
        let o = command()
            .args(["manifest", "sign", "--key", s(&key), s(&manifest)])
            .env_remove("STARPILOT_SIGN_PASSPHRASE")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{}: {err}", key.display());
        for n in needles {
            assert!(err.contains(n), "{}: want {n:?} in {err}", key.display());
        }
        assert!(err.contains(s(&key)), "{err}");
    }
    assert_eq!(snapshot(t.path()), before, "a refused key wrote something");
}

#[test]
fn sign_dry_run_signs_in_memory_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (_, manifest) = release(t.path(), &artifact_bytes(1, 2500));
    let (a_key, _, secret) = keypair(t.path(), "a");
    let m = s(&manifest);
    let before = snapshot(t.path());
    let o = cli(&[
        "manifest",
        "sign",
        "--key",
        s(&a_key),
        "--dry-run",
        "--json",
        m,
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["dry_run"], true);
    assert_eq!(r["release"], 1);
    assert_eq!(r["replaces"], false);
    assert_eq!(r["generation"], "v25");
    let o = cli(&["manifest", "sign", "--key", s(&a_key), "--dry-run", m]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.contains("dry run: would write") && out.contains("model_names_v25.json.minisig"),
        "{out}"
    );
    assert!(
        out.contains(" B): ") && out.contains("(expires 20") && out.contains("Z)\n"),
        "{out}"
    );
    assert!(!out.contains(&secret));
    assert_eq!(snapshot(t.path()), before, "a sign dry run wrote something");

    // After a real signature, the dry run names the next release and the file it replaces.
    let o = cli(&["manifest", "sign", "--key", s(&a_key), m]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let before = snapshot(t.path());
    let o = cli(&[
        "manifest",
        "sign",
        "--key",
        s(&a_key),
        "--dry-run",
        "--json",
        m,
    ]);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (r["release"].clone(), r["replaces"].clone()),
        (2.into(), true.into())
    );
    // A key that is not there is refused, as in the real run.
    let o = cli(&["manifest", "sign", "--key", "missing.key", "--dry-run", m]);
    assert!(!o.status.success());
    assert_eq!(snapshot(t.path()), before, "a sign dry run wrote something");
}

/// `manifest fmt` of `doc`, written to `path` (the canonical form signing requires).
fn write_canonical(dir: &Path, path: &Path, doc: &Value) {
    let raw = dir.join("raw-edit.json");
    std::fs::write(&raw, doc.to_string()).unwrap();
    let o = cli(&["manifest", "fmt", s(&raw)]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    std::fs::write(path, &o.stdout).unwrap();
    std::fs::remove_file(raw).unwrap();
}

/// Issue 23 item 1: a signature covers only what the manifest states. `manifest sign` and
/// `publish --sign-key` refuse a manifest whose entry or Chestnut variant lacks a size, SHA-256
/// or chunk count, naming each field and the command that adds it, and write nothing; after
/// `manifest set-artifact --variant chestnut` the same manifest signs.
#[test]
fn signing_refuses_what_the_signature_would_not_cover() {
    let t = tempfile::tempdir().unwrap();
    let data = artifact_bytes(6, 2500);
    let (artifacts, manifest) = release(t.path(), &data);
    let (key, public, _) = keypair(t.path(), "a");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    doc["models"][0]["accelerator_artifacts"] = serde_json::json!({"chestnut": {
        "artifact_format": "tinygrad_single_v1",
        "artifact_filename": "pop223_driving_chestnut_tinygrad.pkl",
        "execution_device": "AMD"}});
    write_canonical(t.path(), &manifest, &doc);
    // The records (the rehearsal among them) are of the manifest as it is published.
    let ws = covering_records(&t.path().join("ws"), &manifest);
    let store = t.path().join("store");
    let before = snapshot(t.path());
    let m = s(&manifest);

    let sign = cli(&["manifest", "sign", "--key", s(&key), m]);
    let publish = cli(&[
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
    ]);
    for o in [&sign, &publish] {
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{err}");
        for field in ["artifact_size", "artifact_sha256", "artifact_chunk_count"] {
            assert!(
                err.contains(&format!("models[0].accelerator_artifacts.chestnut.{field}")),
                "{err}"
            );
        }
        assert!(
            err.contains(&format!(
                "release-cli manifest set-artifact {m} DIR --model pop223 --variant chestnut"
            )),
            "{err}"
        );
    }
    assert_eq!(
        snapshot(t.path()),
        before,
        "a refused signing wrote something"
    );
    assert!(!store.exists());

    // The live v25 shape (no artifact fields in the entry): refused, the entry's fields named.
    let bare = t.path().join("bare/model_names_v25.json");
    std::fs::create_dir_all(bare.parent().unwrap()).unwrap();
    let mut plain = doc.clone();
    let e = plain["models"][0].as_object_mut().unwrap();
    for k in ["artifact_size", "artifact_sha256", "artifact_chunk_count"] {
        e.shift_remove(k);
    }
    e.shift_remove("accelerator_artifacts");
    write_canonical(t.path(), &bare, &plain);
    let o = cli(&["manifest", "sign", "--key", s(&key), s(&bare)]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("models[0].artifact_size")
            && err.contains("models[0].artifact_chunk_count")
            && err.contains("--model pop223\n"),
        "{err}"
    );
    assert!(!bare.with_extension("json.minisig").exists());

    // The variant's chunk set, its fields written by set-artifact --variant: now it signs.
    let pkl = t.path().join("build/pop223_driving_chestnut_tinygrad.pkl");
    std::fs::write(&pkl, artifact_bytes(7, 1800)).unwrap();
    let variant_dir = t.path().join("chestnut/pop223");
    let o = cli(&[
        "chunk",
        "split",
        s(&pkl),
        "--out-dir",
        s(&variant_dir),
        "--chunk-size",
        "1000",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = cli(&[
        "manifest",
        "set-artifact",
        m,
        s(&variant_dir),
        "--variant",
        "chestnut",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let after: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let v = &after["models"][0]["accelerator_artifacts"]["chestnut"];
    assert_eq!(v["artifact_size"], 1800);
    assert_eq!(v["artifact_chunk_count"], 2);
    assert_eq!(v["execution_device"], "AMD");
    assert_eq!(
        after["models"][0]["artifact_size"], 2500,
        "the entry's own artifact was changed"
    );
    let o = cli(&["manifest", "sign", "--key", s(&key), m]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = cli(&["manifest", "verify", "--key", s(&public), m]);
    assert!(o.status.success(), "{}", text(&o.stderr));
}

/// Issue 23 item 4: publishing without --sign-key over a signed store is refused before any
/// upload (exit 3, naming --sign-key and the opt-out); `--remove-signature REASON` publishes
/// unsigned, removes the signature from every store, says devices with keys will refuse the
/// generation, and records the reason in the publish record.
#[test]
fn an_unsigned_publish_over_a_signed_store_is_refused_or_removes_the_signature_on_purpose() {
    let t = tempfile::tempdir().unwrap();
    let (artifacts, manifest) = release(t.path(), &artifact_bytes(8, 2500));
    let (key, _, _) = keypair(t.path(), "a");
    let store = t.path().join("store");
    let remote = GitRemote::new(&t.path().join("git"), "Models", None);
    let gh = format!("github:{}", remote.checkout.display());
    let ws = covering_records(&t.path().join("ws"), &manifest);
    let publish_from = |artifacts: &Path, ws: &Path, extra: &[&str]| {
        let mut a = vec![
            "publish",
            "--generation",
            "v25",
            "--manifest",
            s(&manifest),
            "--artifacts",
            s(artifacts),
            "--workspace",
            s(ws),
            "--to",
            s(&store),
            "--to",
            &gh,
            "--github-only",
            "test: the local store stands in for the Hub",
        ];
        a.extend_from_slice(extra);
        cli(&a)
    };
    let o = publish_from(&artifacts, &ws, &["--sign-key", s(&key)]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let live_sig = store.join("manifests/model_names_v25.json.minisig");
    let gh_sig = remote.checkout.join("model_names_v25.json.minisig");
    assert!(live_sig.exists() && gh_sig.exists());

    // A new release of the same generation, published without --sign-key: refused, nothing
    // uploaded to either store (a dry run too).
    let r2 = t.path().join("r2");
    std::fs::create_dir_all(&r2).unwrap();
    let (artifacts2, manifest2) = release_in(&r2, &artifact_bytes(9, 2600), "artifacts/pop223");
    std::fs::copy(&manifest2, &manifest).unwrap();
    let ws2 = covering_records(&t.path().join("ws2"), &manifest);
    let publish = |extra: &[&str]| publish_from(&artifacts2, &ws2, extra);
    let before = (snapshot(&store), remote.remote_subjects());
    for extra in [&[][..], &["--dry-run"][..]] {
        let o = publish(extra);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{err}");
        assert!(
            err.contains("--sign-key")
                && err.contains("--remove-signature")
                && err.contains("model_names_v25.json.minisig"),
            "{err}"
        );
        assert_eq!((snapshot(&store), remote.remote_subjects()), before);
    }
    // --remove-signature conflicts with --sign-key.
    let o = publish(&["--sign-key", s(&key), "--remove-signature", "x"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));

    // A dry run of the removal says, per store, that it would remove the signature, and
    // changes nothing (text and JSON).
    let o = publish(&["--dry-run", "--remove-signature", "x"]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        out.matches("model_names_v25.json.minisig: would remove")
            .count(),
        2,
        "{out}"
    );
    let o = publish(&["--dry-run", "--remove-signature", "x", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // Events come first, one JSON line each; the report is the last line.
    let r: Value = serde_json::from_str(text(&o.stdout).lines().last().unwrap()).unwrap();
    for st in r["stores"].as_array().unwrap() {
        assert_eq!(st["signature"], "would_remove", "{r}");
    }
    assert_eq!((snapshot(&store), remote.remote_subjects()), before);
    assert!(
        !t.path().join("model_names_v25.publish.json").exists() || {
            let rec: Value = serde_json::from_slice(
                &std::fs::read(t.path().join("model_names_v25.publish.json")).unwrap(),
            )
            .unwrap();
            rec["signature_removed"].is_null()
        }
    );

    // On purpose: the signature goes from both stores, before the manifest (the commit order on
    // the remote shows it), the warning names the consequence, the record keeps the reason.
    let o = publish(&[
        "--remove-signature",
        "release key lost; re-signing with the new key",
    ]);
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("devices with trusted keys will refuse"),
        "{err}"
    );
    assert!(!live_sig.exists() && !gh_sig.exists());
    assert_eq!(
        text(&o.stdout)
            .matches("model_names_v25.json.minisig: removed")
            .count(),
        2,
        "{}",
        text(&o.stdout)
    );
    let commits = remote.remote_files_per_commit();
    let last_sig = commits
        .iter()
        .rposition(|c| c.iter().any(|f| f == "model_names_v25.json.minisig"))
        .unwrap();
    let last_manifest = commits
        .iter()
        .rposition(|c| c.iter().any(|f| f == "model_names_v25.json"))
        .unwrap();
    assert!(last_sig < last_manifest, "{commits:?}");
    let record: Value = serde_json::from_slice(
        &std::fs::read(t.path().join("model_names_v25.publish.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        record["signature_removed"],
        "release key lost; re-signing with the new key"
    );
    // Now the stores hold no signature: an unsigned publish is no longer refused.
    let o = publish(&[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
}

/// Issue 23: a rotation signature file (one block per key) with one undecodable block still
/// verifies by its good block; the damaged block is reported and skipped.
#[test]
fn a_rotation_file_with_one_damaged_block_verifies_by_the_other() {
    let t = tempfile::tempdir().unwrap();
    let (_, manifest) = release(t.path(), &artifact_bytes(13, 2500));
    let (a_key, a_pub, _) = keypair(t.path(), "a");
    let (b_key, b_pub, _) = keypair(t.path(), "b");
    let m = s(&manifest);
    let o = cli(&[
        "manifest",
        "sign",
        "--key",
        s(&a_key),
        "--key",
        s(&b_key),
        m,
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let sig_path = t.path().join("model_names_v25.json.minisig");
    let text_before = std::fs::read_to_string(&sig_path).unwrap();
    let mut lines: Vec<String> = text_before.lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 8);
    // Block 1's signature line: not base64 any more (the key a block).
    lines[1] = "RWQ*not*base64*".to_string();
    std::fs::write(&sig_path, lines.join("\n") + "\n").unwrap();

    let o = cli(&["manifest", "verify", "--key", s(&b_pub), "--json", m]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["accepted"], true);
    assert!(r["blocks"][0]["error"].is_string(), "{r}");
    assert!(r["blocks"][1]["verified_by"].is_string(), "{r}");
    let o = cli(&["manifest", "verify", "--key", s(&b_pub), m]);
    assert!(text(&o.stdout).contains("block 1: not a decodable signature"));
    // Key a's only block is the damaged one: refused as not verified.
    let o = cli(&["manifest", "verify", "--key", s(&a_pub), m]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("does not verify"),
        "{}",
        text(&o.stderr)
    );
    // Block 1 without its untrusted comment line (not a four-line block any more): it is
    // skipped, block 2 still verifies.
    let mut no_comment = lines.clone();
    no_comment.remove(0);
    std::fs::write(&sig_path, no_comment.join("\n") + "\n").unwrap();
    let o = cli(&["manifest", "verify", "--key", s(&b_pub), "--json", m]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["accepted"], true, "{r}");
    assert!(r["blocks"][0]["error"].is_string(), "{r}");
    assert!(r["blocks"][1]["verified_by"].is_string(), "{r}");
    // Both blocks damaged: malformed, naming the first.
    lines[5] = "RWQ*also*broken*".to_string();
    std::fs::write(&sig_path, lines.join("\n") + "\n").unwrap();
    let o = cli(&["manifest", "verify", "--key", s(&b_pub), m]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("block 1"), "{}", text(&o.stderr));
}
