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
use manifest::layout::CURRENT_GENERATION;

mod common;

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
    let manifest = common::manifest_of(artifacts)?;
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
