//! `release-cli source-map next`: the next generation's source map in the openpilot tree
//! (`release::source_map`).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use manifest::Generation;

use crate::CliResult;
use crate::output::print_json;

#[derive(Debug, Subcommand)]
pub enum SourceMapCommand {
    /// Write scripts/model_source_map_<gen>.json in the tree from the previous generation's map
    /// (ids, sources and refs carried over, in order) and, for a tree that declares its reviewed
    /// catalog (v26's contract), that catalog's ids and GPU flags.
    Next(NextArgs),
}

#[derive(Debug, Args)]
pub struct NextArgs {
    /// The openpilot checkout (its scripts/ holds the maps).
    #[arg(long, value_name = "DIR")]
    pub openpilot: PathBuf,
    /// The generation to write the map of (default: the tree's, whose pin its tinygrad is).
    #[arg(long, value_name = "vNN")]
    pub generation: Option<Generation>,
    /// The map to start from (default: scripts/model_source_map_<previous gen>.json).
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
    /// Decide the map and say what would be written; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print `{"generation","from","source_map","models","kept","dropped","added",
    /// "gpu_from_catalog","dry_run","written","differs_from_existing"}`.
    #[arg(long)]
    pub json: bool,
}

pub fn run(c: SourceMapCommand) -> CliResult {
    let SourceMapCommand::Next(args) = c;
    let r = release::source_map::write_next(
        &args.openpilot,
        args.from.as_deref(),
        args.generation,
        args.dry_run,
    )?;
    if args.json {
        return print_json(&r);
    }
    let ids = |v: &[manifest::ModelId]| v.iter().map(|i| i.as_str()).collect::<Vec<_>>().join(", ");
    let verb = match (r.dry_run, r.written) {
        (true, _) if r.differs_from_existing => "would replace (it differs; remove it first)",
        (true, _) => "would write",
        (false, true) => "wrote",
        (false, false) => "already there:",
    };
    crate::outln!(
        "{verb} {} ({} model(s), from {})",
        r.source_map.display(),
        r.models,
        r.from.display()
    )?;
    if !r.dropped.is_empty() {
        crate::outln!(
            "  left out (not in the tree's catalog): {}",
            ids(&r.dropped)
        )?;
    }
    if !r.added.is_empty() {
        crate::outln!(
            "  added with their archive defaults (onnx/<id>/, input_format auto; give a ref \
             and input_format when known): {}",
            ids(&r.added)
        )?;
    }
    if !r.gpu_from_catalog.is_empty() {
        crate::outln!(
            "  uses_external_gpu set from the tree's catalog: {}",
            ids(&r.gpu_from_catalog)
        )?;
    }
    let sh = |p: &std::path::Path| cli_support::shell_quote(&p.display().to_string());
    if r.dry_run {
        cli_support::info!("next: run the same command without --dry-run");
    } else {
        cli_support::info!(
            "next: commit it, then `release-cli rebuild --workspace WS --source-map {} \
             --base-manifest BASE_MANIFEST --generation {} --openpilot {}` (WS: the rebuild \
             workspace; BASE_MANIFEST: the live {} manifest the models are rebuilt from)",
            sh(&r.source_map),
            r.generation,
            sh(&args.openpilot),
            r.generation
                .previous()
                .map_or("previous".to_string(), |g| g.to_string())
        );
    }
    Ok(())
}
