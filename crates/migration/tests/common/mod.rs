//! Fixtures shared by the in-process tests: a v25 origin on the fault-injecting server, and data
//! dirs laid out the way the Python model manager leaves a v24 device.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use downloader::{DownloadConfig, Downloader, Origins};
use manifest::Generation;
use migration::{Device, DeviceConfig, Effects, RefreshReport};
use serde_json::json;
use test_support::http_server::FaultServer;
use test_support::published::{GH_DIR, HF_DIR, artifact_bytes, publish_model, write_manifest};

pub const V25: Generation = Generation::new(25);
pub const CHUNK: usize = 64 * 1024;

/// One published v25 model.
pub struct Published {
    pub sha256: String,
}

/// The v25 origin: `rdf43` listed without an artifact (built-in), `pop223` (a chunk set, a
/// community favourite, emoji in its name), `tr14223` (a plain file) and `big223` (an eGPU
/// model with an explicit URL map), served in both layouts.
pub struct Origin {
    pub dir: tempfile::TempDir,
    pub server: FaultServer,
    pub models: BTreeMap<&'static str, Published>,
    /// The served manifest, as a JSON value (see [`Origin::republish`]).
    pub manifest: serde_json::Value,
}

pub const CATALOG_IDS: [&str; 4] = ["rdf43", "pop223", "tr14223", "big223"];

impl Origin {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("origin");
        fs::create_dir_all(&root).unwrap();
        let mut models = BTreeMap::new();
        let mut entries = vec![json!({
            "id": "rdf43", "name": "Regret Driven Framework V4 🗺️", "version": "v15",
            "series": "RDF Series", "released": "2025-01-01", "community_favorite": false,
        })];
        for (seed, id, chunk, gpu, fav, name, version) in [
            (1u64, "pop223", Some(CHUNK), false, true, "Pop 👀📡", "v16"),
            (2, "tr14223", None, false, false, "TR14 👀📡", "v8"),
            (3, "big223", Some(CHUNK), true, false, "Big Chestnut", "v16"),
        ] {
            let bytes = artifact_bytes(seed, 2 * CHUNK + 1000 * seed as usize);
            let p = publish_model(&root, "v25", id, &bytes, chunk);
            let mut e = json!({
                "id": id, "name": name, "version": version, "series": "Test Series",
                "released": "2025-06-01", "community_favorite": fav,
                "artifact_format": "tinygrad_single_v1", "artifact_size": p.size,
                "artifact_sha256": p.sha256, "artifact_chunk_count": p.chunk_count,
                "uses_external_gpu": gpu,
            });
            if gpu {
                e["artifact_urls"] = json!({
                    format!("{id}_driving_tinygrad.pkl"): format!("https://example.invalid/{id}")
                });
            }
            entries.push(e);
            models.insert(id, Published { sha256: p.sha256 });
        }
        let manifest = json!({"generation": "v25", "models": entries});
        write_manifest(
            &root,
            "v25",
            serde_json::to_string_pretty(&manifest).unwrap().as_bytes(),
        );
        let server = FaultServer::start(&root).unwrap();
        Origin {
            dir,
            server,
            models,
            manifest,
        }
    }

    /// Publish other bytes under an existing id (same generation): artifacts first, then the
    /// manifest, as the release tools do.
    pub fn republish(&mut self, id: &'static str, seed: u64) {
        let root = self.dir.path().join("origin");
        let bytes = artifact_bytes(seed, 2 * CHUNK + 777);
        let chunk = (id != "tr14223").then_some(CHUNK);
        let p = publish_model(&root, "v25", id, &bytes, chunk);
        for e in self.manifest["models"].as_array_mut().unwrap() {
            if e["id"] == id {
                e["artifact_size"] = json!(p.size);
                e["artifact_sha256"] = json!(p.sha256);
                e["artifact_chunk_count"] = json!(p.chunk_count);
            }
        }
        write_manifest(
            &root,
            "v25",
            serde_json::to_string_pretty(&self.manifest)
                .unwrap()
                .as_bytes(),
        );
        self.models.insert(id, Published { sha256: p.sha256 });
    }

    /// Both origins answer 404 for every file of `id`.
    pub fn refuse(&self, id: &str) {
        use test_support::http_server::Fault;
        self.server
            .add_fault(&format!("/hf/models/v25/{id}/*"), Fault::Status(404), None);
        self.server
            .add_fault(&format!("/gh/v25/{id}/*"), Fault::Status(404), None);
    }

    /// Neither origin serves a manifest (the device is offline, as far as it can tell).
    pub fn no_manifest(&self) {
        use test_support::http_server::Fault;
        self.server
            .add_fault("/hf/manifests/*", Fault::Status(503), None);
        self.server
            .add_fault("/gh/model_names_v25.json", Fault::Status(503), None);
    }

    pub fn downloader(&self) -> Downloader {
        Downloader::new(
            Origins::new(
                &format!("{}/{HF_DIR}", self.server.url()),
                &format!("{}/{GH_DIR}", self.server.url()),
            ),
            DownloadConfig {
                space_margin: 0,
                max_attempts: 2,
                backoff_base: std::time::Duration::from_millis(5),
                backoff_max: std::time::Duration::from_millis(20),
                ..DownloadConfig::default()
            },
        )
    }

    pub fn sha(&self, id: &str) -> &str {
        &self.models[id].sha256
    }

    /// A v24 device with `params`, refreshed once against this origin.
    pub fn refreshed(&self, params: &[(&str, &str)]) -> Fixture {
        let f = Fixture::v24(params);
        refresh(&f.device(), &self.downloader()).unwrap();
        f
    }
}

/// A refresh now, not cancelled, its progress ignored.
pub fn refresh(device: &Device, dl: &Downloader) -> migration::Result<RefreshReport> {
    migration::refresh(device, &migration::Run::new(dl))
}

/// A data dir (plus built-in dir and memory params) as the Python manager leaves a v24 device.
pub struct Fixture {
    pub dir: tempfile::TempDir,
}

pub const LOCAL_MINE: &[u8] = b"local-mine bytes, compiled on the device";
pub const LOCAL_BARE: &[u8] = b"local-bare_model bytes";

/// Old files every fixture starts with.
pub const V24_FILES: [&str; 14] = [
    "pop223_driving_tinygrad.pkl.chunk01of02",
    "pop223_driving_tinygrad.pkl.chunk02of02",
    "pop223_driving_tinygrad.pkl.chunkmanifest",
    "tr14223_driving_tinygrad.pkl",
    "tr14223_driving_tinygrad.pkl.p00",
    "tr14223_driving_tinygrad.pkl.sha256",
    "big223_driving_tinygrad.pkl",
    "big223_driving_chestnut_tinygrad.pkl",
    "gone223_driving_tinygrad.pkl",
    "driving_vision_tinygrad.pkl",
    "driving_off_policy_tinygrad.pkl.p00",
    "dmonitoring_model_tinygrad.pkl",
    "tmpk3j4h5",
    "notes.txt",
];

impl Fixture {
    /// A v24 device: old artifacts in every form, two local models (`local-mine` with a
    /// sidecar, `local-bare_model` without), stale v24 caches, `ModelManifestVersion=v24`, and
    /// the given params.
    pub fn v24(params: &[(&str, &str)]) -> Self {
        let f = Fixture { dir: scratch() };
        let m = f.models();
        fs::create_dir_all(&m).unwrap();
        for name in V24_FILES {
            let body: &[u8] = if name.ends_with(".chunkmanifest") {
                b"2"
            } else {
                b"v24 bytes"
            };
            fs::write(m.join(name), body).unwrap();
        }
        fs::write(m.join("local-mine_driving_tinygrad.pkl"), LOCAL_MINE).unwrap();
        fs::write(
            m.join("local-mine.json"),
            r#"{"name": "Mine, tuned", "version": "v16", "uses_external_gpu": false}"#,
        )
        .unwrap();
        fs::write(m.join("local-bare_model_driving_tinygrad.pkl"), LOCAL_BARE).unwrap();
        fs::write(
            m.join(".model_versions.json"),
            r#"{"pop223": "v7", "gone223": "v9", "tr14223": "v8"}"#,
        )
        .unwrap();
        fs::write(
            m.join(".model_artifacts.json"),
            r#"{"pop223": {"artifact_sha256": "00", "artifact_size": 9, "uses_external_gpu": false},
                "gone223": {"artifact_sha256": "11", "artifact_size": 9, "uses_external_gpu": true}}"#,
        )
        .unwrap();
        fs::write(
            m.join(".model_artifact_urls.json"),
            r#"{"gone223": {"gone223_driving_tinygrad.pkl": "https://example.invalid/v24/gone223"}}"#,
        )
        .unwrap();
        fs::create_dir_all(f.builtin()).unwrap();
        fs::write(
            f.builtin().join("driving_tinygrad.pkl.chunk01of01"),
            b"builtin",
        )
        .unwrap();
        fs::write(f.builtin().join("driving_tinygrad.pkl.chunkmanifest"), b"1").unwrap();
        f.set("ModelManifestVersion", "v24");
        f.set("AvailableModels", "pop223,tr14223,big223,gone223");
        for (k, v) in params {
            f.set(k, v);
        }
        f
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }
    pub fn models(&self) -> PathBuf {
        self.data().join("models")
    }
    pub fn builtin(&self) -> PathBuf {
        self.dir.path().join("builtin")
    }

    pub fn set(&self, key: &str, value: &str) {
        let d = self.data().join("params/d");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(key), value).unwrap();
    }

    pub fn param(&self, key: &str) -> Option<String> {
        fs::read_to_string(self.data().join("params/d").join(key)).ok()
    }

    pub fn device(&self) -> Device {
        self.device_with(Effects::none())
    }

    pub fn device_with(&self, effects: Effects) -> Device {
        let mut d = Device::with_effects(
            DeviceConfig {
                data_dir: self.data(),
                memory_params_dir: self.dir.path().join("shm"),
                builtin_dir: self.builtin(),
                generation: V25,
            },
            effects,
        );
        // The fixture's own sysfs: no Chestnut until [`Fixture::plug_chestnut`].
        d.sysfs_root = self.sysfs();
        d
    }

    pub fn sysfs(&self) -> PathBuf {
        self.dir.path().join("sys")
    }

    /// A Chestnut with its firmware ready, as upstream's ready-check sees it in sysfs.
    pub fn plug_chestnut(&self) {
        let d = self.sysfs().join("bus/usb/devices/2-1");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("idVendor"), "add1\n").unwrap();
        fs::write(d.join("idProduct"), "0001\n").unwrap();
        fs::write(d.join("product"), "custom ed4e39b7-CLEAN\n").unwrap();
    }

    /// Everything a refresh's outcome consists of: every persistent param, and every file of
    /// the models dir with its SHA-256, except the verification cache (keyed by inode and
    /// times, so it differs between equal states) and the lock file.
    pub fn snapshot(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for dir in [self.data().join("params/d"), self.models()] {
            let Ok(rd) = fs::read_dir(&dir) else { continue };
            for e in rd {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                if name == ".verified.json" || name == ".manager.lock" {
                    continue;
                }
                let key = format!("{}/{name}", dir.file_name().unwrap().to_string_lossy());
                if e.file_type().unwrap().is_dir() {
                    // The downloader's staging directory: what is left in it counts too.
                    let mut inside: Vec<String> = fs::read_dir(e.path())
                        .unwrap()
                        .map(|x| x.unwrap().file_name().to_string_lossy().into_owned())
                        .collect();
                    inside.sort();
                    out.insert(format!("{key}/"), inside.join(","));
                    continue;
                }
                let body = fs::read(e.path()).unwrap();
                let value = match String::from_utf8(body.clone()) {
                    Ok(s) if s.len() < 4096 => s,
                    _ => test_support::published::sha256_hex(&body),
                };
                out.insert(key, value);
            }
        }
        out
    }
}

/// A scratch dir on tmpfs when there is one: the manager fsyncs every param and file, and the
/// crash enumeration runs hundreds of refreshes; on tmpfs an fsync costs nothing, and the code
/// paths are the same.
pub fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::tempdir_in(shm)
    {
        return d;
    }
    tempfile::tempdir().unwrap()
}

pub fn sha_of(path: &Path) -> Option<String> {
    fs::read(path)
        .ok()
        .map(|b| test_support::published::sha256_hex(&b))
}

/// One daemon poll with the default config, its outlets the UI only: the request served, if
/// any, and its last progress.
pub fn poll_once(
    device: &Device,
    dl: &Downloader,
) -> migration::Result<Option<(migration::run::daemon::Request, migration::Progress)>> {
    use migration::run::daemon::{DaemonConfig, Outlets, Served, poll};
    let stopping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let out = Outlets {
        log: &|_| {},
        terminal: None,
    };
    let served = poll(device, dl, &stopping, &DaemonConfig::default(), out)?;
    Ok(served.map(|(r, s)| match s {
        Served::Finished(p)
        | Served::Kept { progress: p, .. }
        | Served::Failed { progress: p, .. } => (r, p),
    }))
}

/// An openpilot tree for `migration::report::status` (the binary's is read from the tree).
pub fn tree() -> migration::state::tree::TreeStatus {
    migration::state::tree::TreeStatus {
        openpilot_dir: PathBuf::from("/data/openpilot"),
        tinygrad_commit: None,
        generation: None,
        state: "known",
        problem: None,
        next: None,
    }
}
