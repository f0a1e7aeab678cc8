//! Durability checkpoints. Every effect on disk that this crate's writers make (a directory
//! created, a temporary written, an fsync of a file or a directory, a rename, a removal), and
//! each external command a caller reports as having run in a directory (the `github:` store's
//! `git`), is announced here with its path. A crash-enumeration test registers an observer for
//! a directory ([`observe`]) and, at each announcement, computes what a power loss at that
//! instant would leave under a strict-POSIX model (an entry survives only once its directory is
//! fsynced, a file's bytes only once the file is); see `test_support::strict_fs`.
//!
//! With no observer registered, an announcement is one atomic load. The observer runs in the
//! announcing thread, before the writer goes on, so what it sees on disk is exactly the state
//! after the effect.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One effect on disk, just made.
#[derive(Debug, Clone, Copy)]
pub enum Effect<'a> {
    /// A directory was created (not yet durable: its parent is not synced).
    CreatedDir(&'a Path),
    /// A file's bytes were written and not yet fsynced.
    Wrote(&'a Path),
    /// A file was fsynced: its bytes are durable (its name is not, until its directory is).
    SyncedFile(&'a Path),
    /// A rename; durable once the directory holding `to` is fsynced.
    Renamed {
        /// The name the file had.
        from: &'a Path,
        /// The name it has now.
        to: &'a Path,
    },
    /// A directory was fsynced: its entries are durable.
    SyncedDir(&'a Path),
    /// A file was removed.
    Removed(&'a Path),
    /// An external program ran to its end in `dir` with `args` (what it wrote is known only
    /// from what it was told, e.g. git's `core.fsync`).
    Ran {
        /// The directory it ran in.
        dir: &'a Path,
        /// Its arguments (for git: the `-c` settings first), the program's name excluded.
        args: &'a [OsString],
    },
}

impl Effect<'_> {
    /// The path the effect is about (for a rename, its destination).
    pub fn path(&self) -> &Path {
        match self {
            Effect::CreatedDir(p)
            | Effect::Wrote(p)
            | Effect::SyncedFile(p)
            | Effect::SyncedDir(p)
            | Effect::Removed(p) => p,
            Effect::Renamed { to, .. } => to,
            Effect::Ran { dir, .. } => dir,
        }
    }
}

type Observer = Arc<dyn Fn(&Effect<'_>) + Send + Sync>;

static ACTIVE: AtomicUsize = AtomicUsize::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(0);
static OBSERVERS: Mutex<Vec<(u64, PathBuf, Observer)>> = Mutex::new(Vec::new());

/// An observer registered by [`observe`]; dropping it unregisters it.
#[must_use = "the observer is unregistered when this is dropped"]
pub struct Observation {
    id: u64,
}

impl Drop for Observation {
    fn drop(&mut self) {
        let mut all = OBSERVERS.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|(id, _, _)| *id != self.id);
        ACTIVE.store(all.len(), Ordering::SeqCst);
    }
}

/// Call `f` with every effect whose path is under `root` (an absolute path, as the writers are
/// given), until the returned [`Observation`] is dropped. Effects elsewhere (another test's
/// directory) are not shown.
pub fn observe(
    root: impl Into<PathBuf>,
    f: impl Fn(&Effect<'_>) + Send + Sync + 'static,
) -> Observation {
    let id = NEXT_ID.fetch_add(1, Ordering::SeqCst);
    let mut all = OBSERVERS.lock().unwrap_or_else(|p| p.into_inner());
    all.push((id, root.into(), Arc::new(f)));
    ACTIVE.store(all.len(), Ordering::SeqCst);
    Observation { id }
}

/// Announce an effect just made.
pub fn note(effect: Effect<'_>) {
    if ACTIVE.load(Ordering::SeqCst) == 0 {
        return;
    }
    let path = effect.path();
    let matching: Vec<Observer> = OBSERVERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(_, root, _)| path.starts_with(root))
        .map(|(_, _, f)| Arc::clone(f))
        .collect();
    for f in matching {
        f(&effect);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observer_sees_only_effects_under_its_root_and_only_while_registered() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        let obs = observe("/x/mine", move |e| {
            s.lock().unwrap().push(e.path().to_path_buf())
        });
        note(Effect::SyncedDir(Path::new("/x/mine/a")));
        note(Effect::SyncedDir(Path::new("/x/other/a")));
        note(Effect::Renamed {
            from: Path::new("/x/other/t"),
            to: Path::new("/x/mine/b"),
        });
        drop(obs);
        note(Effect::SyncedDir(Path::new("/x/mine/c")));
        assert_eq!(
            *seen.lock().unwrap(),
            vec![PathBuf::from("/x/mine/a"), PathBuf::from("/x/mine/b")]
        );
    }
}
