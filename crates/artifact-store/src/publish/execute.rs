//! Executing a publish for one store: observe what it holds, upload what the plan says, check
//! the store is complete, run the release guard against its live manifest, then write the
//! signature and the manifest last (the order is in [`super`]'s module comment).

use std::collections::{BTreeMap, BTreeSet};

use chunker::Sha256Digest;
use manifest::{Generation, Manifest, ModelId, StoreLayout};

use super::inspect::{Look, check_entry};
use super::{
    Event, FileSource, LocalArtifact, LocalFile, Observed, PublishOptions, Reason, SignatureAction,
    Step, StoreReport, plan_model,
};
use crate::error::{Error, Refusal, Result};
use crate::paths::StorePath;
use crate::progress::{Tally, Transfer};
use crate::retry::RetryPolicy;
use crate::store::{Store, StoreName};

/// Files a record says a store holds, by store path: the size and SHA-256 they were uploaded
/// with, recorded only once the store had them (`rebuild --upload-to`'s upload record).
pub type KnownFiles = BTreeMap<String, (u64, Sha256Digest)>;

/// What the store holds at `path` for `want`. A file `known` names with `want`'s size and
/// digest, at that size in the store, is taken as that digest without reading it back
/// (`known` is empty unless the artifact's small files read back as its own, [`anchored`]).
fn observe(
    store: &dyn Store,
    path: &StorePath,
    want: &LocalFile,
    known: &KnownFiles,
) -> Result<Observed> {
    match store.stat(path)? {
        None => Ok(Observed::Missing),
        Some(s) if s.size != want.size => Ok(Observed::Present {
            size: s.size,
            sha256: None,
        }),
        Some(s) if known.get(path.as_str()) == Some(&(s.size, want.sha256)) => {
            Ok(Observed::Present {
                size: s.size,
                sha256: Some(want.sha256),
            })
        }
        Some(s) => {
            let sha256 = store.sha256(path)?.map(|(d, _)| d);
            Ok(Observed::Present {
                size: s.size,
                sha256,
            })
        }
    }
}

// One store's publish needs everything publish was given; a struct for it would only rename them.
#[allow(clippy::too_many_arguments)]
pub(super) fn publish_one(
    manifest: &Manifest,
    manifest_bytes: &[u8],
    local: &[LocalArtifact],
    intended: &BTreeSet<ModelId>,
    store: &dyn Store,
    opts: &PublishOptions,
    signature: SignatureAction<'_>,
    known: &KnownFiles,
    on_event: &mut dyn FnMut(&Event),
) -> Result<StoreReport> {
    let name = store.name();
    let layout = StoreLayout::HfBucket;
    // 1. Plan every model from what the store holds now, then (unless a dry run) carry it out.
    let plans = plan_store(store, local, opts.generation, known)?;
    let mut rep = new_report(name.clone(), &plans, opts.generation);
    if !opts.dry_run {
        upload(store, &plans, opts.retry, &mut rep, on_event)?;
    } else {
        rep.skipped_files = rep
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Skip { .. }))
            .count();
    }
    // 2. Every listed artifact complete and matching.
    check_complete(manifest, local, store, opts, on_event)?;
    // 3. The live manifest, fetched again now, and the guard.
    let manifest_path = layout.manifest_path(opts.generation);
    let live_bytes = guard_live(manifest, intended, store, opts, &manifest_path)?;
    rep.first_publish = live_bytes.is_none();
    on_event(&Event::Guarded {
        store: name.clone(),
        first_publish: rep.first_publish,
    });

    // 4. The signature (written, or removed), then the manifest, last; why in this order is
    // said on [`SignatureAction`].
    match signature {
        SignatureAction::Sign(sig) => {
            rep.signature = Some(write_signature(store, opts, sig, on_event)?)
        }
        SignatureAction::RemoveSignature { .. } => {
            rep.signature = Some(remove_signature(store, opts, on_event)?)
        }
        // Checked before any store was written; checked again here, right before the manifest,
        // in case a signature appeared since.
        SignatureAction::Unsigned => {
            super::check_signature_action(&[store], opts.generation, signature)?
        }
    }
    if live_bytes.as_deref() == Some(manifest_bytes) {
        rep.manifest = "unchanged";
        on_event(&Event::ManifestUnchanged {
            store: name.clone(),
            path: manifest_path.to_string(),
        });
    } else if opts.dry_run {
        rep.manifest = "would_write";
    } else {
        write_small(store, opts.retry, &manifest_path, manifest_bytes, on_event)?;
        rep.manifest = "written";
    }

    // 5. Now that the new manifest is live here, what older splits left goes.
    if !opts.dry_run {
        for step in &rep.steps {
            if let Step::RemoveStale { path } = step {
                remove(store, opts.retry, path, on_event)?;
            }
        }
    }
    Ok(rep)
}

/// A model's plan in one store: its local artifact and its steps.
type ModelPlan<'a> = (&'a LocalArtifact, Vec<Step>);

/// A store's report before anything is done: the plan's steps, nothing uploaded yet.
fn new_report(store: StoreName, plans: &[ModelPlan<'_>], generation: Generation) -> StoreReport {
    StoreReport {
        store,
        steps: plans.iter().flat_map(|(_, s)| s.clone()).collect(),
        uploaded_files: 0,
        uploaded_bytes: 0,
        skipped_files: 0,
        first_publish: false,
        manifest: "unchanged",
        manifest_path: StoreLayout::HfBucket.manifest_path(generation).to_string(),
        signature: None,
    }
}

/// Step 1 alone, for `rebuild --upload-to`: the files of `local` that `store` lacks, uploaded
/// in publish's order (chunks, `.sha256`, `.chunkmanifest` last) with publish's retries; never
/// a manifest or a signature, and never a removal or a replacement. A plan that would retract,
/// remove or overwrite a file the store holds (other bytes under the name, perhaps live: a
/// plain file, such as v25's variants, has no chunk manifest to retract first) is refused
/// whole before anything is written: only publish, after its gates, replaces such files.
pub fn upload_artifacts(
    store: &dyn Store,
    local: &[LocalArtifact],
    generation: Generation,
    retry: RetryPolicy,
    on_event: &mut dyn FnMut(&Event),
) -> Result<StoreReport> {
    let plans = plan_store(store, local, generation, &KnownFiles::new())?;
    let removes = plans.iter().flat_map(|(_, s)| s).find_map(|s| match s {
        Step::Retract { path } | Step::RemoveShadowingPlain { path } => Some(path),
        Step::Upload {
            path,
            reason: Reason::SizeDiffers | Reason::ContentDiffers,
            ..
        } => Some(path),
        _ => None,
    });
    if let Some(path) = removes {
        return Err(Error::Unsupported {
            store: store.describe(),
            path: path.clone(),
            reason: "the store holds other bytes under this artifact's name; only publish, \
                     after its gates, replaces them"
                .into(),
        });
    }
    let mut rep = new_report(store.name(), &plans, generation);
    upload(store, &plans, retry, &mut rep, on_event)?;
    Ok(rep)
}

/// Step 1's plan: every model's steps from what the store holds now.
fn plan_store<'a>(
    store: &dyn Store,
    local: &'a [LocalArtifact],
    generation: Generation,
    known: &KnownFiles,
) -> Result<Vec<ModelPlan<'a>>> {
    let layout = StoreLayout::HfBucket;
    let mut plans = Vec::new();
    let none = KnownFiles::new();
    for art in local {
        let dir = layout.artifact_dir(generation, &art.id);
        let known = match anchored(store, art, &dir, known)? {
            true => known,
            false => &none,
        };
        let mut observed = Vec::new();
        for f in &art.files {
            observed.push(observe(store, &dir.join(&f.name)?, f, known)?);
        }
        // A plain file shadows a chunk set; a plain variant is itself the file to upload.
        let chunked = art.is_chunked();
        let plain_present = chunked && store.stat(&dir.join(&art.name)?)?.is_some();
        let mut steps = plan_model(art, &dir, &observed, plain_present);
        steps.extend(stale_steps(store, art, &dir)?);
        plans.push((art, steps));
    }
    Ok(plans)
}

/// Whether a record's word ([`KnownFiles`]) may stand for `art`'s files in `store`: `art` is a
/// chunk set and its sidecar and chunk manifest, read back whole (small reads), are `art`'s.
/// Publish retracts a chunk manifest before it changes chunks under it and writes it last, so
/// another set's chunk manifest there, or none, means the chunks may be other bytes too (a
/// publish since the record, perhaps one that stopped half-way): then they are hashed.
fn anchored(
    store: &dyn Store,
    art: &LocalArtifact,
    dir: &StorePath,
    known: &KnownFiles,
) -> Result<bool> {
    let chunked = art.is_chunked();
    let named = art
        .files
        .iter()
        .any(|f| known.contains_key(&format!("{dir}/{}", f.name)));
    if !named || !chunked {
        return Ok(false);
    }
    for f in art
        .files
        .iter()
        .filter(|f| f.role != super::FileRole::Chunk)
    {
        let path = dir.join(&f.name)?;
        if store.stat(&path)?.map(|s| s.size) != Some(f.size) {
            return Ok(false);
        }
        let held = store.read_small(&path, f.size)?;
        if held.map(|b| Sha256Digest::of_bytes(&b)) != Some(f.sha256) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Step 1 carried out: every planned step, then what the backend held back.
fn upload(
    store: &dyn Store,
    plans: &[ModelPlan<'_>],
    retry: RetryPolicy,
    rep: &mut StoreReport,
    on_event: &mut dyn FnMut(&Event),
) -> Result<()> {
    let name = rep.store.clone();
    let upload_bytes: u64 = plans
        .iter()
        .flat_map(|(_, s)| s)
        .map(|s| match s {
            Step::Upload { size, .. } => *size,
            _ => 0,
        })
        .sum();
    on_event(&Event::StoreStarted {
        store: name.clone(),
        upload_bytes,
    });
    let mut tally = Tally::default();
    for (art, steps) in plans {
        for step in steps {
            run_step(store, art, step, retry, rep, &mut tally, on_event)?;
        }
    }
    // Uploads a backend held back (the GitHub store's batched pushes) go out now, before
    // the store is checked and its manifest written.
    const HELD: &str = "(writes not yet pushed)";
    retry.run(
        &name.name,
        HELD,
        |_, _, _| {},
        || {
            store.flush_reporting(&mut |t: Transfer| {
                tally.report(0, t);
                on_event(&Event::Progress {
                    store: name.clone(),
                    path: HELD.to_string(),
                    transfer: t,
                    sent: tally.position(),
                })
            })
        },
    )?;
    Ok(())
}

/// Step 2: every listed artifact complete and matching. In a dry run, what would be uploaded
/// counts as there. A model whose artifact step 1 uploaded was checked from the local files
/// (size, SHA-256, OOB container), so for it this last look, right before the manifest, reads
/// names and sizes only; one found in the store is read as an OOB container in place again
/// (hashed before the first upload where reads are local or with --deep-verify,
/// `super::check_before_upload`, which leaves out rows another tool published).
fn check_complete(
    manifest: &Manifest,
    local: &[LocalArtifact],
    store: &dyn Store,
    opts: &PublishOptions,
    on_event: &mut dyn FnMut(&Event),
) -> Result<()> {
    let name = store.name();
    let mut problems = Vec::new();
    let mut checked = 0;
    for entry in manifest.models() {
        if entry.id().is_local()
            || (opts.dry_run && super::uploads_main_artifact(local, entry.id()))
        {
            continue;
        }
        checked += 1;
        let look = if super::uploads_main_artifact(local, entry.id()) {
            Look::Sizes
        } else {
            Look::Container
        };
        check_entry(store, opts.generation, entry, look, &mut problems)?;
    }
    if !problems.is_empty() {
        return Err(Error::Incomplete {
            store: name.name,
            problems,
        });
    }
    on_event(&Event::Checked {
        store: name,
        models: checked,
    });
    Ok(())
}

/// Step 3: the live manifest at `manifest_path`, read again now, and the release guard against
/// it. `None`: the store holds none (a first publish).
pub(super) fn guard_live(
    manifest: &Manifest,
    intended: &BTreeSet<ModelId>,
    store: &dyn Store,
    opts: &PublishOptions,
    manifest_path: &StorePath,
) -> Result<Option<Vec<u8>>> {
    let name = store.describe();
    let live_bytes =
        store.read_small(manifest_path, manifest::Limits::DEFAULT_MAX_MANIFEST_BYTES)?;
    if let Some(bytes) = &live_bytes {
        let live = Manifest::from_slice(bytes).map_err(|e| {
            Error::Refused(Refusal::LiveUnparsable {
                store: name.clone(),
                path: manifest_path.clone(),
                source: e,
            })
        })?;
        let live = super::guard_view(live, opts.contract.of(opts.generation));
        manifest::guard(&live, manifest, intended).map_err(|refusal| Error::Guard {
            store: name,
            refusal,
        })?;
    }
    Ok(live_bytes)
}

/// [`Step::RemoveStale`] for every file an older split of `art` left in `dir`.
fn stale_steps(store: &dyn Store, art: &LocalArtifact, dir: &StorePath) -> Result<Vec<Step>> {
    // An empty `<id>/` uploads nothing (the store's copy is the intended one): its split is
    // whatever the store holds.
    if art.files.is_empty() {
        return Ok(Vec::new());
    }
    let chunked = art.is_chunked();
    let count = if chunked {
        art.files
            .iter()
            .filter(|f| f.role == super::FileRole::Chunk)
            .count() as u32
    } else {
        0
    };
    let listed = store.list(dir)?;
    let names: Vec<&str> = listed
        .iter()
        .filter(|e| crate::paths::parent(&e.path).as_ref() == Some(dir))
        .map(|e| e.path.file_name())
        .collect();
    Ok(super::stale_split_files(&art.name, count, &names)
        .into_iter()
        .map(|name| Step::RemoveStale {
            path: format!("{dir}/{name}"),
        })
        .collect())
}

/// Delete one file with retries and report it.
fn remove(
    store: &dyn Store,
    retry: RetryPolicy,
    path: &str,
    on_event: &mut dyn FnMut(&Event),
) -> Result<()> {
    let name = store.name();
    let p: StorePath = path.parse()?;
    retry.run(&name.name, path, |_, _, _| {}, || store.delete(&p))?;
    on_event(&Event::Removed {
        store: name,
        path: path.to_string(),
    });
    Ok(())
}

/// Write the manifest's signature file unless the store already holds exactly it (in a dry
/// run, only say what would happen). Returns the report's `signature` word.
fn write_signature(
    store: &dyn Store,
    opts: &PublishOptions,
    sig: &[u8],
    on_event: &mut dyn FnMut(&Event),
) -> Result<&'static str> {
    let path = StoreLayout::HfBucket.signature_path(opts.generation);
    if store
        .read_small(&path, manifest::signature::MAX_SIGNATURE_BYTES)?
        .as_deref()
        == Some(sig)
    {
        return Ok("unchanged");
    }
    if opts.dry_run {
        return Ok("would_write");
    }
    write_small(store, opts.retry, &path, sig, on_event)?;
    Ok("written")
}

/// Remove the generation's signature file, if the store holds one (in a dry run, only say
/// whether it would). Returns the report's `signature` word.
fn remove_signature(
    store: &dyn Store,
    opts: &PublishOptions,
    on_event: &mut dyn FnMut(&Event),
) -> Result<&'static str> {
    let path = StoreLayout::HfBucket.signature_path(opts.generation);
    if store.stat(&path)?.is_none() {
        return Ok("absent");
    }
    if opts.dry_run {
        return Ok("would_remove");
    }
    remove(store, opts.retry, path.as_str(), on_event)?;
    Ok("removed")
}

/// Write a small file (the manifest or its signature) with retries, reporting each retry and,
/// once written, `ManifestWritten`.
fn write_small(
    store: &dyn Store,
    retry: RetryPolicy,
    path: &StorePath,
    bytes: &[u8],
    on_event: &mut dyn FnMut(&Event),
) -> Result<()> {
    let name = store.name();
    let path_s = path.to_string();
    retry.run(
        &name.name,
        &path_s,
        |attempt, e, wait| {
            on_event(&Event::Retrying {
                store: name.clone(),
                path: path_s.clone(),
                attempt,
                error: e.to_string(),
                wait_ms: wait.as_millis() as u64,
            })
        },
        || store.write_bytes(path, bytes),
    )?;
    on_event(&Event::ManifestWritten {
        store: name,
        path: path_s,
    });
    Ok(())
}

fn run_step(
    store: &dyn Store,
    art: &LocalArtifact,
    step: &Step,
    retry: RetryPolicy,
    rep: &mut StoreReport,
    tally: &mut Tally,
    on_event: &mut dyn FnMut(&Event),
) -> Result<()> {
    let name = store.name();
    match step {
        Step::Skip { .. } => {
            rep.skipped_files += 1;
        }
        // After the manifest (step 5 of `publish_one`).
        Step::RemoveStale { .. } => {}
        Step::Retract { path } | Step::RemoveShadowingPlain { path } => {
            remove(store, retry, path, on_event)?
        }
        Step::Upload {
            path, file, size, ..
        } => {
            let p: StorePath = path.parse()?;
            let f = &art.files[*file];
            on_event(&Event::Uploading {
                store: name.clone(),
                path: path.clone(),
                size: *size,
            });
            let mut retry_events = Vec::new();
            let result = retry.run(
                &name.name,
                path,
                |attempt, e, wait| {
                    retry_events.push(Event::Retrying {
                        store: name.clone(),
                        path: path.clone(),
                        attempt,
                        error: e.to_string(),
                        wait_ms: wait.as_millis() as u64,
                    })
                },
                || {
                    // Each attempt starts the file again from zero.
                    tally.start_file();
                    let mut report = |t: Transfer| {
                        tally.report(*size, t);
                        on_event(&Event::Progress {
                            store: name.clone(),
                            path: path.clone(),
                            transfer: t,
                            sent: tally.position(),
                        })
                    };
                    match &f.source {
                        FileSource::Path(local) => {
                            store.write_file_reporting(&p, local, &mut report)
                        }
                        FileSource::Bytes(b) => {
                            store.write_reporting(&p, &mut std::io::Cursor::new(b), &mut report)
                        }
                    }
                },
            );
            for e in &retry_events {
                on_event(e);
            }
            result?;
            tally.file_done(*size);
            rep.uploaded_files += 1;
            rep.uploaded_bytes += size;
            on_event(&Event::Uploaded {
                store: name.clone(),
                path: path.clone(),
                size: *size,
                sent: tally.position(),
            });
        }
    }
    Ok(())
}
