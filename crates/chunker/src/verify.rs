//! Verification of a logical artifact against what a manifest or sidecar promises.
//!
//! Cheap checks come first (chunk count, total size, chunk sizes), then one streaming pass that
//! hashes the whole artifact and, when per-chunk digests are expected, each chunk on a second
//! thread so that the extra hash does not slow the pass down.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::sync_channel;
use std::thread;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::read::{check_chunk_sizes, resolve_strict};
use crate::{Hasher, IO_BUFFER_SIZE, Resolved, Sha256Digest};

/// What the artifact must be. Every field is optional; `None` means "not checked".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expected {
    /// The SHA-256 of the whole logical artifact.
    pub sha256: Option<Sha256Digest>,
    /// The size of the whole logical artifact, in bytes.
    pub size: Option<u64>,
    /// 0 means one plain file.
    pub chunk_count: Option<u32>,
    /// Per-chunk digests in order (the `artifact_chunk_sha256` manifest extension).
    pub chunk_sha256: Option<Vec<Sha256Digest>>,
}

/// What was found and checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// The logical path verified.
    pub path: PathBuf,
    /// `plain`, `chunked` or `legacy`.
    pub form: &'static str,
    /// The logical size in bytes.
    pub size: u64,
    /// The SHA-256 of the whole artifact, computed from the bytes read.
    pub sha256: Sha256Digest,
    /// Number of chunks (0 for a plain file; the part count for legacy parts).
    pub chunk_count: u32,
    /// Every piece read, in order.
    pub chunks: Vec<VerifiedChunk>,
}

/// One piece of a verified artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifiedChunk {
    /// The piece's file name.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Computed only when per-chunk digests were expected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<Sha256Digest>,
}

/// Verify the logical artifact at `logical` against `expected`. Legacy parts are always checked
/// against their sidecar digest as well.
///
/// `logical` is resolved strictly: a plain file wins, then a complete chunk set (its
/// `.chunkmanifest` and every chunk it counts), then legacy `.pNN` parts with their `.sha256`;
/// a chunk set with a chunk missing is an error ([`Error::MissingChunk`]), not "absent". Then,
/// in this order, each check only when `expected` asks for it:
///
/// 1. the number of chunks against [`Expected::chunk_count`] (0 for a plain file), and the
///    length of [`Expected::chunk_sha256`] against the number of pieces
///    ([`Error::CountMismatch`]);
/// 2. the sum of the pieces' sizes against [`Expected::size`] ([`Error::SizeMismatch`]);
/// 3. for a chunk set, every chunk but the last against the set's chunk size and the last
///    against 1..=chunk size ([`Error::SizeMismatch`] naming the chunk);
/// 4. every byte is read once; each chunk's SHA-256 against [`Expected::chunk_sha256`] (the
///    first mismatch is named), then the whole artifact's against [`Expected::sha256`] and,
///    for legacy parts, against the sidecar ([`Error::DigestMismatch`]).
///
/// Nothing is written. A file that cannot be read is [`Error::Io`] naming it.
pub fn verify(logical: &Path, expected: &Expected) -> Result<VerifyReport> {
    verify_with_progress(logical, expected, &mut |_| {})
}

/// [`verify`], calling `progress` with the number of bytes read each time it reads, so a caller
/// can show how far the hashing has got.
pub fn verify_with_progress(
    logical: &Path,
    expected: &Expected,
    progress: &mut dyn FnMut(u64),
) -> Result<VerifyReport> {
    let resolved = resolve_strict(logical)?;
    let name = logical
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let pieces = resolved.pieces();
    let count = resolved.chunk_count();

    if let Some(want) = expected.chunk_count
        && want != count
    {
        return Err(Error::CountMismatch {
            name,
            expected: want,
            actual: count,
        });
    }
    let total = resolved.size();
    if let Some(want) = expected.size
        && want != total
    {
        return Err(Error::SizeMismatch {
            what: name,
            expected: want,
            actual: total,
        });
    }
    if let Resolved::Chunked { .. } = resolved {
        check_chunk_sizes(&pieces)?;
    }
    let chunk_digests_wanted = match &expected.chunk_sha256 {
        Some(list) if list.len() != pieces.len() => {
            return Err(Error::CountMismatch {
                name: format!("{name} (per-chunk digests)"),
                expected: list.len() as u32,
                actual: pieces.len() as u32,
            });
        }
        Some(list) => Some(list),
        None => None,
    };

    let (whole, chunk_digests) = hash_pieces(&pieces, chunk_digests_wanted.is_some(), progress)?;

    if let Some(list) = chunk_digests_wanted {
        for (i, ((path, _), (want, got))) in pieces
            .iter()
            .zip(list.iter().zip(chunk_digests.iter()))
            .enumerate()
        {
            if want != got {
                return Err(Error::DigestMismatch {
                    what: format!("chunk {} of {} ({})", i + 1, pieces.len(), path.display()),
                    expected: *want,
                    actual: *got,
                });
            }
        }
    }
    let mut wanted_whole = vec![];
    if let Some(d) = expected.sha256 {
        wanted_whole.push(d);
    }
    if let Resolved::Legacy { digest, .. } = &resolved {
        wanted_whole.push(*digest);
    }
    for want in wanted_whole {
        if want != whole {
            return Err(Error::DigestMismatch {
                what: format!("{} (whole artifact)", logical.display()),
                expected: want,
                actual: whole,
            });
        }
    }

    let chunks = pieces
        .iter()
        .enumerate()
        .map(|(i, (path, size))| VerifiedChunk {
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            size: *size,
            sha256: chunk_digests.get(i).copied(),
        })
        .collect();
    Ok(VerifyReport {
        path: logical.to_path_buf(),
        form: resolved.form(),
        size: total,
        sha256: whole,
        chunk_count: count,
        chunks,
    })
}

/// The SHA-256 of the whole of `pieces` (in order) and of each piece, in one pass that reads
/// each byte once: the chunk-set hashing of [`verify`], for a caller that lists each chunk with
/// its digest (publish). The sizes are the pieces' as listed (e.g. by [`crate::resolve`]).
pub fn hash_chunk_set(pieces: &[(PathBuf, u64)]) -> Result<(Sha256Digest, Vec<Sha256Digest>)> {
    hash_pieces(pieces, true, &mut |_| {})
}

/// Hash the concatenation of `pieces`, and each piece too when `per_piece` is set. The per-piece
/// hashes run on a second thread fed the same buffers, so each byte is read from disk once.
fn hash_pieces(
    pieces: &[(PathBuf, u64)],
    per_piece: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<(Sha256Digest, Vec<Sha256Digest>)> {
    let mut reader = crate::read::Counting {
        inner: crate::ArtifactReader::new(pieces.to_vec()),
        progress,
    };
    // A read error needs no context here: the reader's message names the exact piece.
    if !per_piece {
        let (whole, _) = Sha256Digest::of_reader(reader)?;
        return Ok((whole, Vec::new()));
    }

    let sizes: Vec<u64> = pieces.iter().map(|(_, s)| *s).collect();
    let (tx, rx) = sync_channel::<Arc<Vec<u8>>>(4);
    thread::scope(|scope| {
        let chunk_thread = scope.spawn(move || {
            let mut digests = Vec::with_capacity(sizes.len());
            let mut sizes = sizes.into_iter();
            let mut remaining = sizes.next().unwrap_or(0);
            let mut hasher = Hasher::new();
            for buf in rx {
                let mut data = &buf[..];
                while !data.is_empty() {
                    while remaining == 0 {
                        digests.push(std::mem::take(&mut hasher).finish());
                        remaining = sizes.next().unwrap_or(u64::MAX);
                    }
                    let take = remaining.min(data.len() as u64) as usize;
                    hasher.update(&data[..take]);
                    remaining -= take as u64;
                    data = &data[take..];
                }
            }
            digests.push(hasher.finish());
            // Trailing empty pieces still get their digest.
            for _ in sizes {
                digests.push(Hasher::new().finish());
            }
            digests
        });
        let mut whole = Hasher::new();
        let result = (|| {
            loop {
                let mut buf = vec![0u8; IO_BUFFER_SIZE];
                let n = reader.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                buf.truncate(n);
                whole.update(&buf);
                if tx.send(Arc::new(buf)).is_err() {
                    break;
                }
            }
            Ok(())
        })();
        drop(tx);
        let digests = chunk_thread.join().expect("chunk hasher panicked");
        result.map(|()| (whole.finish(), digests))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole digest is the concatenation's, each piece's its own bytes', empty pieces
    /// included, whatever the buffer boundaries.
    #[test]
    fn chunk_set_hashing_digests_the_whole_and_each_piece() {
        let d = tempfile::tempdir().unwrap();
        let big = vec![7u8; IO_BUFFER_SIZE + 3];
        for contents in [
            vec![&b"abc"[..], b"de"],
            vec![&b"abc"[..]],
            vec![&big[..], b"x", &big[..10]],
            vec![&b"abc"[..], b""],
            vec![&b""[..], b"abc"],
        ] {
            let pieces: Vec<(PathBuf, u64)> = contents
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let p = d.path().join(format!("p{i}"));
                    std::fs::write(&p, c).unwrap();
                    (p, c.len() as u64)
                })
                .collect();
            let (whole, each) = hash_chunk_set(&pieces).unwrap();
            assert_eq!(whole, Sha256Digest::of_bytes(&contents.concat()));
            let want: Vec<Sha256Digest> =
                contents.iter().map(|c| Sha256Digest::of_bytes(c)).collect();
            assert_eq!(
                each,
                want,
                "{:?}",
                contents.iter().map(|c| c.len()).collect::<Vec<_>>()
            );
        }
    }
}
