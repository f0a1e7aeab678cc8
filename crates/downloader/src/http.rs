//! A blocking HTTP client that a hostile or broken origin cannot turn against the device.
//!
//! ureq (no async runtime, rustls) does the wire work; every decision that protects the device
//! is taken here:
//! - **Redirects are followed by us** (ureq 2 panics on a redirect to a URL with no host): only
//!   to `http`/`https` with a host, never down to `http`, never with user info, at most
//!   [`HttpConfig::max_redirects`] times, credentials only to their own origin ([`next_hop`]).
//! - **Every request runs on its own thread** while the caller polls a channel, checking cancel,
//!   deadline, response timeout and minimum rate, so nothing the network does can hold it; an
//!   abandoned thread ends by itself, at the origin deadline at the latest.
//! - **A panic inside the HTTP stack** is caught on that thread and becomes a transfer error.

use std::io::Read;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::thread;
use std::time::{Duration, Instant};

use url::Url;

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::policy::GiveUp;

/// Timeouts, rate floor, redirect bound and pool size of every device request.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// TCP (and TLS) connect.
    pub connect_timeout: Duration,
    /// Idle timeout: the longest silence on an open connection (between any two reads).
    pub read_timeout: Duration,
    /// From sending a request to having the final response's headers, redirects included.
    pub response_timeout: Duration,
    /// Minimum transfer rate of a body in bytes per second, averaged over `rate_window`; a slower
    /// transfer fails (and is retried, within the origin's deadline).
    pub min_rate: u64,
    /// The window [`HttpConfig::min_rate`] is averaged over.
    pub rate_window: Duration,
    /// How long one origin may take before the next is tried: the whole manifest fetch, or,
    /// for an artifact, this plus `size / deadline_rate` (retries and backoff included).
    pub origin_deadline: Duration,
    /// The rate an artifact's deadline is computed at (see [`HttpConfig::artifact_deadline`]):
    /// far above `min_rate`, so that a 200 MB artifact gets about half an hour, not 14 h.
    pub deadline_rate: u64,
    /// Redirect hops followed per request.
    pub max_redirects: u32,
    /// Idle connections kept open per host for reuse.
    pub max_idle_per_host: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(20),
            response_timeout: Duration::from_secs(30),
            min_rate: 4 * 1024,
            rate_window: Duration::from_secs(20),
            origin_deadline: Duration::from_secs(120),
            deadline_rate: 128 * 1024,
            max_redirects: 5,
            max_idle_per_host: 16,
        }
    }
}

impl HttpConfig {
    /// The deadline of one origin for an artifact of `size` bytes, from `now`:
    /// `origin_deadline + size / deadline_rate` (defaults: 120 s + size / 128 KiB/s, so 3 MB
    /// gets 142 s, 200 MB 1 645 s ≈ 27 min, 1 GiB 8 312 s ≈ 2.3 h). An origin that misses it is
    /// given up for the run; the bytes it staged are kept for the other origin and later runs.
    pub fn artifact_deadline(&self, now: Instant, size: u64) -> Instant {
        let transfer = Duration::from_secs(size / self.deadline_rate.max(1));
        now.checked_add(self.origin_deadline.saturating_add(transfer))
            .unwrap_or(now + Duration::from_secs(365 * 24 * 3600))
    }
}

/// How often a waiting caller looks at its cancel flag and clocks.
const POLL: Duration = Duration::from_millis(50);
/// Body bytes handed over per message at most; with at most `QUEUE` messages waiting, a request
/// never buffers more than `QUEUE * PIECE` bytes.
const PIECE: usize = 256 * 1024;
const QUEUE: usize = 4;
/// The longest a request thread gathers body reads before handing them over.
const GATHER: Duration = Duration::from_millis(10);
/// How long [`Body::finish`] waits for the end of a body whose bytes were all read.
const FINISH_WAIT: Duration = Duration::from_millis(200);

/// What stops a request early: a cancel, another worker's failure, the origin's deadline.
#[derive(Clone)]
pub(crate) struct Ctl {
    pub cancel: CancelToken,
    pub abort: Option<Arc<AtomicBool>>,
    pub deadline: Instant,
    /// What a cancel error names (a model id or "the v25 manifest").
    pub what: String,
    /// The deadline's length, for the message.
    pub budget: Duration,
}

impl Ctl {
    pub fn new(cancel: &CancelToken, what: &str, budget: Duration, deadline: Instant) -> Self {
        Self {
            cancel: cancel.clone(),
            abort: None,
            deadline,
            what: what.to_string(),
            budget,
        }
    }

    pub fn check(&self, url: &str) -> Result<()> {
        if self.cancel.is_cancelled()
            || self
                .abort
                .as_ref()
                .is_some_and(|a| a.load(Ordering::SeqCst))
        {
            return Err(Error::cancelled(&self.what));
        }
        if Instant::now() >= self.deadline {
            return Err(Error::Deadline {
                url: url.to_string(),
                seconds: self.budget.as_secs(),
            });
        }
        Ok(())
    }
}

#[derive(Clone)]
pub struct Http {
    agent: ureq::Agent,
    config: HttpConfig,
}

/// Headers of a 200 or 206 response.
#[derive(Debug, Clone, Default)]
pub struct Meta {
    pub status: u16,
    pub content_length: Option<u64>,
    /// `Content-Range: bytes a-b/total` parsed, on 206.
    pub content_range: Option<(u64, u64, Option<u64>)>,
    pub etag: Option<String>,
}

enum Msg {
    Head(Result<Meta>),
    Data(Vec<u8>),
    End,
    Fail(String),
}

/// A response whose status was 200 or 206, its body streamed from the request thread.
pub struct Body {
    pub meta: Meta,
    url: String,
    rx: Receiver<Msg>,
    buf: Vec<u8>,
    pos: usize,
    ended: bool,
    ctl: Ctl,
    rate: RateGuard,
}

impl Body {
    /// Read up to `out.len()` bytes; `Ok(0)` at the end of the body. Fails on cancel, deadline,
    /// a transfer slower than the floor, or a broken connection.
    pub fn read(&mut self, out: &mut [u8]) -> Result<usize> {
        loop {
            if self.pos < self.buf.len() {
                let n = out.len().min(self.buf.len() - self.pos);
                out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
                self.pos += n;
                return Ok(n);
            }
            if self.ended || out.is_empty() {
                return Ok(0);
            }
            self.ctl.check(&self.url)?;
            if let Some(message) = self.rate.check(Instant::now()) {
                return Err(Error::TooSlow {
                    url: self.url.clone(),
                    message,
                    why: GiveUp::MinRate,
                });
            }
            match self.rx.recv_timeout(POLL) {
                Ok(Msg::Data(v)) => {
                    self.rate.observe(Instant::now(), v.len() as u64);
                    self.buf = v;
                    self.pos = 0;
                }
                Ok(Msg::End) => self.ended = true,
                Ok(Msg::Fail(message)) => {
                    return Err(Error::transport(&self.url, message));
                }
                Ok(Msg::Head(_)) => {
                    return Err(Error::protocol(&self.url, "a second response head"));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::transport(
                        &self.url,
                        "the connection ended without finishing the body",
                    ));
                }
            }
        }
    }

    /// The caller has read every byte it asked for: wait (briefly) for the request thread to
    /// see the body end, which is when the connection goes back to the pool, so that the next
    /// request reuses it instead of opening another (a new TCP and TLS handshake, and one more
    /// connection than the download's count). Anything unexpected just ends the wait: the
    /// connection is then not reused, nothing else changes.
    pub fn finish(&mut self) {
        let until = Instant::now() + FINISH_WAIT;
        while !self.ended && self.pos >= self.buf.len() {
            let left = until.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left.min(POLL)) {
                Ok(Msg::End) => self.ended = true,
                Ok(_) | Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) if left.is_zero() => return,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Read and drop `n` bytes; fewer available is a transfer error.
    pub fn skip(&mut self, n: u64) -> Result<()> {
        let mut buf = vec![0u8; PIECE];
        let mut left = n;
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            let got = self.read(&mut buf[..want])?;
            if got == 0 {
                return Err(Error::transport(
                    &self.url,
                    format!("body ended after {} bytes", n - left),
                ));
            }
            left -= got as u64;
        }
        Ok(())
    }
}

impl Http {
    pub fn new(config: &HttpConfig) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(config.connect_timeout)
            .timeout_read(config.read_timeout)
            .timeout_write(config.read_timeout)
            .max_idle_connections_per_host(config.max_idle_per_host)
            // Never let ureq follow a redirect: see the module docs.
            .redirects(0)
            .user_agent(concat!(
                "starpilot-device-modeld-manager/",
                env!("CARGO_PKG_VERSION")
            ))
            .build();
        Self {
            agent,
            config: config.clone(),
        }
    }

    /// GET `url`, optionally with a byte range (`end` inclusive) and an `If-Range` validator.
    pub fn get(
        &self,
        url: &str,
        range: Option<(u64, u64)>,
        if_range: Option<&str>,
        ctl: &Ctl,
    ) -> Result<Body> {
        let mut headers = Vec::new();
        if let Some((a, b)) = range {
            headers.push(("Range".to_string(), format!("bytes={a}-{b}")));
            if let Some(tag) = if_range {
                headers.push(("If-Range".to_string(), tag.to_string()));
            }
        }
        self.issue("GET", url, headers, ctl, true)?.wait(ctl)
    }

    /// HEAD `url`: the length and ETag.
    pub fn head(&self, url: &str, ctl: &Ctl) -> Result<(Option<u64>, Option<String>)> {
        let body = self.issue("HEAD", url, Vec::new(), ctl, false)?.wait(ctl)?;
        Ok((body.meta.content_length, body.meta.etag))
    }

    /// GET a small document, reading at most `max` bytes; a longer body is a protocol error
    /// (never buffered beyond `max + 1`).
    pub fn get_small(&self, url: &str, max: u64, ctl: &Ctl) -> Result<Vec<u8>> {
        let mut body = self.get(url, None, None, ctl)?;
        if let Some(len) = body.meta.content_length
            && len > max
        {
            return Err(Error::protocol(
                url,
                format!("body is {len} bytes, more than the limit of {max}"),
            ));
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; PIECE];
        loop {
            let n = body.read(&mut buf)?;
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
            if out.len() as u64 > max {
                return Err(Error::protocol(
                    url,
                    format!("body is more than the limit of {max} bytes"),
                ));
            }
        }
    }

    /// Send `GET url` (with a byte range, `end` inclusive) now and return without waiting for
    /// the answer: [`Pending::wait`] takes it up later. A download sends a connection's next
    /// range this way shortly before the current answer ends, so that the next answer's latency
    /// passes while the last bytes of this one still arrive.
    pub fn get_later(&self, url: &str, range: (u64, u64), ctl: &Ctl) -> Result<Pending> {
        let headers = vec![(
            "Range".to_string(),
            format!("bytes={}-{}", range.0, range.1),
        )];
        self.issue("GET", url, headers, ctl, true)
    }

    /// Start `method url` on a request thread; the caller waits for its head with
    /// [`Pending::wait`].
    fn issue(
        &self,
        method: &'static str,
        url: &str,
        headers: Vec<(String, String)>,
        ctl: &Ctl,
        want_body: bool,
    ) -> Result<Pending> {
        ctl.check(url)?;
        let first = Url::parse(url)
            .map_err(|e| format!("not a URL ({e})"))
            .and_then(check_url)
            .map_err(|reason| Error::Redirect {
                url: url.to_string(),
                location: url.to_string(),
                reason,
            })?;
        let (tx, rx) = mpsc::sync_channel::<Msg>(QUEUE);
        let job = RequestJob {
            agent: self.agent.clone(),
            method,
            first,
            headers,
            max_redirects: self.config.max_redirects,
            deadline: ctl.deadline,
            want_body,
        };
        thread::Builder::new()
            .name("http-request".into())
            .spawn(move || {
                let res = std::panic::catch_unwind(AssertUnwindSafe(|| job.run(&tx)));
                if let Err(panic) = res {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown".into());
                    let message = format!("the HTTP client failed on this response ({what})");
                    // Whichever message the caller waits for, it sees this one.
                    let _ = tx.send(Msg::Fail(message));
                }
            })
            .map_err(|e| Error::transport(url, format!("cannot start a request thread: {e}")))?;
        Ok(Pending {
            url: url.to_string(),
            rx,
            started: Instant::now(),
            want_body,
            config: self.config.clone(),
        })
    }
}

/// A request sent on its own thread whose response head has not been taken up yet
/// ([`Http::get_later`]). Dropped without [`Pending::wait`], its thread ends by itself (at its
/// next send, or the origin's deadline).
pub struct Pending {
    url: String,
    rx: Receiver<Msg>,
    started: Instant,
    want_body: bool,
    config: HttpConfig,
}

impl Pending {
    /// When the request was sent.
    pub fn sent_at(&self) -> Instant {
        self.started
    }

    /// Wait for the final response head (the response timeout counted from when the request
    /// was sent); the body then streams as [`Http::get`]'s does.
    pub fn wait(self, ctl: &Ctl) -> Result<Body> {
        let (url, rx, config) = (self.url.as_str(), self.rx, &self.config);
        let head = loop {
            ctl.check(url)?;
            if self.started.elapsed() >= config.response_timeout {
                return Err(Error::TooSlow {
                    url: url.to_string(),
                    message: format!(
                        "no response within {} s",
                        config.response_timeout.as_secs_f32()
                    ),
                    why: GiveUp::Silent,
                });
            }
            match rx.recv_timeout(POLL) {
                Ok(Msg::Head(h)) => break h?,
                Ok(Msg::Fail(message)) => {
                    return Err(Error::transport(url, message));
                }
                Ok(_) => {
                    return Err(Error::protocol(url, "body before the response head"));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::transport(
                        url,
                        "the request ended without a response",
                    ));
                }
            }
        };
        Ok(Body {
            meta: head,
            url: url.to_string(),
            rx,
            buf: Vec::new(),
            pos: 0,
            ended: !self.want_body,
            ctl: ctl.clone(),
            rate: RateGuard::new(Instant::now(), config.min_rate, config.rate_window),
        })
    }
}

/// Everything a request thread needs, owned.
struct RequestJob {
    agent: ureq::Agent,
    method: &'static str,
    first: Url,
    headers: Vec<(String, String)>,
    max_redirects: u32,
    deadline: Instant,
    want_body: bool,
}

impl RequestJob {
    fn run(self, tx: &SyncSender<Msg>) {
        let resp = match self.respond() {
            Ok(resp) => resp,
            Err(e) => {
                let _ = tx.send(Msg::Head(Err(e)));
                return;
            }
        };
        let meta = Meta {
            status: resp.status(),
            content_length: resp
                .header("content-length")
                .and_then(|v| v.trim().parse().ok()),
            content_range: resp.header("content-range").and_then(parse_content_range),
            etag: resp.header("etag").map(str::to_string),
        };
        if tx.send(Msg::Head(Ok(meta))).is_err() || !self.want_body {
            return;
        }
        stream_body(resp.into_reader(), tx);
    }

    /// The final answer, after the redirects allowed (credentials sent to the first origin
    /// only), within the deadline: a 200 or a 206, else the error it comes to.
    fn respond(&self) -> Result<ureq::Response> {
        let url0 = self.first.to_string();
        let mut url = self.first.clone();
        let mut hops = 0;
        loop {
            let remaining = self.deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(Error::transport(&url0, "the origin's deadline passed"));
            }
            let mut req = self.agent.request_url(self.method, &url).timeout(remaining);
            let same_origin = same_origin(&self.first, &url);
            for (name, value) in &self.headers {
                if !same_origin && is_credential(name) {
                    continue;
                }
                req = req.set(name, value);
            }
            let resp = req.call().map_err(|e| call_error(&url0, e))?;
            let status = resp.status();
            if !(300..400).contains(&status) {
                if status != 200 && status != 206 {
                    return Err(Error::Status { url: url0, status });
                }
                return Ok(resp);
            }
            let location = resp.header("location").map(str::to_string);
            match next_hop(&url, location.as_deref(), hops, self.max_redirects) {
                Ok(next) => {
                    url = next;
                    hops += 1;
                }
                Err(reason) => {
                    return Err(Error::Redirect {
                        url: url0,
                        location: location.unwrap_or_default(),
                        reason,
                    });
                }
            }
        }
    }
}

/// What a failed request comes to (`url0`: the URL first asked for).
fn call_error(url0: &str, e: ureq::Error) -> Error {
    let url = url0.to_string();
    match e {
        // A range inside the size the manifest implies lies past the end of the file the
        // origin serves: it has another file than the manifest describes (a store half-way
        // through a republish), "not yet".
        ureq::Error::Status(416, resp) => Error::size_mismatch(
            &url,
            format!(
                "HTTP 416: the range asked for is past the end of the published file \
                 (Content-Range {:?})",
                resp.header("content-range").unwrap_or("")
            ),
        ),
        ureq::Error::Status(status, _) => Error::Status { url, status },
        // No connection at all (refused, no address, or a connect that timed out): a network
        // hiccup as much as a dead origin; the policy gives it up only after several in a row
        // (`policy::after`).
        ureq::Error::Transport(t) if is_no_connection(&t) => Error::NoConnection {
            url,
            timed_out: is_timeout(&t),
            message: t.to_string(),
        },
        // Accepted, then silent past the idle timeout: the origin is not answering, not merely
        // flaky.
        ureq::Error::Transport(t) if is_timeout(&t) => Error::TooSlow {
            url,
            message: t.to_string(),
            why: GiveUp::Silent,
        },
        ureq::Error::Transport(t) => Error::transport(&url, t.to_string()),
    }
}

/// Hand the body over in messages until it ends or fails (or the reader hung up).
fn stream_body(mut reader: impl Read, tx: &SyncSender<Msg>) {
    let mut buf = vec![0u8; PIECE];
    loop {
        // Gather reads (ureq's are 8 KiB) into one message until it is full or [`GATHER`] has
        // passed: a fast body goes over in few messages, a slow one read by read.
        let began = Instant::now();
        let mut filled = 0;
        let end = loop {
            match reader.read(&mut buf[filled..]) {
                Ok(0) => break Ok(true),
                Ok(n) => {
                    filled += n;
                    if filled == buf.len() || began.elapsed() >= GATHER {
                        break Ok(false);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        // What arrived before an error is handed over first: a retry resumes after it.
        if filled > 0 && tx.send(Msg::Data(buf[..filled].to_vec())).is_err() {
            return;
        }
        match end {
            Ok(false) => {}
            Ok(true) => {
                let _ = tx.send(Msg::End);
                return;
            }
            Err(e) => {
                let _ = tx.send(Msg::Fail(e.to_string()));
                return;
            }
        }
    }
}

/// Whether a transport error is a connection never made: refused, a connect that timed out,
/// or a name that did not resolve.
fn is_no_connection(t: &ureq::Transport) -> bool {
    matches!(
        t.kind(),
        ureq::ErrorKind::ConnectionFailed | ureq::ErrorKind::Dns
    )
}

/// Whether a transport error is a timeout (connect, or a read that waited past the idle
/// timeout).
fn is_timeout(t: &ureq::Transport) -> bool {
    let mut source = std::error::Error::source(t);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            );
        }
        source = e.source();
    }
    false
}

/// Why a URL may not be requested, if it may not: only `http`/`https` with a host and no user
/// info.
fn check_url(url: Url) -> std::result::Result<Url, String> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("scheme `{}` is not http or https", url.scheme()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("the URL carries user info".into());
    }
    Ok(url)
}

/// Where a redirect from `current` with `location` leads, after `hops` earlier hops, or why it
/// is refused. Pure: the rule every redirect goes through.
pub(crate) fn next_hop(
    current: &Url,
    location: Option<&str>,
    hops: u32,
    max: u32,
) -> std::result::Result<Url, String> {
    let location = location.ok_or("a redirect without a Location header")?;
    if hops >= max {
        return Err(format!("more than {max} redirects"));
    }
    let next = current
        .join(location.trim())
        .map_err(|e| format!("unusable Location ({e})"))?;
    let next = check_url(next)?;
    if current.scheme() == "https" && next.scheme() == "http" {
        return Err("a redirect from https down to http".into());
    }
    Ok(next)
}

/// Whether `a` and `b` are the same origin (scheme, host, port): the only case in which
/// credentials given for `a` may be sent to `b`.
pub(crate) fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

fn is_credential(header: &str) -> bool {
    header.eq_ignore_ascii_case("authorization")
        || header.eq_ignore_ascii_case("cookie")
        || header.eq_ignore_ascii_case("proxy-authorization")
}

/// The minimum-rate rule: bytes seen in the current window of `window`; when a window closes
/// with fewer than `min_rate * window` bytes, the transfer is too slow. Pure over the clock it is
/// given.
#[derive(Debug, Clone)]
pub(crate) struct RateGuard {
    min_rate: u64,
    window: Duration,
    start: Instant,
    bytes: u64,
}

impl RateGuard {
    pub fn new(now: Instant, min_rate: u64, window: Duration) -> Self {
        Self {
            min_rate,
            window,
            start: now,
            bytes: 0,
        }
    }

    pub fn observe(&mut self, now: Instant, bytes: u64) {
        self.bytes = self.bytes.saturating_add(bytes);
        if now.duration_since(self.start) >= self.window && self.check(now).is_none() {
            self.start = now;
            self.bytes = 0;
        }
    }

    /// Why the transfer is too slow, if it is.
    pub fn check(&self, now: Instant) -> Option<String> {
        if self.min_rate == 0 || now.duration_since(self.start) < self.window {
            return None;
        }
        let need = (self.min_rate as f64 * self.window.as_secs_f64()) as u64;
        (self.bytes < need).then(|| {
            format!(
                "{} in {:.1} s, slower than the minimum of {}/s",
                cli_support::progress::bytes(self.bytes),
                now.duration_since(self.start).as_secs_f64(),
                cli_support::progress::bytes(self.min_rate)
            )
        })
    }
}

/// `bytes a-b/total` or `bytes a-b/*`.
fn parse_content_range(v: &str) -> Option<(u64, u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    let total = if total == "*" {
        None
    } else {
        Some(total.trim().parse().ok()?)
    };
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range() {
        assert_eq!(
            super::parse_content_range("bytes 2-4/10"),
            Some((2, 4, Some(10)))
        );
        assert_eq!(
            super::parse_content_range("bytes 2-4/*"),
            Some((2, 4, None))
        );
        assert_eq!(super::parse_content_range("items 2-4/10"), None);
        assert_eq!(
            super::parse_content_range("bytes 99999999999999999999-4/10"),
            None
        );
    }

    #[test]
    fn redirect_rule() {
        let http: Url = "http://origin.example/a/b".parse().unwrap();
        let https: Url = "https://origin.example/a/b".parse().unwrap();
        let ok = |from: &Url, loc: &str| next_hop(from, Some(loc), 0, 5).map(|u| u.to_string());
        let cases: &[(&Url, &str, std::result::Result<&str, &str>)] = &[
            (&http, "/c", Ok("http://origin.example/c")),
            (&http, "c", Ok("http://origin.example/a/c")),
            (&http, "https://cdn.example/x", Ok("https://cdn.example/x")),
            (&https, "//cdn.example/x", Ok("https://cdn.example/x")),
            (&https, "http://cdn.example/x", Err("down to http")),
            (&http, "file:///etc/passwd", Err("scheme `file`")),
            (&http, "data:text/plain,hi", Err("scheme `data`")),
            (&http, "mailto:a@b.c", Err("scheme `mailto`")),
            (&http, "unix:/run/x.sock", Err("scheme `unix`")),
            (&http, "ftp://h/x", Err("scheme `ftp`")),
            (&http, "http://", Err("")),
            (&http, "http://user:pw@cdn.example/", Err("user info")),
            (&http, "http://[::1", Err("unusable Location")),
        ];
        for (from, loc, want) in cases {
            let got = ok(from, loc);
            match (want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(w, g, "{loc}"),
                (Err(w), Err(g)) => assert!(g.contains(w), "{loc}: {g}"),
                _ => panic!("{loc}: expected {want:?}, got {got:?}"),
            }
        }
        assert!(
            next_hop(&http, None, 0, 5)
                .unwrap_err()
                .contains("without a Location")
        );
        assert!(
            next_hop(&http, Some("/c"), 5, 5)
                .unwrap_err()
                .contains("more than 5")
        );
        assert!(next_hop(&http, Some("/c"), 4, 5).is_ok());
    }

    #[test]
    fn credentials_stay_on_their_origin() {
        let u = |s: &str| s.parse::<Url>().unwrap();
        let cases = [
            ("https://h/a", "https://h/b", true),
            ("https://h/a", "https://h:443/b", true),
            ("https://h/a", "https://h:8443/b", false),
            ("https://h/a", "https://cdn.h/b", false),
            ("http://h/a", "https://h/a", false),
        ];
        for (a, b, want) in cases {
            assert_eq!(same_origin(&u(a), &u(b)), want, "{a} -> {b}");
        }
        assert!(is_credential("authorization") && is_credential("Cookie"));
        assert!(!is_credential("Range"));
    }

    /// The deadline rule for v25's and a next generation's sizes alike (the rule does not
    /// depend on the generation): 120 s plus the size at 128 KiB/s.
    #[test]
    fn artifact_deadline_rule() {
        let c = HttpConfig::default();
        let t0 = Instant::now();
        let secs = |size: u64| c.artifact_deadline(t0, size).duration_since(t0).as_secs();
        let cases = [
            (0, 120),
            (3_000_000, 142),
            (200_000_000, 1_645),
            (1 << 30, 8_312),
        ];
        for (size, want) in cases {
            assert_eq!(secs(size), want, "{size} bytes");
        }
        assert!(
            secs(200_000_000) < 3600,
            "a 200 MB artifact never waits ~14 h"
        );
        assert!(c.artifact_deadline(t0, u64::MAX) > t0);
    }

    #[test]
    fn rate_floor() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut g = RateGuard::new(t0, 100, 10 * s);
        assert!(
            g.check(t0 + 9 * s).is_none(),
            "no verdict before a window closes"
        );
        g.observe(t0 + 5 * s, 999);
        assert_eq!(
            g.check(t0 + 10 * s).unwrap(),
            "999 B in 10.0 s, slower than the minimum of 100 B/s"
        );
        assert_eq!(
            RateGuard::new(t0, 64 << 10, 10 * s)
                .check(t0 + 10 * s)
                .unwrap(),
            "0 B in 10.0 s, slower than the minimum of 64.00 KiB/s"
        );
        g.observe(t0 + 10 * s, 1);
        assert!(
            g.check(t0 + 10 * s).is_none(),
            "1000 bytes in 10 s is enough"
        );
        // The window restarted when it closed with enough bytes.
        assert!(g.check(t0 + 19 * s).is_none());
        assert!(g.check(t0 + 20 * s).is_some());
        assert!(
            RateGuard::new(t0, 0, s).check(t0 + 100 * s).is_none(),
            "0 = off"
        );
    }
}
