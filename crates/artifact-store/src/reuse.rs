//! Reusing a compatible artifact built elsewhere (docs/formats.md, "Artifact reuse"; the seed's
//! "Reuse Compatible Artifacts").
//!
//! An artifact may be adopted only when its catalog records exactly the same tinygrad commit
//! and exactly the same source-model commit as the caller states; names and dates prove nothing.
//! Adoption is a copy of every chunk, server-side when both ends are on the Hub, renamed to the
//! stable StarPilot ID (`<id>_driving_tinygrad.pkl.chunkNNofMM`), then the `.sha256`, then the
//! `.chunkmanifest` last. The source's SHA-256 and chunk count can then go into our manifest.
//!
//! The compatibility decision ([`check_compatibility`]) is pure and runs before anything is
//! read from or written to a store.

use std::path::Path;

use chunker::{
    Sha256Digest, chunk_manifest_name, chunk_name, format_chunk_manifest, format_sidecar,
    parse_chunk_manifest, parse_sidecar, sidecar_name,
};
use manifest::{Artifact, Generation, GitCommit, Manifest, ModelId, StoreLayout};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::paths::{StorePath, parent};
use crate::store::Store;

use chunker::SMALL_FILE_LIMIT;

pub use crate::refusal::{Difference, ReuseRefusal};

/// What the source catalog says about the artifact, once it is proven compatible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compatible {
    /// The source's artifact fields: format, size, SHA-256, chunk count.
    pub artifact: Artifact,
    /// The source's per-chunk digests, when it records them.
    pub chunk_digests: Option<Vec<Sha256Digest>>,
}

/// Refuse unless the catalog entry `source_id` records exactly `tinygrad_commit` (top-level
/// `tinygrad_commit`) and `source_commit` (the entry's `source_commit`). Every difference is
/// named.
pub fn check_compatibility(
    catalog: &Manifest,
    source_id: &ModelId,
    source_commit: &GitCommit,
    tinygrad_commit: &GitCommit,
) -> Result<Compatible> {
    let entry = catalog.get(source_id).ok_or_else(|| {
        Error::ReuseRefused(ReuseRefusal::UnknownSource {
            source_id: source_id.clone(),
        })
    })?;
    let mut differs = Vec::new();
    // Under the key of the catalog's own contract (v26: `compiler_revision`).
    match catalog.own_revision() {
        None => differs.push(Difference::NoTinygradCommit),
        Some(c) if &c != tinygrad_commit => differs.push(Difference::TinygradCommit {
            recorded: c,
            given: tinygrad_commit.clone(),
        }),
        Some(_) => {}
    }
    match entry.source_commit() {
        None => differs.push(Difference::NoSourceCommit),
        Some(c) if &c != source_commit => differs.push(Difference::SourceCommit {
            recorded: c,
            given: source_commit.clone(),
        }),
        Some(_) => {}
    }
    if !differs.is_empty() {
        return Err(Error::ReuseRefused(ReuseRefusal::Incompatible {
            source_id: source_id.clone(),
            differences: differs,
        }));
    }
    let artifact = entry.artifact().ok_or_else(|| {
        Error::ReuseRefused(ReuseRefusal::NoArtifact {
            source_id: source_id.clone(),
        })
    })?;
    if artifact.chunk_count.is_plain_file() {
        return Err(Error::ReuseRefused(ReuseRefusal::PlainFile {
            source_id: source_id.clone(),
        }));
    }
    Ok(Compatible {
        artifact,
        chunk_digests: entry.chunk_digests(),
    })
}

/// A reuse to carry out.
pub struct ReuseRequest<'a> {
    /// The model (the stable ID the artifact is renamed to).
    pub model: ModelId,
    /// The generation it is reused into.
    pub generation: Generation,
    /// The store the source artifact is in.
    pub source: &'a dyn Store,
    /// The logical artifact in the source store (`dir/x_driving_tinygrad.pkl`).
    pub source_path: StorePath,
    /// What the source catalog says about it, proven compatible.
    pub compatible: Compatible,
    /// The store it is copied to.
    pub dest: &'a dyn Store,
}

/// What a reuse did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReuseReport {
    /// The model.
    pub model: String,
    /// The artifact's SHA-256.
    pub sha256: Sha256Digest,
    /// Its size in bytes.
    pub size: u64,
    /// Its chunk count.
    pub chunk_count: u32,
    /// Every chunk went Hub-to-Hub: no artifact bytes passed through this machine.
    pub server_side: bool,
    /// Every chunk copied, in order.
    pub copied: Vec<CopiedChunk>,
}

/// One chunk a reuse copied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CopiedChunk {
    /// The source (store and path).
    pub from: String,
    /// The destination (store and path).
    pub to: String,
    /// Its size in bytes.
    pub size: u64,
}

/// What a reuse does, worked out by reading the source only: nothing is written anywhere
/// (`reuse --dry-run` prints it; [`reuse`] carries it out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReusePlan {
    /// The model.
    pub model: String,
    /// The artifact's SHA-256.
    pub sha256: Sha256Digest,
    /// Its size in bytes.
    pub size: u64,
    /// Its chunk count.
    pub chunk_count: u32,
    /// Every chunk can go Hub-to-Hub (both ends are on the Hub).
    pub server_side: bool,
    /// Removed from the destination first, so the model reads "not present" until every chunk
    /// is in.
    pub remove: String,
    /// The chunk copies, in order.
    pub copy: Vec<CopiedChunk>,
    /// Written last, in this order: the `.sha256`, then the `.chunkmanifest`.
    pub write: Vec<String>,
    #[serde(skip)]
    steps: Vec<(StorePath, StorePath, u64)>,
    #[serde(skip)]
    dest_sidecar: StorePath,
    #[serde(skip)]
    dest_cm: StorePath,
}

/// Check the source against its catalog (count, sidecar digest, every chunk present, sizes, OOB
/// container) and plan the copy into `models/<gen>/<model>/`, renamed. Only reads the source.
pub fn plan(req: &ReuseRequest<'_>) -> Result<ReusePlan> {
    let sources = check_source(req)?;
    copy_plan(req, sources)
}

/// The source chunk set, checked against its catalog: each chunk's path and size, in order.
fn check_source(req: &ReuseRequest<'_>) -> Result<Vec<(StorePath, u64)>> {
    let artifact = &req.compatible.artifact;
    let count = artifact.chunk_count.get();
    let src_name = req.source_path.file_name().to_string();
    let src_dir = parent(&req.source_path);
    let src_file = |name: &str| -> Result<StorePath> {
        Ok(match &src_dir {
            Some(d) => d.join(name)?,
            None => name.parse()?,
        })
    };

    // The source must be what its catalog says: the same count, the same digest in its sidecar
    // if it has one, every chunk present and the sizes adding up. All small reads.
    let cm_path = src_file(&chunk_manifest_name(&src_name))?;
    let cm = req
        .source
        .read_small(&cm_path, SMALL_FILE_LIMIT)?
        .ok_or_else(|| {
            Error::ReuseRefused(ReuseRefusal::SourceFileMissing {
                store: req.source.describe(),
                path: cm_path.clone(),
                whole_set: true,
            })
        })?;
    let found = parse_chunk_manifest(&cm, Path::new(cm_path.as_str()))?;
    if found != count {
        return Err(Error::ReuseRefused(ReuseRefusal::ChunkCountDiffers {
            store: req.source.describe(),
            path: cm_path,
            found,
            catalog: count,
        }));
    }
    let sc_path = src_file(&sidecar_name(&src_name))?;
    if let Some(sc) = req.source.read_small(&sc_path, SMALL_FILE_LIMIT)? {
        let d = parse_sidecar(&sc, Path::new(sc_path.as_str()))?;
        if d != artifact.sha256 {
            return Err(Error::ReuseRefused(ReuseRefusal::DigestDiffers {
                store: req.source.describe(),
                path: sc_path,
                found: d,
                catalog: artifact.sha256,
            }));
        }
    }
    let mut sources = Vec::new();
    let mut total = 0u64;
    for i in 1..=count {
        let p = src_file(&chunk_name(&src_name, i, count))?;
        let stat = req.source.stat(&p)?.ok_or_else(|| {
            Error::ReuseRefused(ReuseRefusal::SourceFileMissing {
                store: req.source.describe(),
                path: p.clone(),
                whole_set: false,
            })
        })?;
        total += stat.size;
        sources.push((p, stat.size));
    }
    if total != artifact.size.get() {
        return Err(Error::ReuseRefused(ReuseRefusal::SizeDiffers {
            total,
            catalog: artifact.size.get(),
        }));
    }
    // Only an out-of-band pickle container may become a v25 artifact: checked on the source
    // before anything is copied, reading only its headers (HTTP ranges on the Hub).
    let what = format!("{} {}", req.source.describe(), req.source_path);
    if let Err(not_oob) = crate::oob::check_pieces(req.source, &sources, &what)? {
        return Err(Error::ReuseRefused(ReuseRefusal::NotOob(not_oob)));
    }
    Ok(sources)
}

/// The copy of the checked `sources` into `models/<gen>/<model>/`, renamed.
fn copy_plan(req: &ReuseRequest<'_>, sources: Vec<(StorePath, u64)>) -> Result<ReusePlan> {
    let artifact = &req.compatible.artifact;
    let count = artifact.chunk_count.get();
    let dest_name = manifest::layout::artifact_file_name(&req.model).to_string();
    let dir = StoreLayout::HfBucket.artifact_dir(req.generation, &req.model);
    let dest_cm = dir.join(&chunk_manifest_name(&dest_name))?;

    let mut steps = Vec::new();
    let mut copy = Vec::new();
    let mut server_side = true;
    for (i, (src, size)) in sources.into_iter().enumerate() {
        let to = dir.join(&chunk_name(&dest_name, i as u32 + 1, count))?;
        server_side &= req.source.hub_uri(&src).is_some() && req.dest.hub_uri(&to).is_some();
        copy.push(CopiedChunk {
            from: format!("{} {src}", req.source.describe()),
            to: to.to_string(),
            size,
        });
        steps.push((src, to, size));
    }
    let dest_sidecar = dir.join(&sidecar_name(&dest_name))?;
    Ok(ReusePlan {
        model: req.model.to_string(),
        sha256: artifact.sha256,
        size: artifact.size.get(),
        chunk_count: count,
        server_side,
        remove: dest_cm.to_string(),
        copy,
        write: vec![dest_sidecar.to_string(), dest_cm.to_string()],
        steps,
        dest_sidecar,
        dest_cm,
    })
}

/// Copy the source chunk set into `models/<gen>/<model>/`, renamed, `.chunkmanifest` last
/// (the [`plan`], carried out). `on_chunk(index, count, size)` is called after each chunk (for
/// progress).
pub fn reuse(
    req: &ReuseRequest<'_>,
    on_chunk: &mut dyn FnMut(u32, u32, u64),
) -> Result<ReuseReport> {
    let plan = plan(req)?;
    let count = plan.chunk_count;
    // Chunks are about to change: the directory must read "not present" until they are all in.
    req.dest.delete(&plan.dest_cm)?;
    let mut copied = Vec::new();
    let mut server_side = true;
    for (i, (src, to, size)) in plan.steps.iter().enumerate() {
        let index = i as u32 + 1;
        let hub = match req.source.hub_uri(src) {
            Some(uri) => req.dest.copy_from_hub(&uri, to)?,
            None => false,
        };
        if !hub {
            server_side = false;
            let mut r = req.source.open(src)?;
            req.dest.write(to, &mut r)?;
        }
        if req.dest.stat(to)?.map(|s| s.size) != Some(*size) {
            return Err(Error::BadResponse {
                url: format!("{} {to}", req.dest.describe()),
                reason: format!("after the copy it is not {size} bytes; run reuse again"),
            });
        }
        copied.push(plan.copy[i].clone());
        on_chunk(index, count, *size);
    }
    req.dest.write_bytes(
        &plan.dest_sidecar,
        format_sidecar(
            &plan.sha256,
            &manifest::layout::artifact_file_name(&req.model).to_string(),
        )
        .as_bytes(),
    )?;
    req.dest
        .write_bytes(&plan.dest_cm, format_chunk_manifest(count).as_bytes())?;
    Ok(ReuseReport {
        model: plan.model,
        sha256: plan.sha256,
        size: plan.size,
        chunk_count: count,
        server_side,
        copied,
    })
}

/// Put the reused artifact into `manifest`'s entry for `model` (which must exist: reuse does not
/// add models), with the source commit and, when known, the per-chunk digests.
pub fn update_manifest_entry(
    manifest: &mut Manifest,
    model: &ModelId,
    compatible: &Compatible,
    source_commit: &GitCommit,
) -> Result<()> {
    let entry = manifest.get_mut(model).ok_or_else(|| {
        Error::ReuseRefused(ReuseRefusal::NoManifestEntry {
            model: model.clone(),
        })
    })?;
    match &compatible.chunk_digests {
        Some(d) => entry.set_artifact_with_chunks(&compatible.artifact, d)?,
        None => entry.set_artifact(&compatible.artifact),
    }
    entry.set_source_commit(source_commit);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TG: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";
    const SRC: &str = "1111111111111111111111111111111111111111";
    const OTHER: &str = "2222222222222222222222222222222222222222";

    fn catalog(tg: Option<&str>, src: Option<&str>) -> Manifest {
        let mut top = serde_json::Map::new();
        if let Some(t) = tg {
            top.insert("tinygrad_commit".into(), t.into());
        }
        let mut e = serde_json::json!({
            "id": "pop", "name": "Pop", "version": "v15", "series": "OP Series",
            "released": "2025-01-01", "community_favorite": false,
            "artifact_format": "tinygrad_single_v1", "artifact_size": 10,
            "artifact_sha256": Sha256Digest::of_bytes(b"x").to_hex(),
            "artifact_chunk_count": 2, "uses_external_gpu": false
        });
        if let Some(s) = src {
            e["source_commit"] = s.into();
        }
        top.insert("models".into(), serde_json::Value::Array(vec![e]));
        Manifest::from_value(serde_json::Value::Object(top)).unwrap()
    }

    fn c(s: &str) -> GitCommit {
        s.parse().unwrap()
    }

    #[test]
    fn exact_commits_are_compatible() {
        let ok = check_compatibility(
            &catalog(Some(TG), Some(SRC)),
            &"pop".parse().unwrap(),
            &c(SRC),
            &c(TG),
        )
        .unwrap();
        assert_eq!(ok.artifact.chunk_count.get(), 2);
    }

    /// The refusal is typed: callers match on the variant and each difference, not on text.
    #[test]
    fn refusals_are_typed() {
        let id: ModelId = "pop".parse().unwrap();
        let refusal = |cat: Manifest, id: &ModelId, src: &str, tg: &str| match check_compatibility(
            &cat,
            id,
            &c(src),
            &c(tg),
        )
        .unwrap_err()
        {
            Error::ReuseRefused(r) => r,
            other => panic!("not a reuse refusal: {other}"),
        };
        let cases: Vec<(Manifest, &str, Vec<Difference>)> = vec![
            (
                catalog(Some(TG), Some(SRC)),
                OTHER,
                vec![Difference::TinygradCommit {
                    recorded: c(TG),
                    given: c(OTHER),
                }],
            ),
            (
                catalog(None, None),
                TG,
                vec![Difference::NoTinygradCommit, Difference::NoSourceCommit],
            ),
            (
                catalog(Some(TG), Some(OTHER)),
                TG,
                vec![Difference::SourceCommit {
                    recorded: c(OTHER),
                    given: c(SRC),
                }],
            ),
        ];
        for (cat, tg, want) in cases {
            assert_eq!(
                refusal(cat, &id, SRC, tg),
                ReuseRefusal::Incompatible {
                    source_id: id.clone(),
                    differences: want
                }
            );
        }
        let nope: ModelId = "nope".parse().unwrap();
        assert_eq!(
            refusal(catalog(Some(TG), Some(SRC)), &nope, SRC, TG),
            ReuseRefusal::UnknownSource { source_id: nope }
        );
    }

    #[test]
    fn each_difference_is_named() {
        let id: ModelId = "pop".parse().unwrap();
        let refused = check_compatibility(&catalog(Some(TG), Some(SRC)), &id, &c(SRC), &c(OTHER))
            .unwrap_err();
        let e = refused.to_string();
        assert!(
            e.contains("tinygrad commit differs") && !e.contains("source-model commit differs"),
            "{e}"
        );
        let next = cli_support::NextStep::next_step(&refused).unwrap_or_default();
        assert!(
            next.starts_with("nothing was written; rebuild pop"),
            "{next}"
        );
        let e = check_compatibility(&catalog(Some(TG), Some(SRC)), &id, &c(OTHER), &c(TG))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("source-model commit differs") && !e.contains("tinygrad commit differs"),
            "{e}"
        );
        let e = check_compatibility(&catalog(Some(OTHER), Some(OTHER)), &id, &c(SRC), &c(TG))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tinygrad commit differs") && e.contains("source-model commit differs"),
            "{e}"
        );
        let e = check_compatibility(&catalog(None, None), &id, &c(SRC), &c(TG))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("records no tinygrad commit")
                && e.contains("records no source-model commit"),
            "{e}"
        );
        let e = check_compatibility(
            &catalog(Some(TG), Some(SRC)),
            &"nope".parse().unwrap(),
            &c(SRC),
            &c(TG),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--source-id"), "{e}");
    }
}
