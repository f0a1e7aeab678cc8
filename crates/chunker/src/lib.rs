//! The StarPilot chunk-set format (docs/formats.md, "Chunk sets"): how a logical artifact such as
//! `pop223_driving_tinygrad.pkl` is published as `NAME.chunkNNofMM` files plus a
//! `NAME.chunkmanifest` and a `NAME.sha256` sidecar, and how legacy `NAME.pNN` parts are read.
//!
//! It offers a streaming split (one pass, bounded memory, every output fsynced and renamed into
//! place, the chunk manifest last), a `Read + Seek` reader over whatever form is present, join,
//! and verification with typed errors that name the first bad chunk.
//!
//! It does not know about manifests, model IDs or stores; those live in the `manifest` and
//! `artifact-store` crates. It never holds a whole artifact in memory.
//!
//! # Example
//!
//! Split a file into a chunk set, then verify the set against what the split reported, as a
//! manifest would record it:
//!
//! ```
//! use chunker::{Expected, SplitOptions, split_file, verify};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let src = dir.path().join("model.pkl");
//! std::fs::write(&src, vec![7u8; 2_500])?;
//! let out = dir.path().join("release");
//! std::fs::create_dir(&out)?;
//!
//! // 1000-byte chunks: model.pkl.chunk01of03 .. chunk03of03, model.pkl.sha256 and, last,
//! // model.pkl.chunkmanifest.
//! let opts = SplitOptions { chunk_size: 1_000, ..SplitOptions::default() };
//! let report = split_file(&src, &out, &opts)?;
//! assert_eq!(report.chunk_count, 3);
//! assert_eq!(report.chunks[2].name, "model.pkl.chunk03of03");
//! assert_eq!(report.chunks[2].size, 500);
//!
//! // Verify by logical name: the set is found, its sizes checked and every byte hashed.
//! let expected = Expected {
//!     sha256: Some(report.sha256),
//!     size: Some(report.size),
//!     chunk_count: Some(report.chunk_count),
//!     chunk_sha256: Some(report.chunks.iter().map(|c| c.sha256).collect()),
//!     ..Expected::default()
//! };
//! let checked = verify(&out.join("model.pkl"), &expected)?;
//! assert_eq!(checked.form, "chunked");
//! assert_eq!(checked.sha256, chunker::Sha256Digest::of_bytes(&[7u8; 2_500]));
//!
//! // A damaged chunk is named in the error.
//! std::fs::write(out.join("model.pkl.chunk02of03"), vec![0u8; 1_000])?;
//! let err = verify(&out.join("model.pkl"), &expected).unwrap_err();
//! assert!(matches!(err, chunker::Error::DigestMismatch { .. }));
//! assert!(err.to_string().contains("chunk 2 of 3"), "{err}");
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod atomic;
pub mod bounded;
mod digest;
pub mod effects;
mod error;
mod input;
pub mod oob;
mod read;
mod split;
mod verify;

pub use digest::{Hasher, IO_BUFFER_SIZE, InvalidDigest, Sha256Digest, hash_backend};
pub use error::{Error, Result};
pub use input::{locate, member_of, sets_among};
pub use oob::{OobDefect, OobLayout};
pub use read::{
    ArtifactReader, Resolved, join, join_checked, open, read_chunk_manifest, read_sidecar, resolve,
};
pub use split::{
    ChunkInfo, PlannedChunk, SplitOptions, SplitPlan, SplitReport, StagedSplit, other_forms,
    plan_split, set_file_names, split_file, split_open_file, split_reader, stage_reader,
};
pub use verify::{
    DigestChecked, Expected, OwnSidecar, VerifiedChunk, VerifyReport, hash_chunk_set, verify,
    verify_with_progress,
};

use std::path::Path;

/// Check that the logical artifact at `logical` (a plain file or a chunk set) is an OOB pickle
/// container, reading only its headers through a seeking [`ArtifactReader`]. The error names
/// the artifact and the offset.
pub fn check_oob(logical: &Path) -> Result<OobLayout> {
    let mut reader = open(logical)?;
    check_oob_reader(&mut reader, &logical.display().to_string())
}

/// [`check_oob`] over an open reader; `what` names it in errors.
pub fn check_oob_reader(reader: &mut ArtifactReader, what: &str) -> Result<OobLayout> {
    let size = reader.len();
    oob::check_oob(reader, size).map_err(|e| match e {
        oob::OobCheckError::Defect(d) => Error::NotOob {
            what: what.to_string(),
            offset: d.offset,
            defect: d.defect,
        },
        // The reader's errors name the piece (fs_err, or its own truncation message).
        oob::OobCheckError::Io(source) => Error::Io(source),
    })
}

/// 45 MiB: every chunk stays under GitHub's 50 MB warning.
pub const DEFAULT_CHUNK_SIZE: u64 = 45 * 1024 * 1024;

/// Chunk indices and counts are written with two digits, so a set has at most 99 chunks.
pub const MAX_CHUNKS: u32 = 99;

/// Legacy multipart sets had at most 100 parts (`.p00` ..= `.p99`).
pub const MAX_LEGACY_PARTS: u32 = 100;

/// A `.chunkmanifest` or `.sha256` file is read up to this size (4 KiB), so a bogus one cannot
/// make a reader load it whole: the one limit of every reader of them, local or in a store.
pub const SMALL_FILE_LIMIT: u64 = 4096;

/// `NAME.chunkNNofMM`, 1-based `index`.
pub fn chunk_name(name: &str, index: u32, count: u32) -> String {
    format!("{name}.chunk{index:02}of{count:02}")
}

/// `NAME.chunkmanifest`.
pub fn chunk_manifest_name(name: &str) -> String {
    format!("{name}.chunkmanifest")
}

/// `NAME.sha256`.
pub fn sidecar_name(name: &str) -> String {
    format!("{name}.sha256")
}

/// `NAME.pNN`, 0-based `index` (legacy multipart).
pub fn legacy_part_name(name: &str, index: u32) -> String {
    format!("{name}.p{index:02}")
}

/// The content of a `.chunkmanifest`: the decimal count, no newline.
pub fn format_chunk_manifest(count: u32) -> String {
    count.to_string()
}

/// Parse a `.chunkmanifest` body. Whitespace around the number is accepted (readers strip it),
/// anything else, and any count outside 1..=99, is an error quoting the content.
pub fn parse_chunk_manifest(content: &[u8], path: &Path) -> Result<u32> {
    let malformed = || Error::MalformedChunkManifest {
        path: path.to_path_buf(),
        content: String::from_utf8_lossy(&content[..content.len().min(64)]).into_owned(),
    };
    let text = std::str::from_utf8(content)
        .map_err(|_| malformed())?
        .trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) || text.len() > 3 {
        return Err(malformed());
    }
    match text.parse::<u32>() {
        Ok(n) if (1..=MAX_CHUNKS).contains(&n) => Ok(n),
        _ => Err(malformed()),
    }
}

/// The content of a `.sha256` sidecar: `<64 hex>  NAME\n`.
pub fn format_sidecar(digest: &Sha256Digest, name: &str) -> String {
    format!("{digest}  {name}\n")
}

/// Parse a `.sha256` sidecar: its first whitespace-separated token must be 64 lowercase hex.
pub fn parse_sidecar(content: &[u8], path: &Path) -> Result<Sha256Digest> {
    let malformed = || Error::MalformedSidecar {
        path: path.to_path_buf(),
        content: String::from_utf8_lossy(&content[..content.len().min(128)]).into_owned(),
    };
    let text = std::str::from_utf8(content).map_err(|_| malformed())?;
    text.split_whitespace()
        .next()
        .and_then(|tok| tok.parse().ok())
        .ok_or_else(malformed)
}

/// Parse a chunk file name of the logical artifact `name`: `Some((index, count))` for
/// `NAME.chunkNNofMM`, else `None`. Other crates match [`form_of`]'s [`Form::Chunk`].
fn parse_chunk_name(name: &str, file_name: &str) -> Option<(u32, u32)> {
    let rest = file_name.strip_prefix(name)?.strip_prefix(".chunk")?;
    let (idx, count) = rest.split_once("of")?;
    if idx.len() != 2 || count.len() != 2 {
        return None;
    }
    if !idx.bytes().chain(count.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((idx.parse().ok()?, count.parse().ok()?))
}

/// The form a file holds a logical artifact in (docs/formats.md, "Chunk sets").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `NAME` itself, one plain file.
    Plain,
    /// `NAME.chunkNNofMM`.
    Chunk {
        /// 1-based chunk index.
        index: u32,
        /// The number of chunks the name declares.
        count: u32,
    },
    /// `NAME.pNN`, a legacy part (0-based).
    LegacyPart(u32),
    /// `NAME.sha256`.
    Sidecar,
    /// `NAME.chunkmanifest`.
    ChunkManifest,
}

/// Which of `name`'s files `file_name` is, or `None` when it is not one of them: the one
/// matcher of "the forms of NAME" for split, install and publish. Pure.
pub fn form_of(name: &str, file_name: &str) -> Option<Form> {
    let tail = file_name.strip_prefix(name)?;
    match tail {
        "" => Some(Form::Plain),
        ".sha256" => Some(Form::Sidecar),
        ".chunkmanifest" => Some(Form::ChunkManifest),
        _ => {
            if let Some((index, count)) = parse_chunk_name(name, file_name) {
                return Some(Form::Chunk { index, count });
            }
            let digits = tail.strip_prefix(".p")?;
            (digits.len() == 2 && digits.bytes().all(|b| b.is_ascii_digit()))
                .then(|| Form::LegacyPart(digits.parse().expect("two digits")))
        }
    }
}

/// The set a member file belongs to and its form, NAME unknown: `NAME.chunkNNofMM`,
/// `NAME.chunkmanifest`, `NAME.sha256` and `NAME.pNN` give `(NAME, form)` with `NAME` not empty
/// (it may be a path); anything else `None`. Pure.
pub fn member_form(file_name: &str) -> Option<(&str, Form)> {
    let (stem, _) = file_name.rsplit_once('.')?; // a tail follows, so never Form::Plain
    Some((stem, form_of(stem, file_name).filter(|_| !stem.is_empty())?))
}

/// The last component of `path` as text (lossy), or `""` when it has none.
pub(crate) fn file_name_of(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Number of chunks a `size`-byte artifact splits into.
pub fn chunk_count_for(size: u64, chunk_size: u64) -> u64 {
    size.div_ceil(chunk_size)
}

/// The logical name must be a bare file name: no separators, not `.`/`..`, not empty.
pub(crate) fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
        return Err(Error::InvalidName {
            name: name.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_fleet() {
        let n = "pop223_driving_tinygrad.pkl";
        assert_eq!(
            chunk_name(n, 1, 2),
            "pop223_driving_tinygrad.pkl.chunk01of02"
        );
        assert_eq!(
            chunk_name(n, 12, 99),
            "pop223_driving_tinygrad.pkl.chunk12of99"
        );
        assert_eq!(
            chunk_manifest_name(n),
            "pop223_driving_tinygrad.pkl.chunkmanifest"
        );
        assert_eq!(sidecar_name(n), "pop223_driving_tinygrad.pkl.sha256");
        assert_eq!(legacy_part_name(n, 0), "pop223_driving_tinygrad.pkl.p00");
        assert_eq!(format_chunk_manifest(2), "2");
        assert_eq!(parse_chunk_name(n, &chunk_name(n, 3, 7)), Some((3, 7)));
        assert_eq!(parse_chunk_name(n, "other.chunk01of02"), None);
        assert_eq!(parse_chunk_name(n, &format!("{n}.chunk1of2")), None);
    }

    #[test]
    fn forms_of_a_name() {
        let n = "a_driving_tinygrad.pkl";
        for (file, want) in [
            (n.to_string(), Some(Form::Plain)),
            (
                chunk_name(n, 3, 7),
                Some(Form::Chunk { index: 3, count: 7 }),
            ),
            (legacy_part_name(n, 4), Some(Form::LegacyPart(4))),
            (sidecar_name(n), Some(Form::Sidecar)),
            (chunk_manifest_name(n), Some(Form::ChunkManifest)),
            (format!("{n}.chunk1of2"), None),
            (format!("{n}.p1"), None),
            (format!("{n}.p123"), None),
            (format!("{n}.pxy"), None),
            (format!("{n}.tmp"), None),
            (format!("{n}x"), None),
            ("b_driving_tinygrad.pkl".to_string(), None),
            (chunk_name("b_driving_tinygrad.pkl", 1, 2), None),
        ] {
            assert_eq!(form_of(n, &file), want, "{file}");
        }
    }

    #[test]
    fn chunk_manifest_parsing() {
        let p = Path::new("x.chunkmanifest");
        assert_eq!(parse_chunk_manifest(b"2", p).unwrap(), 2);
        assert_eq!(parse_chunk_manifest(b" 12\n", p).unwrap(), 12);
        for bad in [
            &b""[..],
            b"0",
            b"100",
            b"two",
            b"-1",
            b"1.0",
            b"\xff",
            b"1 2",
        ] {
            match parse_chunk_manifest(bad, p) {
                Err(Error::MalformedChunkManifest { content, .. }) => {
                    assert_eq!(content, String::from_utf8_lossy(bad))
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn small_files_read_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let cm = dir.path().join(chunk_manifest_name("a.pkl"));
        let sc = dir.path().join(sidecar_name("a.pkl"));
        assert_eq!(read_chunk_manifest(&cm).unwrap(), None);
        assert_eq!(read_sidecar(&sc).unwrap(), None);
        std::fs::write(&cm, "3").unwrap();
        let d = Sha256Digest::of_bytes(b"abc");
        std::fs::write(&sc, format_sidecar(&d, "a.pkl")).unwrap();
        assert_eq!(read_chunk_manifest(&cm).unwrap(), Some(3));
        assert_eq!(read_sidecar(&sc).unwrap(), Some(d));
        std::fs::write(&cm, "3".repeat(1 << 20)).unwrap();
        assert!(matches!(
            read_chunk_manifest(&cm),
            Err(Error::MalformedChunkManifest { .. })
        ));
    }

    #[test]
    fn sidecar_round_trip() {
        let d = Sha256Digest::of_bytes(b"abc");
        let text = format_sidecar(&d, "a.pkl");
        assert_eq!(text, format!("{}  a.pkl\n", d.to_hex()));
        assert_eq!(parse_sidecar(text.as_bytes(), Path::new("s")).unwrap(), d);
        assert!(parse_sidecar(b"nothex  a.pkl\n", Path::new("s")).is_err());
    }
}
