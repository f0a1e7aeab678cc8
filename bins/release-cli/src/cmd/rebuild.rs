//! `release-cli rebuild`: flags and rendering over `release::rebuild`, the resumable bulk
//! rebuild of a generation on the compiler comma (workspace layout and rules: see that module).

use std::path::PathBuf;
use std::time::Instant;

use artifact_store::StoreSpec;
use clap::Args;
use manifest::{Generation, ModelId};
use release::rebuild::{DEFAULT_SOURCES, Overlap, Progress, Rebuild, RemoteBuilder, StoreUploader};

use crate::cmd::build::{RemoteArgs, render_plan};
use crate::output::{print_json, remote_error};
use crate::progress::live;
use crate::{CliError, CliResult};

#[derive(Debug, Args)]
pub struct RebuildArgs {
    /// The rebuild workspace (created if missing; rerun with the same one to resume).
    #[arg(long, value_name = "DIR", value_parser = release::Workspace::value_parser())]
    pub workspace: release::Workspace,
    /// The source map: `{"<id>": {"source_id", "input_format", "ref", "uses_external_gpu"}}`.
    #[arg(long, value_name = "FILE")]
    pub source_map: PathBuf,
    /// The existing catalog; behaviour versions come from it and are never changed.
    #[arg(long, value_name = "FILE")]
    pub base_manifest: PathBuf,
    /// Where the ONNX sources are archived, as `onnx/<source-id>/<file>`.
    #[arg(long, value_name = "STORE", default_value = DEFAULT_SOURCES, value_parser = StoreSpec::parse)]
    pub sources: StoreSpec,
    /// The generation being built, e.g. v26.
    #[arg(long, value_name = "vNN")]
    pub generation: Generation,
    /// Only these models (default: every source-map model that is in the base manifest).
    #[arg(long = "model", value_name = "ID")]
    pub models: Vec<ModelId>,
    /// Upload each finished model's artifact files (chunks, `.sha256`, `.chunkmanifest`; never a
    /// manifest, and never over other bytes the store holds under their names: publish replaces
    /// those after its gates) to this store from a background worker while the next model
    /// compiles, as publish uploads them (same store forms as publish's --to; repeat for
    /// several, the Hub before GitHub). Recorded in results/<id>.upload.json once the store has
    /// them; a rerun skips what is recorded and still there, and publish, still gated as
    /// always, then uploads only what is missing and the manifest last. A failed upload does
    /// not stop the compiles: the summary names it and publish uploads it.
    #[arg(long = "upload-to", value_name = "STORE", value_parser = StoreSpec::parse)]
    pub upload_to: Vec<StoreSpec>,
    /// Validate each model on the device right after its compile, as `validate --model ID
    /// --workspace DIR` does (same job, same record results/<id>.validation.json, read by the
    /// publish gate); a model done earlier is validated again only without a passing record of
    /// its bytes. With --upload-to, only a passing model is uploaded.
    #[arg(long)]
    pub validate: bool,
    /// With --validate: the models directory on the compiler the validator reads.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/data/models",
        requires = "validate"
    )]
    pub remote_models_dir: compiler_remote::RemotePath,
    /// With --validate: the Python the validator runs with on the compiler.
    #[arg(
        long,
        value_name = "PROGRAM",
        default_value = "/usr/local/venv/bin/python3",
        requires = "validate"
    )]
    pub python: String,
    #[command(flatten)]
    pub access: artifact_store::StoreAccess,
    /// Make the checks a rebuild makes before building (the one-compiler policy, the pin, the
    /// source map and base catalog, which models are done: their records and ready chunk sets
    /// verified; and, when a model would be built, the local rsync and a key for the compiler
    /// in known_hosts), then print per model whether it would be skipped or built, with the
    /// sources it would fetch, the commands and transfers on the compiler, and the files it
    /// would write. Opens no store, connects to nothing, writes nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the final summary `{"workspace","generation","tinygrad_commit","manifest","compiled",
    /// "skipped","failed","not_attempted","not_in_catalog","without_artifact",
    /// "variants_dropped":[{"id","variant","reason"}],"set_aside"?,"models":[{"id","status",
    /// "error"?,"validation"?}],"uploads"?:[{"id","store","status","error"?}]}` (`set_aside`:
    /// where the previous generation's release was moved; `uploads` with --upload-to)
    /// (with --dry-run `{"dry_run":true,"workspace",
    /// "generation","tinygrad_commit","sources","manifest","not_in_catalog","models":[{"id",
    /// "action":"skip"|"build","version","source_id","input_format","gpu","fetch"?,"plan"?}],
    /// "validate","upload_to":[STORE]}`,
    /// `plan` shaped as `compile --dry-run --json`'s).
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
        .map_err(remote_error)?;
    let pin = args.remote.pin()?;
    let rebuild = prepare(&args, &pin)?;
    if args.dry_run {
        return dry_run(&args, &rebuild);
    }
    let mut sink = live;
    let mut builder = RemoteBuilder::new(
        args.sources.clone(),
        args.access.clone(),
        args.remote.connect_options(),
        pin,
        &mut sink,
    )
    .with_contract(rebuild.contract)
    .with_device_check(release::rebuild::DeviceCheck {
        pins: release::tree::load_pins(args.remote.openpilot.as_deref())?,
        models_dir: args.remote_models_dir.clone(),
        python: args.python.clone(),
    });
    let uploader = match args.upload_to.is_empty() {
        true => None,
        false => Some(Box::new(StoreUploader::open(
            &args.upload_to,
            &args.access,
            args.generation,
            rebuild.contract,
        )?) as Box<dyn release::rebuild::Uploader>),
    };
    let overlap = Overlap {
        validate: args.validate,
        uploader,
    };
    let summary = rebuild.run_with(&mut builder, overlap, &mut |p: Progress<'_>| {
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

    print_summary(&args, &summary, started)?;
    // Warnings go to stderr in both modes; --json also lists them as "variants_dropped".
    for d in &summary.variants_dropped {
        eprintln!("warning: {d}");
    }
    // With --json the summary above already says what failed.
    summary
        .result()
        .map_err(|e| CliError::from(e).after_json_report())?;
    if summary.complete() {
        super::store::say_publish_next(
            args.generation,
            &summary.manifest,
            &args.workspace.ready(),
            &args.workspace,
        );
    }
    Ok(())
}

/// The checks a rebuild makes before building (the tree against the generation and pin, the
/// source map and base catalog), and the rebuild under the tree's contract; a model the tree's
/// reviewed catalog does not list is said and left out.
fn prepare(args: &RebuildArgs, pin: &manifest::GitCommit) -> CliResult<Rebuild> {
    let pin_from = match (&args.remote.tinygrad_commit, &args.remote.openpilot) {
        // The file the tree records its tinygrad in (its sync file when it declares its
        // generation), as `pin` read it.
        (None, Some(op)) => op
            .join(compiler_remote::pin_location(op).rel())
            .display()
            .to_string(),
        _ => "--tinygrad-commit".to_string(),
    };
    release::rebuild::check_tree(
        args.generation,
        pin,
        &pin_from,
        args.remote.openpilot.as_deref(),
        &args.remote.connect_options(),
    )?;
    let (pins, declared) = release::tree::load_tree(args.remote.openpilot.as_deref())?;
    let (rebuild, not_in_tree) = Rebuild::prepare(
        args.workspace.clone(),
        &args.source_map,
        &args.base_manifest,
        &args.models,
        args.generation,
        pin.clone(),
    )?
    .under_contract(&pins, declared.as_ref())?;
    for id in &not_in_tree {
        cli_support::info!(
            "{id}: not a row of the tree's reviewed catalog; the {} contract publishes only its \
             rows, so it is left out",
            rebuild.contract.name
        );
    }
    Ok(rebuild)
}

/// The summary, as `--json` or text, and where the previous generation's release was set
/// aside.
fn print_summary(
    args: &RebuildArgs,
    summary: &release::rebuild::Summary,
    started: Instant,
) -> CliResult {
    if args.json {
        print_json(summary)?;
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
        for o in summary
            .models
            .iter()
            .filter(|o| o.validation == Some("failed"))
        {
            crate::outln!("  FAILED device validation {} (not uploaded)", o.id)?;
        }
        print_uploads(&summary.uploads)?;
        not_in_catalog(&summary.not_in_catalog)?;
        crate::outln!(
            "manifest: {} ({} of {} models have a {} artifact)",
            summary.manifest.display(),
            summary.with_artifact,
            summary.with_artifact + summary.without_artifact.len(),
            args.generation
        )?;
    }
    if let Some(dir) = &summary.set_aside {
        cli_support::info!(
            "the previous generation's release (ready/, results/, logs/, rehearsal/) was set aside \
             in {}, where it stays publishable: pass --workspace {} to repair it",
            dir.display(),
            cli_support::shell_quote(&dir.display().to_string())
        );
    }
    Ok(())
}

/// `rebuild --dry-run`: which models a run would skip or build, and how, changing nothing.
fn dry_run(args: &RebuildArgs, rebuild: &Rebuild) -> CliResult {
    let report = rebuild.dry_run(&args.remote.connect_options(), &args.sources.to_string())?;
    artifact_store::publish::check_store_order(&args.upload_to)
        .map_err(release::Error::PublishInput)?;
    let stores: Vec<String> = args
        .upload_to
        .iter()
        .map(release::publish::canonical_store_name)
        .collect();
    if args.json {
        let mut v = serde_json::to_value(&report).map_err(CliError::failure)?;
        v["validate"] = args.validate.into();
        v["upload_to"] = serde_json::to_value(&stores).map_err(CliError::failure)?;
        return print_json(&v);
    }
    let building = report.building();
    crate::outln!(
        "dry run: rebuild {} (tinygrad {}) in {}: {building} to build, {} done earlier \
         (skipped); nothing was fetched, sent, run or written",
        report.generation,
        report.tinygrad_commit,
        report.workspace.display(),
        report.models.len() - building
    )?;
    for m in &report.models {
        match (&m.plan, &m.fetch) {
            (Some(plan), Some(fetch)) => {
                crate::outln!(
                    "  build {} ({}, {}{}) on {}:{}",
                    m.id,
                    m.version,
                    m.input_format,
                    if m.gpu { ", gpu" } else { "" },
                    plan.destination,
                    plan.remote_root
                )?;
                crate::outln!("    fetch  {} -> {}", fetch.from, fetch.to.display())?;
                render_plan(plan, "    ")?;
            }
            _ => crate::outln!(
                "  skip  {} (done earlier; its ready chunk set verifies)",
                m.id
            )?,
        }
    }
    let ids: Vec<&str> = report.models.iter().map(|m| m.id.as_str()).collect();
    for store in &stores {
        crate::outln!(
            "  upload {} -> {store} (artifact files only, each model once built{}, in the \
             background; what results/<id>.upload.json records there is skipped)",
            ids.join(", "),
            if args.validate { " and validated" } else { "" }
        )?;
    }
    not_in_catalog(&report.not_in_catalog)?;
    crate::outln!("  would write  {}", report.manifest.display())?;
    cli_support::info!("next: run the same command without --dry-run");
    Ok(())
}

/// With --upload-to: how many models each store got, and each failed upload with its error.
fn print_uploads(uploads: &[release::rebuild::UploadOutcome]) -> CliResult {
    if uploads.is_empty() {
        return Ok(());
    }
    let n = |s: &str| uploads.iter().filter(|u| u.status == s).count();
    crate::outln!(
        "uploads: {} uploaded, {} recorded earlier and still there, {} failed",
        n("uploaded"),
        n("recorded"),
        n("failed")
    )?;
    for u in uploads.iter().filter(|u| u.status == "failed") {
        crate::outln!(
            "  upload FAILED {} to {}: {}; publish will upload it",
            u.id,
            u.store,
            u.error.as_deref().unwrap_or_default()
        )?;
    }
    Ok(())
}

/// The source-map models the base catalog does not list, one line (none: no line).
fn not_in_catalog(ids: &[ModelId]) -> CliResult {
    if !ids.is_empty() {
        let ids: Vec<&str> = ids.iter().map(|i| i.as_str()).collect();
        crate::outln!("  not in the base catalog (not added): {}", ids.join(", "))?;
    }
    Ok(())
}
