//! The reuse policy: when an artifact built elsewhere may be adopted under a StarPilot model ID
//! by server-side copy, and the copy itself.
//!
//! `artifact-store` proves the source compatible (the source catalog records the same tinygrad
//! and source-model commits, [`check_compatibility`]); the release adds the generation's rules:
//! an artifact from another tinygrad revision is never renamed into the current generation, and
//! a target manifest built with another tinygrad is never updated. Every refusal comes before
//! any store is touched.

use std::path::PathBuf;

use artifact_store::Store;
use artifact_store::reuse::{
    Compatible, ReusePlan, ReuseReport, ReuseRequest, check_compatibility, update_manifest_entry,
};
use manifest::{Generation, GitCommit, Manifest, ModelId, PinTable, StorePath};

use crate::{Error, Result};

/// What a reuse is asked to adopt.
#[derive(Debug, Clone)]
pub struct ReuseAsk {
    /// The StarPilot model ID to publish the artifact as.
    pub model: ModelId,
    /// The model's ID in the source catalog.
    pub source_id: ModelId,
    pub source_commit: GitCommit,
    pub tinygrad_commit: GitCommit,
    pub generation: Generation,
}

/// A reuse that passed every check: what to copy, and the target manifest updated in memory.
#[derive(Debug)]
pub struct Approved {
    pub ask: ReuseAsk,
    pub compatible: Compatible,
    /// The manifest to write once the copy is done, with its path.
    pub target: Option<(PathBuf, Manifest)>,
}

/// Decide a reuse: the source catalog proves compatibility, the artifact's tinygrad is the
/// generation's pin in `pins` (as `publish` reads them: [`crate::tree::load_pins`]), and a
/// target manifest (if given) has the model and the same tinygrad.
pub fn approve(
    ask: ReuseAsk,
    pins: &PinTable,
    catalog: &Manifest,
    target: Option<(PathBuf, Manifest)>,
) -> Result<Approved> {
    let compatible = check_compatibility(
        catalog,
        &ask.source_id,
        &ask.source_commit,
        &ask.tinygrad_commit,
    )?;
    // The catalog records exactly `ask.tinygrad_commit` (checked above); it must be the
    // generation's pin, as `publish` requires of the manifest.
    manifest::pins::check_pin(pins, ask.generation, Some(&ask.tinygrad_commit))
        .map_err(|refusal| Error::ReusePin { refusal })?;
    let target = match target {
        Some((path, mut m)) => {
            if let Some(recorded) = m.own_revision()
                && recorded != ask.tinygrad_commit
            {
                return Err(Error::ReuseManifestPin {
                    path,
                    recorded,
                    given: ask.tinygrad_commit.clone(),
                });
            }
            // Check the entry exists now, so a refusal comes before any copy.
            update_manifest_entry(&mut m, &ask.model, &compatible, &ask.source_commit)?;
            Some((path, m))
        }
        None => None,
    };
    Ok(Approved {
        ask,
        compatible,
        target,
    })
}

/// What [`run`] would remove, copy and write for the approved reuse, reading only the source
/// (`--dry-run`): no store is written and the target manifest is left as it is.
pub fn plan(
    approved: &Approved,
    source: &dyn Store,
    source_path: StorePath,
    dest: &dyn Store,
) -> Result<ReusePlan> {
    Ok(artifact_store::reuse::plan(&request(
        approved,
        source,
        source_path,
        dest,
    ))?)
}

/// The store-level request for an approved reuse.
fn request<'a>(
    approved: &Approved,
    source: &'a dyn Store,
    source_path: StorePath,
    dest: &'a dyn Store,
) -> ReuseRequest<'a> {
    ReuseRequest {
        model: approved.ask.model.clone(),
        generation: approved.ask.generation,
        source,
        source_path,
        compatible: approved.compatible.clone(),
        dest,
    }
}

/// Copy the approved chunk set from `source` (`source_path`, its logical artifact) into `dest`,
/// then write the updated target manifest. `on_chunk(index, count, size)` follows the copy.
pub fn run(
    approved: Approved,
    source: &dyn Store,
    source_path: StorePath,
    dest: &dyn Store,
    on_chunk: &mut dyn FnMut(u32, u32, u64),
) -> Result<ReuseReport> {
    let report =
        artifact_store::reuse::reuse(&request(&approved, source, source_path, dest), on_chunk)?;
    if let Some((path, m)) = &approved.target {
        chunker::atomic::write_atomic(path, &m.to_canonical_bytes())?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REF: &str = "62bf6fb072880905a4c490f0f4f4a6b3c23346ec";
    const OTHER: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";

    fn catalog(tinygrad: &str) -> Manifest {
        Manifest::from_slice(
            format!(
                r#"{{"tinygrad_commit": "{tinygrad}", "models": [{{"id": "pop223", "name": "Pop", "version": "v11", "series": "OP Series", "released": "2025-01-01", "community_favorite": true, "source_commit": "{REF}", "artifact_format": "tinygrad_single_v1", "artifact_size": 5, "artifact_sha256": "{}", "artifact_chunk_count": 1}}]}}"#,
                "0".repeat(64)
            )
            .as_bytes(),
        )
        .unwrap()
    }

    fn ask(tinygrad: &str, generation: u32) -> ReuseAsk {
        ReuseAsk {
            model: "pop223".parse().unwrap(),
            source_id: "pop223".parse().unwrap(),
            source_commit: REF.parse().unwrap(),
            tinygrad_commit: tinygrad.parse().unwrap(),
            generation: Generation::new(generation),
        }
    }

    /// The pin rule for v25 and a made-up v26, through `approve`.
    #[test]
    fn the_generation_rules() {
        let pin = manifest::layout::CURRENT_TINYGRAD_COMMIT;
        let g = manifest::layout::CURRENT_GENERATION.number();
        let builtin = PinTable::builtin();
        let mut with_v26 = PinTable::builtin();
        with_v26
            .record(Generation::new(g + 1), &OTHER.parse().unwrap())
            .unwrap();
        let pin_refused = |r: Result<Approved>| match r {
            Err(Error::ReusePin { refusal }) => refusal,
            other => panic!("{other:?}"),
        };
        assert!(approve(ask(pin, g), &builtin, &catalog(pin), None).is_ok());
        assert!(approve(ask(pin, g), &with_v26, &catalog(pin), None).is_ok());
        // Another tinygrad into v25: refused though the catalog agrees.
        assert!(matches!(
            pin_refused(approve(ask(OTHER, g), &builtin, &catalog(OTHER), None)),
            manifest::PinRefusal::Mismatch { .. }
        ));
        // v26 without a recorded pin: refused (no generation is reused into unpinned).
        assert!(matches!(
            pin_refused(approve(ask(OTHER, g + 1), &builtin, &catalog(OTHER), None)),
            manifest::PinRefusal::Unknown { .. }
        ));
        // v26 pinned to OTHER: its own pin is adopted, a v25-pinned artifact is not.
        assert!(approve(ask(OTHER, g + 1), &with_v26, &catalog(OTHER), None).is_ok());
        let refusal = pin_refused(approve(ask(pin, g + 1), &with_v26, &catalog(pin), None));
        assert!(
            matches!(&refusal, manifest::PinRefusal::Mismatch { belongs_to: Some(b), .. } if b.number() == g),
            "{refusal:?}"
        );
        // A catalog that disagrees is artifact-store's refusal.
        assert!(matches!(
            approve(ask(pin, g), &builtin, &catalog(OTHER), None),
            Err(Error::Store(_))
        ));
        // A target manifest built with another tinygrad.
        let target = (PathBuf::from("t.json"), catalog(OTHER));
        assert!(matches!(
            approve(ask(pin, g), &builtin, &catalog(pin), Some(target)),
            Err(Error::ReuseManifestPin { .. })
        ));
        let approved = approve(
            ask(pin, g),
            &builtin,
            &catalog(pin),
            Some(("t.json".into(), catalog(pin))),
        )
        .unwrap();
        assert!(approved.target.is_some());
    }
}
