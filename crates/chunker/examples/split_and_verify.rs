//! Split a model file into a chunk set and verify the set, as a release script would before
//! uploading it.
//!
//! Usage: split_and_verify FILE OUT_DIR [CHUNK_BYTES]
//!
//! Writes `NAME.chunkNNofMM`, `NAME.sha256` and `NAME.chunkmanifest` into OUT_DIR (created if
//! missing; an earlier set of the same name is replaced), then reads the set back by its logical
//! name and checks its size, chunk count and every chunk's and the whole file's SHA-256 against
//! what the split reported. Prints one line per chunk and the whole digest.

use std::path::PathBuf;
use std::process::ExitCode;

use chunker::{DEFAULT_CHUNK_SIZE, Expected, SplitOptions, split_file, verify};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (file, out, chunk_size) = match &args[..] {
        [f, o] => (PathBuf::from(f), PathBuf::from(o), DEFAULT_CHUNK_SIZE),
        [f, o, c] => match c.parse() {
            Ok(c) => (PathBuf::from(f), PathBuf::from(o), c),
            Err(_) => return usage(&format!("CHUNK_BYTES {c:?} is not a whole number")),
        },
        _ => return usage("expected FILE and OUT_DIR"),
    };
    match run(&file, &out, chunk_size) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

// `..Default::default()` on purpose: the program keeps compiling when options are added.
#[allow(clippy::needless_update)]
fn run(file: &std::path::Path, out: &std::path::Path, chunk_size: u64) -> chunker::Result<()> {
    std::fs::create_dir_all(out)?;
    let opts = SplitOptions {
        chunk_size,
        ..SplitOptions::default()
    };
    let report = split_file(file, out, &opts)?;
    for chunk in &report.chunks {
        println!("{}  {:>12} bytes  {}", chunk.sha256, chunk.size, chunk.name);
    }

    let expected = Expected {
        sha256: Some(report.sha256),
        size: Some(report.size),
        chunk_count: Some(report.chunk_count),
        chunk_sha256: Some(report.chunks.iter().map(|c| c.sha256).collect()),
        ..Expected::default()
    };
    let checked = verify(&out.join(&report.name), &expected)?;
    println!(
        "{}  {:>12} bytes  {} ({} chunks, verified)",
        checked.sha256, checked.size, report.name, checked.chunk_count
    );
    Ok(())
}

fn usage(why: &str) -> ExitCode {
    eprintln!("{why}\nusage: split_and_verify FILE OUT_DIR [CHUNK_BYTES]");
    ExitCode::from(2)
}
