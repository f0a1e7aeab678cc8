//! A publish reports progress within a file for every store kind, from what each backend
//! really learns: a directory's copy, the real `hf` CLI's own progress line (against the Hub
//! emulator), and the real `git push --progress` of a `github:` store's batch. A file larger
//! than the backend's reporting unit gets more than one report, and the store's bytes counted
//! as sent only grow and end at what it uploaded. For v25 and a made-up v26 (made-up pin).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::common::*;
use artifact_store::progress::{Measure, Transfer};
use artifact_store::publish::{Contract, Event, PublishOptions, publish};
use artifact_store::retry::RetryPolicy;
use artifact_store::{GithubStore, HfBucketStore, HfConfig, LocalStore, Store};
use chunker::{SplitOptions, split_reader};
use manifest::{Generation, GitCommit, Manifest, PinTable};
use test_support::hub::{HubConfig, HubEmulator, real_hf_cli};
use test_support::release_stores::{GitRemote, git};

const MIB: u64 = 1 << 20;

/// A made-up next generation's pin.
const V26_PIN: &str = "26a0c0ffee26a0c0ffee26a0c0ffee26a0c0ffee";

/// A generation to publish: v25 with its pin, or a made-up v26 with a made-up pin recorded.
struct Gen {
    generation: Generation,
    pin: GitCommit,
    pins: PinTable,
}

fn generations() -> Vec<Gen> {
    let builtin = PinTable::builtin();
    let (v25, v26) = (Generation::new(25), Generation::new(26));
    let pin26: GitCommit = V26_PIN.parse().unwrap();
    let mut with26 = PinTable::builtin();
    with26.record(v26, &pin26).unwrap();
    vec![
        Gen {
            generation: v25,
            pin: builtin.get(v25).unwrap().clone(),
            pins: builtin,
        },
        Gen {
            generation: v26,
            pin: pin26,
            pins: with26,
        },
    ]
}

fn opts(g: &Gen) -> PublishOptions {
    PublishOptions {
        generation: g.generation,
        dry_run: false,
        retry: RetryPolicy::immediate(2),
        deep_verify: false,
        contract: Contract {
            pins: g.pins.clone(),
            ..Default::default()
        },
    }
}

/// One model of `len` bytes split into chunks of `chunk` bytes, and its manifest.
fn release(
    dir: &Path,
    g: &Gen,
    id: &'static str,
    len: u64,
    chunk: u64,
) -> (std::path::PathBuf, Manifest) {
    // An OOB container with few, large buffers, as real artifacts are: a store's OOB check
    // reads each record's length (an HTTP range each on the Hub).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let payload: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let data = test_support::published::oob_container(&payload, 4 << 20);
    let artifacts = dir.join(format!("artifacts-{}", g.generation));
    let d = artifacts.join(id);
    std::fs::create_dir_all(&d).unwrap();
    let name = format!("{id}_driving_tinygrad.pkl");
    split_reader(
        &data[..],
        len,
        &name,
        &d,
        &SplitOptions { chunk_size: chunk },
    )
    .unwrap();
    let mut e = entry(id, &data, "Pop");
    e["artifact_chunk_count"] = len.div_ceil(chunk).into();
    let m = Manifest::from_value(serde_json::json!({
        "generation": g.generation.to_string(),
        "tinygrad_commit": g.pin.to_string(),
        "models": [e],
    }))
    .unwrap();
    (artifacts, m)
}

/// Publish, collecting the events.
fn run(g: &Gen, artifacts: &Path, m: &Manifest, store: &dyn Store) -> Vec<Event> {
    let mut events = Vec::new();
    publish(m, artifacts, &[store], &opts(g), &mut |e| {
        events.push(e.clone())
    })
    .unwrap();
    events
}

/// The store's `sent` figures in order, and its `upload_bytes`; checks they only grow and end
/// at the total.
fn check_sent(events: &[Event]) {
    let total = events
        .iter()
        .find_map(|e| match e {
            Event::StoreStarted { upload_bytes, .. } => Some(*upload_bytes),
            _ => None,
        })
        .expect("a store started");
    let sent: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::Progress { sent, .. } | Event::Uploaded { sent, .. } => Some(*sent),
            _ => None,
        })
        .collect();
    assert!(sent.windows(2).all(|w| w[0] <= w[1]), "{sent:?}");
    assert!(sent.iter().all(|&s| s <= total), "{sent:?} of {total}");
    assert_eq!(sent.last(), Some(&total), "{sent:?}");
}

/// The in-file byte figures reported for `path` while it was written.
fn file_reports(events: &[Event], suffix: &str) -> Vec<(u64, Measure)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Progress {
                path,
                transfer: Transfer::File { done, measure },
                ..
            } if path.ends_with(suffix) => Some((*done, *measure)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_directory_store_reports_the_bytes_it_has_copied() {
    for g in generations() {
        let t = tempfile::tempdir().unwrap();
        // Two chunks: 9 MiB (over two reporting units) and 1 MiB.
        let (artifacts, m) = release(t.path(), &g, "pop223", 10 * MIB, 9 * MIB);
        let store = LocalStore::new(t.path().join("store"));
        let events = run(&g, &artifacts, &m, &store);
        check_sent(&events);
        let unit = artifact_store::local::COPY_REPORT_BYTES;
        assert_eq!(
            file_reports(&events, ".chunk01of02"),
            [
                (0, Measure::Copied),
                (unit, Measure::Copied),
                (2 * unit, Measure::Copied)
            ],
            "{}",
            g.generation
        );
        // The smaller chunk: only its start; it counts whole once written.
        assert_eq!(
            file_reports(&events, ".chunk02of02"),
            [(0, Measure::Copied)]
        );
        let chunks: u64 = store
            .list(&p(&format!("models/{}/pop223", g.generation)))
            .unwrap()
            .iter()
            .filter(|e| e.path.as_str().contains(".chunk0"))
            .map(|e| e.size)
            .sum();
        assert_eq!(chunks, 10 * MIB, "{}", g.generation);
    }
}

#[test]
fn a_hub_store_reports_the_hf_clis_own_byte_progress() {
    let Some(cli) = real_hf_cli() else { return };
    let t = tempfile::tempdir().unwrap();
    let emu = HubEmulator::start(HubConfig::default()).unwrap();
    // A slow uplink (8 MiB/s): the upload lasts several of the CLI's 100 ms progress polls.
    emu.limit_upload_rate(8 * MIB);
    let config = HfConfig {
        endpoint: emu.url(),
        token: Some(emu.token().to_string()),
        cli,
        timeout: Duration::from_secs(30),
    };
    for g in generations() {
        // A bucket of its own: the same bytes under v26 beside v25's would be refused as
        // carried across generations.
        let bucket = format!("StarPilot-Driving/progress-{}", g.generation);
        emu.create_bucket(&bucket);
        let store = HfBucketStore::new(&bucket, config.clone()).unwrap();
        hub_publish_reports_progress(&g, t.path(), &emu, &bucket, &store);
    }
}

fn hub_publish_reports_progress(
    g: &Gen,
    dir: &Path,
    emu: &HubEmulator,
    bucket: &str,
    store: &HfBucketStore,
) {
    // One 24 MiB chunk: hf-xet counts a file's bytes done in 8 MiB blocks, polled every 100 ms.
    let len = 24 * MIB;
    let (artifacts, m) = release(dir, g, "pop223", len, len);
    let events = run(g, &artifacts, &m, store);
    check_sent(&events);
    let reports = file_reports(&events, ".chunk01of01");
    eprintln!("the hf CLI's reports for a {len}-byte file: {reports:?}");
    assert!(
        reports.iter().all(|(_, m)| *m == Measure::HfCli),
        "{reports:?}"
    );
    assert_eq!(reports.first(), Some(&(0, Measure::HfCli)), "{reports:?}");
    // What the CLI printed within the file (three significant digits), never past it.
    let within: Vec<u64> = reports
        .iter()
        .map(|(d, _)| *d)
        .filter(|&d| d > 0 && d < len)
        .collect();
    assert!(
        within.len() >= 2 && within.windows(2).all(|w| w[0] < w[1]),
        "not several growing progress lines within the file: {reports:?}"
    );
    assert!(reports.iter().all(|(d, _)| *d <= len + len / 200));
    let path = format!(
        "models/{}/pop223/pop223_driving_tinygrad.pkl.chunk01of01",
        g.generation
    );
    assert_eq!(
        emu.bucket_file(bucket, &path).map(|b| b.len() as u64),
        Some(len)
    );
}

/// A `git receive-pack` that reads its input 512 KiB at a time, a quarter of a second apart
/// (about 2 MiB/s), so a push lasts long enough for git's once-a-second byte figures.
fn slow_receive_pack(dir: &Path) -> std::path::PathBuf {
    let script = dir.join("slow-receive-pack");
    let block = dir.join("block");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nwhile :; do\n  head -c 524288 > '{b}'\n  [ -s '{b}' ] || break\n  cat '{b}'\n  sleep 0.25\ndone | git receive-pack \"$@\"\n",
            b = block.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[test]
fn a_github_store_reports_each_pushs_written_bytes() {
    for g in generations() {
        github_publish_reports_progress(&g);
    }
}

fn github_publish_reports_progress(g: &Gen) {
    let t = tempfile::tempdir().unwrap();
    let remote = GitRemote::new(t.path(), "Models", None);
    let slow = slow_receive_pack(t.path());
    git(
        &remote.checkout,
        &[
            "config",
            "remote.origin.receivepack",
            slow.to_str().unwrap(),
        ],
    );
    // One 8 MiB chunk: committed, then pushed with its sidecar and chunk manifest.
    let len = 8 * MIB;
    let (artifacts, m) = release(t.path(), g, "pop223", len, len);
    let store = GithubStore::open(&remote.checkout, "Models").unwrap();
    let events = run(g, &artifacts, &m, &store);
    check_sent(&events);
    let transfers: Vec<(String, Transfer)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Progress { path, transfer, .. } => Some((path.clone(), *transfer)),
            _ => None,
        })
        .collect();
    // The chunk is committed (staged) first; nothing counts as sent until a push.
    assert!(
        transfers
            .iter()
            .any(|(p, t)| p.ends_with(".chunk01of01") && *t == Transfer::Staged { bytes: len }),
        "{transfers:?}"
    );
    // The push the chunk manifest triggers carries it: git's byte figures, more than one,
    // growing, the first within the batch; then its end.
    let pushes: Vec<(u64, u64)> = transfers
        .iter()
        .filter_map(|(p, t)| match t {
            Transfer::Push { written, waiting } if p.ends_with(".chunkmanifest") => {
                Some((*written, *waiting))
            }
            _ => None,
        })
        .collect();
    assert!(pushes.len() >= 2, "{pushes:?}");
    assert!(pushes.windows(2).all(|w| w[0].0 <= w[1].0), "{pushes:?}");
    let waiting = pushes[0].1;
    assert!(waiting > len, "{pushes:?}");
    assert!(pushes[0].0 > 0 && pushes[0].0 < waiting, "{pushes:?}");
    assert!(
        transfers
            .iter()
            .any(|(p, t)| p.ends_with(".chunkmanifest") && *t == Transfer::Pushed),
        "{transfers:?}"
    );
    assert_eq!(
        remote.remote_subjects().last().unwrap(),
        &format!("Publish model_names_{}.json", g.generation)
    );
}

/// An upload whose progress is read still fails as the CLI says, with its error lines and none
/// of its progress lines: a bucket nobody created is "bucket missing".
#[test]
fn a_failed_hub_upload_reports_the_clis_error_without_its_progress_lines() {
    let Some(cli) = real_hf_cli() else { return };
    let t = tempfile::tempdir().unwrap();
    let emu = HubEmulator::start(HubConfig::default()).unwrap();
    let config = HfConfig {
        endpoint: emu.url(),
        token: Some(emu.token().to_string()),
        cli,
        timeout: Duration::from_secs(30),
    };
    let store = HfBucketStore::new("StarPilot-Driving/no-such-bucket", config).unwrap();
    let local = t.path().join("chunk");
    std::fs::write(&local, vec![7u8; 3 << 20]).unwrap();
    let mut reports = Vec::new();
    let err = store
        .write_file_reporting(&p("models/v26/x/x.bin"), &local, &mut |r| reports.push(r))
        .unwrap_err();
    match &err {
        artifact_store::Error::HfCli { kind, stderr, .. } => {
            assert_eq!(*kind, artifact_store::HfFailure::BucketMissing, "{stderr}");
            assert!(
                !stderr.contains("Processing Files") && !stderr.contains('\r'),
                "{stderr}"
            );
        }
        other => panic!("not a CLI failure: {other}"),
    }
    assert_eq!(
        reports.first(),
        Some(&Transfer::File {
            done: 0,
            measure: Measure::HfCli
        })
    );
}
