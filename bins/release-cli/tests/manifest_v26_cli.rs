//! `release-cli manifest validate|fmt|diff|set-artifact` on manifests of a v26-contract
//! generation (docs/formats.md, "Generation contracts"), for v26 and a made-up v27 with v26's
//! contract: the contract comes from the tree's declaration (`--openpilot`) or the manifest's
//! own `artifact_abi`; each v26 refusal names its path.

use crate::common::{cli_in as cli, snapshot, text};

use std::fs;
use std::path::Path;

use serde_json::{Value, json};
use test_support::published::{artifact_bytes, sha256_hex};
use test_support::v26_checker;

const ARENA: &str = "tinygrad_single_v1_arena";

/// (generation, its revision) for each v26-contract generation under test.
const GENERATIONS: [(&str, &str); 2] = [
    ("v26", "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf"),
    ("v27", "2222222222222222222222222222222222222222"),
];

const ROWS: [v26_checker::Row<'static>; 3] = [
    ("sc2", "SC2", "v9", false, true),
    ("gwm8223", "GWM", "v12", true, false),
    ("tr16223", "TR16", "v8", false, false),
];

fn manifest(generation: &str, revision: &str, data: &[u8]) -> Value {
    json!({
        "generation": generation, "compiler_revision": revision, "artifact_abi": ARENA,
        "models": [
            {"id": "sc2", "name": "SC2", "version": "v9", "uses_external_gpu": false,
             "model_lab_eligible": true, "artifact_format": ARENA,
             "artifact_size": data.len(), "artifact_sha256": sha256_hex(data),
             "artifact_chunk_count": 0,
             "accelerator_artifacts": {"amd": {"execution_device": "AMD",
                 "compiler_revision": revision, "artifact_format": ARENA,
                 "artifact_size": data.len(), "artifact_sha256": sha256_hex(data),
                 "artifact_chunk_count": 0}}},
            {"id": "gwm8223", "name": "GWM", "version": "v12", "uses_external_gpu": true,
             "artifact_format": ARENA, "artifact_size": data.len(),
             "artifact_sha256": sha256_hex(data), "artifact_chunk_count": 0}
        ]
    })
}

/// A refusal case: its name, the edit, the paths refused, and whether only the tree's
/// catalog shows it (so that it passes without `--openpilot`).
type Case = (
    &'static str,
    Box<dyn Fn(&mut Value)>,
    Vec<&'static str>,
    bool,
);

fn validate(dir: &Path, file: &Path, tree: Option<&Path>) -> (Option<i32>, Value) {
    let mut args = vec![
        "manifest",
        "validate",
        "--mode",
        "release",
        "--json",
        file.to_str().unwrap(),
    ];
    if let Some(t) = tree {
        args.extend(["--openpilot", t.to_str().unwrap()]);
    }
    let o = cli(&args, dir);
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|_| panic!("{} {}", text(&o.stdout), text(&o.stderr)));
    (o.status.code(), v)
}

fn paths(v: &Value) -> Vec<String> {
    v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn validate_judges_a_v26_contract_manifest_by_its_tree() {
    for (generation, revision) in GENERATIONS {
        let t = tempfile::tempdir().unwrap();
        let tree = t.path().join("openpilot");
        v26_checker::write_tree(&tree, generation, revision, &ROWS);
        let data = artifact_bytes(3, 1500);
        let good = manifest(generation, revision, &data);
        let file = t.path().join(format!("model_names_{generation}.json"));
        fs::write(&file, good.to_string()).unwrap();

        let (code, v) = validate(t.path(), &file, Some(&tree));
        assert_eq!(code, Some(0), "{generation}: {v}");
        assert_eq!(v["contract"], "v26");
        // Without the tree the manifest's ABI names the contract; the tree's rows are not known.
        let (code, v) = validate(t.path(), &file, None);
        assert_eq!(code, Some(0), "{generation}: {v}");
        assert_eq!(v["contract"], "v26");

        let cases: Vec<Case> = vec![
            (
                "a chestnut key",
                Box::new(|d| {
                    let amd = d["models"][0]["accelerator_artifacts"]["amd"].clone();
                    d["models"][0]["accelerator_artifacts"] = json!({"chestnut": amd});
                }),
                vec!["models[0].accelerator_artifacts.chestnut"],
                false,
            ),
            (
                "an id not in the tree's catalog",
                Box::new(|d| d["models"][1]["id"] = json!("zz9")),
                vec!["models[1].id"],
                true,
            ),
            (
                "another version",
                Box::new(|d| d["models"][1]["version"] = json!("v13")),
                vec!["models[1].version"],
                true,
            ),
            (
                "another GPU flag",
                Box::new(|d| d["models"][1]["uses_external_gpu"] = json!(false)),
                vec!["models[1].uses_external_gpu"],
                true,
            ),
            (
                "the v25 format",
                Box::new(|d| d["models"][1]["artifact_format"] = json!("tinygrad_single_v1")),
                vec!["models[1].artifact_format"],
                false,
            ),
            (
                "no compiler_revision",
                Box::new(|d| drop(d.as_object_mut().unwrap().remove("compiler_revision"))),
                vec!["compiler_revision"],
                false,
            ),
            (
                "another revision",
                Box::new(|d| {
                    d["compiler_revision"] = json!("3".repeat(40));
                    d["models"][0]["accelerator_artifacts"]["amd"]["compiler_revision"] =
                        json!("3".repeat(40));
                }),
                vec![
                    "compiler_revision",
                    "models[0].accelerator_artifacts.amd.compiler_revision",
                ],
                true,
            ),
        ];
        for (name, edit, want, needs_tree) in cases {
            let mut doc = good.clone();
            edit(&mut doc);
            fs::write(&file, doc.to_string()).unwrap();
            let before = snapshot(t.path());
            let (code, v) = validate(t.path(), &file, Some(&tree));
            assert_eq!(code, Some(3), "{generation} {name}: {v}");
            assert_eq!(paths(&v), want, "{generation} {name}: {v}");
            assert!(
                v["problems"][0]["message"]
                    .as_str()
                    .unwrap()
                    .contains("refuses the whole manifest"),
                "{generation} {name}: {v}"
            );
            assert_eq!(snapshot(t.path()), before, "validate wrote something");
            let (code, _) = validate(t.path(), &file, None);
            assert_eq!(
                code == Some(0),
                needs_tree,
                "{generation} {name} without the tree"
            );
        }
    }
}

#[test]
fn a_tree_whose_declaration_cannot_be_read_is_refused_by_name() {
    let t = tempfile::tempdir().unwrap();
    let tree = t.path().join("openpilot");
    v26_checker::write_tree(&tree, "v26", GENERATIONS[0].1, &ROWS);
    fs::remove_file(tree.join("upstream-sync.json")).unwrap();
    let file = t.path().join("m.json");
    fs::write(&file, manifest("v26", GENERATIONS[0].1, b"x").to_string()).unwrap();
    let o = cli(
        &[
            "manifest",
            "validate",
            file.to_str().unwrap(),
            "--openpilot",
            tree.to_str().unwrap(),
        ],
        t.path(),
    );
    assert_ne!(o.status.code(), Some(0));
    let err = text(&o.stderr);
    assert!(
        err.contains("catalog.py") && err.contains("upstream-sync.json is missing"),
        "{err}"
    );
}

#[test]
fn fmt_diff_and_set_artifact_keep_the_v26_schema() {
    for (generation, revision) in GENERATIONS {
        let t = tempfile::tempdir().unwrap();
        let data = artifact_bytes(5, 2500);
        let doc = manifest(generation, revision, &data);
        // As another tool writes it: sorted keys, compact.
        let raw = t.path().join("raw.json");
        fs::write(&raw, serde_json::to_vec(&doc).unwrap()).unwrap();
        let o = cli(&["manifest", "fmt", raw.to_str().unwrap()], t.path());
        assert!(o.status.success(), "{}", text(&o.stderr));
        let file = t.path().join(format!("model_names_{generation}.json"));
        fs::write(&file, &o.stdout).unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&o.stdout).unwrap(), doc);
        let o = cli(
            &["manifest", "fmt", "--check", file.to_str().unwrap()],
            t.path(),
        );
        assert!(o.status.success(), "{}", text(&o.stderr));

        // set-artifact: a plain file that fits one chunk is count 0 in the arena format.
        let new_data = artifact_bytes(6, 1800);
        let dir = t.path().join("ready/sc2");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("sc2_driving_tinygrad.pkl"), &new_data).unwrap();
        let o = cli(
            &[
                "manifest",
                "set-artifact",
                file.to_str().unwrap(),
                dir.to_str().unwrap(),
            ],
            t.path(),
        );
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
        let after: Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
        let e = &after["models"][0];
        assert_eq!(e["artifact_format"], ARENA);
        assert_eq!(e["artifact_chunk_count"], 0);
        assert_eq!(e["artifact_size"], 1800);
        assert_eq!(e["artifact_sha256"], sha256_hex(&new_data));
        assert!(e.get("artifact_chunk_sha256").is_none());
        // The amd variant, from its own file.
        let amd = t.path().join("ready/sc2-amd");
        fs::create_dir_all(&amd).unwrap();
        fs::write(amd.join("sc2_driving_amd_tinygrad.pkl"), &new_data).unwrap();
        let o = cli(
            &[
                "manifest",
                "set-artifact",
                file.to_str().unwrap(),
                amd.to_str().unwrap(),
                "--model",
                "sc2",
                "--variant",
                "amd",
            ],
            t.path(),
        );
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
        let after: Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
        let amd_v = &after["models"][0]["accelerator_artifacts"]["amd"];
        assert_eq!(amd_v["artifact_format"], ARENA);
        assert_eq!(amd_v["artifact_size"], 1800);
        assert_eq!(amd_v["compiler_revision"], revision);
        // The result is still one the independent checker accepts.
        let tree = t.path().join("openpilot");
        let catalog = v26_checker::write_tree(&tree, generation, revision, &ROWS);
        let rt = v26_checker::Runtime {
            generation,
            compiler_revision: revision,
            artifact_abi: ARENA,
            bundled: "bundled-current",
            catalog: v26_checker::catalog_rows(&catalog),
        };
        v26_checker::check_manifest(&fs::read(&file).unwrap(), &rt).unwrap();
        let (code, v) = validate(t.path(), &file, Some(&tree));
        assert_eq!(code, Some(0), "{v}");

        // diff names the change, model by model.
        let o = cli(
            &[
                "manifest",
                "diff",
                "--json",
                raw.to_str().unwrap(),
                file.to_str().unwrap(),
            ],
            t.path(),
        );
        assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
        let d: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(d["changed"][0]["id"], "sc2");

        // A plain file larger than one chunk is not published as one.
        let big = t.path().join("ready/gwm8223");
        fs::create_dir_all(&big).unwrap();
        let f = fs::File::create(big.join("gwm8223_driving_tinygrad.pkl")).unwrap();
        f.set_len(chunker::DEFAULT_CHUNK_SIZE + 1).unwrap();
        let before = fs::read(&file).unwrap();
        let o = cli(
            &[
                "manifest",
                "set-artifact",
                file.to_str().unwrap(),
                big.to_str().unwrap(),
            ],
            t.path(),
        );
        assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains("chunk split"),
            "{}",
            text(&o.stderr)
        );
        assert_eq!(fs::read(&file).unwrap(), before);
    }
}

/// `manifest sign` and `verify` take a v26-contract manifest as they take a v25 one: the trusted
/// comment names its generation.
#[test]
fn sign_and_verify_a_v26_contract_manifest() {
    for (generation, revision) in GENERATIONS {
        let t = tempfile::tempdir().unwrap();
        let kp = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
        let (sk, pk) = (t.path().join("a.key"), t.path().join("a.pub"));
        fs::write(&sk, kp.sk.to_box(None).unwrap().into_string()).unwrap();
        fs::write(&pk, kp.pk.to_box().unwrap().into_string()).unwrap();
        let data = artifact_bytes(7, 1200);
        let file = t.path().join(format!("model_names_{generation}.json"));
        let o = {
            let raw = t.path().join("raw.json");
            fs::write(&raw, manifest(generation, revision, &data).to_string()).unwrap();
            cli(&["manifest", "fmt", raw.to_str().unwrap()], t.path())
        };
        fs::write(&file, &o.stdout).unwrap();
        let o = cli(
            &[
                "manifest",
                "sign",
                "--key",
                sk.to_str().unwrap(),
                "--json",
                file.to_str().unwrap(),
            ],
            t.path(),
        );
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["generation"], generation);
        let o = cli(
            &[
                "manifest",
                "verify",
                "--key",
                pk.to_str().unwrap(),
                file.to_str().unwrap(),
            ],
            t.path(),
        );
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
    }
}
