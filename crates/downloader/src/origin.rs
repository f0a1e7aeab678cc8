//! The two places a device downloads from, in order: the Hugging Face bucket, then GitHub raw.
//! Paths come from `manifest::layout`, so only the generation's versioned paths are ever built.

use std::fmt;

use manifest::{FileName, Generation, ModelId, StoreLayout, StorePath};

use crate::error::{Error, Result};

/// Default Hugging Face base (resolve endpoint of the bucket, no revision segment).
pub const DEFAULT_HF_BASE: &str =
    "https://huggingface.co/buckets/StarPilot-Driving/StarPilot-Resources/resolve";
/// Default GitHub base (raw files of the `Models` branch).
pub const DEFAULT_GITHUB_BASE: &str =
    "https://raw.githubusercontent.com/firestar5683/StarPilot-Resources/Models";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OriginKind {
    HuggingFace,
    GitHub,
}

/// One origin: a base URL and the layout of paths under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub kind: OriginKind,
    base: String,
}

impl Origin {
    pub fn new(kind: OriginKind, base: &str) -> Self {
        Self {
            kind,
            base: base.trim_end_matches('/').to_string(),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn layout(&self) -> StoreLayout {
        match self.kind {
            OriginKind::HuggingFace => StoreLayout::HfBucket,
            OriginKind::GitHub => StoreLayout::GithubBranch,
        }
    }

    pub fn url(&self, path: &StorePath) -> String {
        format!("{}/{}", self.base, path.url_encoded())
    }

    pub fn manifest_url(&self, generation: Generation) -> String {
        self.url(&self.layout().manifest_path(generation))
    }

    pub fn artifact_url(&self, generation: Generation, id: &ModelId, file: &FileName) -> String {
        self.url(&self.layout().artifact_path(generation, id, file))
    }

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
    pub fn new(hf_base: &str, github_base: &str) -> Self {
        Self(vec![
            Origin::new(OriginKind::HuggingFace, hf_base),
            Origin::new(OriginKind::GitHub, github_base),
        ])
    }

    pub fn iter(&self) -> impl Iterator<Item = &Origin> {
        self.0.iter()
    }

    /// The origin-fallback loop of the manifest fetch, the download plan and the download:
    /// `attempt` each origin in order until one answers. An error `stops` says no other origin
    /// can fix (a cancel, a local file error) is returned at once, no further origin tried;
    /// every other failure is kept, in order, with the origin it came from.
    pub(crate) fn first_answer<'o, T>(
        &'o self,
        stops: impl Fn(&Error) -> bool,
        mut attempt: impl FnMut(&'o Origin) -> Result<T>,
    ) -> Result<Tried<'o, T>> {
        let mut failed = Vec::new();
        for origin in self.iter() {
            match attempt(origin) {
                Ok(value) => {
                    return Ok(Tried::Answered {
                        value,
                        origin,
                        failed,
                    });
                }
                Err(e) if stops(&e) => return Err(e),
                Err(e) => failed.push((origin.to_string(), e)),
            }
        }
        Ok(Tried::NoneAnswered(failed))
    }
}

/// What [`Origins::first_answer`] came to.
#[derive(Debug)]
pub(crate) enum Tried<'o, T> {
    /// `origin` answered `value`, after the `failed` attempts before it.
    Answered {
        value: T,
        origin: &'o Origin,
        failed: Vec<(String, Error)>,
    },
    /// Every origin failed: each one's error, in order.
    NoneAnswered(Vec<(String, Error)>),
}

impl Default for Origins {
    fn default() -> Self {
        Self::new(DEFAULT_HF_BASE, DEFAULT_GITHUB_BASE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fallback loop: the first answer wins, with the failures before it; an error that
    /// stops ends the loop at once (no later origin asked); all failing keeps each failure.
    #[test]
    fn the_first_origin_that_answers_wins_and_a_stopping_error_ends_the_loop() {
        let o = Origins::default();
        let net = |u: &str| Error::Transport {
            url: u.into(),
            message: "reset".into(),
        };
        let local = || Error::Cancelled { model: "m".into() };
        type Case = (Vec<Result<u8>>, Result<(u8, usize, usize), usize>, usize);
        // (answers in order, Ok((value, answering origin, failures before)) | Err(failures),
        //  origins asked); Err(usize::MAX): the stopping error came back.
        let cases: Vec<Case> = vec![
            (vec![Ok(1), Ok(2)], Ok((1, 0, 0)), 1),
            (vec![Err(net("hf")), Ok(2)], Ok((2, 1, 1)), 2),
            (vec![Err(net("hf")), Err(net("gh"))], Err(2), 2),
            (vec![Err(local()), Ok(2)], Err(usize::MAX), 1),
            (vec![Err(net("hf")), Err(local())], Err(usize::MAX), 2),
        ];
        for (answers, want, asked_want) in cases {
            let mut answers = answers.into_iter();
            let mut asked = 0;
            let got = o.first_answer(Error::is_local, |_| {
                asked += 1;
                answers.next().unwrap()
            });
            let got = match got {
                Ok(Tried::Answered {
                    value,
                    origin,
                    failed,
                }) => {
                    let at = o.iter().position(|x| x == origin).unwrap();
                    assert!(failed.iter().all(|(_, e)| !e.is_local()));
                    Ok((value, at, failed.len()))
                }
                Ok(Tried::NoneAnswered(failed)) => {
                    let names: Vec<String> = o.iter().map(|x| x.to_string()).collect();
                    let origins: Vec<String> = failed.iter().map(|(n, _)| n.clone()).collect();
                    assert_eq!(origins, names, "each failure names its origin, in order");
                    Err(failed.len())
                }
                Err(e) => {
                    assert!(e.is_local(), "{e}");
                    Err(usize::MAX)
                }
            };
            assert_eq!(got, want);
            assert_eq!(asked, asked_want);
        }
    }

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
