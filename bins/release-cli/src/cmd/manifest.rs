//! `release-cli manifest validate|fmt|diff`.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};
use manifest::{Limits, Manifest, ManifestDiff, ValidationMode};
use serde_json::{Value, json};

use crate::output::print_json;
use crate::{CliError, CliResult};

#[derive(Debug, Subcommand)]
pub enum ManifestCommand {
    /// Check a manifest and list every problem with its JSON path. Exits 3 if there is any.
    Validate(ValidateArgs),
    /// Print the manifest's canonical bytes (what the Python release tools write) on stdout.
    Fmt(FmtArgs),
    /// Show, model by model, what was added, removed and changed between two manifests.
    Diff(DiffArgs),
    /// Sign a manifest with a minisign key: writes MANIFEST.minisig with the trusted comment
    /// `generation=<gen> release=<N> expires=<unix seconds>`.
    Sign(super::sign::SignArgs),
    /// Check a manifest's signature as a device with these public keys would. Exits 3 if a
    /// device would refuse it.
    Verify(super::sign::VerifyArgs),
}

/// How much `validate` demands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// What every device enforces when reading: shape, valid unique IDs, well-formed fields.
    Reader,
    /// A complete catalog, with or without artifact fields (e.g. the v25 catalog).
    Catalog,
    /// What `publish` accepts: every entry downloadable (format, size, SHA-256, chunk count).
    Release,
}

impl From<Mode> for ValidationMode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Reader => ValidationMode::Reader,
            Mode::Catalog => ValidationMode::Catalog,
            Mode::Release => ValidationMode::Release,
        }
    }
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The manifest, e.g. `model_names_v25.json`.
    pub file: PathBuf,
    /// Strictness; `release` is what `publish` requires.
    #[arg(long, value_enum, default_value_t = Mode::Catalog)]
    pub mode: Mode,
    /// Print `{"file","mode","valid","models","problems":[{"path","message"}]}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct FmtArgs {
    /// The manifest to format.
    pub file: PathBuf,
    /// Print nothing; exit 3 if the file is not already in canonical form.
    #[arg(long)]
    pub check: bool,
    /// With --check: print `{"file","canonical"}`.
    #[arg(long, requires = "check")]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The old manifest (e.g. the live one).
    pub old: PathBuf,
    /// The new manifest.
    pub new: PathBuf,
    /// Print `{"top_level":[…],"added":[…],"removed":[…],"changed":[{"id","fields":[{"field","old","new"}]}]}`.
    #[arg(long)]
    pub json: bool,
}

pub fn run(command: ManifestCommand) -> CliResult {
    match command {
        ManifestCommand::Validate(a) => validate(a),
        ManifestCommand::Fmt(a) => fmt(a),
        ManifestCommand::Diff(a) => diff(a),
        ManifestCommand::Sign(a) => super::sign::sign(a),
        ManifestCommand::Verify(a) => super::sign::verify(a),
    }
}

/// A manifest file's bytes, read no further than one byte past the fleet's size limit.
/// `Err(size)` when the file is over the limit: its real size where the file system knows it.
fn read_bounded(path: &Path) -> CliResult<Result<Vec<u8>, u64>> {
    use std::io::Read;
    let limit = Limits::default().max_manifest_bytes;
    let file = std::fs::File::open(path)
        .map_err(|e| CliError::failure(format!("{}: {e}", path.display())))?;
    let known = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| CliError::failure(format!("{}: {e}", path.display())))?;
    if bytes.len() as u64 > limit {
        return Ok(Err(known.max(bytes.len() as u64)));
    }
    Ok(Ok(bytes))
}

fn too_large_message(size: u64) -> String {
    format!(
        "manifest is {size} bytes, more than the limit of {} bytes that devices enforce",
        Limits::default().max_manifest_bytes
    )
}

/// Read a manifest file for a command that needs all of it; over the size limit is a failed
/// check (exit 3) naming the file and its size.
pub(crate) fn read_limited(path: &Path) -> CliResult<Vec<u8>> {
    read_bounded(path)?.map_err(|size| {
        CliError::check_failed(format!(
            "{}: {}; devices would refuse it, so shrink it (fewer entries or fields) before using it",
            path.display(),
            too_large_message(size)
        ))
    })
}

fn load(path: &Path) -> CliResult<Manifest> {
    parse(path, &read_limited(path)?)
}

/// Parse a manifest file's bytes; a malformed one is a failed check pointing at `validate`.
fn parse(path: &Path, bytes: &[u8]) -> CliResult<Manifest> {
    Manifest::from_slice_limited(bytes, &Limits::default()).map_err(|e| {
        CliError::check_failed(format!(
            "{}: {e}\nnext: `release-cli manifest validate {}` lists every problem",
            path.display(),
            path.display()
        ))
    })
}

fn validate(args: ValidateArgs) -> CliResult {
    let (bytes, problems) = match read_bounded(&args.file)? {
        Ok(bytes) => {
            let problems = manifest::validate_bytes(&bytes, args.mode.into(), &Limits::default());
            (bytes, problems)
        }
        Err(size) => (
            Vec::new(),
            vec![manifest::Problem {
                path: "$".into(),
                message: too_large_message(size),
            }],
        ),
    };
    let models = if problems.is_empty() {
        Manifest::from_slice(&bytes)
            .map(|m| m.models().len())
            .unwrap_or(0)
    } else {
        0
    };
    let mode = format!("{:?}", args.mode).to_lowercase();
    if args.json {
        print_json(&json!({
            "file": args.file,
            "mode": mode,
            "valid": problems.is_empty(),
            "models": models,
            "problems": problems.iter().map(|p| json!({"path": p.path, "message": p.message})).collect::<Vec<_>>(),
        }))?;
    } else if problems.is_empty() {
        println!(
            "ok: {} is a valid manifest ({models} models, {mode} rules)",
            args.file.display()
        );
        if args.mode != Mode::Release {
            eprintln!(
                "next: `release-cli manifest validate --mode release {}` checks what publish requires",
                args.file.display()
            );
        }
    } else {
        for p in &problems {
            println!("{p}");
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CliError::check_failed(format!(
            "{}: {} problem{} ({mode} rules)",
            args.file.display(),
            problems.len(),
            if problems.len() == 1 { "" } else { "s" }
        )))
    }
}

fn fmt(args: FmtArgs) -> CliResult {
    let original = read_limited(&args.file)?;
    let canonical = parse(&args.file, &original)?.to_canonical_bytes();
    if args.check {
        let is_canonical = canonical == original;
        if args.json {
            print_json(&json!({"file": args.file, "canonical": is_canonical}))?;
        }
        return if is_canonical {
            Ok(())
        } else {
            Err(CliError::check_failed(format!(
                "{} is not in canonical form; `release-cli manifest fmt {} > new.json` writes it",
                args.file.display(),
                args.file.display()
            )))
        };
    }
    crate::output::write_stdout(&canonical)
}

fn diff(args: DiffArgs) -> CliResult {
    let old = load(&args.old)?;
    let new = load(&args.new)?;
    let d = manifest::diff(&old, &new);
    if args.json {
        return print_json(&diff_json(&d));
    }
    print!("{d}");
    if !d.is_empty() {
        println!(
            "summary: {} added, {} removed, {} changed",
            d.added.len(),
            d.removed.len(),
            d.changed.len()
        );
    }
    Ok(())
}

fn diff_json(d: &ManifestDiff) -> Value {
    let field = |c: &manifest::FieldChange| json!({"field": c.field, "old": c.old, "new": c.new});
    json!({
        "top_level": d.top_level.iter().map(field).collect::<Vec<_>>(),
        "added": d.added.iter().map(|id| id.as_str()).collect::<Vec<_>>(),
        "removed": d.removed.iter().map(|id| id.as_str()).collect::<Vec<_>>(),
        "changed": d.changed.iter().map(|m| json!({
            "id": m.id.as_str(),
            "fields": m.fields.iter().map(field).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}
