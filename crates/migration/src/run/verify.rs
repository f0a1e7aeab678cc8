//! Verification of installed models: "installed" means the size and SHA-256 match the catalog
//! (or the origin's digest kept beside an entry without one), never "the size is right". The
//! results are kept in `.verified.json` keyed by file name against a stat signature of every
//! file of the artifact, so a re-check of an untouched model costs a few `stat`s.

use fs_err as fs;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use manifest::{ModelEntry, ModelId, Sha256Digest, layout};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::state::bounded;
use crate::state::device::{Device, ExpectedDigest, VERIFIED_FILE, VerifyState};

/// The stat signature of every file of an installed artifact; equal signatures mean the bytes
/// were not replaced since they were hashed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct CacheEntry {
    signature: String,
    sha256: String,
    size: u64,
    /// These bytes matched the catalog's digest when they were hashed: a later catalog that
    /// republished the model with other bytes makes them an older verified copy, not corrupt.
    #[serde(default)]
    catalog_verified: bool,
    /// When this manager installed these bytes (kept while the file is unchanged): what a
    /// one-shot run compares a load receipt with (`load_receipt::notice_failed_start`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    installed: Option<crate::state::load_receipt::InstallMoment>,
}

impl Device {
    fn signature(path: &Path) -> Result<Option<String>> {
        let Some(resolved) = chunker::resolve(path).map_err(|e| Error::NotVerified {
            path: path.display().to_string(),
            source: e,
        })?
        else {
            return Ok(None);
        };
        let mut sig = String::new();
        let mut files: Vec<PathBuf> = resolved.pieces().into_iter().map(|(p, _)| p).collect();
        if let chunker::Resolved::Chunked { manifest, .. } = &resolved {
            files.push(manifest.clone());
        }
        for f in files {
            let m = fs::symlink_metadata(&f)?;
            if !m.file_type().is_file() {
                // A symlink could be re-pointed without changing its own stat.
                return Ok(None);
            }
            sig.push_str(&format!(
                "{}:{}:{}:{}.{}:{}.{};",
                m.dev(),
                m.ino(),
                m.size(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec()
            ));
        }
        Ok(Some(sig))
    }

    /// The verification cache; an unreadable one is an empty cache (everything is re-hashed).
    fn load_cache(&self) -> BTreeMap<String, CacheEntry> {
        self.read_json(VERIFIED_FILE, bounded::VERIFIED_LIMIT)
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    fn save_cache(&self, cache: &BTreeMap<String, CacheEntry>) -> Result<()> {
        let path = self.models_dir().join(VERIFIED_FILE);
        let body = serde_json::to_vec(cache).expect("plain map serializes");
        self.effects.cache_write(&path, &body)
    }

    /// Whether `entry`'s artifact is installed and verified: size and SHA-256 against the
    /// catalog. A cached result is reused while the stat signature of every file is unchanged,
    /// so a re-check of an untouched model costs a few `stat`s; `force` re-hashes anyway.
    pub fn verify_entry(&self, entry: &ModelEntry, force: bool) -> Result<VerifyState> {
        let path = self.artifact_path(entry.id());
        // A planned run that purged any form of it sees it missing, as the real run would.
        if self.effects.planned_removal(
            &self.files().artifact_dir(entry.id()),
            layout::artifact_file_name(entry.id()).as_str(),
        ) {
            return Ok(VerifyState::Missing);
        }
        let sig = match Self::signature(&path) {
            Ok(Some(sig)) => sig,
            Ok(None) => return Ok(VerifyState::Missing),
            // A torn `.chunkmanifest` or `.sha256` (the Python manager never fsyncs) is a broken
            // install, not a reason to fail: reporting it corrupt lets `download` replace it.
            Err(Error::NotVerified {
                source:
                    chunker::Error::MalformedChunkManifest { .. }
                    | chunker::Error::MalformedSidecar { .. },
                ..
            }) => return Ok(VerifyState::Corrupt),
            Err(e) => return Err(e),
        };
        let Some(expected) = self.expected_digest(entry) else {
            return Ok(VerifyState::Unverified);
        };
        let fits = |sha: &str, size: u64| {
            sha == expected.sha256.to_hex() && expected.size.is_none_or(|s| s == size)
        };
        let name = layout::artifact_file_name(entry.id()).to_string();
        let mut cache = self.load_cache();
        // With trusted keys the cache decides nothing: it sits in `/data/models`, where a writer
        // could plant other bytes beside an entry matching their stat (claiming the signed
        // digest, or an earlier verified copy). The file is hashed every time, and only the
        // signed catalog's digest makes it verified (no `Outdated` from the cache).
        let trust_cache = !self.is_protected();
        if !force
            && trust_cache
            && let Some(c) = cache.get(&name)
            && c.signature == sig
        {
            return Ok(if fits(&c.sha256, c.size) {
                VerifyState::Verified
            } else if c.catalog_verified {
                VerifyState::Outdated
            } else {
                VerifyState::Corrupt
            });
        }
        let expected = chunker::Expected {
            sha256: None,
            size: None,
            chunk_count: None,
            chunk_sha256: None,
            // The catalog judges the bytes (`fits` below), not a sidecar on the device.
            own_sidecar: chunker::OwnSidecar::Ignore,
        };
        let state = match chunker::verify(&path, &expected) {
            Ok(report) => {
                let matches = fits(&report.sha256.to_hex(), report.size);
                // The same bytes, verified against an earlier catalog: still that verified copy.
                let earlier = trust_cache
                    && cache.get(&name).is_some_and(|c| {
                        c.catalog_verified
                            && c.sha256 == report.sha256.to_hex()
                            && c.size == report.size
                    });
                let installed = cache
                    .get(&name)
                    .filter(|c| c.signature == sig)
                    .and_then(|c| c.installed.clone());
                cache.insert(
                    name,
                    CacheEntry {
                        signature: sig,
                        sha256: report.sha256.to_hex(),
                        size: report.size,
                        catalog_verified: matches || earlier,
                        installed,
                    },
                );
                if matches {
                    VerifyState::Verified
                } else if earlier {
                    VerifyState::Outdated
                } else {
                    VerifyState::Corrupt
                }
            }
            Err(_) => {
                cache.remove(&name);
                VerifyState::Corrupt
            }
        };
        self.save_cache(&cache)?;
        Ok(state)
    }

    /// The digest `entry`'s installed artifact must have: the manifest's `artifact_sha256`, or,
    /// for an entry without one (the live manifest's shape), the origin's sidecar digest the
    /// downloader verified the bytes against and kept beside the install. `None`: nothing to
    /// check against (reported `unverified`, never handed to modeld).
    pub fn expected_digest(&self, entry: &ModelEntry) -> Option<ExpectedDigest> {
        let manifest = entry.artifact_sha256().map(|sha256| ExpectedDigest {
            sha256,
            size: entry.artifact_size().map(|s| s.get()),
            source: downloader::DigestSource::Manifest,
        });
        // With trusted keys only what the signed manifest pins counts: never the sidecar, and
        // not a digest without its size and chunk count (`downloader::trust::digest_rule`).
        if self.is_protected() {
            let pinned = downloader::trust::digest_rule(
                true,
                entry.artifact_sha256().is_some(),
                entry.artifact_size().is_some(),
                entry.artifact_chunk_count().is_some(),
            );
            return manifest.filter(|_| pinned.is_ok());
        }
        if manifest.is_some() {
            return manifest;
        }
        let name = layout::artifact_file_name(entry.id());
        downloader::installed_sidecar_digest(&self.files().artifact_dir(entry.id()), name.as_str())
            .map(|sha256| ExpectedDigest {
                sha256,
                size: None,
                source: downloader::DigestSource::Sidecar,
            })
    }

    /// Record that the artifact just installed at `entry`'s path was verified as `sha256` /
    /// `size` (the downloader hashed every byte before the install rename), so the next check is
    /// a few `stat`s instead of hashing the whole artifact again on the device.
    pub fn record_verified(
        &self,
        entry: &ModelEntry,
        sha256: &Sha256Digest,
        size: u64,
    ) -> Result<()> {
        let path = self.artifact_path(entry.id());
        let Some(signature) = Self::signature(&path)? else {
            return Ok(());
        };
        let mut cache = self.load_cache();
        cache.insert(
            layout::artifact_file_name(entry.id()).to_string(),
            CacheEntry {
                signature,
                sha256: sha256.to_hex(),
                size,
                catalog_verified: true,
                installed: crate::state::load_receipt::InstallMoment::now(),
            },
        );
        self.save_cache(&cache)
    }

    /// When this manager installed `id`'s artifact with digest `sha256`, if it did and the
    /// file is unchanged since (its stat signature is the one recorded then).
    pub(crate) fn install_moment(
        &self,
        id: &ModelId,
        sha256: &Sha256Digest,
    ) -> Option<crate::state::load_receipt::InstallMoment> {
        let sig = Self::signature(&self.artifact_path(id)).ok()??;
        self.load_cache()
            .remove(layout::artifact_file_name(id).as_str())
            .filter(|c| c.signature == sig && c.sha256 == sha256.to_hex())
            .and_then(|c| c.installed)
    }

    /// Forget a cached verification (after deleting or replacing an artifact).
    pub fn forget(&self, id: &ModelId) -> Result<()> {
        let mut cache = self.load_cache();
        if cache
            .remove(layout::artifact_file_name(id).as_str())
            .is_some()
        {
            self.save_cache(&cache)?;
        }
        Ok(())
    }
}
