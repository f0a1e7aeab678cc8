//! Fallback rows (issue 25 item 2, issue 27 item 3): the time to a finished first `refresh`
//! of a device selecting a model, from a fresh device, when Hugging Face misbehaves and GitHub
//! is healthy: Hugging Face trickling 1 byte/s (everything under it, the manifest included),
//! silent after accepting each request, and alive but 100x slower than GitHub. The goals are
//! the device issue's: 90 s, 60 s, and GitHub serving the artifact (the origin server's body
//! byte counts per origin). The generation and its pin come from the pin table.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::bench::{Row, quiet, write_pseudo_random};
use crate::bench_device::{Server, entry, mkdirs, run_ok, sidecar_digest, spawn_server};
use crate::util;

const ID: &str = "fallbackbench";
const SIZE: u64 = 8 << 20;
const CHUNK: u64 = 45 << 20;
/// GitHub's rate per response in the 100x row, and Hugging Face's there (above the device's
/// 4 KiB/s minimum rate: alive, never given up for being below it).
const GH_RATE: u64 = 4 << 20;
const HF_SLOW_RATE: u64 = GH_RATE / 100;

struct Scenario {
    name: &'static str,
    faults: Vec<String>,
    /// Seconds to a finished refresh, when the row has a time goal.
    goal: Option<u64>,
}

pub fn rows(work: &Path) -> Result<Vec<Row>, String> {
    let release = util::target_dir().join("release");
    let cli = release.join("release-cli");
    let dmm = release.join("device-modeld-manager");
    let (generation, pin) = manifest::pins::PinTable::builtin()
        .iter()
        .last()
        .map(|(g, c)| (g.to_string(), c.to_string()))
        .ok_or("the pin table is empty")?;

    let root = work.join("fallback");
    let origin = root.join("origin");
    let hf = origin.join(format!("hf/models/{generation}/{ID}"));
    let gh = origin.join(format!("gh/{generation}/{ID}"));
    mkdirs(&hf)?;
    mkdirs(&gh)?;
    mkdirs(&origin.join("hf/manifests"))?;
    eprintln!(
        "bench: publishing a {} MiB model for the fallback rows",
        SIZE >> 20
    );
    let name = format!("{ID}_driving_tinygrad.pkl");
    let source = root.join(&name);
    write_pseudo_random(&source, SIZE)?;
    run_ok(
        Command::new(&cli)
            .args(["chunk", "split"])
            .arg(&source)
            .arg("--out-dir")
            .arg(&hf),
    )?;
    for e in fs::read_dir(&hf).map_err(|e| e.to_string())? {
        let e = e.map_err(|e| e.to_string())?;
        fs::copy(e.path(), gh.join(e.file_name())).map_err(|e| e.to_string())?;
    }
    let sha = sidecar_digest(&hf.join(format!("{name}.sha256")))?;
    let manifest = format!(
        "{{\n  \"models\": [\n{}\n  ]\n}}\n",
        entry(ID, SIZE, &sha, SIZE.div_ceil(CHUNK))
    );
    let file = format!("model_names_{generation}.json");
    for dir in [origin.join("hf/manifests"), origin.join("gh")] {
        fs::write(dir.join(&file), &manifest).map_err(|e| e.to_string())?;
    }
    let tree = root.join("openpilot/tinygrad_repo");
    mkdirs(&tree)?;
    fs::write(tree.join("TINYGRAD_COMMIT"), format!("{pin}\n")).map_err(|e| e.to_string())?;

    let scenarios = [
        Scenario {
            name: "fallback: HF trickling 1 B/s",
            faults: vec!["/hf/*=trickle:1000".into()],
            goal: Some(90),
        },
        Scenario {
            name: "fallback: HF silent after accept",
            faults: vec!["/hf/*=stall".into()],
            goal: Some(60),
        },
        Scenario {
            name: "fallback: HF 100x slower than GitHub",
            faults: vec![
                format!("/hf/models/*=slow:{HF_SLOW_RATE}"),
                format!("/gh/*=slow:{GH_RATE}"),
            ],
            goal: None,
        },
    ];
    let mut rows = Vec::new();
    for (i, s) in scenarios.iter().enumerate() {
        eprintln!("bench: {}", s.name);
        let stats = root.join(format!("stats{i}"));
        let (server, url) = start(
            &release.join("test-http-server"),
            &origin,
            &s.faults,
            &stats,
        )?;
        let device = root.join(format!("device{i}"));
        mkdirs(&device.join("builtin"))?;
        mkdirs(&device.join("params/d"))?;
        fs::write(device.join("params/d/Model"), ID).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&dmm);
        cmd.arg("--data-dir")
            .arg(&device)
            .arg("--memory-params-dir")
            .arg(device.join("shm"))
            .arg("--builtin-dir")
            .arg(device.join("builtin"))
            .arg("--openpilot-dir")
            .arg(root.join("openpilot"))
            .args(["--hf-base", &format!("{url}/hf")])
            .args(["--github-base", &format!("{url}/gh")])
            .arg("refresh");
        let took = util::measure(&mut quiet(&mut cmd))?.wall;
        let installed = device.join("models").join(&name);
        if fs::metadata(&installed).map(|m| m.len()).ok() != Some(SIZE) {
            return Err(format!(
                "{}: {} was not installed",
                s.name,
                installed.display()
            ));
        }
        // The stats file is rewritten every 100 ms.
        std::thread::sleep(Duration::from_millis(300));
        let (hf_bytes, gh_bytes) = served(&stats)?;
        drop(server);
        let t = took.as_secs_f64();
        rows.push(match s.goal {
            Some(goal) => Row {
                name: s.name,
                ours: format!("{t:.1} s"),
                anchor: format!(
                    "goal {goal} s; GitHub {} KiB, HF {} KiB",
                    gh_bytes >> 10,
                    hf_bytes >> 10
                ),
                ratio: t / goal as f64,
                bar: "<= 1.00 of goal",
                pass: Some(t <= goal as f64 && gh_bytes >= SIZE),
            },
            None => {
                let share = gh_bytes as f64 / (gh_bytes + hf_bytes).max(1) as f64;
                Row {
                    name: s.name,
                    ours: format!("{t:.1} s"),
                    anchor: format!(
                        "GitHub {} KiB, HF {} KiB ({} vs {} KiB/s)",
                        gh_bytes >> 10,
                        hf_bytes >> 10,
                        GH_RATE >> 10,
                        HF_SLOW_RATE >> 10
                    ),
                    ratio: share,
                    bar: ">= 0.50 from GitHub",
                    pass: Some(share >= 0.5),
                }
            }
        });
    }
    Ok(rows)
}

/// The origin server with `faults`, counting body bytes under `/hf/models/` and `/gh/` into
/// `stats`.
fn start(
    bin: &PathBuf,
    dir: &Path,
    faults: &[String],
    stats: &Path,
) -> Result<(Server, String), String> {
    let mut cmd = Command::new(bin);
    cmd.arg("--dir")
        .arg(dir)
        .args(["--addr", "127.0.0.1:0", "--latency-ms", "20"])
        .arg("--stats-file")
        .arg(stats)
        .args(["--count", "/hf/models/", "--count", "/gh/"]);
    for f in faults {
        cmd.args(["--fault", f]);
    }
    spawn_server(&mut cmd, bin)
}

/// Body bytes served by Hugging Face's and GitHub's artifact paths, from the stats file.
fn served(stats: &Path) -> Result<(u64, u64), String> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if let Ok(text) = fs::read_to_string(stats) {
            let get = |prefix: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(prefix))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            };
            if let (Some(hf), Some(gh)) = (get("/hf/models/ "), get("/gh/ ")) {
                return Ok((hf, gh));
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{}: no byte counts from the origin",
                stats.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
