//! `release-cli audit`: is what is live whole and consistent? Parses flags, calls
//! `release::audit::read::run`, and renders its report.

use std::path::PathBuf;

use clap::Args;
use manifest::{Generation, UnixSeconds};
use release::audit::{MendContext, Report, read};

use crate::output::print_json;
use crate::progress::bytes_bar;
use crate::{CliError, CliResult};
use artifact_store::StoreAccess;

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// The generation to audit, e.g. `v25`.
    #[arg(long, value_name = "vNN")]
    pub generation: Generation,
    /// A store to audit: `hf://buckets/NS/NAME`, `github:CHECKOUT`, `file:DIR` or a directory.
    /// Repeat for several; every store must agree with the first (same manifest bytes).
    #[arg(long, value_name = "STORE", required = true, value_parser = artifact_store::StoreSpec::parse)]
    pub store: Vec<artifact_store::StoreSpec>,
    /// Also read and hash every chunk of every listed artifact (streaming; a download of each
    /// from the Hub), with progress.
    #[arg(long)]
    pub deep: bool,
    /// Minisign public key(s) the signature must verify with (repeat during a rotation).
    /// With it an unsigned store is a problem; without it a signature is not checked.
    #[arg(long, value_name = "PUB")]
    pub key: Vec<PathBuf>,
    /// The rebuild workspace whose `ready/` holds the release (only written into the printed
    /// commands that mend a problem by publishing again).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub workspace: PathBuf,
    /// The secret key(s) `publish --sign-key` takes (only written into the printed commands
    /// that mend a signed store).
    #[arg(long, value_name = "KEY")]
    pub sign_key: Vec<PathBuf>,
    /// The openpilot tree whose `tinygrad_pins.json` records the pins of generations after v25.
    #[arg(long, value_name = "DIR")]
    pub openpilot: Option<PathBuf>,
    #[command(flatten)]
    pub access: StoreAccess,
    /// Print the report `{"generation","near_expiry_days","stores":[{"store","manifest_sha256",
    /// "models","artifacts","bytes","deep","signature":{"state","release","key","expires"},
    /// "problems":[{"store","model","path","kind","message","mend"}]}],"disagreements":[…],
    /// "healthy"}` (see docs/release.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: AuditArgs) -> CliResult {
    let g = args.generation;
    let request = read::AuditRequest {
        generation: g,
        stores: args.store,
        keys: args.key,
        openpilot: args.openpilot.clone(),
        deep: args.deep,
        mend: MendContext {
            workspace: std::path::absolute(&args.workspace).unwrap_or(args.workspace),
            sign_keys: args.sign_key,
            openpilot: args.openpilot,
        },
        access: args.access.clone(),
    };
    // One bar per store while --deep hashes it (hidden off a terminal, with --json or -q).
    let mut bar: Option<(String, indicatif::ProgressBar)> = None;
    let report = read::run(&request, &mut |p| {
        if bar.as_ref().is_none_or(|(s, _)| s != p.store) {
            if let Some((_, b)) = bar.take() {
                b.finish_and_clear();
            }
            let b = bytes_bar(p.total, format!("hashing {}", p.store), args.json);
            bar = Some((p.store.to_string(), b));
        }
        if let Some((_, b)) = &bar {
            b.set_position(p.done);
        }
    });
    if let Some((_, b)) = bar.take() {
        b.finish_and_clear();
    }
    let report = report?;
    let problems = report.findings().count();
    if args.json {
        print_json(&report)?;
    } else {
        render(&report)?;
    }
    if report.healthy {
        return Ok(());
    }
    let e = CliError::check_failed(format!(
        "{problems} problem(s) in what is live for {g}; each is listed above with the command that mends it"
    ));
    Err(if args.json { e.after_json_report() } else { e })
}

fn render(r: &Report) -> CliResult {
    let now = UnixSeconds::now().0;
    for s in &r.stores {
        let sig = &s.signature;
        let signature = match (sig.state, sig.release, sig.expires) {
            ("verified", Some(rel), Some(exp)) => format!(
                "signed, release {rel} by key {}, expires {} (in {} days)",
                sig.key.as_deref().unwrap_or("?"),
                UnixSeconds(exp),
                exp.saturating_sub(now) / 86_400
            ),
            ("not_checked", ..) => "signed (not checked: no --key)".to_string(),
            ("refused", ..) => "signature refused".to_string(),
            _ => "unsigned".to_string(),
        };
        crate::outln!(
            "{}: {} model(s), {} artifact(s), {}{}; {signature}",
            s.store,
            s.models,
            s.artifacts,
            cli_support::progress::bytes(s.bytes),
            if s.deep { ", every chunk hashed" } else { "" }
        )?;
        if let Some(sha) = &s.manifest_sha256 {
            crate::outln!("  manifest sha256 {sha}")?;
        }
        if s.problems.is_empty() {
            crate::outln!("  ok")?;
        }
        for f in &s.problems {
            crate::outln!("  problem: {f}\n    mend: {}", f.mend)?;
        }
    }
    if r.stores.len() > 1 {
        if r.disagreements.is_empty() {
            crate::outln!("the {} stores agree", r.stores.len())?;
        }
        for f in &r.disagreements {
            crate::outln!("problem: {}: {f}\n  mend: {}", f.store, f.mend)?;
        }
    }
    if r.healthy {
        crate::outln!("healthy: {} is whole and consistent", r.generation)?;
    }
    Ok(())
}
