//! The downloader against the shapes the fleet really sees, on a real HTTP server on 127.0.0.1:
//! the live manifest (no artifact fields), entries the Python fleet tolerates, upstream's
//! cleanup running beside a download, an external GPU, and a stop in the middle of a download.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread;
use std::time::Duration;

use crate::common::*;
use downloader::egpu::{self, Chestnut};
use downloader::{CancelToken, DigestSource, Error, Event, STAGING_DIR, Target};
use test_support::published::{
    HF_DIR, artifact_bytes, artifact_dirs, manifest_json, publish_model, sha256_hex, write_manifest,
};

/// The published v25 catalog as it is live: no artifact fields at all.
const LIVE_CATALOG: &str =
    include_str!("../../manifest/tests/fixtures/model_names_v25.catalog.json");

impl World {
    fn gets(&self) -> Vec<(String, Option<String>)> {
        self.server
            .requests()
            .into_iter()
            .filter(|r| r.method == "GET")
            .map(|r| (r.path, r.range))
            .collect()
    }
}

#[test]
fn the_live_manifest_installs_a_verified_model() {
    let w = world();
    // The live catalog verbatim: 97 entries, not one artifact field.
    write_manifest(&w.root, GEN, LIVE_CATALOG.as_bytes());
    let data = artifact_bytes(11, 3 * CHUNK + 17);
    publish_model(&w.root, GEN, "tr14223", &data, Some(CHUNK));
    let d = w.downloader(config());
    let fetched = d.fetch_manifest(generation()).unwrap();
    assert_eq!(fetched.manifest.models().len(), 97);
    assert!(
        fetched.refused_entries.is_empty(),
        "{:?}",
        fetched.refused_entries
    );
    let entry = fetched.manifest.get(&id("tr14223")).unwrap();
    assert!(entry.artifact().is_none(), "the live shape has no artifact");
    let done = w.download(&d, &fetched.manifest, "tr14223").unwrap();
    assert_eq!(done.digest_source, DigestSource::Sidecar);
    assert_eq!(done.sha256.to_hex(), sha256_hex(&data));
    assert!(done.origin.starts_with("Hugging Face"));
    assert_eq!(w.installed("tr14223").unwrap(), data);
    // The digest it was verified against is kept beside it, in upstream's sidecar format.
    assert_eq!(
        downloader::installed_sidecar_digest(&w.models, "tr14223_driving_tinygrad.pkl")
            .unwrap()
            .to_hex(),
        sha256_hex(&data)
    );
    let gets: Vec<String> = w.gets().into_iter().map(|g| g.0).collect();
    let dir = format!("/{HF_DIR}/models/{GEN}/tr14223/tr14223_driving_tinygrad.pkl");
    assert!(gets.contains(&format!("{dir}.chunkmanifest")), "{gets:?}");
    assert!(gets.contains(&format!("{dir}.sha256")), "{gets:?}");

    // A model published as one plain file with a sidecar: no .chunkmanifest, still installed.
    let plain = artifact_bytes(12, 2 * CHUNK);
    for d in artifact_dirs(&w.root, GEN, "tr15223") {
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("tr15223_driving_tinygrad.pkl"), &plain).unwrap();
        fs::write(
            d.join("tr15223_driving_tinygrad.pkl.sha256"),
            format!(
                "{}  tr15223_driving_tinygrad.pkl\n",
                sha256_hex(&plain).to_uppercase()
            ),
        )
        .unwrap();
    }
    let done = w.download(&d, &fetched.manifest, "tr15223").unwrap();
    assert_eq!(done.digest_source, DigestSource::Sidecar);
    assert_eq!(w.installed("tr15223").unwrap(), plain);
}

#[test]
fn without_a_digest_anywhere_nothing_is_installed_and_it_says_so() {
    let w = world();
    write_manifest(&w.root, GEN, LIVE_CATALOG.as_bytes());
    let data = artifact_bytes(13, 2 * CHUNK + 1);
    publish_model(&w.root, GEN, "tr14223", &data, Some(CHUNK));
    for dir in artifact_dirs(&w.root, GEN, "tr14223") {
        fs::remove_file(dir.join("tr14223_driving_tinygrad.pkl.sha256")).unwrap();
    }
    let d = w.downloader(config());
    let m = d.fetch_manifest(generation()).unwrap().manifest;
    let err = w.download(&d, &m, "tr14223").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("declares no artifact_sha256"), "{text}");
    assert!(text.contains("nothing to verify"), "{text}");
    assert!(w.installed("tr14223").is_none());
    // Not one payload byte was asked for.
    assert!(
        w.gets().iter().all(|(p, _)| !p.contains(".chunk0")),
        "{:?}",
        w.gets()
    );

    // A sidecar that does not match the bytes: verified, refused, nothing installed.
    for dir in artifact_dirs(&w.root, GEN, "tr14223") {
        fs::write(
            dir.join("tr14223_driving_tinygrad.pkl.sha256"),
            format!("{}  x\n", "ab".repeat(32)),
        )
        .unwrap();
    }
    let err = w.download(&d, &m, "tr14223").unwrap_err();
    assert!(err.to_string().contains("digest from the sidecar"), "{err}");
    assert!(w.installed("tr14223").is_none());
    assert!(
        downloader::installed_sidecar_digest(&w.models, "tr14223_driving_tinygrad.pkl").is_none()
    );
}

/// One odd entry beside a published model: the model still downloads; what upstream
/// normalises is kept (and downloads too), anything else is left out with its reason.
#[test]
fn each_tolerated_irregularity_leaves_the_rest_of_the_catalog_working() {
    let w = world();
    let good = publish_model(
        &w.root,
        GEN,
        "pop223",
        &artifact_bytes(21, 2 * CHUNK + 3),
        Some(CHUNK),
    );
    let odd_data = artifact_bytes(22, CHUNK + 9);
    let odd = publish_model(&w.root, GEN, "odd223", &odd_data, Some(CHUNK));
    let base = manifest_json(GEN, &[good.clone(), odd.clone()], false);
    let sha = odd.sha256.clone();
    // (what, text to replace in the odd entry, replacement, odd entry kept?)
    let cases: Vec<(&str, String, String, bool)> = vec![
        ("comma in name", "\"Model odd223\"".into(), "\"Odd, really\"".into(), false),
        ("no such day", "\"released\": \"2025-01-01\",\n      \"community_favorite\": false,\n      \"artifact_format\": \"tinygrad_single_v1\",\n      \"artifact_size\": ".to_string() + &odd.size.to_string(), "\"released\": \"2025-02-30\",\n      \"community_favorite\": false,\n      \"artifact_format\": \"tinygrad_single_v1\",\n      \"artifact_size\": ".to_string() + &odd.size.to_string(), false),
        ("uppercase sha", sha.clone(), sha.to_uppercase(), true),
        ("integer boolean", format!("\"artifact_size\": {},\n      \"artifact_sha256\": \"{sha}\",\n      \"artifact_chunk_count\": {},\n      \"uses_external_gpu\": false", odd.size, odd.chunk_count), format!("\"artifact_size\": {},\n      \"artifact_sha256\": \"{sha}\",\n      \"artifact_chunk_count\": {},\n      \"uses_external_gpu\": 0", odd.size, odd.chunk_count), true),
        ("version v013", "\"id\": \"odd223\",\n      \"name\": \"Model odd223\",\n      \"version\": \"v16\"".into(), "\"id\": \"odd223\",\n      \"name\": \"Model odd223\",\n      \"version\": \"v013\"".into(), false),
        ("empty accelerator sha", format!("\"artifact_sha256\": \"{sha}\""), format!("\"artifact_sha256\": \"{sha}\",\n      \"accelerator_artifacts\": {{\"chestnut\": {{\"artifact_sha256\": \"\", \"execution_device\": \"AMD\"}}}}"), true),
        ("size beyond 2 GiB", format!("\"artifact_size\": {}", odd.size), "\"artifact_size\": 3000000000".into(), false),
        ("100 chunks", format!("\"artifact_chunk_count\": {}", odd.chunk_count), "\"artifact_chunk_count\": 100".into(), false),
    ];
    let d = w.downloader(config());
    for (what, from, to, kept) in cases {
        // Replace only inside the odd entry (the second).
        let at = base.find("\"id\": \"odd223\"").unwrap() - 10;
        let (head, tail) = base.split_at(at);
        assert!(tail.contains(&from), "{what}: pattern not found");
        let body = format!("{head}{}", tail.replacen(&from, &to, 1));
        write_manifest(&w.root, GEN, body.as_bytes());
        let fetched = d.fetch_manifest(generation()).unwrap();
        assert!(fetched.origin.starts_with("Hugging Face"), "{what}");
        let ids: Vec<String> = fetched.manifest.ids().map(ToString::to_string).collect();
        fs::remove_file(w.models.join("pop223_driving_tinygrad.pkl")).ok();
        w.download(&d, &fetched.manifest, "pop223")
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        if kept {
            assert_eq!(ids, ["pop223", "odd223"], "{what}");
            assert!(fetched.refused_entries.is_empty(), "{what}");
            assert!(!fetched.normalised.is_empty(), "{what}");
            fs::remove_file(w.models.join("odd223_driving_tinygrad.pkl")).ok();
            w.download(&d, &fetched.manifest, "odd223")
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(w.installed("odd223").unwrap(), odd_data, "{what}");
        } else {
            assert_eq!(ids, ["pop223"], "{what}");
            assert_eq!(fetched.refused_entries.len(), 1, "{what}");
            assert_eq!(
                fetched.refused_entries[0].id.as_deref(),
                Some("odd223"),
                "{what}"
            );
            assert!(!fetched.refused_entries[0].reason().is_empty(), "{what}");
        }
    }
}

/// Upstream's `_remove_stale_model_files`, written from its description (reference §4.3):
/// in the models directory, delete every entry whose name starts with `tmp`, every driving
/// file without a key (`driving_*`), and every non-local driving file whose key (the text
/// before `_driving_`) is not in `AvailableModels`. Returns what it deleted.
fn upstream_cleanup(models: &Path, available: &BTreeSet<String>) -> Vec<String> {
    let mut deleted = Vec::new();
    let Ok(entries) = fs::read_dir(models) else {
        return deleted;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        let stale = if name.starts_with("tmp") {
            true
        } else if let Some(at) = name.find("_driving_") {
            let key = &name[..at];
            !key.starts_with("local-") && !available.contains(key)
        } else {
            name.starts_with("driving_")
        };
        if stale {
            let gone = if path.is_dir() && !path.is_symlink() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            if gone.is_ok() {
                deleted.push(name);
            }
        }
    }
    deleted
}

#[test]
fn upstream_cleanup_every_second_beside_a_slow_download_does_not_stop_the_install() {
    let w = world();
    let data = artifact_bytes(31, 6 * CHUNK + 5);
    let m = publish_model(&w.root, GEN, "pop223", &data, Some(CHUNK));
    write_manifest(&w.root, GEN, manifest_json(GEN, &[m], true).as_bytes());
    // The Python manager's own leftovers, which its cleanup does remove.
    fs::write(w.models.join("tmpab12cd"), b"x").unwrap();
    fs::write(w.models.join("driving_vision_tinygrad.pkl"), b"x").unwrap();
    fs::write(w.models.join("gone223_driving_tinygrad.pkl"), b"x").unwrap();
    // About 3 s at this rate with 3 connections (each sends its next range a moment early on a
    // second one): two and more cleanup passes meet it mid-way.
    w.server.set_rate_per_conn(Some(40 * 1024));
    let d = w.downloader(config());
    let fetched = d.fetch_manifest(generation()).unwrap();
    let available: BTreeSet<String> = fetched.manifest.ids().map(ToString::to_string).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let passes = Arc::new(AtomicU32::new(0));
    let models = w.models.clone();
    let cleaner = {
        let (stop, passes) = (stop.clone(), passes.clone());
        thread::spawn(move || {
            let mut deleted = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                deleted.extend(upstream_cleanup(&models, &available));
                passes.fetch_add(1, Ordering::SeqCst);
                // Every second, like `check_assets`; the first pass runs at once.
                for _ in 0..10 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    thread::sleep(Duration::from_millis(100));
                }
            }
            deleted
        })
    };
    let progressed = AtomicU32::new(0);
    let done = d
        .download(
            generation(),
            fetched.manifest.get(&id("pop223")).unwrap(),
            &w.models,
            &CancelToken::new(),
            &|e| {
                if let Event::Progress { .. } = e {
                    progressed.fetch_add(1, Ordering::SeqCst);
                }
            },
        )
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    let mut deleted = cleaner.join().unwrap();
    deleted.sort();
    assert!(
        passes.load(Ordering::SeqCst) >= 3,
        "the cleanup ran beside the download"
    );
    assert_eq!(
        deleted,
        [
            "driving_vision_tinygrad.pkl",
            "gone223_driving_tinygrad.pkl",
            "tmpab12cd"
        ],
        "the cleanup is real, and it never touched the download"
    );
    assert_eq!(done.digest_source, DigestSource::Manifest);
    assert_eq!(w.installed("pop223").unwrap(), data);
    // And the installed model survives the next pass, as modeld will need it.
    let available = BTreeSet::from(["pop223".to_string()]);
    assert!(upstream_cleanup(&w.models, &available).is_empty());
    assert!(w.models.join(STAGING_DIR).is_dir());
}

/// Stop in the middle (what SIGTERM does to the manager: the download's cancel token), start
/// again: no finished chunk is fetched twice, and with per-chunk digests a chunk in flight
/// continues where it stopped.
#[test]
fn a_stop_then_a_restart_never_fetches_a_finished_chunk_again() {
    for digests in [true, false] {
        let w = world();
        let data = artifact_bytes(41, 8 * CHUNK + 100);
        let m = publish_model(&w.root, GEN, "pop223", &data, Some(CHUNK));
        write_manifest(&w.root, GEN, manifest_json(GEN, &[m], digests).as_bytes());
        w.server.set_rate_per_conn(Some(96 * 1024));
        let d = w.downloader(config());
        let manifest = d.fetch_manifest(generation()).unwrap().manifest;
        let entry = manifest.get(&id("pop223")).unwrap();
        let cancel = CancelToken::new();
        let err = d
            .download(generation(), entry, &w.models, &cancel, &|e| {
                if let Event::Progress { done, .. } = e
                    && done > 4 * CHUNK as u64 + CHUNK as u64 / 3
                {
                    cancel.cancel();
                }
            })
            .unwrap_err();
        assert!(matches!(err, Error::Cancelled { .. }), "{err}");
        assert!(w.installed("pop223").is_none());
        let first: Vec<(String, Option<String>)> = w.gets();
        let (done, partial) = staging_record(&w.models);
        w.server.clear_requests();
        w.server.set_rate_per_conn(None);

        let resumed_from = std::sync::Mutex::new(None);
        w.download_with(&d, &manifest, "pop223", &|e| {
            if let Event::Progress { done, .. } = e {
                resumed_from.lock().unwrap().get_or_insert(done);
            }
        })
        .unwrap();
        assert_eq!(w.installed("pop223").unwrap(), data);
        let second = w.gets();
        let chunk = |i: u32| format!("pop223_driving_tinygrad.pkl.chunk{i:02}of09");
        // No chunk the first run finished is asked for again; with per-chunk digests a chunk
        // it was cut off in continues at the byte it had reached.
        assert!(done.len() >= 2, "{digests}: {done:?} {first:?}");
        for (p, r) in &second {
            for i in &done {
                assert!(
                    !p.ends_with(&chunk(*i)),
                    "{digests}: chunk {i} fetched twice: {r:?}"
                );
            }
        }
        for (i, reached) in &partial {
            let asked: Vec<&Option<String>> = second
                .iter()
                .filter(|(p, _)| p.ends_with(&chunk(*i)))
                .map(|(_, r)| r)
                .collect();
            assert_eq!(asked.len(), 1, "{digests}: chunk {i}: {asked:?}");
            let want = format!("bytes={reached}-");
            assert!(
                asked[0].as_deref().is_some_and(|r| r.starts_with(&want)),
                "{digests}: chunk {i} should continue at {reached}: {asked:?}"
            );
        }
        if digests {
            assert!(!partial.is_empty(), "a chunk was in flight: {first:?}");
        } else {
            assert!(
                partial.is_empty(),
                "no ranges are recorded without chunk digests"
            );
        }
        let start = resumed_from.lock().unwrap().unwrap();
        let on_disk =
            done.len() as u64 * CHUNK as u64 + partial.iter().map(|(_, b)| b).sum::<u64>();
        assert_eq!(
            start, on_disk,
            "{digests}: progress resumes at what is on disk"
        );
    }
}

/// The staging record after a stop: finished chunks, and (chunk, bytes reached) of chunks cut
/// off, each from its first byte.
fn staging_record(models: &Path) -> (Vec<u32>, Vec<(u32, u64)>) {
    let dir = models.join(STAGING_DIR);
    let state = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(".state"))
        .expect("a stopped download leaves its record");
    let text = fs::read_to_string(state.path()).unwrap();
    let (mut done, mut partial) = (Vec::new(), Vec::new());
    for line in text.lines().skip(1) {
        let w: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        match w[..] {
            [i] => done.push(i as u32),
            [i, 0, b] => partial.push((i as u32, b)),
            _ => panic!("unexpected record line {line:?}"),
        }
    }
    (done, partial)
}

/// A GPU model with a Chestnut build: without a ready Chestnut a single download is refused
/// (unless overridden) and download-all leaves it out; with one, both builds are fetched.
#[test]
fn a_chestnut_present_or_absent_decides_gpu_downloads() {
    let w = world();
    let main = artifact_bytes(51, CHUNK + 1);
    let amd = artifact_bytes(52, CHUNK / 2);
    let cpu = publish_model(&w.root, GEN, "cpu223", &artifact_bytes(53, 100), None);
    let gpu = publish_model(&w.root, GEN, "gpu223", &main, None);
    for dir in artifact_dirs(&w.root, GEN, "gpu223") {
        fs::write(dir.join("gpu223_amd.pkl"), &amd).unwrap();
    }
    let mut json: serde_json::Value =
        serde_json::from_str(&manifest_json(GEN, &[cpu, gpu], false)).unwrap();
    let e = &mut json["models"][1];
    e["uses_external_gpu"] = true.into();
    e["accelerator_artifacts"] = serde_json::json!({"chestnut": {
        "artifact_format": "tinygrad_single_v1", "artifact_filename": "gpu223_amd.pkl",
        "artifact_size": amd.len(), "artifact_sha256": sha256_hex(&amd),
        "artifact_chunk_count": 0, "execution_device": "AMD"}});
    write_manifest(&w.root, GEN, json.to_string().as_bytes());
    let d = w.downloader(config());
    let m = d.fetch_manifest(generation()).unwrap().manifest;

    let sysfs = tempfile::tempdir().unwrap();
    let usb = sysfs.path().join("bus/usb/devices/2-1");
    fs::create_dir_all(&usb).unwrap();
    fs::write(usb.join("idVendor"), "add1\n").unwrap();
    fs::write(usb.join("idProduct"), "0001\n").unwrap();
    fs::write(usb.join("product"), "custom ed4e39b7\n").unwrap();

    // What a manager does with these rules: plan, then fetch.
    let run = |chestnut: Chestnut, all: bool, allow: bool| -> Vec<String> {
        let mut fetched = Vec::new();
        for entry in m.models() {
            let gpu = entry.uses_external_gpu();
            let go = if all {
                egpu::unrequested_download(gpu, chestnut)
            } else {
                entry.id().as_str() == "gpu223"
                    && egpu::single_download(gpu, chestnut, allow).is_ok()
            };
            if !go {
                continue;
            }
            for t in egpu::artifacts_to_fetch(
                entry,
                chestnut,
                manifest::contract::BASE_CONTRACT.contract(),
            )
            .unwrap()
            {
                d.download_target(generation(), &t, &w.models, &CancelToken::new(), &|_| {})
                    .unwrap();
                fetched.push(t.local_name.to_string());
            }
        }
        fetched
    };

    // A Chestnut without its firmware counts as absent.
    let c = egpu::detect_chestnut(sysfs.path());
    assert_eq!(c, Chestnut::Present);
    assert_eq!(
        egpu::single_download(true, c, false),
        Err(egpu::EXTERNAL_GPU_REQUIRED)
    );
    assert!(run(c, false, false).is_empty());
    assert!(
        w.server
            .requests()
            .iter()
            .all(|r| !r.path.contains("gpu223"))
    );
    assert_eq!(run(c, true, false), ["cpu223_driving_tinygrad.pkl"]);
    assert!(w.installed("gpu223").is_none());
    // The override lets one single download through, without the Chestnut build.
    assert_eq!(run(c, false, true), ["gpu223_driving_tinygrad.pkl"]);
    fs::remove_file(w.models.join("gpu223_driving_tinygrad.pkl")).unwrap();

    fs::write(usb.join("product"), "custom ed4e39b7-CLEAN\n").unwrap();
    let c = egpu::detect_chestnut(sysfs.path());
    assert_eq!(c, Chestnut::Ready);
    assert_eq!(
        run(c, true, false),
        [
            "cpu223_driving_tinygrad.pkl",
            "gpu223_driving_tinygrad.pkl",
            "gpu223_driving_chestnut_tinygrad.pkl"
        ]
    );
    assert_eq!(w.installed("gpu223").unwrap(), main);
    assert_eq!(
        fs::read(w.models.join("gpu223_driving_chestnut_tinygrad.pkl"))
            .ok()
            .unwrap(),
        amd
    );
    let t = Target::accelerator_variant(
        m.get(&id("gpu223")).unwrap(),
        manifest::contract::BASE_CONTRACT.contract(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(t.remote_name.as_str(), "gpu223_amd.pkl");
}
