//! The transfer starts on what the manifest entry implies while the origin's `.chunkmanifest`
//! (and the first chunk's `HEAD`) are in flight, and keeps nothing the origin does not confirm.

use std::fs;
use std::sync::Mutex;
use std::time::Duration;

use crate::common::*;
use downloader::{CancelToken, DownloadConfig, Error, Event, STAGING_DIR};
use test_support::http_server::Fault;
use test_support::published::HF_DIR;

/// The `.chunkmanifest` of `id` on the Hugging Face layout, as the server logs its path.
fn chunk_manifest(id: &str) -> String {
    format!("/{HF_DIR}/models/{GEN}/{id}/{id}_driving_tinygrad.pkl.chunkmanifest")
}

fn staged(w: &World) -> Vec<String> {
    fs::read_dir(w.models.join(STAGING_DIR))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A `.chunkmanifest` that never answers holds no range back: the chunk ranges the entry
/// implies go out while it is in flight, so payload bytes arrive from the Hugging Face origin
/// before it has said anything (asking it first, they could only come from GitHub, after the
/// Hugging Face origin was given up). A cancel then: nothing the origin did not confirm is kept,
/// not even the staging file.
#[test]
fn payload_arrives_while_the_chunkmanifest_is_in_flight() {
    let w = world();
    // Four whole chunks: the entry's size and count imply each chunk's length.
    let (_, m) = w.publish("early1", 21, 4 * CHUNK, true, false);
    w.server
        .add_fault(&chunk_manifest("early1"), Fault::Stall, None);
    let mut config = config();
    config.http.response_timeout = Duration::from_secs(2);
    let d = w.downloader(config);
    let cancel = CancelToken::new();
    let origin = Mutex::new(String::new());
    let first_payload_from = Mutex::new(None);
    let err = d
        .download(
            generation(),
            m.get(&id("early1")).unwrap(),
            &w.models,
            &cancel,
            &|e| match e {
                Event::Origin { origin: o } => *origin.lock().unwrap() = o,
                Event::Progress { done, .. } if done > 0 => {
                    first_payload_from
                        .lock()
                        .unwrap()
                        .get_or_insert_with(|| origin.lock().unwrap().clone());
                    cancel.cancel();
                }
                _ => {}
            },
        )
        .unwrap_err();
    let from = first_payload_from.into_inner().unwrap().unwrap_or_default();
    assert!(
        from.starts_with("Hugging Face"),
        "first payload from {from:?}"
    );
    assert!(matches!(err, Error::Cancelled { .. }), "{err}");
    assert!(w.installed("early1").is_none());
    assert!(staged(&w).is_empty(), "{:?}", staged(&w));
}

/// Chunks of another length than the entry's size and count imply: the ranges started on that
/// guess are dropped when the origin's first chunk answers otherwise, and the download starts
/// over on the origin's word, from the same origin (a wrong guess is no failure of the origin).
#[test]
fn another_chunk_length_than_implied_starts_over_on_the_origins_word() {
    let w = world();
    let (data, m) = w.publish("early2", 22, 5 * CHUNK + 123, true, true);
    let d = w.downloader(DownloadConfig {
        connections: 4,
        ..config()
    });
    let done = w.download(&d, &m, "early2").unwrap();
    assert!(done.origin.starts_with("Hugging Face"), "{}", done.origin);
    assert_eq!(w.installed("early2").unwrap(), data);
    assert!(staged(&w).is_empty(), "{:?}", staged(&w));
}

/// A `.chunkmanifest` that gives another count than the entry (a republish under way) stops the
/// transfer started on the entry's word: nothing of it is kept (no staging file), and the
/// artifact comes from the other origin, as when the `.chunkmanifest` was read first.
#[test]
fn a_chunkmanifest_disagreeing_with_the_entry_drops_what_was_started() {
    let w = world();
    let (data, m) = w.publish("early3", 23, 4 * CHUNK, true, false);
    // Slow chunks: the transfer is still under way when the `.chunkmanifest` answers.
    for i in 1..=4 {
        let chunk =
            format!("/{HF_DIR}/models/{GEN}/early3/early3_driving_tinygrad.pkl.chunk{i:02}of04");
        w.server.add_fault(&chunk, Fault::Slow(64 * 1024), None);
    }
    fs::write(
        w.root.join(format!(
            "{HF_DIR}/models/{GEN}/early3/early3_driving_tinygrad.pkl.chunkmanifest"
        )),
        b"2",
    )
    .unwrap();
    let done = w.download(&w.downloader(config()), &m, "early3").unwrap();
    assert!(done.origin.starts_with("GitHub"), "{}", done.origin);
    assert_eq!(w.installed("early3").unwrap(), data);
    assert!(staged(&w).is_empty(), "{:?}", staged(&w));
}
