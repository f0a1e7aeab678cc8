//! The Hugging Face bucket store against a stand-in `hf` executable plus `serve` for Hub reads;
//! `serve` itself over raw HTTP; reuse by server-side copy.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use artifact_store::hf::{HfConfig, HubHttp};
use artifact_store::location::{HfRepoStore, RepoKind};
use artifact_store::publish::{PublishOptions, publish};
use artifact_store::retry::RetryPolicy;
use artifact_store::reuse::{ReuseRequest, check_compatibility, reuse, update_manifest_entry};
use artifact_store::serve::{Mount, MountKind, ServeConfig, Server};
use artifact_store::{GithubStore, HfBucketStore, Store};
use common::*;
use manifest::Generation;
use test_support::release_stores::{GitRemote, StandinHf};

const BUCKET: &str = "StarPilot-Driving/StarPilot-Resources";

struct Hub {
    hf: StandinHf,
    server: Server,
    config: HfConfig,
}

/// A stand-in Hub: the `hf` stand-in writes under `root`, `serve` reads it back over HTTP in
/// the bucket layout (resolve + tree API) and the dataset layout.
fn hub(dir: &Path, journal: Option<&Path>) -> Hub {
    let hf = StandinHf::install(dir, journal);
    let bucket_dir = hf.bucket_dir(BUCKET);
    fs::create_dir_all(&bucket_dir).unwrap();
    let mut config = ServeConfig::standard(
        &bucket_dir,
        BUCKET,
        "firestar5683/StarPilot-Resources",
        "Models",
    );
    config.mounts.push(Mount {
        prefix: "/datasets/org/src/resolve/main/".into(),
        root: hf.dataset_dir("org/src"),
        kind: MountKind::Identity,
        tree_api_bucket: None,
    });
    let server = Server::start("127.0.0.1:0", config).unwrap();
    let config = HfConfig {
        endpoint: server.url(),
        token: Some("hf_test_token".into()),
        cli: hf.exe.clone(),
        timeout: Duration::from_secs(10),
    };
    Hub { hf, server, config }
}

fn opts() -> PublishOptions {
    PublishOptions {
        generation: Generation::new(25),
        dry_run: false,
        retry: RetryPolicy::immediate(2),
        deep_verify: false,
    }
}

#[test]
fn hf_store_basic_operations_go_through_the_cli_and_http() {
    let t = tempfile::tempdir().unwrap();
    let h = hub(t.path(), None);
    let store = HfBucketStore::new(BUCKET, h.config.clone()).unwrap();
    let a = p("models/v25/x/a.bin");
    assert_eq!(store.stat(&a).unwrap(), None);
    store.write_bytes(&a, b"streamed through stdin").unwrap();
    let local = t.path().join("local.bin");
    fs::write(&local, b"handed over by path").unwrap();
    let b = p("models/v25/x/b.bin");
    store.write_file(&b, &local).unwrap();
    assert_eq!(store.stat(&a).unwrap().unwrap().size, 22);
    let mut s = String::new();
    store.open(&b).unwrap().read_to_string(&mut s).unwrap();
    assert_eq!(s, "handed over by path");
    store.copy(&a, &p("models/v25/y/c.bin")).unwrap();
    let listed: Vec<(String, u64)> = store
        .list(&p("models/v25"))
        .unwrap()
        .into_iter()
        .map(|e| (e.path.to_string(), e.size))
        .collect();
    assert_eq!(
        listed,
        [
            ("models/v25/x/a.bin".into(), 22),
            ("models/v25/x/b.bin".into(), 19),
            ("models/v25/y/c.bin".into(), 22)
        ]
    );
    assert!(store.list(&p("models/v24")).unwrap().is_empty());
    assert!(store.delete(&a).unwrap());
    assert!(!store.delete(&a).unwrap());
    let uri = |s: &str| format!("hf://buckets/{BUCKET}/{s}");
    assert_eq!(
        h.hf.calls(),
        [
            format!("buckets cp - {}", uri("models/v25/x/a.bin")),
            format!(
                "buckets cp {} {}",
                local.display(),
                uri("models/v25/x/b.bin")
            ),
            format!(
                "buckets cp {} {}",
                uri("models/v25/x/a.bin"),
                uri("models/v25/y/c.bin")
            ),
            format!("buckets rm {}", uri("models/v25/x/a.bin")),
        ]
    );
    // The token went to the endpoint with every read.
    assert!(
        h.server
            .requests()
            .iter()
            .all(|r| r.authorization.as_deref() == Some("Bearer hf_test_token"))
    );
}

#[test]
fn a_failing_cli_is_reported_with_its_stderr() {
    let t = tempfile::tempdir().unwrap();
    let h = hub(t.path(), None);
    let store = HfBucketStore::new(BUCKET, h.config.clone()).unwrap();
    h.hf.fail_next(1);
    let e = store
        .write_bytes(&p("models/v25/x/a"), b"x")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("buckets cp - hf://buckets/") && e.contains("injected failure"),
        "{e}"
    );
    let missing = HfConfig {
        cli: t.path().join("no-such-hf"),
        ..h.config.clone()
    };
    let e = HfBucketStore::new(BUCKET, missing)
        .unwrap()
        .write_bytes(&p("a/b"), b"x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("--hf-cli") && e.contains("no-such-hf"), "{e}");
}

/// A server on another origin that a redirect points to, recording Authorization headers.
type Seen = Arc<Mutex<Vec<Option<String>>>>;

fn redirecting_pair() -> (String, Seen, Seen) {
    let cdn_seen = Arc::new(Mutex::new(Vec::new()));
    let endpoint_seen = Arc::new(Mutex::new(Vec::new()));
    let cdn = TcpListener::bind("127.0.0.1:0").unwrap();
    let cdn_addr = cdn.local_addr().unwrap();
    let ep = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep_addr = ep.local_addr().unwrap();
    let serve_one = |l: TcpListener, seen: Arc<Mutex<Vec<Option<String>>>>, reply: String| {
        std::thread::spawn(move || {
            for s in l.incoming().take(1) {
                let mut s = s.unwrap();
                let mut buf = [0u8; 4096];
                let n = s.read(&mut buf).unwrap();
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                let auth = req
                    .lines()
                    .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
                    .map(|l| l.split_once(':').unwrap().1.trim().to_string());
                seen.lock().unwrap().push(auth);
                s.write_all(reply.as_bytes()).unwrap();
            }
        });
    };
    serve_one(
        ep,
        endpoint_seen.clone(),
        format!(
            "HTTP/1.1 302 Found\r\nLocation: http://{cdn_addr}/blob\r\nX-Linked-Size: 5\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    );
    serve_one(
        cdn,
        cdn_seen.clone(),
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello".into(),
    );
    (format!("http://{ep_addr}"), endpoint_seen, cdn_seen)
}

#[test]
fn the_token_is_not_forwarded_to_another_host_on_redirect() {
    let (endpoint, endpoint_seen, cdn_seen) = redirecting_pair();
    let http = HubHttp::new(&HfConfig {
        endpoint: endpoint.clone(),
        token: Some("hf_secret".into()),
        cli: "hf".into(),
        timeout: Duration::from_secs(10),
    })
    .unwrap();
    let (mut resp, first) = http
        .send(
            reqwest::Method::GET,
            &format!("{endpoint}/buckets/a/b/resolve/x"),
        )
        .unwrap();
    let mut body = String::new();
    resp.read_to_string(&mut body).unwrap();
    assert_eq!(body, "hello");
    assert_eq!(first.get("x-linked-size").unwrap(), "5");
    assert_eq!(
        *endpoint_seen.lock().unwrap(),
        [Some("Bearer hf_secret".to_string())]
    );
    assert_eq!(*cdn_seen.lock().unwrap(), [None]);
}

#[test]
fn publish_goes_to_the_hub_first_then_github_in_order_and_resumes() {
    let t = tempfile::tempdir().unwrap();
    let journal = t.path().join("journal");
    fs::write(&journal, "").unwrap();
    let h = hub(&t.path().join("hub"), Some(&journal));
    let remote = GitRemote::new(&t.path().join("git"), "Models", Some(&journal));
    let (a, b) = (model("pop223", 21, 2500), model("wm9", 22, 800));
    let dir = artifacts_dir(t.path(), &[&a, &b]);
    let m = manifest_of(vec![
        entry("pop223", &a.data, "Pop"),
        entry("wm9", &b.data, "WM 9"),
    ]);
    let hf_store = HfBucketStore::new(BUCKET, h.config.clone()).unwrap();

    // Interrupted: the connection drops after three uploads (and retries fail too).
    h.hf.allow_only(3);
    let gh = GithubStore::open(&remote.checkout, "Models").unwrap();
    let err = publish(&m, &dir, &[&hf_store, &gh], &opts(), &mut |_| {}).unwrap_err();
    assert!(
        err.to_string()
            .contains("pop223_driving_tinygrad.pkl.sha256"),
        "{err}"
    );
    assert_eq!(
        remote.remote_subjects(),
        ["init"],
        "GitHub untouched while the Hub failed"
    );
    h.hf.heal();
    let before = h.hf.calls().len();

    let gh = GithubStore::open(&remote.checkout, "Models").unwrap();
    publish(&m, &dir, &[&hf_store, &gh], &opts(), &mut |_| {}).unwrap();
    let resumed: Vec<String> = h.hf.calls()[before..].to_vec();
    let uri = |s: &str| format!("hf://buckets/{BUCKET}/{s}");
    let dests: Vec<&str> = resumed
        .iter()
        .map(|c| c.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(
        dests,
        [
            uri("models/v25/pop223/pop223_driving_tinygrad.pkl.sha256"),
            uri("models/v25/pop223/pop223_driving_tinygrad.pkl.chunkmanifest"),
            uri("models/v25/wm9/wm9_driving_tinygrad.pkl.chunk01of01"),
            uri("models/v25/wm9/wm9_driving_tinygrad.pkl.sha256"),
            uri("models/v25/wm9/wm9_driving_tinygrad.pkl.chunkmanifest"),
            uri("manifests/model_names_v25.json"),
        ],
        "only what was missing, in order, manifest last"
    );

    // Across both stores: every Hub write before the first GitHub commit, manifest last in each.
    let lines: Vec<String> = fs::read_to_string(&journal)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let first_git = lines.iter().position(|l| l.starts_with("git ")).unwrap();
    assert!(lines[..first_git].iter().all(|l| l.starts_with("hf ")));
    assert!(lines[first_git..].iter().all(|l| l.starts_with("git ")));
    assert!(lines[first_git - 1].ends_with("manifests/model_names_v25.json"));
    assert_eq!(lines.last().unwrap(), "git Publish model_names_v25.json");
    // The Hub (as devices read it, over HTTP) and GitHub hold the same bytes.
    assert_eq!(read_artifact(&hf_store, "pop223"), a.data);
    assert_eq!(read_artifact(&gh, "wm9"), b.data);
}

fn get(server: &Server, path: &str, extra: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    raw_http(
        server.addr(),
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n"),
    )
}

#[test]
fn serve_speaks_both_layouts_with_ranges_etags_and_no_way_out() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let data = bytes(31, 3000);
    fs::create_dir_all(store.join("models/v25/pop")).unwrap();
    fs::create_dir_all(store.join("manifests")).unwrap();
    fs::write(
        store.join("models/v25/pop/pop_driving_tinygrad.pkl.chunk01of01"),
        &data,
    )
    .unwrap();
    fs::write(
        store.join("manifests/model_names_v25.json"),
        b"{\"models\": []}\n",
    )
    .unwrap();
    fs::write(store.join("models/v25/pop/.tmp-1-x"), b"half").unwrap();
    fs::write(t.path().join("secret"), b"outside").unwrap();
    std::os::unix::fs::symlink(t.path().join("secret"), store.join("models/v25/pop/link")).unwrap();
    let server = Server::start(
        "127.0.0.1:0",
        ServeConfig::standard(&store, BUCKET, "firestar5683/StarPilot-Resources", "Models"),
    )
    .unwrap();
    let hf_chunk =
        format!("/buckets/{BUCKET}/resolve/models/v25/pop/pop_driving_tinygrad.pkl.chunk01of01");
    let gh_chunk =
        "/firestar5683/StarPilot-Resources/Models/v25/pop/pop_driving_tinygrad.pkl.chunk01of01";

    let (s, h, body) = get(&server, &hf_chunk, "");
    assert_eq!(s, 200);
    assert_eq!(body, data);
    assert_eq!(header(&h, "content-length"), Some("3000"));
    assert_eq!(header(&h, "accept-ranges"), Some("bytes"));
    let etag = header(&h, "etag").unwrap().to_string();
    assert!(etag.starts_with('"') && !etag.starts_with("W/"), "{etag}");

    let (s, h2, body) = get(&server, gh_chunk, "");
    assert_eq!((s, body.len()), (200, 3000));
    assert_eq!(header(&h2, "etag"), Some(etag.as_str()));
    let (s, _, body) = get(
        &server,
        "/firestar5683/StarPilot-Resources/Models/model_names_v25.json",
        "",
    );
    assert_eq!((s, body.as_slice()), (200, &b"{\"models\": []}\n"[..]));

    let (s, h, body) = get(&server, &hf_chunk, "Range: bytes=1000-1999\r\n");
    assert_eq!(s, 206);
    assert_eq!(body, &data[1000..2000]);
    assert_eq!(header(&h, "content-range"), Some("bytes 1000-1999/3000"));
    let (s, _, body) = get(&server, &hf_chunk, "Range: bytes=-10\r\n");
    assert_eq!((s, body.as_slice()), (206, &data[2990..]));
    let (s, h, _) = get(&server, &hf_chunk, "Range: bytes=3000-\r\n");
    assert_eq!(s, 416);
    assert_eq!(header(&h, "content-range"), Some("bytes */3000"));
    let (s, _, body) = get(
        &server,
        &hf_chunk,
        &format!("Range: bytes=0-9\r\nIf-Range: {etag}\r\n"),
    );
    assert_eq!((s, body.len()), (206, 10));
    let (s, _, body) = get(
        &server,
        &hf_chunk,
        "Range: bytes=0-9\r\nIf-Range: \"stale\"\r\n",
    );
    assert_eq!((s, body.len()), (200, 3000));
    let (s, _, _) = get(&server, &hf_chunk, &format!("If-None-Match: {etag}\r\n"));
    assert_eq!(s, 304);

    let (s, h, body) = raw_http(
        server.addr(),
        &format!("HEAD {hf_chunk} HTTP/1.1\r\nHost: x\r\n\r\n"),
    );
    assert_eq!(
        (s, header(&h, "content-length"), body.len()),
        (200, Some("3000"), 0)
    );

    for bad in [
        format!("/buckets/{BUCKET}/resolve/../../secret"),
        format!("/buckets/{BUCKET}/resolve/models/%2e%2e/%2e%2e/%2e%2e/secret"),
        format!("/buckets/{BUCKET}/resolve/models/v25/pop/link"),
        format!("/buckets/{BUCKET}/resolve/models/v25/pop/.tmp-1-x"),
        format!("/buckets/{BUCKET}/resolve/models/v25/pop"),
        format!("/buckets/{BUCKET}/resolve/models/v25/pop/missing"),
        "/firestar5683/StarPilot-Resources/Models/manifests/model_names_v25.json".to_string(),
        "/firestar5683/StarPilot-Resources/Models/README.md".to_string(),
        "/other/repo/Models/model_names_v25.json".to_string(),
        "/etc/passwd".to_string(),
    ] {
        let (s, _, body) = get(&server, &bad, "");
        assert_eq!(s, 404, "{bad}");
        assert!(!body.windows(7).any(|w| w == b"outside"), "{bad}");
    }
    let (s, _, _) = raw_http(
        server.addr(),
        &format!("DELETE {hf_chunk} HTTP/1.1\r\nHost: x\r\n\r\n"),
    );
    assert_eq!(s, 405);
    let (s, _, _) = raw_http(server.addr(), "garbage\r\n\r\n");
    assert_eq!(s, 400);
}

fn catalog_with_source(source: &Model, src_commit: &str) -> manifest::Manifest {
    let mut e = entry("supercombo-pop", &source.data, "Source Pop");
    e["source_commit"] = src_commit.into();
    manifest_of(vec![e])
}

const SRC: &str = "1111111111111111111111111111111111111111";

#[test]
fn reuse_hub_to_hub_copies_server_side_renamed_chunk_manifest_last() {
    let t = tempfile::tempdir().unwrap();
    let h = hub(t.path(), None);
    let source = Model {
        id: "supercombo-pop",
        data: bytes(41, 2500),
    };
    // The source dataset holds the chunk set under its own name.
    let src_dir = h.hf.dataset_dir("org/src").join("builds");
    fs::create_dir_all(&src_dir).unwrap();
    chunker::split_reader(
        &source.data[..],
        2500,
        "supercombo_tinygrad.pkl",
        &src_dir,
        &chunker::SplitOptions { chunk_size: CHUNK },
    )
    .unwrap();
    let catalog = catalog_with_source(&source, SRC);
    let compatible = check_compatibility(
        &catalog,
        &"supercombo-pop".parse().unwrap(),
        &SRC.parse().unwrap(),
        &TG.parse().unwrap(),
    )
    .unwrap();
    let src_store = HfRepoStore::new(RepoKind::Datasets, "org/src", None, &h.config).unwrap();
    let dest = HfBucketStore::new(BUCKET, h.config.clone()).unwrap();
    let mut progress = Vec::new();
    let report = reuse(
        &ReuseRequest {
            model: "pop223".parse().unwrap(),
            generation: Generation::new(25),
            source: &src_store,
            source_path: p("builds/supercombo_tinygrad.pkl"),
            compatible: compatible.clone(),
            dest: &dest,
        },
        &mut |i, n, _| progress.push((i, n)),
    )
    .unwrap();
    assert!(report.server_side);
    assert_eq!(report.chunk_count, 3);
    assert_eq!(report.sha256, chunker::Sha256Digest::of_bytes(&source.data));
    assert_eq!(progress, [(1, 3), (2, 3), (3, 3)]);
    let dst =
        |f: &str| format!("hf://buckets/{BUCKET}/models/v25/pop223/pop223_driving_tinygrad.pkl{f}");
    let src = |f: &str| format!("hf://datasets/org/src/builds/supercombo_tinygrad.pkl{f}");
    let calls = h.hf.calls();
    assert_eq!(
        calls,
        [
            format!("buckets cp {} {}", src(".chunk01of03"), dst(".chunk01of03")),
            format!("buckets cp {} {}", src(".chunk02of03"), dst(".chunk02of03")),
            format!("buckets cp {} {}", src(".chunk03of03"), dst(".chunk03of03")),
            format!("buckets cp - {}", dst(".sha256")),
            format!("buckets cp - {}", dst(".chunkmanifest")),
        ]
    );
    // No artifact bytes through this machine: no chunk was ever fetched with GET, and every
    // chunk copy named two Hub addresses.
    for r in h.server.requests() {
        assert!(
            !(r.method == "GET" && r.target.contains(".chunk0")),
            "{r:?}"
        );
    }
    assert_eq!(read_artifact(&dest, "pop223"), source.data);

    // And the manifest entry takes the source's digest and count.
    let mut m = manifest_of(vec![entry("pop223", b"old bytes", "Pop")]);
    update_manifest_entry(
        &mut m,
        &"pop223".parse().unwrap(),
        &compatible,
        &SRC.parse().unwrap(),
    )
    .unwrap();
    let e = m.get(&"pop223".parse().unwrap()).unwrap();
    assert_eq!(e.artifact_sha256(), Some(report.sha256));
    assert_eq!(e.artifact_chunk_count().unwrap().get(), 3);
    assert_eq!(e.source_commit().unwrap().as_str(), SRC);
    assert!(
        update_manifest_entry(
            &mut m,
            &"absent".parse().unwrap(),
            &compatible,
            &SRC.parse().unwrap()
        )
        .is_err()
    );
}

#[test]
fn reuse_refuses_a_different_commit_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let h = hub(t.path(), None);
    let source = Model {
        id: "supercombo-pop",
        data: bytes(42, 1500),
    };
    let catalog = catalog_with_source(&source, SRC);
    let other = "2222222222222222222222222222222222222222";
    let e = check_compatibility(
        &catalog,
        &"supercombo-pop".parse().unwrap(),
        &other.parse().unwrap(),
        &TG.parse().unwrap(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("source-model commit differs") && e.contains(SRC) && e.contains(other),
        "{e}"
    );
    assert!(h.hf.calls().is_empty());
    assert!(h.server.requests().is_empty());
}
