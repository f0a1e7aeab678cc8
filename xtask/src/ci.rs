//! `cargo xtask ci`: fmt, clippy, every test and the docs check, then a summary that counts what
//! passed, failed and was ignored and names every test that skipped its body because a real
//! component (sshd, the real `hf` CLI, `minisign`) is missing here. Such a test passes as far as
//! the harness is concerned and its banner is hidden, so the summary is the only place it shows.
//! `--full` runs `.ci/run`: what CI runs (installs the components, requires them, then this and
//! `dist --reproducible --test`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::{docs, util};

/// The environment variable test-support's skip helper writes to (`TEST<TAB>REASON` lines).
const SKIP_LOG_ENV: &str = "STARPILOT_SKIP_LOG";

pub fn run(full: bool) -> Result<(), String> {
    if full {
        return full_ci();
    }
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
    linked_crate_docs()?;
    let log = util::target_dir().join("tmp").join("ci-skips.log");
    std::fs::create_dir_all(log.parent().unwrap_or(&log))
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let _ = std::fs::remove_file(&log);
    let counts = tests(&log);
    let skips = std::fs::read_to_string(&log).unwrap_or_default();
    let skips = parse_skips(&skips);
    let counts = counts?;
    let summary = summary(&counts, &skips);
    if counts.failed > 0 {
        return Err(summary);
    }
    docs::run(true)?;
    eprintln!("{summary}");
    Ok(())
}

/// The library crates other programs link. Their `#![warn(missing_docs)]` already fails clippy
/// above; rustdoc alone sees broken or private intra-doc links and malformed doc markup.
const LINKED_CRATES: [&str; 4] = ["chunker", "manifest", "downloader", "artifact-store"];

/// `cargo doc --no-deps` of [`LINKED_CRATES`] with rustdoc's warnings as errors (issue 38
/// item 4). Their doc examples run with the tests.
fn linked_crate_docs() -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut args = vec!["doc", "--no-deps", "--locked"];
    for c in LINKED_CRATES {
        args.extend(["-p", c]);
    }
    eprintln!("$ RUSTDOCFLAGS='-D warnings' cargo {}", args.join(" "));
    let status = Command::new(cargo)
        .args(&args)
        .current_dir(util::root())
        .env("RUSTDOCFLAGS", "-D warnings")
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "`cargo {}` failed ({status}): a public item of a linked crate lacks docs or a doc \
             link is broken; see the errors above",
            args.join(" ")
        ))
    }
}

/// `cargo test --workspace --locked`, its stdout echoed line by line and its `test result:`
/// lines added up.
fn tests(log: &std::path::Path) -> Result<Counts, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("$ cargo test --workspace --locked");
    let mut child = Command::new(cargo)
        .args(["test", "--workspace", "--locked"])
        .current_dir(util::root())
        .env(SKIP_LOG_ENV, log)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    let mut counts = Counts::default();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line.map_err(|e| format!("reading cargo test's output: {e}"))?;
            println!("{line}");
            counts.add(&line);
        }
    }
    let status = child.wait().map_err(|e| format!("cargo test: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`cargo test --workspace --locked` failed ({status}): {} passed, {} failed",
            counts.passed, counts.failed
        ));
    }
    Ok(counts)
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Counts {
    /// Add one harness summary line: `test result: ok. 12 passed; 0 failed; 1 ignored; …`.
    fn add(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// The skip log's lines as (test, reason), sorted, duplicates removed.
fn parse_skips(text: &str) -> Vec<(String, String)> {
    let mut skips: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(t, r)| (t.to_string(), r.to_string()))
        .collect();
    skips.sort();
    skips.dedup();
    skips
}

fn summary(c: &Counts, skips: &[(String, String)]) -> String {
    let verdict = if c.failed > 0 {
        "FAILED"
    } else {
        "all checks passed"
    };
    let mut s = format!(
        "xtask ci: {verdict}: {} passed, {} failed, {} ignored, {} skipped",
        c.passed,
        c.failed,
        c.ignored,
        skips.len()
    );
    if !skips.is_empty() {
        s.push_str(
            " (counted as passed by the test harness; their bodies did not run because a real \
             component is missing here):",
        );
        for (test, reason) in skips {
            s.push_str(&format!("\n  skipped {test}: {reason}"));
        }
        s.push_str(
            "\nCI installs and requires these: run `cargo xtask ci --full` (= .ci/run) for what \
             CI runs",
        );
    }
    s
}

/// `.ci/run`, which installs what the tests need and ends by running `cargo xtask ci` (without
/// `--full`) and `cargo xtask dist --reproducible --test`.
fn full_ci() -> Result<(), String> {
    let script = util::root().join(".ci").join("run");
    eprintln!("$ {}", script.display());
    let status = Command::new("bash")
        .arg(&script)
        .current_dir(util::root())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} failed ({status})", script.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harness_lines_add_up_and_other_lines_do_not_count() {
        let mut c = Counts::default();
        for line in [
            "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 3 filtered out; finished in 0.5s",
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s",
            "test a ... ok",
            "running 3 tests",
            "   Doc-tests chunker",
        ] {
            c.add(line);
        }
        assert_eq!(
            c,
            Counts {
                passed: 14,
                failed: 1,
                ignored: 1
            }
        );
    }

    #[test]
    fn the_summary_names_every_skip_and_its_reason() {
        let skips = parse_skips(
            "sign_cli::a\tno minisign\nhub::b\tno hf\nsign_cli::a\tno minisign\nbroken line\n",
        );
        assert_eq!(skips.len(), 2);
        let c = Counts {
            passed: 10,
            failed: 0,
            ignored: 0,
        };
        let s = summary(&c, &skips);
        assert!(
            s.starts_with("xtask ci: all checks passed: 10 passed, 0 failed, 0 ignored, 2 skipped"),
            "{s}"
        );
        assert!(s.contains("\n  skipped hub::b: no hf"), "{s}");
        assert!(s.contains("\n  skipped sign_cli::a: no minisign"), "{s}");
        assert!(s.contains("cargo xtask ci --full"), "{s}");
        assert_eq!(
            summary(&c, &[]),
            "xtask ci: all checks passed: 10 passed, 0 failed, 0 ignored, 0 skipped"
        );
    }
}
