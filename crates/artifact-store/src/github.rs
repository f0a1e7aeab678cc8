//! The GitHub `Models` branch store: a git checkout of `firestar5683/StarPilot-Resources` on
//! branch `Models`, published by committing and pushing.
//!
//! - It refuses a checkout that is dirty, on another branch, or not in sync with its origin after
//!   a fetch: publishing from such a tree would push someone else's changes or fail halfway.
//! - Store paths are in the bucket layout and mapped to the branch layout
//!   (`model_names_<gen>.json`, `<gen>/<id>/<file>`) by `manifest::layout` ([`StoreLayout::translate`]).
//! - Every write is one commit (one whole file), so an interrupted publish leaves only whole
//!   files on the remote. Pushes are batched ([`push_due`]): a chunk or a `.sha256` sidecar, which
//!   make nothing visible on their own, wait in the checkout until the write that completes
//!   something (a `.chunkmanifest`, a manifest, a signature, any removal), until
//!   [`PUSH_BATCH_BYTES`] wait, or until [`Store::flush`]; one push then carries all of them, so
//!   a model's chunks go up in one push instead of one each (issue 27 item 5). Each push stays far
//!   under GitHub's limits (100 MB per file: chunks are 45 MiB; 2 GiB per push). The remote only
//!   ever moves from one commit of the sequence to a later one, so it passes through a subset of
//!   the states one push per file would show. Publish writes the manifest last.
//!
//! Reads come from the working tree, which the checks above keep equal to the remote branch.
//!
//! An interrupted publish (kill -9, power loss) resumes on the next run with no hand repair:
//! - `open` takes the checkout's publish lock (`<git dir>/starpilot-publish.lock`, an `flock`)
//!   and keeps it while the store lives. The lock's descriptor is inherited by every `git` this
//!   store runs, so a `git push` orphaned by a killed publish still holds it: the next run waits
//!   for that push to end ([`LOCK_WAIT`] at most) instead of racing it.
//! - Holding the lock, no git command of ours runs in the checkout, so git's own lock files
//!   left by a killed `git add`/`commit`/`push` (`index.lock`, the branch's and its remote
//!   ref's `.lock`, `HEAD.lock`, `packed-refs.lock`) are stale and removed.
//! - What a killed publish leaves in the working tree (a file written but not added, added but
//!   not committed, a removal staged, a temporary of the atomic writer) is put back to `HEAD`
//!   when every such path is one a publish writes ([`leftovers`]); anything else (a person's
//!   edit, a file outside the branch layout) is still refused.
//! - Its commits not yet pushed are pushed first (as before).

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chunker::Form;
use chunker::atomic::temp_owner;

use manifest::StoreLayout;

use crate::error::{Error, Result};
use crate::local::LocalStore;
use crate::paths::StorePath;
use crate::progress::{Finished, Transfer, parse_git_push_bytes, wait_reading_progress};
use crate::store::{FileStat, ListEntry, Store, StoreName};

/// Bucket layout (what every [`Store`] speaks) → branch layout; `None` for what the branch
/// does not hold.
pub(crate) fn bucket_to_github(path: &StorePath) -> Option<StorePath> {
    StoreLayout::HfBucket.translate(path, StoreLayout::GithubBranch)
}

/// Branch layout → bucket layout; `None` for files outside the layout (README, leftovers).
pub(crate) fn github_to_bucket(path: &StorePath) -> Option<StorePath> {
    StoreLayout::GithubBranch.translate(path, StoreLayout::HfBucket)
}

/// The GitHub `Models` branch as a [`Store`]: a clean checkout of the branch, written one commit
/// per file and pushed in batches (module docs). Open it with [`GithubStore::open`], which refuses
/// a checkout that is dirty, on another branch or behind its origin, and holds the checkout's
/// publish lock while the store lives.
#[derive(Debug, Clone)]
pub struct GithubStore {
    checkout: PathBuf,
    branch: String,
    remote: String,
    files: LocalStore,
    /// The checkout's publish lock, held while the store lives (module docs).
    _lock: Option<Arc<std::fs::File>>,
    /// Commits this store made and has not pushed yet (shared by clones).
    unpushed: Arc<Mutex<Unpushed>>,
}

/// Commits made and not yet pushed, and the bytes of the files they wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Unpushed {
    /// Commits waiting to be pushed.
    pub commits: u32,
    /// Bytes of the files they wrote.
    pub bytes: u64,
}

/// Every git command of the store runs with this: a file over 1 MiB (every chunk) goes deflated
/// once straight into a pack and is never a delta base or target. Chunks are incompressible and
/// unlike each other, so delta search and re-deflating them on push would be CPU for nothing.
const BIG_FILE_THRESHOLD: &str = "core.bigFileThreshold=1m";

/// And with these (git 2.36 or later): git fsyncs every object, pack, ref and index before its
/// rename (by default packs only, so after a power cut a ref could name an empty object). git
/// syncs no directory: [`GithubStore::after_git`] does (docs/release.md, "Power loss").
const GIT_FSYNC: [&str; 2] = ["core.fsync=all", "core.fsyncMethod=fsync"];

/// The oldest git that honours `GIT_FSYNC` (`core.fsync` came with git 2.36; an older git
/// ignores it silently and fsyncs no ref or index).
pub const MIN_GIT: (u32, u32) = (2, 36);

/// Why the git whose `git --version` printed `version` cannot run this store durably, or `None`
/// when it is [`MIN_GIT`] or later. Output that names no version is refused too: durability
/// that cannot be told is not assumed. Pure.
pub fn git_version_problem(version: &str) -> Option<String> {
    let number = version.trim().strip_prefix("git version ").unwrap_or("");
    let mut parts = number.split(['.', ' ']).map(str::parse::<u32>);
    let (min_major, min_minor) = MIN_GIT;
    let upgrade = format!(
        "install git {min_major}.{min_minor} or later (Debian bookworm ships 2.39; \
         `git --version` says which runs), then rerun"
    );
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) if (major, minor) >= MIN_GIT => None,
        (Some(Ok(major)), Some(Ok(minor))) => Some(format!(
            "git {major}.{minor} ignores core.fsync (git {min_major}.{min_minor} added it), so a \
             power cut during a publish could leave a ref naming an object that was never \
             written; {upgrade}"
        )),
        _ => Some(format!(
            "cannot tell git's version from `git --version` ({:?}); {upgrade}",
            version.trim()
        )),
    }
}

/// The `-c NAME=VALUE` arguments every git command of the store runs with.
fn git_config_args() -> Vec<&'static str> {
    let mut out = vec!["-c", BIG_FILE_THRESHOLD];
    for c in GIT_FSYNC {
        out.extend(["-c", c]);
    }
    out
}

/// A checkout's directories (its `.git` included), each with its entries (name, inode), read
/// with readdir alone: what a git command changed is where these differ ([`dirs_changed`]).
pub type Listing =
    std::collections::BTreeMap<PathBuf, std::collections::BTreeSet<(std::ffi::OsString, u64)>>;

fn listing(root: &Path) -> Listing {
    use std::os::unix::fs::DirEntryExt;
    let mut out = Listing::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut entries = std::collections::BTreeSet::new();
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
            entries.insert((e.file_name(), e.ino()));
        }
        out.insert(dir, entries);
    }
    out
}

/// The directories of the checkout `root` whose entries differ between two listings (an
/// entry added, removed, or renamed over: a new inode under an old name), and the new ones, in
/// the order they must be synced: the object store first, then the working tree, then the refs
/// and `.git` itself (index, HEAD, packed-refs), so that no ref is durable before the objects
/// it names; deepest first within each, so that a new directory is durable before its entry
/// in its parent. Pure.
pub fn dirs_changed(root: &Path, before: &Listing, after: &Listing) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = after
        .iter()
        .filter(|(dir, entries)| before.get(*dir) != Some(*entries))
        .map(|(dir, _)| dir.clone())
        .collect();
    let rank = |d: &Path| {
        let rel = d.strip_prefix(root).unwrap_or(d);
        let group = if rel.starts_with(".git/objects") {
            0
        } else if rel.starts_with(".git/refs") || rel == Path::new(".git") {
            2
        } else {
            1
        };
        (group, std::cmp::Reverse(rel.components().count()))
    };
    out.sort_by_key(|d| rank(d));
    out
}

/// Whether `git SUBCOMMAND` may write in the checkout (objects, refs, the index, the working
/// tree), so that the store syncs what it wrote. Pure.
fn git_writes(subcommand: &str) -> bool {
    !matches!(
        subcommand,
        "rev-parse" | "symbolic-ref" | "log" | "rev-list" | "cat-file" | "diff" | "show"
    )
}

/// Most bytes of committed files that wait for a push ([`push_due`]): a quarter of a
/// GiB, far under GitHub's 2 GiB per push, and several 45 MiB chunks per push.
pub const PUSH_BATCH_BYTES: u64 = 256 << 20;

/// Whether a commit that just wrote `file_name` (the file name of a branch-layout path) must be
/// pushed now, with `waiting` the commits not pushed yet (this one included). Pure.
///
/// A chunk (`NAME.chunkNNofMM`) or a `.sha256` sidecar makes nothing visible by itself: a chunk
/// set is present only once its `.chunkmanifest` is (docs/formats.md, "Reading"), so these wait
/// until [`PUSH_BATCH_BYTES`] have piled up. Everything else (a chunk manifest, a generation
/// manifest, a signature, a plain artifact) completes something and is pushed at once, with
/// every commit before it.
pub fn push_due(file_name: &str, waiting: Unpushed) -> bool {
    if waiting.commits == 0 {
        return false;
    }
    let waits = is_chunk_file(file_name) || file_name.ends_with(".sha256");
    !waits || waiting.bytes >= PUSH_BATCH_BYTES
}

/// `NAME.chunkNNofMM` with a non-empty `NAME`.
fn is_chunk_file(file_name: &str) -> bool {
    matches!(
        chunker::member_form(file_name),
        Some((_, Form::Chunk { .. }))
    )
}

/// How long [`GithubStore::open`] waits for another publish to the same checkout, or the `git
/// push` of an interrupted one, to let go of the checkout.
pub const LOCK_WAIT: Duration = Duration::from_secs(300);
/// The publish lock's file name in the checkout's git directory.
pub const LOCK_FILE: &str = "starpilot-publish.lock";

/// The publish locks this process holds, by git directory.
static HELD_LOCKS: std::sync::Mutex<
    std::collections::BTreeMap<PathBuf, std::sync::Weak<std::fs::File>>,
> = std::sync::Mutex::new(std::collections::BTreeMap::new());

impl GithubStore {
    /// Open a checkout for publishing: fetch `origin`, then check that the checkout is on
    /// `branch`, clean, and at the same commit as `origin/<branch>`.
    pub fn open(checkout: impl Into<PathBuf>, branch: &str) -> Result<Self> {
        Self::open_waiting(checkout, branch, LOCK_WAIT)
    }

    /// [`open`](Self::open), waiting at most `wait` for the checkout's publish lock.
    pub fn open_waiting(
        checkout: impl Into<PathBuf>,
        branch: &str,
        wait: Duration,
    ) -> Result<Self> {
        let checkout: PathBuf = checkout.into();
        let mut store = Self {
            files: LocalStore::new(checkout.clone()),
            checkout,
            branch: branch.to_string(),
            remote: "origin".to_string(),
            _lock: None,
            unpushed: Arc::default(),
        };
        let version = Command::new("git").arg("--version").output();
        let version = version.map_err(|source| store.git_failed(source))?.stdout;
        if let Some(problem) = git_version_problem(&String::from_utf8_lossy(&version)) {
            return Err(store.refuse(problem));
        }
        if fs_err::symlink_metadata(store.checkout.join(".git")).is_ok_and(|m| m.is_file()) {
            return Err(store.refuse(
                "its .git is a file (a `git worktree` or a submodule): its objects and refs live \
                 in another directory, outside the ones this store makes durable after each git \
                 command; publish from a plain clone (`git clone --branch Models URL DIR`, then \
                 github:DIR)",
            ));
        }
        if store.checkout.join(".git").exists() {
            let git_dir = PathBuf::from(store.git(["rev-parse", "--absolute-git-dir"])?);
            // Another store of this process on the same checkout shares its lock (an flock
            // taken twice by one process would wait for itself); that one recovered already.
            let mut held = HELD_LOCKS.lock().unwrap_or_else(|p| p.into_inner());
            held.retain(|_, lock| lock.strong_count() > 0);
            if let Some(lock) = held.get(&git_dir).and_then(std::sync::Weak::upgrade) {
                store._lock = Some(lock);
            } else {
                let lock = Arc::new(store.take_lock(&git_dir, wait)?);
                held.insert(git_dir.clone(), Arc::downgrade(&lock));
                drop(held);
                store._lock = Some(lock);
                store.recover(&git_dir)?;
            }
        }
        store.check_ready()?;
        Ok(store)
    }

    /// The checkout's publish lock, waiting up to `wait` for its holder (another publish, or
    /// the orphaned `git push` of a killed one) to end. Its descriptor stays close-on-exec:
    /// [`git_command`](Self::git_command) hands it to this store's own `git` children only.
    fn take_lock(&self, git_dir: &Path, wait: Duration) -> Result<std::fs::File> {
        let path = git_dir.join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| Error::StoreRead {
                what: path.display().to_string(),
                source,
            })?;
        let began = Instant::now();
        let mut said = false;
        loop {
            // std's file lock is flock(2) on Unix: held by the open file description, so the
            // `git` children that inherit the descriptor keep holding it.
            match file.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(source)) => {
                    return Err(Error::StoreRead {
                        what: path.display().to_string(),
                        source,
                    });
                }
            }
            if began.elapsed() >= wait {
                return Err(self.refuse(format!(
                    "another publish to this checkout, or the `git push` of an interrupted one, still holds {} after {} s; let it finish (or find it with `fuser {}` and stop it), then rerun",
                    path.display(),
                    wait.as_secs(),
                    cli_support::shell_quote(&path.to_string_lossy())
                )));
            }
            if !said {
                tracing::info!(
                    "waiting for another publish to {} (or an interrupted one's git push) to finish",
                    self.checkout.display()
                );
                said = true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(file)
    }

    /// `git -C CHECKOUT -c … ARGS`, never waiting for a password prompt, inheriting the publish
    /// lock (and no other process this program starts does: a Hub upload or another test's
    /// `git` must not hold this checkout's lock).
    fn git_command<S: AsRef<OsStr>>(&self, args: &[S]) -> Command {
        let mut cmd = Command::new("git");
        cmd.arg("-C")
            .arg(&self.checkout)
            .args(git_config_args())
            .args(args)
            .env("GIT_TERMINAL_PROMPT", "0");
        if let Some(lock) = &self._lock {
            use std::os::fd::AsRawFd;
            use std::os::unix::process::CommandExt;
            let fd = lock.as_raw_fd();
            // SAFETY: runs in the child between fork and exec and only calls fcntl(2), which is
            // async-signal-safe; it clears FD_CLOEXEC on the lock so `git` keeps it.
            unsafe {
                cmd.pre_exec(move || {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd
    }

    /// Holding the publish lock: remove git's stale lock files and put back to `HEAD` what an
    /// interrupted publish left in the working tree (module docs). A tree with anything else
    /// in it is left for [`check_ready`](Self::check_ready) to refuse.
    fn recover(&self, git_dir: &Path) -> Result<()> {
        let locks = [
            "index.lock".to_string(),
            "HEAD.lock".to_string(),
            "packed-refs.lock".to_string(),
            format!("refs/heads/{}.lock", self.branch),
            format!("refs/remotes/{}/{}.lock", self.remote, self.branch),
        ];
        for lock in locks {
            let p = git_dir.join(&lock);
            if p.is_file() {
                fs_err::remove_file(&p)?;
                tracing::info!("removed {} left by an interrupted git command", p.display());
            }
        }
        let status = self.git_raw(["status", "--porcelain=v1", "-z", "--untracked-files=all"])?;
        let Ok(paths) = leftovers(&status) else {
            return Ok(());
        };
        if paths.is_empty() {
            return Ok(());
        }
        let mut args: Vec<String> = vec!["reset".into(), "--quiet".into(), "--".into()];
        args.extend(paths.iter().cloned());
        self.git(&args)?;
        for p in &paths {
            let in_head = self.git(["cat-file", "-e", &format!("HEAD:{p}")]).is_ok();
            if in_head {
                self.git(["checkout", "--quiet", "HEAD", "--", p])?;
            } else {
                chunker::atomic::remove_if_exists(self.checkout.join(p))?;
            }
        }
        tracing::info!(
            "put back {} file(s) an interrupted publish left in {}",
            paths.len(),
            self.checkout.display()
        );
        Ok(())
    }

    /// The checkout's working tree.
    pub fn checkout(&self) -> &Path {
        &self.checkout
    }

    /// The branch published to.
    pub fn branch(&self) -> &str {
        &self.branch
    }

    fn refuse(&self, reason: impl Into<String>) -> Error {
        Error::GitRefused {
            checkout: self.checkout.clone(),
            reason: reason.into(),
        }
    }

    /// The three preconditions, checked before anything is written.
    pub fn check_ready(&self) -> Result<()> {
        if !self.checkout.join(".git").exists() {
            return Err(self.refuse(
                "not a git checkout; clone the resources repository and check out the Models branch",
            ));
        }
        let head = self
            .git(["symbolic-ref", "--quiet", "--short", "HEAD"])
            .map_err(|_| {
                self.refuse(format!(
                    "HEAD is detached; run `git checkout {}`",
                    self.branch
                ))
            })?;
        if head != self.branch {
            return Err(self.refuse(format!(
                "on branch {head:?}, not {:?}; run `git checkout {}`",
                self.branch, self.branch
            )));
        }
        let dirty = self.git(["status", "--porcelain", "--untracked-files=all"])?;
        if !dirty.is_empty() {
            let shown: Vec<&str> = dirty.lines().take(5).collect();
            return Err(self.refuse(format!(
                "has uncommitted changes ({}{}); commit or remove them first",
                shown.join(", "),
                if dirty.lines().count() > 5 {
                    ", …"
                } else {
                    ""
                }
            )));
        }
        self.git(["fetch", "--quiet", &self.remote, &self.branch])?;
        let local = self.git(["rev-parse", "HEAD"])?;
        let remote_ref = format!("refs/remotes/{}/{}", self.remote, self.branch);
        let remote = self
            .git(["rev-parse", "--verify", "--quiet", &remote_ref])
            .map_err(|_| {
                self.refuse(format!(
                    "{}/{} does not exist; push the branch first",
                    self.remote, self.branch
                ))
            })?;
        if local != remote {
            let counts = self.git([
                "rev-list",
                "--left-right",
                "--count",
                &format!("HEAD...{remote_ref}"),
            ])?;
            let mut it = counts.split_whitespace();
            let (ahead, behind) = (it.next().unwrap_or("?"), it.next().unwrap_or("?"));
            // An interrupted publish leaves its own commits unpushed: a rerun pushes them.
            let subjects = self.git(["log", "--format=%s", &format!("{remote_ref}..HEAD")])?;
            if behind == "0" && is_resumable(&subjects) {
                return self.push(&mut |_| {});
            }
            // A power cut after a push reached the origin can take the checkout's own record
            // of it (its commits, its refs) away: the checkout is then behind an origin that
            // holds exactly our publish commits, and catching up is finishing the publish.
            if ahead == "0" {
                let log = self.git([
                    "log",
                    "--format=%x1e%s",
                    "--name-only",
                    "--no-renames",
                    &format!("HEAD..{remote_ref}"),
                ])?;
                return match theirs_behind(&log) {
                    None => {
                        self.git(["merge", "--ff-only", "--quiet", &remote_ref])?;
                        tracing::info!(
                            "caught {} up with the {behind} publish commit(s) {}/{} already took",
                            self.checkout.display(),
                            self.remote,
                            self.branch
                        );
                        Ok(())
                    }
                    Some(subject) => Err(self.refuse(format!(
                        "{behind} commit(s) behind {}/{}, and not all of them are publish commits (\"{subject}\" is not one: a publish commit writes or removes exactly the file its subject names); look at them with `git -C {} log HEAD..{remote_ref}`, then run `git -C {} merge --ff-only {remote_ref}` and rerun",
                        self.remote,
                        self.branch,
                        cli_support::shell_quote(&self.checkout.to_string_lossy()),
                        cli_support::shell_quote(&self.checkout.to_string_lossy())
                    ))),
                };
            }
            return Err(self.refuse(format!(
                "not in sync with {}/{}: {ahead} commit(s) ahead, {behind} behind; run `git pull --ff-only` or push first",
                self.remote, self.branch
            )));
        }
        Ok(())
    }

    /// Push `HEAD` to the branch. A rejection (the remote moved, a protected branch, no
    /// permission) is reported at once with what to do; only transport failures are retried.
    /// `git push --progress` runs with its stderr read as it comes: each "Writing objects"
    /// byte figure goes to `report` as a [`Transfer::Push`] for the commits waiting, and a push
    /// that ends well as [`Transfer::Pushed`].
    fn push(&self, report: &mut dyn FnMut(Transfer)) -> Result<()> {
        let waiting = self.unpushed().bytes;
        let refspec = format!("HEAD:refs/heads/{}", self.branch);
        let args = ["push", "--progress", &self.remote, &refspec];
        let mut on_segment = |seg: &str| {
            if let Some(written) = parse_git_push_bytes(seg) {
                report(Transfer::Push { written, waiting });
            }
            is_push_progress(seg)
        };
        let pushed = match self.git_streaming(&args, &mut on_segment) {
            Err(Error::Git { stderr, .. }) if push_rejected(&stderr) => Err(Error::PushRejected {
                checkout: self.checkout.clone(),
                remote: self.remote.clone(),
                branch: self.branch.clone(),
                stderr,
            }),
            other => other.map(|_| ()),
        };
        if pushed.is_ok() {
            *self.unpushed.lock().unwrap_or_else(|p| p.into_inner()) = Unpushed::default();
            report(Transfer::Pushed);
        }
        pushed
    }

    /// Run `git ARGS` in the checkout with its stderr read as it comes: each segment (a line or
    /// a `\r`-ended redraw, ANSI codes removed) goes to `on_segment`, which says whether it was
    /// progress; the rest is the error text when git fails.
    fn git_streaming(&self, args: &[&str], on_segment: &mut dyn FnMut(&str) -> bool) -> Result<()> {
        use std::process::Stdio;
        let before = self.before_git(args);
        let child = self
            .git_command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| self.git_failed(source))?;
        let Finished { status, kept, .. } =
            wait_reading_progress(child, on_segment).map_err(|source| self.git_failed(source))?;
        self.after_git(args, before)?;
        if !status.success() {
            return Err(self.git_error(args.join(" "), status, &kept));
        }
        Ok(())
    }

    /// The commits this store made and has not pushed yet.
    pub fn unpushed(&self) -> Unpushed {
        *self.unpushed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn git<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.git_raw(args).map(|out| out.trim().to_string())
    }

    /// [`git`](Self::git) with stdout as it is (no trimming: `-z` output).
    fn git_raw<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let before = self.before_git(&args);
        let out = self
            .git_command(&args)
            .output()
            .map_err(|source| self.git_failed(source))?;
        self.after_git(&args, before)?;
        if !out.status.success() {
            let shown: Vec<_> = args.iter().map(|a| a.to_string_lossy()).collect();
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(self.git_error(shown.join(" "), out.status, &stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Before a git command: the checkout's directories and their entries when the command
    /// may write ([`git_writes`]), for [`after_git`](Self::after_git) to sync what changed.
    fn before_git<S: AsRef<OsStr>>(&self, args: &[S]) -> Option<Listing> {
        let writes = args
            .first()
            .and_then(|a| a.as_ref().to_str())
            .is_none_or(git_writes);
        writes.then(|| listing(&self.checkout))
    }

    /// After a git command (ended well or not): announce it to a crash-enumeration observer
    /// (with the `-c` settings it ran with), then fsync every directory of the checkout whose
    /// entries it changed (deepest first). git fsyncs the files it writes (`core.fsync`) but no
    /// directory, so under strict POSIX the renames of its objects, refs and index, and the
    /// directories it creates, are durable only then; each command's effects are durable
    /// before the next one starts.
    fn after_git<S: AsRef<OsStr>>(&self, args: &[S], before: Option<Listing>) -> Result<()> {
        let mut all: Vec<std::ffi::OsString> =
            git_config_args().into_iter().map(Into::into).collect();
        all.extend(args.iter().map(|a| a.as_ref().to_owned()));
        chunker::effects::note(chunker::effects::Effect::Ran {
            dir: &self.checkout,
            args: &all,
        });
        if let Some(before) = before {
            for dir in dirs_changed(&self.checkout, &before, &listing(&self.checkout)) {
                chunker::atomic::sync_dir(&dir)?;
            }
        }
        Ok(())
    }

    /// `git ARGS` ended with `status`, saying `stderr`.
    fn git_error(&self, args: String, status: std::process::ExitStatus, stderr: &str) -> Error {
        Error::Git {
            checkout: self.checkout.clone(),
            args,
            status: status.to_string(),
            stderr: stderr.trim().to_string(),
        }
    }

    /// `git` could not be started (not installed, no such checkout directory).
    fn git_failed(&self, source: std::io::Error) -> Error {
        Error::Child {
            program: format!("git in {}", self.checkout.display()),
            source,
        }
    }

    fn branch_path(&self, path: &StorePath) -> Result<StorePath> {
        bucket_to_github(path).ok_or_else(|| Error::Unsupported {
            store: self.describe(),
            path: path.to_string(),
            reason: "the Models branch holds only manifests/model_names_<gen>.json and models/<gen>/<id>/<file>".into(),
        })
    }

    /// Commit `rel` (already staged or removed) if it changed, `bytes` long, then push if
    /// [`push_due`] (or `push_now`) says so. Idempotent: after a failed push, calling it again
    /// pushes the existing commits.
    fn commit_and_push(
        &self,
        rel: &StorePath,
        message: &str,
        bytes: u64,
        push_now: bool,
        report: &mut dyn FnMut(Transfer),
    ) -> Result<()> {
        let unchanged = self
            .git_command(&["diff", "--cached", "--quiet", "--", rel.as_str()])
            .status()
            .map_err(|source| self.git_failed(source))?
            .success();
        let waiting = {
            let mut u = self.unpushed.lock().unwrap_or_else(|p| p.into_inner());
            if !unchanged {
                self.git(["commit", "--quiet", "-m", message, "--", rel.as_str()])?;
                u.commits += 1;
                u.bytes += bytes;
            }
            *u
        };
        if !unchanged {
            report(Transfer::Staged { bytes });
        }
        if push_now || push_due(rel.file_name(), waiting) || (unchanged && waiting.commits == 0) {
            // Unchanged and nothing waiting: push anyway, in case an earlier attempt committed
            // and then failed to push (the remote may be behind).
            self.push(report)?;
        }
        Ok(())
    }
}

/// The working-tree paths an interrupted publish left, from `git status --porcelain=v1 -z
/// --untracked-files=all`: `Ok(paths)` when every changed path is one a publish writes (a file
/// of the branch layout, or an atomic writer's temporary of one) in a state a killed `git add`,
/// `git rm` or `git commit` leaves (untracked, added, modified, deleted, staged or not);
/// `Err(path)` names the first that is not, and then nothing is touched. Pure.
pub fn leftovers(porcelain_z: &str) -> std::result::Result<Vec<String>, String> {
    let mut out = Vec::new();
    for record in porcelain_z.split('\0').filter(|r| !r.is_empty()) {
        let (Some(code), Some(path)) = (record.get(..2), record.get(3..)) else {
            return Err(record.to_string());
        };
        let simple = code
            .chars()
            .all(|c| matches!(c, ' ' | '?' | 'A' | 'M' | 'D'));
        if !simple || !publish_writes(path) {
            return Err(path.to_string());
        }
        out.push(path.to_string());
    }
    Ok(out)
}

/// Whether a publish writes `path` (relative to the checkout): a branch-layout file, or the
/// atomic writer's temporary for one.
fn publish_writes(path: &str) -> bool {
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    let name = temp_owner(name).map_or(name, |(_, dest)| dest);
    let full = if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    };
    full.parse::<StorePath>()
        .ok()
        .and_then(|p| github_to_bucket(&p))
        .is_some()
}

/// Whether commits ahead of the remote (subjects, newest first) are all publish commits this
/// store made, so pushing them on a rerun is finishing an interrupted publish.
fn is_resumable(subjects: &str) -> bool {
    let mut any = false;
    for line in subjects.lines() {
        any = true;
        if !(line.starts_with("Publish ") || line.starts_with("Remove ")) {
            return false;
        }
    }
    any
}

/// Of the commits a checkout lacks (`git log --format=%x1e%s --name-only --no-renames
/// HEAD..origin/<branch>`), the subject of the first that is not a publish commit of this store
/// (`Publish <path>` or `Remove <path>` changing exactly that branch-layout file, nothing
/// else); `None` when every one is, so catching up is finishing our own publish. Pure.
pub fn theirs_behind(log: &str) -> Option<String> {
    for record in log.split('\x1e').filter(|r| !r.trim().is_empty()) {
        let mut lines = record.lines();
        let subject = lines.next().unwrap_or_default().trim().to_string();
        let files: Vec<&str> = lines.map(str::trim).filter(|l| !l.is_empty()).collect();
        let named = subject
            .strip_prefix("Publish ")
            .or_else(|| subject.strip_prefix("Remove "));
        let ours = named.is_some_and(|path| {
            files == [path]
                && path
                    .parse::<StorePath>()
                    .ok()
                    .and_then(|p| github_to_bucket(&p))
                    .is_some()
        });
        if !ours {
            return Some(subject);
        }
    }
    None
}

/// Whether a segment of `git push --progress`'s stderr is one of its progress phases (left out
/// of the error text kept for a failed push). Pure.
fn is_push_progress(segment: &str) -> bool {
    const PHASES: [&str; 6] = [
        "Enumerating objects:",
        "Counting objects:",
        "Compressing objects:",
        "Writing objects:",
        "Delta compression using",
        "Total ",
    ];
    let s = segment.trim_start();
    PHASES.iter().any(|p| s.starts_with(p))
}

/// Whether `git push`'s stderr is a refusal (retrying cannot help) rather than a transport
/// failure.
fn push_rejected(stderr: &str) -> bool {
    const MARKS: [&str; 9] = [
        "[rejected]",
        "[remote rejected]",
        "non-fast-forward",
        "fetch first",
        "pre-receive hook declined",
        "protected branch",
        "Permission to",
        "permission denied",
        "The requested URL returned error: 403",
    ];
    let lower = stderr.to_lowercase();
    MARKS.iter().any(|m| lower.contains(&m.to_lowercase()))
}

impl Store for GithubStore {
    fn name(&self) -> StoreName {
        StoreName {
            name: format!("github:{}", self.checkout.display()),
            layout: StoreLayout::GithubBranch,
        }
    }

    fn reads_are_local(&self) -> bool {
        true
    }

    fn stat(&self, path: &StorePath) -> Result<Option<FileStat>> {
        match bucket_to_github(path) {
            Some(rel) => self.files.stat(&rel),
            None => Ok(None),
        }
    }

    fn open(&self, path: &StorePath) -> Result<Box<dyn Read + Send>> {
        let not_found = || Error::NotFound {
            store: self.describe(),
            path: path.to_string(),
        };
        let rel = bucket_to_github(path).ok_or_else(not_found)?;
        self.files.open(&rel).map_err(|e| match e {
            Error::NotFound { .. } => not_found(),
            other => other,
        })
    }

    fn read_at(&self, path: &StorePath, offset: u64, buf: &mut [u8]) -> Result<()> {
        let rel = bucket_to_github(path).ok_or_else(|| Error::NotFound {
            store: self.describe(),
            path: path.to_string(),
        })?;
        self.files.read_at(&rel, offset, buf)
    }

    /// The copy into the checkout is local; what reaches the remote is each push's: the file is
    /// reported [`Transfer::Staged`] once committed, then the pushes it triggers.
    fn write_reporting(
        &self,
        path: &StorePath,
        src: &mut dyn Read,
        report: &mut dyn FnMut(Transfer),
    ) -> Result<u64> {
        let rel = self.branch_path(path)?;
        let n = self.files.write(&rel, src)?;
        self.git(["add", "--", rel.as_str()])?;
        self.commit_and_push(&rel, &format!("Publish {rel}"), n, false, report)?;
        Ok(n)
    }

    fn list(&self, prefix: &StorePath) -> Result<Vec<ListEntry>> {
        // `manifests` has no directory of its own on the branch: its files sit at the root.
        if prefix.as_str() == "manifests" {
            let mut out = Vec::new();
            for entry in fs_err::read_dir(&self.checkout)? {
                let entry = entry?;
                let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                let Ok(rel) = name.parse::<StorePath>() else {
                    continue;
                };
                if let Some(bucket) = github_to_bucket(&rel)
                    && let Some(stat) = self.files.stat(&rel)?
                {
                    out.push(ListEntry {
                        path: bucket,
                        size: stat.size,
                    });
                }
            }
            out.sort_by(|a, b| a.path.cmp(&b.path));
            return Ok(out);
        }
        let Some(rel) = bucket_to_github(prefix).or_else(|| {
            // `models/<gen>` is a directory prefix; map it by hand.
            let rest = prefix.as_str().strip_prefix("models/")?;
            rest.parse().ok()
        }) else {
            return Ok(Vec::new());
        };
        let mut out: Vec<ListEntry> = self
            .files
            .list(&rel)?
            .into_iter()
            .filter_map(|e| {
                Some(ListEntry {
                    path: github_to_bucket(&e.path)?,
                    size: e.size,
                })
            })
            .collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn delete(&self, path: &StorePath) -> Result<bool> {
        let rel = self.branch_path(path)?;
        if self.files.stat(&rel)?.is_none() {
            return Ok(false);
        }
        self.git(["rm", "--quiet", "--", rel.as_str()])?;
        self.commit_and_push(&rel, &format!("Remove {rel}"), 0, true, &mut |_| {})?;
        Ok(true)
    }

    /// Push the commits [`push_due`] let wait.
    fn flush(&self) -> Result<()> {
        self.flush_reporting(&mut |_| {})
    }

    fn flush_reporting(&self, report: &mut dyn FnMut(Transfer)) -> Result<()> {
        if self.unpushed().commits > 0 {
            self.push(report)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `git --version` outputs: 2.36 and later pass (release, vendor suffixes), older ones are
    /// refused naming the version and what to install, unreadable output is refused too.
    #[test]
    fn git_older_than_2_36_is_refused() {
        let cases: [(&str, Option<&str>); 9] = [
            ("git version 2.39.5\n", None),
            ("git version 2.36.0", None),
            ("git version 3.0.0", None),
            ("git version 2.39.3 (Apple Git-146)\n", None),
            ("git version 2.47.1.windows.2", None),
            ("git version 2.35.8\n", Some("git 2.35 ignores core.fsync")),
            ("git version 1.8.3.1", Some("git 1.8 ignores core.fsync")),
            ("git version", Some("cannot tell git's version")),
            ("", Some("cannot tell git's version")),
        ];
        for (output, want) in cases {
            let got = git_version_problem(output);
            match (&got, want) {
                (None, None) => {}
                (Some(p), Some(w)) => {
                    assert!(
                        p.contains(w) && p.contains("install git 2.36"),
                        "{output}: {p}"
                    )
                }
                _ => panic!("{output:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn rejected_pushes_and_resumable_commits() {
        for (stderr, rejected) in [
            (" ! [rejected]        HEAD -> Models (fetch first)", true),
            (
                " ! [remote rejected] HEAD -> Models (pre-receive hook declined)",
                true,
            ),
            ("remote: error: GH006: Protected branch update failed", true),
            ("remote: Permission to x/y.git denied to bot.", true),
            (
                "fatal: unable to access 'https://github.com/x/': The requested URL returned error: 403",
                true,
            ),
            (
                "fatal: unable to access 'https://github.com/x/': Could not resolve host: github.com",
                false,
            ),
            ("fatal: the remote end hung up unexpectedly", false),
        ] {
            assert_eq!(push_rejected(stderr), rejected, "{stderr}");
        }
        assert!(is_resumable(
            "Publish model_names_v25.json\nRemove v25/p/x.chunkmanifest"
        ));
        assert!(!is_resumable(""));
        assert!(!is_resumable("Publish a\nmy own fix"));
    }

    #[test]
    fn only_our_own_publish_commits_are_caught_up_with() {
        let pub_ = |path: &str| format!("\x1ePublish {path}\n\n{path}\n");
        let rm = |path: &str| format!("\x1eRemove {path}\n\n{path}\n");
        for generation in ["v25", "v26", "v27"] {
            let chunk = format!("{generation}/wm9/wm9_driving_tinygrad.pkl.chunk01of03");
            let set = format!("{generation}/wm9/wm9_driving_tinygrad.pkl.chunkmanifest");
            let manifest = format!("model_names_{generation}.json");
            for (log, want) in [
                (String::new(), None),
                (pub_(&manifest), None),
                (
                    format!("{}{}{}", pub_(&manifest), pub_(&set), rm(&chunk)),
                    None,
                ),
                // Someone's commit, a publish subject over other files, a file outside the
                // branch layout, a merge (no files listed): not ours.
                (
                    format!("{}\x1emy own fix\n\nREADME.md\n", pub_(&set)),
                    Some("my own fix"),
                ),
                (
                    format!("\x1ePublish {set}\n\n{set}\nREADME.md\n"),
                    Some(&format!("Publish {set}")[..]),
                ),
                (
                    "\x1ePublish notes.txt\n\nnotes.txt\n".to_string(),
                    Some("Publish notes.txt"),
                ),
                (
                    format!("\x1ePublish {manifest}\n"),
                    Some(&format!("Publish {manifest}")[..]),
                ),
            ] {
                assert_eq!(theirs_behind(&log).as_deref(), want, "{log:?}");
            }
        }
    }

    #[test]
    fn the_directories_a_git_command_changed_are_synced_deepest_first() {
        let l = |dirs: &[(&str, &[(&str, u64)])]| -> Listing {
            dirs.iter()
                .map(|(d, es)| {
                    (
                        PathBuf::from(d),
                        es.iter().map(|(n, i)| ((*n).into(), *i)).collect(),
                    )
                })
                .collect()
        };
        let before = l(&[
            ("/c", &[(".git", 1), ("v25", 2)]),
            ("/c/.git", &[("index", 3), ("refs", 4)]),
            ("/c/.git/refs", &[]),
            ("/c/v25", &[]),
        ]);
        let root = Path::new("/c");
        // Nothing changed: nothing synced.
        assert!(dirs_changed(root, &before, &before).is_empty());
        // A commit: a new object directory with its object, the branch ref renamed over, the
        // index renamed over (a new inode); and a file in the working tree. The objects go
        // first, the refs and `.git` last.
        let before = l(&[
            ("/c", &[(".git", 1), ("v25", 2)]),
            ("/c/.git", &[("index", 3), ("refs", 4), ("objects", 5)]),
            ("/c/.git/objects", &[("pack", 6)]),
            ("/c/.git/objects/pack", &[]),
            ("/c/.git/refs", &[("heads", 7)]),
            ("/c/.git/refs/heads", &[("Models", 8)]),
            ("/c/v25", &[]),
        ]);
        let after = l(&[
            ("/c", &[(".git", 1), ("v25", 2)]),
            ("/c/.git", &[("index", 9), ("refs", 4), ("objects", 5)]),
            ("/c/.git/objects", &[("pack", 6), ("ab", 10)]),
            ("/c/.git/objects/ab", &[("cdef", 11)]),
            ("/c/.git/objects/pack", &[]),
            ("/c/.git/refs", &[("heads", 7)]),
            ("/c/.git/refs/heads", &[("Models", 13)]),
            ("/c/v25", &[("x", 12)]),
        ]);
        assert_eq!(
            dirs_changed(root, &before, &after),
            [
                "/c/.git/objects/ab",
                "/c/.git/objects",
                "/c/v25",
                "/c/.git/refs/heads",
                "/c/.git"
            ]
            .map(PathBuf::from)
            .to_vec()
        );
    }

    #[test]
    fn every_git_command_runs_durable_and_writers_are_synced() {
        let args = git_config_args();
        for c in [
            "core.fsync=all",
            "core.fsyncMethod=fsync",
            BIG_FILE_THRESHOLD,
        ] {
            assert!(args.windows(2).any(|w| w == ["-c", c]), "{c}");
        }
        for (sub, writes) in [
            ("add", true),
            ("commit", true),
            ("push", true),
            ("fetch", true),
            ("merge", true),
            ("reset", true),
            ("checkout", true),
            ("status", true),
            ("rev-parse", false),
            ("log", false),
            ("diff", false),
        ] {
            assert_eq!(git_writes(sub), writes, "{sub}");
        }
    }

    #[test]
    fn pushes_wait_for_the_file_that_completes_something_or_a_full_batch() {
        // A made-up next generation with a made-up pin changes nothing: the rule reads only
        // the file's kind.
        for generation in ["v25", "v26"] {
            let chunk = format!("{generation}/pop/pop_driving_tinygrad.pkl.chunk02of04");
            let sidecar = format!("{generation}/pop/pop_driving_tinygrad.pkl.sha256");
            let set = format!("{generation}/pop/pop_driving_tinygrad.pkl.chunkmanifest");
            let plain = format!("{generation}/pop/pop_driving_tinygrad.pkl");
            let manifest = format!("model_names_{generation}.json");
            let signature = format!("model_names_{generation}.json.minisig");
            let w = |commits, bytes| Unpushed { commits, bytes };
            let full = PUSH_BATCH_BYTES;
            for (path, waiting, due) in [
                // Nothing committed: nothing to push.
                (&set, w(0, 0), false),
                (&chunk, w(0, full), false),
                // Chunks and sidecars wait for their chunk manifest, or a full batch.
                (&chunk, w(1, 45 << 20), false),
                (&chunk, w(5, full - 1), false),
                (&chunk, w(6, full), true),
                (&sidecar, w(4, 180 << 20), false),
                (&sidecar, w(7, full + 1), true),
                // What completes something goes at once, with everything before it.
                (&set, w(1, 1), true),
                (&set, w(6, 180 << 20), true),
                (&plain, w(1, 45 << 20), true),
                (&manifest, w(1, 900), true),
                (&signature, w(2, 300), true),
            ] {
                let name = path.rsplit('/').next().unwrap();
                assert_eq!(push_due(name, waiting), due, "{path} {waiting:?}");
            }
        }
        // Only the exact chunk form waits.
        for (name, chunk) in [
            ("m.pkl.chunk01of02", true),
            ("m.pkl.chunk1of2", false),
            (".chunk01of02", false),
            ("m.pkl.chunk01of02.bak", false),
            ("m.pkl.chunkmanifest", false),
        ] {
            assert_eq!(is_chunk_file(name), chunk, "{name}");
        }
    }

    #[test]
    fn what_an_interrupted_publish_leaves_is_put_back_and_nothing_else() {
        let chunk = "v25/pop/pop_driving_tinygrad.pkl.chunk01of02";
        for (status, want) in [
            ("", Ok(vec![])),
            (&format!("?? {chunk}\0")[..], Ok(vec![chunk.to_string()])),
            (&format!("A  {chunk}\0"), Ok(vec![chunk.to_string()])),
            (&format!("AM {chunk}\0"), Ok(vec![chunk.to_string()])),
            (
                "M  model_names_v25.json\0 D v26/x/x_driving_tinygrad.pkl.sha256\0",
                Ok(vec![
                    "model_names_v25.json".to_string(),
                    "v26/x/x_driving_tinygrad.pkl.sha256".to_string(),
                ]),
            ),
            (
                "?? v25/pop/.tmp-4242-7-pop_driving_tinygrad.pkl.chunk02of02\0",
                Ok(vec![
                    "v25/pop/.tmp-4242-7-pop_driving_tinygrad.pkl.chunk02of02".to_string(),
                ]),
            ),
            (
                "?? .tmp-1-2-model_names_v26.json\0",
                Ok(vec![".tmp-1-2-model_names_v26.json".to_string()]),
            ),
            // A person's file, a file outside the layout, a rename, a conflict: refused.
            ("?? stray.txt\0", Err("stray.txt".to_string())),
            (" M README.md\0", Err("README.md".to_string())),
            (
                &format!("?? {chunk}\0?? notes/todo.md\0"),
                Err("notes/todo.md".to_string()),
            ),
            (&format!("UU {chunk}\0"), Err(chunk.to_string())),
            (&format!("R  {chunk}\0old\0"), Err(chunk.to_string())),
            (
                "?? .tmp-1-2-README.md\0",
                Err(".tmp-1-2-README.md".to_string()),
            ),
        ] {
            assert_eq!(leftovers(status), want, "{status:?}");
        }
    }
}
