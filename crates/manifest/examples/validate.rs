//! Check a manifest file before publishing it, or one fetched from a store.
//!
//! Usage: validate MANIFEST.json [reader|catalog|release]
//!
//! Reads at most the default size limit (2 MiB), then lists every problem with its JSON path,
//! one per line, at the level asked for (default `release`: what a publish requires). Exits 0
//! when the manifest is valid, 1 when it has problems, 2 on a usage or read error. A valid
//! manifest is summarised: its generation and tinygrad pin when it names them, and each model.

use std::process::ExitCode;

use manifest::{Limits, Manifest, ValidationMode, validate_bytes};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, mode) = match &args[..] {
        [p] => (p, ValidationMode::Release),
        [p, m] => match m.as_str() {
            "reader" => (p, ValidationMode::Reader),
            "catalog" => (p, ValidationMode::Catalog),
            "release" => (p, ValidationMode::Release),
            other => return usage(&format!("unknown level {other:?}")),
        },
        _ => return usage("expected one manifest file"),
    };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(2);
        }
    };

    let problems = validate_bytes(&bytes, mode, &Limits::default());
    if !problems.is_empty() {
        for p in &problems {
            println!("{path}: {p}");
        }
        eprintln!(
            "{path}: {} problem(s) at the {mode:?} level",
            problems.len()
        );
        return ExitCode::FAILURE;
    }

    // Valid at this level, so it parses: summarise it.
    let manifest = Manifest::from_slice(&bytes).expect("a valid manifest parses");
    if let Some(generation) = manifest.generation() {
        println!("generation {generation}");
    }
    if let Some(commit) = manifest.tinygrad_commit() {
        println!("tinygrad {commit}");
    }
    for entry in manifest.models() {
        let version = entry.version().map(|v| v.to_string()).unwrap_or_default();
        let artifact = match entry.artifact() {
            Some(a) => format!("{} bytes, {} chunk(s), {}", a.size, a.chunk_count, a.sha256),
            None => "no artifact".into(),
        };
        println!("{} {version} {}: {artifact}", entry.id(), entry.file_name());
    }
    println!("{path}: valid at the {mode:?} level");
    ExitCode::SUCCESS
}

fn usage(why: &str) -> ExitCode {
    eprintln!("{why}\nusage: validate MANIFEST.json [reader|catalog|release]");
    ExitCode::from(2)
}
