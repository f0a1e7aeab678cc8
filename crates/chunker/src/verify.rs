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

use crate::digest::PieceHashes;
use crate::error::{Error, Result};
use crate::read::{check_chunk_sizes, resolve_strict};
use crate::{Hasher, IO_BUFFER_SIZE, Resolved, Sha256Digest};

/// What the artifact must be. `size`, `chunk_count` and `chunk_sha256` are checked when given.
/// The whole digest is checked against `sha256` when given; without it, against the set's own
/// `NAME.sha256` sidecar unless `own_sidecar` is [`OwnSidecar::Ignore`] (see [`verify`]).
/// `Expected::default()` therefore checks a set against its own `.sha256`, as `release-cli chunk
/// verify` does; [`VerifyReport::digest_checked`] says what the digest was checked against.
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
    /// What to do with the set's own `.sha256` sidecar when `sha256` is `None`.
    pub own_sidecar: OwnSidecar,
}

/// How [`verify`] uses the artifact's own `NAME.sha256` sidecar when no digest is expected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OwnSidecar {
    /// Check the whole digest against it when it exists (a malformed one is an error naming
    /// it); without one the digest is unchecked ([`DigestChecked::Nothing`]).
    #[default]
    Check,
    /// Do not read it: the caller compares [`VerifyReport::sha256`] with its own record (the
    /// device judges its models against the catalog, not a local sidecar). Legacy parts are
    /// still checked against theirs, which is part of the legacy form.
    Ignore,
}

/// What the whole digest of a verified artifact was checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DigestChecked {
    /// [`Expected::sha256`].
    Expected,
    /// The artifact's own `.sha256` sidecar (legacy parts always are).
    OwnSidecar,
    /// Nothing: no digest was expected and no sidecar was read. Only the counts and sizes
    /// asked for were checked; [`VerifyReport::sha256`] is what the bytes hash to.
    Nothing,
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
    /// What `sha256` was checked against (not in the serialized report).
    #[serde(skip)]
    pub digest_checked: DigestChecked,
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

/// Verify the logical artifact at `logical` (plain file, chunk set or legacy parts) against
/// `expected`.
///
/// Guarantees, when it returns `Ok`: every piece the form names exists, a chunk set's chunks
/// all have the chunk size but the last (which is not longer, nor empty); the count, size and
/// per-chunk digests asked for match; and the whole artifact hashes to `expected.sha256`, or,
/// without it, to the artifact's own `NAME.sha256` sidecar when there is one (unless
/// [`OwnSidecar::Ignore`]); legacy parts always to their sidecar. Which of these held is
/// [`VerifyReport::digest_checked`]: [`DigestChecked::Nothing`] means no digest was compared, so
/// a caller that needs the bytes proven must check it or pass a digest. Every byte is read once;
/// nothing is written. An error names the first thing that failed (the chunk, the file, the
/// digest expected and found).
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
    let pieces = resolved.pieces();
    let chunk_digests_wanted = check_shape(logical, &resolved, &pieces, expected)?;
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
    let (wanted_whole, digest_checked) = whole_digests(logical, &resolved, expected)?;
    for (want, against) in wanted_whole {
        if want != whole {
            return Err(Error::DigestMismatch {
                what: format!("{} (whole artifact{against})", logical.display()),
                expected: want,
                actual: whole,
            });
        }
    }
    let chunks = pieces
        .iter()
        .enumerate()
        .map(|(i, (path, size))| VerifiedChunk {
            name: crate::file_name_of(path),
            size: *size,
            sha256: chunk_digests.get(i).copied(),
        })
        .collect();
    Ok(VerifyReport {
        path: logical.to_path_buf(),
        form: resolved.form(),
        size: resolved.size(),
        sha256: whole,
        chunk_count: resolved.chunk_count(),
        chunks,
        digest_checked,
    })
}

/// What can be checked before a byte is read: the count and size asked for, a chunk set's chunk
/// sizes, and as many per-chunk digests as pieces. Returns the per-chunk digests asked for.
fn check_shape<'e>(
    logical: &Path,
    resolved: &Resolved,
    pieces: &[(PathBuf, u64)],
    expected: &'e Expected,
) -> Result<Option<&'e Vec<Sha256Digest>>> {
    let name = crate::file_name_of(logical);
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
        check_chunk_sizes(pieces)?;
    }
    match &expected.chunk_sha256 {
        Some(list) if list.len() != pieces.len() => Err(Error::CountMismatch {
            name: format!("{name} (per-chunk digests)"),
            expected: list.len() as u32,
            actual: pieces.len() as u32,
        }),
        wanted => Ok(wanted.as_ref()),
    }
}

/// The digests the whole artifact must hash to (the one expected, a legacy set's sidecar, else
/// the artifact's own sidecar when asked to check it), each with what it is checked against
/// for the message, and which of them [`DigestChecked`] names.
fn whole_digests(
    logical: &Path,
    resolved: &Resolved,
    expected: &Expected,
) -> Result<(Vec<(Sha256Digest, String)>, DigestChecked)> {
    let mut wanted = vec![];
    let mut digest_checked = DigestChecked::Nothing;
    if let Some(want) = expected.sha256 {
        wanted.push((want, String::new()));
        digest_checked = DigestChecked::Expected;
    }
    if let Resolved::Legacy { digest, .. } = resolved {
        wanted.push((*digest, " against its .sha256".to_string()));
        if digest_checked == DigestChecked::Nothing {
            digest_checked = DigestChecked::OwnSidecar;
        }
    } else if digest_checked == DigestChecked::Nothing && expected.own_sidecar == OwnSidecar::Check
    {
        let sidecar = own_sidecar_path(logical);
        if let Some(want) = crate::read_sidecar(&sidecar)? {
            wanted.push((want, format!(" against {}", sidecar.display())));
            digest_checked = DigestChecked::OwnSidecar;
        }
    }
    Ok((wanted, digest_checked))
}

/// `NAME.sha256` beside the logical artifact `NAME`.
fn own_sidecar_path(logical: &Path) -> PathBuf {
    logical.with_file_name(crate::sidecar_name(&crate::file_name_of(logical)))
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
            let mut hashes = PieceHashes::new(sizes.into_iter());
            for buf in rx {
                hashes.update(&buf);
            }
            hashes.finish()
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
