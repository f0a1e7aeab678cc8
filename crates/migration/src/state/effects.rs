//! The one writer of device state. Every durable effect of refresh, download and gc (a param
//! written or removed, a state or cache file written or removed, an artifact purged, a model
//! installed) is made here and recorded in a typed log ([`Effect`]), in one of three modes:
//!
//! - **apply** (production, [`Effects::none`]; [`Effects::recording`] also keeps the log): the
//!   effect is made durable, then recorded;
//! - **crash checkpoint** ([`Effects::crash_after`]): as apply, and right after the n-th effect
//!   the operation stops with [`Error::Crashed`] and runs nothing else
//!   (no cleanup, no fallback), which is what kill -9 at that instant would leave;
//! - **plan** ([`Effects::plan`]): the effect is recorded and skipped; later reads of the same
//!   run through `Effects::read` see the planned bytes (a removed file reads as absent), so a
//!   dry run is the real run with its writes left out.
//!
//! The verification cache (`.verified.json`) and the models directory itself are written here
//! too (`Effects::cache_write`, `Effects::create_dir`) but are not effects of the log: they
//! change nothing modeld or the UI reads, and a crash cannot leave them inconsistent.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use chunker::atomic::{remove_if_exists, sync_dir, write_atomic};
use fs_err as fs;

use crate::error::{Error, Result};
use crate::state::bounded::read_capped;

/// One durable effect, in the order it was made. Its `Display` is the line the crash
/// enumeration names it by (`param K=V`, `write NAME`, `remove NAME`, `install ID`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Effect {
    /// A param written (persistent or memory, as the [`Params`](crate::Params) it went through).
    #[error("param {key}={value}")]
    SetParam { key: String, value: String },
    #[error("param {key} removed")]
    RemoveParam { key: String },
    /// A state or cache file of the models directory written atomically, with its bytes.
    #[error("write {name}")]
    WriteFile { name: String, bytes: Vec<u8> },
    /// A state file of the models directory removed.
    #[error("remove {name}")]
    RemoveFile { name: String },
    /// A driving artifact purged by a generation migration.
    #[error("remove {name}")]
    Purge { name: String },
    /// A stray removed by `gc` (a file, or a staging directory with what it holds).
    #[error("remove {name}")]
    Collect { name: String },
    /// A model (or its Chestnut build, by file name) downloaded, verified and in place.
    #[error("install {what}")]
    Install { what: String },
}

/// A param whose value a run changes: the new value, or `None` for a removal.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ParamChange {
    pub key: String,
    pub value: Option<String>,
}

/// What a planned run changes against the device now (see `Device::planned_changes`): state
/// files written, state files removed, params changed.
pub type Changes = (Vec<String>, Vec<String>, Vec<ParamChange>);

#[derive(Clone, Default)]
pub struct Effects(Option<Arc<Inner>>);

struct Inner {
    crash_after: Option<usize>,
    plan: bool,
    count: AtomicUsize,
    log: Mutex<Vec<Effect>>,
    /// Plan mode: what each path written or removed by this run holds now (`None`: removed).
    planned: Mutex<BTreeMap<PathBuf, Option<Vec<u8>>>>,
}

impl fmt::Debug for Effects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("Effects(none)"),
            Some(i) if i.plan => f.write_str("Effects(plan)"),
            Some(i) => write!(f, "Effects(crash_after={:?})", i.crash_after),
        }
    }
}

/// `m` locked, even when a thread panicked holding it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Effects {
    /// Apply, no log (production).
    pub fn none() -> Self {
        Self(None)
    }

    /// Apply and record every effect, crash never.
    pub fn recording() -> Self {
        Self::make(None, false)
    }

    /// Apply and record every effect, and crash right after the effect numbered `n` (0-based).
    pub fn crash_after(n: usize) -> Self {
        Self::make(Some(n), false)
    }

    /// Record every effect and skip it; reads through `Effects::read` see what was planned.
    pub fn plan() -> Self {
        Self::make(None, true)
    }

    fn make(crash_after: Option<usize>, plan: bool) -> Self {
        Self(Some(Arc::new(Inner {
            crash_after,
            plan,
            count: AtomicUsize::new(0),
            log: Mutex::new(Vec::new()),
            planned: Mutex::new(BTreeMap::new()),
        })))
    }

    /// Whether effects are recorded and skipped (a dry run).
    pub fn is_plan(&self) -> bool {
        self.0.as_ref().is_some_and(|i| i.plan)
    }

    /// The effects recorded so far, in order.
    pub fn effects(&self) -> Vec<Effect> {
        self.0
            .as_ref()
            .map_or_else(Vec::new, |i| lock(&i.log).clone())
    }

    /// The effects recorded so far, in order, as the crash enumeration names them.
    pub fn log(&self) -> Vec<String> {
        self.effects().iter().map(Effect::to_string).collect()
    }

    /// Record one effect that is now durable (or planned); `Err(Crashed)` when the test asked
    /// to crash here.
    fn done(&self, effect: Effect) -> Result<()> {
        let Some(inner) = &self.0 else {
            return Ok(());
        };
        let n = inner.count.fetch_add(1, Ordering::SeqCst);
        let what = (inner.crash_after == Some(n)).then(|| effect.to_string());
        lock(&inner.log).push(effect);
        match what {
            Some(what) => Err(Error::Crashed { effect: n, what }),
            None => Ok(()),
        }
    }

    /// In plan mode, note what `path` holds after this run's planned effect; `true` when the
    /// effect is to be skipped.
    fn planned(&self, path: &Path, now: Option<&[u8]>) -> bool {
        match &self.0 {
            Some(i) if i.plan => {
                lock(&i.planned).insert(path.to_path_buf(), now.map(<[u8]>::to_vec));
                true
            }
            _ => false,
        }
    }

    /// The bytes of `path` as this run sees them: planned bytes in plan mode, else the file
    /// (capped at `limit`, regular files only, see [`read_capped`]).
    pub(crate) fn read(&self, path: &Path, limit: u64) -> Result<Option<Vec<u8>>> {
        match self.planned_bytes(path) {
            Some(planned) => Ok(planned),
            None => read_capped(path, limit),
        }
    }

    /// Whether `path` is there as this run sees it.
    pub(crate) fn exists(&self, path: &Path) -> bool {
        match self.planned_bytes(path) {
            Some(planned) => planned.is_some(),
            None => fs::symlink_metadata(path).is_ok(),
        }
    }

    /// In plan mode, what this run left at `path` if it planned an effect there.
    fn planned_bytes(&self, path: &Path) -> Option<Option<Vec<u8>>> {
        let i = self.0.as_ref().filter(|i| i.plan)?;
        lock(&i.planned).get(path).cloned()
    }

    /// In plan mode, whether a file of `dir` whose name starts with `prefix` (an artifact and
    /// its other forms) was removed by this run.
    pub(crate) fn planned_removal(&self, dir: &Path, prefix: &str) -> bool {
        self.0.as_ref().is_some_and(|i| {
            i.plan
                && lock(&i.planned).iter().any(|(p, now)| {
                    now.is_none()
                        && p.parent() == Some(dir)
                        && p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with(prefix))
                })
        })
    }

    /// Write param `key` of `dir` (the caller has checked it changes).
    pub(crate) fn set_param(&self, dir: &Path, key: &str, value: &str) -> Result<()> {
        let path = dir.join(key);
        if !self.planned(&path, Some(value.as_bytes())) {
            fs::create_dir_all(dir)?;
            write_atomic(&path, value.as_bytes())?;
        }
        self.done(Effect::SetParam {
            key: key.to_string(),
            value: value.to_string(),
        })
    }

    /// Remove param `key` of `dir`; nothing when it is not set.
    pub(crate) fn remove_param(&self, dir: &Path, key: &str) -> Result<()> {
        self.remove(dir, key, |key| Effect::RemoveParam { key })
    }

    /// Remove param `key` of `dir` whatever it is (a directory with what it holds; a symlink,
    /// not its target); nothing when it is not there.
    pub(crate) fn discard_param(&self, dir: &Path, key: &str) -> Result<()> {
        let path = dir.join(key);
        let is_dir = fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        if !is_dir {
            return self.remove_param(dir, key);
        }
        if !self.planned(&path, None) {
            // std's remove_dir_all never follows a symlink inside.
            fs::remove_dir_all(&path)?;
            sync_dir(dir)?;
        }
        self.done(Effect::RemoveParam {
            key: key.to_string(),
        })
    }

    /// Write `name` in the models directory `dir` atomically (the caller has checked it
    /// changes).
    pub(crate) fn write_file(&self, dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
        let path = dir.join(name);
        if !self.planned(&path, Some(bytes)) {
            write_atomic(&path, bytes)?;
        }
        self.done(Effect::WriteFile {
            name: name.to_string(),
            bytes: bytes.to_vec(),
        })
    }

    /// Remove state file `name` of `dir`; nothing when it is not there.
    pub(crate) fn remove_file(&self, dir: &Path, name: &str) -> Result<()> {
        self.remove(dir, name, |name| Effect::RemoveFile { name })
    }

    /// Purge artifact file `name` of `dir` (a migration); nothing when it is not there.
    pub(crate) fn purge(&self, dir: &Path, name: &str) -> Result<()> {
        self.remove(dir, name, |name| Effect::Purge { name })
    }

    /// Remove stray `name` of `dir` (`gc`): a file, or a directory with what it holds.
    pub(crate) fn collect(&self, dir: &Path, name: &str) -> Result<()> {
        let path = dir.join(name);
        if !self.planned(&path, None) {
            if path.is_dir() {
                fs::remove_dir_all(&path)?;
            } else {
                remove_if_exists(&path)?;
            }
        }
        self.done(Effect::Collect {
            name: name.to_string(),
        })
    }

    /// Remove `dir/name` and record `effect` of its name when it was there (or, planned,
    /// would be).
    fn remove(&self, dir: &Path, name: &str, effect: fn(String) -> Effect) -> Result<()> {
        let path = dir.join(name);
        let removed = if self.is_plan() {
            let there = self.exists(&path);
            self.planned(&path, None);
            there
        } else {
            let removed = remove_if_exists(&path)?;
            if removed {
                sync_dir(dir)?;
            }
            removed
        };
        match removed {
            true => self.done(effect(name.to_string())),
            false => Ok(()),
        }
    }

    /// A model (or a Chestnut build) is installed: the downloader put it in place and it
    /// verified. In plan mode the caller skipped the download.
    pub(crate) fn installed(&self, what: &str) -> Result<()> {
        self.done(Effect::Install {
            what: what.to_string(),
        })
    }

    /// Write `path` without making it an effect of the log (skipped in plan mode): the
    /// verification cache, and a running job's progress text (see `layout::DeviceFiles`).
    pub(crate) fn cache_write(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        if !self.planned(path, Some(bytes)) {
            write_atomic(path, bytes)?;
        }
        Ok(())
    }

    /// Remove the verification cache `path` (not an effect of the log; skipped in plan mode).
    pub(crate) fn cache_remove(&self, path: &Path) {
        if !self.planned(path, None) {
            let _ = fs::remove_file(path);
        }
    }

    /// Create directory `path` and its parents (not an effect; skipped in plan mode).
    pub(crate) fn create_dir(&self, path: &Path) -> Result<()> {
        if !self.is_plan() {
            fs::create_dir_all(path)?;
        }
        Ok(())
    }

    /// Flush the removals of a `gc` (skipped in plan mode).
    pub(crate) fn sync(&self, dir: &Path) -> Result<()> {
        if !self.is_plan() {
            sync_dir(dir)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plan mode writes nothing, logs what apply logs, and its reads see the planned bytes.
    #[test]
    fn a_plan_records_and_skips_and_later_reads_see_it() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("old"), b"x").unwrap();
        let run = |e: &Effects| {
            e.set_param(d, "Model", "pop223").unwrap();
            e.write_file(d, ".choice.json", b"{}").unwrap();
            e.remove_file(d, "old").unwrap();
            e.remove_file(d, "absent").unwrap();
            e.installed("pop223").unwrap();
        };
        let plan = Effects::plan();
        run(&plan);
        assert!(!d.join("Model").exists() && d.join("old").exists());
        assert_eq!(
            plan.read(&d.join("Model"), 64).unwrap(),
            Some(b"pop223".to_vec())
        );
        assert_eq!(plan.read(&d.join("old"), 64).unwrap(), None);
        assert!(!plan.exists(&d.join("old")));
        let apply = Effects::recording();
        run(&apply);
        assert_eq!(plan.effects(), apply.effects());
        assert_eq!(
            apply.log(),
            [
                "param Model=pop223",
                "write .choice.json",
                "remove old",
                "install pop223"
            ]
        );
        assert_eq!(std::fs::read(d.join("Model")).unwrap(), b"pop223");
        assert!(!d.join("old").exists());
    }

    #[test]
    fn a_checkpoint_crashes_right_after_its_effect() {
        let dir = tempfile::tempdir().unwrap();
        let e = Effects::crash_after(1);
        e.set_param(dir.path(), "A", "1").unwrap();
        let err = e.set_param(dir.path(), "B", "2").unwrap_err();
        assert!(
            matches!(&err, Error::Crashed { effect: 1, what } if what == "param B=2"),
            "{err:?}"
        );
        assert!(
            dir.path().join("B").exists(),
            "the effect is durable before the crash"
        );
    }
}
