//! The thin reader behind [`super::check_store`]: one [`Snapshot`] per store, read through
//! `artifact-store`'s [`Store`] (a directory, a Hub bucket through HTTP, a `github:` checkout).
//! It lists `models/<gen>/`, reads the manifest, its signature (checked with the given keys)
//! and every `.chunkmanifest` and `.sha256`, each size-capped, and with `deep` hashes every
//! listed artifact streaming, reporting progress. It decides nothing.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use artifact_store::signing::{VerifyingKey, check_signature};
use artifact_store::{Store, StoreSpec};
use chunker::Hasher;
use manifest::{Generation, Limits, Manifest, StoreLayout, StorePath};

use super::{
    MendContext, Report, Rules, SMALL_FILE_LIMIT, SignatureRead, Snapshot, StoreRef,
    expected_artifacts,
};
use crate::Result;

/// What `release-cli audit` was asked.
#[derive(Debug, Clone)]
pub struct AuditRequest {
    pub generation: Generation,
    /// The stores as the user named them; the first is the reference the others must match.
    pub stores: Vec<String>,
    /// Public key files (`--key`); empty: signatures are not checked.
    pub keys: Vec<std::path::PathBuf>,
    /// For the pins of generations after v25 (`tinygrad_pins.json`), and the mend commands.
    pub openpilot: Option<std::path::PathBuf>,
    pub deep: bool,
    /// How the mend commands that publish again are written.
    pub mend: MendContext,
    pub hf: artifact_store::HfConfig,
    pub github_branch: String,
}

/// The audit: parse every store name (a bad one refuses before any store is read), load the
/// keys and pins, read each store in turn, then decide ([`Report::decide`]).
pub fn run(req: &AuditRequest, progress: &mut dyn FnMut(DeepProgress)) -> Result<Report> {
    let mut specs = Vec::new();
    for s in &req.stores {
        let spec = StoreSpec::parse(s)?;
        let r = store_ref(&spec, &req.github_branch).ok_or_else(|| {
            artifact_store::Error::InvalidStore {
                spec: s.clone(),
                reason: "a Hub repository is no release store; audit the bucket \
                         (hf://buckets/NS/NAME)"
                    .into(),
            }
        })?;
        specs.push((spec, r));
    }
    let keys = if req.keys.is_empty() {
        None
    } else {
        let mut keys = Vec::new();
        for k in &req.keys {
            keys.extend(VerifyingKey::load_all(k)?);
        }
        Some(keys)
    };
    let pins = crate::tree::load_pins(req.openpilot.as_deref())?;
    let mut snapshots = Vec::new();
    for (spec, r) in specs {
        let store = spec.open(&req.hf, &req.github_branch)?;
        snapshots.push(snapshot(
            store.as_ref(),
            r,
            req.generation,
            keys.as_deref(),
            req.deep,
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
/// (`None`: not given, a signature is then reported as not checked).
pub fn snapshot(
    store: &dyn Store,
    store_ref: StoreRef,
    generation: Generation,
    keys: Option<&[VerifyingKey]>,
    deep: bool,
    progress: &mut dyn FnMut(DeepProgress),
) -> Result<Snapshot> {
    let layout = StoreLayout::HfBucket;
    let manifest = store
        .read_small(
            &layout.manifest_path(generation),
            Limits::DEFAULT_MAX_MANIFEST_BYTES,
        )
        .map_err(|e| e.to_string());
    let signature = match store.read_small(
        &layout.signature_path(generation),
        manifest::signature::MAX_SIGNATURE_BYTES,
    ) {
        Ok(None) => SignatureRead::Absent,
        Ok(Some(sig)) => match keys {
            None => SignatureRead::NotChecked,
            Some(keys) => {
                let data = manifest
                    .as_ref()
                    .ok()
                    .cloned()
                    .flatten()
                    .unwrap_or_default();
                SignatureRead::Checked(check_signature(keys, &data, &String::from_utf8_lossy(&sig)))
            }
        },
        Err(e) => SignatureRead::Checked(Err(manifest::signature::Refusal::Malformed {
            reason: e.to_string(),
        })),
    };

    let dir = layout.generation_dir(generation);
    let mut files: BTreeMap<String, u64> = store
        .list(&dir)?
        .into_iter()
        .map(|e| (e.path.to_string(), e.size))
        .collect();
    // A directory store's listing hides the temporaries of interrupted writes; they are stale
    // files here, so look for them on disk (never following a link).
    if let StoreRef::Local { root } = &store_ref {
        temporaries(
            &artifact_store::paths::to_fs_path(&dir, root),
            dir.as_str(),
            &mut files,
        )?;
    }

    let mut small = BTreeMap::new();
    for path in files.keys() {
        if !(path.ends_with(".chunkmanifest") || path.ends_with(".sha256")) {
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

    let digests = if deep {
        let parsed = manifest
            .as_ref()
            .ok()
            .and_then(|m| m.as_ref())
            .and_then(|b| Manifest::from_slice(b).ok());
        let wanted: Vec<_> = parsed
            .map(|m| expected_artifacts(&m, generation))
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.pieces().iter().all(|p| files.contains_key(p)))
            .collect();
        let total: u64 = wanted
            .iter()
            .flat_map(|e| e.pieces())
            .map(|p| files[&p])
            .sum();
        let name = store_ref.spec();
        let mut done = 0u64;
        let mut out = BTreeMap::new();
        for e in &wanted {
            let logical = e.logical();
            let mut h = Hasher::new();
            for piece in e.pieces() {
                let p = artifact_store::paths::store_path(&piece)?;
                let reader = store.open(&p)?;
                let mut counting = Counting {
                    inner: reader,
                    on_read: &mut |n| {
                        done += n;
                        progress(DeepProgress {
                            store: &name,
                            artifact: &logical,
                            done,
                            total,
                        })
                    },
                };
                h.update_from_reader(&mut counting).map_err(|source| {
                    artifact_store::Error::StoreRead {
                        what: format!("{name} {piece}"),
                        source,
                    }
                })?;
            }
            out.insert(logical, h.finish());
        }
        Some(out)
    } else {
        None
    };

    Ok(Snapshot {
        store: store_ref,
        manifest,
        signature,
        files,
        small,
        digests,
    })
}

struct Counting<'a, R> {
    inner: R,
    on_read: &'a mut dyn FnMut(u64),
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        (self.on_read)(n as u64);
        Ok(n)
    }
}

/// Add every temporary (`chunker::atomic` names) under `dir` to `files`, as `rel/…`.
fn temporaries(dir: &Path, rel: &str, files: &mut BTreeMap<String, u64>) -> Result<()> {
    let entries = match fs_err::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for entry in entries {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let ty = entry.file_type()?;
        let child = format!("{rel}/{name}");
        if ty.is_dir() {
            temporaries(&entry.path(), &child, files)?;
        } else if ty.is_file() && chunker::atomic::is_temp_name(&name) {
            files.insert(child, entry.metadata()?.len());
        }
    }
    Ok(())
}
