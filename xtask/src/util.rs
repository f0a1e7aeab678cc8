use std::path::{Path, PathBuf};
use std::process::Command;
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

/// Run a command to completion, measuring wall time and the child's own peak RSS (wait4).
pub fn measure(cmd: &mut Command) -> Result<Measured, String> {
    let desc = format!("{cmd:?}");
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
        return Err(format!("{desc} failed (wait status {status})"));
    }
    Ok(Measured {
        wall,
        max_rss_kib: usage.ru_maxrss as u64,
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
