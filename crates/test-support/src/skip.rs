//! A test that cannot run here (no sshd, no real `hf` CLI, no `minisign`) says so through
//! [`skipped`]: a banner on stderr (which the test harness hides unless the test fails) and one
//! line in the file named by `STARPILOT_SKIP_LOG`, which `cargo xtask ci` sets and reads back so
//! its summary names every skip and its reason instead of counting it as a plain pass.

use std::io::Write;

/// The environment variable naming the skip log (one `TEST<TAB>REASON` line per skip).
pub const SKIP_LOG_ENV: &str = "STARPILOT_SKIP_LOG";

/// Record that the calling test skips its body because of `reason` (what is missing and how to
/// install it). The test's name is the harness's thread name (`module::test`).
pub fn skipped(reason: &str) {
    eprintln!("\n\n!!! SKIPPED: {reason} !!!\n");
    let Some(path) = std::env::var_os(SKIP_LOG_ENV) else {
        return;
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("(unnamed test)")
        .to_string();
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .map(|n| {
            n.rsplit_once('-')
                .map_or(n.clone(), |(stem, _)| stem.to_string())
        })
        .unwrap_or_default();
    let line = format!(
        "{binary}::{test}\t{}\n",
        reason.trim().replace(['\n', '\t'], " ")
    );
    // One short O_APPEND write per line: test binaries run in parallel threads and processes.
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log line names this test and carries the reason on one line; without the variable
    /// nothing is written.
    #[test]
    fn a_skip_is_logged_with_the_test_name_and_reason() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skips");
        // SAFETY: no other test of this crate reads or writes this variable.
        unsafe { std::env::set_var(SKIP_LOG_ENV, &log) };
        skipped("no sshd\t(apt-get install openssh-server)\n");
        unsafe { std::env::remove_var(SKIP_LOG_ENV) };
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        let (test, reason) = text.trim_end().split_once('\t').unwrap();
        assert!(
            test.ends_with("skip::tests::a_skip_is_logged_with_the_test_name_and_reason"),
            "{test}"
        );
        assert_eq!(reason, "no sshd (apt-get install openssh-server)");
        skipped("not logged");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), text);
    }
}
