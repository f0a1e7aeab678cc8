//! `release-cli rehearse`: the front of `release::rehearse` (docs/release.md, "Rehearse").

use std::path::PathBuf;

use clap::Args;
use manifest::{Generation, ModelId};

use crate::output::print_json;
use crate::{CliError, CliResult};

#[derive(Debug, Args)]
pub struct RehearseArgs {
    /// The generation being released, e.g. `v26`; the devices start on the one before.
    #[arg(long, value_name = "vNN")]
    pub generation: Generation,
    /// The staged manifest (`ready/model_names_<gen>.json`).
    #[arg(long, value_name = "FILE")]
    pub manifest: PathBuf,
    /// The staged artifacts, one `<id>/` chunk set per model (`ready/`).
    #[arg(long, value_name = "DIR")]
    pub artifacts: PathBuf,
    /// The release's openpilot tree (tinygrad_repo/TINYGRAD_COMMIT, tinygrad_pins.json, the
    /// built-in model under selfdrive/modeld/models) the devices run with.
    #[arg(long, value_name = "DIR")]
    pub openpilot: PathBuf,
    /// The rebuild workspace: the record goes to results/rehearsal.json (publish requires a
    /// passing one for these manifest bytes), the devices and logs to rehearsal/ (replaced).
    #[arg(long, value_name = "DIR")]
    pub workspace: PathBuf,
    /// The device-modeld-manager binary to run [default: the one beside release-cli].
    #[arg(long, value_name = "PATH")]
    pub device_manager: Option<PathBuf>,
    /// The model the old device has selected [default: the first QCOM catalog model that is not
    /// the built-in].
    #[arg(long, value_name = "ID")]
    pub select: Option<ModelId>,
    /// Print the record: `{"generation","previous_generation","manifest","manifest_sha256",
    /// "tinygrad_commit","openpilot","device_manager","device_args","selected","dropped",
    /// "checks":[{"scenario","check","passed","detail"}],"passed","finished_at","work_dir"}`.
    #[arg(long)]
    pub json: bool,
}

fn error(e: release::Error) -> CliError {
    match e {
        release::Error::RehearseInput { .. }
        | release::Error::NotADirectory { .. }
        | release::Error::ManifestFile { .. } => CliError::usage(e),
        e => super::gate::release_error(e),
    }
}

pub fn rehearse(args: RehearseArgs) -> CliResult {
    let device_manager = match args.device_manager {
        Some(p) => p,
        None => std::env::current_exe()
            .map_err(|e| CliError::failure(format!("cannot find release-cli's own path: {e}")))?
            .with_file_name("device-modeld-manager"),
    };
    let opts = release::rehearse::RehearseOptions {
        workspace: args.workspace.clone(),
        manifest: args.manifest,
        artifacts: args.artifacts,
        generation: args.generation,
        openpilot: args.openpilot,
        device_manager,
        select: args.select,
    };
    let rec =
        release::rehearse::run(&opts, &mut |line| cli_support::info!("{line}")).map_err(error)?;
    let path = release::records::rehearsal_path(&args.workspace);
    if args.json {
        print_json(&rec)?;
    } else {
        for c in &rec.checks {
            crate::outln!(
                "{} {:<8} {}: {}",
                if c.passed { "ok    " } else { "FAILED" },
                c.scenario.to_string(),
                c.check,
                c.detail
            )?;
        }
        crate::outln!(
            "rehearsal {} {} -> {} (manifest sha256 {}); recorded in {}",
            if rec.passed { "passed" } else { "FAILED" },
            rec.previous_generation,
            rec.generation,
            rec.manifest_sha256,
            path.display()
        )?;
    }
    if rec.passed {
        cli_support::info!(
            "next: `release-cli publish --generation {} --manifest {} --workspace {} …`",
            rec.generation,
            rec.manifest.display(),
            args.workspace.display()
        );
        Ok(())
    } else {
        Err(CliError::check_failed(format!(
            "the rehearsal of {} failed ({} check(s)); the devices and the manager's logs are in \
             {}; fix the staged release and rehearse again (publish refuses until it passes)",
            rec.manifest.display(),
            rec.failures().count(),
            rec.work_dir.display()
        )))
    }
}
