//! The thin reader behind [`super::check_store`]: one [`Snapshot`] per store, read through
//! `artifact-store`'s [`Store`] (a directory, a Hub bucket through HTTP, a `github:` checkout).
//! It lists `models/<gen>/`, reads the manifest, its signature (checked with the given keys)
//! and every `.chunkmanifest` and `.sha256`, each size-capped, and with `deep` hashes every
//! listed artifact streaming, reporting progress. It decides nothing.

use std::collections::BTreeMap;
use std::path::Path;

use artifact_store::signing::{VerifyingKey, check_signature};
use artifact_store::{Store, StoreAccess, StoreSpec};
use chunker::{Form, Hasher, SMALL_FILE_LIMIT};
use manifest::{Generation, Limits, Manifest, StoreLayout, StorePath};

use super::{MendContext, Report, Rules, SignatureRead, Snapshot, StoreRef, expected_artifacts};
use crate::Result;

/// What `release-cli audit` was asked.
#[derive(Debug, Clone)]
pub struct AuditRequest {
    pub generation: Generation,
    /// The stores; the first is the reference the others must match.
    pub stores: Vec<StoreSpec>,
    /// Public key files (`--key`); empty: signatures are not checked.
    pub keys: Vec<std::path::PathBuf>,
    /// For the pins of generations after v25 (`tinygrad_pins.json`), and the mend commands.
    pub openpilot: Option<std::path::PathBuf>,
    pub deep: bool,
    /// How the mend commands that publish again are written.
    pub mend: MendContext,
    pub access: StoreAccess,
}

/// The audit: name every store as mend commands do (a Hub repository refuses before any store
/// is read), load the keys and pins, read each store in turn, then decide ([`Report::decide`]).
pub fn run(req: &AuditRequest, progress: &mut dyn FnMut(DeepProgress)) -> Result<Report> {
    let mut specs = Vec::new();
    for spec in &req.stores {
        let r = store_ref(spec, &req.access.github_branch).ok_or_else(|| {
            artifact_store::Error::InvalidStore {
                spec: spec.to_string(),
                reason: "a Hub repository is no release store; audit the bucket \
                         (hf://buckets/NS/NAME)"
                    .into(),
            }
        })?;
        specs.push((spec, r));
    }
    let mut keys = Vec::new();
    for k in &req.keys {
        keys.extend(VerifyingKey::load_all(k)?);
    }
    let keys = (!req.keys.is_empty()).then_some(keys);
    let pins = crate::tree::load_pins(req.openpilot.as_deref())?;
    let mut snapshots = Vec::new();
    for (spec, r) in specs {
        let store = spec.open(&req.access)?;
        snapshots.push(snapshot(
            store.as_ref(),
            r,
            req.generation,
            keys.as_deref(),
            req.deep,
            Some(&req.mend.workspace),
            progress,
        )?);
    }
    Ok(Report::decide(
        &snapshots,
        &Rules {
            generation: req.generation,
            pins: &pins,
            keys: keys.as_ref().map_or(0, Vec::len),
            now: manifest::UnixSeconds::now(),
            mend: &req.mend,
        },
    ))
}

/// How a `--store` names its store in mend commands; `None` for a read-only Hub repository,
/// which nothing publishes to.
pub fn store_ref(spec: &StoreSpec, github_branch: &str) -> Option<StoreRef> {
    match spec {
        StoreSpec::Local(root) => Some(StoreRef::Local { root: root.clone() }),
        StoreSpec::HfBucket { bucket } => Some(StoreRef::Hub {
            bucket: bucket.clone(),
        }),
        StoreSpec::Github(checkout) => Some(StoreRef::Github {
            checkout: checkout.clone(),
            branch: github_branch.to_string(),
        }),
        StoreSpec::HfRepo { .. } => None,
    }
}

/// How far `--deep` hashing has got in one store.
#[derive(Debug, Clone, Copy)]
pub struct DeepProgress<'a> {
    pub store: &'a str,
    /// The logical artifact being hashed.
    pub artifact: &'a str,
    /// Bytes hashed in this store so far, and in all.
    pub done: u64,
    pub total: u64,
}

/// Read what [`super::check_store`] needs from `store`. `keys`: the `--key` public keys
/// (`None`: not given, a signature is then reported as not checked). `workspace`: whose
/// `ready/<id>/` chunks a corrupt artifact's chunks are compared with when the manifest lists
/// no per-chunk digests.
pub fn snapshot(
    store: &dyn Store,
    store_ref: StoreRef,
    generation: Generation,
    keys: Option<&[VerifyingKey]>,
    deep: bool,
    workspace: Option<&Path>,
    progress: &mut dyn FnMut(DeepProgress),
) -> Result<Snapshot> {
    let manifest = store
        .read_small(
            &StoreLayout::HfBucket.manifest_path(generation),
            Limits::DEFAULT_MAX_MANIFEST_BYTES,
        )
        .map_err(|e| e.to_string());
    let signature = read_signature(store, generation, keys, &manifest);
    let (files, odd) = listing(store, &store_ref, generation)?;
    let small = read_small_files(store, &files);
    let (digests, failing_chunks) = if deep {
        let parsed = manifest
            .as_ref()
            .ok()
            .and_then(|m| m.as_ref())
            .and_then(|b| Manifest::from_slice(b).ok());
        let name = store_ref.spec();
        let (digests, failing) = deep_digests(
            store,
            &name,
            &files,
            workspace,
            parsed.as_ref(),
            generation,
            progress,
        )?;
        (Some(digests), failing)
    } else {
        (None, BTreeMap::new())
    };
    Ok(Snapshot {
        store: store_ref,
        manifest,
        signature,
        files,
        small,
        digests,
        odd,
        failing_chunks,
    })
}

/// The generation's signature file, checked with `keys` over the `manifest` bytes read (none
/// read: over no bytes).
fn read_signature(
    store: &dyn Store,
    generation: Generation,
    keys: Option<&[VerifyingKey]>,
    manifest: &std::result::Result<Option<Vec<u8>>, String>,
) -> SignatureRead {
    match store.read_small(
        &StoreLayout::HfBucket.signature_path(generation),
        manifest::signature::MAX_SIGNATURE_BYTES,
    ) {
        Ok(None) => SignatureRead::Absent,
        Ok(Some(sig)) => match keys {
            None => SignatureRead::NotChecked,
            Some(keys) => {
                let data = manifest.as_ref().ok().and_then(Option::as_deref);
                let text = String::from_utf8_lossy(&sig);
                SignatureRead::Checked(check_signature(keys, data.unwrap_or_default(), &text))
            }
        },
        Err(e) => SignatureRead::Checked(Err(manifest::signature::Refusal::Malformed {
            reason: e.to_string(),
        })),
    }
}

/// Every file under `models/<gen>/` (bucket layout) with its size, and the entries there no
/// listing shows ([`super::OddEntry`], directory stores only).
fn listing(
    store: &dyn Store,
    store_ref: &StoreRef,
    generation: Generation,
) -> Result<(BTreeMap<String, u64>, BTreeMap<String, super::OddEntry>)> {
    let dir = StoreLayout::HfBucket.generation_dir(generation);
    let mut files: BTreeMap<String, u64> = store
        .list(&dir)?
        .into_iter()
        .map(|e| (e.path.to_string(), e.size))
        .collect();
    // A directory store's listing hides the temporaries of interrupted writes, names no store
    // path can hold and anything not a regular file; they are stale here, so look for them on
    // disk (never following a link).
    let mut odd = BTreeMap::new();
    if let StoreRef::Local { root } = store_ref {
        on_disk(
            &artifact_store::paths::to_fs_path(&dir, root),
            dir.as_str(),
            &mut files,
            &mut odd,
        )?;
    }
    Ok((files, odd))
}

/// The content of every `.chunkmanifest` and `.sha256` among `files`, or why it was not read;
/// one gone since the listing is left out.
fn read_small_files(
    store: &dyn Store,
    files: &BTreeMap<String, u64>,
) -> BTreeMap<String, std::result::Result<Vec<u8>, String>> {
    let mut small = BTreeMap::new();
    for path in files.keys() {
        if !matches!(
            chunker::member_form(path),
            Some((_, Form::ChunkManifest | Form::Sidecar))
        ) {
            continue;
        }
        let Ok(p) = path.parse::<StorePath>() else {
            continue;
        };
        let read = match store.read_small(&p, SMALL_FILE_LIMIT) {
            Ok(Some(b)) => Ok(b),
            Ok(None) => continue,
            Err(e) => Err(e.to_string()),
        };
        small.insert(path.clone(), read);
    }
    small
}

/// A corrupt artifact's failing chunks, by its logical path.
type FailingChunks = BTreeMap<String, Vec<super::FailingChunk>>;

/// `--deep`: the SHA-256 of every artifact `parsed` lists whose `files` are all in the store
/// (named `name`), by logical path, and for each corrupt chunked one the chunks that differ
/// ([`failing`]; `workspace`: whose `ready/<id>/` chunks they are compared with).
fn deep_digests(
    store: &dyn Store,
    name: &str,
    files: &BTreeMap<String, u64>,
    workspace: Option<&Path>,
    parsed: Option<&Manifest>,
    generation: Generation,
    progress: &mut dyn FnMut(DeepProgress),
) -> Result<(BTreeMap<String, chunker::Sha256Digest>, FailingChunks)> {
    let wanted: Vec<_> = parsed
        .map(|m| expected_artifacts(m, generation))
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.pieces().iter().all(|p| files.contains_key(p)))
        .collect();
    let total: u64 = wanted
        .iter()
        .flat_map(|e| e.pieces())
        .map(|p| files[&p])
        .sum();
    let mut done = 0u64;
    let (mut digests, mut failing_chunks) = (BTreeMap::new(), BTreeMap::new());
    for e in &wanted {
        let logical = e.logical();
        let listed = parsed
            .and_then(|m| m.get(&e.model))
            .filter(|_| e.variant.is_none())
            .and_then(|m| m.chunk_digests());
        let ready = workspace.map(|w| crate::Workspace::new(w).ready().join(e.model.as_str()));
        let pieces = e.pieces();
        let paths = pieces
            .iter()
            .map(|p| artifact_store::paths::store_path(p))
            .collect::<artifact_store::Result<Vec<_>>>()?;
        // A chunked artifact with something to compare its chunks with has each chunk hashed
        // in the same read, so a corrupt one is not read again.
        let each = e.count > 0 && (listed.is_some() || ready.is_some());
        let (whole, own) = artifact_store::digest_of(store, name, &paths, each, &mut |n| {
            done += n;
            progress(DeepProgress {
                store: name,
                artifact: &logical,
                done,
                total,
            })
        })?;
        if whole != e.sha256 && e.count > 0 {
            failing_chunks.insert(
                logical.clone(),
                failing(&pieces, &own, listed.as_deref(), ready.as_deref())?,
            );
        }
        digests.insert(logical, whole);
    }
    Ok((digests, failing_chunks))
}

/// The chunks of a corrupt artifact that differ from their reference: the manifest's per-chunk
/// digests when it lists them (`listed`), else the same-named chunk in the workspace's
/// `ready/<id>/` (`ready`), read only when it is a regular file. A chunk with no reference is
/// not named. `got`: each stored chunk's digest, from the read that found the artifact corrupt.
fn failing(
    pieces: &[String],
    got: &[chunker::Sha256Digest],
    listed: Option<&[chunker::Sha256Digest]>,
    ready: Option<&Path>,
) -> Result<Vec<super::FailingChunk>> {
    let mut out = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        let file = piece.rsplit('/').next().unwrap_or(piece);
        let reference = match (listed.and_then(|l| l.get(i)), ready) {
            (Some(d), _) => Some((*d, "the manifest's artifact_chunk_sha256".to_string())),
            (None, Some(dir)) => {
                local_digest(&dir.join(file))?.map(|d| (d, dir.join(file).display().to_string()))
            }
            (None, None) => None,
        };
        let Some((want, from)) = reference else {
            continue;
        };
        let got = got[i];
        if got != want {
            out.push(super::FailingChunk {
                path: piece.clone(),
                sha256: got,
                expected: want,
                reference: from,
            });
        }
    }
    Ok(out)
}

/// The SHA-256 of a local regular file, opened without blocking; `None` when it is absent or
/// not a regular file.
fn local_digest(path: &Path) -> Result<Option<chunker::Sha256Digest>> {
    use fs_err::os::unix::fs::OpenOptionsExt;
    let f = match fs_err::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if !f.metadata()?.is_file() {
        return Ok(None);
    }
    let mut h = Hasher::new();
    h.update_from_reader(&mut std::io::BufReader::new(f))?;
    Ok(Some(h.finish()))
}

/// Add every temporary (`chunker::atomic` names) under `dir` to `files`, as `rel/…`, and every
/// entry no listing shows (a name no store path can hold: control characters, a backslash,
/// invalid UTF-8; a FIFO, device or socket) to `odd`, shown escaped, with the shell command
/// that removes it by inode (no quoting of the odd name needed).
fn on_disk(
    dir: &Path,
    rel: &str,
    files: &mut BTreeMap<String, u64>,
    odd: &mut BTreeMap<String, super::OddEntry>,
) -> Result<()> {
    use std::os::unix::fs::{DirEntryExt, FileTypeExt};
    let entries = match fs_err::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for entry in entries {
        let entry = entry?;
        let ty = entry.file_type()?;
        let raw = entry.file_name();
        let name = raw.to_str().map(str::to_string);
        let child = name.as_ref().map(|n| format!("{rel}/{n}"));
        let holdable = child
            .as_ref()
            .is_some_and(|c| c.parse::<StorePath>().is_ok());
        let special = ty.is_fifo() || ty.is_socket() || ty.is_block_device() || ty.is_char_device();
        if !holdable || special {
            let shown = format!("{rel}/{}", escaped(raw.as_encoded_bytes()));
            odd.insert(
                shown,
                super::OddEntry {
                    at: format!("{}/{}", dir.display(), escaped(raw.as_encoded_bytes())),
                    what: if special {
                        "not a regular file (a FIFO, device or socket)"
                    } else if ty.is_dir() {
                        "a directory whose name no store path can hold"
                    } else {
                        "a name no store path can hold"
                    },
                    mend: format!(
                        "find {} -mindepth 1 -maxdepth 1 -inum {} -exec rm -rf -- {{}} +",
                        cli_support::shell_quote(&dir.display().to_string()),
                        entry.ino()
                    ),
                },
            );
            continue;
        }
        let (Some(name), Some(child)) = (name, child) else {
            continue;
        };
        if ty.is_dir() {
            on_disk(&entry.path(), &child, files, odd)?;
        } else if ty.is_file() && chunker::atomic::is_temp_name(&name) {
            files.insert(child, entry.metadata()?.len());
        }
    }
    Ok(())
}

/// A file name as text: UTF-8 with control characters, quotes and backslashes escaped as Rust
/// writes them (`\t`, `\u{1}`, `\\`), each byte of invalid UTF-8 as `\xNN`. Pure.
pub fn escaped(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        out.extend(chunk.valid().chars().flat_map(char::escape_debug));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}
