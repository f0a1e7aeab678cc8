//! Store names as users type them, parsed once:
//!
//! | spelling | store |
//! |---|---|
//! | `PATH`, `file:PATH`, `file://PATH` | [`LocalStore`] |
//! | `hf://buckets/NS/NAME` | [`HfBucketStore`] |
//! | `hf://datasets/ORG/REPO`, `hf://models/ORG/REPO` | [`HfRepoStore`] (read-only) |
//! | `github:PATH` | [`GithubStore`] (a checkout of the `Models` branch) |
//!
//! Anything else with a `word:` prefix (`hf:/buckets/…`, `hf:buckets/…`, `gh:…`, `s3://…`) is
//! refused ([`scheme_prefix`]): a typo must never become a local folder in the working
//! directory, which would bypass the Hugging Face-before-GitHub order and exit 0. A local
//! directory whose name really starts with `word:` is written `./word:…` or `file:word:…`.
//!
//! A [`Location`] is a store plus a path in it; as a reuse source it may also be a Hub repository
//! file, `hf://datasets/ORG/REPO[@REV]/PATH` (or `hf://models/...`), which is read-only here.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::github::GithubStore;
use crate::hf::{HfBucketStore, HfConfig, HubFile, HubHttp};
use crate::local::LocalStore;
use crate::paths::StorePath;
use crate::progress::Transfer;
use crate::store::{FileStat, ListEntry, Store, StoreName};

/// A parsed store name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// A local directory (`file:PATH`, or a plain path).
    Local(PathBuf),
    /// A Hugging Face bucket (`hf://buckets/NS/NAME`).
    HfBucket {
        /// `NS/NAME`.
        bucket: String,
    },
    /// A checkout of the GitHub `Models` branch (`github:PATH`).
    Github(PathBuf),
    /// `hf://datasets/ORG/REPO` or `hf://models/ORG/REPO`, read-only (a reuse source).
    HfRepo {
        /// `datasets` or `models`.
        kind: RepoKind,
        /// `ORG/REPO`.
        repo: String,
        /// The revision after `@`, when given.
        revision: Option<String>,
    },
}

/// How stores are reached, one value for every store a command opens: the `hf` CLI Hugging Face
/// stores run (read with the rest of the Hub settings each time a store is opened) and the
/// branch a `github:` checkout must be on. With feature `cli`, the flags `--hf-cli` and
/// `--github-branch` every store-opening command of release-cli flattens.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct StoreAccess {
    /// The `hf` CLI to run for Hugging Face stores (default: `HF_CLI`, else `hf` on PATH).
    #[cfg_attr(feature = "cli", arg(long, value_name = "PATH"))]
    pub hf_cli: Option<PathBuf>,
    /// The branch a `github:` checkout must be on.
    #[cfg_attr(
        feature = "cli",
        arg(long, default_value = manifest::layout::GITHUB_BRANCH, value_name = "BRANCH")
    )]
    pub github_branch: String,
}

impl StoreAccess {
    /// The Hub settings from the environment, with this `hf` CLI.
    pub fn hf(&self) -> HfConfig {
        HfConfig::from_env(self.hf_cli.clone())
    }
}

/// Where a directory store's path leads: canonical when it exists, else made absolute against
/// the working directory, else as given. Two names of one directory resolve alike.
pub fn resolved(p: &Path) -> PathBuf {
    std::fs::canonicalize(p)
        .or_else(|_| std::path::absolute(p))
        .unwrap_or_else(|_| p.to_path_buf())
}

/// The kind of a Hugging Face repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepoKind {
    /// `hf://datasets/...`.
    Datasets,
    /// `hf://models/...`.
    Models,
}

impl RepoKind {
    fn as_str(self) -> &'static str {
        match self {
            RepoKind::Datasets => "datasets",
            RepoKind::Models => "models",
        }
    }
}

/// The name [`StoreSpec::parse`] reads back as the same store (a Hub repository: as the store
/// part of a [`Location`]): a directory as its plain path, or as `file:PATH` when the plain
/// path would read as another store or be refused (`hf://…`, `github:…`, `word:…`, empty) or
/// is not the path itself (bytes lost to display).
impl fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreSpec::Local(p) => {
                let plain = p.display().to_string();
                if plain.is_empty() || scheme_prefix(&plain).is_some() || Path::new(&plain) != p {
                    write!(f, "file:{plain}")
                } else {
                    f.write_str(&plain)
                }
            }
            StoreSpec::HfBucket { bucket } => write!(f, "hf://buckets/{bucket}"),
            StoreSpec::Github(p) => write!(f, "github:{}", p.display()),
            StoreSpec::HfRepo {
                kind,
                repo,
                revision,
            } => {
                write!(f, "hf://{}/{repo}", kind.as_str())?;
                if let Some(r) = revision {
                    write!(f, "@{r}")?;
                }
                Ok(())
            }
        }
    }
}

/// A store and a path inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The store.
    pub store: StoreSpec,
    /// The path inside it.
    pub path: StorePath,
}

fn invalid(spec: &str, reason: impl Into<String>) -> Error {
    Error::InvalidStore {
        spec: spec.to_string(),
        reason: reason.into(),
    }
}

/// Split `hf://KIND/NS/NAME[/REST]` into (kind, "NS/NAME", rest).
fn split_hub(spec: &str) -> Result<(String, String, Option<String>)> {
    let rest = spec.strip_prefix("hf://").expect("caller checked");
    let mut parts = rest.splitn(4, '/');
    let kind = parts.next().unwrap_or_default().to_string();
    let ns = parts.next().unwrap_or_default();
    let name = parts.next().unwrap_or_default();
    if ns.is_empty() || name.is_empty() {
        return Err(invalid(
            spec,
            format!("expected hf://{kind}/NAMESPACE/NAME"),
        ));
    }
    let tail = parts.next().filter(|t| !t.is_empty()).map(str::to_string);
    Ok((kind, format!("{ns}/{name}"), tail))
}

pub use crate::refusal::ACCEPTED_STORE_FORMS;

/// The `word` of a leading `word:` (letters, digits, `+`, `-`, `.`, starting with a letter, as
/// in a URL scheme), when there is one. `C:\x` style drive letters count too: this tool runs
/// on Linux and macOS, where such a name is a typo as well.
pub fn scheme_prefix(spec: &str) -> Option<&str> {
    let (word, _) = spec.split_once(':')?;
    let mut chars = word.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(word)
}

/// Refuse an unknown `word:` prefix, naming the closest accepted form when the word is a
/// likely typo of one.
fn unknown_prefix(spec: &str, word: &str) -> Error {
    let hint = match word.to_ascii_lowercase().as_str() {
        "hf" | "huggingface" | "hugging-face" => {
            " (Hugging Face stores are written hf://buckets/NS/NAME, with two slashes)"
        }
        "gh" | "git" | "github" => " (a GitHub checkout is written github:PATH)",
        "file" => " (write file:PATH or file://PATH)",
        _ => "",
    };
    invalid(spec, format!("unknown store prefix {word:?}{hint}"))
}

impl StoreSpec {
    /// Parse a store name (no path inside the store).
    pub fn parse(spec: &str) -> Result<Self> {
        if spec.starts_with("hf://") {
            let (kind, id, tail) = split_hub(spec)?;
            if tail.is_some() {
                return Err(invalid(
                    spec,
                    "a store is the bucket itself; drop the path after NAMESPACE/NAME",
                ));
            }
            return match kind.as_str() {
                "buckets" => Ok(StoreSpec::HfBucket { bucket: id }),
                "datasets" | "models" => Err(invalid(
                    spec,
                    "Hub repositories are read-only here (a reuse --from source); publish to a bucket",
                )),
                other => Err(invalid(spec, format!("unknown Hub kind {other:?}"))),
            };
        }
        if let Some(path) = spec.strip_prefix("github:") {
            if path.is_empty() {
                return Err(invalid(
                    spec,
                    "github: needs the path of a Models branch checkout",
                ));
            }
            return Ok(StoreSpec::Github(PathBuf::from(path)));
        }
        if let Some(path) = spec
            .strip_prefix("file://")
            .or_else(|| spec.strip_prefix("file:"))
        {
            if path.is_empty() {
                return Err(invalid(spec, "file: needs a path"));
            }
            return Ok(StoreSpec::Local(PathBuf::from(path)));
        }
        if let Some(word) = scheme_prefix(spec) {
            return Err(unknown_prefix(spec, word));
        }
        if spec.is_empty() {
            return Err(invalid(spec, "empty"));
        }
        Ok(StoreSpec::Local(PathBuf::from(spec)))
    }

    /// Whether the store is on the Hugging Face Hub (a bucket or a repository).
    pub fn is_hf(&self) -> bool {
        matches!(self, StoreSpec::HfBucket { .. } | StoreSpec::HfRepo { .. })
    }

    /// Whether the store is a GitHub checkout.
    pub fn is_github(&self) -> bool {
        matches!(self, StoreSpec::Github(_))
    }

    /// Whether two names are the same store: the same bucket, or the same directory however it
    /// is spelt (`./store`, `store/`, an absolute path). Used to tell which `--to` is the one
    /// `publish --hub` names.
    pub fn same_store(&self, other: &StoreSpec) -> bool {
        match (self, other) {
            (StoreSpec::Local(a), StoreSpec::Local(b))
            | (StoreSpec::Github(a), StoreSpec::Github(b)) => resolved(a) == resolved(b),
            (a, b) => a == b,
        }
    }

    /// Open the store. A GitHub checkout is checked (branch, clean, in sync) here.
    pub fn open(&self, access: &StoreAccess) -> Result<Box<dyn Store>> {
        Ok(match self {
            StoreSpec::Local(p) => Box::new(LocalStore::new(p.clone())),
            StoreSpec::HfBucket { bucket } => Box::new(HfBucketStore::new(bucket, access.hf())?),
            StoreSpec::Github(p) => Box::new(GithubStore::open(p.clone(), &access.github_branch)?),
            StoreSpec::HfRepo {
                kind,
                repo,
                revision,
            } => Box::new(HfRepoStore::new(
                *kind,
                repo,
                revision.clone(),
                &access.hf(),
            )?),
        })
    }
}

impl Location {
    /// Parse a file location: `hf://buckets/NS/NAME/PATH`, `hf://datasets/ORG/REPO[@REV]/PATH`,
    /// `hf://models/ORG/REPO[@REV]/PATH`, `github:CHECKOUT//PATH`, or a local file path (whose
    /// parent directory becomes the store).
    pub fn parse(spec: &str) -> Result<Self> {
        let need_path =
            |spec: &str| invalid(spec, "needs a path inside the store after the store name");
        let path = |s: &str, spec: &str| -> Result<StorePath> {
            s.parse()
                .map_err(|e: manifest::Error| invalid(spec, e.to_string()))
        };
        if spec.starts_with("hf://") {
            let (kind, id, tail) = split_hub(spec)?;
            let tail = tail.ok_or_else(|| need_path(spec))?;
            let store = match kind.as_str() {
                "buckets" => StoreSpec::HfBucket { bucket: id },
                "datasets" | "models" => {
                    let (repo, revision) = match id.split_once('@') {
                        Some((r, rev)) if !rev.is_empty() => (r.to_string(), Some(rev.to_string())),
                        Some(_) => return Err(invalid(spec, "empty revision after '@'")),
                        None => (id, None),
                    };
                    StoreSpec::HfRepo {
                        kind: if kind == "datasets" {
                            RepoKind::Datasets
                        } else {
                            RepoKind::Models
                        },
                        repo,
                        revision,
                    }
                }
                other => return Err(invalid(spec, format!("unknown Hub kind {other:?}"))),
            };
            return Ok(Location {
                store,
                path: path(&tail, spec)?,
            });
        }
        if let Some(rest) = spec.strip_prefix("github:") {
            let (checkout, inner) = rest.split_once("//").ok_or_else(|| need_path(spec))?;
            return Ok(Location {
                store: StoreSpec::Github(PathBuf::from(checkout)),
                path: path(inner, spec)?,
            });
        }
        let local = spec
            .strip_prefix("file://")
            .or_else(|| spec.strip_prefix("file:"))
            .unwrap_or(spec);
        if local.len() == spec.len()
            && let Some(word) = scheme_prefix(spec)
        {
            return Err(unknown_prefix(spec, word));
        }
        let p = PathBuf::from(local);
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| invalid(spec, "a local location must name a file"))?;
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Ok(Location {
            store: StoreSpec::Local(dir),
            path: path(name, spec)?,
        })
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.store {
            StoreSpec::Local(p) => write!(f, "{}", p.join(self.path.as_str()).display()),
            StoreSpec::Github(p) => write!(f, "github:{}//{}", p.display(), self.path),
            other => write!(f, "{other}/{}", self.path),
        }
    }
}

/// A Hub dataset or model repository, read over HTTP
/// (`<endpoint>/datasets/ORG/REPO/resolve/<rev>/<path>`). Only a reuse source: writes are
/// refused, and listing is not offered (reuse reads the `.chunkmanifest` instead).
#[derive(Debug, Clone)]
pub struct HfRepoStore {
    kind: RepoKind,
    repo: String,
    revision: Option<String>,
    http: HubHttp,
}

impl HfRepoStore {
    /// A read-only store over a Hub repository at `revision` (default `main`).
    /// [`Error::InvalidStore`] when the endpoint is not a URL.
    pub fn new(
        kind: RepoKind,
        repo: &str,
        revision: Option<String>,
        hf: &HfConfig,
    ) -> Result<Self> {
        Ok(Self {
            kind,
            repo: repo.to_string(),
            revision,
            http: HubHttp::new(hf)?,
        })
    }

    fn resolve_url(&self, path: &StorePath) -> String {
        let prefix = match self.kind {
            RepoKind::Datasets => "datasets/",
            RepoKind::Models => "",
        };
        format!(
            "{}/{prefix}{}/resolve/{}/{}",
            self.http.endpoint(),
            self.repo,
            self.revision.as_deref().unwrap_or("main"),
            path.url_encoded()
        )
    }

    fn file<'a>(&'a self, path: &'a StorePath) -> HubFile<'a> {
        HubFile {
            http: &self.http,
            url: self.resolve_url(path),
            store: self,
            path,
        }
    }

    fn read_only(&self, path: &StorePath) -> Error {
        Error::Unsupported {
            store: self.describe(),
            path: path.to_string(),
            reason: "Hub repositories are read-only here".into(),
        }
    }
}

impl Store for HfRepoStore {
    fn name(&self) -> StoreName {
        let spec = StoreSpec::HfRepo {
            kind: self.kind,
            repo: self.repo.clone(),
            revision: self.revision.clone(),
        };
        StoreName {
            name: spec.to_string(),
            layout: manifest::StoreLayout::HfBucket,
        }
    }

    fn hub_uri(&self, path: &StorePath) -> Option<String> {
        Some(format!("{}/{}", self.describe(), path))
    }

    fn stat(&self, path: &StorePath) -> Result<Option<FileStat>> {
        self.file(path).stat()
    }

    fn open(&self, path: &StorePath) -> Result<Box<dyn Read + Send>> {
        self.file(path).open()
    }

    fn read_at(&self, path: &StorePath, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.file(path).read_at(offset, buf)
    }

    fn write_reporting(
        &self,
        path: &StorePath,
        _src: &mut dyn Read,
        _report: &mut dyn FnMut(Transfer),
    ) -> Result<u64> {
        Err(self.read_only(path))
    }

    fn list(&self, prefix: &StorePath) -> Result<Vec<ListEntry>> {
        Err(self.read_only(prefix))
    }

    fn copy(&self, from: &StorePath, _to: &StorePath) -> Result<()> {
        Err(self.read_only(from))
    }

    fn delete(&self, path: &StorePath) -> Result<bool> {
        Err(self.read_only(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_names() {
        assert_eq!(
            StoreSpec::parse("/srv/store").unwrap(),
            StoreSpec::Local("/srv/store".into())
        );
        assert_eq!(
            StoreSpec::parse("file:///srv/store").unwrap(),
            StoreSpec::Local("/srv/store".into())
        );
        assert_eq!(
            StoreSpec::parse("hf://buckets/StarPilot-Driving/StarPilot-Resources").unwrap(),
            StoreSpec::HfBucket {
                bucket: "StarPilot-Driving/StarPilot-Resources".into()
            }
        );
        assert_eq!(
            StoreSpec::parse("github:../res").unwrap(),
            StoreSpec::Github("../res".into())
        );
        assert_eq!(
            StoreSpec::parse("file:rel/store").unwrap(),
            StoreSpec::Local("rel/store".into())
        );
        assert_eq!(
            StoreSpec::parse("./hf:odd").unwrap(),
            StoreSpec::Local("./hf:odd".into())
        );
        for bad in [
            "",
            "s3://x/y",
            // The typos that used to become local folders and publish "successfully".
            "hf:/buckets/StarPilot-Driving/StarPilot-Resources",
            "hf:buckets/StarPilot-Driving/StarPilot-Resources",
            "gh:../res",
            "git:../res",
            "C:store",
            "file:",
            "hf://buckets/only",
            "hf://buckets/a/b/extra",
            "hf://datasets/a/b",
            "hf://spaces/a/b",
            "github:",
            "file://",
        ] {
            assert!(StoreSpec::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// What hints print (a store's Display) is read back as the same store, in every form.
    #[test]
    fn display_reads_back_as_the_same_store() {
        for typed in [
            "hf://buckets/StarPilot-Driving/StarPilot-Resources",
            "github:../res",
            "github:/srv/a checkout",
            "file:rel/store",
            "file:///srv/store",
            "rel/store",
            "/srv/my store",
            "./hf:odd",
            "file:hf:odd",
            "file:hf://buckets/a/b",
            "file:github:x",
            "file:file:x",
            "file:C:store",
        ] {
            let spec = StoreSpec::parse(typed).unwrap();
            let shown = spec.to_string();
            assert_eq!(
                StoreSpec::parse(&shown).unwrap(),
                spec,
                "{typed} shown as {shown}"
            );
        }
        assert_eq!(
            StoreSpec::Local("/srv/my store".into()).to_string(),
            "/srv/my store"
        );
        assert_eq!(StoreSpec::Local("hf:odd".into()).to_string(), "file:hf:odd");
        // A Hub repository is only ever a reuse source: its name is the store part of a
        // location.
        for typed in [
            "hf://datasets/org/repo/x.pkl",
            "hf://models/org/repo@abc/dir/x.pkl",
        ] {
            let l = Location::parse(typed).unwrap();
            let shown = format!("{}/{}", l.store, l.path);
            assert_eq!(shown, typed);
            assert_eq!(Location::parse(&shown).unwrap(), l);
        }
    }

    #[test]
    fn refusals_name_the_accepted_forms() {
        let e = StoreSpec::parse("hf:/buckets/a/b").unwrap_err().to_string();
        assert!(e.contains("two slashes"), "{e}");
        assert!(e.contains(ACCEPTED_STORE_FORMS), "{e}");
        let e = StoreSpec::parse("gh:x").unwrap_err().to_string();
        assert!(e.contains("github:PATH"), "{e}");
        assert_eq!(scheme_prefix("hf:/x"), Some("hf"));
        assert_eq!(scheme_prefix("/abs/hf:x"), None);
        assert_eq!(scheme_prefix("rel/dir"), None);
        assert_eq!(scheme_prefix("1x:y"), None);
    }

    #[test]
    fn locations() {
        let l = Location::parse("hf://datasets/org/repo/dir/x_driving_tinygrad.pkl").unwrap();
        assert_eq!(
            l.store,
            StoreSpec::HfRepo {
                kind: RepoKind::Datasets,
                repo: "org/repo".into(),
                revision: None
            }
        );
        assert_eq!(l.path.as_str(), "dir/x_driving_tinygrad.pkl");
        assert_eq!(
            l.to_string(),
            "hf://datasets/org/repo/dir/x_driving_tinygrad.pkl"
        );
        let l = Location::parse("hf://datasets/org/repo@abc/x.pkl").unwrap();
        assert_eq!(l.to_string(), "hf://datasets/org/repo@abc/x.pkl");
        let l = Location::parse("hf://buckets/a/b/models/v24/p/p.pkl").unwrap();
        assert_eq!(
            l.store,
            StoreSpec::HfBucket {
                bucket: "a/b".into()
            }
        );
        assert_eq!(l.path.as_str(), "models/v24/p/p.pkl");
        let l = Location::parse("/tmp/build/p.pkl").unwrap();
        assert_eq!(l.store, StoreSpec::Local("/tmp/build".into()));
        assert_eq!(l.path.as_str(), "p.pkl");
        let l = Location::parse("github:/co//v25/p/p.pkl").unwrap();
        assert_eq!(l.store, StoreSpec::Github("/co".into()));
        for bad in [
            "hf://datasets/org/repo",
            "hf://datasets/org/repo/../x",
            "hf://datasets/org/repo@/x",
            "github:/co",
            "ftp://x/y",
            "hf:/buckets/a/b/x.pkl",
            "gh:/co//x.pkl",
        ] {
            assert!(Location::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
