//! The Hugging Face bucket store (`hf://buckets/<ns>/<name>`).
//!
//! - Reads go over plain HTTP, exactly as devices read: `<endpoint>/buckets/<ns>/<name>/resolve/<path>`
//!   (no revision segment: buckets are unversioned). Listings use the bucket tree API,
//!   `<endpoint>/api/buckets/<ns>/<name>/tree/<prefix>?recursive=true`, following `Link: rel="next"`.
//! - Writes, server-side copies and deletes go through the `hf` CLI (`hf buckets cp SRC DST`,
//!   `hf buckets rm URI`): it owns the Xet upload protocol and its deduplication, and a copy
//!   whose two ends are on the Hub moves no bytes through this machine.
//! - `HF_TOKEN` is sent only to the configured endpoint's origin. Redirects are followed by hand
//!   so that a hop to a CDN or any other host never carries the token.
//!
//! The Hub is unreachable from the machines this was written on: this code is tested against a
//! stand-in `hf` executable and a local HTTP server (`serve`) with the same URL shapes. The
//! first live publish should confirm the tree API's JSON shape and `hf buckets rm`.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use reqwest::blocking::{Client, Response};
use reqwest::header::{ACCEPT_ENCODING, AUTHORIZATION, CONTENT_LENGTH, HeaderMap, LINK, LOCATION};
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;

use crate::error::{Error, IoContext, Result};
use crate::paths::{StorePath, is_under};
use crate::store::{FileStat, ListEntry, Store};

/// At most this many redirects per request (the Hub answers resolve URLs with one or two).
const MAX_REDIRECTS: usize = 8;
/// Listing pages are small JSON documents; refuse anything absurd.
const MAX_LISTING_PAGE_BYTES: u64 = 64 * 1024 * 1024;

/// How to reach the Hub: the endpoint, the token and the CLI.
#[derive(Clone)]
pub struct HfConfig {
    /// `https://huggingface.co` unless `HF_ENDPOINT` says otherwise; no trailing slash.
    pub endpoint: String,
    pub token: Option<String>,
    /// The `hf` CLI: `--hf-cli`, else `HF_CLI`, else `hf` on PATH.
    pub cli: PathBuf,
    /// Per-request timeout for reads (connect and between bytes, not the whole body).
    pub timeout: Duration,
}

impl std::fmt::Debug for HfConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("HfConfig")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("cli", &self.cli)
            .finish()
    }
}

impl HfConfig {
    /// From the environment, as huggingface_hub reads it: `HF_ENDPOINT`, `HF_TOKEN`, plus our
    /// `HF_CLI`. `cli_override` (the `--hf-cli` flag) wins over `HF_CLI`.
    pub fn from_env(cli_override: Option<PathBuf>) -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        Self {
            endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| manifest::layout::HF_ENDPOINT.to_string())
                .trim_end_matches('/')
                .to_string(),
            token: var("HF_TOKEN"),
            cli: cli_override
                .or_else(|| var("HF_CLI").map(PathBuf::from))
                .unwrap_or_else(|| PathBuf::from("hf")),
            timeout: Duration::from_secs(60),
        }
    }
}

/// A blocking HTTP client for Hub reads that carries the token only to the endpoint's origin.
#[derive(Clone)]
pub struct HubHttp {
    client: Client,
    endpoint: Url,
    token: Option<String>,
}

impl std::fmt::Debug for HubHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubHttp")
            .field("endpoint", &self.endpoint.as_str())
            .finish_non_exhaustive()
    }
}

impl HubHttp {
    pub fn new(config: &HfConfig) -> Result<Self> {
        let endpoint = Url::parse(&config.endpoint).map_err(|e| Error::InvalidStore {
            spec: config.endpoint.clone(),
            reason: format!("HF_ENDPOINT is not a URL: {e}"),
        })?;
        let client = Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.timeout)
            // Blocking reqwest applies this to each read, not to the whole body, so a long
            // download is fine and a stalled one fails.
            .timeout(config.timeout)
            .build()
            .map_err(|e| Error::Http {
                method: "INIT",
                url: config.endpoint.clone(),
                message: e.to_string(),
            })?;
        Ok(Self {
            client,
            endpoint,
            token: config.token.clone(),
        })
    }

    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str().trim_end_matches('/')
    }

    fn same_origin(&self, url: &Url) -> bool {
        url.scheme() == self.endpoint.scheme()
            && url.host_str() == self.endpoint.host_str()
            && url.port_or_known_default() == self.endpoint.port_or_known_default()
    }

    /// Send a request, following redirects by hand. Returns the final response and the headers
    /// of the first one (the Hub puts `X-Linked-Size` on the redirect, not on the CDN answer).
    pub fn send(&self, method: Method, url: &str) -> Result<(Response, HeaderMap)> {
        let method_name: &'static str = if method == Method::HEAD {
            "HEAD"
        } else {
            "GET"
        };
        let mut url = Url::parse(url).map_err(|e| Error::Http {
            method: method_name,
            url: url.to_string(),
            message: e.to_string(),
        })?;
        let mut first_headers = None;
        for _ in 0..=MAX_REDIRECTS {
            // No compression: sizes and ranges must be about the stored bytes.
            let mut req = self
                .client
                .request(method.clone(), url.clone())
                .header(ACCEPT_ENCODING, "identity");
            if let Some(token) = &self.token
                && self.same_origin(&url)
            {
                req = req.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            let resp = req.send().map_err(|e| Error::Http {
                method: method_name,
                url: url.to_string(),
                message: e.to_string(),
            })?;
            if first_headers.is_none() {
                first_headers = Some(resp.headers().clone());
            }
            if resp.status().is_redirection()
                && let Some(loc) = resp.headers().get(LOCATION)
            {
                let loc = loc.to_str().map_err(|_| Error::BadResponse {
                    url: url.to_string(),
                    reason: "redirect Location is not text".into(),
                })?;
                url = url.join(loc).map_err(|e| Error::BadResponse {
                    url: url.to_string(),
                    reason: format!("bad redirect Location {loc:?}: {e}"),
                })?;
                continue;
            }
            return Ok((resp, first_headers.unwrap_or_default()));
        }
        Err(Error::BadResponse {
            url: url.to_string(),
            reason: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }
}

impl HubHttp {
    /// HEAD a resolve URL: the stored file's size, `None` on 404. A redirect's own
    /// Content-Length describes the redirect body, so the Hub's `X-Linked-Size` on the first
    /// answer is trusted there, and Content-Length only on the final one.
    pub(crate) fn stat(&self, url: &str) -> Result<Option<FileStat>> {
        let (resp, first) = self.send(Method::HEAD, url)?;
        match resp.status() {
            StatusCode::NOT_FOUND => Ok(None),
            s if s.is_success() => {
                let size = header_u64(&first, "x-linked-size")
                    .or_else(|| header_u64(resp.headers(), CONTENT_LENGTH.as_str()))
                    .ok_or_else(|| Error::BadResponse {
                        url: url.to_string(),
                        reason: "no Content-Length or X-Linked-Size".into(),
                    })?;
                Ok(Some(FileStat { size }))
            }
            s => Err(status_error("HEAD", url, s)),
        }
    }

    /// GET a resolve URL as a stream; `not_found()` on 404.
    pub(crate) fn open(
        &self,
        url: &str,
        not_found: impl FnOnce() -> Error,
    ) -> Result<Box<dyn Read + Send>> {
        let (resp, _) = self.send(Method::GET, url)?;
        match resp.status() {
            StatusCode::NOT_FOUND => Err(not_found()),
            StatusCode::OK => Ok(Box::new(resp)),
            s => Err(status_error("GET", url, s)),
        }
    }
}

fn status_error(method: &'static str, url: &str, status: StatusCode) -> Error {
    let hint = match status.as_u16() {
        401 | 403 => "; check HF_TOKEN (it must have access to this bucket or repository)",
        429 => "; rate limited, try again later",
        500..=599 => "; the Hub had a problem, try again later",
        _ => "",
    };
    Error::HttpStatus {
        method,
        url: url.to_string(),
        status: status.as_u16(),
        hint,
    }
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// The `hf` CLI, run with our endpoint and token in its environment.
#[derive(Debug, Clone)]
pub struct HfCli {
    config: HfConfig,
}

impl HfCli {
    pub fn new(config: HfConfig) -> Self {
        Self { config }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.config.cli);
        cmd.args(args).env("HF_ENDPOINT", &self.config.endpoint);
        if let Some(t) = &self.config.token {
            cmd.env("HF_TOKEN", t);
        }
        cmd
    }

    fn describe(&self, args: &[&str]) -> String {
        format!("{} {}", self.config.cli.display(), args.join(" "))
    }

    /// Run `hf ARGS`, optionally feeding `stdin` to it, streamed.
    pub fn run(&self, args: &[&str], stdin: Option<&mut dyn Read>) -> Result<u64> {
        let mut cmd = self.command(args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = cmd.spawn().map_err(|source| Error::HfCliMissing {
            program: self.config.cli.display().to_string(),
            source,
        })?;
        let mut stdin_pipe = child.stdin.take();
        let (out, fed) = std::thread::scope(|scope| {
            // Drain stdout/stderr on a second thread while this one feeds stdin, so a chatty
            // CLI can never deadlock against a full pipe.
            let waiter = scope.spawn(move || child.wait_with_output());
            let fed = match (stdin, stdin_pipe.take()) {
                (Some(src), Some(mut pipe)) => {
                    let r = io::copy(src, &mut pipe).and_then(|n| pipe.flush().map(|_| n));
                    // Closing the pipe is the end of the data.
                    drop(pipe);
                    Some(r)
                }
                _ => None,
            };
            (
                waiter.join().expect("waiting for a child does not panic"),
                fed,
            )
        });
        let out = out.at(&self.config.cli)?;
        if !out.status.success() {
            return Err(Error::HfCli {
                command: self.describe(args),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        let fed = match fed {
            Some(r) => r.map_err(|e| Error::HfCli {
                command: self.describe(args),
                status: "stdin".into(),
                stderr: format!("could not stream the data to the CLI: {e}"),
            })?,
            None => 0,
        };
        Ok(fed)
    }

    /// `hf buckets cp SRC DST`.
    pub fn cp(&self, src: &str, dst: &str, stdin: Option<&mut dyn Read>) -> Result<u64> {
        self.run(&["buckets", "cp", src, dst], stdin)
    }
}

#[derive(Debug, Clone)]
pub struct HfBucketStore {
    /// `NS/NAME`.
    bucket: String,
    http: HubHttp,
    cli: HfCli,
}

#[derive(Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: Option<u64>,
}

impl HfBucketStore {
    /// `bucket` is `NS/NAME`.
    pub fn new(bucket: &str, config: HfConfig) -> Result<Self> {
        let parts: Vec<&str> = bucket.split('/').collect();
        if parts.len() != 2
            || parts
                .iter()
                .any(|p| p.is_empty() || *p == "." || *p == "..")
        {
            return Err(Error::InvalidStore {
                spec: format!("hf://buckets/{bucket}"),
                reason: "a bucket is named NAMESPACE/NAME".into(),
            });
        }
        Ok(Self {
            bucket: bucket.to_string(),
            http: HubHttp::new(&config)?,
            cli: HfCli::new(config),
        })
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// `hf://buckets/NS/NAME/<path>`: what the CLI copies to and from.
    pub fn uri(&self, path: &StorePath) -> String {
        manifest::layout::hf_bucket_uri(&self.bucket, path)
    }

    /// The URL devices download from.
    pub fn resolve_url(&self, path: &StorePath) -> String {
        manifest::layout::hf_resolve_url(self.http.endpoint(), &self.bucket, path)
    }

    pub fn cli(&self) -> &HfCli {
        &self.cli
    }

    fn tree_url(&self, prefix: &StorePath) -> String {
        format!(
            "{}/api/buckets/{}/tree/{}?recursive=true",
            self.http.endpoint(),
            self.bucket,
            prefix.url_encoded()
        )
    }
}

impl Store for HfBucketStore {
    fn describe(&self) -> String {
        format!("hf://buckets/{}", self.bucket)
    }

    fn hub_uri(&self, path: &StorePath) -> Option<String> {
        Some(self.uri(path))
    }

    fn copy_from_hub(&self, src_uri: &str, to: &StorePath) -> Result<bool> {
        self.cli.cp(src_uri, &self.uri(to), None)?;
        Ok(true)
    }

    fn stat(&self, path: &StorePath) -> Result<Option<FileStat>> {
        self.http.stat(&self.resolve_url(path))
    }

    fn open(&self, path: &StorePath) -> Result<Box<dyn Read + Send>> {
        self.http.open(&self.resolve_url(path), || Error::NotFound {
            store: self.describe(),
            path: path.to_string(),
        })
    }

    fn write(&self, path: &StorePath, src: &mut dyn Read) -> Result<u64> {
        // `-` is stdin: the bytes stream through the CLI without a temporary copy.
        self.cli.cp("-", &self.uri(path), Some(src))
    }

    fn write_file(&self, path: &StorePath, local: &Path) -> Result<u64> {
        let size = std::fs::metadata(local).at(local)?.len();
        let local = local.to_str().ok_or_else(|| Error::InvalidPath {
            path: local.display().to_string(),
            reason: "not valid UTF-8, cannot be passed to the hf CLI".into(),
        })?;
        self.cli.cp(local, &self.uri(path), None)?;
        Ok(size)
    }

    fn list(&self, prefix: &StorePath) -> Result<Vec<ListEntry>> {
        let mut out = Vec::new();
        let mut next = Some(self.tree_url(prefix));
        while let Some(url) = next.take() {
            let (resp, _) = self.http.send(Method::GET, &url)?;
            match resp.status() {
                StatusCode::NOT_FOUND => break,
                StatusCode::OK => {}
                s => return Err(status_error("GET", &url, s)),
            }
            next = next_link(resp.headers());
            let mut body = Vec::new();
            resp.take(MAX_LISTING_PAGE_BYTES + 1)
                .read_to_end(&mut body)
                .at(&url)?;
            let entries: Vec<TreeEntry> =
                serde_json::from_slice(&body).map_err(|e| Error::BadResponse {
                    url: url.clone(),
                    reason: format!("tree listing is not the expected JSON array: {e}"),
                })?;
            for e in entries {
                if e.kind != "file" {
                    continue;
                }
                let Ok(path) = e.path.parse::<StorePath>() else {
                    continue;
                };
                if is_under(&path, prefix) {
                    out.push(ListEntry {
                        path,
                        size: e.size.unwrap_or(0),
                    });
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn copy(&self, from: &StorePath, to: &StorePath) -> Result<()> {
        self.cli.cp(&self.uri(from), &self.uri(to), None)?;
        Ok(())
    }

    fn delete(&self, path: &StorePath) -> Result<bool> {
        if self.stat(path)?.is_none() {
            return Ok(false);
        }
        self.cli.run(&["buckets", "rm", &self.uri(path)], None)?;
        Ok(true)
    }
}

/// The `rel="next"` target of a `Link` header, as the Hub paginates listings.
fn next_link(headers: &HeaderMap) -> Option<String> {
    let link = headers.get(LINK)?.to_str().ok()?;
    for part in link.split(',') {
        let mut pieces = part.split(';');
        let target = pieces.next()?.trim();
        if pieces.any(|p| p.trim().replace(' ', "") == "rel=\"next\"") {
            return Some(
                target
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_string(),
            );
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn next_link_parsing() {
        let mut h = HeaderMap::new();
        h.insert(
            LINK,
            HeaderValue::from_static(
                "<https://h/api/buckets/a/b/tree?cursor=x>; rel=\"next\", <https://h/p>; rel=\"prev\"",
            ),
        );
        assert_eq!(
            next_link(&h).as_deref(),
            Some("https://h/api/buckets/a/b/tree?cursor=x")
        );
        assert_eq!(next_link(&HeaderMap::new()), None);
    }

    #[test]
    fn bucket_names_are_checked() {
        let cfg = HfConfig {
            endpoint: "http://127.0.0.1:1".into(),
            token: None,
            cli: "hf".into(),
            timeout: Duration::from_secs(1),
        };
        assert!(HfBucketStore::new("a/b", cfg.clone()).is_ok());
        for bad in ["a", "a/b/c", "/b", "a/", "../b"] {
            assert!(HfBucketStore::new(bad, cfg.clone()).is_err(), "{bad}");
        }
        let s = HfBucketStore::new("StarPilot-Driving/StarPilot-Resources", cfg).unwrap();
        let p: StorePath = "models/v25/x/y".parse().unwrap();
        assert_eq!(
            s.uri(&p),
            "hf://buckets/StarPilot-Driving/StarPilot-Resources/models/v25/x/y"
        );
        assert_eq!(
            s.resolve_url(&p),
            "http://127.0.0.1:1/buckets/StarPilot-Driving/StarPilot-Resources/resolve/models/v25/x/y"
        );
        assert!(
            !format!(
                "{:?}",
                HfConfig {
                    token: Some("secret".into()),
                    ..HfConfig::from_env(None)
                }
            )
            .contains("secret")
        );
    }
}
