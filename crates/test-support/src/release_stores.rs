//! Stand-ins for the release engineer's two remote stores:
//!
//! - [`StandinHf`]: an executable named `hf` that records every call (one line of arguments per
//!   call) and carries out `hf buckets cp SRC DST` and `hf buckets rm URI --yes` on a local
//!   directory, refusing what the real CLI refuses (see the script). The Hub tests run the real
//!   CLI against `crate::hub`; this stand-in is for failures that cannot be had from it.
//!   It maps `hf://buckets/NS/NAME/PATH` ↔ `<root>/buckets/NS/NAME/PATH` (and `hf://datasets/…` ↔
//!   `<root>/datasets/…`). Serve `<root>/buckets/NS/NAME` over HTTP to stand in for Hub reads.
//!   Failures can be injected: the next N calls fail, or every call after N successful ones
//!   (an interrupted run).
//! - [`GitRemote`]: a real bare repository as `origin` and a clone of it on branch `Models`.
//!
//! Optionally both append to one journal file (`hf …` lines from the stand-in, `git <subject>`
//! lines from a post-commit hook), so a test can assert the order of writes across stores.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const SCRIPT: &str = r#"#!/usr/bin/env bash
# Stand-in for the Hugging Face `hf` CLI (tests only). Acts on a local directory, and refuses
# what huggingface_hub 2.4.0's `hf` refuses: options before the subcommand, `rm` without --yes
# (it asks, and with no terminal aborts), a bucket that does not exist, a missing source.
set -u
ROOT=__ROOT__
LOG=__LOG__
JOURNAL=__JOURNAL__
printf '%s\n' "$*" >> "$LOG"
if [ -n "$JOURNAL" ]; then printf 'hf %s\n' "$*" >> "$JOURNAL"; fi

if [ -f "$ROOT/.fail-next" ]; then
  n=$(cat "$ROOT/.fail-next")
  if [ "$n" -gt 0 ]; then
    echo $((n - 1)) > "$ROOT/.fail-next"
    echo "stand-in hf: injected failure" >&2
    exit 1
  fi
fi
if [ -f "$ROOT/.budget" ]; then
  n=$(cat "$ROOT/.budget")
  if [ "$n" -le 0 ]; then
    echo "stand-in hf: connection lost (budget used up)" >&2
    exit 1
  fi
  echo $((n - 1)) > "$ROOT/.budget"
fi

case "${1:-}" in
  -*) echo "Error: No such option: $1 (options go after the subcommand)" >&2; exit 2 ;;
esac
group=${1:-}; cmd=${2:-}
shift 2 2>/dev/null || shift $#
pos=(); yes=0; format=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --yes|-y) yes=1 ;;
    --format) shift; case "${1:-}" in auto|human|agent|json|quiet) format=$1 ;;
                *) echo "Error: Invalid value for '--format': '${1:-}'" >&2; exit 2 ;; esac ;;
    --json) format=json ;;
    -q|--quiet) format=quiet ;;
    -) pos+=("$1") ;;
    -*) echo "Error: No such option: $1" >&2; exit 2 ;;
    *) pos+=("$1") ;;
  esac
  shift
done

map() {
  case "$1" in
    hf://buckets/*/*/*|hf://datasets/*/*/*|hf://models/*/*/*) ;;
    *) echo "stand-in hf: not a file URI: $1" >&2; exit 2 ;;
  esac
  rest=${1#hf://}
  case "$rest" in
    *'/../'*|*'/./'*|*'/..'|*'//'*) echo "stand-in hf: bad path $1" >&2; exit 2 ;;
  esac
  kind=${rest%%/*}; r=${rest#*/}; ns=${r%%/*}; r=${r#*/}; name=${r%%/*}
  if [ ! -d "$ROOT/$kind/$ns/$name" ]; then
    echo "ConnectionError: Network error: Request error: HTTP status client error (404 Not Found), domain: http://stand-in/api/$kind/$ns/$name/xet-write-token" >&2
    exit 1
  fi
  printf '%s/%s' "$ROOT" "$rest"
}

if [ "$group" = "buckets" ] && [ "$cmd" = "cp" ] && [ ${#pos[@]} -eq 2 ]; then
  src=${pos[0]}; dst=${pos[1]}
  case "$dst" in
    hf://*) out=$(map "$dst") || exit $? ;;
    *) out=$dst ;;
  esac
  mkdir -p "$(dirname "$out")"
  tmp="$out.standin-partial.$$"
  case "$src" in
    -) cat > "$tmp" || { rm -f "$tmp"; exit 1; } ;;
    hf://*) in=$(map "$src") || exit $?
            [ -f "$in" ] || { echo "Error: No files found at '$src'." >&2; exit 1; }
            cp "$in" "$tmp" || exit 1 ;;
    *) [ -f "$src" ] || { echo "Error: no such file $src" >&2; exit 1; }
       cp "$src" "$tmp" || exit 1 ;;
  esac
  mv -f "$tmp" "$out"
  [ "$format" = json ] && printf '{"src": "%s", "dst": "%s"}\n' "$src" "$dst"
  exit 0
fi
if [ "$group" = "buckets" ] && { [ "$cmd" = "rm" ] || [ "$cmd" = "remove" ]; } && [ ${#pos[@]} -eq 1 ]; then
  out=$(map "${pos[0]}") || exit $?
  if [ $yes -eq 0 ]; then
    if [ "$format" = json ]; then
      echo "Error: Remove '${pos[0]}'? Use --yes to skip confirmation." >&2
    else
      printf "Remove '%s'? [y/N]: " "${pos[0]}"
      echo "Aborted!" >&2
    fi
    exit 1
  fi
  [ -f "$out" ] || { echo "Error: Failed to apply 1 out of 1 operation(s): Entry not found" >&2; exit 1; }
  rm -f "$out"
  exit 0
fi
echo "stand-in hf: unsupported command: $group $cmd ${pos[*]:-}" >&2
exit 2
"#;

fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// A stand-in `hf` executable and the directory it acts on.
#[derive(Debug, Clone)]
pub struct StandinHf {
    /// The executable (pass as `--hf-cli` or `HF_CLI`).
    pub exe: PathBuf,
    /// What `hf://` maps to.
    pub root: PathBuf,
    /// One line per call: the arguments joined by spaces.
    pub log: PathBuf,
}

impl StandinHf {
    /// Install the stand-in under `dir` (`dir/bin/hf`, `dir/hub/`, `dir/hf-calls.log`).
    /// `journal`, when given, also receives an `hf <args>` line per call.
    pub fn install(dir: &Path, journal: Option<&Path>) -> Self {
        let bin = dir.join("bin");
        let root = dir.join("hub");
        fs::create_dir_all(&bin).unwrap();
        fs::create_dir_all(&root).unwrap();
        let log = dir.join("hf-calls.log");
        fs::write(&log, "").unwrap();
        let script = SCRIPT
            .replace("__ROOT__", &quote(&root))
            .replace("__LOG__", &quote(&log))
            .replace(
                "__JOURNAL__",
                &journal.map(quote).unwrap_or_else(|| "''".into()),
            );
        let exe = bin.join("hf");
        fs::write(&exe, script).unwrap();
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
        Self { exe, root, log }
    }

    /// The local directory behind `hf://buckets/<bucket>` (create it: like the real CLI, the
    /// stand-in never creates a bucket).
    pub fn bucket_dir(&self, bucket: &str) -> PathBuf {
        self.root.join("buckets").join(bucket)
    }

    /// The local directory behind `hf://datasets/<repo>`.
    pub fn dataset_dir(&self, repo: &str) -> PathBuf {
        self.root.join("datasets").join(repo)
    }

    /// Every call so far, one string of arguments each.
    pub fn calls(&self) -> Vec<String> {
        fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The next `n` calls fail (then calls work again).
    pub fn fail_next(&self, n: u32) {
        fs::write(self.root.join(".fail-next"), n.to_string()).unwrap();
    }

    /// After `n` more successful calls, every call fails, as if the connection were lost.
    pub fn allow_only(&self, n: u32) {
        fs::write(self.root.join(".budget"), n.to_string()).unwrap();
    }

    /// Undo [`StandinHf::fail_next`] and [`StandinHf::allow_only`].
    pub fn heal(&self) {
        let _ = fs::remove_file(self.root.join(".fail-next"));
        let _ = fs::remove_file(self.root.join(".budget"));
    }
}

/// Run git in `dir`, panicking with its stderr on failure; returns trimmed stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .expect("git is installed");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A bare repository acting as `origin`, and a checkout of its `branch`.
#[derive(Debug, Clone)]
pub struct GitRemote {
    pub bare: PathBuf,
    pub checkout: PathBuf,
    pub branch: String,
}

impl GitRemote {
    /// `dir/origin.git` (bare) with one commit (a README) on `branch`, and `dir/checkout`
    /// cloned from it. With `journal`, a post-commit hook in the checkout appends
    /// `git <subject>` per commit.
    pub fn new(dir: &Path, branch: &str, journal: Option<&Path>) -> Self {
        let bare = dir.join("origin.git");
        let checkout = dir.join("checkout");
        let seed = dir.join("seed");
        fs::create_dir_all(&bare).unwrap();
        git(&bare, &["init", "--quiet", "--bare", "-b", branch]);
        fs::create_dir_all(&seed).unwrap();
        git(&seed, &["init", "--quiet", "-b", branch]);
        configure(&seed);
        fs::write(seed.join("README.md"), "StarPilot resources (test)\n").unwrap();
        git(&seed, &["add", "README.md"]);
        git(&seed, &["commit", "--quiet", "-m", "init"]);
        git(&seed, &["push", "--quiet", bare.to_str().unwrap(), branch]);
        fs::remove_dir_all(&seed).unwrap();
        git(
            dir,
            &[
                "clone",
                "--quiet",
                "-b",
                branch,
                bare.to_str().unwrap(),
                checkout.to_str().unwrap(),
            ],
        );
        configure(&checkout);
        if let Some(j) = journal {
            let hook = checkout.join(".git/hooks/post-commit");
            fs::write(
                &hook,
                format!(
                    "#!/bin/sh\nprintf 'git %s\\n' \"$(git log -1 --format=%s)\" >> {}\n",
                    quote(j)
                ),
            )
            .unwrap();
            fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).unwrap();
        }
        Self {
            bare,
            checkout,
            branch: branch.to_string(),
        }
    }

    /// Commit subjects on the remote branch, oldest first.
    pub fn remote_subjects(&self) -> Vec<String> {
        git(
            &self.bare,
            &["log", "--reverse", "--format=%s", &self.branch],
        )
        .lines()
        .map(str::to_string)
        .collect()
    }

    /// The files a commit on the remote changed, per commit, oldest first.
    pub fn remote_files_per_commit(&self) -> Vec<Vec<String>> {
        let revs = git(&self.bare, &["rev-list", "--reverse", &self.branch]);
        revs.lines()
            .skip(1)
            .map(|rev| {
                git(
                    &self.bare,
                    &["diff-tree", "--no-commit-id", "--name-only", "-r", rev],
                )
                .lines()
                .map(str::to_string)
                .collect()
            })
            .collect()
    }
}

fn configure(repo: &Path) {
    git(repo, &["config", "user.name", "Release Test"]);
    git(
        repo,
        &["config", "user.email", "release-test@example.invalid"],
    );
    git(repo, &["config", "commit.gpgsign", "false"]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stand-in refuses what the real CLI refuses, with the real CLI's wording.
    #[test]
    fn standin_hf_rejects_what_the_real_cli_rejects() {
        let t = tempfile::tempdir().unwrap();
        let hf = StandinHf::install(t.path(), None);
        let run = |args: &[&str]| {
            let o = Command::new(&hf.exe)
                .args(args)
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        };
        let src = t.path().join("f");
        fs::write(&src, b"x").unwrap();
        let dst = "hf://buckets/ns/b/d/f";
        // No bucket yet: cp never creates one.
        let (code, _, err) = run(&["buckets", "cp", src.to_str().unwrap(), dst]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("404 Not Found"), "{err}");
        fs::create_dir_all(hf.bucket_dir("ns/b")).unwrap();
        // Options go after the subcommand.
        let (code, _, _) = run(&[
            "--format",
            "json",
            "buckets",
            "cp",
            src.to_str().unwrap(),
            dst,
        ]);
        assert_eq!(code, Some(2));
        let (code, out, _) = run(&[
            "buckets",
            "cp",
            src.to_str().unwrap(),
            dst,
            "--format",
            "json",
        ]);
        assert_eq!(code, Some(0));
        assert!(out.starts_with("{\"src\""), "{out}");
        // rm asks; with no terminal it aborts, and with --format json it says to pass --yes.
        let (code, out, err) = run(&["buckets", "rm", dst]);
        assert_eq!(code, Some(1));
        assert!(
            out.contains("[y/N]") && err.contains("Aborted!"),
            "{out}{err}"
        );
        let (code, _, err) = run(&["buckets", "rm", dst, "--format", "json"]);
        assert_eq!(code, Some(1));
        assert!(err.contains("Use --yes to skip confirmation"), "{err}");
        assert!(hf.bucket_dir("ns/b").join("d/f").exists());
        let (code, _, err) = run(&["buckets", "rm", dst, "--yes", "--format", "json"]);
        assert_eq!(code, Some(0), "{err}");
        assert!(!hf.bucket_dir("ns/b").join("d/f").exists());
        let (code, _, err) = run(&[
            "buckets",
            "cp",
            dst,
            "hf://buckets/ns/b/g",
            "--format",
            "json",
        ]);
        assert_eq!(code, Some(1));
        assert!(err.contains("No files found at"), "{err}");
    }
}
