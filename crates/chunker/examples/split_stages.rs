//! Where a split's time goes, stage by stage on the same input, with timers (no profiler
//! needed): reading alone, reading + one SHA-256 (what `openssl dgst` does), two SHA-256 passes
//! on two threads (the split's floor: it hashes every byte twice, for the artifact and for its
//! chunk), the durable O_DIRECT chunk writes alone, and the whole split. Each line gives the
//! best wall time and the best CPU time (user + system, all threads) of RUNS runs: on a machine
//! others share, the CPU time is the steadier figure. Build it like the bench does (`--release`).
//!
//! Usage: split_stages INPUT OUT_DIR [RUNS]

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use chunker::atomic::AtomicFile;
use chunker::{DEFAULT_CHUNK_SIZE, Hasher, IO_BUFFER_SIZE, SplitOptions, split_file};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, out, runs) = match &args[..] {
        [i, o] => (Path::new(i), Path::new(o), 3),
        [i, o, r] => (
            Path::new(i),
            Path::new(o),
            r.parse().expect("RUNS is a number"),
        ),
        _ => {
            eprintln!("usage: split_stages INPUT OUT_DIR [RUNS]");
            std::process::exit(2);
        }
    };
    let best = |f: &dyn Fn()| {
        let runs: Vec<(Duration, Duration)> = (0..runs)
            .map(|_| {
                // SAFETY: sync(2) takes no arguments and cannot fail.
                unsafe { libc::sync() };
                let (t, c) = (Instant::now(), cpu_time());
                f();
                (t.elapsed(), cpu_time() - c)
            })
            .collect();
        (
            runs.iter().map(|r| r.0).min().unwrap(),
            runs.iter().map(|r| r.1).min().unwrap(),
        )
    };
    read_all(input, |_| {});
    let read = best(&|| read_all(input, |_| {}));
    let hash1 = best(&|| {
        let mut h = Hasher::new();
        read_all(input, |b| h.update(b));
        std::hint::black_box(h.finish());
    });
    let hash2 = best(&|| {
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut h = Hasher::new();
                    read_all(input, |b| h.update(b));
                    std::hint::black_box(h.finish());
                });
            }
        })
    });
    let write = best(&|| {
        std::fs::create_dir_all(out).unwrap();
        let mut f: Option<AtomicFile> = None;
        let mut n = 0u64;
        let mut i = 0;
        read_all(input, |b| {
            if f.is_none() {
                i += 1;
                f = Some(AtomicFile::create_direct(out.join(format!("w{i}"))).unwrap());
            }
            f.as_mut().unwrap().write_piece(b).unwrap();
            n += b.len() as u64;
            if n.is_multiple_of(DEFAULT_CHUNK_SIZE) {
                f.take().unwrap().sync().unwrap();
            }
        });
        if let Some(mut f) = f {
            f.sync().unwrap();
        }
    });
    let _ = std::fs::remove_dir_all(out);
    let split = best(&|| {
        let _ = std::fs::remove_dir_all(out);
        std::fs::create_dir_all(out).unwrap();
        split_file(input, out, &SplitOptions::default()).unwrap();
    });
    let _ = std::fs::remove_dir_all(out);
    let s = |(wall, cpu): (Duration, Duration)| {
        format!(
            "{:.3} s wall, {:.2} s CPU",
            wall.as_secs_f64(),
            cpu.as_secs_f64()
        )
    };
    println!("read only                      {}", s(read));
    println!("read + 1 SHA-256               {}", s(hash1));
    println!("2 x (read + SHA-256), 2 thr.   {}", s(hash2));
    println!("read + O_DIRECT write + fsync  {}", s(write));
    println!("split                          {}", s(split));
}

/// User + system time of this process so far, every thread included (`/proc/self/stat`, in
/// the kernel's fixed 100 ticks a second); zero where there is no `/proc`.
fn cpu_time() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // The fields after the command name (which may hold spaces): utime and stime are the
    // 14th and 15th of the line, the 12th and 13th after the name.
    let after = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
    let ticks: u64 = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

/// Read `path` in [`IO_BUFFER_SIZE`] pieces (page aligned, as the split's pool buffers are).
fn read_all(path: &Path, mut each: impl FnMut(&[u8])) {
    let mut f = std::fs::File::open(path).unwrap();
    let mut mem = vec![0u8; IO_BUFFER_SIZE + 4096];
    let start = mem.as_ptr().align_offset(4096);
    let buf = &mut mem[start..start + IO_BUFFER_SIZE];
    loop {
        let mut filled = 0;
        while filled < buf.len() {
            let n = f.read(&mut buf[filled..]).unwrap();
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            break;
        }
        each(&buf[..filled]);
        if filled < buf.len() {
            break;
        }
    }
}
