//! The catalog params and caches byte for byte as upstream's Python manager writes them (issue
//! 25 item 6): a device is refreshed in-process against the fault server, serving the real v25
//! catalog (97 entries) plus published artifacts and a few loosely typed entries, with local
//! models beside; then `upstream::writes` (written from the description of the Python
//! manager, not from this crate) says what the Python manager writes for the same catalog, and
//! every param and cache file must be exactly those bytes. So a run of either manager after the
//! other changes no byte. For v25 and for a made-up v26.

use std::collections::BTreeMap;
use std::fs;

use crate::common::{Fixture, refresh};
use crate::upstream::writes;
use downloader::{DownloadConfig, Downloader, Origins};
use manifest::Generation;
use migration::{Device, DeviceConfig, Effects};
use serde_json::{Value, json};
use test_support::http_server::FaultServer;
use test_support::published::{GH_DIR, HF_DIR, artifact_bytes, publish_model, write_manifest};

const REAL_V25: &str = include_str!("../../manifest/tests/fixtures/model_names_v25.catalog.json");

/// The served `models`: the real catalog, two of its entries published with artifacts (one
/// with a Chestnut build and an explicit URL map), and entries that exercise upstream's loose
/// reads (empty format, declared size class, base and direct URLs, emoji and spaces in names).
fn served(root: &std::path::Path, generation: &str) -> Vec<Value> {
    let mut models: Vec<Value> = serde_json::from_str::<Value>(REAL_V25).unwrap()["models"]
        .as_array()
        .unwrap()
        .clone();
    for (seed, id) in [(5u64, "tr14223"), (6, "gwm8223")] {
        let p = publish_model(
            root,
            generation,
            id,
            &artifact_bytes(seed, 70_000),
            Some(32 * 1024),
        );
        let e = models.iter_mut().find(|m| m["id"] == id).unwrap();
        e["artifact_format"] = json!("tinygrad_single_v1");
        e["artifact_size"] = json!(p.size);
        e["artifact_sha256"] = json!(p.sha256);
        e["artifact_chunk_count"] = json!(p.chunk_count);
        if id == "tr14223" {
            e["artifact_urls"] = json!({
                "tr14223_driving_tinygrad.pkl": " https://mirror.invalid/tr14223 ",
                "other.pkl": "https://mirror.invalid/other",
            });
        }
    }
    models.push(json!({
        "id": "loose223", "name": "  Loose 🗺️ Model  ", "version": "v9",
        "series": "", "community_favorite": true,
        "artifact_format": "", "model_size": "medium",
        "artifact_base_url": "https://base.invalid/dir/",
        "download_url": "https://direct.invalid/loose",
    }));
    models.push(json!({
        "id": "direct223", "name": "Direct", "version": "v10",
        "artifact_url": "https://direct.invalid/direct223",
        "uses_external_gpu": true, "model_lab_eligible": true,
    }));
    models
}

fn local_files(f: &Fixture) {
    let m = f.models();
    fs::write(m.join("local-a-b_driving_tinygrad.pkl"), b"a-b").unwrap();
    fs::write(m.join("local-a_driving_tinygrad.pkl"), b"a").unwrap();
    fs::write(
        m.join("local-a.json"),
        r#"{"name": "Tuned, again 👀", "series": "Mine, all mine", "released": "2026-01-02",
            "model_size": "big", "uses_external_gpu": true,
            "accelerator_artifacts": {"Chestnut": {"device": "amd", "artifact_size": 3}}}"#,
    )
    .unwrap();
}

fn device(f: &Fixture, generation: Generation) -> Device {
    let mut d = Device::with_effects(
        DeviceConfig {
            data_dir: f.data(),
            memory_params_dir: f.dir.path().join("shm"),
            builtin_dir: f.builtin(),
            generation,
        },
        Effects::none(),
    );
    d.sysfs_root = f.sysfs();
    d
}

/// Every param and cache the Python manager writes in `update_model_params`, as on disk now.
fn on_disk(f: &Fixture, names: &[String]) -> BTreeMap<String, String> {
    names
        .iter()
        .map(|n| {
            let path = if n.starts_with('.') {
                f.models().join(n)
            } else {
                f.data().join("params/d").join(n)
            };
            let body = fs::read(&path).unwrap_or_else(|e| panic!("{n}: {e}"));
            (n.clone(), String::from_utf8(body).unwrap())
        })
        .collect()
}

/// What the Python manager would write on this device now.
fn python(f: &Fixture, models: &[Value]) -> BTreeMap<String, String> {
    let names: Vec<String> = fs::read_dir(f.models())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut sidecars = BTreeMap::new();
    for n in &names {
        if let Some(key) = n.strip_suffix(".json").filter(|k| k.starts_with("local-")) {
            let body = fs::read(f.models().join(n)).unwrap();
            if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                sidecars.insert(key.to_string(), v);
            }
        }
    }
    writes::update_model_params(models, writes::locals(&names, &sidecars))
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v).unwrap()))
        .collect()
}

#[test]
fn catalog_params_and_caches_are_the_bytes_the_python_manager_writes() {
    for generation in [Generation::new(25), Generation::new(26)] {
        let g = generation.to_string();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("origin");
        let models = served(&root, &g);
        let body = serde_json::to_vec_pretty(&json!({"generation": g, "models": models})).unwrap();
        write_manifest(&root, &g, &body);
        let server = FaultServer::start(&root).unwrap();
        let dl = Downloader::new(
            Origins::new(
                &format!("{}/{HF_DIR}", server.url()),
                &format!("{}/{GH_DIR}", server.url()),
            ),
            DownloadConfig {
                space_margin: 0,
                ..DownloadConfig::default()
            },
        );
        // A device the Python manager left on v24, selecting a published model.
        let f = Fixture::v24(&[("Model", "tr14223"), ("DrivingModel", "tr14223")]);
        local_files(&f);
        let d = device(&f, generation);
        let r = refresh(&d, &dl).unwrap_or_else(|e| panic!("{g}: {e}"));
        assert!(r.refused_entries.is_empty(), "{g}: {:?}", r.refused_entries);
        assert_eq!(r.selected.as_str(), "tr14223", "{g}");

        let want = python(&f, &models);
        let names: Vec<String> = want.keys().cloned().collect();
        assert_eq!(names.len(), 10, "{g}: seven params, three caches");
        let got = on_disk(&f, &names);
        for n in &names {
            assert_eq!(
                got[n], want[n],
                "{g}: {n} differs from the Python manager's bytes"
            );
        }
        // The facts the issue names, on the bytes themselves.
        let formats = &got["AvailableModelArtifactFormats"];
        assert_eq!(
            formats
                .split(',')
                .filter(|x| *x == "tinygrad_single_v1")
                .count(),
            formats.split(',').count(),
            "{g}: {formats}"
        );
        assert!(!formats.split(',').any(str::is_empty), "{g}");
        let artifacts: Value = serde_json::from_str(&got[".model_artifacts.json"]).unwrap();
        assert_eq!(artifacts["pop223"]["artifact_format"], "tinygrad_single_v1");
        assert_eq!(artifacts["pop223"]["artifact_filename"], "");
        assert_eq!(artifacts["local-a"]["model_size_declared"], true);
        assert_eq!(
            artifacts["gwm8223"]["accelerator_artifacts"]["chestnut"]["artifact_format"],
            "tinygrad_single_v1"
        );
        assert!(got[".model_artifacts.json"].starts_with("{\"tr14223\": {\"artifact_format\": "));
        assert!(!got[".model_versions.json"].ends_with('\n'));

        // The Python manager runs after us: it writes the same bytes, so nothing changes. We
        // run after it (its bytes on disk): nothing changes either.
        let before = f.snapshot();
        for (n, body) in &want {
            let path = if n.starts_with('.') {
                f.models().join(n)
            } else {
                f.data().join("params/d").join(n)
            };
            fs::write(path, body).unwrap();
        }
        assert_eq!(
            f.snapshot(),
            before,
            "{g}: a Python run after ours changed bytes"
        );
        refresh(&d, &dl).unwrap();
        assert_eq!(
            f.snapshot(),
            before,
            "{g}: our run after the Python one changed bytes"
        );
        assert_eq!(on_disk(&f, &names), want, "{g}");
    }
}
