//! A small HTTP/1.1 file server on 127.0.0.1 that can misbehave on purpose.
//!
//! It serves a directory (`GET`/`HEAD`, single `Range`, `If-Range`, `ETag`, keep-alive) and lets a
//! test inject the faults a CDN or a flaky car modem produces: an error status for a path, a body
//! cut short, a connection reset mid-body, a `Range` header ignored, more bytes sent than
//! `Content-Length` declares, a per-connection bandwidth cap and a per-request latency; and the
//! ones a hostile origin produces: a redirect to anywhere (`file:`, `data:`, `mailto:`, `unix:`,
//! garbage, none), a response trickled a byte at a time, any raw (malformed) response, and a
//! request never answered. Every request is logged so tests can assert which URLs a client asked
//! for.
//!
//! Hand-rolled on `std::net` so that each fault is exact: a real server library would not let us
//! lie about `Content-Length` or reset a socket after a chosen byte. It is a test tool: one thread
//! per connection, no TLS, no chunked request bodies.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// One way to misbehave on a matching request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this status and a short text body instead of the file.
    Status(u16),
    /// Declare the full length but send only this many body bytes, then close cleanly.
    Truncate(u64),
    /// Send this many body bytes, then reset the connection (TCP RST).
    Reset(u64),
    /// Answer every `Range` request with `200` and the whole file.
    IgnoreRange,
    /// Send this many extra bytes after the declared body.
    OverSend(u64),
    /// Serve these bytes instead of the file (with a matching length and a fresh ETag).
    Body(Vec<u8>),
    /// Answer `status` (301, 302, 303, 307, 308) with this `Location`, whatever it is: another
    /// host, a relative path, `file:`, `data:`, `mailto:`, `unix:`, garbage, or none (`None`).
    Redirect {
        status: u16,
        location: Option<String>,
    },
    /// Send the normal response (head and body) one byte at a time, one byte per interval.
    Trickle(Duration),
    /// Write these bytes as the whole response (any malformed head or body), then close.
    Raw(Vec<u8>),
    /// Read the request and never answer; the connection stays open until the server stops
    /// (what a client sees of an origin that accepts connections and then stays silent).
    Stall,
    /// Serve normally, but this response's body at most this many bytes per second (an origin
    /// alive but slow; overrides the per-connection cap).
    Slow(u64),
}

impl Fault {
    /// A fault from its command-line spelling: `trickle:MS` (one byte every MS ms), `stall`,
    /// `slow:BYTES_PER_SEC`, `status:CODE`.
    pub fn parse(spec: &str) -> Result<Fault, String> {
        let (kind, arg) = spec.split_once(':').unwrap_or((spec, ""));
        let num = || {
            arg.parse::<u64>()
                .map_err(|_| format!("fault {spec:?}: {arg:?} is not a number"))
        };
        match kind {
            "trickle" => Ok(Fault::Trickle(Duration::from_millis(num()?))),
            "stall" => Ok(Fault::Stall),
            "slow" => Ok(Fault::Slow(num()?)),
            "status" => Ok(Fault::Status(num()? as u16)),
            _ => Err(format!(
                "fault {spec:?}: expected trickle:MS, stall, slow:BYTES_PER_SEC or status:CODE"
            )),
        }
    }
}

/// A fault applied to requests whose path equals `path` (or starts with it when it ends in `*`).
#[derive(Debug, Clone)]
struct Rule {
    path: String,
    fault: Fault,
    /// How many more requests it applies to; `None` = forever.
    remaining: Option<u32>,
}

/// What the server saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedRequest {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub if_range: Option<String>,
}

/// Start-up settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub root: PathBuf,
    pub addr: SocketAddr,
    /// Bytes per second per connection; `None` = unlimited.
    pub rate_per_conn: Option<u64>,
    /// Added before every response's headers.
    pub latency: Duration,
}

impl ServerConfig {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            rate_per_conn: None,
            latency: Duration::ZERO,
        }
    }
}

struct Shared {
    root: PathBuf,
    rules: Mutex<Vec<Rule>>,
    log: Mutex<VecDeque<LoggedRequest>>,
    rate: Mutex<Option<u64>>,
    latency: Mutex<Duration>,
    stop: AtomicBool,
    /// Body bytes written per request path (faulty responses included).
    sent: Mutex<std::collections::BTreeMap<String, u64>>,
}

/// A running server; stopped when dropped.
pub struct FaultServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<thread::JoinHandle<()>>,
}

const MAX_LOG: usize = 100_000;

impl FaultServer {
    /// Serve `root` on an ephemeral port of 127.0.0.1.
    pub fn start(root: impl Into<PathBuf>) -> io::Result<Self> {
        Self::with_config(ServerConfig::new(root))
    }

    pub fn with_config(config: ServerConfig) -> io::Result<Self> {
        let listener = TcpListener::bind(config.addr)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            root: config.root,
            rules: Mutex::new(Vec::new()),
            log: Mutex::new(VecDeque::new()),
            rate: Mutex::new(config.rate_per_conn),
            latency: Mutex::new(config.latency),
            stop: AtomicBool::new(false),
            sent: Mutex::new(std::collections::BTreeMap::new()),
        });
        let s = shared.clone();
        let accept = thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let s = s.clone();
                thread::spawn(move || {
                    let _ = serve_connection(conn, &s);
                });
            }
        });
        Ok(Self {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Apply `fault` to the next `times` requests for `path` (`None` = every request). A path
    /// ending in `*` matches by prefix. Rules are checked in the order they were added.
    pub fn add_fault(&self, path: &str, fault: Fault, times: Option<u32>) {
        self.shared.rules.lock().unwrap().push(Rule {
            path: path.to_string(),
            fault,
            remaining: times,
        });
    }

    pub fn clear_faults(&self) {
        self.shared.rules.lock().unwrap().clear();
    }

    pub fn set_rate_per_conn(&self, rate: Option<u64>) {
        *self.shared.rate.lock().unwrap() = rate;
    }

    pub fn set_latency(&self, latency: Duration) {
        *self.shared.latency.lock().unwrap() = latency;
    }

    /// Every request seen so far, oldest first.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.shared.log.lock().unwrap().iter().cloned().collect()
    }

    pub fn clear_requests(&self) {
        self.shared.log.lock().unwrap().clear();
        self.shared.sent.lock().unwrap().clear();
    }

    /// Body bytes this server wrote for request paths starting with `prefix` (payload served,
    /// counted as it leaves, so a response cut short counts what was sent).
    pub fn body_bytes_under(&self, prefix: &str) -> u64 {
        self.shared
            .sent
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p.starts_with(prefix))
            .map(|(_, n)| n)
            .sum()
    }
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept so its thread sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

struct Request {
    method: String,
    path: String,
    range: Option<String>,
    if_range: Option<String>,
    close: bool,
}

fn read_request(reader: &mut BufReader<TcpStream>) -> io::Result<Option<Request>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default().to_string();
    let version = parts.next().unwrap_or_default().to_string();
    let mut range = None;
    let mut if_range = None;
    let mut close = version == "HTTP/1.0";
    let mut total = line.len();
    loop {
        let mut h = String::new();
        let n = reader.read_line(&mut h)?;
        total += n;
        if n == 0 || total > 16 * 1024 {
            return Ok(None);
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            let value = value.trim().to_string();
            match name.trim().to_ascii_lowercase().as_str() {
                "range" => range = Some(value),
                "if-range" => if_range = Some(value),
                "connection" => close = value.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
    }
    let path = target.split('?').next().unwrap_or_default();
    Ok(Some(Request {
        method,
        path: percent_decode(path),
        range,
        if_range,
        close,
    }))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn take_fault(shared: &Shared, path: &str) -> Option<Fault> {
    let mut rules = shared.rules.lock().unwrap();
    for rule in rules.iter_mut() {
        let hit = match rule.path.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => rule.path == path,
        };
        if !hit || rule.remaining == Some(0) {
            continue;
        }
        if let Some(n) = rule.remaining.as_mut() {
            *n -= 1;
        }
        return Some(rule.fault.clone());
    }
    None
}

fn local_path(root: &Path, url_path: &str) -> Option<PathBuf> {
    let rel = Path::new(url_path.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(root.join(rel))
}

/// `bytes=a-b` or `bytes=a-` against a body of `len` bytes: `Some(Ok((start, end_inclusive)))`,
/// `Some(Err(()))` when unsatisfiable, `None` when not a single byte range we understand.
fn parse_range(value: &str, len: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = value.strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let start: u64 = a.trim().parse().ok()?;
    let end = if b.trim().is_empty() {
        len.saturating_sub(1)
    } else {
        b.trim().parse::<u64>().ok()?.min(len.saturating_sub(1))
    };
    if start >= len || start > end {
        return Some(Err(()));
    }
    Some(Ok((start, end)))
}

fn serve_connection(stream: TcpStream, shared: &Shared) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        let Some(req) = read_request(&mut reader)? else {
            return Ok(());
        };
        {
            let mut log = shared.log.lock().unwrap();
            if log.len() >= MAX_LOG {
                log.pop_front();
            }
            log.push_back(LoggedRequest {
                method: req.method.clone(),
                path: req.path.clone(),
                range: req.range.clone(),
                if_range: req.if_range.clone(),
            });
        }
        let latency = *shared.latency.lock().unwrap();
        if !latency.is_zero() {
            thread::sleep(latency);
        }
        let keep = respond(&req, &mut out, shared)?;
        if !keep || req.close {
            let _ = out.shutdown(Shutdown::Both);
            return Ok(());
        }
    }
}

/// Writes one response; `Ok(false)` when the connection must be closed afterwards.
fn respond(req: &Request, out: &mut TcpStream, shared: &Shared) -> io::Result<bool> {
    let head_only = req.method == "HEAD";
    if req.method != "GET" && !head_only {
        simple(out, 405, "method not allowed\n", head_only)?;
        return Ok(true);
    }
    let fault = take_fault(shared, &req.path);
    match &fault {
        Some(Fault::Status(code)) => {
            simple(out, *code, &format!("injected status {code}\n"), head_only)?;
            return Ok(true);
        }
        Some(Fault::Redirect { status, location }) => {
            let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(*status));
            if let Some(l) = location {
                head.push_str(&format!("Location: {l}\r\n"));
            }
            head.push_str("Content-Length: 0\r\n\r\n");
            out.write_all(head.as_bytes())?;
            return Ok(true);
        }
        Some(Fault::Raw(bytes)) => {
            out.write_all(bytes)?;
            out.flush()?;
            return Ok(false);
        }
        Some(Fault::Stall) => {
            while !shared.stop.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(50));
            }
            return Ok(false);
        }
        Some(Fault::Trickle(every)) => {
            // Render the normal response into memory, then drip it.
            let mut rendered = Vec::new();
            let mut sink = Capture(&mut rendered);
            respond_to(req, &mut sink, shared, None)?;
            // Rendered is not sent: the body's bytes count as they leave, one by one.
            let head = rendered
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map_or(rendered.len(), |p| p + 4);
            let count = |n: u64, add: bool| {
                let mut sent = shared.sent.lock().unwrap();
                let c = sent.entry(req.path.clone()).or_default();
                *c = if add { *c + n } else { c.saturating_sub(n) };
            };
            count((rendered.len() - head) as u64, false);
            for (i, b) in rendered.into_iter().enumerate() {
                if shared.stop.load(Ordering::SeqCst) {
                    return Ok(false);
                }
                out.write_all(&[b])?;
                out.flush()?;
                if i >= head {
                    count(1, true);
                }
                thread::sleep(*every);
            }
            return Ok(false);
        }
        _ => {}
    }
    respond_to(req, out, shared, fault)
}

/// Writes into a buffer (used to render a response that is then trickled).
struct Capture<'a>(&'a mut Vec<u8>);

impl Write for Capture<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The normal response for `req` (with `fault` applied), written to `out`.
fn respond_to(
    req: &Request,
    out: &mut dyn SocketWrite,
    shared: &Shared,
    fault: Option<Fault>,
) -> io::Result<bool> {
    let head_only = req.method == "HEAD";
    let Some(path) = local_path(&shared.root, &req.path) else {
        simple(out, 400, "bad path\n", head_only)?;
        return Ok(true);
    };
    let source: Box<dyn ReadAt> = match &fault {
        Some(Fault::Body(bytes)) => Box::new(MemBody(bytes.clone())),
        _ => match File::open(&path).and_then(|f| {
            let m = f.metadata()?;
            if m.is_file() {
                Ok((f, m))
            } else {
                Err(io::Error::from(io::ErrorKind::NotFound))
            }
        }) {
            Ok((f, m)) => Box::new(FileBody {
                file: f,
                len: m.len(),
                etag: format!("\"{:x}-{:x}-{:x}\"", m.len(), m.mtime(), m.mtime_nsec()),
            }),
            Err(_) => {
                simple(out, 404, "not found\n", head_only)?;
                return Ok(true);
            }
        },
    };
    let len = source.len();
    let etag = source.etag();
    let range_allowed = fault != Some(Fault::IgnoreRange)
        && match &req.if_range {
            Some(v) => *v == etag,
            None => true,
        };
    let range = if range_allowed {
        req.range.as_deref().and_then(|r| parse_range(r, len))
    } else {
        None
    };
    let (status, start, end) = match range {
        Some(Err(())) => {
            let head = format!(
                "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\n\r\n"
            );
            out.write_all(head.as_bytes())?;
            return Ok(true);
        }
        Some(Ok((s, e))) => (206, s, e + 1),
        None => (200, 0, len),
    };
    let body_len = end - start;
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Length: {body_len}\r\nETag: {etag}\r\nAccept-Ranges: bytes\r\nContent-Type: application/octet-stream\r\n",
        reason(status)
    );
    if status == 206 {
        head.push_str(&format!(
            "Content-Range: bytes {start}-{}/{len}\r\n",
            end - 1
        ));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    if head_only {
        return Ok(true);
    }
    let (send, cut) = match fault {
        Some(Fault::Truncate(n)) => (body_len.min(n), Some(false)),
        Some(Fault::Reset(n)) => (body_len.min(n), Some(true)),
        _ => (body_len, None),
    };
    let rate = match fault {
        Some(Fault::Slow(r)) => Some(r),
        _ => *shared.rate.lock().unwrap(),
    };
    let count = |n: u64| {
        *shared
            .sent
            .lock()
            .unwrap()
            .entry(req.path.clone())
            .or_default() += n;
    };
    send_body(out, source.as_ref(), start, send, rate, &count)?;
    if let Some(Fault::OverSend(extra)) = fault {
        let junk = vec![b'X'; extra.min(1 << 20) as usize];
        out.write_all(&junk)?;
        out.flush()?;
        return Ok(false);
    }
    match cut {
        Some(true) => {
            out.reset();
            Ok(false)
        }
        Some(false) => Ok(false),
        None => Ok(true),
    }
}

fn send_body(
    out: &mut dyn SocketWrite,
    source: &dyn ReadAt,
    start: u64,
    count: u64,
    rate: Option<u64>,
    counted: &dyn Fn(u64),
) -> io::Result<()> {
    // Paced in writes of 1/100 s of the rate (at most 256 KiB): the schedule is absolute (a
    // write goes out when the bytes before it are due since the body began), so a late wake-up
    // is made up by the next write rather than lost, and a fast rate is not spent on thousands
    // of tiny sleeps a second that a loaded machine cannot keep. A body's last write arrives
    // at most one piece (10 ms) ahead of the rate; the next response on the connection waits
    // for it.
    let piece = match rate {
        Some(r) => (r / 100).clamp(1024, 256 * 1024) as usize,
        None => 256 * 1024,
    };
    let mut buf = vec![0u8; piece];
    let began = Instant::now();
    let mut sent = 0u64;
    while sent < count {
        let n = (count - sent).min(piece as u64) as usize;
        source.read_at(start + sent, &mut buf[..n])?;
        out.write_all(&buf[..n])?;
        counted(n as u64);
        sent += n as u64;
        if let Some(r) = rate
            && r > 0
        {
            let due = Duration::from_secs_f64(sent as f64 / r as f64);
            let elapsed = began.elapsed();
            if due > elapsed {
                thread::sleep(due - elapsed);
            }
        }
    }
    out.flush()
}

/// Where a response goes: a socket, or a buffer for a response that is trickled later.
trait SocketWrite: Write {
    /// End the connection with a TCP RST (nothing for a buffer).
    fn reset(&mut self) {}
}

impl SocketWrite for TcpStream {
    fn reset(&mut self) {
        reset(self);
    }
}

impl SocketWrite for Capture<'_> {}

fn reset(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    // SO_LINGER with a zero timeout makes close() send RST instead of FIN: the client sees
    // "connection reset by peer", as when a mobile link drops.
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket fd and a correctly sized, initialised linger struct.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

fn simple(out: &mut dyn SocketWrite, code: u16, body: &str, head_only: bool) -> io::Result<()> {
    let mut resp = format!(
        "HTTP/1.1 {code} {}\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n\r\n",
        reason(code),
        body.len()
    );
    if !head_only {
        resp.push_str(body);
    }
    out.write_all(resp.as_bytes())
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        206 => "Partial Content",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        416 => "Range Not Satisfiable",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

trait ReadAt: Send {
    fn len(&self) -> u64;
    fn etag(&self) -> String;
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
}

struct FileBody {
    file: File,
    len: u64,
    etag: String,
}

impl ReadAt for FileBody {
    fn len(&self) -> u64 {
        self.len
    }
    fn etag(&self) -> String {
        self.etag.clone()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut f = &self.file;
        f.seek(SeekFrom::Start(offset))?;
        f.read_exact(buf)
    }
}

struct MemBody(Vec<u8>);

impl ReadAt for MemBody {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }
    fn etag(&self) -> String {
        format!("\"mem-{:x}\"", self.0.len())
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let o = offset as usize;
        buf.copy_from_slice(&self.0[o..o + buf.len()]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(addr: SocketAddr, req: &str) -> Vec<u8> {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    }

    fn body_of(resp: &[u8]) -> &[u8] {
        let at = resp.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        &resp[at + 4..]
    }

    #[test]
    fn serves_ranges_and_faults() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/f.bin"), b"0123456789").unwrap();
        let srv = FaultServer::start(dir.path()).unwrap();
        let r = raw(
            srv.addr(),
            "GET /a/f.bin HTTP/1.1\r\nRange: bytes=2-4\r\nConnection: close\r\n\r\n",
        );
        assert!(r.starts_with(b"HTTP/1.1 206"));
        assert_eq!(body_of(&r), b"234");

        let r = raw(
            srv.addr(),
            "GET /a/../etc HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        assert!(
            r.starts_with(b"HTTP/1.1 400"),
            "{}",
            String::from_utf8_lossy(&r)
        );

        srv.add_fault("/a/f.bin", Fault::IgnoreRange, Some(1));
        let r = raw(
            srv.addr(),
            "GET /a/f.bin HTTP/1.1\r\nRange: bytes=2-4\r\nConnection: close\r\n\r\n",
        );
        assert!(r.starts_with(b"HTTP/1.1 200"));
        assert_eq!(body_of(&r), b"0123456789");

        srv.add_fault("/a/*", Fault::Truncate(3), Some(1));
        let r = raw(srv.addr(), "GET /a/f.bin HTTP/1.1\r\n\r\n");
        assert_eq!(body_of(&r), b"012");

        srv.add_fault("/a/f.bin", Fault::Status(429), Some(1));
        let r = raw(
            srv.addr(),
            "GET /a/f.bin HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        assert!(r.starts_with(b"HTTP/1.1 429"));

        srv.add_fault("/a/f.bin", Fault::OverSend(5), Some(1));
        let r = raw(srv.addr(), "GET /a/f.bin HTTP/1.1\r\n\r\n");
        assert_eq!(body_of(&r), b"0123456789XXXXX");

        // If-Range with a stale validator: the whole body, as RFC 9110 says.
        let r = raw(
            srv.addr(),
            "GET /a/f.bin HTTP/1.1\r\nRange: bytes=2-4\r\nIf-Range: \"old\"\r\nConnection: close\r\n\r\n",
        );
        assert!(r.starts_with(b"HTTP/1.1 200"));
        assert_eq!(srv.requests().len(), 7);
    }

    /// A slow path is served at its own rate while another path is not, and the bytes each
    /// path was sent are counted.
    #[test]
    fn slow_paths_and_byte_counts() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("hf")).unwrap();
        std::fs::create_dir_all(dir.path().join("gh")).unwrap();
        let data = vec![7u8; 20_000];
        std::fs::write(dir.path().join("hf/f"), &data).unwrap();
        std::fs::write(dir.path().join("gh/f"), &data).unwrap();
        let srv = FaultServer::start(dir.path()).unwrap();
        srv.add_fault("/hf/*", Fault::parse("slow:40000").unwrap(), None);
        let t = Instant::now();
        let r = raw(
            srv.addr(),
            "GET /hf/f HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(body_of(&r).len(), 20_000);
        assert!(
            t.elapsed() >= Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
        let t = Instant::now();
        raw(
            srv.addr(),
            "GET /gh/f HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        assert!(
            t.elapsed() < Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
        raw(
            srv.addr(),
            "GET /gh/f HTTP/1.1\r\nRange: bytes=0-99\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(srv.body_bytes_under("/hf/"), 20_000);
        assert_eq!(srv.body_bytes_under("/gh/"), 20_100);
        assert_eq!(
            Fault::parse("trickle:1000"),
            Ok(Fault::Trickle(Duration::from_secs(1)))
        );
        assert_eq!(Fault::parse("stall"), Ok(Fault::Stall));
        assert!(Fault::parse("slow:x").is_err() && Fault::parse("nap").is_err());
    }

    /// The per-connection cap never lets a body arrive faster than the rate allows, less its
    /// last write (1/100 s of the rate): a benchmark's link limit is a real limit.
    #[test]
    fn the_rate_cap_is_never_beaten() {
        let dir = tempfile::tempdir().unwrap();
        let len = 2 << 20;
        std::fs::write(dir.path().join("f"), vec![3u8; len]).unwrap();
        let rate = 8 << 20;
        let srv = FaultServer::with_config(ServerConfig {
            rate_per_conn: Some(rate),
            ..ServerConfig::new(dir.path())
        })
        .unwrap();
        let t = Instant::now();
        let r = raw(srv.addr(), "GET /f HTTP/1.1\r\nConnection: close\r\n\r\n");
        let took = t.elapsed();
        assert_eq!(body_of(&r).len(), len);
        let piece = rate / 100;
        let floor = Duration::from_secs_f64((len as u64 - piece) as f64 / rate as f64);
        assert!(took >= floor, "{took:?} < {floor:?}");
    }

    #[test]
    fn hostile_modes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"0123456789").unwrap();
        let srv = FaultServer::start(dir.path()).unwrap();
        srv.add_fault(
            "/f",
            Fault::Redirect {
                status: 302,
                location: Some("file:///etc/passwd".into()),
            },
            Some(1),
        );
        let r = raw(srv.addr(), "GET /f HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert!(r.starts_with(b"HTTP/1.1 302 "));
        assert!(String::from_utf8_lossy(&r).contains("\r\nLocation: file:///etc/passwd\r\n"));

        srv.add_fault("/f", Fault::Raw(b"HTTP/1.1 abc\r\n".to_vec()), Some(1));
        assert_eq!(
            raw(srv.addr(), "GET /f HTTP/1.1\r\n\r\n"),
            b"HTTP/1.1 abc\r\n"
        );

        srv.add_fault("/f", Fault::Trickle(Duration::from_millis(1)), Some(1));
        let r = raw(srv.addr(), "GET /f HTTP/1.1\r\nRange: bytes=2-4\r\n\r\n");
        assert!(r.starts_with(b"HTTP/1.1 206"));
        assert_eq!(body_of(&r), b"234");

        srv.add_fault("/f", Fault::Stall, Some(1));
        let mut s = TcpStream::connect(srv.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        s.write_all(b"GET /f HTTP/1.1\r\n\r\n").unwrap();
        let mut buf = [0u8; 1];
        let e = s.read(&mut buf).unwrap_err();
        assert!(matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ));
    }
}
