//! `device-modeld-manager`: the on-device StarPilot model manager. A thin front over the
//! `migration` and `downloader` crates; see `docs/device.md` for the contract (flags, exit codes,
//! `--json` shapes, params).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use cli_support::Failure;
use downloader::DownloadConfig;
use manifest::Generation;
use migration::report::render::{self, Line, Render};
use migration::rules::next_step::{code, failure};
use migration::{Device, run::commands, run::open, state::tree};

#[cfg(test)]
mod hint_tests;

/// The exit codes, as `--help` shows them (and docs/cli.md, generated from it).
const EXIT_CODES_HELP: &str = "\
Exit codes (stable, see docs/device.md):
  0  success
  1  other failure (I/O, bad argument value, corrupt state file, unknown model)
  2  usage error (bad flags or arguments)
  3  busy: another manager holds the lock
  4  download failed on every origin, or the published set is inconsistent
  5  no origin served a valid manifest (offline, or every manifest rejected, an unsigned or
     badly signed one included when keys are trusted)
  6  verification failed (a model is missing or does not match the catalog)
  7  cancelled
  8  not enough free space
  9  deferred while driving: IsOnroad is set, nothing was changed
  10 paused: the openpilot tree's tinygrad is no known generation's pin (or cannot be read);
     nothing was changed, `resolve` answers the built-in (see `status`)

With --json, a failure too prints one JSON document on stdout,
{\"error\":{\"kind\",\"message\",\"next\"}}, where kind names the exit code (failure, busy,
download_failed, manifest_unavailable, not_verified, cancelled, no_space, deferred, paused, and
usage for a command line the parser refused or a --generation the tree disagrees with, exit 2);
the code is unchanged.";

#[derive(Parser)]
#[command(
    name = "device-modeld-manager",
    version,
    about = "StarPilot on-device model manager: download, verify, migrate, resolve",
    after_help = EXIT_CODES_HELP,
    next_help_heading = "Global options"
)]
struct Cli {
    /// Persistent data root (holds models/ and params/d/).
    #[arg(long, global = true, value_name = "DIR", default_value = "/data")]
    data_dir: PathBuf,
    /// Hugging Face bucket resolve base URL (tried first).
    #[arg(long, global = true, value_name = "URL", default_value = downloader::DEFAULT_HF_BASE)]
    hf_base: String,
    /// GitHub raw base URL of the Models branch (tried second).
    #[arg(long, global = true, value_name = "URL", default_value = downloader::DEFAULT_GITHUB_BASE)]
    github_base: String,
    /// The openpilot checkout this device runs. Its tinygrad (`tinygrad_repo/TINYGRAD_COMMIT`)
    /// decides the manifest generation: the one whose pin it is, in the built-in pin table plus
    /// the checkout's `tinygrad_pins.json`. A tinygrad no table knows (or a marker that cannot
    /// be read) changes nothing: exit 10, `resolve` answers the built-in.
    #[arg(long, global = true, value_name = "DIR", default_value = migration::state::tree::DEFAULT_OPENPILOT_DIR)]
    openpilot_dir: PathBuf,
    /// Check that the openpilot tree's tinygrad is this generation's, e.g. `v25`: a
    /// disagreement is a usage error (exit 2) and nothing is touched. Without it the tree
    /// decides.
    #[arg(long, global = true, value_name = "vNN")]
    generation: Option<Generation>,
    /// Directory holding the built-in RDF V4 chunk set driving_tinygrad.pkl.* [default:
    /// <openpilot-dir>/selfdrive/modeld/models].
    #[arg(long, global = true, value_name = "DIR")]
    builtin_dir: Option<PathBuf>,
    /// Memory params directory (ModelToDownload, ModelDownloadProgress, ...).
    #[arg(
        long,
        global = true,
        value_name = "DIR",
        default_value = "/dev/shm/params/d"
    )]
    memory_params_dir: PathBuf,
    /// Parallel connections per download.
    #[arg(long, global = true, value_name = "N", default_value_t = 4)]
    connections: usize,
    /// Parallel ranges within one chunk.
    #[arg(long, global = true, value_name = "N", default_value_t = 1)]
    ranges_per_chunk: usize,
    /// sysfs root where USB devices are listed, for the external GPU (Chestnut) check.
    #[arg(long, global = true, value_name = "DIR", default_value = "/sys")]
    sysfs_root: PathBuf,
    /// Free space required beyond the artifact, in MiB; at least the generation contract's
    /// headroom (v26: 256 MiB) whatever this says.
    #[arg(long, global = true, value_name = "N", default_value_t = 64)]
    space_margin_mib: u64,
    /// Minisign public keys the release is signed with (one or more, e.g. during a key
    /// rotation). With keys, a manifest is installed only if one of them signed it, for this
    /// generation, unexpired, and not older than the last accepted release. Default: the
    /// openpilot tree's `<openpilot-dir>/starpilot/assets/model_release_keys.pub` if it exists; without keys the device is unprotected (`status` says
    /// so).
    #[arg(long, global = true, value_name = "FILE")]
    trusted_keys: Option<PathBuf>,
    /// Where modeld keeps its load receipt (`starpilot_modeld_<OPENPILOT_PREFIX or d>/
    /// load-v1.json`), read on generations whose contract has one: `status` and the daemon say
    /// what actually runs [default: /dev/shm].
    #[arg(long, global = true, value_name = "DIR")]
    shm_dir: Option<PathBuf>,
    #[command(flatten)]
    output: cli_support::OutputFlags,
    #[command(subcommand)]
    command: Command,
}

/// What `-v` adds, as `--help` shows it.
const VERBOSE_HELP: &str = "Also print each step on stderr: the data, models, memory-params and \
built-in directories, origins, generation, trusted keys and SHA-256 backend (the CPU's SHA \
instructions or the portable code) in use; every download percentage \
(not only every tenth) when stderr is not a terminal";

#[derive(Subcommand)]
enum Command {
    /// Generation and the openpilot tree it comes from, selection, installed models and their
    /// verification state, free space, any interrupted migration.
    Status {
        /// Print `{"generation","manifest_version","selected":{"id","name","version"},"resolved",
        /// "catalog_models","installed":[{"id","state","digest_source"}],"free_bytes",
        /// "interrupted_migration","interrupted_downloads":[{"id","file","done_bytes","size",
        /// "current"}],"fallback":{"chosen","pending":[{"id","case","failures",
        /// "next_retry","reason"}],"dropped"},"refused_entries":[{"index","id","reason"}],
        /// "trust":{…},"tree":{"openpilot_dir","tinygrad_commit","generation","state","problem",
        /// "next"}}`, plus `"unreadable":["<what>: <why>"]` when a part of the device's state
        /// (the journal, the choice, a param) cannot be read, and on a generation whose
        /// contract has modeld's load receipt `"running":{"state","id","variant",
        /// "artifact_sha256","fallback_reason","pid","why","matches_selection","difference"}`
        /// plus `"bad_artifacts":[{"id","sha256","reason","current","text"}]` when any; while paused (the tree's tinygrad has no generation) `{"generation":null,
        /// "manifest_version","resolved","tree":{…}}`.
        #[arg(long)]
        json: bool,
    },
    /// Fetch the manifest, update the catalog params, migrate if the generation changed.
    Refresh {
        /// Fetch and check the manifest as the real run does (signature included), read the
        /// device, and print what it would purge, download, write and set, assuming every
        /// download succeeds; write nothing (no lock file, no param, no cache, no trust
        /// record). Refused while driving, like the real run. Downloads no model. When no
        /// manifest can be had it fails as the real run does (exit 5), and the error names what
        /// the real run would still write (the offline migration to the built-in of a device on
        /// another generation).
        #[arg(long)]
        dry_run: bool,
        /// Print `{"generation","manifest_origin","models","migrated_from","purged":[…],
        /// "selected","fell_back_to_builtin","retrying":[…],"dropped":[…],
        /// "refused_entries":[{"index","id","reason"}]}`; with --dry-run `{"dry_run":true,
        /// "generation","manifest_origin","manifest_url","models","refused_entries",
        /// "migrating","migrated_from","would_purge":[…],"would_download":[{"id","installed"}],
        /// "would_keep":[…],"not_due":[…],"selected","fell_back_to_builtin","would_write":[…],
        /// "would_remove":[…],"would_set_params":[{"key","value"}]}` (`value` null: removed).
        #[arg(long)]
        json: bool,
    },
    /// Download one model, or every downloadable model with --all; prints the installed path.
    Download {
        /// The model ID, e.g. `pop223`.
        #[arg(
            value_name = "ID",
            required_unless_present = "all",
            conflicts_with = "all"
        )]
        id: Option<String>,
        /// Every downloadable catalog model (not external-GPU, built-in or local).
        #[arg(long)]
        all: bool,
        /// Check as the real run does (catalog, GPU rule, installed copy re-hashed, free space
        /// for every download) and ask the origins what they publish (the small requests a
        /// download makes first, no model bytes), then print what would be downloaded,
        /// installed and removed; write nothing (no lock file, no staging file). Exits as the
        /// real run would on a refusal (8 when the space check fails).
        #[arg(long)]
        dry_run: bool,
        /// Print `{"models":[{"id","path","downloaded"}]}`; `downloaded` is false when a verified
        /// copy was already installed (or the model is built-in or local). With --dry-run
        /// `{"dry_run":true,"models":[{"id","action","artifacts":[{"name","origin","size",
        /// "sha256","digest_source","pieces","would_install","would_remove"}]}],
        /// "download_bytes","free_bytes"}` (`action`: download, installed or none).
        #[arg(long)]
        json: bool,
    },
    /// Re-hash installed models (or one) against the catalog. Exits 6 on a missing or bad one.
    Verify {
        /// Only this model (default: every installed catalog model).
        #[arg(value_name = "ID")]
        id: Option<String>,
        /// Re-hash and report exactly as without it (same states, same exit code), but do not
        /// record the results in the verification cache `.verified.json`, which `verify`
        /// otherwise rewrites; nothing is written.
        #[arg(long)]
        dry_run: bool,
        /// Print `{"models":[{"id","state","digest_source"}]}`; with --dry-run
        /// `"dry_run":true` is added.
        #[arg(long)]
        json: bool,
    },
    /// Print the path modeld should load (last line of stdout).
    Resolve {
        /// Print `{"path","id","name","version","builtin"}` as the last line instead (plus
        /// `"doubt"` when a param or state file could not be read and the built-in is answered).
        #[arg(long)]
        json: bool,
    },
    /// Remove stray temporaries and artifacts not in the catalog (never local-*).
    Gc {
        /// Print what would be removed and change nothing (no lock file either; allowed while
        /// driving).
        #[arg(long)]
        dry_run: bool,
        /// Print `{"removed":[…]}`; with --dry-run `{"dry_run":true,"would_remove":[…]}`.
        #[arg(long)]
        json: bool,
    },
    /// Daemon: serve ModelToDownload / DownloadAllModels / CancelModelDownload.
    Run {
        /// How often the memory params are polled, in milliseconds.
        #[arg(long, value_name = "MS", default_value_t = 1000)]
        poll_ms: u64,
        /// How often the manifest is refreshed, in seconds.
        #[arg(long, value_name = "SECS", default_value_t = 3600)]
        refresh_secs: u64,
        /// How soon a refresh or request that found no network is tried again, in seconds.
        #[arg(long, value_name = "SECS", default_value_t = 30)]
        retry_secs: u64,
    },
    /// Print a shell completion script, e.g.
    /// `device-modeld-manager completions bash > /etc/bash_completion.d/device-modeld-manager`.
    Completions {
        /// The shell to generate for.
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    let cli = cli_support::parse::<Cli>(VERBOSE_HELP, |c| &c.output);
    match run(cli) {
        Ok(()) => ExitCode::from(code::OK),
        // With `--json` a failure, too, prints one JSON document on stdout.
        Err(f) => f.report(cli_support::json_requested()),
    }
}

/// Write bytes to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn write_stdout(bytes: &[u8]) -> Result<(), Failure> {
    cli_support::write_stdout(bytes)
        .map(drop)
        .map_err(|e| failure(code::FAILURE, format_args!("stdout: {e}")))
}

/// Print a report: with `--json` its warnings, then the document on one line of stdout;
/// otherwise its lines, each where it goes.
fn show(doc: &impl Render, json: bool) -> Result<(), Failure> {
    for line in doc.text() {
        match line {
            Line::Warning(w) => eprintln!("warning: {w}"),
            Line::Out(l) if !json => write_stdout(format!("{l}\n").as_bytes())?,
            Line::Note(n) if !json => cli_support::info!("{n}"),
            Line::Out(_) | Line::Note(_) => {}
        }
    }
    match json {
        true => write_stdout(
            format!("{}\n", serde_json::to_string(doc).expect("serializes")).as_bytes(),
        ),
        false => Ok(()),
    }
}

/// Where the device and its stores are, and how downloads run, as the flags say.
fn options(cli: &Cli) -> open::Options {
    let space_margin = cli.space_margin_mib * 1024 * 1024;
    open::Options {
        data_dir: cli.data_dir.clone(),
        memory_params_dir: cli.memory_params_dir.clone(),
        builtin_dir: cli.builtin_dir.clone(),
        openpilot_dir: cli.openpilot_dir.clone(),
        generation: cli.generation,
        sysfs_root: cli.sysfs_root.clone(),
        hf_base: cli.hf_base.clone(),
        github_base: cli.github_base.clone(),
        download: DownloadConfig {
            connections: cli.connections.max(1),
            ranges_per_chunk: cli.ranges_per_chunk.max(1),
            space_margin,
            ..DownloadConfig::default()
        },
        trusted_keys: cli.trusted_keys.clone(),
        shm_dir: cli.shm_dir.clone(),
        openpilot_prefix: std::env::var_os("OPENPILOT_PREFIX")
            .map(|v| v.to_string_lossy().into_owned()),
    }
}

fn run(cli: Cli) -> Result<(), Failure> {
    if let Command::Completions { shell } = cli.command {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        let script = cli_support::completion_script(shell, &mut cmd, "device-modeld-manager");
        return write_stdout(&script);
    }
    let options = options(&cli);
    let open::Ready {
        device,
        dl,
        tinygrad,
        tree: tree_status,
    } = match open::open(&options)? {
        open::Opened::Ready(ready) => *ready,
        open::Opened::Paused {
            paused,
            builtin_dir,
        } => return paused_run(&cli, &builtin_dir, &paused),
    };
    // The SHA-256 code this CPU runs (the comma's has the ARMv8 SHA-2 instructions).
    cli_support::detail!(
        "{}, SHA-256 backend: {}",
        options.describe(&device, &tinygrad),
        chunker::hash_backend()
    );
    // Params and state records read as absent because they could not be read: said on stderr
    // when the command ends, whichever way.
    let _warnings = PrintWarnings(&device);
    let progress = render::StderrProgress::new(std::io::stderr().is_terminal());
    let (device, dl) = (&device, &dl);
    match cli.command {
        Command::Resolve { json } => show(&migration::report::resolve(device)?, json),
        Command::Status { json } => show(&migration::report::status(device, tree_status)?, json),
        Command::Refresh {
            dry_run: true,
            json,
        } => show(&commands::refresh_dry_run(device, dl)?, json),
        Command::Refresh { json, .. } => show(&commands::refresh(device, dl, &progress)?, json),
        Command::Download {
            id,
            dry_run: true,
            json,
            ..
        } => show(&commands::download_plan(device, dl, id.as_deref())?, json),
        Command::Download { id, json, .. } => show(
            &commands::download(device, dl, id.as_deref(), &progress)?,
            json,
        ),
        Command::Verify { id, dry_run, json } => {
            let report = commands::verify(device, id.as_deref(), dry_run, json)?;
            show(&report, json)?;
            report.outcome(json)
        }
        Command::Gc {
            dry_run: true,
            json,
        } => show(&commands::gc_plan(device)?, json),
        Command::Gc { json, .. } => show(&commands::gc(device)?, json),
        Command::Run {
            poll_ms,
            refresh_secs,
            retry_secs,
        } => {
            let config = migration::run::daemon::DaemonConfig {
                poll: Duration::from_millis(poll_ms),
                refresh_every: Duration::from_secs(refresh_secs),
                retry_offline: Duration::from_secs(retry_secs),
                ..Default::default()
            };
            // Until SIGTERM. In the foreground on a terminal the progress shows too, and log
            // lines go above the bar instead of through it.
            let tty = std::io::stderr().is_terminal();
            let log_line = |line: &str| match tty {
                true => progress.line(stamped(line)),
                false => log(line),
            };
            let terminal = tty.then_some(&progress);
            Ok(commands::daemon(
                device,
                dl,
                &config,
                &tree_status,
                &log_line,
                terminal,
            )?)
        }
        Command::Completions { .. } => unreachable!("handled before the device is opened"),
    }
}

/// Prints the device's warnings ([`Device::warnings`]) on stderr when dropped.
struct PrintWarnings<'a>(&'a Device);

impl Drop for PrintWarnings<'_> {
    fn drop(&mut self) {
        for w in self.0.warnings().take() {
            eprintln!("warning: {w}");
        }
    }
}

/// The daemon's log line, on stderr: `<UTC time> device-modeld-manager: <line>`.
fn log(line: &str) {
    cli_support::info!("{}", stamped(line));
}

/// `line` as the log shows it, stamped with the time (UTC, RFC 3339).
fn stamped(line: &str) -> String {
    let now = cli_support::time::timestamp(std::time::SystemTime::now());
    format!("{now} device-modeld-manager: {line}")
}

/// Every command while the tree's tinygrad has no generation: nothing on the device is changed.
/// `resolve` answers the built-in and `status` says why; `run` waits, answering the UI's
/// requests with the pause; every other command exits 10 (`ModelDownloadProgress` says it for
/// `refresh` and `download`, except in a dry run, which writes nothing).
fn paused_run(
    cli: &Cli,
    builtin_dir: &std::path::Path,
    paused: &tree::Paused,
) -> Result<(), Failure> {
    let memory = migration::Params::new(cli.memory_params_dir.clone());
    let fail = || failure(code::PAUSED, paused.message()).with_next(Some(paused.next()));
    match &cli.command {
        Command::Resolve { json } => {
            let r = tree::resolve_paused(builtin_dir, paused)?;
            eprintln!(
                "warning: answering the built-in model: {}",
                paused.message()
            );
            write_stdout(format!("{}\n", render::resolve_line(&r, *json)).as_bytes())
        }
        Command::Status { json } => show(
            &tree::status_paused(&cli.data_dir, builtin_dir, &cli.openpilot_dir, paused),
            *json,
        ),
        Command::Run { poll_ms, .. } => {
            let config = migration::run::daemon::DaemonConfig {
                poll: Duration::from_millis(*poll_ms),
                ..Default::default()
            };
            tree::run_paused(
                &memory,
                paused,
                &config,
                &cli_support::stop_on_signals(),
                &log,
            )?;
            Ok(())
        }
        Command::Refresh { dry_run: false, .. } | Command::Download { dry_run: false, .. } => {
            tree::announce(&memory, paused)?;
            Err(fail())
        }
        _ => Err(fail()),
    }
}
