//! The origin policy against a fault-injecting Hugging Face (docs/device.md, *Origin policy*):
//! an origin that trickles, stays silent after accepting, or sends slower than the minimum rate
//! is given up after the first artifact it failed, and every later artifact comes from GitHub
//! without one more request to it; an origin alive but far slower than the other is left for it.
//! Asserted by which origin served the bytes (the server's per-path byte counts), never by time.
//! Each case runs for v25 and for a made-up next generation (v26).

use std::fs;
use std::time::Duration;

use downloader::policy::{GiveUp, Standing};
use downloader::{
    CancelToken, DownloadConfig, Downloader, HttpConfig, Installed, OriginKind, Origins,
};
use manifest::{Generation, Manifest};
use test_support::http_server::{Fault, FaultServer};
use test_support::published::{
    GH_DIR, HF_DIR, artifact_bytes, manifest_json, publish_model, write_manifest,
};

/// Short limits: a silent or trickling origin is given up within about a second.
fn config() -> DownloadConfig {
    DownloadConfig {
        connections: 2,
        ranges_per_chunk: 1,
        max_attempts: 4,
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(20),
        space_margin: 0,
        http: HttpConfig {
            read_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_millis(800),
            min_rate: 4096,
            rate_window: Duration::from_millis(500),
            ..HttpConfig::default()
        },
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    models: std::path::PathBuf,
    server: FaultServer,
    manifest: Manifest,
    generation: Generation,
    data: Vec<Vec<u8>>,
}

/// Three models published on both origins (chunked, 64 KiB chunks) under `generation`.
fn setup(generation: &str, len: usize) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("origin");
    let models = dir.path().join("models");
    fs::create_dir_all(&models).unwrap();
    let mut published = Vec::new();
    let mut data = Vec::new();
    for (i, id) in ["pop223", "rdf43", "mdl9"].iter().enumerate() {
        let bytes = artifact_bytes(40 + i as u64, len);
        published.push(publish_model(
            &root,
            generation,
            id,
            &bytes,
            Some(64 * 1024),
        ));
        data.push(bytes);
    }
    let json = manifest_json(generation, &published, true);
    write_manifest(&root, generation, json.as_bytes());
    Setup {
        server: FaultServer::start(&root).unwrap(),
        _dir: dir,
        models,
        manifest: Manifest::from_slice(json.as_bytes()).unwrap(),
        generation: generation.parse().unwrap(),
        data,
    }
}

impl Setup {
    fn downloader(&self, config: DownloadConfig) -> Downloader {
        let url = self.server.url();
        Downloader::new(
            Origins::new(&format!("{url}/{HF_DIR}"), &format!("{url}/{GH_DIR}")),
            config,
        )
    }

    fn download(&self, d: &Downloader, id: &str) -> Installed {
        d.download(
            self.generation,
            self.manifest.get(&id.parse().unwrap()).unwrap(),
            &self.models,
            &CancelToken::new(),
            &|_| {},
        )
        .unwrap_or_else(|e| panic!("{id}: {e}"))
    }

    fn hf_requests(&self) -> usize {
        let prefix = format!("/{HF_DIR}/");
        self.server
            .requests()
            .iter()
            .filter(|r| r.path.starts_with(&prefix))
            .count()
    }

    fn hf_payload(&self) -> u64 {
        self.server.body_bytes_under(&format!("/{HF_DIR}/models/"))
    }

    fn gh_payload(&self) -> u64 {
        self.server.body_bytes_under(&format!("/{GH_DIR}/"))
    }
}

/// Trickling 1 byte per interval, silent after accepting the request, a body below the minimum
/// rate: each gives Hugging Face up at the first artifact, with its reason; GitHub serves that
/// artifact and every later one, and Hugging Face is not asked again.
#[test]
fn a_slow_or_silent_origin_is_given_up_after_the_first_artifact() {
    let cases = [
        (
            "trickle",
            Fault::Trickle(Duration::from_millis(200)),
            GiveUp::Silent,
        ),
        ("silent", Fault::Stall, GiveUp::Silent),
        ("below the minimum rate", Fault::Slow(1024), GiveUp::MinRate),
    ];
    for generation in ["v25", "v26"] {
        for (what, fault, why) in &cases {
            let s = setup(generation, 200 * 1024);
            // The manifest comes from Hugging Face; its artifacts misbehave.
            s.server
                .add_fault(&format!("/{HF_DIR}/models/*"), fault.clone(), None);
            let d = s.downloader(config());
            let fetched = d.fetch_manifest(s.generation).unwrap();
            assert!(fetched.origin.starts_with("Hugging Face"), "{what}");

            let first = s.download(&d, "pop223");
            assert!(
                first.origin.starts_with("GitHub"),
                "{what}: {}",
                first.origin
            );
            assert_eq!(fs::read(&first.path).unwrap(), s.data[0], "{what}");
            assert_eq!(
                d.seen(OriginKind::HuggingFace).given_up.map(|(_, w)| w),
                Some(*why),
                "{what} {generation}"
            );
            let order = d.origin_order();
            assert_eq!(order[0].0.kind, OriginKind::GitHub, "{what}");
            assert_eq!(order[1].1, Standing::GivenUp(*why), "{what}");

            let hf_after_first = s.hf_requests();
            for (i, id) in ["rdf43", "mdl9"].iter().enumerate() {
                let later = s.download(&d, id);
                assert!(later.origin.starts_with("GitHub"), "{what}: {id}");
                assert_eq!(fs::read(&later.path).unwrap(), s.data[i + 1], "{what}");
            }
            assert_eq!(
                s.hf_requests(),
                hf_after_first,
                "{what} {generation}: Hugging Face was asked again after it was given up"
            );
            // Every artifact's bytes came from GitHub (a trickled or slow response may have
            // sent a few bytes from Hugging Face before it was given up).
            let total: u64 = s.data.iter().map(|d| d.len() as u64).sum();
            assert!(s.hf_payload() < 64 * 1024, "{what}: {}", s.hf_payload());
            assert!(
                s.gh_payload() + s.hf_payload() >= total,
                "{what}: {} + {} < {total}",
                s.gh_payload(),
                s.hf_payload()
            );
            // The manifest of a later run of the same downloader is asked of GitHub first too.
            let again = d.fetch_manifest(s.generation).unwrap();
            assert!(again.origin.starts_with("GitHub"), "{what}");
        }
    }
}

/// Hugging Face alive (20 KiB/s per connection, above the minimum rate) but 100x slower than
/// GitHub: the first download
/// leaves it to measure GitHub (keeping the bytes it fetched), and every later artifact goes to
/// GitHub first; most bytes come from GitHub.
#[test]
fn an_origin_far_slower_than_the_other_is_left_for_it() {
    for generation in ["v25", "v26"] {
        let s = setup(generation, 1 << 20);
        s.server
            .add_fault(&format!("/{HF_DIR}/models/*"), Fault::Slow(20 * 1024), None);
        s.server
            .add_fault(&format!("/{GH_DIR}/*"), Fault::Slow(2 * 1024 * 1024), None);
        let mut c = config();
        c.http.min_rate = 1024;
        let d = s.downloader(c);
        let first = s.download(&d, "pop223");
        assert_eq!(fs::read(&first.path).unwrap(), s.data[0]);
        assert!(first.origin.starts_with("GitHub"), "{}", first.origin);
        let hf_after_first = s.hf_payload();
        assert!(hf_after_first > 0, "Hugging Face was tried first");
        let order = d.origin_order();
        assert_eq!(order[0].0.kind, OriginKind::GitHub, "{order:?}");
        assert!(
            matches!(order[1].1, Standing::FarSlower { .. }),
            "{order:?}"
        );
        for (i, id) in ["rdf43", "mdl9"].iter().enumerate() {
            let later = s.download(&d, id);
            assert!(later.origin.starts_with("GitHub"), "{id}");
            assert_eq!(fs::read(&later.path).unwrap(), s.data[i + 1]);
        }
        assert_eq!(s.hf_payload(), hf_after_first, "later artifacts skipped HF");
        assert!(
            s.gh_payload() > 5 * s.hf_payload(),
            "GitHub {} bytes, Hugging Face {}",
            s.gh_payload(),
            s.hf_payload()
        );
    }
}

/// A fast Hugging Face keeps its place: nothing is given up or left, GitHub is never asked.
#[test]
fn a_healthy_origin_keeps_its_place() {
    for generation in ["v25", "v26"] {
        let s = setup(generation, 200 * 1024);
        let d = s.downloader(config());
        for id in ["pop223", "rdf43", "mdl9"] {
            assert!(s.download(&d, id).origin.starts_with("Hugging Face"));
        }
        assert_eq!(s.gh_payload(), 0);
        assert!(
            d.origin_order()
                .iter()
                .all(|(_, st)| *st == Standing::Preferred)
        );
    }
}

/// An origin no connection can be made to: refused (nothing listens on its port), or a connect
/// that times out (a listener whose accept queue is full drops the handshake).
enum Unreachable {
    Refused,
    /// The listener, and the one connection that fills its queue (held open).
    ConnectTimesOut(
        std::net::TcpListener,
        #[allow(dead_code)] std::net::TcpStream,
    ),
}

impl Unreachable {
    fn base(&self) -> String {
        match self {
            Unreachable::Refused => {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let port = l.local_addr().unwrap().port();
                drop(l);
                format!("http://127.0.0.1:{port}/{HF_DIR}")
            }
            Unreachable::ConnectTimesOut(l, _) => {
                format!("http://{}/{HF_DIR}", l.local_addr().unwrap())
            }
        }
    }

    fn connect_times_out() -> Unreachable {
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // SAFETY: our own listening socket; listen(2) again only sets its backlog.
        assert_eq!(unsafe { libc::listen(l.as_raw_fd(), 0) }, 0);
        // One connection fills the queue; later handshakes go unanswered.
        let held = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        Unreachable::ConnectTimesOut(l, held)
    }
}

/// A connection refused, or a connect timing out, once is a network hiccup as much as a dead
/// origin: Hugging Face keeps its place after one and after two; only the third attempt in a row
/// that cannot connect gives it up (docs/device.md, *Origin policy*). Every artifact still comes
/// from GitHub meanwhile, and no attempt waits longer than the connect timeout.
#[test]
fn an_origin_is_given_up_only_after_three_connect_failures_in_a_row() {
    for generation in ["v25", "v26"] {
        for what in ["refused", "connect times out"] {
            let s = setup(generation, 100 * 1024);
            let hf = match what {
                "refused" => Unreachable::Refused,
                _ => Unreachable::connect_times_out(),
            };
            let mut c = config();
            c.http.connect_timeout = Duration::from_millis(300);
            let d = Downloader::new(
                Origins::new(&hf.base(), &format!("{}/{GH_DIR}", s.server.url())),
                c,
            );
            let standing = |d: &Downloader| {
                let order = d.origin_order();
                (order[0].0.kind, order[0].1, d.seen(OriginKind::HuggingFace))
            };
            // 1: the manifest, from GitHub; Hugging Face still first.
            let started = std::time::Instant::now();
            let fetched = d.fetch_manifest(s.generation).unwrap();
            assert!(fetched.origin.starts_with("GitHub"), "{what}");
            let (first, st, seen) = standing(&d);
            assert_eq!(
                (first, st, seen.given_up, seen.no_connection),
                (OriginKind::HuggingFace, Standing::Preferred, None, 1),
                "{generation} {what}"
            );
            // 2: an artifact; still first.
            let one = s.download(&d, "pop223");
            assert!(one.origin.starts_with("GitHub"), "{what}");
            assert_eq!(fs::read(&one.path).unwrap(), s.data[0]);
            let (first, _, seen) = standing(&d);
            assert_eq!(
                (first, seen.given_up, seen.no_connection),
                (OriginKind::HuggingFace, None, 2),
                "{generation} {what}"
            );
            // 3: the third in a row gives it up.
            let two = s.download(&d, "rdf43");
            assert_eq!(fs::read(&two.path).unwrap(), s.data[1]);
            let (first, st, seen) = standing(&d);
            assert_eq!(first, OriginKind::GitHub, "{generation} {what}");
            assert_eq!(
                seen.given_up.map(|(_, w)| w),
                Some(GiveUp::NoConnection),
                "{generation} {what}"
            );
            assert_eq!(st, Standing::Preferred);
            assert_eq!(
                d.origin_order()[1].1,
                Standing::GivenUp(GiveUp::NoConnection)
            );
            // Three attempts, each failing over within about the connect timeout (a refused
            // connect is retried, a timed-out one is not).
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{what}: {:?}",
                started.elapsed()
            );
            let three = s.download(&d, "mdl9");
            assert!(three.origin.starts_with("GitHub"));
            assert_eq!(fs::read(&three.path).unwrap(), s.data[2]);
        }
    }
}
