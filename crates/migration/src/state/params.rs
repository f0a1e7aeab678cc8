//! openpilot-style params: one file per key in a directory (`/data/params/d`, or the memory
//! params `/dev/shm/params/d`), each written atomically and durably (temp file in the same
//! directory, fsync, rename, fsync the directory), so a power cut leaves the old value or the
//! new one, never a torn one.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::state::bounded::PARAM_LIMIT;
use crate::state::effects::Effects;
use crate::state::effects::lock;

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
    /// The user's choices besides the selection (persistent; comma-joined ids, a sort mode, a
    /// flag): what a move to a per-generation layout carries into its preferences.
    pub const USER_FAVORITES: &str = "UserFavorites";
    pub const BLACKLISTED_MODELS: &str = "BlacklistedModels";
    pub const MODEL_SORT_MODE: &str = "ModelSortMode";
    pub const MODEL_RANDOMIZER: &str = "ModelRandomizer";
}

#[derive(Debug, Clone)]
pub struct Params {
    dir: PathBuf,
    effects: Effects,
    warnings: Warnings,
}

/// Warnings about params and state files read as absent (oversized, not a regular file,
/// corrupt), shared by every clone of the [`Params`] (and the [`Device`](crate::Device)) they
/// came from; each text once. The binary prints them on stderr, the daemon logs them.
#[derive(Debug, Clone, Default)]
pub struct Warnings(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Warnings {
    /// Note `text` (once).
    pub fn add(&self, text: String) {
        let mut w = lock(&self.0);
        if !w.contains(&text) {
            w.push(text);
        }
    }

    /// The warnings noted since the last call, oldest first.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.0))
    }
}

/// A value as upstream reads it: trailing NULs and whitespace stripped (openpilot's C++ writers
/// may leave a NUL, editors a newline), leading whitespace too. Pure.
pub fn upstream_value(raw: &str) -> &str {
    raw.trim_end_matches(|c: char| c == '\0' || c.is_whitespace())
        .trim_start()
}

/// Why a param could not be read, without the state-file advice of [`Error::CorruptState`]
/// (a param is replaced by its next write, or removed by the daemon): `<path>: <why>`.
pub fn unreadable(e: &Error) -> String {
    match e {
        Error::CorruptState { path, message } => format!("{}: {message}", path.display()),
        other => other.to_string(),
    }
}

/// How one param read: unset, a value, or unreadable (the error names the path and why).
#[derive(Debug)]
pub enum ParamRead {
    Absent,
    Value(String),
    Unreadable(Error),
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
            warnings: Warnings::default(),
        }
    }

    /// The warnings of reads that fell back to "absent" ([`Params::get_str`]).
    pub fn warnings(&self) -> &Warnings {
        &self.warnings
    }

    /// These params noting their warnings in `warnings` (shared with the device's other
    /// params).
    pub(crate) fn sharing_warnings(mut self, warnings: &Warnings) -> Self {
        self.warnings = warnings.clone();
        self
    }

    /// The value as upstream reads it ([`upstream_value`]), or why it cannot be read; never an
    /// error. For a reader that must act on a bad param (the daemon removes it).
    pub fn read(&self, key: &str) -> ParamRead {
        match self.get(key) {
            Ok(None) => ParamRead::Absent,
            Ok(Some(v)) => match upstream_value(&v) {
                "" => ParamRead::Absent,
                v => ParamRead::Value(v.to_string()),
            },
            Err(e) => ParamRead::Unreadable(e),
        }
    }

    #[cfg(test)]
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    /// The value, with a trailing NUL or newline left as written; `None` when unset. A value
    /// over [`PARAM_LIMIT`] bytes (or a param path that is not a regular file) is an error naming
    /// the path; it is never read whole.
    pub fn get(&self, key: &str) -> Result<Option<String>> {
        check_key(key)?;
        let path = self.path(key);
        Ok(self
            .effects
            .read(&path, PARAM_LIMIT)?
            .map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// The value as upstream reads it ([`upstream_value`]); `None` when unset or empty. A value
    /// that cannot be read (over the cap, not a regular file: see [`Params::get`]) is read as
    /// absent too, and a warning naming it is noted ([`Params::warnings`]): one bad param never
    /// wedges a command. Only an invalid key is an error. The rollback floor is read strictly,
    /// with [`Params::get`] (`trust_state`).
    pub fn get_str(&self, key: &str) -> Result<Option<String>> {
        check_key(key)?;
        Ok(match self.read(key) {
            ParamRead::Absent => None,
            ParamRead::Value(v) => Some(v),
            ParamRead::Unreadable(e) => {
                self.warnings
                    .add(format!("param {key} read as unset: {}", unreadable(&e)));
                None
            }
        })
    }

    /// openpilot bools: "1" is true. Strict: an unreadable value is an error (`IsOnroad` must
    /// not read as "offroad" because it cannot be read).
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        Ok(self.get(key)?.is_some_and(|v| {
            matches!(upstream_value(&v), "1") || upstream_value(&v).eq_ignore_ascii_case("true")
        }))
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

    /// When `key` was last written (`None`: unset, or no time to be had).
    pub fn modified(&self, key: &str) -> Option<std::time::SystemTime> {
        check_key(key).ok()?;
        std::fs::symlink_metadata(self.path(key))
            .and_then(|m| m.modified())
            .ok()
    }

    /// Remove whatever is at `key`'s path: a value, a FIFO, a symlink (never what it points
    /// to), or a directory with what it holds (a bad request the daemon drops).
    pub fn discard(&self, key: &str) -> Result<()> {
        check_key(key)?;
        self.effects.discard_param(&self.dir, key)
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

    /// Values read as upstream reads them: trailing NULs and whitespace go, inner ones stay.
    #[test]
    fn values_are_read_as_upstream_reads_them() {
        for (raw, want) in [
            ("pop223", "pop223"),
            ("pop223\0", "pop223"),
            ("pop223\n", "pop223"),
            ("pop223\0\n\0", "pop223"),
            (" pop223 \r\n", "pop223"),
            ("a\0b", "a\0b"),
            ("\0", ""),
            ("", ""),
        ] {
            assert_eq!(upstream_value(raw), want, "{raw:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let p = Params::new(dir.path().join("d"));
        fs::create_dir_all(p.dir()).unwrap();
        fs::write(p.path("Model"), b"pop223\0").unwrap();
        assert_eq!(p.get_str("Model").unwrap().as_deref(), Some("pop223"));
        fs::write(p.path("IsOnroad"), b"1\0").unwrap();
        assert!(p.get_bool("IsOnroad").unwrap());
        fs::write(p.path("Model"), b"\0\n").unwrap();
        assert_eq!(p.get_str("Model").unwrap(), None);
        assert!(p.warnings().take().is_empty());
    }

    /// A value that cannot be read (over the cap, a FIFO, a directory, a symlink to a device)
    /// is read as unset by `get_str` with one warning naming it; `get` and `get_bool` stay
    /// strict; `discard` removes each kind, never a symlink's target.
    #[test]
    fn an_unreadable_value_reads_as_unset_with_a_warning_and_can_be_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let p = Params::new(dir.path().join("d"));
        fs::create_dir_all(p.dir()).unwrap();
        let target = dir.path().join("target");
        fs::write(&target, b"1").unwrap();
        let plant = |kind: &str| {
            let path = p.path("Model");
            match kind {
                "oversized" => fs::File::create(&path)
                    .unwrap()
                    .set_len(PARAM_LIMIT + 1)
                    .unwrap(),
                "fifo" => {
                    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
                    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
                }
                "directory" => {
                    fs::create_dir_all(path.join("inner")).unwrap();
                    fs::write(path.join("inner/x"), b"x").unwrap();
                }
                "symlink to /dev/zero" => std::os::unix::fs::symlink("/dev/zero", &path).unwrap(),
                "symlink to a directory" => std::os::unix::fs::symlink(dir.path(), &path).unwrap(),
                _ => unreachable!(),
            }
        };
        for kind in [
            "oversized",
            "fifo",
            "directory",
            "symlink to /dev/zero",
            "symlink to a directory",
        ] {
            plant(kind);
            assert!(p.get("Model").is_err(), "{kind}");
            assert!(p.get_bool("Model").is_err(), "{kind}");
            assert!(
                matches!(p.read("Model"), ParamRead::Unreadable(_)),
                "{kind}"
            );
            assert_eq!(p.get_str("Model").unwrap(), None, "{kind}");
            assert_eq!(p.get_str("Model").unwrap(), None, "{kind}");
            let w = p.warnings().take();
            assert_eq!(w.len(), 1, "{kind}: one warning however often read: {w:?}");
            assert!(
                w[0].contains("param Model read as unset") && w[0].contains("/d/Model"),
                "{kind}: {w:?}"
            );
            p.discard("Model").unwrap();
            assert!(fs::symlink_metadata(p.path("Model")).is_err(), "{kind}");
            assert_eq!(
                fs::read(&target).unwrap(),
                b"1",
                "{kind}: the target is untouched"
            );
            assert!(dir.path().join("d").is_dir());
        }
        p.discard("Model").unwrap(); // nothing there: fine
    }
}
