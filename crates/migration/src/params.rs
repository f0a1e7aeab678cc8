//! openpilot-style params: one file per key in a directory (`/data/params/d`, or the memory
//! params `/dev/shm/params/d`), each written atomically and durably (temp file in the same
//! directory, fsync, rename, fsync the directory), so a power cut leaves the old value or the
//! new one, never a torn one.

use std::path::{Path, PathBuf};

use crate::bounded::PARAM_LIMIT;
use crate::effects::Effects;
use crate::error::{Error, Result};

/// Persistent keys this manager reads and writes.
pub mod keys {
    pub const MODEL: &str = "Model";
    pub const DRIVING_MODEL: &str = "DrivingModel";
    pub const MODEL_VERSION: &str = "ModelVersion";
    pub const DRIVING_MODEL_VERSION: &str = "DrivingModelVersion";
    pub const DRIVING_MODEL_NAME: &str = "DrivingModelName";
    pub const MODEL_MANIFEST_VERSION: &str = "ModelManifestVersion";
    pub const AVAILABLE_MODELS: &str = "AvailableModels";
    pub const AVAILABLE_MODEL_NAMES: &str = "AvailableModelNames";
    pub const AVAILABLE_MODEL_SERIES: &str = "AvailableModelSeries";
    pub const AVAILABLE_MODEL_ARTIFACT_FORMATS: &str = "AvailableModelArtifactFormats";
    pub const MODEL_RELEASED_DATES: &str = "ModelReleasedDates";
    pub const MODEL_VERSIONS: &str = "ModelVersions";
    pub const COMMUNITY_FAVORITES: &str = "CommunityFavorites";
    /// The Small/Big profiles modeld loads from (`none` disables the big one).
    pub const ACTIVE_SMALL_MODEL: &str = "ActiveSmallModel";
    pub const ACTIVE_SMALL_MODEL_NAME: &str = "ActiveSmallModelName";
    pub const ACTIVE_SMALL_MODEL_VERSION: &str = "ActiveSmallModelVersion";
    pub const ACTIVE_BIG_MODEL: &str = "ActiveBigModel";
    pub const ACTIVE_BIG_MODEL_NAME: &str = "ActiveBigModelName";
    pub const ACTIVE_BIG_MODEL_VERSION: &str = "ActiveBigModelVersion";
    /// Memory params the UI writes and this manager clears once handled.
    pub const MODEL_TO_DOWNLOAD: &str = "ModelToDownload";
    pub const DOWNLOAD_ALL_MODELS: &str = "DownloadAllModels";
    pub const CANCEL_MODEL_DOWNLOAD: &str = "CancelModelDownload";
    pub const MODEL_DOWNLOAD_PROGRESS: &str = "ModelDownloadProgress";
    /// Memory param: set by the UI for one GPU-model download without an external GPU; used up
    /// by that one request.
    pub const ALLOW_GPU_WITHOUT_GPU: &str = "AllowGpuModelDownloadWithoutGpu";
    /// Persistent (openpilot's manager sets it while driving): nothing is purged, migrated or
    /// downloaded while it is set.
    pub const IS_ONROAD: &str = "IsOnroad";
    /// Persistent (set by openpilot when the connection is metered): no automatic download.
    pub const NETWORK_METERED: &str = "NetworkMetered";
    /// Persistent, this manager's: the mirror of `.accepted-release.json` (the rollback floor
    /// of signed manifests, JSON per generation), kept where a writer of the models directory
    /// cannot lower it (`trust_state`).
    pub const MODEL_MANIFEST_ACCEPTED_RELEASE: &str = "ModelManifestAcceptedRelease";
}

#[derive(Debug, Clone)]
pub struct Params {
    dir: PathBuf,
    effects: Effects,
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(Error::BadParamKey {
            key: key.to_string(),
        });
    }
    Ok(())
}

impl Params {
    /// Params stored in `dir` (the `d` directory itself). Created on first write.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self::with_effects(dir, Effects::none())
    }

    /// Params whose every write and removal is reported to `effects` (crash enumeration).
    pub fn with_effects(dir: impl Into<PathBuf>, effects: Effects) -> Self {
        Self {
            dir: dir.into(),
            effects,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    /// The value, with a trailing NUL or newline left as written; `None` when unset. A value
    /// over [`PARAM_LIMIT`](crate::bounded::PARAM_LIMIT) bytes (or a param path that is not a
    /// regular file) is an error naming the path; it is never read whole.
    pub fn get(&self, key: &str) -> Result<Option<String>> {
        check_key(key)?;
        let path = self.path(key);
        Ok(self
            .effects
            .read(&path, PARAM_LIMIT)?
            .map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// The value with surrounding whitespace trimmed; `None` when unset or empty.
    pub fn get_str(&self, key: &str) -> Result<Option<String>> {
        Ok(self
            .get(key)?
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty()))
    }

    /// openpilot bools: "1" is true.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        Ok(self
            .get_str(key)?
            .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true")))
    }

    pub fn put(&self, key: &str, value: &str) -> Result<()> {
        check_key(key)?;
        // An unreadable or oversized old value is simply replaced.
        if self.get(key).ok().flatten().as_deref() == Some(value) {
            return Ok(()); // spare the flash a rewrite
        }
        self.effects.set_param(&self.dir, key, value)
    }

    pub fn remove(&self, key: &str) -> Result<()> {
        check_key(key)?;
        self.effects.remove_param(&self.dir, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fs_err as fs;

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = Params::new(dir.path().join("d"));
        assert_eq!(p.get("Model").unwrap(), None);
        p.put("Model", "pop223").unwrap();
        assert_eq!(p.get_str("Model").unwrap().as_deref(), Some("pop223"));
        p.put("DownloadAllModels", "1").unwrap();
        assert!(p.get_bool("DownloadAllModels").unwrap());
        p.remove("Model").unwrap();
        p.remove("Model").unwrap();
        assert_eq!(p.get("Model").unwrap(), None);
        assert!(matches!(p.put("../x", "1"), Err(Error::BadParamKey { .. })));
        assert_eq!(fs::read_dir(dir.path().join("d")).unwrap().count(), 1);
    }

    #[test]
    fn an_oversized_param_is_refused_without_reading_it_and_can_be_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let p = Params::new(dir.path().join("d"));
        fs::create_dir_all(p.dir()).unwrap();
        let f = fs::File::create(p.path("Model")).unwrap();
        f.set_len(PARAM_LIMIT + 1).unwrap(); // sparse: no disk used
        let e = p.get("Model").unwrap_err();
        assert!(matches!(e, Error::CorruptState { .. }), "{e}");
        p.put("Model", "pop223").unwrap();
        assert_eq!(p.get_str("Model").unwrap().as_deref(), Some("pop223"));
    }
}
