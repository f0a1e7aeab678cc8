//! Workspace automation, run as `cargo xtask <task>`:
//!
//! - `demo [WORK_DIR]`: the main job end to end (see `demo.rs`).
//! - `ci`: `cargo fmt --check`, `cargo clippy --workspace --all-targets -D warnings`, every test,
//!   and a check that `docs/cli.md` matches the binaries' help.
//!   This is the README's test command and what `.ci/run` runs.
//! - `bench [--size SIZE_MIB]`: builds release binaries and prints one table of benchmark ratios,
//!   each measured against an anchor (openssl, dd, curl) run on the same data in the same run.
//! - `docs`: regenerate `docs/cli.md` from the binaries' clap help.
//! - `dist [--reproducible] [--test]`: the aarch64 device binary for the comma (see `dist.rs`).
//!
//! Plain Rust with one small dependency (libc, for per-child peak RSS), so it builds fast.

mod bench;
mod bench_budget;
mod bench_device;
mod demo;
mod dist;
mod docs;
mod util;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  ci                 fmt --check, clippy -D warnings, and every test (the README's test command)
  demo [WORK_DIR]    the main job end to end: publish v25, serve it, migrate a v24 device
  bench [--size N]   benchmark ratios against anchors; N = artifact size in MiB (default 1024)
  docs [--check]     regenerate docs/cli.md from the binaries' clap help (--check: fail if stale)
  dist [--reproducible] [--test]
                     build device-modeld-manager for the comma (aarch64, glibc 2.31) into
                     target/dist/, installing its toolchain on Debian; --reproducible: build
                     twice from clean dirs and compare bytes; --test: the end-to-end story with
                     the binary under qemu-aarch64
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("bench") => bench::run(&args[1..]),
        Some("docs") => docs::run(args.get(1).map(String::as_str) == Some("--check")),
        Some("demo") => demo::run(&args[1..]),
        Some("dist") => dist::run(&args[1..]),
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

fn ci() -> Result<(), String> {
    util::cargo(&["fmt", "--all", "--check"])?;
    util::cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ])?;
    util::cargo(&["test", "--workspace", "--locked"])?;
    docs::run(true)?;
    eprintln!("xtask ci: all checks passed");
    Ok(())
}
