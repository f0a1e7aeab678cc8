//! A `github:` publish interrupted at any point resumes on the next run with no hand repair
//! (issue 26 item 9). Each state a kill -9 can leave between git's steps is built on a real
//! checkout of a real bare `origin`: a file written and not added, added and not committed, a
//! commit's stale `index.lock` and branch ref lock, a push's stale remote-ref lock, an atomic
//! writer's temporary, a staged removal, committed and not pushed, and a `git push` orphaned by
//! the killed publish still running. From each, a rerun of the same publish succeeds and leaves
//! the remote branch with the whole release and the checkout clean. A person's edit is still
//! refused and left alone.

use std::fs;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use artifact_store::GithubStore;
use artifact_store::github::{LOCK_FILE, leftovers};
use artifact_store::publish::{PublishOptions, publish};
use artifact_store::retry::RetryPolicy;
use manifest::{Generation, Manifest};
use test_support::release_stores::{GitRemote, git};

fn opts() -> PublishOptions {
    PublishOptions {
        generation: Generation::new(25),
        dry_run: false,
        retry: RetryPolicy::immediate(3),
        deep_verify: true,
        contract: Default::default(),
    }
}

/// A remote holding release one (pop223), the artifacts of release two (pop223 + wm9), and the
/// manifests of both.
struct World {
    _t: tempfile::TempDir,
    remote: GitRemote,
    dir2: std::path::PathBuf,
    m2: Manifest,
    wm9: Vec<u8>,
}

fn world() -> World {
    let t = tempfile::tempdir().unwrap();
    let remote = GitRemote::new(t.path(), "Models", None);
    let (a, b) = (model("pop223", 31, 1500), model("wm9", 32, 2500));
    let dir1 = artifacts_dir(&t.path().join("one"), &[&a]);
    let m1 = manifest_of(vec![entry("pop223", &a.data, "Pop")]);
    let store = GithubStore::open(&remote.checkout, "Models").unwrap();
    publish(&m1, &dir1, &[&store], &opts(), &mut |_| {}).unwrap();
    drop(store);
    let dir2 = artifacts_dir(&t.path().join("two"), &[&a, &b]);
    let m2 = manifest_of(vec![
        entry("pop223", &a.data, "Pop"),
        entry("wm9", &b.data, "WM 9"),
    ]);
    World {
        _t: t,
        remote,
        dir2,
        m2,
        wm9: b.data,
    }
}

const WM9: &str = "v25/wm9/wm9_driving_tinygrad.pkl";

fn git_dir(checkout: &Path) -> std::path::PathBuf {
    checkout.join(".git")
}

/// The rerun: open (no hand repair) and publish release two; then the remote holds it whole,
/// the checkout is clean, in sync, and holds no lock file of git's.
fn rerun_and_check(w: &World, state: &str) {
    let store = GithubStore::open(&w.remote.checkout, "Models")
        .unwrap_or_else(|e| panic!("{state}: the rerun could not open the checkout: {e}"));
    publish(&w.m2, &w.dir2, &[&store], &opts(), &mut |_| {})
        .unwrap_or_else(|e| panic!("{state}: the rerun failed: {e}"));
    drop(store);
    let shown = git(&w.remote.bare, &["show", "Models:model_names_v25.json"]);
    assert_eq!(
        format!("{shown}\n").as_bytes(),
        &w.m2.to_canonical_bytes()[..],
        "{state}"
    );
    let joined = joined_on_remote(&w.remote, WM9);
    assert_eq!(joined, w.wm9, "{state}: wm9 on the remote");
    assert_eq!(
        git(
            &w.remote.checkout,
            &["status", "--porcelain", "--untracked-files=all"]
        ),
        "",
        "{state}: the checkout is clean"
    );
    assert_eq!(
        git(&w.remote.checkout, &["rev-parse", "HEAD"]),
        git(&w.remote.bare, &["rev-parse", "Models"]),
        "{state}: in sync"
    );
    for lock in ["index.lock", "HEAD.lock", "refs/heads/Models.lock"] {
        assert!(
            !git_dir(&w.remote.checkout).join(lock).exists(),
            "{state}: {lock}"
        );
    }
}

/// The artifact a remote branch holds, joined from its chunks (`git show` of each).
fn joined_on_remote(remote: &GitRemote, logical: &str) -> Vec<u8> {
    let count: u32 = git(
        &remote.bare,
        &["show", &format!("Models:{logical}.chunkmanifest")],
    )
    .trim()
    .parse()
    .expect("a chunk count");
    let mut out = Vec::new();
    for i in 1..=count {
        let name = format!("{logical}.chunk{i:02}of{count:02}");
        let o = std::process::Command::new("git")
            .arg("-C")
            .arg(&remote.bare)
            .args(["show", &format!("Models:{name}")])
            .output()
            .unwrap();
        assert!(o.status.success(), "{name} is on the remote");
        out.extend(o.stdout);
    }
    out
}

/// The first file of wm9's set as the store would write it, in the working tree only.
fn write_first_chunk(w: &World) -> String {
    let rel = format!("{WM9}.chunk01of03");
    let src = w.dir2.join("wm9/wm9_driving_tinygrad.pkl.chunk01of03");
    fs::create_dir_all(w.remote.checkout.join("v25/wm9")).unwrap();
    fs::copy(src, w.remote.checkout.join(&rel)).unwrap();
    rel
}

#[test]
fn every_state_an_interrupted_github_publish_leaves_resumes_without_repair() {
    type Make = fn(&World);
    let states: [(&str, Make); 9] = [
        ("written, not added", |w| {
            write_first_chunk(w);
        }),
        ("added, not committed", |w| {
            let rel = write_first_chunk(w);
            git(&w.remote.checkout, &["add", "--", &rel]);
        }),
        (
            "killed in commit: index.lock and the branch's ref lock left",
            |w| {
                let rel = write_first_chunk(w);
                git(&w.remote.checkout, &["add", "--", &rel]);
                let g = git_dir(&w.remote.checkout);
                fs::write(g.join("index.lock"), b"").unwrap();
                fs::write(g.join("refs/heads/Models.lock"), b"").unwrap();
            },
        ),
        (
            "a batch committed, not pushed: every chunk of wm9 waits",
            |w| {
                for i in 1..=3 {
                    let rel = format!("{WM9}.chunk{i:02}of03");
                    let src = w
                        .dir2
                        .join(format!("wm9/wm9_driving_tinygrad.pkl.chunk{i:02}of03"));
                    fs::create_dir_all(w.remote.checkout.join("v25/wm9")).unwrap();
                    fs::copy(src, w.remote.checkout.join(&rel)).unwrap();
                    git(&w.remote.checkout, &["add", "--", &rel]);
                    git(
                        &w.remote.checkout,
                        &["commit", "--quiet", "-m", &format!("Publish {rel}")],
                    );
                }
            },
        ),
        ("committed, not pushed", |w| {
            let rel = write_first_chunk(w);
            git(&w.remote.checkout, &["add", "--", &rel]);
            git(
                &w.remote.checkout,
                &["commit", "--quiet", "-m", &format!("Publish {rel}")],
            );
        }),
        (
            "killed in push: pushed, the remote-tracking ref's lock left",
            |w| {
                let rel = write_first_chunk(w);
                git(&w.remote.checkout, &["add", "--", &rel]);
                git(
                    &w.remote.checkout,
                    &["commit", "--quiet", "-m", &format!("Publish {rel}")],
                );
                git(
                    &w.remote.checkout,
                    &["push", "--quiet", "origin", "HEAD:refs/heads/Models"],
                );
                let lock = git_dir(&w.remote.checkout).join("refs/remotes/origin/Models.lock");
                fs::create_dir_all(lock.parent().unwrap()).unwrap();
                fs::write(lock, b"").unwrap();
            },
        ),
        ("killed in the atomic write: a temporary left", |w| {
            fs::create_dir_all(w.remote.checkout.join("v25/wm9")).unwrap();
            fs::write(
                w.remote
                    .checkout
                    .join("v25/wm9/.tmp-999999-3-wm9_driving_tinygrad.pkl.chunk01of03"),
                b"half",
            )
            .unwrap();
        }),
        ("a staged removal of a live file", |w| {
            git(
                &w.remote.checkout,
                &[
                    "rm",
                    "--quiet",
                    "--",
                    "v25/pop223/pop223_driving_tinygrad.pkl.sha256",
                ],
            );
        }),
        ("a live file half rewritten in place", |w| {
            fs::write(w.remote.checkout.join("model_names_v25.json"), b"{\"mod").unwrap();
        }),
    ];
    // Each state on its own remote and checkout, side by side.
    std::thread::scope(|scope| {
        for (state, make) in states {
            scope.spawn(move || {
                let w = world();
                make(&w);
                rerun_and_check(&w, state);
            });
        }
    });
}

#[test]
fn a_persons_edit_is_still_refused_and_left_alone() {
    let w = world();
    let rel = write_first_chunk(&w);
    fs::write(w.remote.checkout.join("notes.txt"), b"mine").unwrap();
    let e = GithubStore::open(&w.remote.checkout, "Models")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("uncommitted changes") && e.contains("notes.txt"),
        "{e}"
    );
    assert_eq!(
        fs::read(w.remote.checkout.join("notes.txt")).unwrap(),
        b"mine"
    );
    assert!(
        w.remote.checkout.join(&rel).exists(),
        "nothing was put back"
    );
    assert_eq!(
        leftovers("?? notes.txt\0"),
        Err("notes.txt".to_string()),
        "the rule the refusal follows"
    );
}

/// Clear FD_CLOEXEC so a child started now inherits `fd`.
fn inheritable(fd: i32) {
    // SAFETY: fcntl(2) on a descriptor the caller owns.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        assert!(flags >= 0);
        assert_eq!(libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC), 0);
    }
}

/// The `git push` of a killed publish, still running, holds the checkout's publish lock (it
/// inherited it): the rerun waits for it rather than racing it, and a rerun that may not wait so
/// long is refused with what to do, touching nothing.
#[test]
fn a_rerun_waits_for_the_orphaned_git_push_of_a_killed_publish() {
    let w = world();
    let lock_path = git_dir(&w.remote.checkout).join(LOCK_FILE);
    // The orphan: a child holding the lock through an inherited descriptor, as `git push`
    // holds it after its parent was killed.
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .unwrap();
    // SAFETY: flock(2) on a descriptor we own.
    assert_eq!(
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    inheritable(lock.as_raw_fd());
    let mut orphan = std::process::Command::new("sleep")
        .arg("1.5")
        .spawn()
        .unwrap();
    drop(lock);
    let rel = write_first_chunk(&w);

    let e = GithubStore::open_waiting(&w.remote.checkout, "Models", Duration::from_millis(200))
        .unwrap_err()
        .to_string();
    assert!(e.contains("still holds") && e.contains(LOCK_FILE), "{e}");
    assert!(
        w.remote.checkout.join(&rel).exists(),
        "nothing touched while locked"
    );

    let began = Instant::now();
    let store = GithubStore::open(&w.remote.checkout, "Models").unwrap();
    assert!(
        began.elapsed() >= Duration::from_millis(800),
        "it waited for the orphan"
    );
    orphan.wait().unwrap();
    publish(&w.m2, &w.dir2, &[&store], &opts(), &mut |_| {}).unwrap();
    drop(store);
    rerun_and_check(&w, "after the orphan");
}

/// Every git command the store runs holds the publish lock too (an inherited descriptor), so a
/// `git push` that outlives a killed publish keeps the next run waiting: a post-commit hook, a
/// child of the store's `git commit`, finds the lock file among its open descriptors.
#[test]
fn the_stores_git_commands_inherit_the_publish_lock() {
    let w = world();
    let seen = w.remote.checkout.parent().unwrap().join("hook-saw");
    let hook = git_dir(&w.remote.checkout).join("hooks/post-commit");
    fs::write(
        &hook,
        format!(
            "#!/bin/sh\nls -l /proc/$$/fd 2>/dev/null | grep -c -F '{}' >> '{}'\n",
            git_dir(&w.remote.checkout).join(LOCK_FILE).display(),
            seen.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).unwrap();
    let store = GithubStore::open(&w.remote.checkout, "Models").unwrap();
    publish(&w.m2, &w.dir2, &[&store], &opts(), &mut |_| {}).unwrap();
    let counts = fs::read_to_string(&seen).unwrap();
    assert!(!counts.is_empty(), "the hook ran");
    assert!(
        counts.lines().all(|l| l.trim() == "1"),
        "every commit's hook held the lock: {counts:?}"
    );
}

/// Pushes are batched (issue 27 item 5): a model's chunks and sidecar wait in the checkout and
/// go up in one push with its chunk manifest, and the manifest in one more, while every file
/// is still a commit of its own (so an interrupted publish leaves only whole files). Each push
/// the remote received left it at a commit of the publish's sequence with whole files only.
#[test]
fn a_publish_pushes_once_per_model_and_once_for_the_manifest() {
    let w = world();
    let pushes = w.remote.bare.parent().unwrap().join("pushes");
    let hook = w.remote.bare.join("hooks/post-receive");
    fs::write(&hook, format!("#!/bin/sh\ncat >> '{}'\n", pushes.display())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).unwrap();
    let before = w.remote.remote_subjects().len();
    let store = GithubStore::open(&w.remote.checkout, "Models").unwrap();
    publish(&w.m2, &w.dir2, &[&store], &opts(), &mut |_| {}).unwrap();
    assert_eq!(
        store.unpushed(),
        Default::default(),
        "nothing left unpushed"
    );
    drop(store);
    let subjects = w.remote.remote_subjects();
    // wm9: three chunks, the sidecar, the chunk manifest; then the generation's manifest.
    assert_eq!(
        subjects[before..],
        [
            format!("Publish {WM9}.chunk01of03"),
            format!("Publish {WM9}.chunk02of03"),
            format!("Publish {WM9}.chunk03of03"),
            format!("Publish {WM9}.sha256"),
            format!("Publish {WM9}.chunkmanifest"),
            "Publish model_names_v25.json".to_string(),
        ]
    );
    let log = fs::read_to_string(&pushes).unwrap();
    let pushed: Vec<&str> = log.lines().map(|l| l.split(' ').nth(1).unwrap()).collect();
    assert_eq!(
        pushed.len(),
        2,
        "one push for wm9, one for the manifest: {log}"
    );
    // The first push left the remote at wm9's chunk manifest commit: the set whole, the
    // generation's manifest not yet changed.
    let first = git(&w.remote.bare, &["log", "-1", "--format=%s", pushed[0]]);
    assert_eq!(first.trim(), format!("Publish {WM9}.chunkmanifest"));
    rerun_and_check(&w, "after a batched publish");
}

/// A power cut after a push reached the origin can take the checkout's own commits and refs
/// away (a git that ignores `core.fsync`, older than 2.36, or a checkout an older release-cli
/// left): the checkout is then behind an origin holding exactly our publish commits, and the
/// rerun catches up and finishes. Someone else's commit there is refused, naming it, and the
/// commands the refusal prints run as printed.
#[test]
fn a_checkout_behind_an_origin_holding_only_our_publish_commits_catches_up() {
    let w = world();
    let checkout = &w.remote.checkout;
    let release_one = git(checkout, &["rev-parse", "HEAD"]);
    let store = GithubStore::open(checkout, "Models").unwrap();
    publish(&w.m2, &w.dir2, &[&store], &opts(), &mut |_| {}).unwrap();
    drop(store);
    // What the cut left: the branch and its remote-tracking ref back at release one, the
    // working tree as the branch was then.
    git(checkout, &["reset", "--quiet", "--hard", &release_one]);
    git(
        checkout,
        &["update-ref", "refs/remotes/origin/Models", &release_one],
    );
    rerun_and_check(&w, "behind the origin's publish commits");

    // Someone else's commit on the origin, and the checkout behind again.
    let other = w.remote.bare.parent().unwrap().join("someone");
    git(
        w.remote.bare.parent().unwrap(),
        &[
            "clone",
            "--quiet",
            "-b",
            "Models",
            w.remote.bare.to_str().unwrap(),
            other.to_str().unwrap(),
        ],
    );
    fs::write(other.join("notes.txt"), b"theirs").unwrap();
    git(&other, &["add", "notes.txt"]);
    git(
        &other,
        &[
            "-c",
            "user.name=someone",
            "-c",
            "user.email=someone@localhost",
            "commit",
            "--quiet",
            "-m",
            "my own fix",
        ],
    );
    git(&other, &["push", "--quiet", "origin", "Models"]);
    let e = GithubStore::open(checkout, "Models")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("1 commit(s) behind") && e.contains("\"my own fix\" is not one"),
        "{e}"
    );
    assert!(!checkout.join("notes.txt").exists(), "nothing was merged");
    // The two commands the refusal prints, run as printed.
    let commands: Vec<&str> = e.split('`').skip(1).step_by(2).collect();
    assert_eq!(commands.len(), 2, "{e}");
    assert!(
        commands[0].starts_with("git -C ") && commands[0].contains(" log "),
        "{e}"
    );
    assert!(commands[1].contains(" merge --ff-only "), "{e}");
    for c in &commands {
        let out = std::process::Command::new("sh")
            .args(["-c", c])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{c}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(fs::read(checkout.join("notes.txt")).unwrap(), b"theirs");
    GithubStore::open(checkout, "Models").expect("after the printed merge, the rerun opens");
}

/// The lock refusal's `fuser` hint runs as printed for a checkout whose path holds a space: it
/// names the one file, and finds this process, which holds the lock.
#[test]
fn the_lock_hint_runs_as_printed_for_a_path_with_a_space() {
    let t = tempfile::tempdir().unwrap();
    let remote = GitRemote::new(&t.path().join("my models"), "Models", None);
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(git_dir(&remote.checkout).join(LOCK_FILE))
        .unwrap();
    lock.try_lock().unwrap();
    let e = GithubStore::open_waiting(&remote.checkout, "Models", Duration::from_millis(100))
        .unwrap_err()
        .to_string();
    let hint = e
        .split('`')
        .find(|s| s.starts_with("fuser "))
        .unwrap_or_else(|| panic!("no fuser hint in: {e}"));
    let o = std::process::Command::new("sh")
        .args(["-c", hint])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{hint}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let pids = String::from_utf8_lossy(&o.stdout);
    assert!(
        pids.split_whitespace()
            .any(|p| p.trim_end_matches(|c: char| !c.is_ascii_digit())
                == std::process::id().to_string()),
        "{hint} found {pids:?}, not this process"
    );
}

/// A checkout whose `.git` is a file (a `git worktree`: its objects and refs are in the main
/// checkout's git directory, which the store does not make durable) is refused, saying why.
#[test]
fn a_worktree_checkout_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let remote = GitRemote::new(t.path(), "Models", None);
    let wt = t.path().join("wt");
    git(
        &remote.checkout,
        &[
            "worktree",
            "add",
            "--quiet",
            "--force",
            wt.to_str().unwrap(),
            "Models",
        ],
    );
    assert!(wt.join(".git").is_file());
    let e = GithubStore::open(&wt, "Models").unwrap_err().to_string();
    assert!(
        e.contains(".git is a file") && e.contains("git clone --branch Models"),
        "{e}"
    );
}
