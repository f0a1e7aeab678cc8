//! `serve`: an HTTP mirror of a local store, in both URL layouts devices use.
//!
//! - `/buckets/<ns>/<name>/resolve/<path>`: store paths as they are (the Hugging Face layout);
//! - `/<owner>/<repo>/<branch>/<path>`: the GitHub raw layout, `model_names_<gen>.json` at the
//!   branch root and `<gen>/<id>/<file>`, mapped by `manifest::layout`;
//! - `/api/buckets/<ns>/<name>/tree/<prefix>`: the bucket tree listing, so the Hugging Face
//!   store can be pointed at a mirror (its tests do exactly that);
//! - any number of extra mounts (`/datasets/<org>/<repo>/resolve/<rev>/...` in tests).
//!
//! GET and HEAD; `Content-Length`; a strong `ETag` (size, modification time and inode: a file in
//! a store is only ever replaced by an atomic rename, which changes the inode); single `Range`
//! requests with 206 and 416 and `Accept-Ranges: bytes`; `If-Range` and `If-None-Match`. Anything
//! outside the store is 404, traversal and symlinks that leave the root included. One
//! `tracing` debug line per request.
//!
//! It is built on `std::net` on purpose: the surface is three routes and two methods, the bytes
//! are streamed from the file with a fixed buffer, and a thread per connection (capped) is ample
//! for a mirror a test car or a test suite talks to. Every response closes its connection, which
//! keeps request framing trivial and correct.
//!
//! Idle and slow clients cannot starve it: a connection must deliver its whole request head
//! within [`HEAD_TIMEOUT`] (a deadline for the head, not per read, so trickling does not extend
//! it); at most [`IDLE_PER_CLIENT`] connections per client address (and [`MAX_IDLE`] in all) may
//! be waiting for their head at once, and a new one beyond that closes the oldest waiting
//! connection that has sent nothing yet instead of being refused, so a client that sends its
//! request at once is answered however many idle connections are open. A connection whose
//! request bytes have arrived (read or not yet read by its thread) is never closed for this:
//! many clients behind one address that all send at once are all answered. Only connections with a request count against the
//! [`MAX_CONNECTIONS`] busy cap (503 beyond it).
//!
//! Nothing whose real path is outside the store is served or listed: a file's path and a tree
//! listing's prefix and every entry are resolved (`canonicalize`) and must stay under the root.

use std::collections::VecDeque;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

mod answer;
mod http;
mod route;

use answer::{respond, simple};
pub use http::{RangeAnswer, parse_range};
use http::{Request, read_request};

/// Connections with a request being answered at once; more get 503.
pub const MAX_CONNECTIONS: usize = 128;
/// Connections of one client address still waiting for their request head.
pub const IDLE_PER_CLIENT: usize = 16;
/// Connections of all clients still waiting for their request head.
pub const MAX_IDLE: usize = 256;
/// The whole request head must arrive within this time of the connection being accepted.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const IO_TIMEOUT: Duration = Duration::from_secs(30);
const BUF: usize = 256 * 1024;

/// How a URL prefix maps to store paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountKind {
    /// The rest of the URL is the store path.
    Identity,
    /// The rest of the URL is a GitHub branch path, mapped to the bucket layout.
    Github,
}

/// A URL prefix (`/buckets/NS/NAME/resolve/`) served from a directory.
#[derive(Debug, Clone)]
pub struct Mount {
    /// The URL prefix, starting and ending with `/`.
    pub prefix: String,
    /// The directory it serves (a store root in the bucket layout).
    pub root: PathBuf,
    /// How the rest of the URL maps to a store path.
    pub kind: MountKind,
    /// Serve `/api/buckets/<bucket>/tree/...` listings for this root too.
    pub tree_api_bucket: Option<String>,
}

/// What [`Server`] serves: URL prefixes mapped to store directories.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The mounts, tried in order.
    pub mounts: Vec<Mount>,
    /// Most requests [`Server::requests`] remembers; the oldest half is forgotten beyond it, so a
    /// mirror left running for days does not grow without bound. 0 (the default) keeps no log at
    /// all: only tests read it, through [`ServeConfig::with_request_log`].
    pub request_log_limit: usize,
}

/// The limit [`ServeConfig::with_request_log`] sets: far more than any test makes.
pub const REQUEST_LOG_LIMIT: usize = 10_000;

impl ServeConfig {
    /// The two device layouts over one store: `/buckets/<bucket>/resolve/` and
    /// `/<repo>/<branch>/`, plus the bucket's tree API.
    pub fn standard(store: &Path, bucket: &str, github_repo: &str, github_branch: &str) -> Self {
        Self {
            mounts: vec![
                Mount {
                    prefix: format!("/buckets/{bucket}/resolve/"),
                    root: store.to_path_buf(),
                    kind: MountKind::Identity,
                    tree_api_bucket: Some(bucket.to_string()),
                },
                Mount {
                    prefix: format!("/{github_repo}/{github_branch}/"),
                    root: store.to_path_buf(),
                    kind: MountKind::Github,
                    tree_api_bucket: None,
                },
            ],
            request_log_limit: 0,
        }
    }

    /// Test hook: remember served requests (up to [`REQUEST_LOG_LIMIT`]) for [`Server::requests`].
    /// A production server keeps none; `release-cli serve -v` logs requests to stderr instead.
    pub fn with_request_log(mut self) -> Self {
        self.request_log_limit = REQUEST_LOG_LIMIT;
        self
    }
}

/// One served request, for tests that must prove what did (or did not) go over the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// The request method.
    pub method: String,
    /// The request target as sent (path and query).
    pub target: String,
    /// The status answered.
    pub status: u16,
    /// Body bytes sent.
    pub bytes: u64,
    /// Whether the request carried an `Authorization` header. Its value is never kept: it may
    /// be a token.
    pub authorized: bool,
}

/// A running server. Dropping it stops it.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    log: Arc<Mutex<Vec<RequestRecord>>>,
}

impl Server {
    /// Bind (`127.0.0.1:0` picks a free port) and start serving on a background thread.
    pub fn start(addr: impl ToSocketAddrs, config: ServeConfig) -> Result<Self> {
        let listener = TcpListener::bind(addr).map_err(|source| Error::Serve {
            what: "bind the listen address",
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| Error::Serve {
            what: "read the bound address",
            source,
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let config = Arc::new(config);
        let thread = {
            let stop = stop.clone();
            let log = log.clone();
            std::thread::Builder::new()
                .name("serve-accept".into())
                .spawn(move || accept_loop(listener, config, stop, log))
                .map_err(|source| Error::Serve {
                    what: "start the accept thread",
                    source,
                })?
        };
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
            log,
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests served so far, when the config asked for a log
    /// ([`ServeConfig::with_request_log`]); always empty otherwise.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.log.lock().expect("log lock").clone()
    }

    /// Block until the server stops (it does not, unless dropped from elsewhere): for the CLI.
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connections still waiting for their request head, oldest first.
#[derive(Default)]
struct Waiting {
    next_id: u64,
    list: VecDeque<(u64, IpAddr, Instant, TcpStream)>,
}

impl Waiting {
    /// Register a new waiting connection; returns its id and the connections to close to keep
    /// within [`IDLE_PER_CLIENT`] and [`MAX_IDLE`] (the oldest of the same client first), among
    /// those that have sent nothing: one with request bytes in hand is left to its thread.
    fn add(&mut self, ip: IpAddr, stream: TcpStream) -> (u64, Vec<TcpStream>) {
        let id = self.next_id;
        self.next_id += 1;
        let now = Instant::now();
        self.list.push_back((id, ip, now, stream));
        let conns: Vec<Waiter> = self
            .list
            .iter()
            .map(|(_, ip, since, s)| Waiter {
                ip: *ip,
                idle: !has_unread_bytes(s),
                young: now.duration_since(*since) < SEND_GRACE,
            })
            .collect();
        let mut evicted = Vec::new();
        // Highest index first, so the earlier indices stay valid.
        for i in evictions(&conns, IDLE_PER_CLIENT, MAX_IDLE)
            .into_iter()
            .rev()
        {
            if let Some((_, _, _, s)) = self.list.remove(i) {
                evicted.push(s);
            }
        }
        (id, evicted)
    }

    fn remove(&mut self, id: u64) {
        self.list.retain(|(i, _, _, _)| *i != id);
    }
}

/// Whether the peer's bytes are waiting in the socket, unread: a peek that never blocks (the
/// connection's own thread reads the same socket with its timeouts, so the socket's blocking
/// mode is left alone).
fn has_unread_bytes(stream: &TcpStream) -> bool {
    use rustix::net::{RecvFlags, recv};
    // MSG_PEEK leaves the byte in the socket.
    recv(stream, &mut [0u8], RecvFlags::PEEK | RecvFlags::DONTWAIT).is_ok_and(|(n, _)| n > 0)
}

/// How long a new connection has to send its first bytes before it counts against its address's
/// bound of idle connections: clients that connect and send at once race the accept loop.
const SEND_GRACE: Duration = Duration::from_secs(1);

/// A connection waiting for its request head, as the eviction rule sees it.
#[derive(Debug, Clone, Copy)]
struct Waiter {
    ip: IpAddr,
    /// Nothing of its request is waiting in the socket.
    idle: bool,
    /// Accepted less than [`SEND_GRACE`] ago.
    young: bool,
}

/// Which waiting connections (oldest first, the newest last) to close so that no address has
/// more than `per_client` and there are no more than `total` in all: the oldest idle ones of an
/// address over its bound that had [`SEND_GRACE`] to send, then the oldest idle ones overall. A
/// connection whose request bytes have arrived is never chosen (its head deadline bounds it),
/// nor a young one for its address's bound. Pure. Sorted ascending.
fn evictions(conns: &[Waiter], per_client: usize, total: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut seen: std::collections::HashMap<IpAddr, usize> = std::collections::HashMap::new();
    for c in conns {
        *seen.entry(c.ip).or_default() += 1;
    }
    for (i, c) in conns.iter().enumerate() {
        let n = seen.get_mut(&c.ip).expect("counted");
        if *n > per_client && c.idle && !c.young {
            *n -= 1;
            out.push(i);
        }
    }
    let mut left = conns.len() - out.len();
    for (i, c) in conns.iter().enumerate() {
        if left <= total {
            break;
        }
        if c.idle && !out.contains(&i) {
            out.push(i);
            left -= 1;
        }
    }
    out.sort_unstable();
    out
}

fn accept_loop(
    listener: TcpListener,
    config: Arc<ServeConfig>,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<RequestRecord>>>,
) {
    let busy = Arc::new(AtomicUsize::new(0));
    let waiting = Arc::new(Mutex::new(Waiting::default()));
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = conn else { continue };
        let ip = stream
            .peer_addr()
            .map(|a| a.ip())
            .unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let Ok(handle_clone) = stream.try_clone() else {
            continue;
        };
        let (id, evicted) = waiting.lock().expect("waiting lock").add(ip, handle_clone);
        for s in evicted {
            // Its thread's read returns at once and the thread ends.
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        let (config, log, busy, waiting) =
            (config.clone(), log.clone(), busy.clone(), waiting.clone());
        let spawned = std::thread::Builder::new()
            .name("serve-conn".into())
            .spawn(move || {
                let req = read_request(&stream, Instant::now() + HEAD_TIMEOUT);
                waiting.lock().expect("waiting lock").remove(id);
                let req = match req {
                    Ok(Some(r)) => r,
                    _ => {
                        let mut s = &stream;
                        let _ = simple(&mut s, 400, "Bad Request", false);
                        return;
                    }
                };
                if busy.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                    busy.fetch_sub(1, Ordering::SeqCst);
                    let mut s = &stream;
                    let _ = s.write_all(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    return;
                }
                handle(&stream, req, &config, &log);
                busy.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            // Could not start a thread: the connection is dropped, the server goes on.
            continue;
        }
    }
}

/// The request target as the `-v` log shows it: the path only. A query string may carry a
/// credential (`?token=…`), and nothing we serve reads one.
fn logged_target(target: &str) -> &str {
    target.split(['?', '#']).next().unwrap_or("")
}

fn handle(stream: &TcpStream, req: Request, config: &ServeConfig, log: &Mutex<Vec<RequestRecord>>) {
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let mut out = stream;
    let (status, bytes) = respond(&mut out, &req, config).unwrap_or((0, 0));
    tracing::debug!(
        method = %req.method,
        target = %logged_target(&req.target),
        status,
        bytes,
        "request"
    );
    if config.request_log_limit == 0 {
        let _ = stream.shutdown(std::net::Shutdown::Write);
        return;
    }
    let mut log = log.lock().expect("log lock");
    if log.len() >= config.request_log_limit {
        // Forget the oldest half at once: amortized O(1) per request.
        let half = log.len().div_ceil(2);
        log.drain(..half);
    }
    log.push(RequestRecord {
        method: req.method.clone(),
        target: req.target.clone(),
        status,
        bytes,
        authorized: req.header("authorization").is_some(),
    });
    drop(log);
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

#[cfg(test)]
mod tests {
    /// Regression: `serve -v` logged the whole target, a `?token=…` query included.
    #[test]
    fn the_log_shows_the_path_without_its_query() {
        for (target, logged) in [
            ("/models/v25/a.pkl", "/models/v25/a.pkl"),
            ("/m.json?token=hf_SECRET", "/m.json"),
            ("/m.json#frag", "/m.json"),
            ("?token=x", ""),
        ] {
            assert_eq!(super::logged_target(target), logged, "{target}");
        }
    }

    use super::*;
    use http::percent_decode;

    use std::io::Read;
    #[test]
    fn ranges() {
        use RangeAnswer::*;
        assert_eq!(parse_range("bytes=0-0", 10), Partial { start: 0, end: 0 });
        assert_eq!(parse_range("bytes=2-", 10), Partial { start: 2, end: 9 });
        assert_eq!(parse_range("bytes=2-100", 10), Partial { start: 2, end: 9 });
        assert_eq!(parse_range("bytes=-3", 10), Partial { start: 7, end: 9 });
        assert_eq!(parse_range("bytes=-30", 10), Partial { start: 0, end: 9 });
        assert_eq!(parse_range("bytes=10-", 10), Unsatisfiable);
        assert_eq!(parse_range("bytes=-0", 10), Unsatisfiable);
        assert_eq!(parse_range("bytes=0-", 0), Unsatisfiable);
        assert_eq!(parse_range("bytes=5-2", 10), Full);
        assert_eq!(parse_range("bytes=0-1,3-4", 10), Full);
        assert_eq!(parse_range("items=0-1", 10), Full);
        assert_eq!(parse_range("bytes=x-1", 10), Full);
    }

    #[test]
    fn serve_request_log_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut config =
            ServeConfig::standard(dir.path(), "a/b", "o/r", "Models").with_request_log();
        config.request_log_limit = 4;
        let server = Server::start("127.0.0.1:0", config).unwrap();
        for i in 0..10 {
            let mut s = TcpStream::connect(server.addr()).unwrap();
            write!(s, "GET /r{i} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let _ = s.read_to_end(&mut Vec::new());
        }
        // The log is pushed after the response; give the last handler a moment.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while server.requests().last().map(|r| r.target.as_str()) != Some("/r9") {
            assert!(
                std::time::Instant::now() < deadline,
                "{:?}",
                server.requests()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let log = server.requests();
        assert!(log.len() <= 4, "{log:?}");
        assert!(log.iter().all(|r| r.status == 404));
    }

    /// Regression: every request's `Authorization` header was kept in memory, in production too.
    #[test]
    fn serve_keeps_no_log_unless_asked_and_never_a_secret() {
        let dir = tempfile::tempdir().unwrap();
        let send = |server: &Server| {
            let mut s = TcpStream::connect(server.addr()).unwrap();
            write!(
                s,
                "GET /r HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer hf_secret\r\n\r\n"
            )
            .unwrap();
            let _ = s.read_to_end(&mut Vec::new());
        };
        let plain = ServeConfig::standard(dir.path(), "a/b", "o/r", "Models");
        assert_eq!(plain.request_log_limit, 0);
        let server = Server::start("127.0.0.1:0", plain).unwrap();
        send(&server);
        send(&server);
        let log = server.log.clone();
        drop(server);
        assert!(log.lock().unwrap().is_empty(), "a log was kept unasked");
        let config = ServeConfig::standard(dir.path(), "a/b", "o/r", "Models").with_request_log();
        let logged = Server::start("127.0.0.1:0", config).unwrap();
        send(&logged);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while logged.requests().is_empty() {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(10));
        }
        let r = &logged.requests()[0];
        assert!(r.authorized);
        assert!(!format!("{r:?}").contains("hf_secret"), "{r:?}");
    }

    #[test]
    fn unread_bytes_are_seen_without_being_taken_or_blocking() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        // a blocking peek would wait out this timeout
        server
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let start = std::time::Instant::now();
        assert!(!has_unread_bytes(&server), "nothing was sent yet");
        assert!(start.elapsed() < Duration::from_secs(1), "the peek blocked");
        client.write_all(b"G").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !has_unread_bytes(&server) {
            assert!(
                std::time::Instant::now() < deadline,
                "the byte never showed"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut byte = [0u8];
        server.read_exact(&mut byte).unwrap();
        assert_eq!(&byte, b"G", "the peek left the byte in the socket");
        assert!(!has_unread_bytes(&server));
    }

    #[test]
    fn eviction_rule() {
        let a = IpAddr::from([10, 0, 0, 1]);
        let b = IpAddr::from([10, 0, 0, 2]);
        let w = |ip: IpAddr, idle: bool, young: bool| Waiter { ip, idle, young };
        let idle = |ips: &[IpAddr]| ips.iter().map(|ip| w(*ip, true, false)).collect::<Vec<_>>();
        assert!(evictions(&idle(&[a, a, b]), 2, 10).is_empty());
        // Three of `a` with a bound of two: the oldest `a` goes.
        assert_eq!(evictions(&idle(&[a, b, a, a]), 2, 10), [0]);
        assert_eq!(evictions(&idle(&[b, a, a, a, a]), 2, 10), [1, 2]);
        // Over the total: the oldest overall, after the per-client ones.
        assert_eq!(evictions(&idle(&[b, a, a, a]), 2, 2), [0, 1]);
        assert_eq!(evictions(&[], 2, 2), Vec::<usize>::new());
        // A connection whose request has arrived is never closed: the oldest idle one of the
        // address goes instead, or none when every one of them has sent its request.
        let (sent, waited) = (false, true);
        assert_eq!(
            evictions(
                &[w(a, sent, false), w(a, waited, false), w(a, waited, false)],
                2,
                10
            ),
            [1]
        );
        assert!(
            evictions(
                &[w(a, sent, false), w(a, sent, false), w(a, sent, false)],
                2,
                10
            )
            .is_empty()
        );
        assert_eq!(
            evictions(
                &[w(b, sent, false), w(a, waited, false), w(a, sent, false)],
                2,
                2
            ),
            [1]
        );
        // Within the grace a new idle connection does not count against its address (it may be
        // about to send), but does against the total.
        assert!(
            evictions(
                &[w(a, waited, true), w(a, waited, true), w(a, waited, true)],
                2,
                10
            )
            .is_empty()
        );
        assert_eq!(
            evictions(
                &[w(a, waited, true), w(a, waited, true), w(a, waited, true)],
                2,
                2
            ),
            [0]
        );
    }

    /// `/` answers with the mounts' base paths (it was a bare 404), HEAD too; a mount at `/`
    /// keeps `/` for itself.
    #[test]
    fn the_root_answers_with_an_index_of_the_base_paths() {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(
            "127.0.0.1:0",
            ServeConfig::standard(dir.path(), "ns/b", "o/r", "Models"),
        )
        .unwrap();
        let get = |method: &str| {
            let mut s = TcpStream::connect(server.addr()).unwrap();
            write!(s, "{method} / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut reply = String::new();
            s.read_to_string(&mut reply).unwrap();
            reply
        };
        let reply = get("GET");
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        for line in [
            "  /buckets/ns/b/resolve/  store paths as they are",
            "  /api/buckets/ns/b/tree/  the bucket's file listing",
            "  /o/r/Models/  the GitHub raw layout",
        ] {
            assert!(reply.contains(line), "{line}: {reply}");
        }
        let head = get("HEAD");
        assert!(
            head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        let mut rooted = ServeConfig::standard(dir.path(), "ns/b", "o/r", "Models");
        rooted.mounts[0].prefix = "/".into();
        assert!(matches!(route::route(&rooted, "/"), route::Route::NotFound));
    }

    /// Regression: 24–64 clients behind one address that each sent their request at once had
    /// some connections closed unanswered (the oldest beyond the per-address bound of waiting
    /// connections, whose request bytes had already arrived).
    #[test]
    fn many_clients_from_one_address_are_all_answered() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"hello").unwrap();
        let mut config = ServeConfig::standard(dir.path(), "a/b", "o/r", "Models");
        config.mounts[0].prefix = "/".into();
        let server = Server::start("127.0.0.1:0", config).unwrap();
        let clients = 4 * IDLE_PER_CLIENT;
        // Open every connection and send every request before reading any answer, so that
        // many are accepted while the others still wait for their thread.
        let mut streams: Vec<TcpStream> = (0..clients)
            .map(|_| {
                let mut s = TcpStream::connect(server.addr()).unwrap();
                s.write_all(b"GET /f HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
                s
            })
            .collect();
        let mut answered = 0;
        for s in &mut streams {
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut reply = Vec::new();
            let _ = s.read_to_end(&mut reply);
            if reply.starts_with(b"HTTP/1.1 200") && reply.ends_with(b"hello") {
                answered += 1;
            }
        }
        assert_eq!(answered, clients, "every request that arrived is answered");
    }

    #[test]
    fn decoding() {
        assert_eq!(percent_decode("/a%20b").as_deref(), Some("/a b"));
        assert_eq!(percent_decode("/%2e%2e/x").as_deref(), Some("/../x"));
        assert_eq!(percent_decode("/%zz"), None);
        assert_eq!(percent_decode("/%2"), None);
    }
}
