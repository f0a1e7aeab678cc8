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
//! - The token never appears in what we print: every error built here passes through
//!   [`redact`] (the token, any `Authorization`/`Bearer` value, anything shaped like an `hf_`
//!   token), so a CLI that echoes it cannot leak it into a message or a `--json` event.
//! - The CLI runs non-interactively and isolated: `--yes` on `rm` (it asks for confirmation
//!   otherwise, and with no terminal aborts), `--format json` after the subcommand, and unless
//!   the user set them `HF_HUB_DISABLE_UPDATE_CHECK=1`, `HF_HUB_DISABLE_TELEMETRY=1`,
//!   `HF_HUB_DISABLE_PROGRESS_BARS=1` and a private `HF_HOME` (see [`child_env`]). Its failures
//!   are read into an [`HfFailure`] kind (see [`classify_cli_failure`]).
//! - A publish's upload of a local file is the exception: it runs with
//!   `HF_HUB_DISABLE_PROGRESS_BARS=0` (unless the user set it), and its stderr is read as it
//!   comes for the CLI's own per-file progress line ([`HfCli::cp_reporting`]); the progress lines
//!   are left out of the text an error shows.
//!
//! The Hub is unreachable from the machines this was written on: this code is tested against the
//! real `hf` CLI (huggingface_hub 2.4.0, hf-xet 1.8.0) driving a local Hub emulator
//! (`test_support::hub`), which our HTTP reads use too.

use std::collections::HashSet;
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::blocking::{Client, Response};
use reqwest::header::{
    ACCEPT_ENCODING, AUTHORIZATION, CONTENT_LENGTH, HeaderMap, LINK, LOCATION, RANGE,
};
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;

use crate::error::{Error, HfFailure, Result};
use crate::paths::{StorePath, is_under};
use crate::progress::{HfLine, Measure, Transfer, parse_hf_line, wait_reading_progress};
use crate::store::{FileStat, ListEntry, Store, StoreName};

/// At most this many redirects per request (the Hub answers resolve URLs with one or two).
const MAX_REDIRECTS: usize = 8;
/// Listing pages are small JSON documents; refuse anything absurd.
const MAX_LISTING_PAGE_BYTES: u64 = 64 * 1024 * 1024;
/// A listing longer than this many pages is refused (far more than a bucket of models needs):
/// a server that links on forever cannot keep us listing.
pub const MAX_LISTING_PAGES: usize = 10_000;
/// A listing still linking on after this long is stopped, however many pages it took: a
/// bucket of models lists in a few pages, each a second or so even on a slow link.
pub const MAX_LISTING_TIME: std::time::Duration = std::time::Duration::from_secs(120);
/// A next-page link longer than this is refused (a cursor that grows with every page).
pub const MAX_NEXT_LINK_BYTES: usize = 8 * 1024;
/// A listing whose next link keeps coming while this many pages in a row add no path not
/// already listed (a fresh cursor on every page over the same or no entries) is stopped.
pub const MAX_STALLED_PAGES: usize = 3;

/// How to reach the Hub: the endpoint, the token and the CLI.
#[derive(Clone)]
pub struct HfConfig {
    /// `https://huggingface.co` unless `HF_ENDPOINT` says otherwise; no trailing slash.
    pub endpoint: String,
    /// The Hub token (`HF_TOKEN`), when set; never shown in messages.
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
    /// From the environment, as huggingface_hub reads it: `HF_ENDPOINT`, `HF_TOKEN` (else the
    /// token `hf auth login` stored, see [`stored_token_path`]), plus our `HF_CLI`.
    /// `cli_override` (the `--hf-cli` flag) wins over `HF_CLI`.
    pub fn from_env(cli_override: Option<PathBuf>) -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        // The CLI runs with a private HF_HOME (see `child_env`), where it would not find a
        // stored token: read it here and hand it over explicitly, as our HTTP reads need it too.
        let stored = || {
            let path = stored_token_path(&|k| std::env::var_os(k))?;
            let text = fs_err::read_to_string(path).ok()?;
            Some(text.trim().to_string()).filter(|t| !t.is_empty())
        };
        Self {
            endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| manifest::layout::HF_ENDPOINT.to_string())
                .trim_end_matches('/')
                .to_string(),
            token: var("HF_TOKEN").or_else(stored),
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
    /// An HTTP client for `config`'s endpoint and token. [`Error::InvalidStore`] when the endpoint
    /// is not a URL.
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
            .map_err(|e| http_error("INIT", &config.endpoint, e))?;
        Ok(Self {
            client,
            endpoint,
            token: config.token.clone(),
        })
    }

    /// The endpoint URL, without a trailing `/`.
    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str().trim_end_matches('/')
    }

    /// [`redact`] with our token.
    pub fn redact(&self, text: &str) -> String {
        redact(text, &[self.token.as_deref().unwrap_or_default()])
    }

    /// Send a request, following redirects by hand. Returns the final response and the headers
    /// of the first one (the Hub puts `X-Linked-Size` on the redirect, not on the CDN answer).
    pub fn send(&self, method: Method, url: &str) -> Result<(Response, HeaderMap)> {
        self.send_range(method, url, None)
    }

    /// [`HubHttp::send`] with an optional `Range: bytes=START-END` (inclusive) on every hop.
    fn send_range(
        &self,
        method: Method,
        url: &str,
        range: Option<(u64, u64)>,
    ) -> Result<(Response, HeaderMap)> {
        let name = if method == Method::HEAD {
            "HEAD"
        } else {
            "GET"
        };
        let mut url = Url::parse(url).map_err(|e| http_error(name, url, e))?;
        let mut first_headers = None;
        for _ in 0..=MAX_REDIRECTS {
            // No compression: sizes and ranges must be about the stored bytes.
            let mut req = self
                .client
                .request(method.clone(), url.clone())
                .header(ACCEPT_ENCODING, "identity");
            if let Some((start, end)) = range {
                req = req.header(RANGE, format!("bytes={start}-{end}"));
            }
            if let Some(token) = &self.token
                && origin(&url) == origin(&self.endpoint)
            {
                req = req.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            let resp = req.send().map_err(|e| {
                http_error(name, self.redact(url.as_str()), self.redact(&e.to_string()))
            })?;
            first_headers.get_or_insert_with(|| resp.headers().clone());
            let location = resp.headers().get(LOCATION);
            let Some(loc) = location.filter(|_| resp.status().is_redirection()) else {
                return Ok((resp, first_headers.unwrap_or_default()));
            };
            let loc = loc
                .to_str()
                .map_err(|_| bad_response(&url, "redirect Location is not text"))?;
            url = url
                .join(loc)
                .map_err(|e| bad_response(&url, format!("bad redirect Location {loc:?}: {e}")))?;
        }
        Err(bad_response(
            url,
            format!("more than {MAX_REDIRECTS} redirects"),
        ))
    }
}

/// A file of a Hub store read at its resolve URL, a 404 being the store's [`Error::NotFound`]:
/// the read side [`HfBucketStore`] and [`crate::location::HfRepoStore`] share (they differ only
/// in the URL).
pub(crate) struct HubFile<'a> {
    pub http: &'a HubHttp,
    pub url: String,
    pub store: &'a dyn Store,
    pub path: &'a StorePath,
}

impl HubFile<'_> {
    fn not_found(&self) -> Error {
        Error::NotFound {
            store: self.store.describe(),
            path: self.path.to_string(),
        }
    }

    /// HEAD the file: its stored size, `None` on 404. A redirect's own Content-Length describes
    /// the redirect body, so the Hub's `X-Linked-Size` on the first answer is trusted there,
    /// and Content-Length only on the final one.
    pub fn stat(&self) -> Result<Option<FileStat>> {
        let (url, (resp, first)) = (&self.url, self.http.send(Method::HEAD, &self.url)?);
        match resp.status() {
            StatusCode::NOT_FOUND => Ok(None),
            s if s.is_success() => {
                let size = header_u64(&first, "x-linked-size")
                    .or_else(|| header_u64(resp.headers(), CONTENT_LENGTH.as_str()))
                    .ok_or_else(|| bad_response(url, "no Content-Length or X-Linked-Size"))?;
                Ok(Some(FileStat { size }))
            }
            s => Err(status_error("HEAD", url, s)),
        }
    }

    /// GET the file as a stream.
    pub fn open(&self) -> Result<Box<dyn Read + Send>> {
        let (resp, _) = self.http.send(Method::GET, &self.url)?;
        match resp.status() {
            StatusCode::NOT_FOUND => Err(self.not_found()),
            StatusCode::OK => Ok(Box::new(resp)),
            s => Err(status_error("GET", &self.url, s)),
        }
    }

    /// Fill `buf` from `offset` with one ranged GET. A server that ignores the range (200) is
    /// read up to the range and no further.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let (url, range) = (&self.url, Some((offset, offset + buf.len() as u64 - 1)));
        let (mut resp, _) = self.http.send_range(Method::GET, url, range)?;
        let io_err = |e: io::Error| http_error("GET", url, e);
        match resp.status() {
            StatusCode::NOT_FOUND => Err(self.not_found()),
            StatusCode::PARTIAL_CONTENT => resp.read_exact(buf).map_err(io_err),
            StatusCode::OK => {
                let skipped =
                    io::copy(&mut (&mut resp).take(offset), &mut io::sink()).map_err(io_err)?;
                if skipped != offset {
                    let reason = format!("ends at byte {skipped}, before {offset}");
                    return Err(bad_response(url, reason));
                }
                resp.read_exact(buf).map_err(io_err)
            }
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

fn http_error(method: &'static str, url: impl ToString, message: impl ToString) -> Error {
    let (url, message) = (url.to_string(), message.to_string());
    Error::Http {
        method,
        url,
        message,
    }
}

fn bad_response(url: impl ToString, reason: impl Into<String>) -> Error {
    let (url, reason) = (url.to_string(), reason.into());
    Error::BadResponse { url, reason }
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// Where huggingface_hub keeps the token `hf auth login` stored: `HF_TOKEN_PATH`, else
/// `HF_HOME/token`, else `XDG_CACHE_HOME/huggingface/token`, else `~/.cache/huggingface/token`.
pub fn stored_token_path(env: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let set = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = set("HF_TOKEN_PATH") {
        return Some(p);
    }
    if let Some(h) = set("HF_HOME") {
        return Some(h.join("token"));
    }
    let cache = set("XDG_CACHE_HOME").or_else(|| set("HOME").map(|h| h.join(".cache")))?;
    Some(cache.join("huggingface").join("token"))
}

/// What we add to the CLI's environment, given the user's (`env`) and the private `HF_HOME` we
/// would use: each variable only when the user did not set it, so a deliberate choice wins.
/// - `HF_HUB_DISABLE_UPDATE_CHECK=1`: else the CLI asks the package index once a day;
/// - `HF_HUB_DISABLE_TELEMETRY=1`: nothing about our runs leaves the machine;
/// - `HF_HUB_DISABLE_PROGRESS_BARS=1`: its stderr stays readable for error messages;
/// - `HF_HOME=<private>`: no stored token or cache of the user's leaks in (the token is handed
///   over explicitly), and hf-xet's deduplication cache cannot claim content a store never got.
pub fn child_env(
    env: &dyn Fn(&str) -> Option<OsString>,
    private_home: &Path,
) -> Vec<(&'static str, OsString)> {
    let mut out = Vec::new();
    for (k, v) in [
        ("HF_HUB_DISABLE_UPDATE_CHECK", "1"),
        ("HF_HUB_DISABLE_TELEMETRY", "1"),
        ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
    ] {
        if env(k).is_none() {
            out.push((k, OsString::from(v)));
        }
    }
    if env("HF_HOME").is_none() {
        out.push(("HF_HOME", private_home.as_os_str().to_owned()));
    }
    out
}

/// What to set `HF_HUB_DISABLE_PROGRESS_BARS` to for an upload whose progress we read, given the
/// user's value, and what the reports will then mean. Unset: `0`, which makes the CLI print its
/// byte progress even on a pipe ([`Measure::HfCli`]). Set by the user: left alone (a deliberate
/// choice wins); a value huggingface_hub reads as true (`1`, `ON`, `YES`, `TRUE`, any case)
/// turns the bars off, so nothing is reported within a file ([`Measure::AtEnd`]). Pure.
pub fn progress_bars_env(user: Option<&std::ffi::OsStr>) -> (Option<&'static str>, Measure) {
    let truthy = |v: &std::ffi::OsStr| {
        let v = v.to_string_lossy().to_ascii_uppercase();
        ["1", "ON", "YES", "TRUE"].contains(&v.as_str())
    };
    let measure = if user.is_some_and(truthy) {
        Measure::AtEnd
    } else {
        Measure::HfCli
    };
    (user.is_none().then_some("0"), measure)
}

/// Remove secrets from text we are about to show: each of `secrets` (the token), the value of
/// any `Authorization:` header and any `Bearer` credential, and anything shaped like a Hugging
/// Face token (`hf_` followed by 20 or more letters and digits), whoever's it is.
pub fn redact(text: &str, secrets: &[&str]) -> String {
    const MARK: &str = "<redacted>";
    let mut s = text.to_string();
    for secret in secrets.iter().filter(|t| t.len() >= 4) {
        s = s.replace(secret, MARK);
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s.as_str();
    // `authorization: VALUE` (to the end of the line) and `Bearer VALUE` (one word).
    loop {
        let lower = rest.to_ascii_lowercase();
        let found = ["authorization", "bearer "].map(|word| lower.find(word).map(|at| (at, word)));
        let Some((at, word)) = found.into_iter().flatten().min() else {
            break;
        };
        let (head, after) = rest.split_at(at + word.len());
        out.push_str(head);
        let (keep, value_end) = if word == "bearer " {
            let end =
                after.find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | '}'));
            (0, end.unwrap_or(after.len()))
        } else {
            // Only a header-like use: `authorization: x`, `authorization=x`, `'authorization': 'x'`.
            let sep = after
                .find(|c| !matches!(c, ' ' | '"' | '\'' | ':' | '='))
                .unwrap_or(after.len());
            if !after[..sep].contains([':', '=']) {
                rest = after;
                continue;
            }
            let end = after[sep..].find(['\n', '\r', ',', '}']);
            (sep, end.map_or(after.len(), |i| sep + i))
        };
        out.push_str(&after[..keep]);
        out.push_str(MARK);
        rest = &after[value_end..];
    }
    out.push_str(rest);
    redact_hf_tokens(&out)
}

fn redact_hf_tokens(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        let boundary = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        if boundary && b[i..].starts_with(b"hf_") {
            let n = b[i + 3..]
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric())
                .count();
            if n >= 20 {
                out.push_str("<redacted>");
                i += 3 + n;
                continue;
            }
        }
        let ch = s[i..].chars().next().expect("in bounds");
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// What a failed `hf` call means, from its stderr (huggingface_hub 2.4.0's wording).
pub fn classify_cli_failure(stderr: &str) -> HfFailure {
    let has = |n: &str| stderr.contains(n);
    if has("Use --yes to skip confirmation") || has("Aborted!") || has("[y/N]") {
        HfFailure::ConfirmationRequired
    } else if has("401 Unauthorized")
        || has("403 Forbidden")
        || has("Invalid credentials")
        || has("Invalid user token")
    {
        HfFailure::AuthRefused
    } else if has("Failed to apply") && has("operation(s)") {
        HfFailure::BatchFailed
    } else if has("RepoNotFound")
        || has("Bucket not found")
        || (has("404 Not Found") && has("/api/buckets/"))
    {
        HfFailure::BucketMissing
    } else if has("No files found at") || has("EntryNotFound") || has("Entry Not Found") {
        HfFailure::SourceMissing
    } else {
        HfFailure::Other
    }
}

/// The useful part of the CLI's stderr: the error lines, not the Python traceback or the
/// `Hint:` about `HF_DEBUG`.
fn summarize_stderr(stderr: &str) -> String {
    let keep: Vec<&str> = stderr
        .lines()
        .map(str::trim_end)
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with(' ')
                && !l.starts_with("Traceback (most recent call last)")
                && !l.starts_with("Hint: set HF_DEBUG")
                && !l.starts_with("For more information check:")
        })
        .collect();
    let mut s = keep.join("\n");
    if s.is_empty() {
        s = stderr.trim().to_string();
    }
    if s.len() > 4000 {
        s.truncate(s.floor_char_boundary(4000));
        s.push('…');
    }
    s
}

/// The `hf` CLI, run with our endpoint and token in its environment.
#[derive(Debug, Clone)]
pub struct HfCli {
    config: HfConfig,
    /// The private `HF_HOME`, made on first use and removed with the last clone.
    home: Arc<OnceLock<tempfile::TempDir>>,
}

impl HfCli {
    /// The CLI as `config` names it; its private `HF_HOME` is made on first use.
    pub fn new(config: HfConfig) -> Self {
        Self {
            config,
            home: Arc::new(OnceLock::new()),
        }
    }

    fn private_home(&self) -> Result<PathBuf> {
        if self.home.get().is_none() {
            let dir = tempfile::Builder::new()
                .prefix("starpilot-hf-home-")
                .tempdir()
                // A tempfile-crate error: say where it was making the directory.
                .map_err(|e| {
                    let tmp = std::env::temp_dir();
                    let why = format!(
                        "failed to create a private HF_HOME in `{}`: {e}",
                        tmp.display()
                    );
                    io::Error::new(e.kind(), why)
                })?;
            let _ = self.home.set(dir);
        }
        Ok(self.home.get().expect("just set").path().to_path_buf())
    }

    fn command(&self, args: &[&str]) -> Result<Command> {
        let mut cmd = Command::new(&self.config.cli);
        cmd.args(args).env("HF_ENDPOINT", &self.config.endpoint);
        if let Some(t) = &self.config.token {
            cmd.env("HF_TOKEN", t);
        }
        let user = |k: &str| std::env::var_os(k);
        let home = if user("HF_HOME").is_none() {
            self.private_home()?
        } else {
            PathBuf::new()
        };
        for (k, v) in child_env(&user, &home) {
            cmd.env(k, v);
        }
        Ok(cmd)
    }

    fn spawn(&self, mut cmd: Command) -> Result<std::process::Child> {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.spawn().map_err(|source| Error::HfCliMissing {
            program: self.config.cli.display().to_string(),
            source,
        })
    }

    /// A failed run of `hf ARGS`: its kind and the useful part of what it printed (stderr, else
    /// stdout: some errors print there with `--format json`).
    fn failed(&self, args: &[&str], status: ExitStatus, stderr: &str, stdout: &[u8]) -> Error {
        let text = match stderr.trim() {
            "" => String::from_utf8_lossy(stdout).into_owned(),
            _ => stderr.to_string(),
        };
        Error::HfCli {
            command: self.describe(args),
            status: status.to_string(),
            kind: classify_cli_failure(&text),
            stderr: self.redact(&summarize_stderr(&text)),
        }
    }

    fn describe(&self, args: &[&str]) -> String {
        self.redact(&format!("{} {}", self.config.cli.display(), args.join(" ")))
    }

    /// [`redact`] with our token.
    pub fn redact(&self, text: &str) -> String {
        redact(text, &[self.config.token.as_deref().unwrap_or_default()])
    }

    /// Run `hf ARGS`, optionally feeding `stdin` to it, streamed.
    pub fn run(&self, args: &[&str], stdin: Option<&mut dyn Read>) -> Result<u64> {
        let mut cmd = self.command(args)?;
        cmd.stdin(stdin.as_ref().map_or_else(Stdio::null, |_| Stdio::piped()));
        let mut child = self.spawn(cmd)?;
        let pipe = child.stdin.take();
        let (out, fed) = std::thread::scope(|scope| {
            // Drain stdout/stderr on a second thread while this one feeds stdin, so a chatty
            // CLI can never deadlock against a full pipe.
            let waiter = scope.spawn(move || child.wait_with_output());
            // The pipe is closed (dropped) once fed: that is the end of the data.
            let fed = stdin.zip(pipe).map(|(src, mut pipe)| {
                io::copy(src, &mut pipe).and_then(|n| pipe.flush().map(|_| n))
            });
            (
                waiter.join().expect("waiting for a child does not panic"),
                fed,
            )
        });
        let out = out.map_err(|source| Error::Child {
            program: self.describe(args),
            source,
        })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(self.failed(args, out.status, &stderr, &out.stdout));
        }
        fed.unwrap_or(Ok(0)).map_err(|e| Error::HfCli {
            command: self.describe(args),
            status: "stdin".into(),
            kind: HfFailure::Other,
            stderr: self.redact(&format!("could not stream the data to the CLI: {e}")),
        })
    }

    /// `hf buckets cp LOCAL DST --format json`, reading the CLI's own per-file progress line
    /// from its stderr as it runs ([`crate::progress::parse_hf_line`]) and handing each byte
    /// figure to `report` as a [`Transfer::File`]. The CLI prints it only with progress bars on:
    /// unless the user set `HF_HUB_DISABLE_PROGRESS_BARS`, it is run with `=0` (which prints
    /// the bars on a pipe too); with the user's own truthy value nothing is reported within the
    /// file ([`Measure::AtEnd`], see [`progress_bars_env`]).
    pub fn cp_reporting(
        &self,
        local: &str,
        dst: &str,
        report: &mut dyn FnMut(Transfer),
    ) -> Result<()> {
        let args = ["buckets", "cp", local, dst, "--format", "json"];
        let user = std::env::var_os("HF_HUB_DISABLE_PROGRESS_BARS");
        let (set, measure) = progress_bars_env(user.as_deref());
        let mut cmd = self.command(&args)?;
        if let Some(v) = set {
            cmd.env("HF_HUB_DISABLE_PROGRESS_BARS", v);
        }
        cmd.stdin(Stdio::null());
        let child = self.spawn(cmd)?;
        report(Transfer::File { done: 0, measure });
        // The CLI redraws a line it did not change when another bar moves: one report each.
        let mut last = 0;
        let mut parse = |seg: &str| match parse_hf_line(seg) {
            Some(HfLine::File { done, .. }) => {
                if done != last {
                    last = done;
                    report(Transfer::File { done, measure });
                }
                true
            }
            Some(_) => true,
            // The "Validating" percentage: progress, but not of bytes.
            None => seg.trim_start().starts_with("Validating"),
        };
        let finished = wait_reading_progress(child, &mut parse).map_err(|source| Error::Child {
            program: self.describe(&args),
            source,
        })?;
        if !finished.status.success() {
            let (status, kept, stdout) = (finished.status, &finished.kept, &finished.stdout);
            return Err(self.failed(&args, status, kept, stdout));
        }
        Ok(())
    }

    /// `hf buckets cp SRC DST --format json`.
    pub fn cp(&self, src: &str, dst: &str, stdin: Option<&mut dyn Read>) -> Result<u64> {
        self.run(&["buckets", "cp", src, dst, "--format", "json"], stdin)
    }

    /// `hf buckets rm URI --yes --format json`: without `--yes` the CLI asks for confirmation
    /// and, with no terminal, aborts.
    pub fn rm(&self, uri: &str) -> Result<()> {
        self.run(&["buckets", "rm", uri, "--yes", "--format", "json"], None)?;
        Ok(())
    }
}

/// A Hugging Face bucket as a [`Store`]: read over HTTP (resolve URLs and the tree API, paginated
/// under [`Pagination`]'s guard), written, copied server-side and removed through the `hf` CLI.
/// Paths are the bucket layout itself.
#[derive(Debug, Clone)]
pub struct HfBucketStore {
    /// `NS/NAME`.
    bucket: String,
    http: HubHttp,
    cli: HfCli,
    max_pages: usize,
    max_time: std::time::Duration,
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
            max_pages: MAX_LISTING_PAGES,
            max_time: MAX_LISTING_TIME,
        })
    }

    /// Stop listings still linking on after `time` (default [`MAX_LISTING_TIME`]).
    pub fn with_max_listing_time(mut self, time: std::time::Duration) -> Self {
        self.max_time = time;
        self
    }

    /// Refuse listings longer than `pages` pages (default [`MAX_LISTING_PAGES`]).
    pub fn with_max_listing_pages(mut self, pages: usize) -> Self {
        self.max_pages = pages.max(1);
        self
    }

    /// The bucket, `NS/NAME`.
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

    fn file<'a>(&'a self, path: &'a StorePath) -> HubFile<'a> {
        HubFile {
            http: &self.http,
            url: self.resolve_url(path),
            store: self,
            path,
        }
    }

    /// The `hf` CLI this store writes through.
    pub fn cli(&self) -> &HfCli {
        &self.cli
    }
}

impl Store for HfBucketStore {
    fn name(&self) -> StoreName {
        StoreName {
            name: format!("hf://buckets/{}", self.bucket),
            layout: manifest::StoreLayout::HfBucket,
        }
    }

    fn hub_uri(&self, path: &StorePath) -> Option<String> {
        Some(self.uri(path))
    }

    fn copy_from_hub(&self, src_uri: &str, to: &StorePath) -> Result<bool> {
        self.cli.cp(src_uri, &self.uri(to), None)?;
        Ok(true)
    }

    fn stat(&self, path: &StorePath) -> Result<Option<FileStat>> {
        self.file(path).stat()
    }

    fn open(&self, path: &StorePath) -> Result<Box<dyn Read + Send>> {
        self.file(path).open()
    }

    fn read_at(&self, path: &StorePath, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.file(path).read_at(offset, buf)
    }

    /// `-` is stdin: the bytes stream through the CLI without a temporary copy, and nothing is
    /// learned within them (manifests and sidecars; artifacts go by [`Store::write_file_reporting`]).
    fn write_reporting(
        &self,
        path: &StorePath,
        src: &mut dyn Read,
        _report: &mut dyn FnMut(Transfer),
    ) -> Result<u64> {
        self.cli.cp("-", &self.uri(path), Some(src))
    }

    fn write_file(&self, path: &StorePath, local: &Path) -> Result<u64> {
        let (size, local) = cli_source(local)?;
        self.cli.cp(local, &self.uri(path), None)?;
        Ok(size)
    }

    fn write_file_reporting(
        &self,
        path: &StorePath,
        local: &Path,
        report: &mut dyn FnMut(Transfer),
    ) -> Result<u64> {
        let (size, local) = cli_source(local)?;
        self.cli.cp_reporting(local, &self.uri(path), report)?;
        Ok(size)
    }

    fn list(&self, prefix: &StorePath) -> Result<Vec<ListEntry>> {
        let (endpoint, prefix_url) = (self.http.endpoint(), prefix.url_encoded());
        let first = format!(
            "{endpoint}/api/buckets/{}/tree/{prefix_url}?recursive=true",
            self.bucket
        );
        let mut pages = Pagination::new(&first, self.max_pages).within(self.max_time);
        let (started, mut listed, mut out) = (std::time::Instant::now(), HashSet::new(), vec![]);
        let mut next = Some(first);
        while let Some(url) = next.take() {
            let (resp, _) = self.http.send(Method::GET, &url)?;
            match resp.status() {
                StatusCode::NOT_FOUND => break,
                StatusCode::OK => {}
                s => return Err(status_error("GET", &url, s)),
            }
            next = next_link(resp.headers());
            let too_big =
                format!("tree listing page larger than the {MAX_LISTING_PAGE_BYTES}-byte limit");
            let body = chunker::bounded::read_up_to(resp, MAX_LISTING_PAGE_BYTES)
                .map_err(|source| Error::StoreRead {
                    what: url.clone(),
                    source,
                })?
                .ok_or_else(|| bad_response(&url, too_big))?;
            let entries: Vec<TreeEntry> = serde_json::from_slice(&body).map_err(|e| {
                bad_response(
                    &url,
                    format!("tree listing is not the expected JSON array: {e}"),
                )
            })?;
            let mut new_paths = 0;
            for e in entries {
                new_paths += usize::from(listed.insert((e.kind.clone(), e.path.clone())));
                match e.path.parse::<StorePath>() {
                    Ok(path) if e.kind == "file" && is_under(&path, prefix) => {
                        let size = e.size.unwrap_or(0);
                        out.push(ListEntry { path, size });
                    }
                    _ => {}
                }
            }
            if let Some(n) = &next {
                pages
                    .page_listed(new_paths)
                    .and_then(|()| pages.in_time(started.elapsed()))
                    .and_then(|()| pages.follow(n))
                    .map_err(|reason| Error::BadResponse {
                    url: self.http.redact(&url),
                    reason: self.http.redact(&format!(
                        "{reason}; the listing of {} was stopped (nothing was changed; try again later, and report it if it persists)",
                        self.describe()
                    )),
                })?;
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out.dedup_by(|a, b| a.path == b.path);
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
        self.cli.rm(&self.uri(path))?;
        Ok(true)
    }
}

/// The guard over a paginated listing: every `next` link must stay on the first page's origin
/// and API path, must not repeat a page already fetched, and the listing must end within
/// `max_pages` pages. Pure, so each refusal has a table test.
#[derive(Debug)]
pub struct Pagination {
    origin: Option<(String, Option<String>, Option<u16>)>,
    path: String,
    seen: HashSet<String>,
    max_pages: usize,
    /// Pages in a row, up to the last one, that listed no new path.
    stalled: usize,
    max_time: std::time::Duration,
}

impl Pagination {
    /// A guard for a listing whose first page is `first`, refusing more than `max_pages` pages.
    pub fn new(first: &str, max_pages: usize) -> Self {
        let parsed = Url::parse(first).ok();
        Self {
            origin: parsed.as_ref().map(origin),
            path: parsed.map(|u| u.path().to_string()).unwrap_or_default(),
            seen: HashSet::from([first.to_string()]),
            max_pages,
            stalled: 0,
            max_time: MAX_LISTING_TIME,
        }
    }

    /// The same guard with a time bound of `max_time` instead of [`MAX_LISTING_TIME`].
    pub fn within(mut self, max_time: std::time::Duration) -> Self {
        self.max_time = max_time;
        self
    }

    /// Refuse to go on once the listing has taken `elapsed`, at or over the time bound.
    pub fn in_time(&self, elapsed: std::time::Duration) -> Result<(), String> {
        if elapsed >= self.max_time {
            return Err(format!(
                "the listing still links to another page after {} s (the bound is {} s)",
                elapsed.as_secs(),
                self.max_time.as_secs()
            ));
        }
        Ok(())
    }

    /// Count a fetched page that links on and listed `new_paths` paths not listed before;
    /// refuse to go on after [`MAX_STALLED_PAGES`] such pages in a row listed nothing new.
    pub fn page_listed(&mut self, new_paths: usize) -> Result<(), String> {
        self.stalled = if new_paths == 0 { self.stalled + 1 } else { 0 };
        if self.stalled >= MAX_STALLED_PAGES {
            return Err(format!(
                "the listing does not advance: {} pages in a row listed nothing new and still link to another page",
                self.stalled
            ));
        }
        Ok(())
    }

    /// Accept `next` as the following page, or say why not.
    pub fn follow(&mut self, next: &str) -> Result<(), String> {
        if next.len() > MAX_NEXT_LINK_BYTES {
            return Err(format!(
                "the next-page link is {} bytes, over the {MAX_NEXT_LINK_BYTES}-byte bound (a cursor that keeps growing)",
                next.len()
            ));
        }
        let url = Url::parse(next)
            .map_err(|e| format!("the next-page link {next:?} is not a URL ({e})"))?;
        if self.origin != Some(origin(&url)) || url.path() != self.path {
            return Err(format!(
                "the next-page link {next:?} leads away from this listing ({})",
                self.path
            ));
        }
        if !self.seen.insert(next.to_string()) {
            return Err(format!(
                "the next-page link {next:?} repeats a page already listed (the listing would loop)"
            ));
        }
        if self.seen.len() > self.max_pages {
            return Err(format!("the listing goes on past {} pages", self.max_pages));
        }
        Ok(())
    }
}

/// The `rel="next"` target of a `Link` header, as the Hub paginates listings.
fn next_link(headers: &HeaderMap) -> Option<String> {
    let link = headers.get(LINK)?.to_str().ok()?;
    link.split(',').find_map(|part| {
        let mut pieces = part.split(';');
        let target = pieces.next()?.trim();
        let next = pieces.any(|p| p.trim().replace(' ', "") == "rel=\"next\"");
        next.then(|| {
            target
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_string()
        })
    })
}

/// A URL's scheme, host and port: what must match for the token or a next page to go there.
fn origin(url: &Url) -> (String, Option<String>, Option<u16>) {
    let host = url.host_str().map(str::to_string);
    (url.scheme().to_string(), host, url.port_or_known_default())
}

/// A local file handed to the `hf` CLI by name: its size, and its path as the CLI's argument.
fn cli_source(local: &Path) -> Result<(u64, &str)> {
    let size = fs_err::metadata(local)?.len();
    let name = local.to_str().ok_or_else(|| Error::InvalidPath {
        path: local.display().to_string(),
        reason: "not valid UTF-8, cannot be passed to the hf CLI".into(),
    })?;
    Ok((size, name))
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

    /// Whether an upload's progress can be read from the CLI, by the user's
    /// HF_HUB_DISABLE_PROGRESS_BARS (huggingface_hub's own reading of the value).
    #[test]
    fn progress_bars_env_as_a_table() {
        use std::ffi::OsStr;
        for (user, want) in [
            (None, (Some("0"), Measure::HfCli)),
            (Some("1"), (None, Measure::AtEnd)),
            (Some("true"), (None, Measure::AtEnd)),
            (Some("On"), (None, Measure::AtEnd)),
            (Some("yes"), (None, Measure::AtEnd)),
            (Some("0"), (None, Measure::HfCli)),
            (Some("false"), (None, Measure::HfCli)),
            (Some(""), (None, Measure::HfCli)),
        ] {
            assert_eq!(progress_bars_env(user.map(OsStr::new)), want, "{user:?}");
        }
    }

    #[test]
    fn child_env_adds_only_what_the_user_did_not_set() {
        let home = Path::new("/tmp/private-home");
        let none = |_: &str| None;
        let got: Vec<(&str, OsString)> = child_env(&none, home);
        assert_eq!(
            got,
            [
                ("HF_HUB_DISABLE_UPDATE_CHECK", "1".into()),
                ("HF_HUB_DISABLE_TELEMETRY", "1".into()),
                ("HF_HUB_DISABLE_PROGRESS_BARS", "1".into()),
                ("HF_HOME", "/tmp/private-home".into()),
            ]
        );
        let user = |k: &str| {
            matches!(k, "HF_HOME" | "HF_HUB_DISABLE_TELEMETRY").then(|| OsString::from("0"))
        };
        let names: Vec<&str> = child_env(&user, home).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            names,
            [
                "HF_HUB_DISABLE_UPDATE_CHECK",
                "HF_HUB_DISABLE_PROGRESS_BARS"
            ]
        );
    }

    #[test]
    fn stored_token_path_follows_huggingface_hub() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        type Vars = &'static [(&'static str, &'static str)];
        let cases: &[(Vars, Option<&str>)] = &[
            (&[("HF_TOKEN_PATH", "/t"), ("HF_HOME", "/h")], Some("/t")),
            (&[("HF_HOME", "/h"), ("HOME", "/home/u")], Some("/h/token")),
            (
                &[("XDG_CACHE_HOME", "/c"), ("HOME", "/home/u")],
                Some("/c/huggingface/token"),
            ),
            (
                &[("HOME", "/home/u")],
                Some("/home/u/.cache/huggingface/token"),
            ),
            (&[], None),
        ];
        for (vars, want) in cases {
            let got = stored_token_path(&env(vars));
            assert_eq!(got.as_deref(), want.map(Path::new), "{vars:?}");
        }
    }

    #[test]
    fn redaction_removes_every_form_of_the_token() {
        let tok = "hf_SECRETsecretSECRETsecret1234";
        let cases = [
            (format!("token is {tok}."), "token is <redacted>."),
            (
                "headers: {'authorization': 'Bearer abc.def', 'x': 1}".to_string(),
                "headers: {'authorization': '<redacted>, 'x': 1}",
            ),
            (
                "Authorization: Bearer xyz\nnext line".to_string(),
                "Authorization: <redacted>\nnext line",
            ),
            (
                "sent Bearer abc123 to host".to_string(),
                "sent Bearer <redacted> to host",
            ),
            (
                "someone else's hf_abcdefghijklmnopqrstuvwxyz0 leaked".to_string(),
                "someone else's <redacted> leaked",
            ),
            (
                "the authorization was refused".to_string(),
                "the authorization was refused",
            ),
            ("short hf_abc stays".to_string(), "short hf_abc stays"),
            ("ünïcode ok".to_string(), "ünïcode ok"),
        ];
        for (input, want) in cases {
            assert_eq!(redact(&input, &[tok]), want, "{input}");
        }
        // A token without the hf_ shape is still removed, and an empty one is no pattern.
        assert_eq!(
            redact("x plain-secret y", &["plain-secret"]),
            "x <redacted> y"
        );
        assert_eq!(redact("abc", &[""]), "abc");
    }

    #[test]
    fn cli_failures_are_classified_from_the_real_wording() {
        let cases = [
            (
                "Remove 'models/c.bin' from 'ns/bk'? [y/N]: Aborted!",
                HfFailure::ConfirmationRequired,
            ),
            (
                "Error: Remove 'models/c.bin' from 'ns/bk'? Use --yes to skip confirmation.",
                HfFailure::ConfirmationRequired,
            ),
            (
                "ConnectionError: Network error: Request error: HTTP status client error (401 Unauthorized), domain: http://127.0.0.1:1/api/buckets/ns/bk/xet-write-token",
                HfFailure::AuthRefused,
            ),
            (
                "Error: Client error '401 Unauthorized' for url 'http://h/api/buckets/ns/bk/batch'\nInvalid credentials in Authorization header",
                HfFailure::AuthRefused,
            ),
            (
                "ConnectionError: Network error: Request error: HTTP status client error (404 Not Found), domain: http://127.0.0.1:1/api/buckets/ns/nope/xet-write-token",
                HfFailure::BucketMissing,
            ),
            (
                "Error: Failed to apply 1 out of 1 operation(s) on bucket 'ns/bk':\n  - models/zzz: Entry not found",
                HfFailure::BatchFailed,
            ),
            (
                "Error: No files found at 'hf://buckets/ns/bk/models/zzz' in bucket 'ns/bk'.",
                HfFailure::SourceMissing,
            ),
            ("Error: something else", HfFailure::Other),
        ];
        for (stderr, want) in cases {
            assert_eq!(classify_cli_failure(stderr), want, "{stderr}");
        }
        assert_eq!(
            summarize_stderr(
                "Traceback (most recent call last):\n  File \"x\", line 1\n    f()\nConnectionError: boom\nHint: set HF_DEBUG=1 as environment variable for full traceback.\n"
            ),
            "ConnectionError: boom"
        );
    }

    /// A listing is bounded in time and in the length of its cursor, each page new or not.
    #[test]
    fn pagination_is_bounded_in_time_and_cursor_length() {
        use std::time::Duration;
        let first = "http://h:1/api/buckets/a/b/tree/p?recursive=true";
        let p = Pagination::new(first, 100);
        assert_eq!(p.in_time(Duration::ZERO), Ok(()));
        assert_eq!(
            p.in_time(MAX_LISTING_TIME - Duration::from_millis(1)),
            Ok(())
        );
        assert!(p.in_time(MAX_LISTING_TIME).unwrap_err().contains("120 s"));
        let p = Pagination::new(first, 100).within(Duration::from_secs(5));
        assert_eq!(p.in_time(Duration::from_secs(4)), Ok(()));
        assert!(p.in_time(Duration::from_secs(5)).is_err());
        // A cursor that grows with every page: refused once its link passes the bound.
        let mut p = Pagination::new(first, 1_000_000);
        let mut refused_at = None;
        for page in 1..10_000usize {
            let next = format!("{first}&cursor={}", "a".repeat(page * 16));
            if let Err(e) = p.follow(&next) {
                assert!(e.contains("keeps growing"), "{e}");
                refused_at = Some(next.len());
                break;
            }
        }
        let at = refused_at.expect("a growing cursor is refused");
        assert!(
            at > MAX_NEXT_LINK_BYTES && at <= MAX_NEXT_LINK_BYTES + 16,
            "{at}"
        );
    }

    #[test]
    fn pagination_refuses_loops_foreign_links_and_endless_listings() {
        let first = "http://h:1/api/buckets/a/b/tree/p?recursive=true";
        let next = |c: u32| format!("http://h:1/api/buckets/a/b/tree/p?recursive=true&cursor={c}");
        let mut p = Pagination::new(first, 3);
        assert_eq!(p.follow(&next(1)), Ok(()));
        assert!(p.follow(&next(1)).unwrap_err().contains("repeats"));
        assert!(p.follow(first).unwrap_err().contains("repeats"));
        assert_eq!(p.follow(&next(2)), Ok(()));
        assert!(p.follow(&next(3)).unwrap_err().contains("past 3 pages"));
        // Pages that list nothing new: the third in a row ends the listing; a page with
        // something new in between starts the count again.
        for (pages, stops_at) in [
            (&[5, 0, 0, 0][..], Some(3)),
            (&[0, 0, 0][..], Some(2)),
            (&[5, 0, 0, 1, 0, 0, 2][..], None),
            (&[1, 1, 1, 1][..], None),
        ] {
            let mut p = Pagination::new(first, 100);
            let stopped = pages.iter().position(|&n| p.page_listed(n).is_err());
            assert_eq!(stopped, stops_at, "{pages:?}");
        }
        let mut p = Pagination::new(first, 100);
        p.page_listed(0).unwrap();
        p.page_listed(0).unwrap();
        assert!(p.page_listed(0).unwrap_err().contains("does not advance"));
        for foreign in [
            "http://evil:1/api/buckets/a/b/tree/p?cursor=1",
            "https://h:1/api/buckets/a/b/tree/p?cursor=1",
            "http://h:2/api/buckets/a/b/tree/p?cursor=1",
            "http://h:1/api/buckets/other/bucket/tree/p?cursor=1",
            "not a url",
        ] {
            let mut p = Pagination::new(first, 10);
            assert!(p.follow(foreign).is_err(), "{foreign}");
        }
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
