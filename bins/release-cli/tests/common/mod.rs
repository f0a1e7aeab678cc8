//! Shared by the `release-cli` test binaries: run the real binary, read its output.
//! (Each test binary uses some of these, hence the `dead_code` allowance.)
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_release-cli");

/// The binary with an environment that does not depend on the developer's: no token for the
/// Hub, no replacement ssh config.
pub fn command() -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("HF_TOKEN").env_remove("STARPILOT_SSH_CONFIG");
    c
}

/// Run `release-cli ARGS`.
pub fn cli(args: &[&str]) -> Output {
    command().args(args).output().expect("run release-cli")
}

/// Run `release-cli ARGS` in `cwd`.
pub fn cli_in(args: &[&str], cwd: &Path) -> Output {
    command()
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run release-cli")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Write, in the real record format, a passing preflight, a passing validation at both camera
/// resolutions of every artifact `manifest` lists, and passing modelV2/driverStateV2 checks into
/// `<workspace>/results/`, all for the manifest's own pin: what a release engineer's workspace
/// holds after `preflight` and `validate`, for tests whose subject is publishing. Returns
/// `workspace`.
pub fn covering_records(workspace: &Path, manifest: &Path) -> std::path::PathBuf {
    use release::gate::{
        CAMERA_RESOLUTIONS, CheckKind, CheckRecord, CommandRun, PreflightRecord, REQUIRED_OUTPUTS,
        UtcTime, ValidationRecord, read_verdict,
    };
    use release::records;
    let m = manifest::Manifest::from_slice(&std::fs::read(manifest).unwrap()).unwrap();
    let pin = m
        .tinygrad_commit()
        .unwrap_or_else(manifest::layout::current_tinygrad_commit);
    let now = UtcTime::now();
    let preflight = PreflightRecord {
        openpilot: "/fixture/openpilot".into(),
        openpilot_commit: None,
        openpilot_dirty: None,
        tinygrad_commit: pin.clone(),
        commands: release::preflight::COMMANDS
            .iter()
            .map(|argv| CommandRun {
                argv: argv.iter().map(|s| s.to_string()).collect(),
                exit_code: Some(0),
                passed: true,
                started_at: now,
                duration_ms: 1,
            })
            .collect(),
        passed: true,
        finished_at: now,
        log: workspace.join("logs/preflight.log"),
    };
    records::write(&records::preflight_path(workspace), &preflight).unwrap();
    for e in m.models() {
        let (Some(sha), Some(version)) = (e.artifact_sha256(), e.version()) else {
            continue;
        };
        let finite: serde_json::Map<String, serde_json::Value> = REQUIRED_OUTPUTS
            .iter()
            .map(|o| (o.to_string(), true.into()))
            .collect();
        let resolutions: serde_json::Map<String, serde_json::Value> = CAMERA_RESOLUTIONS
            .iter()
            .map(|r| {
                (
                    r.to_string(),
                    serde_json::json!({"passed": true, "finite": finite}),
                )
            })
            .collect();
        let verdict = serde_json::json!({
            "model": e.id().as_str(), "version": version.to_string(), "passed": true,
            "artifact_sha256": sha.to_string(), "resolutions": resolutions,
            "fixture": "written by the test, not by a device"
        });
        let rec = ValidationRecord {
            model: e.id().clone(),
            version,
            resolutions: read_verdict(&verdict, &sha),
            artifact_sha256: sha,
            tinygrad_commit: pin.clone(),
            checked_at: now,
            verdict,
            log: workspace.join("logs/fixture.validate.log"),
        };
        assert!(rec.passed());
        records::write(&records::validation_path(workspace, e.id()), &rec).unwrap();
    }
    let checks = [
        (CheckKind::ModelV2, None),
        (CheckKind::DriverState, Some(CAMERA_RESOLUTIONS[0])),
        (CheckKind::DriverState, Some(CAMERA_RESOLUTIONS[1])),
    ];
    for (kind, res) in checks {
        let rec = CheckRecord {
            check: kind,
            resolution: res,
            model: None,
            passed: true,
            tinygrad_commit: pin.clone(),
            checked_by: "fixture".into(),
            checked_at: now,
            note: "written by the test".into(),
        };
        records::write(&records::check_path(workspace, kind, res), &rec).unwrap();
    }
    workspace.to_path_buf()
}
