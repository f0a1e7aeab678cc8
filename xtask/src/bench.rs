//! `cargo xtask bench`: every benchmark as a ratio against an anchor measured in the same run on
//! the same data, so that the figures mean the same on a laptop, a CI box or a comma.
//!
//! Times are best-of-3 wall clock of whole processes (release builds). Peak RSS comes from the
//! kernel's per-child accounting (wait4), so it covers the whole process, not a sample.

use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::{self, Measured, best_of};

pub const RUNS: usize = 3;
/// Durable writes are the noisiest figure on a shared disk (writeback of earlier runs, page
/// reclaim): both contenders get more tries.
pub const WRITE_RUNS: usize = 5;

/// Flush earlier runs' dirty pages so that their writeback is not billed to the next contender.
fn settle() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Split against the slower of its anchors: one `openssl dgst -sha256` of the artifact, one
/// `dd conv=fsync` copy of it. The split does more than either (every byte hashed twice, for the
/// artifact and for its chunk, on two threads, then written durably), but its stages overlap, so
/// on two free cores it costs about one hash. The bar leaves room for the second hash and the
/// copy sharing those cores (issue 38: `sha2` alone, no hand-written two-state SHA-256).
const SPLIT_BAR: f64 = 1.3;

/// One line of the final table.
pub struct Row {
    pub name: &'static str,
    pub ours: String,
    pub anchor: String,
    pub ratio: f64,
    pub bar: &'static str,
    /// Whether the row meets its bar; `None` for a row shown for information only.
    pub pass: Option<bool>,
}

/// The groups of rows `--only` can name, in the order the bench runs them. `split` is the split
/// time and peak RSS; `device` every row of the device download (speed against curl, verified
/// install against aria2c and the link limit, peak RSS, verify, re-check); `budget` the binary
/// size and the 180 MiB download's RSS; `fallback` the three fallback rows; `install` the
/// verified install in the field's shapes against aria2c and the link limit; `hf` the publish
/// through the real `hf` CLI against that CLI alone; `bump` a bump's wall clock (rebuild
/// --upload-to, then publish) against the compiler's time.
pub const GROUPS: [&str; 10] = [
    "split", "verify", "oob", "device", "install", "github", "hf", "bump", "budget", "fallback",
];

/// Which groups of rows to run: all of them, or those `--only` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection(Vec<&'static str>);

impl Selection {
    pub fn all() -> Self {
        Self(GROUPS.to_vec())
    }

    /// `--only`'s value: group names from [`GROUPS`], separated by commas, each at most once.
    pub fn parse(value: &str) -> Result<Self, String> {
        let mut picked = Vec::new();
        for name in value.split(',') {
            let Some(group) = GROUPS.iter().find(|g| **g == name) else {
                return Err(format!(
                    "--only: unknown row group {name:?}\nnext: name one or more of {}, separated by commas (e.g. --only split,oob)",
                    GROUPS.join(", ")
                ));
            };
            if picked.contains(group) {
                return Err(format!(
                    "--only: {name:?} is named twice\nnext: name each row group once"
                ));
            }
            picked.push(*group);
        }
        Ok(Self(picked))
    }

    pub fn has(&self, group: &str) -> bool {
        self.0.contains(&group)
    }

    /// The bench artifact (`--size`) is needed by the chunk rows and the device verify.
    fn needs_artifact(&self) -> bool {
        ["split", "verify", "oob", "device"]
            .iter()
            .any(|g| self.has(g))
    }
}

pub fn run(args: &[String]) -> Result<(), String> {
    let mut size_mib: u64 = 1024;
    let mut download_mib: u64 = 256;
    let mut only = Selection::all();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--size" => {
                size_mib = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--size needs a number of MiB")?
            }
            "--download-size" => {
                download_mib = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--download-size needs a number of MiB")?
            }
            "--only" => {
                only = Selection::parse(it.next().ok_or("--only needs row groups")?)?;
            }
            other => return Err(format!("bench: unknown argument {other:?}")),
        }
    }
    for tool in ["openssl", "dd"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Err(format!(
                "bench needs `{tool}` on PATH (apt-get install {tool})"
            ));
        }
    }
    for (tool, package) in [("curl", "curl"), ("aria2c", "aria2"), ("git", "git")] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Err(format!(
                "bench needs `{tool}` on PATH (apt-get install {package})"
            ));
        }
    }
    // The binaries and the GitHub publish contender (the library's publish, built like the
    // binaries) in one build: built apart, the example's dev-dependencies unify features
    // differently, and each build undid the other's, relinking everything on every bench run.
    util::cargo(&[
        "build",
        "--release",
        "--quiet",
        "-p",
        "release-cli",
        "-p",
        "device-modeld-manager",
        "-p",
        "test-support",
        "-p",
        "artifact-store",
        "--bins",
        "--example",
        "bench_github_publish",
        "--example",
        "bench_hf_publish",
        "-p",
        "release",
        "--example",
        "bench_bump",
    ])?;
    let bin = util::target_dir().join("release/release-cli");

    // Two benches in one target directory would delete each other's files and time each
    // other: the second is refused while the first holds the lock.
    let _lock = bench_lock(&util::target_dir().join("xtask-bench.lock"))?;
    let work = util::target_dir().join("xtask-bench");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let input = work.join("bench_driving_tinygrad.pkl");
    if only.needs_artifact() {
        eprintln!(
            "bench: writing a {size_mib} MiB artifact to {}",
            input.display()
        );
        write_pseudo_random(&input, size_mib << 20)?;
        frame_oob(&input, size_mib << 20, OOB_BUFFER)?;
        warm(&input)?;
    }

    let mut rows = Vec::new();
    rows.extend(chunker_rows(&bin, &work, &input, &only)?);
    if only.has("device") {
        rows.extend(crate::bench_device::rows(&work, &input, download_mib)?);
    }
    if only.has("install") {
        rows.extend(crate::bench_shapes::rows(&work)?);
    }
    if only.has("github") {
        if !only.has("device") {
            // The device rows publish the model the GitHub row publishes again.
            crate::bench_device::publish_small(&work, download_mib)?;
        }
        rows.extend(crate::bench_github::rows(
            &work,
            &crate::bench_device::published_models(&work),
        )?);
    }
    if only.has("hf") {
        if !only.has("device") && !only.has("github") {
            // The hf row publishes the model the device rows download.
            crate::bench_device::publish_small(&work, download_mib)?;
        }
        // A failing Hub row is shown MISSED with its error; the other rows still print.
        match crate::bench_hf::rows(&work, &crate::bench_device::published_models(&work)) {
            Ok(r) => rows.extend(r),
            Err(e) => {
                eprintln!("bench: the hf row failed: {e}");
                rows.push(Row {
                    name: "hf publish throughput / hf alone",
                    ours: "failed".into(),
                    anchor: "see the error above the table".into(),
                    ratio: 0.0,
                    bar: ">= 0.9",
                    pass: Some(false),
                });
            }
        }
    }
    if only.has("bump") {
        rows.extend(crate::bench_bump::rows(&work)?);
    }
    if only.has("budget") {
        rows.extend(crate::bench_budget::rows(&work)?);
    }
    if only.has("fallback") {
        rows.extend(crate::bench_fallback::rows(&work)?);
    }

    print_table(only.needs_artifact().then_some(size_mib), &rows);
    let _ = fs::remove_dir_all(&work);
    Ok(())
}

fn chunker_rows(
    bin: &Path,
    work: &Path,
    input: &Path,
    only: &Selection,
) -> Result<Vec<Row>, String> {
    let (split_on, verify_on, oob_on) = (only.has("split"), only.has("verify"), only.has("oob"));
    if !(split_on || verify_on || oob_on) {
        return Ok(Vec::new());
    }
    let mut rows = Vec::new();
    eprintln!("bench: anchor openssl dgst -sha256");
    let openssl = openssl_anchor(input)?;
    let out = work.join("chunks");
    let split_cmd = || {
        let mut c = Command::new(bin);
        c.args(["chunk", "split"])
            .arg(input)
            .arg("--out-dir")
            .arg(&out);
        quiet(&mut c)
    };
    if split_on {
        eprintln!("bench: anchor dd bs=4M conv=fsync");
        let dd_out = work.join("dd.out");
        let dd_with = |flags: &[&str]| {
            best_of(
                WRITE_RUNS,
                || {
                    let _ = fs::remove_file(&dd_out);
                    settle();
                },
                || {
                    let mut c = Command::new("dd");
                    c.arg(format!("if={}", input.display()))
                        .arg(format!("of={}", dd_out.display()))
                        .arg("bs=4M")
                        .args(flags);
                    quiet(&mut c)
                },
            )
        };
        let dd = dd_with(&["conv=fsync"])?;
        // The split writes its chunks with O_DIRECT (no page-cache copy taking CPU from the two
        // hashes): the same durable write without the cache, shown for information.
        eprintln!("bench: dd bs=4M oflag=direct conv=fsync (information)");
        let dd_direct = dd_with(&["oflag=direct", "conv=fsync"])?;
        let _ = fs::remove_file(&dd_out);

        eprintln!("bench: release-cli chunk split");
        let split = best_of(
            WRITE_RUNS,
            || {
                let _ = fs::remove_dir_all(&out);
                let _ = fs::create_dir_all(&out);
                settle();
            },
            split_cmd,
        )?;
        rows.extend(split_rows(split, openssl, dd, dd_direct));
    } else {
        // The verify and OOB rows read the chunk set a split writes.
        fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        util::measure(&mut split_cmd())?;
    }
    let logical = out.join(input.file_name().expect("file name"));
    if verify_on {
        eprintln!("bench: release-cli chunk verify");
        let verify = best_of(
            RUNS,
            || {},
            || {
                let mut c = Command::new(bin);
                c.args(["chunk", "verify"]).arg(&logical);
                quiet(&mut c)
            },
        )?;
        let verify_ratio = openssl.wall.as_secs_f64() / verify.wall.as_secs_f64();
        rows.push(Row {
            name: "chunk verify throughput / openssl",
            ours: secs(verify),
            anchor: format!("{} (openssl dgst -sha256)", secs(openssl)),
            ratio: verify_ratio,
            bar: ">= 0.85",
            pass: Some(verify_ratio >= 0.85),
        });
    }
    if oob_on {
        // The OOB check reads the headers only: it must cost less than hashing a hundredth of
        // the artifact. Both have a fixed start-up cost and a part that grows with the artifact
        // (records are OOB_BUFFER apart), so the bar holds at any --size.
        let anchor = openssl_of_hundredth(input, &work.join("oob-anchor.bin"))?;
        eprintln!("bench: release-cli chunk oob (headers only, through the chunk set)");
        let oob = best_of(
            RUNS,
            || {},
            || {
                let mut c = Command::new(bin);
                c.args(["chunk", "oob"]).arg(&logical);
                quiet(&mut c)
            },
        )?;
        rows.push(oob_row(oob, anchor));
    }
    Ok(rows)
}

fn split_rows(split: Measured, openssl: Measured, dd: Measured, dd_direct: Measured) -> Vec<Row> {
    let (floor, floor_name) = if openssl.wall > dd.wall {
        (openssl, "openssl")
    } else {
        (dd, "dd fsync")
    };
    let split_ratio = split.wall.as_secs_f64() / floor.wall.as_secs_f64();
    let split_rss_mib = split.max_rss_kib as f64 / 1024.0;
    vec![
        Row {
            name: "chunk split: 2 SHA-256 + durable write",
            ours: secs(split),
            anchor: format!(
                "{} (slower of openssl dgst {} and dd conv=fsync {}: {floor_name})",
                secs(floor),
                secs(openssl),
                secs(dd)
            ),
            ratio: split_ratio,
            bar: "<= 1.30",
            pass: Some(split_ratio <= SPLIT_BAR),
        },
        Row {
            name: "chunk split time / dd oflag=direct",
            ours: secs(split),
            anchor: format!("{} (dd bs=4M oflag=direct conv=fsync)", secs(dd_direct)),
            ratio: split.wall.as_secs_f64() / dd_direct.wall.as_secs_f64(),
            bar: "none (info)",
            pass: None,
        },
        Row {
            name: "chunk split peak RSS (MiB)",
            ours: format!("{split_rss_mib:.1} MiB"),
            anchor: "64 MiB budget".into(),
            ratio: split_rss_mib / 64.0,
            bar: "<= 1.00 of budget",
            pass: Some(split_rss_mib <= 64.0),
        },
    ]
}

/// The OOB check against `openssl dgst -sha256` over the artifact's first hundredth.
fn oob_row(oob: Measured, hundredth: Measured) -> Row {
    let ratio = oob.wall.as_secs_f64() / hundredth.wall.as_secs_f64();
    Row {
        name: "OOB check time / openssl of 1 %",
        ours: secs(oob),
        anchor: format!("{} (openssl dgst -sha256, 1st 1/100)", secs(hundredth)),
        ratio,
        bar: "<= 1.00",
        pass: Some(ratio <= 1.0),
    }
}

/// `openssl dgst -sha256` over the first hundredth of `input` (copied to `sample`, from the page
/// cache): the anchor of the rows whose work must not grow with the artifact.
pub(crate) fn openssl_of_hundredth(input: &Path, sample: &Path) -> Result<Measured, String> {
    let hundredth = (fs::metadata(input).map_err(|e| e.to_string())?.len() / 100).max(1);
    copy_prefix(input, sample, hundredth)?;
    warm(sample)?;
    eprintln!(
        "bench: anchor openssl dgst -sha256 over the first hundredth ({} KiB)",
        hundredth >> 10
    );
    let anchor = openssl_anchor(sample);
    let _ = fs::remove_file(sample);
    anchor
}

/// `openssl dgst -sha256 PATH`, best of [`RUNS`]: the hashing anchor of every bench group.
pub(crate) fn openssl_anchor(path: &Path) -> Result<Measured, String> {
    best_of(
        RUNS,
        || {},
        || quiet(Command::new("openssl").args(["dgst", "-sha256"]).arg(path)),
    )
}

/// An exclusive `flock` on `path`, held until the file is dropped (the kernel drops it when the
/// process ends, however it ends); an error naming the holder's wait when another bench has it.
fn bench_lock(path: &Path) -> Result<File, String> {
    use std::os::fd::AsRawFd;
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns; LOCK_EX | LOCK_NB are plain ints.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(format!(
            "another `cargo xtask bench` is running in this target directory ({} is locked)\n\
             next: wait for it to finish; two benches at once would time each other",
            path.display()
        ));
    }
    Ok(f)
}

/// Copy the first `len` bytes of `from` to `to`.
fn copy_prefix(from: &Path, to: &Path, len: u64) -> Result<(), String> {
    let src = File::open(from).map_err(|e| format!("{}: {e}", from.display()))?;
    let mut dst = File::create(to).map_err(|e| format!("{}: {e}", to.display()))?;
    std::io::copy(&mut src.take(len), &mut dst).map_err(|e| format!("{}: {e}", to.display()))?;
    Ok(())
}

/// Buffer size of the bench artifact's OOB records: 1 MiB, so a 1 GiB artifact has 1024
/// records (more than a compiled model has), each one a seek and an 8-byte read for the check.
pub(crate) const OOB_BUFFER: u64 = 1 << 20;

/// Turn the pseudo-random file into an out-of-band pickle container in place, as every v25
/// artifact is: an 8-byte LE opcode length, a protocol-5 opcode stream ending in STOP, then
/// (8-byte LE length, buffer) records of at most `buffer` bytes tiling the rest.
pub(crate) fn frame_oob(path: &Path, len: u64, buffer: u64) -> Result<(), String> {
    use std::io::{Seek, SeekFrom};
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut f = fs::OpenOptions::new().write(true).open(path).map_err(err)?;
    let opcodes: u64 = 9;
    let mut head = (opcodes as i64).to_le_bytes().to_vec();
    head.extend_from_slice(&[0x80, 0x05]);
    f.write_all(&head).map_err(err)?;
    f.seek(SeekFrom::Start(8 + opcodes - 1)).map_err(err)?;
    f.write_all(b".").map_err(err)?;
    let mut pos = 8 + opcodes;
    while pos < len {
        let left = len - pos;
        let mut n = (left - 8).min(buffer);
        if (1..8).contains(&(left - 8 - n)) {
            n = left - 8;
        }
        f.seek(SeekFrom::Start(pos)).map_err(err)?;
        f.write_all(&(n as i64).to_le_bytes()).map_err(err)?;
        pos += 8 + n;
    }
    f.sync_all().map_err(err)
}

pub fn secs(m: Measured) -> String {
    format!("{:.3} s", m.wall.as_secs_f64())
}

/// `cmd` as set up (arguments, environment, directory) with its stdout discarded, for timing;
/// [`util::measure`] keeps its stderr and shows it if it fails.
pub fn quiet(cmd: &mut Command) -> Command {
    let fresh = Command::new(cmd.get_program());
    let mut c = std::mem::replace(cmd, fresh);
    c.stdout(Stdio::null());
    c
}

/// Incompressible, reproducible bytes (xorshift), written in 1 MiB blocks.
pub fn write_pseudo_random(path: &PathBuf, len: u64) -> Result<(), String> {
    let f = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut block = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for word in block.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        w.write_all(&block[..n]).map_err(|e| e.to_string())?;
        left -= n as u64;
    }
    w.into_inner()
        .map_err(|e| e.to_string())?
        .sync_all()
        .map_err(|e| e.to_string())
}

/// Read the file once so every contender starts from the page cache.
fn warm(path: &Path) -> Result<(), String> {
    let mut f = File::open(path).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1 << 20];
    while f.read(&mut buf).map_err(|e| e.to_string())? > 0 {}
    Ok(())
}

fn print_table(size_mib: Option<u64>, rows: &[Row]) {
    let on = size_mib.map_or(String::new(), |s| format!(" on a {s} MiB artifact"));
    println!(
        "\nbenchmarks{on} (best of {RUNS}, of {WRITE_RUNS} for the durable writes; ratios are ours vs the anchor in this run)\n"
    );
    println!(
        "{:<38} {:>12}  {:<48} {:>7}  {:<18} result",
        "benchmark", "ours", "anchor", "ratio", "bar"
    );
    for r in rows {
        println!(
            "{:<38} {:>12}  {:<48} {:>7.3}  {:<18} {}",
            r.name,
            r.ours,
            r.anchor,
            r.ratio,
            r.bar,
            match r.pass {
                Some(true) => "ok",
                Some(false) => "MISSED",
                None => "info",
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_bench_is_refused_while_the_first_holds_the_lock() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-lock-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("xtask-bench.lock");
        let first = bench_lock(&path).unwrap();
        let e = bench_lock(&path).unwrap_err();
        assert!(e.contains("another `cargo xtask bench` is running"), "{e}");
        drop(first);
        bench_lock(&path).unwrap();
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_names_row_groups() {
        let ok = |v: &str| Selection::parse(v).unwrap();
        assert_eq!(ok("split"), Selection(vec!["split"]));
        assert_eq!(ok("oob,split"), Selection(vec!["oob", "split"]));
        assert_eq!(ok(&GROUPS.join(",")), Selection::all());
        for (bad, says) in [
            ("", "unknown row group \"\""),
            ("splt", "unknown row group \"splt\""),
            ("split,", "unknown row group \"\""),
            ("split,split", "named twice"),
            ("Split", "unknown row group"),
            ("split oob", "unknown row group"),
        ] {
            let e = Selection::parse(bad).unwrap_err();
            assert!(e.contains(says) && e.contains("next: "), "{bad:?}: {e}");
        }
        let s = ok("device,fallback");
        assert!(s.has("device") && s.has("fallback") && !s.has("split"));
        assert!(s.needs_artifact());
        assert!(!ok("github,budget,fallback").needs_artifact());
        assert!(ok("oob").needs_artifact());
    }
}
