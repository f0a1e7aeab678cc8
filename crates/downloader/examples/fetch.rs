//! Download one model the way a device does: the generation's manifest from Hugging Face, then
//! GitHub, then the model's artifact, verified and installed atomically.
//!
//! Usage: fetch GENERATION MODEL_ID MODELS_DIR [HF_BASE GITHUB_BASE]
//!
//! e.g. `fetch v25 pop223 /tmp/models`. Without bases, the fleet's origins are used
//! (`downloader::DEFAULT_HF_BASE`, `downloader::DEFAULT_GITHUB_BASE`); pass both to point at a
//! mirror (`release-cli serve` serves a local store in both layouts). Interrupted, a later run
//! resumes from the bytes staged under MODELS_DIR. Events go to stderr; the installed file's path,
//! size and SHA-256 to stdout.

use std::path::PathBuf;
use std::process::ExitCode;

use downloader::{CancelToken, DownloadConfig, Downloader, Origins};
use manifest::{Generation, ModelId};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (generation, id, models_dir, origins) = match &args[..] {
        [g, i, m] => (g, i, m, Origins::default()),
        [g, i, m, hf, gh] => (g, i, m, Origins::new(hf, gh)),
        _ => return usage("expected GENERATION MODEL_ID MODELS_DIR"),
    };
    let generation: Generation = match generation.parse() {
        Ok(g) => g,
        Err(e) => return usage(&e.to_string()),
    };
    let id: ModelId = match id.parse() {
        Ok(i) => i,
        Err(e) => return usage(&e.to_string()),
    };
    match run(generation, &id, &PathBuf::from(models_dir), origins) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(
    generation: Generation,
    id: &ModelId,
    models_dir: &std::path::Path,
    origins: Origins,
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(models_dir)?;
    let downloader = Downloader::new(origins, DownloadConfig::default());

    let fetched = downloader.fetch_manifest(generation)?;
    eprintln!("manifest {} from {}", fetched.url, fetched.origin);
    for left_out in &fetched.refused_entries {
        eprintln!("  {left_out}");
    }
    let Some(entry) = fetched.manifest.get(id) else {
        return Err(format!("model {id} is not in the {generation} manifest").into());
    };

    let cancel = CancelToken::new();
    let installed = downloader.download(generation, entry, models_dir, &cancel, &|event| {
        eprintln!("{event:?}")
    })?;
    println!(
        "{}  {} bytes  {} (digest from the {}, via {})",
        installed.path.display(),
        installed.size,
        installed.sha256,
        installed.digest_source,
        installed.origin
    );
    Ok(())
}

fn usage(why: &str) -> ExitCode {
    eprintln!("{why}\nusage: fetch GENERATION MODEL_ID MODELS_DIR [HF_BASE GITHUB_BASE]");
    ExitCode::from(2)
}
