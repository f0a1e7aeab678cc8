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
