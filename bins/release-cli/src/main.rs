//! `release-cli`: the StarPilot release engineer's tool. A thin clap front over the workspace
//! crates; every subcommand lives in its own module under `cmd/`.
//!
//! Exit codes (stable, documented in `docs/cli.md`):
//! - 0: success;
//! - 1: the operation failed (I/O, network, remote command);
//! - 2: usage error (bad flags or arguments);
//! - 3: a check failed: verification, validation, or a refused release guard.

mod cmd;
mod output;
mod progress;
mod units;

use std::process::ExitCode;

use clap::Parser;

pub use output::{CliError, CliResult};

/// The StarPilot release engineer's tool: chunk artifacts, check manifests, publish generations.
#[derive(Debug, Parser)]
#[command(name = "release-cli", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: cmd::Command,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cmd::run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report(),
    }
}
