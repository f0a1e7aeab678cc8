//! The one time type, [`UnixSeconds`], and times as people and the records read them: RFC 3339
//! in UTC to the second, `2026-12-06T09:30:01Z`, both ways. The calendar is humantime's (a small,
//! well-kept crate), not hand arithmetic; `--json` keeps Unix seconds where its documented fields
//! say so.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A point in time, whole seconds since 1970 UTC. JSON writes the number (a signature's expiry,
/// the device's records); a field documented as RFC 3339 takes
/// `#[serde(with = "cli_support::time::rfc3339_field")]`. Shown and parsed as RFC 3339.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UnixSeconds(pub u64);

impl UnixSeconds {
    /// The system clock now (0 if it is before 1970).
    pub fn now() -> Self {
        Self(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        )
    }

    /// `days` days after this instant; `None` when that overflows.
    pub fn plus_days(self, days: u64) -> Option<Self> {
        days.checked_mul(86_400)
            .and_then(|s| self.0.checked_add(s))
            .map(Self)
    }
}

impl fmt::Display for UnixSeconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&rfc3339(self.0))
    }
}

impl FromStr for UnixSeconds {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_rfc3339(s)
            .map(Self)
            .ok_or_else(|| format!("time {s:?}: expected YYYY-MM-DDTHH:MM:SSZ (UTC)"))
    }
}

/// A [`UnixSeconds`] field written as RFC 3339 text (`#[serde(with = ...)]`): the release
/// records' `*_at` fields.
pub mod rfc3339_field {
    use super::UnixSeconds;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `t` as `2026-12-02T19:04:55Z`.
    pub fn serialize<S: Serializer>(t: &UnixSeconds, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(t)
    }

    /// Reads exactly the form [`serialize`] writes.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<UnixSeconds, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// The last second humantime writes, `9999-12-31T23:59:59Z`.
const LAST_SECOND: u64 = 253_402_300_799;

/// Unix seconds as RFC 3339 UTC, `2027-06-01T15:26:14Z`. Past the year 9999 it reads that
/// year's last second.
pub fn rfc3339(unix_seconds: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs(unix_seconds.min(LAST_SECOND));
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `YYYY-MM-DDTHH:MM:SSZ` back to Unix seconds: exactly the form [`rfc3339`] writes (no other
/// separator, offset or fraction), a real date, not before 1970.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let t = humantime::parse_rfc3339(text).ok()?;
    let secs = t.duration_since(UNIX_EPOCH).ok()?.as_secs();
    (rfc3339(secs) == text).then_some(secs)
}

/// `t` as [`rfc3339`]: the stamp on each line of the device daemon's log. Times before 1970 are
/// stamped as 1970.
pub fn timestamp(t: SystemTime) -> String {
    rfc3339(t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_rfc3339() {
        let at = |s: u64| timestamp(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_811_863_574), "2027-06-01T15:26:14Z");
        assert_eq!(at(1_796_549_401), "2026-12-06T09:30:01Z");
        assert_eq!(
            timestamp(UNIX_EPOCH - Duration::from_secs(5)),
            "1970-01-01T00:00:00Z"
        );
    }

    #[test]
    fn only_the_written_form_parses_back() {
        for secs in [
            0,
            951_868_799,
            1_796_238_295,
            1_811_863_574,
            253_402_207_200,
        ] {
            assert_eq!(parse_rfc3339(&rfc3339(secs)), Some(secs), "{secs}");
        }
        for bad in [
            "2026-02-30T00:00:00Z",
            "2026-12-02 19:04:55Z",
            "2026-12-02t19:04:55z",
            "2026-12-02T24:00:00Z",
            "2026-12-02T19:04:55.5Z",
            "2026-12-02T19:04:55+00:00",
            "2026-12-02T19:04:55",
            "1969-12-31T23:59:59Z",
            "",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59Z");
        assert_eq!(parse_rfc3339("9999-12-31T23:59:59Z"), Some(LAST_SECOND));
    }
}
