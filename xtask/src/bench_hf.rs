//! `--only hf`: publishing to the Hub through the real, pinned `hf` CLI (huggingface_hub 2.4.0
//! with hf-xet 1.8.0, `.ci/run`'s venv): our publish (the library's `HfBucketStore` and
//! `publish`, through the `bench_hf_publish` example: the model's files, then the manifest)
//! against the same CLI uploading the same files alone (`hf buckets cp FILE
//! hf://buckets/B/models/<gen>/<id>/FILE`, one command per file). Each run starts a fresh Hub emulator
//! (`hub-emulator`, everything in memory) whose uplink (request bodies of all connections
//! together) is capped at [`UPLINK`], as one release machine's upload link is.

use std::cell::RefCell;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::bench::{RUNS, Row, quiet, secs};
use crate::bench_device::Server;
use crate::util::{self, best_of};

pub(crate) const BUCKET: &str = "StarPilot-Driving/StarPilot-Resources";
/// The release machine's uplink in the bench.
const UPLINK: u64 = 24 << 20;
/// Where `.ci/run` keeps the pinned CLI's venv.
const CI_VENV: &str = ".cache/starpilot-ci/hf-venv-2.4.0-xet-1.8.0/bin/hf";

/// The pinned `hf`: `$STARPILOT_HF_CLI`, else `.ci/run`'s venv under `$HOME`.
pub(crate) fn hf_cli() -> Result<PathBuf, String> {
    let cli = std::env::var_os("STARPILOT_HF_CLI")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(CI_VENV)))
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "the hf row needs the pinned hf CLI: set STARPILOT_HF_CLI, or make ~/{} \
                 (python3 -m venv V && V/bin/pip install huggingface_hub==2.4.0 hf-xet==1.8.0; \
                 .ci/run does it)",
                CI_VENV.trim_end_matches("/bin/hf")
            )
        })?;
    Ok(cli)
}

/// A fresh emulator with the uplink cap `uplink` (bytes/s) and the bucket: it, `HF_ENDPOINT`
/// and the token.
pub(crate) fn start_hub(bin: &Path, uplink: u64) -> Result<(Server, String, String), String> {
    let mut child = Command::new(bin)
        .args(["--quiet", "--uplink-rate", &uplink.to_string(), BUCKET])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let stdout = child.stdout.take().expect("piped");
    let server = Server(child);
    let mut lines = BufReader::new(stdout).lines();
    let mut value = |key: &str| -> Result<String, String> {
        let line = lines
            .next()
            .ok_or("hub-emulator printed nothing")?
            .map_err(|e| e.to_string())?;
        line.strip_prefix(&format!("{key}="))
            .map(str::to_string)
            .ok_or_else(|| format!("hub-emulator printed {line:?}, not {key}=…"))
    };
    let endpoint = value("HF_ENDPOINT")?;
    let token = value("HF_TOKEN")?;
    Ok((server, endpoint, token))
}

/// The hf row, over the chunk sets in `artifacts` (one generation's `<id>/` directories).
pub fn rows(work: &Path, artifacts: &Path) -> Result<Vec<Row>, String> {
    let cli = hf_cli()?;
    let release = util::target_dir().join("release");
    let example = release.join("examples/bench_hf_publish");
    let hub_bin = release.join("hub-emulator");
    let generation = artifacts
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or("the artifacts directory is named after its generation")?;
    let ids: Vec<String> = fs::read_dir(artifacts)
        .map_err(|e| format!("{}: {e}", artifacts.display()))?
        .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
        .collect();
    let [id] = &ids[..] else {
        return Err(format!(
            "the hf row publishes one model, {} has {ids:?}",
            artifacts.display()
        ));
    };
    let model_dir = artifacts.join(id);
    let bytes: u64 = fs::read_dir(&model_dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    let home = work.join("hf-home");
    let hub: RefCell<Option<(Server, String, String)>> = RefCell::new(None);
    let fresh = || {
        hub.replace(None);
        let _ = fs::remove_dir_all(&home);
        let _ = fs::create_dir_all(&home);
        hub.replace(Some(
            start_hub(&hub_bin, UPLINK).expect("the Hub emulator starts"),
        ));
    };
    let env = |c: &mut Command| {
        let h = hub.borrow();
        let (_, endpoint, token) = h.as_ref().expect("started");
        c.env("HF_ENDPOINT", endpoint)
            .env("HF_TOKEN", token)
            .env("HF_HOME", &home)
            .env("HF_HUB_DISABLE_UPDATE_CHECK", "1")
            .env("HF_HUB_DISABLE_TELEMETRY", "1")
            .env("HF_HUB_DISABLE_PROGRESS_BARS", "1");
    };

    eprintln!(
        "bench: hf buckets cp of {} MiB, file by file (the pinned hf CLI alone, uplink {} MiB/s)",
        bytes >> 20,
        UPLINK >> 20
    );
    // One `hf buckets cp` per file, as a person uploads them (`hf buckets sync` needs listing
    // endpoints the emulator does not answer).
    let alone = best_of(RUNS, &fresh, || {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(r#"set -e; for f in "$2"/*; do "$1" buckets cp "$f" "$3/$(basename "$f")" --format json; done"#)
            .arg("sh")
            .arg(&cli)
            .arg(&model_dir)
            .arg(format!("hf://buckets/{BUCKET}/models/{generation}/{id}"));
        env(&mut c);
        quiet(&mut c)
    })?;
    eprintln!("bench: our publish of the same files through the same CLI");
    let ours = best_of(RUNS, &fresh, || {
        let mut c = Command::new(&example);
        c.arg(BUCKET).arg(artifacts).env("HF_CLI", &cli);
        env(&mut c);
        quiet(&mut c)
    })?;
    hub.replace(None);
    let _ = fs::remove_dir_all(&home);
    let ratio = alone.wall.as_secs_f64() / ours.wall.as_secs_f64();
    let mib_s = |m: util::Measured| (bytes >> 20) as f64 / m.wall.as_secs_f64();
    Ok(vec![Row {
        name: "hf publish throughput / hf alone",
        ours: format!("{} ({:.0} MiB/s)", secs(ours), mib_s(ours)),
        anchor: format!(
            "{} ({:.0} MiB/s, hf buckets cp per file, uplink {} MiB/s)",
            secs(alone),
            mib_s(alone),
            UPLINK >> 20
        ),
        ratio,
        bar: ">= 0.9",
        pass: Some(ratio >= 0.9),
    }])
}
