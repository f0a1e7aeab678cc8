//! Shared by every `release-cli` test module: run the real binary, read its output, and make the
//! small release (one model, `pop223`, in 1000-byte chunks) most tests publish.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use serde_json::{Value, json};
use test_support::published::sha256_hex;

mod argv;
pub use argv::{publish_argv, strs};

pub const BIN: &str = env!("CARGO_BIN_EXE_release-cli");

/// The tinygrad commit v25 is pinned to.
pub const TG: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";

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
/// resolutions of every artifact `manifest` lists, passing modelV2/driverStateV2 checks and a
/// passing rehearsal of the manifest's bytes into `<workspace>/results/`, all for the manifest's
/// own pin: what a release engineer's workspace holds after `preflight`, `validate` and
/// `rehearse`, for tests whose subject is publishing (`rehearse_cli.rs` runs the real
/// rehearsal). Returns `workspace`.
pub fn covering_records(workspace: &Path, manifest: &Path) -> std::path::PathBuf {
    use manifest::UnixSeconds;
    use release::gate::{
        CAMERA_RESOLUTIONS, CheckKind, CheckRecord, CommandRun, PreflightRecord, REQUIRED_OUTPUTS,
        ValidationRecord, read_verdict,
    };
    use release::records;
    let m = manifest::Manifest::from_slice(&std::fs::read(manifest).unwrap()).unwrap();
    // The manifest's revision under the contract it names (v25 `tinygrad_commit`, v26
    // `compiler_revision`).
    let pin = m
        .own_revision()
        .unwrap_or_else(manifest::layout::current_tinygrad_commit);
    let now = UnixSeconds::now();
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
    records::write(&release::Workspace::new(workspace).preflight(), &preflight).unwrap();
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
            "cameras": [
                {"passed": true, "camera": [1928, 1208], "inference_ms": {"p95": 12.5}},
                {"passed": true, "camera": [1344, 760], "inference_ms": {"p95": 11.0}}
            ],
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
        records::write(&release::Workspace::new(workspace).validation(e.id()), &rec).unwrap();
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
            artifacts: m
                .models()
                .iter()
                .filter_map(|e| Some((e.id().clone(), e.artifact_sha256()?)))
                .collect(),
        };
        records::write(&release::Workspace::new(workspace).check(kind, res), &rec).unwrap();
    }
    let generation = m
        .generation()
        .unwrap_or(manifest::layout::CURRENT_GENERATION);
    let rehearsal = release::rehearse::RehearsalRecord {
        generation,
        previous_generation: generation.previous().unwrap(),
        manifest: manifest.to_path_buf(),
        manifest_sha256: release::rehearse::manifest_digest(&m),
        tinygrad_commit: Some(pin.clone()),
        openpilot: "/fixture/openpilot".into(),
        device_manager: "/fixture/device-modeld-manager".into(),
        device_args: vec![],
        selected: "pop223".parse().unwrap(),
        dropped: "retired-rehearsal".parse().unwrap(),
        checks: vec![],
        passed: true,
        finished_at: now,
        work_dir: workspace.join("rehearsal"),
    };
    records::write(
        &release::Workspace::new(workspace).rehearsal_record(),
        &rehearsal,
    )
    .unwrap();
    workspace.to_path_buf()
}

/// Requires the refusal of a check (exit 3); its message.
pub fn refused(o: &Output) -> String {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    err
}

/// A manifest entry for `data` as a chunk set of `chunks` chunks.
pub fn entry(id: &str, data: &[u8], chunks: u32) -> Value {
    json!({
        "id": id, "name": id, "version": "v15", "series": "OP Series", "released": "2025-06-01",
        "community_favorite": false, "artifact_format": "tinygrad_single_v1",
        "artifact_size": data.len(), "artifact_sha256": sha256_hex(data),
        "artifact_chunk_count": chunks, "uses_external_gpu": false
    })
}

/// `pop223`'s artifact `data` split by `release-cli chunk split` into 1000-byte chunks in
/// `dir/<out>`, and `dir/model_names_v25.json` listing it, as `manifest fmt` writes it. Returns
/// `dir/artifacts` and the manifest.
pub fn release_in(dir: &Path, data: &[u8], out: &str) -> (PathBuf, PathBuf) {
    let pkl = dir.join("build/pop223_driving_tinygrad.pkl");
    std::fs::create_dir_all(pkl.parent().unwrap()).unwrap();
    std::fs::write(&pkl, data).unwrap();
    let o = cli(&[
        "chunk",
        "split",
        pkl.to_str().unwrap(),
        "--out-dir",
        dir.join(out).to_str().unwrap(),
        "--chunk-size",
        "1000",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let count = data.len().div_ceil(1000) as u32;
    let raw = dir.join("raw.json");
    let doc = json!({"generation": "v25", "tinygrad_commit": TG,
        "models": [entry("pop223", data, count)]});
    std::fs::write(&raw, doc.to_string()).unwrap();
    let o = cli(&["manifest", "fmt", raw.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let manifest = dir.join("model_names_v25.json");
    std::fs::write(&manifest, &o.stdout).unwrap();
    (dir.join("artifacts"), manifest)
}

/// [`release_in`] with the layout `publish` expects: `dir/artifacts/pop223/`.
pub fn release(dir: &Path, data: &[u8]) -> (PathBuf, PathBuf) {
    release_in(dir, data, "artifacts/pop223")
}

/// A running `release-cli serve ARGS --addr 127.0.0.1:0`, killed when dropped.
pub struct Serving {
    child: Child,
    /// The first line it printed: the URL, or with `--json` the JSON document.
    pub first_line: String,
}

pub fn serve(args: &[&str]) -> Serving {
    let mut child = command()
        .arg("serve")
        .args(args)
        .args(["--addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first_line)
        .unwrap();
    Serving { child, first_line }
}

impl Serving {
    /// Send `signal` (`TERM`, `INT`) with kill(1) and wait for the server to end; its status.
    pub fn stop_with(&mut self, signal: &str) -> std::process::ExitStatus {
        let sent = Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal}");
        self.child.wait().unwrap()
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bare `GET path` to `addr` (`host:port`); the whole response as text.
pub fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    buf
}

/// Every file under `dir` (names relative to it, hidden temporaries included) with its content,
/// sorted: equal snapshots before and after a `--dry-run` mean it changed nothing.
pub fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if p.is_dir() {
                out.push((format!("{rel}/"), Vec::new()));
                walk(root, &p, out);
            } else {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}
