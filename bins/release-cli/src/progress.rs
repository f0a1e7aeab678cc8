//! Progress bars on a terminal; nothing when stderr is not one, with `--json` or with `-q`. The
//! bars carry no colour, so `NO_COLOR` has nothing to remove from them. The byte bar's layout is
//! `cli_support::progress`'s, which the device binary draws too.
//! Also the live output lines of the compiler comma and of preflight's commands ([`live`]).

use artifact_store::progress::{Measure, Transfer};
use cli_support::progress::{BAR_CHARS, BYTES_TEMPLATE, bars_hidden as hidden};
use indicatif::{ProgressBar, ProgressStyle};

/// A byte-count progress bar on stderr, hidden when it would only be noise.
pub fn bytes_bar(len: u64, message: impl Into<String>, json: bool) -> ProgressBar {
    if hidden(json) {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(BYTES_TEMPLATE)
            .expect("valid template")
            .progress_chars(BAR_CHARS),
    );
    bar.set_message(message.into());
    bar
}

/// A spinner with elapsed time on stderr, for work whose length the library does not report
/// (hashing a chunk set, an rsync run). Hidden like [`bytes_bar`].
pub fn spinner(message: impl Into<String>, json: bool) -> ProgressBar {
    if hidden(json) {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"),
    );
    bar.set_message(message.into());
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// The publish bar's label for what a store just reported ([`Transfer`]): the file and, where
/// the numbers are not bytes within that file, what they are. A store that reports nothing
/// within a file says so, since its bar moves only when the file is done.
pub fn upload_label(store: &str, path: &str, transfer: &Transfer) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    match transfer {
        Transfer::File {
            measure: Measure::AtEnd,
            ..
        } => format!("{store}: {name} (no progress within the file: moves when it is done)"),
        Transfer::File { .. } => format!("{store}: {name}"),
        Transfer::Staged { .. } => format!("{store}: {name} committed, waiting for a push"),
        Transfer::Push { waiting, .. } => format!(
            "{store}: git push of {} committed (pack bytes written)",
            cli_support::progress::bytes(*waiting)
        ),
        Transfer::Pushed => format!("{store}: pushed"),
    }
}

/// Print a live output line of the device (or of preflight's commands) on stderr, so stdout
/// stays machine-readable; nothing with `-q` (the lines are in the log file either way).
pub fn live(line: &str) {
    if shows_live_output(cli_support::verbosity()) {
        eprintln!("{line}");
    }
}

/// Whether live output lines are echoed at this verbosity: by default and with `-v`, not with
/// `-q`.
fn shows_live_output(v: cli_support::Verbosity) -> bool {
    v >= cli_support::Verbosity::Normal
}

#[cfg(test)]
mod tests {
    use super::*;
    use cli_support::Verbosity;

    /// `-q` silences the device's live lines; the default and `-v` show them.
    #[test]
    fn live_output_is_left_out_only_with_quiet() {
        assert!(!shows_live_output(Verbosity::Quiet));
        assert!(shows_live_output(Verbosity::Normal));
        assert!(shows_live_output(Verbosity::Verbose));
    }

    #[test]
    fn upload_labels() {
        let s = "github:/srv/res";
        let p = "v26/pop/pop_driving_tinygrad.pkl.chunk01of02";
        for (t, want) in [
            (
                Transfer::File {
                    done: 5,
                    measure: Measure::Copied,
                },
                "github:/srv/res: pop_driving_tinygrad.pkl.chunk01of02",
            ),
            (
                Transfer::File {
                    done: 0,
                    measure: Measure::AtEnd,
                },
                "github:/srv/res: pop_driving_tinygrad.pkl.chunk01of02 (no progress within the \
                 file: moves when it is done)",
            ),
            (
                Transfer::Staged { bytes: 9 },
                "github:/srv/res: pop_driving_tinygrad.pkl.chunk01of02 committed, waiting for a push",
            ),
            (
                Transfer::Push {
                    written: 1,
                    waiting: 3 << 20,
                },
                "github:/srv/res: git push of 3.00 MiB committed (pack bytes written)",
            ),
            (Transfer::Pushed, "github:/srv/res: pushed"),
        ] {
            assert_eq!(upload_label(s, p, &t), want);
        }
    }
}
