//! The plan of a publish, pure apart from reading the local artifacts directory: which local
//! files make up each model ([`prepare_local`]) and what each store needs of them, in upload
//! order ([`plan_model`]).

use fs_err as fs;
use std::path::{Path, PathBuf};

use chunker::{
    Form, Resolved, Sha256Digest, chunk_manifest_name, format_chunk_manifest, format_sidecar,
    sidecar_name,
};
use manifest::{Manifest, ModelEntry, ModelId};
use serde::Serialize;

use crate::error::{Error, Refusal, Result};
use crate::paths::StorePath;

/// What a local artifact file is, which fixes its place in the upload order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileRole {
    /// A `NAME.chunkNNofMM` (uploaded first).
    Chunk,
    /// The `NAME.sha256` sidecar (after the chunks).
    Sidecar,
    /// The `NAME.chunkmanifest` (last: it makes the set visible).
    ChunkManifest,
}

/// Where the bytes of a file to upload come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    /// A file on disk.
    Path(PathBuf),
    /// Bytes made in memory (a sidecar or chunk manifest written by publish).
    Bytes(Vec<u8>),
}

/// One file of a model's published form, with what it must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalFile {
    /// The file name in the model's store directory.
    pub name: String,
    /// What it is.
    pub role: FileRole,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256.
    pub sha256: Sha256Digest,
    /// Where its bytes come from.
    pub source: FileSource,
}

/// A model found in the artifacts directory, verified against the manifest, in upload order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalArtifact {
    /// The model.
    pub id: ModelId,
    /// The logical artifact name, `<id>_driving_tinygrad.pkl` unless the entry says otherwise.
    pub name: String,
    /// The files to upload, in upload order.
    pub files: Vec<LocalFile>,
    /// `None` for the model's artifact; the `accelerator_artifacts` key for a variant found in
    /// the same `<id>/` directory, uploaded beside it.
    pub variant: Option<String>,
}

impl LocalArtifact {
    /// Whether it is published as a chunk set (it has a `.chunkmanifest`), not one plain file.
    pub(crate) fn is_chunked(&self) -> bool {
        self.files.iter().any(|f| f.role == FileRole::ChunkManifest)
    }
}

/// What the store holds for one file, as observed before planning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// Not in the store.
    Missing,
    /// Present; `sha256` is `None` when it was not worth reading (the size already differs).
    Present {
        /// Its size in bytes.
        size: u64,
        /// Its SHA-256, when read.
        sha256: Option<Sha256Digest>,
    },
}

/// Why a file is uploaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Not in the store.
    Missing,
    /// In the store with another size.
    SizeDiffers,
    /// In the store with the same size and another SHA-256.
    ContentDiffers,
    /// The chunk manifest is rewritten because the chunks under it changed.
    ChunksChanged,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reason::Missing => "missing",
            Reason::SizeDiffers => "size differs",
            Reason::ContentDiffers => "content differs",
            Reason::ChunksChanged => "chunks changed",
        })
    }
}

/// One step of a store's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Step {
    /// Remove the chunk manifest before changing chunks under it.
    Retract {
        /// The chunk manifest's store path.
        path: String,
    },
    /// Upload a file.
    Upload {
        /// The store path.
        path: String,
        /// Index of the file in its [`LocalArtifact::files`].
        #[serde(skip)]
        file: usize,
        /// No byte of the file is in the range (it starts past the end, a zero-length suffix, an
        /// empty file): answered 416.
        size: u64,
        /// Why it is uploaded.
        reason: Reason,
    },
    /// A plain `NAME` beside the chunk set would win over it for every reader.
    RemoveShadowingPlain {
        /// The plain file's store path.
        path: String,
    },
    /// The store already holds this file with this size and SHA-256.
    Skip {
        /// The store path.
        path: String,
        /// Its size in bytes.
        size: u64,
    },
    /// A chunk an older split of the artifact left (another chunk count), removed once the new
    /// manifest is live in the store, never before: a device that fetched the old manifest
    /// finds the old chunks until then.
    RemoveStale {
        /// The stale chunk's store path.
        path: String,
    },
}

/// The files in an artifact directory (`listed`: file names) that an older split of `name`
/// left: chunks `NAME.chunkNNofMM` with another count than `count`, and, when the artifact is
/// now one plain file (`count` 0), the old set's `.chunkmanifest` too. Pure.
pub fn stale_split_files(name: &str, count: u32, listed: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = listed
        .iter()
        .filter(|f| {
            matches!(chunker::form_of(name, f), Some(Form::Chunk { count: n, .. }) if n != count)
                || (count == 0 && **f == chunk_manifest_name(name))
        })
        .map(|f| f.to_string())
        .collect();
    out.sort();
    out
}

/// The steps for one model: retract if needed, chunks, `.sha256`, `.chunkmanifest`, then drop a
/// shadowing plain file. `observed[i]` is what the store holds for `local.files[i]`;
/// `plain_present` whether a plain `NAME` file is in the store directory.
pub fn plan_model(
    local: &LocalArtifact,
    dir: &StorePath,
    observed: &[Observed],
    plain_present: bool,
) -> Vec<Step> {
    assert_eq!(
        local.files.len(),
        observed.len(),
        "one observation per file"
    );
    let path_of = |name: &str| format!("{dir}/{name}");
    let needs = |f: &LocalFile, o: &Observed| -> Option<Reason> {
        match o {
            Observed::Missing => Some(Reason::Missing),
            Observed::Present { size, .. } if *size != f.size => Some(Reason::SizeDiffers),
            Observed::Present { sha256, .. } if *sha256 != Some(f.sha256) => {
                Some(Reason::ContentDiffers)
            }
            Observed::Present { .. } => None,
        }
    };
    let mut order: Vec<usize> = (0..local.files.len()).collect();
    // Stable: chunks keep their index order, then the sidecar, then the chunk manifest.
    order.sort_by_key(|&i| local.files[i].role);

    let content_changes = order.iter().any(|&i| {
        local.files[i].role != FileRole::ChunkManifest
            && needs(&local.files[i], &observed[i]).is_some()
    });
    let mut steps = Vec::new();
    for &i in &order {
        let f = &local.files[i];
        let o = &observed[i];
        let path = path_of(&f.name);
        let reason = if f.role == FileRole::ChunkManifest {
            let present = matches!(o, Observed::Present { .. });
            if content_changes && present {
                steps.insert(0, Step::Retract { path: path.clone() });
                // After a retract the chunk manifest is gone, so it is always written again.
                Some(Reason::ChunksChanged)
            } else if content_changes {
                Some(needs(f, o).unwrap_or(Reason::ChunksChanged))
            } else {
                needs(f, o)
            }
        } else {
            needs(f, o)
        };
        match reason {
            Some(reason) => steps.push(Step::Upload {
                path,
                file: i,
                size: f.size,
                reason,
            }),
            None => steps.push(Step::Skip { path, size: f.size }),
        }
    }
    if plain_present {
        steps.push(Step::RemoveShadowingPlain {
            path: path_of(&local.name),
        });
    }
    steps
}

/// Scan the artifacts directory: one `<id>/` per model, each a chunk set matching its manifest
/// entry (count, size, whole digest, and per-chunk digests when the entry lists them). Reads
/// every chunk once, streaming.
pub fn prepare_local(dir: &Path, manifest: &Manifest) -> Result<Vec<LocalArtifact>> {
    prepare_local_for(dir, manifest, manifest::ContractName::V25.contract())
}

/// [`prepare_local`] under `contract`: where the contract publishes an artifact that fits one
/// chunk as one plain file (v26), an entry with `artifact_chunk_count` 0 uploads its plain file
/// (at most one chunk's size); otherwise such an entry is refused as before.
pub fn prepare_local_for(
    dir: &Path,
    manifest: &Manifest,
    contract: &manifest::Contract,
) -> Result<Vec<LocalArtifact>> {
    let mut ids = Vec::new();
    let mut loose = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let ty = entry.file_type()?;
        // A symlinked `<id>/` is followed (to a directory only).
        let is_dir = ty.is_dir() || (ty.is_symlink() && fs::metadata(entry.path())?.is_dir());
        if !is_dir {
            // Other files (the manifest, `artifacts.json` beside a rebuild's staging) are fine;
            // artifact pieces out of their `<id>/` would silently publish nothing.
            if looks_like_artifact_piece(&name) {
                loose.push(name);
            }
            continue;
        }
        let id: ModelId = name.parse().map_err(|e: manifest::Error| {
            Error::Refused(Refusal::NotAModelId {
                path: entry.path(),
                source: e,
            })
        })?;
        ids.push(id);
    }
    if !loose.is_empty() {
        loose.sort();
        return Err(Error::Refused(Refusal::LooseFiles {
            dir: dir.to_path_buf(),
            loose,
        }));
    }
    ids.sort();
    let mut out = Vec::new();
    for id in ids {
        out.extend(prepare_one(dir, &id, manifest, contract)?);
    }
    Ok(out)
}

/// One model of the artifacts directory `dir` as [`prepare_local_for`] reads it: `<id>/`'s
/// artifact, then each accelerator variant found beside it, verified against `manifest`.
pub fn prepare_one(
    dir: &Path,
    id: &ModelId,
    manifest: &Manifest,
    contract: &manifest::Contract,
) -> Result<Vec<LocalArtifact>> {
    let entry = manifest.get(id).ok_or_else(|| {
        Error::Refused(Refusal::NoManifestEntry {
            path: dir.join(id.as_str()),
            model: id.clone(),
        })
    })?;
    let mut out = vec![prepare_model(
        dir,
        id,
        entry,
        contract.plain_file_when_one_chunk,
    )?];
    for target in super::inspect::variant_targets(entry).into_iter().flatten() {
        let logical = dir.join(id.as_str()).join(&target.file_name);
        if let Some(found) = chunker::resolve(&logical)? {
            out.push(prepare_found(id, &logical, found, &target, None)?);
        }
    }
    Ok(out)
}

/// Verify the artifact found at `logical` against `target` (form and count, each chunk's digest
/// the model's entry lists, size, SHA-256, OOB container, a sidecar beside a model's chunk set)
/// and list its files in upload order: one plain file for a count of 0, else the chunks,
/// `.sha256` and `.chunkmanifest`. `main`: the model's entry when this is its own artifact,
/// `None` for an accelerator variant.
fn prepare_found(
    id: &ModelId,
    logical: &Path,
    found: Resolved,
    target: &super::inspect::VariantTarget,
    main: Option<&ModelEntry>,
) -> Result<LocalArtifact> {
    let what = logical.display().to_string();
    let pieces = match (found, target.count) {
        (Resolved::Plain { path, size }, 0) => vec![(path, size)],
        (Resolved::Chunked { pieces, .. }, n) if n > 0 => pieces,
        (other, _) => {
            return Err(Error::Refused(Refusal::NotAChunkSet {
                path: logical.to_path_buf(),
                form: other.form(),
            }));
        }
    };
    if target.count > 0 && pieces.len() as u32 != target.count {
        return Err(chunker::Error::CountMismatch {
            name: what,
            expected: target.count,
            actual: pieces.len() as u32,
        }
        .into());
    }
    let chunk_digests = main.and_then(ModelEntry::chunk_digests);
    let (digest, chunk_sha256) = chunker::hash_chunk_set(&pieces)?;
    let mut files = Vec::new();
    let mut total = 0u64;
    for (i, ((path, size), chunk_digest)) in pieces.iter().zip(chunk_sha256).enumerate() {
        if let Some(expected) = chunk_digests.as_ref().and_then(|d| d.get(i))
            && *expected != chunk_digest
        {
            return Err(chunker::Error::DigestMismatch {
                what: path.display().to_string(),
                expected: *expected,
                actual: chunk_digest,
            }
            .into());
        }
        total += size;
        files.push(LocalFile {
            name: path
                .file_name()
                .expect("artifact paths have names")
                .to_string_lossy()
                .into_owned(),
            role: FileRole::Chunk,
            size: *size,
            sha256: chunk_digest,
            source: FileSource::Path(path.clone()),
        });
    }
    if total != target.size {
        return Err(chunker::Error::SizeMismatch {
            what,
            expected: target.size,
            actual: total,
        }
        .into());
    }
    if digest != target.sha256 {
        return Err(chunker::Error::DigestMismatch {
            what,
            expected: target.sha256,
            actual: digest,
        }
        .into());
    }
    // Every driving artifact is an out-of-band pickle container; the check reads only its
    // headers, seeking over the buffers through the chunk set.
    chunker::check_oob_reader(&mut chunker::ArtifactReader::new(pieces), &what)?;
    let name = &target.file_name;
    if main.is_some() && target.count > 0 {
        // A sidecar in the directory must agree; the uploaded one is always written fresh.
        let sidecar_path = logical.with_file_name(sidecar_name(name));
        if let Some(found) = chunker::read_sidecar(&sidecar_path)?
            && found != digest
        {
            return Err(chunker::Error::DigestMismatch {
                what: sidecar_path.display().to_string(),
                expected: digest,
                actual: found,
            }
            .into());
        }
    }
    if target.count > 0 {
        files.extend(small_files(name, &digest, target.count));
    }
    Ok(LocalArtifact {
        id: id.clone(),
        name: name.clone(),
        files,
        variant: main.is_none().then(|| target.variant.clone()),
    })
}

/// The two small files published after a chunk set's chunks, in that order: the `.sha256`
/// naming `digest` for `name`, then the `.chunkmanifest` naming `count`.
fn small_files(name: &str, digest: &Sha256Digest, count: u32) -> [LocalFile; 2] {
    let file = |name: String, role: FileRole, bytes: Vec<u8>| LocalFile {
        name,
        role,
        size: bytes.len() as u64,
        sha256: Sha256Digest::of_bytes(&bytes),
        source: FileSource::Bytes(bytes),
    };
    [
        file(
            sidecar_name(name),
            FileRole::Sidecar,
            format_sidecar(digest, name).into_bytes(),
        ),
        file(
            chunk_manifest_name(name),
            FileRole::ChunkManifest,
            format_chunk_manifest(count).into_bytes(),
        ),
    ]
}

/// A name that is part of a logical artifact: `X.pkl`, its chunks, chunk manifest, sidecar or
/// legacy parts. Any `.chunk…` tail counts (a chunk of any spelling is still a piece lying loose).
pub(crate) fn looks_like_artifact_piece(name: &str) -> bool {
    let Some(end) = name.find(".pkl").map(|i| i + ".pkl".len()) else {
        return false;
    };
    chunker::form_of(&name[..end], name).is_some() || name[end..].starts_with(".chunk")
}

/// The model's own artifact in `<dir>/<id>/`: a chunk set, or where `plain_ok` (v26) one plain
/// file at most one chunk long when its entry's count is 0.
fn prepare_model(
    dir: &Path,
    id: &ModelId,
    entry: &ModelEntry,
    plain_ok: bool,
) -> Result<LocalArtifact> {
    let name = entry.file_name().as_str().to_string();
    let model_dir = dir.join(id.as_str());
    let logical = model_dir.join(&name);
    // An empty `<id>/` marks the model as intended without uploading anything: its files are
    // already in the store (a reuse copied them there), where step 2 checks them. So does one
    // that holds only accelerator variants (uploaded beside the stored artifact).
    if holds_only_variants(&model_dir, entry)? {
        return Ok(LocalArtifact {
            id: id.clone(),
            name,
            files: Vec::new(),
            variant: None,
        });
    }
    let artifact = entry
        .artifact()
        .ok_or_else(|| Error::Refused(Refusal::NoArtifactFields { model: id.clone() }))?;
    let count = artifact.chunk_count.get();
    if count == 0 && !plain_ok {
        return Err(Error::Refused(Refusal::PlainFileCount {
            model: id.clone(),
        }));
    }
    let found = chunker::resolve(&logical)?.ok_or_else(|| chunker::Error::NotFound {
        path: logical.clone(),
    })?;
    if let (0, Resolved::Plain { size, .. }) = (count, &found)
        && *size > chunker::DEFAULT_CHUNK_SIZE
    {
        return Err(Error::Refused(Refusal::NotAChunkSet {
            path: logical,
            form: "plain file larger than one chunk",
        }));
    }
    let target = super::inspect::VariantTarget::main(entry, &artifact);
    prepare_found(id, &logical, found, &target, Some(entry))
}

/// Whether every entry of `model_dir` is one of the entry's accelerator variants (or there is
/// none).
fn holds_only_variants(model_dir: &Path, entry: &ModelEntry) -> Result<bool> {
    let variant_names: Vec<String> = super::inspect::variant_targets(entry)
        .into_iter()
        .flatten()
        .map(|t| t.file_name)
        .collect();
    for e in fs::read_dir(model_dir)? {
        let n = e?.file_name().to_string_lossy().into_owned();
        if !variant_names.iter().any(|v| n.starts_with(v.as_str())) {
            return Ok(false);
        }
    }
    Ok(true)
}
