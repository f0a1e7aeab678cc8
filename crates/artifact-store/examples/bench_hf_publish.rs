//! `cargo xtask bench`'s Hub publish contender: publish every chunk set in ARTIFACTS_DIR
//! (`<id>/<id>_driving_tinygrad.pkl.*`) to the bucket `hf://buckets/BUCKET` with the library's
//! own `HfBucketStore` (which uploads through the `hf` CLI in `HF_CLI`, to `HF_ENDPOINT` with
//! `HF_TOKEN`) and `publish`, under a manifest of the current generation listing exactly those
//! models. As for the GitHub contender, the release gate (build records) is `release-cli`'s and
//! not part of what is timed: this is the transfer.
//!
//! Usage: bench_hf_publish BUCKET ARTIFACTS_DIR

use std::path::Path;

use artifact_store::publish::{PublishOptions, publish};
use artifact_store::retry::RetryPolicy;
use artifact_store::{HfBucketStore, HfConfig};
use manifest::layout::CURRENT_GENERATION;

mod common;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [bucket, artifacts] = &args[..] else {
        eprintln!("usage: bench_hf_publish BUCKET ARTIFACTS_DIR");
        std::process::exit(2);
    };
    if let Err(e) = run(bucket, Path::new(artifacts)) {
        eprintln!("bench_hf_publish: {e}");
        std::process::exit(1);
    }
}

fn run(bucket: &str, artifacts: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let manifest = common::manifest_of(artifacts)?;
    let store = HfBucketStore::new(bucket, HfConfig::from_env(None))?;
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
