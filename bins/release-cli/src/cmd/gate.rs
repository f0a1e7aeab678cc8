//! `release-cli preflight`: the front of `release::preflight` (see docs/release.md, "Validate";
//! publish's validation gate is `release::publish`).

use std::path::{Path, PathBuf};

use clap::Args;
use manifest::GitCommit;
use serde::Serialize;

use crate::output::print_json;
use crate::{CliError, CliResult};

/// `preflight --dry-run --json`.
#[derive(Serialize)]
struct PreflightPlan<'a> {
    dry_run: bool,
    openpilot: &'a Path,
    tinygrad_commit: &'a GitCommit,
    commands: &'a [&'a [&'a str]],
    writes: [&'a Path; 2],
}

#[derive(Debug, Args)]
pub struct PreflightArgs {
    /// The openpilot checkout to test (with ./dev, .venv and tinygrad_repo/TINYGRAD_COMMIT).
    #[arg(long, value_name = "DIR")]
    pub openpilot: PathBuf,
    /// The rebuild workspace: the record goes to results/preflight.json, the output to
    /// logs/preflight.log.
    #[arg(long, value_name = "DIR", value_parser = release::Workspace::value_parser())]
    pub workspace: release::Workspace,
    /// Make the checks preflight makes before running anything (a checkout with ./dev and a
    /// tinygrad marker) and print the commands it would run and the log and record it would
    /// write; run nothing and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the record: `{"openpilot","openpilot_commit","openpilot_dirty","tinygrad_commit",
    /// "commands":[{"argv","exit_code","passed","started_at","duration_ms"}],"passed",
    /// "finished_at","log"}` (with --dry-run `{"dry_run":true,"openpilot","tinygrad_commit",
    /// "commands":[[argv…]…],"writes":[log, record]}`).
    #[arg(long)]
    pub json: bool,
}

pub fn preflight(args: PreflightArgs) -> CliResult {
    if !args.openpilot.is_dir() {
        return Err(CliError::usage(format!(
            "--openpilot {}: not a directory",
            args.openpilot.display()
        )));
    }
    let record_path = args.workspace.preflight();
    let log = args.workspace.preflight_log();
    if args.dry_run {
        let pin = release::preflight::check(&args.openpilot)?;
        if args.json {
            return print_json(&PreflightPlan {
                dry_run: true,
                openpilot: &args.openpilot,
                tinygrad_commit: &pin,
                commands: &release::preflight::COMMANDS,
                writes: [&log, &record_path],
            });
        }
        crate::outln!(
            "dry run: preflight in {} (tinygrad {}); nothing was run or written",
            args.openpilot.display(),
            pin
        )?;
        for argv in release::preflight::COMMANDS {
            crate::outln!("  run    {}", argv.join(" "))?;
        }
        crate::outln!(
            "  would write  {}, {}",
            log.display(),
            record_path.display()
        )?;
        cli_support::info!("next: run the same command without --dry-run");
        return Ok(());
    }
    let rec = release::preflight::run(&args.openpilot, &log, &mut crate::progress::live)?;
    release::records::write(&record_path, &rec)?;
    if args.json {
        print_json(&rec)?;
    } else {
        for c in &rec.commands {
            crate::outln!(
                "{} `{}` ({:.1} s)",
                if c.passed { "ok    " } else { "FAILED" },
                c.argv.join(" "),
                c.duration_ms as f64 / 1000.0
            )?;
        }
        crate::outln!(
            "preflight {} in {} (tinygrad {}); recorded in {}",
            if rec.passed { "passed" } else { "FAILED" },
            rec.openpilot.display(),
            rec.tinygrad_commit,
            record_path.display()
        )?;
    }
    if rec.passed {
        let ws = cli_support::shell_quote(&args.workspace.root().display().to_string());
        cli_support::info!(
            "next: `release-cli validate --model ID --workspace {ws}` for each model of the seed's \
             matrix (ID: the model; `release-cli status --workspace {ws}` lists what is still \
             missing)"
        );
        Ok(())
    } else {
        Err(CliError::check_failed(format!(
            "the repository tests failed in {}; see {}, fix them and rerun preflight",
            args.openpilot.display(),
            log.display()
        )))
    }
}
