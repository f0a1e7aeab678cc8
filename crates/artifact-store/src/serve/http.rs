//! HTTP parsing for the mirror: the request head (bounded in size and time), percent-decoding
//! of the target, and the one-range `Range` header.

use std::io::{self, Read};
use std::net::TcpStream;
use std::time::Instant;

/// A request head larger than this is refused.
pub(crate) const MAX_HEAD_BYTES: usize = 16 * 1024;

pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) target: String,
    pub(crate) headers: Vec<(String, String)>,
}

impl Request {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The request head, which must be complete by `deadline` (each read waits at most until then,
/// so a client trickling bytes gains nothing) and fit in [`MAX_HEAD_BYTES`].
pub(crate) fn read_request(stream: &TcpStream, deadline: Instant) -> io::Result<Option<Request>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 2048];
    let end = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        stream.set_read_timeout(Some(left))?;
        let n = match (&*stream).read(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&buf[..n]);
        if let Some(at) = head[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            break from + at;
        }
        if head.len() > MAX_HEAD_BYTES {
            return Ok(None);
        }
    };
    // Anything after the head (a body) is ignored: GET and HEAD have none we use.
    let text = String::from_utf8_lossy(&head[..end]);
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Ok(None);
    };
    if !version.starts_with("HTTP/1.") {
        return Ok(None);
    }
    let headers = lines
        .filter_map(|h| h.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok(Some(Request {
        method: method.to_string(),
        target: target.to_string(),
        headers,
    }))
}

pub(crate) fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A single byte range resolved against the file size.
#[derive(Debug, PartialEq, Eq)]
pub enum RangeAnswer {
    /// No usable Range header (absent, malformed, several ranges): the whole file.
    Full,
    /// One range, `start..=end` (both inclusive, within the file).
    Partial {
        /// First byte.
        start: u64,
        /// Last byte (inclusive).
        end: u64,
    },
    /// No byte of the file is in the range (it starts past the end, a zero-length suffix, an empty
    /// file): answered 416.
    Unsatisfiable,
}

/// Resolve a `Range` header value for a file of `size` bytes (RFC 9110 §14.1.2, one range).
pub fn parse_range(value: &str, size: u64) -> RangeAnswer {
    let Some(spec) = value.trim().strip_prefix("bytes=") else {
        return RangeAnswer::Full;
    };
    if spec.contains(',') {
        return RangeAnswer::Full;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangeAnswer::Full;
    };
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        // Suffix range: the last N bytes.
        let Ok(n) = b.parse::<u64>() else {
            return RangeAnswer::Full;
        };
        if n == 0 || size == 0 {
            return RangeAnswer::Unsatisfiable;
        }
        return RangeAnswer::Partial {
            start: size.saturating_sub(n),
            end: size - 1,
        };
    }
    let Ok(start) = a.parse::<u64>() else {
        return RangeAnswer::Full;
    };
    let end = if b.is_empty() {
        size.saturating_sub(1)
    } else {
        match b.parse::<u64>() {
            Ok(e) if e >= start => e.min(size.saturating_sub(1)),
            _ => return RangeAnswer::Full,
        }
    };
    if start >= size {
        return RangeAnswer::Unsatisfiable;
    }
    RangeAnswer::Partial { start, end }
}
