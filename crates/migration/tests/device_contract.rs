//! The device contract: devices as the Python manager leaves them are refreshed in-process
//! against the fault-injecting server, then an independent reader (`upstream`, written from the
//! description of modeld and the UIs, not from this crate) says what modeld would load and what
//! the UIs would list. It must be the verified v25 artifact, a local model, or (after a
//! fallback) the built-in — never a missing file (modeld's synchronous Python download) and
//! never a v24 pickle.

use crate::upstream;
use std::fs;

use crate::common::{CATALOG_IDS, Fixture, LOCAL_BARE, LOCAL_MINE, Origin, refresh, sha_of};
use crate::upstream::Load;

/// What a fixture must end as.
struct Case {
    name: &'static str,
    params: &'static [(&'static str, &'static str)],
    /// Artifacts the origin refuses (404 in both layouts).
    refused: &'static [&'static str],
    egpu: bool,
    /// Expected small profile id, and the big profile (`None` unset, `Some("none")` disabled).
    small: &'static str,
    big: Option<&'static str>,
    selected: &'static str,
    fell_back: bool,
}

const SEL_POP: [(&str, &str); 2] = [("Model", "pop223"), ("DrivingModel", "pop223")];

/// What a row leaves out: nothing refused, no eGPU, no big profile, no fallback.
const PLAIN: Case = Case {
    name: "",
    params: &[],
    refused: &[],
    egpu: false,
    small: "",
    big: None,
    selected: "",
    fell_back: false,
};

const CASES: &[Case] = &[
    Case {
        name: "profiles set, big disabled",
        params: &[
            SEL_POP[0],
            SEL_POP[1],
            ("ActiveSmallModel", "pop223"),
            ("ActiveSmallModelName", "Pop"),
            ("ActiveSmallModelVersion", "v7"),
            ("ActiveBigModel", "none"),
        ],
        small: "pop223",
        big: Some("none"),
        selected: "pop223",
        ..PLAIN
    },
    Case {
        name: "legacy selection",
        params: &[("Model", "tr14223"), ("DrivingModel", "tr14223")],
        small: "tr14223",
        selected: "tr14223",
        ..PLAIN
    },
    Case {
        name: "legacy selection, only Model set off the default",
        params: &[("Model", "tr14223"), ("DrivingModel", "rdf43")],
        small: "tr14223",
        selected: "tr14223",
        ..PLAIN
    },
    Case {
        name: "pre-v23 alias",
        params: &[("Model", "pop22"), ("DrivingModel", "pop22")],
        small: "pop223",
        selected: "pop223",
        ..PLAIN
    },
    Case {
        name: "local model with sidecar",
        params: &[
            ("Model", "local-mine"),
            ("DrivingModel", "local-mine"),
            ("ActiveSmallModel", "local-mine"),
        ],
        small: "local-mine",
        selected: "local-mine",
        ..PLAIN
    },
    Case {
        name: "local model without sidecar",
        params: &[
            ("Model", "local-bare_model"),
            ("DrivingModel", "local-bare_model"),
        ],
        small: "local-bare_model",
        selected: "local-bare_model",
        ..PLAIN
    },
    Case {
        name: "eGPU profile",
        params: &[
            ("Model", "big223"),
            ("DrivingModel", "big223"),
            ("ActiveSmallModel", "pop223"),
            ("ActiveBigModel", "big223"),
        ],
        egpu: true,
        small: "pop223",
        big: Some("big223"),
        selected: "big223",
        ..PLAIN
    },
    Case {
        name: "legacy eGPU selection",
        params: &[("Model", "big223"), ("DrivingModel", "big223")],
        egpu: true,
        small: "rdf43",
        big: Some("big223"),
        selected: "big223",
        ..PLAIN
    },
    Case {
        name: "selection dropped from v25",
        params: &[
            ("Model", "gone223"),
            ("DrivingModel", "gone223"),
            ("ActiveSmallModel", "gone223"),
        ],
        small: "rdf43",
        selected: "rdf43",
        fell_back: true,
        ..PLAIN
    },
    Case {
        name: "big profile dropped from v25",
        params: &[
            SEL_POP[0],
            SEL_POP[1],
            ("ActiveSmallModel", "pop223"),
            ("ActiveBigModel", "gone223"),
        ],
        egpu: true,
        small: "pop223",
        selected: "pop223",
        fell_back: true,
        ..PLAIN
    },
    Case {
        name: "selected artifact cannot be downloaded",
        params: &[SEL_POP[0], SEL_POP[1], ("ActiveSmallModel", "pop223")],
        refused: &["pop223"],
        small: "rdf43",
        selected: "rdf43",
        fell_back: true,
        ..PLAIN
    },
];

/// The checks every refreshed device passes, whatever it started as.
fn check(case: &Case, origin: &Origin, f: &Fixture) {
    let ctx = case.name;
    let data = f.data();
    let modeld = upstream::modeld(&data, case.egpu);
    let ui = upstream::ui(&data);

    // modeld's small model: the built-in, or a file with the verified v25 (or local) bytes.
    let expect_load = |id: &str| -> Load {
        if id == "rdf43" {
            Load::BuiltIn
        } else {
            Load::File {
                id: id.to_string(),
                path: f.models().join(format!("{id}_driving_tinygrad.pkl")),
            }
        }
    };
    assert_eq!(modeld.small, expect_load(case.small), "{ctx}: small");
    match case.big {
        Some(b) if b != "none" => assert_eq!(modeld.big, Some(expect_load(b)), "{ctx}: big"),
        _ => assert_eq!(modeld.big, None, "{ctx}: big"),
    }
    for load in [Some(&modeld.small), modeld.big.as_ref()]
        .into_iter()
        .flatten()
    {
        if let Load::File { id, path } = load {
            let bytes = upstream::read_chunked(path).unwrap();
            let sha = test_support::published::sha256_hex(&bytes);
            match id.as_str() {
                "local-mine" => assert_eq!(bytes, LOCAL_MINE, "{ctx}"),
                "local-bare_model" => assert_eq!(bytes, LOCAL_BARE, "{ctx}"),
                _ => assert_eq!(sha, origin.sha(id), "{ctx}: {id} is not the v25 artifact"),
            }
        }
    }

    // The UIs: the v25 catalog then the local models, names cleaned, lists lined up.
    let mut ids: Vec<&str> = CATALOG_IDS.to_vec();
    ids.extend(["local-bare_model", "local-mine"]);
    assert_eq!(ui.ids(), ids, "{ctx}");
    assert_eq!(ui.manifest_version.as_deref(), Some("v25"), "{ctx}");
    assert_eq!(ui.row("pop223").unwrap().name, "Pop", "{ctx}");
    assert_eq!(ui.row("rdf43").unwrap().name, "Regret Driven Framework V4");
    assert_eq!(ui.row("local-mine").unwrap().name, "Mine  tuned", "{ctx}");
    assert_eq!(ui.row("local-mine").unwrap().version, "v16", "{ctx}");
    assert_eq!(
        ui.row("local-mine").unwrap().series,
        "Local Series",
        "{ctx}"
    );
    assert_eq!(ui.row("local-bare_model").unwrap().name, "bare model");
    assert_eq!(ui.row("local-bare_model").unwrap().released, "2100-01-01");
    assert_eq!(ui.favorites, ["pop223"], "{ctx}");

    // Profiles and selection name what modeld loads, with the catalog's name and version.
    let small = ui.small.clone().expect("small profile written");
    assert_eq!(small.0, case.small, "{ctx}");
    let row = ui.row(case.small).unwrap();
    assert_eq!(
        (small.1.as_str(), small.2.as_str()),
        (row.name.as_str(), row.version.as_str()),
        "{ctx}"
    );
    match case.big {
        None => assert_eq!(ui.big, None, "{ctx}"),
        Some("none") => assert_eq!(ui.big, Some(("none".into(), String::new(), String::new()))),
        Some(b) => assert_eq!(ui.big.as_ref().map(|t| t.0.as_str()), Some(b), "{ctx}"),
    }
    assert_eq!(ui.selected.0, case.selected, "{ctx}");
    let sel_row = ui.row(case.selected).unwrap();
    assert_eq!(ui.selected.1, sel_row.name, "{ctx}");
    assert_eq!(
        ui.selected.2,
        if sel_row.version.is_empty() {
            "v15"
        } else {
            &sel_row.version
        },
        "{ctx}"
    );
    for key in ["Model", "DrivingModel"] {
        assert_eq!(f.param(key).as_deref(), Some(case.selected), "{ctx}: {key}");
    }

    // The caches: every listed model, nothing else, v25 digests, upstream's defaults.
    let listed: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    let keys = |m: &serde_json::Map<String, serde_json::Value>| -> Vec<String> {
        m.keys().cloned().collect()
    };
    let mut artifact_ids = keys(&ui.artifacts_cache);
    artifact_ids.sort();
    let mut want = listed.clone();
    want.sort();
    assert_eq!(artifact_ids, want, "{ctx}: .model_artifacts.json");
    for (id, version) in &ui.versions_cache {
        assert!(listed.contains(id), "{ctx}: stale version entry {id}");
        assert_eq!(&ui.row(id).unwrap().version, version, "{ctx}");
    }
    assert_eq!(
        keys(&ui.urls_cache),
        ["big223"],
        "{ctx}: .model_artifact_urls.json"
    );
    for id in ["pop223", "tr14223", "big223"] {
        assert_eq!(
            ui.artifacts_cache[id]["artifact_sha256"],
            origin.sha(id),
            "{ctx}: {id}"
        );
    }
    assert_eq!(ui.artifacts_cache["big223"]["uses_external_gpu"], true);
    assert_eq!(ui.artifacts_cache["big223"]["model_size"], "chestnut");
    assert_eq!(ui.artifacts_cache["pop223"]["model_lab_eligible"], true);

    // No v24 driving artifact left: only installed v25 models and local ones.
    for e in fs::read_dir(f.models()).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        let driving = name.contains("_driving_") || name.starts_with("driving_");
        if !driving || name.starts_with("local-") {
            continue;
        }
        let id = name.split("_driving_").next().unwrap();
        assert_eq!(
            name,
            format!("{id}_driving_tinygrad.pkl"),
            "{ctx}: stray {name}"
        );
        assert_eq!(
            sha_of(&f.models().join(&name)).as_deref(),
            Some(origin.sha(id)),
            "{ctx}: {name} is not v25"
        );
    }
    for kept in [
        "dmonitoring_model_tinygrad.pkl",
        "notes.txt",
        "local-mine.json",
    ] {
        assert!(f.models().join(kept).is_file(), "{ctx}: {kept} was removed");
    }
    // modeld never loads the old selection's name from a stale profile.
    assert_ne!(
        f.param("ActiveSmallModelVersion").as_deref(),
        Some("v7"),
        "{ctx}"
    );
}

#[test]
fn python_manager_devices_end_on_the_verified_v25_model_or_the_builtin() {
    for case in CASES {
        let origin = Origin::start();
        for id in case.refused {
            origin.refuse(id);
        }
        let f = Fixture::v24(case.params);
        if case.egpu {
            f.plug_chestnut();
        }
        let device = f.device();
        let report =
            refresh(&device, &origin.downloader()).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(
            report.migrated_from.as_deref(),
            Some("v24"),
            "{}",
            case.name
        );
        assert_eq!(report.fell_back_to_builtin, case.fell_back, "{}", case.name);
        assert_eq!(report.selected.as_str(), case.selected, "{}", case.name);
        check(case, &origin, &f);

        // A second refresh (same generation) changes nothing.
        let before = f.snapshot();
        refresh(&device, &origin.downloader()).unwrap();
        assert_eq!(f.snapshot(), before, "{}: second refresh", case.name);

        // What `resolve` answers agrees with what upstream modeld loads.
        let r = migration::report::resolve(&device).unwrap();
        if case.selected == case.small {
            match &upstream::modeld(&f.data(), case.egpu).small {
                Load::BuiltIn => assert!(r.builtin, "{}", case.name),
                Load::File { path, .. } => assert_eq!(&r.path, path, "{}", case.name),
                other => panic!("{}: {other:?}", case.name),
            }
        }
        let row = upstream::ui(&f.data());
        let row = row.row(&r.model.id).unwrap();
        // Name and version from the catalog (a local model without a version has none: modeld
        // then takes the artifact's own).
        assert_eq!(
            (r.model.name.as_str(), r.model.version.as_str()),
            (row.name.as_str(), row.version.as_str()),
            "{}",
            case.name
        );
    }
}

#[test]
fn a_same_generation_refresh_repairs_a_missing_or_old_selected_artifact() {
    let origin = Origin::start();
    let f = Fixture::v24(&[SEL_POP[0], SEL_POP[1]]);
    let device = f.device();
    let dl = origin.downloader();
    refresh(&device, &dl).unwrap();
    let path = f.models().join("pop223_driving_tinygrad.pkl");

    // Deleted behind the manager's back: modeld would start a synchronous Python download.
    fs::remove_file(&path).unwrap();
    assert_eq!(
        upstream::modeld(&f.data(), false).small,
        Load::SyncDownload {
            id: "pop223".into()
        }
    );
    let progress = std::sync::Mutex::new(Vec::new());
    migration::refresh(
        &device,
        &migration::Run {
            progress: &|p| progress.lock().unwrap().push(p.to_string()),
            ..migration::Run::new(&dl)
        },
    )
    .unwrap();
    assert_eq!(sha_of(&path).as_deref(), Some(origin.sha("pop223")));
    assert!(
        progress
            .lock()
            .unwrap()
            .contains(&"Downloading selected model \"pop223\"...".to_string())
    );

    // Replaced by an old-generation pickle of the same name: re-fetched, not trusted.
    fs::write(&path, b"a v24 pickle").unwrap();
    refresh(&device, &dl).unwrap();
    assert_eq!(sha_of(&path).as_deref(), Some(origin.sha("pop223")));

    // Gone from the origin as well: the built-in everywhere modeld and the UIs look.
    fs::remove_file(&path).unwrap();
    origin.refuse("pop223");
    let r = refresh(&device, &dl).unwrap();
    assert!(r.fell_back_to_builtin);
    assert_eq!(upstream::modeld(&f.data(), false).small, Load::BuiltIn);
    assert_eq!(upstream::ui(&f.data()).selected.0, "rdf43");
}

#[test]
fn a_deleted_local_model_falls_back_and_leaves_the_list() {
    let origin = Origin::start();
    let f = Fixture::v24(&[("Model", "local-mine"), ("DrivingModel", "local-mine")]);
    let device = f.device();
    let dl = origin.downloader();
    refresh(&device, &dl).unwrap();
    assert!(matches!(
        upstream::modeld(&f.data(), false).small,
        Load::File { .. }
    ));
    fs::remove_file(f.models().join("local-mine_driving_tinygrad.pkl")).unwrap();
    let r = refresh(&device, &dl).unwrap();
    assert!(r.fell_back_to_builtin);
    assert_eq!(upstream::modeld(&f.data(), false).small, Load::BuiltIn);
    let ui = upstream::ui(&f.data());
    assert!(!ui.ids().contains(&"local-mine"));
    assert!(!ui.artifacts_cache.contains_key("local-mine"));
}
