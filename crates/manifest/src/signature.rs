//! Signed manifests: the detached minisign signature published beside
//! `model_names_<gen>.json` as `model_names_<gen>.json.minisig`, and the rules a device applies
//! to the comment it signs (docs/formats.md, "Signed manifests").
//!
//! The signature file is one or more standard minisign signature blocks (four lines each:
//! untrusted comment, signature, `trusted comment: …`, global signature) one after the other.
//! `minisign -V` checks the first block; a device accepts the file when any block is valid under
//! one of its trusted keys. Several blocks exist only during a key rotation (one per key).
//!
//! The trusted comment — covered by the signature, so it cannot be changed without the key — is
//! exactly `generation=<gen> release=<N> expires=<unix seconds>`.
//!
//! This module is pure: it parses and decides. Verifying Ed25519 signatures is done with a
//! minisign crate by the caller (`downloader` on the device, `artifact-store` on the release
//! side); no signature code lives here.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::layout::{StoreLayout, StorePath, manifest_file_name};
use crate::types::{FileName, Generation, ModelId};

pub use crate::layout::SIGNATURE_SUFFIX;
/// A signature file is a few hundred bytes per block; anything larger is refused unread.
pub const MAX_SIGNATURE_BYTES: u64 = 8 * 1024;
/// More blocks than this is not a key rotation but garbage.
pub const MAX_SIGNATURE_BLOCKS: usize = 8;

/// `model_names_<gen>.json.minisig`.
pub fn signature_file_name(generation: Generation) -> FileName {
    format!("{}{SIGNATURE_SUFFIX}", manifest_file_name(generation))
        .parse()
        .expect("a manifest name plus a fixed suffix is a valid file name")
}

impl StoreLayout {
    /// Beside the manifest: HF `manifests/model_names_<gen>.json.minisig`, GitHub
    /// `model_names_<gen>.json.minisig`.
    pub fn signature_path(self, generation: Generation) -> StorePath {
        let manifest = self.manifest_path(generation);
        format!("{manifest}{SIGNATURE_SUFFIX}")
            .parse()
            .expect("a manifest path plus a fixed suffix is a valid store path")
    }
}

/// The release number of a signed generation: starts at 1 and strictly increases with each
/// signed publish of that generation.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct ReleaseNumber(u64);

impl ReleaseNumber {
    /// The first release of a generation.
    pub const FIRST: ReleaseNumber = ReleaseNumber(1);

    /// Release `n`; 0 is refused.
    pub fn new(n: u64) -> Result<Self> {
        if n == 0 {
            return Err(Error::invalid("release number", "0", "releases start at 1"));
        }
        Ok(Self(n))
    }

    /// The number.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The release after this one.
    pub fn next(self) -> Result<Self> {
        self.0
            .checked_add(1)
            .map(Self)
            .ok_or_else(|| Error::invalid("release number", &self.0.to_string(), "no next one"))
    }
}

impl TryFrom<u64> for ReleaseNumber {
    type Error = Error;
    fn try_from(n: u64) -> Result<Self> {
        Self::new(n)
    }
}

impl From<ReleaseNumber> for u64 {
    fn from(r: ReleaseNumber) -> u64 {
        r.0
    }
}

impl FromStr for ReleaseNumber {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::new(parse_decimal("release number", s)?)
    }
}

impl fmt::Display for ReleaseNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

pub use cli_support::time::UnixSeconds;

/// When a signature made at an instant expires.
pub trait SignatureExpiry: Sized {
    /// When a signature made now and valid for `days` expires: at least
    /// [`MIN_EXPIRES_IN_DAYS`], so every device does not refuse it on arrival, and at most
    /// [`MAX_EXPIRES_IN_DAYS`], so the expiry still bounds how long it can be replayed.
    fn signature_expiry(self, days: u64) -> Result<Self>;
}

impl SignatureExpiry for UnixSeconds {
    fn signature_expiry(self, days: u64) -> Result<Self> {
        if days > MAX_EXPIRES_IN_DAYS {
            return Err(Error::invalid(
                "expiry in days",
                &days.to_string(),
                format!(
                    "a signature may stay valid at most {MAX_EXPIRES_IN_DAYS} days (10 years): \
                     its expiry is what stops a withdrawn manifest being served to devices \
                     again; use --expires-in {MAX_EXPIRES_IN_DAYS} or less (default 180) and \
                     sign again before it expires"
                ),
            ));
        }
        if days < MIN_EXPIRES_IN_DAYS {
            return Err(Error::invalid(
                "expiry in days",
                &days.to_string(),
                format!(
                    "a signature must stay valid at least {MIN_EXPIRES_IN_DAYS} day (devices \
                     refuse an expired one); use --expires-in 1 or more (default 180)"
                ),
            ));
        }
        self.plus_days(days)
            .ok_or_else(|| Error::invalid("expiry in days", &days.to_string(), "too far ahead"))
    }
}

/// Plain ASCII digits, no sign, no leading zero (so one number has one spelling).
fn parse_decimal(kind: &'static str, s: &str) -> Result<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0'))
    {
        return Err(Error::invalid(kind, s, "must be a decimal number"));
    }
    s.parse()
        .map_err(|_| Error::invalid(kind, s, "does not fit in 64 bits"))
}

/// What the release key vouches for besides the manifest's bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TrustedComment {
    /// The generation signed.
    pub generation: Generation,
    /// The release number signed.
    pub release: ReleaseNumber,
    /// When the signature stops being accepted, in Unix seconds.
    pub expires: UnixSeconds,
}

impl fmt::Display for TrustedComment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "generation={} release={} expires={}",
            self.generation, self.release, self.expires.0
        )
    }
}

impl FromStr for TrustedComment {
    type Err = Error;
    /// Exactly `generation=<gen> release=<N> expires=<secs>`, single spaces, in that order:
    /// one signed text has one meaning.
    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason: &str| Error::invalid("trusted comment", s, reason);
        let form = "must be `generation=vNN release=N expires=UNIX_SECONDS`";
        let mut parts = s.split(' ');
        let mut field = |key: &str| -> Result<&str> {
            parts
                .next()
                .and_then(|p| p.strip_prefix(key))
                .and_then(|p| p.strip_prefix('='))
                .ok_or_else(|| bad(form))
        };
        let generation: Generation = field("generation")?.parse()?;
        let release: ReleaseNumber = field("release")?.parse()?;
        let expires = UnixSeconds(parse_decimal("expiry", field("expires")?)?);
        if parts.next().is_some() {
            return Err(bad(form));
        }
        Ok(Self {
            generation,
            release,
            expires,
        })
    }
}

/// One minisign signature block of a signature file, as text (four lines, each ending in `\n`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SignatureBlock(String);

impl SignatureBlock {
    /// The block's text: four lines, each ending in `\n`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text after `trusted comment: `, unverified.
    pub fn trusted_comment(&self) -> &str {
        self.0
            .lines()
            .nth(2)
            .and_then(|l| l.strip_prefix("trusted comment: "))
            .unwrap_or_default()
    }

    /// Why this block is not in minisign's form (four lines: `untrusted comment:`, signature,
    /// `trusted comment: `, global signature), or `None`. A defective block is never decoded.
    pub fn defect(&self) -> Option<String> {
        let l: Vec<&str> = self.0.lines().collect();
        if l.len() != 4 {
            return Some(format!(
                "{} lines; a minisign signature block is 4",
                l.len()
            ));
        }
        if !l[0].starts_with("untrusted comment:") || !l[2].starts_with("trusted comment: ") {
            return Some("does not have minisign's untrusted/trusted comment lines".into());
        }
        None
    }

    /// A block from one minisign signature's text (as a minisign library prints it).
    pub fn from_minisign_text(text: &str) -> std::result::Result<Self, Refusal> {
        let mut blocks = signature_blocks(text)?;
        if blocks.len() != 1 {
            return Err(Refusal::Malformed {
                reason: format!("expected one signature block, found {}", blocks.len()),
            });
        }
        let block = blocks.remove(0);
        match block.defect() {
            Some(reason) => Err(Refusal::Malformed { reason }),
            None => Ok(block),
        }
    }
}

/// Split a signature file into its blocks: a block starts at an `untrusted comment:` line or
/// after a whole four-line block (so stray lines form a block of their own). Blank lines between blocks and
/// `\r\n` endings are tolerated. A block without minisign's four-line form is kept, in its
/// place, and answers [`SignatureBlock::defect`]: callers skip it like an undecodable block, so
/// a rotation file with one damaged block still verifies by its good one. Refused as a whole:
/// an empty file, or more than [`MAX_SIGNATURE_BLOCKS`] blocks.
pub fn signature_blocks(text: &str) -> std::result::Result<Vec<SignatureBlock>, Refusal> {
    let malformed = |reason: String| Refusal::Malformed { reason };
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.trim().is_empty())
        .collect();
    if lines.is_empty() {
        return Err(malformed("the file is empty".into()));
    }
    let whole = |g: &[&str]| {
        g.len() == 4
            && g[0].starts_with("untrusted comment:")
            && g[2].starts_with("trusted comment: ")
    };
    let mut groups: Vec<Vec<&str>> = Vec::new();
    for line in lines {
        match groups.last_mut() {
            Some(g) if !line.starts_with("untrusted comment:") && !whole(g) => g.push(line),
            _ => groups.push(vec![line]),
        }
    }
    if groups.len() > MAX_SIGNATURE_BLOCKS {
        return Err(malformed(format!(
            "{} signature blocks, more than {MAX_SIGNATURE_BLOCKS}",
            groups.len()
        )));
    }
    Ok(groups
        .iter()
        .map(|g| SignatureBlock(g.iter().map(|l| format!("{l}\n")).collect()))
        .collect())
}

/// Join blocks into one signature file (the first is what `minisign -V` checks).
pub fn join_signature_blocks(blocks: &[SignatureBlock]) -> String {
    blocks.iter().map(|b| b.as_str()).collect()
}

/// Why a device refuses a fetched manifest when it has trusted keys. Refusing changes nothing on
/// the device; the next origin is tried.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum Refusal {
    /// No signature file is published beside the manifest.
    #[error("no signature is published beside the manifest")]
    Unsigned,
    /// The signature file has no usable signature block.
    #[error("the signature file is malformed: {reason}")]
    Malformed {
        /// Why.
        reason: String,
    },
    /// No trusted key verifies any block over the manifest's bytes.
    #[error(
        "the signature does not verify under any of the {keys} trusted key(s): the manifest or \
         its signature was changed after signing, or another key signed it"
    )]
    UntrustedSignature {
        /// How many trusted keys were tried.
        keys: usize,
    },
    /// A verified block's trusted comment is not `generation=vNN release=N expires=SECONDS`.
    #[error("the signed comment is not `generation=vNN release=N expires=SECONDS`: {reason}")]
    BadComment {
        /// What is wrong with it.
        reason: String,
    },
    /// The signature is for another generation than the manifest fetched.
    #[error("the signature is for generation {found}, but this device fetched {expected}")]
    OtherGeneration {
        /// The generation fetched.
        expected: Generation,
        /// The generation signed.
        found: Generation,
    },
    /// The signature has expired by the device's clock.
    #[error(
        "the signature expired at {} (Unix seconds) and the device clock says {}; the \
         release engineer must sign the manifest again", expires.0, now.0
    )]
    Expired {
        /// When it expired, in Unix seconds.
        expires: UnixSeconds,
        /// The device's clock, in Unix seconds.
        now: UnixSeconds,
    },
    /// The release is older than one the device already accepted (a rollback).
    #[error(
        "release {release} is older than release {accepted}, which this device already accepted \
         (an old manifest served again); keeping the newer one"
    )]
    Rollback {
        /// The release number fetched.
        release: ReleaseNumber,
        /// The highest release number this device accepted for the generation.
        accepted: ReleaseNumber,
    },
}

impl Refusal {
    /// Short text for the device UI (`ModelDownloadProgress`).
    pub fn ui_text(&self) -> &'static str {
        match self {
            Refusal::Unsigned => "Model list refused: not signed",
            Refusal::Malformed { .. } | Refusal::UntrustedSignature { .. } => {
                "Model list refused: not signed by a trusted key"
            }
            Refusal::BadComment { .. } | Refusal::OtherGeneration { .. } => {
                "Model list refused: signed for another generation"
            }
            Refusal::Expired { .. } => "Model list refused: signature expired",
            Refusal::Rollback { .. } => "Model list refused: older than the installed one",
        }
    }
}

/// The rule for a comment whose signature verified: the generation fetched, not expired, and not
/// older than the last release this device accepted for that generation (equal is accepted: the
/// same manifest fetched again).
pub fn check_signed_comment(
    comment: &str,
    expected: Generation,
    accepted: Option<ReleaseNumber>,
    now: UnixSeconds,
) -> std::result::Result<TrustedComment, Refusal> {
    let c: TrustedComment = comment.parse().map_err(|e: Error| Refusal::BadComment {
        reason: e.to_string(),
    })?;
    if c.generation != expected {
        return Err(Refusal::OtherGeneration {
            expected,
            found: c.generation,
        });
    }
    if now >= c.expires {
        return Err(Refusal::Expired {
            expires: c.expires,
            now,
        });
    }
    if let Some(accepted) = accepted
        && c.release < accepted
    {
        return Err(Refusal::Rollback {
            release: c.release,
            accepted,
        });
    }
    Ok(c)
}

/// How far above the live release an explicit `--release` may go. Devices refuse any release
/// below the highest they accepted, so a typo such as `--release 18446744073709551615` would
/// otherwise end signing for the generation (nothing can follow it).
pub const MAX_RELEASE_STEP: u64 = 1000;

/// The shortest validity a new signature may have: a signature that expires sooner would be
/// refused by devices (almost) as soon as it is published.
pub const MIN_EXPIRES_IN_DAYS: u64 = 1;

/// The longest validity a new signature may have: 10 years. The expiry is what stops an old
/// signed manifest (a withdrawn release) being served to devices again; a signature valid past
/// the fleet's lifetime would bound nothing, and a mistyped lifetime
/// (`--expires-in 999999999999`) is refused instead of signed.
pub const MAX_EXPIRES_IN_DAYS: u64 = 3650;

/// What checking one block of a signature file against the trusted keys gave.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BlockOutcome<'a> {
    /// The block is not a decodable minisign signature (bad base64, wrong length or algorithm).
    Undecodable {
        /// Why it does not decode.
        reason: &'a str,
    },
    /// It decodes, but no trusted key verifies it over the manifest's bytes.
    NotVerified,
    /// A trusted key verifies it; its trusted comment, not yet checked.
    Verified {
        /// The trusted comment's text.
        comment: &'a str,
    },
}

/// The decision over a signature file's blocks, in file order: the first block that verifies
/// and whose comment passes [`check_signed_comment`] is accepted. An undecodable block is
/// skipped, not fatal: during a key rotation a file with one damaged block still verifies by
/// its good one. Refused: a verified block's comment refusal when there was one (it explains
/// most), else [`Refusal::Malformed`] when no block decoded at all, else
/// [`Refusal::UntrustedSignature`].
pub fn decide_blocks<'a>(
    outcomes: impl IntoIterator<Item = BlockOutcome<'a>>,
    keys: usize,
    expected: Generation,
    accepted: Option<ReleaseNumber>,
    now: UnixSeconds,
) -> std::result::Result<TrustedComment, Refusal> {
    let mut comment_refusal = None;
    let mut first_defect: Option<(usize, &str)> = None;
    let mut decoded = 0usize;
    for (i, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            BlockOutcome::Undecodable { reason } => {
                first_defect.get_or_insert((i + 1, reason));
            }
            BlockOutcome::NotVerified => decoded += 1,
            BlockOutcome::Verified { comment } => {
                decoded += 1;
                match check_signed_comment(comment, expected, accepted, now) {
                    Ok(c) => return Ok(c),
                    Err(r) => {
                        comment_refusal.get_or_insert(r);
                    }
                }
            }
        }
    }
    if let Some(r) = comment_refusal {
        return Err(r);
    }
    match first_defect {
        Some((block, reason)) if decoded == 0 => Err(Refusal::Malformed {
            reason: format!("block {block}: {reason}"),
        }),
        _ => Err(Refusal::UntrustedSignature { keys }),
    }
}

/// The release number a new signed publish gets: one more than every release already seen
/// (verified live signatures), or `requested` if given, which must be higher than all of them
/// and at most [`MAX_RELEASE_STEP`] above the highest of them and of `unverified` (live
/// releases whose signature our keys cannot check, e.g. during a key rotation; they only raise
/// the ceiling).
pub fn next_release(
    seen: impl IntoIterator<Item = ReleaseNumber>,
    unverified: impl IntoIterator<Item = ReleaseNumber>,
    requested: Option<ReleaseNumber>,
) -> Result<ReleaseNumber> {
    let highest = seen.into_iter().max();
    if let Some(r) = requested {
        let live = highest.into_iter().chain(unverified).max();
        let base = live.map_or(0, ReleaseNumber::get);
        let ceiling = base.saturating_add(MAX_RELEASE_STEP);
        if r.get() > ceiling {
            return Err(Error::invalid(
                "release number",
                &r.to_string(),
                format!(
                    "more than {MAX_RELEASE_STEP} above the live release ({}); devices refuse \
                     every release below the highest they accepted, so a number this high would \
                     leave no room for the next ones; use --release {ceiling} or less, or leave \
                     --release out",
                    live.map_or_else(|| "none yet".to_string(), |l| l.to_string())
                ),
            ));
        }
    }
    match (requested, highest) {
        (Some(r), Some(h)) if r <= h => Err(Error::invalid(
            "release number",
            &r.to_string(),
            format!(
                "release {h} is already published and devices that accepted it refuse anything \
                 lower; use --release {} or more, or leave --release out",
                h.get().saturating_add(1)
            ),
        )),
        (Some(r), _) => Ok(r),
        (None, Some(h)) => h.next(),
        (None, None) => Ok(ReleaseNumber::FIRST),
    }
}

/// A downloadable artifact whose bytes a signature over the manifest would not pin down: the
/// entry (or its accelerator variant) lacks a size, a SHA-256 or a chunk count, so a device with
/// trusted keys would have to take them from the store, which anyone who can write the store
/// controls. Signing refuses such a manifest (docs/formats.md, "Signed manifests").
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Uncovered {
    /// The model.
    pub model: ModelId,
    /// `None` for the entry's own artifact, else the `accelerator_artifacts` key (`chestnut`).
    pub variant: Option<String>,
    /// The JSON path of each missing field, e.g. `models[3].artifact_sha256` or
    /// `models[3].accelerator_artifacts.chestnut.artifact_size`.
    pub missing: Vec<String>,
}

impl Uncovered {
    /// The command that writes the missing fields, for a manifest at `manifest_path`; `DIR` is
    /// the directory holding that artifact's chunk set.
    pub fn fix_command(&self, manifest_path: &str) -> String {
        let variant = self
            .variant
            .as_deref()
            .map(|v| format!(" --variant {v}"))
            .unwrap_or_default();
        format!(
            "release-cli manifest set-artifact {manifest_path} DIR --model {}{variant}",
            self.model
        )
    }
}

impl fmt::Display for Uncovered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} missing (model {}",
            self.missing.join(", "),
            self.model
        )?;
        if let Some(v) = &self.variant {
            write!(f, ", variant {v}")?;
        }
        f.write_str(")")
    }
}

/// Every downloadable artifact of `m` — each entry a device keeps (supported format, not a
/// `local-` model) and each of its `accelerator_artifacts` variants in a supported format —
/// that lacks `artifact_size`, `artifact_sha256` or `artifact_chunk_count`. Empty when a
/// signature over `m` covers every byte a device installs from it. Pure.
pub fn uncovered_artifacts(m: &crate::Manifest) -> Vec<Uncovered> {
    use crate::keys;
    use crate::validate::join_key;
    let mut out = Vec::new();
    let mut check = |model: &ModelId, variant: Option<String>, at: &str, present: [bool; 3]| {
        let missing: Vec<String> = [
            keys::ARTIFACT_SIZE,
            keys::ARTIFACT_SHA256,
            keys::ARTIFACT_CHUNK_COUNT,
        ]
        .into_iter()
        .zip(present)
        .filter(|(_, present)| !present)
        .map(|(k, _)| join_key(at, k))
        .collect();
        if !missing.is_empty() {
            let model = model.clone();
            out.push(Uncovered {
                model,
                variant,
                missing,
            });
        }
    };
    for (i, e) in m.models().iter().enumerate() {
        if !e.is_supported() || e.id().is_local() {
            continue;
        }
        let here = format!("models[{i}]");
        let present = [
            e.artifact_size().is_some(),
            e.artifact_sha256().is_some(),
            e.artifact_chunk_count().is_some(),
        ];
        check(e.id(), None, &here, present);
        for (name, v) in e.accelerators() {
            if v.format.as_ref().is_some_and(|f| !f.is_supported()) {
                continue;
            }
            let at = join_key(&join_key(&here, keys::ACCELERATOR_ARTIFACTS), &name);
            let present = [
                v.size.is_some(),
                v.sha256.is_some(),
                v.chunk_count.is_some(),
            ];
            check(e.id(), Some(name), &at, present);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: u64) -> ReleaseNumber {
        ReleaseNumber::new(n).unwrap()
    }

    const V25: Generation = Generation::new(25);

    #[test]
    fn signature_sits_beside_the_manifest_in_both_layouts() {
        assert_eq!(
            StoreLayout::HfBucket.signature_path(V25).as_str(),
            "manifests/model_names_v25.json.minisig"
        );
        assert_eq!(
            StoreLayout::GithubBranch.signature_path(V25).as_str(),
            "model_names_v25.json.minisig"
        );
        assert_eq!(
            signature_file_name(V25).as_str(),
            "model_names_v25.json.minisig"
        );
        let (hf, gh) = (StoreLayout::HfBucket, StoreLayout::GithubBranch);
        assert_eq!(
            hf.translate(&hf.signature_path(V25), gh),
            Some(gh.signature_path(V25))
        );
        assert_eq!(
            gh.translate(&gh.signature_path(V25), hf),
            Some(hf.signature_path(V25))
        );
    }

    #[test]
    fn trusted_comment_round_trips_and_is_strict() {
        let c: TrustedComment = "generation=v25 release=7 expires=1767225600"
            .parse()
            .unwrap();
        assert_eq!(c.generation, V25);
        assert_eq!(c.release, r(7));
        assert_eq!(c.expires, UnixSeconds(1_767_225_600));
        assert_eq!(c.to_string(), "generation=v25 release=7 expires=1767225600");
        for bad in [
            "",
            "timestamp:1633700835\tfile:x",
            "generation=v25 release=7",
            "generation=v25 release=7 expires=1 extra=1",
            "release=7 generation=v25 expires=1",
            "generation=v25  release=7 expires=1",
            "generation=v025 release=7 expires=1",
            "generation=v25 release=0 expires=1",
            "generation=v25 release=07 expires=1",
            "generation=v25 release=-1 expires=1",
            "generation=v25 release=7 expires=99999999999999999999",
            "generation=v25 release=7 expires=1 ",
        ] {
            assert!(bad.parse::<TrustedComment>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn acceptance_rule_table() {
        let now = UnixSeconds(1000);
        let ok = "generation=v25 release=5 expires=2000";
        // (comment, generation fetched, accepted release, Ok(release) or the refusal's kind)
        type Case<'a> = (&'a str, Generation, Option<u64>, Result<u64, &'a str>);
        let cases: [Case; 9] = [
            (ok, V25, None, Ok(5)),
            (ok, V25, Some(4), Ok(5)),
            (ok, V25, Some(5), Ok(5)),
            (ok, V25, Some(6), Err("rollback")),
            (ok, Generation::new(26), None, Err("generation")),
            (
                "generation=v25 release=5 expires=1000",
                V25,
                None,
                Err("expired"),
            ),
            (
                "generation=v25 release=5 expires=999",
                V25,
                None,
                Err("expired"),
            ),
            ("generation=v25 release=5 expires=1001", V25, None, Ok(5)),
            ("timestamp:1", V25, None, Err("comment")),
        ];
        for (comment, generation, accepted, want) in cases {
            let got = check_signed_comment(comment, generation, accepted.map(r), now);
            match (want, got) {
                (Ok(n), Ok(c)) => assert_eq!(c.release, r(n), "{comment}"),
                (Err("rollback"), Err(Refusal::Rollback { .. }))
                | (Err("generation"), Err(Refusal::OtherGeneration { .. }))
                | (Err("expired"), Err(Refusal::Expired { .. }))
                | (Err("comment"), Err(Refusal::BadComment { .. })) => {}
                (want, got) => panic!("{comment} {accepted:?}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn next_release_is_one_more_than_anything_seen() {
        let none: [ReleaseNumber; 0] = [];
        assert_eq!(next_release([], none, None).unwrap(), r(1));
        assert_eq!(next_release([r(3), r(7), r(5)], none, None).unwrap(), r(8));
        assert_eq!(next_release([r(3)], none, Some(r(10))).unwrap(), r(10));
        assert_eq!(next_release([], none, Some(r(4))).unwrap(), r(4));
        let e = next_release([r(7)], none, Some(r(7)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--release 8"), "{e}");
        assert!(next_release([r(u64::MAX)], none, None).is_err());
    }

    /// An explicit release is at most MAX_RELEASE_STEP above the live one (verified or not).
    #[test]
    fn explicit_release_ceiling_table() {
        // (verified live, unverified live, requested, Ok(release) or Err(text in the error))
        type Case = (
            Vec<u64>,
            Vec<u64>,
            u64,
            std::result::Result<u64, &'static str>,
        );
        let cases: Vec<Case> = vec![
            (vec![], vec![], 1000, Ok(1000)),
            (vec![], vec![], 1001, Err("--release 1000 or less")),
            (vec![5], vec![], 1005, Ok(1005)),
            (vec![5], vec![], 1006, Err("--release 1005 or less")),
            (vec![5], vec![], u64::MAX, Err("(5)")),
            // A rotation: the old key's release 4000 raises the ceiling, not the floor.
            (vec![], vec![4000], 5000, Ok(5000)),
            (vec![], vec![4000], 5001, Err("--release 5000 or less")),
            (vec![], vec![4000], 2, Ok(2)),
            // Near the top of u64 the ceiling saturates instead of overflowing.
            (vec![u64::MAX - 1], vec![], u64::MAX, Ok(u64::MAX)),
        ];
        for (seen, unverified, requested, want) in cases {
            let got = next_release(
                seen.iter().map(|&n| r(n)),
                unverified.iter().map(|&n| r(n)),
                Some(r(requested)),
            );
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, r(w)),
                (Err(e), Err(needle)) => {
                    let e = e.to_string();
                    assert!(e.contains(needle), "{seen:?} {requested}: {e}");
                }
                (got, want) => panic!("{seen:?} {unverified:?} {requested}: {got:?} vs {want:?}"),
            }
        }
    }

    #[test]
    fn a_signature_stays_valid_at_least_a_day() {
        let now = UnixSeconds(1_000_000);
        assert!(now.signature_expiry(0).is_err());
        let e = now.signature_expiry(0).unwrap_err().to_string();
        assert!(e.contains("--expires-in 1"), "{e}");
        assert_eq!(now.signature_expiry(1).unwrap(), UnixSeconds(1_086_400));
        assert_eq!(
            now.signature_expiry(180).unwrap(),
            UnixSeconds(1_000_000 + 180 * 86_400)
        );
        assert!(now.signature_expiry(u64::MAX).is_err());
        // At most ten years.
        assert_eq!(
            now.signature_expiry(MAX_EXPIRES_IN_DAYS).unwrap(),
            UnixSeconds(1_000_000 + 3650 * 86_400)
        );
        for days in [MAX_EXPIRES_IN_DAYS + 1, 999_999_999_999] {
            let e = now.signature_expiry(days).unwrap_err().to_string();
            assert!(e.contains("--expires-in 3650 or less"), "{e}");
        }
    }

    #[test]
    fn blocks_are_split_and_checked() {
        let block = "untrusted comment: x\nRUQ=\ntrusted comment: generation=v25 release=1 expires=9\nAAA=\n";
        let two = format!("{block}\n{}", block.replace("\n", "\r\n"));
        let b = signature_blocks(&two).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(b[1].as_str(), block);
        assert_eq!(b[0].trusted_comment(), "generation=v25 release=1 expires=9");
        assert_eq!(join_signature_blocks(&b), format!("{block}{block}"));
        for bad in ["".to_string(), block.repeat(MAX_SIGNATURE_BLOCKS + 1)] {
            assert!(
                matches!(signature_blocks(&bad), Err(Refusal::Malformed { .. })),
                "{bad:?}"
            );
        }
        // A damaged block is kept in its place with its defect; the good one is intact.
        for damaged in [
            "untrusted comment: x\nRUQ=\n".to_string(),
            block.replace("trusted comment: g", "comment: g"),
            "extra line\n".to_string(),
            "RUQ=\ntrusted comment: generation=v25 release=1 expires=9\nAAA=\n".to_string(),
            "garbage before any block\n".to_string(),
        ] {
            for (file, bad_at, good_at) in [
                (format!("{damaged}{block}"), 0, 1),
                (format!("{block}{damaged}"), 1, 0),
            ] {
                let b = signature_blocks(&file).unwrap();
                assert_eq!(b.len(), 2, "{file:?}");
                assert!(b[bad_at].defect().is_some(), "{file:?}");
                assert_eq!(b[good_at].defect(), None, "{file:?}");
                assert_eq!(b[good_at].as_str(), block);
            }
            assert!(SignatureBlock::from_minisign_text(&damaged).is_err());
        }
        assert!(SignatureBlock::from_minisign_text(&two).is_err());
        assert_eq!(
            SignatureBlock::from_minisign_text(block).unwrap().as_str(),
            block
        );
    }

    #[test]
    fn ui_texts_are_short() {
        let all = [
            Refusal::Unsigned,
            Refusal::Malformed { reason: "x".into() },
            Refusal::UntrustedSignature { keys: 1 },
            Refusal::BadComment { reason: "x".into() },
            Refusal::OtherGeneration {
                expected: V25,
                found: V25,
            },
            Refusal::Expired {
                expires: UnixSeconds(1),
                now: UnixSeconds(2),
            },
            Refusal::Rollback {
                release: r(1),
                accepted: r(2),
            },
        ];
        for refusal in all {
            assert!(refusal.ui_text().len() <= 60, "{refusal:?}");
            assert!(!refusal.to_string().is_empty());
        }
    }

    /// Which artifacts a signature would not cover, as a table over manifests (v25 and a
    /// made-up v26: the rule does not depend on the generation).
    #[test]
    fn uncovered_artifacts_table() {
        use serde_json::{Value, json};
        let sha = "5198df6889af1244f1daa9cd29388e2a3992328f91d7f44d2633e8702a4e19d1";
        let full = |id: &str| {
            json!({"id": id, "name": "N", "artifact_format": "tinygrad_single_v1",
                   "artifact_size": 10, "artifact_sha256": sha, "artifact_chunk_count": 1})
        };
        let variant = |fields: Value| {
            let mut v = json!({"artifact_format": "tinygrad_single_v1",
                               "artifact_filename": "a_driving_chestnut_tinygrad.pkl",
                               "execution_device": "AMD"});
            for (k, x) in fields.as_object().unwrap() {
                v[k] = x.clone();
            }
            v
        };
        let with = |mut e: Value, k: &str, v: Value| {
            e[k] = v;
            e
        };
        let without = |mut e: Value, k: &str| {
            e.as_object_mut().unwrap().shift_remove(k);
            e
        };
        let complete_variant = variant(json!({"artifact_size": 5, "artifact_sha256": sha,
                                              "artifact_chunk_count": 0}));
        // (models, expected [(model, variant, missing paths)])
        type Want = Vec<(&'static str, Option<&'static str>, Vec<&'static str>)>;
        let cases: Vec<(Vec<Value>, Want)> = vec![
            (vec![full("a"), full("b")], vec![]),
            (
                vec![with(
                    full("a"),
                    "accelerator_artifacts",
                    json!({"chestnut": complete_variant}),
                )],
                vec![],
            ),
            // The live v25 shape: no artifact fields at all.
            (
                vec![json!({"id": "a", "name": "N"}), full("b")],
                vec![(
                    "a",
                    None,
                    vec![
                        "models[0].artifact_size",
                        "models[0].artifact_sha256",
                        "models[0].artifact_chunk_count",
                    ],
                )],
            ),
            (
                vec![full("a"), without(full("b"), "artifact_chunk_count")],
                vec![("b", None, vec!["models[1].artifact_chunk_count"])],
            ),
            // A chunk count of 0 (one plain file) is a count.
            (
                vec![with(full("a"), "artifact_chunk_count", json!(0))],
                vec![],
            ),
            // A Chestnut variant without size, digest and count.
            (
                vec![with(
                    full("a"),
                    "accelerator_artifacts",
                    json!({"chestnut": variant(json!({}))}),
                )],
                vec![(
                    "a",
                    Some("chestnut"),
                    vec![
                        "models[0].accelerator_artifacts.chestnut.artifact_size",
                        "models[0].accelerator_artifacts.chestnut.artifact_sha256",
                        "models[0].accelerator_artifacts.chestnut.artifact_chunk_count",
                    ],
                )],
            ),
            (
                vec![with(
                    full("a"),
                    "accelerator_artifacts",
                    json!({"chestnut": variant(json!({"artifact_size": 5, "artifact_sha256": sha}))}),
                )],
                vec![(
                    "a",
                    Some("chestnut"),
                    vec!["models[0].accelerator_artifacts.chestnut.artifact_chunk_count"],
                )],
            ),
            // Both the entry and its variant.
            (
                vec![with(
                    json!({"id": "a", "name": "N", "artifact_size": 1, "artifact_sha256": sha}),
                    "accelerator_artifacts",
                    json!({"chestnut": variant(json!({"artifact_chunk_count": 2}))}),
                )],
                vec![
                    ("a", None, vec!["models[0].artifact_chunk_count"]),
                    (
                        "a",
                        Some("chestnut"),
                        vec![
                            "models[0].accelerator_artifacts.chestnut.artifact_size",
                            "models[0].accelerator_artifacts.chestnut.artifact_sha256",
                        ],
                    ),
                ],
            ),
            // Not downloadable, so nothing to cover: an unsupported format (devices drop the
            // entry), a variant in an unsupported format (devices refuse to fetch it).
            (
                vec![
                    json!({"id": "a", "name": "N", "artifact_format": "onnx_v9"}),
                    full("b"),
                ],
                vec![],
            ),
            (
                vec![with(
                    full("a"),
                    "accelerator_artifacts",
                    json!({"chestnut": {"artifact_format": "rocm_v2", "execution_device": "AMD"}}),
                )],
                vec![],
            ),
        ];
        for generation in ["v25", "v26"] {
            for (models, want) in &cases {
                let m = crate::Manifest::from_value(json!({
                    "generation": generation,
                    "models": models,
                }))
                .unwrap();
                let got: Vec<(String, Option<String>, Vec<String>)> = uncovered_artifacts(&m)
                    .into_iter()
                    .map(|u| (u.model.to_string(), u.variant, u.missing))
                    .collect();
                let want: Vec<(String, Option<String>, Vec<String>)> = want
                    .iter()
                    .map(|(m, v, p)| {
                        (
                            m.to_string(),
                            v.map(str::to_string),
                            p.iter().map(|x| x.to_string()).collect(),
                        )
                    })
                    .collect();
                assert_eq!(got, want, "{generation} {models:?}");
            }
        }
        let u = Uncovered {
            model: "gwm8223".parse().unwrap(),
            variant: Some("chestnut".into()),
            missing: vec!["models[2].accelerator_artifacts.chestnut.artifact_size".into()],
        };
        assert_eq!(
            u.fix_command("model_names_v25.json"),
            "release-cli manifest set-artifact model_names_v25.json DIR --model gwm8223 --variant chestnut"
        );
        assert!(u.to_string().contains("variant chestnut"), "{u}");
    }

    /// A rotation file with one undecodable block still verifies by its good one; what is
    /// refused, and as what, when none does.
    #[test]
    fn decide_blocks_table() {
        use BlockOutcome::*;
        let now = UnixSeconds(1000);
        let good = "generation=v25 release=5 expires=2000";
        let expired = "generation=v25 release=6 expires=10";
        let v26 = Generation::new(26);
        let bad = Undecodable {
            reason: "invalid base64",
        };
        // (blocks, generation fetched, Ok(release) or the refusal's kind)
        type Case<'a> = (Vec<BlockOutcome<'a>>, Generation, Result<u64, &'a str>);
        let cases: Vec<Case> = vec![
            (vec![Verified { comment: good }], V25, Ok(5)),
            // One damaged block, before or after the good one.
            (vec![bad, Verified { comment: good }], V25, Ok(5)),
            (vec![Verified { comment: good }, bad], V25, Ok(5)),
            (
                vec![NotVerified, bad, Verified { comment: good }],
                V25,
                Ok(5),
            ),
            // The first acceptable block wins; an expired one before it does not refuse.
            (
                vec![Verified { comment: expired }, Verified { comment: good }],
                V25,
                Ok(5),
            ),
            (
                vec![Verified { comment: expired }, bad],
                V25,
                Err("expired"),
            ),
            (vec![bad, NotVerified], V25, Err("untrusted")),
            (vec![NotVerified], V25, Err("untrusted")),
            (vec![bad, bad], V25, Err("malformed")),
            (vec![], V25, Err("untrusted")),
            // The same for a made-up next generation.
            (
                vec![
                    bad,
                    Verified {
                        comment: "generation=v26 release=1 expires=2000",
                    },
                ],
                v26,
                Ok(1),
            ),
            (
                vec![bad, Verified { comment: good }],
                v26,
                Err("generation"),
            ),
        ];
        for (blocks, generation, want) in cases {
            let got = decide_blocks(blocks.clone(), 2, generation, None, now);
            match (want, got) {
                (Ok(n), Ok(c)) => assert_eq!(c.release, r(n), "{blocks:?}"),
                (Err("expired"), Err(Refusal::Expired { .. }))
                | (Err("untrusted"), Err(Refusal::UntrustedSignature { keys: 2 }))
                | (Err("generation"), Err(Refusal::OtherGeneration { .. })) => {}
                (Err("malformed"), Err(Refusal::Malformed { reason })) => {
                    assert!(reason.contains("block 1: invalid base64"), "{reason}")
                }
                (want, got) => panic!("{blocks:?}: want {want:?}, got {got:?}"),
            }
        }
    }
}
