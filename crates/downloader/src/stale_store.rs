//! No download storm: a store that served bytes which do not match what it says ("not yet": a
//! republish interrupted and left alone) is not downloaded from again until it changes.
//!
//! What a store says about an artifact before any payload byte is its [`StoreState`]: the
//! digest the bytes are checked against (the manifest's, or the store's `.sha256`), the size,
//! the chunk count and the first chunk's length, and the store's own `.sha256` sidecar. When a
//! transfer from one origin ends "not yet", that origin's state is remembered with the digest it
//! served; the next download of the artifact from that origin asks only for that state (a few
//! small requests) and, while it is the same, is refused as [`crate::Error::StoreUnchanged`]
//! (also "not yet") without a payload request. A changed manifest, sidecar or chunk layout is a
//! new state: one full transfer again. At most one full transfer per store change, per origin;
//! and, so that bytes corrupted once on the way (not by the store) cannot keep a model away
//! for good, one more per [`REMEMBER_FOR`] while a store stays unchanged.
//!
//! The memory lives as long as the [`crate::Downloader`] (the daemon's whole run); a one-shot
//! command starts without it, as a person who asks for a download asks for a try now. The
//! daemon keeps it in a file too ([`Memory::keep_in`], [`FILE`] in the models directory), so
//! a restart does not cost one more transfer per origin: read with a size cap, written
//! atomically after each change; a file that cannot be read or parsed is nothing remembered
//! (at most one more transfer per origin), an entry dated in the future is dropped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use chunker::Sha256Digest;
use manifest::UnixSeconds;

/// What one origin's store says about one artifact, before any payload byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreState {
    /// The origin (its kind and base URL, as displayed).
    pub origin: String,
    /// The artifact's generation and local file name (`v25/<name>`).
    pub local_name: String,
    /// The digest the bytes are verified against.
    pub expected: Sha256Digest,
    /// The artifact's size in bytes.
    pub size: u64,
    /// 0 = one plain file.
    pub chunk_count: u32,
    /// The first piece's length: the first chunk's for a set of more than one chunk, else the size.
    pub first_len: u64,
    /// The store's `.sha256` sidecar, when it publishes one that parses.
    pub sidecar: Option<Sha256Digest>,
}

/// How long an unchanged store that served other bytes is not downloaded from again.
pub const REMEMBER_FOR: Duration = Duration::from_secs(24 * 3600);

/// A store state that served other bytes, the digest of what it served (`None` when the
/// transfer failed before the whole artifact was hashed), and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The store's state when it served them.
    pub state: StoreState,
    /// The digest of the bytes it served.
    pub served: Option<Sha256Digest>,
    /// When.
    pub at: Instant,
}

/// Whether to transfer from a store now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Go {
    /// Nothing remembered, or the store changed since it served other bytes.
    Fetch,
    /// The store says exactly what it said when it served other bytes: not again.
    Skip,
}

/// The rule, at `now_at`. Pure.
pub fn decide(remembered: Option<&Served>, now: &StoreState, now_at: Instant) -> Go {
    match remembered {
        Some(r) if r.state == *now && now_at.saturating_duration_since(r.at) < REMEMBER_FOR => {
            Go::Skip
        }
        _ => Go::Fetch,
    }
}

/// The file the daemon keeps the memory in, in the models directory.
pub const FILE: &str = ".stale-stores.json";
/// The file's read cap (a few entries per artifact and origin).
pub const FILE_LIMIT: u64 = 256 * 1024;

/// One remembered state as the file holds it: when, in Unix seconds.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    state: StoreState,
    served: Option<Sha256Digest>,
    at_unix: u64,
}

/// The remembered states, by origin and artifact.
#[derive(Debug, Default)]
pub struct Memory {
    map: Mutex<BTreeMap<(String, String), Served>>,
    file: Mutex<Option<PathBuf>>,
}

impl Memory {
    fn key(origin: &str, local_name: &str) -> (String, String) {
        (origin.to_string(), local_name.to_string())
    }

    /// What is remembered of `origin`'s store for `local_name`.
    pub fn get(&self, origin: &str, local_name: &str) -> Option<Served> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&Self::key(origin, local_name)).cloned()
    }

    /// Remember that `served.state` served other bytes.
    pub fn remember(&self, served: Served) {
        let key = Self::key(&served.state.origin, &served.state.local_name);
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(key, served);
        self.save(&map);
    }

    /// Forget `origin`'s store for `local_name` (its bytes verified).
    pub fn forget(&self, origin: &str, local_name: &str) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.remove(&Self::key(origin, local_name)).is_some() {
            self.save(&map);
        }
    }

    /// Keep the memory in `path` from now on: what it holds is remembered (as of when it was
    /// written; past [`REMEMBER_FOR`] or dated in the future: dropped; a file that cannot be
    /// read or parsed: nothing), and every later change is written back atomically. Best effort: a
    /// file that cannot be written costs at most one more transfer after a restart.
    pub fn keep_in(&self, path: &Path) {
        let now_unix = UnixSeconds::now().0;
        let saved: Vec<Saved> = chunker::bounded::read_capped(path, FILE_LIMIT)
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for s in saved {
            let Some(age) = now_unix.checked_sub(s.at_unix).map(Duration::from_secs) else {
                continue;
            };
            if age >= REMEMBER_FOR {
                continue;
            }
            let at = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
            let key = Self::key(&s.state.origin, &s.state.local_name);
            map.entry(key).or_insert(Served {
                state: s.state,
                served: s.served,
                at,
            });
        }
        // Nothing written until something changes (a daemon that only waits writes nothing).
        *self.file.lock().unwrap_or_else(|e| e.into_inner()) = Some(path.to_path_buf());
    }

    fn save(&self, map: &BTreeMap<(String, String), Served>) {
        let Some(path) = self.file.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
            return;
        };
        let now_unix = UnixSeconds::now().0;
        let saved: Vec<Saved> = map
            .values()
            .map(|s| Saved {
                state: s.state.clone(),
                served: s.served,
                at_unix: now_unix.saturating_sub(s.at.elapsed().as_secs()),
            })
            .collect();
        if let Ok(body) = serde_json::to_vec(&saved) {
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                let _ = std::fs::remove_dir_all(&path);
            }
            let _ = chunker::atomic::write_atomic(&path, &body);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(b: u8) -> Sha256Digest {
        format!("{b:02x}").repeat(32).parse().unwrap()
    }

    fn state() -> StoreState {
        StoreState {
            origin: "huggingface (http://127.0.0.1:1/hf)".into(),
            local_name: "pop223_driving_tinygrad.pkl".into(),
            expected: d(1),
            size: 300,
            chunk_count: 3,
            first_len: 100,
            sidecar: Some(d(2)),
        }
    }

    /// Skipped only while every part of what the store says is unchanged; each change (the
    /// manifest's digest or size, the sidecar appearing, changing or going, the chunk layout,
    /// another origin or artifact) is a new state worth one transfer.
    #[test]
    fn the_stale_store_table() {
        let t = Instant::now();
        let served = Served {
            state: state(),
            served: Some(d(9)),
            at: t,
        };
        type Change = fn(&mut StoreState);
        let cases: [(&str, Option<Change>, Go); 10] = [
            ("unchanged", Some(|_| {}), Go::Skip),
            (
                "new manifest digest",
                Some(|s| s.expected = d(3)),
                Go::Fetch,
            ),
            ("new size", Some(|s| s.size = 301), Go::Fetch),
            ("new sidecar", Some(|s| s.sidecar = Some(d(1))), Go::Fetch),
            ("sidecar gone", Some(|s| s.sidecar = None), Go::Fetch),
            ("chunk count", Some(|s| s.chunk_count = 2), Go::Fetch),
            ("chunk size", Some(|s| s.first_len = 150), Go::Fetch),
            (
                "other origin",
                Some(|s| s.origin = "github".into()),
                Go::Fetch,
            ),
            (
                "other artifact",
                Some(|s| s.local_name = "x".into()),
                Go::Fetch,
            ),
            ("nothing remembered", None, Go::Fetch),
        ];
        for (what, change, want) in cases {
            let mut now = state();
            let remembered = change.map(|c| {
                c(&mut now);
                &served
            });
            assert_eq!(decide(remembered, &now, t), want, "{what}");
        }
        // An unchanged store is asked once more after a day (bytes corrupted on the way).
        for (after, want) in [
            (Duration::ZERO, Go::Skip),
            (REMEMBER_FOR - Duration::from_secs(1), Go::Skip),
            (REMEMBER_FOR, Go::Fetch),
        ] {
            assert_eq!(
                decide(Some(&served), &state(), t + after),
                want,
                "{after:?}"
            );
        }
        let m = Memory::default();
        m.remember(served.clone());
        assert_eq!(m.get(&state().origin, &state().local_name), Some(served));
        m.forget(&state().origin, &state().local_name);
        assert_eq!(m.get(&state().origin, &state().local_name), None);
    }

    /// Kept in a file, the memory survives a new `Memory` (a daemon restart); garbage, a
    /// directory or a future date are nothing remembered, never an error.
    #[test]
    fn the_memory_survives_a_restart_in_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let served = Served {
            state: state(),
            served: Some(d(9)),
            at: Instant::now(),
        };
        let first = Memory::default();
        first.keep_in(&path);
        first.remember(served.clone());
        let again = Memory::default();
        again.keep_in(&path);
        let got = again.get(&state().origin, &state().local_name).unwrap();
        assert_eq!(
            (got.state, got.served),
            (served.state.clone(), served.served)
        );
        assert_eq!(
            decide(
                again.get(&state().origin, &state().local_name).as_ref(),
                &state(),
                Instant::now()
            ),
            Go::Skip
        );
        again.forget(&state().origin, &state().local_name);
        let third = Memory::default();
        third.keep_in(&path);
        assert_eq!(third.get(&state().origin, &state().local_name), None);
        for bad in [&b"garbage"[..], br#"[{"state":1}]"#] {
            std::fs::write(&path, bad).unwrap();
            let m = Memory::default();
            m.keep_in(&path);
            assert_eq!(m.get(&state().origin, &state().local_name), None);
        }
        let future = serde_json::to_vec(&[Saved {
            state: state(),
            served: None,
            at_unix: UnixSeconds::now().0 + 3600,
        }])
        .unwrap();
        std::fs::write(&path, future).unwrap();
        let m = Memory::default();
        m.keep_in(&path);
        assert_eq!(m.get(&state().origin, &state().local_name), None);
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let m = Memory::default();
        m.keep_in(&path);
        m.remember(served);
        assert!(std::fs::metadata(&path).unwrap().is_file());
    }
}
