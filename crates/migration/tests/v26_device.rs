//! A device whose openpilot tree declares upstream's v26 contract (and a made-up v27 with the
//! same contract): what our manager writes is judged by the independent checker
//! (`upstream_v26`), which reads the data dir the way upstream's v26 manager and modeld do.

use std::fs;
use std::path::{Path, PathBuf};

use downloader::{CancelToken, DownloadConfig, Target};
use manifest::contract::ContractName;
use migration::run::open::{self, Opened, Options};
use migration::state::layout::{DownloadJob, JobState, Variant};
use migration::{Device, state::params::keys};
use serde_json::{Value, json};
use test_support::http_server::FaultServer;
use test_support::published::{GH_DIR, HF_DIR, artifact_bytes, publish_model, write_manifest};

use crate::upstream_v26::{BUNDLED, Runtime, contract_manifest, declare_tree, python_dump};

const COMPILER: &str = crate::upstream_v26::COMPILER_REVISION;
const CHUNK: usize = 64 * 1024;

/// The reviewed rows the tree declares.
fn rows() -> Value {
    json!([
        {"id": "sc2", "name": "SC2", "version": "v9"},
        {"id": "pop223", "name": "Pop", "version": "v16", "model_lab_eligible": true},
        {"id": "big223", "name": "Big", "version": "v16", "uses_external_gpu": true},
    ])
}

pub struct V26 {
    pub dir: tempfile::TempDir,
    generation: String,
    server: FaultServer,
    /// The served manifest, raw.
    manifest: Vec<u8>,
    /// id → (sha, size, chunk count).
    published: Vec<(String, String, u64, u32)>,
}

impl V26 {
    /// A tree declaring `generation` on upstream's contract, and an origin serving a manifest
    /// of that contract with `pop223` (a plain file) and `sc2` (a chunk set).
    pub fn start(generation: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let rows = rows();
        let rows = rows.as_array().unwrap();
        let rt = declare_tree(&dir.path().join("op"), generation, COMPILER, rows);
        fs::create_dir_all(dir.path().join("data/params/d")).unwrap();
        fs::create_dir_all(dir.path().join("shm")).unwrap();
        let origin = dir.path().join("origin");
        let models: Vec<_> = [(7u64, "pop223", None), (8, "sc2", Some(CHUNK))]
            .into_iter()
            .map(|(seed, id, chunk)| {
                let bytes = artifact_bytes(seed, 2 * CHUNK + 333 * seed as usize);
                publish_model(&origin, generation, id, &bytes, chunk)
            })
            .collect();
        let manifest = contract_manifest(&rt, rows, &models);
        let published = models
            .into_iter()
            .map(|p| (p.id, p.sha256, p.size, p.chunk_count))
            .collect();
        write_manifest(&origin, generation, &manifest);
        let server = FaultServer::start(&origin).unwrap();
        V26 {
            dir,
            generation: generation.to_string(),
            server,
            manifest,
            published,
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn root(&self) -> PathBuf {
        self.data().join("models").join(&self.generation)
    }

    pub fn runtime(&self) -> Runtime {
        Runtime::of_tree(&self.dir.path().join("op"), &self.generation, COMPILER)
    }

    fn options(&self) -> Options {
        Options {
            data_dir: self.data(),
            memory_params_dir: self.dir.path().join("shm"),
            builtin_dir: Some(self.dir.path().join("builtin")),
            openpilot_dir: self.dir.path().join("op"),
            generation: None,
            sysfs_root: self.dir.path().join("sys"),
            hf_base: format!("{}/{HF_DIR}", self.server.url()),
            github_base: format!("{}/{GH_DIR}", self.server.url()),
            download: DownloadConfig {
                space_margin: 0,
                max_attempts: 2,
                backoff_base: std::time::Duration::from_millis(5),
                backoff_max: std::time::Duration::from_millis(20),
                ..DownloadConfig::default()
            },
            trusted_keys: None,
            shm_dir: Some(self.dir.path().join("receipt-shm")),
            openpilot_prefix: None,
        }
    }

    /// The device as the binary opens it: the tree decides generation and contract.
    fn open(&self) -> (Device, downloader::Downloader) {
        let Ok(Opened::Ready(r)) = open::open(&self.options()) else {
            panic!("the declaring tree did not open")
        };
        assert_eq!(r.device.contract().name, ContractName::V26);
        assert_eq!(r.device.config.generation.to_string(), self.generation);
        (r.device, r.dl)
    }

    fn target(&self, id: &str) -> Target {
        let (_, sha, size, chunks) = self.published.iter().find(|p| p.0 == id).unwrap();
        let name: manifest::FileName = format!("{id}_driving_tinygrad.pkl").parse().unwrap();
        Target {
            id: id.parse().unwrap(),
            remote_name: name.clone(),
            local_name: name,
            size: Some(*size),
            sha256: Some(sha.parse().unwrap()),
            chunk_count: Some(*chunks),
            chunk_sha256: None,
        }
    }

    pub fn sha(&self, id: &str) -> String {
        self.published.iter().find(|p| p.0 == id).unwrap().1.clone()
    }
}

/// Every file under `dir` with its bytes (lock files included: they stay empty).
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                out.push((p.clone(), fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// A v25 device (its selection and profiles in the params) moves to a v26-contract tree: the
/// choice is carried into `preferences.json`, the accepted manifest is given to upstream as
/// `catalog.json`, the selected model is downloaded into `<gen>/<id>/` under a job upstream
/// reads; upstream's own reading then resolves our install as its own. v26 and a made-up v27.
#[test]
fn a_moved_v25_device_resolves_as_upstream_resolves_it() {
    for generation in ["v26", "v27"] {
        let v = V26::start(generation);
        let params = v.data().join("params/d");
        for (k, val) in [
            (keys::MODEL, "pop223"),
            (keys::DRIVING_MODEL, "pop223"),
            (keys::ACTIVE_BIG_MODEL, "none"),
            (keys::USER_FAVORITES, "sc2,pop223,gone1"),
            (keys::MODEL_SORT_MODE, "series"),
        ] {
            fs::write(params.join(k), val).unwrap();
        }
        let (device, dl) = v.open();
        let rt = v.runtime();
        let root = v.root();
        // Before: upstream sees nothing of ours and resolves the bundled model.
        assert_eq!(rt.resolve_runtime(&root, false).small_id, BUNDLED);

        let carried = device
            .carry_choice(ContractName::V25.contract())
            .unwrap()
            .unwrap();
        device.publish_catalog(&v.manifest).unwrap();
        let cancel = CancelToken::new();
        let installed =
            migration::install_target(&device, &dl, &v.target("pop223"), "Pop", &cancel, &|_| {})
                .unwrap();
        assert!(installed.is_some(), "{generation}: fetched");

        // What upstream reads, read as upstream reads it.
        let prefs = rt.preferences(&root);
        assert_eq!(prefs.small, "pop223", "{generation}");
        assert_eq!(prefs.big, "", "{generation}: big disabled stays disabled");
        assert_eq!(prefs.user_favorites, ["sc2", "pop223"]);
        assert_eq!(prefs.sort_mode, "series");
        assert_eq!(carried.small, prefs.small);
        let entries = rt.catalog(&root);
        assert_eq!(
            entries["pop223"]["artifact_sha256"],
            json!(v.sha("pop223")),
            "{generation}: the live manifest is accepted"
        );
        let sel = rt.resolve_runtime(&root, false);
        assert_eq!(sel.small_id, "pop223", "{generation}");
        assert_eq!(
            sel.small_path,
            Some(root.join("pop223/pop223_driving_tinygrad.pkl"))
        );
        assert_eq!(sel.small_sha.as_deref(), Some(v.sha("pop223").as_str()));
        // Byte for byte as upstream writes its state files.
        let manifest: Value = serde_json::from_slice(&v.manifest).unwrap();
        assert_eq!(
            fs::read_to_string(root.join("catalog.json")).unwrap(),
            python_dump(&manifest)
        );
        let saved: Value =
            serde_json::from_slice(&fs::read(root.join("preferences.json")).unwrap()).unwrap();
        assert_eq!(
            fs::read_to_string(root.join("preferences.json")).unwrap(),
            python_dump(&saved)
        );
        let job = rt.read_job(&root).expect("a job file upstream accepts");
        assert_eq!(job["state"], "completed", "{generation}: {job:?}");
        assert_eq!(
            (&job["model"], &job["downloadAll"]),
            (&json!(""), &json!(false))
        );
        assert_eq!(
            fs::read_to_string(root.join(".download-job.json")).unwrap(),
            python_dump(&Value::Object(job.clone()))
        );
        // Nothing of the v26 root is left behind but upstream's own files.
        let mut names: Vec<String> = fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                ".download-job.json",
                ".download.lock",
                ".state.lock",
                "catalog.json",
                "pop223",
                "preferences.json"
            ]
        );
        let in_model_dir: Vec<String> = fs::read_dir(root.join("pop223"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(
            in_model_dir,
            ["pop223_driving_tinygrad.pkl"],
            "{generation}"
        );
        // The chunk set downloads into its own directory too.
        migration::install_target(&device, &dl, &v.target("sc2"), "SC2", &cancel, &|_| {})
            .unwrap()
            .unwrap();
        assert!(crate::upstream_v26::Runtime::verified_artifact(&root, "sc2", &entries).is_some());
    }
}

/// A device as upstream's v26 manager leaves it: its selection, a verified install, a job
/// another process is running. Our manager reads the selection, fetches nothing upstream
/// verified, refuses to start a second job, and changes no byte; once the other process is
/// gone its running job reads as interrupted, rewritten in upstream's format.
#[test]
fn a_device_upstream_prepared_is_read_not_rewritten() {
    for generation in ["v26", "v27"] {
        let v = V26::start(generation);
        let root = v.root();
        fs::create_dir_all(root.join("pop223")).unwrap();
        let origin_file = v.dir.path().join(format!(
            "origin/{HF_DIR}/models/{generation}/pop223/pop223_driving_tinygrad.pkl"
        ));
        fs::copy(
            &origin_file,
            root.join("pop223/pop223_driving_tinygrad.pkl"),
        )
        .unwrap();
        let manifest: Value = serde_json::from_slice(&v.manifest).unwrap();
        fs::write(root.join("catalog.json"), python_dump(&manifest)).unwrap();
        let prefs = json!({"small": "pop223", "big": BUNDLED, "userFavorites": ["sc2"],
            "sortMode": "date", "randomizer": false, "blacklistedModels": []});
        fs::write(root.join("preferences.json"), python_dump(&prefs)).unwrap();
        let job = json!({"schemaVersion": 1, "jobId": "0123456789abcdef0123456789abcdef",
            "state": "running", "model": "sc2", "progress": "SC2: 40%", "downloadAll": false,
            "cancelRequested": false, "variant": "standard"});
        fs::write(root.join(".download-job.json"), python_dump(&job)).unwrap();
        // The other manager: its own open file description holding the download lock.
        let other = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(root.join(".download.lock"))
            .unwrap();
        other.lock().unwrap();
        fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(root.join(".state.lock"))
            .unwrap();
        let before = snapshot(&root);

        let (device, dl) = v.open();
        let files = device.files();
        // Our manager reads upstream's selection.
        let read = files.read_preferences().unwrap();
        assert_eq!(
            (read.small.as_str(), read.sort_mode.as_str()),
            ("pop223", "date")
        );
        assert_eq!(
            device
                .carry_choice(ContractName::V25.contract())
                .unwrap()
                .unwrap(),
            read,
            "the user's v26 choice is kept, not replaced by the v25 params"
        );
        // Their job is seen, running.
        let status = files.job_status().unwrap();
        assert!(status.downloading);
        assert_eq!(status.job.as_ref().unwrap().state, JobState::Running);
        // A second job is refused: another manager is downloading.
        let e = DownloadJob::start(&files, "sc2", Variant::Standard, false, "x").unwrap_err();
        assert!(matches!(e, migration::Error::Busy { .. }), "{e}");
        // What upstream verified is not fetched again.
        let requests = v.server.requests().len();
        let r = migration::install_target(
            &device,
            &dl,
            &v.target("pop223"),
            "Pop",
            &CancelToken::new(),
            &|_| {},
        )
        .unwrap();
        assert!(r.is_none(), "{generation}: kept");
        assert_eq!(v.server.requests().len(), requests, "nothing requested");
        device.publish_catalog(&v.manifest).unwrap();
        assert_eq!(snapshot(&root), before, "{generation}: no byte changed");

        // The other process is gone: its job reads as interrupted, as upstream reads it.
        drop(other);
        let status = files.job_status().unwrap();
        assert!(!status.downloading);
        let job = v.runtime().read_job(&root).unwrap();
        assert_eq!(job["state"], "interrupted");
        assert_eq!(job["jobId"], "0123456789abcdef0123456789abcdef");
        assert_eq!(job["progress"], migration::state::layout::INTERRUPTED);
        assert_eq!(
            status.job.unwrap().state,
            JobState::Interrupted,
            "{generation}"
        );
    }
}

/// Upstream's UI cancels our job by setting `cancelRequested` on the job file: the running
/// download stops, the job ends `failed`, and the download lock is free again.
#[test]
fn a_cancel_set_by_another_process_stops_our_job() {
    let v = V26::start("v26");
    let (device, _) = v.open();
    let files = device.files();
    let root = v.root();
    let seen = std::sync::atomic::AtomicBool::new(false);
    let r: migration::Result<()> = files.under_job(
        "sc2",
        Variant::Standard,
        false,
        &CancelToken::new(),
        |cancel, publish| {
            publish("SC2: 10%");
            let job = v.runtime().read_job(&root).unwrap();
            assert_eq!(
                (&job["state"], &job["progress"]),
                (&json!("running"), &json!("SC2: 10%"))
            );
            // Upstream's cancel action: set the flag on the job it sees, atomically.
            let mut job = Value::Object(job);
            job["cancelRequested"] = json!(true);
            let tmp = root.join(".model-cancel");
            fs::write(&tmp, python_dump(&job)).unwrap();
            fs::rename(&tmp, root.join(".download-job.json")).unwrap();
            let start = std::time::Instant::now();
            while !cancel.is_cancelled() {
                assert!(
                    start.elapsed() < std::time::Duration::from_secs(5),
                    "not seen"
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            seen.store(true, std::sync::atomic::Ordering::SeqCst);
            Err(downloader::Error::Cancelled {
                model: "sc2".into(),
            }
            .into())
        },
    );
    assert!(r.is_err() && seen.into_inner());
    let job = v.runtime().read_job(&root).unwrap();
    assert_eq!(job["state"], "failed");
    assert!(!files.job_status().unwrap().downloading, "the lock is free");
    DownloadJob::start(&files, "", Variant::Standard, true, "Starting download")
        .unwrap()
        .finish(false, "Downloaded!")
        .unwrap();
    assert_eq!(v.runtime().read_job(&root).unwrap()["state"], "completed");
}

/// The whole move, run as the daemon and `refresh` run it: a v25 device (its selection, a v25
/// artifact of it, a local model, a DM file) whose tree now declares the v26 contract. The
/// refresh accepts the v26 manifest (whole-manifest rules), carries the choice into
/// `preferences.json`, downloads the selected model into `<gen>/<id>/`, and only then removes
/// the v25 driving artifacts; upstream's reading resolves our install as its own. A manifest
/// the contract refuses on the first origin is refused whole and GitHub's copy is taken.
#[test]
fn refresh_moves_a_v25_device_to_the_v26_contract() {
    for generation in ["v26", "v27"] {
        let v = V26::start(generation);
        let models = v.data().join("models");
        fs::create_dir_all(&models).unwrap();
        for (name, body) in [
            ("pop223_driving_tinygrad.pkl", "v25 bytes"),
            ("sc2_driving_tinygrad.pkl.chunk01of01", "v25 chunk"),
            ("local-mine_driving_tinygrad.pkl", "local"),
            ("dmonitoring_model_tinygrad.pkl", "dm"),
        ] {
            fs::write(models.join(name), body).unwrap();
        }
        let params = v.data().join("params/d");
        for (k, val) in [
            (keys::MODEL, "pop223"),
            (keys::DRIVING_MODEL, "pop223"),
            (keys::MODEL_MANIFEST_VERSION, "v25"),
            (keys::BLACKLISTED_MODELS, "sc2"),
        ] {
            fs::write(params.join(k), val).unwrap();
        }
        // The Hub serves a manifest upstream refuses (a behaviour version changed).
        let bad = String::from_utf8(v.manifest.clone())
            .unwrap()
            .replace("\"v16\"", "\"v15\"");
        let hf_manifest = v.dir.path().join(format!(
            "origin/{HF_DIR}/manifests/model_names_{generation}.json"
        ));
        fs::write(&hf_manifest, bad).unwrap();

        let (device, dl) = v.open();
        let report = migration::refresh(&device, &migration::Run::new(&dl)).unwrap();
        assert_eq!(report.migrated_from.as_deref(), Some("v25"), "{generation}");
        assert!(
            report.manifest_origin.contains("github") || report.manifest_origin.contains(GH_DIR),
            "{generation}: {}",
            report.manifest_origin
        );
        // Upstream's reading of what we left.
        let rt = v.runtime();
        let root = v.root();
        let sel = rt.resolve_runtime(&root, false);
        assert_eq!(sel.small_id, "pop223", "{generation}");
        assert_eq!(sel.small_sha.as_deref(), Some(v.sha("pop223").as_str()));
        let prefs = rt.preferences(&root);
        assert_eq!(prefs.blacklisted, ["sc2"]);
        // The v25 driving artifacts are gone; local models and DM files stay.
        let mut left: Vec<String> = fs::read_dir(&models)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains("driving") || n.starts_with("dmonitoring"))
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "dmonitoring_model_tinygrad.pkl",
                "local-mine_driving_tinygrad.pkl"
            ],
            "{generation}"
        );
        assert_eq!(
            fs::read_to_string(params.join(keys::MODEL_MANIFEST_VERSION)).unwrap(),
            generation
        );
        assert!(!models.join(migration::JOURNAL_FILE).exists());
        // Download all: every model of the v26 catalog, each where upstream verifies it.
        migration::download_all(&device, &dl, &CancelToken::new(), &|_, _| {}, &|_| {}).unwrap();
        let entries = rt.catalog(&root);
        for id in ["pop223", "sc2"] {
            assert!(
                crate::upstream_v26::Runtime::verified_artifact(&root, id, &entries).is_some(),
                "{generation}: {id}"
            );
        }
        // A second refresh changes nothing upstream reads.
        let before = snapshot(&root);
        migration::refresh(&device, &migration::Run::new(&dl)).unwrap();
        let after: Vec<_> = snapshot(&root)
            .into_iter()
            .filter(|(p, _)| !p.ends_with(".download-job.json"))
            .collect();
        let before: Vec<_> = before
            .into_iter()
            .filter(|(p, _)| !p.ends_with(".download-job.json"))
            .collect();
        assert_eq!(after, before, "{generation}");
    }
}

/// A v25 device of its own (data and memory params in `dir`) for the shared tree and origin:
/// `pop223` selected, its v25 artifact, a chunk of another, a local model, a DM file.
pub fn v25_device_in(dir: &Path) {
    let models = dir.join("data/models");
    fs::create_dir_all(&models).unwrap();
    fs::create_dir_all(dir.join("shm")).unwrap();
    for (name, body) in [
        ("pop223_driving_tinygrad.pkl", "v25 bytes"),
        ("sc2_driving_tinygrad.pkl.chunk01of01", "v25 chunk"),
        ("local-mine_driving_tinygrad.pkl", "local"),
        ("dmonitoring_model_tinygrad.pkl", "dm"),
    ] {
        fs::write(models.join(name), body).unwrap();
    }
    let params = dir.join("data/params/d");
    fs::create_dir_all(&params).unwrap();
    for (k, val) in [
        (keys::MODEL, "pop223"),
        (keys::DRIVING_MODEL, "pop223"),
        (keys::ACTIVE_SMALL_MODEL, "pop223"),
        (keys::MODEL_MANIFEST_VERSION, "v25"),
        (keys::USER_FAVORITES, "sc2"),
    ] {
        fs::write(params.join(k), val).unwrap();
    }
}

impl V26 {
    /// The device in `dir` as the binary opens it, its durable effects going to `effects`.
    pub fn device_in(
        &self,
        dir: &Path,
        effects: migration::Effects,
    ) -> (Device, downloader::Downloader) {
        let o = Options {
            data_dir: dir.join("data"),
            memory_params_dir: dir.join("shm"),
            ..self.options()
        };
        let Ok(Opened::Ready(r)) = open::open(&o) else {
            panic!("not opened")
        };
        let declared = migration::state::tree::read(&o.openpilot_dir)
            .declaration
            .unwrap()
            .unwrap();
        let mut d = Device::with_effects(r.device.config.clone(), effects)
            .with_contract(r.device.contract())
            .with_declaration(Some(declared));
        d.sysfs_root = r.device.sysfs_root.clone();
        d.load_receipt = r.device.load_receipt.clone();
        (d, r.dl)
    }
}

/// Every file of the data dir with its bytes, but the verification cache and the manager
/// lock (inode and times) and the job file's random id.
pub fn data_snapshot(dir: &Path) -> Vec<(PathBuf, String)> {
    snapshot(&dir.join("data"))
        .into_iter()
        .filter(|(p, _)| !p.ends_with(".verified.json") && !p.ends_with(".manager.lock"))
        .map(|(p, b)| {
            let text = String::from_utf8_lossy(&b).into_owned();
            let shown = if p.ends_with(".download-job.json") {
                let j: Value = serde_json::from_str(&text).unwrap();
                format!("{} {}", j["state"], j["model"])
            } else if b.len() > 4096 {
                format!("{} bytes", b.len())
            } else {
                text
            };
            (p.strip_prefix(dir).unwrap().to_path_buf(), shown)
        })
        .collect()
}

/// Our refresh on a device upstream's v26 manager prepared (its catalog, its selection, its
/// verified install, a job another process is running) while the old v25 params name another
/// model: the selection is upstream's, nothing is downloaded (only the manifest is asked for),
/// and no byte upstream wrote changes. v26 and a made-up v27.
#[test]
fn a_refresh_on_an_upstream_prepared_device_takes_its_selection_and_fetches_nothing() {
    for generation in ["v26", "v27"] {
        let v = V26::start(generation);
        let root = v.root();
        fs::create_dir_all(root.join("pop223")).unwrap();
        let served = v.dir.path().join(format!(
            "origin/{HF_DIR}/models/{generation}/pop223/pop223_driving_tinygrad.pkl"
        ));
        fs::copy(&served, root.join("pop223/pop223_driving_tinygrad.pkl")).unwrap();
        let manifest: Value = serde_json::from_slice(&v.manifest).unwrap();
        fs::write(root.join("catalog.json"), python_dump(&manifest)).unwrap();
        let prefs = json!({"small": "pop223", "big": "", "userFavorites": [],
            "sortMode": "name", "randomizer": false, "blacklistedModels": ["sc2"]});
        fs::write(root.join("preferences.json"), python_dump(&prefs)).unwrap();
        let job = json!({"schemaVersion": 1, "jobId": "fedcba9876543210fedcba9876543210",
            "state": "running", "model": "big223", "progress": "Big: 3%", "downloadAll": false,
            "cancelRequested": false, "variant": "standard"});
        fs::write(root.join(".download-job.json"), python_dump(&job)).unwrap();
        let other = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(root.join(".download.lock"))
            .unwrap();
        other.lock().unwrap();
        fs::write(root.join(".state.lock"), "").unwrap();
        let params = v.data().join("params/d");
        for (k, val) in [
            (keys::MODEL, "sc2"),
            (keys::DRIVING_MODEL, "sc2"),
            (keys::MODEL_MANIFEST_VERSION, "v25"),
        ] {
            fs::write(params.join(k), val).unwrap();
        }
        let before = snapshot(&root);

        let (device, dl) = v.open();
        let report = migration::refresh(&device, &migration::Run::new(&dl)).unwrap();
        assert_eq!(
            report.selected.as_str(),
            "pop223",
            "{generation}: upstream's selection"
        );
        let fetched: Vec<String> = v
            .server
            .requests()
            .iter()
            .map(|r| r.path.clone())
            .filter(|p| p.contains("/models/"))
            .collect();
        assert!(fetched.is_empty(), "{generation}: fetched {fetched:?}");
        assert_eq!(
            snapshot(&root),
            before,
            "{generation}: a byte upstream wrote changed"
        );
        let sel = v.runtime().resolve_runtime(&root, false);
        assert_eq!(sel.small_id, "pop223");
        drop(other);
    }
}

/// `resolve` and `status` (its `--json` is the report's serialization) on a per-generation
/// device answer from the layout's own files, as upstream's runtime resolver reads them: the
/// preferences' selection, its artifact under `<gen>/<id>/` verified against `catalog.json`,
/// else the built-in. The v25 params naming another model play no part. Each answer is
/// compared with the independent checker's `resolve_runtime`: a verified install, a damaged
/// one, a refused catalog, the bundled selection. v26 and v27.
#[test]
fn resolve_and_status_answer_what_upstream_loads() {
    for generation in ["v26", "v27"] {
        let v = V26::start(generation);
        let root = v.root();
        fs::create_dir_all(v.dir.path().join("builtin")).unwrap();
        fs::write(
            v.dir.path().join("builtin/driving_tinygrad.pkl"),
            b"built-in",
        )
        .unwrap();
        let builtin = v.dir.path().join("builtin/driving_tinygrad.pkl");
        // The v25 params name sc2; upstream's selection is pop223.
        let params = v.data().join("params/d");
        for k in [keys::MODEL, keys::DRIVING_MODEL] {
            fs::write(params.join(k), "sc2").unwrap();
        }
        fs::create_dir_all(root.join("pop223")).unwrap();
        let install = root.join("pop223/pop223_driving_tinygrad.pkl");
        fs::copy(
            v.dir.path().join(format!(
                "origin/{HF_DIR}/models/{generation}/pop223/pop223_driving_tinygrad.pkl"
            )),
            &install,
        )
        .unwrap();
        let manifest: Value = serde_json::from_slice(&v.manifest).unwrap();
        fs::write(root.join("catalog.json"), python_dump(&manifest)).unwrap();
        let prefs = |small: &str| {
            json!({"small": small, "big": "", "userFavorites": [], "sortMode": "name",
                "randomizer": false, "blacklistedModels": []})
        };
        fs::write(root.join("preferences.json"), python_dump(&prefs("pop223"))).unwrap();
        let rt = v.runtime();
        let (device, _) = v.open();

        // Each case: what upstream loads, and our answers.
        let check = |case: &str, want_id: &str, want_installed: bool| {
            let up = rt.resolve_runtime(&root, false);
            let r = migration::report::resolve(&device).unwrap();
            let s = migration::report::status(&device, crate::common::tree()).unwrap();
            let json: Value = serde_json::to_value(&s).unwrap();
            assert_eq!(
                up.small_path.clone().unwrap_or(builtin.clone()),
                r.path,
                "{generation} {case}"
            );
            assert_eq!(s.resolved, r.path, "{generation} {case}");
            assert_eq!(r.builtin, up.small_path.is_none(), "{generation} {case}");
            assert_eq!(up.small_id, want_id, "{generation} {case}: the checker");
            // `selected` is the user's choice as upstream reads it, loaded or not.
            let small = rt.preferences(&root).small;
            let ours = match small.as_str() {
                BUNDLED => migration::rules::contract::builtin_id().to_string(),
                id => id.to_string(),
            };
            assert_eq!(
                json["selected"]["id"],
                json!(ours),
                "{generation} {case}: {json}"
            );
            let verified = s
                .installed
                .iter()
                .any(|m| m.id == "pop223" && m.state == migration::VerifyState::Verified);
            assert_eq!(
                verified, want_installed,
                "{generation} {case}: {:?}",
                s.installed
            );
        };
        check("verified install", "pop223", true);
        assert_eq!(
            migration::report::resolve(&device).unwrap().model.name,
            "Pop",
            "named from the catalog"
        );

        // The bundled selection.
        fs::write(root.join("preferences.json"), python_dump(&prefs(BUNDLED))).unwrap();
        check("bundled selection", BUNDLED, true);
        fs::write(root.join("preferences.json"), python_dump(&prefs("pop223"))).unwrap();

        // A catalog upstream refuses whole (another compiler revision): nothing verifies.
        let mut refused = manifest.clone();
        refused["compiler_revision"] = json!("0".repeat(40));
        fs::write(root.join("catalog.json"), python_dump(&refused)).unwrap();
        check("refused catalog", BUNDLED, false);
        fs::write(root.join("catalog.json"), python_dump(&manifest)).unwrap();
        check("catalog back", "pop223", true);

        // Bytes modeld could not start here: it runs the bundled model, and `resolve` says so
        // (upstream's resolver would hand them over once more; the receipt names the fallback).
        migration::state::load_receipt::mark_bad(
            &device,
            &"pop223".parse().unwrap(),
            &v.sha("pop223").parse().unwrap(),
            "selected-load-failed",
            1,
        )
        .unwrap();
        let r = migration::report::resolve(&device).unwrap();
        assert_eq!(
            (r.path.clone(), r.builtin),
            (builtin.clone(), true),
            "{generation}"
        );
        fs::remove_file(
            v.data()
                .join("models")
                .join(migration::state::load_receipt::BAD_ARTIFACTS_FILE),
        )
        .unwrap();
        check("record gone", "pop223", true);

        // A damaged install (same size, one byte changed).
        let mut bytes = fs::read(&install).unwrap();
        bytes[10] ^= 1;
        fs::write(&install, &bytes).unwrap();
        check("damaged install", BUNDLED, false);
    }
}

/// Every file under `dir` whose name ends with `suffix`.
fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    snapshot(dir)
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect()
}

/// An origin as upstream publishes a v26 generation: chunk pieces `<artifact>.chunkNNofMM` with
/// no `.chunkmanifest` and no `.sha256` beside them (their count is the manifest's), and a
/// plain file for a count of 0. A device of that contract downloads both from the manifest's
/// count, size and SHA-256 alone, never asks for either file, and upstream's reader verifies
/// both installs. v26 and v27.
#[test]
fn a_v26_origin_without_chunk_manifests_or_sidecars_is_downloaded() {
    for generation in ["v26", "v27"] {
        let v = V26::start(generation);
        let origin = v.dir.path().join("origin");
        let extra: Vec<PathBuf> = [".chunkmanifest", ".sha256"]
            .iter()
            .flat_map(|s| files_ending(&origin, s))
            .collect();
        assert!(
            !extra.is_empty(),
            "the fixture publishes them to begin with"
        );
        for p in extra {
            fs::remove_file(p).unwrap();
        }
        let (device, dl) = v.open();
        let m = manifest::Manifest::from_slice(&v.manifest).unwrap();
        device.publish_catalog(&v.manifest).unwrap();
        let cancel = CancelToken::new();
        for (id, chunks) in [("sc2", 3), ("pop223", 0)] {
            let entry = m.get(&id.parse().unwrap()).unwrap();
            let target = dl.target(entry).unwrap();
            assert_eq!(target.chunk_count, Some(chunks), "{generation} {id}");
            migration::install_target(&device, &dl, &target, id, &cancel, &|_| {})
                .unwrap_or_else(|e| panic!("{generation} {id}: {e}"))
                .expect("fetched");
        }
        let asked: Vec<String> = v.server.requests().into_iter().map(|r| r.path).collect();
        assert!(
            !asked
                .iter()
                .any(|p| p.ends_with(".chunkmanifest") || p.ends_with(".sha256")),
            "{generation}: {asked:?}"
        );
        assert!(
            asked.iter().any(|p| p.contains(".chunk03of03")),
            "{generation}: the pieces were fetched: {asked:?}"
        );
        let root = v.root();
        let entries = v.runtime().catalog(&root);
        for id in ["sc2", "pop223"] {
            assert!(
                crate::upstream_v26::Runtime::verified_artifact(&root, id, &entries).is_some(),
                "{generation} {id}"
            );
        }
    }
}

/// `download <id> --dry-run` on a v26-contract device plans the artifact as that device fetches
/// it (the contract's artifact format, docs/device.md): a download before it is installed, then,
/// after the real download, the verified copy kept. Before, the dry run checked the entry against
/// v25's format and refused every v26 model ("no downloadable artifact") while the download itself
/// worked. v26 and a made-up v27.
#[test]
fn a_download_dry_run_on_a_v26_contract_device_plans_what_the_download_does() {
    use migration::run::downloads::Action;
    for generation in ["v26", "v27"] {
        let v = V26::start(generation);
        let t = tempfile::tempdir().unwrap();
        v25_device_in(t.path());
        let (device, dl) = v.device_in(t.path(), migration::Effects::none());
        migration::refresh(&device, &migration::Run::new(&dl)).unwrap();
        let root = t.path().join("data/models").join(generation);
        fs::remove_file(root.join("pop223/pop223_driving_tinygrad.pkl")).unwrap();
        let id: manifest::ModelId = "pop223".parse().unwrap();
        let plan = |label: &str| {
            let report = migration::run::preview::download(&device, &dl, Some(&id))
                .unwrap_or_else(|e| panic!("{generation} {label}: {e}"));
            assert_eq!(report.models.len(), 1, "{generation} {label}: {report:?}");
            report.models[0].action.clone()
        };
        match plan("before") {
            Action::Download { artifacts } => {
                let names: Vec<&str> = artifacts.iter().map(|a| a.name.as_str()).collect();
                assert_eq!(names, ["pop223_driving_tinygrad.pkl"], "{generation}");
            }
            other => panic!("{generation}: before the download: {other:?}"),
        }
        migration::download_model(&device, &dl, &id, &CancelToken::new(), &|_| {})
            .unwrap_or_else(|e| panic!("{generation}: {e}"));
        assert!(
            matches!(plan("after"), Action::Installed),
            "{generation}: after the download"
        );
    }
}

/// A device on a v26-contract generation (v26's own root: upstream's preferences, catalog and
/// installs) moves to a made-up v27 with the same contract: `v26/preferences.json` is carried
/// into `v27/preferences.json` as upstream reads it against v27's catalog (an id v27 does not
/// list reads as the bundled model and leaves the favourites), the selected v27 artifact is
/// downloaded, and only then are v26's driving artifacts removed (its other files, local
/// models and DM files stay). The v25 params name another model and play no part.
#[test]
fn a_move_between_v26_contract_generations_keeps_the_users_choice() {
    for (small, want) in [("sc2", "sc2"), ("old26", BUNDLED)] {
        let v = V26::start("v27");
        let models = v.data().join("models");
        let v26 = models.join("v26");
        for id in ["sc2", "old26", "pop223"] {
            fs::create_dir_all(v26.join(id)).unwrap();
            fs::write(
                v26.join(format!("{id}/{id}_driving_tinygrad.pkl")),
                format!("v26 {id}"),
            )
            .unwrap();
        }
        fs::write(v26.join("pop223/pop223_driving_amd_tinygrad.pkl"), "amd").unwrap();
        let prefs = json!({"small": small, "big": "", "userFavorites": ["old26", "pop223"],
            "sortMode": "date", "randomizer": true, "blacklistedModels": ["sc2", "old26"]});
        fs::write(v26.join("preferences.json"), python_dump(&prefs)).unwrap();
        fs::write(v26.join("catalog.json"), "{}").unwrap();
        for (name, body) in [
            ("local-mine_driving_tinygrad.pkl", "local"),
            ("dmonitoring_model_tinygrad.pkl", "dm"),
        ] {
            fs::write(models.join(name), body).unwrap();
        }
        let params = v.data().join("params/d");
        for (k, val) in [
            (keys::MODEL, "pop223"),
            (keys::DRIVING_MODEL, "pop223"),
            (keys::MODEL_MANIFEST_VERSION, "v26"),
        ] {
            fs::write(params.join(k), val).unwrap();
        }
        let (device, dl) = v.open();
        let report = migration::refresh(&device, &migration::Run::new(&dl)).unwrap();
        assert_eq!(report.migrated_from.as_deref(), Some("v26"), "{small}");

        let rt = v.runtime();
        let root = v.root();
        let p = rt.preferences(&root);
        assert_eq!(p.small, want, "{small}: carried as upstream reads it");
        assert_eq!(p.big, "");
        assert_eq!(p.user_favorites, ["pop223"]);
        assert_eq!(p.blacklisted, ["sc2"]);
        assert_eq!((p.sort_mode.as_str(), p.randomizer), ("date", true));
        let sel = rt.resolve_runtime(&root, false);
        assert_eq!(sel.small_id, want, "{small}: what v27's modeld loads");
        if want != BUNDLED {
            assert_eq!(sel.small_sha.as_deref(), Some(v.sha(want).as_str()));
        }
        // Our resolve agrees.
        let builtin = v.dir.path().join("builtin/driving_tinygrad.pkl");
        fs::create_dir_all(builtin.parent().unwrap()).unwrap();
        fs::write(&builtin, b"built-in").unwrap();
        let r = migration::report::resolve(&device).unwrap();
        assert_eq!(r.path, sel.small_path.clone().unwrap_or(builtin), "{small}");
        // v26's driving artifacts are gone; its other files, local models and DM files stay.
        let left: Vec<String> = snapshot(&v26)
            .into_iter()
            .map(|(p, _)| p.strip_prefix(&v26).unwrap().display().to_string())
            .collect();
        // (`.state.lock`: the preferences were read under v26's own lock, as upstream reads.)
        assert_eq!(
            left,
            [".state.lock", "catalog.json", "preferences.json"],
            "{small}"
        );
        assert!(models.join("local-mine_driving_tinygrad.pkl").exists());
        assert!(models.join("dmonitoring_model_tinygrad.pkl").exists());
        assert!(!models.join(migration::JOURNAL_FILE).exists());
        // The move is done: a second refresh changes nothing upstream reads in v27.
        let before: Vec<_> = snapshot(&root)
            .into_iter()
            .filter(|(p, _)| !p.ends_with(".download-job.json"))
            .collect();
        migration::refresh(&device, &migration::Run::new(&dl)).unwrap();
        let after: Vec<_> = snapshot(&root)
            .into_iter()
            .filter(|(p, _)| !p.ends_with(".download-job.json"))
            .collect();
        assert_eq!(after, before, "{small}");
    }
}

/// A device as a v26-contract v26 left it, for a move to the made-up v27: upstream's
/// preferences selecting `pop223` (the params name `sc2`), v26 installs of both, a local model
/// and a DM file.
pub fn v26_device_in(dir: &Path) {
    let models = dir.join("data/models");
    let v26 = models.join("v26");
    fs::create_dir_all(dir.join("shm")).unwrap();
    for id in ["pop223", "sc2"] {
        fs::create_dir_all(v26.join(id)).unwrap();
        fs::write(
            v26.join(format!("{id}/{id}_driving_tinygrad.pkl")),
            format!("v26 {id}"),
        )
        .unwrap();
    }
    let prefs = json!({"small": "pop223", "big": "", "userFavorites": ["sc2"],
        "sortMode": "name", "randomizer": false, "blacklistedModels": []});
    fs::write(v26.join("preferences.json"), python_dump(&prefs)).unwrap();
    for (name, body) in [
        ("local-mine_driving_tinygrad.pkl", "local"),
        ("dmonitoring_model_tinygrad.pkl", "dm"),
    ] {
        fs::write(models.join(name), body).unwrap();
    }
    let params = dir.join("data/params/d");
    fs::create_dir_all(&params).unwrap();
    for (k, val) in [
        (keys::MODEL, "sc2"),
        (keys::DRIVING_MODEL, "sc2"),
        (keys::MODEL_MANIFEST_VERSION, "v26"),
    ] {
        fs::write(params.join(k), val).unwrap();
    }
}

/// With the external GPU ready, a v26-contract device fetches a model's `amd` build beside
/// it, into `<gen>/<id>/<id>_driving_amd_tinygrad.pkl` where upstream looks for it, under a job
/// upstream reads as the `amd` variant's; without the GPU only the standard artifact. The
/// manifest with the variant is one upstream accepts. v26 and v27.
#[test]
fn the_amd_build_is_fetched_with_the_external_gpu() {
    for (generation, gpu) in [("v26", true), ("v27", true), ("v26", false)] {
        let v = V26::start(generation);
        let origin = v.dir.path().join("origin");
        let amd = artifact_bytes(11, 5000);
        let amd_sha = test_support::published::sha256_hex(&amd);
        for dir in test_support::published::artifact_dirs(&origin, generation, "pop223") {
            fs::write(dir.join("pop223_driving_amd_tinygrad.pkl"), &amd).unwrap();
        }
        let mut m: Value = serde_json::from_slice(&v.manifest).unwrap();
        for e in m["models"].as_array_mut().unwrap() {
            if e["id"] == "pop223" {
                e["accelerator_artifacts"] = json!({"amd": {
                    "artifact_format": crate::upstream_v26::ARTIFACT_ABI, "artifact_sha256": amd_sha,
                    "artifact_size": amd.len(), "artifact_chunk_count": 0,
                    "execution_device": "AMD", "compiler_revision": COMPILER}});
            }
        }
        let body = serde_json::to_vec_pretty(&m).unwrap();
        write_manifest(&origin, generation, &body);
        if gpu {
            let usb = v.dir.path().join("sys/bus/usb/devices/2-1");
            fs::create_dir_all(&usb).unwrap();
            for (f, val) in [
                ("idVendor", "add1\n"),
                ("idProduct", "0001\n"),
                ("product", "custom ed4e39b7-CLEAN\n"),
            ] {
                fs::write(usb.join(f), val).unwrap();
            }
        }
        let (device, dl) = v.open();
        device.publish_catalog(&body).unwrap();
        let parsed = manifest::Manifest::from_slice(&body).unwrap();
        let entry = parsed.get(&"pop223".parse().unwrap()).unwrap();
        migration::install(&device, &dl, entry, &CancelToken::new(), &|_| {}).unwrap();

        let root = v.root();
        let rt = v.runtime();
        let entries = rt.catalog(&root);
        assert!(
            entries["pop223"].contains_key("accelerator_artifacts"),
            "{generation}: upstream accepts the manifest with the amd build"
        );
        assert!(
            crate::upstream_v26::Runtime::verified_artifact(&root, "pop223", &entries).is_some()
        );
        let amd_path = crate::upstream_v26::Runtime::artifact_path(&root, "pop223", true);
        let mut names: Vec<String> = fs::read_dir(root.join("pop223"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        let job = rt.read_job(&root).expect("a job file upstream accepts");
        if gpu {
            assert_eq!(fs::read(&amd_path).unwrap(), amd, "{generation}");
            assert_eq!(
                names,
                [
                    "pop223_driving_amd_tinygrad.pkl",
                    "pop223_driving_tinygrad.pkl"
                ],
                "{generation}"
            );
            assert_eq!(job["variant"], "amd", "{generation}");
            assert_eq!(job["state"], "completed");
            // Already there and verified: not fetched again.
            let asked = v.server.requests().len();
            migration::install(&device, &dl, entry, &CancelToken::new(), &|_| {}).unwrap();
            assert_eq!(v.server.requests().len(), asked, "{generation}");
        } else {
            assert_eq!(names, ["pop223_driving_tinygrad.pkl"], "{generation}");
            assert_eq!(job["variant"], "standard");
        }
    }
}

/// Every entry under `dir` (directories, files, symlinks) with a file's bytes: what a run that
/// writes nothing must leave exactly as it was (an empty lock file or directory included).
fn entries(dir: &Path) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                dirs.push(p.clone());
                out.push((p, None));
            } else {
                out.push((p.clone(), Some(fs::read(&p).unwrap_or_default())));
            }
        }
    }
    out.sort();
    out
}

/// A named way to prepare a device directory.
type NamedStart<'a> = (&'a str, &'a dyn Fn(&Path));

/// `refresh --dry-run` on a v26-contract tree writes nothing: not the state lock upstream's
/// layout keeps (`.state.lock`, `.download.lock`), not the generation's root, not a job file,
/// not `preferences.json`; the data dir (models and params) is entry for entry and byte for
/// byte what it was. On a device about to move from v25, on one whose selected model must be
/// downloaded again, and on one upstream's manager prepared without lock files yet. v26 and a
/// made-up v27.
#[test]
fn a_dry_run_on_a_v26_contract_tree_writes_nothing() {
    for generation in ["v26", "v27"] {
        let v = V26::start(generation);
        let move_from_v25 = |dir: &Path| v25_device_in(dir);
        let repair = |dir: &Path| {
            v25_device_in(dir);
            let (d, dl) = v.device_in(dir, migration::Effects::none());
            migration::refresh(&d, &migration::Run::new(&dl)).unwrap();
            let root = dir.join("data/models").join(generation);
            fs::remove_file(root.join("pop223/pop223_driving_tinygrad.pkl")).unwrap();
            for lock in [".state.lock", ".download.lock"] {
                fs::remove_file(root.join(lock)).unwrap();
            }
        };
        let prepared = |dir: &Path| {
            fs::create_dir_all(dir.join("data/params/d")).unwrap();
            fs::create_dir_all(dir.join("shm")).unwrap();
            let root = dir.join("data/models").join(generation);
            fs::create_dir_all(&root).unwrap();
            let manifest: Value = serde_json::from_slice(&v.manifest).unwrap();
            fs::write(root.join("catalog.json"), python_dump(&manifest)).unwrap();
            let prefs = json!({"small": "sc2", "big": "", "userFavorites": [],
                "sortMode": "name", "randomizer": false, "blacklistedModels": []});
            fs::write(root.join("preferences.json"), python_dump(&prefs)).unwrap();
        };
        let starts: [NamedStart; 3] = [
            ("move from v25", &move_from_v25),
            ("download due", &repair),
            ("prepared by upstream", &prepared),
        ];
        for (label, prepare) in starts {
            let t = tempfile::tempdir().unwrap();
            prepare(t.path());
            let before = entries(&t.path().join("data"));
            let (d, dl) = v.device_in(t.path(), migration::Effects::none());
            let plan = migration::run::commands::refresh_dry_run(&d, &dl)
                .unwrap_or_else(|e| panic!("{generation} {label}: {e:?}"));
            assert!(
                !plan.would_download.is_empty() || !plan.would_write.is_empty(),
                "{generation} {label}: the dry run plans nothing: {plan:?}"
            );
            assert_eq!(
                entries(&t.path().join("data")),
                before,
                "{generation} {label}: the dry run wrote"
            );
        }
    }
}

/// The receipt's model is checked as upstream's receipt reader checks it: against the tree's
/// reviewed catalog (`BY_ID`), not against the manifest we accepted. A receipt naming a model
/// the tree lacks is unavailable; one naming a tree GPU model that the manifest does not
/// publish (`big223`) as the small variant is unavailable too (before, the manifest had no row
/// for it and the receipt was believed). v26 and a made-up v27.
#[test]
fn a_load_receipt_is_checked_against_the_trees_catalog() {
    use std::os::unix::fs::PermissionsExt;
    let stat = fs::read_to_string("/proc/self/stat").unwrap();
    let ticks: u64 = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    for generation in ["v26", "v27"] {
        let v = V26::start(generation);
        v25_device_in(v.dir.path());
        let (device, dl) = v.open();
        migration::refresh(&device, &migration::Run::new(&dl)).unwrap();
        let dir = v.dir.path().join("receipt-shm/starpilot_modeld_d");
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let status_for = |model: &str, variant: &str| {
            let f = dir.join("load-v1.json");
            let body = json!({"version": 1, "pid": std::process::id(), "processStartTicks": ticks,
                "loadedMonoNs": migration::state::load_receipt::monotonic_ns(), "modelId": model,
                "variant": variant, "artifactSha256": v.sha("pop223"), "fallbackReason": null});
            fs::write(&f, serde_json::to_vec(&body).unwrap()).unwrap();
            fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
            migration::report::status(&device, crate::common::tree())
                .unwrap()
                .running
                .unwrap()
        };
        let ok = status_for("pop223", "small");
        assert_eq!(ok.state, "running", "{generation}: {ok:?}");
        assert_eq!(ok.id.as_deref(), Some("pop223"));
        for (model, variant, named) in [
            ("zzz226", "small", "zzz226"),
            ("big223", "small", "external-GPU"),
        ] {
            let r = status_for(model, variant);
            assert_eq!(r.state, "unavailable", "{generation} {model}: {r:?}");
            let why = r.why.unwrap_or_default();
            assert!(why.contains(named), "{generation} {model}: {why}");
        }
    }
}

/// On a v26-contract tree nothing upstream reads is kept twice: upstream's v26 code reads the
/// selection from `preferences.json` and the catalog from `catalog.json`, and no param, so the
/// refresh writes neither the `Model`/profile/catalog params nor the v25 caches (the v25 values
/// stay as v25 left them; only `ModelManifestVersion`, our generation marker, moves), and our
/// own record `.catalog.json` holds the very manifest `catalog.json` holds. A selection changed
/// in upstream's UI is followed without any param written. v26 and a made-up v27.
#[test]
fn a_v26_contract_device_keeps_no_second_selection_or_catalog() {
    let flat_caches = [
        ".model_versions.json",
        ".model_artifact_urls.json",
        ".model_artifacts.json",
    ];
    for generation in ["v26", "v27"] {
        let v = V26::start(generation);
        let t = tempfile::tempdir().unwrap();
        v25_device_in(t.path());
        let params_dir = t.path().join("data/params/d");
        let params = || {
            let mut all: Vec<(String, String)> = fs::read_dir(&params_dir)
                .unwrap()
                .map(|e| e.unwrap())
                .map(|e| {
                    let name = e.file_name().into_string().unwrap();
                    (name, fs::read_to_string(e.path()).unwrap())
                })
                .filter(|(k, _)| k != keys::MODEL_MANIFEST_VERSION)
                .collect();
            all.sort();
            all
        };
        let before = params();
        let effects = migration::Effects::recording();
        let (d, dl) = v.device_in(t.path(), effects.clone());
        migration::refresh(&d, &migration::Run::new(&dl)).unwrap();
        let params_written: Vec<String> = effects
            .log()
            .into_iter()
            .filter(|e| e.starts_with("param "))
            .collect();
        assert_eq!(
            params_written,
            [format!("param ModelManifestVersion={generation}")],
            "{generation}"
        );
        assert_eq!(params(), before, "{generation}: a param changed");
        let models = t.path().join("data/models");
        for cache in flat_caches {
            assert!(!models.join(cache).exists(), "{generation}: {cache}");
        }
        let root = models.join(generation);
        let json = |p: PathBuf| -> Value { serde_json::from_slice(&fs::read(p).unwrap()).unwrap() };
        assert_eq!(
            json(models.join(migration::CATALOG_FILE)),
            json(root.join("catalog.json")),
            "{generation}: our record and upstream's catalog disagree"
        );
        // The user picks sc2 in upstream's panel (its preferences write); our refresh fetches
        // it and still writes no param.
        let rt = v.runtime();
        let mut prefs = rt.preferences(&root);
        assert_eq!(prefs.small, "pop223");
        prefs.small = "sc2".into();
        let body = json!({"small": prefs.small, "big": prefs.big,
            "userFavorites": prefs.user_favorites, "sortMode": prefs.sort_mode,
            "randomizer": prefs.randomizer, "blacklistedModels": prefs.blacklisted});
        fs::write(root.join("preferences.json"), python_dump(&body)).unwrap();
        let effects = migration::Effects::recording();
        let (d, dl) = v.device_in(t.path(), effects.clone());
        migration::refresh(&d, &migration::Run::new(&dl)).unwrap();
        assert!(
            effects.log().iter().all(|e| !e.starts_with("param ")),
            "{generation}: {:?}",
            effects.log()
        );
        assert!(effects.log().contains(&"install sc2".to_string()));
        assert_eq!(params(), before, "{generation}");
        assert_eq!(rt.resolve_runtime(&root, false).small_id, "sc2");
        assert_eq!(d.resolve().unwrap().1.id.as_str(), "sc2");
    }
}

/// A one-shot `refresh` notices, as the daemon's watch does, that modeld could not start the
/// artifact this manager installed (`selected-load-failed` in a receipt of a load after the
/// install, whose moment the install recorded): those bytes are marked bad, the bundled model
/// is what upstream's resolver and ours hand modeld, and `preferences.json` keeps the choice.
/// A receipt of a load before the install, or an artifact whose install this manager did not
/// record (another manager's), marks nothing. v26 and a made-up v27.
#[test]
fn a_refresh_notices_a_model_that_failed_its_first_start() {
    use std::os::unix::fs::PermissionsExt;
    let stat = fs::read_to_string("/proc/self/stat").unwrap();
    let ticks: u64 = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    for generation in ["v26", "v27"] {
        let v = V26::start(generation);
        v25_device_in(v.dir.path());
        let (device, dl) = v.open();
        let refresh = || migration::refresh(&device, &migration::Run::new(&dl)).unwrap();
        refresh();
        // The move's purge drops the verification cache (v25 and v26 artifacts share file
        // names), so its install moment with it: the case here is a download on the v26 device.
        fs::remove_file(v.root().join("pop223/pop223_driving_tinygrad.pkl")).unwrap();
        refresh();
        let models = v.data().join("models");
        let bad = models.join(migration::state::load_receipt::BAD_ARTIFACTS_FILE);
        let verified = models.join(migration::VERIFIED_FILE);
        let dir = v.dir.path().join("receipt-shm/starpilot_modeld_d");
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let modeld_fell_back = |loaded: u64| {
            let f = dir.join("load-v1.json");
            let body = json!({"version": 1, "pid": std::process::id(),
                "processStartTicks": ticks, "loadedMonoNs": loaded,
                "modelId": "bundled-current", "variant": "small",
                "artifactSha256": "ab".repeat(32), "fallbackReason": "selected-load-failed"});
            fs::write(&f, serde_json::to_vec(&body).unwrap()).unwrap();
            fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
        };
        // modeld loaded before the install: not about these bytes.
        modeld_fell_back(1);
        refresh();
        assert!(
            !bad.exists(),
            "{generation}: marked from a load before the install"
        );
        // An install this manager did not record (the cache gone: re-verified, no moment).
        let recorded = fs::read(&verified).unwrap();
        fs::remove_file(&verified).unwrap();
        modeld_fell_back(migration::state::load_receipt::monotonic_ns());
        refresh();
        assert!(
            !bad.exists(),
            "{generation}: marked without a recorded install"
        );
        // The recorded install, and a load after it.
        fs::write(&verified, &recorded).unwrap();
        refresh();
        let marked: Value = serde_json::from_slice(&fs::read(&bad).unwrap()).unwrap();
        assert_eq!(marked["artifacts"][0]["id"], "pop223", "{generation}");
        assert_eq!(marked["artifacts"][0]["sha256"], v.sha("pop223").as_str());
        let (path, _) = device.resolve().unwrap();
        assert!(!path.starts_with(&models), "{generation}: {path:?}");
        assert_eq!(v.runtime().preferences(&v.root()).small, "pop223");
    }
}

/// The daily ledger (`<models>/.fetched-today.json`) names each artifact by its path under the
/// generation it is of (`<gen>/<path>`): a v25 build and a v26-contract build of one id, fetched
/// into one models directory by the daemon's automatic refresh, are counted apart, so the v25
/// build's day past its budget holds back only the v25 build. v26 and a made-up v27.
#[test]
fn the_daily_ledger_names_the_per_generation_path() {
    use migration::rules::budget::{DailyBudget, ledger_path, read, today};
    for generation in ["v26", "v27"] {
        let v = V26::start(generation);
        let (mut device, dl) = v.open();
        device.budget = Some(DailyBudget::default());
        // A v25 build of the same id (other bytes), on the same origin and models directory.
        let v25_bytes = artifact_bytes(25, 3 * CHUNK);
        let p = publish_model(
            &v.dir.path().join("origin"),
            "v25",
            "pop223",
            &v25_bytes,
            None,
        );
        let mut v25 = Device::new(migration::DeviceConfig {
            data_dir: v.data(),
            memory_params_dir: v.dir.path().join("shm"),
            builtin_dir: v.dir.path().join("builtin"),
            generation: manifest::Generation::new(25),
        });
        v25.budget = Some(DailyBudget::default());
        let name: manifest::FileName = "pop223_driving_tinygrad.pkl".parse().unwrap();
        let v25_target = Target {
            id: "pop223".parse().unwrap(),
            remote_name: name.clone(),
            local_name: name,
            size: Some(p.size),
            sha256: Some(p.sha256.parse().unwrap()),
            chunk_count: None,
            chunk_sha256: None,
        };
        let cancel = CancelToken::new();
        let fetch = |device: &Device, target: &Target| {
            migration::install_target(device, &dl, target, "Pop", &cancel, &|_| {})
        };
        fetch(&v25, &v25_target)
            .unwrap()
            .expect("the v25 build fetched");
        fetch(&device, &v.target("pop223"))
            .unwrap()
            .expect("the v26-contract build fetched");

        let models = v.data().join("models");
        let (v25_key, new_key) = (
            "v25/pop223_driving_tinygrad.pkl".to_string(),
            format!("{generation}/pop223/pop223_driving_tinygrad.pkl"),
        );
        let ledger: Value =
            serde_json::from_slice(&fs::read(ledger_path(&models)).unwrap()).unwrap();
        let counted: Vec<&String> = ledger["fetched"].as_object().unwrap().keys().collect();
        assert_eq!(counted, [&v25_key, &new_key], "{generation}: {ledger}");
        let new_size = v.target("pop223").size.unwrap();
        let day = read(&models, today());
        assert_eq!(day.spent(&v25_key), Some(p.size), "{generation}: {ledger}");
        assert_eq!(
            day.spent(&new_key),
            Some(new_size),
            "{generation}: {ledger}"
        );

        // The v25 build's day spent: only the v25 build is held back.
        migration::rules::budget::count(&models, &v25_key, p.size, 10 * p.size, today()).unwrap();
        fs::remove_file(models.join("pop223_driving_tinygrad.pkl")).unwrap();
        fs::remove_file(v.root().join("pop223/pop223_driving_tinygrad.pkl")).unwrap();
        match fetch(&v25, &v25_target) {
            Err(migration::Error::HeldBack(h)) => {
                assert_eq!(h.id, v25_key, "{generation}");
                assert_eq!(h.fetched, 11 * p.size, "{generation}");
            }
            other => panic!("{generation}: the v25 build not held back: {other:?}"),
        }
        fetch(&device, &v.target("pop223"))
            .unwrap()
            .expect("the v26-contract build is not held back by the v25 build's count");
        let day = read(&models, today());
        assert_eq!(day.spent(&new_key), Some(2 * new_size), "{generation}");
        assert_eq!(day.spent(&v25_key), Some(11 * p.size), "{generation}");
    }
}

/// The staged files of `dir`'s staging directory (none when there is none).
fn staged_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir.join(downloader::STAGING_DIR))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// On a v26-contract device a download stages under the model's own directory
/// (`<gen>/<id>/.starpilot-staging`): one cut off mid-way is listed by `status` (id, bytes,
/// current), `gc` keeps it and removes a staged file of a model gone from the catalog, one of
/// another digest and v25's `<models>/.starpilot-staging` (which it no longer downloads into),
/// never upstream's own files, and the next download resumes it without fetching a recorded
/// piece again. Before, `status` and `gc` read `<models>/.starpilot-staging` only: the
/// interrupted download was not listed and nothing was swept. v26 and a made-up v27.
#[test]
fn an_interrupted_per_generation_download_is_listed_kept_by_gc_and_resumed() {
    use migration::report::progress::Progress;
    for generation in ["v26", "v27"] {
        let v = V26::start(generation);
        let (device, dl) = v.open();
        migration::refresh(&device, &migration::Run::new(&dl)).unwrap();
        let root = v.root();
        let models = v.data().join("models");
        let sc2_dir = root.join("sc2");
        let record_with_a_piece = || {
            (staged_names(&sc2_dir).iter())
                .filter(|n| n.ends_with(".state") && !n.starts_with('.'))
                .find_map(|n| {
                    let text = fs::read_to_string(sc2_dir.join(downloader::STAGING_DIR).join(n));
                    text.ok().filter(|t| t.lines().count() >= 2)
                })
        };
        // Cut the chunk set `sc2` once a piece is recorded (slow enough to be cut mid-way).
        v.server.set_rate_per_conn(Some(64 * 1024));
        let cancel = CancelToken::new();
        let cut = migration::install_target(&device, &dl, &v.target("sc2"), "SC2", &cancel, &|p| {
            if matches!(p, Progress::Percent(_)) && record_with_a_piece().is_some() {
                cancel.cancel();
            }
        });
        assert!(cut.is_err(), "{generation}: the download was cut");
        v.server.set_rate_per_conn(None);
        let record = record_with_a_piece().expect("a piece recorded");
        assert!(
            !sc2_dir.join("sc2_driving_tinygrad.pkl").exists(),
            "{generation}"
        );

        let s = migration::report::status(&device, crate::common::tree()).unwrap();
        assert_eq!(s.interrupted_downloads.len(), 1, "{generation}: {s:?}");
        let d = &s.interrupted_downloads[0];
        let size = v.published.iter().find(|p| p.0 == "sc2").unwrap().2;
        assert_eq!(
            (d.id.as_deref(), d.file.as_str(), d.size, d.current),
            (Some("sc2"), "sc2_driving_tinygrad.pkl", size, true),
            "{generation}"
        );
        assert!(
            d.done_bytes > 0 && d.done_bytes < size,
            "{generation}: {d:?} {record:?}"
        );

        // Leftovers no download can use: a model gone from the catalog, another digest of
        // pop223, and v25's staging directory; upstream's temporary beside them stays.
        let stage = |dir: &Path, sha: &str, file: &str| -> [String; 2] {
            let staging = dir.join(downloader::STAGING_DIR);
            fs::create_dir_all(&staging).unwrap();
            let data = format!("{}-{file}", &sha[..16]);
            fs::write(staging.join(&data), vec![1u8; 1000]).unwrap();
            let state = format!("{data}.state");
            fs::write(staging.join(&state), format!("{sha} 1000 256\n1\n")).unwrap();
            [data, state]
        };
        let other = "ef".repeat(32);
        let gone = stage(
            &root.join("gone223"),
            &other,
            "gone223_driving_tinygrad.pkl",
        );
        fs::write(root.join("gone223/tmp_upstream"), b"upstream's").unwrap();
        let stale = stage(&root.join("pop223"), &other, "pop223_driving_tinygrad.pkl");
        let pop_sha = v.sha("pop223");
        let resumable = stage(
            &root.join("pop223"),
            &pop_sha,
            "pop223_driving_tinygrad.pkl",
        );
        let v25 = stage(&models, &pop_sha, "pop223_driving_tinygrad.pkl");
        let mut want: Vec<String> = (gone.iter().map(|n| (format!("{generation}/gone223"), n)))
            .chain(stale.iter().map(|n| (format!("{generation}/pop223"), n)))
            .map(|(dir, n)| format!("{dir}/{}/{n}", downloader::STAGING_DIR))
            .chain(
                v25.iter()
                    .map(|n| format!("{}/{n}", downloader::STAGING_DIR)),
            )
            .collect();
        want.sort();
        let before = snapshot(&models);
        // Of what `gc` removes, the staged files (the rest is the flat layout's own sweep).
        let staged_only = |mut names: Vec<String>| {
            names.retain(|n| n.contains(downloader::STAGING_DIR));
            names.sort();
            names
        };
        let planned = staged_only(migration::gc(&device.planning()).unwrap());
        assert_eq!(planned, want, "{generation}: gc --dry-run");
        assert_eq!(
            snapshot(&models),
            before,
            "{generation}: the dry run wrote nothing"
        );
        let removed = staged_only(migration::gc(&device).unwrap());
        assert_eq!(removed, want, "{generation}: gc");
        assert!(
            !root.join("gone223").join(downloader::STAGING_DIR).exists(),
            "{generation}: the emptied staging directory goes"
        );
        assert!(root.join("gone223/tmp_upstream").exists(), "{generation}");
        assert_eq!(staged_names(&models), Vec::<String>::new(), "{generation}");
        assert_eq!(
            staged_names(&root.join("pop223")),
            resumable.to_vec(),
            "{generation}"
        );
        assert!(
            staged_names(&sc2_dir)
                .iter()
                .any(|n| n.ends_with(".state") && !n.starts_with('.')),
            "{generation}: the interrupted download is kept"
        );
        for f in ["catalog.json", ".download-job.json"] {
            assert!(root.join(f).exists(), "{generation} {f}");
        }

        // The next download resumes: no piece the record holds is fetched again.
        let done: Vec<usize> = (record.lines().skip(1))
            .filter(|l| !l.contains(' '))
            .map(|l| l.parse().unwrap())
            .collect();
        assert!(!done.is_empty(), "{generation}: {record}");
        v.server.clear_requests();
        migration::install_target(
            &device,
            &dl,
            &v.target("sc2"),
            "SC2",
            &CancelToken::new(),
            &|_| {},
        )
        .unwrap_or_else(|e| panic!("{generation}: {e}"))
        .expect("installed");
        let asked: Vec<String> = v.server.requests().into_iter().map(|r| r.path).collect();
        for i in done {
            let piece = format!(".chunk{i:02}of03");
            assert!(
                !asked.iter().any(|p| p.ends_with(&piece)),
                "{generation}: {piece} fetched again: {asked:?}"
            );
        }
        let entries = v.runtime().catalog(&root);
        assert!(
            crate::upstream_v26::Runtime::verified_artifact(&root, "sc2", &entries).is_some(),
            "{generation}"
        );
        let s = migration::report::status(&device, crate::common::tree()).unwrap();
        let left: Vec<_> = (s.interrupted_downloads.iter())
            .map(|d| d.id.as_deref())
            .collect();
        assert_eq!(left, [Some("pop223")], "{generation}: only the one gc kept");
    }
}
