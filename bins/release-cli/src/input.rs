//! Reading the manifest a command is given, bounded as devices bound it (`manifest`, `sign`
//! and `publish` read it alike).

use std::path::Path;

use manifest::{Limits, Manifest};

use crate::{CliError, CliResult};

/// A manifest file's bytes, read no further than one byte past the fleet's size limit.
/// `Err(size)` when the file is over the limit: its real size where the file system knows it.
pub(crate) fn read_bounded(path: &Path) -> CliResult<Result<Vec<u8>, u64>> {
    let limit = Limits::default().max_manifest_bytes;
    // Regular files only, opened without blocking: a FIFO or a device is refused at once.
    match chunker::bounded::read_capped(path, limit) {
        Ok(Some(bytes)) => Ok(Ok(bytes)),
        Ok(None) => Err(CliError::failure(format!(
            "{}: No such file or directory (os error 2)",
            path.display()
        ))),
        Err(chunker::Error::FileTooLarge { size, .. }) => Ok(Err(size)),
        Err(e @ chunker::Error::NotRegularFile { .. }) => Err(CliError::usage(e)),
        Err(e) => Err(CliError::failure(e)),
    }
}

pub(crate) fn too_large_message(size: u64) -> String {
    format!(
        "manifest is {size} bytes, more than the limit of {} bytes that devices enforce",
        Limits::default().max_manifest_bytes
    )
}

/// Read a manifest file for a command that needs all of it; over the size limit is a failed
/// check (exit 3) naming the file and its size.
pub(crate) fn read_limited(path: &Path) -> CliResult<Vec<u8>> {
    read_bounded(path)?.map_err(|size| {
        CliError::check_failed(format!(
            "{}: {}; devices would refuse it, so shrink it (fewer entries or fields) before using it",
            path.display(),
            too_large_message(size)
        ))
    })
}

/// A manifest file's bytes ([`read_limited`]) and the manifest they parse to ([`parse_manifest`]).
pub(crate) fn read_manifest(path: &Path) -> CliResult<(Vec<u8>, Manifest)> {
    let bytes = read_limited(path)?;
    let m = parse_manifest(path, &bytes)?;
    Ok((bytes, m))
}

/// Parse a manifest file's bytes within the default [`manifest::Limits`]; a malformed one is a
/// failed check (exit 3) naming the file and pointing at `validate`.
pub(crate) fn parse_manifest(path: &Path, bytes: &[u8]) -> CliResult<Manifest> {
    Manifest::from_slice_limited(bytes, &manifest::Limits::default()).map_err(|e| {
        CliError::check_failed(format!("{}: {e}", path.display())).with_next(format!(
            "`release-cli manifest validate {}` lists every problem",
            path.display()
        ))
    })
}
