//! `uses_external_gpu` against the build records (docs/release.md, "The release gates"): a
//! model's flag in the manifest publish is given must be what its artifact was built for. A
//! QCOM build published as `uses_external_gpu: true` would make every device without Chestnut
//! skip it, and a Chestnut build published as `false` would be loaded on the comma's own GPU.
//!
//! A record speaks for an entry when it names the same model and the same artifact (its
//! SHA-256): the record of an older build, or none (an artifact adopted with `reuse`), decides
//! nothing. [`gpu_flag_mismatches`] is the pure rule; [`check_gpu_flags`] reads the records of a
//! rebuild workspace.

use std::path::{Path, PathBuf};

use fs_err as fs;
use manifest::{Manifest, ModelId};

use crate::rebuild::BuildRecord;
use crate::{Error, Result, Workspace};

/// Records are small JSON files; anything larger is not one.
const MAX_RECORD_BYTES: u64 = 1 << 20;

/// One model whose manifest flag is not what its build record says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "model {id}: the manifest says uses_external_gpu: {manifest}, but {} records {} of this artifact",
    record_path.display(),
    if *record { "a Chestnut (--gpu) build" } else { "a QCOM build" }
)]
pub struct GpuFlagMismatch {
    pub id: ModelId,
    /// `uses_external_gpu` in the manifest (absent reads as `false`).
    pub manifest: bool,
    /// `uses_external_gpu` of the build (`./models --gpu`).
    pub record: bool,
    pub record_path: PathBuf,
}

/// Every non-local entry of `manifest` whose `uses_external_gpu` differs from the record (path,
/// record) built its artifact: same model ID and same `artifact_sha256`. Pure.
pub fn gpu_flag_mismatches(
    manifest: &Manifest,
    records: &[(PathBuf, BuildRecord)],
) -> Vec<GpuFlagMismatch> {
    let mut out = Vec::new();
    for entry in manifest.models().iter().filter(|e| !e.id().is_local()) {
        let Some(sha) = entry.artifact_sha256() else {
            continue;
        };
        let built = records
            .iter()
            .find(|(_, r)| &r.id == entry.id() && r.artifact.sha256 == sha);
        if let Some((path, r)) = built
            && r.uses_external_gpu != entry.uses_external_gpu()
        {
            out.push(GpuFlagMismatch {
                id: entry.id().clone(),
                manifest: entry.uses_external_gpu(),
                record: r.uses_external_gpu,
                record_path: path.clone(),
            });
        }
    }
    out
}

/// [`gpu_flag_mismatches`] over the success records `workspace/results/<id>.json` of the
/// manifest's models; returns how many models a record spoke for. A record that is not a
/// regular file, is too large or does not parse as a success record speaks for nothing.
pub fn check_gpu_flags(manifest: &Manifest, workspace: &Workspace) -> Result<usize> {
    let mut records = Vec::new();
    for id in manifest.ids() {
        let path = workspace.build_record(id);
        if let Some(r) = read_record(&path)? {
            records.push((path, r));
        }
    }
    let mismatches = gpu_flag_mismatches(manifest, &records);
    if !mismatches.is_empty() {
        return Err(Error::GpuFlag {
            mismatches: mismatches.iter().map(ToString::to_string).collect(),
        });
    }
    Ok(manifest
        .models()
        .iter()
        .filter(|e| {
            records
                .iter()
                .any(|(_, r)| &r.id == e.id() && Some(r.artifact.sha256) == e.artifact_sha256())
        })
        .count())
}

fn read_record(path: &Path) -> Result<Option<BuildRecord>> {
    // Only a regular file, not a link to one, can speak for an entry.
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Ok(None);
    }
    let bytes = match chunker::bounded::read_capped(path, MAX_RECORD_BYTES) {
        Ok(Some(bytes)) => bytes,
        Ok(None)
        | Err(chunker::Error::FileTooLarge { .. } | chunker::Error::NotRegularFile { .. }) => {
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    Ok(serde_json::from_slice::<BuildRecord>(&bytes)
        .ok()
        .filter(|r| r.status == "compiled"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rebuild::RecordedArtifact;
    use compiler_remote::InputFormat;
    use manifest::{Generation, GitCommit, PinTable};

    fn record(id: &str, gpu: bool, sha: u8, g: Generation, pin: &GitCommit) -> BuildRecord {
        BuildRecord {
            id: id.parse().unwrap(),
            status: "compiled".into(),
            generation: g,
            tinygrad_commit: pin.clone(),
            version: "v16".parse().unwrap(),
            source_id: id.parse().unwrap(),
            input_format: InputFormat::Supercombo,
            uses_external_gpu: gpu,
            source_commit: None,
            sources: vec![],
            artifact: RecordedArtifact {
                name: format!("{id}_driving_tinygrad.pkl"),
                size: 10,
                sha256: format!("{sha:02x}").repeat(32).parse().unwrap(),
                chunk_count: 1,
                files: vec![],
                chunk_sha256: vec![],
            },
            variants: vec![],
            log: "l".into(),
        }
    }

    /// (id, uses_external_gpu in the manifest: None = absent, sha byte)
    fn manifest(g: Generation, pin: &GitCommit, models: &[(&str, Option<bool>, u8)]) -> Manifest {
        let entries: Vec<serde_json::Value> = models
            .iter()
            .map(|(id, gpu, sha)| {
                let mut e = serde_json::json!({
                    "id": id, "name": id, "version": "v16", "series": "S",
                    "released": "2025-01-01", "community_favorite": false,
                    "artifact_format": "tinygrad_single_v1", "artifact_size": 10,
                    "artifact_sha256": format!("{sha:02x}").repeat(32), "artifact_chunk_count": 1
                });
                if let Some(gpu) = gpu {
                    e["uses_external_gpu"] = serde_json::json!(gpu);
                }
                e
            })
            .collect();
        Manifest::from_value(serde_json::json!({
            "generation": g.to_string(), "tinygrad_commit": pin.to_string(), "models": entries
        }))
        .unwrap()
    }

    #[test]
    fn the_gpu_flag_rule() {
        let v25 = Generation::new(25);
        let v26 = Generation::new(26);
        let pin25 = PinTable::builtin().get(v25).unwrap().clone();
        let pin26: GitCommit = "26a0c0ffee26a0c0ffee26a0c0ffee26a0c0ffee".parse().unwrap();
        for (g, pin) in [(v25, pin25), (v26, pin26)] {
            let recs = |list: &[(&str, bool, u8)]| -> Vec<(PathBuf, BuildRecord)> {
                list.iter()
                    .map(|(id, gpu, sha)| {
                        (
                            PathBuf::from(format!("ws/results/{id}.json")),
                            record(id, *gpu, *sha, g, &pin),
                        )
                    })
                    .collect()
            };
            // (case, manifest models, records, mismatching ids)
            type Case<'a> = (
                &'a str,
                Vec<(&'a str, Option<bool>, u8)>,
                Vec<(&'a str, bool, u8)>,
                Vec<&'a str>,
            );
            let cases: Vec<Case> = vec![
                (
                    "QCOM build, false",
                    vec![("pop", Some(false), 1)],
                    vec![("pop", false, 1)],
                    vec![],
                ),
                (
                    "QCOM build, absent",
                    vec![("pop", None, 1)],
                    vec![("pop", false, 1)],
                    vec![],
                ),
                (
                    "GPU build, true",
                    vec![("bm", Some(true), 2)],
                    vec![("bm", true, 2)],
                    vec![],
                ),
                (
                    "QCOM build published as true",
                    vec![("pop", Some(true), 1)],
                    vec![("pop", false, 1)],
                    vec!["pop"],
                ),
                (
                    "GPU build published as false",
                    vec![("bm", Some(false), 2)],
                    vec![("bm", true, 2)],
                    vec!["bm"],
                ),
                (
                    "GPU build published with the flag absent",
                    vec![("bm", None, 2)],
                    vec![("bm", true, 2)],
                    vec!["bm"],
                ),
                (
                    "record of another artifact decides nothing",
                    vec![("pop", Some(true), 1)],
                    vec![("pop", false, 9)],
                    vec![],
                ),
                (
                    "no record (reused) decides nothing",
                    vec![("pop", Some(true), 1)],
                    vec![],
                    vec![],
                ),
                (
                    "every model is compared",
                    vec![
                        ("pop", Some(true), 1),
                        ("bm", Some(false), 2),
                        ("ok", Some(false), 3),
                    ],
                    vec![("pop", false, 1), ("bm", true, 2), ("ok", false, 3)],
                    vec!["pop", "bm"],
                ),
            ];
            for (name, models, records, want) in cases {
                let m = manifest(g, &pin, &models);
                let got: Vec<String> = gpu_flag_mismatches(&m, &recs(&records))
                    .iter()
                    .map(|x| x.id.to_string())
                    .collect();
                assert_eq!(got, want, "{g} {name}");
            }
        }
    }

    #[test]
    fn the_workspace_check_names_the_record_and_the_next_step() {
        let t = tempfile::tempdir().unwrap();
        let g = Generation::new(26);
        let pin: GitCommit = "26a0c0ffee26a0c0ffee26a0c0ffee26a0c0ffee".parse().unwrap();
        let results = t.path().join("results");
        fs::create_dir_all(&results).unwrap();
        let write = |r: &BuildRecord| {
            fs::write(
                results.join(format!("{}.json", r.id)),
                serde_json::to_vec(r).unwrap(),
            )
            .unwrap()
        };
        write(&record("pop", false, 1, g, &pin));
        write(&record("bm", true, 2, g, &pin));
        // A directory where a record would be, and an oversized file, speak for nothing.
        fs::create_dir_all(results.join("dir.json")).unwrap();
        fs::write(
            results.join("big.json"),
            vec![b' '; (MAX_RECORD_BYTES + 1) as usize],
        )
        .unwrap();
        let ok = manifest(
            g,
            &pin,
            &[
                ("pop", Some(false), 1),
                ("bm", Some(true), 2),
                ("dir", None, 3),
                ("big", None, 4),
            ],
        );
        assert_eq!(check_gpu_flags(&ok, &Workspace::new(t.path())).unwrap(), 2);
        let bad = manifest(g, &pin, &[("pop", Some(true), 1), ("bm", Some(true), 2)]);
        let e = check_gpu_flags(&bad, &Workspace::new(t.path())).unwrap_err();
        let text = e.to_string();
        let next = cli_support::NextStep::next_step(&e).unwrap_or_default();
        assert!(
            text.contains("model pop: the manifest says uses_external_gpu: true, but")
                && text.contains("records a QCOM build of this artifact")
                && next.starts_with("set uses_external_gpu to what was built"),
            "{text}\nnext: {next}"
        );
    }
}
