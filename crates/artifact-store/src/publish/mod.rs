//! Publishing a generation: artifacts first, manifest last, one store after the other.
//!
//! For each store, in the order given (Hugging Face before GitHub, enforced):
//! 1. upload each model in the artifacts directory whose files are missing or different there:
//!    its chunks, then `.sha256`, then `.chunkmanifest` last (a directory is complete once its
//!    chunk manifest is there; if chunks must change under an existing chunk manifest, that
//!    manifest is removed first, so the directory reads "not present" rather than "wrong");
//! 2. check that every artifact the new manifest lists is complete in that store and matches the
//!    manifest's size, digest and count;
//! 3. fetch the live manifest again and run the release guard (`manifest::guard`), with the IDs
//!    that have a directory in the artifacts directory as the intended changes;
//! 4. write the manifest, last;
//! 5. then remove what an older split of an uploaded artifact left (chunks of another count):
//!    only once the new manifest is live there, so a device that fetched the old manifest finds
//!    the old chunks until then ([`stale_split_files`]).
//!
//! One store is finished (its artifacts, then its manifest) before the next is touched. That is
//! what keeps a republish of changed bytes under an existing id without a window: while a store
//! is being changed its live manifest may disagree with its chunks, but every other store is
//! either not yet touched (old manifest, old chunks) or done (new and new), so at every instant
//! at least one origin is consistent, and a device, which treats a mismatch as "not yet" and
//! falls through to the next origin, always gets a verified model. `tests/republish_window.rs`
//! interrupts a republish after each of its store effects and checks exactly that.
//!
//! The plan ([`plan_model`]) is pure and unit-tested; [`publish`] is the I/O around it. A second
//! run after an interruption re-plans from what the store holds, so nothing already there is
//! uploaded again.

use std::collections::BTreeSet;
use std::path::Path;

use manifest::{Generation, Manifest, ModelId, StoreLayout};
use serde::Serialize;

use crate::error::{Error, Refusal, Result};
use crate::location::StoreSpec;
use crate::retry::RetryPolicy;
use crate::store::{Store, StoreName};

mod ahead;
mod execute;
mod inspect;
mod plan;

pub use ahead::{GithubOnly, check_github_only, decide_github_only};
use execute::publish_one;
pub use execute::{KnownFiles, upload_artifacts};
pub use inspect::{StoreProblem, StoreProblemKind, VariantTarget, variant_targets};
pub use plan::*;

/// Everything publish needs besides the stores.
#[derive(Debug, Clone)]
pub struct PublishOptions {
    /// The generation published; the manifest's own `generation` must agree.
    pub generation: Generation,
    /// Plan and report only: nothing is written to any store.
    pub dry_run: bool,
    /// Retries of each write.
    pub retry: RetryPolicy,
    /// Re-read every listed artifact in the store and check its SHA-256 (slow on the Hub).
    /// Stores whose reads are local ([`Store::reads_are_local`]) are always checked this way.
    pub deep_verify: bool,
    /// The release contract's pins and intended generation changes.
    pub contract: Contract,
}

/// What the release contract checks before anything is written: the manifest's tinygrad pin
/// against the generation's ([`manifest::check_pin`]), and, where a store holds the previous
/// generation's manifest, the generation guard ([`manifest::generation_guard`]).
#[derive(Debug, Clone, Default)]
pub struct Contract {
    /// The pin of each generation, and its contract.
    pub pins: manifest::PinTable,
    /// IDs the new generation may add (`--add-model`).
    pub add_models: BTreeSet<ModelId>,
    /// IDs the new generation may drop (`--drop-model`).
    pub drop_models: BTreeSet<ModelId>,
    /// What the openpilot tree declares (a v26 tree's reviewed catalog and compiler revision):
    /// under a contract that takes its entries from the tree's catalog, the manifest's entries
    /// must be its rows, with its versions and GPU flags.
    pub tree: Option<manifest::TreeDeclaration>,
}

impl Contract {
    /// The generation contract `generation` runs (from the pins).
    pub fn of(&self, generation: Generation) -> &'static manifest::Contract {
        self.pins.contract(generation)
    }

    /// What a manifest of `generation` must say under its contract: the generation; the pinned
    /// revision where the contract requires its revision key (v26: `compiler_revision`; under
    /// v25 the pin rule, [`manifest::check_pin`], judges `tinygrad_commit`); the tree's
    /// declaration when it is for this generation.
    pub fn expectation(&self, generation: Generation) -> manifest::Expectation<'_> {
        let c = self.of(generation);
        manifest::Expectation {
            generation: Some(generation),
            revision: c
                .required_top_keys
                .contains(&c.revision_key)
                .then(|| self.pins.get(generation))
                .flatten(),
            tree: self.tree.as_ref().filter(|t| t.generation == generation),
        }
    }
}

/// The pin rule and, per store, the generation guard against the previous generation's
/// manifest when the store holds one. Reads only; runs before any store is written.
pub fn check_contract(
    manifest: &Manifest,
    stores: &[&dyn Store],
    generation: Generation,
    contract: &Contract,
) -> Result<()> {
    manifest::check_pin(
        &contract.pins,
        generation,
        manifest.revision(contract.of(generation)).as_ref(),
    )
    .map_err(|refusal| Error::Pin { refusal })?;
    let Some(previous) = generation.previous() else {
        return Ok(());
    };
    let layout = StoreLayout::HfBucket;
    let path = layout.manifest_path(previous);
    for store in stores {
        let Some(bytes) = store.read_small(&path, manifest::Limits::DEFAULT_MAX_MANIFEST_BYTES)?
        else {
            continue;
        };
        let old = Manifest::from_slice(&bytes).map_err(|e| {
            Error::Refused(Refusal::PreviousUnparsable {
                store: store.describe(),
                path: path.clone(),
                source: e,
            })
        })?;
        let (add, drop) = generation_guard_names(&old, manifest, contract.of(generation), contract);
        manifest::generation_guard(&old, manifest, &add, &drop).map_err(|refusal| {
            Error::GenerationGuard {
                store: store.describe(),
                generation,
                previous,
                path: path.to_string(),
                refusal,
            }
        })?;
    }
    Ok(())
}

// ---- one bucket, two tools (contracts whose entries come from the tree's catalog) ---------

/// The live manifest as the release guard compares it under `contract`: under a contract whose
/// entries are the tree's catalog rows (v26), a live row without `artifact_sha256` is a catalog
/// row the device reads from its own tree, not a published model, so it is left out (a publish
/// that lists only complete models does not "remove" it). Other contracts: the live manifest as
/// it is. Pure.
pub fn guard_view(live: Manifest, contract: &manifest::Contract) -> Manifest {
    if !contract.entries_from_tree_catalog {
        return live;
    }
    let mut view = live;
    let rows: Vec<ModelId> = view
        .models()
        .iter()
        .filter(|e| e.get(manifest::keys::ARTIFACT_SHA256).is_none())
        .map(|e| e.id().clone())
        .collect();
    for id in rows {
        view.remove(&id);
    }
    view
}

/// `ours` with the live manifest's published rows merged in, as the other tool of a shared
/// bucket merges: every live row with an artifact that this publish does not change (`intended`:
/// the models it uploads) is kept as the live manifest has it, in place of ours or appended;
/// the models this publish uploads are ours. Catalog rows without an artifact are not copied.
/// Pure.
pub fn merge_live(ours: &Manifest, live: &Manifest, intended: &BTreeSet<ModelId>) -> Manifest {
    let mut out = ours.clone();
    for row in live.models() {
        if row.get(manifest::keys::ARTIFACT_SHA256).is_none() || intended.contains(row.id()) {
            continue;
        }
        out.upsert(row.clone());
    }
    out
}

/// The models a publish of `artifacts_dir` uploads: its `<id>/` directories (what
/// [`prepare_local`] reads; a name that is no model ID is refused there).
pub fn intended_ids(artifacts_dir: &Path) -> Result<BTreeSet<ModelId>> {
    let mut out = BTreeSet::new();
    for e in fs_err::read_dir(artifacts_dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !e.file_type()?.is_dir() {
            continue;
        }
        if let Ok(id) = name.parse::<ModelId>() {
            out.insert(id);
        }
    }
    Ok(out)
}

/// Under a contract whose entries are the tree's catalog rows (v26), the manifest to publish:
/// `manifest` with each store's live manifest of the generation merged in ([`merge_live`]),
/// so that a bucket another tool (upstream's own rebuild) also publishes to keeps that tool's
/// rows. A live manifest that the contract refuses (at the reader level, with the generation's
/// expectation) stops the publish, as the other tool stops on ours: only an absent one is a
/// first publish. Other contracts: `manifest` as it is. Reads only.
pub fn merge_live_rows(
    manifest: &Manifest,
    artifacts_dir: &Path,
    stores: &[&dyn Store],
    opts: &PublishOptions,
) -> Result<Manifest> {
    let contract = opts.contract.of(opts.generation);
    if !contract.entries_from_tree_catalog {
        return Ok(manifest.clone());
    }
    let intended = intended_ids(artifacts_dir)?;
    let path = StoreLayout::HfBucket.manifest_path(opts.generation);
    let expect = opts.contract.expectation(opts.generation);
    let mut merged = manifest.clone();
    for store in stores {
        let Some(bytes) = store.read_small(&path, manifest::Limits::DEFAULT_MAX_MANIFEST_BYTES)?
        else {
            continue;
        };
        let refused = |source| {
            Error::Refused(Refusal::LiveUnparsable {
                store: store.describe(),
                path: path.clone(),
                source,
            })
        };
        let problems = manifest::validate_for_contract(
            &bytes,
            manifest::ValidationMode::Reader,
            contract,
            &expect,
            &manifest::Limits::default(),
        );
        if !problems.is_empty() {
            return Err(refused(manifest::Error::Invalid(problems)));
        }
        let live = Manifest::from_slice(&bytes).map_err(refused)?;
        merged = merge_live(&merged, &live, &intended);
    }
    Ok(merged)
}

/// The IDs the generation guard lets a new generation add and drop: those named
/// (`--add-model`, `--drop-model`); under a contract whose entries are the tree's catalog rows
/// (v26) also every ID only one side lists, because there the IDs are the tree's catalog
/// (checked by the contract's validation) and a manifest lists only the models built so far, so
/// a previous ID it lacks is not yet rebuilt, not retired. Versions, GPU flags and reused
/// digests stay guarded. Pure.
pub fn generation_guard_names(
    previous: &Manifest,
    new: &Manifest,
    generation_contract: &manifest::Contract,
    contract: &Contract,
) -> (BTreeSet<ModelId>, BTreeSet<ModelId>) {
    let mut add = contract.add_models.clone();
    let mut drop = contract.drop_models.clone();
    if generation_contract.entries_from_tree_catalog {
        let old: BTreeSet<&ModelId> = previous.ids().collect();
        let cur: BTreeSet<&ModelId> = new.ids().collect();
        add.extend(cur.difference(&old).map(|id| (*id).clone()));
        drop.extend(old.difference(&cur).map(|id| (*id).clone()));
    }
    (add, drop)
}

/// What is refused before any store is written, so that a refusal changes nothing. A dry run
/// and a real run both make exactly these checks, through this one function, before the first
/// upload:
/// - the release guard against each store's live manifest of this generation (run again right
///   before the manifest is written, against the manifest fetched then);
/// - completeness: every listed model with no chunk set in `--artifacts <id>/` must be complete,
///   matching (and, where reads are local or with `--deep-verify`, hash to its SHA-256) and an
///   OOB container in every store; otherwise the publish would upload every other model to the
///   first store and only then find the gap;
/// - every `accelerator_artifacts` variant the manifest lists must be in `--artifacts <id>/`
///   (verified by [`prepare_local`]) or complete, matching and an OOB container in every store.
fn check_before_upload(
    manifest: &Manifest,
    local: &[LocalArtifact],
    intended: &BTreeSet<ModelId>,
    stores: &[&dyn Store],
    opts: &PublishOptions,
) -> Result<()> {
    let manifest_path = StoreLayout::HfBucket.manifest_path(opts.generation);
    for store in stores {
        execute::guard_live(manifest, intended, *store, opts, &manifest_path)?;
    }
    for store in stores {
        let look = if opts.deep_verify || store.reads_are_local() {
            inspect::Look::Digest
        } else {
            inspect::Look::Container
        };
        let mut problems = Vec::new();
        // Under a contract whose rows another tool may publish (v26), a row exactly as this
        // store's live manifest has it is that tool's published row, not ours to re-check
        // (its `.sha256` sidecar, say, is not part of that contract).
        let live_rows = live_rows_kept(*store, &manifest_path, opts)?;
        for entry in manifest.models().iter().filter(|e| !e.id().is_local()) {
            if !intended.contains(entry.id()) && live_rows.iter().any(|r| r == entry) {
                continue;
            }
            if !uploads_main_artifact(local, entry.id()) {
                inspect::check_entry(*store, opts.generation, entry, look, &mut problems)?;
            }
            let here: Vec<String> = local
                .iter()
                .filter(|a| &a.id == entry.id())
                .filter_map(|a| a.variant.clone())
                .collect();
            inspect::check_variants(*store, opts.generation, entry, &here, look, &mut problems)?;
        }
        if !problems.is_empty() {
            return Err(Error::Incomplete {
                store: store.describe(),
                problems,
            });
        }
    }
    Ok(())
}

/// The live rows with an artifact, under a contract whose entries are the tree's catalog rows;
/// none otherwise (or without a parsable live manifest, which the guard refuses anyway).
fn live_rows_kept(
    store: &dyn Store,
    path: &manifest::StorePath,
    opts: &PublishOptions,
) -> Result<Vec<manifest::ModelEntry>> {
    let contract = opts.contract.of(opts.generation);
    if !contract.entries_from_tree_catalog {
        return Ok(Vec::new());
    }
    let Some(bytes) = store.read_small(path, manifest::Limits::DEFAULT_MAX_MANIFEST_BYTES)? else {
        return Ok(Vec::new());
    };
    Ok(Manifest::from_slice(&bytes)
        .map(|m| guard_view(m, contract).models().to_vec())
        .unwrap_or_default())
}

/// Whether `--artifacts <id>/` holds the model's main chunk set (an empty `<id>/` directory, as
/// after `reuse`, uploads nothing: the store's copy is checked instead).
pub(crate) fn uploads_main_artifact(local: &[LocalArtifact], id: &ModelId) -> bool {
    local
        .iter()
        .any(|a| &a.id == id && a.variant.is_none() && !a.files.is_empty())
}

/// Progress and decisions, as they happen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Work on a store begins.
    StoreStarted {
        /// The store.
        store: StoreName,
        /// Bytes it will upload.
        upload_bytes: u64,
    },
    /// A file upload begins.
    Uploading {
        /// The store.
        store: StoreName,
        /// The store path.
        path: String,
        /// The file's size.
        size: u64,
    },
    /// A file is in the store.
    Uploaded {
        /// The store.
        store: StoreName,
        /// The store path.
        path: String,
        /// The file's size.
        size: u64,
        /// Bytes of this store's uploads counted as sent so far (the [`crate::progress::Tally`]
        /// position; a `github:` store's committed files count once a push carried them).
        sent: u64,
    },
    /// What the store learnt while writing `path` (bytes within the file, a local commit, a
    /// push's bytes: [`crate::progress::Transfer`]), and the store's bytes counted as sent
    /// since `StoreStarted` (of its `upload_bytes`).
    Progress {
        /// The store.
        store: StoreName,
        /// The store path being written.
        path: String,
        /// What the store reported.
        transfer: crate::progress::Transfer,
        /// Bytes of the store's uploads counted as sent.
        sent: u64,
    },
    /// A write failed and is tried again after a wait.
    Retrying {
        /// The store.
        store: StoreName,
        /// The store path.
        path: String,
        /// The attempt that failed (1-based).
        attempt: u32,
        /// Its error.
        error: String,
        /// The wait before the next attempt, in milliseconds.
        wait_ms: u64,
    },
    /// A file was removed from the store (a retracted chunk manifest, a shadowing plain file, a
    /// stale chunk, a signature).
    Removed {
        /// The store.
        store: StoreName,
        /// The store path.
        path: String,
    },
    /// The store holds every model of the manifest complete: the last check before the
    /// manifest, by names and sizes (the bytes were hashed earlier).
    Checked {
        /// The store.
        store: StoreName,
        /// Models checked (in a dry run, those it would not upload).
        models: usize,
    },
    /// The release guard passed against the store's live manifest.
    Guarded {
        /// The store.
        store: StoreName,
        /// No live manifest existed (the guard had nothing to compare).
        first_publish: bool,
    },
    /// The new manifest is live in the store.
    ManifestWritten {
        /// The store.
        store: StoreName,
        /// The manifest's store path.
        path: String,
    },
    /// The store already holds exactly this manifest; it was not rewritten.
    ManifestUnchanged {
        /// The store.
        store: StoreName,
        /// The manifest's store path.
        path: String,
    },
}

/// The outcome for one store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreReport {
    /// The store, as described.
    pub store: StoreName,
    /// The plan's steps, in order.
    pub steps: Vec<Step>,
    /// Files uploaded (0 in a dry run, whose uploads are the `Upload` steps).
    pub uploaded_files: usize,
    /// Bytes uploaded (0 in a dry run).
    pub uploaded_bytes: u64,
    /// Files the store already held with this size and SHA-256, left as they are.
    pub skipped_files: usize,
    /// No live manifest existed: the first publish of this generation to this store.
    pub first_publish: bool,
    /// `written`, `unchanged`, or in a dry run `would_write` / `unchanged`.
    pub manifest: &'static str,
    /// The manifest's store path.
    pub manifest_path: String,
    /// The signature file beside the manifest, when the publish signs or removes it: `written`,
    /// `unchanged`, `removed`, `absent` (nothing to remove), or in a dry run `would_write` /
    /// `would_remove` / `unchanged` / `absent`. `None` for an unsigned publish.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<&'static str>,
}

/// What a publish did (or, in a dry run, would do), store by store. Serializes to `release-cli
/// publish --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PublishReport {
    /// Whether nothing was written.
    pub dry_run: bool,
    /// The generation published.
    pub generation: String,
    /// The models of the manifest, in order.
    pub models: Vec<String>,
    /// One report per store, in publish order.
    pub stores: Vec<StoreReport>,
}

/// Hugging Face before GitHub (docs/formats.md, "Publish order", point 4): devices try the Hub first, so the fallback must
/// never be ahead of it.
pub fn check_store_order(stores: &[StoreSpec]) -> Result<()> {
    if let Some(first_gh) = stores.iter().position(StoreSpec::is_github)
        && let Some(late_hf) = stores.iter().skip(first_gh).find(|s| s.is_hf())
    {
        return Err(Error::Refused(Refusal::StoreOrder {
            hf: late_hf.to_string(),
            github: stores[first_gh].to_string(),
        }));
    }
    Ok(())
}

/// What a publish does with `model_names_<gen>.json.minisig` beside the manifest.
///
/// The one rule: no store is ever left with a signature beside a manifest it does not cover. A
/// device with trusted keys refuses such a pair, so an old signature left beside a new manifest
/// would freeze every such device on the generation while publish reported success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureAction<'a> {
    /// No signature. Refused, before any store is written, when a store holds a signature for
    /// the generation ([`Refusal::SignedStore`]): sign the publish or say `RemoveSignature`.
    Unsigned,
    /// This signature file (the text of `model_names_<gen>.json.minisig` for the manifest's
    /// canonical bytes, see [`crate::signing`]), written in each store after the guard passed
    /// and before the manifest. Order: new signature, then new manifest. A kill between them
    /// leaves the old manifest beside the new signature, which devices refuse for that store
    /// only (they fall through to the next origin, which is untouched or done), and the next
    /// run finishes it; the other order would leave the old signature beside the new manifest.
    Sign(&'a [u8]),
    /// Publish unsigned on purpose and remove each store's signature; `reason` is recorded.
    /// Order: remove the signature, then write the manifest. A kill between them leaves the old
    /// manifest unsigned, which devices with keys refuse as "not signed" — true, and what was
    /// asked for — rather than a new manifest beside an old signature, which they would refuse
    /// as "changed after signing", the alarm that must keep meaning tampering. Removing after
    /// the guard passed means a refused publish removes nothing.
    RemoveSignature {
        /// Why, recorded in the publish's report.
        reason: &'a str,
    },
}

/// Publish `manifest` and the artifacts in `artifacts_dir` to each store in turn, unsigned
/// ([`SignatureAction::Unsigned`]: refused where a store holds a signature).
pub fn publish(
    manifest: &Manifest,
    artifacts_dir: &Path,
    stores: &[&dyn Store],
    opts: &PublishOptions,
    on_event: &mut dyn FnMut(&Event),
) -> Result<PublishReport> {
    publish_signed(
        manifest,
        artifacts_dir,
        stores,
        opts,
        SignatureAction::Unsigned,
        on_event,
    )
}

/// Refused with [`Refusal::SignedStore`] naming the first store that holds a signature for
/// `generation`, when `action` is [`SignatureAction::Unsigned`]. Reads only.
pub fn check_signature_action(
    stores: &[&dyn Store],
    generation: manifest::Generation,
    action: SignatureAction<'_>,
) -> Result<()> {
    if action != SignatureAction::Unsigned {
        return Ok(());
    }
    let path = StoreLayout::HfBucket.signature_path(generation);
    for store in stores {
        if store.stat(&path)?.is_some() {
            return Err(Error::Refused(Refusal::SignedStore {
                store: store.describe(),
                path,
            }));
        }
    }
    Ok(())
}

/// [`publish`], with what to do about the manifest's signature ([`SignatureAction`]): the
/// signature is written, or removed, in each store right before its manifest, after the guard
/// passed. The event for a written signature is `ManifestWritten` with the signature's path;
/// for a removed one, `Removed`.
pub fn publish_signed(
    manifest: &Manifest,
    artifacts_dir: &Path,
    stores: &[&dyn Store],
    opts: &PublishOptions,
    signature: SignatureAction<'_>,
    on_event: &mut dyn FnMut(&Event),
) -> Result<PublishReport> {
    publish_known(
        manifest,
        artifacts_dir,
        stores,
        opts,
        signature,
        &[],
        on_event,
    )
}

/// [`publish_signed`], where `known[i]` names files the store `stores[i]` is recorded to hold
/// ([`KnownFiles`], `rebuild --upload-to`'s record): such a file found at its recorded size is
/// planned as holding its recorded digest, not read back to hash it, except with
/// `--deep-verify`, where reads are local, or where the chunk set's sidecar and chunk manifest
/// (read back whole) are not the artifact's own: a publish since the record changed it.
/// Everything else is as [`publish_signed`].
pub fn publish_known(
    manifest: &Manifest,
    artifacts_dir: &Path,
    stores: &[&dyn Store],
    opts: &PublishOptions,
    signature: SignatureAction<'_>,
    known: &[KnownFiles],
    on_event: &mut dyn FnMut(&Event),
) -> Result<PublishReport> {
    if let Some(g) = manifest.generation()
        && g != opts.generation
    {
        return Err(Error::Refused(Refusal::GenerationMismatch {
            manifest: g,
            flag: opts.generation,
        }));
    }
    let problems = manifest.validate_for_contract(
        manifest::ValidationMode::Release,
        opts.contract.of(opts.generation),
        &opts.contract.expectation(opts.generation),
    );
    if !problems.is_empty() {
        return Err(manifest::Error::Invalid(problems).into());
    }
    check_contract(manifest, stores, opts.generation, &opts.contract)?;
    check_signature_action(stores, opts.generation, signature)?;
    let local = prepare_local_for(artifacts_dir, manifest, opts.contract.of(opts.generation))?;
    let intended: BTreeSet<ModelId> = local.iter().map(|a| a.id.clone()).collect();
    check_before_upload(manifest, &local, &intended, stores, opts)?;
    let manifest_bytes = manifest.to_canonical_bytes();
    let mut report = PublishReport {
        dry_run: opts.dry_run,
        generation: opts.generation.to_string(),
        models: intended.iter().map(|i| i.to_string()).collect(),
        stores: Vec::new(),
    };
    let none = KnownFiles::new();
    for (i, store) in stores.iter().enumerate() {
        let known = known
            .get(i)
            .filter(|_| !opts.deep_verify && !store.reads_are_local())
            .unwrap_or(&none);
        report.stores.push(publish_one(
            manifest,
            &manifest_bytes,
            &local,
            &intended,
            *store,
            opts,
            signature,
            known,
            on_event,
        )?);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::plan::looks_like_artifact_piece;
    use super::*;
    use crate::paths::StorePath;
    use chunker::Sha256Digest;

    /// An event's store is its name in the JSON, whatever layout the store keeps.
    #[test]
    fn events_name_the_store_as_a_string() {
        let store = StoreName {
            name: "github:/srv/gh".into(),
            layout: StoreLayout::GithubBranch,
        };
        let e = Event::Checked { store, models: 2 };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"event": "checked", "store": "github:/srv/gh", "models": 2})
        );
    }

    /// The store-order rule as a table: a Hugging Face store after a GitHub one is refused,
    /// typed, naming both.
    #[test]
    fn store_order() {
        let k = |n: &str| StoreSpec::parse(n).unwrap();
        let (hf, hf1, hf2) = (
            "hf://buckets/o/hf",
            "hf://buckets/o/hf1",
            "hf://buckets/o/hf2",
        );
        let cases = [
            (vec![k(hf), k("github:gh")], None),
            (vec![k("github:gh")], None),
            (vec![k("local"), k(hf)], None),
            (vec![k("github:gh"), k(hf)], Some((hf, "github:gh"))),
            (
                vec![k(hf1), k("github:gh"), k(hf2)],
                Some((hf2, "github:gh")),
            ),
        ];
        for (kinds, want) in cases {
            match (check_store_order(&kinds), want) {
                (Ok(()), None) => {}
                (Err(Error::Refused(Refusal::StoreOrder { hf, github })), Some((h, g))) => {
                    assert_eq!((hf.as_str(), github.as_str()), (h, g));
                }
                (got, want) => panic!("{kinds:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// Merging a live manifest of another tool: its published rows we do not change are kept
    /// (replacing ours, or appended), ours win for the models we upload, catalog rows without
    /// an artifact are not copied; the guard's view leaves catalog rows out only under a
    /// contract whose entries are the tree's catalog rows.
    #[test]
    fn merge_live_and_guard_view() {
        let sha = |c: char| c.to_string().repeat(64);
        let m = |rows: serde_json::Value| {
            Manifest::from_value(serde_json::json!({"generation": "v26", "models": rows})).unwrap()
        };
        let art = |id: &str, c: char| {
            serde_json::json!({"id": id, "version": "v1", "artifact_sha256": sha(c),
                "artifact_size": 1, "artifact_chunk_count": 0})
        };
        let ours = m(serde_json::json!([art("a1", 'a'), art("b1", 'b')]));
        let live = m(
            serde_json::json!([art("b1", 'c'), art("a1", 'd'), art("c1", 'e'),
            {"id": "d1", "version": "v1"}]),
        );
        let intended: BTreeSet<ModelId> = ["a1".parse().unwrap()].into();
        let merged = merge_live(&ours, &live, &intended);
        let digest = |id: &str| {
            merged
                .get(&id.parse().unwrap())
                .and_then(|e| e.artifact_sha256())
                .map(|d| d.to_hex())
        };
        assert_eq!(
            merged.ids().map(|i| i.as_str()).collect::<Vec<_>>(),
            ["a1", "b1", "c1"]
        );
        assert_eq!(digest("a1"), Some(sha('a')), "ours for what we upload");
        assert_eq!(digest("b1"), Some(sha('c')), "live for what we do not");
        assert_eq!(digest("c1"), Some(sha('e')));
        let v26 = manifest::ContractName::V26.contract();
        let v25 = manifest::ContractName::V25.contract();
        assert_eq!(guard_view(live.clone(), v26).models().len(), 3);
        assert_eq!(guard_view(live.clone(), v25), live);
    }

    #[test]
    fn artifact_pieces_out_of_place() {
        for (name, piece) in [
            ("pop_driving_tinygrad.pkl", true),
            ("pop_driving_tinygrad.pkl.chunk01of03", true),
            ("pop_driving_tinygrad.pkl.chunkmanifest", true),
            ("pop_driving_tinygrad.pkl.sha256", true),
            ("pop_driving_tinygrad.pkl.p07", true),
            ("model_names_v25.json", false),
            ("artifacts.json", false),
            ("README.md", false),
            ("x.pkl.json", false),
        ] {
            assert_eq!(looks_like_artifact_piece(name), piece, "{name}");
        }
    }

    fn art() -> LocalArtifact {
        let f = |name: &str, role, size| LocalFile {
            name: name.into(),
            role,
            size,
            sha256: Sha256Digest::of_bytes(name.as_bytes()),
            source: FileSource::Bytes(vec![]),
        };
        LocalArtifact {
            id: "pop".parse().unwrap(),
            name: "pop_driving_tinygrad.pkl".into(),
            variant: None,
            // Deliberately not in upload order: the plan must order them.
            files: vec![
                f("n.chunkmanifest", FileRole::ChunkManifest, 1),
                f("n.chunk01of02", FileRole::Chunk, 10),
                f("n.sha256", FileRole::Sidecar, 5),
                f("n.chunk02of02", FileRole::Chunk, 3),
            ],
        }
    }

    fn same(a: &LocalArtifact) -> Vec<Observed> {
        a.files
            .iter()
            .map(|f| Observed::Present {
                size: f.size,
                sha256: Some(f.sha256),
            })
            .collect()
    }

    fn paths(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .map(|s| match s {
                Step::Retract { path } => format!("retract {path}"),
                Step::Upload { path, .. } => format!("upload {path}"),
                Step::RemoveShadowingPlain { path } => format!("rm {path}"),
                Step::Skip { path, .. } => format!("skip {path}"),
                Step::RemoveStale { path } => format!("stale {path}"),
            })
            .collect()
    }

    #[test]
    fn fresh_store_uploads_chunks_then_sidecar_then_chunk_manifest() {
        let a = art();
        let dir: StorePath = "models/v25/pop".parse().unwrap();
        let steps = plan_model(&a, &dir, &[Observed::Missing; 4], false);
        assert_eq!(
            paths(&steps),
            [
                "upload models/v25/pop/n.chunk01of02",
                "upload models/v25/pop/n.chunk02of02",
                "upload models/v25/pop/n.sha256",
                "upload models/v25/pop/n.chunkmanifest",
            ]
        );
    }

    #[test]
    fn complete_store_uploads_nothing() {
        let a = art();
        let dir: StorePath = "d".parse().unwrap();
        let steps = plan_model(&a, &dir, &same(&a), false);
        assert!(
            steps.iter().all(|s| matches!(s, Step::Skip { .. })),
            "{steps:?}"
        );
    }

    #[test]
    fn interrupted_upload_resumes_with_only_the_rest() {
        let a = art();
        let dir: StorePath = "d".parse().unwrap();
        let mut obs = same(&a);
        obs[0] = Observed::Missing; // chunk manifest
        obs[3] = Observed::Missing; // chunk 2
        obs[2] = Observed::Missing; // sidecar
        assert_eq!(
            paths(&plan_model(&a, &dir, &obs, false)),
            [
                "skip d/n.chunk01of02",
                "upload d/n.chunk02of02",
                "upload d/n.sha256",
                "upload d/n.chunkmanifest",
            ]
        );
    }

    #[test]
    fn changed_chunk_under_a_chunk_manifest_retracts_it_first() {
        let a = art();
        let dir: StorePath = "d".parse().unwrap();
        let mut obs = same(&a);
        obs[1] = Observed::Present {
            size: 10,
            sha256: Some(Sha256Digest::of_bytes(b"other")),
        };
        assert_eq!(
            paths(&plan_model(&a, &dir, &obs, true)),
            [
                "retract d/n.chunkmanifest",
                "upload d/n.chunk01of02",
                "skip d/n.chunk02of02",
                "skip d/n.sha256",
                "upload d/n.chunkmanifest",
                "rm d/pop_driving_tinygrad.pkl",
            ]
        );
    }

    /// What an older split left, as a table: chunks of another count (and the old set's
    /// chunk manifest when the artifact became one plain file); nothing else.
    #[test]
    fn stale_split_files_are_the_other_counts_chunks() {
        let n = "pop223_driving_tinygrad.pkl";
        let listed = [
            "pop223_driving_tinygrad.pkl.chunk01of01",
            "pop223_driving_tinygrad.pkl.chunk01of02",
            "pop223_driving_tinygrad.pkl.chunk02of02",
            "pop223_driving_tinygrad.pkl.chunkmanifest",
            "pop223_driving_tinygrad.pkl.sha256",
            "pop223_driving_chestnut_tinygrad.pkl.chunk01of03",
            "README.md",
        ];
        let cases: [(u32, &[&str]); 4] = [
            (
                1,
                &[
                    "pop223_driving_tinygrad.pkl.chunk01of02",
                    "pop223_driving_tinygrad.pkl.chunk02of02",
                ],
            ),
            (2, &["pop223_driving_tinygrad.pkl.chunk01of01"]),
            (
                3,
                &[
                    "pop223_driving_tinygrad.pkl.chunk01of01",
                    "pop223_driving_tinygrad.pkl.chunk01of02",
                    "pop223_driving_tinygrad.pkl.chunk02of02",
                ],
            ),
            (
                0,
                &[
                    "pop223_driving_tinygrad.pkl.chunk01of01",
                    "pop223_driving_tinygrad.pkl.chunk01of02",
                    "pop223_driving_tinygrad.pkl.chunk02of02",
                    "pop223_driving_tinygrad.pkl.chunkmanifest",
                ],
            ),
        ];
        for (count, want) in cases {
            assert_eq!(stale_split_files(n, count, &listed), want, "{count}");
        }
        assert!(stale_split_files(n, 2, &listed[1..3]).is_empty());
    }

    #[test]
    fn store_order_is_hf_then_github() {
        let k = |n: &str| StoreSpec::parse(n).unwrap();
        let hf = "hf://buckets/o/hf";
        assert!(check_store_order(&[k(hf), k("github:gh")]).is_ok());
        assert!(check_store_order(&[k("local"), k("github:gh")]).is_ok());
        let e = check_store_order(&[k("github:gh"), k(hf)]).unwrap_err();
        assert!(e.to_string().contains("Hugging Face first"), "{e}");
    }
}
