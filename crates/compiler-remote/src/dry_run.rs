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
