//! `cargo xtask bench`'s GitHub publish contender: publish every chunk set in ARTIFACTS_DIR
//! (`<id>/<id>_driving_tinygrad.pkl.*`, as `release-cli chunk split` writes them) to the
//! `Models` checkout CHECKOUT with the library's own `GithubStore` and `publish`, under a
//! manifest of the current generation listing exactly those models. The release gate (build
//! records) is `release-cli`'s and not part of what is timed: this is the transfer.
//!
//! Usage: bench_github_publish CHECKOUT ARTIFACTS_DIR

use std::path::Path;

use artifact_store::GithubStore;
use artifact_store::publish::{PublishOptions, publish};
use artifact_store::retry::RetryPolicy;
use manifest::Manifest;
use manifest::layout::{CURRENT_GENERATION, current_tinygrad_commit};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [checkout, artifacts] = &args[..] else {
        eprintln!("usage: bench_github_publish CHECKOUT ARTIFACTS_DIR");
        std::process::exit(2);
    };
    if let Err(e) = run(Path::new(checkout), Path::new(artifacts)) {
        eprintln!("bench_github_publish: {e}");
        std::process::exit(1);
    }
}

fn run(checkout: &Path, artifacts: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let mut models = Vec::new();
    let mut ids: Vec<String> = std::fs::read_dir(artifacts)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    ids.sort();
    for id in ids {
        let name = format!("{id}_driving_tinygrad.pkl");
        let dir = artifacts.join(&id);
        let sidecar = std::fs::read_to_string(dir.join(format!("{name}.sha256")))?;
        let sha = sidecar.split_whitespace().next().ok_or("empty sidecar")?;
        let count: u32 = std::fs::read_to_string(dir.join(format!("{name}.chunkmanifest")))?
            .trim()
            .parse()?;
        let mut size = 0;
        for i in 1..=count {
            size += std::fs::metadata(dir.join(chunker::chunk_name(&name, i, count)))?.len();
        }
        models.push(serde_json::json!({
            "id": id,
            "name": format!("Bench {id}"),
            "version": "v16",
            "series": "OP Series",
            "released": "2026-01-01",
            "community_favorite": false,
            "artifact_format": "tinygrad_single_v1",
            "artifact_size": size,
            "artifact_sha256": sha,
            "artifact_chunk_count": count,
            "uses_external_gpu": false,
        }));
    }
    let manifest = Manifest::from_value(serde_json::json!({
        "generation": CURRENT_GENERATION.to_string(),
        "tinygrad_commit": current_tinygrad_commit().to_string(),
        "models": models,
    }))?;
    let store = GithubStore::open(checkout, "Models")?;
    let opts = PublishOptions {
        generation: CURRENT_GENERATION,
        dry_run: false,
        retry: RetryPolicy::immediate(1),
        deep_verify: false,
        contract: Default::default(),
    };
    publish(&manifest, artifacts, &[&store], &opts, &mut |_| {})?;
    Ok(())
}
