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
mod output;
mod progress;
mod units;

use std::process::ExitCode;

use clap::Parser;

pub use output::{CliError, CliResult};

/// The exit codes, as `--help` shows them.
const EXIT_CODES_HELP: &str = "\
Exit codes (stable, see docs/release.md):
  0  success
  1  the operation failed (I/O, network, remote command); the message names what and where
  2  usage error: bad flags or arguments, or a refused flag (another compiler, store order)
  3  a check failed: verification, validation, tinygrad marker, or a refused release guard

Every command that reports takes --json and then prints JSON on stdout (shapes in --help and
docs/release.md); progress and messages go to stderr. A --json command that fails prints one
{\"error\":{\"kind\",\"message\",\"next\"}} document instead (kind: failure, usage,
check_failed), with the same exit code; a report that already says what failed (manifest
validate, fmt --check, diff, the rebuild summary) is not followed by one.";

/// The StarPilot release engineer's tool: chunk artifacts, check manifests, publish generations.
#[derive(Debug, Parser)]
#[command(
    name = "release-cli",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_help = EXIT_CODES_HELP
)]
pub struct Cli {
    #[command(flatten)]
    pub output: cli_support::OutputFlags,
    #[command(subcommand)]
    pub command: cmd::Command,
}

/// What `-v` adds, as `--help` shows it.
const VERBOSE_HELP: &str = "Also print each step on stderr: every file publish uploads or \
removes, every chunk reuse copies (with its source and destination), the stores opened, and \
one log line per request `serve` answers (as RUST_LOG=debug)";

fn main() -> ExitCode {
    let cli = cli_support::parse::<Cli>(VERBOSE_HELP, |c| &c.output);
    let json = cli.command.json();
    match cmd::run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report(json),
    }
}
