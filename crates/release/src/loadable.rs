//! The runtime gate: nothing ships that the pinned runtime cannot load (docs/release.md, "The
//! release gates").
//!
//! Before any byte leaves the machine, every driving artifact a command ships — each model's
//! artifact, each accelerator variant, the built-in chunk set — has its stamp read
//! ([`manifest::stamp`], through chunker's reader, so a chunk set is read as the one file it
//! is) and checked against this generation's contract, pin and the entry's version; and, for a
//! contract with build receipts, every such artifact and every driver-monitoring file must have
//! its receipt beside it ([`manifest::receipt`]) naming the pin and the very bytes that ship.
//! A contract without a stamp or receipts (v25) checks nothing here: its artifacts keep its
//! rules.
//!
//! [`publish_files`] and [`tree_files`] say which files a publish ships and which the tree
//! holds; [`check_files`] reads them and decides. The reads are bounded (the stamp reader's
//! caps; receipts at most [`manifest::receipt::MAX_RECEIPT_BYTES`]).

use std::fmt;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use chunker::Sha256Digest;
use manifest::receipt::{self, BuildReceipt, ReceiptRefusal};
use manifest::stamp::{self, Framing, StampError, StampLimits, StampRefusal};
use manifest::{BehaviorVersion, Contract, GitCommit, Manifest, ModelId, layout};
use serde::Serialize;

use crate::{Error, Result};

/// What a shipped file is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Subject {
    /// A model's artifact.
    Model { id: ModelId },
    /// An `accelerator_artifacts` variant of a model.
    Variant { id: ModelId, variant: String },
    /// The built-in driving model in the openpilot tree.
    Builtin,
    /// A driver-monitoring file in the openpilot tree.
    Dm { name: String },
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Model { id } => write!(f, "model {id}"),
            Self::Variant { id, variant } => write!(f, "model {id}'s {variant} variant"),
            Self::Builtin => f.write_str("the built-in model"),
            Self::Dm { name } => write!(f, "DM file {name}"),
        }
    }
}

/// One file to check: where it is (the logical name: a plain file or a chunk set), whether it
/// carries a stamp, the version it must name, and the digest and size the release states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShippedFile {
    pub subject: Subject,
    pub path: PathBuf,
    /// A driving artifact (model, variant, built-in) carries a stamp; a DM file does not.
    pub stamped: bool,
    pub version: Option<BehaviorVersion>,
    /// The digest and size the release states for it (`None`: taken from the bytes).
    pub sha256: Option<Sha256Digest>,
    pub size: Option<u64>,
}

/// Why a file cannot ship.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadProblem {
    /// The stamp could not be read (not a pickle, an unknown framing, a hostile file).
    #[error("its stamp cannot be read: {0}")]
    Stamp(StampError),
    /// The stamp names another ABI, compiler, format or version.
    #[error("{0}")]
    StampRefused(StampRefusal),
    /// No build receipt beside it.
    #[error(
        "no build receipt {}: nothing ties it to the pin (build it with `release-cli compile`, `dm` or `rebuild`, which write the receipt beside it)",
        receipt.display()
    )]
    ReceiptMissing { receipt: PathBuf },
    /// A receipt that is not one.
    #[error("{}: {reason}", receipt.display())]
    ReceiptUnreadable { receipt: PathBuf, reason: String },
    /// A receipt naming another revision, ABI, digest or size.
    #[error("{0}")]
    ReceiptRefused(ReceiptRefusal),
    /// The file is not there, or the bytes are not what the release states.
    #[error("{reason}")]
    Bytes { reason: String },
    /// The contract checks files but the generation has no pin.
    #[error(
        "the generation has no tinygrad pin to check its stamp and receipt against (record it with `release-cli tinygrad bump`)"
    )]
    NoPin,
}

/// A file that passed: its framing (driving artifacts) and its receipt (contracts with
/// receipts).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Checked {
    pub subject: Subject,
    pub path: PathBuf,
    pub framing: Option<Framing>,
    pub receipt: Option<BuildReceipt>,
}

/// The driving artifacts a publish of `manifest` from `artifacts` ships under `contract`: each
/// entry's artifact and each accelerator variant the contract knows, at `<artifacts>/<id>/<file>`.
/// A variant under another key (a `chestnut` key in a v26 manifest) ships nothing: the
/// contract's manifest validation refuses the whole manifest for it, naming the key.
pub fn publish_files(
    manifest: &Manifest,
    artifacts: &Path,
    contract: &Contract,
) -> Vec<ShippedFile> {
    let mut files = Vec::new();
    for e in manifest.models() {
        let dir = artifacts.join(e.id().as_str());
        files.push(ShippedFile {
            subject: Subject::Model { id: e.id().clone() },
            path: dir.join(e.file_name().as_str()),
            stamped: true,
            version: e.version(),
            sha256: e.artifact_sha256(),
            size: e.artifact_size().map(|s| s.get()),
        });
        for (variant, a) in e.accelerators() {
            if variant != contract.accelerator.key {
                continue;
            }
            let Some(name) = e.accelerator_file_name(&variant) else {
                continue;
            };
            files.push(ShippedFile {
                subject: Subject::Variant {
                    id: e.id().clone(),
                    variant,
                },
                path: dir.join(name.as_str()),
                stamped: true,
                version: e.version(),
                sha256: a.sha256,
                size: a.size.map(|s| s.get()),
            });
        }
    }
    files
}

/// What the openpilot tree ships with a release: the built-in chunk set and the DM set, in
/// `selfdrive/modeld/models` (their digests are taken from the bytes).
pub fn tree_files(openpilot: &Path) -> Vec<ShippedFile> {
    let dir = openpilot.join(crate::tree::BUILTIN_DIR);
    let mut files = vec![builtin_file(&dir.join(crate::tree::BUILTIN_NAME))];
    files.extend(layout::DM_FILES.iter().map(|name| ShippedFile {
        subject: Subject::Dm {
            name: name.to_string(),
        },
        path: dir.join(name),
        stamped: false,
        version: None,
        sha256: None,
        size: None,
    }));
    files
}

/// The built-in model at `path` (a plain file or a chunk set).
pub fn builtin_file(path: &Path) -> ShippedFile {
    ShippedFile {
        subject: Subject::Builtin,
        path: path.to_path_buf(),
        stamped: true,
        version: Some(layout::BUILTIN_MODEL_VERSION),
        sha256: None,
        size: None,
    }
}

/// Whether `contract` checks anything here.
pub fn checks_anything(contract: &Contract) -> bool {
    contract.stamp.is_some() || contract.build_receipts
}

/// Read and decide every file: the first one that cannot ship is the error, naming it.
/// Nothing is written. A contract that checks nothing returns at once.
pub fn check_files(
    files: &[ShippedFile],
    contract: &Contract,
    pin: Option<&GitCommit>,
) -> Result<Vec<Checked>> {
    if !checks_anything(contract) {
        return Ok(Vec::new());
    }
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        out.push(
            check_file(f, contract, pin).map_err(|problem| Error::NotLoadable {
                subject: f.subject.to_string(),
                path: f.path.clone(),
                problem: Box::new(problem),
            })?,
        );
    }
    Ok(out)
}

/// A file that is not there or cannot be read, as a [`LoadProblem::Bytes`].
fn bytes(e: impl fmt::Display) -> LoadProblem {
    LoadProblem::Bytes {
        reason: e.to_string(),
    }
}

fn check_file(
    f: &ShippedFile,
    contract: &Contract,
    pin: Option<&GitCommit>,
) -> std::result::Result<Checked, LoadProblem> {
    let pin = pin.ok_or(LoadProblem::NoPin)?;
    let name = f
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut reader = chunker::open(&f.path).map_err(bytes)?;
    let mut framing = None;
    if f.stamped && contract.stamp.is_some() {
        let st =
            stamp::read_stamp(&mut reader, &StampLimits::default()).map_err(LoadProblem::Stamp)?;
        let version = f.version.ok_or_else(|| LoadProblem::Bytes {
            reason: "the entry names no behaviour version to check the stamp against".into(),
        })?;
        stamp::check_stamp(&name, &st, contract, pin, version)
            .map_err(LoadProblem::StampRefused)?;
        framing = Some(st.framing);
    }
    let mut receipt = None;
    if contract.build_receipts {
        let path = f.path.with_file_name(receipt::receipt_file_name(&name));
        let r = read_receipt_file(&path)?;
        let (sha256, size) = match (f.sha256, f.size) {
            (Some(d), Some(s)) => (d, s),
            _ => {
                reader.seek(SeekFrom::Start(0)).map_err(bytes)?;
                let (d, n) = Sha256Digest::of_reader(&mut reader).map_err(bytes)?;
                (d, n)
            }
        };
        receipt::check_receipt(&name, &r, contract, pin, &sha256, size)
            .map_err(LoadProblem::ReceiptRefused)?;
        receipt = Some(r);
    }
    Ok(Checked {
        subject: f.subject.clone(),
        path: f.path.clone(),
        framing,
        receipt,
    })
}

/// A receipt file: missing, unreadable or parsed.
pub fn read_receipt_file(path: &Path) -> std::result::Result<BuildReceipt, LoadProblem> {
    let unreadable = |reason: String| LoadProblem::ReceiptUnreadable {
        receipt: path.to_path_buf(),
        reason,
    };
    match chunker::bounded::read_capped(path, receipt::MAX_RECEIPT_BYTES) {
        Ok(Some(b)) => receipt::parse_receipt(&b).map_err(|e| unreadable(e.to_string())),
        Ok(None) => Err(LoadProblem::ReceiptMissing {
            receipt: path.to_path_buf(),
        }),
        Err(e) => Err(unreadable(e.to_string())),
    }
}

/// The receipt beside an artifact, when there is one (`status`).
pub fn receipt_beside(artifact: &Path) -> Option<std::result::Result<BuildReceipt, LoadProblem>> {
    let name = artifact.file_name()?.to_string_lossy().into_owned();
    let path = artifact.with_file_name(receipt::receipt_file_name(&name));
    match read_receipt_file(&path) {
        Err(LoadProblem::ReceiptMissing { .. }) => None,
        read => Some(read),
    }
}

/// Write `receipt` beside `artifact` (durably, through chunker's atomic write).
pub fn write_receipt_beside(artifact: &Path, receipt: &BuildReceipt) -> Result<PathBuf> {
    let name = artifact
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let path = artifact.with_file_name(receipt::receipt_file_name(&name));
    chunker::atomic::write_atomic(&path, receipt.to_json().as_bytes())?;
    Ok(path)
}

/// Digest and size of a logical artifact (plain file or chunk set), read through chunker.
pub fn digest_of(path: &Path) -> Result<(Sha256Digest, u64)> {
    let mut r = chunker::open(path)?;
    r.seek(SeekFrom::Start(0))?;
    Ok(Sha256Digest::of_reader(&mut r as &mut dyn Read)?)
}

/// Publish's runtime gate, before any store is opened: every driving artifact `manifest` lists
/// in `artifacts` and, with `openpilot`, the tree's built-in and DM set, checked against the
/// contract and pin `pins` record for `generation`.
pub fn gate_publish(
    manifest: &Manifest,
    artifacts: &Path,
    openpilot: Option<&Path>,
    pins: &manifest::PinTable,
    generation: manifest::Generation,
) -> Result<Vec<Checked>> {
    let contract = pins.contract(generation);
    if !checks_anything(contract) {
        return Ok(Vec::new());
    }
    let mut files = publish_files(manifest, artifacts, contract);
    if let Some(op) = openpilot {
        files.extend(tree_files(op));
    }
    check_files(&files, contract, pins.get(generation))
}

/// The contract of the generation whose pin `pin` is (`compile` and `dm` know the pin, not the
/// generation); a pin no generation records runs the base contract.
pub fn contract_for_pin(pins: &manifest::PinTable, pin: &GitCommit) -> &'static Contract {
    match pins.owner_of(pin) {
        Some(g) => pins.contract(g),
        None => manifest::contract::BASE_CONTRACT.contract(),
    }
}

/// What a build knows of the file it built, for its receipt.
#[derive(Debug, Clone)]
pub struct Built<'a> {
    /// The receipt's `model_id` (a model's id; `rdf43` for the built-in; a DM file's stem).
    pub model_id: &'a str,
    /// The behaviour version it was built for (`None`: a DM file).
    pub version: Option<BehaviorVersion>,
    /// The logical artifact (plain file or chunk set).
    pub artifact: &'a Path,
    /// The sources it was built from (hashed by file name).
    pub sources: &'a [PathBuf],
    /// A driving artifact, which carries a stamp.
    pub stamped: bool,
}

/// The receipt of a file just built, for a contract with build receipts (`Ok(None)` for one
/// without). A driving artifact's stamp is read and checked first (a build whose output is not
/// this pin's is refused, not receipted), and its `model_type`, `image_history_pipeline`,
/// `execution_device` and `warp_device` are the stamp's; a file without a stamp (the DM set)
/// has empty ones.
pub fn receipt_for_build(
    b: &Built<'_>,
    contract: &Contract,
    pin: &GitCommit,
) -> std::result::Result<Option<BuildReceipt>, LoadProblem> {
    if !contract.build_receipts {
        return Ok(None);
    }
    let name = b
        .artifact
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let described = if b.stamped && contract.stamp.is_some() {
        let mut reader = chunker::open(b.artifact).map_err(bytes)?;
        let st =
            stamp::read_stamp(&mut reader, &StampLimits::default()).map_err(LoadProblem::Stamp)?;
        if let Some(v) = b.version {
            stamp::check_stamp(&name, &st, contract, pin, v).map_err(LoadProblem::StampRefused)?;
        }
        let required = |key: &str| {
            st.str(key)
                .map(str::to_string)
                .ok_or_else(|| LoadProblem::Bytes {
                    reason: format!("{name}: its stamp has no {key:?} string for the receipt"),
                })
        };
        (
            required("model_type")?,
            required("image_history_pipeline")?,
            required("execution_device")?,
            required("warp_device")?,
        )
    } else {
        Default::default()
    };
    finish(b, contract, pin, described).map(Some)
}

fn finish(
    b: &Built<'_>,
    contract: &Contract,
    pin: &GitCommit,
    (model_type, pipeline, execution, warp): (String, String, String, String),
) -> std::result::Result<BuildReceipt, LoadProblem> {
    let mut sources = Vec::new();
    for s in b.sources {
        let (d, _) = Sha256Digest::of_file(s).map_err(bytes)?;
        let n = s
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        sources.push((n, d));
    }
    let (artifact_sha256, artifact_size) = digest_of(b.artifact).map_err(bytes)?;
    Ok(BuildReceipt {
        model_id: b.model_id.to_string(),
        behavior_version: b.version.map(|v| v.to_string()),
        model_type,
        artifact_abi: contract
            .artifact_abi
            .unwrap_or(contract.artifact_format)
            .to_string(),
        compiler_revision: pin.clone(),
        source_sha256: receipt::SourceDigests(sources),
        artifact_sha256,
        artifact_size,
        execution_device: execution,
        warp_device: warp,
        image_history_pipeline: pipeline,
        camera_resolutions: crate::gate::CAMERA_RESOLUTIONS
            .iter()
            .map(|r| [r.width, r.height])
            .collect(),
    })
}

/// [`receipt_for_build`], written beside the artifact. Returns the receipt's path.
pub fn write_build_receipt(
    b: &Built<'_>,
    contract: &Contract,
    pin: &GitCommit,
) -> Result<Option<PathBuf>> {
    let problem = |problem| Error::NotLoadable {
        subject: format!("the build of {}", b.model_id),
        path: b.artifact.to_path_buf(),
        problem: Box::new(problem),
    };
    match receipt_for_build(b, contract, pin).map_err(problem)? {
        Some(r) => Ok(Some(write_receipt_beside(b.artifact, &r)?)),
        None => Ok(None),
    }
}

/// `validate`'s runtime gate, before the artifact is sent to the device: its stamp and receipt
/// against the contract of the generation whose pin `pin` is.
pub fn gate_validate(
    id: &ModelId,
    version: BehaviorVersion,
    artifact: &Path,
    pins: &manifest::PinTable,
    pin: &GitCommit,
) -> Result<&'static Contract> {
    let contract = contract_for_pin(pins, pin);
    let file = ShippedFile {
        subject: Subject::Model { id: id.clone() },
        path: artifact.to_path_buf(),
        stamped: true,
        version: Some(version),
        sha256: None,
        size: None,
    };
    check_files(&[file], contract, Some(pin))?;
    Ok(contract)
}

// ---- the latency bound --------------------------------------------------------------------

/// The p95 latency the device reported in a validation record, read where the contract's
/// validator writes it (`validate` keeps the device's report unchanged in its record as its
/// verdict); `None` when it reported none, or the contract has no latency report.
pub fn reported_p95(rec: &crate::gate::ValidationRecord, contract: &Contract) -> Option<f64> {
    contract.validation_latency?.p95_of(&rec.verdict)
}

/// The latency bound `validate` gives the device validator under `contract`.
pub fn latency_bound(contract: &Contract) -> Option<compiler_remote::LatencyBound> {
    Some(compiler_remote::LatencyBound {
        flag: contract.validation_latency?.bound_flag,
        ms: contract.validation_p95_ms?,
    })
}

/// Why a validation does not let a model ship under its contract.
#[derive(Debug, Clone, PartialEq)]
pub enum ValidationProblem {
    /// No record of the bytes that ship (the coverage gate names what to run).
    NoRecord,
    /// The device reported no p95 latency, and the contract bounds it.
    NoLatency { bound_ms: u32 },
    /// Over the contract's bound.
    OverBound { p95_ms: f64, bound_ms: u32 },
    /// Validation SHA, receipt SHA and artifact digest are not one value.
    Digests {
        validated: Sha256Digest,
        receipt: Option<Sha256Digest>,
        artifact: Sha256Digest,
    },
}

/// The decision, pure: a contract with a latency bound needs the validation of exactly the
/// bytes that ship (validation SHA = receipt SHA = artifact digest) with a reported p95 within
/// the bound. A contract without a bound (v25) asks nothing here.
pub fn decide_validation(
    contract: &Contract,
    artifact: &Sha256Digest,
    receipt: Option<&Sha256Digest>,
    validated: Option<(&Sha256Digest, Option<f64>)>,
) -> std::result::Result<(), ValidationProblem> {
    let Some(bound_ms) = contract.validation_p95_ms else {
        return Ok(());
    };
    let Some((validated, p95)) = validated else {
        return Err(ValidationProblem::NoRecord);
    };
    let receipt_differs = contract.build_receipts && receipt != Some(artifact);
    if validated != artifact || receipt_differs {
        return Err(ValidationProblem::Digests {
            validated: *validated,
            receipt: receipt.copied(),
            artifact: *artifact,
        });
    }
    match p95 {
        None => Err(ValidationProblem::NoLatency { bound_ms }),
        Some(p) if p > f64::from(bound_ms) => Err(ValidationProblem::OverBound {
            p95_ms: p,
            bound_ms,
        }),
        Some(_) => Ok(()),
    }
}

/// Publish's latency gate over the workspace's validation records: every model the manifest
/// lists, against its contract's bound, the receipt beside its artifact and its digest.
pub fn gate_validation(
    manifest: &Manifest,
    artifacts: &Path,
    workspace: &crate::Workspace,
    contract: &Contract,
) -> Result<()> {
    if contract.validation_p95_ms.is_none() {
        return Ok(());
    }
    let records = crate::records::load(workspace)?;
    for e in manifest.models() {
        let Some(artifact) = e.artifact_sha256() else {
            continue;
        };
        let path = artifacts
            .join(e.id().as_str())
            .join(receipt::receipt_file_name(e.file_name().as_str()));
        let receipt = read_receipt_file(&path).ok().map(|r| r.artifact_sha256);
        let rec = records
            .validations
            .iter()
            .filter(|r| &r.model == e.id() && r.artifact_sha256 == artifact)
            .max_by_key(|r| r.checked_at);
        let record = workspace.validation(e.id());
        decide_validation(
            contract,
            &artifact,
            receipt.as_ref(),
            rec.map(|r| (&r.artifact_sha256, reported_p95(r, contract))),
        )
        .map_err(|p| match p {
            ValidationProblem::OverBound { p95_ms, bound_ms } => Error::LatencyBound {
                model: e.id().clone(),
                p95_ms,
                bound_ms,
                contract: contract.name,
                record: record.clone(),
            },
            other => Error::ValidationBinding {
                model: e.id().clone(),
                problem: match other {
                    ValidationProblem::NoRecord => format!(
                        "no device validation of the artifact that ships ({artifact})"
                    ),
                    ValidationProblem::NoLatency { bound_ms } => format!(
                        "the device validation reports no p95 latency for every camera ({}); the {} contract bounds it at {bound_ms} ms",
                        contract.validation_latency.map_or(String::new(), |l| format!(
                            "\"{}\"[].\"{}\".\"{}\"",
                            l.cameras_key, l.timing_key, l.p95_key
                        )),
                        contract.name
                    ),
                    ValidationProblem::Digests {
                        validated,
                        receipt,
                        artifact,
                    } => format!(
                        "validation SHA {validated}, receipt SHA {}, artifact digest {artifact}: they must be one value",
                        receipt.map_or_else(|| "(no receipt)".to_string(), |r| r.to_string())
                    ),
                    ValidationProblem::OverBound { .. } => unreachable!("handled above"),
                },
                record: record.clone(),
            },
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use manifest::ContractName;

    fn d(c: char) -> Sha256Digest {
        c.to_string().repeat(64).parse().unwrap()
    }

    /// The latency decision for v25 (no bound) and the v26 contract (which a made-up v27 runs
    /// too: the row is the same).
    #[test]
    fn decide_validation_table() {
        let v25 = ContractName::V25.contract();
        let v26 = ContractName::V26.contract();
        let (a, b) = (d('a'), d('b'));
        type Case<'a> = (
            &'a str,
            &'a Contract,
            Option<&'a Sha256Digest>,
            Option<(&'a Sha256Digest, Option<f64>)>,
            std::result::Result<(), ValidationProblem>,
        );
        let cases: Vec<Case<'_>> = vec![
            ("v25 asks nothing", v25, None, None, Ok(())),
            ("v25 over 50 ms", v25, None, Some((&a, Some(500.0))), Ok(())),
            ("v26 within", v26, Some(&a), Some((&a, Some(49.9))), Ok(())),
            (
                "v26 at the bound",
                v26,
                Some(&a),
                Some((&a, Some(50.0))),
                Ok(()),
            ),
            (
                "v26 over",
                v26,
                Some(&a),
                Some((&a, Some(50.1))),
                Err(ValidationProblem::OverBound {
                    p95_ms: 50.1,
                    bound_ms: 50,
                }),
            ),
            (
                "v26 no latency",
                v26,
                Some(&a),
                Some((&a, None)),
                Err(ValidationProblem::NoLatency { bound_ms: 50 }),
            ),
            (
                "v26 no record",
                v26,
                Some(&a),
                None,
                Err(ValidationProblem::NoRecord),
            ),
            (
                "v26 validated other bytes",
                v26,
                Some(&a),
                Some((&b, Some(10.0))),
                Err(ValidationProblem::Digests {
                    validated: b,
                    receipt: Some(a),
                    artifact: a,
                }),
            ),
            (
                "v26 receipt of other bytes",
                v26,
                Some(&b),
                Some((&a, Some(10.0))),
                Err(ValidationProblem::Digests {
                    validated: a,
                    receipt: Some(b),
                    artifact: a,
                }),
            ),
            (
                "v26 no receipt",
                v26,
                None,
                Some((&a, Some(10.0))),
                Err(ValidationProblem::Digests {
                    validated: a,
                    receipt: None,
                    artifact: a,
                }),
            ),
        ];
        for (what, contract, receipt, validated, want) in cases {
            assert_eq!(
                decide_validation(contract, &a, receipt, validated),
                want,
                "{what}"
            );
        }
    }

    /// A DM file's receipt (no stamp) and a driving artifact's (from its stamp), under v26's
    /// contract; nothing under v25; a foreign stamp is refused, not receipted.
    #[test]
    fn receipts_for_builds() {
        let t = tempfile::tempdir().unwrap();
        let pin: GitCommit = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf".parse().unwrap();
        let source = t.path().join("dmonitoring_model.onnx");
        std::fs::write(&source, b"onnx").unwrap();
        let dm = t.path().join("dm_warp_1928x1208_tinygrad.pkl");
        std::fs::write(&dm, b"dm bytes").unwrap();
        let sources = [source];
        let built = Built {
            model_id: "dm_warp_1928x1208_tinygrad",
            version: None,
            artifact: &dm,
            sources: &sources,
            stamped: false,
        };
        let v25 = ContractName::V25.contract();
        let v26 = ContractName::V26.contract();
        assert_eq!(receipt_for_build(&built, v25, &pin), Ok(None));
        let r = receipt_for_build(&built, v26, &pin).unwrap().unwrap();
        assert_eq!(r.artifact_sha256, Sha256Digest::of_bytes(b"dm bytes"));
        assert_eq!((r.artifact_size, r.behavior_version.as_deref()), (8, None));
        assert_eq!(r.compiler_revision, pin);
        assert_eq!(r.source_sha256.0[0].0, "dmonitoring_model.onnx");
        let path = write_build_receipt(&built, v26, &pin).unwrap().unwrap();
        assert!(path.ends_with("dm_warp_1928x1208_tinygrad.build.json"));
        assert_eq!(read_receipt_file(&path).unwrap(), r);
        // A driving artifact: its stamp must be this pin's.
        let stamp = |rev: &str| {
            let mut p = vec![0x80, 5, b'}', b'('];
            for (k, v) in [
                ("artifact_abi", "tinygrad_single_v1_arena"),
                ("compiler_revision", rev),
                ("behavior_version", "v12"),
                ("model_type", "vision_policy"),
                ("image_history_pipeline", "warp"),
                ("execution_device", "QCOM"),
                ("warp_device", "QCOM"),
            ] {
                for x in [k, v] {
                    p.push(0x8c);
                    p.push(x.len() as u8);
                    p.extend_from_slice(x.as_bytes());
                }
            }
            p.extend_from_slice(&[0x8c, 14]);
            p.extend_from_slice(b"format_version");
            p.extend_from_slice(&[b'K', 1, b'u', b'.']);
            p
        };
        let model = t.path().join("m_driving_tinygrad.pkl");
        let driving = Built {
            model_id: "m",
            version: Some(BehaviorVersion::new(12)),
            artifact: &model,
            sources: &sources,
            stamped: true,
        };
        std::fs::write(&model, stamp(pin.as_str())).unwrap();
        let r = receipt_for_build(&driving, v26, &pin).unwrap().unwrap();
        assert_eq!(
            (r.model_type.as_str(), r.image_history_pipeline.as_str()),
            ("vision_policy", "warp")
        );
        std::fs::write(&model, stamp(&"1".repeat(40))).unwrap();
        assert!(matches!(
            receipt_for_build(&driving, v26, &pin),
            Err(LoadProblem::StampRefused(_))
        ));
    }

    #[test]
    fn contract_of_a_pin() {
        let mut pins = manifest::PinTable::builtin();
        let v25_pin = manifest::layout::current_tinygrad_commit();
        assert_eq!(contract_for_pin(&pins, &v25_pin).name, ContractName::V25);
        let p26: GitCommit = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf".parse().unwrap();
        let p27: GitCommit = "2".repeat(40).parse().unwrap();
        pins.merge_json(
            format!(r#"{{"v26": {{"tinygrad": "{p26}", "contract": "v26"}}, "v27": "{p27}"}}"#)
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(contract_for_pin(&pins, &p26).name, ContractName::V26);
        assert_eq!(contract_for_pin(&pins, &p27).name, ContractName::V26);
        let unknown: GitCommit = "3".repeat(40).parse().unwrap();
        assert_eq!(contract_for_pin(&pins, &unknown).name, ContractName::V25);
    }
}
