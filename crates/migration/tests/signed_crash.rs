//! Crash safety of a signed refresh, by enumeration: with trusted keys a refresh has two more
//! effects before it stores the catalog (the accepted release written, an old refusal report
//! removed). Crash right after each effect of the whole refresh, rerun, and require the state an
//! uninterrupted run leaves, including the accepted release.

use std::collections::BTreeMap;
use std::fs;
use std::io::Cursor;
use std::path::Path;

use crate::common::{Fixture, Origin, refresh};
use crate::crash_enumeration::{Enumeration, Uninterrupted, enumerate};
use downloader::trust::TrustedKeys;
use migration::Effects;

#[test]
fn a_crash_after_any_effect_of_a_signed_refresh_then_a_rerun_ends_as_an_uninterrupted_one() {
    let origin = Origin::start();
    let root = origin.dir.path().join("origin");
    let manifest = fs::read(root.join("hf/manifests/model_names_v25.json")).unwrap();
    let kp = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
    let expires = manifest::UnixSeconds::now().plus_days(1).unwrap();
    let sig = minisign::sign(
        Some(&kp.pk),
        &kp.sk,
        Cursor::new(&manifest),
        Some(&format!("generation=v25 release=2 expires={expires}")),
        None,
    )
    .unwrap()
    .into_string();
    fs::write(root.join("hf/manifests/model_names_v25.json.minisig"), &sig).unwrap();
    fs::write(root.join("gh/model_names_v25.json.minisig"), &sig).unwrap();
    let keys =
        TrustedKeys::parse(&kp.pk.to_box().unwrap().into_string(), Path::new("k.pub")).unwrap();
    let dl = || origin.downloader().with_trusted_keys(keys.clone());

    // A v24 device that accepted release 1 and then saw a refused manifest.
    let params: &[(&str, &str)] = &[("Model", "pop22"), ("DrivingModel", "pop22")];
    let start = || {
        let f = Fixture::v24(params);
        fs::write(
            f.models().join(".accepted-release.json"),
            r#"{"v25": {"release": 1, "expires": 4102444800, "key": "old"}}"#,
        )
        .unwrap();
        fs::write(f.models().join(".refused-manifest.json"), "{}").unwrap();
        f
    };

    let run = |f: &Fixture, effects: Effects| refresh(&f.device_with(effects), &dl());
    // The stored catalog is never newer than the accepted release that guards it: a crash
    // between the two must not let a replayed release 1 in afterwards.
    let catalog_guarded = |f: &Fixture, want: &BTreeMap<String, String>, ctx: &str| {
        if f.snapshot().get("models/.catalog.json") == want.get("models/.catalog.json") {
            let floor = fs::read_to_string(f.models().join(".accepted-release.json")).unwrap();
            assert!(floor.contains("\"release\": 2"), "{ctx}: {floor}");
        }
    };
    let Uninterrupted { log, end: want } = enumerate(&Enumeration {
        after_crash: &catalog_guarded,
        ..Enumeration::new(&origin, "signed refresh", &start, &run)
    });
    assert_eq!(
        &log[..2],
        [
            "write .accepted-release.json",
            "remove .refused-manifest.json"
        ],
        "{log:?}"
    );
    assert!(
        want["models/.accepted-release.json"].contains("\"release\": 2"),
        "{want:?}"
    );
    eprintln!(
        "crashed after each of {} effects of a signed refresh",
        log.len()
    );
}
