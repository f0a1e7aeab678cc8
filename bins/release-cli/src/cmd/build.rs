//! The build half: `tinygrad bump`, `sync`, `compile`, `dm`, `builtin`, `validate` (and the shared
//! remote flags `rebuild` uses too). Flags and rendering over `compiler-remote` and, for the
//! openpilot-tree edits (`tinygrad bump`, `builtin`), `release::tree`; see `docs/release.md`.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use compiler_remote::{
    CompileJob, CompileRequest, Compiler, ConnectOptions, Destination, DmJob, InputFormat,
    RemotePath,
};
use manifest::{BehaviorVersion, GitCommit, ModelId};
use serde::Serialize;

use crate::output::{print_json, remote_error, store_error};
use crate::progress::live;
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
    /// The local openpilot tree; without --tinygrad-commit the tinygrad it records is the pin
    /// (upstream-sync.json in a tree that declares its generation, else
    /// tinygrad_repo/TINYGRAD_COMMIT).
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
        // A tree that declares its generation records its tinygrad in its sync file
        // (`release::tree::tree_pin`); any other tree in tinygrad_repo/TINYGRAD_COMMIT.
        Ok(release::tree::resolve_pin(
            self.tinygrad_commit.clone(),
            self.openpilot.as_deref(),
        )?)
    }

    pub fn connect_options(&self) -> ConnectOptions {
        ConnectOptions {
            destination: self.remote.clone(),
            allow_other_compiler: self.allow_other_compiler,
            remote_root: self.remote_root.clone(),
            ssh_config: self.ssh_config.clone(),
            rsync: self.rsync.clone(),
            // The compiler's tree records its tinygrad where the local tree does.
            pin_location: self
                .openpilot
                .as_deref()
                .map_or_else(Default::default, compiler_remote::pin_location),
            ..ConnectOptions::default()
        }
    }

    /// With --openpilot: refuse unless the tree is what its last sync sent to this compiler
    /// (`compile`, `dm`; `rebuild` checks it in `release`). Without it there is no local tree
    /// to compare, which is said.
    pub fn check_synced(&self) -> CliResult<()> {
        match &self.openpilot {
            Some(op) => {
                compiler_remote::synced::check_synced(
                    op,
                    &self.remote.to_string(),
                    self.remote_root.as_str(),
                )
                .map_err(remote_error)?;
            }
            None => cli_support::info!(
                "note: no --openpilot, so the compiler's tree is not compared with a synced local tree"
            ),
        }
        Ok(())
    }

    pub fn connect(&self) -> CliResult<Compiler> {
        Compiler::connect(self.connect_options()).map_err(remote_error)
    }
}

/// Print a dry run's plan: the steps on the compiler, then the local files written and removed;
/// with `--json` one document, the plan with `"dry_run":true` and the `extra` fields.
pub fn print_plan(
    what: &str,
    plan: compiler_remote::dry_run::Plan,
    extra: Option<serde_json::Value>,
    json: bool,
) -> CliResult {
    if json {
        let mut v = serde_json::to_value(&plan).map_err(CliError::failure)?;
        v["dry_run"] = true.into();
        if let Some(serde_json::Value::Object(extra)) = extra {
            for (k, x) in extra {
                v[k] = x;
            }
        }
        return print_json(&v);
    }
    crate::outln!(
        "dry run: {what} on {}:{} (tinygrad {}); nothing was sent, run or written",
        plan.destination,
        plan.remote_root,
        plan.tinygrad_commit
    )?;
    render_plan(&plan, "  ")?;
    cli_support::info!("next: run the same command without --dry-run");
    Ok(())
}

/// The steps and file lists of a plan, one per line, each line starting with `indent`.
pub fn render_plan(plan: &compiler_remote::dry_run::Plan, indent: &str) -> CliResult {
    for s in &plan.steps {
        crate::outln!("{indent}{s}")?;
    }
    let list = |paths: &[PathBuf]| {
        paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !plan.writes.is_empty() {
        crate::outln!("{indent}would write  {}", list(&plan.writes))?;
    }
    if !plan.removes.is_empty() {
        crate::outln!("{indent}would remove {}", list(&plan.removes))?;
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum TinygradCommand {
    /// Replace tinygrad_repo/ from a tinygrad tree (without git metadata), write the commit to
    /// tinygrad_repo/TINYGRAD_COMMIT, and say which generation comes next.
    Bump(BumpArgs),
    /// Correct the recorded pin of a generation not yet published (a mistyped --commit):
    /// rewrite tinygrad_pins.json (and tinygrad_repo/TINYGRAD_COMMIT when it names the old pin).
    /// Refused once a checked store holds that generation's manifest live.
    Pin(PinArgs),
}

#[derive(Debug, Args)]
pub struct PinArgs {
    /// The openpilot tree whose tinygrad_pins.json records the pin.
    #[arg(long, value_name = "DIR")]
    pub openpilot: PathBuf,
    /// The generation whose pin is corrected (one `tinygrad bump` recorded, e.g. v26).
    #[arg(long, value_name = "vNN")]
    pub generation: manifest::Generation,
    /// The correct full tinygrad commit.
    #[arg(long, value_name = "SHA")]
    pub commit: GitCommit,
    /// A store to check for a live manifest of --generation (`hf://buckets/NS/NAME`,
    /// `github:CHECKOUT`, `file:DIR` or a directory). Repeat for every store you publish to; at
    /// least one is required.
    #[arg(long = "store", value_name = "STORE", required = true, value_parser = artifact_store::StoreSpec::parse)]
    pub stores: Vec<artifact_store::StoreSpec>,
    #[command(flatten)]
    pub access: artifact_store::StoreAccess,
    /// Check the stores and say what would be written; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print `{"generation","from","to","stores_checked":[…],"tree_from_git","dry_run",
    /// "written":[…]}` (`from` is null when --commit already is the generation's pin).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BumpArgs {
    /// The openpilot tree whose tinygrad_repo/ is replaced.
    #[arg(long, value_name = "DIR")]
    pub openpilot: PathBuf,
    /// The tinygrad tree at the new commit: a git checkout (the commit is its HEAD) or a plain
    /// directory (then --commit is required).
    #[arg(long, value_name = "DIR")]
    pub tinygrad_src: PathBuf,
    /// The full tinygrad commit. Required for a plain directory (its digest is recorded with
    /// it in tinygrad_repo/TINYGRAD_SOURCE.json); for a git checkout it must be HEAD.
    #[arg(long, value_name = "SHA")]
    pub commit: Option<GitCommit>,
    /// Say what would be written and removed, and change nothing (every refusal still applies).
    #[arg(long)]
    pub dry_run: bool,
    /// Print `{"openpilot","commit","source":{"commit","kind":"git"|"directory","path",
    /// "digest":{"sha256","files"}},"files","generation":{"from","to"},"manifest_candidates",
    /// "dry_run","written":[…],"removed":[…]}` (`generation` is null when --commit is already
    /// the current generation's pin; `written`/`removed` are paths, a directory standing for
    /// its content).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SyncArgs {
    /// Make the local checks a sync makes (the pin, the tree's four parts, the one-compiler
    /// policy, the local rsync, a key for the compiler in known_hosts) and print the command and
    /// the rsync transfers it would run; connect to nothing and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print `{"destination","remote_root","transfers":[…],"tinygrad_commit"}` (with --dry-run
    /// the plan: `{"dry_run":true,"destination","remote_root","tinygrad_commit","steps":[…],
    /// "writes":[…],"removes":[…]}`, each step `{"step":"check_marker"|"run"|"send"|"fetch",…}`).
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
    /// The compile log (default: logs/<id>.log). It holds the device's output, which is also
    /// printed live on stderr unless -q.
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Make the local checks a compile makes (the pin, the sources, the one-compiler policy,
    /// the local rsync, a key for the compiler in known_hosts) and print the commands and rsync
    /// transfers it would run and the local files it would write or replace; connect to
    /// nothing and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print `{"model","log","artifact":{"name","size","sha256","chunk_count","files"}}` (with
    /// --dry-run the plan, shaped as sync's).
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
    /// The build log (default: logs/dm.log). It holds the device's output, which is also
    /// printed live on stderr unless -q.
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Make the local checks a DM build makes (the pin, the sources, the one-compiler policy,
    /// the local rsync, a key for the compiler in known_hosts) and print the commands and rsync
    /// transfers it would run and the four files it would write; connect to nothing and write
    /// nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print `{"out","log","files":[{"name","size","sha256"}]}` (with --dry-run the plan, shaped
    /// as sync's).
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
    /// Read and check the artifact, say what would be written and removed, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print `{"path","size","sha256","chunk_count","dry_run","written":[…],"removed":[…]}`
    /// (file names in selfdrive/modeld/models; `removed` lists old files not replaced by a new
    /// one of the same name).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The model to validate on the device (with --check model-v2: the model modeld ran).
    #[arg(long, value_name = "ID", required_unless_present = "check")]
    pub model: Option<ModelId>,
    /// Its behaviour version (default: from <workspace>/results/<id>.json).
    #[arg(long, value_name = "vN")]
    pub version: Option<BehaviorVersion>,
    /// The rebuild workspace: the artifact defaults to ready/<id>/, the record goes to
    /// results/<id>.validation.json (results/<check>[.<W>x<H>].check.json with --check).
    #[arg(long, value_name = "DIR", value_parser = release::Workspace::value_parser())]
    pub workspace: Option<release::Workspace>,
    /// The chunk set's logical path (default: <workspace>/ready/<id>/<id>_driving_tinygrad.pkl).
    #[arg(long, value_name = "PATH")]
    pub artifact: Option<PathBuf>,
    /// Where the record is written (default: under <workspace>/results/, see --workspace).
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
    /// The validation log (default: logs/<id>.validate.log, under the workspace when given). It
    /// holds the validator's output, which is also printed live on stderr unless -q.
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Record a check you made on the device instead of running the validator: `model-v2`
    /// (modeld publishes modelV2 steadily) or `driver-state` (DM driverStateV2, per
    /// --resolution). Needs --passed or --failed, --note and the pin (--openpilot or
    /// --tinygrad-commit); nothing is run.
    #[arg(long, value_name = "CHECK", requires = "note")]
    pub check: Option<release::gate::CheckKind>,
    /// With --check driver-state: the camera resolution checked (1928x1208 or 1344x760).
    #[arg(long, value_name = "WxH", requires = "check")]
    pub resolution: Option<release::gate::CameraResolution>,
    /// With --check: the check passed.
    #[arg(long, requires = "check", conflicts_with = "failed")]
    pub passed: bool,
    /// With --check: the check failed.
    #[arg(long, requires = "check")]
    pub failed: bool,
    /// With --check: what you observed (kept in the record).
    #[arg(long, value_name = "TEXT", requires = "check")]
    pub note: Option<String>,
    /// With --check: who made it (default: $USER).
    #[arg(long, value_name = "NAME", requires = "check")]
    pub by: Option<String>,
    /// Make the local checks validation makes (the pin, the chunk set verified, the
    /// one-compiler policy, the local rsync, a key for the compiler in known_hosts) and print
    /// the commands and transfers it would run and the log and record it would write; connect
    /// to nothing and write nothing. With --check: print the record that would be written.
    #[arg(long)]
    pub dry_run: bool,
    /// Print `{"model","passed","p95_ms","resolutions":[{"resolution","passed","problems"}],
    /// "verdict","record","log"}` (`p95_ms`: the device's reported p95 latency or null; with --check: the check record; with --dry-run the plan, shaped as
    /// sync's, plus `"artifact"` and `"record"`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten, next_help_heading = "Compiler options")]
    pub remote: RemoteArgs,
}

pub fn tinygrad(command: TinygradCommand) -> CliResult {
    match command {
        TinygradCommand::Bump(a) => bump(a),
        TinygradCommand::Pin(a) => pin(a),
    }
}

pub fn sync(args: SyncArgs) -> CliResult {
    let openpilot = args.remote.openpilot.clone().ok_or_else(|| {
        CliError::usage("sync needs --openpilot DIR, the tree to send to the compiler")
    })?;
    let pin = args.remote.pin()?;
    if args.dry_run {
        let plan = compiler_remote::dry_run::sync(&args.remote.connect_options(), &openpilot, &pin)
            .map_err(remote_error)?;
        return print_plan(
            &format!("sync {}", openpilot.display()),
            plan,
            None,
            args.json,
        );
    }
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
        "ok: {}:{}/{} records tinygrad {}",
        report.destination,
        report.remote_root,
        compiler_remote::pin_location(&openpilot).rel(),
        report.tinygrad_commit
    )?;
    crate::outln!(
        "recorded: {} files sent, digest {} in {}",
        report.digest.files,
        report.digest.sha256,
        report.record.display()
    )?;
    cli_support::info!(
        "next: `release-cli compile --model ID --version vN --source ONNX --out DIR` for one model \
         (ID: the model; vN: its behaviour version; ONNX: its source model; DIR: where its chunk \
         set goes), or rebuild the generation (`release-cli status --workspace WS` prints the full \
         rebuild command; WS: the rebuild workspace)"
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
    let request = CompileRequest {
        id: args.model.clone(),
        version: args.version,
        gpu: args.gpu,
        input_format: args.input_format,
        local: args.local,
    };
    let log = args
        .log
        .clone()
        .unwrap_or_else(|| PathBuf::from("logs").join(format!("{}.log", request.build_id())));
    let job = CompileJob {
        request,
        sources: args.sources.clone(),
        out: args.out.clone(),
        log,
    };
    let (req, log) = (&job.request, &job.log);
    let pin = args.remote.pin()?;
    args.remote.check_synced()?;
    if args.dry_run {
        let plan = compiler_remote::dry_run::compile(&args.remote.connect_options(), &job, &pin)
            .map_err(remote_error)?;
        return print_plan(
            &format!("compile {}", req.build_id()),
            plan,
            None,
            args.json,
        );
    }
    let artifact = args
        .remote
        .connect()?
        .compile(&job, &pin, &mut live)
        .map_err(remote_error)?;
    // The build receipt beside it (contracts with receipts), after its stamp is checked.
    let contract = release::loadable::contract_for_pin(
        &release::tree::load_pins(args.remote.openpilot.as_deref())?,
        &pin,
    );
    let artifact_path = args.out.join(&artifact.name);
    if let Some(receipt) = release::loadable::write_build_receipt(
        &release::loadable::Built {
            model_id: req.build_id().as_str(),
            version: Some(args.version),
            artifact: &artifact_path,
            sources: &args.sources,
            stamped: true,
        },
        contract,
        &pin,
    )? {
        cli_support::info!("build receipt {}", receipt.display());
    }
    if args.json {
        return print_json(&CompileReport {
            model: req.build_id().to_string(),
            log,
            artifact: &artifact,
        });
    }
    crate::outln!(
        "ok: {} ({}, sha256 {}, {} chunk(s)) in {}; log {}",
        artifact.name,
        cli_support::progress::bytes(artifact.size),
        artifact.sha256,
        artifact.chunk_count,
        args.out.display(),
        log.display()
    )?;
    if args.local {
        cli_support::info!(
            "next: copy {} to the device's /data/models; local builds are never published",
            artifact_path.display()
        );
    } else {
        cli_support::info!(
            "next: `release-cli validate --model {} --version {} --artifact {}`, then publish it",
            req.build_id(),
            args.version,
            artifact_path.display()
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
    let job = DmJob {
        sources,
        remote_out: args.remote_output_dir.clone(),
        out: args.out.clone(),
        log: args
            .log
            .clone()
            .unwrap_or_else(|| PathBuf::from("logs/dm.log")),
    };
    let pin = args.remote.pin()?;
    args.remote.check_synced()?;
    if args.dry_run {
        let plan = compiler_remote::dry_run::dm(&args.remote.connect_options(), &job, &pin)
            .map_err(remote_error)?;
        return print_plan("dm", plan, None, args.json);
    }
    let files = args
        .remote
        .connect()?
        .build_dm(&job, &pin, &mut live)
        .map_err(remote_error)?;
    // Each DM file's build receipt beside it (contracts with receipts): the DM set carries no
    // stamp, so the receipt is what ties it to the pin.
    let contract = release::loadable::contract_for_pin(
        &release::tree::load_pins(args.remote.openpilot.as_deref())?,
        &pin,
    );
    for f in &files {
        let path = args.out.join(&f.name);
        let stem = f.name.strip_suffix(".pkl").unwrap_or(&f.name);
        release::loadable::write_build_receipt(
            &release::loadable::Built {
                model_id: stem,
                version: None,
                artifact: &path,
                sources: &job.sources,
                stamped: false,
            },
            contract,
            &pin,
        )?;
    }
    if args.json {
        return print_json(&DmReport {
            out: &args.out,
            log: &job.log,
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

pub fn builtin(args: BuiltinArgs) -> CliResult {
    let bar = crate::progress::bytes_bar(0, "reading the built-in model", args.json);
    let report =
        release::tree::builtin(&args.artifact, &args.openpilot, args.dry_run, |n, total| {
            bar.set_length(total);
            bar.inc(n)
        });
    bar.finish_and_clear();
    let report = report?;
    if args.json {
        return print_json(&report);
    }
    let removed = if report.removed.is_empty() {
        "nothing".to_string()
    } else {
        report.removed.join(", ")
    };
    if report.dry_run {
        crate::outln!(
            "dry run: {} would become a chunk set ({}, sha256 {}, {} chunk(s)); nothing \
             was changed",
            report.path.display(),
            cli_support::progress::bytes(report.size),
            report.sha256,
            report.chunk_count
        )?;
        crate::outln!("  would write  {}", report.written.join(", "))?;
        crate::outln!("  would remove {removed}")?;
        cli_support::info!("next: run the same command without --dry-run");
        return Ok(());
    }
    crate::outln!(
        "ok: {} is now a chunk set ({}, sha256 {}, {} chunk(s)); removed {removed}",
        report.path.display(),
        cli_support::progress::bytes(report.size),
        report.sha256,
        report.chunk_count,
    )?;
    cli_support::info!(
        "next: commit selfdrive/modeld/models/driving_tinygrad.pkl.* (no full PKL remains)"
    );
    Ok(())
}

#[derive(Serialize)]
struct ValidateReport<'a> {
    model: &'a ModelId,
    passed: bool,
    /// The p95 latency the device reported, in ms.
    p95_ms: Option<f64>,
    resolutions: &'a [release::gate::ResolutionVerdict],
    verdict: &'a serde_json::Value,
    record: &'a Path,
    log: &'a Path,
}

pub fn validate(args: ValidateArgs) -> CliResult {
    if let Some(kind) = args.check {
        return record_check(kind, &args);
    }
    let Some(id) = &args.model else {
        return Err(CliError::usage(
            "validate needs --model ID (or --check CHECK)",
        ));
    };
    let release::validate::ValidateTargets {
        version,
        artifact,
        record,
        log,
    } = release::validate::targets(&release::validate::ValidateFlags {
        model: id,
        version: args.version,
        artifact: args.artifact.as_deref(),
        record: args.record.as_deref(),
        log: args.log.as_deref(),
        workspace: args.workspace.as_ref(),
    })?;
    let pin = args.remote.pin()?;
    // The runtime gate before anything is sent: the artifact's stamp and build receipt.
    let (job, contract) = release::validate::DeviceValidation {
        id,
        version,
        artifact: &artifact,
        log: &log,
        models_dir: &args.remote_models_dir,
        python: &args.python,
    }
    .job(
        &release::tree::load_pins(args.remote.openpilot.as_deref())?,
        &pin,
    )?;
    if args.dry_run {
        let (mut plan, set) =
            compiler_remote::dry_run::validate(&args.remote.connect_options(), &job, &pin)
                .map_err(remote_error)?;
        plan.writes.push(record.clone());
        let extra = serde_json::json!({ "artifact": set, "record": record });
        let what = format!(
            "validate {id} {version} with {} (verified: {}, sha256 {}, {} chunk(s))",
            artifact.display(),
            cli_support::progress::bytes(set.size),
            set.sha256,
            set.chunk_count
        );
        return print_plan(&what, plan, Some(extra), args.json);
    }
    let verdict = args
        .remote
        .connect()?
        .validate(&job, &pin, &mut live)
        .map_err(remote_error)?;
    let (rec, passed) = release::validate::record_verdict(
        id,
        version,
        pin,
        verdict,
        log.clone(),
        &record,
        contract,
    )?;
    // The p95 latency the device reported, against the contract's bound (the record keeps it
    // in the device's verdict; publish requires the bound again).
    let p95_ms = release::loadable::reported_p95(&rec, contract);
    let over_bound = over_bound(contract, &rec, p95_ms);
    if args.json {
        print_json(&ValidateReport {
            model: id,
            passed,
            p95_ms,
            resolutions: &rec.resolutions,
            verdict: &rec.verdict,
            record: &record,
            log: &log,
        })?;
    } else {
        print_validation(id, &rec, p95_ms, over_bound.as_deref(), &record)?;
    }
    if passed {
        Ok(())
    } else {
        Err(CliError::check_failed(format!(
            "{id} failed device validation; see {} and {}",
            record.display(),
            log.display()
        )))
    }
}

/// Why the p95 latency the device reported fails the contract's bound (`None`: within it, or
/// no bound).
fn over_bound(
    contract: &manifest::Contract,
    rec: &release::gate::ValidationRecord,
    p95_ms: Option<f64>,
) -> Option<String> {
    match (contract.validation_p95_ms, p95_ms) {
        (Some(bound), Some(p)) if p > f64::from(bound) => {
            Some(format!("p95 latency {p} ms is over the {bound} ms bound"))
        }
        (Some(bound), None) if rec.passed() => Some(format!(
            "the device reported no p95 latency for every camera; the {} contract bounds it at \
             {bound} ms",
            contract.name
        )),
        (Some(bound), None) => Some(format!(
            "the device reported no p95 latency for every camera: its validator fails a camera \
             over the {bound} ms bound or that it cannot run before reporting one"
        )),
        _ => None,
    }
}

/// The device's verdict per resolution, its latency, and where it is recorded.
fn print_validation(
    id: &ModelId,
    rec: &release::gate::ValidationRecord,
    p95_ms: Option<f64>,
    over_bound: Option<&str>,
    record: &Path,
) -> CliResult {
    for r in &rec.resolutions {
        crate::outln!(
            "{id} at {}: {}",
            r.resolution,
            if r.passed {
                "passed".to_string()
            } else {
                format!("FAILED ({})", r.problems.join("; "))
            }
        )?;
    }
    if let Some(p) = p95_ms {
        crate::outln!("{id}: p95 latency {p} ms")?;
    }
    if let Some(why) = over_bound {
        crate::outln!("{id}: FAILED ({why})")?;
    }
    crate::outln!("verdict recorded in {}", record.display())?;
    Ok(())
}

/// `validate --check`: record a check the release engineer made on the device.
fn record_check(kind: release::gate::CheckKind, args: &ValidateArgs) -> CliResult {
    let (record, rec) = release::validate::check_record(
        &release::validate::CheckFlags {
            kind,
            resolution: args.resolution,
            model: args.model.as_ref(),
            passed: args.passed,
            failed: args.failed,
            note: args.note.as_deref(),
            by: args.by.clone().or_else(|| std::env::var("USER").ok()),
            record: args.record.as_deref(),
            workspace: args.workspace.as_ref(),
        },
        || {
            release::tree::resolve_pin(
                args.remote.tinygrad_commit.clone(),
                args.remote.openpilot.as_deref(),
            )
            .map_err(Box::new)
        },
        release::validate::CheckedOn::Ready,
    )?;
    let at = rec.resolution.map_or(String::new(), |r| format!(" at {r}"));
    let verdict = if rec.passed { "passed" } else { "FAILED" };
    if args.dry_run {
        if args.json {
            let mut v = serde_json::to_value(&rec).map_err(CliError::failure)?;
            v["dry_run"] = true.into();
            v["record_path"] = serde_json::to_value(&record).map_err(CliError::failure)?;
            return print_json(&v);
        }
        crate::outln!(
            "dry run: would record {kind}{at} {verdict} by {} in {}; nothing was written",
            rec.checked_by,
            record.display()
        )?;
        cli_support::info!("next: run the same command without --dry-run");
        return Ok(());
    }
    release::records::write(&record, &rec)?;
    if args.json {
        return print_json(&rec);
    }
    crate::outln!(
        "{kind}{at}: recorded {verdict} by {} in {}",
        rec.checked_by,
        record.display()
    )?;
    Ok(())
}

// ---- tinygrad bump ------------------------------------------------------------------------

fn bump(args: BumpArgs) -> CliResult {
    let report = release::tree::bump(&release::tree::BumpRequest {
        openpilot: args.openpilot.clone(),
        tinygrad_src: args.tinygrad_src.clone(),
        commit: args.commit.clone(),
        dry_run: args.dry_run,
    })?;
    if args.json {
        return print_json(&report);
    }
    let dest = args.openpilot.join("tinygrad_repo");
    let pins = args.openpilot.join(manifest::pins::PINS_FILE);
    let (would, done) = if report.dry_run {
        ("would be ", "dry run: ")
    } else {
        ("", "ok: ")
    };
    crate::outln!(
        "{done}{} {would}replaced ({} files, no git metadata); TINYGRAD_COMMIT = {}",
        dest.display(),
        report.files,
        report.commit
    )?;
    crate::outln!(
        "source: {} ({}), digest {} over {} files{}",
        report.source.path.display(),
        match report.source.kind {
            release::tree::SourceKind::Git => "git checkout: the commit is its HEAD",
            release::tree::SourceKind::Directory => "plain directory: the commit is --commit",
        },
        report.source.digest.sha256,
        report.source.digest.files,
        if report.dry_run {
            String::new()
        } else {
            format!(
                ", recorded in {}",
                dest.join(release::tree::TINYGRAD_SOURCE_FILE).display()
            )
        }
    )?;
    match &report.generation {
        Some(g) => crate::outln!(
            "{} {}= tinygrad {} in {} (publish --openpilot {} checks manifests against it)",
            g.to,
            if report.dry_run {
                "would be recorded "
            } else {
                "recorded "
            },
            report.commit,
            pins.display(),
            args.openpilot.display()
        )?,
        None => crate::outln!(
            "{} is already {}'s pin: same ABI, no new generation",
            report.commit,
            report.current
        )?,
    }
    if report.dry_run {
        crate::outln!("nothing was changed; run the same command without --dry-run")?;
        return Ok(());
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

// ---- tinygrad pin ------------------------------------------------------------------------

fn pin(args: PinArgs) -> CliResult {
    let stores = args
        .stores
        .iter()
        .map(|spec| {
            // A directory store that is not there holds nothing to check: refused, not taken
            // for "not published".
            if let artifact_store::StoreSpec::Local(dir) | artifact_store::StoreSpec::Github(dir) =
                spec
                && !dir.is_dir()
            {
                return Err(CliError::usage(format!(
                    "--store {spec}: no such directory, so nothing says whether {} is published \
                     there; pass the store you publish {} to (the directory `release-cli \
                     publish --to` wrote, or the `github:` checkout)",
                    args.generation, args.generation
                )));
            }
            spec.open(&args.access).map_err(store_error)
        })
        .collect::<CliResult<Vec<_>>>()?;
    let refs: Vec<&dyn artifact_store::Store> = stores.iter().map(|s| s.as_ref()).collect();
    let report = release::tree::correct_pin(
        &release::tree::PinRequest {
            openpilot: args.openpilot.clone(),
            generation: args.generation,
            commit: args.commit.clone(),
            dry_run: args.dry_run,
        },
        &refs,
    )?;
    if args.json {
        return print_json(&report);
    }
    let checked = report.stores_checked.join(", ");
    let Some(from) = &report.from else {
        crate::outln!(
            "{} is already pinned to {}; nothing to correct (checked: {checked})",
            report.generation,
            report.to
        )?;
        return Ok(());
    };
    let files = report
        .written
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if report.dry_run {
        crate::outln!(
            "dry run: {} would be pinned to {} instead of {from} (no live {} manifest in: \
             {checked}); would write {files}; nothing was changed",
            report.generation,
            report.to,
            report.generation
        )?;
        return Ok(());
    }
    crate::outln!(
        "ok: {} is pinned to {} instead of {from} (no live {} manifest in: {checked}); wrote {files}",
        report.generation,
        report.to,
        report.generation
    )?;
    if report.tree_from_git {
        cli_support::info!(
            "next: {}/tinygrad_repo was copied from a git checkout at {from}, so it still is that \
             commit: `release-cli tinygrad bump --openpilot {} --tinygrad-src <checkout at {}>`, \
             then sync",
            args.openpilot.display(),
            args.openpilot.display(),
            report.to
        );
    } else {
        cli_support::info!(
            "next: `release-cli sync --openpilot {}` (the marker changed), then rebuild; earlier \
             build records name the old pin and are rebuilt",
            args.openpilot.display()
        );
    }
    Ok(())
}
