//! Publish against a real local directory and a real git bare repository as `origin`.

use std::fs;

use crate::common::*;
use artifact_store::publish::{PublishOptions, StoreProblem, StoreProblemKind, publish};
use artifact_store::retry::RetryPolicy;
use artifact_store::{Error, GithubStore, LocalStore, Store};
use manifest::Generation;
use test_support::release_stores::{GitRemote, git};

fn opts(dry_run: bool) -> PublishOptions {
    PublishOptions {
        generation: Generation::new(25),
        dry_run,
        retry: RetryPolicy::immediate(3),
        deep_verify: true,
        contract: Default::default(),
    }
}

#[test]
fn publish_to_a_local_store_writes_in_order_and_a_second_run_uploads_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (model("pop223", 1, 2500), model("wm9", 2, 900));
    let dir = artifacts_dir(t.path(), &[&a, &b]);
    let m = manifest_of(vec![
        entry("pop223", &a.data, "Pop"),
        entry("wm9", &b.data, "WM 9"),
    ]);
    let store = Recording::new(LocalStore::new(t.path().join("store")));

    let rep = publish(&m, &dir, &[&store], &opts(false), &mut |_| {}).unwrap();
    assert_eq!(rep.stores[0].manifest, "written");
    assert!(rep.stores[0].first_publish);
    assert_eq!(
        store.writes(),
        [
            "write models/v25/pop223/pop223_driving_tinygrad.pkl.chunk01of03",
            "write models/v25/pop223/pop223_driving_tinygrad.pkl.chunk02of03",
            "write models/v25/pop223/pop223_driving_tinygrad.pkl.chunk03of03",
            "write models/v25/pop223/pop223_driving_tinygrad.pkl.sha256",
            "write models/v25/pop223/pop223_driving_tinygrad.pkl.chunkmanifest",
            "write models/v25/wm9/wm9_driving_tinygrad.pkl.chunk01of01",
            "write models/v25/wm9/wm9_driving_tinygrad.pkl.sha256",
            "write models/v25/wm9/wm9_driving_tinygrad.pkl.chunkmanifest",
            "write manifests/model_names_v25.json",
        ]
    );
    assert_eq!(read_artifact(&store, "pop223"), a.data);
    let sidecar = store
        .read_small(
            &p("models/v25/pop223/pop223_driving_tinygrad.pkl.sha256"),
            200,
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        String::from_utf8(sidecar).unwrap(),
        format!(
            "{}  pop223_driving_tinygrad.pkl\n",
            chunker::Sha256Digest::of_bytes(&a.data)
        )
    );
    let live = store
        .read_small(&p("manifests/model_names_v25.json"), 1 << 20)
        .unwrap()
        .unwrap();
    assert_eq!(live, m.to_canonical_bytes());

    let again = Recording::new(LocalStore::new(t.path().join("store")));
    let rep = publish(&m, &dir, &[&again], &opts(false), &mut |_| {}).unwrap();
    assert!(again.writes().is_empty(), "{:?}", again.writes());
    assert_eq!(rep.stores[0].uploaded_files, 0);
    assert_eq!(rep.stores[0].manifest, "unchanged");
}

#[test]
fn an_interrupted_publish_resumes_without_re_uploading() {
    let t = tempfile::tempdir().unwrap();
    let a = model("pop223", 3, 2500);
    let dir = artifacts_dir(t.path(), &[&a]);
    let m = manifest_of(vec![entry("pop223", &a.data, "Pop")]);
    let root = t.path().join("store");

    let first = Recording::new(LocalStore::new(&root));
    *first.budget.lock().unwrap() = Some(2);
    let err = publish(&m, &dir, &[&first], &opts(false), &mut |_| {}).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("models/v25/pop223/pop223_driving_tinygrad.pkl.chunk03of03")
            && msg.contains("3 attempts"),
        "{msg}"
    );
    assert_eq!(first.writes().len(), 2);
    assert!(
        LocalStore::new(&root)
            .stat(&p("manifests/model_names_v25.json"))
            .unwrap()
            .is_none()
    );

    let second = Recording::new(LocalStore::new(&root));
    publish(&m, &dir, &[&second], &opts(false), &mut |_| {}).unwrap();
    assert_eq!(
        second.writes(),
        [
            "write models/v25/pop223/pop223_driving_tinygrad.pkl.chunk03of03",
            "write models/v25/pop223/pop223_driving_tinygrad.pkl.sha256",
            "write models/v25/pop223/pop223_driving_tinygrad.pkl.chunkmanifest",
            "write manifests/model_names_v25.json",
        ]
    );
    assert_eq!(read_artifact(&second, "pop223"), a.data);
}

#[test]
fn transient_failures_are_retried() {
    let t = tempfile::tempdir().unwrap();
    let a = model("pop223", 4, 500);
    let dir = artifacts_dir(t.path(), &[&a]);
    let m = manifest_of(vec![entry("pop223", &a.data, "Pop")]);
    let store = Recording::new(LocalStore::new(t.path().join("store")));
    *store.transient.lock().unwrap() = 2;
    let mut retries = 0;
    publish(&m, &dir, &[&store], &opts(false), &mut |e| {
        if matches!(e, artifact_store::publish::Event::Retrying { .. }) {
            retries += 1
        }
    })
    .unwrap();
    assert_eq!(retries, 2);
    assert_eq!(read_artifact(&store, "pop223"), a.data);
}

#[test]
fn a_changed_chunk_retracts_the_chunk_manifest_first() {
    let t = tempfile::tempdir().unwrap();
    let a = model("pop223", 5, 2500);
    let dir = artifacts_dir(t.path(), &[&a]);
    let m = manifest_of(vec![entry("pop223", &a.data, "Pop")]);
    let root = t.path().join("store");
    publish(
        &m,
        &dir,
        &[&LocalStore::new(&root)],
        &opts(false),
        &mut |_| {},
    )
    .unwrap();
    // Corrupt one stored chunk (same size, other bytes).
    let chunk = root.join("models/v25/pop223/pop223_driving_tinygrad.pkl.chunk02of03");
    fs::write(&chunk, vec![0u8; 1000]).unwrap();
    let store = Recording::new(LocalStore::new(&root));
    publish(&m, &dir, &[&store], &opts(false), &mut |_| {}).unwrap();
    assert_eq!(
        store.writes(),
        [
            "delete models/v25/pop223/pop223_driving_tinygrad.pkl.chunkmanifest",
            "write models/v25/pop223/pop223_driving_tinygrad.pkl.chunk02of03",
            "write models/v25/pop223/pop223_driving_tinygrad.pkl.chunkmanifest",
        ]
    );
    assert_eq!(read_artifact(&store, "pop223"), a.data);
}

#[test]
fn a_listed_model_missing_everywhere_is_refused_before_the_manifest() {
    let t = tempfile::tempdir().unwrap();
    let (a, ghost) = (model("pop223", 6, 500), model("ghost", 7, 500));
    let dir = artifacts_dir(t.path(), &[&a]);
    let m = manifest_of(vec![
        entry("pop223", &a.data, "Pop"),
        entry("ghost", &ghost.data, "Ghost"),
    ]);
    let store = Recording::new(LocalStore::new(t.path().join("store")));
    let err = publish(&m, &dir, &[&store], &opts(false), &mut |_| {}).unwrap_err();
    assert!(
        matches!(&err, Error::Incomplete { problems, .. } if matches!(
            problems.as_slice(),
            [StoreProblem { model, kind: StoreProblemKind::ChunkManifestMissing { .. } }]
                if model.as_str() == "ghost"
        )),
        "{err}"
    );
    assert!(err.to_string().contains("model ghost"), "{err}");
    assert!(!store.writes().iter().any(|w| w.contains("manifests/")));
}

/// Regression: a chunk corrupted in place (same size) in a local store passed the completeness
/// check, because only the sidecar was compared unless --deep-verify was given.
#[test]
fn a_corrupt_chunk_already_in_a_local_store_is_refused_without_deep_verify() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (model("pop223", 11, 2500), model("tr14223", 12, 2500));
    let root = t.path().join("store");
    let shallow = PublishOptions {
        deep_verify: false,
        ..opts(false)
    };
    let both = artifacts_dir(t.path(), &[&a, &b]);
    let m = manifest_of(vec![
        entry("pop223", &a.data, "Pop"),
        entry("tr14223", &b.data, "TR14"),
    ]);
    publish(&m, &both, &[&LocalStore::new(&root)], &shallow, &mut |_| {}).unwrap();

    let chunk = root.join("models/v25/tr14223/tr14223_driving_tinygrad.pkl.chunk02of03");
    let mut bad = fs::read(&chunk).unwrap();
    bad[0] ^= 0xff;
    fs::write(&chunk, bad).unwrap();

    // Only pop223 is released this time; tr14223 must be found wrong where it lies.
    let only_a = t.path().join("only-a");
    fs::create_dir_all(only_a.join("pop223")).unwrap();
    for f in fs::read_dir(both.join("pop223")).unwrap() {
        let f = f.unwrap();
        fs::copy(f.path(), only_a.join("pop223").join(f.file_name())).unwrap();
    }
    let m2 = manifest_of(vec![
        entry("pop223", &a.data, "Pop 2"),
        entry("tr14223", &b.data, "TR14"),
    ]);
    let live_before = fs::read(root.join("manifests/model_names_v25.json")).unwrap();
    let store = Recording::new(LocalStore::new(&root));
    let err = publish(&m2, &only_a, &[&store], &shallow, &mut |_| {}).unwrap_err();
    assert!(
        matches!(&err, Error::Incomplete { problems, .. } if matches!(
            problems.as_slice(),
            [StoreProblem { model, kind: StoreProblemKind::Corrupt { .. } }]
                if model.as_str() == "tr14223"
        )),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("model tr14223") && msg.contains("SHA-256"),
        "{msg}"
    );
    assert!(!msg.contains("model pop223"), "{msg}");
    assert!(!store.writes().iter().any(|w| w.contains("manifests/")));
    assert_eq!(
        fs::read(root.join("manifests/model_names_v25.json")).unwrap(),
        live_before
    );
}

#[test]
fn a_wrong_artifact_in_the_directory_is_refused_before_any_upload() {
    let t = tempfile::tempdir().unwrap();
    let a = model("pop223", 8, 1500);
    let dir = artifacts_dir(t.path(), &[&a]);
    let mut wrong = a.data.clone();
    wrong[0] ^= 1;
    let m = manifest_of(vec![entry("pop223", &wrong, "Pop")]);
    let store = Recording::new(LocalStore::new(t.path().join("store")));
    let err = publish(&m, &dir, &[&store], &opts(false), &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("SHA-256 mismatch"), "{err}");
    assert!(store.writes().is_empty());
}

#[test]
fn the_guard_names_every_unrelated_change_and_nothing_is_written() {
    let t = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        model("pop223", 9, 500),
        model("wm9", 10, 500),
        model("keep", 11, 500),
    );
    let root = t.path().join("store");
    // First release: all three.
    let dir1 = artifacts_dir(&t.path().join("one"), &[&a, &b, &c]);
    let m1 = manifest_of(vec![
        entry("pop223", &a.data, "Pop"),
        entry("wm9", &b.data, "WM 9"),
        entry("keep", &c.data, "Keep"),
    ]);
    publish(
        &m1,
        &dir1,
        &[&LocalStore::new(&root)],
        &opts(false),
        &mut |_| {},
    )
    .unwrap();
    // Second release rebuilds pop223 only, but the manifest also renames wm9 and drops keep.
    let a2 = model("pop223", 12, 700);
    let dir2 = artifacts_dir(&t.path().join("two"), &[&a2]);
    let m2 = manifest_of(vec![
        entry("pop223", &a2.data, "Pop"),
        entry("wm9", &b.data, "WM Nine"),
    ]);
    let store = Recording::new(LocalStore::new(&root));
    let err = publish(&m2, &dir2, &[&store], &opts(false), &mut |_| {}).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Guard { .. }), "{msg}");
    assert!(
        msg.contains("wm9") && msg.contains("name") && msg.contains("keep"),
        "{msg}"
    );
    // The refusal says what to do about it.
    let next = cli_support::NextStep::next_step(&err).unwrap_or_default();
    assert!(
        next.starts_with("give each model meant to change an <id>/ directory"),
        "{msg}\nnext: {next}"
    );
    assert!(!store.writes().iter().any(|w| w.contains("manifests/")));
    let live = LocalStore::new(&root)
        .read_small(&p("manifests/model_names_v25.json"), 1 << 20)
        .unwrap()
        .unwrap();
    assert_eq!(live, m1.to_canonical_bytes());
}

#[test]
fn dry_run_plans_and_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let a = model("pop223", 13, 1500);
    let dir = artifacts_dir(t.path(), &[&a]);
    let m = manifest_of(vec![entry("pop223", &a.data, "Pop")]);
    let root = t.path().join("store");
    let store = Recording::new(LocalStore::new(&root));
    let rep = publish(&m, &dir, &[&store], &opts(true), &mut |_| {}).unwrap();
    assert!(store.writes().is_empty());
    assert!(!root.exists());
    assert_eq!(rep.stores[0].manifest, "would_write");
    assert_eq!(rep.stores[0].steps.len(), 4);
}

#[test]
fn github_store_refuses_a_checkout_it_must_not_touch() {
    let t = tempfile::tempdir().unwrap();
    let remote = GitRemote::new(t.path(), "Models", None);
    assert!(GithubStore::open(&remote.checkout, "Models").is_ok());

    // Another branch.
    git(&remote.checkout, &["checkout", "--quiet", "-b", "other"]);
    let e = GithubStore::open(&remote.checkout, "Models")
        .unwrap_err()
        .to_string();
    assert!(e.contains("on branch \"other\""), "{e}");
    git(&remote.checkout, &["checkout", "--quiet", "Models"]);

    // Dirty.
    fs::write(remote.checkout.join("stray.txt"), "x").unwrap();
    let e = GithubStore::open(&remote.checkout, "Models")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("uncommitted changes") && e.contains("stray.txt"),
        "{e}"
    );
    fs::remove_file(remote.checkout.join("stray.txt")).unwrap();

    // Behind origin: someone else pushed.
    let other = t.path().join("other");
    git(
        t.path(),
        &[
            "clone",
            "--quiet",
            "-b",
            "Models",
            remote.bare.to_str().unwrap(),
            other.to_str().unwrap(),
        ],
    );
    git(&other, &["config", "user.name", "x"]);
    git(&other, &["config", "user.email", "x@example.invalid"]);
    fs::write(other.join("b.txt"), "b").unwrap();
    git(&other, &["add", "b.txt"]);
    git(&other, &["commit", "--quiet", "-m", "b"]);
    git(&other, &["push", "--quiet", "origin", "Models"]);
    let e = GithubStore::open(&remote.checkout, "Models")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("1 commit(s) behind") && e.contains("\"b\" is not one"),
        "{e}"
    );
    git(&remote.checkout, &["pull", "--quiet", "--ff-only"]);

    // Ahead of origin: a local commit not pushed.
    fs::write(remote.checkout.join("c.txt"), "c").unwrap();
    git(&remote.checkout, &["add", "c.txt"]);
    git(&remote.checkout, &["commit", "--quiet", "-m", "c"]);
    let e = GithubStore::open(&remote.checkout, "Models")
        .unwrap_err()
        .to_string();
    assert!(e.contains("1 commit(s) ahead"), "{e}");
}

#[test]
fn publish_to_github_is_one_commit_and_push_per_file_manifest_last() {
    let t = tempfile::tempdir().unwrap();
    let remote = GitRemote::new(t.path(), "Models", None);
    let a = model("pop223", 14, 1500);
    let dir = artifacts_dir(t.path(), &[&a]);
    let m = manifest_of(vec![entry("pop223", &a.data, "Pop")]);
    let store = GithubStore::open(&remote.checkout, "Models").unwrap();
    publish(&m, &dir, &[&store], &opts(false), &mut |_| {}).unwrap();
    assert_eq!(
        remote.remote_files_per_commit(),
        [
            vec!["v25/pop223/pop223_driving_tinygrad.pkl.chunk01of02"],
            vec!["v25/pop223/pop223_driving_tinygrad.pkl.chunk02of02"],
            vec!["v25/pop223/pop223_driving_tinygrad.pkl.sha256"],
            vec!["v25/pop223/pop223_driving_tinygrad.pkl.chunkmanifest"],
            vec!["model_names_v25.json"],
        ]
    );
    // The remote branch holds exactly the published bytes.
    let shown = git(&remote.bare, &["show", "Models:model_names_v25.json"]);
    assert_eq!(format!("{shown}\n").as_bytes(), &m.to_canonical_bytes()[..]);
    // Still clean and in sync, so the next publish is allowed and has nothing to do.
    let again = GithubStore::open(&remote.checkout, "Models").unwrap();
    let rep = publish(&m, &dir, &[&again], &opts(false), &mut |_| {}).unwrap();
    assert_eq!(rep.stores[0].uploaded_files, 0);
    assert_eq!(remote.remote_subjects().len(), 6);
    // And the store reads back through the branch layout.
    assert_eq!(read_artifact(&again, "pop223"), a.data);
    let listed: Vec<String> = again
        .list(&p("models/v25"))
        .unwrap()
        .into_iter()
        .map(|e| e.path.to_string())
        .collect();
    assert_eq!(listed.len(), 4, "{listed:?}");
    let manifests: Vec<String> = again
        .list(&p("manifests"))
        .unwrap()
        .into_iter()
        .map(|e| e.path.to_string())
        .collect();
    assert_eq!(manifests, ["manifests/model_names_v25.json"]);
}

#[test]
fn an_empty_model_directory_intends_a_change_already_in_the_store() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (model("pop223", 15, 500), model("wm9", 16, 500));
    let root = t.path().join("store");
    let dir1 = artifacts_dir(&t.path().join("one"), &[&a, &b]);
    let m1 = manifest_of(vec![
        entry("pop223", &a.data, "Pop"),
        entry("wm9", &b.data, "WM 9"),
    ]);
    publish(
        &m1,
        &dir1,
        &[&LocalStore::new(&root)],
        &opts(false),
        &mut |_| {},
    )
    .unwrap();
    // A reuse put new pop223 files in the store; the new manifest points at them.
    let a2 = model("pop223", 17, 1200);
    let staged = artifacts_dir(&t.path().join("reused"), &[&a2]);
    let store = LocalStore::new(&root);
    for e in fs::read_dir(staged.join("pop223")).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        store
            .write_bytes(
                &p(&format!("models/v25/pop223/{name}")),
                &fs::read(e.path()).unwrap(),
            )
            .unwrap();
    }
    let m2 = manifest_of(vec![
        entry("pop223", &a2.data, "Pop"),
        entry("wm9", &b.data, "WM 9"),
    ]);
    let empty = t.path().join("two");
    fs::create_dir_all(empty.join("pop223")).unwrap();
    let rec = Recording::new(LocalStore::new(&root));
    publish(&m2, &empty, &[&rec], &opts(false), &mut |_| {}).unwrap();
    assert_eq!(rec.writes(), ["write manifests/model_names_v25.json"]);
    // Without the directory, the same manifest is an unintended change.
    let none = t.path().join("three");
    fs::create_dir_all(&none).unwrap();
    let m3 = manifest_of(vec![
        entry("pop223", &a.data, "Pop"),
        entry("wm9", &b.data, "WM 9"),
    ]);
    let err = publish(
        &m3,
        &none,
        &[&LocalStore::new(&root)],
        &opts(false),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("pop223"), "{err}");
}

/// A push the remote refuses fails at once (no retries) with what to do, leaving the commit in
/// the checkout; the rerun pushes it and finishes the publish, without a manual `git push`.
#[test]
fn a_rejected_push_is_reported_at_once_and_the_rerun_resumes_from_the_local_commit() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let remote = GitRemote::new(t.path(), "Models", None);
    let hook = remote.bare.join("hooks/pre-receive");
    fs::write(&hook, "#!/bin/sh\necho 'branch is protected' >&2\nexit 1\n").unwrap();
    fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).unwrap();
    let a = model("pop223", 15, 1500);
    let dir = artifacts_dir(t.path(), &[&a]);
    let m = manifest_of(vec![entry("pop223", &a.data, "Pop")]);
    let store = GithubStore::open(&remote.checkout, "Models").unwrap();
    let mut retries = 0;
    let e = publish(&m, &dir, &[&store], &opts(false), &mut |ev| {
        if matches!(ev, artifact_store::publish::Event::Retrying { .. }) {
            retries += 1;
        }
    })
    .unwrap_err();
    let next = cli_support::NextStep::next_step(&e).unwrap_or_default();
    let e = e.to_string();
    assert_eq!(retries, 0, "a rejection is not retried");
    assert!(
        e.contains("was rejected")
            && e.contains("pre-receive hook declined")
            && next.contains("rerun the same publish"),
        "{e}\nnext: {next}"
    );
    assert_eq!(remote.remote_subjects(), ["init"]);
    let ahead = git(
        &remote.checkout,
        &["rev-list", "--count", "origin/Models..HEAD"],
    );
    // Every file of the model is a commit of its own; the chunks and the sidecar waited for the
    // push with the chunk manifest (issue 27 item 5), which was the one refused.
    assert_eq!(ahead.trim(), "4");

    // The remote accepts again: reopening pushes the interrupted publish's commit, and the
    // publish completes with nothing uploaded twice.
    fs::remove_file(&hook).unwrap();
    let store = GithubStore::open(&remote.checkout, "Models").unwrap();
    assert_eq!(remote.remote_subjects().len(), 5);
    let report = publish(&m, &dir, &[&store], &opts(false), &mut |_| {}).unwrap();
    assert_eq!(report.stores[0].uploaded_files, 0, "the model is all there");
    assert_eq!(report.stores[0].skipped_files, 4);
    assert_eq!(
        remote.remote_subjects().last().unwrap(),
        "Publish model_names_v25.json"
    );

    // Commits that are not this tool's are never pushed for the user.
    fs::write(remote.checkout.join("notes.txt"), "mine").unwrap();
    git(&remote.checkout, &["add", "notes.txt"]);
    git(
        &remote.checkout,
        &["commit", "--quiet", "-m", "my own change"],
    );
    let e = GithubStore::open(&remote.checkout, "Models")
        .unwrap_err()
        .to_string();
    assert!(e.contains("1 commit(s) ahead"), "{e}");
}
