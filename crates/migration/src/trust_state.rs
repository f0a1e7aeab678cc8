//! What the device remembers about signed manifests, in the models directory:
//!
//! - `.accepted-release.json`: per generation, the highest signed release this device accepted
//!   (and which key signed it, and when it expires). Written atomically *before* the catalog is
//!   stored, so the catalog is never newer than the floor that protects it; a replayed older
//!   release is refused against it, across restarts.
//! - `.refused-manifest.json`: the last refusal (when, which generation, why, per origin), for
//!   `status`: written when every origin failed and one refused on trust grounds, or when an
//!   origin refused before another was accepted; removed at the next fetch accepted from the
//!   first origin tried. It is a report, not state: nothing else reads it.
//!
//! Both are dot files, which the purge and `gc` plans never touch. Both are written with
//! `Device::write_file`/`remove_file`, so the crash enumeration sees them as effects.

use std::collections::BTreeMap;

use downloader::{Downloader, FetchedManifest, trust};
use manifest::signature::Refusal;
use manifest::{Generation, ReleaseNumber, UnixSeconds};
use serde::{Deserialize, Serialize};

use crate::bounded::JOURNAL_LIMIT;
use crate::device::Device;
use crate::error::Result;

pub const ACCEPTED_RELEASE_FILE: &str = ".accepted-release.json";
pub const REFUSED_MANIFEST_FILE: &str = ".refused-manifest.json";

/// The last signed release accepted for one generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptedRelease {
    pub release: ReleaseNumber,
    pub expires: UnixSeconds,
    pub key: String,
}

/// The last manifest fetch that ended with every origin failing and at least one refusing on
/// trust grounds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedManifest {
    pub generation: String,
    pub at: UnixSeconds,
    /// The UI text of the first refusal (`ModelDownloadProgress`).
    pub text: String,
    /// `<origin>: <why>` per refusing origin.
    pub reasons: Vec<String>,
}

/// Every generation's accepted release.
pub fn accepted_releases(device: &Device) -> Result<BTreeMap<String, AcceptedRelease>> {
    Ok(device
        .read_json(ACCEPTED_RELEASE_FILE, JOURNAL_LIMIT)?
        .unwrap_or_default())
}

/// The accepted release of `generation`, if any.
pub fn accepted_release(
    device: &Device,
    generation: Generation,
) -> Result<Option<AcceptedRelease>> {
    Ok(accepted_releases(device)?.remove(&generation.to_string()))
}

pub fn last_refusal(device: &Device) -> Result<Option<RefusedManifest>> {
    device.read_json(REFUSED_MANIFEST_FILE, JOURNAL_LIMIT)
}

/// Fetch the generation's manifest; with trusted keys, refuse one older than the accepted
/// release and record a newly accepted release durably before returning it. A refusal is
/// recorded for `status` and returned as the fetch error; nothing else is written. `cancel`
/// stops the fetch (a cancelled fetch records nothing).
pub fn fetch_accepted(
    device: &Device,
    dl: &Downloader,
    cancel: &downloader::CancelToken,
) -> Result<FetchedManifest> {
    let generation = device.config.generation;
    let floor = release_floor(device, dl)?;
    match dl.fetch_manifest_accepting(generation, floor, cancel) {
        Ok(fetched) => {
            if let Some(signed) = &fetched.signed {
                record_accepted(device, generation, signed)?;
            }
            // An origin that served a refused manifest before another served a good one is
            // still worth a look (someone may have written to that store); else clear.
            let refused: Vec<(&str, &Refusal)> = fetched
                .refused
                .iter()
                .map(|(o, r)| (o.as_str(), r))
                .collect();
            record_refusal(device, generation, &refused)?;
            Ok(fetched)
        }
        Err(e) => {
            let refusals = trust::refusals(&e);
            if !refusals.is_empty() {
                record_refusal(device, generation, &refusals)?;
            }
            Err(e.into())
        }
    }
}

/// The release a fetched manifest must not be older than: the accepted one of this generation,
/// when keys are trusted.
pub(crate) fn release_floor(device: &Device, dl: &Downloader) -> Result<Option<ReleaseNumber>> {
    Ok(match dl.trusted_keys() {
        Some(_) => accepted_release(device, device.config.generation)?.map(|a| a.release),
        None => None,
    })
}

/// Write the refusal report for `refusals`, or remove it when there are none.
fn record_refusal(
    device: &Device,
    generation: Generation,
    refusals: &[(&str, &Refusal)],
) -> Result<()> {
    let Some((_, first)) = refusals.first() else {
        return device.remove_file(REFUSED_MANIFEST_FILE);
    };
    let report = RefusedManifest {
        generation: generation.to_string(),
        at: UnixSeconds::now(),
        text: first.ui_text().to_string(),
        reasons: refusals
            .iter()
            .map(|(origin, r)| format!("{origin}: {r}"))
            .collect(),
    };
    device.write_json(REFUSED_MANIFEST_FILE, &report)
}

fn record_accepted(
    device: &Device,
    generation: Generation,
    signed: &trust::Accepted,
) -> Result<()> {
    match accepted_after(accepted_releases(device)?, generation, signed) {
        // Atomic, and reported to the crash enumeration like every other effect of a refresh.
        Some(all) => device.write_json(ACCEPTED_RELEASE_FILE, &all),
        None => Ok(()),
    }
}

/// The accepted releases once `signed` is accepted for `generation`; `None` when that is
/// already on record (nothing to write).
pub(crate) fn accepted_after(
    mut all: BTreeMap<String, AcceptedRelease>,
    generation: Generation,
    signed: &trust::Accepted,
) -> Option<BTreeMap<String, AcceptedRelease>> {
    let key = generation.to_string();
    if all.get(&key).is_some_and(|a| {
        a.release == signed.release && a.expires == signed.expires && a.key == signed.key
    }) {
        return None;
    }
    all.insert(
        key,
        AcceptedRelease {
            release: signed.release,
            expires: signed.expires,
            key: signed.key.clone(),
        },
    );
    Some(all)
}

/// The first refusal of a manifest fetch refused on trust grounds (shown in
/// `ModelDownloadProgress` as `Progress::ManifestRefused`).
pub fn refusal(e: &downloader::Error) -> Option<manifest::signature::Refusal> {
    trust::refusals(e).first().map(|(_, r)| (*r).clone())
}
