//! `publish`, composed: the validation gate, the GPU-flag check against the build records, the
//! GitHub-only gate, the pins, the signature (release number and expiry) and
//! `artifact_store::publish::publish_signed`, then the publish record beside the manifest (see
//! docs/release.md, "The release gates"). The caller parses flags into a [`PublishRequest`] and
//! renders the [`Event`]s and the [`PublishOutcome`].

use std::path::{Path, PathBuf};

use artifact_store::publish::{
    Contract, GithubOnly, PublishOptions, PublishReport, SignatureAction, check_github_only,
    check_store_order, publish_known,
};
use artifact_store::retry::RetryPolicy;
use artifact_store::signing::{self, SigningKey, VerifyingKey};
use artifact_store::{Store, StoreAccess, StoreName, StoreSpec};
use manifest::{Generation, Manifest, ModelId, ReleaseNumber};
use serde::Serialize;

use crate::gate::{GateOutcome, PublishRecord};
use crate::{Error, Result, Workspace};

/// Default validity of a signature, in days.
pub const DEFAULT_EXPIRES_IN_DAYS: u64 = 180;

/// Everything a publish is asked to do: the manifest the caller read from `--manifest`, and the
/// publish and signing flag groups, each taken whole as parsed from the command line.
#[derive(Debug)]
pub struct PublishRequest {
    pub manifest: Manifest,
    pub flags: PublishFlags,
    pub sign: SignFlags,
}

/// The flags of `release-cli publish` (with feature `cli`, the clap group it flattens; the doc
/// comments are its `--help`), but for the signing ones ([`SignFlags`]).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct PublishFlags {
    /// The generation to publish, e.g. `v25`.
    #[cfg_attr(feature = "cli", arg(long, value_name = "vNN"))]
    pub generation: Generation,
    /// The new manifest (`model_names_<gen>.json`) to publish, last.
    #[cfg_attr(feature = "cli", arg(long = "manifest", value_name = "FILE"))]
    pub manifest_path: PathBuf,
    /// One `<id>/` directory per model to upload, each holding that model's chunk set.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR"))]
    pub artifacts: PathBuf,
    /// A store: `hf://buckets/NS/NAME`, `github:CHECKOUT`, `file:DIR` or a plain directory path
    /// without a `word:` prefix (anything else, e.g. `hf:/buckets/…` or `gh:…`, is refused).
    /// Repeat for several stores; they are published in order (Hugging Face before GitHub).
    #[cfg_attr(
        feature = "cli",
        arg(long = "to", value_name = "STORE", required = true, value_parser = StoreSpec::parse)
    )]
    pub to: Vec<StoreSpec>,
    /// Print the plan (what would be uploaded, skipped and written) and change nothing.
    #[cfg_attr(feature = "cli", arg(long))]
    pub dry_run: bool,
    /// Also on the Hub, re-read every listed artifact and check its SHA-256 (a download of
    /// each; directory and github: stores are always checked this way).
    #[cfg_attr(feature = "cli", arg(long))]
    pub deep_verify: bool,
    /// Attempts per upload before giving up (with exponential backoff from 2 s up to 30 s).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 4, value_name = "N"))]
    pub attempts: u32,
    /// A model this generation adds to the previous generation's IDs (repeat for several).
    /// Without it, a new ID is refused when a store holds the previous generation's manifest.
    #[cfg_attr(feature = "cli", arg(long = "add-model", value_name = "ID"))]
    pub add_models: Vec<ModelId>,
    /// A model of the previous generation this one retires (repeat for several). Without it, a
    /// missing ID is refused: model IDs stay stable across generations.
    #[cfg_attr(feature = "cli", arg(long = "drop-model", value_name = "ID"))]
    pub drop_models: Vec<ModelId>,
    /// The openpilot tree whose `tinygrad_pins.json` (written by `tinygrad bump`) records the
    /// pins of generations after v25. The manifest's tinygrad_commit must be --generation's pin.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR"))]
    pub openpilot: Option<PathBuf>,
    /// The rebuild workspace whose results/ holds the preflight, validation and rehearsal
    /// records; they must cover the seed's validation matrix and a passing rehearsal of this
    /// manifest's bytes, or nothing is published.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_name = "DIR", value_parser = crate::workspace::Workspace::value_parser())
    )]
    pub workspace: Option<Workspace>,
    /// Publish without a covering validation record or rehearsal (the whole gate is skipped);
    /// the reason and the uncovered cells are written into the publish record (`<manifest
    /// stem>.publish.<time>.json` beside the manifest, copied to `<manifest stem>.publish.json`).
    #[cfg_attr(feature = "cli", arg(long, value_name = "REASON"))]
    pub skip_validation: Option<String>,
    /// Allow a github: store without an hf:// one although the Hub (--hub) does not serve this
    /// manifest; the reason is written into the publish record. Without it such a publish is
    /// refused: devices try the Hub first, so GitHub is never ahead of it.
    #[cfg_attr(feature = "cli", arg(long, value_name = "REASON"))]
    pub github_only: Option<String>,
    /// The Hub store whose live manifest a GitHub-only publish is compared with (read only). A
    /// `--to` naming this same store counts as the Hub: an offline mirror or a directory that
    /// stands in for the Hub is named here on purpose, and may then go before GitHub.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_name = "STORE", default_value = crate::rebuild::DEFAULT_SOURCES, value_parser = StoreSpec::parse)
    )]
    pub hub: StoreSpec,
    #[cfg_attr(feature = "cli", command(flatten))]
    pub access: StoreAccess,
}

/// The signing flags of `release-cli publish` (with feature `cli`, a clap group).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct SignFlags {
    /// Sign the manifest with this minisign secret key and upload `model_names_<gen>.json.minisig`
    /// just before the manifest in each store. Repeat during a key rotation. An encrypted key's
    /// passphrase comes from STARPILOT_SIGN_PASSPHRASE, else from the terminal.
    #[cfg_attr(feature = "cli", arg(long, value_name = "KEY"))]
    pub sign_key: Vec<PathBuf>,
    /// With --sign-key: the release number (default: one more than the live signed manifest's).
    #[cfg_attr(feature = "cli", arg(long, value_name = "N", requires = "sign_key"))]
    pub release: Option<ReleaseNumber>,
    /// Publish unsigned over a store that holds this generation's signature, removing that
    /// signature (before the manifest is written); REASON goes into the publish record. Devices
    /// with trusted keys then refuse the generation as not signed. Without this flag or
    /// --sign-key, such a publish is refused before any upload.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_name = "REASON", conflicts_with = "sign_key")
    )]
    pub remove_signature: Option<String>,
    /// With --sign-key: days until devices refuse the signature, 1 to 3650 (10 years; the
    /// expiry is what stops a withdrawn manifest being served again).
    #[cfg_attr(
        feature = "cli",
        arg(long, value_name = "DAYS", requires = "sign_key", default_value_t = DEFAULT_EXPIRES_IN_DAYS)
    )]
    pub expires_in: u64,
}

/// What a publish tells its caller as it goes, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The validation gate was skipped with a reason; `gaps` uncovered cells are recorded.
    ValidationSkipped { reason: String, gaps: usize },
    /// GitHub is published without the Hub, allowed by `--github-only REASON`.
    GithubOnly { reason: String },
    /// The manifest was signed (before any store is written).
    Signed {
        generation: String,
        release: u64,
        expires: u64,
        keys: Vec<String>,
    },
    /// The generation is published unsigned and its signature removed.
    RemovingSignature {
        generation: Generation,
        reason: String,
    },
    /// A shipped file passed the runtime gate: its stamp's framing (driving artifacts) and
    /// whether a build receipt tied it to the pin (contracts with a stamp or receipts).
    RuntimeChecked {
        subject: String,
        path: PathBuf,
        framing: Option<String>,
        receipt: bool,
    },
    /// A first publish (no store holds the previous generation) leaves out a model of the
    /// tree's reviewed catalog (`catalog`, relative to the tree): it stays unpublished.
    StaysUnpublished { id: ModelId, catalog: String },
    /// Progress of the upload itself (serialized on its own, as `artifact_store` shapes it).
    #[serde(skip_serializing)]
    Store(artifact_store::publish::Event),
}

/// The publish report with what the validation gate decided and where the record went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PublishOutcome {
    #[serde(flatten)]
    pub report: PublishReport,
    pub validation: GateOutcome,
    /// `None` on a dry run. The newest publish's record, rewritten by each publish.
    pub publish_record: Option<PathBuf>,
    /// This publish's own record, never overwritten (the history,
    /// [`crate::records::publish_history_path`]). `None` on a dry run.
    pub publish_history: Option<PathBuf>,
}

/// Publish's validation gate, decided before any store is opened: the records in `workspace`
/// must cover the seed's matrix for `manifest`, unless validation is skipped with a reason.
pub fn check_gate(
    manifest: &Manifest,
    manifest_path: Option<&Path>,
    workspace: Option<&Workspace>,
    openpilot: Option<&Path>,
    skip_reason: Option<&str>,
) -> Result<GateOutcome> {
    if let Some(r) = skip_reason
        && r.trim().is_empty()
    {
        return Err(Error::SkipValidationNoReason);
    }
    if workspace.is_none() && skip_reason.is_none() {
        return Err(Error::PublishNeedsWorkspace);
    }
    let coverage = match workspace {
        Some(ws) => {
            let mut records = crate::records::load(ws)?;
            // The preflight must be of the tree being released, as it is now; unless these
            // very bytes were published through a passing gate before (a republish repairs a
            // gated release, whatever the tree has done since).
            let repair = manifest_path.is_some_and(|p| crate::records::gated_before(p, manifest));
            if !repair {
                records.tree = records
                    .preflight
                    .as_ref()
                    .map(|p| crate::preflight::tree_now(openpilot, p));
            }
            Some(crate::gate::coverage(manifest, &records))
        }
        None => None,
    };
    crate::gate::decide(
        workspace.map(Workspace::root),
        coverage.as_ref(),
        skip_reason,
    )
}

/// The manifest publish stages (what it gates, signs, uploads and records, and what `rehearse`
/// serves): `manifest` with the top-level keys every published manifest of `generation` carries
/// under `contract`, added where absent: `generation`, and the contract's `artifact_abi` when it
/// names one and the manifest is written in the contract's form (it records the revision under
/// the contract's `revision_key`; a manifest that does not is left to the contract's
/// validation, not half converted). A value already there is kept: another `generation` is
/// refused by publish, a wrong ABI by the contract's validation. The revision is never
/// invented: the pin rule refuses a manifest without it, so every published manifest carries
/// it.
pub fn staged_manifest(
    manifest: &Manifest,
    generation: Generation,
    contract: &manifest::Contract,
) -> Manifest {
    let mut m = manifest.clone();
    let has = |m: &Manifest, key: &str| m.top_level().any(|(k, _)| k == key);
    if !has(&m, manifest::keys::GENERATION) {
        m.set_generation(generation);
    }
    if let Some(abi) = contract.artifact_abi
        && !has(&m, manifest::keys::ARTIFACT_ABI)
        && has(&m, contract.revision_key)
    {
        m.set_top_level(manifest::keys::ARTIFACT_ABI, abi.into())
            .expect("artifact_abi takes any string");
    }
    m
}

/// Run the publish: every gate before any store is written, then the upload, then the record.
/// `passphrase` unlocks an encrypted signing key.
pub fn run(
    mut req: PublishRequest,
    passphrase: &mut dyn FnMut(&Path) -> std::result::Result<String, String>,
    on_event: &mut dyn FnMut(&Event),
) -> Result<PublishOutcome> {
    let staged = stage(&mut req)?;
    let validation = check_before_stores(&req, &staged, on_event)?;
    let stores = open_stores(&req.flags.to, &req.flags.access)?;
    let store_refs: Vec<&dyn Store> = stores.iter().map(|s| s.as_ref()).collect();
    let github_only = github_only_gate(&req)?;
    if let GithubOnly::Flag { reason } = &github_only {
        on_event(&Event::GithubOnly {
            reason: reason.clone(),
        });
    }
    let opts = PublishOptions {
        generation: req.flags.generation,
        dry_run: req.flags.dry_run,
        retry: RetryPolicy {
            attempts: req.flags.attempts.max(1),
            ..RetryPolicy::default()
        },
        deep_verify: req.flags.deep_verify,
        contract: staged.contract,
    };
    // Under a contract whose rows another tool may publish to the same bucket (v26), the live
    // rows this publish does not change are kept (reads only; a live manifest the contract
    // refuses stops here). Everything below (signature, upload, record) is about the merged
    // manifest.
    let merged = artifact_store::publish::merge_live_rows(
        &req.manifest,
        &req.flags.artifacts,
        &store_refs,
        &opts,
    )?;
    let manifest = &merged;
    // Into stores that hold no previous generation, the guard compares with the tree's catalog
    // or the workspace's staged manifest of the previous generation instead.
    check_left_out(&req, &opts.contract, manifest, &store_refs, on_event)?;
    // A signature covers only what the manifest states: refused before any key is unlocked.
    require_covered(&req, manifest)?;
    let signature = sign(&req, manifest, &store_refs, passphrase, on_event)?;
    let action = match (&signature, &req.sign.remove_signature) {
        (Some(sig), _) => SignatureAction::Sign(sig.as_bytes()),
        (None, Some(reason)) => {
            on_event(&Event::RemovingSignature {
                generation: req.flags.generation,
                reason: reason.clone(),
            });
            SignatureAction::RemoveSignature { reason }
        }
        (None, None) => SignatureAction::Unsigned,
    };
    // Files `rebuild --upload-to` recorded in these stores are not read back to hash them.
    let known = match &req.flags.workspace {
        Some(ws) => crate::rebuild::known_files(
            ws,
            req.flags.generation,
            manifest.ids().cloned(),
            &req.flags
                .to
                .iter()
                .map(canonical_store_name)
                .collect::<Vec<_>>(),
        ),
        None => Vec::new(),
    };
    let report = publish_known(
        manifest,
        &req.flags.artifacts,
        &store_refs,
        &opts,
        action,
        &known,
        &mut |e| on_event(&Event::Store(e.clone())),
    )?;
    let (publish_record, publish_history) = if report.dry_run {
        (None, None)
    } else {
        let (record, history) = write_records(
            &req,
            staged.manifest_path,
            manifest,
            &report,
            &validation,
            github_only,
        )?;
        (Some(record), Some(history))
    };
    Ok(PublishOutcome {
        report,
        validation,
        publish_record,
        publish_history,
    })
}

/// What publish decides before any gate: the manifest's canonical path, the generation the
/// tree selects, and the contract (pins, tree declaration, `--add-model`/`--drop-model`).
struct Staged {
    manifest_path: PathBuf,
    tree_generation: Option<Generation>,
    contract: Contract,
}

/// Name the manifest canonically, check the tree's selectors, load the pins and replace
/// `req.manifest` with the manifest as staged for its contract ([`staged_manifest`]).
fn stage(req: &mut PublishRequest) -> Result<Staged> {
    // The record names the manifest canonically (absolute, links resolved), whatever was
    // typed, so every later reader finds it from anywhere; decided before anything is written.
    let manifest_path = artifact_store::location::resolved(&req.flags.manifest_path);
    // The tree the release ships with must select exactly the generation of its tinygrad.
    let tree_generation = match &req.flags.openpilot {
        Some(op) => crate::tree::check_selectors(op)?,
        None => None,
    };
    let (pins, tree) = crate::tree::load_tree(req.flags.openpilot.as_deref())?;
    let contract = Contract {
        pins,
        add_models: req.flags.add_models.iter().cloned().collect(),
        drop_models: req.flags.drop_models.iter().cloned().collect(),
        tree,
    };
    // What every gate below sees and what is uploaded: the manifest as staged for its contract.
    req.manifest = staged_manifest(
        &req.manifest,
        req.flags.generation,
        contract.of(req.flags.generation),
    );
    Ok(Staged {
        manifest_path,
        tree_generation,
        contract,
    })
}

/// Every gate publish passes before any store is opened, in order: validation, GPU flags,
/// the signature's coverage, the manifest's contract rules, the runtime gate, the latency
/// bound. The validation gate's outcome goes into the record.
fn check_before_stores(
    req: &PublishRequest,
    staged: &Staged,
    on_event: &mut dyn FnMut(&Event),
) -> Result<GateOutcome> {
    let manifest = &req.manifest;
    let generation = req.flags.generation;
    // The validation gate, before any store is opened or anything written. It judges the
    // models this release built (the rows merged from a live manifest below are another
    // tool's, validated by it).
    let validation = check_gate(
        manifest,
        Some(&staged.manifest_path),
        req.flags.workspace.as_ref(),
        req.flags.openpilot.as_deref(),
        req.flags.skip_validation.as_deref(),
    )?;
    if let GateOutcome::Skipped { reason, gaps, .. } = &validation {
        on_event(&Event::ValidationSkipped {
            reason: reason.clone(),
            gaps: gaps.len(),
        });
    }
    // uses_external_gpu must be what the workspace's build records say was built.
    if let Some(ws) = &req.flags.workspace {
        crate::flags::check_gpu_flags(manifest, ws)?;
    }
    // A signature covers only what the manifest states: a signed publish of a manifest that
    // leaves an artifact's size, digest or count unstated is named for that, with the command
    // that writes them into this manifest, before any other rule (checked again on the merged
    // manifest).
    require_covered(req, manifest)?;
    // The manifest's own contract rules before any artifact is read: a manifest its contract
    // refuses as a whole (a v26 `chestnut` key, an id not in the tree's catalog) is named for
    // that, not for a file it makes the gate look for.
    let problems = manifest.validate_for_contract(
        manifest::ValidationMode::Release,
        staged.contract.of(generation),
        &staged.contract.expectation(generation),
    );
    if !problems.is_empty() {
        return Err(artifact_store::Error::from(manifest::Error::Invalid(problems)).into());
    }
    // The runtime gate: every driving artifact's stamp and every build receipt (contracts
    // that have them), before any store is opened.
    // The tree's built-in and DM set ship with the tree's own generation: they are judged when
    // the tree is of the generation published (or its generation is unknown), not when an
    // older generation is published again from a tree that has moved on (a repair).
    let tree_ships = staged.tree_generation.is_none_or(|g| g == generation);
    let checked = crate::loadable::gate_publish(
        manifest,
        &req.flags.artifacts,
        req.flags.openpilot.as_deref().filter(|_| tree_ships),
        &staged.contract.pins,
        generation,
    )?;
    for c in checked {
        on_event(&Event::RuntimeChecked {
            subject: c.subject.to_string(),
            path: c.path,
            framing: c.framing.map(|f| f.to_string()),
            receipt: c.receipt.is_some(),
        });
    }
    // The contract's latency bound over the validations the gate counted (validation SHA =
    // receipt SHA = artifact digest), unless validation is skipped with a reason.
    if let (Some(ws), None) = (&req.flags.workspace, &req.flags.skip_validation) {
        crate::loadable::gate_validation(
            manifest,
            &req.flags.artifacts,
            ws,
            staged.contract.of(generation),
        )?;
    }
    Ok(validation)
}

/// A signed publish refuses a manifest that leaves an artifact's size, digest or count
/// unstated ([`signing::require_covered`]); an unsigned one passes.
fn require_covered(req: &PublishRequest, manifest: &Manifest) -> Result<()> {
    if !req.sign.sign_key.is_empty() {
        signing::require_covered(manifest, &req.flags.manifest_path.display().to_string())
            .map_err(Error::SignRefused)?;
    }
    Ok(())
}

/// The publish record, written twice: as this publish's own history file, then as the newest
/// record beside the manifest. Returns (newest, history).
fn write_records(
    req: &PublishRequest,
    manifest_path: PathBuf,
    manifest: &Manifest,
    report: &PublishReport,
    validation: &GateOutcome,
    github_only: GithubOnly,
) -> Result<(PathBuf, PathBuf)> {
    let record = PublishRecord {
        generation: req.flags.generation,
        manifest: manifest_path,
        manifest_sha256: chunker::Sha256Digest::of_bytes(&manifest.to_canonical_bytes()),
        tinygrad_commit: manifest.own_revision(),
        published_at: manifest::UnixSeconds::now(),
        stores: req.flags.to.iter().map(canonical_store_name).collect(),
        models: report.models.clone(),
        validation: validation.clone(),
        github_only: match github_only {
            GithubOnly::NotGithubOnly => None,
            other => Some(other),
        },
        signature_removed: req.sign.remove_signature.clone(),
    };
    let history =
        crate::records::publish_history_path(&record.manifest, record.published_at, |p| p.exists())
            .ok_or_else(|| Error::Record {
                path: crate::records::publish_record_path(&record.manifest),
                reason: "999 publish records of this second already exist beside it".into(),
            })?;
    crate::records::write(&history, &record)?;
    let path = crate::records::publish_record_path(&record.manifest);
    crate::records::write(&path, &record)?;
    Ok((path, history))
}

/// The generation guard where no `--to` store holds the previous generation's manifest
/// ([`crate::catalog_guard`]): under a contract whose entries are the tree's catalog rows, each
/// catalog row `manifest` leaves out is reported as staying unpublished; otherwise a model of
/// the previous generation's manifest staged in the workspace that it leaves out is refused
/// unless named with `--drop-model`. Nothing to compare with, nothing said.
fn check_left_out(
    req: &PublishRequest,
    contract: &Contract,
    manifest: &Manifest,
    stores: &[&dyn Store],
    on_event: &mut dyn FnMut(&Event),
) -> Result<()> {
    use crate::catalog_guard::{LeftOut, left_out};
    let generation = req.flags.generation;
    let Some(previous) = generation.previous() else {
        return Ok(());
    };
    let held = manifest::StoreLayout::HfBucket.manifest_path(previous);
    for store in stores {
        if store.stat(&held)?.is_some() {
            return Ok(());
        }
    }
    let rules = contract.of(generation);
    let dropped = &contract.drop_models;
    if rules.entries_from_tree_catalog {
        let Some(tree) = contract
            .tree
            .as_ref()
            .filter(|t| t.generation == generation)
        else {
            return Ok(());
        };
        let catalog = tree.contract.contract().tree.map_or_else(String::new, |t| {
            t.catalog_json.replace("{gen}", &generation.to_string())
        });
        let ids = tree.catalog.iter().map(|r| &r.id);
        if let LeftOut::StayUnpublished(ids) = left_out(rules, ids, manifest, dropped) {
            for id in ids {
                let catalog = catalog.clone();
                on_event(&Event::StaysUnpublished { id, catalog });
            }
        }
        return Ok(());
    }
    let Some(ws) = &req.flags.workspace else {
        return Ok(());
    };
    let path = ws.holding(previous).ready_manifest(previous);
    let limit = manifest::Limits::DEFAULT_MAX_MANIFEST_BYTES;
    let Some(bytes) = chunker::bounded::read_capped(&path, limit)? else {
        return Ok(());
    };
    let old = Manifest::from_slice(&bytes).map_err(|source| Error::ManifestFile {
        path: path.clone(),
        source,
    })?;
    let LeftOut::Refused(models) = left_out(rules, old.ids(), manifest, dropped) else {
        return Ok(());
    };
    Err(Error::LeftOutOfGeneration {
        generation,
        previous,
        rerun: rerun_dropping(req, ws, &models),
        path,
        models,
    })
}

/// The publish command as given (each value quoted for the shell), with `models` added as
/// `--drop-model`: the rerun [`Error::LeftOutOfGeneration`] names.
fn rerun_dropping(req: &PublishRequest, ws: &Workspace, models: &[ModelId]) -> String {
    let flags = &req.flags;
    let lossy = |p: &Path| p.to_string_lossy().into_owned();
    let hub = Some(flags.hub.to_string()).filter(|h| h != crate::rebuild::DEFAULT_SOURCES);
    let signed = !req.sign.sign_key.is_empty();
    let once = [
        ("manifest", Some(lossy(&flags.manifest_path))),
        ("artifacts", Some(lossy(&flags.artifacts))),
        ("workspace", Some(lossy(ws.root()))),
        ("openpilot", flags.openpilot.as_deref().map(lossy)),
        ("skip-validation", flags.skip_validation.clone()),
        ("github-only", flags.github_only.clone()),
        ("hub", hub),
        ("hf-cli", flags.access.hf_cli.as_deref().map(lossy)),
        ("github-branch", Some(flags.access.github_branch.clone())),
        ("attempts", Some(flags.attempts.to_string())),
        ("release", req.sign.release.map(|r| r.to_string())),
        (
            "expires-in",
            signed.then(|| req.sign.expires_in.to_string()),
        ),
        ("remove-signature", req.sign.remove_signature.clone()),
    ];
    let id = |name: &'static str| move |id: &ModelId| (name, id.as_str().to_string());
    let repeated = (flags.to.iter().map(|to| ("to", to.to_string())))
        .chain(req.sign.sign_key.iter().map(|k| ("sign-key", lossy(k))))
        .chain(flags.add_models.iter().map(id("add-model")))
        .chain(flags.drop_models.iter().chain(models).map(id("drop-model")));
    let given = once.into_iter().filter_map(|(name, v)| Some((name, v?)));
    let mut rerun = format!("release-cli publish --generation {}", flags.generation);
    for (name, value) in given.chain(repeated) {
        rerun.push_str(&format!(" --{name} {}", cli_support::shell_quote(&value)));
    }
    for (on, name) in [
        (flags.dry_run, " --dry-run"),
        (flags.deep_verify, " --deep-verify"),
    ] {
        if on {
            rerun.push_str(name);
        }
    }
    rerun
}

/// A store path as messages about `store` (as publish's events name it) show it, in the layout
/// the store keeps its files in: a `github:` store's path on its branch (`v25/<id>/<file>`,
/// `model_names_v25.json`), any other store's as it is (bucket layout,
/// `models/v25/<id>/<file>`, `manifests/model_names_v25.json`). A path the branch does not
/// hold stays as it is.
pub fn path_in_store(store: &StoreName, path: &str) -> String {
    let bucket = manifest::StoreLayout::HfBucket;
    path.parse::<manifest::StorePath>()
        .ok()
        .filter(|_| store.layout != bucket)
        .and_then(|p| bucket.translate(&p, store.layout))
        .map_or_else(|| path.to_string(), |p| p.to_string())
}

/// A store as the publish record names it, the same however `--to` spelled it: a directory as
/// `file:` and a `github:` checkout as `github:`, each with its absolute path (symlinks
/// resolved where it exists); a Hub store as `hf://…`.
pub fn canonical_store_name(spec: &StoreSpec) -> String {
    match spec {
        StoreSpec::Local(p) => format!("file:{}", artifact_store::location::resolved(p).display()),
        StoreSpec::Github(p) => {
            format!("github:{}", artifact_store::location::resolved(p).display())
        }
        other => other.to_string(),
    }
}

/// `specs` (publish's `--to`, rebuild's `--upload-to`), refused in an order that puts GitHub
/// ahead of the Hub, opened.
pub(crate) fn open_stores(
    specs: &[StoreSpec],
    access: &StoreAccess,
) -> Result<Vec<Box<dyn Store>>> {
    check_store_order(specs).map_err(Error::PublishInput)?;
    Ok(specs
        .iter()
        .map(|s| s.open(access))
        .collect::<artifact_store::Result<_>>()?)
}

/// GitHub never ahead of the Hub: `artifact_store::publish::check_github_only` over the `--to`
/// stores, opening the Hub store only when it must be read.
fn github_only_gate(req: &PublishRequest) -> Result<GithubOnly> {
    // A `--to` that is the Hub store counts as the Hub (an offline mirror, or a directory
    // standing in for the Hub, named on purpose).
    let kinds: Vec<(bool, bool)> = req
        .flags
        .to
        .iter()
        .map(|s| (s.is_hf() || s.same_store(&req.flags.hub), s.is_github()))
        .collect();
    Ok(check_github_only(
        &kinds,
        req.flags.github_only.as_deref(),
        req.flags.generation,
        &req.manifest,
        &mut || req.flags.hub.open(&req.flags.access),
    )?)
}

/// The signature file for the manifest's canonical bytes (what publish uploads), with the next
/// release after every live signed one. `None` without keys.
fn sign(
    req: &PublishRequest,
    manifest: &Manifest,
    stores: &[&dyn Store],
    passphrase: &mut dyn FnMut(&Path) -> std::result::Result<String, String>,
    on_event: &mut dyn FnMut(&Event),
) -> Result<Option<String>> {
    if req.sign.sign_key.is_empty() {
        return Ok(None);
    }
    let keys = req
        .sign
        .sign_key
        .iter()
        .map(|p| SigningKey::load(p, passphrase))
        .collect::<artifact_store::Result<Vec<_>>>()
        .map_err(Error::PublishInput)?;
    let bytes = manifest.to_canonical_bytes();
    let verifying: Vec<VerifyingKey> = keys.iter().map(VerifyingKey::from).collect();
    let live = signing::live_signatures(stores, req.flags.generation, &verifying, &bytes)
        .map_err(Error::SignFailed)?;
    let release = signing::choose_release(&live, req.sign.release).map_err(Error::PublishInput)?;
    let comment = signing::new_comment(req.flags.generation, release, req.sign.expires_in)
        .map_err(Error::PublishInput)?;
    let text = signing::sign_manifest(&keys, &bytes, &comment).map_err(Error::SignFailed)?;
    on_event(&Event::Signed {
        generation: req.flags.generation.to_string(),
        release: release.get(),
        expires: comment.expires.0,
        keys: keys.iter().map(|k| k.id().to_string()).collect(),
    });
    Ok(Some(text))
}

/// `manifest sign`'s release number, by the rule publish uses
/// ([`signing::choose_release`]): `requested`, else one more than the release of the signature
/// already beside the manifest (`existing`) for `generation`, counting only blocks one of
/// `keys` verifies over `manifest_bytes` (another key's signature beside the file is ignored,
/// not refused); 1 when there is none. A requested release not above the existing one is
/// refused.
pub fn release_beside(
    keys: &[VerifyingKey],
    manifest_bytes: &[u8],
    existing: Option<&[u8]>,
    generation: Generation,
    requested: Option<ReleaseNumber>,
) -> artifact_store::Result<ReleaseNumber> {
    let beside: Vec<signing::LiveSignature> = existing
        .map(|raw| {
            signing::check_signature(keys, manifest_bytes, &String::from_utf8_lossy(raw))
                .unwrap_or_default()
        })
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.verified_by.is_some())
        .filter_map(|c| c.comment.parse::<manifest::TrustedComment>().ok())
        .filter(|c| c.generation == generation)
        .map(|c| signing::LiveSignature {
            store: String::new(),
            verified_release: Some(c.release),
            unverified_comment: None,
        })
        .collect();
    signing::choose_release(&beside, requested)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both generations every rule is tested for: v25 and a made-up v26 with a made-up pin.
    fn generations() -> [(Generation, &'static str); 2] {
        [
            (
                Generation::new(25),
                "e837e367aac9e1a66e689f4f32ce20ca9367df13",
            ),
            (
                Generation::new(26),
                "0123456789abcdef0123456789abcdef01234567",
            ),
        ]
    }

    fn manifest(generation: Generation, pin: &str) -> Manifest {
        let doc = serde_json::json!({
            "generation": generation.to_string(), "tinygrad_commit": pin,
            "models": [{
                "id": "a8", "name": "a8", "version": "v8", "series": "OP Series",
                "released": "2025-01-01", "community_favorite": false,
                "artifact_format": "tinygrad_single_v1", "artifact_size": 5,
                "artifact_sha256": "01".repeat(32), "artifact_chunk_count": 1,
                "uses_external_gpu": false
            }]
        });
        Manifest::from_slice(doc.to_string().as_bytes()).unwrap()
    }

    /// The staged manifest carries the contract's top-level keys where the given one lacks
    /// them, and keeps every value it has: v25, v26 under the v26 contract, and a made-up v27
    /// that inherits it. Each staged manifest reads back with the generation it is published as.
    #[test]
    fn the_staged_manifest_carries_the_contract_top_keys() {
        use manifest::ContractName;
        let (v25, v26, v27) = (
            Generation::new(25),
            Generation::new(26),
            Generation::new(27),
        );
        let mut pins = manifest::PinTable::builtin();
        pins.record_contract(v26, ContractName::V26).unwrap();
        let without = |m: &Manifest, key: &str| {
            let mut m = m.clone();
            m.remove_top_level(key);
            m
        };
        let rev: manifest::GitCommit = "0123456789abcdef0123456789abcdef01234567".parse().unwrap();
        for g in [v25, v26, v27] {
            let contract = pins.contract(g);
            // Written in the contract's form: the revision under its revision key.
            let mut full = manifest(g, rev.as_str());
            full.set_revision(contract, &rev);
            let bare = without(&without(&full, "generation"), "artifact_abi");
            assert_eq!(bare.generation(), None);
            let staged = staged_manifest(&bare, g, contract);
            assert_eq!(staged.generation(), Some(g), "{g}");
            assert_eq!(staged.artifact_abi(), contract.artifact_abi, "{g}");
            assert_eq!(staged.revision(contract), bare.revision(contract), "{g}");
            assert_eq!(staged.models(), bare.models());
            // Values already there are kept, even a generation publish then refuses.
            let mut other = bare.clone();
            other.set_generation(Generation::new(24));
            assert_eq!(
                staged_manifest(&other, g, contract).generation(),
                Some(Generation::new(24))
            );
            // Staging a staged manifest changes nothing.
            assert_eq!(staged_manifest(&staged, g, contract), staged);
            // Not in the contract's form (no revision under its key): only the generation.
            let mut foreign = without(&bare, contract.revision_key);
            if contract.revision_key != "tinygrad_commit" {
                assert_eq!(staged_manifest(&foreign, g, contract).artifact_abi(), None);
            }
            foreign.set_generation(g);
            assert_eq!(staged_manifest(&foreign, g, contract).generation(), Some(g));
        }
        // Under v25 nothing beyond the generation is added.
        let v25_staged = staged_manifest(
            &without(
                &manifest(v25, "e837e367aac9e1a66e689f4f32ce20ca9367df13"),
                "generation",
            ),
            v25,
            pins.contract(v25),
        );
        let keys: Vec<&str> = v25_staged.top_level().map(|(k, _)| k).collect();
        assert_eq!(keys, ["tinygrad_commit", "generation"]);
        assert_eq!(
            pins.contract(v27).artifact_abi,
            pins.contract(v26).artifact_abi
        );
        assert!(pins.contract(v26).artifact_abi.is_some());
    }

    /// Messages about a `github:` store name branch paths; other stores keep bucket paths. For
    /// v25, v26 and a made-up v27.
    #[test]
    fn github_messages_use_branch_paths() {
        let gh = StoreName {
            name: "github:/srv/gh".into(),
            layout: manifest::StoreLayout::GithubBranch,
        };
        let hf = StoreName {
            name: "hf://buckets/StarPilot-Driving/StarPilot-Resources".into(),
            layout: manifest::StoreLayout::HfBucket,
        };
        let local = artifact_store::LocalStore::new("/srv/store").name();
        for generation in ["v25", "v26", "v27"] {
            let cases = [
                (
                    &gh,
                    format!("models/{generation}/pop223/pop223_driving_tinygrad.pkl.chunk01of02"),
                    format!("{generation}/pop223/pop223_driving_tinygrad.pkl.chunk01of02"),
                ),
                (
                    &gh,
                    format!("manifests/model_names_{generation}.json"),
                    format!("model_names_{generation}.json"),
                ),
                (
                    &gh,
                    format!("manifests/model_names_{generation}.json.minisig"),
                    format!("model_names_{generation}.json.minisig"),
                ),
                (
                    &gh,
                    "onnx/pop223/x.onnx".to_string(),
                    "onnx/pop223/x.onnx".to_string(),
                ),
                (
                    &hf,
                    format!("manifests/model_names_{generation}.json"),
                    format!("manifests/model_names_{generation}.json"),
                ),
                (
                    &local,
                    format!("models/{generation}/pop223/x.pkl"),
                    format!("models/{generation}/pop223/x.pkl"),
                ),
            ];
            for (store, path, want) in cases {
                assert_eq!(path_in_store(store, &path), want, "{store} {path}");
            }
        }
    }

    /// The layout comes from the opened store, not from its name: a directory named like a
    /// `github:` checkout (`--to file:github:x`) keeps bucket paths.
    #[test]
    fn directory_named_like_github_keeps_bucket_paths() {
        let store = artifact_store::LocalStore::new("github:x");
        assert_eq!(
            StoreSpec::parse("file:github:x").unwrap(),
            StoreSpec::Local(store.root().into())
        );
        assert_eq!(store.describe(), "github:x");
        let path = "models/v25/pop223/x.pkl";
        assert_eq!(path_in_store(&store.name(), path), path);
    }

    /// Every spelling of one store gives one name; for any generation's stores alike.
    #[test]
    fn canonical_store_names() {
        let t = tempfile::tempdir().unwrap();
        let store = t.path().join("store");
        std::fs::create_dir_all(store.join("sub")).unwrap();
        let real = std::fs::canonicalize(&store).unwrap();
        let name = |s: &str| canonical_store_name(&StoreSpec::parse(s).unwrap());
        let dir = store.display().to_string();
        for spelling in [
            dir.clone(),
            format!("file:{dir}"),
            format!("file://{dir}"),
            format!("{dir}/sub/.."),
            format!("{dir}/"),
        ] {
            assert_eq!(
                name(&spelling),
                format!("file:{}", real.display()),
                "{spelling}"
            );
        }
        assert_eq!(
            name(&format!("github:{dir}/sub/..")),
            format!("github:{}", real.display())
        );
        let missing = t.path().join("not-yet");
        assert_eq!(
            name(missing.to_str().unwrap()),
            format!("file:{}", missing.display())
        );
        assert_eq!(
            name("hf://buckets/StarPilot-Driving/StarPilot-Resources"),
            "hf://buckets/StarPilot-Driving/StarPilot-Resources"
        );
    }

    /// The gate's flag rules come before any record is read: a workspace that does not exist is
    /// never opened when the skip reason is empty.
    #[test]
    fn the_gate_refuses_missing_flags_before_reading_records() {
        let missing = &Workspace::new("/nonexistent/starpilot-workspace");
        for (generation, pin) in generations() {
            let m = manifest(generation, pin);
            type Case<'a> = (Option<&'a Workspace>, Option<&'a str>, &'a str);
            let cases: [Case; 5] = [
                (None, None, "PublishNeedsWorkspace"),
                (None, Some(""), "SkipValidationNoReason"),
                (None, Some("  \t"), "SkipValidationNoReason"),
                (Some(missing), Some(" "), "SkipValidationNoReason"),
                (None, Some("hotfix: validated by hand"), "Skipped"),
            ];
            for (workspace, skip, want) in cases {
                let got = match check_gate(&m, None, workspace, None, skip) {
                    Err(Error::PublishNeedsWorkspace) => "PublishNeedsWorkspace",
                    Err(Error::SkipValidationNoReason) => "SkipValidationNoReason",
                    Ok(GateOutcome::Skipped { reason, .. }) => {
                        assert_eq!(Some(reason.as_str()), skip);
                        "Skipped"
                    }
                    other => panic!("{generation} {workspace:?} {skip:?}: {other:?}"),
                };
                assert_eq!(got, want, "{generation} {workspace:?} {skip:?}");
            }
        }
    }

    fn key(dir: &Path, name: &str) -> SigningKey {
        let kp = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
        let path = dir.join(name);
        std::fs::write(&path, kp.sk.to_box(None).unwrap().into_string()).unwrap();
        SigningKey::load(&path, &mut |_| Err("no passphrase in tests".into())).unwrap()
    }

    fn signed(k: &SigningKey, bytes: &[u8], generation: Generation, release: u64) -> String {
        let comment =
            signing::new_comment(generation, ReleaseNumber::new(release).unwrap(), 30).unwrap();
        signing::sign_manifest(std::slice::from_ref(k), bytes, &comment).unwrap()
    }

    /// `manifest sign`'s release number: one more than the signature beside the manifest when
    /// one of the keys verifies it for this generation, else 1; `--release` must be above it.
    #[test]
    fn release_beside_counts_only_a_verified_signature_of_the_generation() {
        let dir = tempfile::tempdir().unwrap();
        let ours = key(dir.path(), "ours.key");
        let theirs = key(dir.path(), "theirs.key");
        let keys = [VerifyingKey::from(&ours)];
        let n = |r: u64| ReleaseNumber::new(r).unwrap();
        let [(v25, pin25), (v26, pin26)] = generations();
        for (generation, pin, other) in [(v25, pin25, v26), (v26, pin26, v25)] {
            let bytes = manifest(generation, pin).to_canonical_bytes();
            let ours4 = signed(&ours, &bytes, generation, 4);
            let theirs4 = signed(&theirs, &bytes, generation, 4);
            let other4 = signed(&ours, &bytes, other, 4);
            let of_other_bytes = signed(&ours, b"another manifest", generation, 4);
            let cases: [(Option<&str>, Option<u64>, Option<u64>); 9] = [
                (None, None, Some(1)),
                (Some(&ours4), None, Some(5)),
                (Some(&theirs4), None, Some(1)),
                (Some(&other4), None, Some(1)),
                (Some(&of_other_bytes), None, Some(1)),
                (Some("not a signature"), None, Some(1)),
                (Some(&ours4), Some(7), Some(7)),
                (Some(&ours4), Some(4), None),
                (None, Some(1001), None),
            ];
            for (existing, requested, want) in cases {
                let got = release_beside(
                    &keys,
                    &bytes,
                    existing.map(str::as_bytes),
                    generation,
                    requested.map(n),
                );
                assert_eq!(
                    got.as_ref().ok().map(|r| r.get()),
                    want,
                    "{generation} {existing:?} {requested:?}: {got:?}"
                );
            }
        }
    }
}
