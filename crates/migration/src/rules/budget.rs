//! The daily byte budget per artifact: what the daemon's automatic refresh may fetch of one
//! artifact in one UTC day, counted durably in `<models>/.fetched-today.json`.
//!
//! Every payload byte a download receives is counted against the artifact it is for (resumed
//! bytes already on disk are not fetched again and not counted), whoever asked for it. Before
//! an automatic refresh starts a transfer, [`hold`] compares what was fetched of that artifact
//! today, plus one whole artifact, with the budget ([`DailyBudget`]: a multiple of the
//! artifact's size): over it, the transfer is not started and the artifact is held back
//! ([`HeldBack`]: not a failure), naming it, the bytes and when it may try again. So an automatic refresh never starts a
//! transfer that could take the day's count past the budget; a person (a UI request, a
//! `download` or `refresh` command) is served whatever the count, and their bytes are counted
//! too.
//!
//! The ledger is read with a size cap. A ledger that cannot be read or makes no sense (not a
//! regular file, over the cap, not the format, a day in the future) is "unknown": `status` says
//! so, the count starts afresh, and the next counted byte replaces it. A local writer can so
//! reset today's count, as removing the file would; it can never stop a download for more than
//! the rest of the day.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use cli_support::progress::bytes;

use crate::state::bounded;

/// The ledger's file name, in the models directory.
pub const LEDGER_FILE: &str = ".fetched-today.json";
/// The ledger's read cap: one line per artifact fetched today.
pub const LEDGER_LIMIT: u64 = 64 * 1024;
/// Seconds of a UTC day.
const DAY: u64 = 24 * 3600;

/// How many bytes of one artifact the automatic refresh may fetch in one UTC day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DailyBudget {
    /// The budget is this many times the artifact's size. One download asks each origin once
    /// and may fetch a chunk that failed its digest twice: up to 4 sizes when both origins
    /// serve other bytes. The default leaves room for two such rounds and an install.
    pub times_size: u64,
}

impl Default for DailyBudget {
    /// Ten whole artifacts a day.
    fn default() -> Self {
        Self { times_size: 10 }
    }
}

impl DailyBudget {
    /// The budget, in bytes, of an artifact of `size` bytes.
    pub fn bytes_for(&self, size: u64) -> u64 {
        size.saturating_mul(self.times_size)
    }
}

/// An artifact the automatic refresh does not fetch before the next UTC day: one more whole
/// artifact could take today's count past its budget. Not a failure: no failure is counted, no
/// backoff starts, and the daemon logs it once per artifact and day (its [`Display`](std::fmt::Display) line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error(
    "{id}: held back, fetched {} of today's {} budget; tries again after {} (a request from the \
     UI is served now)",
    bytes(*fetched),
    bytes(*budget),
    cli_support::time::rfc3339(*until)
)]
pub struct HeldBack {
    /// The artifact, by its path under the models directory (`<gen>/<path>`).
    pub id: String,
    /// Payload bytes of it fetched today (UTC; 0 when the ledger is unknown).
    pub fetched: u64,
    /// Its daily budget in bytes.
    pub budget: u64,
    /// When the automatic refresh may fetch it again (Unix seconds: the next UTC midnight).
    pub until: u64,
}

/// Whether the automatic refresh holds back artifact `id` of `size` bytes when `spent` bytes
/// of it were fetched on UTC day `today` (`None`: the ledger is unknown, counted afresh): held
/// back when one more whole artifact would pass the budget. A person is never held. Pure.
pub fn hold(
    id: &str,
    spent: Option<u64>,
    size: u64,
    budget: DailyBudget,
    today: u64,
) -> Option<HeldBack> {
    let fetched = spent.unwrap_or(0);
    let budget = budget.bytes_for(size);
    (fetched.saturating_add(size) > budget).then(|| HeldBack {
        id: id.to_string(),
        fetched,
        budget,
        until: today.saturating_add(1).saturating_mul(DAY),
    })
}

/// One artifact's count for the ledger's day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fetched {
    /// Payload bytes received today.
    pub bytes: u64,
    /// The artifact's size when they were counted (its budget is a multiple of it).
    pub size: u64,
}

/// The ledger: the UTC day (days since the Unix epoch) and each artifact's count, by its path
/// under the models directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ledger {
    /// Days since 1970-01-01 (UTC).
    pub day: u64,
    /// Each artifact's count that day.
    pub fetched: BTreeMap<String, Fetched>,
}

impl Ledger {
    /// An empty ledger of day `day`.
    fn of(day: u64) -> Self {
        let fetched = BTreeMap::new();
        Ledger { day, fetched }
    }
}

/// The ledger as read at `today`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// Today's counts (empty when no ledger, or one of an earlier day).
    Known(Ledger),
    /// Unreadable or nonsensical (why, on one line): counted afresh.
    Unknown(String),
}

impl Read {
    /// Today's count for `artifact` (`None` when unknown).
    pub fn spent(&self, artifact: &str) -> Option<u64> {
        match self {
            Read::Known(l) => Some(l.fetched.get(artifact).map_or(0, |f| f.bytes)),
            Read::Unknown(_) => None,
        }
    }
}

/// What `status` shows of the ledger: each artifact's bytes today against its budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TodayReport {
    /// The UTC day (days since 1970-01-01).
    pub day: u64,
    /// Why the ledger is unknown (counted afresh), when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
    /// Each artifact fetched today, by path under the models directory.
    pub artifacts: Vec<ArtifactToday>,
}

/// One artifact's line of [`TodayReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArtifactToday {
    /// Its path under the models directory.
    pub artifact: String,
    /// Payload bytes fetched today.
    pub bytes: u64,
    /// Its daily budget in bytes (`budget` times its size).
    pub budget: u64,
    /// The automatic refresh starts no transfer of it before tomorrow ([`hold`]).
    pub held_back: bool,
}

/// The ledger read at `today`, as `status` reports it under `budget`. Pure.
pub fn report(read: &Read, today: u64, budget: DailyBudget) -> TodayReport {
    let (known, unknown) = match read {
        Read::Known(l) => (Some(l), None),
        Read::Unknown(why) => (None, Some(why.clone())),
    };
    let artifacts = known.iter().flat_map(|l| &l.fetched);
    let artifacts = artifacts.map(|(artifact, f)| ArtifactToday {
        artifact: artifact.clone(),
        bytes: f.bytes,
        budget: budget.bytes_for(f.size),
        held_back: hold(artifact, Some(f.bytes), f.size, budget, today).is_some(),
    });
    TodayReport {
        day: today,
        unknown,
        artifacts: artifacts.collect(),
    }
}

/// Today (UTC days since the epoch) from the system clock.
pub fn today() -> u64 {
    manifest::UnixSeconds::now().0 / DAY
}

/// The ledger's path under `models_dir`.
pub fn ledger_path(models_dir: &Path) -> PathBuf {
    models_dir.join(LEDGER_FILE)
}

/// Interpret the ledger's bytes (`None`: no ledger) at `today`. Pure.
pub fn interpret(bytes: Option<&[u8]>, today: u64) -> Read {
    let Some(bytes) = bytes else {
        return Read::Known(Ledger::of(today));
    };
    match serde_json::from_slice::<Ledger>(bytes) {
        Err(e) => Read::Unknown(format!("not a ledger: {e}")),
        Ok(l) if l.day > today => Read::Unknown(format!(
            "dated day {} after today ({today}): clock or file wrong",
            l.day
        )),
        Ok(l) if l.day < today => Read::Known(Ledger::of(today)),
        Ok(l) => Read::Known(l),
    }
}

/// Read the ledger under `models_dir` at `today` (bounded; never an error).
pub fn read(models_dir: &Path, today: u64) -> Read {
    match bounded::read_capped(&ledger_path(models_dir), LEDGER_LIMIT) {
        Ok(bytes) => interpret(bytes.as_deref(), today),
        Err(e) => Read::Unknown(crate::error::one_line(&e.to_string())),
    }
}

/// The ledger's bytes once `bytes` fetched of `artifact` (of `size` bytes) are added to `read`
/// at `today` (an unknown ledger starts afresh). Pure.
pub fn counted(read: Read, artifact: &str, size: u64, bytes: u64, today: u64) -> Vec<u8> {
    let mut ledger = match read {
        Read::Known(l) => l,
        Read::Unknown(_) => Ledger::of(today),
    };
    let entry = ledger
        .fetched
        .entry(artifact.to_string())
        .or_insert(Fetched { bytes: 0, size });
    entry.bytes = entry.bytes.saturating_add(bytes);
    entry.size = size;
    let mut body = serde_json::to_vec(&ledger).unwrap_or_default();
    body.push(b'\n');
    body
}

/// Count `bytes` fetched of `artifact` (of `size` bytes) at `today`: the ledger read, added
/// to and written back atomically (an unknown one starts afresh; anything but a regular file at
/// its path is removed first, so a planted directory cannot stop the counting).
pub fn count(
    models_dir: &Path,
    artifact: &str,
    size: u64,
    bytes: u64,
    today: u64,
) -> std::io::Result<()> {
    let body = counted(read(models_dir, today), artifact, size, bytes, today);
    let path = ledger_path(models_dir);
    if let Ok(m) = std::fs::symlink_metadata(&path)
        && !m.is_file()
    {
        if m.is_dir() {
            fs_err::remove_dir_all(&path)?;
        } else {
            fs_err::remove_file(&path)?;
        }
    }
    chunker::atomic::write_atomic(&path, &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use manifest::ModelEntry;
    use manifest::contract::ContractName;

    /// The rule over the artifacts v25, v26's contract and a made-up v27 (v26's contract)
    /// fetch for one entry: the automatic refresh holds an artifact back (naming it, today's
    /// bytes and budget, and the next UTC midnight) once one more whole artifact would pass the
    /// budget; an unknown ledger counts afresh.
    #[test]
    fn the_daily_budget_table() {
        const MIB: u64 = 1024 * 1024;
        let v = serde_json::json!({"id": "sc2", "artifact_size": 3 * MIB, "artifact_sha256": "1".repeat(64)});
        let entry = ModelEntry::from_map(v.as_object().unwrap().clone()).unwrap();
        let budget = DailyBudget::default();
        let today = 20_000;
        for (g, contract) in [
            (25, ContractName::V25),
            (26, ContractName::V26),
            (27, ContractName::V26),
        ] {
            let target = downloader::Target::from_entry_for(&entry, contract.contract())
                .unwrap_or_else(|e| panic!("v{g}: {e}"));
            let size = target.size.expect("the entry's size");
            assert_eq!(size, 3 * MIB, "v{g}");
            let id = format!("v{g}/{}", target.local_name.as_str());
            for (spent, held) in [
                (Some(0), false),
                (Some(9 * size), false),
                (None, false),
                (Some(9 * size + 1), true),
                (Some(10 * size), true),
                (Some(u64::MAX), true),
            ] {
                let got = hold(&id, spent, size, budget, today);
                assert_eq!(got.is_some(), held, "v{g} {spent:?}");
                if let Some(h) = got {
                    assert_eq!(
                        (h.id.as_str(), h.fetched, h.budget, h.until),
                        (id.as_str(), spent.unwrap(), 10 * size, 20_001 * DAY),
                        "v{g}"
                    );
                }
            }
            let line = hold(&id, Some(9 * size + MIB), size, budget, today)
                .unwrap()
                .to_string();
            assert_eq!(
                line,
                format!(
                    "{id}: held back, fetched 28.00 MiB of today's 30.00 MiB budget; tries \
                     again after 2024-10-05T00:00:00Z (a request from the UI is served now)"
                )
            );
        }
        // A zero multiple holds back every artifact; an empty artifact always fits.
        let none = DailyBudget { times_size: 0 };
        assert!(hold("a", Some(0), 10, none, today).is_some());
        assert!(hold("a", Some(0), 0, budget, today).is_none());
    }

    #[test]
    fn the_ledger_reads_hostile_content_as_unknown_and_counts_afresh() {
        let today = 20_000;
        let ok = br#"{"day":20000,"fetched":{"a.pkl":{"bytes":5,"size":10}}}"#;
        assert_eq!(interpret(Some(ok), today).spent("a.pkl"), Some(5));
        assert_eq!(interpret(Some(ok), today).spent("b.pkl"), Some(0));
        // Yesterday's counts are over; no ledger is nothing fetched.
        assert_eq!(interpret(Some(ok), today + 1).spent("a.pkl"), Some(0));
        assert_eq!(interpret(None, today).spent("a.pkl"), Some(0));
        for bad in [
            &b"garbage"[..],
            b"",
            b"\xef\xbb\xbf{}",
            br#"{"day":-1,"fetched":{}}"#,
            br#"{"day":20000,"fetched":{"a.pkl":{"bytes":-5,"size":10}}}"#,
            br#"{"day":20000,"fetched":{},"extra":1}"#,
            br#"{"day":20001,"fetched":{}}"#,
        ] {
            assert!(
                matches!(interpret(Some(bad), today), Read::Unknown(_)),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let d = tempfile::tempdir().unwrap();
        count(d.path(), "a.pkl", 10, 4, today).unwrap();
        count(d.path(), "a.pkl", 10, 3, today).unwrap();
        assert_eq!(read(d.path(), today).spent("a.pkl"), Some(7));
        // Garbage, an oversized file and a planted directory: unknown, then replaced.
        let path = ledger_path(d.path());
        std::fs::write(&path, b"\x00garbage").unwrap();
        assert!(matches!(read(d.path(), today), Read::Unknown(_)));
        count(d.path(), "a.pkl", 10, 2, today).unwrap();
        assert_eq!(read(d.path(), today).spent("a.pkl"), Some(2));
        std::fs::write(&path, vec![b' '; LEDGER_LIMIT as usize + 1]).unwrap();
        assert!(matches!(read(d.path(), today), Read::Unknown(_)));
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir_all(path.join("x")).unwrap();
        let why = match read(d.path(), today) {
            Read::Unknown(why) => why,
            other => panic!("{other:?}"),
        };
        assert!(why.contains(LEDGER_FILE), "{why}");
        count(d.path(), "a.pkl", 10, 1, today).unwrap();
        assert_eq!(read(d.path(), today).spent("a.pkl"), Some(1));
    }
}
