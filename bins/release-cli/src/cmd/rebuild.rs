//! `release-cli rebuild`: flags and rendering over `release::rebuild`, the resumable bulk
//! rebuild of a generation on the compiler comma (workspace layout and rules: see that module).

use std::path::PathBuf;
use std::time::Instant;

use artifact_store::StoreSpec;
use clap::Args;
use manifest::{Generation, ModelId};
use release::rebuild::{DEFAULT_SOURCES, Progress, Rebuild, RemoteBuilder};

use crate::cmd::build::{RemoteArgs, live};
use crate::output::print_json;
use crate::{CliError, CliResult};

#[derive(Debug, Args)]
pub struct RebuildArgs {
    /// The rebuild workspace (created if missing; rerun with the same one to resume).
    #[arg(long, value_name = "DIR")]
    pub workspace: PathBuf,
    /// The source map: `{"<id>": {"source_id", "input_format", "ref", "uses_external_gpu"}}`.
    #[arg(long, value_name = "FILE")]
    pub source_map: PathBuf,
    /// The existing catalog; behaviour versions come from it and are never changed.
    #[arg(long, value_name = "FILE")]
    pub base_manifest: PathBuf,
    /// Where the ONNX sources are archived, as `onnx/<source-id>/<file>`.
    #[arg(long, value_name = "STORE", default_value = DEFAULT_SOURCES)]
    pub sources: String,
    /// The generation being built, e.g. v26.
    #[arg(long, value_name = "vNN")]
    pub generation: Generation,
    /// Only these models (default: every source-map model that is in the base manifest).
    #[arg(long = "model", value_name = "ID")]
    pub models: Vec<ModelId>,
    #[command(flatten)]
    pub access: crate::cmd::store::StoreAccess,
    /// Print the final summary `{"workspace","generation","tinygrad_commit","manifest","compiled",
    /// "skipped","failed","not_attempted","not_in_catalog","without_artifact",
    /// "models":[{"id","status","error"?}]}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten, next_help_heading = "Compiler options")]
    pub remote: RemoteArgs,
}

pub fn run(args: RebuildArgs) -> CliResult {
    let started = Instant::now();
    // The policy first: a refused compiler must not even get as far as fetching sources.
    args.remote
        .remote
        .check_policy(args.remote.allow_other_compiler)
        .map_err(crate::cmd::build::remote_error)?;
    let pin = args.remote.pin()?;
    let rebuild = Rebuild::prepare(
        args.workspace.clone(),
        &args.source_map,
        &args.base_manifest,
        &args.models,
        args.generation,
        pin.clone(),
    )?;
    let sources = StoreSpec::parse(&args.sources).map_err(CliError::usage)?;
    let mut sink = live;
    let mut builder = RemoteBuilder::new(
        sources,
        args.access.hf(),
        args.access.github_branch.clone(),
        args.remote.connect_options(),
        pin,
        &mut sink,
    );
    let summary = rebuild.run(&mut builder, &mut |p: Progress<'_>| {
        cli_support::info!(
            "[model {} of {}] {}: {} ({}s elapsed)",
            p.index + 1,
            p.total,
            p.id,
            p.message,
            started.elapsed().as_secs()
        )
    })?;
    drop(builder);

    if args.json {
        print_json(&summary)?;
    } else {
        crate::outln!(
            "rebuild {} ({}): {} compiled, {} skipped (done earlier), {} failed, {} not attempted, in {}s",
            summary.generation,
            summary.tinygrad_commit,
            summary.compiled,
            summary.skipped,
            summary.failed,
            summary.not_attempted.len(),
            started.elapsed().as_secs()
        )?;
        for o in summary.models.iter().filter(|o| o.status == "failed") {
            crate::outln!(
                "  FAILED {}: {}",
                o.id,
                o.error.as_deref().unwrap_or_default()
            )?;
        }
        if !summary.not_in_catalog.is_empty() {
            crate::outln!(
                "  not in the base catalog (not added): {}",
                summary
                    .not_in_catalog
                    .iter()
                    .map(|i| i.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )?;
        }
        crate::outln!(
            "manifest: {} ({} of {} models have a {} artifact)",
            summary.manifest.display(),
            summary.with_artifact,
            summary.with_artifact + summary.without_artifact.len(),
            args.generation
        )?;
    }
    // With --json the summary above already says what failed.
    summary
        .result()
        .map_err(|e| CliError::from(e).after_json_report())?;
    if summary.complete() {
        crate::outln!(
            "next: release-cli publish --artifacts {} --manifest {}",
            args.workspace.join("ready").display(),
            summary.manifest.display()
        )?;
    }
    Ok(())
}

/// The recorded behaviour version of a built model (for `validate --workspace`).
pub fn recorded_version(
    workspace: &std::path::Path,
    id: &ModelId,
) -> CliResult<manifest::BehaviorVersion> {
    Ok(release::rebuild::recorded_version(workspace, id)?)
}
