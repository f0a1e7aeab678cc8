//! A Hugging Face Hub emulator on 127.0.0.1 that the real `hf` CLI (huggingface_hub 2.4.0 with
//! hf-xet 1.8.0) and our own HTTP reads both talk to.
//!
//! What it serves, from the facts in the bucket-protocol reference:
//! - buckets: create / info / list, the `tree` API with `Link: rel="next"` pagination (page size
//!   set per test), `paths-info`, `batch` (`addFile`, `copyFile`, `deleteFile`), the xet read and
//!   write token endpoints, and `resolve` answered with a `302` to a second listener (the
//!   "content host", another origin) that serves the bytes with `Range`;
//! - dataset and model repositories seeded by the test (`tree`, form-encoded `paths-info`,
//!   `resolve`), so `reuse` has something to copy from server-side;
//! - the Xet content store that hf-xet uploads to, as the HTTP subset hf-xet 1.8 falls back to:
//!   `POST /v1/xorbs/default/<hash>`, `POST /v1/shards`, `GET /v1/reconstructions/<hash>`, ranged
//!   xorb reads; the newer endpoints answer 404. Xorbs (LZ4 frames, byte grouping) and shards are
//!   decoded here so that `resolve` can serve a file's bytes and `addFile` can learn its size.
//!
//! Writes (bucket creation, batch, write tokens, CAS uploads) need the configured token.
//! Every request is logged (method, target, status, bytes in and out), and every batch operation
//! that took effect is logged as a [`HubOp`], so tests can assert what crossed the wire.
//!
//! Seeded files get an emulator-made content id as their Xet hash (the SHA-256 of their bytes):
//! the CLI treats Xet hashes as opaque when it copies server-side, so this is enough for `reuse`.
//! It is a test tool: one thread per connection, no TLS, everything in memory.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The all-zero Xet hash: an empty file, which needs no content-store call.
pub const EMPTY_XET_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Which listener a request arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The Hub API, `resolve` and the content store (`/cas/...`).
    Hub,
    /// The content host that `resolve` redirects to (another origin).
    Content,
}

/// One request as the emulator saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubRequest {
    pub listener: Listener,
    pub method: String,
    /// The request target as sent (path and query, not decoded).
    pub target: String,
    pub status: u16,
    pub authorization: Option<String>,
    pub range: Option<String>,
    /// Request body bytes received.
    pub bytes_in: usize,
    /// Response body bytes sent.
    pub bytes_out: usize,
}

/// A bucket change that took effect, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubOp {
    Add {
        bucket: String,
        path: String,
    },
    Copy {
        bucket: String,
        path: String,
        source: String,
    },
    Delete {
        bucket: String,
        path: String,
    },
    CreateBucket {
        bucket: String,
    },
}

/// What the tree listing does wrong on purpose (for pagination guards).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkFault {
    /// Every page's `next` link points at the page itself.
    SelfLoop,
    /// The first page's `next` link points at this URL instead.
    Foreign(String),
    /// Every page links to a fresh cursor forever (an endless listing).
    Endless,
}

/// A file in a bucket or repository.
#[derive(Debug, Clone)]
struct Entry {
    xet_hash: String,
    size: u64,
    mtime_ms: u64,
    uploaded_ms: u64,
}

/// One term of a file's reconstruction: chunks `[start, end)` of a xorb.
#[derive(Debug, Clone)]
struct Term {
    xorb: String,
    start: u32,
    end: u32,
    unpacked: u64,
}

#[derive(Debug, Clone)]
struct ChunkLoc {
    /// Offset of the chunk header in the serialized xorb.
    offset: usize,
    compressed: usize,
    scheme: u8,
    unpacked: usize,
}

#[derive(Debug, Clone)]
struct Xorb {
    raw: Vec<u8>,
    chunks: Vec<ChunkLoc>,
}

#[derive(Default)]
struct State {
    buckets: BTreeMap<String, BTreeMap<String, Entry>>,
    /// `datasets/ORG/REPO` or `models/ORG/REPO` → files.
    repos: BTreeMap<String, BTreeMap<String, Entry>>,
    files: HashMap<String, Vec<Term>>,
    xorbs: HashMap<String, Xorb>,
    log: Vec<HubRequest>,
    ops: Vec<HubOp>,
    /// Batches that still succeed before every batch fails (`None`: no limit).
    batch_budget: Option<u32>,
    link_fault: Option<LinkFault>,
    journal: Option<PathBuf>,
}

struct Shared {
    token: String,
    page_size: usize,
    hub_url: Mutex<String>,
    content_url: Mutex<String>,
    state: Mutex<State>,
    stop: AtomicBool,
    /// Request bodies are read at most this many bytes a second (0: as fast as they come).
    body_rate: std::sync::atomic::AtomicU64,
    /// The uplink: request bodies of every connection together at most this many bytes a
    /// second (0: no cap), and when the link is next free.
    uplink: Mutex<(u64, Option<std::time::Instant>)>,
}

/// Start-up settings.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// The token writes must carry (`Authorization: Bearer <token>`).
    pub token: String,
    /// Entries per tree page.
    pub page_size: usize,
}

impl Default for HubConfig {
    fn default() -> Self {
        Self {
            token: "hf_emulator_write_token".into(),
            page_size: 3,
        }
    }
}

/// A running emulator; stopped when dropped.
pub struct HubEmulator {
    hub_addr: SocketAddr,
    content_addr: SocketAddr,
    shared: Arc<Shared>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl HubEmulator {
    pub fn start(config: HubConfig) -> io::Result<Self> {
        let hub = TcpListener::bind("127.0.0.1:0")?;
        let content = TcpListener::bind("127.0.0.1:0")?;
        let hub_addr = hub.local_addr()?;
        let content_addr = content.local_addr()?;
        let shared = Arc::new(Shared {
            token: config.token,
            page_size: config.page_size.max(1),
            hub_url: Mutex::new(format!("http://{hub_addr}")),
            content_url: Mutex::new(format!("http://{content_addr}")),
            state: Mutex::new(State::default()),
            stop: AtomicBool::new(false),
            body_rate: std::sync::atomic::AtomicU64::new(0),
            uplink: Mutex::new((0, None)),
        });
        let mut threads = Vec::new();
        for (listener, which) in [(hub, Listener::Hub), (content, Listener::Content)] {
            let s = shared.clone();
            threads.push(thread::spawn(move || {
                for conn in listener.incoming() {
                    if s.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let s = s.clone();
                    thread::spawn(move || {
                        let _ = serve_connection(conn, &s, which);
                    });
                }
            }));
        }
        Ok(Self {
            hub_addr,
            content_addr,
            shared,
            threads,
        })
    }

    /// Read request bodies (the CLI's xorb uploads) at most `bytes_per_sec` (0: no limit), as
    /// a slow uplink would, so an upload lasts long enough for its progress to be seen.
    pub fn limit_upload_rate(&self, bytes_per_sec: u64) {
        self.shared.body_rate.store(bytes_per_sec, Ordering::SeqCst);
    }

    /// Cap the uplink: request bodies of all connections together are read at most
    /// `bytes_per_sec` (0: no cap), as one release machine's upload link would carry them.
    pub fn limit_uplink(&self, bytes_per_sec: u64) {
        *self.shared.uplink.lock().unwrap() = (bytes_per_sec, None);
    }

    /// `HF_ENDPOINT` for clients.
    pub fn url(&self) -> String {
        self.shared.hub_url.lock().unwrap().clone()
    }

    /// The content host's origin (where `resolve` redirects).
    pub fn content_url(&self) -> String {
        self.shared.content_url.lock().unwrap().clone()
    }

    pub fn token(&self) -> &str {
        &self.shared.token
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap()
    }

    /// Create a bucket (as its owner would have, before any publish).
    pub fn create_bucket(&self, bucket: &str) {
        self.state().buckets.entry(bucket.to_string()).or_default();
    }

    /// Put a file into a bucket directly (no CLI): a stand-in for what an earlier release left.
    pub fn seed_bucket_file(&self, bucket: &str, path: &str, bytes: &[u8]) {
        let mut st = self.state();
        let entry = seed_content(&mut st, bytes);
        st.buckets
            .entry(bucket.to_string())
            .or_default()
            .insert(path.to_string(), entry);
    }

    /// Put a file into a dataset (`kind` = `datasets`) or model (`models`) repository.
    pub fn seed_repo_file(&self, kind: &str, repo: &str, path: &str, bytes: &[u8]) {
        let mut st = self.state();
        let entry = seed_content(&mut st, bytes);
        st.repos
            .entry(format!("{kind}/{repo}"))
            .or_default()
            .insert(path.to_string(), entry);
    }

    /// Replace a bucket file's bytes in place, keeping the path (a corrupted object).
    pub fn corrupt_bucket_file(&self, bucket: &str, path: &str, bytes: &[u8]) {
        self.seed_bucket_file(bucket, path, bytes);
    }

    /// A bucket file's bytes, reconstructed from the content store.
    pub fn bucket_file(&self, bucket: &str, path: &str) -> Option<Vec<u8>> {
        let st = self.state();
        let e = st.buckets.get(bucket)?.get(path)?;
        reconstruct(&st, &e.xet_hash).ok()
    }

    /// Every path in a bucket, sorted.
    pub fn bucket_paths(&self, bucket: &str) -> Vec<String> {
        self.state()
            .buckets
            .get(bucket)
            .map(|b| b.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// How many uploaded chunks used each compression scheme (0 none, 1 LZ4, 2 byte-grouped
    /// LZ4), so a test can show which decoders real uploads exercised.
    pub fn chunk_schemes(&self) -> BTreeMap<u8, usize> {
        let mut out = BTreeMap::new();
        for x in self.state().xorbs.values() {
            for c in &x.chunks {
                *out.entry(c.scheme).or_default() += 1;
            }
        }
        out
    }

    pub fn has_bucket(&self, bucket: &str) -> bool {
        self.state().buckets.contains_key(bucket)
    }

    pub fn requests(&self) -> Vec<HubRequest> {
        self.state().log.clone()
    }

    pub fn ops(&self) -> Vec<HubOp> {
        self.state().ops.clone()
    }

    pub fn clear_log(&self) {
        let mut st = self.state();
        st.log.clear();
        st.ops.clear();
    }

    /// After `n` more successful batches, every batch is refused (an interrupted run).
    pub fn allow_batches(&self, n: u32) {
        self.state().batch_budget = Some(n);
    }

    /// Undo [`HubEmulator::allow_batches`] and [`HubEmulator::set_link_fault`].
    pub fn heal(&self) {
        let mut st = self.state();
        st.batch_budget = None;
        st.link_fault = None;
    }

    pub fn set_link_fault(&self, fault: Option<LinkFault>) {
        self.state().link_fault = fault;
    }

    /// Append `hf <op> <path>` per bucket change to this file (to order writes across stores).
    pub fn set_journal(&self, path: Option<PathBuf>) {
        self.state().journal = path;
    }
}

impl Drop for HubEmulator {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for a in [self.hub_addr, self.content_addr] {
            let _ = TcpStream::connect_timeout(&a, Duration::from_secs(1));
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `2026-12-02T14:12:39.763Z` from epoch milliseconds: the one RFC 3339 formatter
/// (`cli_support::time`) and the milliseconds.
pub fn iso8601(ms: u64) -> String {
    let secs = cli_support::time::rfc3339(ms / 1000);
    format!("{}.{:03}Z", secs.trim_end_matches('Z'), ms % 1000)
}

/// Store `bytes` as a xorb of uncompressed chunks under an emulator-made file id.
fn seed_content(st: &mut State, bytes: &[u8]) -> Entry {
    let now = now_ms();
    if bytes.is_empty() {
        return Entry {
            xet_hash: EMPTY_XET_HASH.into(),
            size: 0,
            mtime_ms: now,
            uploaded_ms: now,
        };
    }
    let file_hash = hex(&Sha256::digest(bytes));
    let xorb_hash = hex(&Sha256::digest([b"xorb:".as_slice(), bytes].concat()));
    let mut raw = Vec::new();
    let mut chunks = Vec::new();
    for piece in bytes.chunks(64 * 1024) {
        let n = piece.len();
        chunks.push(ChunkLoc {
            offset: raw.len(),
            compressed: n,
            scheme: 0,
            unpacked: n,
        });
        raw.push(0);
        raw.extend_from_slice(&(n as u32).to_le_bytes()[..3]);
        raw.push(0);
        raw.extend_from_slice(&(n as u32).to_le_bytes()[..3]);
        raw.extend_from_slice(piece);
    }
    let count = chunks.len() as u32;
    st.xorbs.insert(xorb_hash.clone(), Xorb { raw, chunks });
    st.files.insert(
        file_hash.clone(),
        vec![Term {
            xorb: xorb_hash,
            start: 0,
            end: count,
            unpacked: bytes.len() as u64,
        }],
    );
    Entry {
        xet_hash: file_hash,
        size: bytes.len() as u64,
        mtime_ms: now,
        uploaded_ms: now,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A Xet hash as its API string: each 8-byte group read as a little-endian u64, in hex.
pub fn xet_hash_string(h: &[u8; 32]) -> String {
    h.chunks(8)
        .map(|g| {
            let mut r = g.to_vec();
            r.reverse();
            hex(&r)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The real CLI

/// The huggingface_hub version the Hub tests are written against (with hf-xet 1.8.0).
pub const PINNED_HF_VERSION: &str = "2.4.0";
/// Where `.ci/run` puts the real `hf` executable (its private venv).
pub const HF_CLI_ENV: &str = "STARPILOT_HF_CLI";
/// Set to `1` (by `.ci/run`) to make a missing or wrong `hf` a test failure instead of a skip.
pub const REQUIRE_HF_ENV: &str = "STARPILOT_REQUIRE_HF";

/// The real `hf` CLI at the pinned version: `$STARPILOT_HF_CLI`, else `hf` on `PATH`. `None`
/// (after a loud message) when there is none and `STARPILOT_REQUIRE_HF` is not `1`; a panic
/// when it is. Checked once per test process (each `hf` start costs about half a second).
pub fn real_hf_cli() -> Option<PathBuf> {
    static FOUND: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let found = FOUND.get_or_init(|| {
        let cli = std::env::var_os(HF_CLI_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("PATH").and_then(|p| {
                    std::env::split_paths(&p)
                        .map(|d| d.join("hf"))
                        .find(|c| c.is_file())
                })
            })
            .ok_or_else(|| format!("no `hf` CLI (set {HF_CLI_ENV} or put `hf` on PATH)"))?;
        let out = std::process::Command::new(&cli)
            .arg("--version")
            .env("HF_HUB_DISABLE_UPDATE_CHECK", "1")
            .env("HF_HUB_DISABLE_TELEMETRY", "1")
            .env("HF_HOME", std::env::temp_dir().join("starpilot-hf-version-check"))
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("{} does not run: {e}", cli.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !text.lines().any(|l| l.trim() == PINNED_HF_VERSION) {
            return Err(format!(
                "{} is version {:?}, the Hub tests need huggingface_hub=={PINNED_HF_VERSION} with hf-xet==1.8.0",
                cli.display(),
                text.trim()
            ));
        }
        Ok(cli)
    });
    match found {
        Ok(p) => Some(p.clone()),
        Err(msg) => {
            if std::env::var(REQUIRE_HF_ENV).as_deref() == Ok("1") {
                panic!("{msg}, and {REQUIRE_HF_ENV}=1 requires it");
            }
            crate::skip::skipped(&format!(
                "{msg}; this test needs the real hf CLI (python3 -m venv V && V/bin/pip install huggingface_hub=={PINNED_HF_VERSION} hf-xet==1.8.0, then {HF_CLI_ENV}=V/bin/hf)"
            ));
            None
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Xorbs and shards

fn parse_xorb(raw: &[u8]) -> Result<Vec<ChunkLoc>, String> {
    let mut chunks = Vec::new();
    let mut pos = 0;
    while pos < raw.len() {
        if raw[pos..].starts_with(b"XETBLOB") {
            break; // a footer: not needed here
        }
        if pos + 8 > raw.len() {
            return Err(format!("truncated chunk header at byte {pos}"));
        }
        let h = &raw[pos..pos + 8];
        if h[0] != 0 {
            return Err(format!("chunk header version {} at byte {pos}", h[0]));
        }
        let compressed = u32::from_le_bytes([h[1], h[2], h[3], 0]) as usize;
        let scheme = h[4];
        let unpacked = u32::from_le_bytes([h[5], h[6], h[7], 0]) as usize;
        if scheme > 2 {
            return Err(format!("unknown compression scheme {scheme} at byte {pos}"));
        }
        if pos + 8 + compressed > raw.len() {
            return Err(format!("chunk at byte {pos} runs past the end"));
        }
        chunks.push(ChunkLoc {
            offset: pos,
            compressed,
            scheme,
            unpacked,
        });
        pos += 8 + compressed;
    }
    Ok(chunks)
}

fn decode_chunk(raw: &[u8], c: &ChunkLoc) -> Result<Vec<u8>, String> {
    let data = &raw[c.offset + 8..c.offset + 8 + c.compressed];
    let out = match c.scheme {
        0 => data.to_vec(),
        1 | 2 => {
            let mut d = lz4_flex::frame::FrameDecoder::new(data);
            let mut out = Vec::with_capacity(c.unpacked);
            d.read_to_end(&mut out)
                .map_err(|e| format!("LZ4 frame: {e}"))?;
            if c.scheme == 2 { ungroup4(&out) } else { out }
        }
        s => return Err(format!("compression scheme {s}")),
    };
    if out.len() != c.unpacked {
        return Err(format!(
            "chunk decodes to {} bytes, its header says {}",
            out.len(),
            c.unpacked
        ));
    }
    Ok(out)
}

/// Undo byte grouping: the input is four groups (sizes differing by at most one, the first ones
/// longer), the output interleaves them back.
fn ungroup4(g: &[u8]) -> Vec<u8> {
    let n = g.len();
    let (q, r) = (n / 4, n % 4);
    let mut starts = [0usize; 4];
    let mut acc = 0;
    for (i, s) in starts.iter_mut().enumerate() {
        *s = acc;
        acc += q + usize::from(i < r);
    }
    (0..n).map(|j| g[starts[j % 4] + j / 4]).collect()
}

struct ShardFile {
    hash: String,
    terms: Vec<Term>,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn parse_shard(b: &[u8]) -> Result<Vec<ShardFile>, String> {
    if b.len() < 48 {
        return Err("shorter than a shard header".into());
    }
    let version = u64::from_le_bytes(b[32..40].try_into().unwrap());
    if version != 2 {
        return Err(format!("shard header version {version}, expected 2"));
    }
    let mut pos = 48;
    let mut files = Vec::new();
    loop {
        if pos + 48 > b.len() {
            return Err("file info section has no bookend".into());
        }
        let head = &b[pos..pos + 48];
        if head[..32].iter().all(|&x| x == 0xff) {
            break;
        }
        let hash: [u8; 32] = head[..32].try_into().unwrap();
        let flags = u32_at(head, 32);
        let n = u32_at(head, 36) as usize;
        pos += 48;
        if pos + n * 48 > b.len() {
            return Err("file info entries run past the end".into());
        }
        let mut terms = Vec::new();
        for i in 0..n {
            let e = &b[pos + i * 48..pos + (i + 1) * 48];
            let xorb: [u8; 32] = e[..32].try_into().unwrap();
            terms.push(Term {
                xorb: xet_hash_string(&xorb),
                unpacked: u64::from(u32_at(e, 36)),
                start: u32_at(e, 40),
                end: u32_at(e, 44),
            });
        }
        pos += n * 48;
        if flags & (1 << 31) != 0 {
            pos += n * 48;
        }
        if flags & (1 << 30) != 0 {
            pos += 48;
        }
        files.push(ShardFile {
            hash: xet_hash_string(&hash),
            terms,
        });
    }
    Ok(files)
}

fn reconstruct(st: &State, file_hash: &str) -> Result<Vec<u8>, String> {
    if file_hash == EMPTY_XET_HASH {
        return Ok(Vec::new());
    }
    let terms = st
        .files
        .get(file_hash)
        .ok_or_else(|| format!("no file {file_hash} in the content store"))?;
    let mut out = Vec::new();
    for t in terms {
        let x = st
            .xorbs
            .get(&t.xorb)
            .ok_or_else(|| format!("xorb {} missing", t.xorb))?;
        let before = out.len();
        for i in t.start..t.end {
            let c = x
                .chunks
                .get(i as usize)
                .ok_or_else(|| format!("xorb {} has no chunk {i}", t.xorb))?;
            out.extend(decode_chunk(&x.raw, c)?);
        }
        if (out.len() - before) as u64 != t.unpacked {
            return Err(format!("term of xorb {} unpacks to the wrong size", t.xorb));
        }
    }
    Ok(out)
}

fn file_size(st: &State, file_hash: &str) -> Option<u64> {
    if file_hash == EMPTY_XET_HASH {
        return Some(0);
    }
    st.files
        .get(file_hash)
        .map(|t| t.iter().map(|t| t.unpacked).sum())
}

// ---------------------------------------------------------------------------------------------
// HTTP

struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    close: bool,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }
    fn query(&self, key: &str) -> Option<String> {
        let q = self.target.split_once('?')?.1;
        q.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == key).then(|| form_decode(v))
        })
    }
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn json(status: u16, v: &Value) -> Self {
        Self {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: serde_json::to_vec(v).unwrap(),
        }
    }
    fn error(status: u16, code: Option<&str>, message: &str) -> Self {
        let mut r = Self::json(status, &json!({ "error": message }));
        if let Some(c) = code {
            r.headers.push(("X-Error-Code".into(), c.into()));
        }
        r
    }
    fn header(mut self, k: &str, v: impl Into<String>) -> Self {
        self.headers.push((k.into(), v.into()));
        self
    }
}

fn read_request(
    r: &mut BufReader<TcpStream>,
    rate: u64,
    uplink: &Mutex<(u64, Option<std::time::Instant>)>,
) -> io::Result<Option<Request>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default().to_string();
    let version = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 {
            return Ok(None);
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
            if n == 0 {
                let mut end = String::new();
                while r.read_line(&mut end)? > 2 {
                    end.clear();
                }
                break;
            }
            let mut buf = vec![0; n + 2];
            r.read_exact(&mut buf)?;
            body.extend_from_slice(&buf[..n]);
        }
    } else if let Some(n) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body = vec![0; n];
        let link = uplink.lock().unwrap().0;
        if link > 0 {
            // The shared link: each piece waits until the link has carried the pieces before
            // it, whichever connection sent them.
            let step = (link / 100).clamp(1024, 1 << 20) as usize;
            for piece in body.chunks_mut(step) {
                r.read_exact(piece)?;
                let due = {
                    let mut l = uplink.lock().unwrap();
                    let now = std::time::Instant::now();
                    let start = l.1.filter(|t| *t > now).unwrap_or(now);
                    let due = start + Duration::from_secs_f64(piece.len() as f64 / link as f64);
                    l.1 = Some(due);
                    due
                };
                let now = std::time::Instant::now();
                if due > now {
                    thread::sleep(due - now);
                }
            }
        } else if rate == 0 {
            r.read_exact(&mut body)?;
        } else {
            // A tenth of a second's worth at a time.
            let step = (rate / 10).max(1) as usize;
            for piece in body.chunks_mut(step) {
                r.read_exact(piece)?;
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
    let close =
        version == "HTTP/1.0" || get("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
    Ok(Some(Request {
        method,
        target,
        headers,
        body,
        close,
    }))
}

fn percent_decode(s: &str) -> String {
    decode(s, false)
}

/// `application/x-www-form-urlencoded` values: `+` is a space.
fn form_decode(s: &str) -> String {
    decode(s, true)
}

fn decode(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 3 <= b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if plus_is_space && b[i] == b'+' {
            b' '
        } else {
            b[i]
        });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn serve_connection(stream: TcpStream, shared: &Shared, which: Listener) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        let rate = shared.body_rate.load(Ordering::SeqCst);
        let Some(req) = read_request(&mut reader, rate, &shared.uplink)? else {
            return Ok(());
        };
        let resp = match which {
            Listener::Hub => route_hub(&req, shared),
            Listener::Content => route_content(&req, shared),
        };
        let head_only = req.method == "HEAD";
        {
            let mut st = shared.state.lock().unwrap();
            st.log.push(HubRequest {
                listener: which,
                method: req.method.clone(),
                target: req.target.clone(),
                status: resp.status,
                authorization: req.header("authorization").map(str::to_string),
                range: req.header("range").map(str::to_string),
                bytes_in: req.body.len(),
                bytes_out: if head_only { 0 } else { resp.body.len() },
            });
        }
        let mut head = format!("HTTP/1.1 {} {}\r\n", resp.status, reason(resp.status));
        for (k, v) in &resp.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n", resp.body.len()));
        if req.close {
            head.push_str("Connection: close\r\n");
        }
        head.push_str("\r\n");
        out.write_all(head.as_bytes())?;
        if !head_only {
            out.write_all(&resp.body)?;
        }
        out.flush()?;
        if req.close {
            let _ = out.shutdown(Shutdown::Both);
            return Ok(());
        }
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        416 => "Range Not Satisfiable",
        422 => "Unprocessable Entity",
        500 => "Internal Server Error",
        _ => "Other",
    }
}

fn authorized(req: &Request, shared: &Shared) -> bool {
    req.header("authorization") == Some(format!("Bearer {}", shared.token).as_str())
}

fn unauthorized() -> Response {
    Response::error(401, None, "Invalid credentials in Authorization header")
}

fn route_hub(req: &Request, shared: &Shared) -> Response {
    let path = req.path().to_string();
    let m = req.method.as_str();
    if let Some(rest) = path.strip_prefix("/cas/") {
        return route_cas(req, rest, shared);
    }
    if let Some(rest) = path.strip_prefix("/api/buckets/") {
        return route_bucket_api(req, rest, shared);
    }
    for kind in ["datasets", "models"] {
        if let Some(rest) = path.strip_prefix(&format!("/api/{kind}/")) {
            return route_repo_api(req, kind, rest, shared);
        }
    }
    if let Some(rest) = path.strip_prefix("/buckets/")
        && (m == "GET" || m == "HEAD")
    {
        let segs: Vec<&str> = rest.splitn(4, '/').collect();
        if segs.len() == 4 && segs[2] == "resolve" {
            let bucket = format!("{}/{}", segs[0], segs[1]);
            let file = percent_decode(segs[3]);
            let st = shared.state.lock().unwrap();
            let Some(b) = st.buckets.get(&bucket) else {
                return Response::error(404, Some("RepoNotFound"), "Bucket not found");
            };
            let Some(e) = b.get(&file) else {
                return Response::error(404, Some("EntryNotFound"), "Entry not found");
            };
            let auth = format!("{}/api/buckets/{bucket}/xet-read-token", hub(shared));
            return redirect_to_content(e, &auth, None, shared);
        }
    }
    if m == "GET" || m == "HEAD" {
        // /datasets/ORG/REPO/resolve/REV/PATH or /ORG/REPO/resolve/REV/PATH (models).
        let (kind, rest) = match path.strip_prefix("/datasets/") {
            Some(r) => ("datasets", r),
            None => ("models", path.trim_start_matches('/')),
        };
        let segs: Vec<&str> = rest.splitn(5, '/').collect();
        if segs.len() == 5 && segs[2] == "resolve" {
            let repo = format!("{kind}/{}/{}", segs[0], segs[1]);
            let file = percent_decode(segs[4]);
            let st = shared.state.lock().unwrap();
            let Some(r) = st.repos.get(&repo) else {
                return Response::error(404, Some("RepoNotFound"), "Repository not found");
            };
            let Some(e) = r.get(&file) else {
                return Response::error(404, Some("EntryNotFound"), "Entry not found");
            };
            let auth = format!(
                "{}/api/{repo}/xet-read-token/{}",
                hub(shared),
                percent_decode(segs[3])
            );
            return redirect_to_content(e, &auth, Some(&commit_of(&repo)), shared);
        }
    }
    Response::error(404, None, &format!("no route for {m} {path}"))
}

fn hub(shared: &Shared) -> String {
    shared.hub_url.lock().unwrap().clone()
}

fn commit_of(repo: &str) -> String {
    hex(&Sha256::digest(repo.as_bytes()))[..40].to_string()
}

fn redirect_to_content(e: &Entry, auth: &str, commit: Option<&str>, shared: &Shared) -> Response {
    let content = shared.content_url.lock().unwrap().clone();
    let mut r = Response {
        status: 302,
        headers: vec![
            ("Location".into(), format!("{content}/files/{}", e.xet_hash)),
            ("X-Xet-Hash".into(), e.xet_hash.clone()),
            ("X-Linked-Size".into(), e.size.to_string()),
            ("X-Linked-ETag".into(), format!("\"{}\"", e.xet_hash)),
            ("ETag".into(), format!("\"{}\"", e.xet_hash)),
            ("Link".into(), format!("<{auth}>; rel=\"xet-auth\"")),
        ],
        body: Vec::new(),
    };
    if let Some(c) = commit {
        r.headers.push(("X-Repo-Commit".into(), c.to_string()));
    }
    r
}

/// `bytes=a-b`, `bytes=a-` or `bytes=-n` against `len`: `Ok(None)` = no range, `Err` = 416.
fn parse_range(v: Option<&str>, len: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = v.and_then(|v| v.strip_prefix("bytes=")) else {
        return Ok(None);
    };
    let (a, b) = spec.split_once('-').ok_or(())?;
    let (start, end) = if a.is_empty() {
        let n: u64 = b.parse().map_err(|_| ())?;
        (len.saturating_sub(n), len.saturating_sub(1))
    } else {
        let s: u64 = a.parse().map_err(|_| ())?;
        let e = if b.is_empty() {
            len.saturating_sub(1)
        } else {
            b.parse::<u64>().map_err(|_| ())?.min(len.saturating_sub(1))
        };
        (s, e)
    };
    if start >= len || start > end {
        return Err(());
    }
    Ok(Some((start, end)))
}

fn ranged(bytes: Vec<u8>, range: Option<&str>, etag: &str) -> Response {
    let len = bytes.len() as u64;
    match parse_range(range, len) {
        Err(()) => Response {
            status: 416,
            headers: vec![("Content-Range".into(), format!("bytes */{len}"))],
            body: Vec::new(),
        },
        Ok(None) => Response {
            status: 200,
            headers: vec![
                ("Accept-Ranges".into(), "bytes".into()),
                ("ETag".into(), etag.into()),
            ],
            body: bytes,
        },
        Ok(Some((s, e))) => Response {
            status: 206,
            headers: vec![
                ("Content-Range".into(), format!("bytes {s}-{e}/{len}")),
                ("ETag".into(), etag.into()),
            ],
            body: bytes[s as usize..=e as usize].to_vec(),
        },
    }
}

fn route_content(req: &Request, shared: &Shared) -> Response {
    if req.method != "GET" && req.method != "HEAD" {
        return Response::error(405, None, "read-only content host");
    }
    let path = req.path();
    let st = shared.state.lock().unwrap();
    if let Some(hash) = path.strip_prefix("/files/") {
        return match reconstruct(&st, hash) {
            Ok(bytes) => ranged(bytes, req.header("range"), &format!("\"{hash}\"")),
            Err(e) => Response::error(404, None, &e),
        };
    }
    if let Some(hash) = path.strip_prefix("/xorbs/") {
        return match st.xorbs.get(hash) {
            Some(x) => ranged(x.raw.clone(), req.header("range"), &format!("\"{hash}\"")),
            None => Response::error(404, None, "no such xorb"),
        };
    }
    Response::error(404, None, "not found")
}

// ---------------------------------------------------------------------------------------------
// Buckets

fn tree_entry(path: &str, e: &Entry) -> Value {
    json!({
        "type": "file",
        "path": path,
        "size": e.size,
        "xetHash": e.xet_hash,
        "mtime": iso8601(e.mtime_ms),
        "uploadedAt": iso8601(e.uploaded_ms),
    })
}

/// Files (and, when not recursive, immediate directories) under `prefix`.
fn listing(files: &BTreeMap<String, Entry>, prefix: &str, recursive: bool) -> Vec<Value> {
    let prefix = prefix.trim_matches('/');
    let under = |p: &str| -> Option<String> {
        if prefix.is_empty() {
            Some(p.to_string())
        } else {
            p.strip_prefix(prefix)
                .and_then(|r| r.strip_prefix('/'))
                .map(str::to_string)
        }
    };
    let mut out = Vec::new();
    let mut dirs = std::collections::BTreeSet::new();
    for (p, e) in files {
        let Some(rel) = under(p) else { continue };
        if recursive || !rel.contains('/') {
            out.push(tree_entry(p, e));
        } else {
            let d = rel.split('/').next().unwrap();
            let full = if prefix.is_empty() {
                d.to_string()
            } else {
                format!("{prefix}/{d}")
            };
            if dirs.insert(full.clone()) {
                out.push(json!({
                    "type": "directory",
                    "path": full,
                    "uploadedAt": iso8601(e.uploaded_ms),
                }));
            }
        }
    }
    out
}

fn paginate(req: &Request, items: Vec<Value>, shared: &Shared) -> Response {
    let start: usize = req
        .query("cursor")
        .and_then(|c| c.strip_prefix("c").and_then(|n| n.parse().ok()))
        .unwrap_or(0);
    let fault = shared.state.lock().unwrap().link_fault.clone();
    let end = (start + shared.page_size).min(items.len());
    let page: Vec<Value> = items.get(start..end).unwrap_or_default().to_vec();
    let mut r = Response::json(200, &Value::Array(page));
    let base = req.target.split('?').next().unwrap_or_default();
    let recursive = req.query("recursive").unwrap_or_default();
    let next = |cursor: usize| {
        format!(
            "{}{base}?recursive={recursive}&cursor=c{cursor}",
            hub(shared)
        )
    };
    let link = match fault {
        Some(LinkFault::SelfLoop) => Some(format!("{}{}", hub(shared), req.target)),
        Some(LinkFault::Foreign(url)) => Some(url),
        Some(LinkFault::Endless) => Some(next(start + 1)),
        None => (end < items.len()).then(|| next(end)),
    };
    if let Some(l) = link {
        r = r.header("Link", format!("<{l}>; rel=\"next\""));
    }
    r
}

fn route_bucket_api(req: &Request, rest: &str, shared: &Shared) -> Response {
    let m = req.method.as_str();
    let mut segs = rest.splitn(3, '/');
    let ns = percent_decode(segs.next().unwrap_or_default());
    let name = percent_decode(segs.next().unwrap_or_default());
    let tail = percent_decode(segs.next().unwrap_or_default());
    if name.is_empty() {
        // GET /api/buckets/NS: the namespace's buckets.
        let st = shared.state.lock().unwrap();
        let list: Vec<Value> = st
            .buckets
            .keys()
            .filter(|b| b.starts_with(&format!("{ns}/")))
            .map(|b| json!({"id": b, "private": false}))
            .collect();
        return Response::json(200, &Value::Array(list));
    }
    let bucket = format!("{ns}/{name}");
    let url = format!("{}/buckets/{bucket}", hub(shared));
    if tail.is_empty() && m == "POST" {
        if !authorized(req, shared) {
            return unauthorized();
        }
        let mut st = shared.state.lock().unwrap();
        if st.buckets.contains_key(&bucket) {
            return Response::json(
                409,
                &json!({"error": "You already created this bucket", "url": url}),
            );
        }
        st.buckets.insert(bucket.clone(), BTreeMap::new());
        st.ops.push(HubOp::CreateBucket {
            bucket: bucket.clone(),
        });
        return Response::json(200, &json!({"url": url, "name": bucket}));
    }
    let st = shared.state.lock().unwrap();
    let Some(files) = st.buckets.get(&bucket) else {
        return Response::error(
            404,
            Some("RepoNotFound"),
            &format!("Bucket {bucket} not found"),
        );
    };
    if tail.is_empty() && m == "GET" {
        return Response::json(
            200,
            &json!({
                "id": bucket, "private": false, "createdAt": iso8601(0),
                "size": files.values().map(|e| e.size).sum::<u64>(),
                "totalFiles": files.len(),
            }),
        );
    }
    if tail == "tree" || tail.starts_with("tree/") {
        let prefix = tail.strip_prefix("tree").unwrap_or_default();
        let recursive = req.query("recursive").as_deref() == Some("true");
        let items = listing(files, prefix, recursive);
        drop(st);
        return paginate(req, items, shared);
    }
    if tail == "paths-info" && m == "POST" {
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let mut out = Vec::new();
        for p in body["paths"].as_array().into_iter().flatten() {
            let Some(p) = p.as_str() else { continue };
            let p = p.trim_matches('/');
            if let Some(e) = files.get(p) {
                out.push(tree_entry(p, e));
            } else if files.keys().any(|k| k.starts_with(&format!("{p}/"))) {
                out.push(json!({"type": "directory", "path": p, "uploadedAt": iso8601(0)}));
            }
        }
        return Response::json(200, &Value::Array(out));
    }
    if tail == "xet-read-token" || tail == "xet-write-token" {
        let write = tail == "xet-write-token";
        if write && !authorized(req, shared) {
            return unauthorized();
        }
        return xet_token(shared, write);
    }
    if tail == "batch" && m == "POST" {
        drop(st);
        if !authorized(req, shared) {
            return unauthorized();
        }
        return batch(req, &bucket, shared);
    }
    Response::error(404, None, &format!("no route for {m} /api/buckets/{rest}"))
}

fn xet_token(shared: &Shared, write: bool) -> Response {
    let exp = now_ms() / 1000 + 3600;
    Response::json(
        200,
        &json!({
            "casUrl": format!("{}/cas", hub(shared)),
            "accessToken": if write { format!("xet-write-{}", shared.token) } else { "xet-read".to_string() },
            "exp": exp,
        }),
    )
}

fn batch(req: &Request, bucket: &str, shared: &Shared) -> Response {
    let mut st = shared.state.lock().unwrap();
    let text = String::from_utf8_lossy(&req.body).into_owned();
    if let Some(n) = st.batch_budget.as_mut() {
        if *n == 0 {
            // Refused as a whole (422): a 5xx would make the CLI back off for ~25 s first.
            let failed: Vec<Value> = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .map(|op| json!({"path": op["path"], "error": "injected: the Hub refused the write"}))
                .collect();
            return Response::json(422, &json!({ "failed": failed }));
        }
        *n -= 1;
    }
    let mut failed = Vec::new();
    let mut total = 0;
    let now = now_ms();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        total += 1;
        let op: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                failed.push(json!({"path": "", "error": format!("bad operation: {e}")}));
                continue;
            }
        };
        let path = op["path"].as_str().unwrap_or_default().to_string();
        let fail = |failed: &mut Vec<Value>, msg: String| {
            failed.push(json!({"path": path.clone(), "error": msg}));
        };
        if path.is_empty()
            || path
                .split('/')
                .any(|s| s.is_empty() || s == "." || s == "..")
        {
            fail(&mut failed, "invalid path".into());
            continue;
        }
        let hash = op["xetHash"].as_str().unwrap_or_default().to_string();
        let mtime = op["mtime"].as_u64().unwrap_or(now);
        match op["type"].as_str() {
            Some("addFile") => {
                if let Err(e) = place_file(&mut st, bucket, &path, hash, mtime, now) {
                    fail(&mut failed, e);
                    continue;
                }
                st.ops.push(HubOp::Add {
                    bucket: bucket.into(),
                    path: path.clone(),
                });
                journal(&st, "addFile", &path);
            }
            Some("copyFile") => {
                let kind = op["sourceRepoType"].as_str().unwrap_or_default();
                let id = op["sourceRepoId"].as_str().unwrap_or_default();
                let source_files = match kind {
                    "bucket" => st.buckets.get(id),
                    "dataset" => st.repos.get(&format!("datasets/{id}")),
                    "model" => st.repos.get(&format!("models/{id}")),
                    _ => None,
                };
                let Some(source_files) = source_files else {
                    fail(&mut failed, format!("source {kind} {id} not found"));
                    continue;
                };
                if !source_files.values().any(|e| e.xet_hash == hash) {
                    fail(
                        &mut failed,
                        format!("{kind} {id} holds no file with Xet hash {hash}"),
                    );
                    continue;
                }
                if let Err(e) = place_file(&mut st, bucket, &path, hash, mtime, now) {
                    fail(&mut failed, e);
                    continue;
                }
                st.ops.push(HubOp::Copy {
                    bucket: bucket.into(),
                    path: path.clone(),
                    source: format!("{kind}:{id}"),
                });
                journal(&st, "copyFile", &path);
            }
            Some("deleteFile") => {
                if st.buckets.get_mut(bucket).unwrap().remove(&path).is_none() {
                    fail(&mut failed, "Entry not found".into());
                    continue;
                }
                st.ops.push(HubOp::Delete {
                    bucket: bucket.into(),
                    path: path.clone(),
                });
                journal(&st, "deleteFile", &path);
            }
            other => fail(&mut failed, format!("unknown operation type {other:?}")),
        }
    }
    let status = if total > 0 && failed.len() == total {
        422
    } else {
        200
    };
    Response::json(status, &json!({ "failed": failed }))
}

/// Puts the uploaded content `hash` at `bucket/path` (what `addFile` and `copyFile` do once
/// their source is checked); refused when the content store does not hold it.
fn place_file(
    st: &mut State,
    bucket: &str,
    path: &str,
    hash: String,
    mtime_ms: u64,
    now: u64,
) -> Result<(), String> {
    let Some(size) = file_size(st, &hash) else {
        return Err(format!("Xet hash {hash} not found in the content store"));
    };
    st.buckets.get_mut(bucket).unwrap().insert(
        path.to_string(),
        Entry {
            xet_hash: hash,
            size,
            mtime_ms,
            uploaded_ms: now,
        },
    );
    Ok(())
}

fn journal(st: &State, op: &str, path: &str) {
    if let Some(j) = &st.journal
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(j)
    {
        let _ = writeln!(f, "hf {op} {path}");
    }
}

// ---------------------------------------------------------------------------------------------
// Repositories

fn route_repo_api(req: &Request, kind: &str, rest: &str, shared: &Shared) -> Response {
    let m = req.method.as_str();
    let mut segs = rest.splitn(3, '/');
    let org = segs.next().unwrap_or_default();
    let name = segs.next().unwrap_or_default();
    let tail = percent_decode(segs.next().unwrap_or_default());
    let repo = format!("{kind}/{org}/{name}");
    let st = shared.state.lock().unwrap();
    let Some(files) = st.repos.get(&repo) else {
        return Response::error(404, Some("RepoNotFound"), "Repository not found");
    };
    let sha = commit_of(&repo);
    let entry = |p: &str, e: &Entry| {
        json!({
            "type": "file", "oid": hex(&Sha256::digest(p.as_bytes()))[..40].to_string(),
            "size": e.size, "path": p, "xetHash": e.xet_hash,
            "lfs": {"oid": e.xet_hash, "size": e.size, "pointerSize": 135},
        })
    };
    if tail.is_empty() || tail.starts_with("revision/") {
        let siblings: Vec<Value> = files.keys().map(|p| json!({"rfilename": p})).collect();
        return Response::json(
            200,
            &json!({"id": format!("{org}/{name}"), "sha": sha, "private": false, "siblings": siblings}),
        );
    }
    if let Some(after) = tail.strip_prefix("paths-info/")
        && m == "POST"
    {
        let _rev = after;
        let body = String::from_utf8_lossy(&req.body).into_owned();
        let mut paths: Vec<String> = Vec::new();
        if req
            .header("content-type")
            .is_some_and(|c| c.contains("json"))
        {
            let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            for p in v["paths"].as_array().into_iter().flatten() {
                if let Some(s) = p.as_str() {
                    paths.push(s.to_string());
                }
            }
        } else {
            for kv in body.split('&') {
                if let Some(v) = kv.strip_prefix("paths=") {
                    paths.push(form_decode(v));
                }
            }
        }
        let out: Vec<Value> = paths
            .iter()
            .filter_map(|p| files.get(p).map(|e| entry(p, e)))
            .collect();
        return Response::json(200, &Value::Array(out));
    }
    if let Some(after) = tail.strip_prefix("tree/") {
        let (_rev, prefix) = after.split_once('/').unwrap_or((after, ""));
        let recursive = req.query("recursive").as_deref() == Some("true");
        let mut items = listing(files, prefix, recursive);
        for v in &mut items {
            if v["type"] == "file" {
                let p = v["path"].as_str().unwrap().to_string();
                *v = entry(&p, &files[&p]);
            }
        }
        drop(st);
        return paginate(req, items, shared);
    }
    if tail.starts_with("xet-read-token") {
        return xet_token(shared, false);
    }
    Response::error(404, None, &format!("no route for {m} /api/{kind}/{rest}"))
}

// ---------------------------------------------------------------------------------------------
// The content store

fn route_cas(req: &Request, rest: &str, shared: &Shared) -> Response {
    let m = req.method.as_str();
    let write_ok =
        req.header("authorization") == Some(format!("Bearer xet-write-{}", shared.token).as_str());
    if let Some(hash) = rest.strip_prefix("v1/xorbs/default/")
        && m == "POST"
    {
        if !write_ok {
            return unauthorized();
        }
        let chunks = match parse_xorb(&req.body) {
            Ok(c) => c,
            Err(e) => return Response::error(400, None, &format!("bad xorb: {e}")),
        };
        let mut st = shared.state.lock().unwrap();
        let inserted = !st.xorbs.contains_key(hash);
        if inserted {
            st.xorbs.insert(
                hash.to_string(),
                Xorb {
                    raw: req.body.clone(),
                    chunks,
                },
            );
        }
        return Response::json(200, &json!({ "was_inserted": inserted }));
    }
    if rest == "v1/shards" && m == "POST" {
        if !write_ok {
            return unauthorized();
        }
        let files = match parse_shard(&req.body) {
            Ok(f) => f,
            Err(e) => return Response::error(400, None, &format!("bad shard: {e}")),
        };
        let mut st = shared.state.lock().unwrap();
        for f in &files {
            for t in &f.terms {
                let Some(x) = st.xorbs.get(&t.xorb) else {
                    return Response::error(
                        400,
                        None,
                        &format!("shard names xorb {} that was never uploaded", t.xorb),
                    );
                };
                if t.start >= t.end || t.end as usize > x.chunks.len() {
                    return Response::error(400, None, "shard term outside its xorb");
                }
            }
        }
        for f in files {
            st.files.insert(f.hash, f.terms);
        }
        return Response::json(200, &json!({ "result": 1 }));
    }
    if let Some(hash) = rest.strip_prefix("v1/reconstructions/")
        && m == "GET"
    {
        let st = shared.state.lock().unwrap();
        let Some(terms) = st.files.get(hash) else {
            return Response::error(404, None, "file not found");
        };
        let total: u64 = terms.iter().map(|t| t.unpacked).sum();
        let (from, to) = match parse_range(req.header("range"), total) {
            Err(()) => return Response::error(416, None, "range not satisfiable"),
            Ok(None) => (0, total.saturating_sub(1)),
            Ok(Some(r)) => r,
        };
        let content = shared.content_url.lock().unwrap().clone();
        let mut out_terms = Vec::new();
        let mut fetch: serde_json::Map<String, Value> = serde_json::Map::new();
        let mut pos = 0u64;
        let mut offset_into_first = 0;
        for t in terms {
            let (t_start, t_end) = (pos, pos + t.unpacked);
            pos = t_end;
            if t_end <= from || t_start > to {
                continue;
            }
            if out_terms.is_empty() {
                offset_into_first = from - t_start;
            }
            let x = &st.xorbs[&t.xorb];
            let first = &x.chunks[t.start as usize];
            let last = &x.chunks[t.end as usize - 1];
            out_terms.push(json!({
                "hash": t.xorb, "unpacked_length": t.unpacked,
                "range": {"start": t.start, "end": t.end},
            }));
            fetch
                .entry(t.xorb.clone())
                .or_insert_with(|| Value::Array(Vec::new()))
                .as_array_mut()
                .unwrap()
                .push(json!({
                    "range": {"start": t.start, "end": t.end},
                    "url": format!("{content}/xorbs/{}", t.xorb),
                    "url_range": {"start": first.offset, "end": last.offset + 8 + last.compressed - 1},
                }));
        }
        return Response::json(
            200,
            &json!({
                "offset_into_first_range": offset_into_first,
                "terms": out_terms,
                "fetch_info": fetch,
            }),
        );
    }
    // The newer endpoints (xorb grants, v2 shards and reconstructions, global dedup): absent,
    // so hf-xet 1.8 falls back to the ones above.
    Response::error(404, None, &format!("no route for {m} /cas/{rest}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_hash_strings() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(1_796_220_759_763), "2026-12-02T14:12:39.763Z");
        let h: [u8; 32] = std::array::from_fn(|i| i as u8);
        assert_eq!(
            xet_hash_string(&h),
            "07060504030201000f0e0d0c0b0a090817161514131211101f1e1d1c1b1a1918"
        );
    }

    #[test]
    fn byte_grouping_round_trips() {
        for n in [0usize, 1, 2, 3, 4, 5, 7, 8, 13] {
            let data: Vec<u8> = (0..n as u8).collect();
            // Group: byte i of every 4-byte group goes to group i.
            let mut g: Vec<u8> = Vec::new();
            for k in 0..4 {
                g.extend(data.iter().skip(k).step_by(4));
            }
            assert_eq!(ungroup4(&g), data, "{n}");
        }
    }

    #[test]
    fn xorbs_decode_every_scheme() {
        let data = b"hello hello hello hello xet".to_vec();
        let mut lz = Vec::new();
        let mut enc = lz4_flex::frame::FrameEncoder::new(&mut lz);
        enc.write_all(&data).unwrap();
        enc.finish().unwrap();
        let mut raw = Vec::new();
        for (scheme, body) in [(0u8, data.clone()), (1, lz.clone())] {
            raw.push(0);
            raw.extend_from_slice(&(body.len() as u32).to_le_bytes()[..3]);
            raw.push(scheme);
            raw.extend_from_slice(&(data.len() as u32).to_le_bytes()[..3]);
            raw.extend_from_slice(&body);
        }
        let chunks = parse_xorb(&raw).unwrap();
        assert_eq!(chunks.len(), 2);
        for c in &chunks {
            assert_eq!(decode_chunk(&raw, c).unwrap(), data);
        }
        assert!(parse_xorb(&raw[..raw.len() - 1]).is_err());
    }

    /// The uplink cap is shared: two connections uploading at once together take as long as
    /// their bytes at the cap (each alone at the cap would finish in half the time).
    #[test]
    fn the_uplink_cap_is_shared_by_every_connection() {
        let hub = HubEmulator::start(HubConfig::default()).unwrap();
        hub.limit_uplink(2_000_000);
        let addr = hub.hub_addr;
        let started = std::time::Instant::now();
        let uploads: Vec<_> = (0..2)
            .map(|_| {
                thread::spawn(move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    let body = vec![7u8; 300_000];
                    let head = format!(
                        "POST /api/nothing HTTP/1.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    s.write_all(head.as_bytes()).unwrap();
                    s.write_all(&body).unwrap();
                    let mut answer = Vec::new();
                    let _ = s.read_to_end(&mut answer);
                    assert!(answer.starts_with(b"HTTP/1.1 "), "{answer:?}");
                })
            })
            .collect();
        for u in uploads {
            u.join().unwrap();
        }
        // 600 000 bytes at 2 MB/s: 0.3 s (less one piece each, read before its wait).
        assert!(
            started.elapsed() >= Duration::from_millis(270),
            "{:?}",
            started.elapsed()
        );
    }
}
