//! The downloader against origins that attack or stall it (issue 16): redirects anywhere,
//! malformed responses, trickled and stalled answers, and a cancel at each point before and
//! during the payload. Every case runs against a real server on 127.0.0.1.
//!
//! The bounds asserted on elapsed time are the documented contracts (cancel within 1 s; an origin
//! abandoned at its deadline), with the configured limits far below them, not speed measurements.

use std::fs;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;
use downloader::{CancelToken, DownloadConfig, Error, HttpConfig};
use manifest::{Manifest, ModelId};
use test_support::http_server::Fault;
use test_support::published::{
    GH_DIR, HF_DIR, artifact_bytes, manifest_json, publish_model, write_manifest,
};

/// Short limits so that every hostile case ends in well under a second per origin.
fn config() -> DownloadConfig {
    DownloadConfig {
        connections: 2,
        ranges_per_chunk: 1,
        max_attempts: 3,
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(20),
        space_margin: 0,
        http: HttpConfig {
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_millis(600),
            min_rate: 2048,
            rate_window: Duration::from_millis(400),
            origin_deadline: Duration::from_millis(1500),
            ..HttpConfig::default()
        },
    }
}

/// Panics on the downloader's request threads, recorded by a hook installed once for this test
/// binary. The request thread catches a panic (so the manager would survive one), but none may
/// happen at all: every hostile input must be refused before it reaches code that can panic.
static REQUEST_PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn watch_request_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if thread::current().name() == Some("http-request") {
                REQUEST_PANICS.lock().unwrap().push(info.to_string());
            }
            previous(info);
        }));
    });
}

fn assert_no_request_panics() {
    let p = REQUEST_PANICS.lock().unwrap();
    assert!(p.is_empty(), "the HTTP stack panicked: {p:?}");
}

fn manifest_path(layout: &str) -> String {
    if layout == HF_DIR {
        format!("/{HF_DIR}/manifests/model_names_{GEN}.json")
    } else {
        format!("/{GH_DIR}/model_names_{GEN}.json")
    }
}

impl World {
    fn hf_file(&self, id: &str, suffix: &str) -> String {
        format!("/{HF_DIR}/models/{GEN}/{id}/{id}_driving_tinygrad.pkl{suffix}")
    }

    fn github_requests(&self) -> usize {
        self.server
            .requests()
            .iter()
            .filter(|r| r.path.starts_with(&format!("/{GH_DIR}/")))
            .count()
    }
}

/// Every kind of redirect an origin (or whoever edits its redirects) could send.
fn hostile_locations() -> Vec<Option<String>> {
    [
        "file:///etc/passwd",
        "file:/data/params/d/DongleId",
        "data:text/plain,hello",
        "data:application/json;base64,e30=",
        "mailto:someone@example.com",
        "unix:/run/dbus/system_bus_socket",
        "unix:///tmp/x.sock",
        "javascript:alert(1)",
        "ftp://127.0.0.1/x",
        "gopher://127.0.0.1:70/",
        "http://",
        "http:///no-host",
        "https://",
        "http://user:secret@127.0.0.1:1/x",
        "http://[::1",
        "http://exa mple.com/",
        "",
        " ",
        "\t//",
        "//",
        "?",
        "#",
        "::::",
    ]
    .into_iter()
    .map(|s| Some(s.to_string()))
    .chain([None])
    .collect()
}

#[test]
fn a_redirect_anywhere_never_panics_and_github_serves_the_manifest() {
    watch_request_panics();
    let w = world();
    w.publish("pop223", 7, 3 * CHUNK, true, true);
    let d = w.downloader(config());
    for location in hostile_locations() {
        for status in [301, 302, 303, 307, 308] {
            w.server.clear_faults();
            w.server.add_fault(
                &manifest_path(HF_DIR),
                Fault::Redirect {
                    status,
                    location: location.clone(),
                },
                None,
            );
            let got = d
                .fetch_manifest(generation())
                .unwrap_or_else(|e| panic!("{status} to {location:?}: GitHub was not used: {e}"));
            assert!(
                got.origin.starts_with("GitHub"),
                "{location:?}: {}",
                got.origin
            );
        }
    }
    assert_no_request_panics();
}

#[test]
fn redirect_loops_are_bounded_and_good_redirects_are_followed() {
    let w = world();
    w.publish("pop223", 7, 3 * CHUNK, true, true);
    let d = w.downloader(config());
    // A loop: the manifest redirects to itself.
    w.server.add_fault(
        &manifest_path(HF_DIR),
        Fault::Redirect {
            status: 302,
            location: Some(manifest_path(HF_DIR)),
        },
        None,
    );
    let got = d.fetch_manifest(generation()).unwrap();
    assert!(got.origin.starts_with("GitHub"));
    let loops = w
        .server
        .requests()
        .iter()
        .filter(|r| r.path == manifest_path(HF_DIR))
        .count();
    assert_eq!(
        loops, 6,
        "the first request plus 5 hops, then the origin is given up"
    );

    // A redirect to another place that serves the file (as a CDN does) is followed.
    w.server.clear_faults();
    w.server.clear_requests();
    w.server.add_fault(
        &manifest_path(HF_DIR),
        Fault::Redirect {
            status: 302,
            location: Some(format!("{}{}", w.server.url(), manifest_path(GH_DIR))),
        },
        None,
    );
    let got = d.fetch_manifest(generation()).unwrap();
    assert!(got.origin.starts_with("Hugging Face"), "{}", got.origin);
}

#[test]
fn a_hostile_redirect_of_a_chunk_or_head_falls_back_to_github() {
    watch_request_panics();
    for suffix in [".chunkmanifest", ".chunk01of03", ".chunk02of03"] {
        for location in [
            Some("file:///etc/shadow".to_string()),
            Some("data:,x".into()),
            None,
        ] {
            let w = world();
            let (data, m) = w.publish("pop223", 7, 3 * CHUNK - 5, true, true);
            w.server.add_fault(
                &w.hf_file("pop223", suffix),
                Fault::Redirect {
                    status: 302,
                    location: location.clone(),
                },
                None,
            );
            let entry = m.get(&"pop223".parse::<ModelId>().unwrap()).unwrap();
            let done = w
                .downloader(config())
                .download(generation(), entry, &w.models, &CancelToken::new(), &|_| {})
                .unwrap_or_else(|e| panic!("{suffix} -> {location:?}: {e}"));
            assert!(done.origin.starts_with("GitHub"), "{suffix}");
            assert_eq!(w.installed("pop223").unwrap(), data);
        }
    }
    assert_no_request_panics();
}

#[test]
fn a_trickled_or_stalled_manifest_gives_way_to_github_at_the_deadline() {
    for fault in [
        Fault::Stall,
        // Headers at 20 bytes/s: no response head within the response timeout.
        Fault::Trickle(Duration::from_millis(50)),
    ] {
        let w = world();
        w.publish("pop223", 7, 3 * CHUNK, true, true);
        w.server
            .add_fault(&manifest_path(HF_DIR), fault.clone(), None);
        let cfg = config();
        let began = Instant::now();
        let got = w
            .downloader(cfg.clone())
            .fetch_manifest(generation())
            .unwrap();
        let took = began.elapsed();
        assert!(got.origin.starts_with("GitHub"), "{fault:?}");
        assert!(
            took < cfg.http.origin_deadline * 3,
            "{fault:?}: {took:?} for an origin deadline of {:?}",
            cfg.http.origin_deadline
        );
    }
}

#[test]
fn a_body_below_the_minimum_rate_gives_way_to_github() {
    let w = world();
    let (data, m) = w.publish("pop223", 7, 3 * CHUNK, true, true);
    // The head arrives in time (about 200 bytes at 1 ms each) but the 64 KiB body at 1 kB/s
    // is below the 2 KiB/s floor.
    w.server.add_fault(
        &w.hf_file("pop223", ".chunk02of03"),
        Fault::Trickle(Duration::from_millis(1)),
        None,
    );
    let cfg = DownloadConfig {
        http: HttpConfig {
            response_timeout: Duration::from_secs(2),
            ..config().http
        },
        ..config()
    };
    let entry = m.get(&"pop223".parse::<ModelId>().unwrap()).unwrap();
    let done = w
        .downloader(cfg)
        .download(generation(), entry, &w.models, &CancelToken::new(), &|_| {})
        .unwrap();
    assert!(done.origin.starts_with("GitHub"), "{}", done.origin);
    assert_eq!(w.installed("pop223").unwrap(), data);
}

/// Responses no correct server sends. Each one, for the manifest and for a chunk, must end in
/// an error for that origin (never a panic, never a hang) and GitHub must be used.
fn malformed_responses() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = [
        &b""[..],
        b"\r\n\r\n",
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 99999 Huge\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 0 Zero\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 -1 Neg\r\n\r\n",
        b"HTTP/9.9 200 OK\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/2 200\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551616\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999999\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\n: empty name\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nX: \xff\xfe\x00\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\n\x00\x00\x00\r\n\r\n",
        b"HTTP/1.1 200 OK\nContent-Length: 2\n\n{}",
        b"HTTP/1.1 200 OK\rContent-Length: 2\r\r{}",
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\n\r\n",
        b"HTTP/1.1 302 Found\r\nLocation: \xff\xfe\r\n\r\n",
        b"HTTP/1.1 302 Found\r\nLocation: file:///etc/passwd\r\nLocation: /ok\r\n\r\n",
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 5-2/1\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 99999999999999999999999-1/2\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes */*\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nETag: \"\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length:2\r\n\r\n{}",
    ]
    .iter()
    .map(|b| b.to_vec())
    .collect();
    // A header line of 1 MiB, and 20,000 headers.
    let mut long = b"HTTP/1.1 200 OK\r\nX-Long: ".to_vec();
    long.extend(std::iter::repeat_n(b'a', 1 << 20));
    long.extend_from_slice(b"\r\n\r\n");
    v.push(long);
    let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..20_000 {
        many.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    v.push(many);
    // A status line of 64 KiB with no newline at all.
    v.push(vec![b'H'; 64 * 1024]);
    v
}

#[test]
fn every_malformed_response_ends_in_an_error_for_that_origin_and_never_a_panic() {
    watch_request_panics();

    let w = world();
    let (data, m) = w.publish("pop223", 7, 3 * CHUNK - 1, true, true);
    let d = w.downloader(config());
    let entry = m.get(&"pop223".parse::<ModelId>().unwrap()).unwrap();
    for (i, raw) in malformed_responses().into_iter().enumerate() {
        w.server.clear_faults();
        w.server
            .add_fault(&manifest_path(HF_DIR), Fault::Raw(raw.clone()), None);
        let got = d
            .fetch_manifest(generation())
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
        assert!(
            got.origin.starts_with("GitHub"),
            "case {i} was accepted from HF"
        );

        w.server.clear_faults();
        w.server
            .add_fault(&w.hf_file("pop223", ".chunk02of03"), Fault::Raw(raw), None);
        let _ = fs::remove_file(w.models.join("pop223_driving_tinygrad.pkl"));
        let done = d
            .download(generation(), entry, &w.models, &CancelToken::new(), &|_| {})
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
        assert!(done.origin.starts_with("GitHub"), "case {i}");
        assert_eq!(w.installed("pop223").unwrap(), data, "case {i}");
    }
    assert_no_request_panics();
}

/// Cancel `after` a delay from another thread; returns how long the call took after the cancel.
fn cancel_after<T>(after: Duration, f: impl FnOnce(&CancelToken) -> T) -> (T, Duration) {
    let cancel = CancelToken::new();
    let at = Mutex::new(None);
    let out = thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(after);
            *at.lock().unwrap() = Some(Instant::now());
            cancel.cancel();
        });
        f(&cancel)
    });
    let at = at
        .into_inner()
        .unwrap()
        .expect("the cancel fired before the call returned");
    (out, at.elapsed())
}

#[test]
fn cancel_is_honoured_within_a_second_before_and_during_every_request() {
    // Generous limits: only the cancel may end these calls.
    let slow = DownloadConfig {
        http: HttpConfig {
            response_timeout: Duration::from_secs(60),
            origin_deadline: Duration::from_secs(120),
            read_timeout: Duration::from_secs(60),
            min_rate: 1,
            rate_window: Duration::from_secs(60),
            ..HttpConfig::default()
        },
        ..config()
    };
    // The manifest request, stalled before its headers.
    let w = world();
    w.publish("pop223", 7, 3 * CHUNK, true, true);
    w.server
        .add_fault(&manifest_path(HF_DIR), Fault::Stall, None);
    let d = w.downloader(slow.clone());
    let (res, after) = cancel_after(Duration::from_millis(300), |c| {
        d.fetch_manifest_cancellable(generation(), c)
    });
    assert!(matches!(res, Err(Error::Cancelled { .. })), "{res:?}");
    assert!(after < Duration::from_secs(1), "{after:?}");
    assert_eq!(w.github_requests(), 0, "no other origin after a cancel");

    // The .chunkmanifest GET, the first chunk's HEAD, headers of a payload range, and the body.
    let cases: [(&str, Fault); 4] = [
        (".chunkmanifest", Fault::Stall),
        (".chunk01of03", Fault::Stall),
        (".chunk02of03", Fault::Trickle(Duration::from_millis(200))),
        (".chunk03of03", Fault::Trickle(Duration::from_micros(500))),
    ];
    for (suffix, fault) in cases {
        let w = world();
        let (_, m) = w.publish("pop223", 7, 3 * CHUNK - 9, true, true);
        w.server
            .add_fault(&w.hf_file("pop223", suffix), fault.clone(), None);
        let d = w.downloader(slow.clone());
        let entry = m.get(&"pop223".parse::<ModelId>().unwrap()).unwrap();
        let (res, after) = cancel_after(Duration::from_millis(400), |c| {
            d.download(generation(), entry, &w.models, c, &|_| {})
        });
        assert!(
            matches!(res, Err(Error::Cancelled { .. })),
            "{suffix}: {res:?}"
        );
        assert!(after < Duration::from_secs(1), "{suffix}: {after:?}");
        assert!(w.installed("pop223").is_none());
        assert_eq!(w.github_requests(), 0, "{suffix}");
    }
}

#[test]
fn planted_symlinks_are_never_followed_and_superseded_staging_is_cleaned() {
    let w = world();
    let (data, m) = w.publish("pop223", 7, 3 * CHUNK + 1, true, true);
    let outside = w.dir.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("victim"), b"precious").unwrap();
    let entry = m.get(&"pop223".parse::<ModelId>().unwrap()).unwrap();
    let target = downloader::Target::from_entry(entry).unwrap();

    // The staging directory's name is a symlink to a directory outside, holding a symlink at
    // the (predictable) staging name; the previous build's staging name is a symlink too.
    let evil = outside.join("evil");
    fs::create_dir_all(&evil).unwrap();
    std::os::unix::fs::symlink(
        outside.join("victim"),
        evil.join(target.staging_name().unwrap()),
    )
    .unwrap();
    std::os::unix::fs::symlink(&evil, w.models.join(downloader::STAGING_DIR)).unwrap();
    std::os::unix::fs::symlink(
        outside.join("victim"),
        w.models.join(format!(
            "{}{}",
            downloader::LEGACY_STAGING_PREFIX,
            target.staging_name().unwrap()
        )),
    )
    .unwrap();
    let d = w.downloader(config());
    d.download(generation(), entry, &w.models, &CancelToken::new(), &|_| {})
        .unwrap();
    assert_eq!(w.installed("pop223").unwrap(), data);
    assert_eq!(fs::read(outside.join("victim")).unwrap(), b"precious");
    assert!(
        fs::symlink_metadata(evil.join(target.staging_name().unwrap())).is_ok(),
        "untouched"
    );
    let staging = w.models.join(downloader::STAGING_DIR);
    assert!(fs::symlink_metadata(&staging).unwrap().is_dir());
    let names: Vec<_> = fs::read_dir(&w.models)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| !n.starts_with(downloader::LEGACY_STAGING_PREFIX)),
        "{names:?}"
    );

    // Cleanup without gc: a partial of another digest of the same model goes, another model's
    // recent partial stays, at the start of the next download.
    fs::write(
        staging.join("ffffffffffffffff-pop223_driving_tinygrad.pkl"),
        b"old",
    )
    .unwrap();
    fs::write(
        staging.join("ffffffffffffffff-pop223_driving_tinygrad.pkl.state"),
        b"x",
    )
    .unwrap();
    fs::write(
        staging.join("1111111111111111-other_driving_tinygrad.pkl"),
        b"o",
    )
    .unwrap();
    fs::remove_file(w.models.join("pop223_driving_tinygrad.pkl")).unwrap();
    d.download(generation(), entry, &w.models, &CancelToken::new(), &|_| {})
        .unwrap();
    let mut left: Vec<_> = fs::read_dir(&staging)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["1111111111111111-other_driving_tinygrad.pkl"]);
}

#[test]
fn a_manifest_ahead_of_or_behind_its_chunks_is_not_yet_and_keeps_the_installed_model() {
    let w = world();
    let old = artifact_bytes(1, 3 * CHUNK - 100);
    let new = artifact_bytes(2, 4 * CHUNK - 50);
    fs::write(w.models.join("pop223_driving_tinygrad.pkl"), &old).unwrap();
    let d = w.downloader(config());
    let cases = [
        // The new manifest went live before the new chunks (both origins).
        (&new, &old),
        // The new chunks are up, the manifest is still the old one.
        (&old, &new),
        // Same size, other bytes: only the digests can tell.
        (&old, &artifact_bytes(3, 3 * CHUNK - 100)),
    ];
    for (listed, served) in cases {
        let listed_m = publish_model(&w.root, GEN, "pop223", listed, Some(CHUNK));
        publish_model(&w.root, GEN, "pop223", served, Some(CHUNK));
        let json = manifest_json(GEN, &[listed_m], false);
        write_manifest(&w.root, GEN, json.as_bytes());
        let m = Manifest::from_slice(json.as_bytes()).unwrap();
        let entry = m.get(&"pop223".parse::<ModelId>().unwrap()).unwrap();
        let err = d
            .download(generation(), entry, &w.models, &CancelToken::new(), &|_| {})
            .unwrap_err();
        assert!(err.is_not_yet(), "{err}");
        assert_eq!(
            w.installed("pop223").unwrap(),
            old,
            "the installed model is kept"
        );
    }
    // Once the chunks catch up, the same manifest downloads.
    let listed_m = publish_model(&w.root, GEN, "pop223", &new, Some(CHUNK));
    let json = manifest_json(GEN, &[listed_m], false);
    let m = Manifest::from_slice(json.as_bytes()).unwrap();
    let entry = m.get(&"pop223".parse::<ModelId>().unwrap()).unwrap();
    d.download(generation(), entry, &w.models, &CancelToken::new(), &|_| {})
        .unwrap();
    assert_eq!(w.installed("pop223").unwrap(), new);
}
