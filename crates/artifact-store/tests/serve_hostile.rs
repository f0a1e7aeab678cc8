//! `serve` against idle and slow clients and against symlinks that lead out of the store
//! (issue 16, item 9), over real sockets on 127.0.0.1.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::*;
use artifact_store::serve::{ServeConfig, Server};

const BUCKET: &str = "StarPilot-Driving/StarPilot-Resources";

fn store_with_a_file(root: &std::path::Path) -> Vec<u8> {
    let data = bytes(5, 4000);
    fs::create_dir_all(root.join("models/v25/pop")).unwrap();
    fs::write(root.join("models/v25/pop/pop_driving_tinygrad.pkl"), &data).unwrap();
    data
}

#[test]
fn a_normal_request_is_answered_within_a_second_under_200_idle_connections() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let data = store_with_a_file(&store);
    let server = Server::start(
        "127.0.0.1:0",
        ServeConfig::standard(&store, BUCKET, "o/r", "Models"),
    )
    .unwrap();
    // 200 connections from this address that never finish a request: half send nothing, half
    // an unfinished head.
    let mut idle = Vec::new();
    for i in 0..200 {
        let mut s = TcpStream::connect(server.addr()).unwrap();
        if i % 2 == 1 {
            s.write_all(b"GET /buckets/").unwrap();
        }
        idle.push(s);
    }
    // Five rounds at once, while the idle connections are still new (a connection gets a
    // second to send its first bytes before it counts as idle against its address: clients
    // that connect and send at once race the accept loop), and one after that second.
    for round in 0..6 {
        if round == 5 {
            std::thread::sleep(Duration::from_millis(1100));
        }
        let began = Instant::now();
        let (status, _, body) = raw_http(
            server.addr(),
            &format!(
                "GET /buckets/{BUCKET}/resolve/models/v25/pop/pop_driving_tinygrad.pkl HTTP/1.1\r\nHost: x\r\n\r\n"
            ),
        );
        let took = began.elapsed();
        assert_eq!(status, 200, "round {round}");
        assert_eq!(body, data);
        assert!(took < Duration::from_secs(1), "round {round}: {took:?}");
    }
    // Then the server closed the oldest idle connections instead of keeping them all.
    let mut closed = 0;
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut b = [0u8; 64];
        if s.read(&mut b).is_ok() {
            closed += 1;
        }
    }
    assert!(
        closed >= 200 - 16,
        "only {closed} idle connections were closed"
    );
}

#[test]
fn nothing_outside_the_store_is_listed_or_served_through_symlinks() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    store_with_a_file(&store);
    let outside = t.path().join("outside");
    fs::create_dir_all(outside.join("deep")).unwrap();
    fs::write(outside.join("secret-name.bin"), b"1234567").unwrap();
    fs::write(outside.join("deep/other.bin"), b"12").unwrap();
    // A symlinked directory and a symlinked file, both leading out.
    std::os::unix::fs::symlink(&outside, store.join("models/v25/evil")).unwrap();
    std::os::unix::fs::symlink(
        outside.join("secret-name.bin"),
        store.join("models/v25/pop/leak.bin"),
    )
    .unwrap();
    std::os::unix::fs::symlink(&outside, store.join("escape")).unwrap();
    let server = Server::start(
        "127.0.0.1:0",
        ServeConfig::standard(&store, BUCKET, "o/r", "Models"),
    )
    .unwrap();
    let get = |path: &str| {
        raw_http(
            server.addr(),
            &format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"),
        )
    };
    for prefix in [
        "models/v25/evil",
        "models/v25/evil/deep",
        "escape",
        "escape/deep",
    ] {
        let (status, _, body) = get(&format!("/api/buckets/{BUCKET}/tree/{prefix}"));
        assert_eq!(status, 404, "{prefix}: {}", String::from_utf8_lossy(&body));
    }
    for prefix in ["", "/models", "/models/v25", "/models/v25/pop"] {
        let (status, _, body) = get(&format!("/api/buckets/{BUCKET}/tree{prefix}"));
        assert_eq!(status, 200, "{prefix}");
        let text = String::from_utf8(body).unwrap();
        assert!(
            !text.contains("secret") && !text.contains("leak"),
            "{prefix}: {text}"
        );
        assert!(
            !text.contains("other.bin") && !text.contains("evil"),
            "{prefix}: {text}"
        );
        assert!(
            text.contains("pop_driving_tinygrad.pkl"),
            "{prefix}: {text}"
        );
    }
    for path in [
        "models/v25/evil/secret-name.bin",
        "models/v25/pop/leak.bin",
        "escape/deep/other.bin",
    ] {
        let (status, _, _) = get(&format!("/buckets/{BUCKET}/resolve/{path}"));
        assert_eq!(status, 404, "{path}");
    }
}
