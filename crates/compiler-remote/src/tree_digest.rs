//! A deterministic digest of a directory tree, and of exactly what `sync` sends.
//!
//! The digest is SHA-256 over one stream of entries, each part in [`crate::plan::PinLocation::sync_parts`] order,
//! the entries of a directory sorted by file name (bytes), depth first. An entry is its kind
//! (file, directory, symlink, other), its permission bits (rsync `-a` keeps them), its path
//! relative to the part's root, and for a file its size and the SHA-256 of its content, for a
//! symlink its target (`-a` sends links as links). Every variable field is length-prefixed, so
//! no two trees share a stream. Modification times are not part of it: a `touch` changes
//! nothing the compiler sees. Entries whose name is excluded (`.git`, `__pycache__` in
//! `tinygrad_repo/`, as rsync's `--exclude=NAME` matches a name at any depth) are skipped with
//! everything under them.
//!
//! Files are streamed one at a time: memory does not grow with the tree.

use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use chunker::{Hasher, Sha256Digest};
use fs_err as fs;

use crate::error::Result;
use crate::plan::SyncPart;

pub use crate::unsynced::TreeDigest;

/// The names a part's rsync options exclude (`--exclude=NAME`).
pub fn excluded_names(part: &SyncPart) -> Vec<&'static str> {
    part.options
        .iter()
        .filter_map(|o| o.strip_prefix("--exclude="))
        .collect()
}

/// The digest of exactly what `sync` sends from `openpilot`: its four parts, with their
/// exclusions. A part that is missing is recorded as missing (sync itself refuses that tree).
pub fn sync_digest(openpilot: &Path) -> Result<TreeDigest> {
    let mut d = Digester::default();
    for part in crate::pin_location(openpilot).sync_parts() {
        d.part(&openpilot.join(part.rel), part.rel, &excluded_names(&part))?;
    }
    Ok(d.finish())
}

/// The digest of the tree at `dir`, skipping every entry named in `exclude` at any depth.
pub fn dir_digest(dir: &Path, exclude: &[&str]) -> Result<TreeDigest> {
    let mut d = Digester::default();
    d.part(dir, "", exclude)?;
    Ok(d.finish())
}

#[derive(Default)]
struct Digester {
    hasher: Hasher,
    files: u64,
}

impl Digester {
    fn field(&mut self, bytes: &[u8]) {
        self.hasher.update(&(bytes.len() as u64).to_le_bytes());
        self.hasher.update(bytes);
    }

    /// One part: its name, then its entries (or a "missing" mark).
    fn part(&mut self, root: &Path, name: &str, exclude: &[&str]) -> Result<()> {
        self.field(b"part");
        self.field(name.as_bytes());
        match fs::symlink_metadata(root) {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.field(b"missing");
                Ok(())
            }
            Err(e) => Err(e.into()),
            Ok(meta) => self.entry(root, b"", &meta, exclude),
        }
    }

    fn entry(
        &mut self,
        path: &Path,
        rel: &[u8],
        meta: &std::fs::Metadata,
        exclude: &[&str],
    ) -> Result<()> {
        let ty = meta.file_type();
        let mode = (meta.permissions().mode() & 0o7777).to_le_bytes();
        if ty.is_dir() {
            self.field(b"d");
            self.field(&mode);
            self.field(rel);
            let mut children: Vec<_> = fs::read_dir(path)?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<std::io::Result<_>>()?;
            children.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            for name in children {
                if exclude.iter().any(|x| name.as_bytes() == x.as_bytes()) {
                    continue;
                }
                let child = path.join(&name);
                let meta = fs::symlink_metadata(&child)?;
                let mut child_rel = rel.to_vec();
                if !child_rel.is_empty() {
                    child_rel.push(b'/');
                }
                child_rel.extend_from_slice(name.as_bytes());
                self.entry(&child, &child_rel, &meta, exclude)?;
            }
            return Ok(());
        }
        self.files += 1;
        if ty.is_file() {
            self.field(b"f");
            self.field(&mode);
            self.field(rel);
            let (sha, size) = Sha256Digest::of_reader(fs::File::open(path)?)?;
            self.field(&size.to_le_bytes());
            self.field(sha.as_bytes());
        } else if ty.is_symlink() {
            self.field(b"l");
            self.field(rel);
            let target = fs::read_link(path)?;
            self.field(target.as_os_str().as_bytes());
        } else {
            // A device, fifo or socket: its kind and mode (rsync -a sends specials as such).
            self.field(b"o");
            self.field(&mode);
            self.field(rel);
            self.field(&(meta.mode() & 0o170000).to_le_bytes());
        }
        Ok(())
    }

    fn finish(self) -> TreeDigest {
        TreeDigest {
            sha256: self.hasher.finish(),
            files: self.files,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::Permissions;

    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let op = t.path();
        let w = |rel: &str, body: &[u8]| {
            let p = op.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        };
        w("tinygrad_repo/TINYGRAD_COMMIT", b"abc\n");
        w("tinygrad_repo/extra/README", b"extra");
        w("tinygrad_repo/tinygrad/tensor.py", b"tensor");
        w("tinygrad_repo/.git/HEAD", b"ref: main");
        w("tinygrad_repo/tinygrad/__pycache__/tensor.pyc", b"bytecode");
        w("selfdrive/modeld/modeld.py", b"modeld");
        w("selfdrive/controls/controlsd.py", b"not sent");
        w("scripts/model_compiler.py", b"compiler");
        w("scripts/other.py", b"not sent");
        w("models", b"#!/bin/sh\n");
        t
    }

    /// Each change to what sync sends changes the digest; a change to what it does not send
    /// (excluded names, other paths, modification times) does not.
    #[test]
    fn what_changes_the_digest() {
        type Edit = fn(&Path);
        let cases: Vec<(&str, Edit, bool)> = vec![
            (
                "content",
                |op| {
                    std::fs::write(op.join("tinygrad_repo/tinygrad/tensor.py"), b"tensor2").unwrap()
                },
                true,
            ),
            (
                "rename",
                |op| {
                    std::fs::rename(
                        op.join("selfdrive/modeld/modeld.py"),
                        op.join("selfdrive/modeld/modeld2.py"),
                    )
                    .unwrap()
                },
                true,
            ),
            (
                "mode",
                |op| {
                    std::fs::set_permissions(op.join("models"), Permissions::from_mode(0o755))
                        .unwrap()
                },
                true,
            ),
            (
                "new empty directory",
                |op| std::fs::create_dir(op.join("selfdrive/modeld/empty")).unwrap(),
                true,
            ),
            (
                "symlink",
                |op| {
                    std::os::unix::fs::symlink("modeld.py", op.join("selfdrive/modeld/link.py"))
                        .unwrap()
                },
                true,
            ),
            (
                "marker",
                |op| std::fs::write(op.join("tinygrad_repo/TINYGRAD_COMMIT"), b"def\n").unwrap(),
                true,
            ),
            (
                "excluded .git",
                |op| std::fs::write(op.join("tinygrad_repo/.git/HEAD"), b"ref: other").unwrap(),
                false,
            ),
            (
                "excluded __pycache__",
                |op| {
                    std::fs::write(
                        op.join("tinygrad_repo/tinygrad/__pycache__/tensor.pyc"),
                        b"other bytecode",
                    )
                    .unwrap()
                },
                false,
            ),
            (
                "a nested .git",
                |op| {
                    std::fs::create_dir_all(op.join("tinygrad_repo/extra/.git")).unwrap();
                    std::fs::write(op.join("tinygrad_repo/extra/.git/x"), b"x").unwrap()
                },
                false,
            ),
            (
                "not sent: other selfdrive",
                |op| std::fs::write(op.join("selfdrive/controls/controlsd.py"), b"edited").unwrap(),
                false,
            ),
            (
                "not sent: other script",
                |op| std::fs::write(op.join("scripts/other.py"), b"edited").unwrap(),
                false,
            ),
            (
                "not sent: the sync record itself",
                |op| std::fs::write(op.join(crate::synced::SYNC_RECORD_FILE), b"{}").unwrap(),
                false,
            ),
            (
                "mtime only",
                |op| {
                    let f = std::fs::File::options()
                        .write(true)
                        .open(op.join("models"))
                        .unwrap();
                    f.set_modified(std::time::SystemTime::UNIX_EPOCH).unwrap();
                },
                false,
            ),
        ];
        for (what, edit, changes) in cases {
            let t = tree();
            let before = sync_digest(t.path()).unwrap();
            assert_eq!(before, sync_digest(t.path()).unwrap(), "deterministic");
            edit(t.path());
            let after = sync_digest(t.path()).unwrap();
            assert_eq!(before != after, changes, "{what}");
        }
    }

    #[test]
    fn counts_and_excludes_from_the_plan() {
        let t = tree();
        // TINYGRAD_COMMIT, extra/README, tensor.py, modeld.py, model_compiler.py, models.
        assert_eq!(sync_digest(t.path()).unwrap().files, 6);
        assert_eq!(
            excluded_names(&crate::plan::SYNC_PARTS[0]),
            [".git", "__pycache__"]
        );
        assert!(excluded_names(&crate::plan::SYNC_PARTS[1]).is_empty());
        // A missing part is part of the digest, not an error.
        let t2 = tree();
        std::fs::remove_file(t2.path().join("models")).unwrap();
        assert_ne!(
            sync_digest(t2.path()).unwrap(),
            sync_digest(t.path()).unwrap()
        );
        // dir_digest: the tree without git metadata.
        let a = dir_digest(&t.path().join("tinygrad_repo"), &[".git"]).unwrap();
        assert_eq!(a.files, 4);
        std::fs::write(t.path().join("tinygrad_repo/.git/HEAD"), b"x").unwrap();
        assert_eq!(
            dir_digest(&t.path().join("tinygrad_repo"), &[".git"]).unwrap(),
            a
        );
    }
}
