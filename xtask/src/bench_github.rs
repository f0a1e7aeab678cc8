//! GitHub publish: our `github:` publish (the library's `GithubStore` and `publish`, through the
//! `bench_github_publish` example, one commit per file and batched pushes) against plain git
//! doing the same job at once: copy the same files into the checkout, one `git add`, one
//! `git commit`, one `git push`. Both start from a fresh bare `origin` and a clone of it holding
//! one commit, so each pushes exactly the model's files (and ours its manifest, a few hundred
//! bytes more).

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::bench::{RUNS, Row, quiet, secs};
use crate::bench_device::run_ok;
use crate::util::{self, best_of};

const BRANCH: &str = "Models";

pub fn rows(work: &Path, artifacts: &Path) -> Result<Vec<Row>, String> {
    let example = util::target_dir().join("release/examples/bench_github_publish");
    let generation = artifacts
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or("the artifacts directory is named after its generation")?;
    let bytes = dir_bytes(artifacts)?;
    let dir = work.join("github");

    eprintln!(
        "bench: git add + commit + one push of the same {} MiB (plain git)",
        bytes >> 20
    );
    let checkout = dir.join("checkout");
    let git_push = best_of(
        RUNS,
        || fresh_remote(&dir).expect("a fresh bare remote and checkout"),
        || {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(
                    r#"set -e; mkdir -p "$1/$3"; cp -R "$2"/. "$1/$3/"; cd "$1"; git add -A; git commit -q -m bench; git push -q origin "HEAD:refs/heads/$4""#,
                )
                .arg("sh")
                .arg(&checkout)
                .arg(artifacts)
                .arg(&generation)
                .arg(BRANCH);
            quiet(&mut c)
        },
    )?;

    eprintln!("bench: our github: publish of the same files (commit per file, batched pushes)");
    let ours = best_of(
        RUNS,
        || fresh_remote(&dir).expect("a fresh bare remote and checkout"),
        || {
            let mut c = Command::new(&example);
            c.arg(&checkout).arg(artifacts);
            quiet(&mut c)
        },
    )?;
    // The last run's remote holds the whole set and the manifest.
    let listed = git_out(
        &dir.join("origin.git"),
        &["ls-tree", "-r", "--name-only", BRANCH],
    )?;
    if !listed
        .lines()
        .any(|l| l == format!("model_names_{generation}.json"))
    {
        return Err(format!(
            "the github publish left no manifest on the remote:\n{listed}"
        ));
    }
    let _ = fs::remove_dir_all(&dir);

    let ratio = git_push.wall.as_secs_f64() / ours.wall.as_secs_f64();
    let mib_s = |m: util::Measured| (bytes >> 20) as f64 / m.wall.as_secs_f64();
    Ok(vec![Row {
        name: "github publish throughput / git push",
        ours: format!("{} ({:.0} MiB/s)", secs(ours), mib_s(ours)),
        anchor: format!(
            "{} ({:.0} MiB/s, add + commit + one push)",
            secs(git_push),
            mib_s(git_push)
        ),
        ratio,
        bar: ">= 0.5",
        pass: Some(ratio >= 0.5),
    }])
}

/// `dir/origin.git` (bare, on [`BRANCH`], one commit) and `dir/checkout`, a clone of it with a
/// committer identity; whatever was there before is removed.
fn fresh_remote(dir: &Path) -> Result<(), String> {
    let _ = fs::remove_dir_all(dir);
    let bare = dir.join("origin.git");
    let checkout = dir.join("checkout");
    crate::bench_device::mkdirs(&checkout)?;
    let git = |d: &Path, args: &[&str]| run_ok(Command::new("git").arg("-C").arg(d).args(args));
    git(dir, &["init", "-q", "--bare", "-b", BRANCH, "origin.git"])?;
    git(&checkout, &["init", "-q", "-b", BRANCH])?;
    git(&checkout, &["config", "user.name", "bench"])?;
    git(&checkout, &["config", "user.email", "bench@localhost"])?;
    fs::write(checkout.join("README.md"), "bench\n").map_err(|e| e.to_string())?;
    git(&checkout, &["add", "README.md"])?;
    git(&checkout, &["commit", "-q", "-m", "init"])?;
    git(
        &checkout,
        &["remote", "add", "origin", &bare.to_string_lossy()],
    )?;
    git(&checkout, &["push", "-q", "origin", BRANCH])?;
    git(&checkout, &["fetch", "-q", "origin"])?;
    // Flush the setup's writes so their writeback is not billed to the contender.
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    Ok(())
}

fn git_out(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "git {args:?} in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Bytes of every file below `dir`.
fn dir_bytes(dir: &Path) -> Result<u64, String> {
    let mut total = 0;
    for entry in fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let meta = entry.metadata().map_err(|e| e.to_string())?;
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}
