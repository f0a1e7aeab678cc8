//! `release-cli preflight`: the seed's "run repository tests first" in the openpilot checkout,
//! recorded as a [`PreflightRecord`].
//!
//! It runs, from the checkout's root, `./dev sync` and then `./.venv/bin/pytest -q -n0` on the
//! three test files the seed names, in that order; a failing command ends the run. The output of
//! both goes to one log and, line by line, to a sink (the CLI prints it live). The record holds
//! the checkout's `HEAD` (and whether it had uncommitted changes), its tinygrad pin, every
//! command with its exit code, start time and duration, and whether all passed.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use manifest::GitCommit;

use crate::gate::{CommandRun, PreflightRecord, TreeNow};
use crate::{Error, Result};
use manifest::UnixSeconds;

/// The seed's repository tests, in order, each run from the checkout's root.
pub const COMMANDS: [&[&str]; 2] = [
    &["./dev", "sync"],
    &[
        "./.venv/bin/pytest",
        "-q",
        "-n0",
        "starpilot/assets/tests/test_model_pipeline.py",
        "common/tests/test_file_chunker.py",
        "scripts/tests/test_model_release.py",
    ],
];

/// The checks [`run`] makes before running anything: `openpilot` is a checkout with a `./dev`
/// script and a tinygrad marker. Returns the marker's pin.
pub fn check(openpilot: &Path) -> Result<GitCommit> {
    if !openpilot.join("dev").is_file() {
        return Err(Error::NotACheckout {
            openpilot: openpilot.to_path_buf(),
            reason: "it has no ./dev script".into(),
        });
    }
    // The tree's tinygrad where the tree records it (its sync file when it declares its
    // generation, else its marker).
    let pin = crate::tree::tree_pin(openpilot)
        .map(|p| p.commit)
        .map_err(|e| Error::NotACheckout {
            openpilot: openpilot.to_path_buf(),
            reason: e.to_string(),
        })?;
    // The tests are of the tree that ships: it must select the generation of its tinygrad.
    crate::tree::check_selectors(openpilot)?;
    Ok(pin)
}

/// Run the seed's commands in `openpilot`, writing their output to `log` and to `sink`.
///
/// A failing command is a record with `passed: false`, not an error; errors are a checkout that
/// is not one (no `dev`, no tinygrad marker) and I/O.
pub fn run(openpilot: &Path, log: &Path, sink: &mut dyn FnMut(&str)) -> Result<PreflightRecord> {
    let tinygrad_commit = check(openpilot)?;
    let (openpilot_commit, openpilot_dirty) = git_state(openpilot);
    if let Some(dir) = log.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs_err::create_dir_all(dir)?;
    }
    let mut log_file = fs_err::File::create(log)?;
    let mut commands = Vec::new();
    for argv in COMMANDS {
        let started_at = UnixSeconds::now();
        let t0 = Instant::now();
        writeln!(log_file, "$ {}", argv.join(" "))?;
        let exit_code = run_one(openpilot, argv, &mut log_file, sink)?;
        let passed = exit_code == Some(0);
        writeln!(
            log_file,
            "# exit {}",
            exit_code.map_or("by a signal".to_string(), |c| c.to_string())
        )?;
        commands.push(CommandRun {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            exit_code,
            passed,
            started_at,
            duration_ms: t0.elapsed().as_millis() as u64,
        });
        if !passed {
            break;
        }
    }
    log_file.sync_all()?;
    Ok(PreflightRecord {
        openpilot: openpilot.to_path_buf(),
        openpilot_commit,
        openpilot_dirty,
        tinygrad_commit,
        passed: commands.len() == COMMANDS.len() && commands.iter().all(|c| c.passed),
        commands,
        finished_at: UnixSeconds::now(),
        log: log.to_path_buf(),
    })
}

/// Run one command with stdout and stderr both streamed, line by line, to the log and the sink.
/// Returns its exit code (`None`: killed by a signal).
fn run_one(
    dir: &Path,
    argv: &[&str],
    log_file: &mut fs_err::File,
    sink: &mut dyn FnMut(&str),
) -> Result<Option<i32>> {
    let spawned = Command::new(argv[0])
        .args(&argv[1..])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    // A command that cannot start (no .venv yet) is a failed command in the record, so an older
    // passing record never outlives it.
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let line = format!("cannot start {}: {e}", argv[0]);
            writeln!(log_file, "{line}")?;
            sink(&line);
            return Ok(None);
        }
    };
    let (tx, rx) = mpsc::channel::<String>();
    let mut readers = Vec::new();
    let pipes: [Option<Box<dyn std::io::Read + Send>>; 2] = [
        child.stdout.take().map(|p| Box::new(p) as _),
        child.stderr.take().map(|p| Box::new(p) as _),
    ];
    for pipe in pipes.into_iter().flatten() {
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            let mut r = BufReader::new(pipe);
            let mut buf = Vec::new();
            while matches!(r.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
                let line = String::from_utf8_lossy(&buf)
                    .trim_end_matches(['\n', '\r'])
                    .to_string();
                if tx.send(line).is_err() {
                    break;
                }
                buf.clear();
            }
        }));
    }
    drop(tx);
    for line in rx {
        writeln!(log_file, "{line}")?;
        sink(&line);
    }
    for r in readers {
        let _ = r.join();
    }
    let status = child.wait().map_err(|source| Error::Spawn {
        command: argv.join(" "),
        dir: dir.to_path_buf(),
        source,
    })?;
    Ok(status.code())
}

/// The checkout the release is cut from as it is now, for the gate's comparison with the
/// preflight `record` ([`crate::gate::preflight_binding`]): `given` (`--openpilot`), else the
/// checkout the record names; foreign when the record is of a git checkout (it names a commit)
/// and `given` resolves to another directory. A record of a checkout without git is bound by its
/// pin alone.
pub fn tree_now(given: Option<&Path>, record: &PreflightRecord) -> TreeNow {
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let openpilot = given.unwrap_or(&record.openpilot).to_path_buf();
    let foreign = record.openpilot_commit.is_some()
        && given.is_some_and(|g| real(g) != real(&record.openpilot));
    let (commit, dirty) = git_state(&openpilot);
    TreeNow {
        openpilot,
        foreign,
        commit,
        dirty,
    }
}

/// The checkout's `HEAD` and whether it has changes, when it is a git checkout with git present.
pub fn git_state(dir: &Path) -> (Option<GitCommit>, Option<bool>) {
    if !dir.join(".git").exists() {
        return (None, None);
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let head = git(&["rev-parse", "HEAD"]).and_then(|s| s.trim().parse().ok());
    // The sync record is this tool's own local state, not a change to the checkout.
    let exclude = format!(":(exclude){}", compiler_remote::synced::SYNC_RECORD_FILE);
    let dirty = git(&["status", "--porcelain", "--", ".", &exclude]).map(|s| !s.trim().is_empty());
    (head, dirty)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    const PIN: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";

    fn exec(path: &Path, body: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, body).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A stand-in openpilot checkout: `./dev` and `.venv/bin/pytest` shell scripts that log
    /// their arguments and exit with the code in `pytest_exit`.
    fn checkout(pytest_exit: i32) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        fs::create_dir_all(root.join("tinygrad_repo")).unwrap();
        fs::write(
            root.join("tinygrad_repo/TINYGRAD_COMMIT"),
            format!("{PIN}\n"),
        )
        .unwrap();
        exec(
            &root.join("dev"),
            "#!/bin/sh\necho \"dev $*\" >> calls.log\necho synced\necho 'a warning' >&2\n",
        );
        exec(
            &root.join(".venv/bin/pytest"),
            &format!(
                "#!/bin/sh\necho \"pytest $*\" >> calls.log\necho '3 passed'\nexit {pytest_exit}\n"
            ),
        );
        t
    }

    #[test]
    fn a_passing_checkout_gives_a_passing_record() {
        let op = checkout(0);
        let log = op.path().join("logs/preflight.log");
        let mut lines = Vec::new();
        let rec = run(op.path(), &log, &mut |l| lines.push(l.to_string())).unwrap();
        assert!(rec.passed, "{rec:?}");
        assert_eq!(rec.tinygrad_commit.as_str(), PIN);
        assert_eq!(rec.commands.len(), 2);
        assert_eq!(rec.commands[1].argv, COMMANDS[1]);
        assert!(rec.commands.iter().all(|c| c.exit_code == Some(0)));
        assert_eq!(rec.openpilot_commit, None, "not a git checkout");
        let calls = fs::read_to_string(op.path().join("calls.log")).unwrap();
        assert_eq!(
            calls,
            "dev sync\npytest -q -n0 starpilot/assets/tests/test_model_pipeline.py \
             common/tests/test_file_chunker.py scripts/tests/test_model_release.py\n"
        );
        // stdout and stderr both reach the sink and the log.
        for l in ["synced", "a warning", "3 passed"] {
            assert!(lines.iter().any(|x| x == l), "{lines:?}");
        }
        let text = fs::read_to_string(&log).unwrap();
        assert!(
            text.contains("$ ./dev sync") && text.contains("a warning"),
            "{text}"
        );
    }

    #[test]
    fn a_failing_pytest_gives_a_failing_record() {
        let op = checkout(1);
        let rec = run(op.path(), &op.path().join("p.log"), &mut |_| {}).unwrap();
        assert!(!rec.passed);
        assert_eq!(rec.commands[0].exit_code, Some(0));
        assert_eq!(rec.commands[1].exit_code, Some(1));
        assert!(!rec.commands[1].passed);
    }

    #[test]
    fn a_failing_dev_sync_stops_before_the_tests() {
        let op = checkout(0);
        exec(
            &op.path().join("dev"),
            "#!/bin/sh\necho \"dev $*\" >> calls.log\nexit 7\n",
        );
        let rec = run(op.path(), &op.path().join("p.log"), &mut |_| {}).unwrap();
        assert!(!rec.passed);
        assert_eq!(rec.commands.len(), 1);
        assert_eq!(rec.commands[0].exit_code, Some(7));
        let calls = fs::read_to_string(op.path().join("calls.log")).unwrap();
        assert_eq!(calls, "dev sync\n", "pytest must not run");
    }

    #[test]
    fn not_a_checkout_is_an_error_that_names_it() {
        let t = tempfile::tempdir().unwrap();
        let e = run(t.path(), &t.path().join("p.log"), &mut |_| {}).unwrap_err();
        assert!(matches!(e, Error::NotACheckout { .. }), "{e}");
        assert!(e.to_string().contains("no ./dev script"), "{e}");
        // No marker: named too, and nothing ran.
        let op = checkout(0);
        fs::remove_file(op.path().join("tinygrad_repo/TINYGRAD_COMMIT")).unwrap();
        let e = run(op.path(), &op.path().join("p.log"), &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("TINYGRAD_COMMIT"), "{e}");
        assert!(!op.path().join("calls.log").exists());
    }

    #[test]
    fn a_pytest_that_cannot_start_is_a_failing_record() {
        let op = checkout(0);
        fs::remove_file(op.path().join(".venv/bin/pytest")).unwrap();
        let log = op.path().join("p.log");
        let rec = run(op.path(), &log, &mut |_| {}).unwrap();
        assert!(!rec.passed);
        assert_eq!(rec.commands[1].exit_code, None);
        let text = fs::read_to_string(&log).unwrap();
        assert!(text.contains("cannot start ./.venv/bin/pytest"), "{text}");
    }

    /// The sync record `release-cli sync` writes at the root is not a change to the checkout;
    /// any other untracked file is.
    #[test]
    fn the_sync_record_does_not_make_a_checkout_dirty() {
        let t = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            Command::new("git")
                .args(args)
                .current_dir(t.path())
                .env("GIT_AUTHOR_NAME", "dev")
                .env("GIT_AUTHOR_EMAIL", "dev@localhost")
                .env("GIT_COMMITTER_NAME", "dev")
                .env("GIT_COMMITTER_EMAIL", "dev@localhost")
                .output()
        };
        if git(&["init", "-q"]).is_err() {
            return;
        }
        fs::write(t.path().join("a.py"), b"a").unwrap();
        git(&["add", "-A"]).unwrap();
        assert!(git(&["commit", "-q", "-m", "a"]).unwrap().status.success());
        assert_eq!(git_state(t.path()).1, Some(false));
        fs::write(
            t.path().join(compiler_remote::synced::SYNC_RECORD_FILE),
            b"{}",
        )
        .unwrap();
        assert_eq!(git_state(t.path()).1, Some(false));
        fs::write(t.path().join("b.py"), b"b").unwrap();
        assert_eq!(git_state(t.path()).1, Some(true));
    }
}
