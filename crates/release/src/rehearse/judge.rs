//! The rehearsal's verdict, a pure function over what was read from the device directory after
//! the manager ran (file names and digests, params, what `resolve` answered) and what the staged
//! release says it must hold.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use chunker::Sha256Digest;
use manifest::{Generation, GitCommit, ModelId, layout};

pub use crate::recorded::{RehearsalCheck, Scenario};

fn check(scenario: Scenario, name: &str, problems: Vec<String>, ok: String) -> RehearsalCheck {
    RehearsalCheck {
        scenario,
        check: name.to_string(),
        passed: problems.is_empty(),
        detail: if problems.is_empty() {
            ok
        } else {
            problems.join("; ")
        },
    }
}

/// A driving-artifact name as the previous manager's purge matches it: it contains `_driving_`
/// or starts with `driving_`. `Some(key)` is the text before `_driving_` (empty for a legacy
/// `driving_*` file).
pub fn driving_key(name: &str) -> Option<&str> {
    if let Some((key, _)) = name.split_once("_driving_") {
        return Some(key);
    }
    name.starts_with("driving_").then_some("")
}

/// A file of the device after the run.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Seen {
    File(Sha256Digest),
    /// Not a regular file (a symlink, a device node): never a verified artifact.
    Other,
}

/// What was read from one device directory after the manager ran.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct DeviceView {
    /// Entries directly in `<data>/models`, by name (directories left out).
    pub top: BTreeMap<String, Seen>,
    /// Regular files in subdirectories of `<data>/models` (the manager's staging), relative path
    /// → digest.
    pub nested: BTreeMap<String, Sha256Digest>,
    /// `<data>/params/d`, key → value.
    pub params: BTreeMap<String, String>,
    /// The refresh's exit code (`None`: killed by a signal).
    pub refresh_exit: Option<i32>,
    /// The last line `resolve` printed (`None` when it failed).
    pub resolved: Option<PathBuf>,
    /// The `small` profile of the generation's `preferences.json`, on a layout that keeps the
    /// selection there (`None`: not there, not JSON, or no string `small`).
    pub preferences_small: Option<String>,
}

/// Where a layout that keeps the selection apart from the params keeps it: the preferences
/// file relative to the models directory, and the id it names the built-in by.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SelectionFile {
    pub rel_path: String,
    pub bundled: String,
}

/// What the device must hold after the run.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Expectation {
    pub scenario: Scenario,
    pub generation: Generation,
    /// The model the old device had selected.
    pub selected: ModelId,
    /// The new catalog: every published ID and its artifact's SHA-256.
    pub catalog: BTreeMap<ModelId, Sha256Digest>,
    /// The old device's driving files, name → digest.
    pub old_driving: BTreeMap<String, Sha256Digest>,
    /// The files any migration keeps, name → digest.
    pub kept: BTreeMap<String, Sha256Digest>,
    pub models_dir: PathBuf,
    pub builtin_dir: PathBuf,
    /// Where the selected model's new artifact must be, relative to `models_dir`, under the
    /// generation's device layout (`<id>_driving_tinygrad.pkl`, or `<gen>/<id>/…`).
    pub selected_artifact: String,
    /// Per generation, where the selection lives (upstream's v26 reads it there and reads no
    /// param); `None` on a flat layout, where the selection params name the model.
    pub selection_file: Option<SelectionFile>,
}

/// The params that name the model modeld loads.
const SELECTION_PARAMS: [&str; 3] = ["Model", "DrivingModel", "ActiveSmallModel"];

fn same_path(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

fn under(p: &Path, dir: &Path) -> bool {
    p.starts_with(dir)
        || matches!((p.canonicalize(), dir.canonicalize()), (Ok(x), Ok(y)) if x.starts_with(&y))
}

/// The checks of one device.
pub fn judge_device(e: &Expectation, v: &DeviceView) -> Vec<RehearsalCheck> {
    let mut out = vec![
        refresh_exit(e, v),
        no_old_driving_artifact(e, v),
        local_and_dm_kept(e, v),
        manifest_version_param(e, v),
    ];
    match e.scenario {
        Scenario::Kept => out.push(selected_is_new_artifact(e, v)),
        Scenario::Dropped => out.push(absent_model_falls_back_to_builtin(e, v)),
        Scenario::Release => {}
    }
    out
}

fn refresh_exit(e: &Expectation, v: &DeviceView) -> RehearsalCheck {
    check(
        e.scenario,
        "refresh_exit",
        match v.refresh_exit {
            Some(0) => vec![],
            Some(c) => vec![format!("device-modeld-manager refresh exited {c}")],
            None => vec!["device-modeld-manager refresh was killed by a signal".into()],
        },
        "device-modeld-manager refresh exited 0".into(),
    )
}

/// No old-generation driving artifact under <data>/models: every non-local driving file left
/// is the new generation's plain artifact of a catalog model with the catalog's digest, and
/// no old bytes remain anywhere below.
fn no_old_driving_artifact(e: &Expectation, v: &DeviceView) -> RehearsalCheck {
    let old_digests: BTreeMap<&Sha256Digest, &str> =
        e.old_driving.iter().map(|(n, d)| (d, n.as_str())).collect();
    let mut left = Vec::new();
    for (name, seen) in &v.top {
        let Some(key) = driving_key(name) else {
            continue;
        };
        if key.starts_with(ModelId::LOCAL_PREFIX) {
            continue;
        }
        let current = e.catalog.iter().any(|(id, sha)| {
            layout::artifact_file_name(id).as_str() == name && *seen == Seen::File(*sha)
        });
        if !current {
            left.push(match seen {
                Seen::File(d) => match old_digests.get(d) {
                    Some(old) if *old == name => format!("{name} (the old file, unchanged)"),
                    Some(old) => format!("{name} (the old bytes of {old})"),
                    None => format!("{name} (not an artifact of the new catalog)"),
                },
                Seen::Other => format!("{name} (not a regular file)"),
            });
        }
    }
    for (path, d) in &v.nested {
        if let Some(old) = old_digests.get(d) {
            left.push(format!("{path} (the old bytes of {old})"));
        }
    }
    check(
        e.scenario,
        "no_old_driving_artifact",
        left.into_iter()
            .map(|l| format!("{} still holds {l}", e.models_dir.display()))
            .collect(),
        format!(
            "no {} driving artifact remains under {}",
            e.generation
                .previous()
                .map_or("old".into(), |g| g.to_string()),
            e.models_dir.display()
        ),
    )
}

/// The files every migration keeps.
fn local_and_dm_kept(e: &Expectation, v: &DeviceView) -> RehearsalCheck {
    let mut lost = Vec::new();
    for (name, d) in &e.kept {
        match v.top.get(name) {
            Some(Seen::File(got)) if got == d => {}
            Some(_) => lost.push(format!("{name} changed")),
            None => lost.push(format!("{name} was deleted")),
        }
    }
    check(
        e.scenario,
        "local_and_dm_kept",
        lost,
        format!("{} local and DM file(s) unchanged", e.kept.len()),
    )
}

fn manifest_version_param(e: &Expectation, v: &DeviceView) -> RehearsalCheck {
    let generation = e.generation.to_string();
    check(
        e.scenario,
        "manifest_version_param",
        match v.params.get("ModelManifestVersion") {
            Some(g) if *g == generation => vec![],
            other => vec![format!(
                "params ModelManifestVersion is {other:?}, not {generation:?}"
            )],
        },
        format!("ModelManifestVersion = {generation}"),
    )
}

/// Where the selection is not `want`, where the generation's layout keeps it: the params
/// (flat), or the small profile of the preferences file (per generation; the built-in by the
/// contract's id).
fn selection_problems(e: &Expectation, v: &DeviceView, want: &str) -> Vec<String> {
    match &e.selection_file {
        None => SELECTION_PARAMS
            .iter()
            .filter(|k| v.params.get(**k).map(String::as_str) != Some(want))
            .map(|k| format!("params {k} is {:?}, not {want:?}", v.params.get(*k)))
            .collect(),
        Some(f) => {
            let want = match want == layout::BUILTIN_MODEL_ID {
                true => f.bundled.as_str(),
                false => want,
            };
            match v.preferences_small.as_deref() {
                Some(small) if small == want => vec![],
                other => vec![format!(
                    "{} names {other:?} as the small profile, not {want:?}",
                    f.rel_path
                )],
            }
        }
    }
}

/// The kept device: its selection is the new artifact, with the manifest's digest, and
/// `resolve` answers it.
fn selected_is_new_artifact(e: &Expectation, v: &DeviceView) -> RehearsalCheck {
    let rel = e.selected_artifact.as_str();
    let path = e.models_dir.join(rel);
    let mut problems = selection_problems(e, v, e.selected.as_str());
    // A file directly in the models directory, or one below it (a per-generation root).
    let found = match v.top.get(rel) {
        Some(seen) => Some(seen.clone()),
        None => v.nested.get(rel).map(|d| Seen::File(*d)),
    };
    match (e.catalog.get(&e.selected), found.as_ref()) {
        (None, _) => problems.push(format!("{} is not in the new catalog", e.selected)),
        (Some(_), None) => problems.push(format!("{} is missing", path.display())),
        (Some(want), Some(Seen::File(got))) if got != want => problems.push(format!(
            "{} has SHA-256 {got}, the manifest lists {want}",
            path.display()
        )),
        (Some(_), Some(Seen::Other)) => {
            problems.push(format!("{} is not a regular file", path.display()))
        }
        _ => {}
    }
    match &v.resolved {
        Some(r) if same_path(r, &path) => {}
        Some(r) => problems.push(format!(
            "resolve answers {}, not {}",
            r.display(),
            path.display()
        )),
        None => problems.push("resolve answered nothing".into()),
    }
    check(
        e.scenario,
        "selected_is_new_artifact",
        problems,
        format!(
            "{} selected and resolved to {} with the manifest's SHA-256",
            e.selected,
            path.display()
        ),
    )
}

/// The dropped device: its selection, absent from the new catalog, falls back to the built-in.
fn absent_model_falls_back_to_builtin(e: &Expectation, v: &DeviceView) -> RehearsalCheck {
    let builtin = layout::BUILTIN_MODEL_ID;
    let mut problems = selection_problems(e, v, builtin);
    if e.catalog.contains_key(&e.selected) {
        problems.push(format!(
            "{} is in the new catalog; the dropped case needs an absent model",
            e.selected
        ));
    }
    match &v.resolved {
        Some(r) if under(r, &e.builtin_dir) => {}
        Some(r) => problems.push(format!(
            "resolve answers {}, not the built-in in {}",
            r.display(),
            e.builtin_dir.display()
        )),
        None => problems.push("resolve answered nothing".into()),
    }
    check(
        e.scenario,
        "absent_model_falls_back_to_builtin",
        problems,
        format!(
            "{} (absent from the new catalog) fell back to the built-in {builtin} in {}",
            e.selected,
            e.builtin_dir.display()
        ),
    )
}

/// The release checks made before any device: the openpilot tree's tinygrad is the manifest's
/// pin and the pin table's for the generation.
pub fn judge_release(
    generation: Generation,
    manifest_pin: Option<&GitCommit>,
    tree_pin: Result<&GitCommit, &str>,
    table_pin: Option<&GitCommit>,
) -> RehearsalCheck {
    let mut problems = Vec::new();
    match (manifest_pin, tree_pin) {
        (None, _) => problems.push(
            "the manifest records no tinygrad pin under its contract's revision key".to_string(),
        ),
        (_, Err(e)) => problems.push(format!("the openpilot tree's tinygrad: {e}")),
        (Some(m), Ok(t)) if m != t => problems.push(format!(
            "the manifest is pinned to {m}, the openpilot tree runs tinygrad {t} (as the tree \
             records it): a device on this tree refuses the manifest"
        )),
        _ => {}
    }
    match (manifest_pin, table_pin) {
        (Some(m), Some(p)) if m != p => problems.push(format!(
            "the pin table maps {generation} to {p}, the manifest says {m}"
        )),
        (Some(_), None) => problems.push(format!(
            "no pin for {generation} in the pin table (tinygrad_pins.json): run `release-cli \
             tinygrad bump` first"
        )),
        _ => {}
    }
    check(
        Scenario::Release,
        "tree_pin",
        problems,
        format!(
            "the manifest, the openpilot tree and the pin table agree on {generation}'s tinygrad"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Sha256Digest {
        Sha256Digest::of_bytes(s.as_bytes())
    }
    fn id(s: &str) -> ModelId {
        s.parse().unwrap()
    }

    fn expect(scenario: Scenario, selected: &str) -> Expectation {
        Expectation {
            scenario,
            generation: Generation::new(26),
            selected: id(selected),
            catalog: [(id("pop223"), d("new pop")), (id("sc23"), d("new sc"))].into(),
            old_driving: [
                ("pop223_driving_tinygrad.pkl".to_string(), d("old pop")),
                ("sc23_driving_tinygrad.pkl.p00".to_string(), d("old sc")),
            ]
            .into(),
            kept: [("local-x_driving_tinygrad.pkl".to_string(), d("local"))].into(),
            models_dir: PathBuf::from("/dev-x/data/models"),
            builtin_dir: PathBuf::from("/op/selfdrive/modeld/models"),
            selected_artifact: format!("{selected}_driving_tinygrad.pkl"),
            selection_file: None,
        }
    }

    /// Per generation the selection is judged in the preferences file, not in the params
    /// (which keep what the previous generation left): kept → the model, dropped → the
    /// contract's bundled id; anything else there fails, whatever the params say.
    #[test]
    fn a_per_generation_selection_is_judged_in_its_preferences() {
        for (scenario, selected, small, ok) in [
            (Scenario::Kept, "pop223", Some("pop223"), true),
            (Scenario::Kept, "pop223", Some("bundled-current"), false),
            (Scenario::Kept, "pop223", None, false),
            (Scenario::Dropped, "gone9", Some("bundled-current"), true),
            (Scenario::Dropped, "gone9", Some("gone9"), false),
        ] {
            let mut e = expect(scenario, selected);
            e.selection_file = Some(SelectionFile {
                rel_path: "v26/preferences.json".into(),
                bundled: "bundled-current".into(),
            });
            let mut v = good(scenario);
            // The params keep the previous generation's selection.
            for k in SELECTION_PARAMS {
                v.params.insert(k.into(), selected.into());
            }
            v.preferences_small = small.map(Into::into);
            let failing = failed(&judge_device(&e, &v));
            assert_eq!(failing.is_empty(), ok, "{scenario} {small:?}: {failing:?}");
            if !ok {
                assert!(
                    failing.iter().any(|f| f.contains("v26/preferences.json")),
                    "{failing:?}"
                );
            }
        }
    }

    /// A device that did everything right for `scenario`.
    fn good(scenario: Scenario) -> DeviceView {
        let sel = if scenario == Scenario::Kept {
            "pop223"
        } else {
            "rdf43"
        };
        let mut v = DeviceView {
            refresh_exit: Some(0),
            ..Default::default()
        };
        v.top.insert(
            "local-x_driving_tinygrad.pkl".into(),
            Seen::File(d("local")),
        );
        v.top
            .insert(".model_versions.json".into(), Seen::File(d("{}")));
        if scenario == Scenario::Kept {
            v.top.insert(
                "pop223_driving_tinygrad.pkl".into(),
                Seen::File(d("new pop")),
            );
            v.resolved = Some("/dev-x/data/models/pop223_driving_tinygrad.pkl".into());
        } else {
            v.resolved = Some("/op/selfdrive/modeld/models/driving_tinygrad.pkl".into());
        }
        for k in SELECTION_PARAMS {
            v.params.insert(k.into(), sel.into());
        }
        v.params.insert("ModelManifestVersion".into(), "v26".into());
        v
    }

    fn failed(checks: &[RehearsalCheck]) -> Vec<String> {
        checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| format!("{}: {}", c.check, c.detail))
            .collect()
    }

    /// The selected model's new artifact where the generation's layout puts it: flat for v25,
    /// `<gen>/<id>/` for the v26 contract (and a made-up v27 that keeps it). A file in the other
    /// place does not count.
    #[test]
    fn the_selected_artifact_is_judged_where_the_layout_puts_it() {
        use manifest::contract::DeviceLayout;
        for (layout, generation) in [
            (DeviceLayout::Flat, Generation::new(25)),
            (DeviceLayout::PerGeneration, Generation::new(26)),
            (DeviceLayout::PerGeneration, Generation::new(27)),
        ] {
            let mut e = expect(Scenario::Kept, "pop223");
            e.generation = generation;
            e.selected_artifact = layout.artifact_rel_path(
                generation,
                &id("pop223"),
                layout::artifact_file_name(&id("pop223")).as_str(),
            );
            let mut v = good(Scenario::Kept);
            v.params
                .insert("ModelManifestVersion".into(), generation.to_string());
            let flat = "pop223_driving_tinygrad.pkl";
            let there = v.top.remove(flat).unwrap();
            let Seen::File(digest) = there else {
                panic!("the good view holds a file")
            };
            if layout == DeviceLayout::Flat {
                assert_eq!(e.selected_artifact, flat);
                v.top.insert(flat.into(), Seen::File(digest));
            } else {
                assert_eq!(
                    e.selected_artifact,
                    format!("{generation}/pop223/pop223_driving_tinygrad.pkl")
                );
                v.nested.insert(e.selected_artifact.clone(), digest);
            }
            v.resolved = Some(e.models_dir.join(&e.selected_artifact));
            let checks = judge_device(&e, &v);
            assert!(
                failed(&checks).is_empty(),
                "{layout:?}: {:?}",
                failed(&checks)
            );
            if layout == DeviceLayout::PerGeneration {
                // The artifact at the flat place instead: missing where the layout wants it.
                v.nested.remove(&e.selected_artifact);
                v.top.insert(flat.into(), Seen::File(digest));
                let failing = failed(&judge_device(&e, &v));
                assert!(
                    failing
                        .iter()
                        .any(|f| f.starts_with("selected_is_new_artifact") && f.contains("missing")),
                    "{failing:?}"
                );
            }
        }
    }

    #[test]
    fn driving_names_as_the_previous_purge_matches_them() {
        for (name, key) in [
            ("pop223_driving_tinygrad.pkl", Some("pop223")),
            ("pop223_driving_tinygrad.pkl.p03", Some("pop223")),
            ("pop223_driving_chestnut_tinygrad.pkl", Some("pop223")),
            ("local-x_driving_tinygrad.pkl", Some("local-x")),
            ("driving_vision_tinygrad.pkl", Some("")),
            ("dmonitoring_model_tinygrad.pkl", None),
            (".model_artifacts.json", None),
            ("local-x.json", None),
        ] {
            assert_eq!(driving_key(name), key, "{name}");
        }
    }

    #[test]
    fn each_device_outcome_gets_its_verdict() {
        type Mutate = fn(&mut DeviceView);
        let table: Vec<(&str, Scenario, &str, Mutate, &[&str])> = vec![
            ("kept, all right", Scenario::Kept, "pop223", |_| {}, &[]),
            (
                "dropped, all right",
                Scenario::Dropped,
                "gone9",
                |_| {},
                &[],
            ),
            (
                "old plain file left with its old bytes",
                Scenario::Kept,
                "pop223",
                |v| {
                    v.top.insert(
                        "pop223_driving_tinygrad.pkl".into(),
                        Seen::File(d("old pop")),
                    );
                },
                &["no_old_driving_artifact", "selected_is_new_artifact"],
            ),
            (
                "a legacy part left",
                Scenario::Kept,
                "pop223",
                |v| {
                    v.top.insert(
                        "sc23_driving_tinygrad.pkl.p00".into(),
                        Seen::File(d("old sc")),
                    );
                },
                &["no_old_driving_artifact"],
            ),
            (
                "old bytes under another name in the staging directory",
                Scenario::Kept,
                "pop223",
                |v| {
                    v.nested.insert(".starpilot-staging/x".into(), d("old sc"));
                },
                &["no_old_driving_artifact"],
            ),
            (
                "a chestnut variant of no catalog file",
                Scenario::Kept,
                "pop223",
                |v| {
                    v.top.insert(
                        "pop223_driving_chestnut_tinygrad.pkl".into(),
                        Seen::File(d("?")),
                    );
                },
                &["no_old_driving_artifact"],
            ),
            (
                "the selected artifact is a symlink",
                Scenario::Kept,
                "pop223",
                |v| {
                    v.top
                        .insert("pop223_driving_tinygrad.pkl".into(), Seen::Other);
                },
                &["no_old_driving_artifact", "selected_is_new_artifact"],
            ),
            (
                "selection fell back although the model is published",
                Scenario::Kept,
                "pop223",
                |v| {
                    v.top.remove("pop223_driving_tinygrad.pkl");
                    v.params.insert("Model".into(), "rdf43".into());
                    v.resolved = Some("/op/selfdrive/modeld/models/driving_tinygrad.pkl".into());
                },
                &["selected_is_new_artifact"],
            ),
            (
                "the profile still names the old model",
                Scenario::Dropped,
                "gone9",
                |v| {
                    v.params.insert("ActiveSmallModel".into(), "gone9".into());
                },
                &["absent_model_falls_back_to_builtin"],
            ),
            (
                "resolve answers a downloaded file for a dropped model",
                Scenario::Dropped,
                "gone9",
                |v| v.resolved = Some("/dev-x/data/models/gone9_driving_tinygrad.pkl".into()),
                &["absent_model_falls_back_to_builtin"],
            ),
            (
                "the local model was deleted",
                Scenario::Dropped,
                "gone9",
                |v| {
                    v.top.remove("local-x_driving_tinygrad.pkl");
                },
                &["local_and_dm_kept"],
            ),
            (
                "the manager failed and left the old generation",
                Scenario::Kept,
                "pop223",
                |v| {
                    v.refresh_exit = Some(4);
                    v.params.insert("ModelManifestVersion".into(), "v25".into());
                    v.resolved = None;
                },
                &[
                    "refresh_exit",
                    "manifest_version_param",
                    "selected_is_new_artifact",
                ],
            ),
        ];
        for (what, scenario, selected, mutate, want) in table {
            let mut v = good(scenario);
            mutate(&mut v);
            let checks = judge_device(&expect(scenario, selected), &v);
            let bad: Vec<&str> = checks
                .iter()
                .filter(|c| !c.passed)
                .map(|c| c.check.as_str())
                .collect();
            assert_eq!(bad, want, "{what}: {:?}", failed(&checks));
            assert!(checks.iter().all(|c| c.scenario == scenario), "{what}");
        }
    }

    #[test]
    fn the_tree_pin_must_be_the_manifests_and_the_tables() {
        let a: GitCommit = "a".repeat(40).parse().unwrap();
        let b: GitCommit = "b".repeat(40).parse().unwrap();
        for g in [Generation::new(25), Generation::new(26)] {
            assert!(judge_release(g, Some(&a), Ok(&a), Some(&a)).passed);
            let c = judge_release(g, Some(&a), Ok(&b), Some(&a));
            assert!(
                !c.passed && c.detail.contains("refuses the manifest"),
                "{c:?}"
            );
            let c = judge_release(g, Some(&a), Ok(&a), Some(&b));
            assert!(
                !c.passed && c.detail.contains(&format!("maps {g}")),
                "{c:?}"
            );
            let c = judge_release(g, Some(&a), Ok(&a), None);
            assert!(!c.passed && c.detail.contains("tinygrad bump"), "{c:?}");
            assert!(!judge_release(g, None, Ok(&a), Some(&a)).passed);
            assert!(!judge_release(g, Some(&a), Err("missing"), Some(&a)).passed);
        }
    }
}
