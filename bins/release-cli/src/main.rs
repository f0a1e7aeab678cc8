//! `release-cli`: the StarPilot release engineer's tool. A thin clap front over the workspace
//! crates; every subcommand lives in its own module under `cmd/`, whose `--help` lists the
//! stable exit codes (`output::EXIT_*`).

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
