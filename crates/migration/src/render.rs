//! The device's reports as the binary prints them: `status` (with the trust state and the
//! openpilot tree), `verify`, `resolve`, the paused `status` and the daemon's tree line, each a
//! typed document that serializes to the command's `--json` shape and renders its text lines.
//! The binary builds one, then prints it.

use std::path::PathBuf;

use serde::Serialize;

use crate::device::{Device, VerifyState};
use crate::error::Result;
use crate::report::{PendingCase, ResolveReport, StatusReport, VerifyReport};
use crate::tree::{PausedStatus, TreeStatus};
use crate::trust_state::{self, AcceptedRelease, FloorSource, RefusedManifest};
use crate::{Phase, params};

/// A verification state as `status` and `verify` print it.
pub fn state_text(s: VerifyState) -> &'static str {
    match s {
        VerifyState::Verified => "verified",
        VerifyState::Outdated => "outdated (verified copy of an earlier publish; in use)",
        VerifyState::Unverified => "unverified",
        VerifyState::Corrupt => "corrupt",
        VerifyState::Missing => "missing",
    }
}

/// `tree: …` as `status` and the daemon's log say it.
pub fn tree_line(t: &TreeStatus) -> String {
    format!(
        "tree: {} runs tinygrad {} ({})",
        t.openpilot_dir.display(),
        t.tinygrad_commit
            .as_ref()
            .map_or("unreadable".to_string(), |c| c.to_string()),
        match (t.generation, t.state) {
            (Some(g), _) => format!("{g}'s pin"),
            (None, "unknown") => "no known generation's pin: paused".to_string(),
            (None, _) => "paused".to_string(),
        }
    )
}

/// The `trust` object of `status --json`: whether manifests must be signed, by which keys, the
/// accepted release (the rollback floor) and the last refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrustReport {
    pub protected: bool,
    pub keys_file: Option<PathBuf>,
    /// The keys' names.
    pub keys: Vec<String>,
    pub accepted_release: Option<AcceptedRelease>,
    /// With keys only: where the accepted release comes from.
    #[serde(flatten)]
    pub floor: Option<FloorCopies>,
    /// With keys only.
    pub last_refusal: Option<RefusedManifest>,
}

/// The two copies of the accepted release, as `status` reports them on a device with keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FloorCopies {
    pub accepted_release_source: FloorSource,
    pub accepted_release_copies: CopyStates,
    /// Neither copy is valid: the error a refresh gives, with its next step.
    pub accepted_release_problem: Option<String>,
}

/// `valid`, `missing` or `corrupt: <why>`, per copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CopyStates {
    pub file: String,
    pub param: String,
}

impl TrustReport {
    /// The device's trust state (its trusted keys are the downloader's).
    pub fn of(device: &Device) -> Result<Self> {
        let floor = trust_state::floor_report(device);
        let refused = trust_state::last_refusal(device)?;
        Ok(match &device.trusted_keys {
            None => TrustReport {
                protected: false,
                keys_file: None,
                keys: Vec::new(),
                accepted_release: floor.accepted_release,
                floor: None,
                last_refusal: None,
            },
            Some(keys) => TrustReport {
                protected: true,
                keys_file: Some(keys.path().to_path_buf()),
                keys: keys.keys().iter().map(|k| k.name().to_string()).collect(),
                accepted_release: floor.accepted_release,
                floor: Some(FloorCopies {
                    accepted_release_source: floor.source,
                    accepted_release_copies: CopyStates {
                        file: floor.file,
                        param: floor.param,
                    },
                    accepted_release_problem: floor.problem,
                }),
                last_refusal: refused,
            },
        })
    }

    /// The human lines of `status` for the trust state.
    pub fn lines(&self) -> Vec<String> {
        let (Some(keys_file), Some(floor)) = (&self.keys_file, &self.floor) else {
            return vec![
                "manifest trust: UNPROTECTED (no --trusted-keys): any manifest the stores serve \
                 is installed"
                    .to_string(),
            ];
        };
        let mut lines = vec![format!(
            "manifest trust: signed manifests only ({} key(s) from {}); only artifacts whose \
             SHA-256, size and chunk count the signature covers are installed",
            self.keys.len(),
            keys_file.display()
        )];
        let (file, param) = (
            trust_state::ACCEPTED_RELEASE_FILE,
            params::keys::MODEL_MANIFEST_ACCEPTED_RELEASE,
        );
        let copies = &floor.accepted_release_copies;
        let from = match floor.accepted_release_source {
            FloorSource::Both => format!("from {file} and the param {param} (they agree)"),
            FloorSource::File => format!("from {file} (the param {param}: {})", copies.param),
            FloorSource::Param => format!("from the param {param} ({file}: {})", copies.file),
            FloorSource::None => String::new(),
        };
        lines.push(
            match (&self.accepted_release, &floor.accepted_release_problem) {
                (Some(a), _) => format!(
                    "  accepted release: {} (signed by {}, expires {}) {from}",
                    a.release, a.key, a.expires
                ),
                (None, Some(p)) => format!("  accepted release: UNKNOWN: {p}"),
                (None, None) => "  accepted release: none yet".to_string(),
            },
        );
        if let Some(r) = &self.last_refusal {
            lines.push(format!(
                "  last refusal ({} at {}): {}",
                r.generation, r.at, r.text
            ));
            lines.extend(r.reasons.iter().map(|reason| format!("    {reason}")));
        }
        lines
    }
}

/// `status`: the device's report, its trust state and its tree (`status --json` is this
/// document).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusDocument {
    #[serde(flatten)]
    pub report: StatusReport,
    pub trust: TrustReport,
    pub tree: TreeStatus,
}

impl StatusDocument {
    pub fn of(device: &Device, tree: TreeStatus) -> Result<Self> {
        Ok(StatusDocument {
            report: crate::report::status(device)?,
            trust: TrustReport::of(device)?,
            tree,
        })
    }

    /// The lines `status` prints on stdout.
    pub fn lines(&self) -> Vec<String> {
        let r = &self.report;
        let mut lines = vec![
            format!("generation: {}", r.generation),
            tree_line(&self.tree),
            format!(
                "manifest version: {}",
                r.manifest_version.as_deref().unwrap_or("none")
            ),
            format!(
                "selected: {} ({} {})",
                r.selected.id, r.selected.name, r.selected.version
            ),
            format!("resolves to: {}", r.resolved.display()),
            match (r.catalog_models, &r.catalog_problem) {
                (Some(n), _) => format!("catalog: {n} models"),
                (None, Some(p)) => format!("catalog: NOT USED: {p}"),
                (None, None) => "catalog: none yet".to_string(),
            },
        ];
        for n in &r.not_installable {
            lines.push(format!("  {} ({}): {}", n.id, n.file, n.reason));
        }
        for m in &r.installed {
            lines.push(format!("  {} {}", m.id, state_text(m.state)));
        }
        lines.push(format!(
            "free bytes: {}",
            r.free_bytes.map_or("unknown".into(), |f| f.to_string())
        ));
        if let Some(fb) = &r.fallback {
            for p in &fb.pending {
                let case = match p.case {
                    PendingCase::Temporary => "waiting for",
                    PendingCase::Update => "update pending for",
                };
                lines.push(format!(
                    "{case} {}: {} failed attempt(s), next retry at unix {} ({})",
                    p.id, p.failures, p.next_retry, p.reason
                ));
            }
            if !fb.dropped.is_empty() {
                lines.push(format!(
                    "dropped for good (not in the catalog): {}",
                    fb.dropped.join(", ")
                ));
            }
        }
        if let Some(j) = &r.interrupted_migration {
            lines.push(format!(
                "interrupted migration: {} -> {} at the {} phase",
                j.from.as_deref().unwrap_or("none"),
                j.to,
                match j.phase {
                    Phase::Purge => "purge",
                    Phase::Download => "download",
                }
            ));
        }
        lines.extend(self.trust.lines());
        lines
    }

    /// The `next:` hint `status` adds on stderr, if any.
    pub fn next(&self) -> Option<String> {
        let r = &self.report;
        if r.interrupted_migration.is_some() {
            Some("`refresh` finishes the interrupted migration".into())
        } else if r.catalog_models.is_none() {
            Some(format!(
                "`refresh` (online) fetches the {} catalog",
                r.generation
            ))
        } else if r.installed.iter().any(|m| m.state == VerifyState::Corrupt) {
            Some(
                "`download <ID>` replaces a corrupt model; `resolve` never hands one to modeld"
                    .into(),
            )
        } else {
            None
        }
    }
}

/// `status` while paused: the lines it prints (its `--json` is the [`PausedStatus`]).
pub fn paused_status_lines(r: &PausedStatus) -> Vec<String> {
    vec![
        "generation: none (paused)".to_string(),
        tree_line(&r.tree),
        format!("resolves to: {}", r.resolved.display()),
        format!("problem: {}", r.tree.problem.as_deref().unwrap_or_default()),
    ]
}

/// `verify` (`verify --dry-run` adds `"dry_run": true` to its `--json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyDocument {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    #[serde(flatten)]
    pub report: VerifyReport,
}

impl VerifyDocument {
    /// One `<id> <state>` line per model.
    pub fn lines(&self) -> Vec<String> {
        let models = &self.report.models;
        models
            .iter()
            .map(|m| format!("{} {}", m.id, state_text(m.state)))
            .collect()
    }
}

/// The line `resolve` prints on stdout: the path, or with `--json` the report.
pub fn resolve_line(r: &ResolveReport, json: bool) -> String {
    match json {
        true => serde_json::to_string(r).expect("a resolve report serializes"),
        false => r.path.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::InstalledModel;
    use manifest::signature::{ReleaseNumber, UnixSeconds};

    fn release(n: u64) -> AcceptedRelease {
        AcceptedRelease {
            release: ReleaseNumber::try_from(n).unwrap(),
            expires: UnixSeconds(1_900_000_000),
            key: "starpilot-2026".into(),
        }
    }

    fn keyed(source: FloorSource, accepted: Option<AcceptedRelease>) -> TrustReport {
        TrustReport {
            protected: true,
            keys_file: Some("/data/params/starpilot_keys.pub".into()),
            keys: vec!["a".into(), "b".into()],
            accepted_release: accepted,
            floor: Some(FloorCopies {
                accepted_release_source: source,
                accepted_release_copies: CopyStates {
                    file: "valid".into(),
                    param: "corrupt: eof".into(),
                },
                accepted_release_problem: None,
            }),
            last_refusal: None,
        }
    }

    /// The `trust` object keeps its two shapes, key for key in this order.
    #[test]
    fn trust_documents_keep_their_shapes() {
        let bare = TrustReport {
            protected: false,
            keys_file: None,
            keys: Vec::new(),
            accepted_release: None,
            floor: None,
            last_refusal: None,
        };
        assert_eq!(
            serde_json::to_string(&bare).unwrap(),
            r#"{"protected":false,"keys_file":null,"keys":[],"accepted_release":null,"last_refusal":null}"#
        );
        assert_eq!(
            bare.lines(),
            [
                "manifest trust: UNPROTECTED (no --trusted-keys): any manifest the stores serve is installed"
            ]
        );
        let mut t = keyed(FloorSource::File, Some(release(3)));
        t.last_refusal = Some(RefusedManifest {
            generation: "v26".into(),
            at: UnixSeconds(1_800_000_000),
            text: "Model list refused: not signed".into(),
            reasons: vec!["hf: not signed".into(), "github: not signed".into()],
        });
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            r#"{"protected":true,"keys_file":"/data/params/starpilot_keys.pub","keys":["a","b"],"accepted_release":{"release":3,"expires":1900000000,"key":"starpilot-2026"},"accepted_release_source":"file","accepted_release_copies":{"file":"valid","param":"corrupt: eof"},"accepted_release_problem":null,"last_refusal":{"generation":"v26","at":1800000000,"text":"Model list refused: not signed","reasons":["hf: not signed","github: not signed"]}}"#
        );
        assert_eq!(
            t.lines(),
            [
                "manifest trust: signed manifests only (2 key(s) from /data/params/starpilot_keys.pub); only artifacts whose SHA-256, size and chunk count the signature covers are installed",
                "  accepted release: 3 (signed by starpilot-2026, expires 1900000000) from .accepted-release.json (the param ModelManifestAcceptedRelease: corrupt: eof)",
                "  last refusal (v26 at 1800000000): Model list refused: not signed",
                "    hf: not signed",
                "    github: not signed",
            ]
        );
    }

    /// Where the accepted release comes from, each case its line.
    #[test]
    fn accepted_release_lines() {
        let line = |t: TrustReport| t.lines()[1].clone();
        assert!(line(keyed(FloorSource::Both, Some(release(1)))).ends_with(
            "from .accepted-release.json and the param ModelManifestAcceptedRelease (they agree)"
        ));
        assert!(line(keyed(FloorSource::Param, Some(release(1)))).ends_with(
            "from the param ModelManifestAcceptedRelease (.accepted-release.json: valid)"
        ));
        assert!(line(keyed(FloorSource::None, Some(release(1)))).ends_with("expires 1900000000) "));
        assert_eq!(
            line(keyed(FloorSource::None, None)),
            "  accepted release: none yet"
        );
        let mut t = keyed(FloorSource::None, None);
        t.floor.as_mut().unwrap().accepted_release_problem = Some("both unreadable".into());
        assert_eq!(line(t), "  accepted release: UNKNOWN: both unreadable");
    }

    #[test]
    fn verify_documents() {
        let report = VerifyReport {
            models: vec![
                InstalledModel {
                    id: "pop223".into(),
                    state: VerifyState::Verified,
                    digest_source: Some("manifest"),
                },
                InstalledModel {
                    id: "wd40".into(),
                    state: VerifyState::Outdated,
                    digest_source: None,
                },
            ],
        };
        let doc = |dry_run| VerifyDocument {
            dry_run,
            report: report.clone(),
        };
        let models = r#"[{"id":"pop223","state":"verified","digest_source":"manifest"},{"id":"wd40","state":"outdated","digest_source":null}]"#;
        assert_eq!(
            serde_json::to_string(&doc(false)).unwrap(),
            format!(r#"{{"models":{models}}}"#)
        );
        assert_eq!(
            serde_json::to_string(&doc(true)).unwrap(),
            format!(r#"{{"dry_run":true,"models":{models}}}"#)
        );
        assert_eq!(
            doc(false).lines(),
            [
                "pop223 verified",
                "wd40 outdated (verified copy of an earlier publish; in use)"
            ]
        );
    }
}
