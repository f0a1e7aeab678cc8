//! What a signature must cover before a device with trusted keys installs an artifact, and the
//! words for what it does not: a leaf, so the crate's error can name it without importing the
//! trust checks that return it.

use std::fmt;

/// A part of an artifact the signature must cover before a device with trusted keys installs
/// it: what the manifest entry (or variant) does not give is not signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsigned {
    /// The whole artifact's SHA-256 (`artifact_sha256`).
    Sha256,
    /// Its size (`artifact_size`).
    Size,
    /// Its chunk count (`artifact_chunk_count`).
    ChunkCount,
}

impl Unsigned {
    /// The manifest field that gives it (the entry's; a variant's are named alike).
    pub fn field(self) -> &'static str {
        match self {
            Unsigned::Sha256 => "artifact_sha256",
            Unsigned::Size => "artifact_size",
            Unsigned::ChunkCount => "artifact_chunk_count",
        }
    }
}

impl fmt::Display for Unsigned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unsigned::Sha256 => "SHA-256",
            Unsigned::Size => "size",
            Unsigned::ChunkCount => "chunk count",
        })
    }
}

/// The words for an artifact a device with trusted keys does not install: `not installable:
/// the signed manifest gives no SHA-256, size for <file>`.
pub fn not_installable_text(file: &str, missing: &[Unsigned]) -> String {
    let list: Vec<String> = missing.iter().map(ToString::to_string).collect();
    format!(
        "not installable: the signed manifest gives no {} for {file} (a device with trusted keys \
         installs only bytes the signature covers, never a digest from the store's .sha256 \
         sidecar); the release engineer adds {} with `release-cli manifest set-artifact` and \
         signs again",
        list.join(", "),
        missing
            .iter()
            .map(|m| m.field())
            .collect::<Vec<_>>()
            .join(", ")
    )
}
