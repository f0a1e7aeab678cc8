//! `release-cli rehearse`: the front of `release::rehearse` (docs/release.md, "Rehearse").

use std::path::PathBuf;

use clap::Args;
use manifest::{Generation, ModelId};

use crate::output::{print_json, store_error};
use crate::{CliError, CliResult};

#[derive(Debug, Args)]
pub struct RehearseArgs {
    /// The generation being released, e.g. `v26`; the devices start on the one before.
    #[arg(long, value_name = "vNN")]
    pub generation: Generation,
    /// The staged manifest (`ready/model_names_<gen>.json`).
    #[arg(long, value_name = "FILE")]
    pub manifest: PathBuf,
    /// The staged artifacts, one `<id>/` chunk set per model (`ready/`).
    #[arg(long, value_name = "DIR")]
    pub artifacts: PathBuf,
    /// The release's openpilot tree (tinygrad_repo/TINYGRAD_COMMIT, tinygrad_pins.json, the
    /// built-in model under selfdrive/modeld/models) the devices run with.
    #[arg(long, value_name = "DIR")]
    pub openpilot: PathBuf,
    /// The rebuild workspace: the record goes to results/rehearsal.json (publish requires a
    /// passing one for these manifest bytes), the devices and logs to rehearsal/ (replaced).
    #[arg(long, value_name = "DIR", value_parser = release::Workspace::value_parser())]
    pub workspace: release::Workspace,
    /// The device-modeld-manager binary to run [default: the one beside release-cli].
    #[arg(long, value_name = "PATH")]
    pub device_manager: Option<PathBuf>,
    /// The model the old device has selected [default: the first QCOM catalog model that is not
    /// the built-in].
    #[arg(long, value_name = "ID")]
    pub select: Option<ModelId>,
    /// The release secret key `publish --sign-key` signs with (repeat during a rotation): the
    /// rehearsal's manifest is signed with it, as devices of a tree that ships
    /// starpilot/assets/model_release_keys.pub require (such a tree is refused without it,
    /// unless MANIFEST.minisig is beside the manifest). An encrypted key's passphrase comes
    /// from STARPILOT_SIGN_PASSPHRASE, else from the terminal.
    #[arg(long, value_name = "KEY")]
    pub sign_key: Vec<PathBuf>,
    /// Print the record: `{"generation","previous_generation","manifest","manifest_sha256",
    /// "tinygrad_commit","openpilot","device_manager","device_args","selected","dropped",
    /// "checks":[{"scenario","check","passed","detail"}],"passed","finished_at","work_dir"}`.
    #[arg(long)]
    pub json: bool,
}

pub fn rehearse(args: RehearseArgs) -> CliResult {
    let device_manager = match args.device_manager {
        Some(p) => p,
        None => std::env::current_exe()
            .map_err(|e| CliError::failure(format!("cannot find release-cli's own path: {e}")))?
            .with_file_name("device-modeld-manager"),
    };
    let opts = release::rehearse::RehearseOptions {
        workspace: args.workspace.clone(),
        manifest: args.manifest,
        artifacts: args.artifacts,
        generation: args.generation,
        openpilot: args.openpilot,
        device_manager,
        select: args.select,
        sign_keys: super::sign::load_signing_keys(&args.sign_key)?
            .into_iter()
            .map(std::sync::Arc::new)
            .collect(),
    };
    let rec = release::rehearse::run(&opts, &mut |line| cli_support::info!("{line}"))?;
    let path = args.workspace.rehearsal_record();
    if args.json {
        print_json(&rec)?;
    } else {
        for c in &rec.checks {
            crate::outln!(
                "{} {:<8} {}: {}",
                if c.passed { "ok    " } else { "FAILED" },
                c.scenario.to_string(),
                c.check,
                c.detail
            )?;
        }
        crate::outln!(
            "rehearsal {} {} -> {} (manifest sha256 {}); recorded in {}",
            if rec.passed { "passed" } else { "FAILED" },
            rec.previous_generation,
            rec.generation,
            rec.manifest_sha256,
            path.display()
        )?;
    }
    if rec.passed {
        super::store::say_publish_next(
            rec.generation,
            &rec.manifest,
            &opts.artifacts,
            &args.workspace,
        );
        Ok(())
    } else {
        Err(CliError::check_failed(format!(
            "the rehearsal of {} failed ({} check(s)); the devices and the manager's logs are in \
             {}; fix the staged release and rehearse again (publish refuses until it passes)",
            rec.manifest.display(),
            rec.failures().count(),
            rec.work_dir.display()
        )))
    }
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The rebuild workspace (results/, ready/).
    #[arg(long, value_name = "DIR", value_parser = release::Workspace::value_parser())]
    pub workspace: release::Workspace,
    /// The release's openpilot tree [default: the one the preflight record names].
    #[arg(long, value_name = "DIR")]
    pub openpilot: Option<PathBuf>,
    /// The generation being released [default: the one whose pin the tree's tinygrad is]. An
    /// earlier generation a later rebuild set aside is read from `<workspace>/generations/<gen>/`.
    #[arg(long, value_name = "vNN")]
    pub generation: Option<Generation>,
    /// A store to read what it holds live (manifest generation, pin, signature release); only
    /// read. Repeatable; same forms as publish --to.
    #[arg(long = "store", visible_alias = "to", value_name = "STORE", value_parser = named_store)]
    pub stores: Vec<(String, artifact_store::StoreSpec)>,
    #[command(flatten)]
    pub access: artifact_store::StoreAccess,
    /// Print `{"workspace","generation","tree":{"openpilot","tinygrad_commit","pin_generation",
    /// "compiler_marker","synced":{"destination","remote_root","digest_sha256","files",
    /// "synced_at_unix","tree_matches"},"problem"},"manifest","manifest_sha256","unbuilt",
    /// "builds":[{"id","state","generation","version","uses_external_gpu","tinygrad_commit",
    /// "sha256","error"}],"dm":[{"name","size","sha256"}],"builtin","builtin_matches_build",
    /// "receipts":[{"of","receipt","compiler_revision","artifact_sha256","matches_pin","problem"}],
    /// "preflight":{"cell","state","detail"},"validation":[…],"rehearsal":{…},
    /// "stores":[{"store","generation","tinygrad_commit","manifest_sha256","models",
    /// "signature_release","holds_staged","problem"}],"problems","next":{"command","why"}}`.
    #[arg(long)]
    pub json: bool,
}

/// A `--store`, typed, with its name as given (what the report calls it).
fn named_store(s: &str) -> artifact_store::Result<(String, artifact_store::StoreSpec)> {
    Ok((s.to_string(), artifact_store::StoreSpec::parse(s)?))
}

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or("-".to_string(), |v| v.to_string())
}

pub fn status(args: StatusArgs) -> CliResult {
    let mut opened = Vec::new();
    for (name, spec) in &args.stores {
        let store = spec.open(&args.access).map_err(store_error)?;
        opened.push((name.clone(), store));
    }
    let refs: Vec<(String, &dyn artifact_store::Store)> = opened
        .iter()
        .map(|(n, s)| (n.clone(), s.as_ref()))
        .collect();
    let st = release::status::gather(
        &args.workspace,
        args.openpilot.as_deref(),
        args.generation,
        &refs,
    )?;
    if args.json {
        return print_json(&st);
    }
    crate::outln!(
        "workspace {} — generation {}",
        st.workspace.display(),
        opt(&st.generation)
    )?;
    print_tree(st.tree.as_ref())?;
    print_files(&st)?;
    print_gates_and_stores(&st)
}

/// The tree, its pin and the last sync.
fn print_tree(tree: Option<&release::status::TreeStatus>) -> CliResult {
    match tree {
        None => crate::outln!("tree       (none: pass --openpilot DIR)")?,
        Some(t) => {
            crate::outln!(
                "tree       {} tinygrad {} ({})",
                t.openpilot.display(),
                opt(&t.tinygrad_commit),
                t.pin_generation
                    .map_or("no generation's pin".into(), |g| format!("{g}'s pin"))
            )?;
            if let Some(p) = &t.problem {
                crate::outln!("tree       problem: {p}")?;
            }
            crate::outln!(
                "compiler   marker {} (last sync record)",
                opt(&t.compiler_marker)
            )?;
            match &t.synced {
                None => crate::outln!("synced     never")?,
                Some(s) => crate::outln!(
                    "synced     {}:{} at {} digest {} over {} files; tree {}",
                    s.destination,
                    s.remote_root,
                    manifest::UnixSeconds(s.synced_at_unix),
                    s.digest_sha256,
                    s.files,
                    if s.tree_matches {
                        "unchanged since"
                    } else {
                        "CHANGED since"
                    }
                )?,
            }
        }
    }
    Ok(())
}

/// The staged manifest, each build, the tree's DM files and built-in, and their receipts.
fn print_files(st: &release::status::Status) -> CliResult {
    crate::outln!(
        "manifest   {} {}",
        st.manifest
            .as_ref()
            .map_or("-".into(), |p| p.display().to_string()),
        opt(&st.manifest_sha256)
    )?;
    for b in &st.builds {
        crate::outln!(
            "build      {:<16} {:<7} {} {} gpu={} tinygrad {} sha256 {}{}",
            b.id.as_str(),
            b.state,
            b.generation,
            opt(&b.version),
            opt(&b.uses_external_gpu),
            opt(&b.tinygrad_commit),
            opt(&b.sha256),
            b.error
                .as_ref()
                .map_or(String::new(), |e| format!(" ({e})"))
        )?;
    }
    for id in &st.unbuilt {
        crate::outln!("build      {:<16} missing", id.as_str())?;
    }
    for f in &st.dm {
        crate::outln!(
            "dm         {:<34} {} {}",
            f.name,
            f.size.map_or("-".into(), |n| format!("{n} bytes")),
            opt(&f.sha256)
        )?;
    }
    crate::outln!(
        "builtin    {}{}",
        st.builtin
            .as_ref()
            .map_or("missing".into(), |b| format!("sha256 {}", opt(&b.sha256))),
        match st.builtin_matches_build {
            Some(true) => " (this pin's rdf43 build)",
            Some(false) => " (NOT this pin's rdf43 build)",
            None => "",
        }
    )?;
    for r in &st.receipts {
        crate::outln!(
            "receipt    {:<40} {}",
            r.of,
            match (&r.problem, &r.compiler_revision) {
                (Some(p), _) => format!("UNREADABLE ({p})"),
                (None, rev) => format!(
                    "tinygrad {} sha256 {}{}",
                    opt(rev),
                    opt(&r.artifact_sha256),
                    match r.matches_pin {
                        Some(true) => "",
                        Some(false) => " (NOT this pin)",
                        None => "",
                    }
                ),
            }
        )?;
    }
    Ok(())
}

/// The gate cells, the stores, the problems and the next step.
fn print_gates_and_stores(st: &release::status::Status) -> CliResult {
    for c in std::iter::once(&st.preflight)
        .chain(st.validation.iter())
        .chain(std::iter::once(&st.rehearsal))
    {
        crate::outln!("gate       {:<8} {}: {}", c.state, c.cell, c.detail)?;
    }
    for s in &st.stores {
        crate::outln!(
            "store      {} {} tinygrad {} release {} models {} sha256 {}{}{}",
            s.store,
            opt(&s.generation),
            opt(&s.tinygrad_commit),
            opt(&s.signature_release),
            opt(&s.models),
            opt(&s.manifest_sha256),
            if s.holds_staged {
                " (holds the staged manifest)"
            } else {
                ""
            },
            s.problem
                .as_ref()
                .map_or(String::new(), |p| format!(" ({p})"))
        )?;
    }
    for p in &st.problems {
        crate::outln!("problem    {p}")?;
    }
    if st.next.command.is_empty() {
        crate::outln!("next       nothing: {}", st.next.why)?;
    } else {
        crate::outln!(
            "next       {}\n           ({})",
            st.next.command,
            st.next.why
        )?;
    }
    Ok(())
}
