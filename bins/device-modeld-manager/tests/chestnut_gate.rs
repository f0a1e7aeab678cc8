//! External-GPU models and the Chestnut, through the real binary (issue 25 item 1): a refresh
//! and a migration fetch a GPU-only model (the big profile's, or a legacy GPU selection's) and
//! any Chestnut build only with a ready Chestnut; the big profile param is kept meanwhile and
//! `status` says why its model is not installed. Run for v25 and for a made-up v26.

use std::fs;

use crate::common::*;
use test_support::http_server::FaultServer;
use test_support::published::{
    artifact_bytes, artifact_dirs, manifest_json, publish_model, sha256_hex, write_manifest,
};

const CHUNK: usize = 128 * 1024;

struct Gen {
    name: &'static str,
    /// `Some`: the openpilot tree is moved to this made-up generation's pin.
    v26: bool,
}

fn plug(d: &Device) {
    let usb = d.dir.path().join("sys/bus/usb/devices/2-1");
    fs::create_dir_all(&usb).unwrap();
    fs::write(usb.join("idVendor"), "add1\n").unwrap();
    fs::write(usb.join("idProduct"), "0001\n").unwrap();
    fs::write(usb.join("product"), "custom ed4e39b7-CLEAN\n").unwrap();
}

fn unplug(d: &Device) {
    fs::remove_dir_all(d.dir.path().join("sys/bus/usb/devices/2-1")).unwrap();
}

fn touched_gpu(server: &FaultServer) -> Vec<String> {
    server
        .requests()
        .into_iter()
        .map(|r| r.path)
        .filter(|p| p.contains("big223"))
        .collect()
}

#[test]
fn gpu_models_are_fetched_by_a_refresh_only_with_a_ready_chestnut() {
    for g in [
        Gen {
            name: "v25",
            v26: false,
        },
        Gen {
            name: "v26",
            v26: true,
        },
    ] {
        let generation = g.name;
        let d = Device::new();
        if g.v26 {
            set_tree(&d.openpilot(), V26_PIN, Some(&v26_pins()));
        }
        let root = d.dir.path().join("origin");
        let pop = artifact_bytes(81, 2 * CHUNK + 3);
        let big = artifact_bytes(82, CHUNK + 11);
        let amd = artifact_bytes(83, CHUNK / 2);
        let p = publish_model(&root, generation, "pop223", &pop, Some(CHUNK));
        let b = publish_model(&root, generation, "big223", &big, Some(CHUNK));
        for dir in artifact_dirs(&root, generation, "big223") {
            fs::write(dir.join("big223_amd.pkl"), &amd).unwrap();
        }
        let mut m: serde_json::Value =
            serde_json::from_str(&manifest_json(generation, &[p, b], true)).unwrap();
        m["models"][1]["uses_external_gpu"] = true.into();
        m["models"][1]["accelerator_artifacts"] = serde_json::json!({"chestnut": {
            "artifact_format": "tinygrad_single_v1", "artifact_filename": "big223_amd.pkl",
            "artifact_size": amd.len(), "artifact_sha256": sha256_hex(&amd),
            "artifact_chunk_count": 0, "execution_device": "AMD"}});
        write_manifest(&root, generation, m.to_string().as_bytes());
        let server = FaultServer::start(&root).unwrap();
        let base = server.url();
        let run = |args: &[&str]| d.command(&base, args).output().unwrap();

        // A device of the previous generation without a Chestnut: small profile pop223, big
        // profile big223, old pickles of both.
        d.make_v24(
            &[
                "pop223_driving_tinygrad.pkl",
                "big223_driving_tinygrad.pkl",
                "big223_driving_chestnut_tinygrad.pkl",
            ],
            "1",
        );
        d.set_param("ActiveSmallModel", "pop223");
        d.set_param("ActiveBigModel", "big223");

        // The dry run says so first, fetching nothing for it.
        let out = run(&["refresh", "--dry-run", "--json"]);
        assert!(out.status.success(), "{generation}: {}", stderr(&out));
        let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            plan["needs_chestnut"],
            serde_json::json!(["big223"]),
            "{generation}: {plan}"
        );
        assert!(
            plan["would_download"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m["id"] != "big223"),
            "{generation}: {plan}"
        );
        assert_eq!(touched_gpu(&server), Vec::<String>::new(), "{generation}");

        // The migration: pop223 installed, big223 neither requested nor installed, its old
        // pickles purged, the big profile kept.
        let out = run(&["refresh", "--json"]);
        assert!(out.status.success(), "{generation}: {}", stderr(&out));
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            r["needs_chestnut"],
            serde_json::json!(["big223"]),
            "{generation}: {r}"
        );
        assert_eq!(r["fell_back_to_builtin"], false, "{generation}: {r}");
        assert_eq!(d.installed("pop223").unwrap(), pop, "{generation}");
        assert_eq!(touched_gpu(&server), Vec::<String>::new(), "{generation}");
        assert!(
            d.model_files().iter().all(|n| !n.starts_with("big223")),
            "{generation}: {:?}",
            d.model_files()
        );
        assert_eq!(
            d.param("ActiveBigModel").as_deref(),
            Some("big223"),
            "{generation}"
        );
        assert_eq!(
            d.param("ActiveSmallModel").as_deref(),
            Some("pop223"),
            "{generation}"
        );
        assert_eq!(
            d.param("ModelManifestVersion").as_deref(),
            Some(generation),
            "{generation}"
        );

        // `status` says why the big profile's model is not installed.
        let out = run(&["status", "--json"]);
        assert!(out.status.success(), "{generation}: {}", stderr(&out));
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let w = &s["waiting_for_chestnut"];
        assert_eq!(w[0]["id"], "big223", "{generation}: {s}");
        assert_eq!(w[0]["slot"], "big_profile", "{generation}: {s}");
        assert!(
            w[0]["reason"].as_str().unwrap().contains("Chestnut"),
            "{generation}: {s}"
        );
        // No failure counted: nothing waits on a backoff for it.
        assert!(
            s["fallback"]["pending"]
                .as_array()
                .is_none_or(|p| p.iter().all(|x| x["id"] != "big223")),
            "{generation}: {s}"
        );
        let text = run(&["status"]);
        assert!(
            stderr(&text).contains("big223 (big profile)")
                || String::from_utf8_lossy(&text.stdout).contains("big223 (big profile)"),
            "{generation}: {}",
            String::from_utf8_lossy(&text.stdout)
        );

        // A later refresh still fetches nothing for it.
        let out = run(&["refresh"]);
        assert!(out.status.success(), "{generation}: {}", stderr(&out));
        assert_eq!(touched_gpu(&server), Vec::<String>::new(), "{generation}");

        // A ready Chestnut: the next refresh fetches the model and its Chestnut build.
        plug(&d);
        let out = run(&["refresh", "--json"]);
        assert!(out.status.success(), "{generation}: {}", stderr(&out));
        assert_eq!(d.installed("big223").unwrap(), big, "{generation}");
        assert_eq!(
            fs::read(d.models().join("big223_driving_chestnut_tinygrad.pkl")).unwrap(),
            amd,
            "{generation}"
        );
        let s: serde_json::Value =
            serde_json::from_slice(&run(&["status", "--json"]).stdout).unwrap();
        assert_eq!(
            s["waiting_for_chestnut"],
            serde_json::json!([]),
            "{generation}: {s}"
        );

        // Unplugged and deleted: a refresh does not fetch it again, the profile stays.
        unplug(&d);
        for name in [
            "big223_driving_tinygrad.pkl",
            "big223_driving_chestnut_tinygrad.pkl",
        ] {
            fs::remove_file(d.models().join(name)).unwrap();
        }
        server.clear_requests();
        let out = run(&["refresh"]);
        assert!(out.status.success(), "{generation}: {}", stderr(&out));
        assert_eq!(touched_gpu(&server), Vec::<String>::new(), "{generation}");
        assert!(d.installed("big223").is_none(), "{generation}");
        assert_eq!(
            d.param("ActiveBigModel").as_deref(),
            Some("big223"),
            "{generation}"
        );
    }
}

/// A legacy GPU selection on a device without a Chestnut: nothing fetched for it; the selection
/// stands in as the built-in (modeld would replace it anyway), the big profile keeps it, and
/// the first refresh with a ready Chestnut installs it and selects it again.
#[test]
fn a_legacy_gpu_selection_waits_for_a_chestnut_without_a_backoff() {
    let d = Device::new();
    let root = d.dir.path().join("origin");
    let big = artifact_bytes(91, CHUNK + 1);
    let p = publish_model(&root, "v25", "pop223", &artifact_bytes(92, 99), None);
    let b = publish_model(&root, "v25", "big223", &big, None);
    let mut m: serde_json::Value =
        serde_json::from_str(&manifest_json("v25", &[p, b], true)).unwrap();
    m["models"][1]["uses_external_gpu"] = true.into();
    write_manifest(&root, "v25", m.to_string().as_bytes());
    let server = FaultServer::start(&root).unwrap();
    let base = server.url();
    let run = |args: &[&str]| d.command(&base, args).output().unwrap();
    d.make_v24(&["big223_driving_tinygrad.pkl"], "1");
    for k in ["Model", "DrivingModel"] {
        d.set_param(k, "big223");
    }
    let out = run(&["refresh", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(touched_gpu(&server), Vec::<String>::new());
    assert_eq!(d.param("Model").as_deref(), Some("rdf43"));
    assert_eq!(d.param("ActiveBigModel").as_deref(), Some("big223"));
    let s: serde_json::Value = serde_json::from_slice(&run(&["status", "--json"]).stdout).unwrap();
    assert_eq!(s["waiting_for_chestnut"][0]["slot"], "selection", "{s}");
    assert_eq!(s["fallback"]["pending"], serde_json::json!([]), "{s}");

    plug(&d);
    let out = run(&["refresh"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(d.installed("big223").unwrap(), big);
    assert_eq!(d.param("Model").as_deref(), Some("big223"));
}
