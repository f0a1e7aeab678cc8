//! Newtypes for the values a manifest carries. Each one can only hold a valid value: parse at the
//! edge (`FromStr`, `TryFrom`), then pass the typed value around.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

/// Parses `vN`: a `v` and a decimal number without leading zeros (so that `Display` gives back
/// the same text), which fits in a `u32`.
fn parse_v_number(s: &str) -> Option<u32> {
    let digits = s.strip_prefix('v')?;
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    digits.parse().ok()
}

/// `as_str`, `Display` and serde through the string for a `String` newtype.
macro_rules! str_newtype {
    ($t:ident, $doc:literal) => {
        impl $t {
            #[doc = $doc]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        serde_via_str!($t);
    };
}

macro_rules! serde_via_str {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// `new`, `number`, `FromStr`, `Display` and serde of a `vN` newtype.
macro_rules! v_number {
    ($t:ident, $kind:literal, $example:literal, $new_doc:literal) => {
        impl $t {
            #[doc = $new_doc]
            pub const fn new(number: u32) -> Self {
                Self(number)
            }

            /// The number after the `v`.
            pub const fn number(self) -> u32 {
                self.0
            }
        }

        impl FromStr for $t {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self> {
                let must = concat!("must look like ", $example);
                parse_v_number(s)
                    .map(Self)
                    .ok_or_else(|| Error::invalid($kind, s, must))
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "v{}", self.0)
            }
        }
        serde_via_str!($t);
    };
}

/// A manifest generation (`v25`): one tinygrad ABI. Ordered by number; generations only go up.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Generation(u32);
v_number!(
    Generation,
    "generation",
    "v25",
    "Generation `number` (`new(25)` is `v25`)."
);

impl Generation {
    /// The generation after this one (`v25` -> `v26`); `None` only at `u32::MAX`.
    pub fn next(self) -> Option<Self> {
        self.0.checked_add(1).map(Self)
    }

    /// The generation before this one (`None` for `v0`).
    pub fn previous(self) -> Option<Self> {
        self.0.checked_sub(1).map(Self)
    }
}

/// A model's behavior version (`v15`): its output-parser contract, independent of the generation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct BehaviorVersion(u32);
v_number!(
    BehaviorVersion,
    "behavior version",
    "v15",
    "Behaviour version `number` (`new(15)` is `v15`)."
);

/// A model ID (`pop223`, `remove-avgpoolv4`, `local-mine`), matching `^[a-z0-9][a-z0-9_-]*$`.
///
/// IDs become directory and file names, so the grammar is what keeps `..`, `/` and friends out
/// of paths; the length cap keeps `<id>_driving_tinygrad.pkl.chunkNNofNN` under the 255-byte
/// file-name limit of every filesystem we write to.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ModelId(String);

impl ModelId {
    /// The longest ID accepted, in bytes.
    pub const MAX_LEN: usize = 128;
    /// Prefix of user-built models that live on one device only and are never published,
    /// downloaded, pruned or migrated.
    pub const LOCAL_PREFIX: &'static str = "local-";

    /// Whether this is a `local-` model, built on one device and never published.
    pub fn is_local(&self) -> bool {
        self.0.starts_with(Self::LOCAL_PREFIX)
    }

    /// The `local-<id>` form of this ID (unchanged when it is already local).
    pub fn to_local(&self) -> ModelId {
        if self.is_local() {
            self.clone()
        } else {
            // A valid ID prefixed with `local-` is still valid, but the length cap can bite.
            ModelId(format!("{}{}", Self::LOCAL_PREFIX, self.0))
        }
    }
}

impl FromStr for ModelId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let reason = if s.is_empty() {
            "must not be empty"
        } else if s.len() > Self::MAX_LEN {
            "longer than 128 bytes"
        } else if !s.as_bytes()[0].is_ascii_lowercase() && !s.as_bytes()[0].is_ascii_digit()
            || !s
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            "must match ^[a-z0-9][a-z0-9_-]*$"
        } else {
            return Ok(Self(s.to_owned()));
        };
        Err(Error::invalid("model ID", s, reason))
    }
}

impl AsRef<str> for ModelId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}
str_newtype!(ModelId, "The ID as written.");

/// A display name. Devices store catalogs in comma-joined params, so a comma would shift every
/// later name onto the wrong model; an empty name would show as a blank row.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ModelName(String);

impl FromStr for ModelName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s.is_empty() {
            Err(Error::invalid("model name", s, "must not be empty"))
        } else if s.contains(',') {
            Err(Error::invalid("model name", s, "must not contain a comma"))
        } else if s.chars().any(char::is_control) {
            // A newline or NUL would break the device's comma-joined `AvailableModelNames`
            // and every line-based reader of it.
            Err(Error::invalid(
                "model name",
                s,
                "must not contain control characters",
            ))
        } else {
            Ok(Self(s.to_owned()))
        }
    }
}

str_newtype!(ModelName, "The name as written.");

/// A calendar date written `YYYY-MM-DD` (the `released` field).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ReleaseDate {
    year: u16,
    month: u8,
    day: u8,
}

impl ReleaseDate {
    /// The date; an error when it is not a real calendar date.
    pub fn new(year: u16, month: u8, day: u8) -> Result<Self> {
        format!("{year:04}-{month:02}-{day:02}").parse()
    }

    /// The year.
    pub fn year(self) -> u16 {
        self.year
    }
    /// The month, 1..=12.
    pub fn month(self) -> u8 {
        self.month
    }
    /// The day of the month, 1..=31.
    pub fn day(self) -> u8 {
        self.day
    }
}

impl FromStr for ReleaseDate {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason: &str| Error::invalid("release date", s, reason);
        let b = s.as_bytes();
        let shape_ok = b.len() == 10
            && b[4] == b'-'
            && b[7] == b'-'
            && b.iter()
                .enumerate()
                .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit());
        if !shape_ok {
            return Err(bad("must look like YYYY-MM-DD"));
        }
        // Digits only, so these parses cannot fail.
        let year: u16 = s[0..4].parse().map_err(|_| bad("bad year"))?;
        let month: u8 = s[5..7].parse().map_err(|_| bad("bad month"))?;
        let day: u8 = s[8..10].parse().map_err(|_| bad("bad day"))?;
        if !(1..=12).contains(&month) {
            return Err(bad("month must be 01..12"));
        }
        let leap =
            (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400);
        let days = match month {
            2 if leap => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        if day == 0 || day > days {
            return Err(bad("no such day in that month"));
        }
        Ok(Self { year, month, day })
    }
}

impl fmt::Display for ReleaseDate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}
serde_via_str!(ReleaseDate);

/// A full git commit SHA-1: exactly 40 lowercase hex digits (tinygrad pins, source commits).
/// Abbreviated SHAs are refused because reuse decisions compare commits for equality.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct GitCommit(String);

impl FromStr for GitCommit {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s.len() == 40 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            Ok(Self(s.to_owned()))
        } else {
            Err(Error::invalid(
                "git commit",
                s,
                "not 40 lowercase hex digits",
            ))
        }
    }
}

str_newtype!(GitCommit, "The 40 hex digits.");

/// A bare file name (one path segment): what `artifact_filename` must be, since it is joined
/// onto a directory on the device and into URLs.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct FileName(String);

impl FileName {
    /// The longest file name accepted, in bytes.
    pub const MAX_LEN: usize = 255;
}

impl FromStr for FileName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let reason = if s.is_empty() {
            "must not be empty"
        } else if s == "." || s == ".." {
            "must not be . or .."
        } else if s.contains(['/', '\\']) {
            "must be a bare file name without path separators"
        } else if s.chars().any(char::is_control) {
            "must not contain control characters"
        } else if s.len() > Self::MAX_LEN {
            "longer than 255 bytes"
        } else {
            return Ok(Self(s.to_owned()));
        };
        Err(Error::invalid("file name", s, reason))
    }
}

str_newtype!(FileName, "The name as written.");

/// Bytes of a logical artifact: in `(0, 2 GiB]`. Nothing larger fits a comma's model budget,
/// and the cap bounds what a device will agree to download.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ArtifactSize(u64);

impl ArtifactSize {
    /// The largest artifact size accepted: 2 GiB.
    pub const MAX: u64 = 2 * 1024 * 1024 * 1024;

    /// `bytes`; an error when 0 or over [`ArtifactSize::MAX`].
    pub fn new(bytes: u64) -> Result<Self> {
        if bytes == 0 || bytes > Self::MAX {
            Err(Error::invalid(
                "artifact size",
                &bytes.to_string(),
                "must be in (0, 2 GiB]",
            ))
        } else {
            Ok(Self(bytes))
        }
    }

    /// The size in bytes.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ArtifactSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// `artifact_chunk_count`: 0 means one plain file, N in 1..=99 means N chunks.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ChunkCount(u32);

impl ChunkCount {
    /// The largest chunk count: [`chunker::MAX_CHUNKS`].
    pub const MAX: u32 = chunker::MAX_CHUNKS;
    /// 0: one plain file.
    pub const PLAIN_FILE: Self = Self(0);

    /// `count`; an error when over [`ChunkCount::MAX`].
    pub fn new(count: u64) -> Result<Self> {
        match u32::try_from(count) {
            Ok(c) if c <= Self::MAX => Ok(Self(c)),
            _ => Err(Error::invalid(
                "chunk count",
                &count.to_string(),
                "must be in 0..=99",
            )),
        }
    }

    /// The count.
    pub fn get(self) -> u32 {
        self.0
    }

    /// Whether the artifact is one plain file (count 0).
    pub fn is_plain_file(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for ChunkCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// `artifact_format`. Devices keep an entry only when it is absent, empty or
/// `tinygrad_single_v1`; any other value makes them drop the entry, so readers keep it as
/// [`ArtifactFormat::Unsupported`] (to filter) and strict validation rejects it.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum ArtifactFormat {
    /// `""`.
    Empty,
    /// `tinygrad_single_v1`: one out-of-band tinygrad pickle, the only format we write.
    TinygradSingleV1,
    /// Any other value: devices drop such an entry.
    Unsupported(String),
}

impl ArtifactFormat {
    /// The `tinygrad_single_v1` spelling.
    pub const TINYGRAD_SINGLE_V1: &'static str = "tinygrad_single_v1";

    /// The format `s` names; never fails (an unknown value is [`ArtifactFormat::Unsupported`]).
    pub fn parse(s: &str) -> Self {
        match s {
            "" => Self::Empty,
            Self::TINYGRAD_SINGLE_V1 => Self::TinygradSingleV1,
            other => Self::Unsupported(other.to_owned()),
        }
    }

    /// The format as written.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Empty => "",
            Self::TinygradSingleV1 => Self::TINYGRAD_SINGLE_V1,
            Self::Unsupported(s) => s,
        }
    }

    /// Whether devices keep an entry of this format (absent, empty or `tinygrad_single_v1`).
    pub fn is_supported(&self) -> bool {
        !matches!(self, Self::Unsupported(_))
    }
}

impl fmt::Display for ArtifactFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_parse_order_and_advance() {
        let v25: Generation = "v25".parse().unwrap();
        assert_eq!(v25.to_string(), "v25");
        assert_eq!(v25.next().unwrap().to_string(), "v26");
        assert!(v25 < "v100".parse().unwrap());
        for bad in [
            "",
            "v",
            "25",
            "V25",
            "v025",
            "v2a",
            "v-1",
            " v25",
            "v99999999999",
        ] {
            assert!(bad.parse::<Generation>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn behavior_versions_are_vn() {
        assert_eq!("v15".parse::<BehaviorVersion>().unwrap().number(), 15);
        assert!("15".parse::<BehaviorVersion>().is_err());
        assert!("v1.5".parse::<BehaviorVersion>().is_err());
    }

    #[test]
    fn model_ids_follow_the_release_grammar() {
        for good in ["pop223", "remove-avgpoolv4", "0abc", "a_b-c", "local-mine"] {
            assert!(good.parse::<ModelId>().is_ok(), "{good}");
        }
        assert!("local-mine".parse::<ModelId>().unwrap().is_local());
        assert!(!"pop223".parse::<ModelId>().unwrap().is_local());
        for bad in [
            "",
            "A",
            "../x",
            "-a",
            "_a",
            "a/b",
            "a.b",
            "a b",
            "pöp",
            &"a".repeat(129),
        ] {
            let err = bad.parse::<ModelId>().unwrap_err().to_string();
            assert!(err.starts_with("invalid model ID"), "{bad}: {err}");
        }
        let id: ModelId = "pop223".parse().unwrap();
        assert_eq!(id.to_local().as_str(), "local-pop223");
        assert_eq!(id.to_local().to_local().as_str(), "local-pop223");
    }

    #[test]
    fn names_refuse_commas() {
        assert!("Green Watermelon v8 👀📡".parse::<ModelName>().is_ok());
        let err = "A, B".parse::<ModelName>().unwrap_err().to_string();
        assert_eq!(
            err,
            r#"invalid model name "A, B": must not contain a comma"#
        );
        assert!("".parse::<ModelName>().is_err());
    }

    #[test]
    fn names_refuse_control_characters() {
        for bad in ["Pop\nModel", "Pop\0", "\u{1b}[31mPop", "Pop\r", "Tab\there"] {
            let err = bad.parse::<ModelName>().unwrap_err().to_string();
            assert!(
                err.ends_with("must not contain control characters"),
                "{err}"
            );
        }
        assert!("Pop Model 👀".parse::<ModelName>().is_ok());
    }

    #[test]
    fn dates_are_real_calendar_days() {
        assert_eq!(
            "2024-02-29".parse::<ReleaseDate>().unwrap().to_string(),
            "2024-02-29"
        );
        for bad in [
            "2023-02-29",
            "1900-02-29",
            "2025-13-01",
            "2025-00-10",
            "2025-04-31",
            "2025-4-1",
            "25-04-01",
            "2025/04/01",
            "2025-04-01T00",
        ] {
            assert!(bad.parse::<ReleaseDate>().is_err(), "{bad}");
        }
        assert!("2000-02-29".parse::<ReleaseDate>().is_ok());
    }

    #[test]
    fn file_names_are_bare() {
        assert!(
            "gwm8223_driving_chestnut_tinygrad.pkl"
                .parse::<FileName>()
                .is_ok()
        );
        for bad in ["", ".", "..", "a/b", "../x", "a\\b", "/abs", "a\nb"] {
            assert!(bad.parse::<FileName>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sizes_counts_commits_and_formats() {
        assert!(ArtifactSize::new(0).is_err());
        assert!(ArtifactSize::new(1).is_ok());
        assert!(ArtifactSize::new(ArtifactSize::MAX).is_ok());
        assert!(ArtifactSize::new(ArtifactSize::MAX + 1).is_err());
        assert!(ChunkCount::new(0).unwrap().is_plain_file());
        assert!(ChunkCount::new(99).is_ok());
        assert!(ChunkCount::new(100).is_err());
        assert!(ChunkCount::new(u64::MAX).is_err());
        assert!(
            "e837e367aac9e1a66e689f4f32ce20ca9367df13"
                .parse::<GitCommit>()
                .is_ok()
        );
        assert!("e837e36".parse::<GitCommit>().is_err());
        assert!(
            "E837E367AAC9E1A66E689F4F32CE20CA9367DF13"
                .parse::<GitCommit>()
                .is_err()
        );
        assert!(ArtifactFormat::parse("").is_supported());
        assert!(ArtifactFormat::parse("tinygrad_single_v1").is_supported());
        assert!(!ArtifactFormat::parse("split").is_supported());
    }
}
