//! Validation against a generation's contract (docs/formats.md, "Generation contracts"): the
//! v25 contract gives exactly `validate_bytes`'s results, the v26 contract refuses the whole
//! manifest on each of its rules, for v26 and for a made-up v27 with v26's contract; every v26
//! verdict is compared with an independent checker written from the schema's description.

use manifest::contract::{ContractName, TreeCatalogRow, TreeDeclaration};
use manifest::{
    Expectation, Generation, GitCommit, Limits, Manifest, ValidationMode, keys, runtime_artifact,
    validate_bytes, validate_for_contract,
};
use serde_json::{Value, json};
use test_support::v26_checker;

const V25_CATALOG: &str = include_str!("fixtures/model_names_v25.catalog.json");
const MODES: [ValidationMode; 3] = [
    ValidationMode::Reader,
    ValidationMode::Catalog,
    ValidationMode::Release,
];

fn sha(c: char) -> String {
    c.to_string().repeat(64)
}

fn commit(c: char) -> GitCommit {
    c.to_string().repeat(40).parse().unwrap()
}

/// The v26-contract generations under test: v26 and a made-up v27, each with its own revision.
fn generations() -> [(Generation, GitCommit); 2] {
    [
        (Generation::new(26), commit('9')),
        (Generation::new(27), commit('7')),
    ]
}

fn tree(generation: Generation, revision: &GitCommit) -> TreeDeclaration {
    let row = |id: &str, v: u32, gpu: bool, lab: bool| TreeCatalogRow {
        id: id.parse().unwrap(),
        name: id.to_uppercase(),
        version: manifest::BehaviorVersion::new(v),
        uses_external_gpu: gpu,
        model_lab_eligible: lab,
    };
    TreeDeclaration {
        generation,
        contract: ContractName::V26,
        compiler_revision: revision.clone(),
        catalog: vec![
            row("sc2", 9, false, true),
            row("gwm8223", 12, true, false),
            row("tr16223", 8, false, false),
        ],
    }
}

fn catalog_json(t: &TreeDeclaration) -> Vec<u8> {
    serde_json::to_vec(&json!({"models": t.catalog.iter().map(|r| json!({
        "id": r.id.as_str(), "name": r.name, "version": r.version.to_string(),
        "uses_external_gpu": r.uses_external_gpu, "model_lab_eligible": r.model_lab_eligible
    })).collect::<Vec<_>>()}))
    .unwrap()
}

/// A release-valid manifest of a v26-contract generation.
fn valid(generation: Generation, revision: &GitCommit) -> Value {
    let fmt = "tinygrad_single_v1_arena";
    json!({
        "generation": generation.to_string(),
        "compiler_revision": revision.as_str(),
        "artifact_abi": "tinygrad_single_v1_arena",
        "models": [
            {"id": "sc2", "name": "SC2", "version": "v9", "uses_external_gpu": false,
             "model_lab_eligible": true, "artifact_format": fmt, "artifact_size": 1000,
             "artifact_sha256": sha('a'), "artifact_chunk_count": 0, "x_kept": {"b": 1, "a": [1.5]},
             "accelerator_artifacts": {"amd": {"execution_device": "AMD",
                 "compiler_revision": revision.as_str(), "artifact_format": fmt,
                 "artifact_size": 2000, "artifact_sha256": sha('b'), "artifact_chunk_count": 2}},
             "runtime_artifacts": [{"min_runner_revision": 2, "artifact_format": fmt,
                 "artifact_size": 3000, "artifact_sha256": sha('c'), "artifact_chunk_count": 1,
                 "validation": {"passed": true, "p95_ms": 21.5}},
                 {"min_runner_revision": 3, "artifact_format": fmt,
                 "artifact_size": 4000, "artifact_sha256": sha('d'), "artifact_chunk_count": 1}]},
            {"id": "gwm8223", "name": "GWM", "version": "v12", "uses_external_gpu": true,
             "artifact_format": fmt, "artifact_size": 99_000_000, "artifact_sha256": sha('e'),
             "artifact_chunk_count": 3}
        ]
    })
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

fn v26() -> &'static manifest::Contract {
    ContractName::V26.contract()
}

/// Applies `edit` to a copy of `doc`.
fn edited(doc: &Value, edit: impl FnOnce(&mut Value)) -> Value {
    let mut d = doc.clone();
    edit(&mut d);
    d
}

#[test]
fn v25_contract_gives_exactly_validate_bytes() {
    let v25 = ContractName::V25.contract();
    let pin = manifest::PinTable::builtin()
        .get(Generation::new(25))
        .unwrap()
        .clone();
    let release = json!({"generation": "v25", "tinygrad_commit": pin.as_str(), "models": [
        {"id": "gwm8223", "name": "GWM", "version": "v11", "series": "WM", "released": "2025-09-28",
         "community_favorite": true, "artifact_format": "tinygrad_single_v1", "artifact_size": 10,
         "artifact_sha256": sha('a'), "artifact_chunk_count": 1,
         "accelerator_artifacts": {"chestnut": {"execution_device": "AMD",
             "artifact_format": "tinygrad_single_v1", "artifact_size": 20,
             "artifact_sha256": sha('b'), "artifact_chunk_count": 0}}}]});
    let docs: Vec<Vec<u8>> = vec![
        V25_CATALOG.as_bytes().to_vec(),
        bytes(&release),
        bytes(&json!([{"id": "a1", "name": "A,B"}])),
        bytes(&json!({"modles": []})),
        b"{not json".to_vec(),
        bytes(&valid(Generation::new(26), &commit('9'))),
    ];
    for doc in &docs {
        for mode in MODES {
            assert_eq!(
                validate_for_contract(doc, mode, v25, &Expectation::default(), &Limits::default()),
                validate_bytes(doc, mode, &Limits::default()),
                "{mode:?} {}",
                String::from_utf8_lossy(doc)
            );
        }
    }
    // The generation and the pin are checked only when asked, under the contract's key.
    let asked = |g: u32, c: &GitCommit, doc: &Value| {
        validate_for_contract(
            &bytes(doc),
            ValidationMode::Release,
            v25,
            &Expectation {
                generation: Some(Generation::new(g)),
                revision: Some(c),
                tree: None,
            },
            &Limits::default(),
        )
        .into_iter()
        .map(|p| p.path)
        .collect::<Vec<_>>()
    };
    assert!(asked(25, &pin, &release).is_empty());
    assert_eq!(asked(26, &pin, &release), ["generation"]);
    assert_eq!(asked(25, &commit('1'), &release), ["tinygrad_commit"]);
    // A v25 manifest without the extensions (the Python tools' own) passes the asked checks.
    let bare = edited(&release, |d| {
        let o = d.as_object_mut().unwrap();
        o.remove("generation");
        o.remove("tinygrad_commit");
    });
    assert!(asked(25, &pin, &bare).is_empty());
}

/// Each rule of the v26 contract: the edit, and the paths refused (empty: still valid).
type Case = (&'static str, Box<dyn Fn(&mut Value)>, Vec<&'static str>);

fn cases() -> Vec<Case> {
    let entry0 = |f: fn(&mut serde_json::Map<String, Value>)| -> Box<dyn Fn(&mut Value)> {
        Box::new(move |d| f(d["models"][0].as_object_mut().unwrap()))
    };
    vec![
        ("valid", Box::new(|_| {}), vec![]),
        (
            "no compiler_revision",
            Box::new(|d| drop(d.as_object_mut().unwrap().remove("compiler_revision"))),
            vec!["compiler_revision"],
        ),
        (
            "no artifact_abi",
            Box::new(|d| drop(d.as_object_mut().unwrap().remove("artifact_abi"))),
            vec!["artifact_abi"],
        ),
        (
            "no generation",
            Box::new(|d| drop(d.as_object_mut().unwrap().remove("generation"))),
            vec!["generation"],
        ),
        (
            "another ABI",
            Box::new(|d| d["artifact_abi"] = json!("tinygrad_single_v1")),
            vec!["artifact_abi"],
        ),
        (
            "another revision",
            Box::new(|d| d["compiler_revision"] = json!("1".repeat(40))),
            vec!["compiler_revision"],
        ),
        (
            "another generation",
            Box::new(|d| d["generation"] = json!("v30")),
            vec!["generation"],
        ),
        (
            "a bare list",
            Box::new(|d| *d = d["models"].clone()),
            vec!["$"],
        ),
        (
            "models not a list",
            Box::new(|d| d["models"] = json!({})),
            vec!["models"],
        ),
        (
            "v25 format",
            entry0(|e| drop(e.insert("artifact_format".into(), json!("tinygrad_single_v1")))),
            vec!["models[0].artifact_format"],
        ),
        (
            "format missing beside a digest",
            entry0(|e| drop(e.remove("artifact_format"))),
            vec!["models[0].artifact_format"],
        ),
        (
            "a chestnut key",
            entry0(|e| {
                let amd = e["accelerator_artifacts"]["amd"].clone();
                e["accelerator_artifacts"] = json!({"chestnut": amd});
            }),
            vec!["models[0].accelerator_artifacts.chestnut"],
        ),
        (
            "chestnut beside amd",
            entry0(|e| {
                let amd = e["accelerator_artifacts"]["amd"].clone();
                e["accelerator_artifacts"]["chestnut"] = amd;
            }),
            vec!["models[0].accelerator_artifacts.chestnut"],
        ),
        (
            "amd without lab eligibility",
            entry0(|e| drop(e.insert("model_lab_eligible".into(), json!(false)))),
            vec!["models[0].model_lab_eligible"],
        ),
        (
            "amd with another device",
            entry0(|e| e["accelerator_artifacts"]["amd"]["execution_device"] = json!("QCOM")),
            vec!["models[0].accelerator_artifacts.amd.execution_device"],
        ),
        (
            "amd without its revision",
            entry0(|e| {
                drop(
                    e["accelerator_artifacts"]["amd"]
                        .as_object_mut()
                        .unwrap()
                        .remove("compiler_revision"),
                )
            }),
            vec!["models[0].accelerator_artifacts.amd.compiler_revision"],
        ),
        (
            "amd on a GPU model",
            Box::new(|d| {
                let amd = d["models"][0]["accelerator_artifacts"].clone();
                d["models"][1]["accelerator_artifacts"] = amd;
                d["models"][1]["model_lab_eligible"] = json!(true);
            }),
            vec!["models[1].accelerator_artifacts.amd"],
        ),
        (
            "accelerators not an object",
            entry0(|e| drop(e.insert("accelerator_artifacts".into(), json!([])))),
            vec!["models[0].accelerator_artifacts"],
        ),
        (
            "an id not in the catalog",
            entry0(|e| drop(e.insert("id".into(), json!("zz9")))),
            vec!["models[0].id"],
        ),
        (
            "the bundled id",
            entry0(|e| drop(e.insert("id".into(), json!("bundled-current")))),
            vec!["models[0].id"],
        ),
        (
            "a duplicate id",
            Box::new(|d| {
                let e = d["models"][1].clone();
                d["models"].as_array_mut().unwrap().push(e);
            }),
            vec!["models[2].id"],
        ),
        (
            "another version",
            entry0(|e| drop(e.insert("version".into(), json!("v10")))),
            vec!["models[0].version"],
        ),
        (
            "another GPU flag",
            Box::new(|d| {
                drop(
                    d["models"][1]
                        .as_object_mut()
                        .unwrap()
                        .remove("uses_external_gpu"),
                )
            }),
            vec!["models[1].uses_external_gpu"],
        ),
        (
            "a GPU flag that reads as the catalog's",
            Box::new(|d| {
                drop(
                    d["models"][0]
                        .as_object_mut()
                        .unwrap()
                        .remove("uses_external_gpu"),
                )
            }),
            vec![],
        ),
        (
            "a plain file (count 0) and 99 chunks",
            Box::new(|d| d["models"][1]["artifact_chunk_count"] = json!(99)),
            vec![],
        ),
        (
            "100 chunks",
            Box::new(|d| d["models"][1]["artifact_chunk_count"] = json!(100)),
            vec!["models[1].artifact_chunk_count"],
        ),
        (
            "size zero",
            entry0(|e| drop(e.insert("artifact_size".into(), json!(0)))),
            vec!["models[0].artifact_size"],
        ),
        (
            "size over 2 GiB",
            entry0(|e| drop(e.insert("artifact_size".into(), json!(2_147_483_649_u64)))),
            vec!["models[0].artifact_size"],
        ),
        (
            "size a float",
            entry0(|e| drop(e.insert("artifact_size".into(), json!(1000.0)))),
            vec!["models[0].artifact_size"],
        ),
        (
            "uppercase digest",
            entry0(|e| drop(e.insert("artifact_sha256".into(), json!("A".repeat(64))))),
            vec!["models[0].artifact_sha256"],
        ),
        (
            "a variant's size missing",
            entry0(|e| {
                drop(
                    e["accelerator_artifacts"]["amd"]
                        .as_object_mut()
                        .unwrap()
                        .remove("artifact_size"),
                )
            }),
            vec!["models[0].accelerator_artifacts.amd.artifact_size"],
        ),
        (
            "runtime variant: unknown key",
            entry0(|e| e["runtime_artifacts"][0]["extra"] = json!(1)),
            vec!["models[0].runtime_artifacts[0].extra"],
        ),
        (
            "runtime variant: no count",
            entry0(|e| {
                drop(
                    e["runtime_artifacts"][0]
                        .as_object_mut()
                        .unwrap()
                        .remove("artifact_chunk_count"),
                )
            }),
            vec!["models[0].runtime_artifacts[0].artifact_chunk_count"],
        ),
        (
            "runtime variant: revision 1",
            entry0(|e| e["runtime_artifacts"][0]["min_runner_revision"] = json!(1)),
            vec!["models[0].runtime_artifacts[0].min_runner_revision"],
        ),
        (
            "runtime variant: revision a string",
            entry0(|e| e["runtime_artifacts"][0]["min_runner_revision"] = json!("2")),
            vec!["models[0].runtime_artifacts[0].min_runner_revision"],
        ),
        (
            "runtime variant: revision twice",
            entry0(|e| e["runtime_artifacts"][1]["min_runner_revision"] = json!(2)),
            vec!["models[0].runtime_artifacts[1].min_runner_revision"],
        ),
        (
            "runtime variant: wrong format",
            entry0(|e| e["runtime_artifacts"][1]["artifact_format"] = json!("tinygrad_single_v1")),
            vec!["models[0].runtime_artifacts[1].artifact_format"],
        ),
        (
            "runtime artifacts not a list",
            entry0(|e| drop(e.insert("runtime_artifacts".into(), json!({})))),
            vec!["models[0].runtime_artifacts"],
        ),
        (
            "an entry without an artifact (a catalog row)",
            Box::new(|d| {
                d["models"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"id": "tr16223", "name": "TR", "version": "v8"}))
            }),
            vec![],
        ),
    ]
}

/// Every case, for v26 and a made-up v27 with v26's contract: our validator (reader level,
/// given the generation, its revision and the tree) refuses exactly the listed paths, and the
/// independent checker agrees on accept/refuse.
#[test]
fn v26_contract_rules_for_v26_and_a_made_up_v27() {
    for (generation, revision) in generations() {
        let t = tree(generation, &revision);
        let expect = Expectation {
            generation: Some(generation),
            revision: Some(&revision),
            tree: Some(&t),
        };
        let gen_text = generation.to_string();
        let rt = v26_checker::Runtime {
            generation: &gen_text,
            compiler_revision: revision.as_str(),
            artifact_abi: "tinygrad_single_v1_arena",
            bundled: "bundled-current",
            catalog: v26_checker::catalog_rows(&catalog_json(&t)),
        };
        let base = valid(generation, &revision);
        for (name, edit, want) in cases() {
            let doc = edited(&base, |d| edit(d));
            let raw = bytes(&doc);
            let got = validate_for_contract(
                &raw,
                ValidationMode::Reader,
                v26(),
                &expect,
                &Limits::default(),
            );
            let paths: Vec<&str> = got.iter().map(|p| p.path.as_str()).collect();
            assert_eq!(paths, want, "{generation} {name}: {got:#?}");
            for p in &got {
                assert!(
                    p.message.contains("refuses the whole manifest"),
                    "{generation} {name}: {p}"
                );
            }
            let independent = v26_checker::check_manifest(&raw, &rt);
            assert_eq!(
                independent.is_ok(),
                got.is_empty(),
                "{generation} {name}: checker says {independent:?}, we say {got:#?}"
            );
        }
        // Without expectations, another generation's manifest is still well-formed v26...
        let other = valid(Generation::new(40), &commit('3'));
        assert!(
            validate_for_contract(
                &bytes(&other),
                ValidationMode::Reader,
                v26(),
                &Expectation::default(),
                &Limits::default()
            )
            .is_empty()
        );
        // ...and refused when this generation's values are asked for.
        let refused: Vec<String> = validate_for_contract(
            &bytes(&other),
            ValidationMode::Reader,
            v26(),
            &expect,
            &Limits::default(),
        )
        .into_iter()
        .map(|p| p.path)
        .collect();
        assert_eq!(
            refused,
            [
                "generation",
                "compiler_revision",
                "models[0].accelerator_artifacts.amd.compiler_revision"
            ],
            "{generation}"
        );
    }
}

#[test]
fn v26_levels_catalog_and_release() {
    let (generation, revision) = generations()[0].clone();
    let t = tree(generation, &revision);
    let expect = Expectation {
        generation: Some(generation),
        revision: Some(&revision),
        tree: Some(&t),
    };
    let paths = |doc: &Value, mode| -> Vec<String> {
        validate_for_contract(&bytes(doc), mode, v26(), &expect, &Limits::default())
            .into_iter()
            .map(|p| p.path)
            .collect()
    };
    let base = valid(generation, &revision);
    for mode in MODES {
        assert!(paths(&base, mode).is_empty(), "{mode:?}");
    }
    // A catalog row without an artifact: fine to read, not something we publish.
    let row = edited(&base, |d| {
        d["models"]
            .as_array_mut()
            .unwrap()
            .push(json!({"id": "tr16223", "name": "TR", "version": "v8"}))
    });
    assert!(paths(&row, ValidationMode::Catalog).is_empty());
    assert_eq!(
        paths(&row, ValidationMode::Release),
        [
            "models[2].artifact_format",
            "models[2].artifact_size",
            "models[2].artifact_sha256",
            "models[2].artifact_chunk_count"
        ]
    );
    // No models; a typo of a v26 key.
    let empty = edited(&base, |d| d["models"] = json!([]));
    assert!(paths(&empty, ValidationMode::Reader).is_empty());
    assert_eq!(paths(&empty, ValidationMode::Catalog), ["models"]);
    let typo = edited(&base, |d| d["compiler_revison"] = json!("x"));
    assert_eq!(paths(&typo, ValidationMode::Catalog), ["compiler_revison"]);
    let typo = edited(&base, |d| d["models"][0]["runtime_artifact"] = json!([]));
    assert_eq!(
        paths(&typo, ValidationMode::Catalog),
        ["models[0].runtime_artifact"]
    );
    // The size cap, before parsing.
    let big = vec![b' '; (2 << 20) + 1];
    assert_eq!(
        paths(
            &serde_json::from_slice(b"null").unwrap(),
            ValidationMode::Reader
        ),
        ["$"]
    );
    assert_eq!(
        validate_for_contract(
            &big,
            ValidationMode::Reader,
            v26(),
            &expect,
            &Limits::default()
        )
        .len(),
        1
    );
}

#[test]
fn v26_manifests_round_trip_and_read_through_the_contract() {
    for (generation, revision) in generations() {
        let doc = valid(generation, &revision);
        // Canonical text round-trips byte for byte, unknown keys in place.
        let m = Manifest::from_value(doc.clone()).unwrap();
        let text = m.to_canonical_string();
        let again = Manifest::from_slice(text.as_bytes()).unwrap();
        assert_eq!(again.to_canonical_string(), text);
        assert_eq!(again.to_value(), doc);
        // Sorted-key compact text (as another tool writes it) reads the same.
        let compact = serde_json::to_vec(&doc).unwrap();
        assert_eq!(Manifest::from_slice(&compact).unwrap().to_value(), doc);
        // Typed accessors go through the contract's revision key.
        assert_eq!(m.revision(v26()), Some(revision.clone()));
        assert_eq!(m.revision(ContractName::V25.contract()), None);
        assert_eq!(m.tinygrad_commit(), None);
        assert_eq!(m.generation(), Some(generation));
        assert_eq!(m.artifact_abi(), Some("tinygrad_single_v1_arena"));
        // Without a pin table: the key of the contract the manifest names.
        assert_eq!(m.own_revision(), Some(revision.clone()));
        let v25m = Manifest::for_generation(generation, &revision);
        assert_eq!(v25m.own_revision(), Some(revision.clone()));
        // An empty manifest of the contract carries its keys in the contract's order.
        let empty = Manifest::for_contract(generation, &revision, v26());
        assert_eq!(
            empty.top_level().map(|(k, _)| k).collect::<Vec<_>>(),
            ["generation", "compiler_revision", "artifact_abi"]
        );
        assert_eq!(empty.revision(v26()), Some(revision.clone()));
        let v25 = Manifest::for_contract(generation, &revision, ContractName::V25.contract());
        assert_eq!(
            v25,
            Manifest::for_generation(generation, &revision),
            "the v25 contract's empty manifest is today's"
        );
    }
}

#[test]
fn runtime_artifact_picks_the_highest_variant_the_runner_loads() {
    let (generation, revision) = generations()[1].clone();
    let m = Manifest::from_value(valid(generation, &revision)).unwrap();
    let sc2 = &m.models()[0];
    let picked = runtime_artifact(sc2, v26()).unwrap();
    // Revision 3 is above the runner's 2: revision 2's fields replace the entry's.
    assert_eq!(picked.get(keys::ARTIFACT_SHA256), Some(&json!(sha('c'))));
    assert_eq!(picked.get(keys::ARTIFACT_SIZE), Some(&json!(3000)));
    assert_eq!(
        picked.get("validation"),
        Some(&json!({"passed": true, "p95_ms": 21.5}))
    );
    assert_eq!(picked.get(keys::MIN_RUNNER_REVISION), None);
    // Keys keep their place; the runtime list itself stays.
    assert_eq!(
        picked
            .fields()
            .keys()
            .position(|k| k == keys::ARTIFACT_SIZE),
        sc2.fields().keys().position(|k| k == keys::ARTIFACT_SIZE)
    );
    assert!(picked.get(keys::RUNTIME_ARTIFACTS).is_some());
    // No variant the runner loads, no variants, or a contract without runtime variants: as is.
    let gwm = &m.models()[1];
    assert_eq!(&runtime_artifact(gwm, v26()).unwrap(), gwm);
    assert_eq!(
        &runtime_artifact(sc2, ContractName::V25.contract()).unwrap(),
        sc2
    );
    let mut only_newer = sc2.clone();
    only_newer
        .set(
            keys::RUNTIME_ARTIFACTS,
            json!([{"min_runner_revision": 5, "artifact_format": "tinygrad_single_v1_arena",
                    "artifact_size": 1, "artifact_sha256": sha('f'), "artifact_chunk_count": 0}]),
        )
        .unwrap();
    assert_eq!(
        runtime_artifact(&only_newer, v26())
            .unwrap()
            .get(keys::ARTIFACT_SHA256),
        Some(&json!(sha('a')))
    );
}
