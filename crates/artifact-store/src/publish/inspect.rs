//! Inspecting a store: whether every artifact the new manifest lists and publish does not
//! upload is complete there and matches the manifest ([`check_entry`], the typed
//! [`StoreProblem`]s behind `Error::Incomplete`).

use std::path::Path;

use chunker::{
    Sha256Digest, chunk_manifest_name, parse_chunk_manifest, parse_sidecar, sidecar_name,
};
use manifest::{Generation, ModelEntry, StoreLayout};

use crate::error::Result;
use crate::paths::StorePath;
use crate::store::Store;

use chunker::SMALL_FILE_LIMIT;

pub use crate::refusal::{StoreProblem, StoreProblemKind};

/// How far a stored artifact is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// Its files there, at their sizes, with `.chunkmanifest` and `.sha256` saying what the
    /// manifest says: small reads only. Publish's last look before the manifest at an artifact
    /// it uploaded, checked from the local files in the same run.
    Sizes,
    /// And an OOB container: the frame headers read in place (a seek each on disk, an HTTP
    /// range each on the Hub; one per frame).
    Container,
    /// And its bytes hashed to the manifest's SHA-256 (`--deep-verify`, or reads are local).
    Digest,
}

impl VariantTarget {
    /// The model's own artifact as a target (an empty `variant`).
    pub(crate) fn main(entry: &ModelEntry, artifact: &manifest::Artifact) -> Self {
        Self {
            variant: String::new(),
            file_name: entry.file_name().as_str().to_string(),
            size: artifact.size.get(),
            sha256: artifact.sha256,
            count: artifact.chunk_count.get(),
        }
    }
}

/// Check one manifest entry against the store, adding one problem per thing wrong.
pub(crate) fn check_entry(
    store: &dyn Store,
    generation: Generation,
    entry: &ModelEntry,
    look: Look,
    problems: &mut Vec<StoreProblem>,
) -> Result<()> {
    let id = entry.id();
    let mut push = |kind| {
        problems.push(StoreProblem {
            model: id.clone(),
            kind,
        })
    };
    let Some(artifact) = entry.artifact() else {
        push(StoreProblemKind::NoArtifactFields);
        return Ok(());
    };
    let dir = StoreLayout::HfBucket.artifact_dir(generation, id);
    check_stored(
        store,
        &dir,
        &VariantTarget::main(entry, &artifact),
        look,
        &mut push,
    )
}

/// One accelerator variant of an entry as publish needs it: where it lives in the store, and
/// what it must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariantTarget {
    /// The `accelerator_artifacts` key (`chestnut`, `amd`).
    pub variant: String,
    /// `artifact_filename`, or `<id>_driving_<variant>_tinygrad.pkl` (the name devices fetch).
    pub file_name: String,
    /// The variant's size in bytes.
    pub size: u64,
    /// Its SHA-256.
    pub sha256: Sha256Digest,
    /// Its chunk count.
    pub count: u32,
}

/// The variants of `entry`, each with its file name and expected size, digest and count; a
/// variant lacking one of them (or with a name that is no bare file name) is an `Err` naming
/// it. Pure.
pub fn variant_targets(
    entry: &ModelEntry,
) -> Vec<std::result::Result<VariantTarget, StoreProblemKind>> {
    entry
        .accelerators()
        .into_iter()
        .map(|(variant, v)| {
            let unpublishable = |reason: &str| StoreProblemKind::VariantUnpublishable {
                variant: variant.clone(),
                reason: reason.to_string(),
            };
            let file_name = match &v.filename {
                Some(f) => f.as_str().to_string(),
                None => {
                    let n = format!("{}_driving_{variant}_tinygrad.pkl", entry.id());
                    n.parse::<manifest::FileName>().map_err(|_| {
                        unpublishable(
                            "its name makes no valid file name; give it an artifact_filename",
                        )
                    })?;
                    n
                }
            };
            let (Some(size), Some(sha256), Some(count)) = (v.size, v.sha256, v.chunk_count) else {
                return Err(unpublishable(
                    "missing artifact_size, artifact_sha256 or artifact_chunk_count",
                ));
            };
            Ok(VariantTarget {
                variant,
                file_name,
                size: size.get(),
                sha256,
                count: count.get(),
            })
        })
        .collect()
}

/// Check the accelerator variants of `entry` that `local` (the variants found in
/// `--artifacts <id>/`) does not provide: each must be complete and matching in the store,
/// an out-of-band container like the main artifact.
pub(crate) fn check_variants(
    store: &dyn Store,
    generation: Generation,
    entry: &ModelEntry,
    local: &[String],
    look: Look,
    problems: &mut Vec<StoreProblem>,
) -> Result<()> {
    let id = entry.id();
    let dir = StoreLayout::HfBucket.artifact_dir(generation, id);
    for target in variant_targets(entry) {
        let t = match target {
            Ok(t) => t,
            Err(kind) => {
                problems.push(StoreProblem {
                    model: id.clone(),
                    kind,
                });
                continue;
            }
        };
        if local.contains(&t.variant) {
            continue;
        }
        let mut push = |kind| {
            problems.push(StoreProblem {
                model: id.clone(),
                kind: StoreProblemKind::Variant {
                    variant: t.variant.clone(),
                    problem: Box::new(kind),
                },
            })
        };
        check_stored(store, &dir, &t, look, &mut push)?;
    }
    Ok(())
}

/// Check one logical artifact `dir/<want.file_name>` in the store: its files complete (plain, or chunk set
/// with `.chunkmanifest` and `.sha256`) and its size; as far as `look` says, an OOB container
/// and its digest.
fn check_stored(
    store: &dyn Store,
    dir: &StorePath,
    want: &VariantTarget,
    look: Look,
    push: &mut dyn FnMut(StoreProblemKind),
) -> Result<()> {
    let (name, count) = (want.file_name.as_str(), want.count);
    let mut pieces = Vec::new();
    if count == 0 {
        let p = dir.join(name)?;
        match store.stat(&p)? {
            Some(s) => pieces.push((p, s.size)),
            None => {
                push(StoreProblemKind::FileMissing { path: p });
                return Ok(());
            }
        }
    } else {
        let cm_path = dir.join(&chunk_manifest_name(name))?;
        let Some(cm) = store.read_small(&cm_path, SMALL_FILE_LIMIT)? else {
            push(StoreProblemKind::ChunkManifestMissing { path: cm_path });
            return Ok(());
        };
        let found = match parse_chunk_manifest(&cm, Path::new(cm_path.as_str())) {
            Ok(n) => n,
            Err(e) => {
                push(StoreProblemKind::Malformed(e));
                return Ok(());
            }
        };
        if found != count {
            push(StoreProblemKind::ChunkCountDiffers {
                path: cm_path,
                found,
                manifest: count,
            });
            return Ok(());
        }
        for i in 1..=count {
            let p = dir.join(&chunker::chunk_name(name, i, count))?;
            match store.stat(&p)? {
                Some(s) => pieces.push((p, s.size)),
                None => push(StoreProblemKind::ChunkMissing { path: p }),
            }
        }
        if pieces.len() as u32 != count {
            return Ok(());
        }
        let sc_path = dir.join(&sidecar_name(name))?;
        match store.read_small(&sc_path, SMALL_FILE_LIMIT)? {
            None => push(StoreProblemKind::FileMissing { path: sc_path }),
            Some(b) => match parse_sidecar(&b, Path::new(sc_path.as_str())) {
                Ok(d) if d == want.sha256 => {}
                Ok(d) => push(StoreProblemKind::SidecarDiffers {
                    path: sc_path,
                    found: d,
                    manifest: want.sha256,
                }),
                Err(e) => push(StoreProblemKind::Malformed(e)),
            },
        }
    }
    let total: u64 = pieces.iter().map(|(_, s)| s).sum();
    if total != want.size {
        push(StoreProblemKind::SizeDiffers {
            total,
            manifest: want.size,
        });
        return Ok(());
    }
    if look == Look::Sizes {
        return Ok(());
    }
    // Found in the store rather than uploaded now: it must be an OOB container too (a few
    // small reads: a seek on disk, an HTTP range on the Hub).
    let what = format!("{} {}", store.describe(), dir.join(name)?);
    if let Err(not_oob) = crate::oob::check_pieces(store, &pieces, &what)? {
        push(StoreProblemKind::NotOob(not_oob));
        return Ok(());
    }
    if look == Look::Digest {
        let pieces = pieces.iter().map(|(p, _)| p);
        let (found, _) =
            crate::store::digest_of(store, &store.describe(), pieces, false, &mut |_| {})?;
        if found != want.sha256 {
            push(StoreProblemKind::Corrupt {
                dir: dir.clone(),
                found,
                manifest: want.sha256,
            });
        }
    }
    Ok(())
}
