//! `release-cli validate`'s records and defaults: where a device validation reads the artifact
//! and writes its record and log (from the flags, else the workspace), the validation record
//! made of the device's verdict, and the check record of `validate --check` (docs/release.md,
//! "Validate"). The run on the device itself is `compiler_remote`'s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use chunker::Sha256Digest;

use manifest::{BehaviorVersion, GitCommit, ModelId, UnixSeconds};

use crate::gate::{CAMERA_RESOLUTIONS, CameraResolution, CheckKind, CheckRecord, ValidationRecord};
use crate::{Error, Result, Workspace};

/// What `validate --model ID` was given.
#[derive(Debug, Clone)]
pub struct ValidateFlags<'a> {
    pub model: &'a ModelId,
    pub version: Option<BehaviorVersion>,
    pub artifact: Option<&'a Path>,
    pub record: Option<&'a Path>,
    pub log: Option<&'a Path>,
    pub workspace: Option<&'a Workspace>,
}

/// What a validation checks and where it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidateTargets {
    pub version: BehaviorVersion,
    pub artifact: PathBuf,
    pub record: PathBuf,
    pub log: PathBuf,
}

fn input(problem: impl Into<String>) -> Error {
    Error::ValidateInput {
        problem: problem.into(),
    }
}

/// Each flag, else the workspace's place for it: the version its build record names, the
/// artifact in `ready/<id>/`, the record `results/<id>.validation.json`, the log
/// `logs/<id>.validate.log`. Without a workspace the record is `<id>.validation.json` and the
/// log `./logs/<id>.validate.log`; the version and the artifact must be given.
pub fn targets(f: &ValidateFlags<'_>) -> Result<ValidateTargets> {
    let (id, ws) = (f.model, f.workspace);
    let version = match (f.version, ws) {
        (Some(v), _) => v,
        (None, Some(ws)) => crate::rebuild::recorded_version(ws, id)?,
        (None, None) => {
            return Err(input(
                "validate needs --version vN, or --workspace DIR with a recorded build",
            ));
        }
    };
    let artifact = match (f.artifact, ws) {
        (Some(a), _) => a.to_path_buf(),
        (None, Some(ws)) => ws.ready_artifact(id),
        (None, None) => return Err(input("validate needs --artifact PATH or --workspace DIR")),
    };
    let record = match (f.record, ws) {
        (Some(r), _) => r.to_path_buf(),
        (None, Some(ws)) => ws.validation(id),
        (None, None) => PathBuf::from(format!("{id}.validation.json")),
    };
    let log = match f.log {
        Some(l) => l.to_path_buf(),
        None => ws
            .cloned()
            .unwrap_or_else(|| Workspace::new("."))
            .validate_log(id),
    };
    Ok(ValidateTargets {
        version,
        artifact,
        record,
        log,
    })
}

/// The device job of `validate --model ID` (and `rebuild --validate`) for the chunk set at
/// `artifact`, after the runtime gate (its stamp and receipt against the contract of `pin`'s
/// generation), with that contract's latency bound; and the contract.
pub struct DeviceValidation<'a> {
    pub id: &'a ModelId,
    pub version: BehaviorVersion,
    pub artifact: &'a Path,
    pub log: &'a Path,
    pub models_dir: &'a compiler_remote::RemotePath,
    pub python: &'a str,
}

impl DeviceValidation<'_> {
    /// The job, once the runtime gate passed, and the contract of `pin`'s generation.
    pub fn job(
        &self,
        pins: &manifest::PinTable,
        pin: &GitCommit,
    ) -> Result<(compiler_remote::ValidateJob, &'static manifest::Contract)> {
        let contract =
            crate::loadable::gate_validate(self.id, self.version, self.artifact, pins, pin)?;
        let job = compiler_remote::ValidateJob {
            id: self.id.clone(),
            version: self.version,
            artifact: self.artifact.to_path_buf(),
            models_dir: self.models_dir.clone(),
            python: self.python.to_string(),
            log: self.log.to_path_buf(),
            // The contract's latency bound, given to the validator as upstream's rebuild does.
            latency_bound: crate::loadable::latency_bound(contract),
        };
        Ok((job, contract))
    }
}

/// The device's verdict written as the validation record at `record` (what the publish gate
/// reads; per camera resolution, the device's own JSON kept unchanged), and whether it passes:
/// every resolution passed and, where `contract` bounds the p95 latency, the device reported
/// one within the bound.
pub fn record_verdict(
    id: &ModelId,
    version: BehaviorVersion,
    pin: GitCommit,
    verdict: compiler_remote::Verdict,
    log: PathBuf,
    record: &Path,
    contract: &manifest::Contract,
) -> Result<(ValidationRecord, bool)> {
    let rec = ValidationRecord {
        model: id.clone(),
        version,
        resolutions: crate::gate::read_verdict(&verdict.verdict, &verdict.artifact_sha256),
        artifact_sha256: verdict.artifact_sha256,
        tinygrad_commit: pin,
        checked_at: UnixSeconds::now(),
        verdict: verdict.verdict,
        log,
    };
    crate::records::write(record, &rec)?;
    let passed = passes(&rec, contract);
    Ok((rec, passed))
}

/// Whether `rec` lets its model ship under `contract`: every resolution passed, and a p95
/// latency within the contract's bound when it has one.
pub fn passes(rec: &ValidationRecord, contract: &manifest::Contract) -> bool {
    let p95 = crate::loadable::reported_p95(rec, contract);
    rec.passed()
        && match (contract.validation_p95_ms, p95) {
            (Some(bound), Some(p)) => p <= f64::from(bound),
            (Some(_), None) => false,
            (None, _) => true,
        }
}

/// What `validate --check KIND` was given.
#[derive(Debug, Clone)]
pub struct CheckFlags<'a> {
    pub kind: CheckKind,
    pub resolution: Option<CameraResolution>,
    pub model: Option<&'a ModelId>,
    pub passed: bool,
    pub failed: bool,
    pub note: Option<&'a str>,
    /// `--by`, else the user's name (`USER`).
    pub by: Option<String>,
    pub record: Option<&'a Path>,
    pub workspace: Option<&'a Workspace>,
}

/// The check the release engineer made on the device, and where its record goes: one of
/// `--passed`/`--failed`, `--resolution` exactly for a per-resolution check (one of
/// [`CAMERA_RESOLUTIONS`]), a non-blank `--note`, who checked, and `--record` or the
/// workspace's place. `pin` (the tinygrad the check was made with) and the artifacts it was
/// made on ([`CheckedOn`]) are looked up only once the flags are accepted.
pub fn check_record(
    f: &CheckFlags<'_>,
    pin: impl FnOnce() -> std::result::Result<GitCommit, Box<crate::Error>>,
    artifacts: CheckedOn,
) -> Result<(PathBuf, CheckRecord)> {
    let kind = f.kind;
    if f.passed == f.failed {
        return Err(input(format!(
            "--check {kind} needs --passed or --failed: what you saw on the device"
        )));
    }
    let [a, b] = CAMERA_RESOLUTIONS;
    match (kind.per_resolution(), f.resolution) {
        (true, None) => {
            return Err(input(format!(
                "--check {kind} is made per camera resolution: add --resolution {a} or {b}"
            )));
        }
        (false, Some(r)) => {
            return Err(input(format!(
                "--check {kind} is one check per generation: drop --resolution {r}"
            )));
        }
        (true, Some(r)) if !CAMERA_RESOLUTIONS.contains(&r) => {
            return Err(input(format!(
                "--resolution {r}: the camera resolutions are {a} and {b}"
            )));
        }
        _ => {}
    }
    let note = f.note.unwrap_or_default();
    if note.trim().is_empty() {
        return Err(input(format!(
            "--check {kind} needs --note TEXT: what you observed"
        )));
    }
    let checked_by = match &f.by {
        Some(b) if !b.trim().is_empty() => b.clone(),
        _ => return Err(input("--check needs --by NAME (USER is not set)")),
    };
    let path = match (f.record, f.workspace) {
        (Some(r), _) => r.to_path_buf(),
        (None, Some(ws)) => ws.check(kind, f.resolution),
        (None, None) => {
            return Err(input(format!(
                "--check {kind} needs --workspace DIR (or --record FILE)"
            )));
        }
    };
    let record = CheckRecord {
        check: kind,
        resolution: f.resolution,
        model: f.model.cloned(),
        passed: f.passed,
        tinygrad_commit: pin().map_err(|e| *e)?,
        checked_by,
        checked_at: UnixSeconds::now(),
        note: note.to_string(),
        artifacts: match artifacts {
            CheckedOn::Ready => ready_digests(f.workspace, f.model)?,
            CheckedOn::Given(digests) => digests,
        },
    };
    Ok((path, record))
}

/// The artifacts a device check was made on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckedOn {
    /// The workspace's built artifacts ([`ready_digests`] over `--workspace` and `--model`):
    /// what `validate --check` records.
    Ready,
    /// These digests, as given.
    Given(BTreeMap<ModelId, Sha256Digest>),
}

/// The artifacts a device check is made on: the SHA-256 in each `ready/<id>/<id>_driving_
/// tinygrad.pkl.sha256` of `workspace` (only `model`'s with `--model`), each read size-capped
/// and regular-file-only. Refused without a workspace, or when it holds no built artifact: a
/// check that names no artifact could never go stale.
pub fn ready_digests(
    workspace: Option<&Workspace>,
    model: Option<&ModelId>,
) -> Result<BTreeMap<ModelId, Sha256Digest>> {
    let Some(ws) = workspace else {
        return Err(input(
            "--check needs --workspace DIR: the check is bound to the artifacts in its ready/ \
             (a rebuild of every one of them makes it stale)",
        ));
    };
    let ids: Vec<ModelId> = match model {
        Some(id) => vec![id.clone()],
        None => {
            let mut ids = Vec::new();
            if let Ok(entries) = fs_err::read_dir(ws.ready()) {
                for e in entries.take(crate::records::MAX_RESULTS_ENTRIES) {
                    let e = e?;
                    if e.file_type()?.is_dir()
                        && let Some(id) = e.file_name().to_str().and_then(|n| n.parse().ok())
                    {
                        ids.push(id);
                    }
                }
            }
            ids
        }
    };
    let mut digests = BTreeMap::new();
    for id in ids {
        let path = ws.ready_artifact(&id);
        let sidecar = path.with_file_name(chunker::sidecar_name(
            &path.file_name().unwrap_or_default().to_string_lossy(),
        ));
        match chunker::bounded::read_capped_existing(&sidecar, chunker::SMALL_FILE_LIMIT) {
            Ok(bytes) => {
                digests.insert(id, chunker::parse_sidecar(&bytes, &sidecar)?);
            }
            Err(e) if model.is_some() => {
                return Err(input(format!(
                    "--model {id}: {e}; the check is bound to the artifact it was made on \
                     (build it into {} first)",
                    ws.ready_model(&id).display()
                )));
            }
            // A ready/ directory without a driving chunk set (a variant only): not checked on.
            Err(_) => {}
        }
    }
    if digests.is_empty() {
        return Err(input(format!(
            "no built artifact in {} (no <id>/<id>_driving_tinygrad.pkl.sha256): the check is \
             bound to the artifacts it was made on; run `release-cli rebuild` first",
            ws.ready().display()
        )));
    }
    Ok(digests)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both generations every rule is tested for: v25's pin and a made-up v26 pin.
    const PINS: [&str; 2] = [
        "e837e367aac9e1a66e689f4f32ce20ca9367df13",
        "0123456789abcdef0123456789abcdef01234567",
    ];

    fn id() -> ModelId {
        "sc23".parse().unwrap()
    }

    fn problem(r: Result<impl std::fmt::Debug>) -> String {
        match r {
            Err(Error::ValidateInput { problem }) => problem,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn targets_are_the_flags_else_the_workspace_places() {
        let t = tempfile::tempdir().unwrap();
        let ws = Workspace::new(t.path());
        let id = id();
        let v: BehaviorVersion = "v8".parse().unwrap();
        let flags = |version, artifact, workspace| ValidateFlags {
            model: &id,
            version,
            artifact,
            record: None,
            log: None,
            workspace,
        };
        // Everything from the workspace but the version.
        let got = targets(&flags(Some(v), None, Some(&ws))).unwrap();
        assert_eq!(
            got,
            ValidateTargets {
                version: v,
                artifact: ws.ready_artifact(&id),
                record: ws.validation(&id),
                log: ws.validate_log(&id),
            }
        );
        // Without a workspace: the version and artifact are required, the record and log have
        // places of their own.
        let a = Path::new("/x/sc23_driving_tinygrad.pkl");
        let got = targets(&flags(Some(v), Some(a), None)).unwrap();
        assert_eq!(got.record, PathBuf::from("sc23.validation.json"));
        assert_eq!(got.log, PathBuf::from("./logs/sc23.validate.log"));
        assert_eq!(
            problem(targets(&flags(None, Some(a), None))),
            "validate needs --version vN, or --workspace DIR with a recorded build"
        );
        assert_eq!(
            problem(targets(&flags(Some(v), None, None))),
            "validate needs --artifact PATH or --workspace DIR"
        );
        // A workspace without a build record of the model names the record it looked for.
        match targets(&flags(None, None, Some(&ws))) {
            Err(Error::RecordMissing { path }) => assert_eq!(path, ws.build_record(&id)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_check_record_needs_its_flags_before_the_pin_is_asked_for() {
        let ws = Workspace::new("/w");
        let [a, b] = CAMERA_RESOLUTIONS;
        let odd: CameraResolution = "640x480".parse().unwrap();
        for pin in PINS {
            let base = CheckFlags {
                kind: CheckKind::DriverState,
                resolution: Some(a),
                model: None,
                passed: true,
                failed: false,
                note: Some("faces tracked"),
                by: Some("dev".into()),
                record: None,
                workspace: Some(&ws),
            };
            type Edit = fn(&mut CheckFlags<'_>);
            let refusals: [(Edit, String); 8] = [
                (
                    |f| f.passed = false,
                    "--check driver-state needs --passed or --failed: what you saw on the device"
                        .into(),
                ),
                (
                    |f| f.failed = true,
                    "--check driver-state needs --passed or --failed: what you saw on the device"
                        .into(),
                ),
                (
                    |f| f.resolution = None,
                    format!(
                        "--check driver-state is made per camera resolution: add --resolution {a} or {b}"
                    ),
                ),
                (
                    |f| f.kind = CheckKind::ModelV2,
                    format!("--check model-v2 is one check per generation: drop --resolution {a}"),
                ),
                (
                    |f| f.resolution = Some("640x480".parse().unwrap()),
                    format!("--resolution {odd}: the camera resolutions are {a} and {b}"),
                ),
                (
                    |f| f.note = Some(" \t"),
                    "--check driver-state needs --note TEXT: what you observed".into(),
                ),
                (
                    |f| f.by = None,
                    "--check needs --by NAME (USER is not set)".into(),
                ),
                (
                    |f| f.workspace = None,
                    "--check driver-state needs --workspace DIR (or --record FILE)".into(),
                ),
            ];
            for (edit, want) in refusals {
                let mut f = base.clone();
                edit(&mut f);
                // `Ready` over the workspace /w, which does not exist: the flags' refusal
                // comes before the artifacts are looked for.
                let got = check_record(
                    &f,
                    || panic!("the pin is asked for after the flags"),
                    CheckedOn::Ready,
                );
                assert_eq!(problem(got), want);
            }
            let pin: GitCommit = pin.parse().unwrap();
            let bound: BTreeMap<ModelId, Sha256Digest> = [(id(), Sha256Digest::of_bytes(b"built"))]
                .into_iter()
                .collect();
            let (path, rec) =
                check_record(&base, || Ok(pin.clone()), CheckedOn::Given(bound.clone())).unwrap();
            assert_eq!(
                path,
                PathBuf::from(format!("/w/results/driver-state.{a}.check.json"))
            );
            assert_eq!(
                (
                    rec.check,
                    rec.resolution,
                    rec.passed,
                    rec.tinygrad_commit,
                    rec.checked_by.as_str()
                ),
                (CheckKind::DriverState, Some(a), true, pin.clone(), "dev")
            );
            assert_eq!(rec.artifacts, bound);
            let mut g = base.clone();
            (g.kind, g.resolution, g.record) =
                (CheckKind::ModelV2, None, Some(Path::new("/r.json")));
            let (path, rec) =
                check_record(&g, || Ok(pin.clone()), CheckedOn::Given(bound.clone())).unwrap();
            assert_eq!(
                (path, rec.check),
                (PathBuf::from("/r.json"), CheckKind::ModelV2)
            );
        }
    }

    /// A check is bound to the digests in the workspace's `ready/` sidecars (only `--model`'s
    /// with it); without a workspace or a built artifact it is refused, naming what is missing.
    #[test]
    fn a_check_is_bound_to_the_ready_artifacts() {
        let t = tempfile::tempdir().unwrap();
        let ws = Workspace::new(t.path());
        let e = ready_digests(None, None).unwrap_err();
        assert!(
            e.to_string().contains("--check needs --workspace DIR"),
            "{e}"
        );
        let e = ready_digests(Some(&ws), None).unwrap_err();
        assert!(e.to_string().contains("no built artifact in"), "{e}");
        let put = |id: &str, d: &Sha256Digest| {
            let id: ModelId = id.parse().unwrap();
            let a = ws.ready_artifact(&id);
            std::fs::create_dir_all(a.parent().unwrap()).unwrap();
            let name = a.file_name().unwrap().to_string_lossy().into_owned();
            std::fs::write(
                a.with_file_name(chunker::sidecar_name(&name)),
                chunker::format_sidecar(d, &name),
            )
            .unwrap();
        };
        let (d8, d11) = (
            Sha256Digest::of_bytes(b"a8"),
            Sha256Digest::of_bytes(b"a11"),
        );
        put("a8", &d8);
        put("a11", &d11);
        // A directory with only a variant is not a driving artifact the check ran on.
        std::fs::create_dir_all(ws.ready().join("gpu16")).unwrap();
        let all = ready_digests(Some(&ws), None).unwrap();
        let want: Vec<(String, Sha256Digest)> = vec![("a11".into(), d11), ("a8".into(), d8)];
        let got: Vec<(String, Sha256Digest)> =
            all.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        assert_eq!(got, want);
        let a8: ModelId = "a8".parse().unwrap();
        let one = ready_digests(Some(&ws), Some(&a8)).unwrap();
        assert_eq!(one.into_iter().collect::<Vec<_>>(), vec![(a8, d8)]);
        let gpu: ModelId = "gpu16".parse().unwrap();
        let e = ready_digests(Some(&ws), Some(&gpu)).unwrap_err();
        assert!(e.to_string().contains("--model gpu16"), "{e}");
        // A FIFO where the sidecar should be is refused, not waited on.
        let fifo = ws.ready().join("gpu16/gpu16_driving_tinygrad.pkl.sha256");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let e = ready_digests(Some(&ws), Some(&gpu)).unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
    }
}
