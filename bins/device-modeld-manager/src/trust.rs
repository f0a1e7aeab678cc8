//! `--trusted-keys`: loading the keys, and rendering the trust state for `status` and the UI.

use std::path::Path;

use downloader::Downloader;
use downloader::trust::{DEFAULT_TRUSTED_KEYS, TrustedKeys};
use migration::Device;
use migration::trust_state;
use serde_json::{Value, json};

use crate::{Fail, code};

/// The downloader with the trusted keys of `--trusted-keys`, or of the StarPilot default file
/// when it exists. A given file that cannot be used is an error: a device that was meant to be
/// protected must not silently run unprotected.
pub fn with_keys(dl: Downloader, flag: Option<&Path>) -> Result<Downloader, Fail> {
    let path = match flag {
        Some(p) => p,
        None if Path::new(DEFAULT_TRUSTED_KEYS).exists() => Path::new(DEFAULT_TRUSTED_KEYS),
        None => return Ok(dl),
    };
    let keys = TrustedKeys::load(path).map_err(|e| {
        Fail::new(
            code::FAILURE,
            format!(
                "{e}\nnext: give --trusted-keys a file holding the release key's minisign .pub \
                 (docs/device.md, \"Trust\")"
            ),
        )
    })?;
    Ok(dl.with_trusted_keys(keys))
}

/// The device with the downloader's trusted keys, so what it stored under them is re-verified
/// on every read and only pinned artifacts count.
pub fn device_with_keys(mut device: Device, dl: &Downloader) -> Device {
    device.trusted_keys = dl.trusted_keys().cloned();
    device
}

/// The `trust` object of `status --json`.
pub fn status_json(device: &Device, dl: &Downloader) -> Result<Value, Fail> {
    let floor = trust_state::floor_report(device);
    let refused = trust_state::last_refusal(device)?;
    Ok(match dl.trusted_keys() {
        None => json!({
            "protected": false,
            "keys_file": null,
            "keys": [],
            "accepted_release": floor.accepted_release,
            "last_refusal": null,
        }),
        Some(keys) => json!({
            "protected": true,
            "keys_file": keys.path(),
            "keys": keys.keys().iter().map(|k| k.name()).collect::<Vec<_>>(),
            "accepted_release": floor.accepted_release,
            "accepted_release_source": floor.source,
            "accepted_release_copies": {"file": floor.file, "param": floor.param},
            "accepted_release_problem": floor.problem,
            "last_refusal": refused,
        }),
    })
}

/// The human lines of `status` for the `trust` object.
pub fn status_lines(v: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    if v["protected"] != json!(true) {
        lines.push(
            "manifest trust: UNPROTECTED (no --trusted-keys): any manifest the stores serve is \
             installed"
                .to_string(),
        );
        return lines;
    }
    lines.push(format!(
        "manifest trust: signed manifests only ({} key(s) from {}); only artifacts whose \
         SHA-256, size and chunk count the signature covers are installed",
        v["keys"].as_array().map_or(0, Vec::len),
        v["keys_file"].as_str().unwrap_or_default()
    ));
    let copies = &v["accepted_release_copies"];
    let from = match v["accepted_release_source"].as_str().unwrap_or_default() {
        "both" => format!(
            "from {} and the param {} (they agree)",
            migration::trust_state::ACCEPTED_RELEASE_FILE,
            migration::params::keys::MODEL_MANIFEST_ACCEPTED_RELEASE
        ),
        "file" => format!(
            "from {} (the param {}: {})",
            migration::trust_state::ACCEPTED_RELEASE_FILE,
            migration::params::keys::MODEL_MANIFEST_ACCEPTED_RELEASE,
            copies["param"].as_str().unwrap_or_default()
        ),
        "param" => format!(
            "from the param {} ({}: {})",
            migration::params::keys::MODEL_MANIFEST_ACCEPTED_RELEASE,
            migration::trust_state::ACCEPTED_RELEASE_FILE,
            copies["file"].as_str().unwrap_or_default()
        ),
        _ => String::new(),
    };
    match v["accepted_release"].as_object() {
        Some(a) => lines.push(format!(
            "  accepted release: {} (signed by {}, expires {}) {from}",
            a["release"],
            a["key"].as_str().unwrap_or_default(),
            a["expires"]
        )),
        None => match v["accepted_release_problem"].as_str() {
            Some(p) => lines.push(format!("  accepted release: UNKNOWN: {p}")),
            None => lines.push("  accepted release: none yet".to_string()),
        },
    }
    if let Some(r) = v["last_refusal"].as_object() {
        lines.push(format!(
            "  last refusal ({} at {}): {}",
            r["generation"].as_str().unwrap_or_default(),
            r["at"],
            r["text"].as_str().unwrap_or_default()
        ));
        for reason in r["reasons"].as_array().into_iter().flatten() {
            lines.push(format!("    {}", reason.as_str().unwrap_or_default()));
        }
    }
    lines
}
