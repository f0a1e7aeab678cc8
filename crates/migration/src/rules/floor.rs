//! The rollback floor's two copies as stored (`.accepted-release.json` in the models
//! directory and the persistent param `ModelManifestAcceptedRelease`; see `trust_state`) and the
//! floor a stored catalog is checked against on every read. A leaf below `device` and
//! `trust_state`, which both read it (`trust_state` re-exports these).

use std::collections::BTreeMap;
use std::path::Path;

use manifest::{Generation, ReleaseNumber, UnixSeconds};
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::state::bounded::{JOURNAL_LIMIT, read_capped};

pub const ACCEPTED_RELEASE_FILE: &str = ".accepted-release.json";

/// The last signed release accepted for one generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptedRelease {
    pub release: ReleaseNumber,
    pub expires: UnixSeconds,
    pub key: String,
}

impl From<&downloader::trust::Accepted> for AcceptedRelease {
    fn from(a: &downloader::trust::Accepted) -> Self {
        let (release, expires, key) = (a.release, a.expires, a.key.clone());
        AcceptedRelease {
            release,
            expires,
            key,
        }
    }
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

/// Both copies as far as what backs them allows (a floor that cannot be raised from outside).
/// Pure. `held` is the release of the signed catalog the device holds for `generation` (its
/// signature verified, whatever the floor), with its key and expiry.
///
/// - The file, which a writer of the models directory can write, never raises the floor above
///   what backs it: per generation, the param's release, and for `generation` also `held`
///   (the one moment the file is legitimately ahead of the param is a crash between the two
///   writes, after the catalog it records was stored). An entry above that is replaced by
///   what backs it (`held` for `generation`, else the param's entry), or dropped when nothing
///   does. With no valid param the file is the only record (a device from before the param):
///   its entries stand, as a stored catalog older than them is still refused.
/// - The param is never lowered by the file or by `held`: a signed catalog older than the
///   param's release is the rollback the floor refuses.
/// - One copy missing and the other unreadable (garbage, a directory, a link, a FIFO): the
///   unreadable one is stood in for by `held`, so it is rewritten instead of wedging the
///   device. Two unreadable copies stay unknown (nothing is assumed; a person restores one).
pub fn bound(
    file: &FloorCopy,
    param: &FloorCopy,
    generation: Generation,
    held: Option<&AcceptedRelease>,
) -> (FloorCopy, FloorCopy) {
    use FloorCopy::*;
    let key = generation.to_string();
    let from_held = |h: &AcceptedRelease| Valid(AcceptedReleases::from([(key.clone(), h.clone())]));
    match (file, param, held) {
        (Corrupt(_), Missing, Some(h)) => return (from_held(h), Missing),
        (Missing, Corrupt(_), Some(h)) => return (Missing, from_held(h)),
        _ => {}
    }
    let Valid(f) = file else {
        return (file.clone(), param.clone());
    };
    let p = match param {
        Valid(p) => Some(p),
        _ => None,
    };
    let mut bounded = AcceptedReleases::new();
    for (g, a) in f {
        let from_param = p.and_then(|p| p.get(g));
        let from_held = held.filter(|_| *g == key);
        let backing = match (from_param, from_held) {
            (Some(x), Some(y)) => Some(if y.release > x.release { y } else { x }),
            (x, y) => x.or(y),
        };
        let checkable = p.is_some();
        match backing {
            _ if !checkable => {
                bounded.insert(g.clone(), a.clone());
            }
            Some(b) if a.release > b.release => {
                bounded.insert(g.clone(), b.clone());
            }
            Some(_) => {
                bounded.insert(g.clone(), a.clone());
            }
            None => {}
        }
    }
    (Valid(bounded), param.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(r: u64, key: &str) -> AcceptedRelease {
        AcceptedRelease {
            release: ReleaseNumber::new(r).unwrap(),
            expires: UnixSeconds(4_102_444_800),
            key: key.to_string(),
        }
    }

    fn copy(entries: &[(&str, u64, &str)]) -> FloorCopy {
        FloorCopy::Valid(
            entries
                .iter()
                .map(|(g, r, k)| (g.to_string(), a(*r, k)))
                .collect(),
        )
    }

    /// (file, param, held) -> (file, param) as bounded, for v25, a made-up v26 (the v26
    /// contract's generation) and a made-up v27 after it.
    #[test]
    fn the_floor_bound_table() {
        use FloorCopy::{Corrupt, Missing};
        let bad = || Corrupt("not a regular file".into());
        let max = u64::MAX;
        for g in ["v25", "v26", "v27"] {
            let generation: Generation = g.parse().unwrap();
            let o = "v1"; // another generation
            let held = |r: u64| Some(a(r, "signed"));
            type Row = (
                FloorCopy,
                FloorCopy,
                Option<AcceptedRelease>,
                FloorCopy,
                FloorCopy,
            );
            let table: Vec<Row> = vec![
                // Raised from outside to the largest release: the held catalog's stands in.
                (
                    copy(&[(g, max, "x")]),
                    copy(&[(g, 2, "p")]),
                    held(2),
                    copy(&[(g, 2, "p")]),
                    copy(&[(g, 2, "p")]),
                ),
                // No valid param: the file is the only record and stands.
                (
                    copy(&[(g, max, "x")]),
                    Missing,
                    held(3),
                    copy(&[(g, max, "x")]),
                    Missing,
                ),
                (
                    copy(&[(g, max, "x")]),
                    bad(),
                    held(3),
                    copy(&[(g, max, "x")]),
                    bad(),
                ),
                // The param higher than the held catalog: the file raises nothing past it.
                (
                    copy(&[(g, max, "x")]),
                    copy(&[(g, 5, "p")]),
                    held(3),
                    copy(&[(g, 5, "p")]),
                    copy(&[(g, 5, "p")]),
                ),
                // No signed catalog of this generation held: the param bounds it.
                (
                    copy(&[(g, 9, "x")]),
                    copy(&[(g, 2, "p")]),
                    None,
                    copy(&[(g, 2, "p")]),
                    copy(&[(g, 2, "p")]),
                ),
                // Nothing backs it: dropped.
                (copy(&[(g, 9, "x")]), copy(&[]), None, copy(&[]), copy(&[])),
                // A crash between the file and the param: the held catalog backs the file.
                (
                    copy(&[(g, 3, "f")]),
                    copy(&[(g, 2, "p")]),
                    held(3),
                    copy(&[(g, 3, "f")]),
                    copy(&[(g, 2, "p")]),
                ),
                // Lowered, or an older signed catalog put back: the param still wins (merge).
                (
                    copy(&[(g, 1, "f")]),
                    copy(&[(g, 2, "p")]),
                    held(1),
                    copy(&[(g, 1, "f")]),
                    copy(&[(g, 2, "p")]),
                ),
                // Another generation's entry: bounded by the param only.
                (
                    copy(&[(o, 9, "f"), (g, 2, "f")]),
                    copy(&[(o, 4, "p")]),
                    held(2),
                    copy(&[(o, 4, "p"), (g, 2, "f")]),
                    copy(&[(o, 4, "p")]),
                ),
                // No valid param (a device from before it): other generations stand.
                (
                    copy(&[(o, 9, "f")]),
                    Missing,
                    held(2),
                    copy(&[(o, 9, "f")]),
                    Missing,
                ),
                (
                    copy(&[(g, 5, "f")]),
                    Missing,
                    None,
                    copy(&[(g, 5, "f")]),
                    Missing,
                ),
                // One copy unreadable, the other missing: the held catalog stands in.
                (bad(), Missing, held(4), copy(&[(g, 4, "signed")]), Missing),
                (Missing, bad(), held(4), Missing, copy(&[(g, 4, "signed")])),
                (bad(), Missing, None, bad(), Missing),
                // Two unreadable copies stay unknown.
                (bad(), bad(), held(4), bad(), bad()),
                (Missing, Missing, held(4), Missing, Missing),
            ];
            for (file, param, held, want_file, want_param) in table {
                let got = bound(&file, &param, generation, held.as_ref());
                assert_eq!(
                    got,
                    (want_file, want_param),
                    "{g}: {file:?} / {param:?} / {held:?}"
                );
            }
        }
    }
}
