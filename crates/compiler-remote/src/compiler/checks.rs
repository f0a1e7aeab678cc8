//! Local checks made before anything is sent to the compiler.

use std::path::{Path, PathBuf};

use fs_err as fs;

use crate::error::{Error, Result, SourceProblem};
use crate::job::{ValidateJob, artifact_dir_and_name};
use crate::outputs::{self, FetchedArtifact};

/// The chunk set `validate` sends, checked locally: its verified files, or the validator
/// refusal naming the job's artifact (the real run and the dry run both).
pub(crate) fn release_set_to_validate(job: &ValidateJob) -> Result<FetchedArtifact> {
    let (dir, name) = artifact_dir_and_name(&job.artifact);
    outputs::check_release(&dir, &name)?.map_err(|problem| Error::Validator {
        model: job.id.to_string(),
        detail: format!(
            "{} is not a verified chunk set: {problem}",
            job.artifact.display()
        ),
        log: job.log.clone(),
    })
}

/// The parts of the openpilot tree `sync` sends are all there.
pub(crate) fn check_tree(openpilot: &Path) -> Result<()> {
    for part in crate::pin_location(openpilot).sync_parts() {
        let p = openpilot.join(part.rel);
        let ok = if part.is_dir { p.is_dir() } else { p.exists() };
        if !ok {
            return Err(Error::TreeIncomplete { path: p });
        }
    }
    Ok(())
}

pub(crate) fn check_sources(sources: &[PathBuf]) -> Result<()> {
    if sources.is_empty() {
        return Err(Error::Source {
            path: PathBuf::from("--source"),
            problem: SourceProblem::NoneGiven,
        });
    }
    let mut names = std::collections::BTreeSet::new();
    for s in sources {
        let meta = fs::metadata(s)?;
        if !meta.is_file() || meta.len() == 0 {
            return Err(Error::Source {
                path: s.clone(),
                problem: SourceProblem::NotANonEmptyFile,
            });
        }
        let name = s.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        if !names.insert(name) {
            return Err(Error::Source {
                path: s.clone(),
                problem: SourceProblem::DuplicateName,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Source problems are typed (callers match on them) and render what they rendered as
    /// `Error::Pin` before, path first.
    #[test]
    fn source_problems_are_typed_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.onnx");
        fs::write(&empty, b"").unwrap();
        let a = dir.path().join("a").join("m.onnx");
        let b = dir.path().join("b").join("m.onnx");
        for p in [&a, &b] {
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, b"onnx").unwrap();
        }
        let cases: [(Vec<PathBuf>, SourceProblem, &str); 3] = [
            (
                vec![],
                SourceProblem::NoneGiven,
                "--source: no source files given",
            ),
            (
                vec![empty.clone()],
                SourceProblem::NotANonEmptyFile,
                "empty.onnx: not a non-empty file",
            ),
            (
                vec![a.clone(), b.clone()],
                SourceProblem::DuplicateName,
                "m.onnx: two sources share this file name",
            ),
        ];
        for (sources, want, text) in cases {
            let err = check_sources(&sources).unwrap_err();
            assert!(
                matches!(&err, Error::Source { problem, .. } if *problem == want),
                "{err:?}"
            );
            assert!(err.to_string().contains(text), "{err}");
        }
        check_sources(std::slice::from_ref(&a)).unwrap();
        // A source that is not there: fs-err's message names the path.
        let missing = dir.path().join("gone.onnx");
        let err = check_sources(&[a, missing.clone()]).unwrap_err();
        assert!(matches!(err, Error::Io(_)), "{err:?}");
        assert!(
            err.to_string().contains(&missing.display().to_string()),
            "{err}"
        );
    }
}
