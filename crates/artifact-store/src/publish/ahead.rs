//! GitHub never ahead of the Hub (docs/release.md, "The release gates"): devices try Hugging
//! Face first and GitHub second, so within a generation GitHub alone may only receive a
//! manifest the Hub already serves. A publish whose stores include a `github:` one and no
//! `hf://` one is refused unless the Hub's live manifest of the generation is byte-for-byte the
//! one being published, or the engineer says why (`--github-only "REASON"`, recorded).
//!
//! [`decide_github_only`] is the pure rule; [`check_github_only`] fetches the Hub's manifest
//! only when the rule needs it.

use manifest::{Generation, Manifest, StoreLayout};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Refusal, Result};
use crate::store::Store;

/// Why a publish that reaches GitHub may go ahead (serialized into the publish record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "allowed", rename_all = "snake_case")]
pub enum GithubOnly {
    /// The stores include a Hub store, or no GitHub one: the rule does not apply.
    NotGithubOnly,
    /// The Hub already serves exactly this manifest.
    HubHoldsSame {
        /// The Hub store.
        hub: String,
        /// The manifest's store path.
        path: String,
    },
    /// Allowed by `--github-only REASON`.
    Flag {
        /// The reason given.
        reason: String,
    },
}

/// The rule. `stores` is (is Hub, is GitHub) per `--to`; `hub` is the Hub store, the
/// manifest's path and the manifest's bytes there (`None`: no manifest), or `None` when it was
/// not fetched (the rule must then not need it). A reason that is only whitespace is no reason.
pub fn decide_github_only(
    stores: &[(bool, bool)],
    reason: Option<&str>,
    hub: Option<(&str, &str, Option<&[u8]>)>,
    manifest_bytes: &[u8],
) -> std::result::Result<GithubOnly, Refusal> {
    let has_hub = stores.iter().any(|s| s.0);
    let has_github = stores.iter().any(|s| s.1);
    if has_hub || !has_github {
        return Ok(GithubOnly::NotGithubOnly);
    }
    if let Some(r) = reason {
        if r.trim().is_empty() {
            return Err(Refusal::GithubOnlyNoReason);
        }
        return Ok(GithubOnly::Flag {
            reason: r.to_string(),
        });
    }
    match hub {
        Some((hub, path, Some(live))) if live == manifest_bytes => Ok(GithubOnly::HubHoldsSame {
            hub: hub.to_string(),
            path: path.to_string(),
        }),
        Some((hub, path, held)) => Err(Refusal::GithubAheadOfHub {
            hub: hub.to_string(),
            path: path.to_string(),
            hub_has_one: held.is_some(),
        }),
        None => Err(Refusal::GithubAheadOfHub {
            hub: "(the Hub)".into(),
            path: String::new(),
            hub_has_one: false,
        }),
    }
}

/// [`decide_github_only`] for a publish of `manifest` to `stores`, opening the Hub store with
/// `open_hub` only when GitHub would be published alone without a reason. Reads only.
pub fn check_github_only(
    stores: &[(bool, bool)],
    reason: Option<&str>,
    generation: Generation,
    manifest: &Manifest,
    open_hub: &mut dyn FnMut() -> Result<Box<dyn Store>>,
) -> Result<GithubOnly> {
    let bytes = manifest.to_canonical_bytes();
    if let Ok(d) = decide_github_only(stores, reason, None, &bytes) {
        return Ok(d);
    }
    if reason.is_some() {
        // Only an empty reason gets here.
        return decide_github_only(stores, reason, None, &bytes).map_err(Error::Refused);
    }
    let path = StoreLayout::HfBucket.manifest_path(generation);
    let unreadable = |hub: String, e: Error| Error::HubUnreadable {
        hub,
        path: path.to_string(),
        source: Box::new(e),
    };
    let hub = open_hub().map_err(|e| unreadable("the Hub store (--hub)".into(), e))?;
    let live = hub
        .read_small(&path, manifest::Limits::DEFAULT_MAX_MANIFEST_BYTES)
        .map_err(|e| unreadable(hub.describe(), e))?;
    decide_github_only(
        stores,
        None,
        Some((&hub.describe(), path.as_str(), live.as_deref())),
        &bytes,
    )
    .map_err(Error::Refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_github_only_rule() {
        let m = b"{\"models\":[]}\n".as_slice();
        let other = b"{\"models\":[1]}\n".as_slice();
        let (hf, gh, local) = ((true, false), (false, true), (false, false));
        let hub = |held| Some(("hf://buckets/a/b", "manifests/model_names_v26.json", held));
        type Case<'a> = (
            &'a str,
            Vec<(bool, bool)>,
            Option<&'a str>,
            Option<(&'a str, &'a str, Option<&'a [u8]>)>,
            &'a str,
        );
        let cases: Vec<Case> = vec![
            ("hub then github", vec![hf, gh], None, None, "not"),
            ("hub only", vec![hf], None, None, "not"),
            ("local only", vec![local], None, None, "not"),
            (
                "github alone, hub holds the same",
                vec![gh],
                None,
                hub(Some(m)),
                "same",
            ),
            (
                "github alone, hub holds another",
                vec![gh],
                None,
                hub(Some(other)),
                "refused",
            ),
            (
                "github alone, hub holds none",
                vec![gh],
                None,
                hub(None),
                "refused",
            ),
            (
                "local and github, no hub",
                vec![local, gh],
                None,
                hub(None),
                "refused",
            ),
            (
                "github alone with a reason",
                vec![gh],
                Some("hub outage, ticket 12"),
                None,
                "flag",
            ),
            (
                "github alone with an empty reason",
                vec![gh],
                Some("  "),
                None,
                "no reason",
            ),
        ];
        for (name, stores, reason, hub, want) in cases {
            let got = match decide_github_only(&stores, reason, hub, m) {
                Ok(GithubOnly::NotGithubOnly) => "not",
                Ok(GithubOnly::HubHoldsSame { .. }) => "same",
                Ok(GithubOnly::Flag { .. }) => "flag",
                Err(Refusal::GithubAheadOfHub { .. }) => "refused",
                Err(Refusal::GithubOnlyNoReason) => "no reason",
                Err(other) => panic!("{name}: {other}"),
            };
            assert_eq!(got, want, "{name}");
        }
        let text = decide_github_only(&[gh], None, hub(Some(other)), m)
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("hf://buckets/a/b holds another manifests/model_names_v26.json")
                && text.contains("--github-only \"REASON\""),
            "{text}"
        );
    }
}
