//! Effect checkpoints for the crash enumeration. Every durable effect of a refresh (a param
//! written or removed, a cache or state file written, a file purged, a model installed) reports
//! itself here right after it is on disk. In production the hook does nothing; a test can ask
//! for a simulated crash right after the n-th effect: the operation then stops with
//! [`Error::Crashed`](crate::Error::Crashed) and runs nothing else (no cleanup, no fallback),
//! which is what kill -9 at that instant would leave.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

#[derive(Clone, Default)]
pub struct Effects(Option<Arc<Inner>>);

struct Inner {
    crash_after: Option<usize>,
    count: AtomicUsize,
    log: Mutex<Vec<String>>,
}

impl std::fmt::Debug for Effects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            None => f.write_str("Effects(none)"),
            Some(i) => write!(f, "Effects(crash_after={:?})", i.crash_after),
        }
    }
}

impl Effects {
    /// No checkpoints (production).
    pub fn none() -> Self {
        Self(None)
    }

    /// Record every effect, crash never.
    pub fn recording() -> Self {
        Self::make(None)
    }

    /// Record every effect and crash right after the effect numbered `n` (0-based).
    pub fn crash_after(n: usize) -> Self {
        Self::make(Some(n))
    }

    fn make(crash_after: Option<usize>) -> Self {
        Self(Some(Arc::new(Inner {
            crash_after,
            count: AtomicUsize::new(0),
            log: Mutex::new(Vec::new()),
        })))
    }

    /// The effects recorded so far, in order.
    pub fn log(&self) -> Vec<String> {
        self.0.as_ref().map_or_else(Vec::new, |i| {
            i.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
        })
    }

    /// Report one effect that is now durable; `Err(Crashed)` when the test asked to crash here.
    pub(crate) fn done(&self, what: impl FnOnce() -> String) -> Result<()> {
        let Some(inner) = &self.0 else {
            return Ok(());
        };
        let what = what();
        let n = inner.count.fetch_add(1, Ordering::SeqCst);
        inner
            .log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(what.clone());
        if inner.crash_after == Some(n) {
            return Err(Error::Crashed { effect: n, what });
        }
        Ok(())
    }
}
