//! Device-side benchmarks: `device-modeld-manager` against the throttled local origin
//! (`test-http-server`, which limits each connection's bandwidth and adds latency, as the Hub's
//! CDN does per connection), with `curl` over one connection as the anchor; our verified, durable
//! install (download, SHA-256, fsync, rename) against `aria2c` downloading the same chunks over as
//! many connections (download only: no verification, no fsync) and against the link limit (the
//! bytes at every connection's full rate); then verification of an installed model against
//! `openssl dgst -sha256` on the same file, and the cached re-check.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::bench::{RUNS, Row, WRITE_RUNS, quiet, secs, write_pseudo_random};
use crate::util::{self, best_of};

const GENERATION: &str = "v25";
const SMALL_ID: &str = "benchmodel";
const BIG_ID: &str = "bigbench";
const CHUNK: u64 = 45 << 20;
/// Per-connection bandwidth of the stand-in origin, and its latency.
const RATE_PER_CONN: u64 = 32 << 20;
const LATENCY_MS: u64 = 20;
const CONNECTIONS: &str = "8";
const RANGES_PER_CHUNK: &str = "2";
/// Ours runs with the device's default of one range per chunk: the downloader cuts the
/// artifact into blocks for its connections by itself (the first 6/7 one big block per
/// connection, the rest in small ones), which a fixed split per chunk would only unbalance.
const OUR_RANGES_PER_CHUNK: &str = "1";
/// aria2c at the same connection count: this many chunks at once, each over
/// [`RANGES_PER_CHUNK`] connections (`-j 4 -x 2 -s 2`).
const ARIA2C_FILES_AT_ONCE: &str = "4";

/// Kills the origin server when the bench ends, however it ends.
pub(crate) struct Server(pub(crate) Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Where [`rows`] leaves the chunk set of the model it downloads (`<id>/<id>_driving_tinygrad.pkl.*`
/// in the bucket layout of one generation), for the GitHub publish bench.
pub fn published_models(work: &Path) -> PathBuf {
    work.join("origin/hf/models").join(GENERATION)
}

pub fn rows(work: &Path, big: &Path, download_mib: u64) -> Result<Vec<Row>, String> {
    let release = util::target_dir().join("release");
    let dmm = release.join("device-modeld-manager");
    let origin = work.join("origin");
    let hf_dir = origin.join("hf");
    let small_sha = publish_small(work, download_mib)?;
    let small_name = format!("{SMALL_ID}_driving_tinygrad.pkl");
    let small_count = (download_mib << 20).div_ceil(CHUNK);

    let big_size = fs::metadata(big).map_err(|e| e.to_string())?.len();
    let big_sha = openssl_digest(big)?;
    let manifest = format!(
        "{{\n  \"models\": [\n{},\n{}\n  ]\n}}\n",
        entry(SMALL_ID, download_mib << 20, &small_sha, small_count),
        entry(BIG_ID, big_size, &big_sha, big_size.div_ceil(CHUNK)),
    );
    fs::write(
        hf_dir.join(format!("manifests/model_names_{GENERATION}.json")),
        manifest,
    )
    .map_err(|e| e.to_string())?;

    let (_server, url) = start_server(&release.join("test-http-server"), &origin)?;
    let device = work.join("device");
    mkdirs(&device.join("builtin"))?;
    let dmm_cmd = |args: &[&str]| device_command(&dmm, &device, &url, args);
    run_ok(&mut dmm_cmd(&["refresh"]))?;

    eprintln!("bench: curl, one connection, the same chunks");
    let chunk_urls: Vec<String> = (1..=small_count)
        .map(|i| {
            format!(
                "{url}/hf/models/{GENERATION}/{SMALL_ID}/{small_name}.chunk{i:02}of{small_count:02}"
            )
        })
        .collect();
    let curl = best_of(
        RUNS,
        || {},
        || {
            let mut c = Command::new("curl");
            c.args(["-s", "--fail"]);
            for u in &chunk_urls {
                c.args(["-o", "/dev/null", u]);
            }
            quiet(&mut c)
        },
    )?;
    eprintln!(
        "bench: device-modeld-manager download ({CONNECTIONS} connections, {OUR_RANGES_PER_CHUNK} range per chunk)"
    );
    let installed = device.join("models").join(&small_name);
    // A verified, durable install: best of as many runs as the other durable writes.
    let ours = best_of(
        WRITE_RUNS,
        || {
            let _ = fs::remove_file(&installed);
        },
        || {
            quiet(&mut dmm_cmd(&[
                "--connections",
                CONNECTIONS,
                "--ranges-per-chunk",
                OUR_RANGES_PER_CHUNK,
                "download",
                SMALL_ID,
            ]))
        },
    )?;
    if !installed.exists() {
        return Err(format!("download did not install {}", installed.display()));
    }

    eprintln!(
        "bench: aria2c -j {ARIA2C_FILES_AT_ONCE} -x {RANGES_PER_CHUNK} -s {RANGES_PER_CHUNK} ({CONNECTIONS} connections), download only"
    );
    let aria_dir = work.join("aria2c");
    let url_list = work.join("aria2c-urls.txt");
    fs::write(&url_list, chunk_urls.join("\n") + "\n").map_err(|e| e.to_string())?;
    let aria2c = best_of(
        RUNS,
        || {
            let _ = fs::remove_dir_all(&aria_dir);
            let _ = fs::create_dir_all(&aria_dir);
        },
        || {
            let mut c = Command::new("aria2c");
            c.args([
                "--quiet=true",
                "-j",
                ARIA2C_FILES_AT_ONCE,
                "-x",
                RANGES_PER_CHUNK,
                "-s",
                RANGES_PER_CHUNK,
                "-k",
                "1M",
                "--file-allocation=none",
                "--allow-overwrite=true",
                "--auto-file-renaming=false",
                "--check-certificate=false",
            ])
            .arg("-d")
            .arg(&aria_dir)
            .arg("-i")
            .arg(&url_list);
            quiet(&mut c)
        },
    )?;
    let fetched: u64 = fs::read_dir(&aria_dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    if fetched != download_mib << 20 {
        return Err(format!(
            "aria2c fetched {fetched} bytes, not {}",
            download_mib << 20
        ));
    }
    let _ = fs::remove_dir_all(&aria_dir);
    let connections: u64 = CONNECTIONS.parse().expect("a number");
    // Every connection at full rate the whole time, plus one round trip to start.
    let limit_s = (download_mib << 20) as f64 / (connections * RATE_PER_CONN) as f64
        + LATENCY_MS as f64 / 1000.0;

    eprintln!("bench: verify an installed {} MiB model", big_size >> 20);
    let big_installed = device
        .join("models")
        .join(format!("{BIG_ID}_driving_tinygrad.pkl"));
    fs::hard_link(big, &big_installed)
        .or_else(|_| fs::copy(big, &big_installed).map(|_| ()))
        .map_err(|e| format!("{}: {e}", big_installed.display()))?;
    let openssl = crate::bench::openssl_anchor(&big_installed)?;
    let verify = best_of(RUNS, || {}, || quiet(&mut dmm_cmd(&["verify", BIG_ID])))?;
    let recheck = best_of(RUNS, || {}, || quiet(&mut dmm_cmd(&["status", "--json"])))?;
    // The cached re-check reads no model bytes: it must cost less than hashing a hundredth of
    // the model (both have a fixed start-up cost, so the bar holds at any --size).
    let hundredth = crate::bench::openssl_of_hundredth(big, &work.join("recheck-anchor.bin"))?;

    let speedup = curl.wall.as_secs_f64() / ours.wall.as_secs_f64();
    let rss_mib = ours.max_rss_kib as f64 / 1024.0;
    let verify_ratio = openssl.wall.as_secs_f64() / verify.wall.as_secs_f64();
    let recheck_ratio = recheck.wall.as_secs_f64() / hundredth.wall.as_secs_f64();
    Ok(vec![
        Row {
            name: "device download speed / curl (1 conn)",
            ours: secs(ours),
            anchor: format!(
                "{} (curl; {} MiB/s per conn, {LATENCY_MS} ms)",
                secs(curl),
                RATE_PER_CONN >> 20
            ),
            ratio: speedup,
            bar: ">= 3.0",
            pass: Some(speedup >= 3.0),
        },
        Row {
            name: "verified install speed / aria2c",
            ours: secs(ours),
            anchor: format!(
                "{} (aria2c, {CONNECTIONS} conns, download only)",
                secs(aria2c)
            ),
            ratio: aria2c.wall.as_secs_f64() / ours.wall.as_secs_f64(),
            bar: ">= 1.0",
            pass: Some(aria2c.wall.as_secs_f64() / ours.wall.as_secs_f64() >= 1.0),
        },
        Row {
            name: "verified install speed / link limit",
            ours: secs(ours),
            anchor: format!(
                "{limit_s:.3} s ({CONNECTIONS} x {} MiB/s + {LATENCY_MS} ms)",
                RATE_PER_CONN >> 20
            ),
            ratio: limit_s / ours.wall.as_secs_f64(),
            bar: ">= 0.9",
            pass: Some(limit_s / ours.wall.as_secs_f64() >= 0.9),
        },
        Row {
            name: "device download peak RSS (MiB)",
            ours: format!("{rss_mib:.1} MiB"),
            anchor: "32 MiB budget".into(),
            ratio: rss_mib / 32.0,
            bar: "<= 1.00 of budget",
            pass: Some(rss_mib <= 32.0),
        },
        Row {
            name: "device verify throughput / openssl",
            ours: secs(verify),
            anchor: format!("{} (openssl dgst -sha256)", secs(openssl)),
            ratio: verify_ratio,
            bar: ">= 0.85",
            pass: Some(verify_ratio >= 0.85),
        },
        Row {
            name: "device re-check (status) / openssl 1 %",
            ours: secs(recheck),
            anchor: format!(
                "{} (openssl, 1st 1/100; full verify {})",
                secs(hundredth),
                secs(verify)
            ),
            ratio: recheck_ratio,
            bar: "<= 1.00",
            pass: Some(recheck_ratio <= 1.0),
        },
    ])
}

/// Publish the `download_mib` MiB model the device rows download (and the GitHub row publishes
/// again) as a chunk set into [`published_models`], with the origin's other directories;
/// returns its SHA-256.
pub(crate) fn publish_small(work: &Path, download_mib: u64) -> Result<String, String> {
    let cli = util::target_dir().join("release/release-cli");
    let origin = work.join("origin");
    let hf_dir = origin.join("hf");
    let small_dir = published_models(work).join(SMALL_ID);
    mkdirs(&small_dir)?;
    mkdirs(&hf_dir.join("manifests"))?;
    mkdirs(&origin.join("gh"))?;

    eprintln!("bench: publishing a {download_mib} MiB model to the local origin");
    let small_name = format!("{SMALL_ID}_driving_tinygrad.pkl");
    let small = work.join(&small_name);
    write_pseudo_random(&small.to_path_buf(), download_mib << 20)?;
    // Framed as every v25 artifact is, so that the GitHub publish bench can publish it too.
    crate::bench::frame_oob(&small, download_mib << 20, crate::bench::OOB_BUFFER)?;
    run_ok(
        Command::new(&cli)
            .args(["chunk", "split"])
            .arg(&small)
            .arg("--out-dir")
            .arg(&small_dir),
    )?;
    let small_sha = sidecar_digest(&small_dir.join(format!("{small_name}.sha256")))?;
    fs::remove_file(&small).map_err(|e| e.to_string())?;
    Ok(small_sha)
}

pub(crate) fn entry(id: &str, size: u64, sha: &str, count: u64) -> String {
    format!(
        "    {{\n      \"id\": \"{id}\",\n      \"name\": \"Bench {id}\",\n      \"version\": \"v16\",\n      \"series\": \"OP Series\",\n      \"released\": \"2026-01-01\",\n      \"community_favorite\": false,\n      \"artifact_format\": \"tinygrad_single_v1\",\n      \"artifact_size\": {size},\n      \"artifact_sha256\": \"{sha}\",\n      \"artifact_chunk_count\": {count},\n      \"uses_external_gpu\": false\n    }}"
    )
}

pub(crate) fn mkdirs(p: &Path) -> Result<(), String> {
    fs::create_dir_all(p).map_err(|e| format!("{}: {e}", p.display()))
}

pub(crate) fn run_ok(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

pub(crate) fn sidecar_digest(path: &Path) -> Result<String, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("{}: empty sidecar", path.display()))
}

fn openssl_digest(path: &Path) -> Result<String, String> {
    let out = Command::new("openssl")
        .args(["dgst", "-sha256", "-r"])
        .arg(path)
        .output()
        .map_err(|e| e.to_string())?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| "openssl printed no digest".to_string())
}

pub(crate) fn start_server(bin: &PathBuf, dir: &Path) -> Result<(Server, String), String> {
    let mut cmd = Command::new(bin);
    cmd.arg("--dir")
        .arg(dir)
        .args(["--addr", "127.0.0.1:0"])
        .args(["--rate-per-conn", &RATE_PER_CONN.to_string()])
        .args(["--latency-ms", &LATENCY_MS.to_string()]);
    spawn_server(&mut cmd, bin)
}

/// Start `test-http-server` as `cmd` says and read the URL it prints first; the server is killed
/// when the returned [`Server`] is dropped.
pub(crate) fn spawn_server(cmd: &mut Command, bin: &Path) -> Result<(Server, String), String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let stdout = child.stdout.take().expect("piped");
    let server = Server(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let url = line.trim().to_string();
    if !url.starts_with("http://") {
        return Err(format!("test-http-server printed {url:?}, not its URL"));
    }
    Ok((server, url))
}

/// `device-modeld-manager` against a bench device dir and the local origin (both benches use it),
/// with an openpilot tree (`DEVICE/openpilot`) that runs the current generation's tinygrad pin,
/// written here on first use.
pub(crate) fn device_command(dmm: &Path, device: &Path, url: &str, args: &[&str]) -> Command {
    let openpilot = device.join("openpilot");
    let marker = openpilot.join("tinygrad_repo/TINYGRAD_COMMIT");
    if !marker.is_file() {
        let _ = fs::create_dir_all(marker.parent().expect("a parent"));
        let _ = fs::write(
            &marker,
            format!("{}\n", manifest::layout::current_tinygrad_commit()),
        );
    }
    let mut c = Command::new(dmm);
    c.arg("--data-dir")
        .arg(device)
        .arg("--openpilot-dir")
        .arg(&openpilot)
        .arg("--memory-params-dir")
        .arg(device.join("shm"))
        .arg("--builtin-dir")
        .arg(device.join("builtin"))
        .args(["--hf-base", &format!("{url}/hf")])
        .args(["--github-base", &format!("{url}/gh")])
        .args(args);
    c
}
