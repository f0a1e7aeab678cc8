//! The catalog params and caches written by the real binary are the bytes upstream's Python
//! manager writes for the same catalog (issue 25 item 6): `refresh` against the fault server
//! serving the real v25 catalog (one entry published), then the independent checker
//! (`crates/migration/tests/upstream/writes.rs`, written from the description of the Python
//! manager, not from our code) says what the Python manager writes; every byte must match, and a
//! second `refresh` over the Python manager's bytes changes none. For v25 and a made-up v26.

use std::collections::BTreeMap;
use std::fs;

use crate::common::*;
use serde_json::{Value, json};
use test_support::http_server::FaultServer;
use test_support::published::{artifact_bytes, publish_model, write_manifest};

#[path = "../../../crates/migration/tests/upstream/writes.rs"]
mod writes;

const REAL_V25: &str =
    include_str!("../../../crates/manifest/tests/fixtures/model_names_v25.catalog.json");

fn python_bytes(d: &Device, models: &[Value]) -> BTreeMap<String, Vec<u8>> {
    let names = d.model_files();
    let mut sidecars = BTreeMap::new();
    for n in &names {
        if let Some(key) = n.strip_suffix(".json").filter(|k| k.starts_with("local-"))
            && let Ok(v) = serde_json::from_slice(&fs::read(d.models().join(n)).unwrap())
        {
            sidecars.insert(key.to_string(), v);
        }
    }
    writes::update_model_params(models, writes::locals(&names, &sidecars))
        .into_iter()
        .collect()
}

fn path_of(d: &Device, name: &str) -> std::path::PathBuf {
    if name.starts_with('.') {
        d.models().join(name)
    } else {
        d.params().join(name)
    }
}

#[test]
fn the_binary_writes_the_python_managers_bytes_for_the_same_catalog() {
    for (generation, v26) in [("v25", false), ("v26", true)] {
        let d = Device::new();
        if v26 {
            set_tree(&d.openpilot(), V26_PIN, Some(&v26_pins()));
        }
        let root = d.dir.path().join("origin");
        let mut models: Vec<Value> = serde_json::from_str::<Value>(REAL_V25).unwrap()["models"]
            .as_array()
            .unwrap()
            .clone();
        let p = publish_model(&root, generation, "pop223", &artifact_bytes(3, 5000), None);
        let e = models.iter_mut().find(|m| m["id"] == "pop223").unwrap();
        e["artifact_format"] = json!("tinygrad_single_v1");
        e["artifact_size"] = json!(p.size);
        e["artifact_sha256"] = json!(p.sha256);
        e["artifact_chunk_count"] = json!(0);
        write_manifest(
            &root,
            generation,
            json!({"generation": generation, "models": models})
                .to_string()
                .as_bytes(),
        );
        let server = FaultServer::start(&root).unwrap();
        let base = server.url();
        d.make_v24(&["pop223_driving_tinygrad.pkl"], "1");
        fs::write(d.models().join("local-x-y_driving_tinygrad.pkl"), b"x").unwrap();
        fs::write(d.models().join("local-x_driving_tinygrad.pkl"), b"x").unwrap();
        fs::write(
            d.models().join("local-x.json"),
            r#"{"name": "X, local", "version": "v16"}"#,
        )
        .unwrap();

        let out = d.command(&base, &["refresh"]).output().unwrap();
        assert!(out.status.success(), "{generation}: {}", stderr(&out));
        assert_eq!(d.installed("pop223").unwrap(), artifact_bytes(3, 5000));
        let want = python_bytes(&d, &models);
        assert_eq!(want.len(), 10, "{generation}");
        for (name, bytes) in &want {
            let got = fs::read(path_of(&d, name)).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(bytes),
                "{generation}: {name}"
            );
        }

        // The Python manager's bytes on disk (the same), then our refresh: no byte changes.
        for (name, bytes) in &want {
            fs::write(path_of(&d, name), bytes).unwrap();
        }
        let out = d.command(&base, &["refresh"]).output().unwrap();
        assert!(out.status.success(), "{generation}: {}", stderr(&out));
        for (name, bytes) in &want {
            assert_eq!(
                &fs::read(path_of(&d, name)).unwrap(),
                bytes,
                "{generation}: {name}"
            );
        }
    }
}
