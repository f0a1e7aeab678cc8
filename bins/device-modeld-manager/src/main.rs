//! `device-modeld-manager`: the on-device StarPilot model manager. A thin front over the
//! `migration` and `downloader` crates; see `docs/device.md` for the contract (flags, exit codes,
//! `--json` shapes, params).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use cli_support::Failure;
use downloader::{CancelToken, DownloadConfig};
use manifest::{Generation, ModelId};
use migration::next_step::{code, failure};
use migration::preview::DryRun;
use migration::render;
use migration::{Device, ManagerLock, open, tree};

mod dry_run;
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
    #[arg(long, global = true, value_name = "DIR", default_value = migration::tree::DEFAULT_OPENPILOT_DIR)]
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
    /// Free space required beyond the artifact, in MiB.
    #[arg(long, global = true, value_name = "N", default_value_t = 64)]
    space_margin_mib: u64,
    /// Minisign public keys the release is signed with (one or more, e.g. during a key
    /// rotation). With keys, a manifest is installed only if one of them signed it, for this
    /// generation, unexpired, and not older than the last accepted release. Default: the
    /// StarPilot keys file if it exists; without keys the device is unprotected (`status` says
    /// so).
    #[arg(long, global = true, value_name = "FILE")]
    trusted_keys: Option<PathBuf>,
    #[command(flatten)]
    output: cli_support::OutputFlags,
    #[command(subcommand)]
    command: Command,
}

/// What `-v` adds, as `--help` shows it.
const VERBOSE_HELP: &str = "Also print each step on stderr: the data, models, memory-params and \
built-in directories, origins, generation and trusted keys in use; every download percentage \
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
        /// "next"}}`; while paused (the tree's tinygrad has no generation) `{"generation":null,
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
    let json = wants_json(&cli.command);
    match run(cli) {
        Ok(()) => ExitCode::from(code::OK),
        Err(f) => f.report(json),
    }
}

/// Whether the command asked for `--json`: then a failure, too, prints one JSON document
/// (`{"error":{"kind","message","next"}}`) on stdout, and the exit code is unchanged.
fn wants_json(c: &Command) -> bool {
    match c {
        Command::Status { json }
        | Command::Refresh { json, .. }
        | Command::Download { json, .. }
        | Command::Verify { json, .. }
        | Command::Resolve { json }
        | Command::Gc { json, .. } => *json,
        Command::Run { .. } | Command::Completions { .. } => false,
    }
}

/// Write bytes to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn write_stdout(bytes: &[u8]) -> Result<(), Failure> {
    cli_support::write_stdout(bytes)
        .map(drop)
        .map_err(|e| failure(code::FAILURE, format!("stdout: {e}")))
}

/// Print one line on stdout (a closed pipe is not an error).
fn out_line(line: impl std::fmt::Display) -> Result<(), Failure> {
    write_stdout(format!("{line}\n").as_bytes())
}

fn run(cli: Cli) -> Result<(), Failure> {
    if let Command::Completions { shell } = cli.command {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        let script = cli_support::completion_script(shell, &mut cmd, "device-modeld-manager");
        return write_stdout(&script);
    }
    let options = open::Options {
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
            space_margin: cli.space_margin_mib * 1024 * 1024,
            ..DownloadConfig::default()
        },
        trusted_keys: cli.trusted_keys.clone(),
    };
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
    cli_support::detail!("{}", options.describe(&device, &tinygrad));
    // Params and state records read as absent because they could not be read: said on stderr
    // when the command ends, whichever way.
    let _warnings = PrintWarnings(&device);
    let progress = render::StderrProgress::new(std::io::stderr().is_terminal());
    let print = |p: &migration::Progress| progress.say(p);
    match cli.command {
        Command::Resolve { json } => {
            let r = migration::report::resolve(&device)?;
            if let Some(d) = &r.doubt {
                eprintln!("warning: answering the built-in model: {d}");
            }
            if !json {
                cli_support::info!(
                    "model: {} ({} {})",
                    r.model.id,
                    r.model.name,
                    r.model.version
                );
            }
            out_line(render::resolve_line(&r, json))
        }
        Command::Status { json } => {
            let doc = render::StatusDocument::of(&device, tree_status)?;
            if json {
                return out_line(serde_json::to_string(&doc).expect("serializable"));
            }
            for line in doc.lines() {
                out_line(line)?;
            }
            if let Some(next) = doc.next() {
                cli_support::info!("next: {next}");
            }
            Ok(())
        }
        Command::Refresh {
            dry_run: true,
            json,
        } => {
            let plan = match migration::preview::refresh_as(
                &device,
                &dl,
                migration::unix_now(),
                migration::choice::Caller::Person,
            ) {
                Ok(plan) => plan,
                Err(e) => {
                    let before = migration::preview::refresh_failure(&device, &e)?;
                    // The message, then what the real run would write before failing, then
                    // `next:`.
                    let mut fail = Failure::from(e);
                    fail.message
                        .push_str(&dry_run::failure_lines(&before).join(""));
                    return Err(fail);
                }
            };
            if json {
                return out_line(DryRun::of(&plan).to_json());
            }
            for line in dry_run::refresh_lines(&plan) {
                out_line(line)?;
            }
            cli_support::info!("next: run `refresh` without --dry-run to do it");
            Ok(())
        }
        Command::Refresh { json, .. } => {
            // Onroad: refused before the lock file is even created.
            device.ensure_offroad("refresh")?;
            let _lock = ManagerLock::acquire(&device.models_dir())?;
            progress.label("selected model");
            // A person's refresh: every pending model is tried now, whatever its backoff.
            let r = migration::refresh_as(
                &device,
                &dl,
                &CancelToken::new(),
                &print,
                migration::unix_now(),
                migration::choice::Caller::Person,
            );
            progress.finish();
            let r = r?;
            if json {
                return out_line(serde_json::to_string(&r).expect("serializable"));
            }
            out_line(format_args!(
                "{} manifest from {}: {} models; selected {}{}{}",
                r.generation,
                r.manifest_origin,
                r.models,
                r.selected,
                r.migrated_from
                    .as_ref()
                    .map(|f| format!("; migrated from {f}, purged {} files", r.purged.len()))
                    .unwrap_or_default(),
                if r.fell_back_to_builtin {
                    " (fell back to the built-in model)"
                } else {
                    ""
                }
            ))?;
            if !r.retrying.is_empty() {
                cli_support::info!(
                    "retrying later: {} (the built-in, or the verified older copy, stands in \
                     until it downloads)",
                    r.retrying.join(", ")
                );
            }
            if !r.dropped.is_empty() {
                cli_support::info!(
                    "dropped for good (not in the {} catalog): {}",
                    r.generation,
                    r.dropped.join(", ")
                );
            }
            if !r.retrying.is_empty() && r.dropped.is_empty() {
                cli_support::info!(
                    "next: nothing to do; `refresh` tries it again at once, and the daemon \
                     retries it on its own after a backoff (`status` shows when)"
                );
            } else if r.fell_back_to_builtin {
                cli_support::info!(
                    "next: the selected model is not available for {}; pick another one, then \
                     `download <ID>` it",
                    r.generation
                );
            } else {
                cli_support::info!(
                    "next: `resolve` prints the path modeld loads; `status` shows the rest"
                );
            }
            Ok(())
        }
        Command::Download {
            id,
            all,
            dry_run: true,
            json,
        } => {
            let id = match all {
                true => None,
                false => Some(parse_model_id(id)?),
            };
            let plan = migration::preview::download(
                &device,
                &dl,
                id.as_ref(),
                cli.space_margin_mib * 1024 * 1024,
            )?;
            if json {
                return out_line(DryRun::of(&plan).to_json());
            }
            for line in dry_run::download_lines(&plan.models, plan.needed, plan.free) {
                out_line(line)?;
            }
            cli_support::info!("next: run `download` without --dry-run to do it");
            Ok(())
        }
        Command::Download { id, all, json, .. } => {
            device.ensure_offroad("download")?;
            let _lock = ManagerLock::acquire(&device.models_dir())?;
            let cancel = CancelToken::new();
            let mut done = Vec::new();
            if all {
                let around = |entry: &manifest::ModelEntry, before: bool| match before {
                    true => {
                        progress.label(entry.id().as_str());
                        progress.line(format_args!("downloading {}", entry.id()));
                    }
                    false => progress.finish(),
                };
                done = migration::download_all(&device, &dl, &cancel, &around, &print)?.models;
            } else {
                let id = parse_model_id(id)?;
                progress.label(id.as_str());
                let r = migration::download_model(&device, &dl, &id, &cancel, &print);
                progress.finish();
                done.push((id, r?.is_some()));
            }
            let report = migration::DownloadReport::of(&device, &done);
            if json {
                return out_line(serde_json::to_string(&report).expect("serializable"));
            }
            if all {
                out_line("All models downloaded!")?;
            } else if let Some(m) = report.models.first() {
                out_line(m.path.display())?;
                if !m.downloaded && !migration::is_builtin_id(m.id.as_str()) && !m.id.is_local() {
                    cli_support::info!(
                        "{}: a verified copy is installed; nothing was downloaded",
                        m.id
                    );
                }
            }
            cli_support::info!(
                "next: select a model in the UI (param `Model`); `resolve` prints what modeld loads"
            );
            Ok(())
        }
        Command::Verify { id, dry_run, json } => verify(&device, id, dry_run, json),
        Command::Gc {
            dry_run: true,
            json,
        } => {
            let plan = migration::gc(&device.planning())?;
            if json {
                let plan = migration::GcPlan { would_remove: plan };
                return out_line(DryRun::of(&plan).to_json());
            }
            for r in &plan {
                out_line(format_args!("would remove {r}"))?;
            }
            if plan.is_empty() {
                cli_support::info!("nothing to remove");
            } else {
                cli_support::info!("next: run `gc` without --dry-run to remove them");
            }
            Ok(())
        }
        Command::Gc { json, .. } => {
            device.ensure_offroad("gc")?;
            let _lock = ManagerLock::acquire(&device.models_dir())?;
            let removed = migration::gc(&device)?;
            if json {
                let report = migration::GcReport { removed };
                return out_line(serde_json::to_string(&report).expect("serializable"));
            }
            for r in &removed {
                out_line(format_args!("removed {r}"))?;
            }
            if removed.is_empty() {
                cli_support::info!("nothing to remove");
            }
            Ok(())
        }
        Command::Run {
            poll_ms,
            refresh_secs,
            retry_secs,
        } => {
            let _lock = ManagerLock::acquire(&device.models_dir())?;
            let stopping = cli_support::stop_on_signals();
            log(&render::tree_line(&tree_status));
            let config = migration::daemon::DaemonConfig {
                poll: Duration::from_millis(poll_ms),
                refresh_every: Duration::from_secs(refresh_secs),
                retry_offline: Duration::from_secs(retry_secs),
            };
            migration::daemon::run(&device, &dl, &config, &stopping, &log)?;
            Ok(())
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

/// The `ID` argument of `download`.
fn parse_model_id(id: Option<String>) -> Result<ModelId, Failure> {
    id.unwrap_or_default()
        .parse()
        .map_err(|e: manifest::Error| {
            failure(code::FAILURE, e).with_next(Some("`status` lists the catalog's models"))
        })
}

fn verify(
    device: &Device,
    id: Option<String>,
    dry_run: bool,
    json_out: bool,
) -> Result<(), Failure> {
    let on_hash = |id: &ModelId| {
        if !json_out {
            cli_support::info!("verifying {id}...");
        }
    };
    let doc = match render::VerifyDocument::of(device, id.as_deref(), dry_run, &on_hash) {
        Err(migration::Error::UnknownModel { id, generation }) => {
            return Err(failure(
                code::FAILURE,
                format_args!(
                    "model {id} is not in the {generation} catalog; `status` lists the installed \
                     models"
                ),
            ));
        }
        doc => doc?,
    };
    if json_out {
        out_line(serde_json::to_string(&doc).expect("serializable"))?;
    } else {
        for line in doc.lines() {
            out_line(line)?;
        }
        if doc.report.models.is_empty() {
            cli_support::info!("no installed models to verify");
        }
    }
    match doc.failure() {
        Some(f) if json_out => Err(f.after_json_report()),
        Some(f) => Err(f),
        None => Ok(()),
    }
}

/// The daemon's log line.
fn log(line: &str) {
    cli_support::info!("device-modeld-manager: {line}");
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
            out_line(render::resolve_line(&r, *json))
        }
        Command::Status { json } => {
            let r = tree::status_paused(&cli.data_dir, builtin_dir, &cli.openpilot_dir, paused);
            if *json {
                return out_line(serde_json::to_string(&r).expect("serializable"));
            }
            for line in render::paused_status_lines(&r) {
                out_line(line)?;
            }
            cli_support::info!("next: {}", paused.next());
            Ok(())
        }
        Command::Run { poll_ms, .. } => {
            let config = migration::daemon::DaemonConfig {
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
