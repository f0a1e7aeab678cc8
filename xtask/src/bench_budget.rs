//! Budgets for the binary that ships to the comma: its stripped size, and the peak RSS of one
//! model download of a typical size (180 MiB) with the device's default settings, natively.
//! The size is measured for the aarch64 binary `cargo xtask dist` builds into `target/dist/`
//! (stripped at link time; the bench runs dist first), the one the budget is about, and shown
//! for information for the native release build (stripped here with binutils' `strip`).

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::bench::{Row, write_pseudo_random};
use crate::bench_device::{device_command, entry, mkdirs, run_ok, sidecar_digest, start_server};
use crate::util;

/// Stripped size budget (decimal megabytes, as a download is counted).
const SIZE_BUDGET: u64 = 4_000_000;
/// Peak RSS budget of one download.
const RSS_BUDGET_MIB: f64 = 16.0;
/// A typical driving model.
const DOWNLOAD_MIB: u64 = 180;
const GENERATION: &str = "v25";
const ID: &str = "budget180";
const CHUNK: u64 = 45 << 20;

pub fn rows(work: &Path) -> Result<Vec<Row>, String> {
    let mut rows = size_rows(work)?;
    rows.push(download_rss_row(work)?);
    Ok(rows)
}

fn size_rows(work: &Path) -> Result<Vec<Row>, String> {
    let native = util::target_dir().join("release/device-modeld-manager");
    let stripped = work.join("device-modeld-manager.stripped");
    run_ok(Command::new("strip").arg("-o").arg(&stripped).arg(&native)).map_err(|e| {
        format!("{e}\nnext: bench needs binutils' strip (apt-get install binutils)")
    })?;
    // The budget is the comma's binary: build it here (incremental when `cargo xtask dist` ran
    // on these sources) so the row is never skipped or measured on an older build.
    eprintln!("bench: cargo xtask dist (the aarch64 device binary, for its size)");
    crate::dist::run(&[])?;
    let dist = util::target_dir().join("dist/device-modeld-manager");
    Ok(vec![
        Row {
            pass: None,
            bar: "none (not device)",
            ..size_row(
                "device binary size, stripped (x86_64)",
                len(&stripped)?,
                "native release build, strip",
            )
        },
        size_row(
            "device binary size (aarch64 dist)",
            len(&dist)?,
            "target/dist, glibc 2.31",
        ),
    ])
}

fn size_row(name: &'static str, bytes: u64, what: &str) -> Row {
    let ratio = bytes as f64 / SIZE_BUDGET as f64;
    Row {
        name,
        ours: format!("{:.2} MB", bytes as f64 / 1e6),
        anchor: format!("4 MB budget ({what})"),
        ratio,
        bar: "<= 1.00 of budget",
        pass: Some(bytes <= SIZE_BUDGET),
    }
}

fn len(p: &Path) -> Result<u64, String> {
    fs::metadata(p)
        .map(|m| m.len())
        .map_err(|e| format!("{}: {e}", p.display()))
}

/// Publish one 180 MiB model to a local origin and download it with `device-modeld-manager`'s
/// defaults (the settings a comma runs with), measuring the whole process's peak RSS.
fn download_rss_row(work: &Path) -> Result<Row, String> {
    let release = util::target_dir().join("release");
    let cli = release.join("release-cli");
    let dmm = release.join("device-modeld-manager");
    let origin = work.join("budget-origin");
    let hf = origin.join("hf");
    let model_dir = hf.join(format!("models/{GENERATION}/{ID}"));
    mkdirs(&model_dir)?;
    mkdirs(&hf.join("manifests"))?;
    mkdirs(&origin.join("gh"))?;

    eprintln!("bench: publishing a {DOWNLOAD_MIB} MiB model for the RSS budget");
    let name = format!("{ID}_driving_tinygrad.pkl");
    let artifact = work.join(&name);
    let size = DOWNLOAD_MIB << 20;
    write_pseudo_random(&artifact, size)?;
    run_ok(
        Command::new(&cli)
            .args(["chunk", "split"])
            .arg(&artifact)
            .arg("--out-dir")
            .arg(&model_dir),
    )?;
    let sha = sidecar_digest(&model_dir.join(format!("{name}.sha256")))?;
    fs::remove_file(&artifact).map_err(|e| e.to_string())?;
    fs::write(
        hf.join(format!("manifests/model_names_{GENERATION}.json")),
        format!(
            "{{\n  \"models\": [\n{}\n  ]\n}}\n",
            entry(ID, size, &sha, size.div_ceil(CHUNK))
        ),
    )
    .map_err(|e| e.to_string())?;

    let (_server, url) = start_server(&release.join("test-http-server"), &origin)?;
    let device = work.join("budget-device");
    mkdirs(&device.join("builtin"))?;
    let dmm_cmd = |args: &[&str]| device_command(&dmm, &device, &url, args);
    run_ok(&mut dmm_cmd(&["refresh"]))?;
    let installed = device.join("models").join(&name);
    eprintln!("bench: device-modeld-manager download (default settings), peak RSS");
    // Through the small launcher: measured straight from here, the child's peak RSS would
    // count this process's own (dist ran in it just before).
    let mut rss_kib = 0;
    for _ in 0..2 {
        let _ = fs::remove_file(&installed);
        let m = util::measure_own_rss(&dmm_cmd(&["download", ID]), work)?;
        rss_kib = rss_kib.max(m.max_rss_kib);
    }
    if !installed.exists() {
        return Err(format!("download did not install {}", installed.display()));
    }
    let rss_mib = rss_kib as f64 / 1024.0;
    Ok(Row {
        name: "device 180 MiB download peak RSS",
        ours: format!("{rss_mib:.1} MiB"),
        anchor: format!("{RSS_BUDGET_MIB:.0} MiB budget (default settings)"),
        ratio: rss_mib / RSS_BUDGET_MIB,
        bar: "<= 1.00 of budget",
        pass: Some(rss_mib <= RSS_BUDGET_MIB),
    })
}
