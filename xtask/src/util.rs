use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    // `cargo run` sets CARGO_MANIFEST_DIR for the process it starts; prefer it over the
    // compile-time value so that a binary built from another checkout sharing this target
    // directory still works on the checkout it was run from.
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or(manifest_dir)
}

/// Where cargo puts build outputs: `CARGO_TARGET_DIR` when set, else `<root>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t),
        None => root().join("target"),
    }
}

/// Run cargo with `args` in the workspace root, echoing the command.
pub fn cargo(args: &[&str]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("$ cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(root())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

/// What one child process cost.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub wall: Duration,
    /// Peak resident set size in KiB, from the kernel's accounting of this child alone.
    pub max_rss_kib: u64,
}

/// Run a command to completion, measuring wall time and the child's own peak RSS (wait4). Its
/// stderr goes to an unlinked temporary file, shown (the last 4 KiB) if it fails.
pub fn measure(cmd: &mut Command) -> Result<Measured, String> {
    let desc = format!("{cmd:?}");
    static N: AtomicU64 = AtomicU64::new(0);
    let log_path = std::env::temp_dir().join(format!(
        "xtask-stderr-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let mut log = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&log_path)
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    let _ = fs::remove_file(&log_path);
    cmd.stderr(log.try_clone().map_err(|e| e.to_string())?);
    let start = Instant::now();
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {desc}: {e}"))?;
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our own child, status and usage point to live locals.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = start.elapsed();
    std::mem::forget(child); // already reaped by wait4
    if rc != pid {
        return Err(format!(
            "wait4 failed for {desc}: {}",
            std::io::Error::last_os_error()
        ));
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        let mut stderr = Vec::new();
        let _ = log.seek(SeekFrom::Start(0));
        let _ = log.read_to_end(&mut stderr);
        let tail = &stderr[stderr.len().saturating_sub(4096)..];
        return Err(format!(
            "{desc} failed (wait status {status}); its stderr:\n{}",
            String::from_utf8_lossy(tail).trim_end()
        ));
    }
    Ok(Measured {
        wall,
        max_rss_kib: usage.ru_maxrss as u64,
    })
}

/// Where [`measure_child`] writes the peak RSS (KiB) of the command it ran.
pub const RSS_OUT_ENV: &str = "XTASK_RSS_OUT";

/// `cargo xtask measure-child PROGRAM ARGS…` (run by [`measure_own_rss`], not by people): run
/// the command as a child of this small process and write its peak RSS in KiB to the file
/// `$XTASK_RSS_OUT`. A child's `ru_maxrss` also counts the memory of the process that spawned
/// it, as it was at the exec (with `posix_spawn` the spawner's own high-water mark): measured
/// straight from the bench, after `cargo xtask dist` ran in it, a download read the bench's
/// ~23 MiB instead of its own ~12 MiB. From here it counts this launcher's few MiB at most.
pub fn measure_child(args: &[String]) -> Result<(), String> {
    let out = std::env::var_os(RSS_OUT_ENV).ok_or(format!("{RSS_OUT_ENV} is not set"))?;
    let (program, rest) = args.split_first().ok_or("measure-child needs a command")?;
    let m = measure(Command::new(program).args(rest))?;
    fs::write(&out, m.max_rss_kib.to_string()).map_err(|e| e.to_string())
}

/// Run `cmd` (program and arguments only; its stdout is discarded) through [`measure_child`]:
/// its wall time (with the launcher's start) and its own peak RSS, not the bench's.
pub fn measure_own_rss(cmd: &Command, work: &Path) -> Result<Measured, String> {
    let rss = work.join("measure-child.rss");
    let _ = fs::remove_file(&rss);
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut launcher = Command::new(exe);
    launcher
        .arg("measure-child")
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .env(RSS_OUT_ENV, &rss)
        .stdout(std::process::Stdio::null());
    let m = measure(&mut launcher)?;
    let kib = fs::read_to_string(&rss).map_err(|e| format!("{}: {e}", rss.display()))?;
    Ok(Measured {
        max_rss_kib: kib.trim().parse().map_err(|e| format!("{kib:?}: {e}"))?,
        ..m
    })
}

/// Best (shortest) of `n` runs; the ratio of two best-of-n runs is the steadiest figure on a
/// shared machine.
pub fn best_of(
    n: usize,
    mut setup: impl FnMut(),
    mut make: impl FnMut() -> Command,
) -> Result<Measured, String> {
    let mut best: Option<Measured> = None;
    for _ in 0..n {
        setup();
        let m = measure(&mut make())?;
        best = Some(match best {
            Some(b) if b.wall <= m.wall => Measured {
                max_rss_kib: b.max_rss_kib.max(m.max_rss_kib),
                ..b
            },
            Some(b) => Measured {
                max_rss_kib: b.max_rss_kib.max(m.max_rss_kib),
                ..m
            },
            None => m,
        });
    }
    Ok(best.expect("n >= 1"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::quiet;

    /// Issue 39: a failing bench command's stderr was discarded, so the hf row failed with only
    /// a wait status.
    #[test]
    fn a_failing_commands_stderr_is_shown() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo the reason it failed >&2; exit 3"]);
        let err = measure(&mut quiet(&mut c)).unwrap_err();
        assert!(err.contains("its stderr:\nthe reason it failed"), "{err}");
    }

    /// Issue 39: `quiet` rebuilt the command from its program and arguments alone, so the hf
    /// row's `HF_ENDPOINT`, `HF_TOKEN` and `HF_HOME` never reached the CLI.
    #[test]
    fn quiet_keeps_the_environment_and_directory() {
        let mut c = Command::new("sh");
        c.args(["-c", r#"test "$XTASK_QUIET" = kept && test "$(pwd)" = /"#])
            .env("XTASK_QUIET", "kept")
            .current_dir("/");
        measure(&mut quiet(&mut c)).unwrap();
    }
}
