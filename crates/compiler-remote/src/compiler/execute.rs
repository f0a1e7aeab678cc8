//! Executing a plan: every step taken in order and run exactly as the dry run renders it (the
//! command line, the rsync options, sources and destinations are the step's own), and recorded.
//! What a step's outcome means (a failed build, outputs to check) stays with the operation.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitStatus;

use fs_err::File;

use super::fetch::FetchDir;
use super::{Compiler, LineSink};
use crate::error::Result;
use crate::job::{Plan, Step};

/// A plan being executed on one session.
pub(crate) struct Execution<'a> {
    compiler: &'a Compiler,
    plan: Plan,
    next: usize,
}

impl Compiler {
    pub(crate) fn execute(&self, plan: Plan) -> Execution<'_> {
        Execution {
            compiler: self,
            plan,
            next: 0,
        }
    }

    /// Every plan step this session has started, in order: what a dry run of the same
    /// operations lists.
    pub fn steps_run(&self) -> Vec<Step> {
        self.steps_run.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Execution<'_> {
    /// Go on with `plan`, which begins with the steps already taken (a validation plan lists
    /// the files it sends only once the set is verified, after the marker check).
    pub(crate) fn continue_with(&mut self, plan: Plan) {
        assert_eq!(plan.steps[..self.next], self.plan.steps[..self.next]);
        self.plan = plan;
    }

    fn take(&mut self) -> Step {
        let step = self.plan.steps[self.next].clone();
        self.next += 1;
        if let Ok(mut run) = self.compiler.steps_run.lock() {
            run.push(step.clone());
        }
        step
    }

    /// A step of another kind than the operation takes next: a bug in its plan builder.
    fn misplaced(&self, kind: &str) -> ! {
        panic!(
            "plan step {} is not a {kind}: {:?}",
            self.next, self.plan.steps
        )
    }

    /// The marker check: refuse unless the compiler's marker is the plan's pin.
    pub(crate) fn check_marker(&mut self) -> Result<()> {
        let Step::CheckMarker { .. } = self.take() else {
            self.misplaced("marker check")
        };
        self.compiler.check_marker(&self.plan.tinygrad_commit)
    }

    /// A command whose non-zero exit is an error quoting its stderr.
    pub(crate) fn run(&mut self) -> Result<String> {
        let Step::Run { command } = self.take() else {
            self.misplaced("command")
        };
        self.compiler.run_checked(&command)
    }

    /// A command with its output streamed to `sink` and appended to `log` after a header line.
    pub(crate) fn stream(&mut self, log: &mut File, sink: LineSink<'_>) -> Result<ExitStatus> {
        let Step::Run { command } = self.take() else {
            self.misplaced("command")
        };
        writeln!(log, "# {} on {}", command, self.compiler.dest())?;
        self.compiler.run_streaming(&command, log, sink)
    }

    /// A transfer to the compiler; `what` names it in an error.
    pub(crate) fn send(&mut self, what: &str) -> Result<()> {
        let Step::Send { from, to, options } = self.take() else {
            self.misplaced("send")
        };
        let mut args: Vec<OsString> = options.iter().map(OsString::from).collect();
        args.extend(from.into_iter().map(PathBuf::into_os_string));
        args.push(to.into());
        self.compiler.rsync(what, args)
    }

    /// A transfer from the compiler into a fresh private directory, returned for checking.
    pub(crate) fn fetch(&mut self, what: &str) -> Result<FetchDir> {
        let Step::Fetch { from, to, options } = self.take() else {
            self.misplaced("fetch")
        };
        let dir = FetchDir::at(to)?;
        let mut args: Vec<OsString> = options.iter().map(OsString::from).collect();
        args.push(from.into());
        args.push(dir.path().into());
        self.compiler.rsync(what, args)?;
        Ok(dir)
    }

    /// The plan's last step, the remote cleanup, run whatever happened before it.
    pub(crate) fn cleanup(mut self) -> Result<String> {
        self.next = self.plan.steps.len() - 1;
        self.run()
    }
}
