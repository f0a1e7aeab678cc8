//! Stopping on SIGTERM and SIGINT: a long-running command (`release-cli serve`) waits on
//! [`stop_on_signals`]'s flag and ends normally, exit 0, instead of being killed by the signal
//! (exit 143 or 130). The handler only stores to the flag.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Install handlers for SIGTERM and SIGINT and return a flag that becomes true once either
/// arrives. After this, neither signal kills the process: the caller must poll the flag and
/// end. The handlers are signal-hook's, which only store to the flag (async-signal-safe).
pub fn stop_on_signals() -> Arc<AtomicBool> {
    let stopping = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // Registration fails only for a forbidden signal (SIGKILL, SIGSTOP, …), never these.
        signal_hook::flag::register(sig, stopping.clone())
            .expect("SIGTERM and SIGINT can be handled");
    }
    stopping
}

/// Block until `stopping` is set, checking every 50 ms.
pub fn wait_for(stopping: &AtomicBool) {
    while !stopping.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real SIGTERM to this process sets the flag and does not kill it.
    #[test]
    fn a_sigterm_sets_the_flag_instead_of_killing() {
        let stopping = stop_on_signals();
        assert!(!stopping.load(Ordering::SeqCst));
        // SAFETY: raise(3) on our own process; the handler is installed above.
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        let t = std::time::Instant::now();
        wait_for(&stopping);
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
