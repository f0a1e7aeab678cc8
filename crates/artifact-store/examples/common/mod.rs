//! What the bench's publish contenders share: the manifest of every chunk set in a directory.

use std::path::Path;

use manifest::Manifest;
use manifest::layout::{CURRENT_GENERATION, current_tinygrad_commit};

/// A manifest of the current generation listing exactly the chunk sets in `artifacts`
/// (`<id>/<id>_driving_tinygrad.pkl.*`, as `release-cli chunk split` writes them).
pub fn manifest_of(artifacts: &Path) -> Result<Manifest, Box<dyn std::error::Error>> {
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
    Ok(manifest)
}
