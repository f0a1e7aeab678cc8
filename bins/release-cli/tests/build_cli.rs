//! The build half of `release-cli` (sync, compile, dm, rebuild, validate, builtin, tinygrad
//! bump), run as the real binary against a real sshd on 127.0.0.1 and a stand-in device root.

use crate::common::{cli_in as cli, snapshot, text};

use std::fs;
use std::path::Path;
use std::process::Command;

use test_support::sshd::{DeviceRoot, Sshd};

const PIN: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";
const OTHER: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";
const REF: &str = "62bf6fb072880905a4c490f0f4f4a6b3c23346ec";

/// The remote flags pointing at the loopback sshd and the device root.
fn remote<'a>(sshd: &'a Sshd, dev: &'a DeviceRoot, buf: &'a mut Vec<String>) -> Vec<&'a str> {
    buf.clear();
    buf.push(sshd.ssh_config().to_str().unwrap().to_string());
    buf.push(dev.remote_root().to_str().unwrap().to_string());
    vec![
        "--remote",
        Sshd::alias(),
        "--allow-other-compiler",
        "--ssh-config",
        &buf[0],
        "--remote-root",
        &buf[1],
        "--tinygrad-commit",
        PIN,
    ]
}

fn write(path: &Path, body: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, body).unwrap();
}

const BASE: &str = r#"{
  "models": [
    {
      "id": "pop223",
      "name": "Pop",
      "version": "v11",
      "series": "OP Series",
      "released": "2025-01-01",
      "community_favorite": true,
      "artifact_format": "tinygrad_single_v1",
      "artifact_size": 5,
      "artifact_sha256": "0000000000000000000000000000000000000000000000000000000000000000",
      "artifact_chunk_count": 1,
      "uses_external_gpu": false
    },
    {
      "id": "sc23",
      "name": "SC",
      "version": "v9",
      "series": "OP Series",
      "released": "2025-01-02",
      "community_favorite": false,
      "uses_external_gpu": false
    },
    {
      "id": "rdf43",
      "name": "Regret Driven Framework V4",
      "version": "v15",
      "series": "OP Series",
      "released": "2025-01-03",
      "community_favorite": false,
      "uses_external_gpu": false
    }
  ]
}
"#;

#[test]
fn rebuild_records_a_failure_then_resumes_and_writes_the_manifest() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(Some(PIN));
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    // The source store: the archive layout onnx/<source-id>/.
    write(
        &root.join("store/onnx/pop22/driving_vision.onnx"),
        b"pop vision",
    );
    write(
        &root.join("store/onnx/pop22/driving_policy.onnx"),
        b"pop policy",
    );
    write(&root.join("store/onnx/pop22/README.txt"), b"not a source");
    write(
        &root.join("store/onnx/sc23/driving_supercombo.onnx"),
        b"sc supercombo",
    );
    write(
        &root.join("map.json"),
        format!(
            r#"{{"pop223": {{"source_id": "pop22", "input_format": "split", "ref": "{REF}"}},
                "sc23": {{"source_id": "sc23", "input_format": "supercombo"}},
                "newmodel": {{"input_format": "supercombo"}}}}"#
        )
        .as_bytes(),
    );
    write(&root.join("base.json"), BASE.as_bytes());
    dev.set("fail", "sc23");

    let mut buf = Vec::new();
    let mut args = vec![
        "rebuild",
        "--workspace",
        "ws",
        "--source-map",
        "map.json",
        "--base-manifest",
        "base.json",
        "--sources",
        "store",
        "--generation",
        "v25",
        "--json",
    ];
    args.extend(remote(&sshd, &dev, &mut buf));

    let out = cli(&args, root);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("[model 1 of 2] pop223"), "{err}");
    assert!(err.contains("elapsed"), "{err}");
    assert!(
        err.contains("[device] compile of sc23 failed: injected failure"),
        "{err}"
    );
    assert!(err.contains("1 model(s) failed: sc23"), "{err}");
    // The summary says what failed, so it is the whole --json answer: no error document follows.
    let stdout = text(&out.stdout);
    let mut lines = stdout.lines();
    let summary: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(lines.next(), None, "{stdout}");
    assert_eq!(summary["compiled"], 1);
    assert_eq!(summary["failed"], 1);
    assert_eq!(summary["not_in_catalog"], serde_json::json!(["newmodel"]));
    let ws = root.join("ws");
    assert!(ws.join("results/pop223.json").is_file());
    let failure: serde_json::Value =
        serde_json::from_slice(&fs::read(ws.join("results/sc23.failure.json")).unwrap()).unwrap();
    assert_eq!(failure["status"], "failed");
    assert!(failure["error"].as_str().unwrap().contains("sc23.log"));
    assert!(
        fs::read_to_string(ws.join("logs/sc23.log"))
            .unwrap()
            .contains("injected failure")
    );
    // Only the ONNX files were fetched and staged.
    let calls = dev.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");

    // A dry run now: pop223 is done, sc23 would be built again; nothing changes, nothing runs.
    let before = snapshot(root);
    let mut dry: Vec<&str> = args.iter().copied().filter(|a| *a != "--json").collect();
    dry.push("--dry-run");
    let out = cli(&dry, root);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("1 to build, 1 done earlier"), "{said}");
    assert!(said.contains("  skip  pop223"), "{said}");
    assert!(said.contains("  build sc23 (v9, supercombo)"), "{said}");
    assert_eq!(
        snapshot(root),
        before,
        "a rebuild dry run changed something"
    );
    assert_eq!(dev.calls().len(), 2);
    assert!(calls[0].ends_with("inputs=driving_policy.onnx,driving_vision.onnx"));
    assert!(calls[0].starts_with("--pop223 --version v11 --input-format split"));

    let manifest = fs::read(ws.join("ready/model_names_v25.json")).unwrap();
    let m: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    assert_eq!(m["generation"], "v25");
    assert_eq!(m["tinygrad_commit"], PIN);
    assert_eq!(m["models"][0]["version"], "v11");
    assert_eq!(m["models"][0]["source_commit"], REF);
    assert_eq!(m["models"][0]["artifact_chunk_count"], 3);
    // Per-chunk digests, in chunk order, match the chunk files staged in ready/.
    let digests = m["models"][0]["artifact_chunk_sha256"].as_array().unwrap();
    assert_eq!(digests.len(), 3);
    for (i, d) in digests.iter().enumerate() {
        let chunk = ws.join(format!(
            "ready/pop223/pop223_driving_tinygrad.pkl.chunk{:02}of03",
            i + 1
        ));
        let (want, _) = chunker::Sha256Digest::of_file(&chunk).unwrap();
        assert_eq!(d.as_str().unwrap(), want.to_hex());
    }
    assert!(m["models"][1].get("artifact_sha256").is_none());
    assert_eq!(
        m["models"].as_array().unwrap().len(),
        3,
        "no model was added"
    );

    // Resume: the failure is fixed; pop223 is skipped, sc23 retried.
    dev.clear("fail");
    let out = cli(&args, root);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["skipped"], 1);
    assert_eq!(summary["compiled"], 1);
    assert_eq!(summary["failed"], 0);
    assert!(!ws.join("results/sc23.failure.json").exists());
    assert_eq!(dev.calls().len(), 3, "pop223 was compiled again");
    let m: serde_json::Value =
        serde_json::from_slice(&fs::read(ws.join("ready/model_names_v25.json")).unwrap()).unwrap();
    assert_eq!(m["models"][1]["version"], "v9");
    assert_eq!(m["models"][1]["artifact_format"], "tinygrad_single_v1");
    assert_eq!(m["models"][1]["artifact_size"], 2500);
    let sha = m["models"][1]["artifact_sha256"]
        .as_str()
        .unwrap()
        .to_string();
    // The staged chunk set verifies against the manifest.
    let v = cli(
        &[
            "chunk",
            "verify",
            "ws/ready/sc23/sc23_driving_tinygrad.pkl",
            "--sha256",
            &sha,
            "--chunk-count",
            "3",
        ],
        root,
    );
    assert_eq!(v.status.code(), Some(0), "{}", text(&v.stderr));

    // Regression: a success record only counts for the plan it was built from. After the base
    // catalog moves pop223 to another behaviour version, the rerun rebuilds it instead of
    // skipping it and publishing the old build under the new version.
    assert_eq!(BASE.matches(r#""version": "v11""#).count(), 1);
    write(
        &root.join("base.json"),
        BASE.replace(r#""version": "v11""#, r#""version": "v12""#)
            .as_bytes(),
    );
    let before = dev.calls().len();
    let out = cli(&args, root);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["compiled"], 1, "{summary}");
    assert_eq!(summary["skipped"], 1, "{summary}");
    let calls = dev.calls();
    assert_eq!(calls.len(), before + 1, "{calls:?}");
    assert!(
        calls[before].starts_with("--pop223 --version v12"),
        "{calls:?}"
    );
    let m: serde_json::Value =
        serde_json::from_slice(&fs::read(ws.join("ready/model_names_v25.json")).unwrap()).unwrap();
    assert_eq!(m["models"][0]["version"], "v12");
    let rec: serde_json::Value =
        serde_json::from_slice(&fs::read(ws.join("results/pop223.json")).unwrap()).unwrap();
    assert_eq!(rec["version"], "v12");

    // validate records the device's own verdict.
    let mut vargs = vec![
        "validate",
        "--model",
        "sc23",
        "--workspace",
        "ws",
        "--python",
        "python3",
        "--json",
    ];
    let models_dir = dev.models_dir().to_str().unwrap().to_string();
    vargs.extend(["--remote-models-dir", &models_dir]);
    vargs.extend(remote(&sshd, &dev, &mut buf));
    let out = cli(&vargs, root);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let recorded: serde_json::Value =
        serde_json::from_slice(&fs::read(ws.join("results/sc23.validation.json")).unwrap())
            .unwrap();
    // The typed record: one verdict per camera resolution, the bytes and pin it is for, and the
    // device's own JSON unchanged.
    assert_eq!(recorded["model"], "sc23");
    assert_eq!(recorded["version"], "v9");
    assert_eq!(recorded["artifact_sha256"], sha.as_str());
    assert_eq!(recorded["tinygrad_commit"], PIN);
    assert_eq!(recorded["verdict"]["passed"], true);
    assert_eq!(recorded["verdict"]["artifact_sha256"], sha.as_str());
    let res = &recorded["resolutions"];
    assert_eq!(res[0]["resolution"], "1928x1208", "{recorded}");
    assert_eq!(res[1]["resolution"], "1344x760", "{recorded}");
    assert_eq!(res[0]["passed"], true, "{recorded}");
    assert_eq!(res[1]["passed"], true, "{recorded}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["passed"], true);

    // A non-finite output at one resolution: that cell fails, the record says why, exit 3.
    dev.set("nonfinite", "1344x760 lead");
    let out = cli(&vargs, root);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let recorded: serde_json::Value =
        serde_json::from_slice(&fs::read(ws.join("results/sc23.validation.json")).unwrap())
            .unwrap();
    assert_eq!(recorded["resolutions"][0]["passed"], true, "{recorded}");
    assert_eq!(recorded["resolutions"][1]["passed"], false, "{recorded}");
    let problems = recorded["resolutions"][1]["problems"].to_string();
    assert!(
        problems.contains("1344x760: lead output is not finite"),
        "{problems}"
    );
    dev.clear("nonfinite");
}

/// `rebuild --upload-to DIR` (issue 39 item 2): each built model's artifact files go to the
/// store while the next compiles, recorded in results/<id>.upload.json, never a manifest;
/// `publish` then finds them there and uploads only the manifest. The dry run names the
/// uploads.
#[test]
fn rebuild_uploads_each_model_and_publish_then_writes_only_the_manifest() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(Some(PIN));
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    write(&root.join("store/onnx/pop22/driving_vision.onnx"), b"v");
    write(&root.join("store/onnx/pop22/driving_policy.onnx"), b"p");
    write(&root.join("store/onnx/sc23/driving_supercombo.onnx"), b"s");
    write(
        &root.join("map.json"),
        br#"{"pop223": {"source_id": "pop22", "input_format": "split"},
             "sc23": {"source_id": "sc23", "input_format": "supercombo"}}"#,
    );
    let mut base: serde_json::Value = serde_json::from_str(BASE).unwrap();
    base["models"].as_array_mut().unwrap().truncate(2);
    write(&root.join("base.json"), base.to_string().as_bytes());
    let mut buf = Vec::new();
    let mut args = vec![
        "rebuild",
        "--workspace",
        "ws",
        "--source-map",
        "map.json",
        "--base-manifest",
        "base.json",
        "--sources",
        "store",
        "--generation",
        "v25",
        "--upload-to",
        "up",
    ];
    args.extend(remote(&sshd, &dev, &mut buf));
    let mut dry = args.clone();
    dry.push("--dry-run");
    let out = cli(&dry, root);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("  upload pop223, sc23 -> file:"),
        "{}",
        text(&out.stdout)
    );
    assert!(!root.join("up").exists());

    args.push("--json");
    // With --validate, each model is validated after its compile, as `validate` does; a
    // model failing it is not uploaded.
    let models_dir = dev.models_dir().to_str().unwrap().to_string();
    args.extend([
        "--validate",
        "--python",
        "python3",
        "--remote-models-dir",
        &models_dir,
    ]);
    dev.set("nonfinite", "1344x760 lead");
    let out = cli(&args, root);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["models"][0]["validation"], "failed", "{summary}");
    assert!(summary.get("uploads").is_none(), "{summary}");
    assert!(!root.join("up").exists());
    let recorded: serde_json::Value =
        serde_json::from_slice(&fs::read(root.join("ws/results/sc23.validation.json")).unwrap())
            .unwrap();
    assert_eq!(recorded["resolutions"][1]["passed"], false, "{recorded}");
    dev.clear("nonfinite");
    let out = cli(&args, root);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["models"][1]["validation"], "passed", "{summary}");
    let statuses: Vec<&str> = summary["uploads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["uploaded", "uploaded"], "{summary}");
    let err = text(&out.stderr);
    assert!(
        err.contains("uploading pop223 in the background meanwhile"),
        "{err}"
    );
    let up = root.join("up");
    assert!(
        up.join("models/v25/sc23/sc23_driving_tinygrad.pkl.chunkmanifest")
            .is_file()
    );
    assert!(!up.join("manifests").exists(), "rebuild wrote a manifest");
    let rec: serde_json::Value =
        serde_json::from_slice(&fs::read(root.join("ws/results/pop223.upload.json")).unwrap())
            .unwrap();
    assert_eq!(rec["uploads"][0]["artifact"], "pop223_driving_tinygrad.pkl");
    assert_eq!(rec["uploads"][0]["files"].as_array().unwrap().len(), 5);

    // A rerun skips what is recorded and still there.
    let out = cli(&args, root);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again["uploads"][0]["status"], "recorded", "{again}");

    let out = cli(
        &[
            "publish",
            "--generation",
            "v25",
            "--manifest",
            "ws/ready/model_names_v25.json",
            "--artifacts",
            "ws/ready",
            "--workspace",
            "ws",
            "--skip-validation",
            "test: no device",
            "--to",
            "up",
            "--json",
        ],
        root,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["stores"][0]["uploaded_files"], 0, "{report}");
    assert_eq!(report["stores"][0]["skipped_files"], 10, "{report}");
    assert_eq!(report["stores"][0]["manifest"], "written", "{report}");
    assert!(up.join("manifests/model_names_v25.json").is_file());
}

#[test]
fn validate_check_records_a_device_check_and_refuses_incomplete_ones() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let pin = ["--tinygrad-commit", PIN];
    let base = ["validate", "--workspace", "ws", "--by", "ana"];
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend_from_slice(extra);
        a.extend_from_slice(&pin);
        cli(&a, root)
    };
    // Refusals: usage errors, nothing written.
    for (extra, why) in [
        (
            &["--check", "driver-state", "--passed", "--note", "ok"][..],
            "add --resolution 1928x1208 or 1344x760",
        ),
        (
            &[
                "--check",
                "model-v2",
                "--resolution",
                "1928x1208",
                "--passed",
                "--note",
                "ok",
            ][..],
            "drop --resolution",
        ),
        (
            &[
                "--check",
                "driver-state",
                "--resolution",
                "640x480",
                "--passed",
                "--note",
                "ok",
            ][..],
            "the camera resolutions are 1928x1208 and 1344x760",
        ),
        (
            &["--check", "model-v2", "--note", "ok"][..],
            "needs --passed or --failed",
        ),
        (
            &["--check", "model-v2", "--passed", "--note", " "][..],
            "needs --note TEXT",
        ),
    ] {
        let o = run(extra);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains(why),
            "{extra:?}: {}",
            text(&o.stderr)
        );
        assert!(!root.join("ws").exists(), "{extra:?} wrote something");
    }
    // A check is bound to the artifacts it was made on: none built in ws/ready/ is refused.
    let o = run(&["--check", "model-v2", "--passed", "--note", "ok"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("no built artifact in ws/ready"),
        "{}",
        text(&o.stderr)
    );
    assert!(!root.join("ws").exists(), "a refused check wrote something");
    let built = |id: &str, bytes: &[u8]| {
        let dir = root.join("ws/ready").join(id);
        fs::create_dir_all(&dir).unwrap();
        let name = format!("{id}_driving_tinygrad.pkl");
        fs::write(
            dir.join(format!("{name}.sha256")),
            format!("{}  {name}\n", test_support::published::sha256_hex(bytes)),
        )
        .unwrap();
        test_support::published::sha256_hex(bytes)
    };
    let (sc23, pop) = (built("sc23", b"sc23 built"), built("pop223", b"pop built"));
    // A dry run shows the record and where it would go, and writes nothing.
    let o = run(&[
        "--check",
        "model-v2",
        "--passed",
        "--note",
        "ok",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["record_path"], "ws/results/model-v2.check.json");
    assert_eq!(v["checked_by"], "ana");
    assert_eq!(
        v["artifacts"],
        serde_json::json!({"pop223": pop, "sc23": sc23})
    );
    assert!(
        !root.join("ws/results").exists(),
        "a --check dry run wrote something"
    );
    let o = run(&[
        "--check",
        "driver-state",
        "--resolution",
        "1344x760",
        "--failed",
        "--note",
        "driverStateV2 stopped after 3 s",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let rec: serde_json::Value = serde_json::from_slice(
        &fs::read(root.join("ws/results/driver-state.1344x760.check.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(rec["check"], "driver-state");
    assert_eq!(rec["resolution"], "1344x760");
    assert_eq!(rec["passed"], false);
    assert_eq!(rec["checked_by"], "ana");
    assert_eq!(rec["tinygrad_commit"], PIN);
    assert_eq!(rec["note"], "driverStateV2 stopped after 3 s");
    let o = run(&[
        "--check",
        "model-v2",
        "--model",
        "sc23",
        "--passed",
        "--note",
        "20 Hz for 10 min",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let rec: serde_json::Value =
        serde_json::from_slice(&fs::read(root.join("ws/results/model-v2.check.json")).unwrap())
            .unwrap();
    assert_eq!(rec["model"], "sc23");
    assert_eq!(rec["passed"], true);
    // With --model, only that model's artifact.
    assert_eq!(rec["artifacts"], serde_json::json!({"sc23": sc23}));
}

#[test]
fn compile_refusals_and_exit_codes() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(Some(OTHER));
    let t = tempfile::tempdir().unwrap();
    write(&t.path().join("src/driving_supercombo.onnx"), b"src");
    let mut buf = Vec::new();
    let base = [
        "compile",
        "--model",
        "rdf43",
        "--version",
        "v15",
        "--source",
        "src/driving_supercombo.onnx",
        "--out",
        "out",
    ];

    // Marker mismatch: exit 3, ./models never ran.
    let mut args = base.to_vec();
    args.extend(remote(&sshd, &dev, &mut buf));
    let out = cli(&args, t.path());
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("tinygrad marker mismatch"));
    assert!(dev.calls().is_empty());

    // Another host without --allow-other-compiler: refused before connecting.
    let mut args = base.to_vec();
    args.extend(["--remote", "comma@192.168.3.111", "--tinygrad-commit", PIN]);
    let out = cli(&args, t.path());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("comma@192.168.3.111") && err.contains("--allow-other-compiler"));

    // The right marker, but the build is a plain pickle, not an OOB container: refused as
    // invalid outputs naming the offset, and nothing lands in out/.
    fs::write(dev.remote_root().join("tinygrad_repo/TINYGRAD_COMMIT"), PIN).unwrap();
    dev.set("plain_pickle", "rdf43");
    let mut args = base.to_vec();
    args.extend(remote(&sshd, &dev, &mut buf));
    let out = cli(&args, t.path());
    let err = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("not an out-of-band (OOB) pickle container at byte"),
        "{err}"
    );
    assert!(
        !t.path().join("out").exists()
            || fs::read_dir(t.path().join("out")).unwrap().next().is_none()
    );
    dev.clear("plain_pickle");

    // The right marker: compiled, live output on stderr, JSON on stdout.
    let mut args = base.to_vec();
    args.extend(["--log", "logs/rdf43.log", "--json"]);
    args.extend(remote(&sshd, &dev, &mut buf));
    let out = cli(&args, t.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("[device] wrote 3 chunk(s)"));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["artifact"]["chunk_count"], 3);
    assert!(
        t.path()
            .join("out/rdf43_driving_tinygrad.pkl.chunkmanifest")
            .is_file()
    );

    // With -q the device's lines are not echoed, but the log still has them.
    let mut args = vec!["-q"];
    args.extend(base);
    args.extend(["--log", "logs/quiet.log"]);
    args.extend(remote(&sshd, &dev, &mut buf));
    let out = cli(&args, t.path());
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("[device]"), "-q echoed live output: {err}");
    assert!(!err.contains("next:"), "{err}");
    assert!(
        fs::read_to_string(t.path().join("logs/quiet.log"))
            .unwrap()
            .contains("wrote 3 chunk(s)")
    );

    // A digest mismatch: exit 3, the log is named.
    dev.set("corrupt", "rdf43");
    let mut args = base.to_vec();
    args.extend(["--log", "logs/rdf43.log"]);
    args.extend(remote(&sshd, &dev, &mut buf));
    let out = cli(&args, t.path());
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("SHA-256 mismatch for rdf43"));
    assert!(text(&out.stderr).contains("logs/rdf43.log"));
    // The earlier good set is still there, untouched.
    assert!(
        t.path()
            .join("out/rdf43_driving_tinygrad.pkl.chunkmanifest")
            .is_file()
    );
}

/// `compile --dry-run` lists what the real `compile` then does against the loopback compiler:
/// the `./models` command line it runs, the log and chunk-set files it writes, the earlier set it
/// removes, the remote directories left clean by its last step; the dry run changes nothing.
#[test]
fn a_compile_dry_run_lists_what_the_real_compile_then_does() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(Some(PIN));
    let t = tempfile::tempdir().unwrap();
    write(&t.path().join("src/driving_supercombo.onnx"), b"src");
    write(
        &t.path().join("out/rdf43_driving_tinygrad.pkl.chunk01of07"),
        b"an older set",
    );
    let mut buf = Vec::new();
    let mut args = vec![
        "compile",
        "--model",
        "rdf43",
        "--version",
        "v15",
        "--source",
        "src/driving_supercombo.onnx",
        "--out",
        "out",
    ];
    args.extend(remote(&sshd, &dev, &mut buf));
    let mut dry = args.clone();
    dry.extend(["--dry-run", "--json"]);
    let before = snapshot(t.path());
    let out = cli(&dry, t.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(snapshot(t.path()), before, "a dry run wrote something");
    assert!(dev.calls().is_empty());
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let out = cli(&args, t.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let call = dev.calls().pop().unwrap();
    let models = call.split(" | inputs=").next().unwrap();
    let command = plan["steps"][3]["command"].as_str().unwrap();
    assert!(
        command.ends_with(&format!("./models {models} 2>&1")),
        "{command} / {call}"
    );
    for w in plan["writes"].as_array().unwrap() {
        let w = t.path().join(w.as_str().unwrap());
        let written = match w.to_str().unwrap().strip_suffix('*') {
            Some(prefix) => fs::read_dir(w.parent().unwrap()).unwrap().any(|e| {
                let p = e.unwrap().path();
                p.to_str().unwrap().starts_with(prefix) && p.is_file()
            }),
            None => w.is_file(),
        };
        assert!(written, "{} was not written", w.display());
    }
    let removes = plan["removes"].as_array().unwrap();
    assert_eq!(removes.len(), 1);
    assert!(!t.path().join(removes[0].as_str().unwrap()).exists());
    for dir in ["uncompiledmodels", "compiledmodels"] {
        let left = fs::read_dir(dev.remote_root().join(dir)).unwrap().count();
        assert_eq!(left, 0, "{dir} was not cleaned");
    }
}

#[test]
fn sync_and_dm_through_the_cli() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(None);
    let t = tempfile::tempdir().unwrap();
    let op = t.path().join("openpilot");
    write(
        &op.join("tinygrad_repo/TINYGRAD_COMMIT"),
        format!("{PIN}\n").as_bytes(),
    );
    write(&op.join("tinygrad_repo/.git/HEAD"), b"ref");
    write(&op.join("selfdrive/modeld/modeld.py"), b"#");
    write(&op.join("scripts/model_compiler.py"), b"#");
    write(
        &op.join("selfdrive/modeld/models/dmonitoring_model.onnx"),
        b"dm",
    );
    fs::copy(dev.remote_root().join("models"), op.join("models")).unwrap();
    let mut buf = Vec::new();
    let op_s = op.to_str().unwrap().to_string();

    // The pin comes from the tree when --tinygrad-commit is absent.
    let mut args = vec!["sync", "--openpilot", &op_s, "--json"];
    let r = remote(&sshd, &dev, &mut buf);
    args.extend(&r[..r.len() - 2]);
    let out = cli(&args, t.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["tinygrad_commit"], PIN);
    assert!(!dev.remote_root().join("tinygrad_repo/.git").exists());

    let remote_dm = dev.remote_root().join("dm_out");
    let remote_dm = remote_dm.to_str().unwrap().to_string();
    dev.set("dm_missing", "dmonitoring_model_metadata.pkl");
    let mut args = vec![
        "dm",
        "--out",
        "dm",
        "--openpilot",
        &op_s,
        "--remote-output-dir",
        &remote_dm,
    ];
    let r = remote(&sshd, &dev, &mut buf);
    args.extend(&r[..r.len() - 2]);
    let out = cli(&args, t.path());
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("dmonitoring_model_metadata.pkl"));
    assert!(!t.path().join("dm/dmonitoring_model_tinygrad.pkl").exists());

    dev.clear("dm_missing");
    let out = cli(&args, t.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(fs::read_dir(t.path().join("dm")).unwrap().count(), 4);
}

/// `sync` records the digest of what it sent; `compile` and `rebuild` refuse a tree that is not
/// what its last sync sent (never synced, or edited since), before connecting, and `rebuild
/// --generation` must be the generation of the tree's tinygrad. For v25 (the built-in pin) and
/// a made-up v26 (recorded in the tree's tinygrad_pins.json); each refusal changes nothing.
#[test]
fn sync_records_the_tree_and_builds_refuse_another_tree_or_generation() {
    let Some(sshd) = Sshd::start() else { return };
    for (generation, pin, next) in [("v25", PIN, "v26"), ("v26", OTHER, "v27")] {
        let dev = DeviceRoot::new(Some(pin));
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let op = root.join("op");
        write(
            &op.join("tinygrad_repo/TINYGRAD_COMMIT"),
            format!("{pin}\n").as_bytes(),
        );
        write(&op.join("tinygrad_repo/tinygrad/tensor.py"), b"tensor");
        write(&op.join("selfdrive/modeld/modeld.py"), b"#");
        write(&op.join("scripts/model_compiler.py"), b"#");
        write(
            &op.join("selfdrive/modeld/models/dmonitoring_model.onnx"),
            b"dm",
        );
        fs::copy(dev.remote_root().join("models"), op.join("models")).unwrap();
        if generation == "v26" {
            write(
                &op.join("tinygrad_pins.json"),
                format!("{{\"v25\": \"{PIN}\", \"v26\": \"{OTHER}\"}}").as_bytes(),
            );
        }
        write(&root.join("src/driving_supercombo.onnx"), b"src");
        write(
            &root.join("map.json"),
            br#"{"sc23": {"source_id": "sc23", "input_format": "supercombo"}}"#,
        );
        write(&root.join("base.json"), BASE.as_bytes());
        let mut buf = Vec::new();
        let r = remote(&sshd, &dev, &mut buf);
        // The pin comes from the tree: no --tinygrad-commit.
        let remote_flags: Vec<String> = r[..r.len() - 2].iter().map(|s| s.to_string()).collect();
        let run = |args: &[&str]| {
            let mut a: Vec<&str> = args.to_vec();
            a.extend(["--openpilot", "op"]);
            a.extend(remote_flags.iter().map(String::as_str));
            cli(&a, root)
        };
        let compile = [
            "compile",
            "--model",
            "sc23",
            "--version",
            "v9",
            "--source",
            "src/driving_supercombo.onnx",
            "--out",
            "out",
        ];
        let rebuild = |g: &'static str| {
            [
                "rebuild",
                "--workspace",
                "ws",
                "--source-map",
                "map.json",
                "--base-manifest",
                "base.json",
                "--sources",
                "store",
                "--generation",
                g,
            ]
        };
        let refused = |args: &[&str], says: &[&str]| {
            let before = snapshot(root);
            let out = run(args);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(3), "{generation} {args:?}: {err}");
            for s in says {
                assert!(err.contains(s), "{generation} {args:?}: {s:?} not in {err}");
            }
            assert_eq!(
                snapshot(root),
                before,
                "{generation} {args:?} changed something"
            );
            assert!(dev.calls().is_empty(), "{generation} {args:?} ran ./models");
        };

        // Never synced: refused, naming the tree and the command to run.
        refused(
            &compile,
            &[
                "op: not what the compiler",
                "has no record of a sync",
                "next: `release-cli sync --openpilot op",
            ],
        );
        let mut dry = rebuild(generation).to_vec();
        dry.push("--dry-run");
        refused(&dry, &["has no record of a sync"]);

        // The sync records what it sent.
        let out = run(&["sync", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let record = compiler_remote::synced::read_record(&op)
            .unwrap()
            .expect("a sync record");
        assert_eq!(record.tinygrad_commit.as_str(), pin);
        assert_eq!(
            report["digest"]["sha256"],
            record.digest.sha256.to_hex().as_str()
        );
        assert_eq!(record.digest.files, 6, "{record:?}");
        assert_eq!(record.digest, release::tree::sync_digest(&op).unwrap());

        // The generation must be the tree's: the next one (no pin) is refused before anything.
        refused(
            &rebuild(next),
            &[
                &format!("rebuild --generation {next} refused"),
                &format!("{pin} (from op/tinygrad_repo/TINYGRAD_COMMIT), is {generation}'s pin"),
                &format!("rerun with --generation {generation}"),
            ],
        );
        let other = if generation == "v25" { "v26" } else { "v25" };
        let mut args = rebuild(other).to_vec();
        args.push("--dry-run");
        refused(&args, &[&format!("rebuild --generation {other} refused")]);
        // The tree's own generation, in sync: planned.
        let out = run(&dry);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("1 to build"),
            "{}",
            text(&out.stdout)
        );

        // In sync: compile goes through.
        let out = run(&compile);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(dev.calls().len(), 1);
        fs::remove_dir_all(root.join("out")).unwrap();
        fs::remove_dir_all(root.join("logs")).unwrap();
        let calls = dev.calls().len();

        // A local edit never synced: compile and rebuild refuse before connecting.
        write(&op.join("selfdrive/modeld/modeld.py"), b"# edited");
        let before = snapshot(root);
        for args in [
            &compile[..],
            &rebuild(generation)[..],
            &["dm", "--out", "dm"][..],
        ] {
            let out = run(args);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
            assert!(err.contains("changed since the last sync"), "{err}");
            assert_eq!(snapshot(root), before, "{args:?} changed something");
        }
        assert_eq!(dev.calls().len(), calls, "./models ran on a stale tree");
        // Undoing the edit makes the tree what was sent again.
        write(&op.join("selfdrive/modeld/modeld.py"), b"#");
        let out = run(&compile);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
}

#[test]
fn builtin_replaces_the_full_pkl_with_a_chunk_set() {
    let t = tempfile::tempdir().unwrap();
    let models = t.path().join("op/selfdrive/modeld/models");
    write(
        &models.join("driving_tinygrad.pkl"),
        b"the old built-in, a full PKL",
    );
    write(&models.join("dmonitoring_model_tinygrad.pkl"), b"dm stays");
    // A plain pickle is refused with the offset, and the tree is untouched.
    write(&t.path().join("plain.pkl"), &[5u8; 3000]);
    let out = cli(
        &["builtin", "--artifact", "plain.pkl", "--openpilot", "op"],
        t.path(),
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr)
            .contains("plain.pkl: not an out-of-band (OOB) pickle container at byte 0"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        fs::read(models.join("driving_tinygrad.pkl")).unwrap(),
        b"the old built-in, a full PKL"
    );
    assert_eq!(fs::read_dir(&models).unwrap().count(), 2);

    write(
        &t.path().join("rdf43.pkl"),
        &test_support::published::artifact_bytes(5, 3000),
    );
    let out = cli(
        &[
            "builtin",
            "--artifact",
            "rdf43.pkl",
            "--openpilot",
            "op",
            "--json",
        ],
        t.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["chunk_count"], 1);
    assert_eq!(r["removed"], serde_json::json!(["driving_tinygrad.pkl"]));
    let mut names: Vec<String> = fs::read_dir(&models)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "dmonitoring_model_tinygrad.pkl",
            "driving_tinygrad.pkl.chunk01of01",
            "driving_tinygrad.pkl.chunkmanifest",
            "driving_tinygrad.pkl.sha256",
        ]
    );
    let v = cli(
        &[
            "chunk",
            "verify",
            "op/selfdrive/modeld/models/driving_tinygrad.pkl",
        ],
        t.path(),
    );
    assert_eq!(v.status.code(), Some(0), "{}", text(&v.stderr));

    // An artifact whose sidecar disagrees is refused and nothing changes.
    write(
        &t.path().join("bad/x.pkl"),
        &test_support::published::artifact_bytes(6, 100),
    );
    write(
        &t.path().join("bad/x.pkl.sha256"),
        format!("{}  x.pkl\n", "ab".repeat(32)).as_bytes(),
    );
    let out = cli(
        &["builtin", "--artifact", "bad/x.pkl", "--openpilot", "op"],
        t.path(),
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(models.join("driving_tinygrad.pkl.chunk01of01").is_file());
}

#[test]
fn tinygrad_bump_replaces_the_tree_without_git_metadata() {
    let t = tempfile::tempdir().unwrap();
    let op = t.path().join("op");
    write(&op.join("tinygrad_repo/old_only.py"), b"old");
    write(
        &op.join("starpilot/assets/model_manager.py"),
        b"import os\nMANIFEST_CANDIDATES = (\"v25\",)\n",
    );
    let src = t.path().join("tg");
    write(&src.join("tinygrad/tensor.py"), b"new");
    write(&src.join("extra/sub/.git"), b"gitdir: elsewhere");
    write(&src.join("extra/sub/file.py"), b"x");
    let out = cli(
        &[
            "tinygrad",
            "bump",
            "--openpilot",
            "op",
            "--tinygrad-src",
            "tg",
            "--commit",
            OTHER,
            "--json",
        ],
        t.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["generation"]["from"], "v25");
    assert_eq!(r["generation"]["to"], "v26");
    assert!(
        r["manifest_candidates"]
            .as_str()
            .unwrap()
            .ends_with("model_manager.py:2")
    );
    let tg = op.join("tinygrad_repo");
    assert_eq!(
        fs::read_to_string(tg.join("TINYGRAD_COMMIT")).unwrap(),
        format!("{OTHER}\n")
    );
    assert!(tg.join("tinygrad/tensor.py").is_file());
    assert!(tg.join("extra/sub/file.py").is_file());
    assert!(!tg.join("extra/sub/.git").exists());
    // The source and its digest are recorded beside the commit.
    let source: serde_json::Value =
        serde_json::from_slice(&fs::read(tg.join("TINYGRAD_SOURCE.json")).unwrap()).unwrap();
    assert_eq!(source["kind"], "directory");
    assert_eq!(source["commit"], OTHER);
    assert_eq!(source["digest"], r["source"]["digest"]);
    assert_eq!(source["digest"]["files"], 2);
    assert!(!tg.join("old_only.py").exists());
    // The generation↔pin pair is recorded in the tree, not only on the command line.
    let pins: serde_json::Value =
        serde_json::from_slice(&fs::read(op.join("tinygrad_pins.json")).unwrap()).unwrap();
    assert_eq!(pins, serde_json::json!({"v25": PIN, "v26": OTHER}));

    // v26 is pinned now: another commit for it, or the old pin for the generation after it,
    // is refused before anything changes.
    let bump = |commit: &str| {
        cli(
            &[
                "tinygrad",
                "bump",
                "--openpilot",
                "op",
                "--tinygrad-src",
                "tg",
                "--commit",
                commit,
            ],
            t.path(),
        )
    };
    let out = bump(REF);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("v26 is already pinned"),
        "{}",
        text(&out.stderr)
    );
    write(
        &op.join("starpilot/assets/model_manager.py"),
        b"import os\nMANIFEST_CANDIDATES = (\"v26\",)\n",
    );
    let out = bump(PIN);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr)
            .contains("already v25's pin; a new generation (v27) needs a new tinygrad commit"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        fs::read_to_string(tg.join("TINYGRAD_COMMIT")).unwrap(),
        format!("{OTHER}\n")
    );
    let pins_after: serde_json::Value =
        serde_json::from_slice(&fs::read(op.join("tinygrad_pins.json")).unwrap()).unwrap();
    assert_eq!(pins_after, pins);
    // A plain directory names its commit: without --commit, refused (exit 2), nothing changed.
    let before = snapshot(&op);
    let out = cli(
        &[
            "tinygrad",
            "bump",
            "--openpilot",
            "op",
            "--tinygrad-src",
            "tg",
        ],
        t.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("tg is not a git checkout")
            && text(&out.stderr).contains("pass --commit SHA"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(snapshot(&op), before);
    write(
        &op.join("starpilot/assets/model_manager.py"),
        b"import os\nMANIFEST_CANDIDATES = (\"v25\",)\n",
    );

    // A git checkout at another commit is refused.
    let g = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&src)
        .status();
    if g.is_ok_and(|s| s.success()) {
        let out = cli(
            &[
                "tinygrad",
                "bump",
                "--openpilot",
                "op",
                "--tinygrad-src",
                "tg",
                "--commit",
                PIN,
            ],
            t.path(),
        );
        assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
        assert_eq!(
            fs::read_to_string(tg.join("TINYGRAD_COMMIT")).unwrap(),
            format!("{OTHER}\n")
        );
    }
}

/// `tinygrad pin` corrects a mistyped pin of an unpublished generation (a made-up v26) in one
/// command, and is refused (the tree unchanged) once a checked store holds a live v26
/// manifest with it, for v25's built-in pin, and without a store to check.
#[test]
fn tinygrad_pin_corrects_an_unpublished_pin() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let op = root.join("op");
    write(&op.join("tinygrad_repo/old.py"), b"old");
    write(&root.join("tg/tinygrad/tensor.py"), b"new");
    fs::create_dir_all(root.join("store")).unwrap();
    let typo = "1".repeat(40);
    let out = cli(
        &[
            "tinygrad",
            "bump",
            "--openpilot",
            "op",
            "--tinygrad-src",
            "tg",
            "--commit",
            &typo,
        ],
        root,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let pin = |extra: &[&str]| {
        let mut a = vec!["tinygrad", "pin", "--openpilot", "op"];
        a.extend(extra);
        cli(&a, root)
    };
    let refused = |extra: &[&str], code: i32, says: &str| {
        let before = snapshot(root);
        let out = pin(extra);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{extra:?}: {err}");
        assert!(err.contains(says), "{extra:?}: {says:?} not in {err}");
        assert_eq!(snapshot(root), before, "{extra:?} changed something");
    };
    let fix = ["--generation", "v26", "--commit", OTHER];
    // No store to check: refused by the parser.
    refused(&fix, 2, "--store");
    // v25's pin is built in.
    refused(
        &["--generation", "v25", "--commit", OTHER, "--store", "store"],
        2,
        "v25's pin e837e367aac9e1a66e689f4f32ce20ca9367df13 is built into",
    );
    // v27 has no recorded pin.
    refused(
        &["--generation", "v27", "--commit", OTHER, "--store", "store"],
        2,
        "no pin for v27 is recorded",
    );
    // v25's pin for v26: another generation's pin.
    refused(
        &["--generation", "v26", "--commit", PIN, "--store", "store"],
        3,
        "already v25's pin",
    );
    // A store that is not there, or a live manifest that is not a regular file: nothing says
    // whether v26 is published, so nothing is rewritten (and the FIFO does not hang the check).
    let mut nowhere = fix.to_vec();
    nowhere.extend(["--store", "nowhere"]);
    refused(&nowhere, 2, "--store nowhere: no such directory");
    let mut gh_nowhere = fix.to_vec();
    gh_nowhere.extend(["--store", "github:nowhere"]);
    refused(&gh_nowhere, 2, "--store github:nowhere: no such directory");
    fs::create_dir_all(root.join("store/manifests")).unwrap();
    assert!(
        Command::new("mkfifo")
            .arg(root.join("store/manifests/model_names_v26.json"))
            .status()
            .unwrap()
            .success()
    );
    let mut at_fifo = fix.to_vec();
    at_fifo.extend(["--store", "store"]);
    let started = std::time::Instant::now();
    let out = pin(&at_fifo);
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_ne!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("not a regular file"),
        "{}",
        text(&out.stderr)
    );
    fs::remove_file(root.join("store/manifests/model_names_v26.json")).unwrap();
    // A live v26 manifest with the mistyped pin in the store: published, never corrected.
    write(
        &root.join("store/manifests/model_names_v26.json"),
        format!(r#"{{"generation": "v26", "tinygrad_commit": "{typo}", "models": []}}"#).as_bytes(),
    );
    let mut args = fix.to_vec();
    args.extend(["--store", "store"]);
    refused(&args, 3, "v26 is live in ");
    refused(
        &args,
        3,
        &format!("manifests/model_names_v26.json records tinygrad {typo}"),
    );
    fs::remove_file(root.join("store/manifests/model_names_v26.json")).unwrap();

    // Not live: a dry run says what it would write, then the correction.
    let before = snapshot(root);
    let mut dry = args.clone();
    dry.push("--dry-run");
    let out = pin(&dry);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("would write op/tinygrad_pins.json, op/tinygrad_repo/TINYGRAD_COMMIT, op/tinygrad_repo/TINYGRAD_SOURCE.json"), "{}", text(&out.stdout));
    assert_eq!(snapshot(root), before);
    let mut json = args.clone();
    json.push("--json");
    let out = pin(&json);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["from"], typo.as_str());
    assert_eq!(r["to"], OTHER);
    assert_eq!(r["tree_from_git"], false);
    let pins: serde_json::Value =
        serde_json::from_slice(&fs::read(op.join("tinygrad_pins.json")).unwrap()).unwrap();
    assert_eq!(pins, serde_json::json!({"v25": PIN, "v26": OTHER}));
    assert_eq!(
        fs::read_to_string(op.join("tinygrad_repo/TINYGRAD_COMMIT")).unwrap(),
        format!("{OTHER}\n")
    );
    // Again: nothing to correct.
    let out = pin(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("v26 is already pinned to"),
        "{}",
        text(&out.stdout)
    );

    // A tree copied from a git checkout is that checkout's commit: the table is corrected, the
    // marker is left, and the next step is to bump the tree from the right checkout.
    let repo = root.join("repo");
    write(&repo.join("tinygrad/tensor.py"), b"git");
    let git = |a: &[&str]| {
        Command::new("git")
            .args(a)
            .current_dir(&repo)
            .env("GIT_AUTHOR_NAME", "dev")
            .env("GIT_AUTHOR_EMAIL", "dev@localhost")
            .env("GIT_COMMITTER_NAME", "dev")
            .env("GIT_COMMITTER_EMAIL", "dev@localhost")
            .output()
    };
    if git(&["init", "-q"]).is_err() {
        return;
    }
    git(&["add", "-A"]).unwrap();
    assert!(git(&["commit", "-q", "-m", "x"]).unwrap().status.success());
    let head = text(&git(&["rev-parse", "HEAD"]).unwrap().stdout)
        .trim()
        .to_string();
    let op2 = root.join("op2");
    write(&op2.join("tinygrad_repo/old.py"), b"old");
    let out = cli(
        &[
            "tinygrad",
            "bump",
            "--openpilot",
            "op2",
            "--tinygrad-src",
            "repo",
        ],
        root,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = cli(
        &[
            "tinygrad",
            "pin",
            "--openpilot",
            "op2",
            "--generation",
            "v26",
            "--commit",
            OTHER,
            "--store",
            "store",
        ],
        root,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("was copied from a git checkout at"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        fs::read_to_string(op2.join("tinygrad_repo/TINYGRAD_COMMIT")).unwrap(),
        format!("{head}\n")
    );
    let pins: serde_json::Value =
        serde_json::from_slice(&fs::read(op2.join("tinygrad_pins.json")).unwrap()).unwrap();
    assert_eq!(pins["v26"], OTHER);
}

#[test]
fn builtin_and_tinygrad_bump_dry_runs_report_and_change_nothing() {
    let t = tempfile::tempdir().unwrap();
    let op = t.path().join("op");
    let models = op.join("selfdrive/modeld/models");
    write(&models.join("driving_tinygrad.pkl"), b"the old built-in");
    write(&models.join("driving_tinygrad.pkl.p00"), b"a legacy part");
    write(&op.join("tinygrad_repo/old_only.py"), b"old");
    write(
        &op.join("starpilot/assets/model_manager.py"),
        b"MANIFEST_CANDIDATES = (\"v25\",)\n",
    );
    write(&t.path().join("tg/tinygrad/tensor.py"), b"new");
    write(&t.path().join("tg/tinygrad/ops.py"), b"new");
    let bytes = test_support::published::artifact_bytes(5, 3000);
    write(&t.path().join("rdf43.pkl"), &bytes);
    let before = snapshot(t.path());

    let out = cli(
        &[
            "builtin",
            "--artifact",
            "rdf43.pkl",
            "--openpilot",
            "op",
            "--dry-run",
            "--json",
        ],
        t.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["dry_run"], true);
    assert_eq!(r["chunk_count"], 1);
    assert_eq!(r["size"], bytes.len());
    assert_eq!(
        r["sha256"],
        chunker::Sha256Digest::of_bytes(&bytes).to_hex().as_str()
    );
    assert_eq!(
        r["written"],
        serde_json::json!([
            "driving_tinygrad.pkl.chunk01of01",
            "driving_tinygrad.pkl.sha256",
            "driving_tinygrad.pkl.chunkmanifest"
        ])
    );
    assert_eq!(
        r["removed"],
        serde_json::json!(["driving_tinygrad.pkl", "driving_tinygrad.pkl.p00"])
    );
    let out = cli(
        &[
            "builtin",
            "--artifact",
            "rdf43.pkl",
            "--openpilot",
            "op",
            "--dry-run",
        ],
        t.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("would remove driving_tinygrad.pkl, driving_tinygrad.pkl.p00"),
        "{said}"
    );
    // A dry run still refuses what the real run refuses.
    write(
        &t.path().join("rdf43.pkl.sha256"),
        format!("{}  rdf43.pkl\n", "ab".repeat(32)).as_bytes(),
    );
    let out = cli(
        &[
            "builtin",
            "--artifact",
            "rdf43.pkl",
            "--openpilot",
            "op",
            "--dry-run",
        ],
        t.path(),
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    fs::remove_file(t.path().join("rdf43.pkl.sha256")).unwrap();
    assert_eq!(
        snapshot(t.path()),
        before,
        "a builtin dry run wrote something"
    );

    let bump = |extra: &[&str]| {
        let mut a = vec![
            "tinygrad",
            "bump",
            "--openpilot",
            "op",
            "--tinygrad-src",
            "tg",
            "--commit",
            OTHER,
            "--dry-run",
        ];
        a.extend(extra);
        cli(&a, t.path())
    };
    let out = bump(&["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["dry_run"], true);
    assert_eq!(r["files"], 2);
    assert_eq!(r["generation"]["to"], "v26");
    // Paths as --openpilot named them.
    assert_eq!(
        r["written"],
        serde_json::json!([
            "op/tinygrad_repo",
            "op/tinygrad_repo/TINYGRAD_COMMIT",
            "op/tinygrad_repo/TINYGRAD_SOURCE.json",
            "op/tinygrad_pins.json"
        ])
    );
    assert_eq!(r["removed"], serde_json::json!(["op/tinygrad_repo"]));
    let out = bump(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("nothing was changed"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(snapshot(t.path()), before, "a bump dry run wrote something");
}

/// A public key to pin in a known_hosts file (any valid one: nothing ever connects).
const PINNED_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMvovP/4DpT61RRclm7A4M7FU95M3u77Cw0MOul1fjUC";

/// A compiler that does not exist: an ssh alias for a port on 127.0.0.1 nothing listens on,
/// whose key is pinned in `known_hosts` when `pinned`, plus a stand-in local rsync 3 (rsync is
/// checked, never run, by a dry run). Returns the remote flags.
fn absent_compiler(dir: &Path, pinned: bool) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let kh = dir.join("known_hosts");
    let key = if pinned {
        format!("[127.0.0.1]:{port} {PINNED_KEY}\n")
    } else {
        String::new()
    };
    write(&kh, key.as_bytes());
    let cfg = dir.join("ssh_config");
    write(
        &cfg,
        format!(
            "Host nocompiler\n  HostName 127.0.0.1\n  Port {port}\n  UserKnownHostsFile {}\n  \
             GlobalKnownHostsFile /dev/null\n",
            kh.display()
        )
        .as_bytes(),
    );
    let rsync = dir.join("rsync");
    write(
        &rsync,
        b"#!/bin/sh\necho 'rsync  version 3.2.7  protocol version 32'\n",
    );
    fs::set_permissions(&rsync, fs::Permissions::from_mode(0o755)).unwrap();
    [
        "--remote",
        "nocompiler",
        "--allow-other-compiler",
        "--ssh-config",
        cfg.to_str().unwrap(),
        "--rsync",
        rsync.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

/// `sync`, `compile`, `dm`, `validate` and `rebuild --dry-run`: the local checks, then the plan,
/// against a compiler that does not listen (any connection would fail with exit 1), and not a
/// byte changed in the working directory.
#[test]
fn compiler_dry_runs_check_locally_print_the_plan_and_connect_to_nothing() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let op = root.join("op");
    write(
        &op.join("tinygrad_repo/TINYGRAD_COMMIT"),
        format!("{PIN}\n").as_bytes(),
    );
    write(&op.join("selfdrive/modeld/modeld.py"), b"#");
    write(
        &op.join("selfdrive/modeld/models/dmonitoring_model.onnx"),
        b"dm",
    );
    write(&op.join("scripts/model_compiler.py"), b"#");
    write(&op.join("models"), b"#!/bin/sh\n");
    write(&root.join("src/driving_supercombo.onnx"), b"onnx");
    // A verified chunk set to validate, and an earlier set that a compile would replace.
    let bytes = test_support::published::artifact_bytes(9, 2500);
    write(&root.join("whole.pkl"), &bytes);
    for out in ["ready/sc23", "out"] {
        fs::create_dir_all(root.join(out)).unwrap();
        chunker::split_reader(
            fs::File::open(root.join("whole.pkl")).unwrap(),
            bytes.len() as u64,
            "sc23_driving_tinygrad.pkl",
            &root.join(out),
            &chunker::SplitOptions { chunk_size: 1000 },
        )
        .unwrap();
    }
    write(
        &root.join("map.json"),
        br#"{"sc23": {"source_id": "sc23", "input_format": "supercombo"}}"#,
    );
    write(&root.join("base.json"), BASE.as_bytes());
    let remote = absent_compiler(root, true);
    // The tree as a sync to that compiler left it (compile and dm compare the tree with it).
    compiler_remote::synced::write_record(
        &op,
        &compiler_remote::synced::SyncRecord {
            destination: "nocompiler".into(),
            remote_root: compiler_remote::DEFAULT_REMOTE_ROOT.into(),
            tinygrad_commit: PIN.parse().unwrap(),
            digest: compiler_remote::tree_digest::sync_digest(&op).unwrap(),
            synced_at_unix: 0,
        },
    )
    .unwrap();
    let before = snapshot(root);
    let run = |args: &[&str]| {
        let mut a: Vec<&str> = args.to_vec();
        a.extend(remote.iter().map(String::as_str));
        a.push("--dry-run");
        cli(&a, root)
    };
    let ok = |args: &[&str]| {
        let out = run(args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
        text(&out.stdout)
    };

    let said = ok(&["sync", "--openpilot", "op"]);
    assert!(
        said.starts_with("dry run: sync op on nocompiler:/data/openpilot"),
        "{said}"
    );
    assert!(
        said.contains(
            "send   op/tinygrad_repo/ -> nocompiler:/data/openpilot/tinygrad_repo/ (rsync -az \
             --delete --exclude=.git --exclude=__pycache__)"
        ),
        "{said}"
    );
    assert!(said.contains(&format!(
        "check  /data/openpilot/tinygrad_repo/TINYGRAD_COMMIT must be {PIN}"
    )));

    let compile = [
        "compile",
        "--model",
        "sc23",
        "--version",
        "v9",
        "--source",
        "src/driving_supercombo.onnx",
        "--out",
        "out",
        "--openpilot",
        "op",
    ];
    let said = ok(&compile);
    assert!(
        said.contains(
            "run    cd /data/openpilot && ./models --sc23 --version v9 --input-dir \
             /data/openpilot/uncompiledmodels --output-dir /data/openpilot/compiledmodels 2>&1"
        ),
        "{said}"
    );
    assert!(said.contains("would write  logs/sc23.log, out/sc23_driving_tinygrad.pkl.chunk*"));
    assert!(
        said.contains("would remove out/sc23_driving_tinygrad.pkl.chunk01of03"),
        "{said}"
    );
    let mut json = compile.to_vec();
    json.push("--json");
    let plan: serde_json::Value = serde_json::from_str(&ok(&json)).unwrap();
    assert_eq!(plan["dry_run"], true);
    assert_eq!(plan["steps"][0]["step"], "check_marker");
    assert_eq!(plan["steps"][2]["from"][0], "src/driving_supercombo.onnx");

    let said = ok(&["dm", "--out", "dm", "--openpilot", "op"]);
    assert!(said.contains("./models --dm --input-dir"), "{said}");
    assert!(said.contains("dm/dmonitoring_model_tinygrad.pkl"), "{said}");

    let out = run(&[
        "validate",
        "--model",
        "sc23",
        "--version",
        "v9",
        "--workspace",
        ".",
        "--openpilot",
        "op",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["artifact"]["chunk_count"], 3);
    assert_eq!(plan["record"], "./results/sc23.validation.json");
    assert!(
        plan["steps"][3]["command"]
            .as_str()
            .unwrap()
            .ends_with("scripts/validate_model_artifact.py --model sc23 --version v9"),
        "{plan}"
    );

    let rebuild = [
        "rebuild",
        "--workspace",
        "ws",
        "--source-map",
        "map.json",
        "--base-manifest",
        "base.json",
        "--sources",
        "store",
        "--generation",
        "v25",
        "--tinygrad-commit",
        PIN,
    ];
    let said = ok(&rebuild);
    assert!(said.contains("1 to build, 0 done earlier"), "{said}");
    assert!(
        said.contains("fetch  store/onnx/sc23/*.onnx -> ws/onnx/sc23"),
        "{said}"
    );
    assert!(said.contains("./models --sc23 --version v9"), "{said}");
    assert!(
        said.contains("would write  ws/ready/model_names_v25.json"),
        "{said}"
    );

    // The refusals still refuse: a validate of a broken set (3), a tree without models (2).
    fs::remove_file(root.join("ready/sc23/sc23_driving_tinygrad.pkl.chunk02of03")).unwrap();
    let out = run(&[
        "validate",
        "--model",
        "sc23",
        "--version",
        "v9",
        "--workspace",
        ".",
        "--openpilot",
        "op",
    ]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("is not a verified chunk set"));
    let chunk = root.join("ready/sc23/sc23_driving_tinygrad.pkl.chunk02of03");
    write(&chunk, &bytes[1000..2000]);
    fs::remove_file(op.join("models")).unwrap();
    let out = run(&["sync", "--openpilot", "op"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    write(&op.join("models"), b"#!/bin/sh\n");

    assert_eq!(snapshot(root), before, "a dry run wrote something");

    // No key pinned for the compiler: refused as the connection would refuse it (exit 3).
    let remote = absent_compiler(root, false);
    let mut a = vec!["compile"];
    a.extend(&compile[1..]);
    a.extend(remote.iter().map(String::as_str));
    a.push("--dry-run");
    let out = cli(&a, root);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("host key is not known") && err.contains("known_hosts"),
        "{err}"
    );
    assert!(!root.join("logs").exists() && !root.join("ws").exists());
}

/// A git checkout with a modified or untracked file is not its HEAD commit: `tinygrad bump`
/// refuses it (exit 3), naming the files and the next step, and the tree is unchanged; once
/// clean, the same command bumps. For v25 -> v26 and a made-up v26 -> v27 alike.
#[test]
fn tinygrad_bump_refuses_a_checkout_with_changes_its_commit_does_not_have() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let repo = root.join("tg");
    let git = |a: &[&str]| {
        Command::new("git")
            .args(a)
            .current_dir(&repo)
            .env("GIT_AUTHOR_NAME", "dev")
            .env("GIT_AUTHOR_EMAIL", "dev@localhost")
            .env("GIT_COMMITTER_NAME", "dev")
            .env("GIT_COMMITTER_EMAIL", "dev@localhost")
            .output()
    };
    write(&repo.join("tinygrad/tensor.py"), b"v26 tinygrad");
    if git(&["init", "-q"]).is_err() {
        return;
    }
    let op = root.join("op");
    write(
        &op.join("tinygrad_repo/TINYGRAD_COMMIT"),
        format!("{PIN}\n").as_bytes(),
    );
    let bump = || {
        cli(
            &[
                "tinygrad",
                "bump",
                "--openpilot",
                "op",
                "--tinygrad-src",
                "tg",
            ],
            root,
        )
    };
    for (from, to) in [("v25", "v26"), ("v26", "v27")] {
        git(&["add", "-A"]).unwrap();
        assert!(git(&["commit", "-q", "-m", to]).unwrap().status.success());
        let head = text(&git(&["rev-parse", "HEAD"]).unwrap().stdout)
            .trim()
            .to_string();
        write(&repo.join("tinygrad/tensor.py"), b"edited, not committed");
        write(&repo.join("tinygrad/extra.py"), b"untracked");
        write(
            &op.join("starpilot/assets/model_manager.py"),
            format!("MANIFEST_CANDIDATES = (\"{from}\",)\n").as_bytes(),
        );
        let before = snapshot(&op);
        let out = bump();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{from} -> {to}: {err}");
        assert!(
            err.contains(&format!("tg is a git checkout at {head} with changes"))
                && err.contains("M tinygrad/tensor.py")
                && err.contains("?? tinygrad/extra.py")
                && err.contains("nothing was changed")
                && err.contains("git -C tg stash --include-untracked"),
            "{from} -> {to}: {err}"
        );
        assert_eq!(snapshot(&op), before, "{from} -> {to}: the tree changed");
        // The next step, as printed: set the changes aside, and the bump goes through.
        assert!(
            git(&["stash", "-q", "--include-untracked"])
                .unwrap()
                .status
                .success()
        );
        let out = bump();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{from} -> {to}: {}",
            text(&out.stderr)
        );
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(
            said.contains(&format!("next generation: {from} -> {to}")),
            "{said}"
        );
        assert_eq!(
            fs::read_to_string(op.join("tinygrad_repo/TINYGRAD_COMMIT")).unwrap(),
            format!("{head}\n")
        );
        // The next generation's tinygrad is a new commit.
        write(&repo.join("tinygrad/tensor.py"), b"v27 tinygrad");
    }
}

/// The bump after a bump. A tree whose `MANIFEST_CANDIDATES` cannot be found starts from the
/// generation of its own tinygrad, so v26 -> v27 works as v25 -> v26 did. A tree whose
/// `MANIFEST_CANDIDATES` still names v25 while its tinygrad is v26's is refused (exit 3, tree
/// unchanged) with both ways forward, and each printed command works as given.
#[test]
fn a_second_bump_starts_from_the_trees_generation_or_says_what_to_do() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    const V26: &str = "2626262626262626262626262626262626262626";
    const V27: &str = "2727272727272727272727272727272727272727";
    write(&root.join("tg/tinygrad/tensor.py"), b"made-up tinygrad");
    let bump = |op: &str, commit: &str| {
        cli(
            &[
                "tinygrad",
                "bump",
                "--openpilot",
                op,
                "--tinygrad-src",
                "tg",
                "--commit",
                commit,
                "--json",
            ],
            root,
        )
    };
    let pins = |op: &str| -> serde_json::Value {
        serde_json::from_slice(&fs::read(root.join(op).join("tinygrad_pins.json")).unwrap())
            .unwrap()
    };

    // No MANIFEST_CANDIDATES anywhere: v25 -> v26, then v26 -> v27.
    write(
        &root.join("op/tinygrad_repo/TINYGRAD_COMMIT"),
        format!("{PIN}\n").as_bytes(),
    );
    for (commit, from, to) in [(V26, "v25", "v26"), (V27, "v26", "v27")] {
        let out = bump("op", commit);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["generation"], serde_json::json!({"from": from, "to": to}));
    }
    assert_eq!(
        pins("op"),
        serde_json::json!({"v25": PIN, "v26": V26, "v27": V27})
    );

    // MANIFEST_CANDIDATES still ("v25",) on a v26 tree: ambiguous, refused, nothing changed.
    write(
        &root.join("op2/tinygrad_repo/TINYGRAD_COMMIT"),
        format!("{PIN}\n").as_bytes(),
    );
    let py = root.join("op2/starpilot/assets/model_manager.py");
    write(&py, b"MANIFEST_CANDIDATES = (\"v25\",)\n");
    assert_eq!(bump("op2", V26).status.code(), Some(0));
    let before = snapshot(&root.join("op2"));
    let out = bump("op2", V27);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("v26 is already pinned")
            && err.contains("nothing was changed")
            && err.contains(&format!(
                "`release-cli tinygrad pin --openpilot op2 --generation v26 --commit {V27} --store STORE`"
            ))
            && err.contains("set MANIFEST_CANDIDATES to (\"v26\",)")
            && err.contains("model_manager.py:1"),
        "{err}"
    );
    assert_eq!(snapshot(&root.join("op2")), before);
    // Way 1, as printed (STORE: an empty store, nothing live): the pin is corrected.
    fs::create_dir_all(root.join("store")).unwrap();
    let out = cli(
        &[
            "tinygrad",
            "pin",
            "--openpilot",
            "op2",
            "--generation",
            "v26",
            "--commit",
            V27,
            "--store",
            "store",
            "--dry-run",
        ],
        root,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Way 2, as printed: MANIFEST_CANDIDATES names v26, and the same bump makes v27.
    write(&py, b"MANIFEST_CANDIDATES = (\"v26\",)\n");
    let out = bump("op2", V27);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(pins("op2")["v27"], V27);
}
