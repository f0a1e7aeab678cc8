//! What `sync`, `compile`, `build_dm` and `validate` would do, without connecting to the
//! compiler: the checks the real run makes before and besides talking to it (the one-compiler
//! policy, the local rsync, a host key already in known_hosts, the openpilot tree, the sources,
//! the chunk set to validate), then the very plan the real run executes ([`crate::job`]),
//! rendered: each command the comma would run, each rsync transfer, each local file written or
//! replaced.
//!
//! Nothing here writes a file or opens a connection. What only the comma can tell is not
//! checked: whether its host key matches the pinned one, its rsync, its tinygrad marker (the
//! plan's first step says what it must be).

use std::fmt;
use std::path::Path;

use manifest::GitCommit;

use crate::compiler::checks::{check_sources, check_tree, release_set_to_validate};
use crate::compiler::fetch::earlier_set;
use crate::compiler::{ConnectOptions, check_host_key_known, check_local_rsync};
use crate::error::Result;
use crate::job::{CompileJob, DmJob, ValidateJob};
pub use crate::job::{Plan, Step};
use crate::outputs::FetchedArtifact;

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::CheckMarker { path, expected } => {
                write!(f, "check  {path} must be {expected}")
            }
            Step::Run { command } => write!(f, "run    {command}"),
            Step::Send { from, to, options } => {
                let from: Vec<String> = from.iter().map(|p| p.display().to_string()).collect();
                write!(
                    f,
                    "send   {} -> {to} (rsync {})",
                    from.join(" "),
                    options.join(" ")
                )
            }
            Step::Fetch { from, to, options } => write!(
                f,
                "fetch  {from} -> {} (rsync {})",
                to.display(),
                options.join(" ")
            ),
        }
    }
}

/// The checks [`crate::Compiler::connect`] makes before the network, and one it leaves to ssh:
/// the one-compiler policy, the local rsync, and a key for the compiler in known_hosts.
pub fn check_before_connect(opts: &ConnectOptions) -> Result<()> {
    opts.destination.check_policy(opts.allow_other_compiler)?;
    check_local_rsync(&opts.rsync)?;
    check_host_key_known(opts)
}

/// `sync`: the checks and the tree's four parts, then its plan.
pub fn sync(opts: &ConnectOptions, openpilot: &Path, pin: &GitCommit) -> Result<Plan> {
    check_before_connect(opts)?;
    check_tree(openpilot)?;
    crate::job::sync_plan(opts, openpilot, pin)
}

/// `compile`: the checks and the sources, then what [`compile_plan`] lists.
pub fn compile(opts: &ConnectOptions, job: &CompileJob, pin: &GitCommit) -> Result<Plan> {
    check_before_connect(opts)?;
    check_sources(&job.sources)?;
    compile_plan(opts, job, pin)
}

/// One compile's plan and the earlier set of its artifact in `out` it would replace, without
/// checks (a rebuild plans models whose sources it has not fetched yet).
pub fn compile_plan(opts: &ConnectOptions, job: &CompileJob, pin: &GitCommit) -> Result<Plan> {
    let mut p = job.plan(opts, pin)?;
    if job.out.is_dir() {
        p.removes = earlier_set(&job.out, &job.request.artifact_name())?;
    }
    Ok(p)
}

/// `dm`: the checks and the sources, then the DM build's plan.
pub fn dm(opts: &ConnectOptions, job: &DmJob, pin: &GitCommit) -> Result<Plan> {
    check_before_connect(opts)?;
    check_sources(&job.sources)?;
    job.plan(opts, pin)
}

/// `validate`: the checks and the chunk set verified as the real run verifies it, then the
/// validator's plan. Returns the plan and the verified set.
pub fn validate(
    opts: &ConnectOptions,
    job: &ValidateJob,
    pin: &GitCommit,
) -> Result<(Plan, FetchedArtifact)> {
    check_before_connect(opts)?;
    let set = release_set_to_validate(job)?;
    Ok((job.plan(opts, pin, &set)?, set))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{self, CompileRequest};
    use std::path::PathBuf;

    fn opts() -> ConnectOptions {
        ConnectOptions::default()
    }

    #[test]
    fn a_compile_plan_lists_the_real_runs_commands_and_files() {
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
