//! The two places a device downloads from, in order: the Hugging Face bucket, then GitHub raw.
//! Paths come from `manifest::layout`, so only the generation's versioned paths are ever built.

use std::fmt;

use manifest::{FileName, Generation, ModelId, StoreLayout, StorePath};

/// Default Hugging Face base (resolve endpoint of the bucket, no revision segment).
pub const DEFAULT_HF_BASE: &str =
    "https://huggingface.co/buckets/StarPilot-Driving/StarPilot-Resources/resolve";
/// Default GitHub base (raw files of the `Models` branch).
pub const DEFAULT_GITHUB_BASE: &str =
    "https://raw.githubusercontent.com/firestar5683/StarPilot-Resources/Models";

/// Which store an origin is: it decides the path layout under the base URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OriginKind {
    /// A Hugging Face bucket (resolve URLs).
    HuggingFace,
    /// The raw files of a GitHub branch.
    GitHub,
}

/// One origin: a base URL and the layout of paths under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Which store it is.
    pub kind: OriginKind,
    base: String,
}

impl Origin {
    /// An origin of `kind` at `base` (a trailing `/` is dropped).
    pub fn new(kind: OriginKind, base: &str) -> Self {
        Self {
            kind,
            base: base.trim_end_matches('/').to_string(),
        }
    }

    /// The base URL, without a trailing `/`.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn layout(&self) -> StoreLayout {
        match self.kind {
            OriginKind::HuggingFace => StoreLayout::HfBucket,
            OriginKind::GitHub => StoreLayout::GithubBranch,
        }
    }

    /// The URL of a store path under this origin (each segment URL-encoded).
    pub fn url(&self, path: &StorePath) -> String {
        format!("{}/{}", self.base, path.url_encoded())
    }

    /// The URL of `generation`'s manifest, `.../model_names_<gen>.json` in this origin's layout.
    pub fn manifest_url(&self, generation: Generation) -> String {
        self.url(&self.layout().manifest_path(generation))
    }

    /// The URL of `file` of model `id` in `generation`, in this origin's layout.
    pub fn artifact_url(&self, generation: Generation, id: &ModelId, file: &FileName) -> String {
        self.url(&self.layout().artifact_path(generation, id, file))
    }

    /// `Hugging Face` or `GitHub`.
    pub fn name(&self) -> &'static str {
        match self.kind {
            OriginKind::HuggingFace => "Hugging Face",
            OriginKind::GitHub => "GitHub",
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.base)
    }
}

/// Hugging Face first, GitHub second; nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origins(Vec<Origin>);

impl Origins {
    /// Hugging Face at `hf_base` first, then GitHub at `github_base`.
    pub fn new(hf_base: &str, github_base: &str) -> Self {
        Self(vec![
            Origin::new(OriginKind::HuggingFace, hf_base),
            Origin::new(OriginKind::GitHub, github_base),
        ])
    }

    /// The origins, in the order they are asked.
    pub fn iter(&self) -> impl Iterator<Item = &Origin> {
        self.0.iter()
    }
}

impl Default for Origins {
    fn default() -> Self {
        Self::new(DEFAULT_HF_BASE, DEFAULT_GITHUB_BASE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_versioned_paths() {
        let o = Origins::default();
        let v25: Generation = "v25".parse().unwrap();
        let id: ModelId = "pop223".parse().unwrap();
        let f: FileName = "pop223_driving_tinygrad.pkl.chunk01of02".parse().unwrap();
        let urls: Vec<_> = o.iter().map(|o| o.artifact_url(v25, &id, &f)).collect();
        assert_eq!(
            urls,
            [
                "https://huggingface.co/buckets/StarPilot-Driving/StarPilot-Resources/resolve/models/v25/pop223/pop223_driving_tinygrad.pkl.chunk01of02",
                "https://raw.githubusercontent.com/firestar5683/StarPilot-Resources/Models/v25/pop223/pop223_driving_tinygrad.pkl.chunk01of02",
            ]
        );
        let m: Vec<_> = o.iter().map(|o| o.manifest_url(v25)).collect();
        assert!(m[0].ends_with("/resolve/manifests/model_names_v25.json"));
        assert!(m[1].ends_with("/Models/model_names_v25.json"));
        assert!(m.iter().chain(&urls).all(|u| !u.contains("gitlab")));
    }
}
