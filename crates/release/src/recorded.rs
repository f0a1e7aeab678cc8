//! Values more than one part of the gate records and reads: the time a record was made
//! ([`UtcTime`]) and the rehearsal's record ([`RehearsalRecord`], its checks and the manifest
//! digest it binds). A leaf: it uses no other module of this crate, so `gate`, `records` and
//! `rehearse` (which re-export these) do not import each other in a circle.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use chunker::Sha256Digest;
use manifest::{Generation, GitCommit, Manifest, ModelId};
use serde::{Deserialize, Serialize};

/// A point in time, whole seconds since 1970 UTC; written as `2026-12-02T19:04:55Z`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub struct UtcTime(pub u64);

impl UtcTime {
    /// The system clock now (0 if it is before 1970), as the signature's clock reads it.
    pub fn now() -> Self {
        Self(manifest::UnixSeconds::now().0)
    }
}

// Days since 1970-01-01 to (year, month, day), proleptic Gregorian: the one conversion, shared
// with the device's log timestamps.
use cli_support::progress::civil_from_days as civil;

/// (year, month, day) to days since 1970-01-01, the inverse of `civil`.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

impl fmt::Display for UtcTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0 as i64;
        let (y, m, d) = civil(secs.div_euclid(86_400));
        let t = secs.rem_euclid(86_400);
        write!(
            f,
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
            t / 3600,
            t / 60 % 60,
            t % 60
        )
    }
}

impl FromStr for UtcTime {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("time {s:?}: expected YYYY-MM-DDTHH:MM:SSZ (UTC)");
        let b = s.as_bytes();
        if b.len() != 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[19] != b'Z' {
            return Err(bad());
        }
        let n = |r: std::ops::Range<usize>| -> Result<u32, String> {
            let t = &s[r];
            if !t.bytes().all(|c| c.is_ascii_digit()) {
                return Err(bad());
            }
            t.parse().map_err(|_| bad())
        };
        let (y, mo, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
        if b[13] != b':' || b[16] != b':' {
            return Err(bad());
        }
        let (h, mi, se) = (n(11..13)?, n(14..16)?, n(17..19)?);
        if !(1970..=9999).contains(&y)
            || !(1..=12).contains(&mo)
            || !(1..=31).contains(&d)
            || h > 23
            || mi > 59
            || se > 59
        {
            return Err(bad());
        }
        let days = days_from_civil(i64::from(y), mo, d);
        if civil(days) != (i64::from(y), mo, d) {
            return Err(bad());
        }
        Ok(Self(
            days as u64 * 86_400 + u64::from(h) * 3600 + u64::from(mi) * 60 + u64::from(se),
        ))
    }
}

impl Serialize for UtcTime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for UtcTime {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Which device a check was made on.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    /// The staged release and the openpilot tree, before any device.
    Release,
    /// An old device whose selected model is in the new catalog: it must end on the new bytes.
    Kept,
    /// An old device whose selected model the new catalog dropped: it must end on the built-in.
    Dropped,
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scenario::Release => "release",
            Scenario::Kept => "kept",
            Scenario::Dropped => "dropped",
        })
    }
}

/// One check of the rehearsal and what was seen.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct RehearsalCheck {
    pub scenario: Scenario,
    /// A short stable name (`no_old_driving_artifact`, `selected_is_new_artifact`, …).
    pub check: String,
    pub passed: bool,
    /// What was seen (on failure: what is wrong and where).
    pub detail: String,
}

/// `results/rehearsal.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RehearsalRecord {
    pub generation: Generation,
    /// The generation the old devices were on.
    pub previous_generation: Generation,
    pub manifest: PathBuf,
    /// The SHA-256 of the manifest's canonical bytes (what `publish` writes and records).
    pub manifest_sha256: Sha256Digest,
    pub tinygrad_commit: Option<GitCommit>,
    pub openpilot: PathBuf,
    pub device_manager: PathBuf,
    /// How the device was told where its tree is: `--openpilot-dir DIR` (it follows the tree:
    /// generation and built-in come from it).
    pub device_args: Vec<String>,
    /// The `kept` device's selected model, and the `dropped` device's (absent from the catalog).
    pub selected: ModelId,
    pub dropped: ModelId,
    pub checks: Vec<RehearsalCheck>,
    pub passed: bool,
    pub finished_at: UtcTime,
    /// The devices, the staged store and the manager's logs.
    pub work_dir: PathBuf,
}

impl RehearsalRecord {
    pub fn failures(&self) -> impl Iterator<Item = &RehearsalCheck> {
        self.checks.iter().filter(|c| !c.passed)
    }
}

/// The SHA-256 the rehearsal and the publish record bind a manifest by.
pub fn manifest_digest(m: &Manifest) -> Sha256Digest {
    Sha256Digest::of_bytes(&m.to_canonical_bytes())
}
