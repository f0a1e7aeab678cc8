//! Issue 39 item 4: publish's last look at a store before its manifest reads names and sizes
//! only. Every model it just uploaded was checked (size, digest, OOB container) from the local
//! files, and every model it found there was looked at closer before the first upload; reading
//! the frame headers of each uploaded artifact again cost one HTTP range per frame on the Hub
//! (7 of the 21 s of a 256 MiB publish through the `hf` CLI in `cargo xtask bench`).

use std::sync::atomic::Ordering;

use crate::common::*;
use artifact_store::publish::{PublishOptions, publish};
use artifact_store::retry::RetryPolicy;
use artifact_store::{LocalStore, Store};
use manifest::layout::CURRENT_GENERATION;

/// What every publish here asks for: the current generation, one try, no deep verification.
fn opts() -> PublishOptions {
    PublishOptions {
        generation: CURRENT_GENERATION,
        dry_run: false,
        retry: RetryPolicy::immediate(1),
        deep_verify: false,
        contract: Default::default(),
    }
}

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
    let opts = opts();
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

/// Issue 39 item 2: `rebuild --upload-to` uploads a model's files through publish's step 1 and
/// never a manifest; publish, told what the upload recorded, does not read those files back
/// (on the Hub, a download of each) and uploads nothing again.
#[test]
fn recorded_uploads_are_not_read_back_and_an_upload_writes_no_manifest() {
    use artifact_store::publish::{
        KnownFiles, SignatureAction, prepare_local, publish_known, upload_artifacts,
    };
    let t = tempfile::tempdir().unwrap();
    let m = model("pop", 1, 60_000);
    let artifacts = artifacts_dir(t.path(), &[&m]);
    let manifest = manifest_of(vec![entry(m.id, &m.data, "Pop")]);
    let store = Recording {
        remote: true,
        ..Recording::new(LocalStore::new(t.path().join("store")))
    };
    let local = prepare_local(&artifacts, &manifest).unwrap();
    let up = upload_artifacts(
        &store,
        &local,
        CURRENT_GENERATION,
        RetryPolicy::immediate(1),
        &mut |_| {},
    )
    .unwrap();
    assert!(up.uploaded_files > 2, "{up:?}");
    assert_eq!(read_artifact(&store.inner, m.id), m.data);
    let manifest_path = manifest::StoreLayout::HfBucket.manifest_path(CURRENT_GENERATION);
    assert_eq!(store.inner.stat(&manifest_path).unwrap(), None);
    let known: KnownFiles = local[0]
        .files
        .iter()
        .map(|f| (format!("models/v25/pop/{}", f.name), (f.size, f.sha256)))
        .collect();
    let opts = opts();
    let before = store.reads.load(Ordering::SeqCst);
    let report = publish_known(
        &manifest,
        &artifacts,
        &[&store],
        &opts,
        SignatureAction::Unsigned,
        &[known],
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(report.stores[0].uploaded_files, 0, "uploaded again");
    assert_eq!(report.stores[0].skipped_files, local[0].files.len());
    assert_eq!(report.stores[0].manifest, "written");
    assert_eq!(store.reads.load(Ordering::SeqCst), before, "read back");
    // Without the record, the same publish reads the files back to hash them.
    publish(&manifest, &artifacts, &[&store], &opts, &mut |_| {}).unwrap();
    assert!(store.reads.load(Ordering::SeqCst) > before);
}

/// An upload outside publish never replaces what a store holds under the artifact's name
/// (perhaps live): refused whole, before anything is written.
#[test]
fn an_upload_never_replaces_files_the_store_holds() {
    use artifact_store::publish::{prepare_local, upload_artifacts};
    let t = tempfile::tempdir().unwrap();
    let old = model("pop", 1, 6_000);
    let manifest = manifest_of(vec![entry(old.id, &old.data, "Pop")]);
    let store = LocalStore::new(t.path().join("store"));
    let opts = opts();
    let first = artifacts_dir(&t.path().join("old"), &[&old]);
    publish(&manifest, &first, &[&store], &opts, &mut |_| {}).unwrap();
    let new = model("pop", 2, 6_000);
    let changed = manifest_of(vec![entry(new.id, &new.data, "Pop")]);
    let second = artifacts_dir(&t.path().join("new"), &[&new]);
    let local = prepare_local(&second, &changed).unwrap();
    let e = upload_artifacts(
        &store,
        &local,
        CURRENT_GENERATION,
        RetryPolicy::immediate(1),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("only publish"), "{e}");
    assert_eq!(read_artifact(&store, old.id), old.data);
}

/// A record older than what the store holds does not stand for it: another publish since the
/// record (another pin's bytes at the same sizes, here one that stopped after its chunks, the
/// chunk manifest retracted, or one that finished) changed the chunks under the record's word.
/// Publish, told the stale record, finds that out from the chunk set's small files and uploads
/// the manifest's bytes again rather than listing them over other bytes.
#[test]
fn a_stale_record_does_not_stand_for_a_chunk_set_replaced_since() {
    use artifact_store::publish::{
        FileSource, KnownFiles, SignatureAction, prepare_local, publish_known, upload_artifacts,
    };
    for finished in [false, true] {
        let t = tempfile::tempdir().unwrap();
        let ours = model("pop", 1, 60_000);
        let other = model("pop", 2, 60_000);
        let artifacts = artifacts_dir(&t.path().join("ours"), &[&ours]);
        let manifest = manifest_of(vec![entry(ours.id, &ours.data, "Pop")]);
        let store = Recording {
            remote: true,
            ..Recording::new(LocalStore::new(t.path().join("store")))
        };
        let local = prepare_local(&artifacts, &manifest).unwrap();
        upload_artifacts(
            &store,
            &local,
            CURRENT_GENERATION,
            RetryPolicy::immediate(1),
            &mut |_| {},
        )
        .unwrap();
        let known: KnownFiles = local[0]
            .files
            .iter()
            .map(|f| (format!("models/v25/pop/{}", f.name), (f.size, f.sha256)))
            .collect();
        // Another publish: the chunk manifest retracted, the other chunks (same sizes), then,
        // when it finished, the sidecar and the chunk manifest.
        let theirs = prepare_local(
            &artifacts_dir(&t.path().join("theirs"), &[&other]),
            &manifest_of(vec![entry(other.id, &other.data, "Pop")]),
        )
        .unwrap();
        let cm = theirs[0].files.last().unwrap();
        store
            .inner
            .delete(&p(&format!("models/v25/pop/{}", cm.name)))
            .unwrap();
        for f in theirs[0].files.iter() {
            let is_chunk = f.role == artifact_store::publish::FileRole::Chunk;
            let path = p(&format!("models/v25/pop/{}", f.name));
            match &f.source {
                FileSource::Path(src) if is_chunk => store.inner.write_file(&path, src),
                FileSource::Bytes(b) if finished && !is_chunk => store.inner.write_bytes(&path, b),
                FileSource::Path(src) if finished => store.inner.write_file(&path, src),
                _ => continue,
            }
            .unwrap();
        }
        let opts = opts();
        let report = publish_known(
            &manifest,
            &artifacts,
            &[&store],
            &opts,
            SignatureAction::Unsigned,
            &[known],
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(report.stores[0].manifest, "written");
        assert_eq!(
            read_artifact(&store.inner, ours.id),
            ours.data,
            "finished {finished}: the manifest lists bytes the store does not hold"
        );
    }
}

/// A plain file (v25's accelerator variants are one) has no chunk manifest to retract before
/// it changes: an upload outside publish that finds other bytes under its name (the live
/// variant, here rebuilt to other bytes) is refused whole and leaves the live file as it is.
#[test]
fn an_upload_never_overwrites_a_plain_file_the_store_holds() {
    use artifact_store::publish::{prepare_local, upload_artifacts};
    let t = tempfile::tempdir().unwrap();
    let m = model("pop", 1, 6_000);
    let variant = |seed| {
        let data = bytes(seed, 1_800);
        let mut e = entry(m.id, &m.data, "Pop");
        e["accelerator_artifacts"] = serde_json::json!({"chestnut": {
            "artifact_format": "tinygrad_single_v1",
            "artifact_filename": "pop_driving_chestnut_tinygrad.pkl",
            "artifact_size": data.len(),
            "artifact_sha256": chunker::Sha256Digest::of_bytes(&data).to_hex(),
            "artifact_chunk_count": 0,
            "execution_device": "AMD"
        }});
        let dir = artifacts_dir(&t.path().join(format!("v{seed}")), &[&m]);
        std::fs::write(dir.join("pop/pop_driving_chestnut_tinygrad.pkl"), &data).unwrap();
        (manifest_of(vec![e]), dir, data)
    };
    let store = LocalStore::new(t.path().join("store"));
    let opts = opts();
    let (live, first, live_variant) = variant(31);
    publish(&live, &first, &[&store], &opts, &mut |_| {}).unwrap();
    let (rebuilt, second, _) = variant(32);
    let local = prepare_local(&second, &rebuilt).unwrap();
    let e = upload_artifacts(
        &store,
        &local,
        CURRENT_GENERATION,
        RetryPolicy::immediate(1),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("only publish"), "{e}");
    let path = p("models/v25/pop/pop_driving_chestnut_tinygrad.pkl");
    assert_eq!(
        store.read_small(&path, 10_000).unwrap().unwrap(),
        live_variant
    );
}
