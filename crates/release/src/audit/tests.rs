//! Table tests of the audit's pure decisions, for v25 and a made-up v26 with a made-up pin.

use super::*;
use serde_json::json;

const V26_PIN: &str = "0123456789abcdef0123456789abcdef01234567";
const NOW: u64 = 1_800_000_000;
const DAY: u64 = 86_400;

fn pins() -> PinTable {
    let mut t = PinTable::builtin();
    t.record(Generation::new(26), &V26_PIN.parse().unwrap())
        .unwrap();
    t
}

fn pin_of(g: Generation) -> String {
    pins().get(g).unwrap().to_string()
}

/// A 2500-byte artifact for `id`, in 1000-byte chunks.
fn data(id: &str) -> Vec<u8> {
    (0..2500u32)
        .map(|i| (i as usize * 7 + id.len()) as u8)
        .collect()
}

fn entry(id: &str) -> serde_json::Value {
    let d = data(id);
    json!({
        "id": id, "name": id, "version": "v15", "series": "OP Series", "released": "2025-06-01",
        "community_favorite": false, "artifact_format": "tinygrad_single_v1",
        "artifact_size": d.len(), "artifact_sha256": Sha256Digest::of_bytes(&d).to_hex(),
        "artifact_chunk_count": 3, "uses_external_gpu": false
    })
}

fn manifest_bytes(g: Generation, pin: &str, ids: &[&str]) -> Vec<u8> {
    let doc = json!({"generation": g.to_string(), "tinygrad_commit": pin,
        "models": ids.iter().map(|i| entry(i)).collect::<Vec<_>>()});
    Manifest::from_value(doc).unwrap().to_canonical_bytes()
}

/// A healthy local store holding `ids` for `g`, unsigned.
fn healthy(g: Generation, ids: &[&str]) -> Snapshot {
    let mut files = BTreeMap::new();
    let mut small = BTreeMap::new();
    for id in ids {
        let d = data(id);
        let dir = format!("models/{g}/{id}");
        let name = format!("{id}_driving_tinygrad.pkl");
        for (i, c) in d.chunks(1000).enumerate() {
            files.insert(
                format!("{dir}/{}", chunker::chunk_name(&name, i as u32 + 1, 3)),
                c.len() as u64,
            );
        }
        let cm = format!("{dir}/{name}.chunkmanifest");
        let sc = format!("{dir}/{name}.sha256");
        files.insert(cm.clone(), 1);
        small.insert(cm, Ok(b"3".to_vec()));
        let side = chunker::format_sidecar(&Sha256Digest::of_bytes(&d), &name);
        files.insert(sc.clone(), side.len() as u64);
        small.insert(sc, Ok(side.into_bytes()));
    }
    Snapshot {
        store: StoreRef::Local {
            root: "/srv/store".into(),
        },
        manifest: Ok(Some(manifest_bytes(g, &pin_of(g), ids))),
        signature: SignatureRead::Absent,
        files,
        small,
        digests: None,
        odd: BTreeMap::new(),
        failing_chunks: BTreeMap::new(),
    }
}

fn mend() -> MendContext {
    MendContext {
        workspace: "/ws".into(),
        sign_keys: vec!["/keys/release.key".into()],
        openpilot: None,
    }
}

fn audit(s: &Snapshot, g: Generation, keys_given: bool) -> StoreAudit {
    let pins = pins();
    let m = mend();
    check_store(
        s,
        &Rules {
            generation: g,
            pins: &pins,
            keys: usize::from(keys_given),
            now: UnixSeconds(NOW),
            mend: &m,
        },
    )
}

fn kinds(a: &StoreAudit) -> Vec<&'static str> {
    a.problems.iter().map(|f| kind_name(f.kind)).collect()
}

/// The kind as the JSON report names it.
fn kind_name(kind: FindingKind) -> &'static str {
    let v = serde_json::to_value(kind).unwrap();
    Box::leak(v.as_str().unwrap().to_owned().into_boxed_str())
}

fn gens() -> [Generation; 2] {
    [Generation::new(25), Generation::new(26)]
}

#[test]
fn a_whole_store_is_healthy() {
    for g in gens() {
        let a = audit(&healthy(g, &["pop223", "gwm8223"]), g, false);
        assert!(a.problems.is_empty(), "{g}: {:?}", a.problems);
        assert_eq!((a.models, a.artifacts, a.bytes), (2, 2, 5000));
        assert_eq!(a.signature.state, "unsigned");
    }
}

#[test]
fn each_defect_is_found_with_model_path_and_mend() {
    type Damage = fn(&mut Snapshot, Generation);
    let cases: Vec<(&str, Damage, &str, &str)> = vec![
        (
            "a chunk deleted",
            |s, g| {
                s.files.remove(&format!(
                    "models/{g}/pop223/pop223_driving_tinygrad.pkl.chunk02of03"
                ));
            },
            "file_missing",
            "pop223_driving_tinygrad.pkl.chunk02of03",
        ),
        (
            "the chunk manifest gone",
            |s, g| {
                s.small.remove(&format!(
                    "models/{g}/pop223/pop223_driving_tinygrad.pkl.chunkmanifest"
                ));
            },
            "chunk_manifest_missing",
            "pop223_driving_tinygrad.pkl.chunkmanifest",
        ),
        (
            "the chunk manifest says 2",
            |s, g| {
                s.small.insert(
                    format!("models/{g}/pop223/pop223_driving_tinygrad.pkl.chunkmanifest"),
                    Ok(b"2".to_vec()),
                );
            },
            "chunk_count_differs",
            "pop223_driving_tinygrad.pkl.chunkmanifest",
        ),
        (
            "the sidecar names another digest",
            |s, g| {
                s.small.insert(
                    format!("models/{g}/pop223/pop223_driving_tinygrad.pkl.sha256"),
                    Ok(format!("{}  x\n", "0".repeat(64)).into_bytes()),
                );
            },
            "sidecar_differs",
            "pop223_driving_tinygrad.pkl.sha256",
        ),
        (
            "a chunk one byte short",
            |s, g| {
                *s.files
                    .get_mut(&format!(
                        "models/{g}/pop223/pop223_driving_tinygrad.pkl.chunk03of03"
                    ))
                    .unwrap() -= 1;
            },
            "size_differs",
            "pop223_driving_tinygrad.pkl",
        ),
        (
            "chunks of the wrong sizes adding up",
            |s, g| {
                let f = |i| format!("models/{g}/pop223/pop223_driving_tinygrad.pkl.chunk0{i}of03");
                *s.files.get_mut(&f(1)).unwrap() = 900;
                *s.files.get_mut(&f(3)).unwrap() = 600;
            },
            "chunk_size",
            "pop223_driving_tinygrad.pkl.chunk02of03",
        ),
        (
            "an older split's chunk",
            |s, g| {
                s.files.insert(
                    format!("models/{g}/pop223/pop223_driving_tinygrad.pkl.chunk01of01"),
                    2500,
                );
            },
            "other_split",
            "pop223_driving_tinygrad.pkl.chunk01of01",
        ),
        (
            "a temporary",
            |s, g| {
                s.files.insert(
                    format!("models/{g}/pop223/.tmp-77-0-pop223_driving_tinygrad.pkl.chunk01of03"),
                    10,
                );
            },
            "temporary",
            ".tmp-77-0-pop223",
        ),
        (
            "a plain file shadowing the set",
            |s, g| {
                s.files.insert(
                    format!("models/{g}/pop223/pop223_driving_tinygrad.pkl"),
                    2500,
                );
            },
            "shadowing_plain_file",
            "pop223/pop223_driving_tinygrad.pkl",
        ),
        (
            "a model the manifest does not list",
            |s, g| {
                s.files.insert(
                    format!("models/{g}/old1/old1_driving_tinygrad.pkl.chunkmanifest"),
                    1,
                );
            },
            "unlisted",
            "old1/old1_driving_tinygrad.pkl.chunkmanifest",
        ),
        (
            "the manifest gone",
            |s, _| s.manifest = Ok(None),
            "manifest_missing",
            "manifests/model_names_",
        ),
        (
            "a manifest over the release rules",
            |s, g| {
                let mut v: serde_json::Value =
                    serde_json::from_slice(s.manifest.as_ref().unwrap().as_ref().unwrap()).unwrap();
                v["models"][0]["artifact_sha256"] = json!("XYZ");
                let _ = g;
                s.manifest = Ok(Some(serde_json::to_vec(&v).unwrap()));
            },
            "manifest_rule",
            "manifests/model_names_",
        ),
        (
            "another generation's pin",
            |s, g| {
                let other = if g == Generation::new(25) {
                    V26_PIN.to_string()
                } else {
                    pin_of(Generation::new(25))
                };
                s.manifest = Ok(Some(manifest_bytes(g, &other, &["pop223", "gwm8223"])));
            },
            "manifest_pin",
            "manifests/model_names_",
        ),
    ];
    for g in gens() {
        for (what, damage, kind, path) in &cases {
            let mut s = healthy(g, &["pop223", "gwm8223"]);
            damage(&mut s, g);
            let a = audit(&s, g, false);
            let f = a
                .problems
                .iter()
                .find(|f| kind_name(f.kind) == *kind)
                .unwrap_or_else(|| panic!("{g} {what}: no {kind} in {:?}", a.problems));
            assert!(f.path.contains(path), "{g} {what}: {f:?}");
            assert!(f.path.starts_with("/srv/store/"), "{g} {what}: {f:?}");
            if !f.path.contains("manifests/") {
                assert!(f.model.is_some(), "{g} {what}: {f:?}");
            }
            if [
                "other_split",
                "temporary",
                "shadowing_plain_file",
                "unlisted",
            ]
            .contains(kind)
            {
                assert_eq!(
                    f.mend,
                    format!("rm -f -- {}", shell_quote(&f.path)),
                    "{g} {what}"
                );
            } else {
                assert_eq!(
                    f.mend,
                    format!(
                        "release-cli publish --generation {g} --manifest /ws/ready/model_names_{g}.json --artifacts /ws/ready --workspace /ws --to /srv/store"
                    ),
                    "{g} {what}"
                );
            }
            // Every other model stays clean.
            assert!(
                a.problems
                    .iter()
                    .all(|f| f.model.as_ref().is_none_or(|m| m.as_str() != "gwm8223")),
                "{g} {what}: {:?}",
                a.problems
            );
        }
    }
}

#[test]
fn deep_finds_bytes_that_do_not_hash_to_the_manifest() {
    for g in gens() {
        let mut s = healthy(g, &["pop223"]);
        let logical = format!("models/{g}/pop223/pop223_driving_tinygrad.pkl");
        s.digests = Some(BTreeMap::from([(
            logical.clone(),
            Sha256Digest::of_bytes(&data("pop223")),
        )]));
        assert!(audit(&s, g, false).problems.is_empty());
        s.digests = Some(BTreeMap::from([(logical, Sha256Digest::of_bytes(b"x"))]));
        let a = audit(&s, g, false);
        assert_eq!(kinds(&a), ["corrupt"], "{g}");
        assert!(a.deep);
    }
}

fn signed(g: Generation, comment: String, verified: bool) -> Snapshot {
    let mut s = healthy(g, &["pop223"]);
    s.signature = SignatureRead::Checked(Ok(vec![BlockCheck {
        block: 1,
        verified_by: verified.then(|| "ABCDEF0123456789".to_string()),
        comment,
        error: None,
    }]));
    s
}

#[test]
fn the_signature_verifies_and_is_not_near_expiry() {
    for g in gens() {
        let c = |release: u64, expires: u64| {
            format!("generation={g} release={release} expires={expires}")
        };
        // (snapshot, keys given, expected kinds, state)
        let cases: Vec<(Snapshot, bool, Vec<&str>, &str)> = vec![
            (
                signed(g, c(3, NOW + 100 * DAY), true),
                true,
                vec![],
                "verified",
            ),
            (
                signed(g, c(3, NOW + NEAR_EXPIRY_DAYS * DAY), true),
                true,
                vec![],
                "verified",
            ),
            (
                signed(g, c(3, NOW + NEAR_EXPIRY_DAYS * DAY - 1), true),
                true,
                vec!["signature_near_expiry"],
                "verified",
            ),
            (
                signed(g, c(3, NOW - 1), true),
                true,
                vec!["signature_refused"],
                "refused",
            ),
            (
                signed(g, c(3, NOW + 100 * DAY), false),
                true,
                vec!["signature_refused"],
                "refused",
            ),
            (
                signed(
                    g,
                    format!("generation=v24 release=3 expires={}", NOW + 100 * DAY),
                    true,
                ),
                true,
                vec!["signature_refused"],
                "refused",
            ),
            (
                healthy(g, &["pop223"]),
                true,
                vec!["signature_missing"],
                "unsigned",
            ),
            (healthy(g, &["pop223"]), false, vec![], "unsigned"),
            (
                {
                    let mut s = healthy(g, &["pop223"]);
                    s.signature = SignatureRead::NotChecked;
                    s
                },
                false,
                vec![],
                "not_checked",
            ),
        ];
        for (i, (s, keys, want, state)) in cases.iter().enumerate() {
            let a = audit(s, g, *keys);
            assert_eq!(kinds(&a), *want, "{g} case {i}: {:?}", a.problems);
            assert_eq!(a.signature.state, *state, "{g} case {i}");
            for f in &a.problems {
                assert!(
                    f.path.ends_with(&format!("model_names_{g}.json.minisig")),
                    "{f:?}"
                );
                // A signed store, or one that should be, is mended by publishing again with
                // the signing key.
                if *keys || !matches!(s.signature, SignatureRead::Absent) {
                    assert!(f.mend.ends_with("--sign-key /keys/release.key"), "{f:?}");
                }
            }
        }
        let a = audit(&signed(g, c(3, NOW + 3 * DAY), true), g, true);
        assert!(
            a.problems[0].message.contains("(in 3 day(s)"),
            "{:?}",
            a.problems
        );
        assert_eq!(a.signature.release, Some(3));
        assert_eq!(a.signature.expires, Some(NOW + 3 * DAY));
    }
}

#[test]
fn near_expiry_is_fourteen_days() {
    let cases = [
        (NOW + 30 * DAY, None),
        (NOW + 14 * DAY, None),
        (NOW + 14 * DAY - 1, Some(13)),
        (NOW + DAY, Some(1)),
        (NOW + 5, Some(0)),
    ];
    for (expires, want) in cases {
        assert_eq!(
            near_expiry(UnixSeconds(expires), UnixSeconds(NOW)),
            want,
            "{expires}"
        );
    }
}

#[test]
fn stores_of_one_generation_agree() {
    for g in gens() {
        let pins = pins();
        let m = mend();
        let rules = Rules {
            generation: g,
            pins: &pins,
            keys: 0,
            now: UnixSeconds(NOW),
            mend: &m,
        };
        let a = healthy(g, &["pop223", "gwm8223"]);
        let mut b = healthy(g, &["pop223", "gwm8223"]);
        b.store = StoreRef::Hub {
            bucket: "StarPilot-Driving/StarPilot-Resources".into(),
        };
        assert!(compare_stores(&[a.clone(), b.clone()], &rules).is_empty());
        assert!(Report::decide(&[a.clone(), b.clone()], &rules).healthy);

        // The Hub lists an older pop223 and no gwm8223.
        let mut v: serde_json::Value =
            serde_json::from_slice(b.manifest.as_ref().unwrap().as_ref().unwrap()).unwrap();
        v["models"][0]["artifact_sha256"] = json!("a".repeat(64));
        v["models"].as_array_mut().unwrap().truncate(1);
        b.manifest = Ok(Some(Manifest::from_value(v).unwrap().to_canonical_bytes()));
        let found = compare_stores(&[a, b], &rules);
        let k: Vec<_> = found
            .iter()
            .map(|f| (kind_name(f.kind), f.model.as_ref().map(|m| m.to_string())))
            .collect();
        assert_eq!(
            k,
            [
                ("stores_disagree", None),
                ("artifact_digest_differs", Some("gwm8223".into())),
                ("artifact_digest_differs", Some("pop223".into())),
            ],
            "{g}"
        );
        assert!(found[0].path.starts_with(&format!(
            "hf://buckets/StarPilot-Driving/StarPilot-Resources/manifests/model_names_{g}.json"
        )));
        assert!(
            found[0]
                .mend
                .ends_with("--to hf://buckets/StarPilot-Driving/StarPilot-Resources"),
            "{}",
            found[0].mend
        );
    }
}

#[test]
fn remove_commands_name_the_store_s_own_path() {
    let p: StorePath = "models/v26/pop223/pop223_driving_tinygrad.pkl.chunk01of01"
        .parse()
        .unwrap();
    let cases = [
        (
            StoreRef::Local {
                root: "/srv/my store".into(),
            },
            "rm -f -- '/srv/my store/models/v26/pop223/pop223_driving_tinygrad.pkl.chunk01of01'",
        ),
        (
            StoreRef::Hub {
                bucket: "a/b".into(),
            },
            "hf buckets rm hf://buckets/a/b/models/v26/pop223/pop223_driving_tinygrad.pkl.chunk01of01 --yes",
        ),
        (
            StoreRef::Github {
                checkout: "/co".into(),
                branch: "Models".into(),
            },
            "git -C /co rm -q -- v26/pop223/pop223_driving_tinygrad.pkl.chunk01of01 && git -C /co commit -qm 'Remove v26/pop223/pop223_driving_tinygrad.pkl.chunk01of01' && git -C /co push -q origin HEAD:refs/heads/Models",
        ),
    ];
    for (store, want) in cases {
        assert_eq!(store.remove_command(&p), want);
    }
    assert_eq!(shell_quote("it's"), r"'it'\''s'");
}

#[test]
fn expected_artifacts_skip_local_models_and_include_variants() {
    for g in gens() {
        let mut doc: serde_json::Value =
            serde_json::from_slice(&manifest_bytes(g, &pin_of(g), &["pop223", "gwm8223"])).unwrap();
        let mut local = entry("x");
        local["id"] = json!("local-x");
        doc["models"].as_array_mut().unwrap().push(local);
        doc["models"][1]["accelerator_artifacts"] = json!({"chestnut": {
            "artifact_format": "tinygrad_single_v1",
            "artifact_filename": "gwm8223_driving_chestnut_tinygrad.pkl",
            "artifact_size": 10, "artifact_sha256": "b".repeat(64),
            "artifact_chunk_count": 0, "execution_device": "AMD"}});
        let m = Manifest::from_value(doc).unwrap();
        let got: Vec<(String, Option<String>, u32)> = expected_artifacts(&m, g)
            .into_iter()
            .map(|e| (e.logical(), e.variant, e.count))
            .collect();
        assert_eq!(
            got,
            [
                (
                    format!("models/{g}/pop223/pop223_driving_tinygrad.pkl"),
                    None,
                    3
                ),
                (
                    format!("models/{g}/gwm8223/gwm8223_driving_tinygrad.pkl"),
                    None,
                    3
                ),
                (
                    format!("models/{g}/gwm8223/gwm8223_driving_chestnut_tinygrad.pkl"),
                    Some("chestnut".to_string()),
                    0
                ),
            ]
        );
    }
}

#[test]
fn a_variant_is_checked_like_its_model() {
    for g in gens() {
        let mut s = healthy(g, &["gwm8223"]);
        let mut doc: serde_json::Value =
            serde_json::from_slice(s.manifest.as_ref().unwrap().as_ref().unwrap()).unwrap();
        doc["models"][0]["accelerator_artifacts"] = json!({"chestnut": {
            "artifact_format": "tinygrad_single_v1",
            "artifact_filename": "gwm8223_driving_chestnut_tinygrad.pkl",
            "artifact_size": 10, "artifact_sha256": "b".repeat(64),
            "artifact_chunk_count": 0, "execution_device": "AMD"}});
        s.manifest = Ok(Some(
            Manifest::from_value(doc).unwrap().to_canonical_bytes(),
        ));
        let a = audit(&s, g, false);
        assert_eq!(kinds(&a), ["file_missing"], "{g}: {:?}", a.problems);
        let f = &a.problems[0];
        assert_eq!(f.model.as_ref().unwrap().as_str(), "gwm8223");
        assert!(
            f.message.contains("accelerator variant \"chestnut\""),
            "{f:?}"
        );
        assert!(
            f.path.ends_with(&format!(
                "models/{g}/gwm8223/gwm8223_driving_chestnut_tinygrad.pkl"
            )),
            "{f:?}"
        );
        let plain = format!("models/{g}/gwm8223/gwm8223_driving_chestnut_tinygrad.pkl");
        s.files.insert(plain.clone(), 10);
        assert!(audit(&s, g, false).problems.is_empty());
        // A chunk set left of it (it is plain now) is stale.
        s.files.insert(format!("{plain}.chunk01of01"), 10);
        assert_eq!(kinds(&audit(&s, g, false)), ["other_split"]);
        *s.files.get_mut(&plain).unwrap() = 9;
        s.files.remove(&format!("{plain}.chunk01of01"));
        assert_eq!(kinds(&audit(&s, g, false)), ["size_differs"]);
    }
}

/// A name no store path can hold is shown escaped, invalid UTF-8 byte by byte. Pure.
#[test]
fn odd_names_are_shown_escaped() {
    use super::read::escaped;
    let cases: [(&[u8], &str); 6] = [
        (b"plain.bin", "plain.bin"),
        (b"a\tb", "a\\tb"),
        (b"c\\d", "c\\\\d"),
        (b"e\x01f", "e\\u{1}f"),
        (b"g\xffh", "g\\xffh"),
        (b"\xe2\x82", "\\xe2\\x82"),
    ];
    for (raw, shown) in cases {
        assert_eq!(escaped(raw), shown, "{raw:?}");
    }
}

/// Entries no listing shows are problems with their own mend, with a manifest or without; a
/// corrupt artifact names its failing chunk. v25 and a made-up v26.
#[test]
fn odd_entries_and_failing_chunks_are_named() {
    for g in gens() {
        let mut s = healthy(g, &["pop223"]);
        s.odd.insert(
            format!("models/{g}/pop223/a\\tb"),
            OddEntry {
                at: format!("/srv/store/models/{g}/pop223/a\\tb"),
                what: "a name no store path can hold",
                mend: "find /srv/store -mindepth 1 -maxdepth 1 -inum 7 -exec rm -rf -- {} +".into(),
            },
        );
        let a = audit(&s, g, false);
        assert_eq!(kinds(&a), ["odd_name"], "{g}");
        assert!(a.problems[0].message.contains("a\\tb"), "{:?}", a.problems);
        assert!(a.problems[0].mend.contains("-inum 7"));
        assert_eq!(
            a.problems[0].model.as_ref().map(|m| m.as_str()),
            Some("pop223")
        );
        s.manifest = Ok(None);
        assert!(kinds(&audit(&s, g, false)).contains(&"odd_name"), "{g}");

        let mut s = healthy(g, &["pop223"]);
        let name = format!("models/{g}/pop223/pop223_driving_tinygrad.pkl");
        s.digests = Some(BTreeMap::from([(
            name.clone(),
            Sha256Digest::of_bytes(b"other"),
        )]));
        s.failing_chunks.insert(
            name.clone(),
            vec![FailingChunk {
                path: format!("{name}.chunk02of03"),
                sha256: Sha256Digest::of_bytes(b"x"),
                expected: Sha256Digest::of_bytes(b"y"),
                reference: "/ws/ready/pop223/pop223_driving_tinygrad.pkl.chunk02of03".into(),
            }],
        );
        let a = audit(&s, g, false);
        assert_eq!(kinds(&a), ["corrupt"], "{g}");
        assert!(
            a.problems[0].path.ends_with(".chunk02of03"),
            "{:?}",
            a.problems
        );
        assert!(
            a.problems[0].message.contains("failing chunk(s): models/"),
            "{:?}",
            a.problems
        );
    }
}
