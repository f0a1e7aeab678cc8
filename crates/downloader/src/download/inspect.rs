//! Checking bytes already on disk: the digest of a staging file (whole, or one piece), and the
//! digest recorded next to an installed artifact whose entry declares none.

use std::path::Path;

use chunker::{Hasher, Sha256Digest};
use fs_err::File;
use fs_err::os::unix::fs::FileExt;

use crate::error::{Error, Result};
use crate::http::Ctl;

/// Digest of an installed artifact whose entry declares none, as recorded at install from the
/// origin's sidecar (`<models>/<local_name>.sha256`, upstream's sidecar format). `None` when
/// there is no such record or it is malformed.
pub fn installed_sidecar_digest(models_dir: &Path, local_name: &str) -> Option<Sha256Digest> {
    let path = models_dir.join(chunker::sidecar_name(local_name));
    chunker::read_sidecar(&path).ok().flatten()
}

/// The whole staging file's digest; a cancel stops it between two buffers.
pub(crate) fn hash_file(file: &File, size: u64, ctl: &Ctl) -> Result<Sha256Digest> {
    let mut hasher = Hasher::new();
    let step = 16 * chunker::IO_BUFFER_SIZE as u64;
    let mut at = 0;
    while at < size {
        if ctl.cancel.is_cancelled() {
            return Err(Error::cancelled(&ctl.what));
        }
        let len = step.min(size - at);
        hash_region(file, at, len, &mut hasher)?;
        at += len;
    }
    Ok(hasher.finish())
}

pub(crate) fn hash_region(file: &File, offset: u64, len: u64, hasher: &mut Hasher) -> Result<()> {
    let mut buf = vec![0u8; chunker::IO_BUFFER_SIZE];
    let mut pos = 0;
    while pos < len {
        let want = (len - pos).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..want], offset + pos)?;
        hasher.update(&buf[..want]);
        pos += want as u64;
    }
    Ok(())
}
