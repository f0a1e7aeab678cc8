//! What the sync check compares and why it refuses: a tree's [`TreeDigest`] and the
//! [`Unsynced`] reason `Error::NotSynced` carries. A leaf (it uses no other module of this
//! crate), so `error` and the modules that compute digests do not import each other;
//! `tree_digest` and `synced` re-export these.

use chunker::Sha256Digest;
use serde::{Deserialize, Serialize};

/// A tree's digest and how many entries went into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeDigest {
    pub sha256: Sha256Digest,
    /// Files, symlinks and other non-directory entries counted.
    pub files: u64,
}

/// Why the local tree is not what the compiler has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsynced {
    /// No sync of this tree was recorded.
    #[error("this tree has no record of a sync")]
    Never,
    /// The files sync sends changed since the last sync.
    #[error(
        "the files sync sends changed since the last sync (synced {} over {} files, now {} over {} files)",
        recorded.sha256, recorded.files, now.sha256, now.files
    )]
    Changed {
        recorded: TreeDigest,
        now: TreeDigest,
    },
    /// The last sync went to another compiler or remote root.
    #[error("it was last synced to {destination}:{remote_root}")]
    Elsewhere {
        destination: String,
        remote_root: String,
    },
}
