//! `--only install`: the device's verified, durable install (download, SHA-256 of the whole
//! artifact, fsync, rename) in the shapes the field has, each against `aria2c` downloading the
//! same chunks over as many connections (download only: no verification, no fsync) and against
//! the link limit (every connection at its full rate the whole time, plus one round trip), in
//! the same run.
//!
//! The shapes vary what decides an install's time: as many connections as chunks or fewer; a
//! per-connection cap of 4, 16 or 32 MiB/s; 20 or 100 ms before each answer; the threaded origin
//! (`test-http-server`) or a plain single-threaded one that answers each connection's requests in
//! order (`test-http-server --single-thread`). The slower shapes' artifacts are smaller (4 chunks
//! of 16 or 24 MiB) so that their rows take seconds, not a minute; the chunks keep the shape (one
//! per connection, or two), as `chunk split --chunk-size` cuts them.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::bench::{RUNS, Row, WRITE_RUNS, quiet, secs, write_pseudo_random};
use crate::bench_device::{device_command, entry, mkdirs, run_ok, sidecar_digest, spawn_server};
use crate::util::{self, Measured, best_of};

const GENERATION: &str = "v25";
/// Peak RSS budget of one install (the device download's, at any connection count).
const RSS_BUDGET_MIB: f64 = 32.0;

/// One shape of the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub connections: u32,
    pub chunks: u32,
    pub chunk_mib: u64,
    pub rate_mib: u64,
    pub latency_ms: u64,
    pub single_thread: bool,
}

/// The shapes every bench run measures (see the module docs). Each transfer lasts about 3 s at
/// the link limit, so that the fixed costs a device cannot avoid (a process start, one round
/// trip to learn what the origin publishes) stay a small part of it.
pub const SHAPES: [Shape; 5] = [
    // Measured in the field (issue 39): one 45 MiB chunk per connection, a single-threaded origin.
    Shape {
        connections: 4,
        chunks: 4,
        chunk_mib: 45,
        rate_mib: 16,
        latency_ms: 20,
        single_thread: true,
    },
    // Fewer connections than chunks, fast ones, the threaded origin.
    Shape {
        connections: 2,
        chunks: 4,
        chunk_mib: 45,
        rate_mib: 32,
        latency_ms: 20,
        single_thread: false,
    },
    // Slow connections far away (4 chunks of 16 MiB: 4 s at 4 x 4 MiB/s).
    Shape {
        connections: 4,
        chunks: 4,
        chunk_mib: 16,
        rate_mib: 4,
        latency_ms: 100,
        single_thread: false,
    },
    // The field's artifact far away, on the single-threaded origin.
    Shape {
        connections: 4,
        chunks: 4,
        chunk_mib: 45,
        rate_mib: 16,
        latency_ms: 100,
        single_thread: true,
    },
    // Fewer connections than chunks, far away, on the single-threaded origin.
    Shape {
        connections: 2,
        chunks: 4,
        chunk_mib: 24,
        rate_mib: 16,
        latency_ms: 100,
        single_thread: true,
    },
];

impl Shape {
    pub fn size(&self) -> u64 {
        u64::from(self.chunks) * (self.chunk_mib << 20)
    }

    /// `4c 4x45M 16M/s 20ms 1thr`: what the row's name shows.
    pub fn label(&self) -> String {
        format!(
            "{}c {}x{}M {}M/s {}ms {}",
            self.connections,
            self.chunks,
            self.chunk_mib,
            self.rate_mib,
            self.latency_ms,
            if self.single_thread { "1thr" } else { "thr" }
        )
    }

    /// Every connection at its full rate the whole time, plus one round trip to start.
    pub fn link_limit_s(&self) -> f64 {
        self.size() as f64 / (u64::from(self.connections) * (self.rate_mib << 20)) as f64
            + self.latency_ms as f64 / 1000.0
    }

    /// aria2c at this connection count: `connections` chunks at once, each over one connection
    /// (a chunk is what one connection of ours starts on too).
    pub fn aria2c_args(&self) -> Vec<String> {
        let j = self.connections.to_string();
        vec![
            "-j".into(),
            j,
            "-x".into(),
            "1".into(),
            "-s".into(),
            "1".into(),
        ]
    }
}

/// What one shape measured.
pub struct Measures {
    pub ours: Measured,
    pub aria2c: Measured,
}

/// The rows of every shape, and the peak RSS of the largest.
pub fn rows(work: &Path) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    let mut worst_rss: (f64, String) = (0.0, String::new());
    for (i, shape) in SHAPES.iter().enumerate() {
        let m = measure(work, i, shape)?;
        rows.extend(shape_rows(shape, &m));
        let rss = m.ours.max_rss_kib as f64 / 1024.0;
        if rss > worst_rss.0 {
            worst_rss = (rss, shape.label());
        }
    }
    rows.push(Row {
        name: "install shapes: peak RSS (largest)",
        ours: format!("{:.1} MiB", worst_rss.0),
        anchor: format!("{RSS_BUDGET_MIB:.0} MiB budget ({})", worst_rss.1),
        ratio: worst_rss.0 / RSS_BUDGET_MIB,
        bar: "<= 1.00 of budget",
        pass: Some(worst_rss.0 <= RSS_BUDGET_MIB),
    });
    Ok(rows)
}

/// The two rows of a shape: against aria2c (>= 1.0) and against the link limit (>= 0.95).
pub fn shape_rows(shape: &Shape, m: &Measures) -> Vec<Row> {
    let ours = m.ours.wall.as_secs_f64();
    let vs_aria = m.aria2c.wall.as_secs_f64() / ours;
    let limit = shape.link_limit_s();
    let vs_link = limit / ours;
    let label = shape.label();
    vec![
        Row {
            name: leak(format!("install {label} / aria2c")),
            ours: secs(m.ours),
            anchor: format!(
                "{} (aria2c -j {} -x 1, download only)",
                secs(m.aria2c),
                shape.connections
            ),
            ratio: vs_aria,
            bar: ">= 1.0",
            pass: Some(vs_aria >= 1.0),
        },
        Row {
            name: leak(format!("install {label} / link")),
            ours: secs(m.ours),
            anchor: format!(
                "{limit:.3} s ({} x {} MiB/s + {} ms)",
                shape.connections, shape.rate_mib, shape.latency_ms
            ),
            ratio: vs_link,
            bar: ">= 0.95",
            pass: Some(vs_link >= 0.95),
        },
    ]
}

/// Row names live as long as the table: a handful of strings per bench run.
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Publish the shape's artifact, serve it as the shape says, and time our install and aria2c.
fn measure(work: &Path, i: usize, shape: &Shape) -> Result<Measures, String> {
    let release = util::target_dir().join("release");
    let cli = release.join("release-cli");
    let dmm = release.join("device-modeld-manager");
    let base = work.join(format!("shape{i}"));
    let origin = base.join("origin");
    let hf = origin.join("hf");
    let id = format!("shape{i}");
    let model_dir = hf.join(format!("models/{GENERATION}/{id}"));
    mkdirs(&model_dir)?;
    mkdirs(&hf.join("manifests"))?;
    mkdirs(&origin.join("gh"))?;
    let name = format!("{id}_driving_tinygrad.pkl");
    let artifact = base.join(&name);
    let size = shape.size();
    eprintln!(
        "bench: install shape {}: publishing {} MiB",
        shape.label(),
        size >> 20
    );
    write_pseudo_random(&artifact, size)?;
    run_ok(
        Command::new(&cli)
            .args(["chunk", "split"])
            .arg(&artifact)
            .arg("--out-dir")
            .arg(&model_dir)
            .args(["--chunk-size", &(shape.chunk_mib << 20).to_string()]),
    )?;
    let sha = sidecar_digest(&model_dir.join(format!("{name}.sha256")))?;
    fs::remove_file(&artifact).map_err(|e| e.to_string())?;
    fs::write(
        hf.join(format!("manifests/model_names_{GENERATION}.json")),
        format!(
            "{{\n  \"models\": [\n{}\n  ]\n}}\n",
            entry(&id, size, &sha, u64::from(shape.chunks))
        ),
    )
    .map_err(|e| e.to_string())?;

    let server_bin = release.join("test-http-server");
    let mut server = Command::new(&server_bin);
    server
        .arg("--dir")
        .arg(&origin)
        .args(["--addr", "127.0.0.1:0"])
        .args(["--rate-per-conn", &(shape.rate_mib << 20).to_string()])
        .args(["--latency-ms", &shape.latency_ms.to_string()]);
    if shape.single_thread {
        server.arg("--single-thread");
    }
    let (_server, url) = spawn_server(&mut server, &server_bin)?;
    let device = base.join("device");
    mkdirs(&device.join("builtin"))?;
    let dmm_cmd = |args: &[&str]| device_command(&dmm, &device, &url, args);
    run_ok(&mut dmm_cmd(&["refresh"]))?;

    let connections = shape.connections.to_string();
    let installed = device.join("models").join(&name);
    let ours = best_of(
        WRITE_RUNS,
        || {
            let _ = fs::remove_file(&installed);
        },
        || {
            quiet(&mut dmm_cmd(&[
                "--connections",
                &connections,
                "download",
                &id,
            ]))
        },
    )?;
    if !installed.exists() {
        return Err(format!("download did not install {}", installed.display()));
    }

    let urls: Vec<String> = (1..=shape.chunks)
        .map(|c| {
            format!(
                "{url}/hf/models/{GENERATION}/{id}/{}",
                chunker_name(&name, c, shape.chunks)
            )
        })
        .collect();
    let url_list = base.join("aria2c-urls.txt");
    fs::write(&url_list, urls.join("\n") + "\n").map_err(|e| e.to_string())?;
    let aria_dir = base.join("aria2c");
    let aria2c = best_of(
        RUNS,
        || {
            let _ = fs::remove_dir_all(&aria_dir);
            let _ = fs::create_dir_all(&aria_dir);
        },
        || {
            let mut c = Command::new("aria2c");
            c.arg("--quiet=true")
                .args(shape.aria2c_args())
                .args([
                    "--file-allocation=none",
                    "--allow-overwrite=true",
                    "--auto-file-renaming=false",
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
    if fetched != size {
        return Err(format!("aria2c fetched {fetched} bytes, not {size}"));
    }
    let _ = fs::remove_dir_all(&base);
    Ok(Measures { ours, aria2c })
}

/// `<name>.chunkNNofMM`, as the chunk set names its files.
fn chunker_name(name: &str, i: u32, count: u32) -> String {
    format!("{name}.chunk{i:02}of{count:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every dimension the issue names is covered by some shape: connections equal to chunks
    /// and fewer; caps of 4, 16 and 32 MiB/s; 20 and 100 ms; both origins.
    #[test]
    fn the_shapes_cover_every_dimension() {
        let any = |f: &dyn Fn(&Shape) -> bool| SHAPES.iter().any(f);
        assert!(any(&|s| s.connections == s.chunks));
        assert!(any(&|s| s.connections < s.chunks));
        for rate in [4, 16, 32] {
            assert!(any(&|s| s.rate_mib == rate), "{rate} MiB/s");
        }
        for ms in [20, 100] {
            assert!(any(&|s| s.latency_ms == ms), "{ms} ms");
        }
        assert!(any(&|s| s.single_thread) && any(&|s| !s.single_thread));
        // The field's shape, as measured from outside.
        assert!(SHAPES.contains(&Shape {
            connections: 4,
            chunks: 4,
            chunk_mib: 45,
            rate_mib: 16,
            latency_ms: 20,
            single_thread: true,
        }));
    }

    #[test]
    fn link_limit_and_rows() {
        let s = SHAPES[0];
        assert!((s.link_limit_s() - (180.0 / 64.0 + 0.02)).abs() < 1e-9);
        let m = |secs: f64| Measured {
            wall: std::time::Duration::from_secs_f64(secs),
            max_rss_kib: 10 << 10,
        };
        let rows = shape_rows(
            &s,
            &Measures {
                ours: m(2.9),
                aria2c: m(3.2),
            },
        );
        assert_eq!(rows[0].pass, Some(true));
        assert_eq!(rows[1].pass, Some(true), "{}", rows[1].ratio);
        let rows = shape_rows(
            &s,
            &Measures {
                ours: m(3.5),
                aria2c: m(3.2),
            },
        );
        assert_eq!(rows[0].pass, Some(false));
        assert_eq!(rows[1].pass, Some(false));
        assert_eq!(chunker_name("a.pkl", 2, 4), "a.pkl.chunk02of04");
    }
}
