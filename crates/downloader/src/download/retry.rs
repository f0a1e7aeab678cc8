//! The device's one retry helper: exponential backoff with jitter, cancel-aware, bounded by the
//! origin's deadline.

use std::hash::{BuildHasher, Hasher as _};
use std::thread;
use std::time::{Duration, Instant};

use super::DownloadConfig;
use crate::error::{Error, Result};
use crate::http::Ctl;

/// Run `op` with exponential backoff and jitter while its error is retryable.
pub(crate) fn with_retries<T>(
    config: &DownloadConfig,
    ctl: &Ctl,
    url: &str,
    mut op: impl FnMut() -> Result<T>,
) -> Result<T> {
    let mut attempt = 0;
    loop {
        match op() {
            Err(e) if retry_again(&e, attempt, config.max_attempts) => {
                backoff_sleep(config, attempt, ctl, url)?;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// The retry decision: another try after failed attempt `attempt` (0-based) when the error is
/// one a retry can fix and the attempts are not used up.
fn retry_again(e: &Error, attempt: u32, max_attempts: u32) -> bool {
    e.is_retryable() && attempt + 1 < max_attempts
}

/// The wait after failed attempt `attempt` (0-based) before jitter: `base * 2^attempt`, capped
/// at `backoff_max`.
fn backoff_delay(config: &DownloadConfig, attempt: u32) -> Duration {
    config
        .backoff_base
        .saturating_mul(1u32 << attempt.min(16))
        .min(config.backoff_max)
}

/// `base * 2^attempt`, capped, plus up to half of it again at random, so that many devices
/// failing together do not retry in lockstep. Wakes early on cancel; a sleep that would pass the
/// origin's deadline fails at once with [`Error::Deadline`].
fn backoff_sleep(config: &DownloadConfig, attempt: u32, ctl: &Ctl, url: &str) -> Result<()> {
    let base = backoff_delay(config, attempt);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(attempt);
    let jitter_ms = base.as_millis() as u64 / 2;
    let jitter = if jitter_ms == 0 {
        Duration::ZERO
    } else {
        Duration::from_millis(h.finish() % (jitter_ms + 1))
    };
    let until = Instant::now() + base + jitter;
    if until >= ctl.deadline {
        return Err(Error::Deadline {
            url: url.to_string(),
            seconds: ctl.budget.as_secs(),
        });
    }
    loop {
        ctl.check(url)?;
        let now = Instant::now();
        if now >= until {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(20).min(until - now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CancelToken;

    /// The one device retry helper stops waiting as soon as the download is cancelled (what a
    /// SIGTERM or IsOnroad turns into), well before a long backoff would end.
    #[test]
    fn retries_stop_waiting_on_cancel() {
        let config = DownloadConfig {
            backoff_base: Duration::from_secs(30),
            backoff_max: Duration::from_secs(30),
            max_attempts: 5,
            ..DownloadConfig::default()
        };
        let cancel = CancelToken::new();
        let ctl = crate::http::Ctl::new(
            &cancel,
            "m",
            Duration::from_secs(600),
            Instant::now() + Duration::from_secs(600),
        );
        let canceller = cancel.clone();
        let start = Instant::now();
        let mut calls = 0;
        let err = with_retries(&config, &ctl, "http://o/x", || -> Result<()> {
            calls += 1;
            let c = canceller.clone();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(50));
                c.cancel();
            });
            Err(Error::Status {
                url: "http://o/x".into(),
                status: 503,
            })
        })
        .unwrap_err();
        assert!(matches!(err, Error::Cancelled { .. }), "{err}");
        assert_eq!(calls, 1);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
    }

    /// The device's backoff schedule and retry decision as a table: doubling from the base,
    /// capped; retried only while the error is retryable and attempts remain.
    #[test]
    fn backoff_schedule_and_retry_decision() {
        let config = DownloadConfig {
            backoff_base: Duration::from_millis(250),
            backoff_max: Duration::from_secs(8),
            ..DownloadConfig::default()
        };
        let ms: Vec<u128> = [0, 1, 2, 3, 4, 5, 6, 40]
            .iter()
            .map(|&a| backoff_delay(&config, a).as_millis())
            .collect();
        assert_eq!(ms, [250, 500, 1000, 2000, 4000, 8000, 8000, 8000]);

        let status = |status| Error::Status {
            url: "u".into(),
            status,
        };
        let transport = Error::Transport {
            url: "u".into(),
            message: "reset".into(),
        };
        let cases = [
            (status(503), 0, 3, true),
            (status(429), 1, 3, true),
            (status(503), 2, 3, false),
            (status(404), 0, 3, false),
            (transport, 0, 1, false),
            (Error::Cancelled { model: "m".into() }, 0, 5, false),
        ];
        for (e, attempt, max, want) in cases {
            assert_eq!(
                retry_again(&e, attempt, max),
                want,
                "{e} after attempt {attempt}/{max}"
            );
        }
    }
}
