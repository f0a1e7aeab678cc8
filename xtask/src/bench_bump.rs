//! `--only bump` (issue 39 item 2): the bump's wall clock. The `bench_bump` example (crates/
//! release/examples) rebuilds [`N`] models with a stand-in builder that takes [`COMPILE_MS`] per
//! compile and [`VALIDATE_MS`] per validation and writes a real [`MIB`] MiB chunk set, into the
//! Hub emulator with its uplink capped at [`UPLINK`], through the pinned `hf` CLI (the real
//! store client, one `hf buckets cp` per file, as publish uploads). Measured in the same run, a
//! fresh emulator each: one model's upload alone; the sequential bump (rebuild --validate, then
//! publish of everything, manifest last); ours (rebuild --validate --upload-to the bucket, the
//! uploads beside the compiles, then publish, which finds them and writes the manifest). Bar:
//! ours <= 1.1 x (N x (compile + validate) + one model's upload).

use std::path::Path;
use std::process::Command;

use crate::bench::Row;
use crate::bench_hf::{BUCKET, hf_cli, start_hub};
use crate::util;

const N: usize = 8;
const COMPILE_MS: u64 = 8_000;
const VALIDATE_MS: u64 = 2_000;
const MIB: u64 = 24;
const UPLINK: u64 = 24 << 20;

/// One run of the example in `mode` against a fresh emulator: its timed seconds.
fn timed(work: &Path, mode: &str) -> Result<f64, String> {
    let release = util::target_dir().join("release");
    let (_hub, endpoint, token) = start_hub(&release.join("hub-emulator"), UPLINK)?;
    let home = work.join("bump-hf-home");
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).map_err(|e| e.to_string())?;
    let out = Command::new(release.join("examples/bench_bump"))
        .args([mode, &work.join(format!("bump-{mode}")).to_string_lossy()])
        .args([N, COMPILE_MS as usize, VALIDATE_MS as usize, MIB as usize].map(|v| v.to_string()))
        .arg(format!("hf://buckets/{BUCKET}"))
        .env("HF_CLI", hf_cli()?)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_TOKEN", token)
        .env("HF_HOME", &home)
        .env("HF_HUB_DISABLE_UPDATE_CHECK", "1")
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .output()
        .map_err(|e| format!("bench_bump: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("seconds=")?.parse().ok())
        .filter(|_| out.status.success())
        .ok_or_else(|| {
            format!(
                "bench_bump {mode} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

pub fn rows(work: &Path) -> Result<Vec<Row>, String> {
    eprintln!(
        "bench: bump of {N} models ({COMPILE_MS} ms compile + {VALIDATE_MS} ms validation, \
         {MIB} MiB each) to the Hub emulator through the hf CLI, uplink {} MiB/s",
        UPLINK >> 20
    );
    let one = timed(work, "one")?;
    eprintln!("bench: one model's upload alone: {one:.1} s; the sequential bump");
    let sequential = timed(work, "sequential")?;
    eprintln!("bench: sequential {sequential:.1} s; ours (rebuild --upload-to, then publish)");
    let ours = timed(work, "overlap")?;
    let floor = N as f64 * (COMPILE_MS + VALIDATE_MS) as f64 / 1000.0 + one;
    let ratio = ours / floor;
    Ok(vec![Row {
        name: "bump (rebuild --upload-to, publish; one run each) / compiler time",
        ours: format!("{ours:.1} s (sequential {sequential:.1} s)"),
        anchor: format!(
            "{floor:.1} s ({N} x {:.0} s compile+validate + one {MIB} MiB upload {one:.1} s, \
             uplink {} MiB/s)",
            (COMPILE_MS + VALIDATE_MS) as f64 / 1000.0,
            UPLINK >> 20
        ),
        ratio,
        bar: "<= 1.1",
        pass: Some(ratio <= 1.1),
    }])
}
