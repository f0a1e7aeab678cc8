//! Mapping between the bucket layout every `Store` speaks and the GitHub `Models` branch layout
//! (SPEC.md section 4), built on `manifest::layout` so the names are defined once:
//!
//! | bucket (store path) | GitHub branch |
//! |---|---|
//! | `manifests/model_names_<gen>.json` | `model_names_<gen>.json` |
//! | `models/<gen>/<id>/<file>` | `<gen>/<id>/<file>` |
//! | anything else (`onnx/…`) | not on the branch |

use manifest::{Generation, StoreLayout};

use crate::paths::StorePath;

const MANIFESTS_DIR: &str = "manifests";
const MODELS_DIR: &str = "models";

/// The generation named by a manifest file name `model_names_<gen>.json`.
fn manifest_generation(file: &str) -> Option<Generation> {
    let generation: Generation = file
        .strip_prefix("model_names_")?
        .strip_suffix(".json")?
        .parse()
        .ok()?;
    // Only the exact canonical spelling maps (no `v025`).
    (StoreLayout::GithubBranch.manifest_path(generation).as_str() == file).then_some(generation)
}

fn canonical_generation(seg: &str) -> Option<Generation> {
    let g: Generation = seg.parse().ok()?;
    (g.to_string() == seg).then_some(g)
}

/// Bucket layout → GitHub branch layout; `None` when the branch does not hold such a file.
pub fn bucket_to_github(path: &StorePath) -> Option<StorePath> {
    let segs: Vec<&str> = path.segments().collect();
    match segs.as_slice() {
        [MANIFESTS_DIR, file] => {
            manifest_generation(file).map(|g| StoreLayout::GithubBranch.manifest_path(g))
        }
        [MODELS_DIR, generation, rest @ ..] if !rest.is_empty() => {
            canonical_generation(generation)?;
            Some(
                segs[1..]
                    .join("/")
                    .parse()
                    .expect("segments of a valid path"),
            )
        }
        _ => None,
    }
}

/// GitHub branch layout → bucket layout; `None` for files that are not part of the layout
/// (README, other branches' leftovers).
pub fn github_to_bucket(path: &StorePath) -> Option<StorePath> {
    let segs: Vec<&str> = path.segments().collect();
    match segs.as_slice() {
        [file] => manifest_generation(file).map(|g| StoreLayout::HfBucket.manifest_path(g)),
        [generation, rest @ ..] if !rest.is_empty() => {
            canonical_generation(generation)?;
            Some(
                format!("{MODELS_DIR}/{}", path.as_str())
                    .parse()
                    .expect("segments of a valid path"),
            )
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> StorePath {
        s.parse().unwrap()
    }

    #[test]
    fn maps_both_ways() {
        let cases = [
            ("manifests/model_names_v25.json", "model_names_v25.json"),
            (
                "models/v25/pop223/pop223_driving_tinygrad.pkl.chunk01of02",
                "v25/pop223/pop223_driving_tinygrad.pkl.chunk01of02",
            ),
            ("models/v25/pop223", "v25/pop223"),
        ];
        for (bucket, github) in cases {
            assert_eq!(bucket_to_github(&p(bucket)), Some(p(github)), "{bucket}");
            assert_eq!(github_to_bucket(&p(github)), Some(p(bucket)), "{github}");
        }
    }

    #[test]
    fn outside_the_layout_maps_to_nothing() {
        for bucket in [
            "onnx/pop22/x.onnx",
            "manifests/other.json",
            "manifests/model_names_v025.json",
            "models/latest/x",
            "models/v25",
            "manifests",
        ] {
            assert_eq!(bucket_to_github(&p(bucket)), None, "{bucket}");
        }
        for github in ["README.md", "model_names_x.json", "docs/a.md", "v25"] {
            assert_eq!(github_to_bucket(&p(github)), None, "{github}");
        }
    }
}
