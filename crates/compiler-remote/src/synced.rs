//! What the last `sync` sent: a small record in the openpilot tree, and the check `compile` and
//! `rebuild` make before connecting (the local tree must still be what the compiler has).
//!
//! After a successful sync, [`SYNC_RECORD_FILE`] at the tree's root holds the compiler, its
//! remote root, the pin and the [`TreeDigest`] of exactly the files sync sent
//! ([`crate::tree_digest::sync_digest`]). The record is not itself sent (it is outside the four
//! parts), so writing it does not change the digest.

use std::path::{Path, PathBuf};

use fs_err as fs;
use manifest::GitCommit;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::tree_digest::{TreeDigest, sync_digest};

/// The sync record, relative to the openpilot tree.
pub const SYNC_RECORD_FILE: &str = ".starpilot_sync.json";
/// A sync record is a few hundred bytes; anything larger is not one.
const RECORD_LIMIT: u64 = 64 * 1024;

/// What one sync sent, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRecord {
    /// The compiler, as `--remote` named it.
    pub destination: String,
    pub remote_root: String,
    /// The marker the compiler reported after the transfers.
    pub tinygrad_commit: GitCommit,
    /// The digest of what was sent.
    pub digest: TreeDigest,
    /// When the sync finished, seconds since the Unix epoch.
    pub synced_at_unix: u64,
}

pub use crate::unsynced::Unsynced;

/// The pure rule: the tree is in sync with `destination:remote_root` when the last recorded
/// sync went there and its digest is the tree's digest now.
pub fn judge(
    record: Option<&SyncRecord>,
    now: &TreeDigest,
    destination: &str,
    remote_root: &str,
) -> Result<(), Unsynced> {
    let Some(r) = record else {
        return Err(Unsynced::Never);
    };
    if r.destination != destination || r.remote_root != remote_root {
        return Err(Unsynced::Elsewhere {
            destination: r.destination.clone(),
            remote_root: r.remote_root.clone(),
        });
    }
    if &r.digest != now {
        return Err(Unsynced::Changed {
            recorded: r.digest,
            now: *now,
        });
    }
    Ok(())
}

/// The record's path in `openpilot`.
pub fn record_path(openpilot: &Path) -> PathBuf {
    openpilot.join(SYNC_RECORD_FILE)
}

/// The last sync recorded in `openpilot`, `None` when there is none. A record that is not a
/// regular file, is too large or does not parse is an error naming the path.
pub fn read_record(openpilot: &Path) -> Result<Option<SyncRecord>> {
    let path = record_path(openpilot);
    let meta = match fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let bad = |problem: String| Error::SyncRecord {
        path: path.clone(),
        problem,
    };
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    let Some(bytes) = chunker::bounded::read_up_to(fs::File::open(&path)?, RECORD_LIMIT)? else {
        return Err(bad(format!("larger than {RECORD_LIMIT} bytes")));
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| bad(e.to_string()))
}

/// Write the record of a sync (atomically).
pub fn write_record(openpilot: &Path, record: &SyncRecord) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(record).expect("a record serializes");
    bytes.push(b'\n');
    chunker::atomic::write_atomic(record_path(openpilot), &bytes)?;
    Ok(())
}

/// Remove the record (a sync is starting: the compiler's tree is about to change).
pub(crate) fn remove_record(openpilot: &Path) -> Result<()> {
    chunker::atomic::remove_if_exists(record_path(openpilot))?;
    Ok(())
}

/// Refuse unless `openpilot` is, file for file, what its last sync sent to
/// `destination:remote_root`. Reads the tree (streamed); writes nothing. Returns the digest.
pub fn check_synced(openpilot: &Path, destination: &str, remote_root: &str) -> Result<TreeDigest> {
    let record = read_record(openpilot)?;
    let now = sync_digest(openpilot)?;
    judge(record.as_ref(), &now, destination, remote_root).map_err(|why| Error::NotSynced {
        openpilot: openpilot.to_path_buf(),
        destination: destination.to_string(),
        remote_root: remote_root.to_string(),
        why: Box::new(why),
    })?;
    Ok(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(b: u8) -> TreeDigest {
        TreeDigest {
            sha256: chunker::Sha256Digest::of_bytes(&[b]),
            files: 3,
        }
    }

    fn record(dest: &str, root: &str, d: TreeDigest) -> SyncRecord {
        SyncRecord {
            destination: dest.into(),
            remote_root: root.into(),
            tinygrad_commit: "e837e367aac9e1a66e689f4f32ce20ca9367df13".parse().unwrap(),
            digest: d,
            synced_at_unix: 1,
        }
    }

    #[test]
    fn the_sync_rule() {
        let here = record("comma@192.168.3.110", "/data/openpilot", digest(1));
        let cases: Vec<(Option<SyncRecord>, TreeDigest, Result<(), Unsynced>)> = vec![
            (Some(here.clone()), digest(1), Ok(())),
            (None, digest(1), Err(Unsynced::Never)),
            (
                Some(here.clone()),
                digest(2),
                Err(Unsynced::Changed {
                    recorded: digest(1),
                    now: digest(2),
                }),
            ),
            (
                Some(record("comma@192.168.3.111", "/data/openpilot", digest(1))),
                digest(1),
                Err(Unsynced::Elsewhere {
                    destination: "comma@192.168.3.111".into(),
                    remote_root: "/data/openpilot".into(),
                }),
            ),
            (
                Some(record("comma@192.168.3.110", "/tmp/op", digest(1))),
                digest(1),
                Err(Unsynced::Elsewhere {
                    destination: "comma@192.168.3.110".into(),
                    remote_root: "/tmp/op".into(),
                }),
            ),
        ];
        for (r, now, want) in cases {
            assert_eq!(
                judge(r.as_ref(), &now, "comma@192.168.3.110", "/data/openpilot"),
                want,
                "{r:?}"
            );
        }
    }

    #[test]
    fn records_round_trip_and_bad_ones_are_named() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(read_record(t.path()).unwrap(), None);
        let r = record("a", "/r", digest(1));
        write_record(t.path(), &r).unwrap();
        assert_eq!(read_record(t.path()).unwrap(), Some(r));
        std::fs::write(record_path(t.path()), b"{").unwrap();
        let e = read_record(t.path()).unwrap_err().to_string();
        assert!(e.contains(SYNC_RECORD_FILE), "{e}");
        std::fs::remove_file(record_path(t.path())).unwrap();
        std::fs::create_dir(record_path(t.path())).unwrap();
        let e = read_record(t.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
