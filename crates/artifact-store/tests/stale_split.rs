//! A republish that changes a model's split (3 chunks, then 2) leaves no chunk of the older
//! split in any store (issue 26 item 3): in a directory, a `github:` checkout with a bare
//! origin, and a Hub bucket through the real `hf` CLI. The older chunks go only after the new
//! manifest is written there, never before (a device that fetched the old manifest still finds
//! them until then), and a run interrupted between the two finishes the removal on rerun.

use std::fs;

use crate::common::*;
use artifact_store::publish::{Event, PublishOptions, Step, publish};
use artifact_store::retry::RetryPolicy;
use artifact_store::{GithubStore, HfBucketStore, LocalStore, Store};
use manifest::{Generation, Manifest};
use test_support::release_stores::GitRemote;

fn opts(dry_run: bool) -> PublishOptions {
    PublishOptions {
        generation: Generation::new(25),
        dry_run,
        retry: RetryPolicy::immediate(1),
        deep_verify: false,
        contract: Default::default(),
    }
}

const NAME: &str = "pop223_driving_tinygrad.pkl";

/// The first release (2500 bytes: three chunks) and the second (1800 bytes: two), each as an
/// artifacts directory and its manifest.
fn releases(dir: &std::path::Path) -> [(std::path::PathBuf, Manifest, Vec<u8>); 2] {
    [(1, 2500), (2, 1800)].map(|(seed, len)| {
        let m = model("pop223", seed, len);
        let d = artifacts_dir(&dir.join(format!("r{seed}")), &[&m]);
        let manifest = manifest_of(vec![entry("pop223", &m.data, "Pop")]);
        (d, manifest, m.data)
    })
}

/// The file names the store holds for pop223.
fn names(store: &dyn Store) -> Vec<String> {
    store
        .list(&p("models/v25/pop223"))
        .unwrap()
        .into_iter()
        .map(|e| e.path.file_name().to_string())
        .collect()
}

fn new_set() -> Vec<String> {
    let mut v = vec![
        format!("{NAME}.chunk01of02"),
        format!("{NAME}.chunk02of02"),
        format!("{NAME}.chunkmanifest"),
        format!("{NAME}.sha256"),
    ];
    v.sort();
    v
}

fn old_chunks() -> Vec<String> {
    (1..=3)
        .map(|i| format!("models/v25/pop223/{NAME}.chunk0{i}of03"))
        .collect()
}

/// Republish with a changed split, recording events; the `Removed` events of the older chunks
/// come after the manifest's `ManifestWritten`.
fn republish_and_check_order(store: &dyn Store, dir: &std::path::Path, m: &Manifest) {
    let mut events = Vec::new();
    publish(m, dir, &[store], &opts(false), &mut |e| {
        events.push(e.clone())
    })
    .unwrap();
    let written = events
        .iter()
        .position(|e| {
            matches!(e, Event::ManifestWritten { path, .. } | Event::ManifestUnchanged { path, .. }
                if path.ends_with("model_names_v25.json"))
        })
        .expect("the manifest is live");
    let removed: Vec<(usize, String)> = events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            Event::Removed { path, .. } if path.contains("of03") => Some((i, path.clone())),
            _ => None,
        })
        .collect();
    let removed_after: Vec<_> = removed
        .iter()
        .filter(|(i, p)| *i > written && !p.ends_with("chunkmanifest"))
        .map(|(_, p)| p.clone())
        .collect();
    assert_eq!(removed_after, old_chunks(), "{events:?}");
    assert!(
        removed
            .iter()
            .all(|(i, p)| *i > written || p.ends_with(".chunkmanifest")),
        "no old chunk removed before the manifest: {events:?}"
    );
}

#[test]
fn a_directory_store_drops_the_older_split_after_the_manifest_and_resumes_the_removal() {
    let t = tempfile::tempdir().unwrap();
    let [(d1, m1, _), (d2, m2, data2)] = releases(t.path());
    let root = t.path().join("store");
    let store = LocalStore::new(root.clone());
    publish(&m1, &d1, &[&store], &opts(false), &mut |_| {}).unwrap();
    assert_eq!(names(&store).len(), 5);

    // The dry run names the removals and changes nothing.
    let before = fs::read_dir(root.join("models/v25/pop223"))
        .unwrap()
        .count();
    let plan = publish(&m2, &d2, &[&store], &opts(true), &mut |_| {}).unwrap();
    let stale: Vec<&str> = plan.stores[0]
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::RemoveStale { path } => Some(path.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(stale, old_chunks());
    assert_eq!(
        fs::read_dir(root.join("models/v25/pop223"))
            .unwrap()
            .count(),
        before
    );
    let v = serde_json::to_value(&plan).unwrap();
    assert!(
        v["stores"][0]["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["action"] == "remove_stale"),
        "{v}"
    );

    // Interrupted right after the manifest: the new release is live, the old chunks still
    // there; the rerun removes them.
    let writes_to_manifest = {
        let probe = Recording::new(LocalStore::new(t.path().join("probe")));
        publish(&m1, &d1, &[&probe], &opts(false), &mut |_| {}).unwrap();
        let rec = Recording::killable(LocalStore::new(t.path().join("probe")), None);
        publish(&m2, &d2, &[&rec], &opts(false), &mut |_| {}).unwrap();
        let w = rec.writes();
        w.iter()
            .position(|l| l.ends_with("manifests/model_names_v25.json"))
            .unwrap() as u32
            + 1
    };
    let killed = Recording::killable(LocalStore::new(root.clone()), Some(writes_to_manifest));
    publish(&m2, &d2, &[&killed], &opts(false), &mut |_| {}).unwrap_err();
    assert_eq!(
        store
            .read_small(&p("manifests/model_names_v25.json"), 1 << 20)
            .unwrap()
            .unwrap(),
        m2.to_canonical_bytes()
    );
    assert!(names(&store).contains(&format!("{NAME}.chunk01of03")));
    assert_eq!(read_artifact(&store, "pop223"), data2);

    republish_and_check_order(&Recording::new(LocalStore::new(root.clone())), &d2, &m2);
    assert_eq!(names(&store), new_set());
    assert_eq!(read_artifact(&store, "pop223"), data2);
}

#[test]
fn a_github_store_drops_the_older_split_after_the_manifest() {
    let t = tempfile::tempdir().unwrap();
    let [(d1, m1, _), (d2, m2, data2)] = releases(t.path());
    let remote = GitRemote::new(&t.path().join("git"), "Models", None);
    let gh = GithubStore::open(&remote.checkout, "Models").unwrap();
    publish(&m1, &d1, &[&gh], &opts(false), &mut |_| {}).unwrap();
    let gh = GithubStore::open(&remote.checkout, "Models").unwrap();
    republish_and_check_order(&gh, &d2, &m2);
    assert_eq!(names(&gh), new_set());
    assert_eq!(read_artifact(&gh, "pop223"), data2);
    let subjects = remote.remote_subjects();
    let manifest_at = subjects
        .iter()
        .rposition(|s| s == "Publish model_names_v25.json")
        .unwrap();
    let removals: Vec<&String> = subjects[manifest_at + 1..].iter().collect();
    assert_eq!(
        removals,
        (1..=3)
            .map(|i| format!("Remove v25/pop223/{NAME}.chunk0{i}of03"))
            .collect::<Vec<_>>()
            .iter()
            .collect::<Vec<_>>(),
        "{subjects:?}"
    );
    assert!(
        !remote
            .checkout
            .join(format!("v25/pop223/{NAME}.chunk01of03"))
            .exists()
    );
}

#[test]
fn a_hub_bucket_drops_the_older_split_after_the_manifest_through_the_real_hf_cli() {
    use test_support::hub::{HubConfig, HubEmulator, HubOp, real_hf_cli};
    let Some(cli) = real_hf_cli() else { return };
    let t = tempfile::tempdir().unwrap();
    let [(d1, m1, _), (d2, m2, data2)] = releases(t.path());
    let emu = HubEmulator::start(HubConfig::default()).unwrap();
    let bucket = "StarPilot-Driving/StarPilot-Resources";
    emu.create_bucket(bucket);
    let config = artifact_store::HfConfig {
        endpoint: emu.url(),
        token: Some(emu.token().to_string()),
        cli,
        timeout: std::time::Duration::from_secs(20),
    };
    let hub = HfBucketStore::new(bucket, config).unwrap();
    publish(&m1, &d1, &[&hub], &opts(false), &mut |_| {}).unwrap();
    emu.clear_log();
    republish_and_check_order(&hub, &d2, &m2);
    assert_eq!(names(&hub), new_set());
    assert_eq!(read_artifact(&hub, "pop223"), data2);
    // At the Hub itself: the deletes of the older chunks are the last operations, after the
    // manifest's upload.
    let ops = emu.ops();
    let manifest_at = ops
        .iter()
        .position(
            |o| matches!(o, HubOp::Add { path, .. } if path == "manifests/model_names_v25.json"),
        )
        .unwrap();
    let after: Vec<String> = ops[manifest_at + 1..]
        .iter()
        .map(|o| match o {
            HubOp::Delete { path, .. } => path.clone(),
            other => panic!("after the manifest only deletes: {other:?}"),
        })
        .collect();
    assert_eq!(after, old_chunks());
}
