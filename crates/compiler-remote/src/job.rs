//! Each operation on the compiler as data: its typed request, and its plan (the commands the
//! comma runs, the files sent and fetched, the local files written), built by one builder per
//! operation. The real run ([`crate::Compiler`]) executes a plan step by step, exactly as built;
//! the dry run ([`crate::dry_run`]) renders it.

use std::path::{Path, PathBuf};

use manifest::{BehaviorVersion, GitCommit, ModelId};
use serde::Serialize;

use crate::error::Result;
use crate::outputs::FetchedArtifact;
use crate::plan::{self, CompileRequest};
use crate::target::{ConnectOptions, RemotePath};

/// One thing a run does on the compiler, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// Read the compiler's tinygrad marker; anything but `expected` refuses the run.
    CheckMarker { path: String, expected: String },
    /// A command line run on the compiler.
    Run { command: String },
    /// An rsync transfer from this machine to the compiler.
    Send {
        from: Vec<PathBuf>,
        to: String,
        options: Vec<String>,
    },
    /// An rsync transfer from the compiler to this machine (into a private directory first;
    /// moved into place only once checked).
    Fetch {
        from: String,
        to: PathBuf,
        options: Vec<String>,
    },
}

/// What a run does: its steps on the compiler and the local files it writes or removes.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub destination: String,
    pub remote_root: String,
    /// The pin the compiler's marker must equal.
    pub tinygrad_commit: GitCommit,
    pub steps: Vec<Step>,
    /// Local files that would be written (created or replaced). A name ending in `*` stands for
    /// files whose number only the build decides (`NAME.chunk*`).
    pub writes: Vec<PathBuf>,
    /// Local files that exist now and would be removed (an earlier set of the same artifact);
    /// listed by a dry run only.
    pub removes: Vec<PathBuf>,
}

/// One model to compile: what to build, exactly which sources to stage, where the verified
/// artifact goes and the log of the device's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileJob {
    pub request: CompileRequest,
    pub sources: Vec<PathBuf>,
    pub out: PathBuf,
    pub log: PathBuf,
}

/// The driver-monitoring build: its sources, where `./models --dm` writes on the compiler, where
/// the four files go and the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmJob {
    pub sources: Vec<PathBuf>,
    pub remote_out: RemotePath,
    pub out: PathBuf,
    pub log: PathBuf,
}

/// One run of the device-side validator: the model and version it checks, the chunk set's
/// logical path (its files sit beside it), the models directory and Python on the compiler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidateJob {
    pub id: ModelId,
    pub version: BehaviorVersion,
    pub artifact: PathBuf,
    pub models_dir: RemotePath,
    pub python: String,
    pub log: PathBuf,
    /// The p95 latency bound the validator is given (`None`: the contract has none).
    pub latency_bound: Option<plan::LatencyBound>,
}

impl Plan {
    fn new(opts: &ConnectOptions, pin: &GitCommit) -> Plan {
        Plan {
            destination: opts.destination.to_string(),
            remote_root: opts.remote_root.to_string(),
            tinygrad_commit: pin.clone(),
            steps: Vec::new(),
            writes: Vec::new(),
            removes: Vec::new(),
        }
    }

    /// A plan whose first step checks the marker: a build refuses a wrong tinygrad before
    /// anything on the device changes.
    pub(crate) fn checking_marker(opts: &ConnectOptions, pin: &GitCommit) -> Result<Plan> {
        let mut p = Plan::new(opts, pin);
        p.check_marker(opts)?;
        Ok(p)
    }

    fn remote(&self, path: &RemotePath, trailing_slash: bool) -> String {
        let slash = if trailing_slash { "/" } else { "" };
        format!("{}:{path}{slash}", self.destination)
    }

    fn check_marker(&mut self, opts: &ConnectOptions) -> Result<()> {
        self.steps.push(Step::CheckMarker {
            path: opts.remote_root.join(opts.pin_location.rel())?.to_string(),
            expected: self.tinygrad_commit.to_string(),
        });
        Ok(())
    }

    fn run(&mut self, command: String) {
        self.steps.push(Step::Run { command });
    }

    /// Send `from` into the directory `to` with [`plan::SEND_OPTIONS`].
    fn send_into(&mut self, from: Vec<PathBuf>, to: &RemotePath) {
        self.steps.push(Step::Send {
            from,
            to: self.remote(to, true),
            options: plan::SEND_OPTIONS.iter().map(|o| o.to_string()).collect(),
        });
    }

    fn fetch(&mut self, from: &RemotePath, to: PathBuf, options: Vec<String>) {
        self.steps.push(Step::Fetch {
            from: self.remote(from, true),
            to,
            options,
        });
    }
}

/// The private directory in `out` that the outputs of `name` are fetched into.
fn fetch_dir(out: &Path, name: &str) -> PathBuf {
    out.join(format!("{}fetch-{name}", chunker::atomic::TEMP_PREFIX))
}

/// `sync`: its `mkdir`, its transfers (the tree's [`crate::plan::PinLocation::sync_parts`]), the
/// marker check, and the sync record.
pub(crate) fn sync_plan(opts: &ConnectOptions, openpilot: &Path, pin: &GitCommit) -> Result<Plan> {
    let root = &opts.remote_root;
    let mut p = Plan::new(opts, pin);
    let parts = crate::pin_location(openpilot).sync_parts();
    p.run(plan::sync_mkdir_command(root, &parts)?);
    for part in parts {
        let slash = if part.is_dir { "/" } else { "" };
        let mut from = openpilot.join(part.rel).into_os_string();
        from.push(slash);
        let to = p.remote(&root.join(part.rel)?, part.is_dir);
        p.steps.push(Step::Send {
            from: vec![from.into()],
            to,
            options: part.options.iter().map(|o| o.to_string()).collect(),
        });
    }
    p.check_marker(opts)?;
    p.writes.push(crate::synced::record_path(openpilot));
    Ok(p)
}

impl CompileJob {
    /// Marker check, emptied staging, the sources sent, `./models`, the outputs fetched, the
    /// remote directories cleaned; the log and the artifact's files written.
    pub fn plan(&self, opts: &ConnectOptions, pin: &GitCommit) -> Result<Plan> {
        let staging = opts.remote_root.join(plan::STAGING_DIR)?;
        let remote_out = opts.remote_root.join(plan::OUTPUT_DIR)?;
        let (req, out) = (&self.request, &self.out);
        let name = req.artifact_name();
        let mut p = Plan::checking_marker(opts, pin)?;
        p.run(plan::prepare_command(&staging, &remote_out, &name));
        p.send_into(self.sources.clone(), &staging);
        p.run(plan::run_models_command(
            &opts.remote_root,
            &req.models_args(&staging, &remote_out),
        ));
        p.fetch(
            &remote_out,
            fetch_dir(out, &name),
            plan::fetch_options(&name),
        );
        p.run(plan::cleanup_command(&staging, &remote_out, &name));
        p.writes.push(self.log.clone());
        if req.local {
            p.writes.push(out.join(&name));
        } else {
            p.writes.push(out.join(format!("{name}.chunk*")));
            p.writes.push(out.join(chunker::sidecar_name(&name)));
            p.writes.push(out.join(chunker::chunk_manifest_name(&name)));
        }
        Ok(p)
    }
}

impl DmJob {
    /// The DM build's steps (as a compile's, with `./models --dm`) and the four files it writes.
    pub fn plan(&self, opts: &ConnectOptions, pin: &GitCommit) -> Result<Plan> {
        let staging = opts.remote_root.join(plan::STAGING_DIR)?;
        let mut p = Plan::checking_marker(opts, pin)?;
        p.run(plan::dm_prepare_command(&staging, &self.remote_out)?);
        p.send_into(self.sources.clone(), &staging);
        p.run(plan::run_models_command(
            &opts.remote_root,
            &plan::dm_args(&staging, &self.remote_out),
        ));
        p.fetch(
            &self.remote_out,
            fetch_dir(&self.out, "dm"),
            plan::dm_fetch_options(),
        );
        p.run(plan::dm_cleanup_command(&staging, &self.remote_out)?);
        p.writes.push(self.log.clone());
        p.writes
            .extend(plan::DM_FILES.iter().map(|f| self.out.join(f)));
        Ok(p)
    }
}

impl ValidateJob {
    /// The validator's steps for `set`, the verified chunk set at [`ValidateJob::artifact`]:
    /// its files sent to the models directory, the validator run, the copies removed.
    pub fn plan(
        &self,
        opts: &ConnectOptions,
        pin: &GitCommit,
        set: &FetchedArtifact,
    ) -> Result<Plan> {
        let (dir, _) = artifact_dir_and_name(&self.artifact);
        let mut p = Plan::checking_marker(opts, pin)?;
        p.run(plan::validate_prepare_command(&self.models_dir, &set.name));
        p.send_into(
            set.files.iter().map(|f| dir.join(f)).collect(),
            &self.models_dir,
        );
        p.run(plan::validate_command(
            &opts.remote_root,
            &self.python,
            &self.id,
            self.version,
            self.latency_bound,
        ));
        p.run(plan::validate_cleanup_command(&self.models_dir, &set.name));
        p.writes.push(self.log.clone());
        Ok(p)
    }
}

/// The directory and file name of a chunk set's logical path (`.` for a bare name).
pub(crate) fn artifact_dir_and_name(artifact: &Path) -> (PathBuf, String) {
    let name = artifact
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = match artifact.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    (dir, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dry_run::compile_plan;

    fn opts() -> ConnectOptions {
        ConnectOptions::default()
    }

    #[test]
    fn a_compile_plan_lists_its_commands_transfers_and_files() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        fs_err::create_dir_all(&out).unwrap();
        fs_err::write(out.join("pop223_driving_tinygrad.pkl.chunk01of02"), b"old").unwrap();
        fs_err::write(out.join("other_driving_tinygrad.pkl.chunk01of01"), b"x").unwrap();
        let req = CompileRequest {
            id: "pop223".parse().unwrap(),
            version: "v16".parse().unwrap(),
            gpu: false,
            input_format: plan::InputFormat::Supercombo,
            local: false,
        };
        let pin: GitCommit = "e837e367aac9e1a66e689f4f32ce20ca9367df13".parse().unwrap();
        let job = CompileJob {
            request: req,
            sources: vec![PathBuf::from("src/driving_supercombo.onnx")],
            out: out.clone(),
            log: PathBuf::from("logs/pop223.log"),
        };
        let p = compile_plan(&opts(), &job, &pin).unwrap();
        let lines: Vec<String> = p.steps.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            lines[0],
            "check  /data/openpilot/tinygrad_repo/TINYGRAD_COMMIT must be \
             e837e367aac9e1a66e689f4f32ce20ca9367df13"
        );
        assert!(lines[1].starts_with("run    rm -rf /data/openpilot/uncompiledmodels"));
        assert_eq!(
            lines[2],
            "send   src/driving_supercombo.onnx -> \
             comma@192.168.3.110:/data/openpilot/uncompiledmodels/ (rsync -a)"
        );
        assert!(
            lines[3].contains("./models --pop223 --version v16"),
            "{}",
            lines[3]
        );
        assert!(
            lines[4].starts_with("fetch  comma@192.168.3.110:/data/openpilot/compiledmodels/ -> ")
        );
        assert!(lines[4].ends_with(
            "(rsync -a --include=pop223_driving_tinygrad.pkl \
             --include=pop223_driving_tinygrad.pkl.* --exclude=*)"
        ));
        assert_eq!(lines.len(), 6);
        assert_eq!(p.writes[0], Path::new("logs/pop223.log"));
        assert_eq!(
            p.removes,
            [out.join("pop223_driving_tinygrad.pkl.chunk01of02")]
        );
    }
}
