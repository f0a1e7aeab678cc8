//! The build half: `tinygrad bump`, `sync`, `compile`, `dm`, `builtin`, `validate` (and the shared
//! remote flags `rebuild` uses too). Thin over `compiler-remote`; see `docs/release.md`.

use std::fs;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

use chunker::{SplitOptions, atomic};
use clap::{Args, Subcommand};
use compiler_remote::{
    CompileRequest, Compiler, ConnectOptions, Destination, InputFormat, RemotePath,
};
use manifest::{BehaviorVersion, Generation, GitCommit, ModelId};
use serde::Serialize;

use crate::output::print_json;
use crate::{CliError, CliResult};

/// Flags every command that talks to the compiler takes.
#[derive(Debug, Clone, Args)]
pub struct RemoteArgs {
    /// The compiler, `[USER@]HOST` (an alias from ~/.ssh/config works). Only the supported
    /// compiler is accepted without --allow-other-compiler.
    #[arg(long, value_name = "[USER@]HOST", default_value = compiler_remote::SUPPORTED_COMPILER)]
    pub remote: Destination,
    /// openpilot's directory on the compiler.
    #[arg(long, value_name = "PATH", default_value = compiler_remote::DEFAULT_REMOTE_ROOT)]
    pub remote_root: RemotePath,
    /// Accept a compiler other than comma@192.168.3.110 (only with the release owner's approval).
    #[arg(long)]
    pub allow_other_compiler: bool,
    /// The local openpilot tree; its tinygrad_repo/TINYGRAD_COMMIT is the pin unless
    /// --tinygrad-commit is given.
    #[arg(long, value_name = "DIR")]
    pub openpilot: Option<PathBuf>,
    /// The tinygrad commit the compiler must have (full 40-hex SHA).
    #[arg(long, value_name = "SHA")]
    pub tinygrad_commit: Option<GitCommit>,
    /// An ssh config file to use instead of ~/.ssh/config (ssh's -F).
    #[arg(long, value_name = "FILE", env = "STARPILOT_SSH_CONFIG")]
    pub ssh_config: Option<PathBuf>,
    /// The local rsync program (must be rsync 3.x, not macOS openrsync).
    #[arg(long, value_name = "PROGRAM", default_value = "rsync")]
    pub rsync: PathBuf,
}

impl RemoteArgs {
    pub fn pin(&self) -> CliResult<GitCommit> {
        compiler_remote::resolve_pin(self.tinygrad_commit.clone(), self.openpilot.as_deref())
            .map_err(remote_error)
    }

    pub fn connect(&self) -> CliResult<Compiler> {
        Compiler::connect(ConnectOptions {
            destination: self.remote.clone(),
            allow_other_compiler: self.allow_other_compiler,
            remote_root: self.remote_root.clone(),
            ssh_config: self.ssh_config.clone(),
            rsync: self.rsync.clone(),
            ..ConnectOptions::default()
        })
        .map_err(remote_error)
    }
}

/// Map a compiler error to the CLI's exit codes: refused flags are usage errors, failed checks
/// (marker, digest, outputs) are check failures, the rest are failures.
pub fn remote_error(e: compiler_remote::Error) -> CliError {
    use compiler_remote::Error as E;
    match e {
        E::OtherCompiler { .. } | E::InvalidDestination { .. } | E::InvalidRemotePath { .. } => {
            CliError::usage(e)
        }
        E::Pin { .. } | E::TreeIncomplete { .. } | E::Source { .. } => CliError::usage(e),
        E::MarkerMissing { .. }
        | E::MarkerMismatch { .. }
        | E::DigestMismatch { .. }
        | E::InvalidOutputs { .. }
        | E::MissingOutputs { .. }
        | E::DmIncomplete { .. }
        | E::HostKeyNotKnown { .. } => CliError::check_failed(e),
        other => CliError::failure(other),
    }
}

/// Print live compiler output on stderr so stdout stays machine-readable.
pub fn live(line: &str) {
    eprintln!("{line}");
}

#[derive(Debug, Subcommand)]
pub enum TinygradCommand {
    /// Replace tinygrad_repo/ from a tinygrad tree (without git metadata), write the commit to
    /// tinygrad_repo/TINYGRAD_COMMIT, and say which generation comes next.
    Bump(BumpArgs),
}

#[derive(Debug, Args)]
pub struct BumpArgs {
    /// The openpilot tree whose tinygrad_repo/ is replaced.
    #[arg(long, value_name = "DIR")]
    pub openpilot: PathBuf,
    /// The tinygrad tree at the new commit (a git checkout is checked against --commit).
    #[arg(long, value_name = "DIR")]
    pub tinygrad_src: PathBuf,
    /// The full tinygrad commit.
    #[arg(long, value_name = "SHA")]
    pub commit: GitCommit,
    /// Print `{"openpilot","commit","files","generation":{"from","to"},"manifest_candidates"}`
    /// (`generation` is null when --commit is already the current generation's pin).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SyncArgs {
    /// Print `{"destination","remote_root","transfers":[…],"tinygrad_commit"}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten, next_help_heading = "Compiler options")]
    pub remote: RemoteArgs,
}

#[derive(Debug, Args)]
pub struct CompileArgs {
    /// The model ID (the release ID; --local builds `local-<id>`).
    #[arg(long, value_name = "ID")]
    pub model: ModelId,
    /// The behaviour version, e.g. v16. It never changes with tinygrad.
    #[arg(long, value_name = "vN")]
    pub version: BehaviorVersion,
    /// Compile for Chestnut, the USB AMD external GPU.
    #[arg(long)]
    pub gpu: bool,
    /// `supercombo` (default) or `split` for legacy split sources.
    #[arg(long, value_name = "FORMAT", default_value = "supercombo")]
    pub input_format: InputFormat,
    /// Build `local-<id>`: one plain PKL, never published.
    #[arg(long)]
    pub local: bool,
    /// The model's ONNX file(s); exactly these are staged.
    #[arg(long = "source", value_name = "ONNX", required = true, num_args = 1..)]
    pub sources: Vec<PathBuf>,
    /// Where the verified chunk set (or local PKL) goes.
    #[arg(long, value_name = "DIR", alias = "out-dir")]
    pub out: PathBuf,
    /// The compile log (default: logs/<id>.log).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Print `{"model","log","artifact":{"name","size","sha256","chunk_count","files"}}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten, next_help_heading = "Compiler options")]
    pub remote: RemoteArgs,
}

#[derive(Debug, Args)]
pub struct DmArgs {
    /// Where the four DM files go (written only when all four came back).
    #[arg(long, value_name = "DIR", alias = "out-dir")]
    pub out: PathBuf,
    /// The DM ONNX (default: <--openpilot>/selfdrive/modeld/models/dmonitoring_model.onnx).
    #[arg(long = "source", value_name = "ONNX")]
    pub sources: Vec<PathBuf>,
    /// Where ./models --dm writes on the compiler.
    #[arg(long, value_name = "PATH", default_value = compiler_remote::plan::DEFAULT_DM_OUTPUT_DIR)]
    pub remote_output_dir: RemotePath,
    /// The build log (default: logs/dm.log).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Print `{"out","log","files":[{"name","size","sha256"}]}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten, next_help_heading = "Compiler options")]
    pub remote: RemoteArgs,
}

#[derive(Debug, Args)]
pub struct BuiltinArgs {
    /// The RDF V4 artifact: a plain PKL, or the logical path of a chunk set.
    #[arg(long, value_name = "PKL")]
    pub artifact: PathBuf,
    /// The openpilot tree whose selfdrive/modeld/models/driving_tinygrad.pkl is replaced.
    #[arg(long, value_name = "DIR")]
    pub openpilot: PathBuf,
    /// Print `{"path","size","sha256","chunk_count","removed"}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The model to validate.
    #[arg(long, value_name = "ID")]
    pub model: ModelId,
    /// Its behaviour version (default: from <workspace>/results/<id>.json).
    #[arg(long, value_name = "vN")]
    pub version: Option<BehaviorVersion>,
    /// The rebuild workspace: the artifact defaults to ready/<id>/, the verdict goes to
    /// results/<id>.validation.json.
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// The chunk set's logical path (default: <workspace>/ready/<id>/<id>_driving_tinygrad.pkl).
    #[arg(long, value_name = "PATH")]
    pub artifact: Option<PathBuf>,
    /// Where the verdict is recorded (default: <workspace>/results/<id>.validation.json).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// The models directory on the compiler the validator reads.
    #[arg(long, value_name = "PATH", default_value = "/data/models")]
    pub remote_models_dir: RemotePath,
    /// The Python the validator runs with on the compiler.
    #[arg(
        long,
        value_name = "PROGRAM",
        default_value = "/usr/local/venv/bin/python3"
    )]
    pub python: String,
    /// The validation log (default: logs/<id>.validate.log, under the workspace when given).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Print `{"model","passed","verdict","record","log"}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten, next_help_heading = "Compiler options")]
    pub remote: RemoteArgs,
}

pub fn tinygrad(command: TinygradCommand) -> CliResult {
    match command {
        TinygradCommand::Bump(a) => bump(a),
    }
}

pub fn sync(args: SyncArgs) -> CliResult {
    let openpilot = args.remote.openpilot.clone().ok_or_else(|| {
        CliError::usage("sync needs --openpilot DIR, the tree to send to the compiler")
    })?;
    let pin = args.remote.pin()?;
    let bar = crate::progress::spinner(format!("connecting to {}", args.remote.remote), args.json);
    let c = args.remote.connect();
    bar.set_message(format!(
        "syncing {} to {}:{}",
        openpilot.display(),
        args.remote.remote,
        args.remote.remote_root
    ));
    let report = c.and_then(|c| c.sync(&openpilot, &pin).map_err(remote_error));
    bar.finish_and_clear();
    let report = report?;
    if args.json {
        return print_json(&report);
    }
    for t in &report.transfers {
        crate::outln!("synced {t}")?;
    }
    crate::outln!(
        "ok: {}:{}/tinygrad_repo/TINYGRAD_COMMIT is {}",
        report.destination,
        report.remote_root,
        report.tinygrad_commit
    )?;
    eprintln!(
        "next: `release-cli compile --model ID …` for one model, or `release-cli rebuild …` for the generation"
    );
    Ok(())
}

#[derive(Serialize)]
struct CompileReport<'a> {
    model: String,
    log: &'a Path,
    artifact: &'a compiler_remote::FetchedArtifact,
}

pub fn compile(args: CompileArgs) -> CliResult {
    let req = CompileRequest {
        id: args.model.clone(),
        version: args.version,
        gpu: args.gpu,
        input_format: args.input_format,
        local: args.local,
    };
    let log = args
        .log
        .clone()
        .unwrap_or_else(|| PathBuf::from("logs").join(format!("{}.log", req.build_id())));
    let pin = args.remote.pin()?;
    let c = args.remote.connect()?;
    let artifact = c
        .compile(&req, &args.sources, &pin, &args.out, &log, &mut live)
        .map_err(remote_error)?;
    if args.json {
        return print_json(&CompileReport {
            model: req.build_id().to_string(),
            log: &log,
            artifact: &artifact,
        });
    }
    crate::outln!(
        "ok: {} ({} bytes, sha256 {}, {} chunk(s)) in {}; log {}",
        artifact.name,
        artifact.size,
        artifact.sha256,
        artifact.chunk_count,
        args.out.display(),
        log.display()
    )?;
    if args.local {
        eprintln!(
            "next: copy {} to the device's /data/models; local builds are never published",
            args.out.join(&artifact.name).display()
        );
    } else {
        eprintln!(
            "next: `release-cli validate --model {} --version {} --artifact {}`, then publish it",
            req.build_id(),
            args.version,
            args.out.join(&artifact.name).display()
        );
    }
    Ok(())
}

#[derive(Serialize)]
struct DmReport<'a> {
    out: &'a Path,
    log: &'a Path,
    files: &'a [compiler_remote::DmFile],
}

pub fn dm(args: DmArgs) -> CliResult {
    let sources = if args.sources.is_empty() {
        let op = args.remote.openpilot.as_ref().ok_or_else(|| {
            CliError::usage("dm needs --source ONNX or --openpilot DIR (for its DM ONNX)")
        })?;
        vec![op.join("selfdrive/modeld/models/dmonitoring_model.onnx")]
    } else {
        args.sources.clone()
    };
    let log = args
        .log
        .clone()
        .unwrap_or_else(|| PathBuf::from("logs/dm.log"));
    let pin = args.remote.pin()?;
    let c = args.remote.connect()?;
    let files = c
        .build_dm(
            &sources,
            &pin,
            &args.remote_output_dir,
            &args.out,
            &log,
            &mut live,
        )
        .map_err(remote_error)?;
    if args.json {
        return print_json(&DmReport {
            out: &args.out,
            log: &log,
            files: &files,
        });
    }
    for f in &files {
        crate::outln!("  {}  {:>10}  {}", f.sha256, f.size, f.name)?;
    }
    crate::outln!(
        "ok: all four DM files in {}; replace them together",
        args.out.display()
    )?;
    Ok(())
}

/// The built-in model's logical name in the openpilot tree.
const BUILTIN_NAME: &str = "driving_tinygrad.pkl";
/// GitHub refuses files over 100 MB; nothing that size may stay in the tree.
const REPOSITORY_FILE_LIMIT: u64 = 100_000_000;

#[derive(Serialize)]
struct BuiltinReport {
    path: PathBuf,
    size: u64,
    sha256: chunker::Sha256Digest,
    chunk_count: u32,
    removed: Vec<String>,
}

pub fn builtin(args: BuiltinArgs) -> CliResult {
    let models = args.openpilot.join("selfdrive/modeld/models");
    if !models.is_dir() {
        return Err(CliError::usage(format!(
            "{} does not exist; is --openpilot the openpilot tree?",
            models.display()
        )));
    }
    // The artifact may carry a sidecar (a compile output does); then it must match. Bounded
    // read: a bogus multi-gigabyte "sidecar" is reported, not loaded.
    let expected = match args.artifact.file_name() {
        Some(n) => chunker::read_sidecar(
            &args
                .artifact
                .with_file_name(chunker::sidecar_name(&n.to_string_lossy())),
        )?,
        None => None,
    };
    let mut reader = chunker::open(&args.artifact)?;
    // The built-in model is a v25 driving artifact like any other: an OOB container.
    chunker::check_oob_reader(&mut reader, &args.artifact.display().to_string())?;
    reader
        .seek(std::io::SeekFrom::Start(0))
        .map_err(|e| io_err(&args.artifact, e))?;
    let size = reader.len();
    let bar = crate::progress::bytes_bar(size, "splitting the built-in model", args.json);
    let reader = crate::progress::ProgressReader {
        inner: reader,
        bar: bar.clone(),
    };
    let staging = models.join(format!(
        "{}builtin-{}",
        atomic::TEMP_PREFIX,
        std::process::id()
    ));
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(|e| io_err(&staging, e))?;
    }
    fs::create_dir_all(&staging).map_err(|e| io_err(&staging, e))?;
    let result = (|| {
        let report = chunker::split_reader(
            reader,
            size,
            BUILTIN_NAME,
            &staging,
            &SplitOptions {
                chunk_size: chunker::DEFAULT_CHUNK_SIZE,
            },
        )?;
        if let Some(want) = expected
            && want != report.sha256
        {
            return Err(CliError::check_failed(format!(
                "{}: SHA-256 {} does not match its .sha256 ({want}); the built-in model was not \
                 changed",
                args.artifact.display(),
                report.sha256
            )));
        }
        // Remove the old built-in in every form it may have: a plain PKL, chunks, legacy parts.
        let mut removed = Vec::new();
        for entry in fs::read_dir(&models).map_err(|e| io_err(&models, e))? {
            let entry = entry.map_err(|e| io_err(&models, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if (name == BUILTIN_NAME || name.starts_with(&format!("{BUILTIN_NAME}.")))
                && entry.path().is_file()
            {
                fs::remove_file(entry.path()).map_err(|e| io_err(&entry.path(), e))?;
                removed.push(name);
            }
        }
        removed.sort();
        let mut names: Vec<String> = report.chunks.iter().map(|c| c.name.clone()).collect();
        names.push(chunker::sidecar_name(BUILTIN_NAME));
        names.push(chunker::chunk_manifest_name(BUILTIN_NAME));
        for n in &names {
            fs::rename(staging.join(n), models.join(n)).map_err(|e| io_err(&models.join(n), e))?;
        }
        atomic::sync_dir(&models).map_err(|e| io_err(&models, e))?;
        if let Some(big) = report
            .chunks
            .iter()
            .find(|c| c.size > REPOSITORY_FILE_LIMIT)
        {
            return Err(CliError::failure(format!(
                "{} is {} bytes, over GitHub's 100 MB limit",
                big.name, big.size
            )));
        }
        Ok(BuiltinReport {
            path: models.join(BUILTIN_NAME),
            size: report.size,
            sha256: report.sha256,
            chunk_count: report.chunk_count,
            removed,
        })
    })();
    bar.finish_and_clear();
    let _ = fs::remove_dir_all(&staging);
    let report = result?;
    if args.json {
        return print_json(&report);
    }
    crate::outln!(
        "ok: {} is now a chunk set ({} bytes, sha256 {}, {} chunk(s)); removed {}",
        report.path.display(),
        report.size,
        report.sha256,
        report.chunk_count,
        if report.removed.is_empty() {
            "nothing".to_string()
        } else {
            report.removed.join(", ")
        }
    )?;
    crate::outln!(
        "next: commit selfdrive/modeld/models/driving_tinygrad.pkl.* (no full PKL remains)"
    )?;
    Ok(())
}

#[derive(Serialize)]
struct ValidateReport<'a> {
    model: &'a ModelId,
    passed: bool,
    verdict: &'a serde_json::Value,
    record: &'a Path,
    log: &'a Path,
}

pub fn validate(args: ValidateArgs) -> CliResult {
    let id = &args.model;
    let ws = args.workspace.as_deref();
    let version = match (args.version, ws) {
        (Some(v), _) => v,
        (None, Some(ws)) => crate::cmd::rebuild::recorded_version(ws, id)?,
        (None, None) => {
            return Err(CliError::usage(
                "validate needs --version vN, or --workspace DIR with a recorded build",
            ));
        }
    };
    let artifact_name = manifest::layout::artifact_file_name(id)
        .as_str()
        .to_string();
    let artifact = match (&args.artifact, ws) {
        (Some(a), _) => a.clone(),
        (None, Some(ws)) => ws.join("ready").join(id.as_str()).join(&artifact_name),
        (None, None) => {
            return Err(CliError::usage(
                "validate needs --artifact PATH or --workspace DIR",
            ));
        }
    };
    let record = match (&args.record, ws) {
        (Some(r), _) => r.clone(),
        (None, Some(ws)) => ws.join("results").join(format!("{id}.validation.json")),
        (None, None) => PathBuf::from(format!("{id}.validation.json")),
    };
    let log = args.log.clone().unwrap_or_else(|| {
        ws.unwrap_or(Path::new("."))
            .join("logs")
            .join(format!("{id}.validate.log"))
    });
    let pin = args.remote.pin()?;
    let c = args.remote.connect()?;
    let verdict = c
        .validate(
            id,
            version,
            &artifact,
            &pin,
            &args.remote_models_dir,
            &args.python,
            &log,
            &mut live,
        )
        .map_err(remote_error)?;
    // Record the validator's own JSON, unchanged.
    if let Some(dir) = record.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    }
    let mut text = serde_json::to_string_pretty(&verdict.verdict).map_err(CliError::failure)?;
    text.push('\n');
    atomic::write_atomic(&record, text.as_bytes()).map_err(|e| io_err(&record, e))?;
    if args.json {
        print_json(&ValidateReport {
            model: id,
            passed: verdict.passed,
            verdict: &verdict.verdict,
            record: &record,
            log: &log,
        })?;
    } else {
        crate::outln!(
            "{}: the device validator says {}; verdict recorded in {}",
            id,
            if verdict.passed { "passed" } else { "FAILED" },
            record.display()
        )?;
    }
    if verdict.passed {
        Ok(())
    } else {
        Err(CliError::check_failed(format!(
            "{id} failed device validation; see {} and {}",
            record.display(),
            log.display()
        )))
    }
}

pub fn io_err(path: &Path, e: std::io::Error) -> CliError {
    CliError::failure(format!("{}: {e}", path.display()))
}

// ---- tinygrad bump ------------------------------------------------------------------------

#[derive(Serialize)]
struct BumpReport {
    openpilot: PathBuf,
    commit: GitCommit,
    files: u64,
    generation: Option<GenerationMove>,
    manifest_candidates: Option<String>,
}

#[derive(Serialize)]
struct GenerationMove {
    from: Generation,
    to: Generation,
}

fn bump(args: BumpArgs) -> CliResult {
    let src = &args.tinygrad_src;
    if !src.is_dir() {
        return Err(CliError::usage(format!(
            "--tinygrad-src {} is not a directory",
            src.display()
        )));
    }
    if !args.openpilot.is_dir() {
        return Err(CliError::usage(format!(
            "--openpilot {} is not a directory",
            args.openpilot.display()
        )));
    }
    // The generation↔pin pair first (pure, before anything is written): the same pin as the
    // current generation is the same ABI (no new generation); a new pin makes the next
    // generation, and a pin another generation has, or a second pin for the next generation,
    // is refused.
    let mut pins = super::store::load_pins(Some(&args.openpilot))?;
    let candidates = find_manifest_candidates(&args.openpilot);
    let current = candidates
        .as_ref()
        .and_then(|(_, _, gens)| gens.iter().max().copied())
        .unwrap_or(manifest::layout::CURRENT_GENERATION);
    let same_abi = pins.owner_of(&args.commit) == Some(current);
    let generation = if same_abi {
        None
    } else {
        let to = current
            .next()
            .ok_or_else(|| CliError::usage(format!("{current} is the last generation number")))?;
        pins.record(to, &args.commit)
            .map_err(|e| CliError::check_failed(format!("tinygrad bump refused: {e}")))?;
        Some(GenerationMove { from: current, to })
    };
    // A git checkout must be at the commit we are about to record.
    if src.join(".git").exists() {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(src)
            .args(["rev-parse", "HEAD"])
            .output()
            .map_err(|e| CliError::failure(format!("git rev-parse in {}: {e}", src.display())))?;
        let head = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || head != args.commit.as_str() {
            return Err(CliError::check_failed(format!(
                "{} is at {head:?}, not {}; check out the commit first",
                src.display(),
                args.commit
            )));
        }
    }
    let dest = args.openpilot.join("tinygrad_repo");
    let new = args
        .openpilot
        .join(format!("{}tinygrad_repo-new", atomic::TEMP_PREFIX));
    let old = args
        .openpilot
        .join(format!("{}tinygrad_repo-old", atomic::TEMP_PREFIX));
    for p in [&new, &old] {
        if p.exists() {
            fs::remove_dir_all(p).map_err(|e| io_err(p, e))?;
        }
    }
    let files = copy_tree_without_git(src, &new)?;
    atomic::write_atomic(
        new.join("TINYGRAD_COMMIT"),
        format!("{}\n", args.commit).as_bytes(),
    )
    .map_err(|e| io_err(&new, e))?;
    // Swap by rename so tinygrad_repo/ is never half old, half new.
    if dest.exists() {
        fs::rename(&dest, &old).map_err(|e| io_err(&dest, e))?;
    }
    fs::rename(&new, &dest).map_err(|e| io_err(&dest, e))?;
    atomic::sync_dir(&args.openpilot).map_err(|e| io_err(&args.openpilot, e))?;
    if old.exists() {
        fs::remove_dir_all(&old).map_err(|e| io_err(&old, e))?;
    }

    // Recorded after the swap: a crash in between leaves the pair unrecorded, and rerunning
    // the same bump records it.
    if generation.is_some() {
        let path = args.openpilot.join(manifest::pins::PINS_FILE);
        atomic::write_atomic(&path, pins.to_json().as_bytes()).map_err(|e| io_err(&path, e))?;
    }
    let report = BumpReport {
        openpilot: args.openpilot.clone(),
        commit: args.commit.clone(),
        files,
        manifest_candidates: candidates
            .as_ref()
            .map(|(p, line, _)| format!("{}:{line}", p.display())),
        generation,
    };
    if args.json {
        return print_json(&report);
    }
    crate::outln!(
        "ok: {} replaced ({} files, no git metadata); TINYGRAD_COMMIT = {}",
        dest.display(),
        report.files,
        args.commit
    )?;
    match &report.generation {
        Some(g) => crate::outln!(
            "recorded {} = tinygrad {} in {} (publish --openpilot {} checks manifests against it)",
            g.to,
            args.commit,
            args.openpilot.join(manifest::pins::PINS_FILE).display(),
            args.openpilot.display()
        )?,
        None => crate::outln!(
            "{} is already {current}'s pin: same ABI, no new generation",
            args.commit
        )?,
    }
    if let Some(g) = &report.generation {
        crate::outln!(
            "next generation: {} -> {}. Build and publish it with --generation {} \
             (rebuild, publish); never fall back to {}.",
            g.from,
            g.to,
            g.to,
            g.from
        )?;
        match &report.manifest_candidates {
            Some(at) => crate::outln!(
                "change MANIFEST_CANDIDATES at {at} to (\"{}\",) by hand: this tool does not edit \
                 Python",
                g.to
            )?,
            None => crate::outln!(
                "MANIFEST_CANDIDATES was not found under {}; set it to (\"{}\",) wherever the \
                 device code defines it",
                args.openpilot.join("starpilot").display(),
                g.to
            )?,
        }
    }
    crate::outln!(
        "then: release-cli sync --openpilot {}",
        args.openpilot.display()
    )?;
    Ok(())
}

/// Copy a directory tree, skipping every `.git` entry (directory or gitfile) at any depth.
fn copy_tree_without_git(src: &Path, dst: &Path) -> CliResult<u64> {
    fs::create_dir_all(dst).map_err(|e| io_err(dst, e))?;
    let mut count = 0;
    for entry in fs::read_dir(src).map_err(|e| io_err(src, e))? {
        let entry = entry.map_err(|e| io_err(src, e))?;
        if entry.file_name() == ".git" {
            continue;
        }
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let ty = entry.file_type().map_err(|e| io_err(&from, e))?;
        if ty.is_symlink() {
            let target = fs::read_link(&from).map_err(|e| io_err(&from, e))?;
            std::os::unix::fs::symlink(&target, &to).map_err(|e| io_err(&to, e))?;
            count += 1;
        } else if ty.is_dir() {
            count += copy_tree_without_git(&from, &to)?;
        } else {
            fs::copy(&from, &to).map_err(|e| io_err(&to, e))?;
            count += 1;
        }
    }
    Ok(count)
}

/// Find `MANIFEST_CANDIDATES = ("v25",)` in the device code under `starpilot/`.
fn find_manifest_candidates(openpilot: &Path) -> Option<(PathBuf, usize, Vec<Generation>)> {
    let mut stack = vec![openpilot.join("starpilot")];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        let mut entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "py") {
                let mut text = String::new();
                if fs::File::open(&p)
                    .and_then(|mut f| f.read_to_string(&mut text))
                    .is_err()
                {
                    continue;
                }
                for (i, line) in text.lines().enumerate() {
                    let t = line.trim_start();
                    if let Some(rest) = t.strip_prefix("MANIFEST_CANDIDATES") {
                        let gens = parse_generations(rest);
                        if !gens.is_empty() {
                            return Some((p, i + 1, gens));
                        }
                    }
                }
            }
        }
    }
    None
}

/// The `"vNN"` strings in a Python tuple literal.
fn parse_generations(text: &str) -> Vec<Generation> {
    text.split(['"', '\''])
        .filter_map(|s| s.parse::<Generation>().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_in_python() {
        assert_eq!(
            parse_generations(" = (\"v25\",)"),
            vec![Generation::new(25)]
        );
        assert_eq!(
            parse_generations(": tuple[str, ...] = ('v24', 'v25')"),
            vec![Generation::new(24), Generation::new(25)]
        );
        assert!(parse_generations(" = ()").is_empty());
    }
}
