//! The release contract's refusals, run as the real binary: each one exits with its code, says
//! what is wrong and what to do, and writes nothing (no store directory, no file in a store, no
//! local folder in the working directory).

use crate::common::{
    TG, cli, cli_in, covering_records, entry, publish_argv, refused, release_in as release, strs,
    text,
};

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use test_support::published::{artifact_bytes, random_bytes, sha256_hex};

/// `release-cli publish` of `manifest` with a workspace whose records cover the validation
/// matrix (written beside the manifest, in `ws/`), so the other gates are what is tested.
fn publish(cwd: &Path, manifest: &Path, artifacts: &Path, to: &[&str]) -> std::process::Output {
    let ws = covering_records(&manifest.parent().unwrap().join("ws"), manifest);
    let args = publish_argv(
        "v25",
        manifest.to_str().unwrap(),
        artifacts.to_str().unwrap(),
        to,
        &["--workspace", ws.to_str().unwrap()],
    );
    cli_in(&strs(&args), cwd)
}

/// Publishes to the local store `dir/store` (which does not exist yet) and requires a refusal
/// (exit 3) that created nothing there; its message.
fn refused_into_a_new_store(dir: &Path, manifest: &Path, artifacts: &Path) -> String {
    let store = dir.join("store");
    let o = publish(dir, manifest, artifacts, &[store.to_str().unwrap()]);
    let err = refused(&o);
    assert!(!store.exists(), "{} was created: {err}", store.display());
    err
}

/// Every file under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p.clone());
            }
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
        }
    }
    out.sort();
    out
}

#[test]
fn mistyped_store_names_are_usage_errors_and_create_no_folder() {
    let t = tempfile::tempdir().unwrap();
    let (artifacts, manifest) = release(t.path(), &artifact_bytes(1, 2500), "artifacts/pop223");
    let cwd = t.path().join("cwd");
    fs::create_dir_all(&cwd).unwrap();
    for bad in [
        "hf:/buckets/StarPilot-Driving/StarPilot-Resources",
        "hf:buckets/StarPilot-Driving/StarPilot-Resources",
        "gh:../checkout",
        "s3://bucket/x",
    ] {
        let o = publish(&cwd, &manifest, &artifacts, &[bad]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{bad}: {err}");
        assert!(
            err.contains("accepted forms: hf://buckets/NS/NAME"),
            "{bad}: {err}"
        );
        assert!(tree(&cwd).is_empty(), "{bad}: {:?}", tree(&cwd));
    }
    // The same through reuse's destination.
    let o = cli_in(
        &[
            "reuse",
            "--model",
            "pop223",
            "--from",
            "hf://datasets/o/r/x_driving_tinygrad.pkl",
            "--source-catalog",
            manifest.to_str().unwrap(),
            "--source-commit",
            TG,
            "--tinygrad-commit",
            TG,
            "--to",
            "hf:/buckets/a/b",
            "--generation",
            "v25",
        ],
        &cwd,
    );
    assert_ne!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(tree(&cwd).is_empty());
}

#[test]
fn a_flat_artifacts_folder_is_refused_with_the_expected_layout() {
    let t = tempfile::tempdir().unwrap();
    // What `chunk split --out-dir artifacts` makes: the chunk set directly in artifacts/.
    let (artifacts, manifest) = release(t.path(), &artifact_bytes(2, 2500), "artifacts");
    let err = refused_into_a_new_store(t.path(), &manifest, &artifacts);
    assert!(
        err.contains("one <id>/ directory per model")
            && err.contains("pop223_driving_tinygrad.pkl.chunk01of03")
            && err.contains("mkdir -p")
            && err.contains("/pop223"),
        "{err}"
    );
}

#[test]
fn publish_refuses_an_artifact_that_is_not_oob_and_names_file_and_offset() {
    let t = tempfile::tempdir().unwrap();
    // A plain pickle (not an OOB container) with a manifest that matches it byte for byte.
    let (artifacts, manifest) = release(t.path(), &random_bytes(3, 2500), "artifacts/pop223");
    let err = refused_into_a_new_store(t.path(), &manifest, &artifacts);
    assert!(
        err.contains(
            "pop223/pop223_driving_tinygrad.pkl: not an out-of-band (OOB) pickle container at byte "
        ),
        "{err}"
    );

    // An OOB container with one byte too many: the records no longer tile the file.
    let mut data = artifact_bytes(4, 2500);
    data.push(0);
    let t = tempfile::tempdir().unwrap();
    let (artifacts, manifest) = release(t.path(), &data, "artifacts/pop223");
    let err = refused_into_a_new_store(t.path(), &manifest, &artifacts);
    assert!(err.contains("at byte 2500: 1 trailing byte(s)"), "{err}");
}

#[test]
fn publish_refuses_a_listed_artifact_in_the_store_that_is_not_oob() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    // The store already holds pop223 (say, copied there by hand) as a plain pickle; the
    // manifest lists it and --artifacts has nothing to upload.
    let data = random_bytes(5, 2500);
    let dir = store.join("models/v25/pop223");
    fs::create_dir_all(&dir).unwrap();
    let pkl = t.path().join("pop223_driving_tinygrad.pkl");
    fs::write(&pkl, &data).unwrap();
    let o = cli(&[
        "chunk",
        "split",
        pkl.to_str().unwrap(),
        "--out-dir",
        dir.to_str().unwrap(),
        "--chunk-size",
        "1000",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let manifest = t.path().join("model_names_v25.json");
    let doc = json!({"generation": "v25", "tinygrad_commit": TG,
        "models": [entry("pop223", &data, 3)]});
    fs::write(
        &manifest,
        serde_json::to_string_pretty(&doc).unwrap() + "\n",
    )
    .unwrap();
    let artifacts = t.path().join("empty");
    fs::create_dir_all(&artifacts).unwrap();
    let before = tree(&store);
    let o = publish(t.path(), &manifest, &artifacts, &[store.to_str().unwrap()]);
    let err = refused(&o);
    assert!(
        err.contains("model pop223")
            && err.contains("not an out-of-band (OOB) pickle container at byte"),
        "{err}"
    );
    assert_eq!(tree(&store), before);
    assert!(!store.join("manifests").exists());
}

#[test]
fn chunk_oob_reports_the_layout_or_the_offset() {
    let t = tempfile::tempdir().unwrap();
    let good = t.path().join("good_driving_tinygrad.pkl");
    fs::write(&good, artifact_bytes(6, 5000)).unwrap();
    let o = cli(&[
        "chunk",
        "split",
        good.to_str().unwrap(),
        "--chunk-size",
        "1000",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    fs::remove_file(&good).unwrap();
    let o = cli(&["chunk", "oob", good.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["size"], 5000);
    assert!(v["buffers"].as_u64().unwrap() >= 7);
    // The forms `verify` and `join` accept: any file of the set, or the directory holding it.
    for form in [
        "good_driving_tinygrad.pkl.chunk01of05",
        "good_driving_tinygrad.pkl.chunk05of05",
        "good_driving_tinygrad.pkl.chunkmanifest",
        "good_driving_tinygrad.pkl.sha256",
        "",
    ] {
        let o = cli(&[
            "chunk",
            "oob",
            t.path().join(form).to_str().unwrap(),
            "--json",
        ]);
        assert_eq!(o.status.code(), Some(0), "{form}: {}", text(&o.stderr));
        let w: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(w["size"], 5000, "{form}");
        assert_eq!(w["buffers"], v["buffers"], "{form}");
    }
    let bad = t.path().join("bad.pkl");
    fs::write(&bad, random_bytes(7, 100)).unwrap();
    let o = cli(&["chunk", "oob", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3));
    assert!(
        text(&o.stderr).contains("bad.pkl: not an out-of-band"),
        "{}",
        text(&o.stderr)
    );
}

const NEXT_PIN: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";

/// A v26 release of pop223 (pinned to NEXT_PIN) with extra manifest entries.
fn v26_release(dir: &Path, pin: &str, extra: Vec<Value>) -> (PathBuf, PathBuf) {
    let data = artifact_bytes(9, 2500);
    let (artifacts, manifest) = release(dir, &data, "artifacts/pop223");
    let mut models = vec![entry("pop223", &data, 3)];
    models.extend(extra);
    let doc = json!({"generation": "v26", "tinygrad_commit": pin, "models": models});
    fs::write(
        &manifest,
        serde_json::to_string_pretty(&doc).unwrap() + "\n",
    )
    .unwrap();
    let manifest26 = dir.join("model_names_v26.json");
    fs::rename(&manifest, &manifest26).unwrap();
    (artifacts, manifest26)
}

fn publish26(
    dir: &Path,
    manifest: &Path,
    artifacts: &Path,
    store: &Path,
    extra: &[&str],
) -> std::process::Output {
    let ws = covering_records(&dir.join("ws"), manifest);
    let mut args = publish_argv(
        "v26",
        manifest.to_str().unwrap(),
        artifacts.to_str().unwrap(),
        &[store.to_str().unwrap()],
        &["--workspace", ws.to_str().unwrap()],
    );
    args.extend(extra.iter().map(|s| s.to_string()));
    cli_in(&strs(&args), dir)
}

#[test]
fn a_manifest_whose_pin_is_not_its_generations_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    // --generation v26 with a v25-pinned manifest.
    let (artifacts, manifest) = v26_release(t.path(), TG, vec![]);
    let op = t.path().join("op");
    fs::create_dir_all(&op).unwrap();
    fs::write(
        op.join("tinygrad_pins.json"),
        format!("{{\"v25\": \"{TG}\", \"v26\": \"{NEXT_PIN}\"}}\n"),
    )
    .unwrap();
    let o = publish26(
        t.path(),
        &manifest,
        &artifacts,
        &store,
        &["--openpilot", "op"],
    );
    let err = refused(&o);
    assert!(
        err.contains(&format!("tinygrad_commit {TG} is not v26's pin {NEXT_PIN}"))
            && err.contains("it is v25's"),
        "{err}"
    );
    assert!(!store.exists());
    // Without a recorded v26 pin, v26 cannot be published at all.
    let (artifacts, manifest) = v26_release(t.path(), NEXT_PIN, vec![]);
    let o = publish26(t.path(), &manifest, &artifacts, &store, &[]);
    let err = refused(&o);
    assert!(err.contains("no tinygrad pin is recorded for v26"), "{err}");
    assert!(!store.exists());
}

#[test]
fn a_new_generation_keeps_the_previous_ids_versions_and_gpu_flags() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    // The store holds v25: pop223 (v15), gwm (v8), chest (v16, Chestnut).
    let old = |id: &str, v: &str, gpu: bool| {
        json!({"id": id, "name": id, "version": v, "series": "OP Series",
               "released": "2025-06-01", "community_favorite": false, "uses_external_gpu": gpu})
    };
    fs::create_dir_all(store.join("manifests")).unwrap();
    let v25 = json!({"generation": "v25", "tinygrad_commit": TG, "models": [
        old("pop223", "v15", false), old("gwm", "v8", false), old("chest", "v16", true)]});
    fs::write(
        store.join("manifests/model_names_v25.json"),
        serde_json::to_string_pretty(&v25).unwrap(),
    )
    .unwrap();
    let op = t.path().join("op");
    fs::create_dir_all(&op).unwrap();
    fs::write(
        op.join("tinygrad_pins.json"),
        format!("{{\"v25\": \"{TG}\", \"v26\": \"{NEXT_PIN}\"}}\n"),
    )
    .unwrap();
    // v26 drops gwm, adds fresh, flips chest's GPU flag; pop223 keeps v15.
    let listed = |id: &str, v: &str, gpu: bool| {
        let mut e = entry(id, &artifact_bytes(10, 2500), 3);
        e["version"] = v.into();
        e["uses_external_gpu"] = gpu.into();
        e
    };
    let (artifacts, manifest) = v26_release(
        t.path(),
        NEXT_PIN,
        vec![listed("chest", "v16", false), listed("fresh", "v16", false)],
    );
    let before = tree(&store);
    let o = publish26(
        t.path(),
        &manifest,
        &artifacts,
        &store,
        &["--openpilot", "op"],
    );
    let err = refused(&o);
    for want in [
        "departs from v25 (manifests/model_names_v25.json)",
        "+ model fresh is new (name it with --add-model fresh)",
        "- model gwm is missing",
        "--drop-model gwm",
        "~ model chest: uses_external_gpu true -> false",
    ] {
        assert!(err.contains(want), "{want:?} not in {err}");
    }
    assert_eq!(tree(&store), before, "nothing written");

    // Naming the intended changes is not enough while chest's target changes.
    let o = publish26(
        t.path(),
        &manifest,
        &artifacts,
        &store,
        &[
            "--openpilot",
            "op",
            "--add-model",
            "fresh",
            "--drop-model",
            "gwm",
        ],
    );
    let err = refused(&o);
    assert!(
        err.contains("chest") && !err.contains("fresh is new"),
        "{err}"
    );
    assert_eq!(tree(&store), before);
}

#[test]
fn manifest_set_artifact_fills_the_entry_and_refuses_without_writing() {
    let t = tempfile::tempdir().unwrap();
    let data = artifact_bytes(11, 2500);
    let (artifacts, manifest) = release(t.path(), &data, "artifacts/pop223");
    // Start from an entry without artifact fields, in non-canonical form.
    let doc = json!({"generation": "v25", "tinygrad_commit": TG, "models": [{
        "id": "pop223", "name": "Pop", "version": "v15", "series": "OP Series",
        "released": "2025-06-01", "community_favorite": false}]});
    fs::write(&manifest, serde_json::to_string(&doc).unwrap()).unwrap();
    let dir = artifacts.join("pop223");
    let o = cli(&[
        "manifest",
        "set-artifact",
        manifest.to_str().unwrap(),
        dir.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let m: Value = serde_json::from_slice(&fs::read(&manifest).unwrap()).unwrap();
    let e = &m["models"][0];
    assert_eq!(e["artifact_size"], 2500);
    assert_eq!(e["artifact_sha256"], sha256_hex(&data));
    assert_eq!(e["artifact_chunk_count"], 3);
    assert_eq!(e["artifact_format"], "tinygrad_single_v1");
    let chunks: Vec<String> = data.chunks(1000).map(sha256_hex).collect();
    assert_eq!(e["artifact_chunk_sha256"], json!(chunks));
    // The file is now canonical.
    let o = cli(&["manifest", "fmt", "--check", manifest.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));

    // Refusals leave the manifest byte for byte as it was.
    let before = fs::read(&manifest).unwrap();
    let o = cli(&[
        "manifest",
        "set-artifact",
        manifest.to_str().unwrap(),
        dir.to_str().unwrap(),
        "--model",
        "absent",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    // With --json the failure is one error document on stdout too:
    // {"error":{"kind","message","next"}}, the exit code carrying the number.
    let err: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(err["error"]["kind"], "check_failed");
    assert!(err["error"].get("next").is_some(), "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no entry for model absent")
    );
    assert_eq!(fs::read(&manifest).unwrap(), before);

    let plain = t.path().join("plain/pop223");
    let pkl = t.path().join("pop223_driving_tinygrad.pkl");
    fs::write(&pkl, random_bytes(12, 2500)).unwrap();
    let o = cli(&[
        "chunk",
        "split",
        pkl.to_str().unwrap(),
        "--out-dir",
        plain.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let o = cli(&[
        "manifest",
        "set-artifact",
        manifest.to_str().unwrap(),
        plain.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("not an out-of-band"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(fs::read(&manifest).unwrap(), before);
}

#[test]
fn manifest_fmt_write_rewrites_in_place_once() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("model_names_v25.json");
    fs::write(
        &f,
        r#"{"models":[{"id":"pop223","name":"Pop","version":"v15"}]}"#,
    )
    .unwrap();
    let o = cli(&["manifest", "fmt", "--check", f.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(3));
    let lines: Vec<Value> = text(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The report says what failed, so it is the whole --json answer: no error document follows.
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["canonical"], false);
    let o = cli(&["manifest", "fmt", "--write", f.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(
        serde_json::from_slice::<Value>(&o.stdout).unwrap()["changed"],
        true
    );
    let o = cli(&["manifest", "fmt", "--write", f.to_str().unwrap(), "--json"]);
    assert_eq!(
        serde_json::from_slice::<Value>(&o.stdout).unwrap()["changed"],
        false
    );
    let o = cli(&["manifest", "fmt", "--check", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
}

// ---- the validation gate ------------------------------------------------------------------

/// `release-cli publish --generation v25` of `manifest` to `store` with `extra` flags (no
/// records are written: the gate is what is tested).
fn publish_gated(
    dir: &Path,
    manifest: &Path,
    artifacts: &Path,
    store: &Path,
    extra: &[&str],
) -> std::process::Output {
    let args = publish_argv(
        "v25",
        manifest.to_str().unwrap(),
        artifacts.to_str().unwrap(),
        &[store.to_str().unwrap()],
        extra,
    );
    cli_in(&strs(&args), dir)
}

/// A store that already holds a file, so "untouched" is a real comparison.
fn existing_store(dir: &Path) -> PathBuf {
    let store = dir.join("store");
    fs::create_dir_all(store.join("manifests")).unwrap();
    fs::write(store.join("manifests/README"), "an older file\n").unwrap();
    store
}

fn edit_record(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    edit(&mut v);
    fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn publish_without_covering_records_is_refused_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (artifacts, manifest) = release(t.path(), &artifact_bytes(11, 2500), "artifacts/pop223");
    let store = existing_store(t.path());
    let before = tree(&store);
    let record = t.path().join("model_names_v25.publish.json");
    let ws = t.path().join("ws");
    let w = ws.to_str().unwrap();
    let unchanged = |case: &str| {
        assert_eq!(tree(&store), before, "{case}: the store changed");
        assert!(!record.exists(), "{case}: a publish record was written");
    };

    // Neither a workspace nor a reason to skip: a usage error saying what to pass.
    let o = publish_gated(t.path(), &manifest, &artifacts, &store, &[]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("publish needs --workspace DIR"), "{err}");
    unchanged("no workspace");

    // An empty workspace: every cell of the matrix for this manifest (one v15 artifact) is
    // listed, not only the first; a dry run is refused the same way.
    fs::create_dir_all(&ws).unwrap();
    for extra in [
        &["--workspace", w][..],
        &["--workspace", w, "--dry-run"][..],
    ] {
        let o = publish_gated(t.path(), &manifest, &artifacts, &store, extra);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{err}");
        for line in [
            "preflight (./dev sync and the repository tests): missing: run `release-cli preflight",
            "v15 artifact at 1928x1208: missing: validate one of pop223",
            "v15 artifact at 1344x760: missing: validate one of pop223",
            "stable modelV2 from modeld: missing",
            "DM driverStateV2 at 1928x1208: missing",
            "DM driverStateV2 at 1344x760: missing",
            "--skip-validation",
        ] {
            assert!(err.contains(line), "{line:?} not in:\n{err}");
        }
        unchanged("empty workspace");
    }

    // Covering records, then one resolution failed on the device, a DM check missing and a
    // preflight of another pin: each is named with what is wrong.
    covering_records(&ws, &manifest);
    edit_record(&ws.join("results/pop223.validation.json"), |v| {
        v["resolutions"][1]["passed"] = false.into();
        v["resolutions"][1]["problems"] = json!(["1344x760: lead output is not finite"]);
    });
    fs::remove_file(ws.join("results/driver-state.1344x760.check.json")).unwrap();
    edit_record(&ws.join("results/preflight.json"), |v| {
        v["tinygrad_commit"] = NEXT_PIN.into();
    });
    let o = publish_gated(t.path(), &manifest, &artifacts, &store, &["--workspace", w]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    for line in [
        &format!(
            "preflight (./dev sync and the repository tests): stale: recorded with tinygrad {NEXT_PIN}, the manifest is pinned to {TG}"
        )[..],
        "v15 artifact at 1344x760: failed: pop223: 1344x760: lead output is not finite",
        "DM driverStateV2 at 1344x760: missing",
    ] {
        assert!(err.contains(line), "{line:?} not in:\n{err}");
    }
    assert!(
        !err.contains("at 1928x1208"),
        "covered cells are not listed:\n{err}"
    );
    unchanged("failed and missing cells");

    // New bytes for pop223: the records of the old artifact are stale.
    covering_records(&ws, &manifest);
    let (artifacts, manifest) = release(t.path(), &artifact_bytes(12, 2500), "artifacts2/pop223");
    let o = publish_gated(
        t.path(),
        &manifest,
        &artifacts.with_file_name("artifacts2"),
        &store,
        &["--workspace", w],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("v15 artifact at 1928x1208: stale: pop223 was validated as artifact_sha256"),
        "{err}"
    );
    unchanged("stale records");

    // A record that is not one is an error naming it, not a silent gap.
    fs::write(
        ws.join("results/sc23.validation.json"),
        "{\"passed\": true}\n",
    )
    .unwrap();
    let o = publish_gated(t.path(), &manifest, &artifacts, &store, &["--workspace", w]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("sc23.validation.json: not a readable record"),
        "{err}"
    );
    unchanged("malformed record");
}

#[test]
fn skip_validation_publishes_and_its_reason_is_in_the_publish_record() {
    let t = tempfile::tempdir().unwrap();
    let (artifacts, manifest) = release(t.path(), &artifact_bytes(13, 2500), "artifacts/pop223");
    let store = existing_store(t.path());
    let before = tree(&store);
    // An empty reason is refused, and nothing is written.
    let o = publish_gated(
        t.path(),
        &manifest,
        &artifacts,
        &store,
        &["--skip-validation", " "],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("--skip-validation needs a reason"));
    assert_eq!(tree(&store), before);

    let reason = "hotfix: validated by hand on QCOM";
    let o = publish_gated(
        t.path(),
        &manifest,
        &artifacts,
        &store,
        &["--skip-validation", reason, "--json"],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!(
            "warning: publishing without validation ({reason})"
        )),
        "{err}"
    );
    let report: Value = serde_json::from_str(text(&o.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(report["validation"]["status"], "skipped", "{report}");
    assert_eq!(report["validation"]["reason"], reason);
    let path = t.path().join("model_names_v25.publish.json");
    assert_eq!(report["publish_record"], path.to_str().unwrap());
    let rec: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(rec["validation"]["status"], "skipped");
    assert_eq!(rec["validation"]["reason"], reason);
    assert_eq!(rec["generation"], "v25");
    assert_eq!(rec["tinygrad_commit"], TG);
    assert_eq!(rec["models"], json!(["pop223"]));
    // The store by its canonical name, however --to spelled it.
    let canonical = format!("file:{}", fs::canonicalize(&store).unwrap().display());
    assert_eq!(rec["stores"], json!([canonical]));
    let published = fs::read(store.join("manifests/model_names_v25.json")).unwrap();
    assert_eq!(rec["manifest_sha256"], sha256_hex(&published));

    // One record per publish: this one's own file holds the same record, and a second publish
    // (the store spelled another way) adds another file instead of overwriting the first.
    let first = PathBuf::from(report["publish_history"].as_str().unwrap());
    assert_eq!(first.parent(), path.parent());
    assert!(
        first
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("model_names_v25.publish.20"),
        "{}",
        first.display()
    );
    let first_bytes = fs::read(&first).unwrap();
    assert_eq!(first_bytes, fs::read(&path).unwrap());
    let again = format!("file:{}/.", store.display());
    let o = cli_in(
        &strs(&publish_argv(
            "v25",
            manifest.to_str().unwrap(),
            artifacts.to_str().unwrap(),
            &[&again],
            &["--skip-validation", "second publish", "--json"],
        )),
        t.path(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let report: Value = serde_json::from_str(text(&o.stdout).lines().last().unwrap()).unwrap();
    let second = PathBuf::from(report["publish_history"].as_str().unwrap());
    assert_ne!(second, first);
    assert_eq!(
        fs::read(&first).unwrap(),
        first_bytes,
        "the first record was changed"
    );
    let rec: Value = serde_json::from_slice(&fs::read(&second).unwrap()).unwrap();
    assert_eq!(rec["validation"]["reason"], "second publish");
    assert_eq!(rec["stores"], json!([canonical]));
    assert_eq!(fs::read(&second).unwrap(), fs::read(&path).unwrap());
    let history: Vec<_> = fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("model_names_v25.publish.2"))
        .collect();
    assert_eq!(history.len(), 2, "{history:?}");
}

/// A stand-in openpilot checkout: `./dev` and `.venv/bin/pytest` shell scripts; pytest exits
/// with `pytest_exit`.
fn stand_in_checkout(dir: &Path, pytest_exit: i32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let op = dir.join("openpilot");
    fs::create_dir_all(op.join("tinygrad_repo")).unwrap();
    fs::write(op.join("tinygrad_repo/TINYGRAD_COMMIT"), format!("{TG}\n")).unwrap();
    for (path, body) in [
        ("dev", "#!/bin/sh\necho \"syncing $*\"\n".to_string()),
        (
            ".venv/bin/pytest",
            format!(
                "#!/bin/sh\necho \"pytest $*\"\necho 'E assert 1 == 2' >&2\nexit {pytest_exit}\n"
            ),
        ),
    ] {
        let p = op.join(path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, body).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    op
}

/// `-q` leaves out the commands' live output lines (and the `next:` hint); the log keeps them.
#[test]
fn preflight_with_quiet_prints_no_live_output() {
    let t = tempfile::tempdir().unwrap();
    let op = stand_in_checkout(t.path(), 0);
    let ws = t.path().join("ws");
    let args = |quiet: bool| {
        let mut a = vec![
            "preflight",
            "--openpilot",
            op.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
        ];
        if quiet {
            a.insert(0, "-q");
        }
        cli(&a)
    };
    let o = args(false);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("syncing sync") && err.contains("next:"),
        "{err}"
    );
    let o = args(true);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(err, "", "-q printed on stderr");
    assert!(text(&o.stdout).contains("preflight passed"));
    let log = fs::read_to_string(ws.join("logs/preflight.log")).unwrap();
    assert!(
        log.contains("syncing sync") && log.contains("E assert 1 == 2"),
        "{log}"
    );
}

/// `preflight --dry-run` checks the checkout and lists the commands and files, running and
/// writing nothing; a tree that is not a checkout is still refused.
#[test]
fn preflight_dry_run_runs_nothing_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let op = stand_in_checkout(t.path(), 0);
    // ./dev would leave this file behind if it ran.
    fs::write(op.join("dev"), "#!/bin/sh\ntouch ran\n").unwrap();
    let before = crate::common::snapshot(t.path());
    let ws = t.path().join("ws");
    let run = |extra: &[&str]| {
        let mut a = vec![
            "preflight",
            "--openpilot",
            op.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
            "--dry-run",
        ];
        a.extend(extra);
        cli(&a)
    };
    let o = run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let said = text(&o.stdout);
    assert!(
        said.contains(&format!("(tinygrad {TG}); nothing was run or written")),
        "{said}"
    );
    assert!(said.contains("  run    ./dev sync\n"), "{said}");
    assert!(said.contains("logs/preflight.log") && said.contains("results/preflight.json"));
    let o = run(&["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["commands"][0], json!(["./dev", "sync"]));
    assert_eq!(v["tinygrad_commit"], TG);
    fs::remove_file(op.join("tinygrad_repo/TINYGRAD_COMMIT")).unwrap();
    let o = run(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    fs::write(op.join("tinygrad_repo/TINYGRAD_COMMIT"), format!("{TG}\n")).unwrap();
    assert_eq!(
        crate::common::snapshot(t.path()),
        before,
        "a preflight dry run changed something"
    );
}

#[test]
fn preflight_records_the_repository_tests_and_publish_requires_it_passing() {
    let t = tempfile::tempdir().unwrap();
    let (artifacts, manifest) = release(t.path(), &artifact_bytes(14, 2500), "artifacts/pop223");
    let store = existing_store(t.path());
    let before = tree(&store);
    let ws = t.path().join("ws");
    let w = ws.to_str().unwrap();
    // The device's records are there; the repository tests are what decides.
    covering_records(&ws, &manifest);
    fs::remove_file(ws.join("results/preflight.json")).unwrap();

    // A failing pytest: a failing record, exit 3, and publish refuses.
    let op = stand_in_checkout(&t.path().join("failing"), 1);
    let o = cli(&[
        "preflight",
        "--openpilot",
        op.to_str().unwrap(),
        "--workspace",
        w,
        "--json",
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("E assert 1 == 2"), "live output: {err}");
    let rec: Value =
        serde_json::from_slice(&fs::read(ws.join("results/preflight.json")).unwrap()).unwrap();
    assert_eq!(rec["passed"], false, "{rec}");
    assert_eq!(rec["commands"][0]["argv"], json!(["./dev", "sync"]));
    assert_eq!(rec["commands"][1]["exit_code"], 1);
    assert_eq!(rec["tinygrad_commit"], TG);
    let o = publish_gated(t.path(), &manifest, &artifacts, &store, &["--workspace", w]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("preflight (./dev sync and the repository tests): failed: `./.venv/bin/pytest -q -n0 starpilot/assets/tests/test_model_pipeline.py common/tests/test_file_chunker.py scripts/tests/test_model_release.py` exited 1"),
        "{err}"
    );
    assert_eq!(tree(&store), before);

    // Passing: publish goes through and its record names the records that covered the matrix.
    let op = stand_in_checkout(&t.path().join("passing"), 0);
    let o = cli(&[
        "preflight",
        "--openpilot",
        op.to_str().unwrap(),
        "--workspace",
        w,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("preflight passed"),
        "{}",
        text(&o.stdout)
    );
    let o = publish_gated(t.path(), &manifest, &artifacts, &store, &["--workspace", w]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        out.contains("validation: 7 cell(s) of the seed's matrix covered"),
        "{out}"
    );
    let rec: Value =
        serde_json::from_slice(&fs::read(t.path().join("model_names_v25.publish.json")).unwrap())
            .unwrap();
    assert_eq!(rec["validation"]["status"], "passed", "{rec}");
    let cells: Vec<&str> = rec["validation"]["covered"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["cell"].as_str().unwrap())
        .collect();
    assert_eq!(
        cells,
        [
            "preflight (./dev sync and the repository tests)",
            "v15 artifact at 1928x1208",
            "v15 artifact at 1344x760",
            "stable modelV2 from modeld",
            "DM driverStateV2 at 1928x1208",
            "DM driverStateV2 at 1344x760",
            "rehearsal of this manifest on old-generation devices"
        ]
    );
    assert!(store.join("manifests/model_names_v25.json").is_file());
}

/// The exit code of a publish whose directories are missing, pinned where the publish
/// workflow is composed in `release::publish`: a `--workspace` that is not a directory is a
/// failure (as the validation gate classifies its records), an `--openpilot` that is not one a
/// usage error (as the pins are loaded everywhere); neither touches the store.
#[test]
fn publish_with_a_missing_workspace_or_openpilot_keeps_its_exit_code_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (artifacts, manifest) = release(t.path(), &artifact_bytes(11, 2500), "artifacts/pop223");
    let store = existing_store(t.path());
    let before = tree(&store);
    let record = t.path().join("model_names_v25.publish.json");
    let missing = t.path().join("missing");
    let m = missing.to_str().unwrap();
    for (extra, code) in [
        (&["--workspace", m][..], 1),
        (&["--skip-validation", "test", "--openpilot", m][..], 2),
    ] {
        let o = publish_gated(t.path(), &manifest, &artifacts, &store, extra);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{extra:?}: {err}");
        assert!(err.contains(m), "{extra:?}: {err}");
        assert!(err.contains("not a directory"), "{extra:?}: {err}");
        assert_eq!(tree(&store), before, "{extra:?}: the store changed");
        assert!(!record.exists(), "{extra:?}: a publish record was written");
    }
}

/// Gate records that cannot mislead, through the real binary, for v25 and a made-up v26 (its
/// made-up pin recorded in `--openpilot`'s `tinygrad_pins.json`): a newer failure of the same
/// bytes beside an older pass, a record of another behaviour version, device checks made on
/// artifacts that were all rebuilt since, and a preflight that says passed with a failing
/// command each refuse the publish (exit 3, named) and write nothing; the covering records
/// then publish.
#[test]
fn gate_records_that_would_mislead_refuse_the_publish_and_write_nothing() {
    for generation in ["v25", "v26"] {
        let t = tempfile::tempdir().unwrap();
        let (artifacts, manifest) = if generation == "v25" {
            release(t.path(), &artifact_bytes(9, 2500), "artifacts/pop223")
        } else {
            v26_release(t.path(), NEXT_PIN, vec![])
        };
        let op = t.path().join("op");
        fs::create_dir_all(&op).unwrap();
        fs::write(
            op.join("tinygrad_pins.json"),
            format!("{{\"v25\": \"{TG}\", \"v26\": \"{NEXT_PIN}\"}}\n"),
        )
        .unwrap();
        let store = existing_store(t.path());
        let before = tree(&store);
        let ws = t.path().join("ws");
        let results = ws.join("results");
        let run = |dry_run: bool| {
            let mut args = publish_argv(
                generation,
                manifest.to_str().unwrap(),
                artifacts.to_str().unwrap(),
                &[store.to_str().unwrap()],
                &[
                    "--workspace",
                    ws.to_str().unwrap(),
                    "--openpilot",
                    op.to_str().unwrap(),
                ],
            );
            if dry_run {
                args.push("--dry-run".into());
            }
            cli_in(&strs(&args), t.path())
        };
        let refused_with = |case: &str, want: &[&str]| {
            for dry_run in [true, false] {
                let o = run(dry_run);
                let err = text(&o.stderr);
                assert_eq!(o.status.code(), Some(3), "{generation} {case}: {err}");
                for w in want {
                    assert!(err.contains(w), "{generation} {case}: {w:?} not in:\n{err}");
                }
                assert_eq!(
                    tree(&store),
                    before,
                    "{generation} {case}: the store changed"
                );
            }
        };

        // An older pass and a newer failure of the same bytes, in another record file that
        // sorts after the pass: the failure counts.
        covering_records(&ws, &manifest);
        let mut newer: Value =
            serde_json::from_slice(&fs::read(results.join("pop223.validation.json")).unwrap())
                .unwrap();
        newer["checked_at"] = "2099-01-01T00:00:00Z".into();
        newer["resolutions"][0]["passed"] = false.into();
        newer["resolutions"][0]["problems"] = json!(["1928x1208: plan output is not finite"]);
        fs::write(
            results.join("pop223.zz-rerun.validation.json"),
            newer.to_string(),
        )
        .unwrap();
        refused_with(
            "a newer failure",
            &["v15 artifact at 1928x1208: failed: pop223: 1928x1208: plan output is not finite"],
        );
        fs::remove_file(results.join("pop223.zz-rerun.validation.json")).unwrap();

        // A record of another behaviour version of the same bytes.
        edit_record(&results.join("pop223.validation.json"), |v| {
            v["version"] = "v16".into();
        });
        refused_with(
            "another behaviour version",
            &["stale: pop223 was validated as behaviour version v16, the manifest lists v15"],
        );

        // Device checks made on artifacts that were all rebuilt since.
        covering_records(&ws, &manifest);
        for name in [
            "model-v2.check.json",
            "driver-state.1928x1208.check.json",
            "driver-state.1344x760.check.json",
        ] {
            edit_record(&results.join(name), |v| {
                v["artifacts"] = json!({"pop223": sha256_hex(b"the build before")});
            });
        }
        refused_with(
            "checks of rebuilt artifacts",
            &[
                "stable modelV2 from modeld: stale: model-v2 was checked on 1 artifact(s) of which the manifest lists none",
                "DM driverStateV2 at 1928x1208: stale",
                "DM driverStateV2 at 1344x760: stale",
            ],
        );

        // A preflight that says passed with a failing command.
        covering_records(&ws, &manifest);
        edit_record(&results.join("preflight.json"), |v| {
            v["commands"][1]["exit_code"] = 1.into();
        });
        refused_with(
            "a contradictory preflight",
            &[
                "preflight (./dev sync and the repository tests): failed: the record says passed but",
            ],
        );

        // The covering records publish (the same gate, not a refusal by default).
        covering_records(&ws, &manifest);
        let o = run(false);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{generation}: {}",
            text(&o.stderr)
        );
        assert!(
            store
                .join(format!("manifests/model_names_{generation}.json"))
                .is_file(),
            "{generation}"
        );
    }
}

/// Issue 26.2 through the real binary: a manifest listing a model that is in neither
/// `--artifacts` nor any store is refused (exit 3, the model and its missing file named) before
/// the first upload, on the dry run and on the real run alike: the local store and the GitHub
/// remote stay as they were, although the other model would have gone first.
#[test]
fn a_publish_refused_for_a_missing_model_uploads_nothing_anywhere() {
    use test_support::release_stores::GitRemote;
    let t = tempfile::tempdir().unwrap();
    let data = artifact_bytes(21, 2500);
    let (artifacts, manifest) = release(t.path(), &data, "artifacts/pop223");
    let absent = artifact_bytes(22, 1800);
    let doc = json!({"generation": "v25", "tinygrad_commit": TG,
        "models": [entry("pop223", &data, 3), entry("wd40", &absent, 2)]});
    fs::write(
        &manifest,
        serde_json::to_string_pretty(&doc).unwrap() + "\n",
    )
    .unwrap();
    let ws = covering_records(&t.path().join("ws"), &manifest);
    let store = existing_store(t.path());
    let before = tree(&store);
    let remote = GitRemote::new(&t.path().join("gh"), "Models", None);
    let gh = format!("github:{}", remote.checkout.display());
    for dry_run in [true, false] {
        let mut args = publish_argv(
            "v25",
            manifest.to_str().unwrap(),
            artifacts.to_str().unwrap(),
            &[store.to_str().unwrap(), &gh],
            &[
                "--workspace",
                ws.to_str().unwrap(),
                "--github-only",
                "test: no Hub here",
            ],
        );
        if dry_run {
            args.push("--dry-run".into());
        }
        let o = cli_in(&strs(&args), t.path());
        let err = refused(&o);
        assert!(
            err.contains("model wd40")
                && err
                    .contains("models/v25/wd40/wd40_driving_tinygrad.pkl.chunkmanifest is missing"),
            "dry run {dry_run}: {err}"
        );
        assert!(
            !err.contains(&format!("publishing to {}", store.display())),
            "an upload started: {err}"
        );
        assert_eq!(tree(&store), before, "dry run {dry_run}: the store changed");
        assert_eq!(remote.remote_subjects(), ["init"], "dry run {dry_run}");
        assert!(
            !release::records::publish_record_path(&manifest).exists(),
            "dry run {dry_run}"
        );
    }
}
