//! The release contract's refusals, run as the real binary: each one exits with its code, says
//! what is wrong and what to do, and writes nothing (no store directory, no file in a store, no
//! local folder in the working directory).

use crate::common::{TG, cli, cli_in, entry, refused, release_in as release, text};

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use test_support::published::{artifact_bytes, random_bytes, sha256_hex};

fn publish(cwd: &Path, manifest: &Path, artifacts: &Path, to: &[&str]) -> std::process::Output {
    let mut args = vec![
        "publish".to_string(),
        "--generation".into(),
        "v25".into(),
        "--manifest".into(),
        manifest.to_str().unwrap().into(),
        "--artifacts".into(),
        artifacts.to_str().unwrap().into(),
    ];
    for t in to {
        args.push("--to".into());
        args.push(t.to_string());
    }
    cli_in(&args.iter().map(String::as_str).collect::<Vec<_>>(), cwd)
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
    let mut args = vec![
        "publish",
        "--generation",
        "v26",
        "--manifest",
        manifest.to_str().unwrap(),
        "--artifacts",
        artifacts.to_str().unwrap(),
        "--to",
        store.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    cli_in(&args, dir)
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
