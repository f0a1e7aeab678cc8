//! `device-modeld-manager`: the on-device StarPilot model manager. A thin front over the
//! `migration` and `downloader` crates; see `docs/device.md` for the contract (flags, exit codes,
//! `--json` shapes, params).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use downloader::{CancelToken, DownloadConfig, Downloader, Origins};
use manifest::{Generation, ModelId, layout};
use migration::params::keys;
use migration::{Device, DeviceConfig, ManagerLock, VerifyState};
use serde_json::json;

/// Stable exit codes (documented in docs/device.md).
mod code {
    pub const OK: u8 = 0;
    pub const FAILURE: u8 = 1;
    pub const BUSY: u8 = 3;
    pub const DOWNLOAD_FAILED: u8 = 4;
    pub const MANIFEST_UNAVAILABLE: u8 = 5;
    pub const NOT_VERIFIED: u8 = 6;
    pub const CANCELLED: u8 = 7;
    pub const NO_SPACE: u8 = 8;
}

#[derive(Parser)]
#[command(
    version,
    about = "StarPilot on-device model manager: download, verify, migrate, resolve"
)]
struct Cli {
    /// Persistent data root (holds models/ and params/d/).
    #[arg(long, global = true, default_value = "/data")]
    data_dir: PathBuf,
    /// Hugging Face bucket resolve base URL (tried first).
    #[arg(long, global = true, default_value = downloader::DEFAULT_HF_BASE)]
    hf_base: String,
    /// GitHub raw base URL of the Models branch (tried second).
    #[arg(long, global = true, default_value = downloader::DEFAULT_GITHUB_BASE)]
    github_base: String,
    /// Manifest generation this device reads (vNN).
    #[arg(long, global = true, default_value_t = layout::CURRENT_GENERATION)]
    generation: Generation,
    /// Directory holding the built-in RDF V4 chunk set driving_tinygrad.pkl.*.
    #[arg(
        long,
        global = true,
        default_value = "/data/openpilot/selfdrive/modeld/models"
    )]
    builtin_dir: PathBuf,
    /// Memory params directory (ModelToDownload, ModelDownloadProgress, ...).
    #[arg(long, global = true, default_value = "/dev/shm/params/d")]
    memory_params_dir: PathBuf,
    /// Parallel connections per download.
    #[arg(long, global = true, default_value_t = 4)]
    connections: usize,
    /// Parallel ranges within one chunk.
    #[arg(long, global = true, default_value_t = 1)]
    ranges_per_chunk: usize,
    /// Free space required beyond the artifact, in MiB.
    #[arg(long, global = true, default_value_t = 64)]
    space_margin_mib: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generation, selection, installed models and their verification state, free space, any
    /// interrupted migration.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Fetch the manifest, update the catalog params, migrate if the generation changed.
    Refresh {
        #[arg(long)]
        json: bool,
    },
    /// Download one model, or every downloadable model with --all.
    Download {
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<String>,
        #[arg(long)]
        all: bool,
    },
    /// Re-hash installed models (or one) against the catalog.
    Verify {
        id: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Print the path modeld should load (last line).
    Resolve,
    /// Remove stray temporaries and artifacts not in the catalog (never local-*).
    Gc {
        #[arg(long)]
        json: bool,
    },
    /// Daemon: serve ModelToDownload / DownloadAllModels / CancelModelDownload.
    Run {
        /// How often the memory params are polled.
        #[arg(long, default_value_t = 1000)]
        poll_ms: u64,
        /// How often the manifest is refreshed.
        #[arg(long, default_value_t = 3600)]
        refresh_secs: u64,
    },
}

struct Fail {
    code: u8,
    message: String,
}

impl From<migration::Error> for Fail {
    fn from(e: migration::Error) -> Self {
        let code = match &e {
            migration::Error::Busy { .. } => code::BUSY,
            migration::Error::Download(d) => download_code(d),
            migration::Error::NotVerified { .. } => code::NOT_VERIFIED,
            _ => code::FAILURE,
        };
        Fail {
            code,
            message: e.to_string(),
        }
    }
}

fn download_code(d: &downloader::Error) -> u8 {
    match d {
        downloader::Error::ManifestUnavailable { .. } => code::MANIFEST_UNAVAILABLE,
        downloader::Error::Cancelled { .. } => code::CANCELLED,
        downloader::Error::InsufficientSpace { .. } => code::NO_SPACE,
        downloader::Error::Io { .. } => code::FAILURE,
        _ => code::DOWNLOAD_FAILED,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::from(code::OK),
        Err(f) => {
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn run(cli: Cli) -> Result<(), Fail> {
    let device = Device::new(DeviceConfig {
        data_dir: cli.data_dir.clone(),
        memory_params_dir: cli.memory_params_dir.clone(),
        builtin_dir: cli.builtin_dir.clone(),
        generation: cli.generation,
    });
    let dl = Downloader::new(
        Origins::new(&cli.hf_base, &cli.github_base),
        DownloadConfig {
            connections: cli.connections.max(1),
            ranges_per_chunk: cli.ranges_per_chunk.max(1),
            space_margin: cli.space_margin_mib * 1024 * 1024,
            ..DownloadConfig::default()
        },
    );
    let print = |s: &str| eprintln!("{s}");
    match cli.command {
        Command::Resolve => {
            let (path, sel) = device.resolve()?;
            eprintln!("model: {} ({})", sel.id, sel.name);
            println!("{}", path.display());
            Ok(())
        }
        Command::Status { json } => status(&device, json),
        Command::Refresh { json } => {
            let _lock = ManagerLock::acquire(&device.models_dir())?;
            let r = migration::refresh(&device, &dl, &CancelToken::new(), &print)?;
            if json {
                println!("{}", serde_json::to_string(&r).expect("serializable"));
            } else {
                println!(
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
                );
            }
            Ok(())
        }
        Command::Download { id, all } => {
            let _lock = ManagerLock::acquire(&device.models_dir())?;
            let cancel = CancelToken::new();
            if all {
                let catalog = device.require_catalog()?;
                for entry in migration::downloadable(&catalog) {
                    eprintln!("downloading {}", entry.id());
                    migration::install(&device, &dl, entry, &cancel, &print)?;
                }
                println!("All models downloaded!");
            } else {
                let id: ModelId =
                    id.unwrap_or_default()
                        .parse()
                        .map_err(|e: manifest::Error| Fail {
                            code: code::FAILURE,
                            message: e.to_string(),
                        })?;
                migration::download_model(&device, &dl, &id, &cancel, &print)?;
                println!("{}", device.artifact_path(&id).display());
            }
            Ok(())
        }
        Command::Verify { id, json } => verify(&device, id, json),
        Command::Gc { json } => {
            let _lock = ManagerLock::acquire(&device.models_dir())?;
            let removed = migration::gc(&device)?;
            if json {
                println!("{}", json!({ "removed": removed }));
            } else {
                for r in &removed {
                    println!("removed {r}");
                }
            }
            Ok(())
        }
        Command::Run {
            poll_ms,
            refresh_secs,
        } => daemon(
            &device,
            &dl,
            Duration::from_millis(poll_ms),
            Duration::from_secs(refresh_secs),
        ),
    }
}

fn status(device: &Device, json_out: bool) -> Result<(), Fail> {
    let sel = device.selection()?;
    let journal = migration::read_journal(device)?;
    let catalog = device.catalog()?;
    let mut models = Vec::new();
    if let Some(c) = &catalog {
        for e in c.models() {
            let state = device.verify_entry(e, false)?;
            if state != VerifyState::Missing {
                models.push(json!({ "id": e.id().as_str(), "state": state }));
            }
        }
    }
    let free = downloader::space::available_bytes(&device.models_dir()).ok();
    let (resolved, _) = device.resolve()?;
    let v = json!({
        "generation": device.config.generation.to_string(),
        "manifest_version": device.params.get_str(keys::MODEL_MANIFEST_VERSION)?,
        "selected": { "id": sel.id, "name": sel.name, "version": sel.version },
        "resolved": resolved,
        "catalog_models": catalog.as_ref().map(|c| c.models().len()),
        "installed": models,
        "free_bytes": free,
        "interrupted_migration": journal,
    });
    if json_out {
        println!("{v}");
    } else {
        println!("generation: {}", v["generation"]);
        println!("manifest version: {}", v["manifest_version"]);
        println!("selected: {} ({} {})", sel.id, sel.name, sel.version);
        println!("resolves to: {}", resolved.display());
        for m in &models {
            println!("  {} {}", m["id"].as_str().unwrap_or_default(), m["state"]);
        }
        println!(
            "free bytes: {}",
            free.map(|f| f.to_string()).unwrap_or("unknown".into())
        );
        if let Some(j) = journal {
            println!(
                "interrupted migration: {:?} -> {} at phase {:?}",
                j.from, j.to, j.phase
            );
        }
    }
    Ok(())
}

fn verify(device: &Device, id: Option<String>, json_out: bool) -> Result<(), Fail> {
    let catalog = device.require_catalog()?;
    let mut results = Vec::new();
    let mut bad = false;
    for e in catalog.models() {
        if let Some(want) = &id
            && e.id().as_str() != want
        {
            continue;
        }
        let state = device.verify_entry(e, true)?;
        if state == VerifyState::Missing && id.is_none() {
            continue;
        }
        bad |= state != VerifyState::Verified;
        results.push(json!({ "id": e.id().as_str(), "state": state }));
    }
    if let Some(want) = &id
        && results.is_empty()
    {
        return Err(Fail {
            code: code::FAILURE,
            message: format!(
                "model {want} is not in the {} catalog",
                device.config.generation
            ),
        });
    }
    if json_out {
        println!("{}", json!({ "models": results }));
    } else {
        for r in &results {
            println!("{} {}", r["id"].as_str().unwrap_or_default(), r["state"]);
        }
    }
    if bad {
        return Err(Fail {
            code: code::NOT_VERIFIED,
            message: "some models are missing or do not match the catalog; run `download` again"
                .into(),
        });
    }
    Ok(())
}

/// A cancel token that trips when the UI sets `CancelModelDownload`.
fn watch_cancel(device: &Device, stop: &Arc<AtomicBool>) -> (CancelToken, thread::JoinHandle<()>) {
    let token = CancelToken::new();
    let t = token.clone();
    let memory = device.memory.clone();
    let stop = stop.clone();
    let h = thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            if memory
                .get_bool(keys::CANCEL_MODEL_DOWNLOAD)
                .unwrap_or(false)
            {
                t.cancel();
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    });
    (token, h)
}

fn failure_text(e: &migration::Error) -> String {
    match e {
        migration::Error::Download(downloader::Error::Cancelled { .. }) => {
            "Download cancelled...".into()
        }
        migration::Error::Download(downloader::Error::InsufficientSpace { .. }) => {
            "Download failed: not enough free space".into()
        }
        migration::Error::Download(downloader::Error::ManifestUnavailable { .. }) => {
            "Hugging Face and GitHub are offline...".into()
        }
        migration::Error::Download(_) => {
            "Download failed: model could not be downloaded and verified".into()
        }
        other => format!("Download failed: {other}"),
    }
}

fn daemon(
    device: &Device,
    dl: &Downloader,
    poll: Duration,
    refresh_every: Duration,
) -> Result<(), Fail> {
    let _lock = ManagerLock::acquire(&device.models_dir())?;
    let progress_param = |s: &str| {
        let _ = device.memory.put(keys::MODEL_DOWNLOAD_PROGRESS, s);
    };
    let mut last_refresh: Option<Instant> = None;
    loop {
        if last_refresh.is_none_or(|t| t.elapsed() >= refresh_every) {
            if let Err(e) = migration::refresh(device, dl, &CancelToken::new(), &progress_param) {
                eprintln!("refresh failed: {e}");
            }
            last_refresh = Some(Instant::now());
        }
        let all = device.memory.get_bool(keys::DOWNLOAD_ALL_MODELS)?;
        let one = device.memory.get_str(keys::MODEL_TO_DOWNLOAD)?;
        if all || one.is_some() {
            let stop = Arc::new(AtomicBool::new(false));
            let (cancel, watcher) = watch_cancel(device, &stop);
            let outcome: Result<String, migration::Error> = if all {
                (|| {
                    let catalog = device.require_catalog()?;
                    for entry in migration::downloadable(&catalog) {
                        progress_param(&format!(
                            "Downloading \"{}\"...",
                            entry.name().unwrap_or(entry.id().as_str())
                        ));
                        migration::install(device, dl, entry, &cancel, &progress_param)?;
                    }
                    Ok("All models downloaded!".to_string())
                })()
            } else {
                let id = one.clone().unwrap_or_default();
                match id.parse::<ModelId>() {
                    Ok(id) => migration::download_model(device, dl, &id, &cancel, &progress_param)
                        .map(|_| "Downloaded!".to_string()),
                    Err(e) => Ok(format!("Download failed: {e}")),
                }
            };
            stop.store(true, Ordering::SeqCst);
            let _ = watcher.join();
            let text = match &outcome {
                Ok(t) => t.clone(),
                Err(e) => {
                    eprintln!("download failed: {e}");
                    failure_text(e)
                }
            };
            progress_param(&text);
            // Clear each request once handled, and the cancel flag with it, so neither a
            // stale request nor a stale cancel survives (the Python manager kept both).
            if all {
                device.memory.remove(keys::DOWNLOAD_ALL_MODELS)?;
            } else {
                device.memory.remove(keys::MODEL_TO_DOWNLOAD)?;
            }
            device.memory.remove(keys::CANCEL_MODEL_DOWNLOAD)?;
        } else if device.memory.get_bool(keys::CANCEL_MODEL_DOWNLOAD)? {
            // Nothing to cancel: a leftover flag must not cancel the next download.
            device.memory.remove(keys::CANCEL_MODEL_DOWNLOAD)?;
        }
        thread::sleep(poll);
    }
}
