//! Manifest crate tests against real data and the rules of docs/formats.md ("The manifest",
//! "Store layout", "Release guard").

use std::collections::BTreeSet;

use manifest::{
    Artifact, ArtifactSize, ChunkCount, Error, Limits, Manifest, ModelId, Problem, Sha256Digest,
    UnexpectedChange, ValidationMode, diff, guard, keys, layout, validate_bytes,
};
use serde_json::{Value, json};

const V25_CATALOG: &str = include_str!("fixtures/model_names_v25.catalog.json");

fn id(s: &str) -> ModelId {
    s.parse().unwrap()
}

fn digest(c: char) -> Sha256Digest {
    c.to_string().repeat(64).parse().unwrap()
}

fn parse(v: Value) -> Manifest {
    Manifest::from_value(v).unwrap()
}

fn problems(v: &Value, mode: ValidationMode) -> Vec<String> {
    let bytes = serde_json::to_vec(v).unwrap();
    validate_bytes(&bytes, mode, &Limits::default())
        .iter()
        .map(Problem::to_string)
        .collect()
}

#[test]
fn real_v25_catalog_round_trips_byte_for_byte() {
    let m = Manifest::from_slice(V25_CATALOG.as_bytes()).unwrap();
    assert_eq!(m.models().len(), 97);
    assert_eq!(m.to_canonical_string(), V25_CATALOG);
    assert!(m.validate(ValidationMode::Catalog).is_empty());
    assert!(
        validate_bytes(
            V25_CATALOG.as_bytes(),
            ValidationMode::Catalog,
            &Limits::default()
        )
        .is_empty()
    );
    // The fixture predates artifact fields: typed reads see none, and nothing is dropped.
    assert!(
        m.models()
            .iter()
            .all(|e| e.artifact().is_none() && e.is_supported())
    );
    let gwm = m.get(&id("gwm8223")).unwrap();
    assert_eq!(gwm.accelerators()[0].0, "chestnut");
}

#[test]
fn real_v25_catalog_is_not_a_release_manifest() {
    let problems = validate_bytes(
        V25_CATALOG.as_bytes(),
        ValidationMode::Release,
        &Limits::default(),
    );
    // artifact_format, artifact_size, artifact_sha256, artifact_chunk_count for each of 97.
    assert_eq!(problems.len(), 97 * 4);
    assert_eq!(
        problems[0].to_string(),
        "models[0].artifact_format: missing; a release entry must be tinygrad_single_v1 (model \"tr14223\")"
    );
    assert_eq!(
        problems[1].to_string(),
        "models[0].artifact_size: missing; required for every published model (model \"tr14223\")"
    );
}

#[test]
fn extension_fields_are_plain_extra_keys() {
    let mut m = Manifest::from_slice(V25_CATALOG.as_bytes()).unwrap();
    let original: Value = serde_json::from_str(V25_CATALOG).unwrap();
    m.set_generation(layout::CURRENT_GENERATION);
    m.set_tinygrad_commit(&layout::current_tinygrad_commit());
    let pop = id("tr14223");
    let a = Artifact::tinygrad(
        ArtifactSize::new(100).unwrap(),
        digest('a'),
        ChunkCount::new(2).unwrap(),
    );
    let e = m.get_mut(&pop).unwrap();
    e.set_artifact_with_chunks(&a, &[digest('b'), digest('c')])
        .unwrap();
    e.set_source_commit(&"0".repeat(40).parse().unwrap());

    let text = m.to_canonical_string();
    let written: Value = serde_json::from_str(&text).unwrap();
    // What the Python fleet does with the document: a top-level object with a `models` list
    // of dicts, each read by key. Every documented key it reads is where it was; ours are extra.
    let models = written["models"].as_array().unwrap();
    assert_eq!(models.len(), 97);
    for (old, new) in original["models"].as_array().unwrap().iter().zip(models) {
        for (k, v) in old.as_object().unwrap() {
            assert_eq!(&new[k], v, "{k}");
        }
    }
    let entry = &models[0];
    assert_eq!(entry["artifact_format"], "tinygrad_single_v1");
    assert_eq!(entry["artifact_size"], 100);
    assert_eq!(entry["artifact_chunk_count"], 2);
    assert_eq!(entry["artifact_chunk_sha256"].as_array().unwrap().len(), 2);
    assert_eq!(written["generation"], "v25");
    assert_eq!(written["tinygrad_commit"], layout::CURRENT_TINYGRAD_COMMIT);
    assert!(text.starts_with("{\n  \"models\": [\n    {\n      \"id\": \"tr14223\",\n"));

    // Reading it back gives the typed values; writing again changes nothing.
    let back = Manifest::from_slice(text.as_bytes()).unwrap();
    assert_eq!(back.generation(), Some(layout::CURRENT_GENERATION));
    assert_eq!(
        back.get(&pop).unwrap().chunk_digests().unwrap(),
        vec![digest('b'), digest('c')]
    );
    assert_eq!(back.to_canonical_string(), text);
    assert!(back.validate(ValidationMode::Catalog).is_empty());

    // Dropping the extension and artifact keys again gives back the original bytes.
    let mut stripped = back.clone();
    let e = stripped.get_mut(&pop).unwrap();
    for k in [
        "artifact_format",
        "artifact_size",
        "artifact_sha256",
        "artifact_chunk_count",
    ]
    .into_iter()
    .chain(keys::ENTRY_EXTENSIONS)
    {
        e.remove(k).unwrap();
    }
    let mut top = stripped.to_value();
    for k in keys::TOP_LEVEL_EXTENSIONS {
        top.as_object_mut().unwrap().shift_remove(k);
    }
    assert_eq!(parse(top).to_canonical_string(), V25_CATALOG);
}

#[test]
fn unknown_fields_keep_their_place_among_known_ones() {
    let text = r#"{
  "note": "first",
  "models": [
    {
      "x_before": 1,
      "id": "a1",
      "x_mid": {
        "deep": [],
        "empty": {}
      },
      "name": "Été 🚗",
      "x_after": [
        1.5,
        1e-05,
        null,
        "tab\tquote\"ctl\u0001"
      ]
    }
  ],
  "trailer": true
}
"#;
    let mut m = Manifest::from_slice(text.as_bytes()).unwrap();
    assert_eq!(m.to_canonical_string(), text);
    let keys: Vec<_> = m.models()[0].fields().keys().cloned().collect();
    assert_eq!(keys, ["x_before", "id", "x_mid", "name", "x_after"]);
    let tops: Vec<_> = m.top_level().map(|(k, _)| k.to_owned()).collect();
    assert_eq!(tops, ["note", "trailer"]);
    // New top-level keys go after the existing ones.
    m.set_generation("v26".parse().unwrap());
    let out = m.to_canonical_string();
    assert!(
        out.ends_with("  \"trailer\": true,\n  \"generation\": \"v26\"\n}\n"),
        "{out}"
    );
}

#[test]
fn bare_arrays_are_read_and_written_as_objects() {
    let m = Manifest::from_slice(br#"[{"id": "a"}, {"id": "b"}]"#).unwrap();
    assert_eq!(m.ids().map(ModelId::as_str).collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(
        m.to_canonical_string(),
        "{\n  \"models\": [\n    {\n      \"id\": \"a\"\n    },\n    {\n      \"id\": \"b\"\n    }\n  ]\n}\n"
    );
    assert_eq!(
        Manifest::new().to_canonical_string(),
        "{\n  \"models\": []\n}\n"
    );
}

#[test]
fn every_problem_is_reported_with_its_path() {
    let good_sha = "a".repeat(64);
    let doc = json!({
        "generation": "25",
        "tinygrad_commit": "abc",
        "models": [
            {"id": "../x", "name": "ok", "version": "v1", "series": "S", "released": "2025-01-01", "community_favorite": false},
            {"id": "A", "name": "x", "version": "v1", "series": "S", "released": "2025-01-01", "community_favorite": false},
            {"id": "", "name": "x", "version": "v1", "series": "S", "released": "2025-01-01", "community_favorite": false},
            {"id": "dup", "name": "Bad, name", "version": "16", "series": "S", "released": "2025-02-30", "community_favorite": "no",
             "artifact_format": "split", "artifact_size": 0, "artifact_sha256": "ABC", "artifact_chunk_count": 100,
             "artifact_filename": "../evil.pkl"},
            {"id": "dup", "name": "x", "version": "v1", "series": "S", "released": "2025-01-01", "community_favorite": false,
             "artifact_size": 2147483649u64, "artifact_sha256": good_sha, "artifact_chunk_count": 2,
             "artifact_chunk_sha256": [good_sha, "nope"],
             "accelerator_artifacts": {"chestnut": {"artifact_sha256": "zz", "artifact_format": "amd_v9", "artifact_filename": "a/b"}}},
            "not an object",
            {"name": "no id"}
        ]
    });
    let got = problems(&doc, ValidationMode::Catalog);
    let want = [
        "generation: must look like v25 (got \"25\")",
        "tinygrad_commit: not 40 lowercase hex digits (got \"abc\")",
        "models[0].id: must match ^[a-z0-9][a-z0-9_-]*$ (got \"../x\")",
        "models[1].id: must match ^[a-z0-9][a-z0-9_-]*$ (got \"A\")",
        "models[2].id: must not be empty (got \"\")",
        "models[3].name: must not contain a comma (got \"Bad, name\") (model \"dup\")",
        "models[3].version: must look like v15 (got \"16\") (model \"dup\")",
        "models[3].released: no such day in that month (got \"2025-02-30\") (model \"dup\")",
        "models[3].community_favorite: expected true or false, found string \"no\" (model \"dup\")",
        "models[3].artifact_size: must be in (0, 2 GiB] (got \"0\") (model \"dup\")",
        "models[3].artifact_sha256: not 64 lowercase hex digits (got \"ABC\") (model \"dup\")",
        "models[3].artifact_chunk_count: must be in 0..=99 (got \"100\") (model \"dup\")",
        "models[3].artifact_filename: must be a bare file name without path separators (got \"../evil.pkl\") (model \"dup\")",
        "models[3].artifact_format: unknown artifact_format \"split\" (allowed: absent, \"\", \"tinygrad_single_v1\"); devices would drop this entry (model \"dup\")",
        "models[4].artifact_size: must be in (0, 2 GiB] (got \"2147483649\") (model \"dup\")",
        "models[4].artifact_chunk_sha256[1]: not 64 lowercase hex digits (got \"nope\") (model \"dup\")",
        "models[4].accelerator_artifacts.chestnut.artifact_sha256: not 64 lowercase hex digits (got \"zz\") (model \"dup\")",
        "models[4].accelerator_artifacts.chestnut.artifact_filename: must be a bare file name without path separators (got \"a/b\") (model \"dup\")",
        "models[4].id: duplicate model ID \"dup\" (first at models[3])",
        "models[4].accelerator_artifacts.chestnut.artifact_format: unknown artifact_format \"amd_v9\" (allowed: absent, \"\", \"tinygrad_single_v1\"); devices would drop this entry (model \"dup\")",
        "models[4].accelerator_artifacts.chestnut.artifact_size: missing; required when artifact_sha256 is present (model \"dup\")",
        "models[5]: expected an object, found string \"not an object\"",
        "models[6].id: missing; every entry needs an id",
        "models[6].version: missing; required in every catalog entry",
        "models[6].series: missing; required in every catalog entry",
        "models[6].released: missing; required in every catalog entry",
        "models[6].community_favorite: missing; required in every catalog entry",
    ];
    assert_eq!(got, want, "\n{}", got.join("\n"));

    // The reader refuses the same document, listing the reader-level problems.
    let err = Manifest::from_value(doc).unwrap_err();
    let Error::Invalid(list) = &err else {
        panic!("{err}")
    };
    assert_eq!(list.len(), want.len() - 7, "{err}");
    assert!(
        err.to_string()
            .contains("models[3].artifact_sha256: not 64 lowercase hex digits")
    );
}

#[test]
fn reader_accepts_what_the_fleet_accepts() {
    // Unsupported formats and missing fields are kept (devices drop or default them).
    let m =
        parse(json!({"models": [{"id": "a", "artifact_format": "split"}, {"id": "local-mine"}]}));
    assert!(!m.models()[0].is_supported());
    assert!(m.models()[1].id().is_local());
    assert!(m.validate(ValidationMode::Reader).is_empty());
    assert!(!m.validate(ValidationMode::Catalog).is_empty());
}

#[test]
fn chunk_digest_list_must_match_the_count() {
    let sha = "a".repeat(64);
    let base = json!({"id": "a", "name": "A", "version": "v1", "series": "S", "released": "2025-01-01",
        "community_favorite": false, "artifact_format": "tinygrad_single_v1", "artifact_size": 5,
        "artifact_sha256": sha, "artifact_chunk_count": 2, "artifact_chunk_sha256": [sha]});
    assert_eq!(
        problems(&json!({"models": [base]}), ValidationMode::Catalog),
        [
            "models[0].artifact_chunk_sha256: has 1 digests but artifact_chunk_count is 2 (model \"a\")"
        ]
    );
    let mut no_count = base.clone();
    no_count
        .as_object_mut()
        .unwrap()
        .shift_remove("artifact_chunk_count");
    assert_eq!(
        problems(&json!({"models": [no_count]}), ValidationMode::Catalog),
        ["models[0].artifact_chunk_sha256: present without artifact_chunk_count (model \"a\")"]
    );
}

#[test]
fn release_mode_demands_downloadable_non_local_entries() {
    let sha = "a".repeat(64);
    let ok = json!({"id": "a", "name": "A", "version": "v1", "series": "S", "released": "2025-01-01",
        "community_favorite": false, "artifact_format": "tinygrad_single_v1", "artifact_size": 5,
        "artifact_sha256": sha, "artifact_chunk_count": 1, "uses_external_gpu": false});
    let mut empty_format = ok.clone();
    empty_format["id"] = json!("b");
    empty_format["artifact_format"] = json!("");
    let mut local = ok.clone();
    local["id"] = json!("local-c");
    let doc = json!({"models": [ok, empty_format, local]});
    assert_eq!(
        problems(&doc, ValidationMode::Release),
        [
            "models[1].artifact_format: empty; a release entry must be tinygrad_single_v1 (model \"b\")",
            "models[2].id: local models are never published in a release manifest",
        ]
    );
    assert!(problems(&doc, ValidationMode::Catalog).is_empty());
    assert_eq!(
        problems(&json!({"models": []}), ValidationMode::Release),
        ["models: no models; devices ignore a manifest without entries"]
    );
    assert!(problems(&json!({"models": []}), ValidationMode::Reader).is_empty());
}

#[test]
fn shape_errors() {
    for (doc, want) in [
        (
            json!(3),
            "$: expected an object with a \"models\" array, found number 3",
        ),
        (json!({"x": 1}), "$: missing the \"models\" array"),
        (
            json!({"models": {}}),
            "models: expected an array of model entries, found an object",
        ),
    ] {
        assert_eq!(problems(&doc, ValidationMode::Reader), [want]);
    }
    let bad_json = validate_bytes(
        b"{\"models\": [",
        ValidationMode::Reader,
        &Limits::default(),
    );
    assert!(
        bad_json[0].to_string().starts_with("$: not valid JSON"),
        "{bad_json:?}"
    );
    assert!(matches!(Manifest::from_slice(b"{"), Err(Error::Json(_))));
}

#[test]
fn size_limit_is_checked_before_parsing() {
    let limits = Limits {
        max_manifest_bytes: 16,
    };
    // Not even JSON: the size check comes first.
    let big = vec![b'x'; 17];
    assert!(matches!(
        Manifest::from_slice_limited(&big, &limits),
        Err(Error::TooLarge {
            limit: 16,
            actual: 17
        })
    ));
    let p = validate_bytes(&big, ValidationMode::Reader, &limits);
    assert_eq!(
        p[0].to_string(),
        "$: manifest is 17 bytes, more than the limit of 16 bytes"
    );
    // An endless body is cut after limit + 1 bytes instead of being buffered.
    let err = Manifest::from_reader_limited(std::io::repeat(b' '), &Limits::default()).unwrap_err();
    assert!(
        matches!(err, Error::TooLarge { limit, actual } if limit == 2 << 20 && actual == (2 << 20) + 1)
    );
    // Exactly at the limit is fine.
    let at = br#"{"models":[]}   "#;
    assert_eq!(at.len(), 16);
    assert!(Manifest::from_slice_limited(at, &limits).is_ok());
}

fn release_manifest() -> Manifest {
    let sha = "a".repeat(64);
    parse(json!({"models": [
        {"id": "keep", "name": "Keep", "version": "v11", "series": "WM Series", "released": "2025-09-28",
         "community_favorite": true, "artifact_format": "tinygrad_single_v1", "artifact_size": 10,
         "artifact_sha256": sha, "artifact_chunk_count": 1,
         "accelerator_artifacts": {"chestnut": {"artifact_format": "tinygrad_single_v1",
             "artifact_filename": "keep_driving_chestnut_tinygrad.pkl", "artifact_size": 20,
             "artifact_sha256": sha, "artifact_chunk_count": 0, "execution_device": "AMD"}}},
        {"id": "target", "name": "Target", "version": "v16", "series": "OP Series", "released": "2025-10-01",
         "community_favorite": false, "artifact_format": "tinygrad_single_v1", "artifact_size": 10,
         "artifact_sha256": sha, "artifact_chunk_count": 1, "uses_external_gpu": false}
    ]}))
}

#[test]
fn guard_allows_intended_changes_only() {
    let live = release_manifest();
    let intended: BTreeSet<ModelId> = [id("target"), id("new1")].into();
    let mut new = live.clone();
    assert!(guard(&live, &new, &intended).is_ok());

    new.get_mut(&id("target"))
        .unwrap()
        .set_artifact(&Artifact::tinygrad(
            ArtifactSize::new(99).unwrap(),
            digest('b'),
            ChunkCount::new(3).unwrap(),
        ));
    let mut added = new.get(&id("target")).unwrap().clone().into_fields();
    added.insert("id".into(), json!("new1"));
    new.insert(manifest::ModelEntry::from_map(added).unwrap())
        .unwrap();
    new.set_generation(layout::CURRENT_GENERATION);
    new.set_tinygrad_commit(&layout::current_tinygrad_commit());
    guard(&live, &new, &intended).unwrap();

    // Key order is not a change.
    let mut reordered = live.to_value();
    let first = reordered["models"][1].as_object_mut().unwrap();
    let name = first.shift_remove("name").unwrap();
    first.insert("name".into(), name);
    assert!(guard(&live, &parse(reordered), &BTreeSet::new()).is_ok());
}

#[test]
fn guard_names_every_unexpected_change() {
    let live = release_manifest();
    let mut new = live.clone();
    let keep = new.get_mut(&id("keep")).unwrap();
    let mut acc = keep.get("accelerator_artifacts").unwrap().clone();
    acc["chestnut"]["artifact_sha256"] = json!("b".repeat(64));
    keep.set("accelerator_artifacts", acc).unwrap();
    keep.set_community_favorite(false);
    new.remove(&id("target"));
    let mut stranger = live.get(&id("keep")).unwrap().clone().into_fields();
    stranger.insert("id".into(), json!("stranger"));
    new.insert(manifest::ModelEntry::from_map(stranger).unwrap())
        .unwrap();
    new.set_top_level("note", json!("x")).unwrap();

    let refusal = guard(&live, &new, &BTreeSet::new()).unwrap_err();
    assert_eq!(
        refusal.changes,
        [
            UnexpectedChange::TopLevel {
                field: "note".into()
            },
            UnexpectedChange::Added(id("stranger")),
            UnexpectedChange::Removed(id("target")),
            UnexpectedChange::Changed {
                id: id("keep"),
                field: "community_favorite".into()
            },
            UnexpectedChange::Changed {
                id: id("keep"),
                field: "accelerator_artifacts.chestnut.artifact_sha256".into()
            },
        ]
    );
    let text = refusal.to_string();
    assert!(
        text.starts_with("refusing to publish: the new manifest makes 5 unexpected changes"),
        "{text}"
    );
    assert!(text.contains(
        "model keep: field accelerator_artifacts.chestnut.artifact_sha256 would change, but keep is not among the intended models"
    ));

    // A changed pin is refused even though adding one is allowed.
    let mut pinned = live.clone();
    pinned.set_generation(layout::CURRENT_GENERATION);
    let mut bumped = pinned.clone();
    bumped.set_generation("v26".parse().unwrap());
    assert!(guard(&live, &pinned, &BTreeSet::new()).is_ok());
    assert_eq!(
        guard(&pinned, &bumped, &BTreeSet::new())
            .unwrap_err()
            .changes,
        [UnexpectedChange::TopLevel {
            field: "generation".into()
        }]
    );
}

#[test]
fn diff_is_structured_and_readable() {
    let live = release_manifest();
    assert!(diff(&live, &live).is_empty());
    assert_eq!(diff(&live, &live).to_string(), "no changes\n");
    let mut new = live.clone();
    let t = new.get_mut(&id("target")).unwrap();
    t.set_artifact(&Artifact::tinygrad(
        ArtifactSize::new(99).unwrap(),
        digest('a'),
        ChunkCount::new(1).unwrap(),
    ));
    t.set_source_commit(&"1".repeat(40).parse().unwrap());
    new.remove(&id("keep"));
    let d = diff(&live, &new);
    assert_eq!(d.removed, [id("keep")]);
    assert_eq!(d.changed[0].fields.len(), 2);
    assert_eq!(d.changed[0].fields[0].old, Some(json!(10)));
    assert_eq!(
        d.to_string(),
        format!(
            "- model keep\n~ model target\n    artifact_size: 10 -> 99\n    source_commit: (absent) -> \"{}\"\n",
            "1".repeat(40)
        )
    );
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    fn json_string() -> impl Strategy<Value = String> {
        // Control characters, quotes, backslashes, non-ASCII and astral-plane characters.
        proptest::collection::vec(
            prop_oneof![
                any::<char>(),
                proptest::char::range('\u{0}', '\u{7f}'),
                Just('"'),
                Just('\\'),
                Just('é'),
                Just('📡'),
            ],
            0..12,
        )
        .prop_map(|cs| cs.into_iter().collect())
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
                .prop_map(Value::from),
            json_string().prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec((json_string(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn canonical_output_reparses_equal_and_is_a_fixed_point(v in json_value()) {
            let text = manifest::to_canonical_string(&v);
            let back: Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(&back, &v);
            prop_assert_eq!(manifest::to_canonical_string(&back), text);
        }

        #[test]
        fn manifests_with_arbitrary_extra_fields_round_trip(
            extras in proptest::collection::vec((json_string(), json_value()), 0..5),
            top_extras in proptest::collection::vec((json_string(), json_value()), 0..3),
            n in 1usize..4,
        ) {
            let known = |k: &str| k == "models" || keys::RELEASE_ORDER.contains(&k)
                || k.starts_with("model") || k.starts_with("artifact")
                || k.starts_with("accelerator") || k == "generation" || k == "tinygrad_commit";
            let mut top = serde_json::Map::new();
            for (k, v) in &top_extras {
                if !known(k) { top.insert(k.clone(), v.clone()); }
            }
            let models: Vec<Value> = (0..n).map(|i| {
                let mut e = serde_json::Map::new();
                for (j, (k, v)) in extras.iter().enumerate() {
                    if j == 1 { e.insert("id".into(), json!(format!("m{i}"))); }
                    if !known(k) && k != "id" { e.insert(k.clone(), v.clone()); }
                }
                e.insert("id".into(), json!(format!("m{i}")));
                Value::Object(e)
            }).collect();
            top.insert("models".into(), Value::Array(models));
            let doc = Value::Object(top);
            let m = Manifest::from_value(doc.clone()).unwrap();
            let text = m.to_canonical_string();
            prop_assert_eq!(&text, &manifest::to_canonical_string(&doc));
            let again = Manifest::from_slice(text.as_bytes()).unwrap();
            prop_assert_eq!(&again, &m);
            prop_assert_eq!(again.to_canonical_string(), text);
        }
    }
}
