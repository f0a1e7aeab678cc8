//! `release-cli publish`, `reuse` and `serve` as a release engineer runs them: the real binary,
//! a real local store, a real bare git origin, the stand-in `hf`, and HTTP on 127.0.0.1.

use crate::common;
use crate::common::{TG, cli, covering_records, entry, http_get, publish_argv, serve, strs};

use std::path::Path;

use serde_json::{Value, json};
use test_support::published::{artifact_bytes, sha256_hex};
use test_support::release_stores::{GitRemote, StandinHf};

const SRC: &str = "1111111111111111111111111111111111111111";

/// [`common::release`], as the strings the command lines take.
fn release(dir: &Path, data: &[u8]) -> (String, String) {
    let (artifacts, manifest) = common::release(dir, data);
    (
        artifacts.to_str().unwrap().to_string(),
        manifest.to_str().unwrap().to_string(),
    )
}

/// `release-cli publish --json` of [`release`]'s files to `hf://buckets/{bucket}` through the
/// `hf` at `hf_cli`, against `hub` with `token`.
fn publish_to_hub(
    hub: &test_support::hub::HubEmulator,
    token: &str,
    (artifacts, manifest): &(String, String),
    bucket: &str,
    hf_cli: &Path,
    extra: &[&str],
) -> std::process::Output {
    common::command()
        .env("HF_ENDPOINT", hub.url())
        .env("HF_TOKEN", token)
        .args([
            "publish",
            "--generation",
            "v25",
            "--manifest",
            manifest,
            "--artifacts",
            artifacts,
            "--to",
            &format!("hf://buckets/{bucket}"),
            "--hf-cli",
            hf_cli.to_str().unwrap(),
            "--workspace",
            covering_records(
                &Path::new(manifest).parent().unwrap().join("ws"),
                Path::new(manifest),
            )
            .to_str()
            .unwrap(),
            "--json",
        ])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn publish_dry_run_then_publish_to_a_directory_and_github() {
    let t = tempfile::tempdir().unwrap();
    let data = artifact_bytes(1, 2500);
    let (artifacts, manifest) = release(t.path(), &data);
    let store = t.path().join("store");
    let remote = GitRemote::new(&t.path().join("git"), "Models", None);
    let gh = format!("github:{}", remote.checkout.display());
    let ws = covering_records(&t.path().join("ws"), Path::new(&manifest));
    let args = |extra: &[&str]| {
        let mut v = vec![
            "publish",
            "--generation",
            "v25",
            "--manifest",
            &manifest,
            "--artifacts",
            &artifacts,
            "--workspace",
            ws.to_str().unwrap(),
            "--to",
            store.to_str().unwrap(),
            "--to",
            &gh,
            // No Hub store here: GitHub goes with the local store only.
            "--github-only",
            "test: no Hub in this test",
        ];
        v.extend_from_slice(extra);
        v.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        cli(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };

    let o = run(&["--dry-run"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let plan = String::from_utf8_lossy(&o.stdout);
    assert!(
        plan.contains("upload   models/v25/pop223/pop223_driving_tinygrad.pkl.chunk01of03"),
        "{plan}"
    );
    // The github: store's part of the plan names the branch's paths, not the bucket's.
    let (_, gh_part) = plan
        .split_once(&format!("{gh}:\n"))
        .expect("the github store's plan");
    assert!(
        gh_part.contains("upload   v25/pop223/pop223_driving_tinygrad.pkl.chunk01of03")
            && gh_part.contains("manifest model_names_v25.json: would write")
            && !gh_part.contains("models/v25/")
            && !gh_part.contains("manifests/"),
        "{plan}"
    );
    assert!(plan.contains("would write"), "{plan}");
    // Regression: reasons were Rust spellings (`Missing`, `SizeDiffers`).
    assert!(
        plan.contains(", missing)") && !plan.contains(" bytes"),
        "{plan}"
    );
    assert!(
        !plan.contains("Missing") && !plan.contains("Differs"),
        "{plan}"
    );
    assert!(!store.exists());
    assert_eq!(remote.remote_subjects(), ["init"]);

    let o = run(&["--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let report = lines.last().unwrap();
    assert_eq!(report["stores"][0]["manifest"], "written");
    assert_eq!(report["stores"][1]["manifest"], "written");
    assert_eq!(report["stores"][1]["uploaded_files"], 5);
    assert!(lines.iter().any(|l| l["event"] == "manifest_written"));
    // Progress events: what each store learnt while writing (the directory's copy; the github:
    // store's commits, its push's byte figure and its end), and each store's bytes counted as
    // sent, which end at what it uploaded.
    for (i, kinds) in [(0, &["file"][..]), (1, &["staged", "push", "pushed"][..])] {
        let name = report["stores"][i]["store"].as_str().unwrap();
        let of_store = |event: &str| -> Vec<&Value> {
            lines
                .iter()
                .filter(|l| l["event"] == event && l["store"] == name)
                .collect()
        };
        for kind in kinds {
            assert!(
                of_store("progress")
                    .iter()
                    .any(|l| l["transfer"]["kind"] == *kind),
                "{name}: no {kind} progress in {lines:?}"
            );
        }
        let sent: Vec<u64> = of_store("uploaded")
            .iter()
            .map(|l| l["sent"].as_u64().unwrap())
            .collect();
        assert!(sent.windows(2).all(|w| w[0] <= w[1]), "{name}: {sent:?}");
        assert_eq!(
            sent.last().copied(),
            report["stores"][i]["uploaded_bytes"].as_u64(),
            "{name}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l["transfer"]["kind"] == "file" && l["transfer"]["measure"] == "copied")
    );
    assert_eq!(
        remote.remote_subjects().last().unwrap(),
        "Publish model_names_v25.json"
    );

    // GitHub before the Hub is a usage error; nothing is opened.
    let o = cli(&strs(&publish_argv(
        "v25",
        &manifest,
        &artifacts,
        &[&gh, "hf://buckets/a/b"],
        &["--dry-run"],
    )));
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn reuse_refusal_exits_3_and_a_compatible_reuse_updates_the_manifest() {
    let t = tempfile::tempdir().unwrap();
    let hf = StandinHf::install(&t.path().join("hub"), None);
    let data = artifact_bytes(2, 1500);
    // The source chunk set in a local directory (a build kept on disk by another fork).
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("x.pkl"), &data).unwrap();
    let o = cli(&[
        "chunk",
        "split",
        src.join("x.pkl").to_str().unwrap(),
        "--chunk-size",
        "1000",
    ]);
    assert!(o.status.success());
    std::fs::remove_file(src.join("x.pkl")).unwrap();
    let mut e = entry("x", &data, 2);
    e["source_commit"] = SRC.into();
    let catalog = t.path().join("catalog.json");
    std::fs::write(
        &catalog,
        json!({"tinygrad_commit": TG, "models": [e]}).to_string(),
    )
    .unwrap();
    let ours = t.path().join("model_names_v25.json");
    let before =
        json!({"generation": "v25", "tinygrad_commit": TG, "models": [entry("pop223", b"old", 1)]});
    std::fs::write(&ours, serde_json::to_string_pretty(&before).unwrap() + "\n").unwrap();
    let store = t.path().join("store");
    let from = src.join("x.pkl");
    let base = |source_commit: &str| {
        vec![
            "reuse".to_string(),
            "--model".into(),
            "pop223".into(),
            "--source-id".into(),
            "x".into(),
            "--from".into(),
            from.to_str().unwrap().into(),
            "--source-catalog".into(),
            catalog.to_str().unwrap().into(),
            "--source-commit".into(),
            source_commit.into(),
            "--tinygrad-commit".into(),
            TG.into(),
            "--to".into(),
            store.to_str().unwrap().into(),
            "--generation".into(),
            "v25".into(),
            "--manifest".into(),
            ours.to_str().unwrap().into(),
            "--hf-cli".into(),
            hf.exe.to_str().unwrap().into(),
        ]
    };
    let run = |a: Vec<String>| cli(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let manifest_before = std::fs::read(&ours).unwrap();

    let o = run(base("2222222222222222222222222222222222222222"));
    assert_eq!(o.status.code(), Some(3));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("source-model commit differs"), "{err}");
    assert!(!store.exists());
    assert_eq!(std::fs::read(&ours).unwrap(), manifest_before);

    let o = run(base(SRC));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&sha256_hex(&data)) && out.contains("chunk_count  2"),
        "{out}"
    );
    let d = store.join("models/v25/pop223");
    let mut joined = std::fs::read(d.join("pop223_driving_tinygrad.pkl.chunk01of02")).unwrap();
    joined.extend(std::fs::read(d.join("pop223_driving_tinygrad.pkl.chunk02of02")).unwrap());
    assert_eq!(joined, data);
    assert_eq!(
        std::fs::read_to_string(d.join("pop223_driving_tinygrad.pkl.chunkmanifest")).unwrap(),
        "2"
    );
    let after: Value = serde_json::from_slice(&std::fs::read(&ours).unwrap()).unwrap();
    assert_eq!(after["models"][0]["artifact_sha256"], sha256_hex(&data));
    assert_eq!(after["models"][0]["artifact_chunk_count"], 2);
    assert_eq!(after["models"][0]["source_commit"], SRC);
    assert!(hf.calls().is_empty(), "a local reuse never runs hf");
}

/// A made-up v26 pin (the tree's `tinygrad_pins.json` records it).
const V26_PIN: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";

/// `reuse` applies the pin table as `publish` reads it (built-in plus `--openpilot`'s
/// `tinygrad_pins.json`): an artifact compiled with another generation's tinygrad never
/// replaces a live set, for v25 and for a made-up v26; every refusal leaves the store and the
/// manifest as they were.
#[test]
fn reuse_refuses_an_artifact_of_another_generations_pin() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let data = artifact_bytes(3, 1500);
    let src = root.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("x.pkl"), &data).unwrap();
    let split = |dir: &Path| {
        let o = cli(&[
            "chunk",
            "split",
            dir.join("x.pkl").to_str().unwrap(),
            "--chunk-size",
            "1000",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::remove_file(dir.join("x.pkl")).unwrap();
    };
    split(&src);
    let mut e = entry("x", &data, 2);
    e["source_commit"] = SRC.into();
    // One source catalog per pin: the same artifact, as built with v25's and with v26's tinygrad.
    for (name, pin) in [("catalog_v25.json", TG), ("catalog_v26.json", V26_PIN)] {
        std::fs::write(
            root.join(name),
            json!({"tinygrad_commit": pin, "models": [e.clone()]}).to_string(),
        )
        .unwrap();
    }
    // The openpilot tree after `tinygrad bump` to v26.
    let op = root.join("op");
    std::fs::create_dir_all(&op).unwrap();
    std::fs::write(
        op.join("tinygrad_pins.json"),
        json!({"v25": TG, "v26": V26_PIN}).to_string(),
    )
    .unwrap();
    // The live v26 and v25 sets of tr14223 in the store.
    let store = root.join("store");
    for g in ["v25", "v26"] {
        let d = store.join(format!("models/{g}/tr14223"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("tr14223_driving_tinygrad.pkl.chunk01of01"), g).unwrap();
        std::fs::write(d.join("tr14223_driving_tinygrad.pkl.chunkmanifest"), "1").unwrap();
    }
    let reuse = |generation: &str, pin: &str, openpilot: bool| {
        let mut a = vec![
            "reuse",
            "--model",
            "tr14223",
            "--source-id",
            "x",
            "--from",
            "src/x.pkl",
            "--source-catalog",
        ];
        a.push(if pin == TG {
            "catalog_v25.json"
        } else {
            "catalog_v26.json"
        });
        a.extend([
            "--source-commit",
            SRC,
            "--tinygrad-commit",
            pin,
            "--to",
            "store",
            "--generation",
            generation,
        ]);
        if openpilot {
            a.extend(["--openpilot", "op"]);
        }
        common::command()
            .args(&a)
            .current_dir(root)
            .output()
            .unwrap()
    };
    let refused = |generation: &str, pin: &str, openpilot: bool, says: &str| {
        let before = common::snapshot(root);
        let o = reuse(generation, pin, openpilot);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(3), "{generation} {pin}: {err}");
        assert!(err.contains(says), "{err}");
        assert!(err.contains("nothing was copied"), "{err}");
        assert_eq!(
            common::snapshot(root),
            before,
            "a refused reuse changed something"
        );
    };
    // A v25-pinned artifact into v26: refused (it is v25's pin), the live v26 set untouched.
    refused(
        "v26",
        TG,
        true,
        &format!("tinygrad_commit {TG} is not v26's pin {V26_PIN} (it is v25's"),
    );
    // Without the tree, v26 has no pin at all: refused, naming the way to record one.
    refused("v26", V26_PIN, false, "no tinygrad pin is recorded for v26");
    // A v26-pinned artifact into v25: refused, the live v25 set untouched.
    refused(
        "v25",
        V26_PIN,
        true,
        &format!("tinygrad_commit {V26_PIN} is not v25's pin {TG} (it is v26's"),
    );
    // The generation's own pin is adopted.
    for (g, pin) in [("v26", V26_PIN), ("v25", TG)] {
        let o = reuse(g, pin, true);
        assert!(
            o.status.success(),
            "{g}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let d = store.join(format!("models/{g}/tr14223"));
        let mut joined = std::fs::read(d.join("tr14223_driving_tinygrad.pkl.chunk01of02")).unwrap();
        joined.extend(std::fs::read(d.join("tr14223_driving_tinygrad.pkl.chunk02of02")).unwrap());
        assert_eq!(joined, data, "{g}");
    }
}

#[test]
fn serve_prints_its_address_first_and_serves_both_layouts() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    std::fs::create_dir_all(store.join("manifests")).unwrap();
    std::fs::write(
        store.join("manifests/model_names_v25.json"),
        b"{\"models\": []}\n",
    )
    .unwrap();
    let server = serve(&["--store", store.to_str().unwrap()]);
    let url = server.first_line.trim().to_string();
    let addr = url
        .strip_prefix("http://")
        .expect("first line is the URL")
        .to_string();
    let get = |path: &str| http_get(&addr, path);
    let hf = get(
        "/buckets/StarPilot-Driving/StarPilot-Resources/resolve/manifests/model_names_v25.json",
    );
    assert!(
        hf.starts_with("HTTP/1.1 200") && hf.ends_with("{\"models\": []}\n"),
        "{hf}"
    );
    let gh = get("/firestar5683/StarPilot-Resources/Models/model_names_v25.json");
    assert!(gh.starts_with("HTTP/1.1 200"), "{gh}");
    assert!(
        get("/buckets/StarPilot-Driving/StarPilot-Resources/resolve/../x")
            .starts_with("HTTP/1.1 404")
    );
    drop(server);

    let o = cli(&["serve", "--store", t.path().join("nope").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
}

/// `release-cli publish` to a Hugging Face bucket through the real `hf` CLI and the Hub
/// emulator (skipped locally without the CLI, required in CI).
#[test]
fn publish_to_a_hub_bucket_through_the_real_hf_cli() {
    use test_support::hub::{HubConfig, HubEmulator, HubOp, real_hf_cli};
    let Some(hf_cli) = real_hf_cli() else { return };
    let t = tempfile::tempdir().unwrap();
    let data = artifact_bytes(3, 2500);
    let files = release(t.path(), &data);
    let hub = HubEmulator::start(HubConfig::default()).unwrap();
    let bucket = "StarPilot-Driving/StarPilot-Resources";
    hub.create_bucket(bucket);
    let o = publish_to_hub(&hub, hub.token(), &files, bucket, &hf_cli, &[]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["stores"][0]["manifest"], "written");
    assert_eq!(report["stores"][0]["uploaded_files"], 5);
    let paths: Vec<String> = hub
        .ops()
        .into_iter()
        .map(|op| match op {
            HubOp::Add { path, .. } => path,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(paths.len(), 6);
    assert_eq!(paths.last().unwrap(), "manifests/model_names_v25.json");
    assert_eq!(
        hub.bucket_file(
            bucket,
            "models/v25/pop223/pop223_driving_tinygrad.pkl.chunk03of03"
        )
        .unwrap(),
        data[2000..]
    );
    assert!(!stdout.contains(hub.token()));
}

/// A CLI that echoes the token as it fails (a stand-in: the real one cannot be made to on
/// demand): neither the `--json` events nor the error message carry it.
#[test]
fn the_token_never_reaches_json_events_or_messages() {
    use test_support::hub::{HubConfig, HubEmulator};
    let t = tempfile::tempdir().unwrap();
    let data = artifact_bytes(4, 2500);
    let files = release(t.path(), &data);
    let hub = HubEmulator::start(HubConfig::default()).unwrap();
    hub.create_bucket("a/b");
    let exe = t.path().join("hf");
    std::fs::write(
        &exe,
        "#!/bin/sh\necho \"token=$HF_TOKEN\" >&2\necho \"Authorization: Bearer $HF_TOKEN\" >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let secret = "hf_NotForPrintingNotForPrinting42";
    let o = publish_to_hub(&hub, secret, &files, "a/b", &exe, &["--attempts", "2"]);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!o.status.success(), "{all}");
    assert!(all.contains("\"event\":\"retrying\""), "{all}");
    assert!(all.contains("<redacted>"), "{all}");
    assert!(
        !all.contains(secret) && !all.contains("NotForPrinting"),
        "{all}"
    );
}

/// `reuse --dry-run` from a Hub dataset into a Hub bucket (the Hub emulator for reads, the
/// stand-in `hf` for writes): it checks the source and prints the plan, and writes nothing: no
/// `hf` call, no write operation at the Hub, the bucket and the manifest unchanged.
#[test]
fn reuse_dry_run_checks_the_source_prints_the_plan_and_writes_nothing() {
    use test_support::hub::{HubConfig, HubEmulator};
    let t = tempfile::tempdir().unwrap();
    let emu = HubEmulator::start(HubConfig::default()).unwrap();
    emu.create_bucket("ns/dest");
    let hf = StandinHf::install(&t.path().join("standin"), None);
    let data = artifact_bytes(4, 1500);
    let build = t.path().join("build");
    std::fs::create_dir_all(&build).unwrap();
    std::fs::write(build.join("x_driving_tinygrad.pkl"), &data).unwrap();
    let split = t.path().join("split");
    let o = cli(&[
        "chunk",
        "split",
        build.join("x_driving_tinygrad.pkl").to_str().unwrap(),
        "--out-dir",
        split.to_str().unwrap(),
        "--chunk-size",
        "1000",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for f in std::fs::read_dir(&split).unwrap() {
        let f = f.unwrap();
        emu.seed_repo_file(
            "datasets",
            "org/src",
            &format!("builds/{}", f.file_name().to_string_lossy()),
            &std::fs::read(f.path()).unwrap(),
        );
    }
    let mut e = entry("x", &data, 2);
    e["source_commit"] = SRC.into();
    let catalog = t.path().join("catalog.json");
    std::fs::write(
        &catalog,
        json!({"tinygrad_commit": TG, "models": [e]}).to_string(),
    )
    .unwrap();
    let ours = t.path().join("model_names_v25.json");
    let doc =
        json!({"generation": "v25", "tinygrad_commit": TG, "models": [entry("pop223", b"old", 1)]});
    std::fs::write(&ours, serde_json::to_string_pretty(&doc).unwrap() + "\n").unwrap();
    let manifest_before = std::fs::read(&ours).unwrap();
    emu.clear_log();
    let run = |extra: &[&str]| {
        common::command()
            .args([
                "reuse",
                "--dry-run",
                "--model",
                "pop223",
                "--source-id",
                "x",
                "--from",
                "hf://datasets/org/src/builds/x_driving_tinygrad.pkl",
                "--source-catalog",
                catalog.to_str().unwrap(),
                "--source-commit",
                SRC,
                "--tinygrad-commit",
                TG,
                "--to",
                "hf://buckets/ns/dest",
                "--generation",
                "v25",
                "--manifest",
                ours.to_str().unwrap(),
                "--hf-cli",
                hf.exe.to_str().unwrap(),
            ])
            .args(extra)
            .env("HF_ENDPOINT", emu.url())
            .env("HF_TOKEN", emu.token())
            .output()
            .unwrap()
    };
    let o = run(&["--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let dir = "models/v25/pop223/pop223_driving_tinygrad.pkl";
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["sha256"], sha256_hex(&data));
    assert_eq!(v["chunk_count"], 2);
    assert_eq!(v["server_side"], true, "{v}");
    assert_eq!(v["remove"], format!("{dir}.chunkmanifest"));
    assert_eq!(v["copy"][1]["to"], format!("{dir}.chunk02of02"));
    assert_eq!(v["copy"][1]["size"], 500);
    assert_eq!(
        v["write"],
        json!([format!("{dir}.sha256"), format!("{dir}.chunkmanifest")])
    );
    assert_eq!(v["manifest"], ours.to_str().unwrap());
    let o = run(&[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with("plan reuse pop223 (1.46 KiB, 2 chunk(s)"),
        "{out}"
    );
    assert!(
        out.contains("  copy     hf://datasets/org/src")
            && out.contains(&format!("-> {dir}.chunk01of02 (1000 B)")),
        "{out}"
    );
    assert!(out.contains("  update   "), "{out}");

    assert!(hf.calls().is_empty(), "no hf call: {:?}", hf.calls());
    assert!(emu.ops().is_empty(), "no write at the Hub: {:?}", emu.ops());
    let reqs = emu.requests();
    assert!(!reqs.is_empty(), "the source was read");
    assert!(
        reqs.iter().all(|r| r.method == "GET" || r.method == "HEAD"),
        "{reqs:?}"
    );
    assert!(emu.bucket_paths("ns/dest").is_empty());
    assert_eq!(std::fs::read(&ours).unwrap(), manifest_before);

    // The same checks as a real reuse: a source that does not match its catalog is refused.
    let mut bad = entry("x", &data, 3);
    bad["source_commit"] = SRC.into();
    std::fs::write(
        &catalog,
        json!({"tinygrad_commit": TG, "models": [bad]}).to_string(),
    )
    .unwrap();
    let o = run(&[]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `-q` leaves stdout as it is and stderr empty; `-v` adds one line per uploaded file.
#[test]
fn publish_quiet_prints_the_report_only_and_verbose_each_upload() {
    let t = tempfile::tempdir().unwrap();
    let data = artifact_bytes(3, 2500);
    let (artifacts, manifest) = release(t.path(), &data);
    let ws = covering_records(&t.path().join("ws"), Path::new(&manifest));
    let publish = |store: &str, flag: Option<&str>| {
        let dir = t.path().join(store);
        let mut a = vec![
            "publish",
            "--generation",
            "v25",
            "--manifest",
            &manifest,
            "--artifacts",
            &artifacts,
            "--to",
            dir.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
        ];
        a.extend(flag);
        let o = cli(&a);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // Each publish has its own record file: the line naming it differs from run to run.
        let out: String = String::from_utf8_lossy(&o.stdout)
            .replace(dir.to_str().unwrap(), "STORE")
            .lines()
            .filter(|l| !l.starts_with("this publish's record (kept): "))
            .map(|l| format!("{l}\n"))
            .collect();
        (out, String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (out, err) = publish("a", None);
    assert!(
        err.contains("publishing to") && err.contains("next: "),
        "{err}"
    );
    assert!(!err.contains("uploading"), "{err}");
    let (quiet_out, quiet_err) = publish("b", Some("--quiet"));
    assert_eq!(quiet_err, "");
    assert_eq!(quiet_out, out);
    let (verbose_out, verbose_err) = publish("c", Some("-v"));
    assert_eq!(verbose_out, out);
    for (i, size) in [(1, 1000), (2, 1000), (3, 500)] {
        let line = format!(
            "uploading models/v25/pop223/pop223_driving_tinygrad.pkl.chunk0{i}of03 ({size} B)"
        );
        assert!(verbose_err.contains(&line), "{line} in {verbose_err}");
    }
    assert!(verbose_err.contains("next: "), "{verbose_err}");
}

/// `serve` stopped by SIGTERM (a service manager, `kill`) or SIGINT (Ctrl-C) ends normally:
/// exit 0, not 143 or 130, after it served.
#[test]
fn serve_exits_0_on_sigterm_and_sigint() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    std::fs::create_dir_all(store.join("manifests")).unwrap();
    for signal in ["TERM", "INT"] {
        let mut server = serve(&["--store", store.to_str().unwrap()]);
        let url = server.first_line.trim().to_string();
        let addr = url.trim_start_matches("http://");
        let reply = http_get(addr, "/buckets/x/y/resolve/main/manifests/none.json");
        assert!(reply.starts_with("HTTP/1.1 404"), "{signal}: {reply}");
        let status = server.stop_with(signal);
        assert_eq!(status.code(), Some(0), "SIG{signal}: {status:?}");
    }
}
