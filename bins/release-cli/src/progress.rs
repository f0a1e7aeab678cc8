//! Progress bars on a terminal; nothing when stderr is not one, with `--json` or with `-q`. The
//! bars carry no colour, so `NO_COLOR` has nothing to remove from them. The byte bar's layout is
//! `cli_support::progress`'s, which the device binary draws too.

use std::io::Read;

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

/// A reader that advances a progress bar as it is read.
pub struct ProgressReader<R> {
    pub inner: R,
    pub bar: ProgressBar,
}

impl<R: Read> Read for ProgressReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }
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
