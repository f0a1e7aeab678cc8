//! The rebuild workspace and every path in it, one method each (no hand joins elsewhere):
//!
//! ```text
//! <workspace>/onnx/<id>/<file>.onnx        sources fetched from <store>/onnx/<source-id>/
//! <workspace>/logs/<id>.log                the compile log of the latest attempt
//! <workspace>/logs/<id>.validate.log       the latest device validation's log
//! <workspace>/logs/preflight.log           the latest preflight's output
//! <workspace>/results/<id>.json            success record (what was built, with which pin)
//! <workspace>/results/<id>.failure.json    failure record of the latest attempt
//! <workspace>/results/<id>.upload.json     what `rebuild --upload-to` put in each store
//! <workspace>/results/preflight.json, <id>.validation.json, <check>[.<W>x<H>].check.json,
//!                    rehearsal.json        the gate's records (crate::records)
//! <workspace>/ready/<id>/<id>_driving_tinygrad.pkl.chunkNNofMM + .sha256 + .chunkmanifest
//! <workspace>/ready/<id>/<id>_driving_<variant>_tinygrad.pkl…   a rebuilt accelerator variant
//! <workspace>/ready/model_names_<gen>.json the manifest for `release-cli publish`
//! <workspace>/rehearsal/                   the last rehearsal's devices and logs
//! <workspace>/generations/<gen>/           an earlier generation's release, set aside by the
//!                                          rebuild of the next (ready/, results/, logs/,
//!                                          rehearsal/ in the layout above)
//! ```
//!
//! One generation, one workspace: the top level holds the generation being released; a
//! `rebuild` of another generation first moves the previous one's ready set, records, logs and
//! publish history to `generations/<gen>/` ([`Workspace::set_aside`]), itself a workspace of
//! the same layout, so `publish --workspace <workspace>/generations/<gen>` (what `audit`'s mend
//! prints) still repairs it. A workspace from before the rule reads as it always did.

use std::path::{Path, PathBuf};

use manifest::{Generation, ModelId, layout};
use serde::Serialize;

use crate::gate::{CameraResolution, CheckKind};

/// A rebuild workspace directory (`--workspace DIR`). Serializes as its path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Workspace(PathBuf);

impl From<PathBuf> for Workspace {
    fn from(root: PathBuf) -> Self {
        Self(root)
    }
}

impl Workspace {
    /// `--workspace DIR`: a path, as clap parses every path flag (an empty one is refused), made
    /// a workspace.
    #[cfg(feature = "cli")]
    pub fn value_parser() -> impl clap::builder::TypedValueParser<Value = Workspace> {
        use clap::builder::TypedValueParser;
        clap::builder::PathBufValueParser::new().map(Workspace::from)
    }

    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self(root.into())
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.0
    }

    pub fn display(&self) -> std::path::Display<'_> {
        self.0.display()
    }

    /// `onnx/<id>/`: the model's fetched sources.
    pub fn onnx(&self, id: &ModelId) -> PathBuf {
        self.0.join("onnx").join(id.as_str())
    }

    /// `logs/<id>.log`: the model's latest compile log.
    pub fn build_log(&self, id: &ModelId) -> PathBuf {
        self.log(&format!("{id}.log"))
    }

    /// `logs/<id>.validate.log`: the model's latest device validation log.
    pub fn validate_log(&self, id: &ModelId) -> PathBuf {
        self.log(&format!("{id}.validate.log"))
    }

    /// `logs/preflight.log`.
    pub fn preflight_log(&self) -> PathBuf {
        self.log("preflight.log")
    }

    fn log(&self, name: &str) -> PathBuf {
        self.0.join("logs").join(name)
    }

    /// `results/`: every record.
    pub fn results(&self) -> PathBuf {
        self.0.join("results")
    }

    /// `results/<id>.json`: the model's success record.
    pub fn build_record(&self, id: &ModelId) -> PathBuf {
        self.results().join(format!("{id}.json"))
    }

    /// `results/<id>.failure.json`: the model's latest failed attempt.
    pub fn failure_record(&self, id: &ModelId) -> PathBuf {
        self.results().join(format!("{id}.failure.json"))
    }

    /// `results/<id>.upload.json`: what `rebuild --upload-to` put in each store.
    pub fn upload_record(&self, id: &ModelId) -> PathBuf {
        self.results().join(format!("{id}.upload.json"))
    }

    /// `results/preflight.json`.
    pub fn preflight(&self) -> PathBuf {
        self.results().join("preflight.json")
    }

    /// `results/<id>.validation.json`.
    pub fn validation(&self, id: &ModelId) -> PathBuf {
        self.results()
            .join(format!("{id}{}", crate::records::VALIDATION_SUFFIX))
    }

    /// `results/<check>.json` or, per camera resolution, `results/<check>.<W>x<H>.check.json`.
    pub fn check(&self, kind: CheckKind, res: Option<CameraResolution>) -> PathBuf {
        let suffix = crate::records::CHECK_SUFFIX;
        self.results().join(match res {
            Some(r) => format!("{kind}.{r}{suffix}"),
            None => format!("{kind}{suffix}"),
        })
    }

    /// `results/rehearsal.json`: the last `release-cli rehearse`.
    pub fn rehearsal_record(&self) -> PathBuf {
        self.results().join("rehearsal.json")
    }

    /// `ready/`: what `release-cli publish --artifacts` takes.
    pub fn ready(&self) -> PathBuf {
        self.0.join("ready")
    }

    /// `ready/<id>/`: the model's chunk set(s).
    pub fn ready_model(&self, id: &ModelId) -> PathBuf {
        self.ready().join(id.as_str())
    }

    /// `ready/<id>/<id>_driving_tinygrad.pkl`: the model's logical artifact.
    pub fn ready_artifact(&self, id: &ModelId) -> PathBuf {
        self.ready_model(id)
            .join(layout::artifact_file_name(id).as_str())
    }

    /// `ready/model_names_<gen>.json`.
    pub fn ready_manifest(&self, generation: Generation) -> PathBuf {
        self.ready()
            .join(layout::manifest_file_name(generation).as_str())
    }

    /// `rehearsal/`: the last rehearsal's devices and logs (replaced by each rehearsal).
    pub fn rehearsal_dir(&self) -> PathBuf {
        self.0.join("rehearsal")
    }

    /// `generations/<gen>/`: `generation`'s release once set aside, a workspace of its own.
    pub fn generation_dir(&self, generation: Generation) -> Workspace {
        Workspace(self.0.join("generations").join(generation.to_string()))
    }

    /// The workspace that holds `generation`'s staged release: this one when its `ready/` has
    /// `model_names_<gen>.json`, else `generations/<gen>/` when that has it, else this one.
    pub fn holding(&self, generation: Generation) -> Workspace {
        let aside = self.generation_dir(generation);
        if self.ready_manifest(generation).symlink_metadata().is_err()
            && aside.ready_manifest(generation).symlink_metadata().is_ok()
        {
            aside
        } else {
            self.clone()
        }
    }

    /// The generations whose staged manifest `ready/` holds (`ready/model_names_<gen>.json`).
    pub fn staged_generations(&self) -> crate::Result<Vec<Generation>> {
        let mut out = Vec::new();
        let Ok(entries) = fs_err::read_dir(self.ready()) else {
            return Ok(out);
        };
        for e in entries.take(crate::records::MAX_RESULTS_ENTRIES) {
            let name = e?.file_name().to_string_lossy().into_owned();
            let g = name
                .strip_prefix("model_names_")
                .and_then(|r| r.strip_suffix(".json"))
                .and_then(|g| g.parse::<Generation>().ok());
            if let Some(g) = g {
                out.push(g);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Before a rebuild of `building`: when `ready/` holds another generation's staged manifest
    /// and not `building`'s, move `ready/`, `results/`, `logs/` and `rehearsal/` (the newest such
    /// generation's release, with its publish records) to `generations/<gen>/`, each by one
    /// rename, so that generation stays publishable as it was. Returns where it went. A part
    /// already there is refused, nothing moved; a move interrupted half way resumes on the next
    /// run (the manifest is moved last, so `ready/` still says which generation it is).
    pub fn set_aside(
        &self,
        building: Generation,
    ) -> crate::Result<Option<(Generation, Workspace)>> {
        let staged = self.staged_generations()?;
        if staged.contains(&building) {
            return Ok(None);
        }
        let Some(&g) = staged.iter().max() else {
            return Ok(None);
        };
        let dest = self.generation_dir(g);
        let parts = ["results", "logs", "rehearsal", "ready"];
        for part in parts {
            if self.0.join(part).symlink_metadata().is_ok()
                && dest.0.join(part).symlink_metadata().is_ok()
            {
                return Err(crate::Error::SetAsideTaken {
                    generation: g,
                    from: self.0.join(part),
                    to: dest.0.join(part),
                });
            }
        }
        fs_err::create_dir_all(&dest.0)?;
        for part in parts {
            let from = self.0.join(part);
            if from.symlink_metadata().is_ok() {
                fs_err::rename(&from, dest.0.join(part))?;
            }
        }
        for dir in [&dest.0, &self.0] {
            chunker::atomic::sync_dir(dir)?;
        }
        Ok(Some((g, dest)))
    }

    /// The directories a rebuild run creates.
    pub fn rebuild_dirs(&self) -> [PathBuf; 4] {
        ["onnx", "logs", "results", "ready"].map(|d| self.0.join(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path, for v25 and a made-up v26: the layout docs/release.md describes.
    #[test]
    fn every_path_is_under_the_workspace_as_documented() {
        let ws = Workspace::new("/w");
        let id: ModelId = "sc23".parse().unwrap();
        let res: CameraResolution = crate::gate::CAMERA_RESOLUTIONS[0];
        let cases: Vec<(PathBuf, String)> = vec![
            (ws.onnx(&id), "/w/onnx/sc23".into()),
            (ws.build_log(&id), "/w/logs/sc23.log".into()),
            (ws.validate_log(&id), "/w/logs/sc23.validate.log".into()),
            (ws.preflight_log(), "/w/logs/preflight.log".into()),
            (ws.results(), "/w/results".into()),
            (ws.build_record(&id), "/w/results/sc23.json".into()),
            (
                ws.failure_record(&id),
                "/w/results/sc23.failure.json".into(),
            ),
            (ws.preflight(), "/w/results/preflight.json".into()),
            (ws.validation(&id), "/w/results/sc23.validation.json".into()),
            (
                ws.check(CheckKind::ModelV2, None),
                "/w/results/model-v2.check.json".into(),
            ),
            (
                ws.check(CheckKind::DriverState, Some(res)),
                format!("/w/results/driver-state.{res}.check.json"),
            ),
            (ws.rehearsal_record(), "/w/results/rehearsal.json".into()),
            (ws.ready(), "/w/ready".into()),
            (ws.ready_model(&id), "/w/ready/sc23".into()),
            (
                ws.ready_artifact(&id),
                "/w/ready/sc23/sc23_driving_tinygrad.pkl".into(),
            ),
            (
                ws.ready_manifest(Generation::new(25)),
                "/w/ready/model_names_v25.json".into(),
            ),
            (
                ws.ready_manifest(Generation::new(26)),
                "/w/ready/model_names_v26.json".into(),
            ),
            (ws.rehearsal_dir(), "/w/rehearsal".into()),
        ];
        for (got, want) in cases {
            assert_eq!(got, PathBuf::from(&want));
        }
        assert_eq!(
            serde_json::to_string(&ws).unwrap(),
            serde_json::to_string(Path::new("/w")).unwrap()
        );
    }
}
