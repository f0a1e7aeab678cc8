//! `release-cli rehearse`: the staged release played on devices as the previous generation's
//! manager leaves them, before anything is published (docs/release.md, "Rehearse").
//!
//! 1. The staged release (the ready directory and the manifest) is laid out as a store in the
//!    bucket layout under `<workspace>/rehearsal/store` (hard links, copies where links cannot
//!    be made; the manifest as its canonical bytes, as `publish` writes it) and served on
//!    127.0.0.1 in both device URL layouts by `artifact_store::serve`, as `release-cli serve`
//!    does.
//! 2. Two devices are built ([`device::build_old_device`]): one whose selected model is in the
//!    new catalog (`kept`), one whose selected model the new catalog does not list (`dropped`).
//! 3. The real `device-modeld-manager` binary runs `refresh` then `resolve` on each, as the
//!    service does.
//! 4. Each device directory is read directly (file digests, params) and judged
//!    ([`judge::judge_device`]); the manager's own report is kept in the log, never trusted.
//!
//! The result is `results/rehearsal.json` ([`RehearsalRecord`]), bound to the SHA-256 of the
//! manifest's canonical bytes and its generation, which `publish`'s gate requires
//! ([`crate::gate::coverage`]).

pub mod device;
pub mod judge;

use fs_err as fs;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use chunker::Sha256Digest;
use manifest::{BehaviorVersion, Generation, Manifest, ModelId, NamedModel, layout};

use crate::{Error, Result, Workspace};
use device::{OldDevice, OldDeviceSpec, build_old_device};
use judge::{DeviceView, Expectation, RehearsalCheck, Scenario, Seen};
use manifest::UnixSeconds;

/// Manifests are well under this; a larger file is not one.
const MAX_MANIFEST_BYTES: u64 = 16 << 20;
/// A param value is a few bytes; a larger file is read only this far.
const MAX_PARAM_BYTES: u64 = 64 << 10;
/// Size of each stand-in artifact on the old devices.
const OLD_ARTIFACT_BYTES: usize = 64 << 10;
/// The device's StarPilot trusted-keys file, relative to the openpilot tree.
pub const TREE_TRUSTED_KEYS: &str = "starpilot/assets/model_release_keys.pub";

/// What to rehearse.
#[derive(Clone, Debug)]
pub struct RehearseOptions {
    /// The rebuild workspace: the record goes to `results/rehearsal.json`, the devices and the
    /// staged store to `rehearsal/` (replaced on every run).
    pub workspace: Workspace,
    /// The staged manifest (`ready/model_names_<gen>.json`).
    pub manifest: PathBuf,
    /// The staged artifacts, one `<id>/` per model (`ready/`).
    pub artifacts: PathBuf,
    pub generation: Generation,
    /// The release's openpilot tree: its `tinygrad_repo/TINYGRAD_COMMIT`, `tinygrad_pins.json`
    /// and built-in model are what the devices run with.
    pub openpilot: PathBuf,
    /// The `device-modeld-manager` binary to run.
    pub device_manager: PathBuf,
    /// The model the old device has selected; default: the first catalog model that is neither
    /// local, the built-in nor external-GPU.
    pub select: Option<ModelId>,
    /// The release keys publish signs with (`--sign-key`): the rehearsal store's manifest is
    /// signed with them, as the fleet of a tree that ships trusted keys needs. Empty: a
    /// `.minisig` beside the staged manifest is served, if there is one.
    pub sign_keys: Vec<std::sync::Arc<artifact_store::signing::SigningKey>>,
}

pub use crate::recorded::{RehearsalRecord, manifest_digest};

fn input(problem: impl Into<String>) -> Error {
    Error::RehearseInput {
        problem: problem.into(),
    }
}

/// Read a manifest a user handed us: a regular file, size-capped.
pub fn read_manifest(path: &Path) -> Result<Manifest> {
    // A missing file is the I/O error naming it, as before the capped read.
    fs::metadata(path)?;
    let bytes = match chunker::bounded::read_capped_existing(path, MAX_MANIFEST_BYTES) {
        Ok(bytes) => bytes,
        Err(chunker::Error::NotRegularFile { .. }) => {
            return Err(input(format!(
                "--manifest {}: not a regular file; pass ready/model_names_<gen>.json",
                path.display()
            )));
        }
        Err(chunker::Error::FileTooLarge { .. }) => {
            return Err(input(format!(
                "--manifest {}: larger than {MAX_MANIFEST_BYTES} bytes, not a manifest",
                path.display()
            )));
        }
        Err(e) => return Err(e.into()),
    };
    Manifest::from_slice(&bytes).map_err(|source| Error::ManifestFile {
        path: path.to_path_buf(),
        source,
    })
}

/// The models the rehearsal uses: the kept device's selection, two more catalog models for the
/// old device's other forms, and an ID the catalog does not list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cast {
    pub selected: NamedModel,
    pub others: Vec<NamedModel>,
    pub dropped: ModelId,
}

/// Choose the cast from the new catalog (pure).
pub fn cast(m: &Manifest, select: Option<&ModelId>) -> Result<Cast> {
    let builtin = layout::builtin_model_id();
    let eligible = |e: &&manifest::ModelEntry| {
        !e.id().is_local() && *e.id() != builtin && !e.uses_external_gpu()
    };
    // An entry without a version is listed as `v15` on the old device.
    let old = |e: &manifest::ModelEntry| NamedModel {
        version: e.version().unwrap_or(BehaviorVersion::new(15)).to_string(),
        ..NamedModel::of_entry(e)
    };
    let selected = match select {
        Some(id) => {
            let e = m.get(id).ok_or_else(|| {
                input(format!(
                    "--select {id}: not in the staged manifest; pick a model it lists"
                ))
            })?;
            if !eligible(&e) {
                return Err(input(format!(
                    "--select {id}: a local, built-in or external-GPU model is not migrated \
                     by a download; pick a QCOM catalog model"
                )));
            }
            old(e)
        }
        None => m.models().iter().find(eligible).map(old).ok_or_else(|| {
            input(
                "the staged manifest lists no downloadable QCOM model to select; nothing to \
                 rehearse",
            )
        })?,
    };
    let others = m
        .models()
        .iter()
        .filter(eligible)
        .filter(|e| *e.id() != selected.id)
        .take(2)
        .map(old)
        .collect();
    let dropped = (0..)
        .map(|n| {
            let s = if n == 0 {
                "retired-rehearsal".to_string()
            } else {
                format!("retired-rehearsal{n}")
            };
            s.parse::<ModelId>().expect("a valid model ID")
        })
        .find(|id| m.get(id).is_none())
        .expect("an unused ID");
    Ok(Cast {
        selected,
        others,
        dropped,
    })
}

/// Lay the staged release out as a bucket-layout store: the manifest's canonical bytes (and its
/// `.minisig` when one lies beside the staged manifest), and each listed model's files from
/// `<artifacts>/<id>/`. A model without files is left out: the device will find it missing, as
/// it would in a store.
fn stage_store(
    store: &Path,
    manifest_path: &Path,
    m: &Manifest,
    artifacts: &Path,
    g: Generation,
    sign_keys: &[std::sync::Arc<artifact_store::signing::SigningKey>],
) -> Result<()> {
    let hf = layout::StoreLayout::HfBucket;
    let at = |p: &layout::StorePath| store.join(p.as_str());
    let mpath = at(&hf.manifest_path(g));
    fs::create_dir_all(mpath.parent().expect("manifests/"))?;
    chunker::atomic::write_atomic(&mpath, &m.to_canonical_bytes())?;
    let sig = signature_beside(manifest_path);
    if !sign_keys.is_empty() {
        // Signed as publish signs the same bytes; the release number and expiry are the
        // rehearsal's own (old devices have accepted no release of this generation yet).
        let comment = artifact_store::signing::new_comment(
            g,
            manifest::ReleaseNumber::FIRST,
            manifest::signature::MIN_EXPIRES_IN_DAYS,
        )
        .map_err(|e| input(e.to_string()))?;
        let bytes = m.to_canonical_bytes();
        let blocks = sign_keys
            .iter()
            .map(|k| k.sign(&bytes, &comment))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| input(e.to_string()))?;
        let text = manifest::signature::join_signature_blocks(&blocks);
        chunker::atomic::write_atomic(at(&hf.signature_path(g)), text.as_bytes())?;
    } else if sig.is_file() {
        fs::copy(&sig, at(&hf.signature_path(g)))?;
    }
    for e in m.models().iter().filter(|e| !e.id().is_local()) {
        let src = artifacts.join(e.id().as_str());
        if !src.is_dir() {
            continue;
        }
        let dst = at(&hf.artifact_dir(g, e.id()));
        fs::create_dir_all(&dst)?;
        for f in fs::read_dir(&src)? {
            let f = f?;
            if !f.file_type()?.is_file() {
                continue;
            }
            let to = dst.join(f.file_name());
            if std::fs::hard_link(f.path(), &to).is_err() {
                fs::copy(f.path(), &to)?;
            }
        }
    }
    Ok(())
}

/// `MANIFEST.minisig`: a signature made beside the staged manifest (`manifest sign`).
fn signature_beside(manifest_path: &Path) -> PathBuf {
    PathBuf::from(format!(
        "{}{}",
        manifest_path.display(),
        manifest::signature::SIGNATURE_SUFFIX
    ))
}

/// What the device directory holds now.
fn read_device(dev: &OldDevice) -> Result<DeviceView> {
    let mut v = DeviceView::default();
    let models = dev.models_dir();
    for entry in fs::read_dir(&models)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let t = entry.file_type()?;
        if t.is_dir() {
            walk(&entry.path(), &name, 0, &mut v.nested)?;
        } else if t.is_file() {
            v.top
                .insert(name, Seen::File(Sha256Digest::of_file(&entry.path())?.0));
        } else {
            v.top.insert(name, Seen::Other);
        }
    }
    let params = dev.params_dir();
    if params.is_dir() {
        for entry in fs::read_dir(&params)? {
            let entry = entry?;
            if !entry.file_type()?.is_file() {
                continue;
            }
            let mut s = Vec::new();
            fs::File::open(entry.path())?
                .take(MAX_PARAM_BYTES)
                .read_to_end(&mut s)?;
            v.params.insert(
                entry.file_name().to_string_lossy().into_owned(),
                String::from_utf8_lossy(&s).into_owned(),
            );
        }
    }
    Ok(v)
}

/// Regular files below a subdirectory of `models/` (staging), a few levels deep.
fn walk(dir: &Path, rel: &str, depth: u32, out: &mut BTreeMap<String, Sha256Digest>) -> Result<()> {
    if depth > 3 {
        return Ok(());
    }
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = format!("{rel}/{}", entry.file_name().to_string_lossy());
        let t = entry.file_type()?;
        if t.is_dir() {
            walk(&entry.path(), &name, depth + 1, out)?;
        } else if t.is_file() {
            out.insert(name, Sha256Digest::of_file(&entry.path())?.0);
        }
    }
    Ok(())
}

/// One manager run, appended to `log`.
fn manager(
    bin: &Path,
    common: &[String],
    args: &[&str],
    log: &Path,
) -> Result<(Option<i32>, String)> {
    let out = Command::new(bin)
        .args(common)
        .args(args)
        .output()
        .map_err(|source| Error::Spawn {
            command: format!("{} {}", bin.display(), args.join(" ")),
            dir: PathBuf::from("."),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut file = fs::OpenOptions::new().create(true).append(true).open(log)?;
    write!(
        file,
        "$ {} {} {}\nexit: {:?}\n--- stdout\n{stdout}\n--- stderr\n{}\n",
        bin.display(),
        common.join(" "),
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    )?;
    Ok((out.status.code(), stdout))
}

/// Refuse what cannot be rehearsed before anything is read: missing directories or manager, a
/// tree that does not select its tinygrad's generation, an unsigned rehearsal of a tree that
/// ships release keys.
fn check_inputs(opts: &RehearseOptions) -> Result<()> {
    for (flag, dir) in [
        ("--workspace", opts.workspace.root()),
        ("--artifacts", &opts.artifacts),
        ("--openpilot", &opts.openpilot),
    ] {
        if !dir.is_dir() {
            return Err(Error::NotADirectory {
                flag,
                path: dir.to_path_buf(),
            });
        }
    }
    if !opts.device_manager.is_file() {
        return Err(input(format!(
            "--device-manager {}: no such file; build it (`cargo build -p device-modeld-manager`) \
             or pass its path",
            opts.device_manager.display()
        )));
    }
    // The devices follow the tree: it must select exactly the generation of its tinygrad.
    crate::tree::check_selectors(&opts.openpilot)?;
    // A tree that ships trusted keys makes its devices refuse an unsigned manifest: the
    // rehearsal is signed as the publish will be, before any device is built.
    if opts.openpilot.join(TREE_TRUSTED_KEYS).is_file()
        && opts.sign_keys.is_empty()
        && !signature_beside(&opts.manifest).is_file()
    {
        return Err(input(format!(
            "{} ships {TREE_TRUSTED_KEYS}: its devices refuse an unsigned manifest, so the \
             rehearsal is signed as the publish will be; run this command again with \
             --sign-key KEY (KEY: the release secret key `publish --sign-key` signs with)",
            opts.openpilot.display()
        )));
    }
    Ok(())
}

/// What is rehearsed: the manifest as publish stages it (its contract's top-level keys added
/// where absent, so the rehearsed bytes are the published ones), the generation the devices
/// migrate from, the cast and the manifest's pin.
struct Release {
    pins: manifest::PinTable,
    m: Manifest,
    previous: Generation,
    cast: Cast,
    /// The manifest's pin under the generation's contract (v25 `tinygrad_commit`, v26
    /// `compiler_revision`).
    pin: Option<manifest::GitCommit>,
}

impl Release {
    fn read(opts: &RehearseOptions) -> Result<Self> {
        let pins = crate::tree::load_pins(Some(&opts.openpilot))?;
        let g = opts.generation;
        let m =
            crate::publish::staged_manifest(&read_manifest(&opts.manifest)?, g, pins.contract(g));
        if let Some(mg) = m.generation()
            && mg != g
        {
            return Err(input(format!(
                "--manifest {} is a {mg} manifest, not {g}; pass the manifest of --generation",
                opts.manifest.display()
            )));
        }
        let previous = g
            .previous()
            .ok_or_else(|| input(format!("{g} has no previous generation to migrate from")))?;
        let cast = cast(&m, opts.select.as_ref())?;
        let pin = m.revision(pins.contract(g));
        Ok(Release {
            pins,
            m,
            previous,
            cast,
            pin,
        })
    }
}

/// Lay the release out as a store in `work/store` and serve it on 127.0.0.1.
fn serve_staged(
    opts: &RehearseOptions,
    m: &Manifest,
    work: &Path,
    say: &mut dyn FnMut(&str),
) -> Result<artifact_store::serve::Server> {
    if work.symlink_metadata().is_ok() {
        fs::remove_dir_all(work)?;
    }
    let store = work.join("store");
    fs::create_dir_all(&store)?;
    say(&format!(
        "staging {} and {} as a store in {}",
        opts.manifest.display(),
        opts.artifacts.display(),
        store.display()
    ));
    let g = opts.generation;
    stage_store(
        &store,
        &opts.manifest,
        m,
        &opts.artifacts,
        g,
        &opts.sign_keys,
    )?;
    let server = artifact_store::serve::Server::start(
        "127.0.0.1:0",
        artifact_store::serve::ServeConfig::standard(
            &store,
            layout::HF_BUCKET,
            layout::GITHUB_REPO,
            layout::GITHUB_BRANCH,
        ),
    )
    .map_err(|e| {
        input(format!(
            "cannot serve {} on 127.0.0.1: {e}",
            store.display()
        ))
    })?;
    say(&format!("serving it on {}", server.url()));
    Ok(server)
}

/// The manager's arguments for the device `dev` built in `root` (its data, params and sysfs
/// roots, made here) against the store served at `url`.
fn manager_args(
    opts: &RehearseOptions,
    dev: &OldDevice,
    root: &Path,
    url: &str,
    device_args: &[String],
) -> Result<Vec<String>> {
    let shm = root.join("shm/params/d");
    let sysfs = root.join("sys");
    fs::create_dir_all(&shm)?;
    fs::create_dir_all(&sysfs)?;
    let mut common: Vec<String> = vec![
        "--data-dir".into(),
        dev.data.display().to_string(),
        "--memory-params-dir".into(),
        shm.display().to_string(),
        "--sysfs-root".into(),
        sysfs.display().to_string(),
        "--hf-base".into(),
        format!("{url}/buckets/{}/resolve", layout::HF_BUCKET),
        "--github-base".into(),
        format!("{url}/{}/{}", layout::GITHUB_REPO, layout::GITHUB_BRANCH),
    ];
    common.extend(device_args.iter().cloned());
    let keys = opts.openpilot.join(TREE_TRUSTED_KEYS);
    if keys.is_file() {
        common.extend(["--trusted-keys".into(), keys.display().to_string()]);
    }
    Ok(common)
}

/// One scenario: a `previous`-generation device built in `root`, refreshed and resolved by the
/// real manager against the store at `url`, read back and judged.
fn rehearse_device(
    opts: &RehearseOptions,
    r: &Release,
    scenario: Scenario,
    root: &Path,
    url: &str,
    device_args: &[String],
    say: &mut dyn FnMut(&str),
) -> Result<Vec<RehearsalCheck>> {
    let (g, previous) = (opts.generation, r.previous);
    let selected = match scenario {
        Scenario::Dropped => NamedModel {
            id: r.cast.dropped.clone(),
            name: "Retired Rehearsal Model".into(),
            version: r.cast.selected.version.clone(),
        },
        _ => r.cast.selected.clone(),
    };
    let spec = OldDeviceSpec {
        generation: previous,
        selected: selected.clone(),
        others: r.cast.others.clone(),
        local: "local-rehearsal".parse().expect("a valid local ID"),
        artifact_size: OLD_ARTIFACT_BYTES,
    };
    say(&format!(
        "{scenario}: a {previous} device with {} selected in {}",
        selected.id,
        root.display()
    ));
    let dev = build_old_device(&root.join("data"), &spec)?;
    let common = manager_args(opts, &dev, root, url, device_args)?;
    let log = root.join("manager.log");
    say(&format!(
        "{scenario}: device-modeld-manager refresh, then resolve (log: {})",
        log.display()
    ));
    let (refresh_exit, _) = manager(&opts.device_manager, &common, &["refresh", "--json"], &log)?;
    let (resolve_exit, out) = manager(&opts.device_manager, &common, &["resolve"], &log)?;
    let mut view = read_device(&dev)?;
    view.refresh_exit = refresh_exit;
    view.resolved = (resolve_exit == Some(0))
        .then(|| out.lines().rev().find(|l| !l.trim().is_empty()))
        .flatten()
        .map(|l| PathBuf::from(l.trim()));
    let contract = r.pins.contract(g);
    let selection_file = contract.generation_files.map(|f| judge::SelectionFile {
        rel_path: format!("{g}/{}", f.preferences),
        bundled: contract.bundled_selection.to_string(),
    });
    if let Some(f) = &selection_file {
        view.preferences_small = fs::read(dev.models_dir().join(&f.rel_path))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|p| p.get("small")?.as_str().map(str::to_string));
    }
    let expect = Expectation {
        scenario,
        generation: g,
        selected: selected.id.clone(),
        catalog: r
            .m
            .models()
            .iter()
            .filter(|e| !e.id().is_local())
            .filter_map(|e| Some((e.id().clone(), e.artifact_sha256()?)))
            .collect(),
        old_driving: dev.driving.clone(),
        kept: dev.kept.clone(),
        models_dir: dev.models_dir(),
        // The device follows its tree, as on a comma: its generation is the one of the tree's
        // tinygrad, its built-in under the tree (docs/device.md, "Which generation").
        builtin_dir: opts.openpilot.join(crate::tree::BUILTIN_DIR),
        selection_file,
        selected_artifact: contract.device_layout.artifact_rel_path(
            g,
            &selected.id,
            layout::artifact_file_name(&selected.id).as_str(),
        ),
    };
    Ok(judge::judge_device(&expect, &view))
}

/// Run the rehearsal and write `results/rehearsal.json`. Errors are inputs that cannot be
/// rehearsed (nothing recorded); a rehearsal that ran and failed is a record with
/// `passed: false`. `say` gets one line per step.
pub fn run(opts: &RehearseOptions, say: &mut dyn FnMut(&str)) -> Result<RehearsalRecord> {
    check_inputs(opts)?;
    let r = Release::read(opts)?;
    let g = opts.generation;
    // The runtime gate before anything is staged: every driving artifact's stamp and every
    // build receipt (the tree's built-in and DM set too), for contracts that have them.
    crate::loadable::gate_publish(&r.m, &opts.artifacts, Some(&opts.openpilot), &r.pins, g)?;
    let tree_pin = crate::tree::tree_pin(&opts.openpilot)
        .map(|p| p.commit)
        .map_err(|e| e.to_string());
    let mut checks = vec![judge::judge_release(
        g,
        r.pin.as_ref(),
        tree_pin.as_ref().map_err(String::as_str),
        r.pins.get(g),
    )];
    let work = opts.workspace.rehearsal_dir();
    let server = serve_staged(opts, &r.m, &work, say)?;
    let url = server.url();
    let device_args: Vec<String> = vec![
        "--openpilot-dir".into(),
        opts.openpilot.display().to_string(),
    ];
    for scenario in [Scenario::Kept, Scenario::Dropped] {
        let root = work.join(scenario.to_string());
        checks.extend(rehearse_device(
            opts,
            &r,
            scenario,
            &root,
            &url,
            &device_args,
            say,
        )?);
    }
    drop(server);

    let passed = checks.iter().all(|c| c.passed);
    let rec = RehearsalRecord {
        generation: g,
        previous_generation: r.previous,
        manifest: opts.manifest.clone(),
        manifest_sha256: manifest_digest(&r.m),
        tinygrad_commit: r.pin,
        openpilot: opts.openpilot.clone(),
        device_manager: opts.device_manager.clone(),
        device_args,
        selected: r.cast.selected.id,
        dropped: r.cast.dropped,
        checks,
        passed,
        finished_at: UnixSeconds::now(),
        work_dir: work,
    };
    crate::records::write(&opts.workspace.rehearsal_record(), &rec)?;
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(entries: &str) -> Manifest {
        Manifest::from_slice(format!(r#"{{"generation":"v26","models":[{entries}]}}"#).as_bytes())
            .unwrap()
    }

    #[test]
    fn the_cast_skips_builtin_local_and_gpu_models() {
        let m = manifest(
            r#"{"id":"rdf43","name":"RDF","version":"v15"},
               {"id":"gpu16","name":"G","version":"v16","uses_external_gpu":true},
               {"id":"pop223","name":"Pop","version":"v11"},
               {"id":"sc23","name":"Sc","version":"v12"},
               {"id":"tr14223","name":"Tr","version":"v16"},
               {"id":"retired-rehearsal","name":"X","version":"v16"}"#,
        );
        let c = cast(&m, None).unwrap();
        assert_eq!(c.selected.id.as_str(), "pop223");
        assert_eq!(c.selected.version, BehaviorVersion::new(11).to_string());
        let others: Vec<&str> = c.others.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(others, ["sc23", "tr14223"]);
        // The absent ID really is absent.
        assert_eq!(c.dropped.as_str(), "retired-rehearsal1");
        let c = cast(&m, Some(&"tr14223".parse().unwrap())).unwrap();
        assert_eq!(c.selected.id.as_str(), "tr14223");
        for bad in ["gpu16", "rdf43", "nope"] {
            let e = cast(&m, Some(&bad.parse().unwrap())).unwrap_err();
            assert!(e.to_string().contains(&format!("--select {bad}")), "{e}");
        }
        let e = cast(
            &manifest(r#"{"id":"rdf43","name":"RDF","version":"v15"}"#),
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("nothing to rehearse"), "{e}");
    }
}
