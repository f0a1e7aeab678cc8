//! Republishing changed bytes under an existing id never leaves the fleet without a consistent
//! origin (issue 16, item 6): publish finishes one store (artifacts, then the manifest) before it
//! touches the next, so at every instant at least one store's manifest matches its chunks, and a
//! device that downloads at that instant gets a verified model (old or new), never a mix.
//!
//! Shown by enumeration: the publish is interrupted after each of its store effects (every write
//! and delete, on both stores), and at each of those states both stores are checked and a real
//! device download runs against them over HTTP on 127.0.0.1.

use std::fs;
use std::io::Read;
use std::path::Path;

use crate::common::*;
use artifact_store::publish::{PublishOptions, publish};
use artifact_store::retry::RetryPolicy;
use artifact_store::{LocalStore, Store};
use downloader::{CancelToken, DownloadConfig, Downloader, Origins};
use manifest::{Generation, Manifest};
use test_support::http_server::FaultServer;

fn opts() -> PublishOptions {
    PublishOptions {
        generation: Generation::new(25),
        dry_run: false,
        retry: RetryPolicy::immediate(1),
        deep_verify: true,
        contract: Default::default(),
    }
}

/// Whether the store's live manifest matches the chunk set it holds for every listed model.
fn consistent(store: &dyn Store) -> bool {
    let Some(bytes) = store
        .read_small(&p("manifests/model_names_v25.json"), 1 << 20)
        .unwrap()
    else {
        return false;
    };
    let m = Manifest::from_slice(&bytes).unwrap();
    m.models().iter().all(|e| {
        let id = e.id().to_string();
        let name = format!("{id}_driving_tinygrad.pkl");
        let dir = format!("models/v25/{id}");
        let Some(cm) = store
            .read_small(&p(&format!("{dir}/{name}.chunkmanifest")), 10)
            .unwrap()
        else {
            return false;
        };
        let n: u32 = String::from_utf8(cm).unwrap().parse().unwrap();
        let art = e.artifact().unwrap();
        if n != art.chunk_count.get() {
            return false;
        }
        let mut data = Vec::new();
        for i in 1..=n {
            match store.open(&p(&format!("{dir}/{}", chunker::chunk_name(&name, i, n)))) {
                Ok(mut r) => {
                    r.read_to_end(&mut data).unwrap();
                }
                Err(_) => return false,
            }
        }
        chunker::Sha256Digest::of_bytes(&data) == art.sha256
    })
}

fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// Serve store `hf` as the Hugging Face origin and store `gh` (same layout on disk) as the
/// GitHub origin, whose paths are `<gen>/<id>/...` and `model_names_<gen>.json`.
fn origins_for(root: &Path, hf: &Path, gh: &Path) -> FaultServer {
    fs::create_dir_all(root.join("gh")).unwrap();
    std::os::unix::fs::symlink(hf, root.join("hf")).unwrap();
    std::os::unix::fs::symlink(gh.join("models/v25"), root.join("gh/v25")).unwrap();
    std::os::unix::fs::symlink(
        gh.join("manifests/model_names_v25.json"),
        root.join("gh/model_names_v25.json"),
    )
    .unwrap();
    FaultServer::start(root).unwrap()
}

#[test]
fn a_republish_with_changed_bytes_keeps_one_origin_consistent_at_every_kill_point() {
    let t = tempfile::tempdir().unwrap();
    let old = model("pop223", 1, 2500);
    let new = model("pop223", 2, 3100);
    let other = model("wm9", 3, 900);
    let old_m = manifest_of(vec![
        entry("pop223", &old.data, "Pop"),
        entry("wm9", &other.data, "WM 9"),
    ]);
    let new_m = manifest_of(vec![
        entry("pop223", &new.data, "Pop"),
        entry("wm9", &other.data, "WM 9"),
    ]);
    // Both stores hold the old release.
    let base = t.path().join("base");
    let old_dir = artifacts_dir(&t.path().join("old"), &[&old, &other]);
    let (hf0, gh0) = (base.join("hf"), base.join("gh"));
    publish(
        &old_m,
        &old_dir,
        &[&LocalStore::new(&hf0), &LocalStore::new(&gh0)],
        &opts(),
        &mut |_| {},
    )
    .unwrap();
    let new_dir = artifacts_dir(&t.path().join("new"), &[&new]);

    // How many effects the whole republish has on each store.
    let full = t.path().join("full");
    copy_tree(&base, &full);
    let (a, b) = (
        Recording::killable(LocalStore::new(full.join("hf")), None),
        Recording::killable(LocalStore::new(full.join("gh")), None),
    );
    publish(&new_m, &new_dir, &[&a, &b], &opts(), &mut |_| {}).unwrap();
    let (na, nb) = (a.writes().len() as u32, b.writes().len() as u32);
    assert!(na >= 6 && na == nb, "{na} {nb}");

    let mut states = 0;
    for k in 0..=(na + nb) {
        let dir = t.path().join(format!("k{k}"));
        copy_tree(&base, &dir);
        let (hf, gh) = (dir.join("hf"), dir.join("gh"));
        let (budget_a, budget_b) = if k < na {
            (Some(k), Some(0))
        } else {
            (None, Some(k - na))
        };
        let a = Recording::killable(LocalStore::new(&hf), budget_a);
        let b = Recording::killable(LocalStore::new(&gh), budget_b);
        let res = publish(&new_m, &new_dir, &[&a, &b], &opts(), &mut |_| {});
        assert_eq!(res.is_ok(), k == na + nb, "kill point {k}");
        let (ca, cb) = (
            consistent(&LocalStore::new(&hf)),
            consistent(&LocalStore::new(&gh)),
        );
        assert!(
            ca || cb,
            "kill point {k}: no consistent origin (hf {ca}, github {cb})"
        );
        if k < na {
            assert!(
                cb,
                "kill point {k}: GitHub was touched before Hugging Face was done"
            );
        }

        // A device refreshing at this instant: an old copy installed, the manifest from the
        // first origin that serves one, the model from the first origin whose chunks match it.
        let srv_root = t.path().join(format!("srv{k}"));
        let server = origins_for(&srv_root, &hf, &gh);
        let url = server.url();
        let d = Downloader::new(
            Origins::new(&format!("{url}/hf"), &format!("{url}/gh")),
            DownloadConfig {
                backoff_base: std::time::Duration::from_millis(1),
                backoff_max: std::time::Duration::from_millis(2),
                max_attempts: 2,
                space_margin: 0,
                ..DownloadConfig::default()
            },
        );
        let models = t.path().join(format!("device{k}"));
        fs::create_dir_all(&models).unwrap();
        fs::write(models.join("pop223_driving_tinygrad.pkl"), &old.data).unwrap();
        let fetched = d.fetch_manifest(Generation::new(25)).unwrap();
        let entry = fetched.manifest.get(&"pop223".parse().unwrap()).unwrap();
        let done = d
            .download(
                Generation::new(25),
                entry,
                &models,
                &CancelToken::new(),
                &|_| {},
            )
            .unwrap_or_else(|e| panic!("kill point {k}: the device got no model: {e}"));
        let got = fs::read(models.join("pop223_driving_tinygrad.pkl")).unwrap();
        assert!(
            got == old.data || got == new.data,
            "kill point {k}: a mix was installed"
        );
        assert_eq!(
            done.sha256,
            entry.artifact().unwrap().sha256,
            "kill point {k}"
        );
        states += 1;
    }
    assert_eq!(states, na + nb + 1);
}
