//! Checks on what came back from the compiler, run on the local copy before anything is moved
//! into place: exactly one chunk set (or one PKL for a local build), complete, and matching its
//! `.sha256`.

use std::collections::BTreeSet;
use std::path::Path;

use fs_err as fs;

use chunker::{Expected, Form, Sha256Digest};
use serde::Serialize;

use crate::error::Result;

/// A verified artifact in a local directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FetchedArtifact {
    /// The logical name, `<id>_driving_tinygrad.pkl`.
    pub name: String,
    pub size: u64,
    pub sha256: Sha256Digest,
    /// 0 for one plain PKL (local builds), N for a chunk set.
    pub chunk_count: u32,
    /// Every file of the artifact, `.chunkmanifest` last.
    pub files: Vec<String>,
}

/// Why the fetched outputs are not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputProblem {
    /// Nothing of this artifact came back.
    #[error("none of its files is there")]
    Missing,
    /// Something came back, but not a well-formed artifact.
    #[error("{0}")]
    Invalid(String),
    /// Well-formed, but the bytes do not hash to the `.sha256`.
    #[error("its chunks hash to {actual} but its .sha256 says {expected}")]
    Digest {
        expected: Sha256Digest,
        actual: Sha256Digest,
    },
}

/// Files in `dir` that belong to `name` (the name itself or `name.<anything>`).
fn files_of(dir: &Path, name: &str) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let file = entry.file_name().to_string_lossy().into_owned();
        if file == name || file.starts_with(&format!("{name}.")) {
            out.insert(file);
        }
    }
    Ok(out)
}

/// Check a release build's outputs in `dir`: a complete chunk set, its `.chunkmanifest` count
/// equal to the chunks present, no full PKL beside it, nothing else, and the SHA-256 of the
/// chunks equal to the `.sha256`.
pub fn check_release(dir: &Path, name: &str) -> Result<Result<FetchedArtifact, OutputProblem>> {
    let files = files_of(dir, name)?;
    if files.is_empty() {
        return Ok(Err(OutputProblem::Missing));
    }
    let invalid = |s: String| Ok(Err(OutputProblem::Invalid(s)));
    if files.contains(name) {
        return invalid(format!(
            "the full PKL {name} came back; a release build must be a chunk set only"
        ));
    }
    let manifest_name = chunker::chunk_manifest_name(name);
    let sidecar_name = chunker::sidecar_name(name);
    if !files.contains(&manifest_name) {
        return invalid(format!("{manifest_name} is missing"));
    }
    if !files.contains(&sidecar_name) {
        return invalid(format!("{sidecar_name} is missing"));
    }
    let manifest_path = dir.join(&manifest_name);
    let count = match chunker::parse_chunk_manifest(&fs::read(&manifest_path)?, &manifest_path) {
        Ok(n) => n,
        Err(e) => return invalid(e.to_string()),
    };
    let sidecar_path = dir.join(&sidecar_name);
    let expected = match chunker::parse_sidecar(&fs::read(&sidecar_path)?, &sidecar_path) {
        Ok(d) => d,
        Err(e) => return invalid(e.to_string()),
    };
    let mut chunks = Vec::new();
    for f in &files {
        if *f == manifest_name || *f == sidecar_name {
            continue;
        }
        match chunker::form_of(name, f) {
            Some(Form::Chunk { count: of, .. }) if of != count => {
                return invalid(format!(
                    "{f} does not belong to a set of {count} chunks ({manifest_name} says {count})"
                ));
            }
            Some(Form::Chunk { index, .. }) => chunks.push((index, f.clone())),
            _ => return invalid(format!("unexpected file {f}")),
        }
    }
    chunks.sort();
    let indices: Vec<u32> = chunks.iter().map(|(i, _)| *i).collect();
    if indices != (1..=count).collect::<Vec<_>>() {
        return invalid(format!(
            "{manifest_name} says {count} chunk(s) but chunks {indices:?} came back"
        ));
    }
    let report = match chunker::verify(
        &dir.join(name),
        &Expected {
            chunk_count: Some(count),
            // Judged against the digest the compile reported, just below.
            own_sidecar: chunker::OwnSidecar::Ignore,
            ..Expected::default()
        },
    ) {
        Ok(r) => r,
        Err(e) => return invalid(e.to_string()),
    };
    if report.sha256 != expected {
        return Ok(Err(OutputProblem::Digest {
            expected,
            actual: report.sha256,
        }));
    }
    // Every v25 driving artifact is an out-of-band pickle container (headers only are read).
    if let Err(e) = chunker::check_oob(&dir.join(name)) {
        return invalid(e.to_string());
    }
    let mut list: Vec<String> = chunks.into_iter().map(|(_, f)| f).collect();
    list.push(sidecar_name);
    list.push(manifest_name);
    Ok(Ok(FetchedArtifact {
        name: name.to_string(),
        size: report.size,
        sha256: report.sha256,
        chunk_count: count,
        files: list,
    }))
}

/// Check a local build's output: one plain PKL, checked against a `.sha256` when one came too.
pub fn check_local(dir: &Path, name: &str) -> Result<Result<FetchedArtifact, OutputProblem>> {
    let files = files_of(dir, name)?;
    if !files.contains(name) {
        return Ok(Err(OutputProblem::Missing));
    }
    let sidecar_name = chunker::sidecar_name(name);
    if let Some(extra) = files.iter().find(|f| **f != name && **f != sidecar_name) {
        return Ok(Err(OutputProblem::Invalid(format!(
            "unexpected file {extra} beside the local PKL"
        ))));
    }
    let path = dir.join(name);
    let (sha256, size) = Sha256Digest::of_file(&path)?;
    let mut list = vec![name.to_string()];
    if files.contains(&sidecar_name) {
        let sp = dir.join(&sidecar_name);
        let expected = match chunker::parse_sidecar(&fs::read(&sp)?, &sp) {
            Ok(d) => d,
            Err(e) => return Ok(Err(OutputProblem::Invalid(e.to_string()))),
        };
        if expected != sha256 {
            return Ok(Err(OutputProblem::Digest {
                expected,
                actual: sha256,
            }));
        }
        list.push(sidecar_name);
    }
    // `./models --local-<id>` keeps one OOB PKL: the same container, unchunked.
    if let Err(e) = chunker::check_oob(&path) {
        return Ok(Err(OutputProblem::Invalid(e.to_string())));
    }
    Ok(Ok(FetchedArtifact {
        name: name.to_string(),
        size,
        sha256,
        chunk_count: 0,
        files: list,
    }))
}

/// Which of the four DM files are absent (or empty) in `dir`.
pub fn missing_dm_files(dir: &Path) -> Vec<String> {
    crate::plan::DM_FILES
        .iter()
        .filter(|f| {
            fs::metadata(dir.join(f))
                .map(|m| !m.is_file() || m.len() == 0)
                .unwrap_or(true)
        })
        .map(|f| f.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: &str = "m_driving_tinygrad.pkl";

    fn oob(seed: u64, len: usize) -> Vec<u8> {
        test_support::published::artifact_bytes(seed, len)
    }

    fn set(dir: &Path, data: &[u8], chunk: u64) -> chunker::SplitReport {
        let src = dir.join("src.bin");
        fs::write(&src, data).unwrap();
        let out = dir.join("out");
        fs::create_dir_all(&out).unwrap();
        chunker::split_reader(
            fs::File::open(&src).unwrap(),
            data.len() as u64,
            N,
            &out,
            &chunker::SplitOptions { chunk_size: chunk },
        )
        .unwrap()
    }

    #[test]
    fn a_good_chunk_set() {
        let t = tempfile::tempdir().unwrap();
        set(t.path(), &oob(7, 25), 10);
        let a = check_release(&t.path().join("out"), N).unwrap().unwrap();
        assert_eq!(a.chunk_count, 3);
        assert_eq!(a.size, 25);
        assert_eq!(a.sha256, Sha256Digest::of_bytes(&oob(7, 25)));
        assert_eq!(a.files.last().unwrap(), &format!("{N}.chunkmanifest"));
        assert_eq!(a.files.len(), 5);
    }

    #[test]
    fn problems() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        fs::create_dir_all(&out).unwrap();
        assert_eq!(check_release(&out, N).unwrap(), Err(OutputProblem::Missing));
        let data = oob(1, 25);
        set(t.path(), &data, 10);
        // A chunk missing.
        fs::remove_file(out.join(format!("{N}.chunk02of03"))).unwrap();
        match check_release(&out, N).unwrap() {
            Err(OutputProblem::Invalid(m)) => assert!(m.contains("[1, 3]"), "{m}"),
            r => panic!("{r:?}"),
        }
        fs::write(out.join(format!("{N}.chunk02of03")), &data[10..20]).unwrap();
        // The sidecar lies.
        fs::write(
            out.join(format!("{N}.sha256")),
            format!("{}  {N}\n", Sha256Digest::of_bytes(b"x")),
        )
        .unwrap();
        assert!(matches!(
            check_release(&out, N).unwrap(),
            Err(OutputProblem::Digest { .. })
        ));
        // A full PKL beside the chunks.
        fs::write(out.join(N), b"full").unwrap();
        assert!(matches!(
            check_release(&out, N).unwrap(),
            Err(OutputProblem::Invalid(_))
        ));
    }

    #[test]
    fn a_chunk_set_that_is_not_oob_is_refused_with_its_offset() {
        let t = tempfile::tempdir().unwrap();
        let mut data = oob(3, 25);
        data.push(0); // one trailing byte after the last buffer record
        set(t.path(), &data, 10);
        match check_release(&t.path().join("out"), N).unwrap() {
            Err(OutputProblem::Invalid(m)) => {
                assert!(m.contains("out-of-band") && m.contains("at byte 25"), "{m}")
            }
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn local_and_dm() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(
            check_local(t.path(), N).unwrap(),
            Err(OutputProblem::Missing)
        );
        fs::write(t.path().join(N), b"local, but a plain pickle").unwrap();
        match check_local(t.path(), N).unwrap() {
            Err(OutputProblem::Invalid(m)) => assert!(m.contains("at byte 0"), "{m}"),
            r => panic!("{r:?}"),
        }
        fs::write(t.path().join(N), oob(2, 40)).unwrap();
        let a = check_local(t.path(), N).unwrap().unwrap();
        assert_eq!((a.chunk_count, a.size), (0, 40));
        assert_eq!(missing_dm_files(t.path()).len(), 4);
        for f in crate::plan::DM_FILES {
            fs::write(t.path().join(f), b"x").unwrap();
        }
        assert!(missing_dm_files(t.path()).is_empty());
    }
}
