//! Power loss on the release machine (issue 36 item 5), by deterministic enumeration under a
//! strict-POSIX model (`test_support::strict_fs`): a directory entry is durable only after its
//! directory's fsync, a file's bytes only after the file's fsync, a rename only after its
//! directory's fsync.
//!
//! The publish runs for real; after each of its effects (`chunker::effects`: each directory
//! created, temporary written, fsync, rename, removal, and each `git` command with the settings
//! it ran with) the state a power cut would leave is computed three ways (only what was synced;
//! every entry but only synced bytes; everything), and from every distinct one a rerun of the
//! same publish must finish with no hand repair. What git makes durable is read from what it
//! was told: with `core.fsync` it fsyncs the files of the components named (its default: packs
//! only), never a directory. The origin (GitHub) does not lose power: it keeps what it took.
//!
//! Modelled: exactly the operations these code paths perform. Not modelled: crashes inside one
//! git command (git's own lock-file protocol, covered by github_resume for kill -9) and mixes
//! where some unsynced directories survived and others did not.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::common::*;
use artifact_store::publish::{PublishOptions, publish};
use artifact_store::retry::RetryPolicy;
use artifact_store::{GithubStore, LocalStore, Store};
use chunker::effects::{self, Effect};
use manifest::{Generation, Manifest};
use test_support::release_stores::{GitRemote, git};
use test_support::strict_fs::{self, StrictFs, Tree, View};

fn opts() -> PublishOptions {
    PublishOptions {
        generation: Generation::new(25),
        dry_run: false,
        retry: RetryPolicy::immediate(2),
        deep_verify: true,
        contract: Default::default(),
    }
}

/// The files git fsyncs, by component, from the `core.fsync` settings it was given (git's
/// documentation: the platform default is `committed,-loose-object`, i.e. packs only).
fn git_fsynced(args: &[OsString]) -> BTreeSet<&'static str> {
    const ALL: [&str; 6] = [
        "loose-object",
        "pack",
        "pack-metadata",
        "commit-graph",
        "index",
        "reference",
    ];
    let default: BTreeSet<&str> = ["pack"].into();
    let mut set = default.clone();
    let mut it = args.iter().filter_map(|a| a.to_str());
    while let Some(a) = it.next() {
        if a != "-c" {
            continue;
        }
        let Some(value) = it.next().and_then(|v| v.strip_prefix("core.fsync=")) else {
            continue;
        };
        if value.is_empty() {
            set = default.clone();
        }
        for token in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (remove, name) = match token.strip_prefix('-') {
                Some(n) => (true, n),
                None => (false, token),
            };
            let parts: Vec<&str> = match name {
                "none" => {
                    set.clear();
                    continue;
                }
                "objects" | "committed" => vec!["loose-object", "pack"],
                "added" => vec!["loose-object", "pack", "index"],
                "derived-metadata" => vec!["pack-metadata", "commit-graph"],
                "all" => ALL.to_vec(),
                other => ALL.iter().copied().filter(|c| *c == other).collect(),
            };
            for p in parts {
                if remove {
                    set.remove(p);
                } else {
                    set.insert(p);
                }
            }
        }
    }
    set
}

/// Whether `rel` (relative to the checkout) belongs to one of `components`.
fn in_component(rel: &Path, components: &BTreeSet<&str>) -> bool {
    let Ok(rest) = rel.strip_prefix(".git") else {
        return false;
    };
    let s = rest.to_string_lossy();
    let name = rel
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let under = |c| components.contains(c);
    if let Some(obj) = s.strip_prefix("objects/") {
        if let Some(pack) = obj.strip_prefix("pack/") {
            return (pack.ends_with(".pack") && under("pack"))
                || ([".idx", ".rev", ".bitmap"]
                    .iter()
                    .any(|e| pack.ends_with(e))
                    && under("pack-metadata"));
        }
        if obj.starts_with("info/commit-graph") {
            return under("commit-graph");
        }
        let loose = obj.len() == 41
            && obj.as_bytes()[2] == b'/'
            && obj
                .bytes()
                .filter(|b| *b != b'/')
                .all(|b| b.is_ascii_hexdigit());
        return loose && under("loose-object");
    }
    if s == "index" {
        return under("index");
    }
    (s.starts_with("refs/") || s == "packed-refs" || s == "HEAD")
        && !name.ends_with(".lock")
        && under("reference")
}

/// One distinct state a power cut can leave, and where it was first seen.
struct State {
    label: String,
    tree: Tree,
    origin: Option<Arc<Tree>>,
}

/// Records, after each effect under `model.root()`, the distinct states a power cut there
/// would leave (with the origin as it then was, when there is one).
struct Recorder {
    model: StrictFs,
    origin: Option<PathBuf>,
    states: Vec<State>,
    seen: BTreeSet<([u8; 32], [u8; 32])>,
    effects: usize,
}

impl Recorder {
    fn new(root: &Path, origin: Option<&Path>) -> Arc<Mutex<Self>> {
        let mut r = Self {
            model: StrictFs::new(root),
            origin: origin.map(Path::to_path_buf),
            states: Vec::new(),
            seen: BTreeSet::new(),
            effects: 0,
        };
        r.record("before the publish");
        Arc::new(Mutex::new(r))
    }

    fn apply(&mut self, e: &Effect<'_>) {
        self.effects += 1;
        let label = match e {
            Effect::CreatedDir(p) => {
                self.model.refresh();
                format!("created {}", p.display())
            }
            Effect::Wrote(p) => {
                self.model.refresh();
                format!("wrote {}", p.display())
            }
            Effect::SyncedFile(p) => {
                self.model.sync_file(p);
                format!("fsynced {}", p.display())
            }
            Effect::Renamed { to, .. } => {
                self.model.refresh();
                format!("renamed to {}", to.display())
            }
            Effect::SyncedDir(p) => {
                self.model.sync_dir(p);
                format!("fsynced dir {}", p.display())
            }
            Effect::Removed(p) => {
                self.model.refresh();
                format!("removed {}", p.display())
            }
            Effect::Ran { args, .. } => {
                let components = git_fsynced(args);
                self.model.sync_files(|rel| in_component(rel, &components));
                let shown: Vec<String> = args
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .filter(|a| !a.contains('='))
                    .filter(|a| a != "-c")
                    .collect();
                format!("ran git {}", shown.join(" "))
            }
        };
        self.record(&format!("#{} {label}", self.effects));
    }

    fn record(&mut self, label: &str) {
        let origin = self
            .origin
            .as_deref()
            .map(|o| Arc::new(strict_fs::tree_of(o)));
        let od = origin.as_deref().map_or([0; 32], strict_fs::digest);
        for view in View::ALL {
            let tree = self.model.state(view);
            if self.seen.insert((strict_fs::digest(&tree), od)) {
                self.states.push(State {
                    label: format!("{label} ({view:?})"),
                    tree,
                    origin: origin.clone(),
                });
            }
        }
    }

    /// What is not durable now: the paths where the synced view differs from the state as it
    /// is, but for those `ignore` names.
    fn not_durable(&self, ignore: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
        let (synced, now) = (
            self.model.state(View::Synced),
            self.model.state(View::Killed),
        );
        let mut out: Vec<PathBuf> = now
            .iter()
            .filter(|(p, e)| synced.get(*p) != Some(*e))
            .map(|(p, _)| p.clone())
            .chain(synced.keys().filter(|p| !now.contains_key(*p)).cloned())
            .filter(|p| !ignore(p))
            .collect();
        out.sort();
        out
    }
}

/// Run `f` with every effect under `root` applied to `rec`.
fn observed<T>(root: &Path, rec: &Arc<Mutex<Recorder>>, f: impl FnOnce() -> T) -> T {
    let r = Arc::clone(rec);
    let _obs = effects::observe(root, move |e| {
        r.lock().unwrap_or_else(|p| p.into_inner()).apply(e)
    });
    f()
}

/// Where replays are rebuilt: a tmpfs (`/dev/shm`) when there is one, where the reruns' own
/// fsyncs cost nothing (the states are small), else beside the test's files.
fn replay_dir(fallback: &Path) -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    shm.is_dir()
        .then(|| tempfile::tempdir_in(shm).ok())
        .flatten()
        .unwrap_or_else(|| tempfile::tempdir_in(fallback).unwrap())
}

/// Replay each state on two threads; the failures, each with the state's label.
fn replay(
    states: &[State],
    check: impl Fn(usize, &State) -> Result<(), String> + Sync,
) -> Vec<String> {
    let failures = Mutex::new(Vec::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(state) = states.get(i) else { break };
                    if let Err(e) = check(i, state) {
                        failures
                            .lock()
                            .unwrap()
                            .push(format!("{}: {e}", state.label));
                    }
                }
            });
        }
    });
    failures.into_inner().unwrap()
}

/// What the replays found, as a failure message (`None`: every state resumed).
fn report(what: &str, rec: &Recorder, failures: &[String]) -> Option<String> {
    eprintln!(
        "{what}: {} effects, {} distinct power-loss states, {} need hand repair",
        rec.effects,
        rec.states.len(),
        failures.len()
    );
    (!failures.is_empty()).then(|| {
        format!(
            "{what}: {} of {} distinct power-loss states ({} effects) need hand repair; first ones:\n{}",
            failures.len(),
            rec.states.len(),
            rec.effects,
            failures
                .iter()
                .take(8)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        )
    })
}

/// A model's artifact as a store holds it, joined from its chunk manifest, or why not.
fn whole(store: &dyn Store, id: &str) -> Result<Vec<u8>, String> {
    let name = format!("{id}_driving_tinygrad.pkl");
    let dir = format!("models/v25/{id}");
    let cm = store
        .read_small(&p(&format!("{dir}/{name}.chunkmanifest")), 10)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{id}: no chunk manifest"))?;
    let n: u32 = String::from_utf8_lossy(&cm)
        .trim()
        .parse()
        .map_err(|_| format!("{id}: chunk manifest {cm:?}"))?;
    let mut out = Vec::new();
    for i in 1..=n {
        let chunk = format!("{dir}/{}", chunker::chunk_name(&name, i, n));
        store
            .open(&p(&chunk))
            .map_err(|e| e.to_string())?
            .read_to_end(&mut out)
            .map_err(|e| format!("{chunk}: {e}"))?;
    }
    Ok(out)
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what()) }
}

// ---------------------------------------------------------------------------------------------
// `github:` store

/// `git` in `dir`, its trimmed stdout or its stderr.
fn try_git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// From one state (checkout and origin rebuilt side by side under `dir`), the rerun of the
/// publish: it opens with no hand repair and leaves the origin with the whole release, the
/// checkout clean and at the origin's commit.
fn github_rerun(
    dir: &Path,
    state: &State,
    m: &Manifest,
    artifacts: &Path,
    wm9: &[u8],
) -> Result<(), String> {
    let (checkout, bare) = (dir.join("checkout"), dir.join("origin.git"));
    strict_fs::materialize(&state.tree, &checkout);
    strict_fs::materialize(state.origin.as_ref().expect("an origin"), &bare);
    git(
        &checkout,
        &["remote", "set-url", "origin", bare.to_str().unwrap()],
    );
    let store = GithubStore::open(&checkout, "Models").map_err(|e| format!("open: {e}"))?;
    publish(m, artifacts, &[&store], &opts(), &mut |_| {}).map_err(|e| format!("publish: {e}"))?;
    drop(store);
    let shown = try_git(&bare, &["show", "Models:model_names_v25.json"])?;
    ensure(
        format!("{shown}\n").as_bytes() == &m.to_canonical_bytes()[..],
        || "the origin's manifest is not the release's".into(),
    )?;
    let on_origin = GithubStore::open(&checkout, "Models").map_err(|e| format!("reopen: {e}"))?;
    ensure(whole(&on_origin, "wm9")? == wm9, || {
        "wm9 is not whole".into()
    })?;
    let status = try_git(
        &checkout,
        &["status", "--porcelain", "--untracked-files=all"],
    )?;
    ensure(status.is_empty(), || {
        format!("the checkout is not clean: {status}")
    })?;
    let (head, tip) = (
        try_git(&checkout, &["rev-parse", "HEAD"])?,
        try_git(&bare, &["rev-parse", "Models"])?,
    );
    ensure(head == tip, || {
        format!("HEAD {head} is not the origin's {tip}")
    })
}

#[test]
fn a_github_publish_cut_by_power_loss_anywhere_resumes_without_hand_repair() {
    let t = tempfile::tempdir().unwrap();
    let remote = GitRemote::new(t.path(), "Models", None);
    let (a, b) = (model("pop223", 41, 900), model("wm9", 42, 1500));
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

    // Release two, observed: wm9's chunks, sidecar, chunk manifest and the manifest.
    let rec = Recorder::new(&remote.checkout, Some(&remote.bare));
    observed(&remote.checkout, &rec, || {
        let store = GithubStore::open(&remote.checkout, "Models").unwrap();
        publish(&m2, &dir2, &[&store], &opts(), &mut |_| {}).unwrap();
    });
    let rec = rec.lock().unwrap();
    // What git writes without fsync under any setting (reflogs, messages, FETCH_HEAD) may be
    // lost; nothing reads it.
    let bookkeeping = |p: &Path| {
        p.starts_with(".git/logs")
            || ["COMMIT_EDITMSG", "FETCH_HEAD", "ORIG_HEAD"]
                .iter()
                .any(|f| p == Path::new(".git").join(f))
    };
    let lost = rec.not_durable(bookkeeping);
    let work = replay_dir(t.path());
    let failures = replay(&rec.states, |i, state| {
        let dir = work.path().join(i.to_string());
        let r = github_rerun(&dir, state, &m2, &dir2, &b.data);
        if r.is_ok() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        r
    });
    if let Some(why) = report("github: publish", &rec, &failures) {
        panic!("{why}");
    }
    assert!(
        lost.is_empty(),
        "a publish that returned is durable in the checkout too (each git command's renames synced); not durable: {lost:?}"
    );
}

#[test]
fn git_is_told_to_fsync_what_the_model_credits() {
    let a = |s: &[&str]| s.iter().map(OsString::from).collect::<Vec<_>>();
    assert_eq!(git_fsynced(&a(&["status"])), ["pack"].into());
    assert_eq!(
        git_fsynced(&a(&["-c", "core.fsync=all", "commit"])).len(),
        6
    );
    assert_eq!(
        git_fsynced(&a(&["-c", "core.fsync=committed,index,-pack"])),
        ["loose-object", "index"].into()
    );
    let all = git_fsynced(&a(&["-c", "core.fsync=all"]));
    for (rel, synced) in [
        (
            ".git/objects/ab/cdef0123456789abcdef0123456789abcdef01",
            true,
        ),
        (".git/objects/ab/tmp_obj_XYZ", false),
        (".git/objects/pack/pack-1.pack", true),
        (".git/refs/heads/Models", true),
        (".git/refs/heads/Models.lock", false),
        (".git/index", true),
        (".git/logs/HEAD", false),
        ("v25/pop/x.chunkmanifest", false),
    ] {
        assert_eq!(in_component(Path::new(rel), &all), synced, "{rel}");
    }
    assert!(!in_component(Path::new(".git/index"), &["pack"].into()));
}

// ---------------------------------------------------------------------------------------------
// directory store

/// From one state of the directory holding the store: a reader never finds the manifest
/// listing a model the store does not hold whole, and the rerun finishes the release.
fn dir_rerun(
    dir: &Path,
    state: &State,
    m: &Manifest,
    artifacts: &Path,
    models: &[&Model],
) -> Result<(), String> {
    strict_fs::materialize(&state.tree, dir);
    let store = LocalStore::new(dir.join("store"));
    let manifest = p("manifests/model_names_v25.json");
    if let Some(bytes) = store
        .read_small(&manifest, 1 << 20)
        .map_err(|e| e.to_string())?
    {
        ensure(bytes == m.to_canonical_bytes(), || {
            format!("a torn manifest ({} bytes)", bytes.len())
        })?;
        for model in models {
            let got = whole(&store, model.id)
                .map_err(|e| format!("the live manifest lists {}, and {e}", model.id))?;
            ensure(got == model.data, || {
                format!("{} is not whole under a live manifest", model.id)
            })?;
        }
    }
    publish(m, artifacts, &[&store], &opts(), &mut |_| {}).map_err(|e| format!("rerun: {e}"))?;
    for model in models {
        ensure(whole(&store, model.id)? == model.data, || {
            format!("{} is not whole after the rerun", model.id)
        })?;
    }
    Ok(())
}

#[test]
fn a_first_publish_into_a_directory_store_cut_by_power_loss_anywhere_resumes() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (model("pop223", 51, 1500), model("wm9", 52, 2500));
    let artifacts = artifacts_dir(&t.path().join("src"), &[&a, &b]);
    let m = manifest_of(vec![
        entry("pop223", &a.data, "Pop"),
        entry("wm9", &b.data, "WM 9"),
    ]);
    // The store's directory new, or there and empty; under a directory that exists.
    let mut problems = Vec::new();
    // The store's directory new; there and empty; or holding another generation already
    // (`manifests/` and `models/` there, `models/v25/` new).
    for (n, (case, made)) in [
        ("a new store directory", &[][..]),
        ("an empty store directory", &["store"][..]),
        (
            "a store holding another generation",
            &[
                "store",
                "store/manifests",
                "store/models",
                "store/models/v24",
            ][..],
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let root = t.path().join(format!("world-{n}"));
        std::fs::create_dir_all(&root).unwrap();
        for d in made {
            std::fs::create_dir(root.join(d)).unwrap();
        }
        let rec = Recorder::new(&root, None);
        observed(&root, &rec, || {
            publish(
                &m,
                &artifacts,
                &[&LocalStore::new(root.join("store"))],
                &opts(),
                &mut |_| {},
            )
            .unwrap();
        });
        let rec = rec.lock().unwrap();
        let lost = rec.not_durable(|_| false);
        let work = replay_dir(t.path());
        let failures = replay(&rec.states, |i, state| {
            dir_rerun(
                &work.path().join(i.to_string()),
                state,
                &m,
                &artifacts,
                &[&a, &b],
            )
        });
        problems.extend(report(
            &format!("first publish into {case}"),
            &rec,
            &failures,
        ));
        if !lost.is_empty() {
            problems.push(format!(
                "{case}: a publish that returned must be durable (each directory it created synced); not durable: {lost:?}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}
