//! `release-cli`: the StarPilot release engineer's tool. A thin clap front over the workspace
//! crates; every subcommand lives in its own module under `cmd/`.
//!
//! Exit codes (stable, shown in `--help`, so in `docs/cli.md`, and in `docs/release.md`):
//! - 0: success;
//! - 1: the operation failed (I/O, network, remote command);
//! - 2: usage error (bad flags or arguments);
//! - 3: a check failed: verification, validation, or a refused release guard.

mod cmd;
#[cfg(test)]
mod hint_tests;
mod input;
mod output;
mod progress;
mod units;

use std::process::ExitCode;

pub use output::{CliError, CliResult};

/// What `-v` adds, as `--help` shows it.
const VERBOSE_HELP: &str = "Also print each step on stderr: every file publish uploads or \
removes, every chunk reuse copies (with its source and destination), the stores opened, and \
one log line per request `serve` answers (as RUST_LOG=debug)";

fn main() -> ExitCode {
    let cli = cli_support::parse::<cmd::Cli>(VERBOSE_HELP, |c| &c.output);
    match cmd::run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report(cli_support::json_requested()),
    }
}
