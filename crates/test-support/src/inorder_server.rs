//! A plain HTTP/1.1 file server on one thread that answers each connection's requests in order:
//! the shape of a small origin (a single-threaded event loop, no worker per connection), for the
//! device's install benchmarks.
//!
//! One thread polls every socket without blocking. Each connection has a bandwidth cap; a
//! request is answered `latency` after it arrived (the delay runs while an earlier answer on the
//! same connection is still sending, as a network's would), never before the earlier answers on
//! that connection are complete. `GET` and `HEAD`, a single `Range` (`bytes=a-b`, `bytes=a-`),
//! `ETag`, keep-alive; nothing else (no faults: see [`crate::http_server`] for those).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

/// Bytes a connection sends per write at most.
const WRITE: usize = 64 * 1024;
/// The longest request head read.
const MAX_HEAD: usize = 16 * 1024;

/// A request waiting for its answer.
struct Pending {
    due: Instant,
    head_only: bool,
    path: String,
    range: Option<String>,
}

/// The answer being sent on a connection.
struct Active {
    head: Vec<u8>,
    head_sent: usize,
    file: Option<File>,
    pos: u64,
    end: u64,
    began: Instant,
    sent: u64,
}

struct Conn {
    stream: TcpStream,
    inbuf: Vec<u8>,
    queue: VecDeque<Pending>,
    active: Option<Active>,
    closed: bool,
}

/// Serve `root` on `listener` until the process ends: one thread, each connection capped at
/// `rate` bytes per second (`None`: no cap), each answer `latency` after its request.
pub fn serve(
    listener: TcpListener,
    root: &Path,
    rate: Option<u64>,
    latency: Duration,
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut conns: Vec<Conn> = Vec::new();
    let mut buf = vec![0u8; WRITE];
    loop {
        let mut progress = false;
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(true)?;
                    let _ = stream.set_nodelay(true);
                    conns.push(Conn {
                        stream,
                        inbuf: Vec::new(),
                        queue: VecDeque::new(),
                        active: None,
                        closed: false,
                    });
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => break,
            }
        }
        let now = Instant::now();
        for c in &mut conns {
            progress |= c.step(root, rate, latency, now, &mut buf);
        }
        conns.retain(|c| !c.closed);
        if !progress {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

impl Conn {
    /// Read what arrived, start the next answer when it is due, send what the cap allows.
    /// Whether anything moved.
    fn step(
        &mut self,
        root: &Path,
        rate: Option<u64>,
        latency: Duration,
        now: Instant,
        buf: &mut [u8],
    ) -> bool {
        let mut progress = false;
        match self.stream.read(buf) {
            Ok(0) => {
                self.closed = true;
                return true;
            }
            Ok(n) => {
                self.inbuf.extend_from_slice(&buf[..n]);
                progress = true;
                while let Some(end) = find_head_end(&self.inbuf) {
                    let head: Vec<u8> = self.inbuf.drain(..end + 4).collect();
                    match parse_request(&head) {
                        Some((method, path, range)) => self.queue.push_back(Pending {
                            due: now + latency,
                            head_only: method == "HEAD",
                            path,
                            range,
                        }),
                        None => {
                            self.closed = true;
                            return true;
                        }
                    }
                }
                if self.inbuf.len() > MAX_HEAD {
                    self.closed = true;
                    return true;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => {
                self.closed = true;
                return true;
            }
        }
        if self.active.is_none()
            && let Some(p) = self.queue.front()
            && p.due <= now
        {
            let p = self.queue.pop_front().expect("a front");
            self.active = Some(answer(root, &p, now));
            progress = true;
        }
        let Some(a) = self.active.as_mut() else {
            return progress;
        };
        while a.head_sent < a.head.len() {
            match self.stream.write(&a.head[a.head_sent..]) {
                Ok(n) => {
                    a.head_sent += n;
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return progress,
                Err(_) => {
                    self.closed = true;
                    return true;
                }
            }
        }
        while a.pos < a.end {
            let allowed = match rate {
                Some(r) => {
                    let due = (r as f64 * now.duration_since(a.began).as_secs_f64()) as u64;
                    due.saturating_sub(a.sent)
                }
                None => u64::MAX,
            };
            let n = (a.end - a.pos).min(allowed).min(buf.len() as u64) as usize;
            if n == 0 {
                return progress;
            }
            let file = a.file.as_ref().expect("a body has a file");
            if file.read_exact_at(&mut buf[..n], a.pos).is_err() {
                self.closed = true;
                return true;
            }
            match self.stream.write(&buf[..n]) {
                Ok(w) => {
                    a.pos += w as u64;
                    a.sent += w as u64;
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return progress,
                Err(_) => {
                    self.closed = true;
                    return true;
                }
            }
        }
        self.active = None;
        progress
    }
}

/// The answer to `p`: its head, and the file range its body is.
fn answer(root: &Path, p: &Pending, now: Instant) -> Active {
    let simple = |status: &str| Active {
        head: format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").into_bytes(),
        head_sent: 0,
        file: None,
        pos: 0,
        end: 0,
        began: now,
        sent: 0,
    };
    let Some(path) = local_path(root, &p.path) else {
        return simple("400 Bad Request");
    };
    let Ok((file, meta)) = File::open(&path).and_then(|f| {
        let m = f.metadata()?;
        if m.is_file() {
            Ok((f, m))
        } else {
            Err(io::ErrorKind::NotFound.into())
        }
    }) else {
        return simple("404 Not Found");
    };
    let len = meta.len();
    let etag = format!("\"{:x}-{:x}-{:x}\"", len, meta.mtime(), meta.mtime_nsec());
    let (status, start, end) = match p.range.as_deref().map(|r| parse_range(r, len)) {
        Some(Some((a, b))) => ("206 Partial Content", a, b + 1),
        Some(None) => {
            return Active {
                head: format!(
                    "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\n\r\n"
                )
                .into_bytes(),
                ..simple("416")
            };
        }
        None => ("200 OK", 0, len),
    };
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nETag: {etag}\r\nAccept-Ranges: bytes\r\nContent-Type: application/octet-stream\r\n",
        end - start
    );
    if start != 0 || end != len || p.range.is_some() {
        head.push_str(&format!(
            "Content-Range: bytes {start}-{}/{len}\r\n",
            end - 1
        ));
    }
    head.push_str("\r\n");
    Active {
        head: head.into_bytes(),
        head_sent: 0,
        file: Some(file),
        pos: start,
        end: if p.head_only { start } else { end },
        began: now,
        sent: 0,
    }
}

fn find_head_end(b: &[u8]) -> Option<usize> {
    b.windows(4).position(|w| w == b"\r\n\r\n")
}

/// Method, path and `Range` header of a request head; `None` when it is not one.
fn parse_request(head: &[u8]) -> Option<(String, String, Option<String>)> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, target) = (first.next()?.to_string(), first.next()?);
    let path = target.split('?').next()?.to_string();
    let range = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("range"))
        .map(|(_, v)| v.trim().to_string());
    Some((method, path, range))
}

fn local_path(root: &Path, url_path: &str) -> Option<PathBuf> {
    let rel = Path::new(url_path.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(root.join(rel))
}

/// `bytes=a-b` or `bytes=a-` of a `len`-byte body: `(start, end_inclusive)`, `None` when
/// unsatisfiable or not understood.
fn parse_range(value: &str, len: u64) -> Option<(u64, u64)> {
    let (a, b) = value.strip_prefix("bytes=")?.split_once('-')?;
    let start: u64 = a.trim().parse().ok()?;
    let end = match b.trim() {
        "" => len.checked_sub(1)?,
        b => b.parse::<u64>().ok()?.min(len.checked_sub(1)?),
    };
    (start <= end).then_some((start, end))
}

/// Start [`serve`] on a thread for a test; its address.
pub fn spawn(
    root: PathBuf,
    rate: Option<u64>,
    latency: Duration,
) -> io::Result<(SocketAddr, std::thread::JoinHandle<io::Result<()>>)> {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let addr = listener.local_addr()?;
    let h = std::thread::spawn(move || serve(listener, &root, rate, latency));
    Ok((addr, h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};

    fn read_response(r: &mut BufReader<TcpStream>, head_only: bool) -> (String, Vec<u8>) {
        let mut head = String::new();
        let mut len = 0usize;
        loop {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let mut body = vec![0u8; if head_only { 0 } else { len }];
        r.read_exact(&mut body).unwrap();
        (head, body)
    }

    /// Pipelined requests on one connection are answered in order, ranges included, each
    /// after the latency, at the cap.
    #[test]
    fn answers_in_order_at_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        let (addr, _h) = spawn(
            dir.path().to_path_buf(),
            Some(1_000_000),
            Duration::from_millis(30),
        )
        .unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        let started = Instant::now();
        s.write_all(
            b"GET /f HTTP/1.1\r\nRange: bytes=10-99999\r\n\r\nHEAD /f HTTP/1.1\r\n\r\nGET /f HTTP/1.1\r\nRange: bytes=100000-\r\n\r\nGET /nope HTTP/1.1\r\n\r\n",
        )
        .unwrap();
        let mut r = BufReader::new(s);
        let (h1, b1) = read_response(&mut r, false);
        assert!(h1.starts_with("HTTP/1.1 206"), "{h1}");
        assert!(h1.contains("Content-Range: bytes 10-99999/200000"), "{h1}");
        assert_eq!(b1, &data[10..100_000]);
        let (h2, b2) = read_response(&mut r, true);
        assert!(h2.starts_with("HTTP/1.1 200") && b2.is_empty(), "{h2}");
        assert!(h2.contains("Content-Length: 200000"), "{h2}");
        let (h3, b3) = read_response(&mut r, false);
        assert!(h3.contains("bytes 100000-199999/200000"), "{h3}");
        assert_eq!(b3, &data[100_000..]);
        let (h4, _) = read_response(&mut r, false);
        assert!(h4.starts_with("HTTP/1.1 404"), "{h4}");
        // 200 000 body bytes at 1 MB/s: at least 0.19 s (the cap holds), the latency overlapping.
        assert!(started.elapsed() >= Duration::from_millis(190));
    }
}
