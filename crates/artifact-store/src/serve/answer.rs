//! Answering one parsed request: route it, then write the status line, headers and body (a
//! file with its ETag and Range handling, a tree listing, or a short error page).

use fs_err::{self as fs, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::http::{Request, percent_decode};
use super::route::{Route, route};
use super::{BUF, RangeAnswer, ServeConfig, parse_range};
use crate::paths::{StorePath, to_fs_path};

fn etag(meta: &std::fs::Metadata) -> String {
    format!(
        "\"{:x}-{:x}-{:x}\"",
        meta.len(),
        meta.mtime() as u64 * 1_000_000_000 + meta.mtime_nsec() as u64,
        meta.ino()
    )
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => "application/json",
        _ => "application/octet-stream",
    }
}

pub(super) fn simple(
    out: &mut impl Write,
    status: u16,
    reason: &str,
    head: bool,
) -> io::Result<(u16, u64)> {
    let body = format!("{status} {reason}\n");
    write!(
        out,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if !head {
        out.write_all(body.as_bytes())?;
    }
    out.flush()?;
    Ok((status, 0))
}

/// A 200 answer of `body`, of type `content_type`.
fn ok(out: &mut impl Write, content_type: &str, body: &[u8], head: bool) -> io::Result<(u16, u64)> {
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if !head {
        out.write_all(body)?;
    }
    out.flush()?;
    Ok((200, if head { 0 } else { body.len() as u64 }))
}

/// What `/` answers: the base path of every mount and what it serves, so a person who opens the
/// mirror in a browser or with curl sees where to point `--hf-base`/`--github-base`.
pub(super) fn index(config: &ServeConfig) -> String {
    let mut body = String::from("StarPilot model store mirror (release-cli serve). Base paths:\n");
    for m in &config.mounts {
        let what = match m.kind {
            super::MountKind::Identity => "store paths as they are (Hugging Face resolve layout)",
            super::MountKind::Github => {
                "the GitHub raw layout (model_names_<gen>.json, <gen>/<id>/<file>)"
            }
        };
        body.push_str(&format!("  {}  {what}\n", m.prefix));
        if let Some(bucket) = &m.tree_api_bucket {
            body.push_str(&format!(
                "  /api/buckets/{bucket}/tree/  the bucket's file listing (JSON)\n"
            ));
        }
    }
    body
}

pub(super) fn respond(
    out: &mut impl Write,
    req: &Request,
    config: &ServeConfig,
) -> io::Result<(u16, u64)> {
    let head = match req.method.as_str() {
        "GET" => false,
        "HEAD" => true,
        _ => {
            write!(
                out,
                "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )?;
            return Ok((405, 0));
        }
    };
    let raw_path = req.target.split(['?', '#']).next().unwrap_or("");
    let Some(path) = percent_decode(raw_path) else {
        return simple(out, 404, "Not Found", head);
    };
    match route(config, &path) {
        Route::Index => ok(
            out,
            "text/plain; charset=utf-8",
            index(config).as_bytes(),
            head,
        ),
        Route::NotFound => simple(out, 404, "Not Found", head),
        Route::Tree { root, prefix } => tree(out, &root, prefix.as_ref(), head),
        Route::File(p) => file(out, req, &p, head),
    }
}

fn tree(
    out: &mut impl Write,
    root: &Path,
    prefix: Option<&StorePath>,
    head: bool,
) -> io::Result<(u16, u64)> {
    let store = crate::local::LocalStore::new(root);
    let entries = match prefix {
        Some(p) => crate::store::Store::list(&store, p),
        None => {
            // The whole bucket: list each top-level directory.
            let mut all = Vec::new();
            if let Ok(rd) = fs::read_dir(root) {
                for e in rd.flatten() {
                    if let Some(Ok(p)) = e.file_name().to_str().map(str::parse::<StorePath>)
                        && let Ok(mut v) = crate::store::Store::list(&store, &p)
                    {
                        all.append(&mut v);
                    }
                }
            }
            all.sort_by(|a, b| a.path.cmp(&b.path));
            Ok(all)
        }
    };
    let Ok(entries) = entries else {
        return simple(out, 500, "Internal Server Error", head);
    };
    // Nothing whose real path leaves the store: not the prefix (a symlinked directory), not an
    // entry (a symlinked file).
    let Ok(real_root) = fs::canonicalize(root) else {
        return simple(out, 404, "Not Found", head);
    };
    let inside = |p: &StorePath| {
        fs::canonicalize(to_fs_path(p, root)).is_ok_and(|real| real.starts_with(&real_root))
    };
    if let Some(p) = prefix
        && fs::symlink_metadata(to_fs_path(p, root)).is_ok()
        && !inside(p)
    {
        return simple(out, 404, "Not Found", head);
    }
    let entries: Vec<_> = entries.into_iter().filter(|e| inside(&e.path)).collect();
    let body: Vec<serde_json::Value> = entries
        .iter()
        .map(|e| serde_json::json!({"type": "file", "path": e.path.as_str(), "size": e.size}))
        .collect();
    let body = serde_json::to_vec(&body).expect("JSON of strings and numbers");
    ok(out, "application/json", &body, head)
}

fn file(out: &mut impl Write, req: &Request, path: &Path, head: bool) -> io::Result<(u16, u64)> {
    let Ok(mut f) = File::open(path) else {
        return simple(out, 404, "Not Found", head);
    };
    let Ok(meta) = f.metadata() else {
        return simple(out, 404, "Not Found", head);
    };
    if !meta.is_file() {
        return simple(out, 404, "Not Found", head);
    }
    let size = meta.len();
    let tag = etag(&meta);
    let common = format!(
        "ETag: {tag}\r\nAccept-Ranges: bytes\r\nContent-Type: {}\r\nConnection: close\r\n",
        content_type(path)
    );
    if let Some(inm) = req.header("if-none-match")
        && inm.split(',').any(|t| t.trim() == tag || t.trim() == "*")
    {
        write!(out, "HTTP/1.1 304 Not Modified\r\n{common}\r\n")?;
        out.flush()?;
        return Ok((304, 0));
    }
    // If-Range with another validator means "the file changed: send all of it".
    let range_applies = match req.header("if-range") {
        Some(v) => v.trim() == tag,
        None => true,
    };
    let range = match (req.header("range"), range_applies) {
        (Some(r), true) => parse_range(r, size),
        _ => RangeAnswer::Full,
    };
    let (status, start, len) = match range {
        RangeAnswer::Full => {
            write!(
                out,
                "HTTP/1.1 200 OK\r\n{common}Content-Length: {size}\r\n\r\n"
            )?;
            (200, 0, size)
        }
        RangeAnswer::Partial { start, end } => {
            let len = end - start + 1;
            write!(
                out,
                "HTTP/1.1 206 Partial Content\r\n{common}Content-Range: bytes {start}-{end}/{size}\r\nContent-Length: {len}\r\n\r\n"
            )?;
            (206, start, len)
        }
        RangeAnswer::Unsatisfiable => {
            write!(
                out,
                "HTTP/1.1 416 Range Not Satisfiable\r\n{common}Content-Range: bytes */{size}\r\nContent-Length: 0\r\n\r\n"
            )?;
            out.flush()?;
            return Ok((416, 0));
        }
    };
    if head {
        out.flush()?;
        return Ok((status, 0));
    }
    f.seek(SeekFrom::Start(start))?;
    let mut buf = vec![0u8; BUF.min(len.max(1) as usize)];
    let mut left = len;
    while left > 0 {
        let want = (buf.len() as u64).min(left) as usize;
        let n = f.read(&mut buf[..want])?;
        if n == 0 {
            // The file shrank under us: stop; the client sees a short body and retries.
            break;
        }
        out.write_all(&buf[..n])?;
        left -= n as u64;
    }
    out.flush()?;
    Ok((status, len - left))
}
