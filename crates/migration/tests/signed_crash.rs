//! Crash safety of a signed refresh, by enumeration: with trusted keys a refresh stores the
//! catalog beside its signature (the signature file with the new and the old block, the
//! catalog, the signature file with the new block alone), then raises the accepted release
//! (file, then its param mirror), then removes an old refusal report. Crash right after each
//! effect of the whole refresh and require, at that instant, that the stored catalog verifies
//! under the keys (so `resolve` never loses it) and that a replayed older release is refused as
//! soon as the newer catalog is stored; then rerun and require the state an uninterrupted run
//! leaves, including both copies of the accepted release.

use std::fs;
use std::io::Cursor;
use std::path::Path;

use crate::common::{Fixture, Origin, refresh};
use crate::crash_enumeration::{Enumeration, Uninterrupted, enumerate};
use downloader::trust::TrustedKeys;
use migration::{Device, Effects};

const RELEASE_PARAM: &str = "ModelManifestAcceptedRelease";

fn sign(kp: &minisign::KeyPair, data: &[u8], release: u64) -> String {
    let expires = manifest::UnixSeconds::now().plus_days(1).unwrap().0;
    minisign::sign(
        Some(&kp.pk),
        &kp.sk,
        Cursor::new(data),
        Some(&format!(
            "generation=v25 release={release} expires={expires}"
        )),
        None,
    )
    .unwrap()
    .into_string()
}

fn serve_signed(origin: &Origin, manifest: &[u8], sig: &str) {
    let root = origin.dir.path().join("origin");
    fs::write(root.join("hf/manifests/model_names_v25.json"), manifest).unwrap();
    fs::write(root.join("gh/model_names_v25.json"), manifest).unwrap();
    fs::write(root.join("hf/manifests/model_names_v25.json.minisig"), sig).unwrap();
    fs::write(root.join("gh/model_names_v25.json.minisig"), sig).unwrap();
}

#[test]
fn a_crash_after_any_effect_of_a_signed_refresh_then_a_rerun_ends_as_an_uninterrupted_one() {
    let kp = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
    let keys =
        TrustedKeys::parse(&kp.pk.to_box().unwrap().into_string(), Path::new("k.pub")).unwrap();
    // Release 2 is served; release 1 is the same catalog in other bytes (compact JSON), which
    // the device stored earlier and a second origin replays.
    let origin = Origin::start();
    let root = origin.dir.path().join("origin");
    let m2 = fs::read(root.join("hf/manifests/model_names_v25.json")).unwrap();
    let m1 = serde_json::to_vec(&origin.manifest).unwrap();
    assert_ne!(m1, m2);
    let (s1, s2) = (sign(&kp, &m1, 1), sign(&kp, &m2, 2));
    serve_signed(&origin, &m2, &s2);
    let replay = Origin::start();
    serve_signed(&replay, &m1, &s1);

    let with_keys = |mut d: Device| {
        d.trusted_keys = Some(keys.clone());
        d
    };
    let dl = |o: &Origin| o.downloader().with_trusted_keys(keys.clone());

    // A v24 device that stored release 1's signed catalog (an earlier build: the accepted
    // release in the file only, no param mirror yet) and then saw a refused manifest.
    let params: &[(&str, &str)] = &[("Model", "pop22"), ("DrivingModel", "pop22")];
    let start = || {
        let f = Fixture::v24(params);
        fs::write(f.models().join(".catalog.json"), &m1).unwrap();
        fs::write(f.models().join(".catalog.json.minisig"), &s1).unwrap();
        fs::write(
            f.models().join(".accepted-release.json"),
            r#"{"v25": {"release": 1, "expires": 4102444800, "key": "old"}}"#,
        )
        .unwrap();
        fs::write(f.models().join(".refused-manifest.json"), "{}").unwrap();
        f
    };

    let run =
        |f: &Fixture, effects: Effects| refresh(&with_keys(f.device_with(effects)), &dl(&origin));
    let after_crash = |f: &Fixture, want: &crate::crash_enumeration::Snapshot, ctx: &str| {
        let device = with_keys(f.device());
        // The stored catalog verifies at every instant: old bytes by the old block, new by
        // the new one, never below the accepted release.
        let catalog = device.catalog();
        assert!(matches!(catalog, Ok(Some(_))), "{ctx}: {catalog:?}");
        // Once the newer catalog is stored, release 1 is a replay, whatever the floor copies
        // say yet (checked with the dry run, which writes nothing).
        let newer_stored =
            f.snapshot().get("models/.catalog.json") == want.get("models/.catalog.json");
        let replayed =
            migration::run::preview::refresh(&device, &migration::Run::new(&dl(&replay)));
        assert_eq!(
            replayed.is_err(),
            newer_stored,
            "{ctx}: {:?}",
            replayed.err()
        );
    };
    let Uninterrupted { log, end: want } = enumerate(&Enumeration {
        after_crash: &after_crash,
        ..Enumeration::new(&origin, "signed refresh", &start, &run)
    });
    let param_effects: Vec<&String> = log
        .iter()
        .filter(|e| e.starts_with(&format!("param {RELEASE_PARAM}=")))
        .collect();
    assert_eq!(param_effects.len(), 2, "{log:?}");
    // First the upgrade: the param mirror is written from the file (release 1), before the
    // fetch; then the refresh's own effects.
    assert!(param_effects[0].contains("\"release\":1"), "{log:?}");
    assert_eq!(
        &log[..7],
        [
            param_effects[0].as_str(),
            "write .catalog.json.minisig",
            "write .catalog.json",
            "write .catalog.json.minisig",
            "write .accepted-release.json",
            param_effects[1].as_str(),
            "remove .refused-manifest.json",
        ],
        "{log:?}"
    );
    assert!(
        want["models/.accepted-release.json"].contains("\"release\": 2"),
        "{want:?}"
    );
    assert!(
        want[&format!("d/{RELEASE_PARAM}")].contains("\"release\":2"),
        "{want:?}"
    );
    assert_eq!(want["models/.catalog.json.minisig"], s2);
    eprintln!(
        "crashed after each of {} effects of a signed refresh",
        log.len()
    );
}

/// (what, catalog bytes, signature file, floor file's release, floor param's release, want)
type Case<'a> = (
    &'a str,
    Vec<u8>,
    Option<String>,
    u64,
    Option<u64>,
    Option<bool>,
);

/// The rule for the device's own copy, for v25 and a made-up v26: the stored catalog is used
/// only when the signature kept beside it verifies over its exact bytes under a trusted key,
/// for this generation (another generation's is "no catalog", as without keys), at a release
/// not below the higher floor copy; an expired signature still verifies (the copy was accepted
/// while valid, and the device must work offline).
#[test]
fn the_stored_catalog_rule_for_v25_and_a_made_up_v26() {
    let kp = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
    let other = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
    let keys =
        TrustedKeys::parse(&kp.pk.to_box().unwrap().into_string(), Path::new("k.pub")).unwrap();
    let signed = |kp: &minisign::KeyPair, data: &[u8], comment: String| {
        minisign::sign(
            Some(&kp.pk),
            &kp.sk,
            Cursor::new(data),
            Some(&comment),
            None,
        )
        .unwrap()
        .into_string()
    };
    let later = manifest::UnixSeconds::now().plus_days(1).unwrap();
    for n in [25u32, 26] {
        let g = manifest::Generation::new(n);
        let dir = crate::common::scratch();
        let mut device = Device::new(migration::DeviceConfig {
            data_dir: dir.path().join("data"),
            memory_params_dir: dir.path().join("shm"),
            builtin_dir: dir.path().join("builtin"),
            generation: g,
        });
        device.trusted_keys = Some(keys.clone());
        let models = device.models_dir();
        fs::create_dir_all(&models).unwrap();
        // No `generation` field: the signed comment binds the generation.
        let body = br#"{"models": [{"id": "pop223", "name": "Pop", "version": "v16",
            "series": "S", "released": "2025-01-01", "community_favorite": false}]}"#;
        let comment = |for_gen: &str, release: u64, expires: u64| {
            format!("generation={for_gen} release={release} expires={expires}")
        };
        let floor = |file: u64, param: Option<u64>| {
            fs::write(
                models.join(".accepted-release.json"),
                format!(r#"{{"{g}": {{"release": {file}, "expires": 0, "key": "k"}}}}"#),
            )
            .unwrap();
            let p = dir.path().join("data/params/d");
            fs::create_dir_all(&p).unwrap();
            match param {
                Some(r) => fs::write(
                    p.join(RELEASE_PARAM),
                    format!(r#"{{"{g}": {{"release": {r}, "expires": 0, "key": "k"}}}}"#),
                )
                .unwrap(),
                None => {
                    let _ = fs::remove_file(p.join(RELEASE_PARAM));
                }
            }
        };
        let mut tampered = body.to_vec();
        tampered[20] = b'P';
        // (catalog bytes, signature or none, floor file, floor param) -> Some(true) used,
        // Some(false) "no catalog", None refused (CatalogNotTrusted).
        let g_s = g.to_string();
        let cases: Vec<Case> = vec![
            (
                "signed",
                body.to_vec(),
                Some(signed(&kp, body, comment(&g_s, 3, later.0))),
                3,
                Some(3),
                Some(true),
            ),
            (
                "newer than the floor",
                body.to_vec(),
                Some(signed(&kp, body, comment(&g_s, 4, later.0))),
                3,
                Some(3),
                Some(true),
            ),
            (
                "expired",
                body.to_vec(),
                Some(signed(&kp, body, comment(&g_s, 3, 1))),
                3,
                Some(3),
                Some(true),
            ),
            (
                "edited",
                tampered.clone(),
                Some(signed(&kp, body, comment(&g_s, 3, later.0))),
                3,
                Some(3),
                None,
            ),
            ("no signature", body.to_vec(), None, 3, Some(3), None),
            (
                "another key",
                body.to_vec(),
                Some(signed(&other, body, comment(&g_s, 3, later.0))),
                3,
                Some(3),
                None,
            ),
            (
                "older than the param",
                body.to_vec(),
                Some(signed(&kp, body, comment(&g_s, 2, later.0))),
                1,
                Some(3),
                None,
            ),
            (
                "older than the file",
                body.to_vec(),
                Some(signed(&kp, body, comment(&g_s, 2, later.0))),
                3,
                None,
                None,
            ),
            (
                "a damaged block before the good one",
                body.to_vec(),
                Some(format!(
                    "untrusted comment: damaged\nRWQAAAAA\ntrusted comment: {}\nAAAA\n{}",
                    comment(&g_s, 3, later.0),
                    signed(&kp, body, comment(&g_s, 3, later.0))
                )),
                3,
                Some(3),
                Some(true),
            ),
            (
                "a block without its untrusted comment line before the good one",
                body.to_vec(),
                Some(format!(
                    "RWQAAAAA\ntrusted comment: {}\nAAAA\n{}",
                    comment(&g_s, 3, later.0),
                    signed(&kp, body, comment(&g_s, 3, later.0))
                )),
                3,
                Some(3),
                Some(true),
            ),
            (
                "a good block followed by a stray line",
                body.to_vec(),
                Some(format!(
                    "{}stray line\n",
                    signed(&kp, body, comment(&g_s, 3, later.0))
                )),
                3,
                Some(3),
                Some(true),
            ),
            (
                "only a damaged block",
                body.to_vec(),
                Some(format!(
                    "untrusted comment: damaged\nRWQAAAAA\ntrusted comment: {}\nAAAA\n",
                    comment(&g_s, 3, later.0)
                )),
                3,
                Some(3),
                None,
            ),
            (
                "another generation",
                body.to_vec(),
                Some(signed(&kp, body, comment("v24", 3, later.0))),
                3,
                Some(3),
                Some(false),
            ),
        ];
        for (what, bytes, sig, file, param, want) in cases {
            fs::write(models.join(".catalog.json"), &bytes).unwrap();
            match &sig {
                Some(s) => fs::write(models.join(".catalog.json.minisig"), s).unwrap(),
                None => {
                    let _ = fs::remove_file(models.join(".catalog.json.minisig"));
                }
            }
            floor(file, param);
            let got = device.catalog();
            let ctx = format!("{g} {what}: {got:?}");
            match want {
                Some(true) => {
                    let m = got.unwrap().expect(&ctx);
                    assert_eq!(m.generation(), Some(g), "{ctx}");
                    assert_eq!(m.models().len(), 1, "{ctx}");
                }
                Some(false) => assert!(matches!(got, Ok(None)), "{ctx}"),
                None => assert!(
                    matches!(got, Err(migration::Error::CatalogNotTrusted { .. })),
                    "{ctx}"
                ),
            }
        }
    }
}
