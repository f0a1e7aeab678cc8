//! Issue 39 item 4: publish's last look at a store before its manifest reads names and sizes
//! only. Every model it just uploaded was checked (size, digest, OOB container) from the local
//! files, and every model it found there was looked at closer before the first upload; reading
//! the frame headers of each uploaded artifact again cost one HTTP range per frame on the Hub
//! (7 of the 21 s of a 256 MiB publish through the `hf` CLI in `cargo xtask bench`).

use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::*;
use artifact_store::publish::{PublishOptions, publish};
use artifact_store::retry::RetryPolicy;
use artifact_store::{FileStat, ListEntry, LocalStore, Result, Store, StorePath};
use manifest::layout::CURRENT_GENERATION;

/// A directory store that reads like a remote one (`reads_are_local` false, as the Hub) and
/// counts the reads of file contents beyond the small files.
struct Remote {
    inner: LocalStore,
    reads: AtomicUsize,
}

impl Store for Remote {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn stat(&self, path: &StorePath) -> Result<Option<FileStat>> {
        self.inner.stat(path)
    }
    fn open(&self, path: &StorePath) -> Result<Box<dyn Read + Send>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.open(path)
    }
    fn read_at(&self, path: &StorePath, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.read_at(path, offset, buf)
    }
    fn read_small(&self, path: &StorePath, limit: u64) -> Result<Option<Vec<u8>>> {
        self.inner.read_small(path, limit)
    }
    fn write_reporting(
        &self,
        path: &StorePath,
        src: &mut dyn Read,
        report: &mut dyn FnMut(artifact_store::progress::Transfer),
    ) -> Result<u64> {
        self.inner.write_reporting(path, src, report)
    }
    fn list(&self, prefix: &StorePath) -> Result<Vec<ListEntry>> {
        self.inner.list(prefix)
    }
    fn delete(&self, path: &StorePath) -> Result<bool> {
        self.inner.delete(path)
    }
}

#[test]
fn the_last_look_before_the_manifest_reads_no_artifact_bytes() {
    let t = tempfile::tempdir().unwrap();
    // 60,000 bytes in 700-byte OOB buffers: about 86 frame headers, in 60 chunks.
    let m = model("pop", 1, 60_000);
    let artifacts = artifacts_dir(t.path(), &[&m]);
    let manifest = manifest_of(vec![entry(m.id, &m.data, "Pop")]);
    let store = Remote {
        inner: LocalStore::new(t.path().join("store")),
        reads: AtomicUsize::new(0),
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
