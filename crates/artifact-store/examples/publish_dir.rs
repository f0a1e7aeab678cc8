//! Publish a release into a directory store, e.g. one `release-cli serve` then serves to a
//! device for a try, or a staging copy checked before the real stores.
//!
//! Usage: publish_dir MANIFEST.json ARTIFACTS_DIR STORE_DIR [--dry-run]
//!
//! ARTIFACTS_DIR holds one directory per model to upload, `<id>/`, with the model's chunk set
//! (`chunker::split_file`'s output); a model of the manifest without a directory must already
//! be complete in the store. The manifest must name its `generation`. Chunks, `.sha256` and
//! `.chunkmanifest` go up first, every other model is checked in the store, the release guard
//! compares against the store's live manifest, and the manifest is written last. `--dry-run`
//! prints the plan and writes nothing. Each event goes to stderr, one line per store to stdout.

use std::path::PathBuf;
use std::process::ExitCode;

use artifact_store::LocalStore;
use artifact_store::publish::{Event, PublishOptions, publish};
use artifact_store::retry::RetryPolicy;
use manifest::{Limits, Manifest};

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let dry_run = match args.iter().position(|a| a == "--dry-run") {
        Some(i) => {
            args.remove(i);
            true
        }
        None => false,
    };
    let [manifest, artifacts, store] = &args[..] else {
        eprintln!("usage: publish_dir MANIFEST.json ARTIFACTS_DIR STORE_DIR [--dry-run]");
        return ExitCode::from(2);
    };
    match run(
        &PathBuf::from(manifest),
        &PathBuf::from(artifacts),
        &PathBuf::from(store),
        dry_run,
    ) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(
    manifest_path: &std::path::Path,
    artifacts: &std::path::Path,
    store_dir: &std::path::Path,
    dry_run: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let file = std::fs::File::open(manifest_path)
        .map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    let manifest = Manifest::from_reader_limited(file, &Limits::default())
        .map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    let generation = manifest.generation().ok_or_else(|| {
        format!(
            "{}: no top-level \"generation\"; add the generation it is for (e.g. \"v25\")",
            manifest_path.display()
        )
    })?;

    let store = LocalStore::new(store_dir);
    let opts = PublishOptions {
        generation,
        dry_run,
        retry: RetryPolicy::default(),
        // A directory store is read locally, so every artifact in it is re-hashed anyway.
        deep_verify: true,
        // The built-in pin table: the manifest's tinygrad pin must be its generation's.
        contract: Default::default(),
    };
    let report = publish(&manifest, artifacts, &[&store], &opts, &mut |event| {
        if !matches!(event, Event::Progress { .. }) {
            eprintln!("{event:?}");
        }
    })?;
    for s in &report.stores {
        if dry_run {
            for step in &s.steps {
                println!("{}: would {step:?}", s.store);
            }
        }
        println!(
            "{}: {} file(s), {} bytes uploaded, {} unchanged; manifest {} ({})",
            s.store,
            s.uploaded_files,
            s.uploaded_bytes,
            s.skipped_files,
            s.manifest,
            s.manifest_path
        );
    }
    Ok(())
}
