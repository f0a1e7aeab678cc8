//! The downloader against a real, misbehaving HTTP server on 127.0.0.1.

use std::fs;
use std::sync::Mutex;

use crate::common::*;
use downloader::{CancelToken, DownloadConfig, Error, Event, STAGING_DIR};
use test_support::http_server::Fault;
use test_support::published::{GH_DIR, HF_DIR, PublishedModel, manifest_json, write_manifest_at};

impl World {
    /// Every file in the models dir (temporaries included) but the staging directory, whose
    /// contents [`World::staged`] lists.
    fn listing(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(&self.models)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != STAGING_DIR)
            .collect();
        v.sort();
        v
    }

    /// Files in the staging directory.
    fn staged(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.models.join(STAGING_DIR))
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    fn hf_chunk(&self, id: &str, i: u32, n: u32) -> String {
        format!("/{HF_DIR}/models/{GEN}/{id}/{id}_driving_tinygrad.pkl.chunk{i:02}of{n:02}")
    }
}

#[test]
fn parallel_chunked_download_installs_verified_plain_file() {
    let w = world();
    let (data, m) = w.publish("pop223", 1, 5 * CHUNK + 123, true, true);
    // An older chunk set of the same model is on the device: it must stay readable until the
    // new artifact is verified, and be gone afterwards.
    fs::write(
        w.models.join("pop223_driving_tinygrad.pkl.chunk01of01"),
        b"old",
    )
    .unwrap();
    fs::write(
        w.models.join("pop223_driving_tinygrad.pkl.chunkmanifest"),
        b"1",
    )
    .unwrap();
    let d = w.downloader(DownloadConfig {
        ranges_per_chunk: 3,
        connections: 4,
        ..config()
    });
    let events = Mutex::new(Vec::new());
    let entry = m.get(&"pop223".parse().unwrap()).unwrap();
    let done = d
        .download(generation(), entry, &w.models, &CancelToken::new(), &|e| {
            events.lock().unwrap().push(e)
        })
        .unwrap();
    assert_eq!(done.size, data.len() as u64);
    assert_eq!(w.installed("pop223").unwrap(), data);
    assert_eq!(w.listing(), ["pop223_driving_tinygrad.pkl"]);
    let events = events.into_inner().unwrap();
    assert!(matches!(events.last(), Some(Event::Installed { .. })));
    let last_progress = events
        .iter()
        .filter_map(|e| match e {
            Event::Progress { done, total } => Some((*done, *total)),
            _ => None,
        })
        .next_back()
        .unwrap();
    assert_eq!(last_progress, (data.len() as u64, data.len() as u64));
    // Only HF was needed, only versioned paths were asked for, and ranges were used.
    let reqs = w.server.requests();
    assert!(reqs.iter().all(|r| {
        r.path
            .starts_with(&format!("/{HF_DIR}/models/{GEN}/pop223/"))
    }));
    assert!(reqs.iter().filter(|r| r.range.is_some()).count() >= 6);
}

#[test]
fn plain_file_artifact() {
    let w = world();
    let (data, m) = w.publish("plain1", 2, 3 * CHUNK, false, false);
    w.download(&w.downloader(config()), &m, "plain1").unwrap();
    assert_eq!(w.installed("plain1").unwrap(), data);
}

#[test]
fn hf_errors_fall_back_to_github() {
    for status in [404, 500, 429] {
        let w = world();
        let (data, m) = w.publish("pop223", 3, 3 * CHUNK + 5, true, false);
        w.server
            .add_fault(&w.hf_chunk("pop223", 2, 4), Fault::Status(status), None);
        let done = w.download(&w.downloader(config()), &m, "pop223").unwrap();
        assert!(
            done.origin.starts_with("GitHub"),
            "{status}: {}",
            done.origin
        );
        assert_eq!(w.installed("pop223").unwrap(), data, "{status}");
        let gh = w
            .server
            .requests()
            .into_iter()
            .filter(|r| r.path.starts_with("/gh/"))
            .count();
        assert!(gh > 0);
        assert!(
            w.server
                .requests()
                .iter()
                .all(|r| r.path.contains("/v25/pop223/"))
        );
    }
}

#[test]
fn corrupt_or_truncated_chunk_on_hf_is_never_installed() {
    for (digests, truncate) in [(true, false), (false, false), (false, true)] {
        let w = world();
        let (data, m) = w.publish("pop223", 4, 3 * CHUNK + 7, true, digests);
        let bad = w.root.join(format!(
            "{HF_DIR}/models/{GEN}/pop223/pop223_driving_tinygrad.pkl.chunk02of04"
        ));
        let mut bytes = fs::read(&bad).unwrap();
        if truncate {
            bytes.truncate(CHUNK / 2);
        } else {
            bytes[100] ^= 0xff;
        }
        fs::write(&bad, bytes).unwrap();
        let done = w.download(&w.downloader(config()), &m, "pop223").unwrap();
        assert!(done.origin.starts_with("GitHub"), "{digests} {truncate}");
        assert_eq!(w.installed("pop223").unwrap(), data);
        assert_eq!(w.listing(), ["pop223_driving_tinygrad.pkl"]);
    }
}

#[test]
fn wrong_chunkmanifest_falls_through() {
    let w = world();
    let (data, m) = w.publish("pop223", 5, 2 * CHUNK + 1, true, false);
    fs::write(
        w.root.join(format!(
            "{HF_DIR}/models/{GEN}/pop223/pop223_driving_tinygrad.pkl.chunkmanifest"
        )),
        b"2",
    )
    .unwrap();
    let done = w.download(&w.downloader(config()), &m, "pop223").unwrap();
    assert!(done.origin.starts_with("GitHub"));
    assert_eq!(w.installed("pop223").unwrap(), data);
}

#[test]
fn both_origins_bad_leaves_old_artifact_and_nothing_partial() {
    let w = world();
    let (_, m) = w.publish("pop223", 6, 3 * CHUNK, true, false);
    fs::write(w.models.join("pop223_driving_tinygrad.pkl"), b"previous").unwrap();
    w.server
        .add_fault("/hf/models/v25/pop223/*", Fault::Status(500), None);
    w.server.add_fault(
        "/gh/v25/pop223/pop223_driving_tinygrad.pkl.chunk03of03",
        Fault::Status(404),
        None,
    );
    let err = w
        .download(&w.downloader(config()), &m, "pop223")
        .unwrap_err();
    match &err {
        Error::AllOriginsFailed { model, attempts } => {
            assert_eq!(model, "pop223");
            assert_eq!(attempts.len(), 2);
            assert!(err.to_string().contains("HTTP 500"), "{err}");
            assert!(err.to_string().contains("HTTP 404"), "{err}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(w.installed("pop223").unwrap(), b"previous");
    // Only the staging file and its piece record (in the staging directory) may remain, for a
    // later resume. Whether the record exists depends on whether GitHub completed a piece before
    // its 404 ended the attempt, so either is right; a stray temporary is not.
    assert_eq!(w.listing(), ["pop223_driving_tinygrad.pkl"]);
    assert!(
        w.staged().iter().all(|n| {
            let base = n.strip_suffix(".state").unwrap_or(n);
            !base.starts_with('.') && base.ends_with("-pop223_driving_tinygrad.pkl")
        }),
        "{:?}",
        w.staged()
    );
}

#[test]
fn reset_and_truncation_mid_chunk_resume_with_range_and_if_range() {
    for fault in [Fault::Reset(10_000), Fault::Truncate(20_000)] {
        let w = world();
        let (data, m) = w.publish("pop223", 7, 3 * CHUNK, true, true);
        let chunk = w.hf_chunk("pop223", 2, 3);
        w.server.add_fault(&chunk, fault.clone(), Some(2));
        let done = w.download(&w.downloader(config()), &m, "pop223").unwrap();
        assert!(done.origin.starts_with("Hugging Face"), "{fault:?}");
        assert_eq!(w.installed("pop223").unwrap(), data);
        let resumed: Vec<_> = w
            .server
            .requests()
            .into_iter()
            .filter(|r| r.path == chunk && r.if_range.is_some())
            .collect();
        assert!(!resumed.is_empty(), "{fault:?}: no resumed request");
        assert!(
            resumed
                .iter()
                .all(|r| r.range.as_deref() != Some("bytes=0-65535"))
        );
    }
}

#[test]
fn server_ignoring_range_and_over_sending() {
    for fault in [Fault::IgnoreRange, Fault::OverSend(5000)] {
        let w = world();
        let (data, m) = w.publish("pop223", 8, 4 * CHUNK + 9, true, false);
        w.server.add_fault("/hf/*", fault.clone(), None);
        let done = w
            .download(
                &w.downloader(DownloadConfig {
                    ranges_per_chunk: 4,
                    ..config()
                }),
                &m,
                "pop223",
            )
            .unwrap();
        assert!(done.origin.starts_with("Hugging Face"), "{fault:?}");
        assert_eq!(w.installed("pop223").unwrap(), data, "{fault:?}");
    }
}

#[test]
fn hostile_manifests_fall_through_to_github() {
    let w = world();
    let good = PublishedModel {
        id: "pop223".into(),
        name: "Pop".into(),
        size: 10,
        sha256: "a".repeat(64),
        chunk_count: 1,
        chunk_sha256: vec![],
    };
    write_manifest_at(
        &w.root,
        GH_DIR,
        GEN,
        manifest_json(GEN, std::slice::from_ref(&good), false).as_bytes(),
    );
    let mut hostile = Vec::new();
    let mut m = good.clone();
    m.id = "../etc".into();
    hostile.push(("dotdot id", manifest_json(GEN, &[m], false).into_bytes()));
    let mut m = good.clone();
    m.size = 1_000_000_000_000;
    hostile.push(("10^12 size", manifest_json(GEN, &[m], false).into_bytes()));
    let mut m = good.clone();
    m.chunk_count = 1000;
    hostile.push(("1000 chunks", manifest_json(GEN, &[m], false).into_bytes()));
    let mut big = manifest_json(GEN, std::slice::from_ref(&good), false).into_bytes();
    big.truncate(big.len() - 2);
    big.extend(std::iter::repeat_n(b' ', 3 * 1024 * 1024));
    big.extend(b"}\n");
    hostile.push(("3 MiB", big));
    hostile.push(("not json", b"<html>".to_vec()));
    hostile.push((
        "other generation",
        manifest_json("v24", std::slice::from_ref(&good), false).into_bytes(),
    ));
    let d = w.downloader(config());
    for (what, body) in hostile {
        write_manifest_at(&w.root, HF_DIR, GEN, &body);
        let got = d.fetch_manifest(generation()).unwrap();
        assert!(got.origin.starts_with("GitHub"), "{what}");
        assert_eq!(got.manifest.models().len(), 1, "{what}");
    }
    // A hostile value beside a good entry refuses that entry only; a path-like ID anywhere
    // refuses the whole manifest.
    let mut ok = good.clone();
    ok.id = "ok223".into();
    for (what, bad, whole) in [
        (
            "10^12 size",
            PublishedModel {
                size: 1_000_000_000_000,
                ..good.clone()
            },
            false,
        ),
        (
            "1000 chunks",
            PublishedModel {
                chunk_count: 1000,
                ..good.clone()
            },
            false,
        ),
        (
            "underscore id",
            PublishedModel {
                id: "pop_223".into(),
                ..good.clone()
            },
            false,
        ),
        (
            "dotdot id",
            PublishedModel {
                id: "../etc".into(),
                ..good.clone()
            },
            true,
        ),
    ] {
        let body = manifest_json(GEN, &[ok.clone(), bad], false);
        write_manifest_at(&w.root, HF_DIR, GEN, body.as_bytes());
        let got = d.fetch_manifest(generation()).unwrap();
        if whole {
            assert!(got.origin.starts_with("GitHub"), "{what}");
        } else {
            assert!(got.origin.starts_with("Hugging Face"), "{what}");
            let ids: Vec<_> = got.manifest.ids().map(|i| i.to_string()).collect();
            assert_eq!(ids, ["ok223"], "{what}");
            assert_eq!(got.refused_entries.len(), 1, "{what}");
            assert_eq!(got.refused_entries[0].index, 1, "{what}");
        }
    }
    write_manifest_at(&w.root, GH_DIR, GEN, b"[{\"id\": \"../x\"}]");
    let err = d.fetch_manifest(generation()).unwrap_err();
    assert!(
        matches!(err, Error::ManifestUnavailable { ref attempts, .. } if attempts.len() == 2),
        "{err}"
    );
}

#[test]
fn cancel_stops_and_installs_nothing() {
    let w = world();
    let (_, m) = w.publish("pop223", 9, 8 * CHUNK, true, false);
    w.server.set_rate_per_conn(Some(256 * 1024));
    let d = w.downloader(config());
    let cancel = CancelToken::new();
    let entry = m.get(&"pop223".parse().unwrap()).unwrap();
    let err = d
        .download(generation(), entry, &w.models, &cancel, &|e| {
            if let Event::Progress { done, .. } = e
                && done > 0
            {
                cancel.cancel();
            }
        })
        .unwrap_err();
    assert!(matches!(err, Error::Cancelled { .. }), "{err}");
    assert!(w.installed("pop223").is_none());
    // GitHub was not tried after a cancel.
    assert!(
        w.server
            .requests()
            .iter()
            .all(|r| r.path.starts_with("/hf/"))
    );
}

#[test]
fn complete_chunks_survive_a_failed_run_and_are_not_fetched_again() {
    let w = world();
    let (data, m) = w.publish("pop223", 10, 4 * CHUNK, true, true);
    w.server.add_fault(
        "/hf/models/v25/pop223/pop223_driving_tinygrad.pkl.chunk04of04",
        Fault::Status(503),
        None,
    );
    w.server.add_fault(
        "/gh/v25/pop223/pop223_driving_tinygrad.pkl.chunk04of04",
        Fault::Status(503),
        None,
    );
    let d = w.downloader(DownloadConfig {
        connections: 1,
        ..config()
    });
    assert!(w.download(&d, &m, "pop223").is_err());
    w.server.clear_faults();
    w.server.clear_requests();
    w.download(&d, &m, "pop223").unwrap();
    assert_eq!(w.installed("pop223").unwrap(), data);
    let fetched: Vec<_> = w
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.contains(".chunk0"))
        .map(|r| r.path)
        .collect();
    assert_eq!(
        fetched,
        [w.hf_chunk("pop223", 4, 4)],
        "chunks 1-3 were kept from the first run"
    );
    assert_eq!(w.listing(), ["pop223_driving_tinygrad.pkl"]);
    assert!(w.staged().is_empty(), "{:?}", w.staged());
}

/// A real full filesystem: a 1 MiB tmpfs when we may mount one (root in CI), otherwise the
/// test says so and checks the same refusal through the free-space margin on the real disk.
#[test]
fn full_disk_is_refused_before_writing() {
    let w = world();
    let (_, m) = w.publish("pop223", 11, 24 * CHUNK, true, false);
    let small = w.dir.path().join("small");
    fs::create_dir_all(&small).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&small)
        .status()
        .is_ok_and(|s| s.success());
    let (dir, cfg) = if mounted {
        (small.clone(), config())
    } else {
        eprintln!("cannot mount tmpfs here; using a free-space margin larger than the disk");
        (
            w.models.clone(),
            DownloadConfig {
                space_margin: u64::MAX / 2,
                ..config()
            },
        )
    };
    fs::write(dir.join("pop223_driving_tinygrad.pkl"), b"previous").unwrap();
    let entry = m.get(&"pop223".parse().unwrap()).unwrap();
    let err = w
        .downloader(cfg)
        .download(generation(), entry, &dir, &CancelToken::new(), &|_| {})
        .unwrap_err();
    let listing: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != STAGING_DIR)
        .collect();
    let staged = fs::read_dir(dir.join(STAGING_DIR)).map_or(0, |d| d.count());
    let previous = fs::read(dir.join("pop223_driving_tinygrad.pkl")).unwrap();
    if mounted {
        let _ = std::process::Command::new("umount").arg(&small).status();
    }
    assert!(matches!(err, Error::InsufficientSpace { .. }), "{err}");
    assert!(err.to_string().contains("gc"), "{err}");
    assert_eq!(previous, b"previous");
    assert_eq!(listing.len(), 1, "{listing:?}");
    assert_eq!(staged, 0, "nothing was staged");
}

/// The contract's download headroom is what a download checks free space against, not only the
/// configured margin: a made-up contract (v25's rules) that asks for more headroom than any disk
/// has refuses the download with margin 0 before a byte is staged, the installed file untouched.
#[test]
fn the_contracts_headroom_is_checked_before_writing() {
    let w = world();
    let (_, m) = w.publish("pop223", 12, 3 * CHUNK, true, false);
    let base = manifest::contract::ContractName::V25.contract();
    let greedy: &'static manifest::Contract = Box::leak(Box::new(manifest::Contract {
        download_headroom_bytes: u64::MAX / 2,
        ..*base
    }));
    fs::write(w.models.join("pop223_driving_tinygrad.pkl"), b"previous").unwrap();
    let entry = m.get(&"pop223".parse().unwrap()).unwrap();
    let err = w
        .downloader(config())
        .with_contract(greedy, None)
        .download(generation(), entry, &w.models, &CancelToken::new(), &|_| {})
        .unwrap_err();
    assert!(matches!(err, Error::InsufficientSpace { .. }), "{err}");
    let staged = fs::read_dir(w.models.join(STAGING_DIR)).map_or(0, |d| d.count());
    assert_eq!(staged, 0, "nothing was staged");
    let previous = fs::read(w.models.join("pop223_driving_tinygrad.pkl")).unwrap();
    assert_eq!(previous, b"previous");
}

/// `plan_target` (a dry run's view) learns what a download would fetch with the small requests
/// a download makes first, never a payload byte, and writes nothing, not even the staging
/// directory.
#[test]
fn plan_target_fetches_no_payload_and_writes_nothing() {
    let w = world();
    let (data, m) = w.publish("pop223", 3, 3 * CHUNK + 5, true, false);
    let d = w.downloader(config());
    let mut target = downloader::Target::from_entry(m.get(&id("pop223")).unwrap()).unwrap();
    target.size = None; // learned from HEAD, as for an entry without artifact_size
    let plan = d
        .plan_target(generation(), &target, &CancelToken::new())
        .unwrap();
    assert_eq!(plan.size, data.len() as u64);
    assert_eq!(plan.pieces.len(), 4);
    assert_eq!(plan.digest_source, downloader::DigestSource::Manifest);
    assert!(plan.origin.starts_with("Hugging Face"), "{}", plan.origin);
    let payload: Vec<_> = w
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && !r.path.ends_with(".chunkmanifest"))
        .map(|r| r.path)
        .collect();
    assert!(payload.is_empty(), "{payload:?}");
    assert!(fs::read_dir(&w.models).unwrap().next().is_none());
}

/// A range whose retry is answered with a whole, different body (its ETag changed, so
/// `If-Range` gives a `200`) is written again from its start: bytes the artifact's digest may
/// already have followed are overwritten. Such a run never trusts the followed digest: the
/// staging file is hashed whole, the mix of two bodies fails the digest, and only the published
/// bytes are ever installed (here from GitHub).
#[test]
fn bytes_written_twice_are_hashed_again_before_install() {
    let w = world();
    let (data, m) = w.publish("pop223", 9, 3 * CHUNK, true, false);
    let chunk = w.hf_chunk("pop223", 2, 3);
    // The second chunk as another body: wrong in the first 20 000 bytes only, so that a digest
    // which followed the first try's (right) bytes and then the second try's rest would match.
    let mut other = data[CHUNK..2 * CHUNK].to_vec();
    for b in &mut other[..20_000] {
        *b ^= 0x5a;
    }
    w.server.add_fault(&chunk, Fault::Truncate(20_000), Some(1));
    w.server.add_fault(&chunk, Fault::Body(other), Some(1));
    let done = w.download(&w.downloader(config()), &m, "pop223").unwrap();
    assert_eq!(w.installed("pop223").unwrap(), data);
    assert!(done.origin.starts_with("GitHub"), "{}", done.origin);
    let retried: Vec<_> = w
        .server
        .requests()
        .into_iter()
        .filter(|r| r.path == chunk)
        .collect();
    assert!(
        retried.len() >= 2 && retried[1].if_range.is_some(),
        "{retried:?}"
    );
}
