//! Rendering of `refresh --dry-run`, `download --dry-run` and `gc --dry-run`: the plans are
//! `migration::preview`'s (the refresh and gc in plan mode, the downloads planned); this only
//! prints them, as one JSON document (`"dry_run": true`, then the plan's own serialization) or
//! one `would …` line per effect. `verify --dry-run` is
//! `migration::report::verify_read_only`, rendered as `verify` is.

use migration::VerifyState;
use migration::preview::{Action, FailedRefreshPlan, ModelDownload, RefreshPlan};

/// `refresh --dry-run`: one `would …` line per effect.
pub fn refresh_lines(p: &RefreshPlan) -> Vec<String> {
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
    out
}

/// What a failing `refresh` writes before it fails, as lines to add to the error message (each
/// starting with a newline; none when it writes nothing).
pub fn failure_lines(p: &FailedRefreshPlan) -> Vec<String> {
    if p.is_empty() {
        return Vec::new();
    }
    let mut out = vec!["\nbefore failing, the real run would:".to_string()];
    if let Some(from) = &p.migrate_from {
        out.push(format!(
            "\n  migrate from {} to the built-in model offline",
            from.as_deref().unwrap_or("unknown")
        ));
    }
    out.extend(p.would_purge.iter().map(|n| format!("\n  purge {n}")));
    out.extend(p.would_write.iter().map(|n| format!("\n  write {n}")));
    out.extend(p.would_set_params.iter().map(|c| match &c.value {
        Some(v) => format!("\n  set param {} = {v}", c.key),
        None => format!("\n  remove param {}", c.key),
    }));
    out
}

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
pub fn download_lines(models: &[ModelDownload], needed: u64, free: u64) -> Vec<String> {
    let mut out = Vec::new();
    for m in models {
        match &m.action {
            Action::Nothing { reason } => {
                out.push(format!("{}: {reason}, nothing to download", m.id))
            }
            Action::Installed => out.push(format!("{}: verified copy installed, kept", m.id)),
            Action::Download { artifacts } => {
                for p in artifacts {
                    out.push(format!(
                        "would download {} ({} bytes in {} file(s) from {}, digest from the {})",
                        p.name, p.size, p.pieces, p.origin, p.digest_source
                    ));
                    out.extend(p.would_install.iter().map(|n| format!("would install {n}")));
                    out.extend(p.would_remove.iter().map(|n| format!("would remove {n}")));
                }
            }
        }
    }
    out.push(format!("would download {needed} bytes; {free} bytes free"));
    out
}
