//! Reading and writing the gate's records (`results/preflight.json`, `results/<id>.validation.json`,
//! `results/model-v2.check.json`, `results/driver-state.<W>x<H>.check.json`,
//! `results/rehearsal.json`; their places are [`crate::Workspace`]'s), each written atomically
//! as pretty JSON; the types are in [`crate::gate`].

use fs_err as fs;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Workspace;
use crate::gate::{CheckRecord, PreflightRecord, Records, ValidationRecord};
use crate::recorded::RehearsalRecord;
use crate::{Error, Result};
use manifest::UnixSeconds;

/// Records are a few kilobytes; anything much larger is not one.
pub(crate) const MAX_RECORD_BYTES: u64 = 4 << 20;
pub(crate) const VALIDATION_SUFFIX: &str = ".validation.json";
pub(crate) const CHECK_SUFFIX: &str = ".check.json";
/// `results/` holds a few files per model; a directory with more entries than this is not a
/// workspace's, and is refused rather than read without end.
pub(crate) const MAX_RESULTS_ENTRIES: usize = 4096;

/// The publish record's place: `<manifest stem>.publish.json` beside the manifest
/// (`ready/model_names_v25.json` → `ready/model_names_v25.publish.json`).
pub fn publish_record_path(manifest: &Path) -> PathBuf {
    let stem = manifest
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "manifest".into());
    manifest.with_file_name(format!("{stem}.publish.json"))
}

/// Whether `manifest` (as staged) was already published through a passing validation gate, as a
/// publish record beside `manifest_path` says (the newest or any in the history): then a publish
/// of the same bytes again (a mend, a second store) is a repair of a release that was gated, and
/// the preflight is judged as it was then, not against the tree's later commits. Records that
/// cannot be read count as none.
pub fn gated_before(manifest_path: &Path, manifest: &manifest::Manifest) -> bool {
    let Some(dir) = manifest_path.parent() else {
        return false;
    };
    let Some(stem) = manifest_path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
    else {
        return false;
    };
    let prefix = format!("{stem}.publish.");
    let want = chunker::Sha256Digest::of_bytes(&manifest.to_canonical_bytes());
    let Ok(entries) = fs::read_dir(if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    }) else {
        return false;
    };
    entries
        .take(MAX_RESULTS_ENTRIES)
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(&prefix) && n.ends_with(".json")
        })
        .filter_map(|e| read::<crate::gate::PublishRecord>(&e.path()).ok())
        .any(|r| {
            r.manifest_sha256 == want
                && matches!(r.validation, crate::gate::GateOutcome::Passed { .. })
        })
}

/// One publish's own record, never overwritten: `<manifest stem>.publish.<YYYYMMDDTHHMMSSZ>.json`
/// beside the manifest for the time it was published (`model_names_v25.publish.20261202T190455Z.json`),
/// with `-2`, `-3`, … when `taken` says that name is already used (two publishes in one second).
/// `None` when every suffix up to 999 is taken.
pub fn publish_history_path(
    manifest: &Path,
    published_at: UnixSeconds,
    taken: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    let stem = manifest
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "manifest".into());
    let time: String = published_at
        .to_string()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    (1..1000)
        .map(|n| {
            let suffix = if n == 1 {
                String::new()
            } else {
                format!("-{n}")
            };
            manifest.with_file_name(format!("{stem}.publish.{time}{suffix}.json"))
        })
        .find(|p| !taken(p))
}

/// Write a record atomically (temp file, fsync, rename), creating `results/` when needed.
pub fn write<T: Serialize>(path: &Path, record: &T) -> Result<()> {
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    let mut text = serde_json::to_string_pretty(record).map_err(|e| Error::Record {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    text.push('\n');
    chunker::atomic::write_atomic(path, text.as_bytes())?;
    Ok(())
}

/// One record: size-capped, regular files only, parsed; an [`Error::Record`] naming the file
/// otherwise. Every reader of `results/` goes through it.
pub(crate) fn read<T: DeserializeOwned>(path: &Path) -> Result<T> {
    serde_json::from_slice(&read_bytes(path)?).map_err(|e| Error::Record {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// A record's bytes: size-capped, regular files only (a FIFO in results/ must not hang the
/// gate); an [`Error::Record`] naming the file when it cannot be read.
pub(crate) fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    chunker::bounded::read_capped_existing(path, MAX_RECORD_BYTES).map_err(|e| Error::Record {
        path: path.to_path_buf(),
        reason: match e {
            chunker::Error::FileTooLarge { size, limit, .. } => {
                format!("{size} bytes is too large for a record (limit {limit})")
            }
            chunker::Error::NotRegularFile { .. } => "not a regular file".into(),
            other => other.to_string(),
        },
    })
}

/// Every record in `<workspace>/results/`. A missing directory is no records; a record that
/// does not parse is an error naming it (rerun the command that writes it).
pub fn load(workspace: &Workspace) -> Result<Records> {
    let dir = workspace.results();
    let mut records = Records::default();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !workspace.root().is_dir() {
                return Err(Error::NotADirectory {
                    flag: "--workspace",
                    path: workspace.root().to_path_buf(),
                });
            }
            return Ok(records);
        }
        Err(e) => return Err(e.into()),
    };
    let mut paths = Vec::new();
    for e in entries {
        if paths.len() == MAX_RESULTS_ENTRIES {
            return Err(Error::Record {
                path: dir,
                reason: format!(
                    "more than {MAX_RESULTS_ENTRIES} entries; is --workspace the rebuild \
                     workspace?"
                ),
            });
        }
        paths.push(e?.path());
    }
    paths.sort();
    // Anything at a record's name is read (a FIFO, a directory or a dangling link there is an
    // error naming it, never taken for "no record").
    let preflight = workspace.preflight();
    if preflight.symlink_metadata().is_ok() {
        records.preflight = Some(read::<PreflightRecord>(&preflight)?);
    }
    let rehearsal = workspace.rehearsal_record();
    if rehearsal.symlink_metadata().is_ok() {
        records.rehearsal = Some(read::<RehearsalRecord>(&rehearsal)?);
    }
    for p in paths {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.ends_with(VALIDATION_SUFFIX) {
            records.validations.push(read::<ValidationRecord>(&p)?);
        } else if name.ends_with(CHECK_SUFFIX) {
            records.checks.push(read::<CheckRecord>(&p)?);
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One history file per publish, named by its time, never reusing a taken name; for any
    /// generation's manifest name.
    #[test]
    fn publish_history_names_one_file_per_publish() {
        use manifest::UnixSeconds;
        let at: UnixSeconds = "2026-12-02T19:04:55Z".parse().unwrap();
        for generation in ["v25", "v26"] {
            let m = PathBuf::from(format!("/r/ready/model_names_{generation}.json"));
            let stem = format!("/r/ready/model_names_{generation}.publish.20261202T190455Z");
            let cases: [(&[&str], Option<String>); 3] = [
                (&[], Some(format!("{stem}.json"))),
                (&[".json"], Some(format!("{stem}-2.json"))),
                (&[".json", "-2.json"], Some(format!("{stem}-3.json"))),
            ];
            for (taken, want) in cases {
                let taken: Vec<String> = taken.iter().map(|t| format!("{stem}{t}")).collect();
                let got = publish_history_path(&m, at, |p| taken.iter().any(|t| Path::new(t) == p));
                assert_eq!(got, want.map(PathBuf::from), "{generation} {taken:?}");
            }
            assert_eq!(publish_history_path(&m, at, |_| true), None);
        }
    }

    #[test]
    fn a_missing_workspace_is_named_and_an_empty_one_has_no_records() {
        let t = tempfile::tempdir().unwrap();
        let ws = Workspace::new(t.path().join("ws"));
        let e = load(&ws).unwrap_err();
        assert!(matches!(e, Error::NotADirectory { .. }), "{e:?}");
        assert!(e.to_string().contains(&*ws.root().to_string_lossy()), "{e}");
        fs::create_dir(ws.root()).unwrap();
        let r = load(&ws).unwrap();
        assert!(r.preflight.is_none() && r.validations.is_empty() && r.checks.is_empty());
    }

    /// Every read of `results/` is bounded: the number of entries, and each record's size.
    #[test]
    fn results_reads_are_bounded() {
        let t = tempfile::tempdir().unwrap();
        let ws = Workspace::new(t.path());
        fs::create_dir_all(ws.results()).unwrap();
        let big = ws.results().join("a8.validation.json");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_RECORD_BYTES + 1).unwrap();
        let e = load(&ws).unwrap_err();
        assert!(
            e.to_string().contains("is too large for a record") && e.to_string().contains("a8"),
            "{e}"
        );
        fs::remove_file(&big).unwrap();
        for i in 0..MAX_RESULTS_ENTRIES {
            std::fs::File::create(ws.results().join(format!("x{i}.log"))).unwrap();
        }
        assert!(load(&ws).is_ok());
        std::fs::File::create(ws.results().join("one-more.log")).unwrap();
        let e = load(&ws).unwrap_err();
        assert!(
            matches!(&e, Error::Record { path, .. } if path == &ws.results()),
            "{e:?}"
        );
        assert!(e.to_string().contains("more than 4096 entries"), "{e}");
    }

    #[test]
    fn an_unreadable_record_names_its_path() {
        let t = tempfile::tempdir().unwrap();
        let path = Workspace::new(t.path()).preflight();
        // A directory where the record should be: refused unread, naming the file.
        fs::create_dir_all(&path).unwrap();
        let e = read::<PreflightRecord>(&path).unwrap_err();
        assert!(matches!(e, Error::Record { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains(&*path.to_string_lossy()) && text.contains("not a regular file"),
            "{text}"
        );
        // A missing one is a file error naming it.
        let missing = t.path().join("results/absent.validation.json");
        let e = read::<PreflightRecord>(&missing).unwrap_err();
        assert!(e.to_string().contains(&*missing.to_string_lossy()), "{e}");
    }

    /// A republish of bytes that went out through a passing gate is recognised from the
    /// publish records beside the manifest (the newest or the history); a skipped gate, other
    /// bytes or no record are not. For v25, v26 and v27 manifests alike.
    #[test]
    fn a_republish_of_gated_bytes_is_recognised() {
        for generation in [25, 26, 27] {
            let t = tempfile::tempdir().unwrap();
            let path = t.path().join(format!("model_names_v{generation}.json"));
            let m = manifest::Manifest::from_slice(
                format!(r#"{{"generation": "v{generation}", "models": []}}"#).as_bytes(),
            )
            .unwrap();
            let other = manifest::Manifest::from_slice(
                format!(r#"{{"generation": "v{generation}", "models": [], "x": 1}}"#).as_bytes(),
            )
            .unwrap();
            assert!(!gated_before(&path, &m), "no record");
            let record = |validation| crate::gate::PublishRecord {
                generation: manifest::Generation::new(generation),
                manifest: path.clone(),
                manifest_sha256: chunker::Sha256Digest::of_bytes(&m.to_canonical_bytes()),
                tinygrad_commit: None,
                published_at: UnixSeconds(1),
                stores: vec![],
                models: vec![],
                validation,
                github_only: None,
                signature_removed: None,
            };
            let skipped = crate::gate::GateOutcome::Skipped {
                reason: "hotfix".into(),
                workspace: None,
                gaps: vec![],
            };
            write(&publish_record_path(&path), &record(skipped)).unwrap();
            assert!(!gated_before(&path, &m), "v{generation}: a skipped gate");
            let passed = crate::gate::GateOutcome::Passed {
                workspace: t.path().into(),
                covered: vec![],
            };
            let history = path.with_file_name(format!(
                "model_names_v{generation}.publish.20261202T190455Z.json"
            ));
            write(&history, &record(passed)).unwrap();
            assert!(
                gated_before(&path, &m),
                "v{generation}: the history's passed gate"
            );
            assert!(!gated_before(&path, &other), "v{generation}: other bytes");
        }
    }
}
