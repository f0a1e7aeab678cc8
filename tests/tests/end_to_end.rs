//! The main job end to end with the real binaries: publish v25 (local store + git `Models`
//! branch), serve it on 127.0.0.1, and migrate a v24 device with `device-modeld-manager refresh`.
//! Also the failure versions: Hugging Face down, and the selected model missing from v25.

use std::path::Path;

use integration_tests::story::{self, Binaries, LOCAL_MODEL, Report, Scenario};
use manifest::ModelId;
use manifest::layout::{self, DM_FILES};

fn play(scenario: Scenario) -> (tempfile::TempDir, Report) {
    let bins = Binaries::next_to_test_executable().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let report = story::play(&bins, &scenario, &dir.path().join("work"), false)
        .unwrap_or_else(|e| panic!("story failed: {e}"));
    (dir, report)
}

fn is_driving_artifact(name: &str) -> bool {
    name.contains("_driving_") || name.starts_with("driving_")
}

fn published_digest(report: &Report, id: &str) -> String {
    let id: ModelId = id.parse().unwrap();
    report
        .manifest
        .get(&id)
        .and_then(|e| e.artifact())
        .map(|a| a.sha256.to_hex())
        .expect("published with an artifact")
}

/// No driving artifact of the old generation is left: each one is a local model or the selected
/// model with exactly the published v25 bytes.
fn assert_no_old_generation_artifact(report: &Report, selected: Option<&str>) {
    for (name, digest) in &report.after {
        if !is_driving_artifact(name) || name.starts_with(LOCAL_MODEL) {
            continue;
        }
        let sel = selected.unwrap_or_else(|| panic!("{name} left on a device that fell back"));
        assert_eq!(
            name,
            &format!("{sel}{}", layout::ARTIFACT_SUFFIX),
            "stray {name}"
        );
        assert_eq!(
            digest,
            &published_digest(report, sel),
            "{name} is not the v25 artifact"
        );
    }
}

/// The device asked only for v25 paths (never an unversioned or v24 one), from `github` or not.
fn assert_only_v25_requests(report: &Report, github: bool) {
    assert!(!report.requests.is_empty(), "no request logged");
    for r in &report.requests {
        assert!(r.is_generation_path("v25"), "device asked for {}", r.target);
        assert_eq!(r.is_github(), github, "device asked {} ", r.target);
    }
}

/// What upstream modeld and the UIs read names `small`: the small profile (with the catalog's
/// name), the comma-joined catalog plus the local model, and caches with no v24 leftovers.
fn assert_device_contract(r: &Report, small: &str) {
    let p = &r.params_after;
    assert_eq!(p["ActiveSmallModel"], small);
    let want_name = match r
        .manifest
        .get(&small.parse().unwrap())
        .and_then(|e| e.name())
    {
        Some(n) => n
            .replace(['👀', '📡', '🗺', '\u{fe0f}'], "")
            .trim()
            .to_string(),
        None => layout::BUILTIN_MODEL_NAME.to_string(),
    };
    assert_eq!(p["ActiveSmallModelName"], want_name);
    assert_eq!(
        p["ActiveBigModel"], "none",
        "a disabled big profile stays disabled"
    );
    let listed: Vec<&str> = p["AvailableModels"].split(',').collect();
    assert_eq!(listed.len(), r.manifest.models().len() + 1, "{listed:?}");
    assert_eq!(listed.last(), Some(&LOCAL_MODEL));
    for cache in [
        ".model_versions.json",
        ".model_artifacts.json",
        ".model_artifact_urls.json",
    ] {
        let body = std::fs::read(r.models_dir.join(cache)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        for id in v.as_object().unwrap().keys() {
            assert!(listed.contains(&id.as_str()), "{cache} keeps {id}");
        }
    }
}

fn assert_locals_and_dm_kept(report: &Report) {
    let mut expected: Vec<String> = DM_FILES.iter().map(|s| s.to_string()).collect();
    expected.push(format!("{LOCAL_MODEL}{}", layout::ARTIFACT_SUFFIX));
    expected.sort();
    assert_eq!(report.kept(), expected);
}

#[test]
fn a_v24_device_migrates_to_the_published_v25() {
    let (_dir, r) = play(Scenario::default());

    // Every old-generation artifact form is gone: legacy parts with their sidecar, a chunk set.
    let deleted = r.deleted();
    for name in [
        "gwm8223_driving_tinygrad.pkl.p00",
        "gwm8223_driving_tinygrad.pkl.p02",
        "gwm8223_driving_tinygrad.pkl.sha256",
        "tr16223_driving_tinygrad.pkl.chunk01of02",
        "tr16223_driving_tinygrad.pkl.chunkmanifest",
    ] {
        assert!(deleted.contains(&name), "{name} not deleted: {deleted:?}");
    }
    assert_locals_and_dm_kept(&r);
    // The selected v24 plain PKL was replaced by the verified v25 artifact.
    assert_eq!(r.downloaded(), vec!["pop223_driving_tinygrad.pkl"]);
    assert_no_old_generation_artifact(&r, Some("pop223"));

    assert_eq!(r.selected_after(), Some("pop223"));
    assert_eq!(r.params_after["DrivingModel"], "pop223");
    assert_eq!(r.params_after["ModelManifestVersion"], "v25");
    assert_eq!(r.resolved, r.models_dir.join("pop223_driving_tinygrad.pkl"));
    assert_device_contract(&r, "pop223");
    let origin = r.refresh["manifest_origin"].as_str().unwrap();
    assert!(origin.starts_with("Hugging Face"), "{origin}");
    assert_only_v25_requests(&r, false);
}

#[test]
fn publish_writes_artifacts_first_and_the_manifest_last() {
    let (_dir, r) = play(Scenario::default());
    let commits = &r.github_commits;
    assert_eq!(commits.last().unwrap(), "Publish model_names_v25.json");
    for id in ["pop223", "gwm8223", "tr16223"] {
        let pos = |suffix: &str| {
            commits
                .iter()
                .position(|c| c.contains(&format!("{id}_driving_tinygrad.pkl{suffix}")))
                .unwrap_or_else(|| panic!("no commit for {id}{suffix}: {commits:?}"))
        };
        let manifest_pos = pos(".chunkmanifest");
        assert!(pos(".sha256") < manifest_pos, "{commits:?}");
        assert!(pos(".chunk01of") < manifest_pos, "{commits:?}");
    }
    // The store holds the manifest under the Hugging Face layout, byte for byte.
    let store_manifest = r.work.join("store/manifests/model_names_v25.json");
    assert_eq!(
        std::fs::read(&store_manifest).unwrap(),
        r.manifest.to_canonical_bytes()
    );
    // The git branch holds it at its root, as raw.githubusercontent.com serves it.
    let checkout: &Path = &r.work.join("models-checkout");
    assert!(checkout.join("model_names_v25.json").is_file());
    assert!(
        checkout
            .join("v25/pop223/pop223_driving_tinygrad.pkl.chunkmanifest")
            .is_file()
    );
}

#[test]
fn with_hugging_face_down_the_device_uses_github() {
    let (_dir, r) = play(Scenario {
        hf_down: true,
        ..Scenario::default()
    });
    let origin = r.refresh["manifest_origin"].as_str().unwrap();
    assert!(origin.starts_with("GitHub"), "{origin}");
    assert_only_v25_requests(&r, true);
    assert_eq!(r.downloaded(), vec!["pop223_driving_tinygrad.pkl"]);
    assert_no_old_generation_artifact(&r, Some("pop223"));
    assert_locals_and_dm_kept(&r);
    assert_eq!(r.selected_after(), Some("pop223"));
    assert_eq!(r.params_after["ModelManifestVersion"], "v25");
    assert_eq!(r.resolved, r.models_dir.join("pop223_driving_tinygrad.pkl"));
}

#[test]
fn with_the_selected_model_missing_from_v25_the_device_falls_back_to_the_builtin() {
    let (_dir, r) = play(Scenario {
        selected_missing: true,
        ..Scenario::default()
    });
    assert!(r.deleted().contains(&"pop223_driving_tinygrad.pkl"));
    assert!(r.downloaded().is_empty(), "{:?}", r.downloaded());
    assert_no_old_generation_artifact(&r, None);
    assert_locals_and_dm_kept(&r);

    let p = &r.params_after;
    assert_eq!(p["Model"], layout::BUILTIN_MODEL_ID);
    assert_eq!(p["DrivingModel"], layout::BUILTIN_MODEL_ID);
    assert_eq!(p["DrivingModelName"], layout::BUILTIN_MODEL_NAME);
    assert_eq!(p["ModelVersion"], "v15");
    assert_eq!(p["DrivingModelVersion"], "v15");
    assert_eq!(p["ModelManifestVersion"], "v25");
    assert_eq!(r.resolved, r.builtin_dir.join("driving_tinygrad.pkl"));
    assert_eq!(r.refresh["fell_back_to_builtin"], true);
    assert_device_contract(&r, layout::BUILTIN_MODEL_ID);
    // Only the manifest was asked for: the missing model is not probed elsewhere.
    assert_only_v25_requests(&r, false);
    assert!(
        r.requests.iter().all(|q| !q.target.contains("pop223")),
        "{:?}",
        r.requests
    );
}

/// Issue 22's end-to-end bump: the live v25 release, `tinygrad bump` to a made-up commit (v26),
/// sync and rebuild against the loopback sshd with the stand-in `./models`, DM, built-in, the
/// validation records, publish to a local store and a git `Models` branch; then a v25 device
/// whose openpilot tree moves to the new tinygrad runs `device-modeld-manager run` as the
/// documented service entry does, and its data dir is read directly.
#[test]
fn a_v25_device_follows_its_tree_through_a_bump_to_v26() {
    use integration_tests::bump::{
        self, Compiler, Device, DeviceState, MODELS, Mirror, Release, SELECTED,
    };
    use test_support::sshd::{DeviceRoot, Sshd};

    let Some(sshd) = Sshd::start() else { return };
    let started = std::time::Instant::now();
    let bins = Binaries::next_to_test_executable().unwrap_or_else(|e| panic!("{e}"));
    let (old, old_pin) = bump::current_generation();
    // The compiler comma, still on the current generation's tinygrad.
    let comma = DeviceRoot::new(Some(&old_pin));
    let compiler = Compiler {
        ssh_config: sshd.ssh_config().to_path_buf(),
        alias: Sshd::alias().to_string(),
        remote_root: comma.remote_root(),
        models_dir: comma.models_dir(),
    };
    let t = tempfile::tempdir().unwrap();
    let work = t.path().join("maintainer");
    let ok = |r: Result<serde_json::Value, String>| r.unwrap_or_else(|e| panic!("{e}"));
    let mut rel = Release::new(&bins, &compiler, &work, &comma.remote_root().join("models"))
        .unwrap_or_else(|e| panic!("{e}"));

    // 1. The live release of the current generation, staged without the compiler (its build is
    //    not this test's subject, and its publish record says so).
    rel.stage_live_release(old)
        .unwrap_or_else(|e| panic!("{e}"));
    ok(rel.publish(
        old,
        Some("the live release the bump starts from; the bump's own publish is gated"),
    ));
    let live_old = rel.live_manifest(old).unwrap();

    // 2. A device of that generation, as its manager leaves it.
    let mut device = Device::new(&t.path().join("device")).unwrap();
    device.ship_tree(&rel.openpilot).unwrap();
    {
        let mirror = Mirror::serve(&bins, &rel.store, &t.path().join("serve-old.log")).unwrap();
        device.origins = (mirror.hf_base.clone(), mirror.github_base.clone());
        let t0 = std::time::Instant::now();
        bump::prepare_old_device(&bins, &rel, &device, old).unwrap_or_else(|e| panic!("{e}"));
        rel.steps
            .push(("device: prepare the old device".into(), t0.elapsed()));
    }
    let before = DeviceState::read(&device).unwrap();
    assert_eq!(before.params["ModelManifestVersion"], old.to_string());
    assert_eq!(before.params["Model"], SELECTED);
    let old_forms = before.driving_artifacts();
    // Every form an old artifact takes: a full PKL, legacy parts, chunks, a chunk manifest, a
    // sidecar.
    type IsForm = fn(&str) -> bool;
    let forms: [(&str, IsForm); 5] = [
        ("full PKL", |n| n.ends_with(".pkl")),
        (".pNN part", |n| n.ends_with(".pkl.p00")),
        ("chunk", |n| n.contains(".pkl.chunk01of")),
        ("chunk manifest", |n| n.ends_with(".pkl.chunkmanifest")),
        ("sidecar", |n| n.ends_with(".pkl.sha256")),
    ];
    for (form, is) in forms {
        assert!(
            old_forms.iter().any(|n| is(n)),
            "the old device has no {form}: {old_forms:?}"
        );
    }
    let selected_file = format!("{SELECTED}{}", layout::ARTIFACT_SUFFIX);
    let old_sha = live_old
        .get(&SELECTED.parse().unwrap())
        .and_then(|e| e.artifact_sha256())
        .unwrap()
        .to_hex();
    assert_eq!(
        before.models[&selected_file], old_sha,
        "the old device's selection"
    );

    // 3. The bump: a made-up tinygrad at a real commit; the generation comes from the bump.
    let tinygrad = work.join("tinygrad");
    let new_pin = bump::made_up_tinygrad(&tinygrad).unwrap();
    let new = rel
        .tinygrad_bump(&tinygrad, &new_pin)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(Some(new), old.next(), "the bump names the next generation");
    let s = ok(rel.sync());
    assert_eq!(s["tinygrad_commit"], new_pin.as_str());
    let live_old_path = rel.store.join(format!("manifests/model_names_{old}.json"));
    // Runbook step 4: the generation's source map, written from the previous one.
    let map = ok(rel.source_map_next());
    assert_eq!(map["models"], MODELS.len(), "{map}");
    let r = ok(rel.rebuild(new, &live_old_path));
    assert_eq!(r["compiled"], MODELS.len(), "{r}");
    ok(rel.dm());
    let builtin = ok(rel.builtin(new));
    // Every build record is of the new pin.
    for id in MODELS {
        let path = rel.workspace(new).join(format!("results/{id}.json"));
        let rec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            rec["tinygrad_commit"],
            new_pin.as_str(),
            "{}",
            path.display()
        );
    }
    // The new DM files and built-in are part of the tree the device validation runs with: sync
    // again before validating, and commit the tree.
    ok(rel.sync());
    rel.commit_tree(&format!("{new} DM and built-in"))
        .unwrap_or_else(|e| panic!("{e}"));
    // Without records the gate refuses, naming exactly the cells the records below cover: a
    // preflight, the three rows of these models (v8, v15, external GPU) at both resolutions,
    // modelV2, and driverStateV2 at both resolutions (plus the rehearsal).
    let gaps = rel
        .publish_refused_gaps(new)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut cells = vec!["preflight".to_string(), "stable modelV2".to_string()];
    for res in ["1928x1208", "1344x760"] {
        for row in [
            "v8 artifact",
            "v15 artifact",
            "external-GPU artifact",
            "DM driverStateV2",
        ] {
            cells.push(format!("{row} at {res}"));
        }
    }
    for cell in &cells {
        assert!(
            gaps.iter()
                .any(|g| g.starts_with(cell.as_str()) && g.contains(": missing:")),
            "the gate does not ask for {cell}: {gaps:?}"
        );
    }
    assert!(
        gaps.iter()
            .any(|g| g.starts_with("rehearsal") && g.contains(": missing:")),
        "the gate does not ask for the rehearsal: {gaps:?}"
    );
    assert_eq!(
        gaps.len(),
        cells.len() + 1,
        "{gaps:#?}\n(the cells above and the rehearsal)"
    );
    rel.validation_records(new)
        .unwrap_or_else(|e| panic!("{e}"));
    let r = rel.rehearse(new).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r["passed"], true, "{r}");
    let report = ok(rel.publish(new, None));
    assert_eq!(report["validation"]["status"], "passed", "{report}");

    // What the stores hold now: the new manifest, pinned to the made-up commit, last on the
    // git branch; every model rebuilt (other bytes than the old generation's).
    let live_new = rel.live_manifest(new).unwrap();
    assert_eq!(live_new, rel.built_manifest(new).unwrap());
    assert_eq!(
        live_new.tinygrad_commit().map(|c| c.to_string()),
        Some(new_pin.clone())
    );
    let commits = rel.github_commits().unwrap();
    assert_eq!(
        commits.last().map(String::as_str),
        Some(format!("Publish model_names_{new}.json").as_str()),
        "{commits:?}"
    );
    assert!(
        rel.github_checkout
            .join(format!("model_names_{new}.json"))
            .is_file()
    );
    for id in MODELS {
        let on_branch = rel.github_checkout.join(format!(
            "{new}/{id}/{id}{}.chunkmanifest",
            layout::ARTIFACT_SUFFIX
        ));
        assert!(
            on_branch.is_file(),
            "{} is not on the branch",
            on_branch.display()
        );
        let id = id.parse().unwrap();
        let sha = |m: &manifest::Manifest| m.get(&id).and_then(|e| e.artifact_sha256());
        assert!(
            sha(&live_new).is_some() && sha(&live_new) != sha(&live_old),
            "{id}"
        );
    }
    let new_sha = live_new
        .get(&SELECTED.parse().unwrap())
        .and_then(|e| e.artifact_sha256())
        .unwrap()
        .to_hex();

    // 4. With the new generation live, a device whose tree is still on the old tinygrad stays
    //    on the old generation: its files and params do not change.
    let mirror = Mirror::serve(&bins, &rel.store, &t.path().join("serve-new.log")).unwrap();
    device.origins = (mirror.hf_base.clone(), mirror.github_base.clone());
    let t0 = std::time::Instant::now();
    device
        .run_daemon_once(&bins)
        .unwrap_or_else(|e| panic!("{e}"));
    rel.steps
        .push(("device: run on the old tree".into(), t0.elapsed()));
    let unmoved = DeviceState::read(&device).unwrap();
    assert_eq!(
        unmoved.params, before.params,
        "a device on the old tree changed"
    );
    assert_eq!(
        unmoved.files_not_the_managers(),
        before.files_not_the_managers(),
        "a device on the old tree changed"
    );
    let asked = mirror.requests().unwrap();
    assert!(
        !asked.is_empty(),
        "the device on the old tree asked nothing"
    );
    for r in &asked {
        assert!(
            r.is_generation_path(&old.to_string()),
            "device asked for {}",
            r.target
        );
    }
    let asked = asked.len();

    // 5. The device's openpilot tree moves to the new tinygrad (the updater swaps it in), and
    //    the manager runs as its service entry does.
    device.ship_tree(&rel.openpilot).unwrap();
    let t0 = std::time::Instant::now();
    let log = device
        .run_daemon_once(&bins)
        .unwrap_or_else(|e| panic!("{e}"));
    rel.steps
        .push(("device: run on the new tree".into(), t0.elapsed()));

    // 6. The end state, read from the device's directories.
    let after = DeviceState::read(&device).unwrap();
    // The tree it runs is the new one: the built-in is the new RDF V4 build.
    let sidecar = device.builtin_dir().join("driving_tinygrad.pkl.sha256");
    let sidecar = std::fs::read_to_string(&sidecar).unwrap();
    assert!(
        sidecar.starts_with(builtin["sha256"].as_str().unwrap()),
        "{sidecar} vs {builtin}"
    );
    assert_eq!(
        after.driving_artifacts(),
        vec![selected_file.as_str()],
        "old driving artifacts remain (before: {old_forms:?})\n{log}"
    );
    assert_eq!(
        after.models[&selected_file], new_sha,
        "the selected model is not the published {new} artifact"
    );
    let local = format!("{}{}", bump::LOCAL_MODEL, layout::ARTIFACT_SUFFIX);
    for kept in DM_FILES.iter().copied().chain([local.as_str()]) {
        assert_eq!(
            after.models.get(kept),
            before.models.get(kept),
            "{kept} changed"
        );
        assert!(after.models.contains_key(kept), "{kept} was removed");
    }
    assert_eq!(after.params["ModelManifestVersion"], new.to_string());
    assert_eq!(after.params["Model"], SELECTED);
    assert_eq!(after.params["DrivingModel"], SELECTED);
    assert_eq!(after.params["ActiveSmallModel"], SELECTED);
    // The device asked only for the new generation's paths.
    let requests = mirror.requests().unwrap();
    assert!(
        requests.len() > asked,
        "the device asked the mirror nothing"
    );
    for r in &requests[asked..] {
        assert!(
            r.is_generation_path(&new.to_string()),
            "device asked for {}",
            r.target
        );
    }
    // And modeld would load the new artifact.
    let out = device.manager(&bins).arg("resolve").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resolved = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .to_string();
    assert_eq!(
        Path::new(resolved.trim()),
        device.models_dir().join(&selected_file)
    );

    for (step, took) in &rel.steps {
        eprintln!("bump: {step:<40} {:>6.2} s", took.as_secs_f64());
    }
    eprintln!("bump: whole test {:.1} s", started.elapsed().as_secs_f64());
}

// ---- a bump into the v26 contract, and on to a v27 that keeps it ------------------------------

/// The ABI a v26-contract runtime loads and the bundled model's id, as upstream's catalog module
/// states them (not read from our contract table: the checker below is independent of it).
const V26_ABI: &str = "tinygrad_single_v1_arena";
const V26_BUNDLED: &str = "bundled-current";

/// The reviewed catalog rows the maintainer writes into `catalog-<gen>.json`: the built models
/// with the live manifest's name, version and GPU flag; the v8 QCOM model is Model Lab eligible
/// (so the rebuild builds its `amd` variant, which upstream allows only on such a model).
fn reviewed_rows(live: &manifest::Manifest) -> Vec<(String, String, String, bool, bool)> {
    use integration_tests::bump::MODELS;
    MODELS
        .iter()
        .map(|id| {
            let e = live
                .get(&id.parse().unwrap())
                .expect("a built model is live");
            (
                id.to_string(),
                e.name().unwrap_or(id).to_string(),
                e.version().expect("a version").to_string(),
                e.uses_external_gpu(),
                *id == "tr16223",
            )
        })
        .collect()
}

/// The hand edits of a bump into (or within) the v26 contract (docs/release.md): the tree's
/// catalog module, its one reviewed `catalog-<gen>.json` (the previous generation's removed) and
/// `upstream-sync.json` naming the new tinygrad as `tinygrad_repo`'s commit; committed.
fn declare_v26_tree(
    rel: &integration_tests::bump::Release,
    generation: manifest::Generation,
    pin: &str,
    rows: &[(String, String, String, bool, bool)],
) -> Vec<u8> {
    let dir = rel.openpilot.join("starpilot/models");
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("catalog-") && name.ends_with(".json") {
                std::fs::remove_file(e.path()).unwrap();
            }
        }
    }
    let rows: Vec<test_support::v26_checker::Row<'_>> = rows
        .iter()
        .map(|(i, n, v, g, l)| (i.as_str(), n.as_str(), v.as_str(), *g, *l))
        .collect();
    let catalog =
        test_support::v26_checker::write_tree(&rel.openpilot, &generation.to_string(), pin, &rows);
    rel.commit_tree(&format!("declare {generation} under the v26 contract"))
        .unwrap_or_else(|e| panic!("{e}"));
    catalog
}

/// What upstream's runner checks inside one artifact (`validate_artifact`, from the reference):
/// read with python3's own pickle module (every global refused: nothing is imported), the
/// container an 8-byte length, the opcodes, then (8-byte length, buffer) records; the top-level
/// dict's stamp, pipeline, frame skip, both camera sizes' runners and metadata. The bytes are
/// joined from the store's pieces as a v26 device fetches them (`models/<gen>/<id>/<file>`
/// itself for a count of 0, else `.chunkNNofMM`), and their size and SHA-256 must be the row's.
const RUNNER_CHECK: &str = r#"
import hashlib, io, json, pickle, struct, sys
path, name, count, size, sha, abi, revision, version = sys.argv[1:]
count, size = int(count), int(size)
pieces = [path + "/" + name] if count == 0 else [
    "%s/%s.chunk%02dof%02d" % (path, name, i + 1, count) for i in range(count)]
data = b"".join(open(p, "rb").read() for p in pieces)
assert len(data) == size, "size %d != %d" % (len(data), size)
assert hashlib.sha256(data).hexdigest() == sha, "digest"
(n,) = struct.unpack_from("<q", data, 0)
ops, rest, bufs = data[8:8 + n], data[8 + n:], []
while rest:
    (m,) = struct.unpack_from("<q", rest, 0)
    bufs.append(rest[8:8 + m]); rest = rest[8 + m:]
class Refuse(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("global %s.%s" % (module, name))
d = Refuse(io.BytesIO(ops), buffers=bufs).load()
assert isinstance(d, dict), type(d)
want = {"artifact_abi": abi, "compiler_revision": revision, "format_version": 1,
        "behavior_version": version}
for k, v in want.items():
    assert d.get(k) == v, "catalog model compiler/ABI mismatch: %s=%r" % (k, d.get(k))
assert d["model_type"] in ("supercombo", "vision_policy", "vision_multi_policy")
assert d["image_history_pipeline"] in ("policy", "warp")
assert isinstance(d["frame_skip"], int) and 1 <= d["frame_skip"] <= 20
assert (1928, 1208) in d and (1344, 760) in d, "runners for both camera sizes"
for k in ("input_shapes", "output_shapes", "output_slices"):
    assert k in d["metadata"], k
print(json.dumps({"ok": name}))
"#;

fn runner_accepts(dir: &Path, name: &str, row: &serde_json::Value, pin: &str) {
    let arg = |k: &str| match &row[k] {
        serde_json::Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let out = std::process::Command::new("python3")
        .args(["-c", RUNNER_CHECK])
        .arg(dir)
        .arg(name)
        .args([
            arg("artifact_chunk_count"),
            arg("artifact_size"),
            arg("artifact_sha256"),
        ])
        .args([V26_ABI, pin])
        .arg(arg("version"))
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "upstream's runner would refuse {}/{name}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The whole published generation as a v26 device and runtime read it, independently of our
/// code: the manifest in the local store and on the git branch accepted by the reference's
/// checker for this tree's catalog and pin, every model listed, and every artifact (and `amd`
/// variant) in the store loadable by the runner's checks.
fn assert_upstream_accepts(
    rel: &integration_tests::bump::Release,
    generation: manifest::Generation,
    pin: &str,
    catalog: &[u8],
) {
    use integration_tests::bump::MODELS;
    use test_support::v26_checker::{Runtime, catalog_rows, check_manifest};
    let gen_s = generation.to_string();
    let rt = Runtime {
        generation: &gen_s,
        compiler_revision: pin,
        artifact_abi: V26_ABI,
        bundled: V26_BUNDLED,
        catalog: catalog_rows(catalog),
    };
    let name = format!("model_names_{generation}.json");
    let hub = std::fs::read(rel.store.join("manifests").join(&name)).unwrap();
    let github = std::fs::read(rel.github_checkout.join(&name)).unwrap();
    assert_eq!(hub, github, "the two stores publish one manifest");
    let rows = check_manifest(&hub, &rt)
        .unwrap_or_else(|why| panic!("a {generation} device refuses the manifest: {why}"));
    let mut ids: Vec<&str> = rows.keys().map(String::as_str).collect();
    ids.sort();
    let mut want = MODELS.to_vec();
    want.sort();
    assert_eq!(ids, want, "every built model is published");
    let mut variants = 0;
    for (id, row) in &rows {
        let dir = rel.store.join(format!("models/{generation}/{id}"));
        runner_accepts(&dir, &format!("{id}_driving_tinygrad.pkl"), row, pin);
        if let Some(amd) = row.get("accelerator_artifacts").and_then(|a| a.get("amd")) {
            let mut v = amd.clone();
            v["version"] = row["version"].clone();
            runner_accepts(&dir, &format!("{id}_driving_amd_tinygrad.pkl"), &v, pin);
            variants += 1;
        }
    }
    assert_eq!(
        variants, 1,
        "the lab-eligible model's amd variant is published"
    );
}

/// Every build receipt of `generation`'s release (each model, the built-in, the DM set) names
/// the pin and the bytes beside it, as the compiler's receipt states them.
fn assert_receipts(
    rel: &integration_tests::bump::Release,
    generation: manifest::Generation,
    pin: &str,
) {
    use integration_tests::bump::MODELS;
    let mut receipts: Vec<(std::path::PathBuf, std::path::PathBuf)> = MODELS
        .iter()
        .map(|id| {
            let dir = rel.workspace(generation).join(format!("ready/{id}"));
            (
                dir.join(format!("{id}_driving_tinygrad.build.json")),
                dir.join(format!("{id}_driving_tinygrad.pkl")),
            )
        })
        .collect();
    let models = rel.openpilot.join("selfdrive/modeld/models");
    for f in ["driving_tinygrad.pkl"]
        .iter()
        .chain(layout::DM_FILES.iter())
    {
        let stem = f.strip_suffix(".pkl").unwrap();
        receipts.push((models.join(format!("{stem}.build.json")), models.join(f)));
    }
    for (receipt, artifact) in receipts {
        let r: serde_json::Value = serde_json::from_slice(
            &std::fs::read(&receipt).unwrap_or_else(|e| panic!("{}: {e}", receipt.display())),
        )
        .unwrap();
        assert_eq!(r["compiler_revision"], pin, "{}", receipt.display());
        assert_eq!(r["artifact_abi"], V26_ABI, "{}", receipt.display());
        let mut reader = chunker::open(&artifact).unwrap();
        let (sha, size) = chunker::Sha256Digest::of_reader(&mut reader).unwrap();
        assert_eq!(
            r["artifact_sha256"],
            sha.to_string(),
            "{}",
            receipt.display()
        );
        assert_eq!(r["artifact_size"], size, "{}", receipt.display());
    }
}

/// A release key pair made with `minisign -G`: the public half goes into the tree as
/// `starpilot/assets/model_release_keys.pub` (committed); returns the secret key's path. Without
/// minisign the signed part of the story is skipped, unless STARPILOT_REQUIRE_MINISIGN=1.
fn ship_release_keys(rel: &integration_tests::bump::Release) -> Option<std::path::PathBuf> {
    let dir = rel.work.join("release-keys");
    std::fs::create_dir_all(&dir).unwrap();
    let (public, secret) = (dir.join("release.pub"), dir.join("release.key"));
    let made = std::process::Command::new("minisign")
        .args(["-G", "-W", "-p"])
        .arg(&public)
        .arg("-s")
        .arg(&secret)
        .output();
    match made {
        Ok(o) if o.status.success() => {}
        other => {
            let why = format!("minisign -G is not available ({other:?})");
            if std::env::var_os("STARPILOT_REQUIRE_MINISIGN").is_some_and(|v| v == "1") {
                panic!("{why}, and STARPILOT_REQUIRE_MINISIGN=1");
            }
            test_support::skip::skipped(&format!("the signed rehearse and publish: {why}"));
            return None;
        }
    }
    let keys = rel
        .openpilot
        .join("starpilot/assets/model_release_keys.pub");
    std::fs::copy(&public, &keys).unwrap();
    rel.commit_tree("ship the release keys")
        .unwrap_or_else(|e| panic!("{e}"));
    Some(secret)
}

/// Every file under `dir` (relative path → bytes), `.git` aside.
fn all_files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if e.file_name() == ".git" {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Issue 34's end-to-end bump into upstream's v26 contract: the live v25 release, `tinygrad
/// bump` to a made-up commit, the tree declaring v26 (catalog module, `catalog-v26.json`,
/// `upstream-sync.json`), sync, rebuild/DM/built-in on a compiler that stamps its output (build
/// receipts beside each), the device validation with its p95 latency within the bound, the
/// rehearsal (a v25 device, then a v26 one, migrated by the real manager), the gated publish to
/// a local store and a git `Models` branch; the published manifest is
/// accepted by the reference's checker and each artifact by the runner's checks. Then the same
/// for a made-up v27 that keeps v26's contract.
#[test]
fn a_bump_into_the_v26_contract_and_on_to_v27_ships_what_upstream_accepts() {
    use integration_tests::bump::{self, Compiler, MODELS, Release};
    use test_support::sshd::{DeviceRoot, Sshd};

    let Some(sshd) = Sshd::start() else { return };
    let started = std::time::Instant::now();
    let bins = Binaries::next_to_test_executable().unwrap_or_else(|e| panic!("{e}"));
    let (old, old_pin) = bump::current_generation();
    let comma = DeviceRoot::new(Some(&old_pin));
    let compiler = Compiler {
        ssh_config: sshd.ssh_config().to_path_buf(),
        alias: Sshd::alias().to_string(),
        remote_root: comma.remote_root(),
        models_dir: comma.models_dir(),
    };
    let t = tempfile::tempdir().unwrap();
    let work = t.path().join("maintainer");
    let ok = |r: Result<serde_json::Value, String>| r.unwrap_or_else(|e| panic!("{e}"));
    let mut rel = Release::new(&bins, &compiler, &work, &comma.remote_root().join("models"))
        .unwrap_or_else(|e| panic!("{e}"));
    // One rebuild workspace for every generation, as the maintainer keeps it: each rebuild
    // sets the previous generation's release aside in generations/<gen>/.
    rel.shared_workspace = true;

    // The live release of the current generation (v25), as in the v25 story.
    rel.stage_live_release(old)
        .unwrap_or_else(|e| panic!("{e}"));
    ok(rel.publish(
        old,
        Some("the live release the bump starts from; the bump's own publish is gated"),
    ));
    let rows = reviewed_rows(&rel.live_manifest(old).unwrap());

    // The compiler comma now runs a compiler that stamps what it builds, and the device measures
    // a p95 latency within the contract's bound.
    comma.set("stamp", V26_ABI);
    comma.set("p95_ms", "31.5");

    let tinygrad = work.join("tinygrad");
    let mut pin = bump::made_up_tinygrad(&tinygrad).unwrap();
    let mut base = rel.store.join(format!("manifests/model_names_{old}.json"));
    let mut previous = old;
    for step in 0..2 {
        if step == 1 {
            pin = bump::next_tinygrad_commit(&tinygrad, "the next tinygrad").unwrap();
        }
        let new = rel
            .tinygrad_bump(&tinygrad, &pin)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            Some(new),
            previous.next(),
            "the bump names the next generation"
        );
        let catalog = declare_v26_tree(&rel, new, &pin, &rows);
        // The second bump's tree ships the fleet's release keys (a hand edit committed with
        // the bump): from here on its devices take only a signed manifest.
        if step == 1 {
            rel.sign_key = ship_release_keys(&rel);
        }

        let s = ok(rel.sync());
        assert_eq!(s["tinygrad_commit"], pin.as_str());
        // Runbook step 4: the source map from the previous one and the tree's catalog, ids
        // stable; then the rebuild from it.
        let map = ok(rel.source_map_next());
        assert_eq!(map["models"], MODELS.len(), "{map}");
        assert_eq!(map["dropped"], serde_json::json!([]), "{map}");
        let r = ok(rel.rebuild(new, &base));
        assert_eq!(r["compiled"], MODELS.len(), "{r}");
        let built = std::fs::read(
            rel.workspace(new)
                .join(format!("ready/model_names_{new}.json")),
        )
        .unwrap();
        let top: serde_json::Value = serde_json::from_slice(&built).unwrap();
        assert_eq!(top["compiler_revision"], pin.as_str(), "{top}");
        // The two-bump traps: the previous generation's RDF V4 build is not a built-in of this
        // tree, and DM files this pin did not build (the previous tree's) stop a publish; each
        // refusal changes nothing.
        let tree_models = rel.openpilot.join("selfdrive/modeld/models");
        let store_before = (all_files(&rel.store), all_files(&rel.github_checkout));
        let tree_before = story::digests(&tree_models).unwrap();
        let foreign = rel.builtin_from(&rel.builtin_source(previous));
        assert!(
            foreign.is_err(),
            "{previous}'s built-in went into the {new} tree: {foreign:?}"
        );
        assert_eq!(story::digests(&tree_models).unwrap(), tree_before);
        ok(rel.builtin(new));
        let (code, err) = rel
            .publish_dry_run_unvalidated(new, "the runtime gate alone")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            code == Some(3) && err.contains("DM file"),
            "publish with the previous tree's DM files was not refused ({code:?}):\n{err}"
        );
        assert_eq!(
            (all_files(&rel.store), all_files(&rel.github_checkout)),
            store_before
        );
        // The built-in changed what sync sends: sync before the DM build, as after any edit.
        ok(rel.sync());
        // The previous tree's DM files are there, but their receipts name the previous pin:
        // status asks for the DM build (it used to skip it once the files existed).
        let st = ok(rel.status(new));
        assert!(
            st["next"]["command"]
                .as_str()
                .is_some_and(|c| c.starts_with("release-cli dm ")),
            "status after the rebuild does not ask for dm: {}",
            st["next"]
        );
        ok(rel.dm());
        assert_receipts(&rel, new, &pin);
        ok(rel.sync());
        rel.commit_tree(&format!("{new} DM and built-in"))
            .unwrap_or_else(|e| panic!("{e}"));

        // The device validation reports its p95 latency, and the contract's bound holds: over
        // it, `validate` fails (once is enough to show it).
        if step == 0 {
            comma.set("p95_ms", "75");
            let over = rel.validate(new, bump::SELECTED);
            assert!(
                over.as_ref().is_err_and(|e| e.contains("p95")),
                "a p95 of 75 ms passed validation: {over:?}"
            );
            comma.set("p95_ms", "31.5");
        }
        let reports = rel
            .validation_records(new)
            .unwrap_or_else(|e| panic!("{e}"));
        for v in &reports {
            assert_eq!(v["p95_ms"], 31.5, "{v}");
            assert_eq!(v["passed"], true, "{v}");
        }
        // A tree with release keys rehearses signed: status says so, and a rehearsal without
        // the key is refused before any device is built, naming --sign-key.
        if let Some(key) = rel.sign_key.take() {
            let st = ok(rel.status(new));
            let next = st["next"]["command"].as_str().unwrap_or_default();
            assert!(
                next.starts_with("release-cli rehearse ") && next.ends_with(" --sign-key KEY"),
                "{}",
                st["next"]
            );
            let unsigned = rel.rehearse(new);
            assert!(
                unsigned
                    .as_ref()
                    .is_err_and(|e| e.contains("--sign-key KEY") && e.contains("exit status: 2")),
                "an unsigned rehearsal of a keyed tree was not refused: {unsigned:?}"
            );
            rel.sign_key = Some(key);
        }
        // The rehearsal: devices of the previous generation, migrated by the real device
        // manager, end on this generation's bytes where its layout puts them.
        let r = rel.rehearse(new).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r["passed"], true, "{r}");
        // The gate is bound to the tree that ships: a commit after preflight (a test broken
        // after it ran) or an uncommitted change makes the preflight stale; preflight again.
        if step == 0 {
            let broken = rel
                .openpilot
                .join("starpilot/assets/tests/test_model_pipeline.py");
            std::fs::write(&broken, b"def test_it():\n    assert False\n").unwrap();
            let (code, err) = rel.refused(&rel.publish_dry_run_args(new)).unwrap();
            assert!(
                code == Some(3) && err.contains("has uncommitted changes"),
                "({code:?}) {err}"
            );
            rel.commit_tree("a test broken after preflight")
                .unwrap_or_else(|e| panic!("{e}"));
            let (code, err) = rel.refused(&rel.publish_dry_run_args(new)).unwrap();
            assert!(
                code == Some(3) && err.contains("committed since"),
                "({code:?}) {err}"
            );
            std::fs::write(&broken, b"def test_it():\n    pass\n").unwrap();
            rel.commit_tree("the test fixed")
                .unwrap_or_else(|e| panic!("{e}"));
            ok(rel.preflight(new));
        }
        // The tree must select exactly the generation it ships: a tree on the next tinygrad
        // whose MANIFEST_CANDIDATES still names the previous generation is refused by status,
        // preflight and publish, each naming the line and the edit.
        if step == 1 {
            let selector = rel.openpilot.join("starpilot/assets/model_manager.py");
            let kept = std::fs::read(&selector).unwrap();
            std::fs::write(
                &selector,
                format!("import os\nMANIFEST_CANDIDATES = (\"{previous}\",)\n"),
            )
            .unwrap();
            let want = format!("MANIFEST_CANDIDATES names (\"{previous}\",)");
            let (code, err) = rel.refused(&rel.publish_dry_run_args(new)).unwrap();
            assert!(code == Some(3) && err.contains(&want), "({code:?}) {err}");
            let mut pre: Vec<std::ffi::OsString> =
                vec!["preflight".into(), "--dry-run".into(), "--openpilot".into()];
            pre.push(rel.openpilot.clone().into());
            pre.push("--workspace".into());
            pre.push(rel.workspace(new).into());
            let (code, err) = rel.refused(&pre).unwrap();
            assert!(code == Some(3) && err.contains(&want), "({code:?}) {err}");
            let st = ok(rel.status(new));
            assert!(
                st["next"]["why"]
                    .as_str()
                    .is_some_and(|w| w.contains(&want)),
                "{}",
                st["next"]
            );
            std::fs::write(&selector, kept).unwrap();
        }
        let report = ok(rel.publish(new, None));
        assert_eq!(report["validation"]["status"], "passed", "{report}");
        let commits = rel.github_commits().unwrap();
        assert_eq!(
            commits.last().map(String::as_str),
            Some(format!("Publish model_names_{new}.json").as_str()),
            "{commits:?}"
        );
        assert_upstream_accepts(&rel, new, &pin, &catalog);

        base = rel.store.join(format!("manifests/model_names_{new}.json"));
        previous = new;
    }

    // The v26 release, set aside in the shared workspace by the v27 rebuild, stays repairable:
    // with a chunk of it gone from the store, audit --generation v26 names the problem with a
    // mend that runs as printed (from generations/v26/), and the store is whole again.
    let v26 = old.next().unwrap();
    assert!(
        rel.workspace(v26)
            .join(format!("generations/{v26}/ready/model_names_{v26}.json"))
            .is_file(),
        "the v27 rebuild did not set v26 aside"
    );
    let (code, clean) = rel.audit(v26).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(code, Some(0), "{clean}");
    let dir = rel.store.join(format!(
        "models/{v26}/{}",
        integration_tests::bump::SELECTED
    ));
    let piece = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("_driving_tinygrad.pkl"))
        .expect("a piece of the selected model in the store");
    std::fs::remove_file(&piece).unwrap();
    let (code, damaged) = rel.audit(v26).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(code, Some(3), "{damaged}");
    let mends = rel.run_mends(&damaged).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        mends
            .iter()
            .any(|m| m.contains(&format!("generations/{v26}/ready/model_names_{v26}.json"))),
        "{mends:?}"
    );
    let (code, mended) = rel.audit(v26).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(code, Some(0), "{mended}");
    assert!(piece.is_file());

    for (step, took) in &rel.steps {
        eprintln!("v26 bump: {step:<40} {:>6.2} s", took.as_secs_f64());
    }
    eprintln!(
        "v26 bump: whole test {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
