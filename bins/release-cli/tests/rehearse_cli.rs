//! `release-cli rehearse`, run as the real binary with the real `device-modeld-manager` (built
//! beside it by `cargo test --workspace`): a staged v25 release and a made-up v26 one pass, a
//! staged release without the selected model's files fails, the record says so, and `publish`
//! refuses it with the store unchanged. The devices are read directly by the test as well.

use crate::common::{TG, cli, cli_in, covering_records, entry, snapshot, text};

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use test_support::published::{artifact_bytes, sha256_hex};

/// A made-up next pin.
const NEXT_PIN: &str = "26aa26aa26aa26aa26aa26aa26aa26aa26aa26aa";
const MODELS: [&str; 3] = ["pop223", "sc23", "tr14223"];

/// The device manager built beside release-cli.
fn device_manager() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_release-cli")).with_file_name("device-modeld-manager");
    assert!(
        p.is_file(),
        "{} is not built: run `cargo build -p device-modeld-manager` (cargo test --workspace \
         builds it)",
        p.display()
    );
    p
}

/// An openpilot tree whose tinygrad marker is `pin`, with the pin recorded for `generation`
/// when it is not a built-in one, and a built-in RDF V4 chunk set.
fn openpilot(dir: &Path, generation: &str, pin: &str) -> PathBuf {
    let op = dir.join("openpilot");
    fs::create_dir_all(op.join("tinygrad_repo")).unwrap();
    fs::write(op.join("tinygrad_repo/TINYGRAD_COMMIT"), format!("{pin}\n")).unwrap();
    if generation != "v25" {
        fs::write(
            op.join("tinygrad_pins.json"),
            format!("{{\"v25\": \"{TG}\", \"{generation}\": \"{pin}\"}}\n"),
        )
        .unwrap();
    }
    let models = op.join("selfdrive/modeld/models");
    fs::create_dir_all(&models).unwrap();
    let pkl = models.join("driving_tinygrad.pkl");
    fs::write(&pkl, artifact_bytes(43, 7000)).unwrap();
    let o = cli(&[
        "chunk",
        "split",
        pkl.to_str().unwrap(),
        "--chunk-size",
        "3000",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    fs::remove_file(&pkl).unwrap();
    op
}

/// A staged release (`ready/<id>/` chunk sets and `ready/model_names_<gen>.json`) of three
/// models. Returns (ready, manifest, each model's bytes).
fn staged(dir: &Path, generation: &str, pin: &str) -> (PathBuf, PathBuf, Vec<Vec<u8>>) {
    let ready = dir.join("ready");
    let mut entries = Vec::new();
    let mut bytes = Vec::new();
    for (i, id) in MODELS.iter().enumerate() {
        let data = artifact_bytes(100 + i as u64 + generation.len() as u64, 2500 + 100 * i);
        let pkl = dir.join(format!("build/{id}_driving_tinygrad.pkl"));
        fs::create_dir_all(pkl.parent().unwrap()).unwrap();
        fs::write(&pkl, &data).unwrap();
        let o = cli(&[
            "chunk",
            "split",
            pkl.to_str().unwrap(),
            "--out-dir",
            ready.join(id).to_str().unwrap(),
            "--chunk-size",
            "1000",
        ]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        entries.push(entry(id, &data, data.len().div_ceil(1000) as u32));
        bytes.push(data);
    }
    let raw = dir.join("raw.json");
    let doc = json!({"generation": generation, "tinygrad_commit": pin, "models": entries});
    fs::write(&raw, doc.to_string()).unwrap();
    let o = cli(&["manifest", "fmt", raw.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let manifest = ready.join(format!("model_names_{generation}.json"));
    fs::write(&manifest, &o.stdout).unwrap();
    (ready, manifest, bytes)
}

fn rehearse(
    cwd: &Path,
    generation: &str,
    manifest: &Path,
    ready: &Path,
    op: &Path,
    ws: &Path,
    extra: &[&str],
) -> std::process::Output {
    let mut args = vec![
        "rehearse",
        "--generation",
        generation,
        "--manifest",
        manifest.to_str().unwrap(),
        "--artifacts",
        ready.to_str().unwrap(),
        "--openpilot",
        op.to_str().unwrap(),
        "--workspace",
        ws.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    cli_in(&args, cwd)
}

fn publish(
    cwd: &Path,
    generation: &str,
    manifest: &Path,
    ready: &Path,
    store: &Path,
    op: &Path,
    ws: &Path,
) -> std::process::Output {
    cli_in(
        &[
            "publish",
            "--generation",
            generation,
            "--manifest",
            manifest.to_str().unwrap(),
            "--artifacts",
            ready.to_str().unwrap(),
            "--to",
            store.to_str().unwrap(),
            "--openpilot",
            op.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
        ],
        cwd,
    )
}

fn record(ws: &Path) -> Value {
    serde_json::from_slice(&fs::read(ws.join("results/rehearsal.json")).unwrap()).unwrap()
}

/// Files directly in a device's models directory, name → SHA-256.
fn models_dir(ws: &Path, scenario: &str) -> Vec<(String, String)> {
    let dir = ws.join(format!("rehearsal/{scenario}/data/models"));
    let mut out: Vec<(String, String)> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                sha256_hex(&fs::read(e.path()).unwrap()),
            )
        })
        .collect();
    out.sort();
    out
}

fn param(ws: &Path, scenario: &str, key: &str) -> String {
    fs::read_to_string(ws.join(format!("rehearsal/{scenario}/data/params/d/{key}"))).unwrap()
}

/// A passing rehearsal, checked by reading the devices here too, then publish accepts it.
fn passes(generation: &str, previous: &str, pin: &str, select: Option<&str>) {
    let t = tempfile::tempdir().unwrap();
    let op = openpilot(t.path(), generation, pin);
    let (ready, manifest, bytes) = staged(t.path(), generation, pin);
    let ws = t.path().join("ws");
    fs::create_dir_all(&ws).unwrap();
    // Preflight and validation records as the other commands leave them; the rehearsal's own
    // record is replaced by the real run below.
    covering_records(&ws, &manifest);
    fs::remove_file(ws.join("results/rehearsal.json")).unwrap();
    let dm = device_manager();
    let mut extra = vec!["--json"];
    if let Some(s) = select {
        extra.extend(["--select", s, "--device-manager", dm.to_str().unwrap()]);
    }
    let o = rehearse(t.path(), generation, &manifest, &ready, &op, &ws, &extra);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{}\n{err}", text(&o.stdout));
    let printed: Value = serde_json::from_slice(&o.stdout).unwrap();
    let rec = record(&ws);
    assert_eq!(printed, rec);
    assert_eq!(rec["passed"], true, "{rec:#}");
    assert_eq!(rec["generation"], generation);
    assert_eq!(rec["previous_generation"], previous);
    assert_eq!(rec["tinygrad_commit"], pin);
    let published = fs::read(&manifest).unwrap();
    assert_eq!(rec["manifest_sha256"], sha256_hex(&published));
    // A manager that follows its tree is run as the service runs it (--openpilot-dir, no
    // --generation); an older one is told the generation and the built-in.
    let help = std::process::Command::new(&dm)
        .arg("--help")
        .output()
        .unwrap();
    let first = if text(&help.stdout).contains("--openpilot-dir") {
        "--openpilot-dir"
    } else {
        "--generation"
    };
    assert_eq!(rec["device_args"][0], first, "{rec:#}");
    let checks: Vec<&str> = rec["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    for want in [
        "tree_pin",
        "no_old_driving_artifact",
        "selected_is_new_artifact",
        "absent_model_falls_back_to_builtin",
        "local_and_dm_kept",
    ] {
        assert!(checks.contains(&want), "{want} not in {checks:?}");
    }

    // The kept device, read here: the selected model is the new bytes, no old-generation driving
    // file is left, the local model and the DM files are.
    let sel = select.unwrap_or("pop223");
    let i = MODELS.iter().position(|m| *m == sel).unwrap();
    assert_eq!(rec["selected"], sel);
    let files = models_dir(&ws, "kept");
    let name = format!("{sel}_driving_tinygrad.pkl");
    assert!(
        files.contains(&(name.clone(), sha256_hex(&bytes[i]))),
        "{files:#?}"
    );
    for (f, _) in &files {
        let driving = f.contains("_driving_") || f.starts_with("driving_");
        assert!(
            !driving || f == &name || f.starts_with("local-"),
            "an old driving file is left: {f} in {files:#?}"
        );
    }
    assert!(
        files
            .iter()
            .any(|(f, _)| f == "dmonitoring_model_tinygrad.pkl")
    );
    assert!(
        files
            .iter()
            .any(|(f, _)| f == "local-rehearsal_driving_tinygrad.pkl")
    );
    assert_eq!(param(&ws, "kept", "Model"), sel);
    assert_eq!(param(&ws, "kept", "ModelManifestVersion"), generation);
    // The dropped device is on the built-in.
    assert_eq!(param(&ws, "dropped", "Model"), "rdf43");
    assert!(
        !models_dir(&ws, "dropped")
            .iter()
            .any(|(f, _)| f.starts_with("retired-rehearsal")),
    );

    // Publish accepts the records, rehearsal included.
    let store = t.path().join("store");
    let o = publish(t.path(), generation, &manifest, &ready, &store, &op, &ws);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("covered by the records"),
        "{}",
        text(&o.stdout)
    );
    let live = fs::read(store.join(format!("manifests/model_names_{generation}.json"))).unwrap();
    assert_eq!(live, published);
}

#[test]
fn a_staged_v25_release_rehearses_and_publishes() {
    passes("v25", "v24", TG, None);
}

#[test]
fn a_staged_v26_release_with_a_made_up_pin_rehearses_and_publishes() {
    passes("v26", "v25", NEXT_PIN, Some("sc23"));
}

#[test]
fn a_release_without_the_selected_models_files_fails_and_publish_refuses_it() {
    let t = tempfile::tempdir().unwrap();
    let op = openpilot(t.path(), "v26", NEXT_PIN);
    let (ready, manifest, _) = staged(t.path(), "v26", NEXT_PIN);
    let ws = t.path().join("ws");
    fs::create_dir_all(&ws).unwrap();
    covering_records(&ws, &manifest);
    // pop223's chunk set is not staged.
    let aside = t.path().join("aside");
    fs::rename(ready.join("pop223"), &aside).unwrap();
    let o = rehearse(t.path(), "v26", &manifest, &ready, &op, &ws, &[]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{}\n{err}", text(&o.stdout));
    assert!(err.contains("rehearse again"), "{err}");
    let out = text(&o.stdout);
    assert!(
        out.contains("FAILED kept     selected_is_new_artifact"),
        "{out}"
    );
    let rec = record(&ws);
    assert_eq!(rec["passed"], false);
    let failed: Vec<&str> = rec["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["passed"] == false)
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    assert!(failed.contains(&"selected_is_new_artifact"), "{failed:?}");
    // The device fell back rather than keeping an old file: nothing of v25 is left.
    assert!(!failed.contains(&"no_old_driving_artifact"), "{rec:#}");

    // The files back in place: publish still refuses, because the recorded rehearsal failed;
    // the store is untouched and no publish record is written.
    fs::rename(&aside, ready.join("pop223")).unwrap();
    let store = t.path().join("store");
    fs::create_dir_all(store.join("manifests")).unwrap();
    fs::write(store.join("manifests/README"), "an older file\n").unwrap();
    let before = snapshot(&store);
    let o = publish(t.path(), "v26", &manifest, &ready, &store, &op, &ws);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("rehearsal of this manifest on old-generation devices: failed: kept selected_is_new_artifact"),
        "{err}"
    );
    assert_eq!(snapshot(&store), before);
    assert!(!ready.join("model_names_v26.publish.json").exists());

    // A rehearsal of other manifest bytes is stale: rehearse, then change one name.
    let o = rehearse(t.path(), "v26", &manifest, &ready, &op, &ws, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let mut doc: Value = serde_json::from_slice(&fs::read(&manifest).unwrap()).unwrap();
    doc["models"][1]["name"] = "Renamed".into();
    fs::write(
        &manifest,
        serde_json::to_string_pretty(&doc).unwrap() + "\n",
    )
    .unwrap();
    let o = publish(t.path(), "v26", &manifest, &ready, &store, &op, &ws);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("on old-generation devices: stale:"), "{err}");
    assert_eq!(snapshot(&store), before);
}

#[test]
fn bad_rehearse_input_is_a_usage_error_and_records_nothing() {
    let t = tempfile::tempdir().unwrap();
    let op = openpilot(t.path(), "v26", NEXT_PIN);
    let (ready, manifest, _) = staged(t.path(), "v26", NEXT_PIN);
    let ws = t.path().join("ws");
    fs::create_dir_all(&ws).unwrap();
    let dm = device_manager();
    for (extra, gen_, want) in [
        (
            vec!["--select", "nope"],
            "v26",
            "--select nope: not in the staged manifest",
        ),
        (vec![], "v25", "is a v26 manifest, not v25"),
        (
            vec!["--device-manager", "/nonexistent/device-modeld-manager"],
            "v26",
            "--device-manager /nonexistent/device-modeld-manager: no such file",
        ),
    ] {
        let mut extra = extra;
        if !extra.contains(&"--device-manager") {
            extra.extend(["--device-manager", dm.to_str().unwrap()]);
        }
        let o = rehearse(t.path(), gen_, &manifest, &ready, &op, &ws, &extra);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(want), "{want:?} not in {err}");
        assert!(!ws.join("results").exists(), "{err}");
        assert!(!ws.join("rehearsal").exists(), "{err}");
    }
}

fn status(cwd: &Path, ws: &Path, op: &Path, stores: &[&Path]) -> Value {
    let mut args = vec![
        "status",
        "--workspace",
        ws.to_str().unwrap(),
        "--openpilot",
        op.to_str().unwrap(),
        "--json",
    ];
    for s in stores {
        args.extend(["--store", s.to_str().unwrap()]);
    }
    let o = cli_in(&args, cwd);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn next(s: &Value) -> &str {
    s["next"]["command"].as_str().unwrap()
}

/// A build record as `rebuild` writes it, for one staged model.
fn build_record(ws: &Path, id: &str, data: &[u8], generation: &str, pin: &str) {
    let rec = json!({
        "id": id, "status": "built", "generation": generation, "tinygrad_commit": pin,
        "version": "v15", "source_id": id, "input_format": "supercombo",
        "uses_external_gpu": false, "sources": [format!("onnx/{id}/driving_supercombo.onnx")],
        "artifact": {"name": format!("{id}_driving_tinygrad.pkl"), "size": data.len(),
            "sha256": sha256_hex(data), "chunk_count": data.len().div_ceil(1000), "files": []},
        "log": ws.join(format!("logs/{id}.log")),
    });
    fs::create_dir_all(ws.join("results")).unwrap();
    fs::write(
        ws.join(format!("results/{id}.json")),
        serde_json::to_string_pretty(&rec).unwrap(),
    )
    .unwrap();
}

#[test]
fn status_follows_a_v26_release_from_the_tree_to_the_store() {
    let t = tempfile::tempdir().unwrap();
    let op = openpilot(t.path(), "v26", NEXT_PIN);
    let ws = t.path().join("ws");
    fs::create_dir_all(&ws).unwrap();
    let store = t.path().join("store");
    fs::create_dir_all(&store).unwrap();

    // A bumped tree, never synced: the tree says v26, the compiler's marker is unknown.
    let s = status(t.path(), &ws, &op, &[&store]);
    assert_eq!(s["generation"], "v26", "{s:#}");
    assert_eq!(s["tree"]["tinygrad_commit"], NEXT_PIN);
    assert_eq!(s["tree"]["pin_generation"], "v26");
    assert_eq!(s["tree"]["compiler_marker"], Value::Null);
    assert!(
        next(&s).starts_with("release-cli sync --openpilot"),
        "{s:#}"
    );

    // Synced (the record sync writes, with the digest of what it sent).
    let digest = compiler_remote::tree_digest::sync_digest(&op).unwrap();
    compiler_remote::synced::write_record(
        &op,
        &release::tree::SyncRecord {
            destination: "comma@compiler".into(),
            remote_root: "/data/openpilot".into(),
            tinygrad_commit: NEXT_PIN.parse().unwrap(),
            digest,
            synced_at_unix: 1,
        },
    )
    .unwrap();
    let s = status(t.path(), &ws, &op, &[&store]);
    assert_eq!(s["tree"]["compiler_marker"], NEXT_PIN, "{s:#}");
    assert_eq!(
        s["tree"]["synced"]["digest_sha256"],
        digest.sha256.to_string()
    );
    assert_eq!(s["tree"]["synced"]["tree_matches"], true);
    // The generation's source map is the rebuild's input: written first, then named.
    assert!(
        next(&s).starts_with("release-cli source-map next --openpilot"),
        "{s:#}"
    );
    let map = op.join("scripts/model_source_map_v26.json");
    fs::create_dir_all(map.parent().unwrap()).unwrap();
    fs::write(&map, "{}\n").unwrap();
    let s = status(t.path(), &ws, &op, &[&store]);
    assert!(next(&s).starts_with("release-cli rebuild"), "{s:#}");
    assert!(
        next(&s).contains(&format!("--source-map {}", map.display())),
        "{s:#}"
    );
    fs::remove_file(&map).unwrap();

    // Staged and built, with the DM set in the tree: the gates are next, preflight first.
    let ready_dir = t.path().join("stage");
    fs::create_dir_all(&ready_dir).unwrap();
    let (ready, manifest, bytes) = staged(&ready_dir, "v26", NEXT_PIN);
    fs::rename(&ready, ws.join("ready")).unwrap();
    let ready = ws.join("ready");
    let manifest = ready.join(manifest.file_name().unwrap());
    for (id, data) in MODELS.iter().zip(&bytes) {
        build_record(&ws, id, data, "v26", NEXT_PIN);
    }
    let s = status(t.path(), &ws, &op, &[&store]);
    assert!(next(&s).starts_with("release-cli dm"), "{s:#}");
    let builds = s["builds"].as_array().unwrap();
    assert_eq!(builds.len(), 3);
    assert_eq!(builds[0]["id"], "pop223");
    assert_eq!(builds[0]["state"], "built");
    assert_eq!(builds[0]["version"], "v15");
    assert_eq!(builds[0]["uses_external_gpu"], false);
    assert_eq!(builds[0]["tinygrad_commit"], NEXT_PIN);
    assert_eq!(builds[0]["sha256"], sha256_hex(&bytes[0]));
    for dm in manifest::layout::DM_FILES {
        fs::write(op.join("selfdrive/modeld/models").join(dm), dm).unwrap();
    }
    // The DM files are under selfdrive/modeld/, which sync sends: the tree changed since the
    // sync, so sync is next again until it is recorded anew.
    let s = status(t.path(), &ws, &op, &[&store]);
    assert_eq!(s["tree"]["synced"]["tree_matches"], false, "{s:#}");
    assert!(next(&s).starts_with("release-cli sync"), "{s:#}");
    let digest = compiler_remote::tree_digest::sync_digest(&op).unwrap();
    compiler_remote::synced::write_record(
        &op,
        &release::tree::SyncRecord {
            destination: "comma@compiler".into(),
            remote_root: "/data/openpilot".into(),
            tinygrad_commit: NEXT_PIN.parse().unwrap(),
            digest,
            synced_at_unix: 2,
        },
    )
    .unwrap();
    let s = status(t.path(), &ws, &op, &[&store]);
    assert!(
        next(&s).starts_with(&format!(
            "release-cli preflight --openpilot {}",
            op.display()
        )),
        "{s:#}"
    );
    assert_eq!(s["rehearsal"]["state"], "missing");
    assert!(
        s["dm"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["sha256"].is_string())
    );

    // Preflight and validation recorded, not rehearsed: rehearse is next.
    covering_records(&ws, &manifest);
    fs::remove_file(ws.join("results/rehearsal.json")).unwrap();
    let s = status(t.path(), &ws, &op, &[&store]);
    assert_eq!(s["preflight"]["state"], "covered", "{s:#}");
    assert!(
        next(&s).starts_with("release-cli rehearse --generation v26"),
        "{s:#}"
    );

    // Rehearsed with that exact command line, then publish is next: the store holds nothing.
    let cmd: Vec<String> = next(&s).split(' ').skip(1).map(String::from).collect();
    let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let o = cli_in(&args, t.path());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let s = status(t.path(), &ws, &op, &[&store]);
    assert_eq!(s["rehearsal"]["state"], "covered", "{s:#}");
    assert!(
        next(&s).starts_with("release-cli publish --generation v26"),
        "{s:#}"
    );
    assert_eq!(s["stores"][0]["holds_staged"], false);

    // Published: the store holds the staged manifest, nothing is next.
    let o = publish(t.path(), "v26", &manifest, &ready, &store, &op, &ws);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let s = status(t.path(), &ws, &op, &[&store]);
    let live = &s["stores"][0];
    assert_eq!(live["holds_staged"], true, "{s:#}");
    assert_eq!(live["generation"], "v26");
    assert_eq!(live["tinygrad_commit"], NEXT_PIN);
    assert_eq!(live["signature_release"], Value::Null);
    assert_eq!(next(&s), "", "{s:#}");
    assert!(s["next"]["why"].as_str().unwrap().starts_with("done"));

    // The text form names the same next step, and status writes nothing anywhere.
    let before = [snapshot(&ws), snapshot(&op), snapshot(&store)];
    let o = cli_in(
        &[
            "status",
            "--workspace",
            ws.to_str().unwrap(),
            "--openpilot",
            op.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ],
        t.path(),
    );
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        out.contains(&format!("tinygrad {NEXT_PIN} (v26's pin)")),
        "{out}"
    );
    assert!(out.contains("next       nothing: done"), "{out}");
    assert_eq!([snapshot(&ws), snapshot(&op), snapshot(&store)], before);
}

#[test]
fn a_tree_on_another_tinygrad_fails_the_rehearsal_naming_both_pins() {
    let t = tempfile::tempdir().unwrap();
    // The tree's marker moved on after the release was staged: the pin table still says v26 is
    // NEXT_PIN, but the tree runs another tinygrad.
    let op = openpilot(t.path(), "v26", NEXT_PIN);
    let moved = "27bb27bb27bb27bb27bb27bb27bb27bb27bb27bb";
    fs::write(
        op.join("tinygrad_repo/TINYGRAD_COMMIT"),
        format!("{moved}\n"),
    )
    .unwrap();
    let (ready, manifest, _) = staged(t.path(), "v26", NEXT_PIN);
    let ws = t.path().join("ws");
    fs::create_dir_all(&ws).unwrap();
    let o = rehearse(t.path(), "v26", &manifest, &ready, &op, &ws, &[]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    let rec = record(&ws);
    assert_eq!(rec["passed"], false);
    let tree = rec["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "tree_pin")
        .unwrap();
    assert_eq!(tree["passed"], false, "{rec:#}");
    let detail = tree["detail"].as_str().unwrap();
    assert!(
        detail.contains(NEXT_PIN) && detail.contains(moved) && detail.contains("refuses"),
        "{detail}"
    );
}

/// `status --generation G` of a generation the rebuild of the next one set aside reads its
/// release from `WS/generations/G/` (its staged manifest and build records), and names that
/// as the workspace; the generation at the top level is still read from there. For v25 set
/// aside by a made-up v26, and a made-up v26 set aside by a made-up v27.
#[test]
fn status_of_a_set_aside_generation_reads_its_release_from_generations() {
    for (generation, pin, next) in [("v25", TG, "v26"), ("v26", NEXT_PIN, "v27")] {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path().join("ws");
        let aside = ws.join("generations").join(generation);
        let (_, manifest, bytes) = staged(&aside, generation, pin);
        for (id, data) in MODELS.iter().zip(&bytes) {
            build_record(&aside, id, data, generation, pin);
        }
        fs::create_dir_all(ws.join("ready")).unwrap();
        let top = ws.join(format!("ready/model_names_{next}.json"));
        fs::write(&top, json!({"generation": next, "models": []}).to_string()).unwrap();
        let status_of = |g: &str| -> Value {
            let args = [
                "status",
                "--workspace",
                ws.to_str().unwrap(),
                "--generation",
                g,
            ];
            let o = cli_in(&[&args[..], &["--json"]].concat(), t.path());
            assert_eq!(o.status.code(), Some(0), "{g}: {}", text(&o.stderr));
            serde_json::from_slice(&o.stdout).unwrap()
        };
        let s = status_of(generation);
        assert_eq!(s["workspace"], aside.to_str().unwrap(), "{s:#}");
        assert_eq!(s["manifest"], manifest.to_str().unwrap(), "{s:#}");
        let builds = s["builds"].as_array().unwrap();
        assert_eq!(builds.len(), 3, "{s:#}");
        assert!(builds.iter().all(|b| b["state"] == "built"), "{s:#}");
        let s = status_of(next);
        assert_eq!(s["workspace"], ws.to_str().unwrap(), "{s:#}");
        assert_eq!(s["manifest"], top.to_str().unwrap(), "{s:#}");
    }
}
