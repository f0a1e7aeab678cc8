//! Retrying a failed upload with exponential backoff, then giving up with the path named.

use std::time::Duration;

use crate::error::{Error, Result};

/// How often and how patiently to retry. Tests use [`RetryPolicy::immediate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts, including the first (at least 1).
    pub attempts: u32,
    /// Wait before the second attempt; it doubles with each attempt after.
    pub initial_delay: Duration,
    /// The longest wait between attempts.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 4,
            initial_delay: Duration::from_secs(2),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Retries without waiting.
    pub fn immediate(attempts: u32) -> Self {
        Self {
            attempts,
            initial_delay: Duration::ZERO,
            max_delay: Duration::ZERO,
        }
    }

    /// The wait before attempt `n + 1` (`n` counted from 1): doubling, capped.
    pub fn delay_after(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.initial_delay
            .checked_mul(factor)
            .unwrap_or(self.max_delay)
            .min(self.max_delay)
    }

    /// Run `op` until it succeeds or the attempts are used up. `on_retry(attempt, error, wait)`
    /// is told about every failure that will be retried. The final error is
    /// [`Error::UploadFailed`] naming `store` and `path`. Refusals (checks that failed) are not
    /// retried: trying again cannot change them.
    pub fn run<T>(
        &self,
        store: &str,
        path: &str,
        mut on_retry: impl FnMut(u32, &Error, Duration),
        mut op: impl FnMut() -> Result<T>,
    ) -> Result<T> {
        let attempts = self.attempts.max(1);
        let mut n = 0;
        loop {
            n += 1;
            match op() {
                Ok(v) => return Ok(v),
                Err(e) if e.is_check_failure() || e.is_permanent() => return Err(e),
                Err(e) if n >= attempts => {
                    return Err(Error::UploadFailed {
                        store: store.to_string(),
                        path: path.to_string(),
                        attempts: n,
                        last: Box::new(e),
                    });
                }
                Err(e) => {
                    let wait = self.delay_after(n);
                    on_retry(n, &e, wait);
                    std::thread::sleep(wait);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_and_cap() {
        let p = RetryPolicy {
            attempts: 10,
            initial_delay: Duration::from_secs(2),
            max_delay: Duration::from_secs(30),
        };
        let d: Vec<u64> = (1..=6).map(|n| p.delay_after(n).as_secs()).collect();
        assert_eq!(d, [2, 4, 8, 16, 30, 30]);
        assert_eq!(p.delay_after(40), Duration::from_secs(30));
    }

    #[test]
    fn retries_then_reports_the_path() {
        let mut calls = 0;
        let mut retried = Vec::new();
        let err = RetryPolicy::immediate(3)
            .run(
                "s",
                "models/v25/x/y",
                |n, _, _| retried.push(n),
                || -> Result<()> {
                    calls += 1;
                    Err(Error::Refused(crate::Refusal::NoSigningKey).into_transient())
                },
            )
            .unwrap_err();
        assert_eq!(calls, 3);
        assert_eq!(retried, [1, 2]);
        let msg = err.to_string();
        assert!(
            msg.contains("models/v25/x/y") && msg.contains("3 attempts"),
            "{msg}"
        );

        let mut calls = 0;
        let ok = RetryPolicy::immediate(3).run(
            "s",
            "p",
            |_, _, _| {},
            || {
                calls += 1;
                if calls < 2 {
                    Err(Error::Refused(crate::Refusal::NoSigningKey).into_transient())
                } else {
                    Ok(7)
                }
            },
        );
        assert_eq!(ok.unwrap(), 7);

        let mut calls = 0;
        let refused = RetryPolicy::immediate(3).run(
            "s",
            "p",
            |_, _, _| {},
            || -> Result<()> {
                calls += 1;
                Err(Error::Refused(crate::Refusal::NoSigningKey))
            },
        );
        assert!(matches!(refused, Err(Error::Refused(_))));
        assert_eq!(calls, 1);
    }

    impl Error {
        fn into_transient(self) -> Error {
            Error::Http {
                method: "PUT",
                url: "u".into(),
                message: self.to_string(),
            }
        }
    }
}
