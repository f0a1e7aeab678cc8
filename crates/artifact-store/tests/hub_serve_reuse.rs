//! The Hugging Face bucket store against the real `hf` CLI (huggingface_hub 2.4.0, hf-xet 1.8.0)
//! driving the Hub emulator of `test_support::hub`, which our own HTTP reads use too; `serve`
//! over raw HTTP; reuse by server-side copy. The tests that need the CLI skip locally without it
//! (with a message) and fail in CI (`STARPILOT_REQUIRE_HF=1`). A shell stand-in remains only
//! where a test needs a CLI that misbehaves in a way the real one cannot be made to.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use artifact_store::hf::{HfConfig, HubHttp, MAX_STALLED_PAGES, classify_cli_failure};
use artifact_store::location::{HfRepoStore, RepoKind};
use artifact_store::publish::{PublishOptions, publish};
use artifact_store::retry::RetryPolicy;
use artifact_store::reuse::{
    Compatible, ReuseReport, ReuseRequest, check_compatibility, reuse, update_manifest_entry,
};
use artifact_store::serve::{ServeConfig, Server};
use artifact_store::{Error, GithubStore, HfBucketStore, HfFailure, Store};
use manifest::Generation;
use test_support::hub::{HubConfig, HubEmulator, HubOp, LinkFault, Listener, real_hf_cli};
use test_support::release_stores::GitRemote;

const BUCKET: &str = "StarPilot-Driving/StarPilot-Resources";

struct Hub {
    emu: HubEmulator,
    config: HfConfig,
}

/// The emulator with the release bucket created, and a config that runs `cli` against it.
fn hub_with(cli: PathBuf, page_size: usize) -> Hub {
    let emu = HubEmulator::start(HubConfig {
        page_size,
        ..HubConfig::default()
    })
    .unwrap();
    emu.create_bucket(BUCKET);
    let config = HfConfig {
        endpoint: emu.url(),
        token: Some(emu.token().to_string()),
        cli,
        timeout: Duration::from_secs(20),
    };
    Hub { emu, config }
}

/// For tests that never run the CLI: a path that does not exist, so a call would fail loudly.
fn hub_without_cli() -> Hub {
    hub_with(PathBuf::from("/nonexistent/hf-must-not-run"), 2)
}

/// Runs the real `hf` CLI against the emulator, with its own `HF_HOME`, no update check and no
/// telemetry.
fn hf(cli: &Path, h: &Hub, home: &Path, args: &[&str]) -> std::process::Output {
    Command::new(cli)
        .args(args)
        .env("HF_ENDPOINT", h.emu.url())
        .env("HF_TOKEN", h.emu.token())
        .env("HF_HOME", home)
        .env("HF_HUB_DISABLE_UPDATE_CHECK", "1")
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn uri(path: &str) -> String {
    format!("hf://buckets/{BUCKET}/{path}")
}

fn add(path: &str) -> HubOp {
    HubOp::Add {
        bucket: BUCKET.into(),
        path: path.into(),
    }
}

fn delete(path: &str) -> HubOp {
    HubOp::Delete {
        bucket: BUCKET.into(),
        path: path.into(),
    }
}

fn opts() -> PublishOptions {
    PublishOptions {
        generation: Generation::new(25),
        dry_run: false,
        retry: RetryPolicy::immediate(2),
        deep_verify: false,
        contract: Default::default(),
    }
}

#[test]
fn hf_store_operations_through_the_real_cli_and_http() {
    let Some(cli) = real_hf_cli() else { return };
    let t = tempfile::tempdir().unwrap();
    let h = hub_with(cli.clone(), 2);
    let store = HfBucketStore::new(BUCKET, h.config.clone()).unwrap();
    let a = p("models/v25/x/a.bin");
    assert_eq!(store.stat(&a).unwrap(), None);
    store.write_bytes(&a, b"streamed through stdin").unwrap();
    // Text, then floats: hf-xet 1.8 LZ4-compresses such chunks (it chose plain LZ4, not byte
    // grouping, for these), so the emulator's LZ4 decoding is exercised by real uploads.
    let mut big: Vec<u8> = (0..6000)
        .flat_map(|i| format!("line {i}: handed over by path\n").into_bytes())
        .collect();
    // Floats in [1, 2) with noisy mantissas.
    let mut x: u32 = 12345;
    big.extend((0..60_000).flat_map(|_| {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (1.0f32 + (x >> 9) as f32 / (1u32 << 23) as f32).to_le_bytes()
    }));
    let local = t.path().join("local.bin");
    fs::write(&local, &big).unwrap();
    let b = p("models/v25/x/b.bin");
    store.write_file(&b, &local).unwrap();
    assert_eq!(store.stat(&a).unwrap().unwrap().size, 22);
    let mut back = Vec::new();
    store.open(&b).unwrap().read_to_end(&mut back).unwrap();
    assert!(back == big, "b.bin read back differs");
    let schemes = h.emu.chunk_schemes();
    eprintln!("chunk compression schemes seen: {schemes:?}");
    assert!(schemes.get(&1).is_some_and(|&n| n > 0), "{schemes:?}");
    // The CLI reads it back too (reconstruction API, ranged xorb reads from the content host).
    let out = hf(
        &cli,
        &h,
        &t.path().join("hf-home-read"),
        &[
            "buckets",
            "cp",
            &uri("models/v25/x/b.bin"),
            "-",
            "--format",
            "quiet",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout == big, "the CLI read back other bytes");
    store.copy(&a, &p("models/v25/y/c.bin")).unwrap();
    // Three files, two per page: the listing follows the Link header.
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
            ("models/v25/x/b.bin".into(), big.len() as u64),
            ("models/v25/y/c.bin".into(), 22)
        ]
    );
    assert!(
        h.emu
            .requests()
            .iter()
            .any(|r| r.target.contains("cursor=")),
        "the listing took a second page"
    );
    assert!(store.list(&p("models/v24")).unwrap().is_empty());

    // The bug this suite was built for: the real CLI asks before removing. Without a terminal
    // and without --yes it aborts, exit 1, and the file stays.
    let out = hf(
        &cli,
        &h,
        &t.path().join("hf-home"),
        &["buckets", "rm", &uri("models/v25/x/a.bin")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stdout.contains("[y/N]") && stderr.contains("Aborted!"),
        "{stdout}{stderr}"
    );
    assert_eq!(
        classify_cli_failure(&stderr),
        HfFailure::ConfirmationRequired
    );
    assert!(store.stat(&a).unwrap().is_some(), "nothing was removed");
    // Our delete passes --yes.
    assert!(store.delete(&a).unwrap());
    assert!(store.stat(&a).unwrap().is_none());
    assert!(
        !store.delete(&a).unwrap(),
        "a missing file needs no CLI call"
    );

    assert_eq!(
        h.emu.ops(),
        [
            add("models/v25/x/a.bin"),
            add("models/v25/x/b.bin"),
            HubOp::Copy {
                bucket: BUCKET.into(),
                path: "models/v25/y/c.bin".into(),
                source: format!("bucket:{BUCKET}"),
            },
            delete("models/v25/x/a.bin"),
        ]
    );
    // The token went with every Hub API call, never to the content host.
    let log = h.emu.requests();
    assert!(log.iter().any(|r| r.listener == Listener::Content));
    for r in &log {
        match r.listener {
            Listener::Content => assert_eq!(r.authorization, None, "{r:?}"),
            Listener::Hub
                if r.target.starts_with("/buckets/") || r.target.starts_with("/api/buckets/") =>
            {
                assert_eq!(
                    r.authorization.as_deref(),
                    Some(format!("Bearer {}", h.emu.token()).as_str()),
                    "{r:?}"
                )
            }
            Listener::Hub => {}
        }
    }
}

#[test]
fn real_cli_failures_become_typed_errors() {
    let Some(cli) = real_hf_cli() else { return };
    let t = tempfile::tempdir().unwrap();
    let h = hub_with(cli.clone(), 2);
    let kind = |e: Error| match e {
        Error::HfCli { kind, .. } => kind,
        other => panic!("not a CLI failure: {other}"),
    };
    // A bucket nobody created.
    let missing = HfBucketStore::new("StarPilot-Driving/no-such-bucket", h.config.clone()).unwrap();
    let e = missing.write_bytes(&p("a/b"), b"x").unwrap_err();
    let msg = e.to_string();
    let next = cli_support::NextStep::next_step(&e).unwrap_or_default();
    assert!(next.contains("hf buckets create"), "{msg}\nnext: {next}");
    assert!(!msg.contains("Traceback"), "{msg}");
    assert_eq!(kind(e), HfFailure::BucketMissing);
    // The next step the message names works: the real CLI creates the bucket.
    let out = hf(
        &cli,
        &h,
        &t.path().join("hf-home"),
        &[
            "buckets",
            "create",
            "StarPilot-Driving/no-such-bucket",
            "--exist-ok",
            "--format",
            "json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(h.emu.has_bucket("StarPilot-Driving/no-such-bucket"));
    // A token the Hub refuses: not retried (it cannot get better), and not printed.
    let wrong = HfConfig {
        token: Some("hf_refusedRefusedRefusedRefused00".into()),
        ..h.config.clone()
    };
    let store = HfBucketStore::new(BUCKET, wrong).unwrap();
    let before = h.emu.requests().len();
    let e = RetryPolicy::immediate(3)
        .run(
            "hf",
            "a/b",
            |_, _, _| {},
            || store.write_bytes(&p("a/b"), b"x"),
        )
        .unwrap_err();
    let msg = e.to_string();
    assert!(!msg.contains("hf_refused"), "{msg}");
    assert_eq!(kind(e), HfFailure::AuthRefused);
    let token_calls = h.emu.requests()[before..]
        .iter()
        .filter(|r| r.target.ends_with("/xet-write-token"))
        .count();
    assert_eq!(token_calls, 1, "tried once");
    assert_eq!(
        h.emu.ops(),
        [HubOp::CreateBucket {
            bucket: "StarPilot-Driving/no-such-bucket".into()
        }],
        "the refused token wrote nothing"
    );
    // No CLI at all.
    let e = HfBucketStore::new(
        BUCKET,
        HfConfig {
            cli: t.path().join("no-such-hf"),
            ..h.config.clone()
        },
    )
    .unwrap()
    .write_bytes(&p("a/b"), b"x")
    .unwrap_err()
    .to_string();
    assert!(e.contains("--hf-cli") && e.contains("no-such-hf"), "{e}");
}

/// A CLI that fails by echoing the token (as a debug log or a traceback of request headers
/// would): the real one cannot be made to do this on demand, so a script stands in.
#[test]
fn a_cli_that_echoes_the_token_never_gets_it_printed() {
    let t = tempfile::tempdir().unwrap();
    let exe = t.path().join("hf");
    fs::write(
        &exe,
        "#!/bin/sh\necho \"debug: token=$HF_TOKEN headers={'authorization': 'Bearer $HF_TOKEN'}\" >&2\necho \"Authorization: Bearer $HF_TOKEN\" >&2\nexit 1\n",
    )
    .unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    let h = hub_with(exe, 2);
    let secret = h.emu.token().to_string();
    let store = HfBucketStore::new(BUCKET, h.config.clone()).unwrap();
    let mut events = Vec::new();
    let e = RetryPolicy::immediate(2)
        .run(
            "hf",
            "a/b",
            |_, e, _| events.push(e.to_string()),
            || store.write_bytes(&p("a/b"), b"x"),
        )
        .unwrap_err();
    let all = format!("{e}\n{e:?}\n{}", events.join("\n"));
    assert!(!all.contains(&secret), "{all}");
    assert!(all.contains("<redacted>"), "{all}");
    assert_eq!(events.len(), 1, "the retry was reported");
}

#[test]
fn tree_pagination_stops_on_loops_foreign_links_and_endless_listings() {
    let h = hub_without_cli();
    for i in 0..5 {
        h.emu
            .seed_bucket_file(BUCKET, &format!("models/v25/m/f{i}"), b"data");
    }
    let store = HfBucketStore::new(BUCKET, h.config.clone()).unwrap();
    assert_eq!(store.list(&p("models/v25")).unwrap().len(), 5);

    h.emu.set_link_fault(Some(LinkFault::SelfLoop));
    let e = store.list(&p("models/v25")).unwrap_err().to_string();
    assert!(e.contains("repeats a page"), "{e}");

    let (foreign, seen, _) = redirecting_pair();
    h.emu.set_link_fault(Some(LinkFault::Foreign(format!(
        "{foreign}/api/buckets/{BUCKET}/tree/models"
    ))));
    let e = store.list(&p("models/v25")).unwrap_err().to_string();
    assert!(e.contains("leads away"), "{e}");
    assert!(
        seen.lock().unwrap().is_empty(),
        "the foreign link was not fetched"
    );

    // A fresh cursor on every page over the same entries: stopped once three pages in a row
    // listed nothing new, not at the page cap. Each page that advances lists at least one of the
    // five files, so at most five pages advance (the emulator's pages overlap by a cursor step).
    h.emu.set_link_fault(Some(LinkFault::Endless));
    let before = h.emu.requests().len();
    let e = store.list(&p("models/v25")).unwrap_err().to_string();
    assert!(e.contains("does not advance"), "{e}");
    let fetched = h.emu.requests().len() - before;
    assert!(
        fetched > MAX_STALLED_PAGES && fetched <= 5 + MAX_STALLED_PAGES,
        "{fetched} pages"
    );
    assert!(!e.contains(h.emu.token()));
    // The page cap still holds where it comes first.
    let before = h.emu.requests().len();
    let e = HfBucketStore::new(BUCKET, h.config.clone())
        .unwrap()
        .with_max_listing_pages(2)
        .list(&p("models/v25"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("past 2 pages"), "{e}");
    assert_eq!(h.emu.requests().len() - before, 2);
    assert!(!e.contains(h.emu.token()));
    // And the time bound: a listing still linking on when it is reached is stopped there.
    let before = h.emu.requests().len();
    let e = HfBucketStore::new(BUCKET, h.config.clone())
        .unwrap()
        .with_max_listing_time(std::time::Duration::ZERO)
        .list(&p("models/v25"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("still links to another page after"), "{e}");
    assert_eq!(h.emu.requests().len() - before, 1);
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
    let Some(cli) = real_hf_cli() else { return };
    let t = tempfile::tempdir().unwrap();
    let journal = t.path().join("journal");
    fs::write(&journal, "").unwrap();
    let h = hub_with(cli, 2);
    h.emu.set_journal(Some(journal.clone()));
    let remote = GitRemote::new(&t.path().join("git"), "Models", Some(&journal));
    let (a, b) = (model("pop223", 21, 2500), model("wm9", 22, 800));
    let dir = artifacts_dir(t.path(), &[&a, &b]);
    let m = manifest_of(vec![
        entry("pop223", &a.data, "Pop"),
        entry("wm9", &b.data, "WM 9"),
    ]);
    let hf_store = HfBucketStore::new(BUCKET, h.config.clone()).unwrap();

    // Interrupted: the Hub fails every batch after three (and the retry fails too).
    h.emu.allow_batches(3);
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
    let dir_of = |id: &str, f: &str| format!("models/v25/{id}/{id}_driving_tinygrad.pkl{f}");
    assert_eq!(
        h.emu.ops(),
        [
            add(&dir_of("pop223", ".chunk01of03")),
            add(&dir_of("pop223", ".chunk02of03")),
            add(&dir_of("pop223", ".chunk03of03")),
        ]
    );
    h.emu.heal();
    h.emu.clear_log();

    let gh = GithubStore::open(&remote.checkout, "Models").unwrap();
    publish(&m, &dir, &[&hf_store, &gh], &opts(), &mut |_| {}).unwrap();
    assert_eq!(
        h.emu.ops(),
        [
            add(&dir_of("pop223", ".sha256")),
            add(&dir_of("pop223", ".chunkmanifest")),
            add(&dir_of("wm9", ".chunk01of01")),
            add(&dir_of("wm9", ".sha256")),
            add(&dir_of("wm9", ".chunkmanifest")),
            add("manifests/model_names_v25.json"),
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
    assert_eq!(
        h.emu
            .bucket_file(BUCKET, &dir_of("pop223", ".chunk02of03"))
            .unwrap(),
        a.data[1000..2000]
    );
}

/// Seed the bucket with a published release (no CLI): chunk sets for `models` and the manifest.
fn seed_release(emu: &HubEmulator, models: &[&Model], m: &manifest::Manifest) {
    let t = tempfile::tempdir().unwrap();
    let dir = artifacts_dir(t.path(), models);
    for model in models {
        for f in fs::read_dir(dir.join(model.id)).unwrap() {
            let f = f.unwrap();
            let name = f.file_name().to_string_lossy().into_owned();
            emu.seed_bucket_file(
                BUCKET,
                &format!("models/v25/{}/{name}", model.id),
                &fs::read(f.path()).unwrap(),
            );
        }
    }
    emu.seed_bucket_file(
        BUCKET,
        "manifests/model_names_v25.json",
        &m.to_canonical_bytes(),
    );
}

#[test]
fn republish_retracts_first_deep_verify_reads_everything_and_the_guard_holds() {
    let Some(cli) = real_hf_cli() else { return };
    let t = tempfile::tempdir().unwrap();
    let h = hub_with(cli, 2);
    let (old, wm) = (model("pop223", 51, 2500), model("wm9", 52, 800));
    let live = manifest_of(vec![
        entry("pop223", &old.data, "Pop"),
        entry("wm9", &wm.data, "WM 9"),
    ]);
    seed_release(&h.emu, &[&old, &wm], &live);
    let store = HfBucketStore::new(BUCKET, h.config.clone()).unwrap();

    // The guard: a manifest that renames wm9 without a wm9/ directory is refused, nothing written.
    let quiet = t.path().join("quiet");
    fs::create_dir_all(quiet.join("pop223")).unwrap();
    let renamed = manifest_of(vec![
        entry("pop223", &old.data, "Pop"),
        entry("wm9", &wm.data, "WM 9 renamed"),
    ]);
    let e = publish(&renamed, &quiet, &[&store], &opts(), &mut |_| {}).unwrap_err();
    assert!(matches!(e, Error::Guard { .. }), "{e}");
    assert!(h.emu.ops().is_empty());

    // Changed bytes under pop223 (same chunk count): the chunk manifest goes first (the real
    // `rm`, which needs --yes), then the chunks, the sidecar, the chunk manifest, the manifest.
    let new = model("pop223", 53, 2500);
    let dir = artifacts_dir(&t.path().join("v2"), &[&new]);
    let m2 = manifest_of(vec![
        entry("pop223", &new.data, "Pop"),
        entry("wm9", &wm.data, "WM 9"),
    ]);
    publish(&m2, &dir, &[&store], &opts(), &mut |_| {}).unwrap();
    let d = |f: &str| format!("models/v25/pop223/pop223_driving_tinygrad.pkl{f}");
    assert_eq!(
        h.emu.ops(),
        [
            delete(&d(".chunkmanifest")),
            add(&d(".chunk01of03")),
            add(&d(".chunk02of03")),
            add(&d(".chunk03of03")),
            add(&d(".sha256")),
            add(&d(".chunkmanifest")),
            add("manifests/model_names_v25.json"),
        ]
    );
    assert_eq!(read_artifact(&store, "pop223"), new.data);

    // A wm9 chunk corrupted in place at the same size: only --deep-verify reads it and refuses.
    let mut bad = wm.data.clone();
    bad[10] ^= 0xff;
    h.emu.corrupt_bucket_file(
        BUCKET,
        "models/v25/wm9/wm9_driving_tinygrad.pkl.chunk01of01",
        &bad,
    );
    h.emu.clear_log();
    let empty = t.path().join("none");
    fs::create_dir_all(&empty).unwrap();
    let rep = publish(&m2, &empty, &[&store], &opts(), &mut |_| {}).unwrap();
    assert_eq!(rep.stores[0].manifest, "unchanged");
    let deep = PublishOptions {
        deep_verify: true,
        ..opts()
    };
    let e = publish(&m2, &empty, &[&store], &deep, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("model wm9") && e.contains("SHA-256"), "{e}");
    assert!(h.emu.ops().is_empty(), "nothing written by either run");
    // Deep verify read every chunk of both models through resolve and the content host.
    let reads = h
        .emu
        .requests()
        .into_iter()
        .filter(|r| r.listener == Listener::Content && r.method == "GET" && r.bytes_out >= 800)
        // The live manifest, read for the guard before any upload and again before writing.
        .filter(|r| r.bytes_out != m2.to_canonical_bytes().len())
        .count();
    assert_eq!(
        reads, 3,
        "the two pop223 chunks of 1000 bytes + the wm9 chunk of 800 (the 500-byte one is below the filter)"
    );
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

/// The source dataset `org/src` holds `source` as a chunk set under its own name,
/// `builds/supercombo_tinygrad.pkl`.
fn seed_source(h: &Hub, source: &Model) {
    let split = tempfile::tempdir().unwrap();
    chunker::split_reader(
        &source.data[..],
        source.data.len() as u64,
        "supercombo_tinygrad.pkl",
        split.path(),
        &chunker::SplitOptions { chunk_size: CHUNK },
    )
    .unwrap();
    for f in fs::read_dir(split.path()).unwrap() {
        let f = f.unwrap();
        h.emu.seed_repo_file(
            "datasets",
            "org/src",
            &format!("builds/{}", f.file_name().to_string_lossy()),
            &fs::read(f.path()).unwrap(),
        );
    }
}

/// The catalog's verdict on reusing `source` built at `SRC` with the pinned tinygrad.
fn compatible_at_src(source: &Model) -> Compatible {
    check_compatibility(
        &catalog_with_source(source, SRC),
        &source.id.parse().unwrap(),
        &SRC.parse().unwrap(),
        &TG.parse().unwrap(),
    )
    .unwrap()
}

/// Reuses the seeded `org/src` build as `pop223` of v25 in `dest`.
fn reuse_pop223(
    h: &Hub,
    compatible: Compatible,
    dest: &dyn Store,
    on_chunk: &mut dyn FnMut(u32, u32, u64),
) -> artifact_store::Result<ReuseReport> {
    let source = HfRepoStore::new(RepoKind::Datasets, "org/src", None, &h.config).unwrap();
    reuse(
        &ReuseRequest {
            model: "pop223".parse().unwrap(),
            generation: Generation::new(25),
            source: &source,
            source_path: p("builds/supercombo_tinygrad.pkl"),
            compatible,
            dest,
        },
        on_chunk,
    )
}

#[test]
fn reuse_hub_to_hub_copies_server_side_renamed_chunk_manifest_last() {
    let Some(cli) = real_hf_cli() else { return };
    let h = hub_with(cli, 2);
    let source = Model {
        id: "supercombo-pop",
        data: bytes(41, 2500),
    };
    seed_source(&h, &source);
    // The destination already holds an older set: its chunk manifest must go first (rm --yes).
    let dst_path = |f: &str| format!("models/v25/pop223/pop223_driving_tinygrad.pkl{f}");
    h.emu
        .seed_bucket_file(BUCKET, &dst_path(".chunkmanifest"), b"1");
    h.emu
        .seed_bucket_file(BUCKET, &dst_path(".chunk01of01"), b"old");

    let compatible = compatible_at_src(&source);
    let dest = HfBucketStore::new(BUCKET, h.config.clone()).unwrap();
    let mut progress = Vec::new();
    let report = reuse_pop223(&h, compatible.clone(), &dest, &mut |i, n, _| {
        progress.push((i, n))
    })
    .unwrap();
    assert!(report.server_side);
    assert_eq!(report.chunk_count, 3);
    assert_eq!(report.sha256, chunker::Sha256Digest::of_bytes(&source.data));
    assert_eq!(progress, [(1, 3), (2, 3), (3, 3)]);
    let copy = |f: &str| HubOp::Copy {
        bucket: BUCKET.into(),
        path: dst_path(f),
        source: "dataset:org/src".into(),
    };
    assert_eq!(
        h.emu.ops(),
        [
            delete(&dst_path(".chunkmanifest")),
            copy(".chunk01of03"),
            copy(".chunk02of03"),
            copy(".chunk03of03"),
            add(&dst_path(".sha256")),
            add(&dst_path(".chunkmanifest")),
        ]
    );
    // No chunk byte through this machine: the only content uploads are the two small files, and
    // nothing chunk-sized was read back (the OOB check reads the source's headers by ranges).
    let log = h.emu.requests();
    let uploads: Vec<usize> = log
        .iter()
        .filter(|r| r.target.starts_with("/cas/v1/xorbs/"))
        .map(|r| r.bytes_in)
        .collect();
    assert_eq!(uploads.len(), 2, "{uploads:?}");
    assert!(uploads.iter().all(|&n| n < 300), "{uploads:?}");
    for r in &log {
        assert!(
            r.bytes_out < 450 && r.bytes_in < 450,
            "{r:?} may have carried a chunk (the smallest is 500 bytes)"
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
    let h = hub_without_cli();
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
    assert!(h.emu.requests().is_empty());
}

#[test]
fn reuse_refuses_a_source_that_is_not_oob_reading_only_its_head_and_copies_nothing() {
    // No hf CLI at all: the refusal must come before any copy.
    let h = hub_without_cli();
    // Same size and digest as its catalog says, but a plain pickle: not an OOB container.
    let source = Model {
        id: "supercombo-pop",
        data: test_support::published::random_bytes(43, 2500),
    };
    seed_source(&h, &source);
    let compatible = compatible_at_src(&source);
    let dest = HfBucketStore::new(BUCKET, h.config.clone()).unwrap();
    let e = reuse_pop223(&h, compatible, &dest, &mut |_, _, _| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not an out-of-band (OOB) pickle container at byte")
            && e.contains("builds/supercombo_tinygrad.pkl"),
        "{e}"
    );
    // Nothing was copied, and the check read only the 10-byte head, by range.
    assert!(h.emu.ops().is_empty(), "{:?}", h.emu.ops());
    assert!(h.emu.bucket_paths(BUCKET).is_empty());
    let chunk_reads: Vec<_> = h
        .emu
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.target.contains(".chunk0"))
        .collect();
    assert!(!chunk_reads.is_empty());
    for r in &chunk_reads {
        assert!(r.range.is_some() && r.bytes_out <= 10, "{r:?}");
    }
}
