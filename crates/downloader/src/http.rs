//! A thin blocking HTTP client (ureq: no async runtime, rustls) with the few calls the
//! downloader needs, each mapping statuses and transport failures onto [`Error`].

use std::io::Read;
use std::time::Duration;

use crate::error::{Error, Result};

/// Timeouts and pool size.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub connect_timeout: Duration,
    /// Longest silence while reading a body before the transfer counts as failed.
    pub read_timeout: Duration,
    pub max_idle_per_host: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            max_idle_per_host: 16,
        }
    }
}

#[derive(Clone)]
pub struct Http {
    agent: ureq::Agent,
}

/// A response whose status was 200 or 206.
pub struct Body {
    pub status: u16,
    pub content_length: Option<u64>,
    /// `Content-Range: bytes a-b/total` parsed, on 206.
    pub content_range: Option<(u64, u64, Option<u64>)>,
    pub etag: Option<String>,
    pub reader: Box<dyn Read + Send + Sync + 'static>,
}

impl Http {
    pub fn new(config: &HttpConfig) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(config.connect_timeout)
            .timeout_read(config.read_timeout)
            .max_idle_connections_per_host(config.max_idle_per_host)
            .redirects(5)
            .user_agent(concat!(
                "starpilot-device-modeld-manager/",
                env!("CARGO_PKG_VERSION")
            ))
            .build();
        Self { agent }
    }

    /// GET `url`, optionally with a byte range (`end` inclusive) and an `If-Range` validator.
    pub fn get(
        &self,
        url: &str,
        range: Option<(u64, u64)>,
        if_range: Option<&str>,
    ) -> Result<Body> {
        let mut req = self.agent.get(url);
        if let Some((a, b)) = range {
            req = req.set("Range", &format!("bytes={a}-{b}"));
            if let Some(tag) = if_range {
                req = req.set("If-Range", tag);
            }
        }
        match req.call() {
            Ok(resp) => {
                let status = resp.status();
                if status != 200 && status != 206 {
                    return Err(Error::Status {
                        url: url.to_string(),
                        status,
                    });
                }
                let content_length = resp
                    .header("content-length")
                    .and_then(|v| v.trim().parse().ok());
                let content_range = resp.header("content-range").and_then(parse_content_range);
                let etag = resp.header("etag").map(str::to_string);
                Ok(Body {
                    status,
                    content_length,
                    content_range,
                    etag,
                    reader: resp.into_reader(),
                })
            }
            Err(ureq::Error::Status(status, _)) => Err(Error::Status {
                url: url.to_string(),
                status,
            }),
            Err(ureq::Error::Transport(t)) => Err(Error::Transport {
                url: url.to_string(),
                message: t.to_string(),
            }),
        }
    }

    /// HEAD `url`: the length and ETag.
    pub fn head(&self, url: &str) -> Result<(Option<u64>, Option<String>)> {
        match self.agent.head(url).call() {
            Ok(resp) => Ok((
                resp.header("content-length")
                    .and_then(|v| v.trim().parse().ok()),
                resp.header("etag").map(str::to_string),
            )),
            Err(ureq::Error::Status(status, _)) => Err(Error::Status {
                url: url.to_string(),
                status,
            }),
            Err(ureq::Error::Transport(t)) => Err(Error::Transport {
                url: url.to_string(),
                message: t.to_string(),
            }),
        }
    }

    /// GET a small document, reading at most `max` bytes; a longer body is a protocol error
    /// (never buffered beyond `max + 1`).
    pub fn get_small(&self, url: &str, max: u64) -> Result<Vec<u8>> {
        let body = self.get(url, None, None)?;
        if let Some(len) = body.content_length
            && len > max
        {
            return Err(Error::Protocol {
                url: url.to_string(),
                message: format!("body is {len} bytes, more than the limit of {max}"),
            });
        }
        let mut buf = Vec::new();
        body.reader
            .take(max + 1)
            .read_to_end(&mut buf)
            .map_err(|e| Error::Transport {
                url: url.to_string(),
                message: e.to_string(),
            })?;
        if buf.len() as u64 > max {
            return Err(Error::Protocol {
                url: url.to_string(),
                message: format!("body is more than the limit of {max} bytes"),
            });
        }
        Ok(buf)
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
    }
}
