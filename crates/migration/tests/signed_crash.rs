//! Crash safety of a signed refresh, by enumeration: with trusted keys a refresh has two more
//! effects before it stores the catalog (the accepted release written, an old refusal report
//! removed). Crash right after each effect of the whole refresh, rerun, and require the state an
//! uninterrupted run leaves, including the accepted release.

use std::fs;
use std::io::Cursor;
use std::path::Path;

use crate::common::{Fixture, Origin};
use downloader::CancelToken;
use downloader::trust::TrustedKeys;
use migration::{Effects, Error};

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

    let clean = start();
    let effects = Effects::recording();
    migration::refresh(
        &clean.device_with(effects.clone()),
        &dl(),
        &CancelToken::new(),
        &|_| {},
    )
    .unwrap();
    let want = clean.snapshot();
    let log = effects.log();
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
    for (n, what) in log.iter().enumerate() {
        let f = start();
        let ctx = format!("crash after effect {n} ({what})");
        match migration::refresh(
            &f.device_with(Effects::crash_after(n)),
            &dl(),
            &CancelToken::new(),
            &|_| {},
        ) {
            Err(Error::Crashed { effect, .. }) => assert_eq!(effect, n, "{ctx}"),
            other => panic!("{ctx}: expected the simulated crash, got {other:?}"),
        }
        // The stored catalog is never newer than the accepted release that guards it: a crash
        // between the two must not let a replayed release 1 in afterwards.
        if f.snapshot().get("models/.catalog.json") == want.get("models/.catalog.json") {
            let floor = fs::read_to_string(f.models().join(".accepted-release.json")).unwrap();
            assert!(floor.contains("\"release\": 2"), "{ctx}: {floor}");
        }
        migration::refresh(&f.device(), &dl(), &CancelToken::new(), &|_| {})
            .unwrap_or_else(|e| panic!("{ctx}: rerun failed: {e}"));
        assert_eq!(f.snapshot(), want, "{ctx}: rerun ends elsewhere");
    }
    eprintln!(
        "crashed after each of {} effects of a signed refresh",
        log.len()
    );
}
