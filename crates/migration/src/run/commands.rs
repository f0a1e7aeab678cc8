//! Each device command as the binary runs it, one call: the checks before it (driving, the
//! manager lock), the run with its progress on stderr, and the typed report the binary renders
//! ([`crate::report::render`]).

use cli_support::Failure;
use downloader::{CancelToken, Downloader};
use manifest::{ModelEntry, ModelId};

use crate::error::{Error, Result};
use crate::report::VerifyReport;
use crate::report::progress::Progress;
use crate::report::render::StderrProgress;
use crate::rules::choice::Caller;
use crate::rules::next_step::{code, failure};
use crate::run::daemon::DaemonConfig;
use crate::run::downloads::{DownloadPlanReport, DownloadReport, download_all, download_model};
use crate::run::lock::ManagerLock;
use crate::run::manager::{self, GcPlan, GcReport, RefreshReport, Run};
use crate::run::preview::{self, RefreshPlan};
use crate::state::device::Device;
use crate::state::tree::TreeStatus;

/// `refresh`: a person's refresh (every pending model is tried now, whatever its backoff), its
/// progress labelled `selected model`.
pub fn refresh(
    device: &Device,
    dl: &Downloader,
    progress: &StderrProgress,
) -> Result<RefreshReport> {
    // Onroad: refused before the lock file is even created.
    device.ensure_offroad("refresh")?;
    let _lock = ManagerLock::acquire(&device.models_dir())?;
    progress.label("selected model");
    let print = |p: &Progress| progress.say(p);
    let r = manager::refresh(
        device,
        &Run {
            progress: &print,
            caller: Caller::Person,
            ..Run::new(dl)
        },
    );
    progress.finish();
    r
}

/// `refresh --dry-run`: the person's refresh in plan mode. Failing, the real run's error, with
/// what the real run would still write before failing.
pub fn refresh_dry_run(device: &Device, dl: &Downloader) -> Result<RefreshPlan, Failure> {
    let person = Run {
        caller: Caller::Person,
        ..Run::new(dl)
    };
    preview::refresh(device, &person).or_else(|e| {
        let before = preview::refresh_failure(device, &e)?;
        Err(crate::report::render::dry_run::refresh_failure(e, &before))
    })
}

/// The `ID` argument of `download`.
fn model_id(id: &str) -> Result<ModelId, Failure> {
    id.parse().map_err(|e: manifest::Error| {
        failure(code::FAILURE, e).with_next(Some("`status` lists the catalog's models"))
    })
}

/// `download ID` (`id`), or `download --all` (`None`): each model labelled by its ID.
pub fn download(
    device: &Device,
    dl: &Downloader,
    id: Option<&str>,
    progress: &StderrProgress,
) -> Result<DownloadReport, Failure> {
    device.ensure_offroad("download")?;
    let _lock = ManagerLock::acquire(&device.models_dir())?;
    let cancel = CancelToken::new();
    let print = |p: &Progress| progress.say(p);
    let done = match id {
        None => {
            let around = |entry: &ModelEntry, before: bool| match before {
                true => {
                    progress.label(entry.id().as_str());
                    progress.line(format_args!("downloading {}", entry.id()));
                }
                false => progress.finish(),
            };
            download_all(device, dl, &cancel, &around, &print)?.models
        }
        Some(id) => {
            let id = model_id(id)?;
            progress.label(id.as_str());
            let r = download_model(device, dl, &id, &cancel, &print);
            progress.finish();
            vec![(id, r?.is_some())]
        }
    };
    Ok(DownloadReport::of(device, id.is_none(), &done))
}

/// `download --dry-run` of `id` (`None`: `--all`).
pub fn download_plan(
    device: &Device,
    dl: &Downloader,
    id: Option<&str>,
) -> Result<DownloadPlanReport, Failure> {
    let id = id.map(model_id).transpose()?;
    Ok(preview::download(device, dl, id.as_ref())?)
}

/// `verify` of every installed catalog model or of `only`; `json`: no `verifying …` notes.
pub fn verify(
    device: &Device,
    only: Option<&str>,
    dry_run: bool,
    json: bool,
) -> Result<VerifyReport, Failure> {
    let on_hash = |id: &ModelId| {
        if !json {
            cli_support::info!("verifying {id}...");
        }
    };
    match crate::report::verify(device, only, dry_run, &on_hash) {
        Err(Error::UnknownModel { id, generation }) => Err(failure(
            code::FAILURE,
            format_args!(
                "model {id} is not in the {generation} catalog; `status` lists the installed \
                 models"
            ),
        )),
        report => Ok(report?),
    }
}

/// `gc`.
pub fn gc(device: &Device) -> Result<GcReport> {
    device.ensure_offroad("gc")?;
    let _lock = ManagerLock::acquire(&device.models_dir())?;
    let removed = manager::gc(device)?;
    Ok(GcReport { removed })
}

/// `gc --dry-run`: gc in plan mode (no lock file either; allowed while driving).
pub fn gc_plan(device: &Device) -> Result<GcPlan> {
    let would_remove = manager::gc(&device.planning())?;
    Ok(GcPlan {
        dry_run: true,
        would_remove,
    })
}

/// `run`: the daemon under the manager lock until SIGTERM or SIGINT, its log starting with the
/// tree it runs on; `terminal` (a foreground run on a terminal) shows its progress too.
pub fn daemon(
    device: &Device,
    dl: &Downloader,
    config: &DaemonConfig,
    tree: &TreeStatus,
    log: &(dyn Fn(&str) + Sync),
    terminal: Option<&StderrProgress>,
) -> Result<()> {
    let _lock = ManagerLock::acquire(&device.models_dir())?;
    // What stores served other bytes survives a restart (no storm across restarts).
    dl.keep_stale_stores_in(&device.models_dir().join(downloader::stale_store::FILE));
    let stopping = cli_support::stop_on_signals();
    log(&crate::report::render::tree_line(tree));
    let show = |p: &Progress| {
        if let Some(t) = terminal {
            t.say(p)
        }
    };
    let show: Option<&(dyn Fn(&Progress) + Sync)> = terminal.map(|_| &show as _);
    crate::run::daemon::run(device, dl, config, &stopping, log, show)
}
