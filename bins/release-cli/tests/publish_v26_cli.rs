//! `release-cli publish` of a v26-contract generation (v26, and a made-up v27 with v26's
//! contract) to a local store, with the openpilot tree that declares it: what is published is
//! accepted by an independent checker of the v26 schema, and each refusal of the contract
//! (a `chestnut` key, an id not in the tree's catalog, another version or GPU flag, the v25
//! format, a missing top-level key) uploads nothing and leaves store, tree and workspace as
//! they were.

use crate::common::{cli, cli_in, covering_records, publish_argv, snapshot, strs, text};

use std::fs;
use std::path::{Path, PathBuf};

use crate::loadable_cli::{Item, receipt, runtime_tree, stamped};
use serde_json::{Value, json};
use test_support::published::{artifact_bytes, sha256_hex};
use test_support::v26_checker;

const ARENA: &str = "tinygrad_single_v1_arena";

const GENERATIONS: [(&str, &str); 2] = [
    ("v26", "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf"),
    ("v27", "2222222222222222222222222222222222222222"),
];

const ROWS: [v26_checker::Row<'static>; 2] = [
    ("pop223", "Pop", "v15", false, true),
    ("gwm8223", "GWM", "v12", true, false),
];

struct Setup {
    dir: tempfile::TempDir,
    tree: PathBuf,
    artifacts: PathBuf,
    catalog: Vec<u8>,
    data: Vec<u8>,
}

/// pop223's artifact as the v26 contract's runtime reads it: a pickle whose top-level dict
/// carries the stamp of `revision` and pop223's behaviour version (v15).
fn stamped_model(revision: &str) -> Vec<u8> {
    let rev: &'static str = Box::leak(revision.to_string().into_boxed_str());
    stamped(
        &[
            ("artifact_abi", Item::S("tinygrad_single_v1_arena")),
            ("compiler_revision", Item::S(rev)),
            ("format_version", Item::I(1)),
            ("behavior_version", Item::S("v15")),
            ("model_type", Item::S("supercombo")),
            ("image_history_pipeline", Item::S("policy")),
            ("frame_skip", Item::I(4)),
        ],
        &artifact_bytes(26, 2500),
    )
}

fn setup(generation: &str, revision: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("openpilot");
    let catalog = v26_checker::write_tree(&tree, generation, revision, &ROWS);
    runtime_tree(&tree, revision);
    let data = stamped_model(revision);
    let pkl = dir.path().join("build/pop223_driving_tinygrad.pkl");
    fs::create_dir_all(pkl.parent().unwrap()).unwrap();
    fs::write(&pkl, &data).unwrap();
    let artifacts = dir.path().join("artifacts");
    let o = cli(&[
        "chunk",
        "split",
        pkl.to_str().unwrap(),
        "--out-dir",
        artifacts.join("pop223").to_str().unwrap(),
        "--chunk-size",
        "1000",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // The compiler's build receipt beside the artifact: publish's runtime gate requires it.
    fs::write(
        artifacts.join("pop223/pop223_driving_tinygrad.build.json"),
        receipt("pop223", revision, &data),
    )
    .unwrap();
    Setup {
        dir,
        tree,
        artifacts,
        catalog,
        data,
    }
}

fn manifest(generation: &str, revision: &str, data: &[u8]) -> Value {
    json!({
        "generation": generation, "compiler_revision": revision, "artifact_abi": ARENA,
        "models": [{"id": "pop223", "name": "Pop", "version": "v15", "uses_external_gpu": false,
            "model_lab_eligible": true, "artifact_format": ARENA,
            "artifact_size": data.len(), "artifact_sha256": sha256_hex(data),
            "artifact_chunk_count": 3}]
    })
}

/// Publishes `doc` (written as `<dir>/m/model_names_<gen>.json`, with covering records in
/// `<dir>/m/ws`) to `<dir>/store` with the tree.
fn publish(s: &Setup, generation: &str, doc: &Value) -> std::process::Output {
    publish_with(s, generation, doc, &[])
}

/// [`publish`] with `extra` arguments.
fn publish_with(s: &Setup, generation: &str, doc: &Value, extra: &[&str]) -> std::process::Output {
    let mdir = s.dir.path().join("m");
    fs::create_dir_all(&mdir).unwrap();
    let path = mdir.join(format!("model_names_{generation}.json"));
    fs::write(&path, serde_json::to_string_pretty(doc).unwrap()).unwrap();
    let ws = covering_records(&mdir.join("ws"), &path);
    let store = s.dir.path().join("store");
    let args = publish_argv(
        generation,
        path.to_str().unwrap(),
        s.artifacts.to_str().unwrap(),
        &[store.to_str().unwrap()],
        &[
            &[
                "--workspace",
                ws.to_str().unwrap(),
                "--openpilot",
                s.tree.to_str().unwrap(),
            ][..],
            extra,
        ]
        .concat(),
    );
    cli_in(&strs(&args), s.dir.path())
}

fn checker<'a>(generation: &'a str, revision: &'a str, catalog: &[u8]) -> v26_checker::Runtime<'a> {
    v26_checker::Runtime {
        generation,
        compiler_revision: revision,
        artifact_abi: ARENA,
        bundled: "bundled-current",
        catalog: v26_checker::catalog_rows(catalog),
    }
}

#[test]
fn a_published_v26_contract_manifest_passes_the_independent_checker() {
    for (generation, revision) in GENERATIONS {
        let s = setup(generation, revision);
        let o = publish(&s, generation, &manifest(generation, revision, &s.data));
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
        let store = s.dir.path().join("store");
        let live =
            fs::read(store.join(format!("manifests/model_names_{generation}.json"))).unwrap();
        let rows = v26_checker::check_manifest(&live, &checker(generation, revision, &s.catalog))
            .unwrap_or_else(|e| panic!("{generation}: {e}"));
        assert_eq!(rows.len(), 1);
        // `audit` judges the live store by the generation's contract: nothing to report.
        let o = cli_in(
            &[
                "audit",
                "--generation",
                generation,
                "--json",
                "--store",
                store.to_str().unwrap(),
                "--openpilot",
                s.tree.to_str().unwrap(),
            ],
            s.dir.path(),
        );
        let report: Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}{}", text(&o.stdout), text(&o.stderr)));
        let kinds: Vec<&str> = report["stores"][0]["problems"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["kind"].as_str().unwrap())
            .collect();
        assert!(
            !kinds.iter().any(|k| k.starts_with("manifest_")),
            "{generation}: {report}"
        );
        // The chunks are where a v26 device fetches them.
        for i in 1..=3 {
            assert!(
                store
                    .join(format!(
                        "models/{generation}/pop223/pop223_driving_tinygrad.pkl.chunk0{i}of03"
                    ))
                    .is_file()
            );
        }
    }
}

fn paths_under(dir: &Path) -> Vec<(String, Vec<u8>)> {
    if dir.exists() {
        snapshot(dir)
    } else {
        Vec::new()
    }
}

#[test]
fn each_v26_refusal_uploads_nothing_and_changes_nothing() {
    let (generation, revision) = GENERATIONS[0];
    let s = setup(generation, revision);
    let good = manifest(generation, revision, &s.data);
    let sha = sha256_hex(&s.data);
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "a chestnut key",
            {
                let mut d = good.clone();
                d["models"][0]["accelerator_artifacts"] = json!({"chestnut": {
                    "execution_device": "AMD", "compiler_revision": revision,
                    "artifact_format": ARENA, "artifact_size": 2500, "artifact_sha256": sha,
                    "artifact_chunk_count": 3}});
                d
            },
            "accelerator_artifacts.chestnut",
        ),
        (
            "an id not in the tree's catalog",
            {
                let mut d = good.clone();
                let mut e = d["models"][0].clone();
                e["id"] = json!("zz9");
                d["models"].as_array_mut().unwrap().push(e);
                d
            },
            "models[1].id",
        ),
        (
            "another version",
            {
                let mut d = good.clone();
                d["models"][0]["version"] = json!("v16");
                d
            },
            "models[0].version",
        ),
        (
            "another GPU flag",
            {
                let mut d = good.clone();
                d["models"][0]["uses_external_gpu"] = json!(true);
                d
            },
            "models[0].uses_external_gpu",
        ),
        (
            "the v25 format",
            {
                let mut d = good.clone();
                d["models"][0]["artifact_format"] = json!("tinygrad_single_v1");
                d
            },
            "models[0].artifact_format",
        ),
        (
            "no compiler_revision",
            {
                let mut d = good.clone();
                d.as_object_mut().unwrap().remove("compiler_revision");
                d
            },
            "compiler_revision",
        ),
        // A missing `artifact_abi` is not a refusal: publish stages the contract's ABI into a
        // manifest that names the contract's revision (release's
        // `publish::tests::the_staged_manifest_carries_the_contract_top_keys`).
    ];
    for (name, doc, path) in cases {
        let before_tree = snapshot(&s.tree);
        let before_artifacts = snapshot(&s.artifacts);
        // Without its revision the validation records cannot match the manifest (the gate
        // refuses that too); skipping the gate shows the contract's own refusal.
        let extra: &[&str] = if path == "compiler_revision" || path == "artifact_abi" {
            &["--skip-validation", "the contract's refusal is the subject"]
        } else {
            &[]
        };
        let o = publish_with(&s, generation, &doc, extra);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{name}: {err}");
        assert!(err.contains(path), "{name}: {err}");
        let store = s.dir.path().join("store");
        assert!(
            paths_under(&store).is_empty(),
            "{name}: something was uploaded"
        );
        assert_eq!(snapshot(&s.tree), before_tree, "{name}: the tree changed");
        assert_eq!(snapshot(&s.artifacts), before_artifacts, "{name}");
        let ws = s.dir.path().join("m/ws");
        assert!(
            !ws.join("publish.json").exists()
                && !paths_under(&ws).iter().any(|(p, _)| p.contains("publish")),
            "{name}: a publish record was written"
        );
    }
}

/// A live manifest as the other tool of a shared bucket writes it (upstream's rebuild: every
/// catalog row, sorted keys, compact; a published `gwm8223` as one plain file with its own
/// `source_sha256`, no sidecar, none of our extension keys) in `store`; returns it.
fn upstream_live(store: &Path, generation: &str, revision: &str) -> Value {
    let gwm = artifact_bytes(12, 1800);
    let dir = store.join(format!("models/{generation}/gwm8223"));
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("gwm8223_driving_tinygrad.pkl"), &gwm).unwrap();
    let live = json!({
        "artifact_abi": ARENA, "compiler_revision": revision, "generation": generation,
        "models": [
            {"id": "gwm8223", "name": "GWM", "version": "v12", "uses_external_gpu": true,
             "model_lab_eligible": false, "artifact_format": ARENA,
             "artifact_size": gwm.len(), "artifact_sha256": sha256_hex(&gwm),
             "artifact_chunk_count": 0, "source_sha256": {"gwm8223_driving_policy.onnx": "ab".repeat(32)}},
            {"id": "pop223", "name": "Pop", "version": "v15", "uses_external_gpu": false,
             "model_lab_eligible": true}
        ]
    });
    let m = store.join("manifests");
    fs::create_dir_all(&m).unwrap();
    fs::write(
        m.join(format!("model_names_{generation}.json")),
        serde_json::to_vec(&live).unwrap(),
    )
    .unwrap();
    live
}

/// One bucket, two tools: our publish over the other tool's live manifest keeps its published
/// rows (the guard still applies) and what we publish is a manifest the other tool's merge
/// accepts (the independent checker); a live manifest the contract refuses stops the publish
/// before anything is uploaded.
#[test]
fn a_publish_over_the_other_tools_live_manifest_merges_its_rows() {
    for (generation, revision) in GENERATIONS {
        let s = setup(generation, revision);
        let store = s.dir.path().join("store");
        let live = upstream_live(&store, generation, revision);
        let o = publish(&s, generation, &manifest(generation, revision, &s.data));
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
        let path = store.join(format!("manifests/model_names_{generation}.json"));
        let published = fs::read(&path).unwrap();
        let rows =
            v26_checker::check_manifest(&published, &checker(generation, revision, &s.catalog))
                .unwrap_or_else(|e| panic!("{generation}: {e}"));
        assert_eq!(rows.keys().collect::<Vec<_>>(), ["gwm8223", "pop223"]);
        // The other tool's row is kept exactly; ours is the one we published.
        assert_eq!(rows["gwm8223"], live["models"][0]);
        assert_eq!(rows["pop223"]["artifact_sha256"], sha256_hex(&s.data));
        assert_eq!(rows["pop223"]["artifact_chunk_count"], 3);

        // A live manifest the contract refuses (a chestnut key) stops the next publish.
        let mut bad: Value = serde_json::from_slice(&published).unwrap();
        bad["models"][0]["accelerator_artifacts"] =
            json!({"chestnut": {"execution_device": "AMD"}});
        fs::write(&path, serde_json::to_vec(&bad).unwrap()).unwrap();
        let before = snapshot(&store);
        let o = publish(&s, generation, &manifest(generation, revision, &s.data));
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{generation}: {err}");
        assert!(err.contains("accelerator_artifacts.chestnut"), "{err}");
        assert_eq!(snapshot(&store), before, "{generation}: the store changed");
    }
}

/// Under the v26 contract an artifact that fits one chunk is published as one plain file
/// (count 0), as `manifest set-artifact` writes it, and a device of the contract reads it.
#[test]
fn a_one_chunk_artifact_is_published_as_a_plain_file() {
    for (generation, revision) in GENERATIONS {
        let s = setup(generation, revision);
        let dir = s.artifacts.join("pop223");
        fs::remove_dir_all(&dir).unwrap();
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("pop223_driving_tinygrad.pkl"), &s.data).unwrap();
        fs::write(
            dir.join("pop223_driving_tinygrad.build.json"),
            receipt("pop223", revision, &s.data),
        )
        .unwrap();
        let mut doc = manifest(generation, revision, &s.data);
        doc["models"][0]["artifact_chunk_count"] = json!(0);
        let o = publish(&s, generation, &doc);
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
        let store = s.dir.path().join("store");
        let model = store.join(format!("models/{generation}/pop223"));
        assert_eq!(
            fs::read(model.join("pop223_driving_tinygrad.pkl")).unwrap(),
            s.data
        );
        assert!(
            !model
                .join("pop223_driving_tinygrad.pkl.chunkmanifest")
                .exists()
        );
        let live =
            fs::read(store.join(format!("manifests/model_names_{generation}.json"))).unwrap();
        let rows =
            v26_checker::check_manifest(&live, &checker(generation, revision, &s.catalog)).unwrap();
        assert_eq!(rows["pop223"]["artifact_chunk_count"], 0);
    }
}

/// The generation guard against the previous generation's manifest in the store: a
/// v26-contract manifest lists only the models built so far, so a previous model it does not
/// list yet is not refused as dropped; a changed version still is.
#[test]
fn the_generation_guard_lets_a_v26_contract_manifest_list_only_built_models() {
    for (generation, revision) in GENERATIONS {
        let s = setup(generation, revision);
        let store = s.dir.path().join("store");
        let previous = format!("v{}", generation[1..].parse::<u32>().unwrap() - 1);
        let old_sha = "0".repeat(64);
        let prev = json!({"generation": previous, "models": [
            {"id": "pop223", "name": "Pop", "version": "v15", "uses_external_gpu": false,
             "artifact_format": "tinygrad_single_v1", "artifact_size": 10,
             "artifact_sha256": old_sha, "artifact_chunk_count": 1},
            {"id": "gwm8223", "name": "GWM", "version": "v12", "uses_external_gpu": true,
             "artifact_format": "tinygrad_single_v1", "artifact_size": 10,
             "artifact_sha256": old_sha, "artifact_chunk_count": 1}
        ]});
        fs::create_dir_all(store.join("manifests")).unwrap();
        let prev_path = store.join(format!("manifests/model_names_{previous}.json"));
        fs::write(&prev_path, prev.to_string()).unwrap();
        let o = publish(&s, generation, &manifest(generation, revision, &s.data));
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));

        // Another version than the previous generation's is still refused.
        let mut changed = prev.clone();
        changed["models"][0]["version"] = json!("v14");
        fs::write(&prev_path, changed.to_string()).unwrap();
        let live = store.join(format!("manifests/model_names_{generation}.json"));
        fs::remove_file(&live).unwrap();
        let before = snapshot(&store);
        let o = publish(&s, generation, &manifest(generation, revision, &s.data));
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{generation}: {err}");
        assert!(err.contains("v14"), "{generation}: {err}");
        assert_eq!(snapshot(&store), before);
    }
}

/// A first publish of a v26-contract generation into a store without the previous generation:
/// the manifest is compared with the tree's catalog, and a partial one (upstream accepts them)
/// is published with one line per catalog model left out, saying it stays unpublished.
#[test]
fn a_first_publish_names_each_catalog_model_it_leaves_unpublished() {
    for (generation, revision) in GENERATIONS {
        let s = setup(generation, revision);
        let o = publish(&s, generation, &manifest(generation, revision, &s.data));
        let err = text(&o.stderr);
        assert!(o.status.success(), "{generation}: {err}");
        let notes: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("stays unpublished"))
            .collect();
        assert_eq!(notes.len(), 1, "{generation}: {err}");
        assert!(
            notes[0].contains("gwm8223")
                && notes[0].contains(&format!("catalog-{generation}.json")),
            "{generation}: {err}"
        );
    }
}
