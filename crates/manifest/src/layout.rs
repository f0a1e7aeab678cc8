//! Where things live in the two stores (docs/formats.md, "Store layout"), and the defaults that name them.
//! Every store path in the workspace is built here, so a layout change is a change to one file.
//!
//! | what | Hugging Face bucket | GitHub `Models` branch |
//! |---|---|---|
//! | manifest | `manifests/model_names_<gen>.json` | `model_names_<gen>.json` |
//! | its signature | `manifests/model_names_<gen>.json.minisig` | `model_names_<gen>.json.minisig` |
//! | artifact files | `models/<gen>/<id>/<file>` | `<gen>/<id>/<file>` |
//! | archived ONNX sources | `onnx/<source-id>/<file>` | — |

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::types::{BehaviorVersion, FileName, Generation, GitCommit, ModelId};

/// The Hugging Face bucket devices download from first.
pub const HF_BUCKET: &str = "StarPilot-Driving/StarPilot-Resources";
/// The Hugging Face endpoint bucket URLs are built on.
pub const HF_ENDPOINT: &str = "https://huggingface.co";
/// The GitHub repository devices fall back to, and its branch.
pub const GITHUB_REPO: &str = "firestar5683/StarPilot-Resources";
/// The branch of [`GITHUB_REPO`] that holds the manifests and artifacts.
pub const GITHUB_BRANCH: &str = "Models";
/// The endpoint raw GitHub file URLs are built on.
pub const GITHUB_RAW_ENDPOINT: &str = "https://raw.githubusercontent.com";

/// The generation this code publishes and devices running it read.
pub const CURRENT_GENERATION: Generation = Generation::new(25);
/// The tinygrad commit that defines [`CURRENT_GENERATION`]'s ABI.
pub const CURRENT_TINYGRAD_COMMIT: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";

/// The built-in model shipped in the openpilot tree: always installed, the fallback.
pub const BUILTIN_MODEL_ID: &str = "rdf43";
/// The built-in model's display name.
pub const BUILTIN_MODEL_NAME: &str = "Regret Driven Framework V4";
/// The built-in model's behaviour version.
pub const BUILTIN_MODEL_VERSION: BehaviorVersion = BehaviorVersion::new(15);

/// The driver-monitoring set: built once per generation, replaced together.
pub const DM_FILES: [&str; 4] = [
    "dmonitoring_model_tinygrad.pkl",
    "dmonitoring_model_metadata.pkl",
    "dm_warp_1928x1208_tinygrad.pkl",
    "dm_warp_1344x760_tinygrad.pkl",
];

/// Appended to the manifest's name: `model_names_v25.json.minisig`.
pub const SIGNATURE_SUFFIX: &str = ".minisig";

/// Suffix of every driving artifact: `<id>_driving_tinygrad.pkl`.
pub const ARTIFACT_SUFFIX: &str = "_driving_tinygrad.pkl";

/// [`CURRENT_TINYGRAD_COMMIT`] as a typed commit.
pub fn current_tinygrad_commit() -> GitCommit {
    CURRENT_TINYGRAD_COMMIT
        .parse()
        .expect("the pinned commit is 40 lowercase hex digits")
}

/// [`BUILTIN_MODEL_ID`] as a typed ID.
pub fn builtin_model_id() -> ModelId {
    BUILTIN_MODEL_ID
        .parse()
        .expect("the built-in model ID is valid")
}

/// `<id>_driving_tinygrad.pkl`, the logical artifact of a model.
pub fn artifact_file_name(id: &ModelId) -> FileName {
    format!("{id}{ARTIFACT_SUFFIX}")
        .parse()
        .expect("a model ID plus a fixed suffix is a valid file name")
}

/// `model_names_<gen>.json`.
pub fn manifest_file_name(generation: Generation) -> FileName {
    format!("model_names_{generation}.json")
        .parse()
        .expect("a generation makes a valid file name")
}

/// The generation a manifest file name `model_names_<gen>.json` is for; `None` for any other
/// name (the generation must be spelled canonically: `v025` is not `v25`).
pub fn parse_manifest_file_name(file: &str) -> Option<Generation> {
    file.strip_prefix("model_names_")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// A relative, `/`-separated path inside a store. It cannot be absolute, contain `..` or `.`,
/// empty segments, backslashes or control characters, so joining it onto a store root or URL
/// never escapes that root.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct StorePath(String);

impl StorePath {
    /// The path as written, `/`-separated.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path's segments, in order; none is empty, `.` or `..`.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// The last segment.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// Appends one or more segments (`a/b` allowed), each checked.
    pub fn join(&self, rest: &str) -> Result<Self> {
        format!("{}/{rest}", self.0).parse()
    }

    fn from_segments(segments: &[&str]) -> Self {
        let joined = segments.join("/");
        joined
            .parse()
            .expect("layout builds paths from validated segments")
    }

    /// The path with each segment percent-encoded for a URL (as Python's
    /// `urllib.parse.quote`, which devices use: unreserved characters stay, `/` separates).
    pub fn url_encoded(&self) -> String {
        let mut out = String::with_capacity(self.0.len());
        for b in self.0.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    }
}

impl FromStr for StorePath {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason: &str| Err(Error::invalid("store path", s, reason));
        if s.is_empty() {
            return bad("must not be empty");
        }
        if s.starts_with('/') {
            return bad("must be relative");
        }
        if s.contains('\\') {
            return bad("must use / as the only separator");
        }
        if s.chars().any(char::is_control) {
            return bad("must not contain control characters");
        }
        for seg in s.split('/') {
            match seg {
                "" => return bad("must not contain empty segments"),
                "." | ".." => return bad("must not contain . or .. segments"),
                _ => {}
            }
        }
        Ok(Self(s.to_owned()))
    }
}

impl fmt::Display for StorePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for StorePath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The two published layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreLayout {
    /// The Hugging Face bucket `StarPilot-Driving/StarPilot-Resources`.
    HfBucket,
    /// The `Models` branch of `firestar5683/StarPilot-Resources`.
    GithubBranch,
}

impl StoreLayout {
    /// HF `manifests/model_names_<gen>.json`; GitHub `model_names_<gen>.json`.
    pub fn manifest_path(self, generation: Generation) -> StorePath {
        let name = manifest_file_name(generation);
        match self {
            Self::HfBucket => StorePath::from_segments(&["manifests", name.as_str()]),
            Self::GithubBranch => StorePath::from_segments(&[name.as_str()]),
        }
    }

    /// The directory of every model of a generation: HF `models/<gen>`, GitHub `<gen>`.
    pub fn generation_dir(self, generation: Generation) -> StorePath {
        let generation = generation.to_string();
        match self {
            Self::HfBucket => StorePath::from_segments(&["models", &generation]),
            Self::GithubBranch => StorePath::from_segments(&[&generation]),
        }
    }

    /// The directory of a model's artifact files: HF `models/<gen>/<id>`, GitHub `<gen>/<id>`.
    pub fn artifact_dir(self, generation: Generation, id: &ModelId) -> StorePath {
        let dir = self.generation_dir(generation);
        StorePath::from_segments(&[dir.as_str(), id.as_str()])
    }

    /// One artifact file (logical artifact, chunk, `.chunkmanifest` or `.sha256`):
    /// HF `models/<gen>/<id>/<file>`, GitHub `<gen>/<id>/<file>`.
    pub fn artifact_path(self, generation: Generation, id: &ModelId, file: &FileName) -> StorePath {
        let dir = self.artifact_dir(generation, id);
        StorePath::from_segments(&[dir.as_str(), file.as_str()])
    }

    /// What `path` names in this layout: a generation's manifest (`None` as the rest), or
    /// something below a generation's directory (its path relative to that directory).
    fn locate(self, path: &StorePath) -> Option<(Generation, Option<&str>)> {
        let s = path.as_str();
        let manifest = match self {
            Self::HfBucket => s.strip_prefix("manifests/"),
            Self::GithubBranch => Some(s),
        };
        if let Some(generation) = manifest.and_then(parse_manifest_file_name) {
            return Some((generation, None));
        }
        let below = match self {
            Self::HfBucket => s.strip_prefix("models/")?,
            Self::GithubBranch => s,
        };
        let (generation, rest) = below.split_once('/')?;
        Some((generation.parse().ok()?, Some(rest)))
    }

    /// The same file in the layout `to`: a manifest, or anything below a generation's
    /// directory (a model directory, an artifact file). `None` for what `to` does not hold
    /// (`onnx/…`, a README, a generation directory itself).
    pub fn translate(self, path: &StorePath, to: StoreLayout) -> Option<StorePath> {
        // A manifest's detached signature sits beside it in both layouts.
        if let Some(manifest) = path
            .as_str()
            .strip_suffix(SIGNATURE_SUFFIX)
            .and_then(|m| m.parse::<StorePath>().ok())
            && let Some((generation, None)) = self.locate(&manifest)
        {
            return Some(to.signature_path(generation));
        }
        match self.locate(path)? {
            (generation, None) => Some(to.manifest_path(generation)),
            (generation, Some(rest)) => to.generation_dir(generation).join(rest).ok(),
        }
    }
}

/// HF `onnx/<source-id>/<file>`: the archived ONNX source of a model. Source IDs (`pop22`) follow
/// the model ID grammar but are not release IDs.
pub fn hf_onnx_path(source_id: &ModelId, file: &FileName) -> StorePath {
    StorePath::from_segments(&["onnx", source_id.as_str(), file.as_str()])
}

/// `https://huggingface.co/buckets/<bucket>/resolve/<path>`: what devices download (no revision
/// segment; buckets are unversioned).
pub fn hf_resolve_url(endpoint: &str, bucket: &str, path: &StorePath) -> String {
    format!(
        "{}/buckets/{bucket}/resolve/{}",
        endpoint.trim_end_matches('/'),
        path.url_encoded()
    )
}

/// `hf://buckets/<bucket>/<path>`: what the `hf` CLI copies to and from.
pub fn hf_bucket_uri(bucket: &str, path: &StorePath) -> String {
    format!("hf://buckets/{bucket}/{path}")
}

/// `https://raw.githubusercontent.com/<repo>/<branch>/<path>`.
pub fn github_raw_url(endpoint: &str, repo: &str, branch: &str, path: &StorePath) -> String {
    format!(
        "{}/{repo}/{branch}/{}",
        endpoint.trim_end_matches('/'),
        path.url_encoded()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ModelId {
        s.parse().unwrap()
    }

    #[test]
    fn paths_match_the_spec() {
        let v25 = CURRENT_GENERATION;
        let pop = id("pop223");
        let file = artifact_file_name(&pop);
        assert_eq!(file.as_str(), "pop223_driving_tinygrad.pkl");
        assert_eq!(
            StoreLayout::HfBucket.manifest_path(v25).as_str(),
            "manifests/model_names_v25.json"
        );
        assert_eq!(
            StoreLayout::GithubBranch.manifest_path(v25).as_str(),
            "model_names_v25.json"
        );
        assert_eq!(
            StoreLayout::HfBucket
                .artifact_path(v25, &pop, &file)
                .as_str(),
            "models/v25/pop223/pop223_driving_tinygrad.pkl"
        );
        assert_eq!(
            StoreLayout::GithubBranch
                .artifact_path(v25, &pop, &file)
                .as_str(),
            "v25/pop223/pop223_driving_tinygrad.pkl"
        );
        let onnx: FileName = "pop22_driving_supercombo.onnx".parse().unwrap();
        assert_eq!(
            hf_onnx_path(&id("pop22"), &onnx).as_str(),
            "onnx/pop22/pop22_driving_supercombo.onnx"
        );
    }

    #[test]
    fn urls_match_what_devices_fetch() {
        let path = StoreLayout::HfBucket.manifest_path(CURRENT_GENERATION);
        assert_eq!(
            hf_resolve_url(HF_ENDPOINT, HF_BUCKET, &path),
            "https://huggingface.co/buckets/StarPilot-Driving/StarPilot-Resources/resolve/manifests/model_names_v25.json"
        );
        assert_eq!(
            hf_bucket_uri(HF_BUCKET, &path),
            "hf://buckets/StarPilot-Driving/StarPilot-Resources/manifests/model_names_v25.json"
        );
        let gh = StoreLayout::GithubBranch.manifest_path(CURRENT_GENERATION);
        assert_eq!(
            github_raw_url(GITHUB_RAW_ENDPOINT, GITHUB_REPO, GITHUB_BRANCH, &gh),
            "https://raw.githubusercontent.com/firestar5683/StarPilot-Resources/Models/model_names_v25.json"
        );
        let odd: StorePath = "a b/c+d%é".parse().unwrap();
        assert_eq!(odd.url_encoded(), "a%20b/c%2Bd%25%C3%A9");
    }

    #[test]
    fn store_paths_refuse_escapes() {
        for bad in [
            "", "/abs", "a//b", "a/", "../x", "a/../b", "./a", "a\\b", "a/\u{0}",
        ] {
            assert!(bad.parse::<StorePath>().is_err(), "{bad:?}");
        }
        let p: StorePath = "models/v25".parse().unwrap();
        assert_eq!(p.join("x/y").unwrap().as_str(), "models/v25/x/y");
        assert!(p.join("..").is_err());
        assert!(p.join("").is_err());
        assert_eq!(p.join("x").unwrap().file_name(), "x");
        assert_eq!(p.segments().collect::<Vec<_>>(), ["models", "v25"]);
    }

    #[test]
    fn translates_between_the_layouts_both_ways() {
        let p = |s: &str| s.parse::<StorePath>().unwrap();
        let (hf, gh) = (StoreLayout::HfBucket, StoreLayout::GithubBranch);
        let cases = [
            ("manifests/model_names_v25.json", "model_names_v25.json"),
            (
                "models/v25/pop223/pop223_driving_tinygrad.pkl.chunk01of02",
                "v25/pop223/pop223_driving_tinygrad.pkl.chunk01of02",
            ),
            ("models/v25/pop223", "v25/pop223"),
        ];
        for (bucket, github) in cases {
            assert_eq!(hf.translate(&p(bucket), gh), Some(p(github)), "{bucket}");
            assert_eq!(gh.translate(&p(github), hf), Some(p(bucket)), "{github}");
        }
        for bucket in [
            "onnx/pop22/x.onnx",
            "manifests/other.json",
            "manifests/model_names_v025.json",
            "models/latest/x",
            "models/v25",
            "manifests",
        ] {
            assert_eq!(hf.translate(&p(bucket), gh), None, "{bucket}");
        }
        for github in ["README.md", "model_names_x.json", "docs/a.md", "v25"] {
            assert_eq!(gh.translate(&p(github), hf), None, "{github}");
        }
        assert_eq!(
            parse_manifest_file_name("model_names_v25.json"),
            Some(CURRENT_GENERATION)
        );
        assert_eq!(hf.generation_dir(CURRENT_GENERATION).as_str(), "models/v25");
        assert_eq!(gh.generation_dir(CURRENT_GENERATION).as_str(), "v25");
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(current_tinygrad_commit().as_str(), CURRENT_TINYGRAD_COMMIT);
        assert_eq!(builtin_model_id().as_str(), "rdf43");
        assert_eq!(BUILTIN_MODEL_VERSION.to_string(), "v15");
        assert!(BUILTIN_MODEL_NAME.parse::<crate::ModelName>().is_ok());
        for f in DM_FILES {
            assert!(f.parse::<FileName>().is_ok());
        }
    }
}
