//! What the device remembers about signed manifests, in the models directory:
//!
//! - `.accepted-release.json`: per generation, the highest signed release this device accepted
//!   (and which key signed it, and when it expires): the rollback floor. Mirrored in the
//!   persistent param `ModelManifestAcceptedRelease` (`<data>/params/d`), which a writer of the
//!   models directory cannot lower; the higher copy wins per generation, a missing or corrupt
//!   copy never lowers it and is rewritten from the valid one ([`merge_floor`]).
//! - `.catalog.json.minisig`: the signature block(s) of the stored catalog, which is verified
//!   against it on every read (`Device::catalog`).
//! - `.refused-manifest.json`: the last refusal (when, which generation, why, per origin), for
//!   `status`: written when every origin failed and one refused on trust grounds, or when an
//!   origin refused before another was accepted; removed at the next fetch accepted from the
//!   first origin tried. It is a report, not state: nothing else reads it.
//!
//! All are dot files, which the purge and `gc` plans never touch. All are written with
//! `Device::write_file`/`remove_file` (the param with `Params::put`), so the crash enumeration
//! sees them as effects.
//!
//! A signed refresh stores, in this order ([`store_accepted`]): the signature file holding the
//! new block *and* the old one, the catalog, the signature file with the new block alone, then
//! the floor (file, then param). After a crash at any point the stored catalog verifies by one
//! of the blocks (old catalog by the old block, new by the new) at a release not below the
//! floor; and a fetch's floor also counts the stored catalog's own signed release, so a catalog
//! stored before its floor was raised still keeps an older release out.

use std::collections::BTreeMap;

use downloader::{Downloader, FetchedManifest, trust};
use manifest::signature::Refusal;
use manifest::{Generation, ReleaseNumber, UnixSeconds};
use serde::{Deserialize, Serialize};

pub use crate::rules::floor::{
    ACCEPTED_RELEASE_FILE, AcceptedRelease, AcceptedReleases, FloorCopy,
};

use crate::error::{Error, Result};
use crate::state::device::{CATALOG_FILE, CATALOG_SIGNATURE_FILE, Device};
use crate::state::params::keys;

pub const REFUSED_MANIFEST_FILE: &str = ".refused-manifest.json";

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

/// Which copy the floor of a generation comes from (`status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FloorSource {
    /// No copy holds a release for it.
    None,
    /// `.accepted-release.json` (the param has a lower one, none, or is unreadable).
    File,
    /// The param `ModelManifestAcceptedRelease` (the file has a lower one, none, or is
    /// unreadable).
    Param,
    /// Both copies agree.
    Both,
}

/// The floor both copies give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Floor {
    /// Per generation, the higher of the two copies' releases.
    pub merged: AcceptedReleases,
    /// The file must be rewritten to `merged` (missing, corrupt or lower somewhere).
    pub repair_file: bool,
    /// The param must be rewritten to `merged`.
    pub repair_param: bool,
}

impl Floor {
    pub fn source(
        &self,
        file: &FloorCopy,
        param: &FloorCopy,
        generation: Generation,
    ) -> FloorSource {
        let key = generation.to_string();
        let Some(best) = self.merged.get(&key) else {
            return FloorSource::None;
        };
        let has = |c: &FloorCopy| matches!(c, FloorCopy::Valid(m) if m.get(&key).is_some_and(|a| a.release == best.release));
        match (has(file), has(param)) {
            (true, true) => FloorSource::Both,
            (true, false) => FloorSource::File,
            (false, _) => FloorSource::Param,
        }
    }
}

/// The floor from its two copies. Pure.
///
/// Per generation the higher release wins, so lowering or deleting one copy lowers nothing. A
/// missing or corrupt copy is rewritten from the valid one. When no copy is valid and at least
/// one is corrupt, the floor is unknown: `None` (a corrupt copy might have held a higher
/// release, so nothing is assumed). Two missing copies are a device that never accepted a
/// signed release.
pub fn merge_floor(file: &FloorCopy, param: &FloorCopy) -> Option<Floor> {
    use FloorCopy::*;
    let (merged, repair_file, repair_param) = match (file, param) {
        (Missing, Missing) => (AcceptedReleases::new(), false, false),
        (Valid(f), Valid(p)) => {
            let mut merged = f.clone();
            for (generation, a) in p {
                match merged.get(generation) {
                    Some(have) if have.release >= a.release => {}
                    _ => {
                        merged.insert(generation.clone(), a.clone());
                    }
                }
            }
            let (rf, rp) = (&merged != f, &merged != p);
            (merged, rf, rp)
        }
        (Valid(f), Missing | Corrupt(_)) => (f.clone(), false, true),
        (Missing | Corrupt(_), Valid(p)) => (p.clone(), true, false),
        (Corrupt(_), _) | (_, Corrupt(_)) => return None,
    };
    Some(Floor {
        merged,
        repair_file,
        repair_param,
    })
}

/// [`merge_floor`] of the copies as `floor::bound` leaves them (`held`: the signed catalog the
/// device holds): a copy the bound changed is marked for rewriting too. Pure.
pub fn merge_bounded(
    file: &FloorCopy,
    param: &FloorCopy,
    generation: Generation,
    held: Option<&AcceptedRelease>,
) -> Option<Floor> {
    let (f, p) = crate::rules::floor::bound(file, param, generation, held);
    let mut floor = merge_floor(&f, &p)?;
    floor.repair_file |= f != *file;
    floor.repair_param |= p != *param;
    Some(floor)
}

/// The floor of `device` from its two copies, bounded by the signed catalog it holds.
fn merge_device(device: &Device, file: &FloorCopy, param: &FloorCopy) -> Option<Floor> {
    let held = device.stored_signed();
    merge_bounded(file, param, device.config.generation, held.as_ref())
}

/// Both copies as read (size-capped, regular files only).
pub fn floor_copies(device: &Device) -> (FloorCopy, FloorCopy) {
    crate::rules::floor::read_copies(
        &device.models_dir(),
        &device.params.path(keys::MODEL_MANIFEST_ACCEPTED_RELEASE),
    )
}

/// The floor, or [`Error::TrustStateUnreadable`] naming both copies and a next step that
/// resets nothing by itself.
pub fn floor(device: &Device) -> Result<Floor> {
    let (file, param) = floor_copies(device);
    merge_device(device, &file, &param).ok_or_else(|| Error::TrustStateUnreadable {
        file: device.models_dir().join(ACCEPTED_RELEASE_FILE),
        file_problem: copy_state(&file),
        param: device.params.path(keys::MODEL_MANIFEST_ACCEPTED_RELEASE),
        param_problem: copy_state(&param),
        generation: device.config.generation.to_string(),
    })
}

/// `valid`, `missing` or `corrupt: <why>`.
fn copy_state(c: &FloorCopy) -> String {
    match c {
        FloorCopy::Missing => "missing".to_string(),
        FloorCopy::Corrupt(m) => format!("corrupt: {m}"),
        FloorCopy::Valid(_) => "valid".to_string(),
    }
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

/// The floor as `status` shows it: this generation's accepted release, which copy it comes
/// from, and what is wrong with either copy.
pub fn floor_report(device: &Device) -> (Option<AcceptedRelease>, FloorCopies) {
    let generation = device.config.generation;
    let (file, param) = floor_copies(device);
    let (accepted_release, source, problem) = match merge_device(device, &file, &param) {
        Some(f) => (
            f.merged.get(&generation.to_string()).cloned(),
            f.source(&file, &param, generation),
            None,
        ),
        None => (
            None,
            FloorSource::None,
            floor(device)
                .err()
                .map(|e| crate::rules::next_step::with_next(&e)),
        ),
    };
    let copies = FloorCopies {
        accepted_release_source: source,
        accepted_release_copies: CopyStates {
            file: copy_state(&file),
            param: copy_state(&param),
        },
        accepted_release_problem: problem,
    };
    (accepted_release, copies)
}

/// Rewrite a missing, corrupt or lower copy from the merged floor (a refresh does this before
/// it fetches, so a corrupt file never wedges it and never lowers the floor).
fn repair_floor(device: &Device, floor: &Floor) -> Result<()> {
    if floor.repair_file {
        clear_directory(device, &device.models_dir().join(ACCEPTED_RELEASE_FILE))?;
        device.write_json(ACCEPTED_RELEASE_FILE, &floor.merged)?;
    }
    if floor.repair_param {
        clear_directory(
            device,
            &device.params.path(keys::MODEL_MANIFEST_ACCEPTED_RELEASE),
        )?;
        write_floor_param(device, &floor.merged)?;
    }
    Ok(())
}

/// A directory at a floor copy's path, removed so the repair's rename can replace it (a link,
/// a FIFO or a file is replaced by the rename itself, never followed). Not in a dry run.
fn clear_directory(device: &Device, path: &std::path::Path) -> Result<()> {
    if device.effects().is_plan() {
        return Ok(());
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(fs_err::remove_dir_all(path)?),
        _ => Ok(()),
    }
}

fn write_floor_param(device: &Device, all: &AcceptedReleases) -> Result<()> {
    device.params.put(
        keys::MODEL_MANIFEST_ACCEPTED_RELEASE,
        &serde_json::to_string(all).expect("state serializes"),
    )
}

/// Fetch the generation's manifest; with trusted keys, refuse one older than the accepted
/// release (a missing or corrupt copy of it is rewritten from the other first; with neither
/// readable, nothing is fetched). A refusal is returned as the fetch error and recorded by
/// `manager::failed_fetch`. `cancel` stops the fetch. The accepted manifest is stored by
/// [`store_accepted`].
pub fn fetch_accepted(
    device: &Device,
    dl: &Downloader,
    cancel: &downloader::CancelToken,
) -> Result<FetchedManifest> {
    let generation = device.config.generation;
    if dl.trusted_keys().is_some() {
        repair_floor(device, &floor(device)?)?;
    }
    let floor = release_floor(device, dl)?;
    Ok(dl.fetch_manifest_accepting(generation, floor, cancel)?)
}

/// The release a fetched manifest must not be older than, when keys are trusted: the accepted
/// one of this generation (the higher copy), or the stored catalog's signed release when that
/// is higher (a crash between storing the catalog and raising the floor).
pub(crate) fn release_floor(device: &Device, dl: &Downloader) -> Result<Option<ReleaseNumber>> {
    Ok(match dl.trusted_keys() {
        Some(_) => (floor(device)?.merged)
            .remove(&device.config.generation.to_string())
            .map(|a| a.release)
            .max(device.stored_signed().map(|a| a.release)),
        None => None,
    })
}

/// Store an accepted manifest as the catalog, crash-safely, then what the fetch learned: with
/// a signature, the signature file with the new and the old block, the catalog's bytes exactly
/// as signed, the signature file with the new block alone, then the accepted release (file,
/// then param); without, the catalog as today. Last, the refusal report (cleared, or naming
/// origins that were refused before another was accepted).
pub fn store_accepted(device: &Device, fetched: &FetchedManifest) -> Result<()> {
    let generation = device.config.generation;
    match &fetched.signed {
        Some(signed) => {
            let new = signed.block.clone();
            let old = device
                .effects()
                .read(
                    &device.models_dir().join(CATALOG_SIGNATURE_FILE),
                    manifest::signature::MAX_SIGNATURE_BYTES,
                )
                .ok()
                .flatten()
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|t| manifest::signature::signature_blocks(&t).ok())
                .and_then(|blocks| blocks.into_iter().next())
                .filter(|b| *b != new && b.defect().is_none());
            if let Some(old) = old {
                device.write_file(
                    CATALOG_SIGNATURE_FILE,
                    manifest::signature::join_signature_blocks(&[new.clone(), old]).as_bytes(),
                )?;
            }
            // The bytes the signature covers, as served (within the manifest read limit, which
            // is the catalog's).
            device.write_file(CATALOG_FILE, &fetched.raw)?;
            device.write_file(CATALOG_SIGNATURE_FILE, new.as_str().as_bytes())?;
            record_accepted(device, generation, signed)?;
        }
        None => device.write_file(CATALOG_FILE, &accepted_catalog_body(fetched, generation)?)?,
    }
    // What upstream reads, where its layout keeps it (nothing apart on a flat layout).
    device.publish_catalog(&fetched.raw)?;
    // An origin that served a refused manifest before another served a good one is still
    // worth a look (someone may have written to that store); else clear.
    let refused: Vec<(&str, &Refusal)> = fetched
        .refused
        .iter()
        .map(|(o, r)| (o.as_str(), r))
        .collect();
    record_refusal(device, generation, &refused)
}

/// The bytes `.catalog.json` gets for a fetched manifest: as received, unless entries were left
/// out or values normalised (the raw bytes would bring the refused entries back when read):
/// then what this device accepted, canonical.
pub(crate) fn accepted_catalog_body(
    fetched: &downloader::FetchedManifest,
    generation: Generation,
) -> Result<Vec<u8>> {
    let raw = (fetched.refused_entries.is_empty() && fetched.normalised.is_empty())
        .then_some(fetched.raw.as_slice());
    crate::state::device::catalog_body(raw, &fetched.manifest, generation)
}

/// Write the refusal report for `refusals`, or remove it when there are none.
pub(crate) fn record_refusal(
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
    match accepted_after(floor(device)?.merged, generation, signed) {
        // Atomic, and reported to the crash enumeration like every other effect of a refresh:
        // the file, then its mirror in the param (each only raises the floor).
        Some(all) => {
            device.write_json(ACCEPTED_RELEASE_FILE, &all)?;
            write_floor_param(device, &all)
        }
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
    let accepted = AcceptedRelease::from(signed);
    if all.get(&key) == Some(&accepted) {
        return None;
    }
    all.insert(key, accepted);
    Some(all)
}

/// The first refusal of a manifest fetch refused on trust grounds (shown in
/// `ModelDownloadProgress` as `Progress::ManifestRefused`).
pub fn refusal(e: &downloader::Error) -> Option<manifest::signature::Refusal> {
    trust::refusals(e).first().map(|(_, r)| (*r).clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(pairs: &[(&str, u64)]) -> FloorCopy {
        FloorCopy::Valid(
            pairs
                .iter()
                .map(|(g, r)| {
                    (
                        g.to_string(),
                        AcceptedRelease {
                            release: ReleaseNumber::new(*r).unwrap(),
                            expires: UnixSeconds(4_102_444_800),
                            key: format!("k{r}"),
                        },
                    )
                })
                .collect(),
        )
    }

    fn releases(f: &Floor) -> Vec<(String, u64)> {
        f.merged
            .iter()
            .map(|(g, a)| (g.clone(), a.release.get()))
            .collect()
    }

    /// File × param: the higher copy wins per generation, a missing, corrupt or lower copy
    /// never lowers the floor and is marked for rewriting, and no valid copy with a corrupt one
    /// is an unknown floor. For v25 and a made-up v26.
    #[test]
    fn the_floor_merge_table() {
        use FloorCopy::{Corrupt, Missing};
        let bad = || Corrupt("expected value at line 1".into());
        for g in ["v25", "v26"] {
            let generation: Generation = g.parse().unwrap();
            // (file, param) -> Ok((releases, repair file, repair param, source)) or Err
            type Want = Option<(Vec<(String, u64)>, bool, bool, FloorSource)>;
            let one = |r: u64| vec![(g.to_string(), r)];
            let table: Vec<(FloorCopy, FloorCopy, Want)> = vec![
                (
                    Missing,
                    Missing,
                    Some((vec![], false, false, FloorSource::None)),
                ),
                (
                    rel(&[(g, 3)]),
                    rel(&[(g, 3)]),
                    Some((one(3), false, false, FloorSource::Both)),
                ),
                // The file lowered or deleted in the models dir: the param keeps the floor.
                (
                    rel(&[(g, 1)]),
                    rel(&[(g, 3)]),
                    Some((one(3), true, false, FloorSource::Param)),
                ),
                (
                    Missing,
                    rel(&[(g, 3)]),
                    Some((one(3), true, false, FloorSource::Param)),
                ),
                (
                    bad(),
                    rel(&[(g, 3)]),
                    Some((one(3), true, false, FloorSource::Param)),
                ),
                // An upgrade (no param yet), or the param lower: the file keeps it.
                (
                    rel(&[(g, 3)]),
                    Missing,
                    Some((one(3), false, true, FloorSource::File)),
                ),
                (
                    rel(&[(g, 3)]),
                    rel(&[(g, 2)]),
                    Some((one(3), false, true, FloorSource::File)),
                ),
                (
                    rel(&[(g, 3)]),
                    bad(),
                    Some((one(3), false, true, FloorSource::File)),
                ),
                // Another generation's entry in one copy is kept, not lost.
                (
                    rel(&[(g, 3)]),
                    rel(&[("v1", 9)]),
                    Some((
                        vec![(g.to_string(), 3), ("v1".to_string(), 9)]
                            .into_iter()
                            .collect::<BTreeMap<_, _>>()
                            .into_iter()
                            .collect(),
                        true,
                        true,
                        FloorSource::File,
                    )),
                ),
                // Nothing valid and something corrupt: unknown, never "none".
                (bad(), Missing, None),
                (Missing, bad(), None),
                (bad(), bad(), None),
            ];
            for (file, param, want) in table {
                let got = merge_floor(&file, &param);
                let ctx = format!("{g}: {file:?} / {param:?}");
                match (got, want) {
                    (Some(f), Some((r, rf, rp, source))) => {
                        assert_eq!(releases(&f), r, "{ctx}");
                        assert_eq!((f.repair_file, f.repair_param), (rf, rp), "{ctx}");
                        assert_eq!(f.source(&file, &param, generation), source, "{ctx}");
                    }
                    (None, None) => {}
                    (got, want) => panic!("{ctx}: got {got:?}, want {want:?}"),
                }
            }
        }
    }
}
