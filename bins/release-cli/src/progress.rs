//! Progress bars on a terminal; nothing when stderr is not one or `--json` is asked for.

use std::io::{IsTerminal, Read};

use indicatif::{ProgressBar, ProgressStyle};

/// A byte-count progress bar on stderr, hidden when it would only be noise.
pub fn bytes_bar(len: u64, message: impl Into<String>, json: bool) -> ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
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
