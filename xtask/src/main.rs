//! Workspace automation, run as `cargo xtask <task>`:
//!
//! - `demo [WORK_DIR]`: the main job end to end (see `demo.rs`).
//! - `ci [--full]`: `cargo fmt --check`, `cargo clippy --workspace --all-targets -D warnings`, every
//!   test, and a check that `docs/cli.md` matches the binaries' help, ending with the passed,
//!   failed, ignored and skipped counts and the reason for each skip (see `ci.rs`). This is the
//!   README's test command and what `.ci/run` runs after installing the components the tests
//!   need; `--full` runs `.ci/run` itself.
//! - `bench [--size SIZE_MIB] [--download-size MIB] [--only GROUP[,GROUP]]`: builds release binaries and prints one table of benchmark ratios,
//!   each measured against an anchor (openssl, dd, curl) run on the same data in the same run.
//! - `docs`: regenerate `docs/cli.md` from the binaries' clap help.
//! - `dist [--reproducible] [--test]`: the aarch64 device binary for the comma (see `dist.rs`).
//!
//! Plain Rust with one small dependency (libc, for per-child peak RSS), so it builds fast.

mod bench;
mod bench_budget;
mod bench_bump;
mod bench_device;
mod bench_fallback;
mod bench_github;
mod bench_hf;
mod bench_shapes;
mod ci;
mod demo;
mod dist;
mod dist_hash;
mod docs;
mod util;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  ci [--full]        fmt --check, clippy -D warnings, and every test (the README's test command),
                     then passed/failed/ignored/skipped counts and why each test skipped;
                     --full: run .ci/run instead (installs sshd, minisign and the pinned hf CLI,
                     requires them, then this and dist --reproducible --test: what CI runs)
  demo [WORK_DIR]    the main job end to end: publish v25, serve it, migrate a v24 device
  bench [--size N] [--download-size M] [--only GROUP[,GROUP]]
                     benchmark ratios against anchors; N = artifact size in MiB (default 1024),
                     M = the device download's and the github and hf publishes' (default 256);
                     --only runs some row groups: split, verify, oob, device, install
                     (the install in the field's shapes), github, hf (publish through the
                     pinned hf CLI), budget (runs dist first: the size budget is the aarch64
                     binary's), fallback
  docs [--check]     regenerate docs/cli.md from the binaries' clap help (--check: fail if stale)
  dist [--reproducible] [--test]
                     build device-modeld-manager for the comma (aarch64, glibc 2.31) into
                     target/dist/, installing its toolchain on Debian; --reproducible: build
                     twice from clean dirs and compare bytes; --test: the end-to-end story with
                     the binary under qemu-aarch64
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo xtask demo --help` prints help; it must not run the task (demo would take
    // `--help` for its work directory).
    if let Some(help) = task_help(&args) {
        print!("{help}");
        return ExitCode::SUCCESS;
    }
    let result = match args.first().map(String::as_str) {
        Some(task) if let Some(e) = bad_arguments(task, &args[1..]) => Err(e),
        Some("ci") => ci::run(args.get(1).map(String::as_str) == Some("--full")),
        Some("bench") => bench::run(&args[1..]),
        Some("docs") => docs::run(args.get(1).map(String::as_str) == Some("--check")),
        Some("demo") => demo::run(&args[1..]),
        Some("dist") => dist::run(&args[1..]),
        // Not a task for people: the bench's small launcher (see util::measure_child).
        Some("measure-child") => util::measure_child(&args[1..]),
        Some("-h" | "--help" | "help") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown task {other:?}\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The help for `<task> … -h|--help`: the task's line of [`USAGE`] (or all of it for a task
/// not listed there). `None` when no help flag follows a task.
fn task_help(args: &[String]) -> Option<String> {
    let (task, rest) = args.split_first()?;
    if !rest.iter().any(|a| a == "-h" || a == "--help") {
        return None;
    }
    let mut lines = USAGE.lines().skip_while(|l| !is_task_line(l, task));
    Some(match lines.next() {
        // The task's line and its continuation lines (indented further, as `dist`'s are).
        Some(l) => {
            let mut help = format!("usage: cargo xtask {}\n", l.trim());
            for more in lines.take_while(|m| m.starts_with("    ")) {
                help.push_str(more);
                help.push('\n');
            }
            help
        }
        None => USAGE.to_string(),
    })
}

fn is_task_line(line: &str, task: &str) -> bool {
    line.starts_with("  ")
        && !line.starts_with("   ")
        && line.split_whitespace().next() == Some(task)
}

/// Arguments a task that takes few would misread: `ci` takes none, `docs` only `--check`, and
/// `demo` one work directory that must not look like a flag (`demo --verbose` would otherwise
/// create a folder named `--verbose`). `bench` and `dist` check their own.
fn bad_arguments(task: &str, rest: &[String]) -> Option<String> {
    let bad = match task {
        "ci" => rest.iter().find(|a| *a != "--full").or(rest.get(1)),
        "docs" => rest.iter().find(|a| *a != "--check"),
        "demo" => rest.iter().find(|a| a.starts_with('-')).or(rest.get(1)),
        _ => None,
    }?;
    Some(format!(
        "{task}: unexpected argument {bad:?}\n\n{}",
        task_help(&[task.to_string(), "--help".to_string()]).unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn help(args: &[&str]) -> Option<String> {
        task_help(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    /// Regression: `cargo xtask demo --help` ran the demo in a folder named `--help`.
    #[test]
    fn every_task_answers_help_without_running() {
        for task in ["ci", "demo", "bench", "docs"] {
            for flag in ["-h", "--help"] {
                let h = help(&[task, flag]).unwrap_or_else(|| panic!("{task} {flag}"));
                assert!(h.starts_with(&format!("usage: cargo xtask {task}")), "{h}");
            }
        }
        assert!(help(&["demo", "work", "--help"]).is_some());
        assert_eq!(help(&["demo", "work"]), None);
        assert_eq!(help(&["demo"]), None);
        assert_eq!(help(&[]), None);
        assert_eq!(help(&["nope", "--help"]).as_deref(), Some(USAGE));
        let dist = help(&["dist", "--help"]).unwrap();
        assert!(dist.contains("--reproducible: build"), "{dist}");
        assert_eq!(help(&["demo", "-h"]).unwrap().lines().count(), 1);
    }

    /// Regression: `cargo xtask demo --verbose` ran the demo in a folder named `--verbose`, and
    /// `docs --chek` regenerated docs/cli.md instead of checking it.
    #[test]
    fn arguments_a_task_would_misread_are_refused() {
        let bad = |args: &[&str]| {
            let v: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            bad_arguments(&v[0], &v[1..])
        };
        for args in [
            &["demo", "--verbose"][..],
            &["demo", "work", "more"],
            &["docs", "--chek"],
            &["ci", "--fast"],
        ] {
            let e = bad(args).unwrap_or_else(|| panic!("{args:?} accepted"));
            assert!(
                e.contains(args.last().unwrap()) && e.contains("usage: cargo xtask"),
                "{e}"
            );
        }
        for args in [
            &["demo"][..],
            &["demo", "work"],
            &["docs"],
            &["docs", "--check"],
            &["ci"],
            &["bench", "--size", "8"],
            &["bench", "--only", "split,oob"],
            &["dist", "--test"],
        ] {
            assert_eq!(bad(args), None, "{args:?}");
        }
    }
}
