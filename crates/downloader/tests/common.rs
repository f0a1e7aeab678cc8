//! The test world every downloader test plays in: a real HTTP server on 127.0.0.1 serving an
//! origin directory with both layouts (Hugging Face and GitHub), and a device models directory.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use downloader::{CancelToken, DownloadConfig, Downloader, Error, Event, Installed, Origins};
use manifest::{Generation, Manifest, ModelId};
use test_support::http_server::FaultServer;
use test_support::published::{
    GH_DIR, HF_DIR, artifact_bytes, manifest_json, publish_model, write_manifest,
};

pub const GEN: &str = "v25";
pub const CHUNK: usize = 64 * 1024;

pub struct World {
    pub dir: tempfile::TempDir,
    /// What the server serves: `HF_DIR/…` and `GH_DIR/…`.
    pub root: PathBuf,
    /// The device's models directory.
    pub models: PathBuf,
    pub server: FaultServer,
}

pub fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("origin");
    let models = dir.path().join("models");
    fs::create_dir_all(&root).unwrap();
    fs::create_dir_all(&models).unwrap();
    let server = FaultServer::start(&root).unwrap();
    World {
        dir,
        root,
        models,
        server,
    }
}

/// Three connections, four attempts and millisecond backoffs: a fault costs a test little time.
pub fn config() -> DownloadConfig {
    DownloadConfig {
        connections: 3,
        ranges_per_chunk: 1,
        max_attempts: 4,
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(20),
        space_margin: 0,
        ..DownloadConfig::default()
    }
}

pub fn generation() -> Generation {
    GEN.parse().unwrap()
}

pub fn id(s: &str) -> ModelId {
    s.parse().unwrap()
}

impl World {
    /// A downloader whose origins are this world's server.
    pub fn downloader(&self, config: DownloadConfig) -> Downloader {
        let url = self.server.url();
        Downloader::new(
            Origins::new(&format!("{url}/{HF_DIR}"), &format!("{url}/{GH_DIR}")),
            config,
        )
    }

    /// Publishes one model of `len` pseudo-random bytes from `seed` (chunked or a plain file) on
    /// both origins, with a manifest listing just it (with or without artifact digests).
    pub fn publish(
        &self,
        id: &str,
        seed: u64,
        len: usize,
        chunked: bool,
        digests: bool,
    ) -> (Vec<u8>, Manifest) {
        let data = artifact_bytes(seed, len);
        let m = publish_model(&self.root, GEN, id, &data, chunked.then_some(CHUNK));
        let json = manifest_json(GEN, &[m], digests);
        write_manifest(&self.root, GEN, json.as_bytes());
        (data, Manifest::from_slice(json.as_bytes()).unwrap())
    }

    pub fn download(&self, d: &Downloader, m: &Manifest, model: &str) -> Result<Installed, Error> {
        self.download_with(d, m, model, &|_| {})
    }

    pub fn download_with(
        &self,
        d: &Downloader,
        m: &Manifest,
        model: &str,
        on_event: &(dyn Fn(Event) + Sync),
    ) -> Result<Installed, Error> {
        d.download(
            generation(),
            m.get(&id(model)).unwrap(),
            &self.models,
            &CancelToken::new(),
            on_event,
        )
    }

    /// The installed driving artifact of `model`, if any.
    pub fn installed(&self, model: &str) -> Option<Vec<u8>> {
        fs::read(self.models.join(format!("{model}_driving_tinygrad.pkl"))).ok()
    }
}
