//! `refresh --dry-run`, `download --dry-run` and `gc --dry-run` as they print: the plans are
//! [`crate::run::preview`]'s (the refresh and gc in plan mode, the downloads planned); `--json`
//! is one document (each plan leads with `"dry_run": true`), the text one `would …` line per
//! effect. `verify --dry-run` is [`crate::report::verify`] with its `dry_run`, rendered as
//! `verify` is.

use cli_support::Failure;

use super::{Line, Render, out_then_notes};
use crate::VerifyState;
use crate::error::Error;
use crate::run::manager::GcPlan;
use crate::run::preview::{Action, DownloadPlanReport, FailedRefreshPlan, RefreshPlan};

/// `refresh --dry-run`: one `would …` line per effect.
impl Render for RefreshPlan {
    fn text(&self) -> Vec<Line> {
        let p = self;
        let mut out = vec![format!(
            "{} manifest from {}: {} models",
            p.generation, p.manifest_origin, p.models
        )];
        if p.migrating {
            out.push(format!(
                "would migrate from {} to {}",
                p.migrated_from.as_deref().unwrap_or("unknown"),
                p.generation
            ));
        }
        out.extend(p.would_purge.iter().map(|n| format!("would purge {n}")));
        out.extend(p.would_download.iter().map(|p| {
            format!(
                "would download {} (installed: {})",
                p.id,
                state_name(p.installed)
            )
        }));
        out.extend(
            p.would_keep
                .iter()
                .map(|id| format!("would keep {id} (verified)")),
        );
        out.extend(
            p.not_due
                .iter()
                .map(|id| format!("would not retry {id} yet (its retry is not due)")),
        );
        out.extend(p.would_write.iter().map(|n| format!("would write {n}")));
        out.extend(p.would_remove.iter().map(|n| format!("would remove {n}")));
        out.extend(p.would_set_params.iter().map(|c| match &c.value {
            Some(v) => format!("would set param {} = {v}", c.key),
            None => format!("would remove param {}", c.key),
        }));
        out.push(format!(
            "would select {}{}",
            p.selected,
            if p.fell_back_to_builtin {
                " (falling back to the built-in model)"
            } else {
                ""
            }
        ));
        let next = "next: run `refresh` without --dry-run to do it".to_string();
        out_then_notes(out, [next])
    }
}

/// How `refresh --dry-run` fails with the real run's error `e`: its message, then what the real
/// run would write before failing (`before`, one line each starting with a newline; none when
/// it writes nothing), then its next step.
pub fn refresh_failure(e: Error, before: &FailedRefreshPlan) -> Failure {
    let mut fail = Failure::from(e);
    if before.is_empty() {
        return fail;
    }
    let mut out = vec!["\nbefore failing, the real run would:".to_string()];
    if let Some(from) = &before.migrate_from {
        out.push(format!(
            "\n  migrate from {} to the built-in model offline",
            from.as_deref().unwrap_or("unknown")
        ));
    }
    out.extend(before.would_purge.iter().map(|n| format!("\n  purge {n}")));
    out.extend(before.would_write.iter().map(|n| format!("\n  write {n}")));
    out.extend(before.would_set_params.iter().map(|c| match &c.value {
        Some(v) => format!("\n  set param {} = {v}", c.key),
        None => format!("\n  remove param {}", c.key),
    }));
    fail.message.push_str(&out.join(""));
    fail
}

/// A verification state in one word.
pub fn state_name(s: VerifyState) -> &'static str {
    match s {
        VerifyState::Verified => "verified",
        VerifyState::Outdated => "outdated",
        VerifyState::Unverified => "unverified",
        VerifyState::Corrupt => "corrupt",
        VerifyState::Missing => "missing",
    }
}

/// `download --dry-run`: what each model would fetch, install and remove.
impl Render for DownloadPlanReport {
    fn text(&self) -> Vec<Line> {
        let mut out = Vec::new();
        for m in &self.models {
            match &m.action {
                Action::Nothing { reason } => {
                    out.push(format!("{}: {reason}, nothing to download", m.id))
                }
                Action::Installed => out.push(format!("{}: verified copy installed, kept", m.id)),
                Action::Download { artifacts } => {
                    for p in artifacts {
                        out.push(format!(
                            "would download {} ({} in {} file(s) from {}, digest from the {})",
                            p.name,
                            cli_support::progress::bytes(p.size),
                            p.pieces,
                            p.origin,
                            p.digest_source
                        ));
                        out.extend(p.would_install.iter().map(|n| format!("would install {n}")));
                        out.extend(p.would_remove.iter().map(|n| format!("would remove {n}")));
                    }
                }
            }
        }
        out.push(format!(
            "would download {}; {} free",
            cli_support::progress::bytes(self.needed),
            cli_support::progress::bytes(self.free)
        ));
        let next = "next: run `download` without --dry-run to do it".to_string();
        out_then_notes(out, [next])
    }
}

/// `gc --dry-run`: a `would remove` line per file, then whether there is anything to do.
impl Render for GcPlan {
    fn text(&self) -> Vec<Line> {
        let files = &self.would_remove;
        let note = match files.is_empty() {
            true => "nothing to remove",
            false => "next: run `gc` without --dry-run to remove them",
        };
        let lines = files.iter().map(|r| format!("would remove {r}"));
        out_then_notes(lines, [note.to_string()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::preview::ParamChange;

    #[test]
    fn gc_dry_run_says_what_it_would_remove_or_that_nothing_is_to_do() {
        let plan = |names: &[&str]| GcPlan {
            dry_run: true,
            would_remove: names.iter().map(|s| s.to_string()).collect(),
        };
        let empty = plan(&[]);
        assert_eq!(empty.text(), [Line::Note("nothing to remove".into())]);
        let some = plan(&["x.tmp"]);
        assert_eq!(
            some.text(),
            [
                Line::Out("would remove x.tmp".into()),
                Line::Note("next: run `gc` without --dry-run to remove them".into())
            ]
        );
        assert_eq!(
            serde_json::to_string(&some).unwrap(),
            r#"{"dry_run":true,"would_remove":["x.tmp"]}"#
        );
    }

    /// A failing dry run keeps the real run's message and next step, and adds what the real
    /// run would still write, one indented line each; nothing when it writes nothing.
    #[test]
    fn a_failing_refresh_dry_run_names_what_the_real_run_still_writes() {
        let e = || Error::NoCatalog {
            generation: "v26".into(),
        };
        let plain = Failure::from(e());
        let none = refresh_failure(e(), &FailedRefreshPlan::default());
        assert_eq!(none, plain);
        let before = FailedRefreshPlan {
            migrate_from: Some(None),
            would_purge: vec!["pop223_driving_tinygrad.pkl".into()],
            would_write: vec![".migration.json".into()],
            would_set_params: vec![
                ParamChange {
                    key: "Model".into(),
                    value: Some("rdf43".into()),
                },
                ParamChange {
                    key: "ActiveBigModel".into(),
                    value: None,
                },
            ],
        };
        let f = refresh_failure(e(), &before);
        assert_eq!(
            (f.code, f.kind, &f.next),
            (plain.code, plain.kind, &plain.next)
        );
        assert_eq!(
            f.message,
            format!(
                "{}\nbefore failing, the real run would:\n  migrate from unknown to the \
                 built-in model offline\n  purge pop223_driving_tinygrad.pkl\n  write \
                 .migration.json\n  set param Model = rdf43\n  remove param ActiveBigModel",
                plain.message
            )
        );
    }
}
