//! Fixtures shared by the integration tests: a release (artifacts directory + manifest) built
//! with the real chunker, store wrappers that record or break writes, and a raw HTTP client.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use artifact_store::{FileStat, ListEntry, Result, Store, StorePath};
use chunker::{SplitOptions, split_reader};
use manifest::Manifest;
use serde_json::{Value, json};

pub const TG: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";
pub const CHUNK: u64 = 1000;

pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    test_support::published::artifact_bytes(seed, len)
}

/// One model of a test release.
pub struct Model {
    pub id: &'static str,
    pub data: Vec<u8>,
}

pub fn model(id: &'static str, seed: u64, len: usize) -> Model {
    Model {
        id,
        data: bytes(seed, len),
    }
}

pub fn entry(id: &str, data: &[u8], name: &str) -> Value {
    json!({
        "id": id,
        "name": name,
        "version": "v15",
        "series": "OP Series",
        "released": "2025-06-01",
        "community_favorite": false,
        "artifact_format": "tinygrad_single_v1",
        "artifact_size": data.len(),
        "artifact_sha256": chunker::Sha256Digest::of_bytes(data).to_hex(),
        "artifact_chunk_count": (data.len() as u64).div_ceil(CHUNK),
        "uses_external_gpu": false
    })
}

pub fn manifest_of(entries: Vec<Value>) -> Manifest {
    Manifest::from_value(json!({
        "generation": "v25",
        "tinygrad_commit": TG,
        "models": entries,
    }))
    .unwrap()
}

/// Split each model into `dir/<id>/` as the compiler would hand it over.
pub fn artifacts_dir(dir: &Path, models: &[&Model]) -> PathBuf {
    let out = dir.join("artifacts");
    for m in models {
        let d = out.join(m.id);
        std::fs::create_dir_all(&d).unwrap();
        split_reader(
            &m.data[..],
            m.data.len() as u64,
            &format!("{}_driving_tinygrad.pkl", m.id),
            &d,
            &SplitOptions { chunk_size: CHUNK },
        )
        .unwrap();
    }
    out
}

/// The logical artifact a store holds for a model, joined from its chunk manifest.
pub fn read_artifact(store: &dyn Store, id: &str) -> Vec<u8> {
    let name = format!("{id}_driving_tinygrad.pkl");
    let dir = format!("models/v25/{id}");
    let cm = store
        .read_small(&p(&format!("{dir}/{name}.chunkmanifest")), 10)
        .unwrap()
        .unwrap();
    let n: u32 = String::from_utf8(cm).unwrap().parse().unwrap();
    let mut out = Vec::new();
    for i in 1..=n {
        store
            .open(&p(&format!("{dir}/{}", chunker::chunk_name(&name, i, n))))
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
    }
    out
}

pub fn p(s: &str) -> StorePath {
    s.parse().unwrap()
}

/// A store that records every write and delete, in order, can be told to fail, counts the
/// opens of file contents beyond the small files, and can read like a remote one.
pub struct Recording<S> {
    pub inner: S,
    pub log: Arc<Mutex<Vec<String>>>,
    /// Fail every write after this many successful ones (an interruption), if set.
    pub budget: Mutex<Option<u32>>,
    /// Fail this many writes, then work again (transient errors).
    pub transient: Mutex<u32>,
    /// Whether deletes count against `budget` too (a publish killed at any effect).
    pub gate_deletes: bool,
    /// Opens of file contents (a `read_at` opens too; `read_small` is not counted).
    pub reads: AtomicUsize,
    /// Reads like a remote store (`reads_are_local` false, as the Hub).
    pub remote: bool,
}

impl<S> Recording<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            log: Arc::new(Mutex::new(Vec::new())),
            budget: Mutex::new(None),
            transient: Mutex::new(0),
            gate_deletes: false,
            reads: AtomicUsize::new(0),
            remote: false,
        }
    }

    /// A store whose every effect (write, copy, delete) fails after `budget` of them: a publish
    /// killed at that point. [`Recording::writes`] lists the effects that happened.
    pub fn killable(inner: S, budget: Option<u32>) -> Self {
        Self {
            budget: Mutex::new(budget),
            gate_deletes: true,
            ..Self::new(inner)
        }
    }

    pub fn writes(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn gate(&self, path: &StorePath) -> Result<()> {
        let mut t = self.transient.lock().unwrap();
        if *t > 0 {
            *t -= 1;
            return Err(artifact_store::Error::Http {
                method: "PUT",
                url: path.to_string(),
                message: "injected transient failure".into(),
            });
        }
        let mut b = self.budget.lock().unwrap();
        if let Some(n) = b.as_mut() {
            if *n == 0 {
                return Err(artifact_store::Error::Http {
                    method: "PUT",
                    url: path.to_string(),
                    message: "injected interruption".into(),
                });
            }
            *n -= 1;
        }
        Ok(())
    }
}

impl<S: Store> Store for Recording<S> {
    fn name(&self) -> artifact_store::StoreName {
        self.inner.name()
    }
    fn reads_are_local(&self) -> bool {
        !self.remote && self.inner.reads_are_local()
    }
    fn stat(&self, path: &StorePath) -> Result<Option<FileStat>> {
        self.inner.stat(path)
    }
    fn open(&self, path: &StorePath) -> Result<Box<dyn Read + Send>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.open(path)
    }
    fn read_small(&self, path: &StorePath, limit: u64) -> Result<Option<Vec<u8>>> {
        self.inner.read_small(path, limit)
    }
    fn write_reporting(
        &self,
        path: &StorePath,
        src: &mut dyn Read,
        report: &mut dyn FnMut(artifact_store::progress::Transfer),
    ) -> Result<u64> {
        self.gate(path)?;
        let n = self.inner.write_reporting(path, src, report)?;
        self.log.lock().unwrap().push(format!("write {path}"));
        Ok(n)
    }
    fn list(&self, prefix: &StorePath) -> Result<Vec<ListEntry>> {
        self.inner.list(prefix)
    }
    fn copy(&self, from: &StorePath, to: &StorePath) -> Result<()> {
        self.gate(to)?;
        self.inner.copy(from, to)?;
        self.log.lock().unwrap().push(format!("copy {from} {to}"));
        Ok(())
    }
    fn delete(&self, path: &StorePath) -> Result<bool> {
        if self.gate_deletes {
            self.gate(path)?;
        }
        let r = self.inner.delete(path)?;
        self.log.lock().unwrap().push(format!("delete {path}"));
        Ok(r)
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
}

/// One raw HTTP/1.1 exchange (no URL normalisation, unlike an HTTP client library), returning
/// status, headers (lowercased names) and body.
pub fn raw_http(addr: SocketAddr, request: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let body = buf[split + 4..].to_vec();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body)
}

pub fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}
