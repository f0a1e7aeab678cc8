//! `release-cli publish`, `reuse` and `serve`: the front of the `artifact-store` crate.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use artifact_store::publish::{Event, PublishReport, Step};
use artifact_store::reuse::ReusePlan;
use artifact_store::serve::{ServeConfig, Server};
use artifact_store::{Location, StoreAccess, StoreSpec};
use clap::Args;
use manifest::{Generation, GitCommit, Manifest, ModelId, layout};
use release::gate::GateOutcome;
use release::publish::{self, PublishRequest};

use crate::output::{print_json, store_error};
use crate::progress::bytes_bar;
use crate::{CliError, CliResult};

fn read_manifest(path: &PathBuf) -> CliResult<Manifest> {
    // A missing input file is exit 1, as for every command (an I/O failure, like manifest
    // validate's).
    if let Err(e) = std::fs::metadata(path) {
        return Err(CliError::failure(format!("{}: {e}", path.display())));
    }
    Ok(crate::input::read_manifest(path)?.1)
}

/// `publish`: release's publish flags and signing flags, each group taken whole.
#[derive(Debug, Args)]
pub struct PublishArgs {
    #[command(flatten)]
    pub flags: publish::PublishFlags,
    /// Print one JSON line per event (`{"event":…}`), then the report `{"dry_run","generation",
    /// "models","stores":[…],"validation","publish_record","publish_history"}` (see
    /// docs/release.md).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sign: publish::SignFlags,
}

pub fn publish_cmd(args: PublishArgs) -> CliResult {
    let flags = args.flags;
    let manifest = read_manifest(&flags.manifest_path)?;
    if !flags.artifacts.is_dir() {
        return Err(CliError::usage(format!(
            "--artifacts {}: not a directory",
            flags.artifacts.display()
        )));
    }
    let (json, dry_run) = (args.json, flags.dry_run);
    let removing_signature = args.sign.remove_signature.is_some();
    // A local store, which `serve` can serve to a device for a try.
    let local_store = flags.to.iter().find_map(|s| match s {
        StoreSpec::Local(p) => Some(p.clone()),
        _ => None,
    });
    let request = PublishRequest {
        manifest,
        flags,
        sign: args.sign,
    };
    let mut bar = None;
    let mut on_event = |e: &publish::Event| render_publish_event(e, json, &mut bar, dry_run);
    let outcome = publish::run(request, &mut super::sign::ask_passphrase, &mut on_event)?;
    if json {
        return print_json(&outcome);
    }
    print_outcome(&outcome)?;
    let generation = &outcome.report.generation;
    if outcome.report.dry_run {
        cli_support::info!("next: run the same command without --dry-run to publish");
    } else if removing_signature {
        cli_support::info!(
            "next: devices without trusted keys pick up {generation} on their next refresh; \
             devices with keys refuse it as not signed until you publish it again with \
             --sign-key"
        );
    } else if let Some(dir) = &local_store {
        cli_support::info!(
            "next: devices pick up {generation} on their next refresh; try it offline with \
             `release-cli serve --store {}` and a device pointed at it (`device-modeld-manager \
             --hf-base URL refresh`, URL: the base URL serve prints)",
            cli_support::shell_quote(&dir.display().to_string())
        );
    } else {
        cli_support::info!("next: devices pick up {generation} on their next refresh");
    }
    Ok(())
}

/// The text form of publish's events: warnings and notes on stderr, the upload's progress
/// ([`render_store_event`]); with `--json`, the signature and the upload's events as JSON
/// lines.
fn render_publish_event(
    e: &publish::Event,
    json: bool,
    bar: &mut Option<indicatif::ProgressBar>,
    dry_run: bool,
) {
    use publish::Event as E;
    match e {
        E::ValidationSkipped { reason, gaps } => eprintln!(
            "warning: publishing without validation ({reason}); {gaps} uncovered cell(s) recorded"
        ),
        E::GithubOnly { reason } => {
            eprintln!("warning: publishing to GitHub without the Hub ({reason}); recorded")
        }
        E::Signed { .. } if json => {
            let _ = print_json(e);
        }
        E::Signed {
            generation,
            release,
            expires,
            keys,
        } => cli_support::info!(
            "signing {generation} release {release} with key {} (expires {})",
            keys.join(" and "),
            cli_support::time::rfc3339(*expires),
        ),
        E::RemovingSignature { generation, reason } => eprintln!(
            "warning: publishing {generation} unsigned and removing its signature ({reason}); \
             devices with trusted keys will refuse this generation as not signed"
        ),
        E::StaysUnpublished { id, catalog } => eprintln!(
            "note: {id} (in the tree's {catalog}) is not in this manifest: it stays unpublished"
        ),
        E::RuntimeChecked { .. } if json => {}
        E::RuntimeChecked {
            subject,
            path,
            framing,
            receipt,
        } => cli_support::info!(
            "checked {subject} ({}): {}{}",
            path.display(),
            framing.as_deref().unwrap_or("no stamp"),
            if *receipt {
                "; build receipt names the pin and these bytes"
            } else {
                ""
            }
        ),
        E::Store(e) if json => {
            let _ = print_json(e);
        }
        E::Store(e) => render_store_event(e, bar, dry_run),
    }
}

/// The text report of a publish: the plan or what was uploaded, what the validation gate
/// decided, and where the records went.
fn print_outcome(outcome: &publish::PublishOutcome) -> CliResult {
    print_report(&outcome.report);
    match &outcome.validation {
        GateOutcome::Passed { workspace, covered } => crate::outln!(
            "validation: {} cell(s) of the seed's matrix covered by the records in {}",
            covered.len(),
            workspace.display()
        )?,
        GateOutcome::Skipped { reason, .. } => crate::outln!("validation: SKIPPED ({reason})")?,
    }
    if let Some(p) = &outcome.publish_record {
        crate::outln!("publish record: {}", p.display())?;
    }
    if let Some(p) = &outcome.publish_history {
        crate::outln!("this publish's record (kept): {}", p.display())?;
    }
    Ok(())
}

/// The `next:` line after a build or rehearsal that leaves a release ready to publish: the
/// publish command for these paths, each quoted for the shell (`rebuild` and `rehearse` say
/// it alike).
pub(crate) fn say_publish_next(
    generation: Generation,
    manifest: &std::path::Path,
    artifacts: &std::path::Path,
    workspace: &release::Workspace,
) {
    let sh = |p: &std::path::Path| cli_support::shell_quote(&p.display().to_string());
    cli_support::info!(
        "next: `release-cli publish --generation {generation} --manifest {} --artifacts {} \
         --workspace {} --to STORE` (STORE: a store to publish to, e.g. hf://buckets/NS/NAME; \
         --to again for each other store)",
        sh(manifest),
        sh(artifacts),
        sh(workspace.root())
    );
}

/// The text form of the upload's progress: a byte bar per store, one line per decision. Paths
/// are as the store holds them (a `github:` store's on its branch).
fn render_store_event(e: &Event, bar: &mut Option<indicatif::ProgressBar>, dry_run: bool) {
    use publish::path_in_store as at;
    match e {
        Event::StoreStarted {
            store,
            upload_bytes,
        } => {
            cli_support::info!("publishing to {store}");
            *bar = Some(bytes_bar(*upload_bytes, store.to_string(), false));
        }
        Event::Uploaded { sent, .. } => {
            if let Some(b) = bar {
                b.set_position(*sent)
            }
        }
        Event::Progress {
            store,
            path,
            transfer,
            sent,
        } => {
            if let Some(b) = bar {
                b.set_position(*sent);
                b.set_message(crate::progress::upload_label(
                    &store.name,
                    &at(store, path),
                    transfer,
                ));
            }
        }
        Event::Retrying {
            store,
            path,
            attempt,
            error,
            wait_ms,
        } => eprintln!(
            "warning: upload of {} failed (attempt {attempt}): {error}; retrying in {:.1} s",
            at(store, path),
            *wait_ms as f64 / 1000.0
        ),
        Event::Removed { store, path } => {
            cli_support::info!("{store}: removed {}", at(store, path))
        }
        Event::Checked { store, models } => {
            if let Some(b) = bar.take() {
                b.finish_and_clear()
            }
            if dry_run {
                cli_support::info!(
                    "{store}: {models} listed artifact(s) not in --artifacts are complete and matching there"
                )
            } else {
                cli_support::info!("{store}: {models} listed artifact(s) complete and matching")
            }
        }
        Event::Guarded {
            store,
            first_publish,
        } => {
            if *first_publish {
                cli_support::info!(
                    "{store}: no live manifest yet: first publish of this generation"
                )
            } else {
                cli_support::info!("{store}: release guard passed against the live manifest")
            }
        }
        Event::ManifestWritten { store, path } => {
            cli_support::info!("{store}: wrote {}", at(store, path))
        }
        Event::ManifestUnchanged { store, path } => {
            cli_support::info!(
                "{store}: {} already identical, not rewritten",
                at(store, path)
            )
        }
        Event::Uploading { store, path, size } => {
            let path = at(store, path);
            cli_support::detail!(
                "{store}: uploading {path} ({})",
                cli_support::progress::bytes(*size)
            )
        }
    }
}

fn print_report(report: &PublishReport) {
    let mut out = std::io::stdout().lock();
    let verb = if report.dry_run { "plan" } else { "published" };
    let _ = writeln!(
        out,
        "{verb} {} ({} model(s) from the artifacts directory: {})",
        report.generation,
        report.models.len(),
        report.models.join(", ")
    );
    for s in &report.stores {
        let _ = writeln!(out, "{}:", s.store);
        let at = |path: &str| publish::path_in_store(&s.store, path);
        if report.dry_run {
            for step in &s.steps {
                let _ = match step {
                    Step::Retract { path } => {
                        let path = at(path);
                        writeln!(out, "  remove   {path} (chunks change under it)")
                    }
                    Step::Upload {
                        path, size, reason, ..
                    } => writeln!(
                        out,
                        "  upload   {} ({}, {reason})",
                        at(path),
                        cli_support::progress::bytes(*size)
                    ),
                    Step::RemoveShadowingPlain { path } => {
                        let path = at(path);
                        writeln!(
                            out,
                            "  remove   {path} (plain file would shadow the chunk set)"
                        )
                    }
                    Step::Skip { path, .. } => writeln!(out, "  present  {}", at(path)),
                    Step::RemoveStale { path } => writeln!(
                        out,
                        "  remove   {} (an older split's, once the manifest is written)",
                        at(path)
                    ),
                };
            }
        } else {
            let _ = writeln!(
                out,
                "  uploaded {} file(s), {}; {} already present",
                s.uploaded_files,
                cli_support::progress::bytes(s.uploaded_bytes),
                s.skipped_files
            );
        }
        let _ = writeln!(
            out,
            "  manifest {}: {}",
            at(&s.manifest_path),
            s.manifest.replace('_', " ")
        );
        if let Some(sig) = s.signature {
            let _ = writeln!(
                out,
                "  signature {}{}: {}",
                at(&s.manifest_path),
                manifest::signature::SIGNATURE_SUFFIX,
                sig.replace('_', " ")
            );
        }
    }
}

#[derive(Debug, Args)]
pub struct ReuseArgs {
    /// The StarPilot model ID to publish the artifact as.
    #[arg(long, value_name = "ID")]
    pub model: ModelId,
    /// The model's ID in the source catalog (default: --model).
    #[arg(long, value_name = "ID")]
    pub source_id: Option<ModelId>,
    /// The source logical artifact, e.g. `hf://datasets/ORG/REPO/dir/x_driving_tinygrad.pkl`
    /// (its `.chunkNNofMM` files and `.chunkmanifest` sit beside that name).
    #[arg(long, value_name = "LOCATION", value_parser = Location::parse)]
    pub from: Location,
    /// The source catalog: a manifest with top-level `tinygrad_commit` and per-entry
    /// `source_commit`.
    #[arg(long, value_name = "FILE")]
    pub source_catalog: PathBuf,
    /// The source-model commit the artifact must have been built from (40 hex).
    #[arg(long, value_name = "SHA")]
    pub source_commit: GitCommit,
    /// The tinygrad commit the artifact must have been compiled with (40 hex).
    #[arg(long, value_name = "SHA")]
    pub tinygrad_commit: GitCommit,
    /// The store to copy into (`hf://buckets/NS/NAME` for a server-side copy).
    #[arg(long, value_name = "STORE", value_parser = StoreSpec::parse)]
    pub to: StoreSpec,
    /// The generation to copy into, e.g. `v25`.
    #[arg(long, value_name = "vNN")]
    pub generation: Generation,
    /// Also write the artifact's SHA-256 and chunk count into this manifest's entry for --model.
    #[arg(long, value_name = "FILE")]
    pub manifest: Option<PathBuf>,
    /// The openpilot tree whose `tinygrad_pins.json` (written by `tinygrad bump`) records the
    /// pins of generations after v25, as for publish. The artifact's tinygrad must be the pin
    /// of the generation it is copied into.
    #[arg(long, value_name = "DIR")]
    pub openpilot: Option<PathBuf>,
    #[command(flatten)]
    pub access: StoreAccess,
    /// Check the source (catalog, chunk set, OOB container) and print what would be removed,
    /// copied and written, and whether --manifest would change; nothing is written to the
    /// store or the manifest.
    #[arg(long)]
    pub dry_run: bool,
    /// Print `{"model","sha256","size","chunk_count","server_side","copied":[...]}`; with
    /// --dry-run `{"dry_run":true,"model","sha256","size","chunk_count","server_side","remove",
    /// "copy":[{"from","to","size"}],"write":[…],"manifest"}`.
    #[arg(long)]
    pub json: bool,
}

pub fn reuse_cmd(args: ReuseArgs) -> CliResult {
    // Everything that can refuse is decided before any store is touched.
    let catalog = read_manifest(&args.source_catalog)?;
    let target = match &args.manifest {
        Some(path) => Some((path.clone(), read_manifest(path)?)),
        None => None,
    };
    let approved = release::reuse::approve(
        release::reuse::ReuseAsk {
            model: args.model.clone(),
            source_id: args.source_id.clone().unwrap_or_else(|| args.model.clone()),
            source_commit: args.source_commit.clone(),
            tinygrad_commit: args.tinygrad_commit.clone(),
            generation: args.generation,
        },
        &release::tree::load_pins(args.openpilot.as_deref())?,
        &catalog,
        target,
    )?;
    let from = &args.from;
    let source = from.store.open(&args.access).map_err(store_error)?;
    let dest = args.to.open(&args.access).map_err(store_error)?;
    cli_support::detail!("source: {}", source.describe());
    cli_support::detail!("destination: {}", dest.describe());
    if args.dry_run {
        let plan =
            release::reuse::plan(&approved, source.as_ref(), from.path.clone(), dest.as_ref())?;
        return print_reuse_plan(&plan, args.manifest.as_deref(), args.json);
    }
    let bar = bytes_bar(
        approved.compatible.artifact.size.get(),
        format!("reuse {}", args.model),
        args.json,
    );
    let report = release::reuse::run(
        approved,
        source.as_ref(),
        from.path.clone(),
        dest.as_ref(),
        &mut |_, _, size| bar.inc(size),
    );
    bar.finish_and_clear();
    let report = report?;
    for c in &report.copied {
        cli_support::detail!(
            "copied {} -> {} ({})",
            c.from,
            c.to,
            cli_support::progress::bytes(c.size)
        );
    }
    if args.json {
        return print_json(&report);
    }
    crate::outln!("model        {}", report.model)?;
    crate::outln!("sha256       {}", report.sha256)?;
    crate::outln!(
        "size         {} ({} bytes)",
        cli_support::progress::bytes(report.size),
        report.size
    )?;
    crate::outln!("chunk_count  {}", report.chunk_count)?;
    crate::outln!(
        "copy         {}",
        if report.server_side {
            "server-side (no artifact bytes passed through this machine)"
        } else {
            "streamed through this machine"
        }
    )?;
    match &args.manifest {
        Some(p) => {
            crate::outln!("manifest     {} updated", p.display())?;
            cli_support::info!(
                "next: `release-cli publish --generation {} --manifest {} --artifacts DIR --workspace WS --to {}` with an empty DIR/{}/ (nothing to upload; publish checks the copied files) and WS the rebuild workspace whose records pass the validation gate",
                args.generation,
                p.display(),
                args.to,
                args.model
            );
        }
        None => cli_support::info!(
            "next: put these values in the manifest entry of {} (or rerun with --manifest FILE), then publish",
            args.model
        ),
    }
    Ok(())
}

/// `reuse --dry-run`'s output: the plan, and whether the manifest would be updated.
fn print_reuse_plan(plan: &ReusePlan, manifest: Option<&std::path::Path>, json: bool) -> CliResult {
    if json {
        let mut v = serde_json::to_value(plan).map_err(CliError::failure)?;
        v["dry_run"] = true.into();
        v["manifest"] = serde_json::to_value(manifest).map_err(CliError::failure)?;
        return print_json(&v);
    }
    let mut text = format!(
        "plan reuse {} ({}, {} chunk(s), sha256 {}), {}\n  remove   {}\n",
        plan.model,
        cli_support::progress::bytes(plan.size),
        plan.chunk_count,
        plan.sha256,
        if plan.server_side {
            "server-side copies"
        } else {
            "streamed through this machine"
        },
        plan.remove
    );
    for c in &plan.copy {
        text.push_str(&format!(
            "  copy     {} -> {} ({})\n",
            c.from,
            c.to,
            cli_support::progress::bytes(c.size)
        ));
    }
    for w in &plan.write {
        text.push_str(&format!("  write    {w}\n"));
    }
    if let Some(m) = manifest {
        text.push_str(&format!(
            "  update   {} (entry {})\n",
            m.display(),
            plan.model
        ));
    }
    crate::output::write_stdout(text.as_bytes())?;
    cli_support::info!("next: run the same command without --dry-run to copy");
    Ok(())
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The local store directory to serve (bucket layout: `manifests/`, `models/<gen>/…`).
    #[arg(long, value_name = "DIR")]
    pub store: PathBuf,
    /// Address to listen on; port 0 picks a free one. Loopback unless you say otherwise.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    pub addr: SocketAddr,
    /// Bucket name in `/buckets/<NS/NAME>/resolve/…` URLs.
    #[arg(long, default_value = layout::HF_BUCKET, value_name = "NS/NAME")]
    pub bucket: String,
    /// Repository in `/<OWNER/REPO>/<BRANCH>/…` URLs.
    #[arg(long, default_value = layout::GITHUB_REPO, value_name = "OWNER/REPO")]
    pub github_repo: String,
    /// Branch in `/<OWNER/REPO>/<BRANCH>/…` URLs.
    #[arg(long, default_value = layout::GITHUB_BRANCH, value_name = "BRANCH")]
    pub github_branch: String,
    /// Print `{"url","hf_base","github_base","store"}` as the first stdout line instead of the
    /// bare URL (`hf_base` and `github_base` are what `device-modeld-manager` takes).
    #[arg(long)]
    pub json: bool,
}

/// `serve --json`'s first line.
#[derive(serde::Serialize)]
struct ServeInfo<'a> {
    url: String,
    hf_base: &'a str,
    github_base: &'a str,
    store: &'a std::path::Path,
}

pub fn serve_cmd(args: ServeArgs) -> CliResult {
    if !args.store.is_dir() {
        return Err(CliError::usage(format!(
            "--store {}: not a directory",
            args.store.display()
        )));
    }
    for (flag, v) in [
        ("--bucket", &args.bucket),
        ("--github-repo", &args.github_repo),
    ] {
        let parts: Vec<&str> = v.split('/').collect();
        if parts.len() != 2 || parts.iter().any(|p| p.is_empty()) {
            return Err(CliError::usage(format!(
                "{flag} {v:?}: expected NAMESPACE/NAME"
            )));
        }
    }
    if args.github_branch.is_empty() || args.github_branch.contains('/') {
        return Err(CliError::usage("--github-branch must be one path segment"));
    }
    // -v logs each request, -q only warnings; otherwise RUST_LOG decides (default info).
    let filter = match cli_support::verbosity() {
        cli_support::Verbosity::Verbose => tracing_subscriber::EnvFilter::new("debug"),
        cli_support::Verbosity::Quiet => tracing_subscriber::EnvFilter::new("warn"),
        cli_support::Verbosity::Normal => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    // Colours only on a terminal and without NO_COLOR: a redirected log stays plain text.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(cli_support::colour_on(true))
        .try_init();
    let config = ServeConfig::standard(
        &args.store,
        &args.bucket,
        &args.github_repo,
        &args.github_branch,
    );
    let stopping = cli_support::stop_on_signals();
    let server = Server::start(args.addr, config)
        .map_err(|e| CliError::failure(format!("cannot listen on {}: {e}", args.addr)))?;
    let hf_base = format!("{}/buckets/{}/resolve", server.url(), args.bucket);
    let github_base = format!(
        "{}/{}/{}",
        server.url(),
        args.github_repo,
        args.github_branch
    );
    // The first line of stdout is the base URL and nothing else (or, with --json, one object):
    // scripts and tests read it.
    let first_line = if args.json {
        serde_json::to_string(&ServeInfo {
            url: server.url(),
            hf_base: &hf_base,
            github_base: &github_base,
            store: &args.store,
        })
        .map_err(CliError::failure)?
    } else {
        server.url().to_string()
    };
    crate::outln!("{first_line}")?;
    cli_support::info!(
        "serving {} as {hf_base}/… and {github_base}/…; stop with Ctrl-C",
        args.store.display(),
    );
    cli_support::info!(
        "next: device-modeld-manager --hf-base {hf_base} --github-base {github_base} refresh"
    );
    // SIGTERM and SIGINT stop the server and end the command normally (exit 0).
    cli_support::stop::wait_for(&stopping);
    drop(server);
    cli_support::info!("stopped");
    Ok(())
}
