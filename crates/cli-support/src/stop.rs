//! Stopping on SIGTERM and SIGINT: a long-running command (`release-cli serve`) waits on
//! [`stop_on_signals`]'s flag and ends normally, exit 0, instead of being killed by the signal
//! (exit 143 or 130). The handler only stores to an atomic; a thread relays it to the flag.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Set by the signal handler.
static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    SIGNALLED.store(true, Ordering::SeqCst);
}

/// Install handlers for SIGTERM and SIGINT and return a flag that becomes true once either
/// arrives (within about 20 ms). After this, neither signal kills the process: the caller
/// must poll the flag and end.
pub fn stop_on_signals() -> Arc<AtomicBool> {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t);
        }
    }
    let stopping = Arc::new(AtomicBool::new(false));
    let relay = stopping.clone();
    std::thread::spawn(move || {
        while !SIGNALLED.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        relay.store(true, Ordering::SeqCst);
    });
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
