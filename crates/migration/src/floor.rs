//! The rollback floor's two copies as stored (`.accepted-release.json` in the models
//! directory and the persistent param `ModelManifestAcceptedRelease`; see `trust_state`) and the
//! floor a stored catalog is checked against on every read. A leaf below `device` and
//! `trust_state`, which both read it (`trust_state` re-exports these).

use std::collections::BTreeMap;
use std::path::Path;

use manifest::{Generation, ReleaseNumber, UnixSeconds};
use serde::{Deserialize, Serialize};

use crate::bounded::{JOURNAL_LIMIT, read_capped};
use crate::error::Error;

pub const ACCEPTED_RELEASE_FILE: &str = ".accepted-release.json";

/// The last signed release accepted for one generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptedRelease {
    pub release: ReleaseNumber,
    pub expires: UnixSeconds,
    pub key: String,
}

pub type AcceptedReleases = BTreeMap<String, AcceptedRelease>;

/// One copy of the accepted releases as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FloorCopy {
    Missing,
    /// Unreadable: over the size cap, not a regular file, or not the JSON map.
    Corrupt(String),
    Valid(AcceptedReleases),
}

/// Both copies as read (size-capped, regular files only): the file in `models_dir`, the param
/// file `param`.
pub fn read_copies(models_dir: &Path, param: &Path) -> (FloorCopy, FloorCopy) {
    let read = |path: &Path| match read_capped(path, JOURNAL_LIMIT) {
        Ok(None) => FloorCopy::Missing,
        Ok(Some(b)) => match serde_json::from_slice::<AcceptedReleases>(&b) {
            Ok(m) => FloorCopy::Valid(m),
            Err(e) => FloorCopy::Corrupt(e.to_string()),
        },
        Err(Error::CorruptState { message, .. }) => FloorCopy::Corrupt(message),
        Err(e) => FloorCopy::Corrupt(e.to_string()),
    };
    (read(&models_dir.join(ACCEPTED_RELEASE_FILE)), read(param))
}

/// The floor the stored catalog is checked against on every read: the higher valid copy's
/// release for `generation`; with no valid copy none (the fetch refuses until the floor is
/// known, see `trust_state::floor`).
pub fn for_read(copies: &(FloorCopy, FloorCopy), generation: Generation) -> Option<ReleaseNumber> {
    let key = generation.to_string();
    [&copies.0, &copies.1]
        .iter()
        .filter_map(|c| match c {
            FloorCopy::Valid(m) => m.get(&key).map(|a| a.release),
            _ => None,
        })
        .max()
}
