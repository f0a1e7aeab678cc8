//! The release contract's refusals, run as the real binary: each one exits with its code, says
//! what is wrong and what to do, and writes nothing (no store directory, no file in a store, no
//! local folder in the working directory).

mod common;
use common::{cli, cli_in, text};

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use test_support::published::{artifact_bytes, random_bytes, sha256_hex};

const TG: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";

fn entry(id: &str, data: &[u8], chunks: u32) -> Value {
    json!({
        "id": id, "name": id, "version": "v15", "series": "OP Series", "released": "2025-06-01",
        "community_favorite": false, "artifact_format": "tinygrad_single_v1",
        "artifact_size": data.len(), "artifact_sha256": sha256_hex(data),
        "artifact_chunk_count": chunks, "uses_external_gpu": false
    })
}

/// `dir/<out>` holding `pop223`'s chunk set of `data` (1000-byte chunks), and a v25 manifest.
fn release(dir: &Path, data: &[u8], out: &str) -> (PathBuf, PathBuf) {
    let pkl = dir.join("build/pop223_driving_tinygrad.pkl");
    fs::create_dir_all(pkl.parent().unwrap()).unwrap();
    fs::write(&pkl, data).unwrap();
    let o = cli(&[
        "chunk",
        "split",
        pkl.to_str().unwrap(),
        "--out-dir",
        dir.join(out).to_str().unwrap(),
        "--chunk-size",
        "1000",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let manifest = dir.join("model_names_v25.json");
    let count = data.len().div_ceil(1000) as u32;
    let doc = json!({"generation": "v25", "tinygrad_commit": TG,
        "models": [entry("pop223", data, count)]});
    fs::write(
        &manifest,
        serde_json::to_string_pretty(&doc).unwrap() + "\n",
    )
    .unwrap();
    (dir.join("artifacts"), manifest)
}

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
    let store = t.path().join("store");
    let o = publish(t.path(), &manifest, &artifacts, &[store.to_str().unwrap()]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("one <id>/ directory per model")
            && err.contains("pop223_driving_tinygrad.pkl.chunk01of03")
            && err.contains("mkdir -p")
            && err.contains("/pop223"),
        "{err}"
    );
    assert!(!store.exists());
}

#[test]
fn publish_refuses_an_artifact_that_is_not_oob_and_names_file_and_offset() {
    let t = tempfile::tempdir().unwrap();
    // A plain pickle (not an OOB container) with a manifest that matches it byte for byte.
    let (artifacts, manifest) = release(t.path(), &random_bytes(3, 2500), "artifacts/pop223");
    let store = t.path().join("store");
    let o = publish(t.path(), &manifest, &artifacts, &[store.to_str().unwrap()]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains(
            "pop223/pop223_driving_tinygrad.pkl: not an out-of-band (OOB) pickle container at byte "
        ),
        "{err}"
    );
    assert!(!store.exists());

    // An OOB container with one byte too many: the records no longer tile the file.
    let mut data = artifact_bytes(4, 2500);
    data.push(0);
    let t = tempfile::tempdir().unwrap();
    let (artifacts, manifest) = release(t.path(), &data, "artifacts/pop223");
    let o = publish(t.path(), &manifest, &artifacts, &[store.to_str().unwrap()]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("at byte 2500: 1 trailing byte(s)"), "{err}");
    assert!(!store.exists());
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
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
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
