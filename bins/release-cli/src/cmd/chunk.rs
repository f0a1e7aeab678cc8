//! `release-cli chunk split|join|verify|oob`.

use std::fs::File;
use std::path::{Path, PathBuf};

use chunker::{Expected, Sha256Digest, SplitOptions};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::output::print_json;
use crate::progress::bytes_bar;
use crate::units::parse_size;
use crate::{CliError, CliResult};

#[derive(Debug, Subcommand)]
pub enum ChunkCommand {
    /// Split FILE into a chunk set named after it: `NAME.chunk01ofNN` …, `NAME.sha256`, and
    /// `NAME.chunkmanifest` written last. FILE itself is left in place.
    Split(SplitArgs),
    /// Join a chunk set (or legacy `.pNN` parts) back into one file, atomically.
    Join(JoinArgs),
    /// Check a chunk set: every chunk present, sizes, count and SHA-256. Exits 3 on a problem.
    Verify(VerifyArgs),
    /// Check that an artifact (chunk set or plain file) is an out-of-band pickle container, as
    /// every v25 driving artifact must be: the header and every buffer record tile the file
    /// exactly. Reads only the headers. Exits 3, naming the byte offset, when it is not.
    Oob(OobArgs),
}

#[derive(Debug, Args)]
pub struct OobArgs {
    /// The artifact (its chunk set, plain file or legacy parts): its logical path, any file of
    /// its set (`….chunk01of02`, `….chunkmanifest`, `….sha256`, `….p00`), or the directory
    /// holding exactly one set, as `verify` and `join` take it. Nothing there is "not found",
    /// exit 1.
    #[arg(value_name = "ARTIFACT")]
    pub logical: PathBuf,
    /// Print `{"path","size","opcode_len","protocol","buffers","buffer_bytes"}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SplitArgs {
    /// The artifact to split, e.g. `pop223_driving_tinygrad.pkl`.
    pub file: PathBuf,
    /// Where to write the chunk set (default: FILE's directory).
    #[arg(long, value_name = "DIR", alias = "out")]
    pub out_dir: Option<PathBuf>,
    /// Bytes per chunk: a number of bytes or a size with a unit (`45MiB`, `1GiB`, `500kB`).
    #[arg(long, value_name = "SIZE", default_value = "45MiB", value_parser = parse_size)]
    pub chunk_size: u64,
    /// Check FILE (a regular file, not empty), the chunk size and the chunk count, list the
    /// output directory, and print the chunks (names and sizes) it would write and the files it
    /// would remove (chunks of an earlier set with another count, stale temporaries of an
    /// interrupted split). Writes nothing: no chunk, no temporary, no output directory. Does not
    /// read FILE's contents, so prints no SHA-256.
    #[arg(long)]
    pub dry_run: bool,
    /// Print `{"name","size","sha256","chunk_count","chunks":[{"name","size","sha256"}]}`; with
    /// --dry-run `{"dry_run":true,"out_dir","name","size","chunk_count","chunks":[{"name","size"}],
    /// "written":[…],"removed":[…]}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct JoinArgs {
    /// The artifact: its logical path (`out/pop223_driving_tinygrad.pkl`), any file of its set
    /// (`….chunk01of02`, `….chunkmanifest`, `….sha256`, `….p00`), or the directory holding
    /// exactly one set. Nothing there is "not found", exit 1.
    #[arg(value_name = "ARTIFACT")]
    pub logical: PathBuf,
    /// The file to write.
    #[arg(long, short, value_name = "FILE")]
    pub output: PathBuf,
    /// Expected SHA-256 of the whole artifact (default: the `.sha256` sidecar beside it); the
    /// joined bytes must match it or nothing is written. A chunk set with neither (as Python's
    /// chunker writes them) is checked by its count and chunk sizes.
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<Sha256Digest>,
    /// Read every chunk and check the set as the join would (every chunk present, the SHA-256
    /// against the `.sha256` sidecar when there is one), check that OUTPUT's directory exists,
    /// and print what would be written (OUTPUT, its size and SHA-256, whether it replaces a
    /// file). Writes nothing, not even a temporary.
    #[arg(long)]
    pub dry_run: bool,
    /// Print `{"output","size","sha256"}`; with --dry-run
    /// `{"dry_run":true,"output","size","sha256","replaces"}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The artifact whose chunk set (or plain file, or legacy parts) to check: its logical
    /// path, any file of its set (`….chunk01of02`, `….chunkmanifest`, `….sha256`, `….p00`), or
    /// the directory holding exactly one set. Nothing there is "not found", exit 1.
    #[arg(value_name = "ARTIFACT")]
    pub logical: PathBuf,
    /// Expected SHA-256 of the whole artifact (default: the `.sha256` sidecar beside it). A
    /// chunk set without a sidecar (as Python's chunker writes them) is checked by its count
    /// and chunk sizes only, unless this is given; a plain file needs it or a sidecar.
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<Sha256Digest>,
    /// Expected size of the whole artifact in bytes.
    #[arg(long, value_name = "N")]
    pub size: Option<u64>,
    /// Expected chunk count (0 means one plain file).
    #[arg(long, value_name = "N")]
    pub chunk_count: Option<u32>,
    /// Print `{"path","form","size","sha256","chunk_count","chunks":[{"name","size"}]}` (`form` is
    /// `plain`, `chunked` or `legacy`).
    #[arg(long)]
    pub json: bool,
}

pub fn run(command: ChunkCommand) -> CliResult {
    match command {
        ChunkCommand::Split(a) => split(a),
        ChunkCommand::Join(a) => join(a),
        ChunkCommand::Verify(a) => verify(a),
        ChunkCommand::Oob(a) => oob(a),
    }
}

fn oob(mut args: OobArgs) -> CliResult {
    args.logical = locate(&args.logical)?;
    let layout = chunker::check_oob(&args.logical)?;
    if args.json {
        #[derive(serde::Serialize)]
        struct OobReport<'a> {
            path: &'a Path,
            #[serde(flatten)]
            layout: chunker::OobLayout,
        }
        return print_json(&OobReport {
            path: &args.logical,
            layout,
        });
    }
    crate::outln!(
        "{}: OOB pickle container, {}: {}-byte protocol-{} opcode stream and {} buffer(s) of {}",
        args.logical.display(),
        cli_support::progress::bytes(layout.size),
        layout.opcode_len,
        layout.protocol,
        layout.buffers,
        cli_support::progress::bytes(layout.buffer_bytes)
    )
}

fn split(args: SplitArgs) -> CliResult {
    let out_dir = match &args.out_dir {
        Some(d) => d.clone(),
        None => parent_of(&args.file),
    };
    let name = args
        .file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| CliError::usage(format!("{} is not a file", args.file.display())))?;
    let file = File::open(&args.file)
        .map_err(|e| CliError::failure(format!("{}: {e}", args.file.display())))?;
    let meta = file
        .metadata()
        .map_err(|e| CliError::failure(format!("{}: {e}", args.file.display())))?;
    if !meta.is_file() {
        return Err(CliError::usage(format!(
            "{} is not a regular file; give the artifact file to split, e.g. out/pop223_driving_tinygrad.pkl",
            args.file.display()
        )));
    }
    let size = meta.len();
    let opts = SplitOptions {
        chunk_size: args.chunk_size,
    };
    if args.dry_run {
        return split_dry_run(&args, &name, size, &out_dir, &opts);
    }
    // Every directory created is fsynced up to the one that existed (a power cut after the
    // split must not take the new directory, and the set in it, away).
    chunker::atomic::create_dir_all_durable(&out_dir)
        .map_err(|e| CliError::failure(format!("{}: {e}", out_dir.display())))?;
    let bar = bytes_bar(size, format!("splitting {name}"), args.json);
    // The file checked above is the one split, even if its path is replaced meanwhile.
    let report = chunker::split_open_file(file, &args.file, &out_dir, &opts, &|n| bar.inc(n));
    bar.finish_and_clear();
    let report = report?;
    if args.json {
        return print_json(&report);
    }
    crate::outln!(
        "{}: {}, sha256 {}, {} chunk(s) in {}",
        report.name,
        cli_support::progress::bytes(report.size),
        report.sha256,
        report.chunk_count,
        out_dir.display()
    )?;
    for c in &report.chunks {
        crate::outln!("  {}  {:>12}  {}", c.sha256, c.size, c.name)?;
    }
    cli_support::info!(
        "next: check it with `release-cli chunk verify {}`; publish takes --artifacts DIR where this directory is DIR/<id>/",
        out_dir.join(&report.name).display()
    );
    Ok(())
}

/// `chunk split --dry-run`: the plan, and nothing written.
fn split_dry_run(
    args: &SplitArgs,
    name: &str,
    size: u64,
    out_dir: &Path,
    opts: &SplitOptions,
) -> CliResult {
    let plan = chunker::plan_split(name, size, out_dir, opts)?;
    if args.json {
        #[derive(serde::Serialize)]
        struct SplitDryRun<'a, P: serde::Serialize> {
            #[serde(flatten)]
            plan: &'a P,
            dry_run: bool,
            out_dir: &'a Path,
        }
        return print_json(&SplitDryRun {
            plan: &plan,
            dry_run: true,
            out_dir,
        });
    }
    crate::outln!(
        "dry run: would split {} ({}) into {} chunk(s) in {}{}",
        args.file.display(),
        cli_support::progress::bytes(size),
        plan.chunk_count,
        out_dir.display(),
        if out_dir.is_dir() {
            ""
        } else {
            " (would create the directory)"
        }
    )?;
    for c in &plan.chunks {
        crate::outln!(
            "  would write {}  {}",
            c.name,
            cli_support::progress::bytes(c.size)
        )?;
    }
    for n in plan.written.iter().skip(plan.chunks.len()) {
        crate::outln!("  would write {n}")?;
    }
    for n in &plan.removed {
        crate::outln!("  would remove {n}")?;
    }
    crate::outln!("nothing was changed; run the same command without --dry-run")
}

fn parent_of(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `chunk join --json` (and, with `dry_run` and `replaces`, its `--dry-run`).
#[derive(Serialize)]
struct JoinReport<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    dry_run: Option<bool>,
    output: &'a Path,
    size: u64,
    sha256: Sha256Digest,
    #[serde(skip_serializing_if = "Option::is_none")]
    replaces: Option<bool>,
}

/// The artifact's size for a progress bar; 0 when it cannot be found (the operation itself then
/// reports why).
fn logical_size(logical: &Path) -> u64 {
    chunker::resolve(logical)
        .ok()
        .flatten()
        .map_or(0, |r| r.size())
}

/// The logical artifact path `input` names ([`chunker::locate`]): nothing there is "not found",
/// exit 1 as for any missing input file; a directory with several sets is a usage error.
fn locate(input: &Path) -> CliResult<PathBuf> {
    chunker::locate(input).map_err(|e| match e {
        chunker::Error::NotFound { .. } => CliError::failure(e),
        chunker::Error::AmbiguousDirectory { .. } => CliError::usage(e),
        other => other.into(),
    })
}

fn join(mut args: JoinArgs) -> CliResult {
    args.logical = locate(&args.logical)?;
    if args.dry_run {
        return join_dry_run(&args);
    }
    let bar = bytes_bar(
        logical_size(&args.logical),
        format!("joining {}", args.logical.display()),
        args.json,
    );
    let joined = chunker::join_checked(&args.logical, &args.output, args.sha256, &mut |n| {
        bar.inc(n)
    });
    bar.finish_and_clear();
    let (sha256, size) = joined?;
    if args.json {
        return print_json(&JoinReport {
            dry_run: None,
            output: &args.output,
            size,
            sha256,
            replaces: None,
        });
    }
    crate::outln!(
        "wrote {} ({}, sha256 {sha256})",
        args.output.display(),
        cli_support::progress::bytes(size)
    )?;
    cli_support::info!(
        "next: `release-cli chunk split {}` makes a chunk set of it again",
        args.output.display()
    );
    Ok(())
}

/// `chunk join --dry-run`: every check the join makes (it reads and hashes the set), nothing
/// written.
fn join_dry_run(args: &JoinArgs) -> CliResult {
    let expected = Expected {
        sha256: match args.sha256 {
            Some(d) => Some(d),
            None => chunker::read_sidecar(&sidecar_path(&args.logical)?)?,
        },
        ..Expected::default()
    };
    let out_dir = parent_of(&args.output);
    if !out_dir.is_dir() {
        return Err(CliError::failure(format!(
            "{}: the directory to write {} into does not exist",
            out_dir.display(),
            args.output.display()
        )));
    }
    let bar = bytes_bar(
        logical_size(&args.logical),
        format!("checking {}", args.logical.display()),
        args.json,
    );
    let report = chunker::verify_with_progress(&args.logical, &expected, &mut |n| bar.inc(n));
    bar.finish_and_clear();
    let report = report?;
    let replaces = args.output.exists();
    if args.json {
        return print_json(&JoinReport {
            dry_run: Some(true),
            output: &args.output,
            size: report.size,
            sha256: report.sha256,
            replaces: Some(replaces),
        });
    }
    crate::outln!(
        "dry run: would write {} ({}, sha256 {}){}, joined from the {} artifact {}",
        args.output.display(),
        cli_support::progress::bytes(report.size),
        report.sha256,
        if replaces {
            ", replacing the file there"
        } else {
            ""
        },
        report.form,
        args.logical.display()
    )?;
    crate::outln!("nothing was changed; run the same command without --dry-run")
}

fn verify(mut args: VerifyArgs) -> CliResult {
    args.logical = locate(&args.logical)?;
    let mut expected = Expected {
        sha256: args.sha256,
        size: args.size,
        chunk_count: args.chunk_count,
        chunk_sha256: None,
        // The sidecar is read below, with what to say when there is none.
        own_sidecar: chunker::OwnSidecar::Ignore,
    };
    let mut against_sidecar = false;
    let mut digest_unchecked = false;
    if expected.sha256.is_none() {
        let sidecar = sidecar_path(&args.logical)?;
        // No sidecar and no artifact either is "not found" (exit 1, as a missing input file is
        // for every command), not a complaint about the sidecar.
        if !sidecar.exists() && matches!(chunker::resolve(&args.logical), Ok(None)) {
            return Err(chunker::Error::NotFound {
                path: args.logical.clone(),
            }
            .into());
        }
        // Bounded read: a bogus multi-gigabyte "sidecar" is reported, not loaded.
        match chunker::read_sidecar(&sidecar)? {
            Some(digest) => {
                expected.sha256 = Some(digest);
                against_sidecar = true;
            }
            // A set Python's chunker wrote has no sidecar: its count and sizes still say a lot.
            None if matches!(
                chunker::resolve(&args.logical)?,
                Some(chunker::Resolved::Chunked { .. })
            ) =>
            {
                digest_unchecked = true;
            }
            None => {
                return Err(CliError::usage(format!(
                    "no --sha256 given and no sidecar {} to check against; pass --sha256 HEX",
                    sidecar.display()
                )));
            }
        }
    }
    let bar = bytes_bar(
        logical_size(&args.logical),
        format!("verifying {}", args.logical.display()),
        args.json,
    );
    let report = chunker::verify_with_progress(&args.logical, &expected, &mut |n| bar.inc(n));
    bar.finish_and_clear();
    let report = report?;
    if args.json {
        if digest_unchecked {
            let mut v = serde_json::to_value(&report).map_err(CliError::failure)?;
            v["sha256_checked"] = false.into();
            return print_json(&v);
        }
        return print_json(&report);
    }
    crate::outln!(
        "ok: {} ({}, {}, {} chunk(s), sha256 {}{})",
        args.logical.display(),
        report.form,
        cli_support::progress::bytes(report.size),
        report.chunk_count,
        report.sha256,
        if against_sidecar {
            ", matches the .sha256 sidecar"
        } else if digest_unchecked {
            "; no .sha256 sidecar, so the count and chunk sizes were checked, not the digest"
        } else {
            ""
        }
    )?;
    if digest_unchecked {
        cli_support::info!(
            "the digest was not checked: give the manifest's artifact_sha256 with --sha256 to check it too"
        );
    }
    Ok(())
}

fn sidecar_path(logical: &Path) -> CliResult<PathBuf> {
    let name = logical
        .file_name()
        .ok_or_else(|| CliError::usage(format!("{} is not a file path", logical.display())))?;
    Ok(parent_of(logical).join(chunker::sidecar_name(&name.to_string_lossy())))
}
