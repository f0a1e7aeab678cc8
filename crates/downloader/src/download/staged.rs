//! The staging file of one download and its completion record (what a resume continues from),
//! and the install: the one rename that makes a verified artifact visible, then the removal of
//! the artifact's other forms.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use chunker::atomic::{remove_if_exists, sync_dir};
use fs_err as fs;
use fs_err::File;
use manifest::FileName;

use super::DigestSource;
use super::plan::{Partial, Piece, Plan, add_range, other_forms};
use crate::error::{Error, Result};
use crate::space;
use crate::staging::{MAX_STATE_BYTES, StagingDir, staging_names};

/// The staging file plus the record of which pieces (and, when each chunk has its own digest,
/// which ranges inside unfinished pieces) are on disk and fsynced, both in the verified staging
/// directory (see [`crate::staging`]).
pub(crate) struct Staging {
    dir: StagingDir,
    data_name: String,
    state_name: String,
    /// Open on `data_name`; its errors name that path (fs-err).
    pub(crate) file: File,
    record: Mutex<(BTreeSet<u32>, Partial)>,
    header: String,
    /// Whether ranges inside a piece are recorded: only when each chunk's digest is known, so
    /// bytes resumed into a chunk are checked before the chunk counts as done.
    keep_partial: bool,
}

/// How often, in bytes of one segment, its progress is recorded (fsync + record) while it
/// downloads, so even a crash loses at most this much of a chunk.
pub(crate) const RANGE_RECORD_STEP: u64 = 8 * 1024 * 1024;

impl Staging {
    pub(crate) fn open(
        models_dir: &Path,
        local_name: &FileName,
        plan: &Plan,
        pieces: &[Piece],
        margin: u64,
    ) -> Result<Self> {
        let dir = StagingDir::open(models_dir)?;
        let (data_name, state_name) = staging_names(&plan.sha256.to_hex(), local_name.as_str());
        dir.clean(&[&data_name, &state_name], local_name.as_str());
        let header = format!(
            "{} {} {}\n",
            plan.sha256,
            plan.size,
            pieces.first().map(|p| p.len).unwrap_or(0)
        );
        let keep_partial = plan.chunk_sha256.is_some();
        let existing = dir.open_existing(&data_name).ok();
        let resumed = existing.as_ref().and_then(|f| {
            Self::read_state(
                &dir,
                f,
                &state_name,
                &header,
                plan.size,
                pieces,
                keep_partial,
            )
        });
        let file = match (resumed.is_some(), existing) {
            (true, Some(f)) => f,
            (_, existing) => {
                // A staging file nothing can resume holds this artifact's own preallocated
                // blocks: removed before the space check, so they count as free.
                if existing.is_some() {
                    drop(existing);
                    dir.remove(&data_name)?;
                    dir.remove(&state_name)?;
                }
                let needed = plan.size.saturating_add(margin);
                let no_space = |available| Error::InsufficientSpace {
                    path: models_dir.to_path_buf(),
                    needed,
                    available,
                };
                let available = space::available_bytes(models_dir)?;
                if available < needed {
                    return Err(no_space(available));
                }
                dir.remove(&state_name)?;
                let f = dir.create_new(&data_name)?;
                if let Err(e) = space::reserve(&f, plan.size) {
                    drop(f);
                    let _ = dir.remove(&data_name);
                    if e.kind() == std::io::ErrorKind::StorageFull {
                        return Err(no_space(space::available_bytes(models_dir).unwrap_or(0)));
                    }
                    return Err(e.into());
                }
                f
            }
        };
        Ok(Self {
            dir,
            data_name,
            state_name,
            file,
            record: Mutex::new(resumed.unwrap_or_default()),
            header,
            keep_partial,
        })
    }

    /// Pieces (and ranges) recorded by an earlier run, if its record matches this artifact.
    /// Lines: `<index>` for a complete piece, `<index> <start> <end>` for a range inside one.
    fn read_state(
        dir: &StagingDir,
        data: &File,
        state_name: &str,
        header: &str,
        size: u64,
        pieces: &[Piece],
        keep_partial: bool,
    ) -> Option<(BTreeSet<u32>, Partial)> {
        let len = data.metadata().ok()?.len();
        if len != size {
            return None;
        }
        let bytes = dir.read_small(state_name, MAX_STATE_BYTES).ok()?;
        let text = String::from_utf8(bytes).ok()?;
        let rest = text.strip_prefix(header)?;
        let mut done = BTreeSet::new();
        let mut partial = Partial::new();
        for line in rest.lines() {
            let mut words = line.split_ascii_whitespace();
            let i: u32 = words.next()?.parse().ok()?;
            let piece = pieces.iter().find(|p| p.index == i)?;
            match (words.next(), words.next(), words.next()) {
                (None, None, None) => {
                    done.insert(i);
                }
                (Some(a), Some(b), None) if keep_partial => {
                    let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
                    if a >= b || b > piece.len {
                        return None;
                    }
                    add_range(partial.entry(i).or_default(), (a, b));
                }
                _ => return None,
            }
        }
        for i in &done {
            partial.remove(i);
        }
        Some((done, partial))
    }

    fn write_record(&self, record: &(BTreeSet<u32>, Partial)) -> Result<()> {
        let mut text = self.header.clone();
        for i in record.0.iter() {
            text.push_str(&format!("{i}\n"));
        }
        for (i, ranges) in &record.1 {
            for (a, b) in ranges {
                text.push_str(&format!("{i} {a} {b}\n"));
            }
        }
        Ok(self.dir.write_atomic(&self.state_name, text.as_bytes())?)
    }

    /// fsync the data, then record `index` as complete (atomically), so a restart skips it.
    pub(crate) fn mark_done(&self, index: u32) -> Result<()> {
        self.file.sync_data()?;
        let mut record = self.record.lock().unwrap();
        record.0.insert(index);
        record.1.remove(&index);
        self.write_record(&record)
    }

    /// fsync the data, then record bytes `[a, b)` of piece `index` as on disk, so a restart
    /// continues inside the piece. A no-op unless each chunk has its own digest.
    pub(crate) fn mark_range(&self, index: u32, a: u64, b: u64) -> Result<()> {
        if !self.keep_partial || a >= b {
            return Ok(());
        }
        self.file.sync_data()?;
        let mut record = self.record.lock().unwrap();
        if record.0.contains(&index) {
            return Ok(());
        }
        add_range(record.1.entry(index).or_default(), (a, b));
        self.write_record(&record)
    }

    /// Forget every range of piece `index` (its bytes failed the chunk digest).
    pub(crate) fn forget(&self, index: u32) -> Result<()> {
        let mut record = self.record.lock().unwrap();
        if record.1.remove(&index).is_some() {
            self.write_record(&record)?;
        }
        Ok(())
    }

    /// What the completion record says is on disk: complete pieces, ranges inside the others.
    pub(crate) fn recorded(&self) -> (BTreeSet<u32>, Partial) {
        self.record.lock().unwrap().clone()
    }

    pub(crate) fn discard(self) {
        let _ = self.dir.remove(&self.state_name);
        let _ = self.dir.remove(&self.data_name);
    }
}

/// The mode of an installed artifact: that of every other file of the models directory
/// (openpilot's and upstream's writes, under the usual umask).
pub const INSTALLED_MODE: u32 = 0o644;

/// Rename the verified staging file over the final name (atomic for modeld, see the `download`
/// module docs) and remove the artifact's other forms. The staging name must still be the file
/// we verified, so nothing swapped in is installed; a digest learned from the origin's sidecar is
/// written beside the installed file for `status` and `verify`.
pub(crate) fn install(
    staging: &Staging,
    dir: &Path,
    local: &FileName,
    plan: &Plan,
) -> Result<PathBuf> {
    staging.file.sync_all()?;
    let dest = dir.join(local.as_str());
    let ours = staging
        .dir
        .still_is(&staging.data_name, &staging.file)
        .unwrap_or(false);
    if !ours {
        return Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "{}: the verified staging file was removed or replaced before install (another process cleaning the models directory?); nothing was installed, the next try downloads it again",
                staging.file.path().display()
            ),
        )));
    }
    // The staging file was made 0600 (the staging directory is private); installed, it gets
    // the mode every other file of the models directory has.
    {
        use std::os::unix::fs::PermissionsExt;
        staging
            .file
            .set_permissions(std::fs::Permissions::from_mode(INSTALLED_MODE))?;
    }
    staging.dir.rename_out(&staging.data_name, &dest)?;
    sync_dir(dir)?;
    remove_other_forms(dir, local.as_str())?;
    if plan.digest_source == DigestSource::Sidecar {
        let sidecar = dir.join(chunker::sidecar_name(local.as_str()));
        chunker::atomic::write_atomic(
            &sidecar,
            chunker::format_sidecar(&plan.sha256, local.as_str()).as_bytes(),
        )?;
    }
    staging.dir.remove(&staging.state_name)?;
    staging.dir.sync()?;
    sync_dir(dir)?;
    Ok(dest)
}

/// Remove the chunk-set and legacy forms of `name` in `dir` (`.chunkmanifest` first, so no reader
/// ever sees a manifest without its chunks), leaving the plain file. Which names those are is
/// [`other_forms`].
pub fn remove_other_forms(dir: &Path, name: &str) -> Result<()> {
    // The manifest goes before the directory is even listed.
    remove_if_exists(dir.join(chunker::chunk_manifest_name(name)))?;
    let listed: Vec<String> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    for other in other_forms(listed.iter().map(String::as_str), name) {
        remove_if_exists(dir.join(other))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file error says which operation failed on which path (fs-err), is the crate's one
    /// I/O variant, and keeps its kind; it is local, so no other origin is tried.
    #[test]
    fn file_errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-models-dir");
        let e = remove_other_forms(&missing, "a_driving_tinygrad.pkl").unwrap_err();
        let Error::Io(io) = &e else {
            panic!("not an I/O error: {e:?}")
        };
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        assert!(
            e.to_string().starts_with(&format!(
                "failed to read directory `{}`: ",
                missing.display()
            )),
            "{e}"
        );
        assert!(e.is_local());
    }
}
