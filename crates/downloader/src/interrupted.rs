//! Downloads left unfinished in the staging directory ([`crate::STAGING_DIR`]): what `status`
//! reports as an interrupted download, read without following anything and without writing.
//!
//! A download stages `<16 hex of its digest>-<local name>` and its completion record
//! `<same>.state`: a header line `<sha256> <size> <piece length>`, then one line per piece done
//! (`<index>`, from 1) or per range done inside an unfinished piece (`<index> <start> <end>`,
//! offsets in the piece). A resume continues from that record; it is removed once the artifact
//! is installed.

use std::path::Path;

use fs_err as fs;

use crate::staging::{MAX_STATE_BYTES, STAGING_DIR, staged_parts};

/// One unfinished download: the file it installs, the digest it is for, how far it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedDownload {
    /// The local file name it installs (`<id>_driving_tinygrad.pkl`, a Chestnut variant's).
    pub file: String,
    /// The first 16 hex digits of the artifact digest it is for.
    pub sha256_prefix: String,
    /// Bytes recorded done (whole pieces and ranges inside unfinished ones).
    pub done_bytes: u64,
    /// The artifact's size.
    pub size: u64,
}

/// How far a completion record says a download got: `(size, done bytes)`, or `None` when it is
/// not a record. Pure.
pub fn record_progress(text: &str) -> Option<(u64, u64)> {
    let mut lines = text.lines();
    let mut header = lines.next()?.split(' ');
    let (_sha, size, piece) = (header.next()?, header.next()?, header.next()?);
    let size: u64 = size.parse().ok()?;
    let piece: u64 = piece.parse().ok()?;
    let mut done = 0u64;
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let f: Vec<u64> = line
            .split(' ')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        done = done.saturating_add(match f[..] {
            // Pieces are numbered from 1, as the chunks are (`download::plan::Piece`).
            [i] => {
                let start = i.checked_sub(1)?.saturating_mul(piece);
                size.saturating_sub(start).min(piece)
            }
            [_, a, b] => b.saturating_sub(a),
            _ => return None,
        });
    }
    Some((size, done.min(size)))
}

/// The staged downloads of `models_dir`, by file name; none when there is no staging directory
/// (or it is not a directory: a symlink at its name is never followed). Read-only.
pub fn staged_downloads(models_dir: &Path) -> Vec<StagedDownload> {
    let dir = models_dir.join(STAGING_DIR);
    if !fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
        return Vec::new();
    }
    let Ok(rd) = fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<StagedDownload> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|name| {
            let data = name.strip_suffix(".state")?;
            let (sha, file) = staged_parts(&name)
                .filter(|(sha, _)| sha.bytes().all(|b| b.is_ascii_hexdigit()))?;
            let bytes = chunker::bounded::read_capped(&dir.join(&name), MAX_STATE_BYTES)
                .ok()
                .flatten()?;
            let (size, done_bytes) = record_progress(std::str::from_utf8(&bytes).ok()?)?;
            // The record without its staged bytes is nothing to resume.
            fs::symlink_metadata(dir.join(data))
                .ok()
                .filter(|m| m.is_file())?;
            Some(StagedDownload {
                file: file.to_string(),
                sha256_prefix: sha.to_string(),
                done_bytes,
                size,
            })
        })
        .collect();
    out.sort_by(|a, b| a.file.cmp(&b.file));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_counts_whole_pieces_and_ranges() {
        let sha = "ab".repeat(32);
        for (body, want) in [
            (format!("{sha} 1000 256\n"), Some((1000, 0))),
            // Pieces 1 and 4 (the last, 232 bytes) done, 100 bytes inside piece 2.
            (
                format!("{sha} 1000 256\n1\n4\n2 0 100\n"),
                Some((1000, 588)),
            ),
            (format!("{sha} 1000 256\n1\n2\n3\n4\n"), Some((1000, 1000))),
            // A plain file is one piece, numbered 1.
            (format!("{sha} 1000 1000\n1\n"), Some((1000, 1000))),
            (format!("{sha} 1000 256\n0\n"), None),
            (format!("{sha} 1000\n1\n"), None),
            (format!("{sha} 1000 256\nzero\n"), None),
            (String::new(), None),
        ] {
            assert_eq!(record_progress(&body), want, "{body:?}");
        }
    }

    #[test]
    fn staged_downloads_are_listed_without_following_links() {
        let d = tempfile::tempdir().unwrap();
        let models = d.path().join("models");
        assert!(staged_downloads(&models).is_empty());
        let staging = models.join(STAGING_DIR);
        std::fs::create_dir_all(&staging).unwrap();
        let sha = "cd".repeat(32);
        let data = format!("{}-pop223_driving_tinygrad.pkl", &sha[..16]);
        std::fs::write(staging.join(&data), vec![0u8; 1000]).unwrap();
        std::fs::write(
            staging.join(format!("{data}.state")),
            format!("{sha} 1000 256\n1\n"),
        )
        .unwrap();
        // A record without its bytes, and a stray, are not downloads.
        std::fs::write(
            staging.join(format!("{}-gone_driving_tinygrad.pkl.state", &sha[..16])),
            format!("{sha} 1000 256\n1\n"),
        )
        .unwrap();
        std::fs::write(staging.join(".new-x"), b"x").unwrap();
        assert_eq!(
            staged_downloads(&models),
            [StagedDownload {
                file: "pop223_driving_tinygrad.pkl".into(),
                sha256_prefix: sha[..16].to_string(),
                done_bytes: 256,
                size: 1000,
            }]
        );
        // The staging directory swapped for a symlink: not followed.
        let elsewhere = d.path().join("elsewhere");
        std::fs::rename(&staging, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &staging).unwrap();
        assert!(staged_downloads(&models).is_empty());
    }
}
