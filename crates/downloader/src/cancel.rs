//! The cancellation flag of a download or a manifest fetch: a leaf, so the HTTP layer and the
//! download both use it without importing each other.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A cancellation flag shared between the one who asks and the download.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A flag not yet raised.
    pub fn new() -> Self {
        Self::default()
    }
    /// Raise the flag: the download stops at its next check and returns
    /// [`crate::Error::Cancelled`]; every clone sees it.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    /// Whether the flag is raised.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
