//! The daemon's stop flag: SIGTERM and SIGINT end `run` (and the paused daemon) between polls.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Set by SIGTERM/SIGINT.
static STOPPING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOPPING.store(true, Ordering::SeqCst);
}

/// A flag set by SIGTERM/SIGINT (relayed from the signal handler's atomic by a thread).
pub fn on_signals() -> Arc<AtomicBool> {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t);
        }
    }
    let stopping = Arc::new(AtomicBool::new(false));
    let relay = {
        let stopping = stopping.clone();
        std::thread::spawn(move || {
            while !STOPPING.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            stopping.store(true, Ordering::SeqCst);
        })
    };
    drop(relay);
    stopping
}
