//! Rendering of `refresh --dry-run` and `download --dry-run`: the plans are
//! `migration::preview`'s (built from the real run's own decisions); this only prints them, as
//! one JSON document (`"dry_run": true`) or one `would …` line per effect. `verify --dry-run` is
//! `migration::report::verify_read_only`, rendered as `verify` is.

use manifest::ModelId;
use migration::VerifyState;
use migration::preview::{Action, FailedRefreshPlan, ModelDownload, RefreshPlan};
use serde_json::{Value, json};

/// `refresh --dry-run --json`.
pub fn refresh_json(p: &RefreshPlan) -> Value {
    json!({
        "dry_run": true,
        "generation": p.generation,
        "manifest_origin": p.manifest_origin,
        "manifest_url": p.manifest_url,
        "models": p.models,
        "refused_entries": p.refused_entries,
        "migrating": p.migrate_from.is_some(),
        "migrated_from": p.migrate_from.clone().flatten(),
        "would_purge": p.would_purge,
        "would_download": p.would_download.iter()
            .map(|(id, state)| json!({"id": id.as_str(), "installed": state_name(*state)}))
            .collect::<Vec<_>>(),
        "would_keep": p.would_keep.iter().map(ModelId::as_str).collect::<Vec<_>>(),
        "not_due": p.not_due.iter().map(ModelId::as_str).collect::<Vec<_>>(),
        "selected": p.selected.as_str(),
        "fell_back_to_builtin": p.fell_back_to_builtin,
        "would_write": p.would_write,
        "would_remove": p.would_remove,
        "would_set_params": p.would_set_params.iter()
            .map(|(k, v)| json!({"key": k, "value": v}))
            .collect::<Vec<_>>(),
    })
}

/// `refresh --dry-run`: one `would …` line per effect.
pub fn refresh_lines(p: &RefreshPlan) -> Vec<String> {
    let mut out = vec![format!(
        "{} manifest from {}: {} models",
        p.generation, p.manifest_origin, p.models
    )];
    if let Some(from) = &p.migrate_from {
        out.push(format!(
            "would migrate from {} to {}",
            from.as_deref().unwrap_or("unknown"),
            p.generation
        ));
    }
    out.extend(p.would_purge.iter().map(|n| format!("would purge {n}")));
    out.extend(
        p.would_download
            .iter()
            .map(|(id, state)| format!("would download {id} (installed: {})", state_name(*state))),
    );
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
    out.extend(p.would_set_params.iter().map(|(k, v)| match v {
        Some(v) => format!("would set param {k} = {v}"),
        None => format!("would remove param {k}"),
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
    out.extend(p.would_set_params.iter().map(|(k, v)| match v {
        Some(v) => format!("\n  set param {k} = {v}"),
        None => format!("\n  remove param {k}"),
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

/// `download --dry-run --json`.
pub fn download_json(models: &[ModelDownload], needed: u64, free: u64) -> Value {
    let models: Vec<Value> = models
        .iter()
        .map(|m| match &m.action {
            Action::Nothing(why) => json!({"id": m.id.as_str(), "action": "none", "reason": why}),
            Action::Installed => json!({"id": m.id.as_str(), "action": "installed"}),
            Action::Download(planned) => json!({
                "id": m.id.as_str(),
                "action": "download",
                "artifacts": planned.iter().map(|p| json!({
                    "name": p.local_name,
                    "origin": p.plan.origin,
                    "size": p.plan.size,
                    "sha256": p.plan.sha256.to_hex(),
                    "digest_source": p.plan.digest_source.as_str(),
                    "pieces": p.plan.pieces.len(),
                    "would_install": p.would_install,
                    "would_remove": p.would_remove,
                })).collect::<Vec<_>>(),
            }),
        })
        .collect();
    json!({"dry_run": true, "models": models, "download_bytes": needed, "free_bytes": free})
}

/// `download --dry-run`: what each model would fetch, install and remove.
pub fn download_lines(models: &[ModelDownload], needed: u64, free: u64) -> Vec<String> {
    let mut out = Vec::new();
    for m in models {
        match &m.action {
            Action::Nothing(why) => out.push(format!("{}: {why}, nothing to download", m.id)),
            Action::Installed => out.push(format!("{}: verified copy installed, kept", m.id)),
            Action::Download(planned) => {
                for p in planned {
                    out.push(format!(
                        "would download {} ({} bytes in {} file(s) from {}, digest from the {})",
                        p.local_name,
                        p.plan.size,
                        p.plan.pieces.len(),
                        p.plan.origin,
                        p.plan.digest_source
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
