//! The GitHub `Models` branch store: a git checkout of `firestar5683/StarPilot-Resources` on
//! branch `Models`, published by committing and pushing.
//!
//! - It refuses a checkout that is dirty, on another branch, or not in sync with its origin after
//!   a fetch: publishing from such a tree would push someone else's changes or fail halfway.
//! - Store paths are in the bucket layout and mapped to the branch layout
//!   (`model_names_<gen>.json`, `<gen>/<id>/<file>`) by `manifest::layout` ([`StoreLayout::translate`]).
//! - Every write is one commit and one push, so every push stays under GitHub's 100 MB limit
//!   (chunks are 45 MiB) and an interrupted publish leaves whole files on the remote. Publish
//!   writes the manifest last.
//!
//! Reads come from the working tree, which the checks above keep equal to the remote branch.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use manifest::StoreLayout;

use crate::error::{Error, Result};
use crate::local::LocalStore;
use crate::paths::StorePath;
use crate::store::{FileStat, ListEntry, Store};

/// Bucket layout (what every [`Store`] speaks) → branch layout; `None` for what the branch
/// does not hold.
pub(crate) fn bucket_to_github(path: &StorePath) -> Option<StorePath> {
    StoreLayout::HfBucket.translate(path, StoreLayout::GithubBranch)
}

/// Branch layout → bucket layout; `None` for files outside the layout (README, leftovers).
pub(crate) fn github_to_bucket(path: &StorePath) -> Option<StorePath> {
    StoreLayout::GithubBranch.translate(path, StoreLayout::HfBucket)
}

#[derive(Debug, Clone)]
pub struct GithubStore {
    checkout: PathBuf,
    branch: String,
    remote: String,
    files: LocalStore,
}

impl GithubStore {
    /// Open a checkout for publishing: fetch `origin`, then check that the checkout is on
    /// `branch`, clean, and at the same commit as `origin/<branch>`.
    pub fn open(checkout: impl Into<PathBuf>, branch: &str) -> Result<Self> {
        let checkout: PathBuf = checkout.into();
        let store = Self {
            files: LocalStore::new(checkout.clone()),
            checkout,
            branch: branch.to_string(),
            remote: "origin".to_string(),
        };
        store.check_ready()?;
        Ok(store)
    }

    pub fn checkout(&self) -> &Path {
        &self.checkout
    }

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
                return self.push();
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
    fn push(&self) -> Result<()> {
        match self.git([
            "push",
            "--quiet",
            &self.remote,
            &format!("HEAD:refs/heads/{}", self.branch),
        ]) {
            Err(Error::Git { stderr, .. }) if push_rejected(&stderr) => Err(Error::PushRejected {
                checkout: self.checkout.clone(),
                remote: self.remote.clone(),
                branch: self.branch.clone(),
                stderr,
            }),
            other => other.map(|_| ()),
        }
    }

    fn git<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let out = Command::new("git")
            .arg("-C")
            .arg(&self.checkout)
            .args(&args)
            // Never wait for a password prompt: fail and say so.
            .env("GIT_TERMINAL_PROMPT", "0")
            .output()
            .map_err(|source| self.git_failed(source))?;
        if !out.status.success() {
            return Err(Error::Git {
                checkout: self.checkout.clone(),
                args: args
                    .iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
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

    /// Commit `rel` (already staged or removed) if it changed, then push. Idempotent: after a
    /// failed push, calling it again pushes the existing commit.
    fn commit_and_push(&self, rel: &StorePath, message: &str) -> Result<()> {
        let unchanged = Command::new("git")
            .arg("-C")
            .arg(&self.checkout)
            .args(["diff", "--cached", "--quiet", "--", rel.as_str()])
            .status()
            .map_err(|source| self.git_failed(source))?
            .success();
        if !unchanged {
            self.git(["commit", "--quiet", "-m", message, "--", rel.as_str()])?;
        }
        self.push()
    }
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
    fn describe(&self) -> String {
        format!("github:{}", self.checkout.display())
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
        let rel = bucket_to_github(path).ok_or_else(|| Error::NotFound {
            store: self.describe(),
            path: path.to_string(),
        })?;
        self.files.open(&rel).map_err(|e| match e {
            Error::NotFound { .. } => Error::NotFound {
                store: self.describe(),
                path: path.to_string(),
            },
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

    fn write(&self, path: &StorePath, src: &mut dyn Read) -> Result<u64> {
        let rel = self.branch_path(path)?;
        let n = self.files.write(&rel, src)?;
        self.git(["add", "--", rel.as_str()])?;
        self.commit_and_push(&rel, &format!("Publish {rel}"))?;
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
        self.commit_and_push(&rel, &format!("Remove {rel}"))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
