//! Building on the comma: `compile` (one model), `build_dm` (the four DM files) and `validate`
//! (the device-side validator), each with its output streamed live and saved to a log.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use fs_err::{self as fs, File};
use manifest::{BehaviorVersion, GitCommit, ModelId};

use super::checks::{check_sources, release_set_to_validate};
use super::fetch::FetchDir;
use super::session::status_text;
use super::{Compiler, DEVICE_PREFIX, DmFile, LineSink, Verdict};
use crate::error::{Error, Result};
use crate::outputs::{self, FetchedArtifact, OutputProblem};
use crate::plan::{self, CompileRequest};
use crate::target::RemotePath;

impl Compiler {
    /// Compile one model: marker check, clean staging, stage exactly `sources`, run `./models`
    /// with its output streamed to `sink` and saved to `log`, fetch and verify the outputs into
    /// `out`, clean the remote directories.
    pub fn compile(
        &self,
        req: &CompileRequest,
        sources: &[PathBuf],
        pin: &GitCommit,
        out: &Path,
        log: &Path,
        sink: LineSink<'_>,
    ) -> Result<FetchedArtifact> {
        // Refuse on a wrong tinygrad before anything on the device changes.
        self.check_marker(pin)?;
        check_sources(sources)?;
        let staging = self.root_join(plan::STAGING_DIR)?;
        let remote_out = self.root_join(plan::OUTPUT_DIR)?;
        let name = req.artifact_name();

        let mut log_file = create_log(log)?;
        self.run_checked(&plan::prepare_command(&staging, &remote_out, &name))?;
        let result = self.compile_staged(
            req,
            sources,
            &staging,
            &remote_out,
            &name,
            out,
            log,
            &mut log_file,
            sink,
        );
        // Clean up whatever happened; a cleanup failure must not hide the build's own error.
        let cleanup = self.run_checked(&plan::cleanup_command(&staging, &remote_out, &name));
        let artifact = result?;
        cleanup?;
        Ok(artifact)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn compile_staged(
        &self,
        req: &CompileRequest,
        sources: &[PathBuf],
        staging: &RemotePath,
        remote_out: &RemotePath,
        name: &str,
        out: &Path,
        log: &Path,
        log_file: &mut File,
        sink: LineSink<'_>,
    ) -> Result<FetchedArtifact> {
        let model = req.build_id().to_string();
        let mut args = os_args(&plan::SEND_OPTIONS);
        args.extend(sources.iter().map(|s| s.clone().into_os_string()));
        args.push(self.remote_arg(staging, true));
        self.rsync(&format!("of the sources of {model}"), args)?;

        let command = plan::run_models_command(
            &self.opts.remote_root,
            &req.models_args(staging, remote_out),
        );
        writeln!(log_file, "# {} on {}", command, self.dest())?;
        let status = self.run_streaming(&command, log_file, sink)?;
        if !status.success() {
            return Err(Error::CompileFailed {
                model,
                status: status_text(&status),
                log: log.to_path_buf(),
            });
        }

        fs::create_dir_all(out)?;
        let fetch = FetchDir::new(out, name)?;
        let mut args = os_args(&plan::fetch_options(name));
        args.push(self.remote_arg(remote_out, true));
        args.push(fetch.path().into());
        self.rsync(&format!("of the outputs of {model}"), args)?;
        let checked = if req.local {
            outputs::check_local(fetch.path(), name)?
        } else {
            outputs::check_release(fetch.path(), name)?
        };
        let artifact = match checked {
            Ok(a) => a,
            Err(OutputProblem::Missing) => {
                return Err(Error::MissingOutputs {
                    model,
                    expected: if req.local {
                        name.to_string()
                    } else {
                        format!("{name}.chunk*")
                    },
                    remote_dir: format!("{}:{remote_out}", self.dest()),
                    log: log.to_path_buf(),
                });
            }
            Err(OutputProblem::Invalid(detail)) => {
                return Err(Error::InvalidOutputs {
                    model,
                    detail,
                    log: log.to_path_buf(),
                });
            }
            Err(OutputProblem::Digest { expected, actual }) => {
                return Err(Error::DigestMismatch {
                    model,
                    expected,
                    actual,
                    log: log.to_path_buf(),
                });
            }
        };
        fetch.install(out, name, &artifact.files)?;
        Ok(artifact)
    }

    /// Build the DM set: stage `sources`, run `./models --dm`, fetch the four files into `out`.
    /// Nothing is written to `out` unless all four came back.
    pub fn build_dm(
        &self,
        sources: &[PathBuf],
        pin: &GitCommit,
        remote_dm_out: &RemotePath,
        out: &Path,
        log: &Path,
        sink: LineSink<'_>,
    ) -> Result<Vec<DmFile>> {
        self.check_marker(pin)?;
        check_sources(sources)?;
        let staging = self.root_join(plan::STAGING_DIR)?;
        let cleanup_command = plan::dm_cleanup_command(&staging, remote_dm_out)?;
        self.run_checked(&plan::dm_prepare_command(&staging, remote_dm_out)?)?;
        let mut log_file = create_log(log)?;
        let result = (|| {
            let mut args = os_args(&plan::SEND_OPTIONS);
            args.extend(sources.iter().map(|s| s.clone().into_os_string()));
            args.push(self.remote_arg(&staging, true));
            self.rsync("of the DM sources", args)?;
            let command = plan::run_models_command(
                &self.opts.remote_root,
                &plan::dm_args(&staging, remote_dm_out),
            );
            writeln!(log_file, "# {} on {}", command, self.dest())?;
            let status = self.run_streaming(&command, &mut log_file, sink)?;
            if !status.success() {
                return Err(Error::CompileFailed {
                    model: "dm".to_string(),
                    status: status_text(&status),
                    log: log.to_path_buf(),
                });
            }
            fs::create_dir_all(out)?;
            let fetch = FetchDir::new(out, "dm")?;
            let mut args = os_args(&plan::dm_fetch_options());
            args.push(self.remote_arg(remote_dm_out, true));
            args.push(fetch.path().into());
            self.rsync("of the DM outputs", args)?;
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
        let cleanup = self.run_checked(&cleanup_command);
        let files = result?;
        cleanup?;
        Ok(files)
    }

    /// Run the device-side validator on the compiler for the chunk set at `artifact` (a logical
    /// path whose chunk files sit beside it) and return its JSON verdict, never one of ours.
    #[allow(clippy::too_many_arguments)]
    pub fn validate(
        &self,
        id: &ModelId,
        version: BehaviorVersion,
        artifact: &Path,
        pin: &GitCommit,
        models_dir: &RemotePath,
        python: &str,
        log: &Path,
        sink: LineSink<'_>,
    ) -> Result<Verdict> {
        self.check_marker(pin)?;
        let (dir, name, set) = release_set_to_validate(id, artifact, log)?;
        let (files, artifact_sha256) = (set.files, set.sha256);
        self.run_checked(&plan::validate_prepare_command(models_dir, &name))?;
        let mut args = os_args(&plan::SEND_OPTIONS);
        args.extend(files.iter().map(|f| dir.join(f).into_os_string()));
        args.push(self.remote_arg(models_dir, true));
        self.rsync(&format!("of {name} to {models_dir}"), args)?;

        let mut log_file = create_log(log)?;
        let command = plan::validate_command(&self.opts.remote_root, python, id, version);
        writeln!(log_file, "# {} on {}", command, self.dest())?;
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
            self.run_streaming(&command, &mut log_file, &mut tee)
        };
        let cleanup = self.run_checked(&plan::validate_cleanup_command(models_dir, &name));
        let status = status?;
        cleanup?;
        if !status.success() {
            return Err(Error::Validator {
                model: id.to_string(),
                detail: format!("the validator exited with {}", status_text(&status)),
                log: log.to_path_buf(),
            });
        }
        let verdict: serde_json::Value =
            serde_json::from_str(&last).map_err(|e| Error::Validator {
                model: id.to_string(),
                detail: format!("its last output line is not a JSON verdict ({e}): {last:?}"),
                log: log.to_path_buf(),
            })?;
        let passed = verdict
            .get("passed")
            .and_then(|v| v.as_bool())
            .ok_or_else(|| Error::Validator {
                model: id.to_string(),
                detail: format!("the verdict has no boolean \"passed\": {last}"),
                log: log.to_path_buf(),
            })?;
        Ok(Verdict {
            passed,
            verdict,
            artifact_sha256,
        })
    }
}

pub(crate) fn create_log(log: &Path) -> Result<File> {
    if let Some(dir) = log.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    Ok(File::create(log)?)
}

/// rsync options as arguments.
fn os_args<S: AsRef<str>>(options: &[S]) -> Vec<OsString> {
    options.iter().map(|o| OsString::from(o.as_ref())).collect()
}
