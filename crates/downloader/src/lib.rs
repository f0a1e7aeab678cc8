//! Device-side download of StarPilot driving models: the generation's manifest from Hugging Face
//! then GitHub, and a model's artifact fetched in parallel, resumed, retried, verified and
//! installed atomically under `/data/models`.
//!
//! What it guarantees:
//! - only the current generation's versioned paths are requested (`manifest::layout`);
//! - manifests are size-capped and strictly validated, and a bad one falls through to the next
//!   origin;
//! - payload bytes are never written past the size the manifest declares, and nothing reaches
//!   its final name before the whole SHA-256 (and each chunk's, when published) matched;
//! - a failure on every origin leaves nothing under a final name.
//!
//! What it does not do: decide what to download or delete (that is `migration`), touch params,
//! or load models. It never holds an artifact in memory: pieces stream to a staging file.
//!
//! # Example
//!
//! Fetch the generation's manifest and download one model into the models directory. Here a
//! local HTTP server (hidden lines) plays both origins; on a device the origins are
//! [`Origins::default()`] (the Hugging Face bucket, then GitHub) and the directory
//! `/data/models`.
//!
//! ```
//! use downloader::{CancelToken, DownloadConfig, Downloader, Origins};
//! use manifest::{Generation, ModelId};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use test_support::published::{GH_DIR, HF_DIR, artifact_bytes, manifest_json, publish_model, write_manifest};
//! # let dir = tempfile::tempdir()?;
//! # let root = dir.path().join("origin");
//! # // Model `pop223`, 200 000 bytes published as 64 KiB chunks, in a manifest with digests.
//! # let published = publish_model(&root, "v25", "pop223", &artifact_bytes(7, 200_000), Some(64 * 1024));
//! # write_manifest(&root, "v25", manifest_json("v25", &[published], true).as_bytes());
//! # let server = test_support::http_server::FaultServer::start(&root)?;
//! # let hf_base = format!("{}/{HF_DIR}", server.url());
//! # let github_base = format!("{}/{GH_DIR}", server.url());
//! # let models_dir = dir.path().join("models");
//! # std::fs::create_dir(&models_dir)?;
//! let downloader = Downloader::new(
//!     Origins::new(&hf_base, &github_base),
//!     DownloadConfig::default(),
//! );
//!
//! // The first origin serving a valid v25 manifest wins; each failure is kept in the error.
//! let generation: Generation = "v25".parse()?;
//! let fetched = downloader.fetch_manifest(generation)?;
//! let id: ModelId = "pop223".parse()?;
//! let entry = fetched.manifest.get(&id).ok_or("pop223 is not in the manifest")?;
//!
//! // Chunks are fetched in parallel into staging, each checked against the manifest's per-chunk
//! // digest when it lists them, and the whole file against `artifact_sha256` before it is
//! // renamed into place.
//! let installed = downloader.download(
//!     generation,
//!     entry,
//!     &models_dir,
//!     &CancelToken::new(),
//!     &|event| eprintln!("{event:?}"),
//! )?;
//! assert_eq!(installed.path, models_dir.join("pop223_driving_tinygrad.pkl"));
//! assert_eq!(Some(installed.sha256), entry.artifact_sha256());
//! assert_eq!(std::fs::metadata(&installed.path)?.len(), 200_000);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod cancel;
mod download;
pub mod egpu;
mod error;
mod fallback;
mod http;
pub mod interrupted;
mod origin;
pub mod policy;
pub mod space;
mod staging;
pub mod stale_store;
pub mod trust;
mod unsigned;

pub use cancel::CancelToken;
pub use download::{
    DigestSource, DownloadConfig, DownloadPlan, Event, Installed, Piece, Target,
    installed_sidecar_digest, other_forms, plan_pieces, remove_other_forms,
};
pub use error::{Error, Result, UnusableEntry, UnusableReason};
pub use http::HttpConfig;
pub use origin::{DEFAULT_GITHUB_BASE, DEFAULT_HF_BASE, Origin, OriginKind, Origins};
pub use staging::{
    LEGACY_STAGING_PREFIX, STAGING_DIR, STALE_AFTER, Usable, collect_unusable, staged_bytes,
    unusable_staged,
};

use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use manifest::validate::Problem;
use manifest::{
    Generation, GitCommit, Limits, Manifest, ModelEntry, RefusedEntry, ReleaseNumber, UnixSeconds,
};

use crate::fallback::{Tried, Turn};
use crate::http::Http;

/// A manifest and where it came from, read the device's way (`manifest::tolerant`): the
/// usable entries, the ones left out with their reasons, and what was normalised.
#[derive(Debug, Clone)]
pub struct FetchedManifest {
    /// The usable entries.
    pub manifest: Manifest,
    /// The bytes as served (within the manifest size limit), so the device can store exactly
    /// what it accepted.
    pub raw: Vec<u8>,
    /// The origin that served it, as displayed.
    pub origin: String,
    /// The manifest's URL.
    pub url: String,
    /// What its signature vouched for, when the downloader has trusted keys.
    pub signed: Option<trust::Accepted>,
    /// Origins tried before this one whose manifest was refused on trust grounds (e.g. a bad
    /// signature on Hugging Face when GitHub's was good): worth reporting.
    pub refused: Vec<(String, manifest::signature::Refusal)>,
    /// Entries left out of `manifest`, each with every reason (the manifest itself was
    /// accepted; see [`manifest::tolerant`]).
    pub refused_entries: Vec<RefusedEntry>,
    /// Values read as upstream reads them (an uppercase digest lowercased, `1` read as `true`).
    pub normalised: Vec<Problem>,
}

/// Origins, an HTTP client and tuning, shared by every download of a manager.
pub struct Downloader {
    http: Http,
    origins: Origins,
    config: DownloadConfig,
    limits: Limits,
    trusted_keys: Option<trust::TrustedKeys>,
    /// The tinygrad this device's openpilot tree runs: a manifest naming another one is refused.
    tinygrad_pin: Option<GitCommit>,
    /// The contract of the device's generation, and what the tree declared: a whole-manifest
    /// contract (v26) refuses a manifest its rules refuse, and loads only its format.
    contract: &'static manifest::Contract,
    tree: Option<std::sync::Arc<manifest::TreeDeclaration>>,
    /// What this downloader's run saw of each origin ([`policy`]).
    book: Mutex<policy::Book>,
    /// Stores that served other bytes, not downloaded from again until they change.
    stale: stale_store::Memory,
}

impl Downloader {
    /// A downloader over `origins` (asked in order) with `config`, reading as a device of the base
    /// contract (v25) with no tinygrad pin and no trusted keys until told otherwise.
    pub fn new(origins: Origins, config: DownloadConfig) -> Self {
        Self {
            http: Http::new(&config.http),
            origins,
            config,
            limits: Limits::default(),
            trusted_keys: None,
            tinygrad_pin: None,
            contract: manifest::contract::BASE_CONTRACT.contract(),
            tree: None,
            book: Mutex::new(policy::Book::default()),
            stale: stale_store::Memory::default(),
        }
    }

    /// The origins in the order the next request asks them ([`policy::order`] over what this
    /// downloader saw), each with its standing.
    pub fn origin_order(&self) -> Vec<(Origin, policy::Standing)> {
        let book = self.book().clone();
        let seen: Vec<_> = self
            .origins
            .iter()
            .map(|o| (o.kind, book.seen(o.kind)))
            .collect();
        policy::order(&seen, Instant::now())
            .into_iter()
            .filter_map(|(kind, standing)| {
                self.origins
                    .iter()
                    .find(|o| o.kind == kind)
                    .map(|o| (o.clone(), standing))
            })
            .collect()
    }

    /// Keep the memory of stores that served other bytes in `path` ([`stale_store::Memory::keep_in`]),
    /// so that it survives a restart (the daemon's; one-shot commands do not call it).
    pub fn keep_stale_stores_in(&self, path: &Path) {
        self.stale.keep_in(path);
    }

    /// What this downloader saw of `kind` so far.
    pub fn seen(&self, kind: OriginKind) -> policy::Seen {
        self.book().seen(kind)
    }

    fn book(&self) -> std::sync::MutexGuard<'_, policy::Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The one origin-fallback loop ([`fallback::first_answer`]) over the origins in the
    /// policy's order, what each attempt says of its origin recorded in this downloader's book.
    fn first_answer<T>(&self, attempt: impl FnMut(&Origin, Turn) -> Result<T>) -> Result<Tried<T>> {
        let order = self.origin_order().into_iter().map(|(o, _)| o).collect();
        fallback::first_answer(order, attempt, |origin, said| self.note(origin, said))
    }

    /// Record what one attempt said of `origin` ([`Error::said`], [`policy::after`]).
    fn note(&self, origin: &Origin, said: Result<(), &Error>) {
        let said = said.map_or_else(Error::said, |()| policy::Said::Answered);
        self.book().note(origin.kind, said, Instant::now());
    }

    fn note_measured(&self, origin: &Origin, m: policy::Measured) {
        if m.bytes > 0 {
            self.book().measured(origin.kind, m, Instant::now());
        }
    }

    /// Accept only manifests whose `tinygrad_commit`, when they have one, is `pin` (the
    /// openpilot tree's `tinygrad_repo/TINYGRAD_COMMIT`): a manifest built for another tinygrad
    /// is refused like one of another generation ([`Error::WrongTinygrad`]) and the next origin
    /// is tried.
    pub fn with_tinygrad_pin(mut self, pin: GitCommit) -> Self {
        self.tinygrad_pin = Some(pin);
        self
    }

    /// Read manifests and artifacts as a device of `contract` does, with the tree's
    /// declaration (its reviewed catalog bounds a v26 manifest's entries).
    pub fn with_contract(
        mut self,
        contract: &'static manifest::Contract,
        tree: Option<manifest::TreeDeclaration>,
    ) -> Self {
        self.contract = contract;
        self.tree = tree.map(std::sync::Arc::new);
        self
    }

    /// Free space a download needs beyond the artifact: the configured
    /// [`DownloadConfig::space_margin`], at least the contract's download headroom (v26: 256 MiB;
    /// [`manifest::Contract::download_margin`]).
    pub fn space_margin(&self) -> u64 {
        self.contract.download_margin(self.config.space_margin)
    }

    /// The contract this downloader reads manifests and fetches artifacts under.
    pub fn contract(&self) -> &'static manifest::Contract {
        self.contract
    }

    /// `entry`'s artifact as this device fetches it.
    pub fn target(&self, entry: &ModelEntry) -> Result<Target> {
        Target::from_entry_for(entry, self.contract)
    }

    /// The tinygrad a manifest must name, when set: one naming another is refused
    /// ([`Error::WrongTinygrad`]).
    pub fn tinygrad_pin(&self) -> Option<&GitCommit> {
        self.tinygrad_pin.as_ref()
    }

    /// Accept only manifests signed by one of `keys` (see [`trust`]).
    pub fn with_trusted_keys(mut self, keys: trust::TrustedKeys) -> Self {
        self.trusted_keys = Some(keys);
        self
    }

    /// The keys a manifest's signature must verify under, when set.
    pub fn trusted_keys(&self) -> Option<&trust::TrustedKeys> {
        self.trusted_keys.as_ref()
    }

    /// [`trust::target_rule`] on this downloader: with trusted keys, [`Error::NotSigned`] for a
    /// target whose SHA-256, size or chunk count the signed manifest does not give. Pure.
    pub fn check_signed(&self, target: &Target) -> Result<DigestSource> {
        trust::target_rule(self.trusted_keys.is_some(), target).map_err(|missing| {
            Error::NotSigned {
                model: target.id.to_string(),
                file: target.local_name.to_string(),
                missing,
            }
        })
    }

    /// The origins, in configured order.
    pub fn origins(&self) -> &Origins {
        &self.origins
    }

    /// The tuning every download uses.
    pub fn config(&self) -> &DownloadConfig {
        &self.config
    }

    /// The generation's manifest from the first origin that serves a valid one. Each origin's
    /// failure (HTTP error, oversize, invalid JSON, broken rules, another generation) is kept
    /// in the error if none succeeds.
    pub fn fetch_manifest(&self, generation: Generation) -> Result<FetchedManifest> {
        self.fetch_manifest_cancellable(generation, &CancelToken::new())
    }

    /// [`Downloader::fetch_manifest`] that stops within a second of `cancel` (with
    /// [`Error::Cancelled`], no other origin tried). Each origin gets
    /// [`HttpConfig::origin_deadline`] before the next is tried.
    pub fn fetch_manifest_cancellable(
        &self,
        generation: Generation,
        cancel: &CancelToken,
    ) -> Result<FetchedManifest> {
        self.fetch_manifest_accepting(generation, None, cancel)
    }

    /// [`Downloader::fetch_manifest_cancellable`]; with trusted keys, a manifest whose signed
    /// release is lower than `accepted` (the last release this device accepted) is refused as a
    /// replay, like any other manifest the keys do not accept.
    pub fn fetch_manifest_accepting(
        &self,
        generation: Generation,
        accepted: Option<ReleaseNumber>,
        cancel: &CancelToken,
    ) -> Result<FetchedManifest> {
        let tried = self.first_answer(|origin, _| {
            let url = origin.manifest_url(generation);
            self.fetch_one_manifest(&url, generation, accepted, cancel)
                .map(|fetched| (fetched, url))
        })?;
        let ((read, signed, raw), url, origin, failed) = match tried {
            Tried::Answered {
                value: (fetched, url),
                origin,
                failed,
            } => (fetched, url, origin, failed),
            Tried::NoneAnswered(attempts) => {
                return Err(Error::ManifestUnavailable {
                    generation: generation.to_string(),
                    attempts,
                });
            }
        };
        let refused = failed
            .into_iter()
            .filter_map(|(origin, e)| match e {
                Error::Refused { refusal, .. } => Some((origin, refusal)),
                _ => None,
            })
            .collect();
        Ok(FetchedManifest {
            manifest: read.manifest,
            raw,
            origin: origin.to_string(),
            url,
            signed,
            refused,
            refused_entries: read.refused,
            normalised: read.normalised,
        })
    }

    fn fetch_one_manifest(
        &self,
        url: &str,
        generation: Generation,
        accepted: Option<ReleaseNumber>,
        cancel: &CancelToken,
    ) -> Result<(manifest::Tolerated, Option<trust::Accepted>, Vec<u8>)> {
        let budget = self.config.http.origin_deadline;
        let ctl = http::Ctl::new(
            cancel,
            &format!("the {generation} manifest"),
            budget,
            Instant::now() + budget,
        );
        let get = |url: &str, max: u64| {
            download::with_retries(&self.config, &ctl, url, || {
                self.http.get_small(url, max, &ctl)
            })
        };
        let bytes = get(url, self.limits.max_manifest_bytes)?;
        // With trusted keys, the signature is checked over the raw bytes before they are parsed
        // (within the same per-origin deadline).
        let signed = match &self.trusted_keys {
            None => None,
            Some(keys) => {
                Some(self.signature_verdict(keys, url, &bytes, generation, accepted, &get)?)
            }
        };
        self.check_whole_contract(url, &bytes, generation)?;
        // Only what makes the whole manifest unusable is an error here; a bad entry is left
        // out with its reason and the rest of the catalog still works. (The signature, when
        // required, covers the raw bytes, so a signed manifest's refused entries were signed too.)
        let read = Manifest::from_slice_tolerant(&bytes, &self.limits).map_err(|source| {
            Error::BadManifest {
                url: url.to_string(),
                source,
            }
        })?;
        self.check_usable(url, &read, generation)?;
        Ok((read, signed, bytes))
    }

    /// The manifest's signature (`<url>.sig`; none published is for the verdict to judge)
    /// checked over its raw bytes with the trusted `keys`: accepted, or refused.
    fn signature_verdict(
        &self,
        keys: &trust::TrustedKeys,
        url: &str,
        bytes: &[u8],
        generation: Generation,
        accepted: Option<ReleaseNumber>,
        get: &dyn Fn(&str, u64) -> Result<Vec<u8>>,
    ) -> Result<trust::Accepted> {
        let sig_url = format!("{url}{}", manifest::signature::SIGNATURE_SUFFIX);
        let sig = match get(&sig_url, manifest::signature::MAX_SIGNATURE_BYTES) {
            Ok(b) => Some(b),
            Err(Error::Status {
                status: 404 | 410, ..
            }) => None,
            Err(e) => return Err(e),
        };
        let verdict = trust::verify_manifest(
            keys,
            bytes,
            sig.as_deref(),
            generation,
            accepted,
            UnixSeconds::now(),
        );
        verdict.map_err(|refusal| Error::Refused {
            url: url.to_string(),
            refusal,
        })
    }

    /// A whole-manifest contract (v26) refuses the manifest for any violation of its rules, as
    /// upstream's manager does; the next origin is asked.
    fn check_whole_contract(&self, url: &str, bytes: &[u8], generation: Generation) -> Result<()> {
        if !self.contract.whole_manifest_refusal {
            return Ok(());
        }
        let problems = manifest::validate_for_contract(
            bytes,
            manifest::ValidationMode::Reader,
            self.contract,
            &manifest::Expectation {
                generation: Some(generation),
                revision: self.tinygrad_pin.as_ref(),
                tree: self.tree.as_deref(),
            },
            &self.limits,
        );
        if problems.is_empty() {
            return Ok(());
        }
        Err(Error::BadManifest {
            url: url.to_string(),
            source: manifest::Error::Invalid(problems),
        })
    }

    /// A read manifest this device can use: at least one usable entry (upstream takes the
    /// first manifest that yields one), of its generation, and of its tinygrad pin.
    fn check_usable(
        &self,
        url: &str,
        read: &manifest::Tolerated,
        generation: Generation,
    ) -> Result<()> {
        let manifest = &read.manifest;
        // Upstream takes the first manifest that yields at least one usable entry.
        if !manifest
            .models()
            .iter()
            .any(|e| e.is_supported_by(self.contract))
        {
            return Err(Error::NoUsableEntries {
                url: url.to_string(),
                entries: unusable_entries(read),
            });
        }
        if let Some(found) = manifest.generation()
            && found != generation
        {
            return Err(Error::WrongGeneration {
                url: url.to_string(),
                expected: generation.to_string(),
                found: found.to_string(),
            });
        }
        if let Some(expected) = &self.tinygrad_pin
            && let Some(found) = manifest.tinygrad_commit()
            && &found != expected
        {
            return Err(Error::WrongTinygrad {
                url: url.to_string(),
                expected: expected.clone(),
                found,
            });
        }
        Ok(())
    }

    /// Download `entry`'s artifact of `generation` into `models_dir`, trying each origin in
    /// order. Progress and origin changes go to `on_event`. Guarantees as
    /// [`Downloader::download_target`].
    pub fn download(
        &self,
        generation: Generation,
        entry: &ModelEntry,
        models_dir: &Path,
        cancel: &CancelToken,
        on_event: &(dyn Fn(Event) + Sync),
    ) -> Result<Installed> {
        let target = self.target(entry)?;
        self.download_target(generation, &target, models_dir, cancel, on_event)
    }

    /// What [`Downloader::download_target`] would fetch: each origin in order is asked what it
    /// publishes for `target` (the `.chunkmanifest`, `.sha256` sidecar and `HEAD` requests a
    /// download makes before its first payload byte), and the first complete answer is
    /// returned. No payload is requested and nothing is written (a dry run's view).
    pub fn plan_target(
        &self,
        generation: Generation,
        target: &Target,
        cancel: &CancelToken,
    ) -> Result<DownloadPlan> {
        self.check_signed(target)?;
        let job = download::Job {
            http: &self.http,
            config: &self.config,
            generation,
            contract: self.contract,
            target,
            models_dir: Path::new(""),
            cancel,
            on_event: &|_| {},
            leave: &|_, _| false,
            stale: &self.stale,
            received: &std::sync::atomic::AtomicU64::new(0),
        };
        match self.first_answer(|origin, _| download::resolve_from(&job, origin))? {
            Tried::Answered {
                value: r, origin, ..
            } => Ok(DownloadPlan {
                origin: origin.to_string(),
                size: r.plan.size,
                sha256: r.plan.sha256,
                digest_source: r.plan.digest_source,
                pieces: r.pieces,
            }),
            Tried::NoneAnswered(attempts) => Err(Error::AllOriginsFailed {
                model: target.id.to_string(),
                attempts,
            }),
        }
    }

    /// [`Downloader::download`] of an explicit target: a model's artifact
    /// ([`Target::from_entry`]) or its Chestnut variant ([`Target::accelerator_variant`]).
    ///
    /// When it returns `Ok(installed)`: `installed.path` holds, as one plain file fsynced and
    /// renamed into place (its directory fsynced), bytes of `installed.size` whose whole SHA-256
    /// is `installed.sha256`, checked before the rename against the digest named by
    /// `installed.digest_source` (with trusted keys always the signed manifest's, with its size
    /// and chunk count; without keys the entry's digest, else the origin's `.sha256`), and each
    /// chunk's when published; other forms of the same name are removed after. When it returns
    /// `Err`: nothing new is under the final name (a copy already there is untouched), and the
    /// staging file under `<models_dir>/.starpilot-staging` may hold verified-so-far bytes that
    /// the next call resumes. It never writes past the declared size, never requests another
    /// generation's paths, and returns [`Error::Cancelled`] within about a second of `cancel`.
    pub fn download_target(
        &self,
        generation: Generation,
        target: &Target,
        models_dir: &Path,
        cancel: &CancelToken,
        on_event: &(dyn Fn(Event) + Sync),
    ) -> Result<Installed> {
        self.check_signed(target)?;
        // An origin a download left to measure the other (see `policy::leave`) comes back at
        // the end, on its resumed turn, to finish from where it stopped.
        let tried = self.first_answer(|origin, turn| {
            if cancel.is_cancelled() {
                return Err(Error::cancelled(&target.id));
            }
            on_event(Event::Origin {
                origin: origin.to_string(),
            });
            let other = self
                .origins
                .iter()
                .find(|o| o.kind != origin.kind)
                .map(|o| o.kind);
            let leave = |m: policy::Measured, remaining: u64| {
                turn == Turn::First
                    && other
                        .is_some_and(|k| policy::leave(m, remaining, &self.seen(k), Instant::now()))
            };
            let received = std::sync::atomic::AtomicU64::new(0);
            // The bytes this origin delivered are reported once, before `Installed` when the
            // try installs (so `Installed` stays the last event of a download), else after it.
            let reported = std::sync::atomic::AtomicBool::new(false);
            let report_fetched = || {
                let bytes = received.load(std::sync::atomic::Ordering::SeqCst);
                if bytes > 0 && !reported.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    on_event(Event::Fetched {
                        origin: origin.to_string(),
                        bytes,
                    });
                }
            };
            let on_event = &|e: Event| {
                if matches!(e, Event::Installed { .. }) {
                    report_fetched();
                }
                on_event(e)
            };
            let job = download::Job {
                http: &self.http,
                config: &self.config,
                generation,
                contract: self.contract,
                target,
                models_dir,
                cancel,
                on_event,
                leave: &leave,
                stale: &self.stale,
                received: &received,
            };
            let mut measured = policy::Measured::default();
            let result = download::download_from(&job, origin, &mut measured);
            self.note_measured(origin, measured);
            report_fetched();
            result
        })?;
        match tried {
            Tried::Answered { value, .. } => Ok(value),
            Tried::NoneAnswered(attempts) => Err(Error::AllOriginsFailed {
                model: target.id.to_string(),
                attempts,
            }),
        }
    }
}

/// Every entry of a manifest read the device's way that the device cannot use, in published
/// order: the ones the reading left out, and the kept ones in a format it cannot load. Pure.
fn unusable_entries(read: &manifest::Tolerated) -> Vec<UnusableEntry> {
    let mut out: Vec<UnusableEntry> = read
        .refused
        .iter()
        .map(|r| UnusableEntry {
            index: r.index,
            id: r.id.clone(),
            reason: UnusableReason::Refused {
                problems: r.problems.clone(),
            },
        })
        .collect();
    // The kept entries are the published ones minus the refused, in order: number them back.
    let refused: std::collections::BTreeSet<usize> = read.refused.iter().map(|r| r.index).collect();
    let published = (0..).filter(|i| !refused.contains(i));
    for (index, entry) in published.zip(read.manifest.models()) {
        if let Some(format) = entry.artifact_format().filter(|f| !f.is_supported()) {
            out.push(UnusableEntry {
                index,
                id: Some(entry.id().to_string()),
                reason: UnusableReason::UnsupportedFormat { format },
            });
        }
    }
    out.sort_by_key(|e| e.index);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(id: &str, extra: serde_json::Value) -> serde_json::Value {
        let mut e = json!({"id": id, "name": "N", "version": "v16", "series": "S",
            "released": "2025-01-01", "community_favorite": false});
        for (k, v) in extra.as_object().unwrap() {
            e[k] = v.clone();
        }
        e
    }

    /// The free space a download needs beyond the artifact, per generation as the pin table
    /// gives its contract (v25: the configured margin; v26 recorded with upstream's v26
    /// contract, which asks for size + 256 MiB; a made-up v27 inheriting it): the contract's
    /// headroom is a floor under the configured margin, never a replacement for a larger one.
    #[test]
    fn the_contracts_download_headroom_is_a_floor_under_the_margin() {
        use manifest::{Generation, PinTable, contract::ContractName};
        const MIB: u64 = 1024 * 1024;
        let mut pins = PinTable::builtin();
        pins.record_contract(Generation::new(26), ContractName::V26)
            .unwrap();
        let table = [
            (25, [(0, 0), (64 * MIB, 64 * MIB), (1024 * MIB, 1024 * MIB)]),
            (
                26,
                [
                    (0, 256 * MIB),
                    (64 * MIB, 256 * MIB),
                    (1024 * MIB, 1024 * MIB),
                ],
            ),
            (
                27,
                [
                    (0, 256 * MIB),
                    (64 * MIB, 256 * MIB),
                    (1024 * MIB, 1024 * MIB),
                ],
            ),
        ];
        for (generation, rows) in table {
            for (configured, want) in rows {
                let config = DownloadConfig {
                    space_margin: configured,
                    ..DownloadConfig::default()
                };
                let dl = Downloader::new(Origins::new("http://h", "http://g"), config)
                    .with_contract(pins.contract(Generation::new(generation)), None);
                assert_eq!(
                    dl.space_margin(),
                    want,
                    "v{generation}, --space-margin-mib {}",
                    configured / MIB
                );
            }
        }
    }

    fn no_usable(doc: serde_json::Value) -> Error {
        let read = Manifest::from_value_tolerant(doc).unwrap();
        Error::NoUsableEntries {
            url: "https://o/m.json".into(),
            entries: unusable_entries(&read),
        }
    }

    /// Every unusable entry is listed in published order with its index, its id and why, the
    /// problems relative to the entry; an empty catalog says so.
    #[test]
    fn unusable_entries_render_each_reason() {
        let e = no_usable(json!({"models": [
            entry("new1", json!({"artifact_format": "tinygrad_multi_v2"})),
            entry("bad1", json!({"released": "2025-02-30"})),
            {"name": "no id"},
        ]}));
        let text = e.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "https://o/m.json: manifest has no usable model entry:"
        );
        assert_eq!(
            lines[1],
            "    model \"new1\" (models[0]) skipped: artifact_format \"tinygrad_multi_v2\" is not \
             one this device loads (only \"tinygrad_single_v1\"); a newer device-modeld-manager may"
        );
        assert!(
            lines[2].starts_with("    model \"bad1\" (models[1]) refused: released: "),
            "{text}"
        );
        assert!(lines[3].starts_with("    models[2] refused: "), "{text}");
        assert_eq!(lines.len(), 4, "{text}");

        assert_eq!(
            no_usable(json!({"models": []})).to_string(),
            "https://o/m.json: manifest has no usable model entry: it lists no models"
        );
    }

    /// A caller tells "this catalog is only in formats a newer manager loads" from "this
    /// catalog is broken" by matching the reasons.
    #[test]
    fn callers_match_the_reason() {
        let only_newer = |e: &Error| match e {
            Error::NoUsableEntries { entries, .. } => {
                !entries.is_empty()
                    && entries
                        .iter()
                        .all(|u| matches!(u.reason, UnusableReason::UnsupportedFormat { .. }))
            }
            _ => false,
        };
        let newer = no_usable(json!({"models": [
            entry("a1", json!({"artifact_format": "x"})),
            entry("b1", json!({"artifact_format": "y"})),
        ]}));
        assert!(only_newer(&newer));
        let Error::NoUsableEntries { entries, .. } = &newer else {
            unreachable!()
        };
        assert_eq!(
            entries
                .iter()
                .map(|u| (u.index, u.id.as_deref()))
                .collect::<Vec<_>>(),
            [(0, Some("a1")), (1, Some("b1"))]
        );
        let broken = no_usable(json!({"models": [
            entry("a1", json!({"artifact_format": "x"})),
            entry("b1", json!({"version": "v013"})),
        ]}));
        assert!(!only_newer(&broken));
        assert!(!only_newer(&no_usable(json!({"models": []}))));
    }
}
