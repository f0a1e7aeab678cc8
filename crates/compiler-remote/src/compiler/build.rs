//! Building on the comma: `compile` (one model), `build_dm` (the four DM files) and `validate`
//! (the device-side validator), each with its output streamed live and saved to a log.

use std::path::Path;

use fs_err::{self as fs, File};
use manifest::GitCommit;

use super::checks::{check_sources, release_set_to_validate};
use super::session::status_text;
use super::{Compiler, DEVICE_PREFIX, DmFile, LineSink, Verdict};
use crate::error::{Error, Result};
use crate::job::{CompileJob, DmJob, Plan, ValidateJob};
use crate::outputs::{self, FetchedArtifact, OutputProblem};
use crate::plan;

impl Compiler {
    /// Compile one model: marker check, clean staging, stage exactly the job's sources, run
    /// `./models` with its output streamed to `sink` and saved to the log, fetch and verify the
    /// outputs into the job's `out`, clean the remote directories.
    pub fn compile(
        &self,
        job: &CompileJob,
        pin: &GitCommit,
        sink: LineSink<'_>,
    ) -> Result<FetchedArtifact> {
        let mut exec = self.execute(job.plan(&self.opts, pin)?);
        // Refuse on a wrong tinygrad before anything on the device changes.
        exec.check_marker()?;
        check_sources(&job.sources)?;
        let mut log_file = create_log(&job.log)?;
        exec.run()?;
        let result = (|| {
            let (req, out, log) = (&job.request, &job.out, &job.log);
            let model = req.build_id().to_string();
            let name = req.artifact_name();
            exec.send(&format!("of the sources of {model}"))?;
            let status = exec.stream(&mut log_file, sink)?;
            if !status.success() {
                return Err(Error::CompileFailed {
                    model,
                    status: status_text(&status),
                    log: log.to_path_buf(),
                });
            }
            fs::create_dir_all(out)?;
            let fetch = exec.fetch(&format!("of the outputs of {model}"))?;
            let checked = if req.local {
                outputs::check_local(fetch.path(), &name)?
            } else {
                outputs::check_release(fetch.path(), &name)?
            };
            let (log, remote_out) = (log.to_path_buf(), self.root_join(plan::OUTPUT_DIR)?);
            let artifact = checked.map_err(|problem| match problem {
                OutputProblem::Missing => Error::MissingOutputs {
                    expected: if req.local {
                        name.clone()
                    } else {
                        format!("{name}.chunk*")
                    },
                    remote_dir: format!("{}:{remote_out}", self.dest()),
                    model,
                    log,
                },
                OutputProblem::Invalid(detail) => Error::InvalidOutputs { model, detail, log },
                OutputProblem::Digest { expected, actual } => Error::DigestMismatch {
                    model,
                    expected,
                    actual,
                    log,
                },
            })?;
            fetch.install(out, &name, &artifact.files)?;
            Ok(artifact)
        })();
        // Clean up whatever happened; a cleanup failure must not hide the build's own error.
        let cleanup = exec.cleanup();
        let artifact = result?;
        cleanup?;
        Ok(artifact)
    }

    /// Build the DM set: stage the job's sources, run `./models --dm`, fetch the four files
    /// into its `out`. Nothing is written to `out` unless all four came back.
    pub fn build_dm(
        &self,
        job: &DmJob,
        pin: &GitCommit,
        sink: LineSink<'_>,
    ) -> Result<Vec<DmFile>> {
        let (out, log) = (&job.out, &job.log);
        let mut exec = self.execute(job.plan(&self.opts, pin)?);
        exec.check_marker()?;
        check_sources(&job.sources)?;
        exec.run()?;
        let mut log_file = create_log(log)?;
        let result = (|| {
            exec.send("of the DM sources")?;
            let status = exec.stream(&mut log_file, sink)?;
            if !status.success() {
                return Err(Error::CompileFailed {
                    model: "dm".to_string(),
                    status: status_text(&status),
                    log: log.to_path_buf(),
                });
            }
            fs::create_dir_all(out)?;
            let fetch = exec.fetch("of the DM outputs")?;
            let missing = outputs::missing_dm_files(fetch.path());
            if !missing.is_empty() {
                return Err(Error::DmIncomplete {
                    missing,
                    out: out.to_path_buf(),
                    log: log.to_path_buf(),
                });
            }
            let mut files = Vec::new();
            for f in plan::DM_FILES {
                let (sha256, size) = chunker::Sha256Digest::of_file(&fetch.path().join(f))?;
                files.push(DmFile {
                    name: f.to_string(),
                    size,
                    sha256,
                });
            }
            let names: Vec<String> = plan::DM_FILES.iter().map(|s| s.to_string()).collect();
            fetch.install_files(out, &names)?;
            Ok(files)
        })();
        let cleanup = exec.cleanup();
        let files = result?;
        cleanup?;
        Ok(files)
    }

    /// Run the device-side validator on the compiler for the job's chunk set (a logical path
    /// whose chunk files sit beside it) and return its JSON verdict, never one of ours.
    pub fn validate(
        &self,
        job: &ValidateJob,
        pin: &GitCommit,
        sink: LineSink<'_>,
    ) -> Result<Verdict> {
        let (id, log) = (&job.id, &job.log);
        let mut exec = self.execute(Plan::checking_marker(&self.opts, pin)?);
        exec.check_marker()?;
        let set = release_set_to_validate(job)?;
        exec.continue_with(job.plan(&self.opts, pin, &set)?);
        exec.run()?;
        exec.send(&format!("of {} to {}", set.name, job.models_dir))?;

        let mut log_file = create_log(log)?;
        let mut last = String::new();
        let status = {
            // The verdict is the last line on stdout; stderr is kept apart so a warning printed
            // after the verdict cannot hide it.
            let mut tee = |line: &str| {
                if let Some(text) = line.strip_prefix(DEVICE_PREFIX)
                    && !text.trim().is_empty()
                {
                    last = text.trim().to_string();
                }
                sink(line);
            };
            exec.stream(&mut log_file, &mut tee)
        };
        let cleanup = exec.cleanup();
        let status = status?;
        cleanup?;
        let refused = |detail| Error::Validator {
            model: id.to_string(),
            detail,
            log: log.to_path_buf(),
        };
        if !status.success() {
            let status = status_text(&status);
            return Err(refused(format!("the validator exited with {status}")));
        }
        let verdict: serde_json::Value = serde_json::from_str(&last).map_err(|e| {
            refused(format!(
                "its last output line is not a JSON verdict ({e}): {last:?}"
            ))
        })?;
        let passed = verdict
            .get("passed")
            .and_then(|v| v.as_bool())
            .ok_or_else(|| refused(format!("the verdict has no boolean \"passed\": {last}")))?;
        Ok(Verdict {
            passed,
            verdict,
            artifact_sha256: set.sha256,
        })
    }
}

pub(crate) fn create_log(log: &Path) -> Result<File> {
    if let Some(dir) = log.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    Ok(File::create(log)?)
}
