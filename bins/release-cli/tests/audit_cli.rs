//! `release-cli audit` against what `publish` really put in a directory, a `github:` checkout
//! with a bare origin, and a Hub bucket through the real `hf` CLI and the Hub emulator: healthy
//! stores exit 0; each damage is named with its model, path and a mend command, which is then
//! run exactly as printed (`sh -c`) and makes the audit pass again. Audit itself changes nothing.

use crate::common::{self, cli, cli_in, covering_records, text};

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use test_support::published::artifact_bytes;
use test_support::release_stores::GitRemote;

const CHUNK: &str = "pop223_driving_tinygrad.pkl.chunk";

/// A rebuild workspace `dir/ws` as `rebuild` leaves it: `ready/pop223/` (three 1000-byte
/// chunks), `ready/model_names_v25.json` and passing gate records.
fn workspace(dir: &Path, data: &[u8]) -> PathBuf {
    let ws = dir.join("ws");
    fs::create_dir_all(&ws).unwrap();
    let (_, manifest) = common::release_in(&ws, data, "ready/pop223");
    fs::rename(&manifest, ws.join("ready/model_names_v25.json")).unwrap();
    covering_records(&ws, &ws.join("ready/model_names_v25.json"));
    ws
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn publish(ws: &Path, to: &[&str], extra: &[&str]) {
    let mut args = vec![
        "publish",
        "--generation",
        "v25",
        "--manifest",
        s(&ws.join("ready/model_names_v25.json")).to_string().leak(),
        "--artifacts",
        s(&ws.join("ready")).to_string().leak(),
        "--workspace",
        s(ws),
    ];
    for t in to {
        args.extend(["--to", t]);
    }
    args.extend(extra);
    let o = cli(&args);
    assert!(o.status.success(), "{}", text(&o.stderr));
}

/// `release-cli audit --json ARGS`: the exit code and the report.
fn audit(args: &[&str], cwd: &Path) -> (Option<i32>, Value, Output) {
    let mut a = vec!["audit", "--generation", "v25", "--json"];
    a.extend(args);
    let o = cli_in(&a, cwd);
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&o.stdout), text(&o.stderr)));
    (o.status.code(), v, o)
}

/// Every finding of a report: (kind, model, path, mend).
fn findings(v: &Value) -> Vec<(String, String, String, String)> {
    let mut out = Vec::new();
    let mut add = |f: &Value| {
        out.push((
            f["kind"].as_str().unwrap().to_string(),
            f["model"].as_str().unwrap_or_default().to_string(),
            f["path"].as_str().unwrap().to_string(),
            f["mend"].as_str().unwrap().to_string(),
        ))
    };
    for st in v["stores"].as_array().unwrap() {
        st["problems"].as_array().unwrap().iter().for_each(&mut add);
    }
    v["disagreements"]
        .as_array()
        .unwrap()
        .iter()
        .for_each(&mut add);
    out
}

/// Run every distinct mend command as printed, in `cwd`, with `path` first on PATH.
fn mend(v: &Value, cwd: &Path, path: &Path, env: &[(&str, &str)]) {
    let cmds: BTreeSet<String> = findings(v).into_iter().map(|f| f.3).collect();
    assert!(!cmds.is_empty());
    for c in cmds {
        let o = std::process::Command::new("sh")
            .arg("-c")
            .arg(&c)
            .current_dir(cwd)
            .env(
                "PATH",
                format!("{}:{}", path.display(), std::env::var("PATH").unwrap()),
            )
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{c}: {}{}",
            text(&o.stdout),
            text(&o.stderr)
        );
    }
}

/// A directory holding `release-cli` (for the mend commands that call it).
fn bin_dir() -> PathBuf {
    Path::new(common::BIN).parent().unwrap().to_path_buf()
}

#[test]
fn audit_finds_what_breaks_in_a_directory_and_github_and_each_mend_runs_as_printed() {
    let t = tempfile::tempdir().unwrap();
    let ws = workspace(t.path(), &artifact_bytes(1, 2500));
    let store = t.path().join("store");
    let remote = GitRemote::new(&t.path().join("git"), "Models", None);
    let gh = format!("github:{}", remote.checkout.display());
    publish(
        &ws,
        &[s(&store), &gh],
        &["--github-only", "test: no Hub in this test"],
    );
    let stores = ["--store", &gh, "--store", s(&store), "--workspace", s(&ws)];

    let (code, v, _) = audit(&stores, t.path());
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["healthy"], true);
    assert_eq!(v["near_expiry_days"], 14);
    assert_eq!(v["stores"][0]["artifacts"], 1);
    assert_eq!(v["stores"][1]["bytes"], 2500);
    let o = cli_in(
        &["audit", "--generation", "v25", "--deep"]
            .into_iter()
            .chain(stores)
            .collect::<Vec<_>>(),
        t.path(),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let human = text(&o.stdout);
    assert!(human.contains("every chunk hashed"), "{human}");
    assert!(human.contains("2.44 KiB"), "{human}");
    assert!(human.contains("the 2 stores agree"), "{human}");
    assert!(human.contains("healthy: v25"), "{human}");

    // Damage the directory: an older split's chunk, a temporary, a chunk gone.
    let dir = store.join("models/v25/pop223");
    fs::write(dir.join(format!("{CHUNK}01of01")), vec![1u8; 2500]).unwrap();
    fs::write(dir.join(".tmp-4242-0-x"), b"half").unwrap();
    fs::remove_file(dir.join(format!("{CHUNK}02of03"))).unwrap();
    let before = common::snapshot(t.path());
    let (code, v, o) = audit(&stores, t.path());
    assert_eq!(code, Some(3), "{v}");
    assert_eq!(v["healthy"], false);
    assert!(
        text(&o.stderr).contains("3 problem(s)"),
        "{}",
        text(&o.stderr)
    );
    let f = findings(&v);
    let kinds: Vec<&str> = f.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(kinds, ["file_missing", "temporary", "other_split"], "{f:?}");
    for (kind, model, path, _) in &f {
        assert_eq!(model, "pop223", "{kind}");
        assert!(path.starts_with(s(&dir)), "{path}");
    }
    assert!(f[0].2.ends_with(&format!("{CHUNK}02of03")));
    assert!(
        f[0].3.starts_with("release-cli publish --generation v25"),
        "{}",
        f[0].3
    );
    assert_eq!(
        f[2].3,
        format!("rm -f -- {}", dir.join(format!("{CHUNK}01of01")).display())
    );
    assert_eq!(common::snapshot(t.path()), before, "audit changed nothing");
    // The human report names each with its mend.
    let o = cli_in(
        &["audit", "--generation", "v25"]
            .into_iter()
            .chain(stores)
            .collect::<Vec<_>>(),
        t.path(),
    );
    assert_eq!(o.status.code(), Some(3));
    let human = text(&o.stdout);
    assert!(
        human.contains(&format!(
            "problem: model pop223: {}",
            dir.join(format!("{CHUNK}02of03")).display()
        )),
        "{human}"
    );
    assert!(human.contains("    mend: rm -f -- "), "{human}");

    mend(&v, t.path(), &bin_dir(), &[]);
    let (code, v, _) = audit(&stores, t.path());
    assert_eq!(code, Some(0), "after the mends: {v}");

    // Deep finds a chunk corrupted in place at its size; the plain audit cannot.
    let c1 = dir.join(format!("{CHUNK}01of03"));
    let mut b = fs::read(&c1).unwrap();
    b[10] ^= 0xff;
    fs::write(&c1, &b).unwrap();
    let (code, _, _) = audit(&["--store", s(&store)], t.path());
    assert_eq!(code, Some(0));
    let (code, v, _) = audit(&["--store", s(&store), "--deep"], t.path());
    assert_eq!(code, Some(3));
    assert_eq!(findings(&v)[0].0, "corrupt", "{v}");
    b[10] ^= 0xff;
    fs::write(&c1, &b).unwrap();

    // GitHub: a stale chunk pushed to the branch; its mend is git rm, commit, push.
    let co = &remote.checkout;
    fs::write(co.join(format!("v25/pop223/{CHUNK}01of02")), b"old").unwrap();
    for args in [
        vec!["add", "-A"],
        vec!["commit", "-qm", "Publish stale"],
        vec!["push", "-q", "origin", "HEAD:refs/heads/Models"],
    ] {
        let o = std::process::Command::new("git")
            .arg("-C")
            .arg(co)
            .args(&args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
    }
    let (code, v, _) = audit(&stores, t.path());
    assert_eq!(code, Some(3));
    let f = findings(&v);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].0, "other_split");
    assert_eq!(
        f[0].2,
        co.join(format!("v25/pop223/{CHUNK}01of02"))
            .display()
            .to_string()
    );
    assert!(
        f[0].3
            .starts_with(&format!("git -C {} rm -q -- v25/pop223/", co.display()))
    );
    mend(&v, t.path(), &bin_dir(), &[]);
    assert!(
        remote
            .remote_subjects()
            .last()
            .unwrap()
            .starts_with("Remove v25/pop223/"),
        "{:?}",
        remote.remote_subjects()
    );

    // The directory's manifest rewritten with other bytes: the stores disagree, and the
    // mend publishes the workspace's release to it again.
    let m = store.join("manifests/model_names_v25.json");
    let mut bytes = fs::read(&m).unwrap();
    bytes.extend_from_slice(b"\n");
    fs::write(&m, &bytes).unwrap();
    let (code, v, _) = audit(&stores, t.path());
    assert_eq!(code, Some(3));
    let f = findings(&v);
    assert_eq!(
        f.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
        ["stores_disagree"]
    );
    assert!(
        f[0].3.ends_with(&format!("--to {}", store.display())),
        "{}",
        f[0].3
    );
    mend(&v, t.path(), &bin_dir(), &[]);
    let (code, v, _) = audit(&stores, t.path());
    assert_eq!(code, Some(0), "{v}");
}

#[test]
fn a_signature_near_expiry_is_a_problem_mended_by_signing_again() {
    let t = tempfile::tempdir().unwrap();
    let ws = workspace(t.path(), &artifact_bytes(2, 2500));
    let kp = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
    let (sk, pk) = (t.path().join("release.key"), t.path().join("release.pub"));
    fs::write(&sk, kp.sk.to_box(None).unwrap().into_string()).unwrap();
    fs::write(&pk, kp.pk.to_box().unwrap().into_string()).unwrap();
    let store = t.path().join("store");
    publish(
        &ws,
        &[s(&store)],
        &["--sign-key", s(&sk), "--expires-in", "5"],
    );
    let args = [
        "--store",
        s(&store),
        "--key",
        s(&pk),
        "--sign-key",
        s(&sk),
        "--workspace",
        s(&ws),
    ];
    let (code, v, _) = audit(&args, t.path());
    assert_eq!(code, Some(3), "{v}");
    let f = findings(&v);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].0, "signature_near_expiry");
    assert!(f[0].2.ends_with("manifests/model_names_v25.json.minisig"));
    assert!(
        f[0].3.contains(&format!("--sign-key {}", sk.display())),
        "{}",
        f[0].3
    );
    let sig = &v["stores"][0]["signature"];
    assert_eq!(sig["state"], "verified");
    assert_eq!(sig["release"], 1);
    // Human output: an RFC 3339 date, not Unix seconds.
    let o = cli_in(
        &["audit", "--generation", "v25"]
            .into_iter()
            .chain(args)
            .collect::<Vec<_>>(),
        t.path(),
    );
    let human = text(&o.stdout);
    assert!(
        human.contains("release 1 expires 20") && human.contains("day(s), within 14)"),
        "{human}"
    );
    assert!(
        !human.contains("expires=") && !human.contains("Unix seconds"),
        "{human}"
    );

    mend(&v, t.path(), &bin_dir(), &[]);
    let (code, v, _) = audit(&args, t.path());
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["stores"][0]["signature"]["release"], 2);

    // Another key: refused. Without --key: not checked, healthy.
    let other = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
    let opk = t.path().join("other.pub");
    fs::write(&opk, other.pk.to_box().unwrap().into_string()).unwrap();
    let (code, v, _) = audit(&["--store", s(&store), "--key", s(&opk)], t.path());
    assert_eq!(code, Some(3));
    assert_eq!(findings(&v)[0].0, "signature_refused");
    let msg = v["stores"][0]["problems"][0]["message"].as_str().unwrap();
    assert!(
        msg.contains("does not verify under any of the 1 trusted key(s)"),
        "{msg}"
    );
    let (code, v, _) = audit(&["--store", s(&store)], t.path());
    assert_eq!(code, Some(0));
    assert_eq!(v["stores"][0]["signature"]["state"], "not_checked");
}

#[test]
fn bad_flags_are_usage_errors_before_any_store_is_read() {
    let t = tempfile::tempdir().unwrap();
    for args in [
        vec!["audit", "--generation", "v25"],
        vec!["audit", "--generation", "25", "--store", "x"],
        vec!["audit", "--generation", "v25", "--store", "hf:/buckets/a/b"],
        vec![
            "audit",
            "--generation",
            "v25",
            "--store",
            "hf://datasets/a/b",
        ],
    ] {
        let o = cli_in(&args, t.path());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o.stderr));
    }
    // A key file that is not there: the missing input file's exit 1, naming it.
    let o = cli_in(
        &[
            "audit",
            "--generation",
            "v25",
            "--store",
            "x",
            "--key",
            "absent.pub",
        ],
        t.path(),
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("absent.pub"),
        "{}",
        text(&o.stderr)
    );
    // An empty directory: no manifest, exit 3 naming it.
    fs::create_dir(t.path().join("empty")).unwrap();
    let (code, v, _) = audit(&["--store", "empty"], t.path());
    assert_eq!(code, Some(3));
    assert_eq!(findings(&v)[0].0, "manifest_missing");
}

/// A Hub bucket through the real `hf` CLI (skipped locally without it, required in CI): the
/// published bucket is healthy, a stale chunk uploaded beside the set is found and removed by
/// the printed `hf buckets rm` command.
#[test]
fn audit_a_hub_bucket_published_through_the_real_hf_cli() {
    use test_support::hub::{HubConfig, HubEmulator, real_hf_cli};
    let Some(hf_cli) = real_hf_cli() else { return };
    let t = tempfile::tempdir().unwrap();
    let ws = workspace(t.path(), &artifact_bytes(3, 2500));
    let hub = HubEmulator::start(HubConfig::default()).unwrap();
    let bucket = "StarPilot-Driving/StarPilot-Resources";
    hub.create_bucket(bucket);
    let url = hub.url();
    let env = [("HF_ENDPOINT", url.as_str()), ("HF_TOKEN", hub.token())];
    let run = |args: &[&str]| {
        common::command()
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.to_string())))
            .current_dir(t.path())
            .output()
            .unwrap()
    };
    let uri = format!("hf://buckets/{bucket}");
    let mut publish = vec![
        "publish".to_string(),
        "--generation".into(),
        "v25".into(),
        "--manifest".into(),
        s(&ws.join("ready/model_names_v25.json")).into(),
        "--artifacts".into(),
        s(&ws.join("ready")).into(),
        "--workspace".into(),
        s(&ws).into(),
        "--to".into(),
        uri.clone(),
        "--hf-cli".into(),
        s(&hf_cli).into(),
    ];
    let o = run(&publish.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", text(&o.stderr));
    publish.clear();

    let audit_args = [
        "audit",
        "--generation",
        "v25",
        "--json",
        "--deep",
        "--store",
        &uri,
    ];
    let o = run(&audit_args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["stores"][0]["store"], uri);
    assert_eq!(v["stores"][0]["deep"], true);

    // A stale chunk of an older split, uploaded with the real CLI.
    let stale = t.path().join("stale");
    fs::write(&stale, b"older split").unwrap();
    let dst = format!("{uri}/models/v25/pop223/{CHUNK}01of01");
    let o = std::process::Command::new(&hf_cli)
        .args(["buckets", "cp", s(&stale), &dst])
        .envs(env.iter().map(|(k, v)| (*k, v.to_string())))
        .env("HF_HOME", t.path().join("hf-home"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = run(&audit_args);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let f = findings(&v);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].0, "other_split");
    assert_eq!(f[0].2, dst);
    assert_eq!(f[0].3, format!("hf buckets rm {dst} --yes"));
    let home = t.path().join("hf-home");
    mend(
        &v,
        t.path(),
        hf_cli.parent().unwrap(),
        &[
            ("HF_ENDPOINT", url.as_str()),
            ("HF_TOKEN", hub.token()),
            ("HF_HOME", s(&home)),
        ],
    );
    let o = run(&audit_args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
}

/// A made-up v26 with a made-up pin: its pin comes from `--openpilot`'s `tinygrad_pins.json`
/// (as `tinygrad bump` records it); without it the pin is unknown and named as the problem.
#[test]
fn a_made_up_v26_is_audited_against_the_pin_the_openpilot_tree_records() {
    const PIN26: &str = "0123456789abcdef0123456789abcdef01234567";
    let t = tempfile::tempdir().unwrap();
    let data = artifact_bytes(7, 2500);
    let store = t.path().join("store");
    let set = store.join("models/v26/pop223");
    let pkl = t.path().join("pop223_driving_tinygrad.pkl");
    fs::write(&pkl, &data).unwrap();
    let o = cli(&[
        "chunk",
        "split",
        s(&pkl),
        "--out-dir",
        s(&set),
        "--chunk-size",
        "1000",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let raw = t.path().join("raw.json");
    let doc = serde_json::json!({"generation": "v26", "tinygrad_commit": PIN26,
        "models": [common::entry("pop223", &data, 3)]});
    fs::write(&raw, doc.to_string()).unwrap();
    let o = cli(&["manifest", "fmt", s(&raw)]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    fs::create_dir_all(store.join("manifests")).unwrap();
    fs::write(store.join("manifests/model_names_v26.json"), &o.stdout).unwrap();
    let op = t.path().join("openpilot");
    fs::create_dir_all(&op).unwrap();
    fs::write(
        op.join("tinygrad_pins.json"),
        format!("{{\"v26\": \"{PIN26}\"}}\n"),
    )
    .unwrap();

    let run = |extra: &[&str]| {
        let mut a = vec![
            "audit",
            "--generation",
            "v26",
            "--json",
            "--deep",
            "--store",
            s(&store),
        ];
        a.extend(extra);
        let o = cli_in(&a, t.path());
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        (o.status.code(), v)
    };
    let (code, v) = run(&["--openpilot", s(&op)]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["generation"], "v26");
    let (code, v) = run(&[]);
    assert_eq!(code, Some(3), "{v}");
    let f = findings(&v);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].0, "manifest_pin");
    assert!(
        v["stores"][0]["problems"][0]["message"]
            .as_str()
            .unwrap()
            .contains("no tinygrad pin is known for v26"),
        "{v}"
    );
    // v25 pinned here would be another generation's pin; v25's manifest is simply not there.
    let o = cli_in(
        &[
            "audit",
            "--generation",
            "v25",
            "--json",
            "--store",
            s(&store),
        ],
        t.path(),
    );
    assert_eq!(o.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(findings(&v)[0].0, "manifest_missing", "{v}");
}

/// A manifest without a top-level `generation` is published with one (the key its contract's
/// published manifests carry), so our own audit calls the store it published healthy.
#[test]
fn a_manifest_without_a_generation_is_published_with_one_and_audits_healthy() {
    let t = tempfile::tempdir().unwrap();
    let ws = workspace(t.path(), &artifact_bytes(1, 2500));
    let file = ws.join("ready/model_names_v25.json");
    let mut doc: Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
    assert!(doc.as_object_mut().unwrap().remove("generation").is_some());
    fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    // The gate records (the rehearsal's digest) are of what publish stages, as `rehearse`
    // records them.
    let mut staged = manifest::Manifest::from_slice(&fs::read(&file).unwrap()).unwrap();
    staged.set_generation(manifest::Generation::new(25));
    let staged_file = t.path().join("staged.json");
    fs::write(&staged_file, staged.to_canonical_bytes()).unwrap();
    covering_records(&ws, &staged_file);
    let store = t.path().join("store");
    publish(&ws, &[s(&store)], &[]);
    let live: Value =
        serde_json::from_slice(&fs::read(store.join("manifests/model_names_v25.json")).unwrap())
            .unwrap();
    assert_eq!(live["generation"], "v25");
    let (code, v, _) = audit(&["--store", s(&store), "--workspace", s(&ws)], t.path());
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["healthy"], true);
}

/// Stray entries whatever their names (a tab, a backslash, a control character, invalid
/// UTF-8) or kinds (a FIFO) are each listed, escaped, with a mend that runs as printed and
/// makes the store healthy; a deep audit of a corrupt artifact names its failing chunk.
#[test]
fn odd_strays_are_listed_and_a_deep_audit_names_the_failing_chunk() {
    use std::os::unix::ffi::OsStrExt;
    let t = tempfile::tempdir().unwrap();
    let ws = workspace(t.path(), &artifact_bytes(1, 2500));
    let store = t.path().join("store");
    publish(&ws, &[s(&store)], &[]);
    let dir = store.join("models/v25/pop223");
    let names: [&[u8]; 4] = [b"a\tb", b"c\\d", b"e\x01f", b"g\xffh"];
    for n in names {
        fs::write(dir.join(std::ffi::OsStr::from_bytes(n)), b"stray").unwrap();
    }
    assert!(
        std::process::Command::new("mkfifo")
            .arg(dir.join("pipe"))
            .status()
            .unwrap()
            .success()
    );
    let stores = ["--store", s(&store), "--workspace", s(&ws)];
    let start = std::time::Instant::now();
    let (code, v, _) = audit(&stores, t.path());
    assert!(start.elapsed() < std::time::Duration::from_secs(20));
    assert_ne!(code, Some(0), "{v}");
    assert_eq!(v["healthy"], false);
    let odd: Vec<String> = v["stores"][0]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "odd_name")
        .map(|f| f["message"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(odd.len(), 5, "{v}");
    for shown in [r"a\tb", r"c\\d", r"e\u{1}f", r"g\xffh", "pipe"] {
        assert!(odd.iter().any(|m| m.contains(shown)), "{shown}: {odd:?}");
    }
    mend(&v, t.path(), &bin_dir(), &[]);
    let (code, v, _) = audit(&stores, t.path());
    assert_eq!(code, Some(0), "{v}");

    // Flip one byte of the second chunk (same size): the deep audit names that chunk.
    let chunk = dir.join(format!("{CHUNK}02of03"));
    let mut bytes = fs::read(&chunk).unwrap();
    bytes[10] ^= 0xff;
    fs::write(&chunk, bytes).unwrap();
    let mut deep = stores.to_vec();
    deep.push("--deep");
    let (code, v, _) = audit(&deep, t.path());
    assert_ne!(code, Some(0), "{v}");
    let f = findings(&v);
    let corrupt: Vec<_> = f.iter().filter(|f| f.0 == "corrupt").collect();
    assert_eq!(corrupt.len(), 1, "{v}");
    assert!(corrupt[0].2.ends_with(&format!("{CHUNK}02of03")), "{v}");
    let message = v["stores"][0]["problems"][0]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "failing chunk(s): models/v25/pop223/{CHUNK}02of03"
        )),
        "{message}"
    );
    assert!(
        !message.contains("01of03") && !message.contains("03of03"),
        "{message}"
    );
}

/// The publish record names the manifest canonically (absolute, through a symlinked
/// directory resolved), however it was typed.
#[test]
fn the_publish_record_names_the_manifest_canonically() {
    let t = tempfile::tempdir().unwrap();
    let ws = workspace(t.path(), &artifact_bytes(1, 2500));
    std::os::unix::fs::symlink(&ws, t.path().join("link")).unwrap();
    let store = t.path().join("store");
    let o = cli_in(
        &[
            "publish",
            "--generation",
            "v25",
            "--manifest",
            "./link/ready/../ready/model_names_v25.json",
            "--artifacts",
            "link/ready",
            "--workspace",
            "link",
            "--to",
            s(&store),
        ],
        t.path(),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let record: Value =
        serde_json::from_slice(&fs::read(ws.join("ready/model_names_v25.publish.json")).unwrap())
            .unwrap();
    let canonical = fs::canonicalize(ws.join("ready/model_names_v25.json")).unwrap();
    assert_eq!(record["manifest"], canonical.to_str().unwrap(), "{record}");
}

/// `status --store` without a known generation says so for each store, and its human store
/// row shows what `--json` has (models and the live manifest's SHA-256).
#[test]
fn status_says_why_a_store_was_not_read_and_its_rows_show_what_json_has() {
    let t = tempfile::tempdir().unwrap();
    let ws = workspace(t.path(), &artifact_bytes(1, 2500));
    let store = t.path().join("store");
    publish(&ws, &[s(&store)], &[]);
    let o = cli(&["status", "--workspace", s(&ws), "--store", s(&store)]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.lines()
            .any(|l| l.starts_with("store ") && l.contains("no generation is known")),
        "{out}"
    );
    let json = |extra: &[&str]| -> Value {
        let mut a = vec![
            "status",
            "--json",
            "--workspace",
            s(&ws),
            "--store",
            s(&store),
        ];
        a.extend(extra);
        let o = cli(&a);
        assert!(o.status.success(), "{}", text(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let v = json(&[]);
    assert!(
        v["stores"][0]["problem"]
            .as_str()
            .unwrap()
            .contains("--generation vNN"),
        "{v}"
    );
    let v = json(&["--generation", "v25"]);
    let o = cli(&[
        "status",
        "--workspace",
        s(&ws),
        "--store",
        s(&store),
        "--generation",
        "v25",
    ]);
    let out = text(&o.stdout);
    let row = out
        .lines()
        .find(|l| l.starts_with("store "))
        .unwrap_or_else(|| panic!("{out}"));
    let st = &v["stores"][0];
    assert!(
        row.contains(&format!("models {}", st["models"])),
        "{row} / {st}"
    );
    assert!(
        row.contains(st["manifest_sha256"].as_str().unwrap()),
        "{row} / {st}"
    );
}

/// A symlinked `<id>/` in `--artifacts` is followed (its chunk set is published); one whose
/// link leads nowhere is refused naming it, not called missing.
#[test]
fn a_symlinked_model_directory_is_followed() {
    let t = tempfile::tempdir().unwrap();
    let ws = workspace(t.path(), &artifact_bytes(1, 2500));
    let elsewhere = t.path().join("elsewhere");
    fs::rename(ws.join("ready/pop223"), &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, ws.join("ready/pop223")).unwrap();
    let store = t.path().join("store");
    publish(&ws, &[s(&store)], &[]);
    assert!(
        store
            .join(format!("models/v25/pop223/{CHUNK}01of03"))
            .is_file()
    );
    let (code, v, _) = audit(&["--store", s(&store), "--workspace", s(&ws)], t.path());
    assert_eq!(code, Some(0), "{v}");

    fs::remove_file(ws.join("ready/pop223")).unwrap();
    std::os::unix::fs::symlink(t.path().join("gone"), ws.join("ready/pop223")).unwrap();
    let o = cli(&[
        "publish",
        "--generation",
        "v25",
        "--manifest",
        s(&ws.join("ready/model_names_v25.json")),
        "--artifacts",
        s(&ws.join("ready")),
        "--workspace",
        s(&ws),
        "--to",
        s(&t.path().join("store2")),
    ]);
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("pop223"), "{err}");
    assert!(!t.path().join("store2").exists());
}
