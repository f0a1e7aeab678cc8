//! Issue 39 item 4: publish's last look at a store before its manifest reads names and sizes
//! only. Every model it just uploaded was checked (size, digest, OOB container) from the local
//! files, and every model it found there was looked at closer before the first upload; reading
//! the frame headers of each uploaded artifact again cost one HTTP range per frame on the Hub
//! (7 of the 21 s of a 256 MiB publish through the `hf` CLI in `cargo xtask bench`).

use std::sync::atomic::Ordering;

use crate::common::*;
use artifact_store::LocalStore;
use artifact_store::publish::{PublishOptions, publish};
use artifact_store::retry::RetryPolicy;
use manifest::layout::CURRENT_GENERATION;

#[test]
fn the_last_look_before_the_manifest_reads_no_artifact_bytes() {
    let t = tempfile::tempdir().unwrap();
    // 60,000 bytes in 700-byte OOB buffers: about 86 frame headers, in 60 chunks.
    let m = model("pop", 1, 60_000);
    let artifacts = artifacts_dir(t.path(), &[&m]);
    let manifest = manifest_of(vec![entry(m.id, &m.data, "Pop")]);
    // A directory store that reads like a remote one and counts the reads of file contents.
    let store = Recording {
        remote: true,
        ..Recording::new(LocalStore::new(t.path().join("store")))
    };
    let opts = PublishOptions {
        generation: CURRENT_GENERATION,
        dry_run: false,
        retry: RetryPolicy::immediate(1),
        deep_verify: false,
        contract: Default::default(),
    };
    publish(&manifest, &artifacts, &[&store], &opts, &mut |_| {}).unwrap();
    assert_eq!(read_artifact(&store.inner, m.id), m.data);
    assert_eq!(
        store.reads.load(Ordering::SeqCst),
        0,
        "publish read the bytes of an artifact it had just uploaded"
    );

    // A model found in the store (the same release again) is still looked at as a container
    // before any upload: its frame headers are read, once.
    publish(&manifest, &artifacts, &[&store], &opts, &mut |_| {}).unwrap();
    let again = store.reads.load(Ordering::SeqCst);
    assert!(again > 0, "a model found in the store was not checked");
}
