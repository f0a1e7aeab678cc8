//! One model's artifact: plan the pieces, fetch them in parallel into one staging file, verify,
//! then install with a single rename.
//!
//! Whatever the published form, the artifact is assembled into one staging file (see
//! [`crate::staging`]) and, once its whole SHA-256 matches, renamed over
//! `<id>_driving_tinygrad.pkl`: a plain file wins over a chunk set for every reader
//! (docs/formats.md, "Reading"), so that rename is the one moment the new artifact appears and
//! no reader sees a mix. Other forms of the name are removed afterwards, `.chunkmanifest` first.
//!
//! This file holds the public vocabulary; [`plan`] the pure decisions, [`resolve`] what one
//! origin publishes, [`execute`] one origin's run, [`staged`] the staging file, its record and
//! the install, [`inspect`] digests of bytes on disk, [`retry`] the one retry helper.

mod execute;
mod inspect;
mod plan;
mod resolve;
mod retry;
mod staged;

pub(crate) use execute::{Job, download_from, resolve_from};
pub use inspect::installed_sidecar_digest;
pub use plan::{Piece, other_forms, plan_pieces};
pub(crate) use retry::with_retries;
pub use staged::remove_other_forms;

use std::path::PathBuf;
use std::time::Duration;

use chunker::Sha256Digest;
use manifest::{FileName, ModelEntry, ModelId};

pub use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::http::HttpConfig;
use crate::staging::staging_names;

/// Tuning of one download.
#[derive(Debug, Clone)]
pub struct DownloadConfig {
    /// Parallel connections per download.
    pub connections: usize,
    /// Ranges fetched in parallel within one chunk (1 = a chunk is one request).
    pub ranges_per_chunk: usize,
    /// Tries per range before the origin counts as failed.
    pub max_attempts: u32,
    /// Wait before the first retry; it doubles with each retry, and jitter adds up to half again.
    pub backoff_base: Duration,
    /// The cap on that doubling (before jitter).
    pub backoff_max: Duration,
    /// Free space required beyond the artifact itself.
    pub space_margin: u64,
    /// Timeouts, rates and deadlines of the HTTP client.
    pub http: HttpConfig,
}

impl Default for DownloadConfig {
    fn default() -> Self {
        Self {
            connections: 4,
            ranges_per_chunk: 1,
            max_attempts: 5,
            backoff_base: Duration::from_millis(250),
            backoff_max: Duration::from_secs(8),
            space_margin: 64 * 1024 * 1024,
            http: HttpConfig::default(),
        }
    }
}

/// What a download reports while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Trying this origin.
    Origin {
        /// The origin, as displayed (its name and base URL).
        origin: String,
    },
    /// Bytes of the artifact present in staging so far.
    Progress {
        /// Bytes present in staging.
        done: u64,
        /// The artifact's size in bytes.
        total: u64,
    },
    /// All bytes are in; the digest (which followed the bytes as they arrived) finishes over
    /// the last ones before install.
    Verifying,
    /// One origin's try moved this many payload bytes over the network (resumed bytes already
    /// on disk not counted), whatever its outcome: what a daily byte budget counts.
    Fetched {
        /// The origin, as displayed.
        origin: String,
        /// Bytes received from it in this try.
        bytes: u64,
    },
    /// Verified and renamed into place.
    Installed {
        /// The installed file.
        path: PathBuf,
    },
}

/// Where the digest a download was verified against came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DigestSource {
    /// `artifact_sha256` of the manifest entry.
    Manifest,
    /// The origin's `<name>.sha256` sidecar, because the entry declares no digest (the live
    /// manifest's shape). The bytes are still verified against it before install, and the
    /// digest is kept next to the installed file ([`installed_sidecar_digest`]).
    Sidecar,
}

impl DigestSource {
    /// `manifest` or `sidecar`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Manifest => "manifest",
            Self::Sidecar => "sidecar",
        }
    }
}

impl std::fmt::Display for DigestSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A verified, installed artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The installed logical file (`<models>/<local name>`).
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, which the whole artifact matched before the rename.
    pub sha256: Sha256Digest,
    /// Where that digest came from.
    pub digest_source: DigestSource,
    /// The origin the bytes came from, as displayed.
    pub origin: String,
}

/// What a download of a target would fetch from the first origin that answers, learned the way
/// a download learns it before its first payload byte ([`crate::Downloader::plan_target`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadPlan {
    /// The origin that answered, as displayed.
    pub origin: String,
    /// The artifact's size (the entry's, or learned from the origin).
    pub size: u64,
    /// The digest the bytes would be verified against.
    pub sha256: Sha256Digest,
    /// Where that digest comes from.
    pub digest_source: DigestSource,
    /// The remote files, each placed at its offset in the artifact.
    pub pieces: Vec<Piece>,
}

/// What to fetch, checked against the manifest entry before any request. Fields the entry
/// does not declare are `None` and learned from each origin before the first payload byte:
/// the chunk count from `.chunkmanifest` (absent: one plain file), the digest from the
/// `.sha256` sidecar (absent too: not downloadable), the size from `HEAD`.
#[derive(Debug, Clone)]
pub struct Target {
    /// The model.
    pub id: ModelId,
    /// Remote logical name (`artifact_filename` or `<id>_driving_tinygrad.pkl`).
    pub remote_name: FileName,
    /// Local logical name: `<id>_driving_tinygrad.pkl` (what modeld opens), or
    /// `<id>_driving_chestnut_tinygrad.pkl` for the eGPU variant.
    pub local_name: FileName,
    /// `artifact_size`, when the entry declares it.
    pub size: Option<u64>,
    /// `artifact_sha256`, when the entry declares it.
    pub sha256: Option<Sha256Digest>,
    /// `Some(0)` = one plain file.
    pub chunk_count: Option<u32>,
    /// `artifact_chunk_sha256`, when the entry declares it: one digest per chunk, checked as each
    /// chunk arrives.
    pub chunk_sha256: Option<Vec<Sha256Digest>>,
}

impl Target {
    /// The entry's artifact as a device of the base contract (v25) fetches it.
    /// [`Error::NotDownloadable`] for a `local-` model, an unsupported `artifact_format`, or
    /// per-chunk digests that do not match the chunk count.
    pub fn from_entry(entry: &ModelEntry) -> Result<Self> {
        Self::from_entry_for(entry, manifest::contract::BASE_CONTRACT.contract())
    }

    /// The entry's artifact as a device of `contract` fetches it (its `artifact_format` must
    /// be one that contract loads).
    pub fn from_entry_for(entry: &ModelEntry, contract: &manifest::Contract) -> Result<Self> {
        let model = entry.id().to_string();
        let bad = |reason: &str| Error::NotDownloadable {
            model: model.clone(),
            reason: reason.to_string(),
        };
        if entry.id().is_local() {
            return Err(bad("local models are never downloaded"));
        }
        if !entry.is_supported_by(contract) {
            return Err(bad("unsupported artifact_format"));
        }
        let chunk_count = entry.artifact_chunk_count().map(|c| c.get());
        let chunk_sha256 = entry.chunk_digests();
        if let (Some(list), Some(count)) = (&chunk_sha256, chunk_count)
            && list.len() != count as usize
        {
            return Err(bad(
                "artifact_chunk_sha256 does not have one digest per chunk",
            ));
        }
        Ok(Self {
            id: entry.id().clone(),
            remote_name: entry.file_name(),
            local_name: manifest::layout::artifact_file_name(entry.id()),
            size: entry.artifact_size().map(|s| s.get()),
            sha256: entry.artifact_sha256(),
            chunk_count,
            chunk_sha256,
        })
    }

    /// Where this target's digest will come from.
    pub fn digest_source(&self) -> DigestSource {
        if self.sha256.is_some() {
            DigestSource::Manifest
        } else {
            DigestSource::Sidecar
        }
    }

    /// The staging file's name inside [`STAGING_DIR`](crate::STAGING_DIR): tied to the artifact digest so bytes of
    /// two different artifacts are never mixed. `None` until the digest is known.
    pub fn staging_name(&self) -> Option<String> {
        self.sha256
            .map(|d| staging_names(&d.to_hex(), self.local_name.as_str()).0)
    }
}
