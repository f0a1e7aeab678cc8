//! Inspecting a store: whether every artifact the new manifest lists and publish does not
//! upload is complete there and matches the manifest ([`check_entry`], the typed
//! [`StoreProblem`]s behind `Error::Incomplete`).

use std::path::Path;

use chunker::{
    Hasher, Sha256Digest, chunk_manifest_name, parse_chunk_manifest, parse_sidecar, sidecar_name,
};
use manifest::{Generation, ModelEntry, ModelId, StoreLayout};

use crate::error::{Error, Result};
use crate::paths::StorePath;
use crate::store::Store;

use super::SMALL_FILE_LIMIT;
use super::plan::entry_file_name;

/// One thing wrong in the store with a model the new manifest lists and publish does not
/// upload (`Error::Incomplete`).
#[derive(Debug)]
pub struct StoreProblem {
    pub model: ModelId,
    pub kind: StoreProblemKind,
}

/// What is wrong with a model's files in the store.
#[derive(Debug)]
pub enum StoreProblemKind {
    /// The manifest entry has no artifact fields to check the store against.
    NoArtifactFields,
    /// A plain artifact file or the `.sha256` is not in the store.
    FileMissing { path: StorePath },
    /// The `.chunkmanifest` is not in the store: the directory is incomplete or absent.
    ChunkManifestMissing { path: StorePath },
    /// A chunk named by the `.chunkmanifest` is not in the store.
    ChunkMissing { path: StorePath },
    /// The `.chunkmanifest` or `.sha256` cannot be read as one.
    Malformed(chunker::Error),
    /// The `.chunkmanifest` names another count than the manifest.
    ChunkCountDiffers {
        path: StorePath,
        found: u32,
        manifest: u32,
    },
    /// The `.sha256` names another digest than the manifest.
    SidecarDiffers {
        path: StorePath,
        found: Sha256Digest,
        manifest: Sha256Digest,
    },
    /// The files add up to another size than the manifest's.
    SizeDiffers { total: u64, manifest: u64 },
    /// The stored bytes are not an out-of-band pickle container.
    NotOob(crate::oob::NotOob),
    /// The stored bytes hash to another digest than the manifest's (deep check).
    Corrupt {
        dir: StorePath,
        found: Sha256Digest,
        manifest: Sha256Digest,
    },
}

impl std::fmt::Display for StoreProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = &self.model;
        write!(f, "model {id}: ")?;
        match &self.kind {
            StoreProblemKind::NoArtifactFields => f.write_str(
                "the manifest entry has no artifact_size/artifact_sha256/artifact_chunk_count",
            ),
            StoreProblemKind::FileMissing { path } => write!(f, "{path} is missing"),
            StoreProblemKind::ChunkManifestMissing { path } => write!(
                f,
                "{path} is missing (the artifact directory is incomplete or absent; put its chunk set in the artifacts directory)"
            ),
            StoreProblemKind::ChunkMissing { path } => write!(f, "chunk {path} is missing"),
            StoreProblemKind::Malformed(e) => write!(f, "{e}"),
            StoreProblemKind::ChunkCountDiffers {
                path,
                found,
                manifest,
            } => write!(
                f,
                "{path} says {found} chunks, the manifest says {manifest}"
            ),
            StoreProblemKind::SidecarDiffers {
                path,
                found,
                manifest,
            } => write!(f, "{path} says {found}, the manifest says {manifest}"),
            StoreProblemKind::SizeDiffers { total, manifest } => write!(
                f,
                "the store holds {total} bytes, the manifest says {manifest}"
            ),
            StoreProblemKind::NotOob(not_oob) => write!(f, "{not_oob}"),
            StoreProblemKind::Corrupt {
                dir,
                found,
                manifest,
            } => write!(
                f,
                "the stored artifact's SHA-256 is {found}, the manifest says {manifest} (a chunk in {dir} is corrupt; put the model's chunk set in --artifacts {id}/ so publish replaces it)"
            ),
        }
    }
}

/// Check one manifest entry against the store, adding one problem per thing wrong.
pub(crate) fn check_entry(
    store: &dyn Store,
    generation: Generation,
    entry: &ModelEntry,
    deep: bool,
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
    let name = entry_file_name(entry);
    let count = artifact.chunk_count.get();
    let mut pieces = Vec::new();
    if count == 0 {
        let p = dir.join(&name)?;
        match store.stat(&p)? {
            Some(s) => pieces.push((p, s.size)),
            None => {
                push(StoreProblemKind::FileMissing { path: p });
                return Ok(());
            }
        }
    } else {
        let cm_path = dir.join(&chunk_manifest_name(&name))?;
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
            let p = dir.join(&chunker::chunk_name(&name, i, count))?;
            match store.stat(&p)? {
                Some(s) => pieces.push((p, s.size)),
                None => push(StoreProblemKind::ChunkMissing { path: p }),
            }
        }
        if pieces.len() as u32 != count {
            return Ok(());
        }
        let sc_path = dir.join(&sidecar_name(&name))?;
        match store.read_small(&sc_path, SMALL_FILE_LIMIT)? {
            None => push(StoreProblemKind::FileMissing { path: sc_path }),
            Some(b) => match parse_sidecar(&b, Path::new(sc_path.as_str())) {
                Ok(d) if d == artifact.sha256 => {}
                Ok(d) => push(StoreProblemKind::SidecarDiffers {
                    path: sc_path,
                    found: d,
                    manifest: artifact.sha256,
                }),
                Err(e) => push(StoreProblemKind::Malformed(e)),
            },
        }
    }
    let total: u64 = pieces.iter().map(|(_, s)| s).sum();
    if total != artifact.size.get() {
        push(StoreProblemKind::SizeDiffers {
            total,
            manifest: artifact.size.get(),
        });
        return Ok(());
    }
    // Found in the store rather than uploaded now: it must be an OOB container too (a few
    // small reads: a seek on disk, an HTTP range on the Hub).
    let what = format!("{} {}", store.describe(), dir.join(&name)?);
    if let Err(not_oob) = crate::oob::check_pieces(store, &pieces, &what)? {
        push(StoreProblemKind::NotOob(not_oob));
        return Ok(());
    }
    if deep {
        let mut h = Hasher::new();
        for (p, _) in &pieces {
            h.update_from_reader(store.open(p)?)
                .map_err(|source| Error::StoreRead {
                    what: format!("{} {p}", store.describe()),
                    source,
                })?;
        }
        let d = h.finish();
        if d != artifact.sha256 {
            push(StoreProblemKind::Corrupt {
                dir,
                found: d,
                manifest: artifact.sha256,
            });
        }
    }
    Ok(())
}
