//! Fetched outputs land in a private directory and are moved into place only once checked.

use std::path::{Path, PathBuf};

use fs_err::{self as fs, File};

use crate::error::Result;

/// A private directory inside `out` that fetched files land in before they are checked, so a
/// bad fetch never replaces a good artifact.
pub(crate) struct FetchDir {
    path: PathBuf,
}

impl FetchDir {
    /// Empty (or create) the fetch directory at `path`, a plan's fetch destination.
    pub(crate) fn at(path: PathBuf) -> Result<FetchDir> {
        if path.exists() {
            fs::remove_dir_all(&path)?;
        }
        fs::create_dir_all(&path)?;
        Ok(FetchDir { path })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Replace any earlier set of `name` in `out` with the checked files, `.chunkmanifest`
    /// last (it is what makes a set complete to readers).
    pub(crate) fn install(self, out: &Path, name: &str, files: &[String]) -> Result<()> {
        // Retract an older chunk set first: without its `.chunkmanifest` it reads as "not
        // present", so a crash while the rest goes never leaves a manifest over missing chunks.
        let old_manifest = out.join(chunker::chunk_manifest_name(name));
        if chunker::atomic::remove_if_exists(&old_manifest)? {
            chunker::atomic::sync_dir(out)?;
        }
        for path in earlier_set(out, name)? {
            chunker::atomic::remove_if_exists(&path)?;
        }
        self.install_files(out, files)
    }

    /// Move `files` into `out` in the given order. The last one (the `.chunkmanifest` of a chunk
    /// set) is renamed only after the renames before it are durable, so that after a power cut
    /// a present chunk manifest always means its chunks are there too.
    pub(crate) fn install_files(self, out: &Path, files: &[String]) -> Result<()> {
        for (i, f) in files.iter().enumerate() {
            let src = self.path.join(f);
            File::open(&src)?.sync_all()?;
            if i + 1 == files.len() && i > 0 {
                chunker::atomic::sync_dir(out)?;
            }
            fs::rename(&src, out.join(f))?;
        }
        chunker::atomic::sync_dir(out)?;
        Ok(())
    }
}

impl Drop for FetchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// The files of an earlier set of `name` in `out` (the name itself or `name.<anything>`), which
/// installing a new one removes.
pub(crate) fn earlier_set(out: &Path, name: &str) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(out)? {
        let entry = entry?;
        let f = entry.file_name().to_string_lossy().into_owned();
        if (f == name || f.starts_with(&format!("{name}."))) && entry.path().is_file() {
            found.push(entry.path());
        }
    }
    found.sort();
    Ok(found)
}
