//! No publish leaves a stale signature (issue 23 item 4).
//!
//! - A signed publish is interrupted after each of its store effects (every write and delete, in
//!   a local store and a real git remote), and at every one of those states neither store holds
//!   its old signature beside its new manifest: each is (old manifest, old signature), (old
//!   manifest, new signature) or (new manifest, new signature).
//! - An unsigned publish over a signed store is refused before any store effect.
//! - `RemoveSignature` is enumerated the same way: (old, old signature), (old, none), (new,
//!   none) — never the new manifest beside the old signature.

use std::path::Path;

use crate::common::*;
use artifact_store::publish::{PublishOptions, SignatureAction, publish, publish_signed};
use artifact_store::retry::RetryPolicy;
use artifact_store::signing::{self, SigningKey, VerifyingKey};
use artifact_store::{Error, GithubStore, LocalStore, Refusal, Store};
use manifest::{Generation, Manifest, ReleaseNumber};
use test_support::release_stores::{GitRemote, git};

const V25: Generation = Generation::new(25);

fn opts() -> PublishOptions {
    PublishOptions {
        generation: V25,
        dry_run: false,
        retry: RetryPolicy::immediate(1),
        deep_verify: true,
        contract: Default::default(),
    }
}

fn key(dir: &Path) -> SigningKey {
    let kp = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
    let path = dir.join("release.key");
    std::fs::write(&path, kp.sk.to_box(None).unwrap().into_string()).unwrap();
    SigningKey::load(&path, &mut |_| Err("no passphrase in tests".into())).unwrap()
}

fn signature_for(k: &SigningKey, m: &Manifest, release: u64) -> String {
    let comment = signing::new_comment(V25, ReleaseNumber::new(release).unwrap(), 30).unwrap();
    signing::sign_manifest(std::slice::from_ref(k), &m.to_canonical_bytes(), &comment).unwrap()
}

/// What one store serves: (manifest bytes, signature text), as a device would fetch them (the
/// git store is read from its bare remote, not the checkout).
fn served(store: &Served) -> (Option<Vec<u8>>, Option<String>) {
    match store {
        Served::Dir(d) => (
            std::fs::read(d.join("manifests/model_names_v25.json")).ok(),
            std::fs::read_to_string(d.join("manifests/model_names_v25.json.minisig")).ok(),
        ),
        Served::Git(r) => {
            let show = |f: &str| {
                let o = std::process::Command::new("git")
                    .args(["show", &format!("{}:{f}", r.branch)])
                    .current_dir(&r.bare)
                    .output()
                    .unwrap();
                o.status.success().then_some(o.stdout)
            };
            (
                show("model_names_v25.json"),
                show("model_names_v25.json.minisig").map(|b| String::from_utf8(b).unwrap()),
            )
        }
    }
}

enum Served {
    Dir(std::path::PathBuf),
    Git(GitRemote),
}

/// Which signature a store serves: the old, the new, none, or something else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sig {
    Old,
    New,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Man {
    Old,
    New,
}

struct Release {
    old_m: Manifest,
    new_m: Manifest,
    old_sig: String,
    new_sig: String,
    old_dir: std::path::PathBuf,
    new_dir: std::path::PathBuf,
}

fn classify(r: &Release, store: &Served) -> (Man, Sig) {
    let (m, s) = served(store);
    let m = m.expect("a manifest is always served");
    let man = if m == r.old_m.to_canonical_bytes() {
        Man::Old
    } else if m == r.new_m.to_canonical_bytes() {
        Man::New
    } else {
        panic!("a manifest that is neither the old nor the new one")
    };
    let sig = match s {
        None => Sig::None,
        Some(s) if s == r.old_sig => Sig::Old,
        Some(s) if s == r.new_sig => Sig::New,
        Some(s) => panic!("an unexpected signature file: {s}"),
    };
    (man, sig)
}

fn release(dir: &Path, k: &SigningKey) -> Release {
    let old = model("pop223", 1, 2500);
    let new = model("pop223", 2, 3100);
    let other = model("wm9", 3, 900);
    let old_m = manifest_of(vec![
        entry("pop223", &old.data, "Pop"),
        entry("wm9", &other.data, "WM 9"),
    ]);
    let new_m = manifest_of(vec![
        entry("pop223", &new.data, "Pop"),
        entry("wm9", &other.data, "WM 9"),
    ]);
    Release {
        old_sig: signature_for(k, &old_m, 1),
        new_sig: signature_for(k, &new_m, 2),
        old_dir: artifacts_dir(&dir.join("old"), &[&old, &other]),
        new_dir: artifacts_dir(&dir.join("new"), &[&new]),
        old_m,
        new_m,
    }
}

/// A local store and a git remote holding the old release, signed: (dir, remote).
fn signed_base(dir: &Path, r: &Release) -> (std::path::PathBuf, GitRemote) {
    let local = dir.join("local");
    let remote = GitRemote::new(&dir.join("git"), "Models", None);
    let gh = GithubStore::open(&remote.checkout, "Models").unwrap();
    publish_signed(
        &r.old_m,
        &r.old_dir,
        &[&LocalStore::new(&local), &gh],
        &opts(),
        SignatureAction::Sign(r.old_sig.as_bytes()),
        &mut |_| {},
    )
    .unwrap();
    (local, remote)
}

/// Run `action`'s publish of the new release with the local store killed after `budget.0`
/// effects and the git store after `budget.1`, from a fresh signed base; the states served.
fn run_killed(
    root: &Path,
    r: &Release,
    action: SignatureAction<'_>,
    budget: (Option<u32>, Option<u32>),
) -> (bool, [(Man, Sig); 2], (u32, u32)) {
    let (local, remote) = signed_base(root, r);
    let a = Recording::killable(LocalStore::new(&local), budget.0);
    let b = Recording::killable(
        GithubStore::open(&remote.checkout, "Models").unwrap(),
        budget.1,
    );
    let ok = publish_signed(
        &r.new_m,
        &r.new_dir,
        &[&a, &b],
        &opts(),
        action,
        &mut |_| {},
    )
    .is_ok();
    let effects = (a.writes().len() as u32, b.writes().len() as u32);
    let states = [
        classify(r, &Served::Dir(local)),
        classify(r, &Served::Git(remote)),
    ];
    (ok, states, effects)
}

/// Every kill point of a publish with `action`: each store's served state at each, checked by
/// `allowed`. Returns the states seen, in order.
fn enumerate(
    t: &Path,
    r: &Release,
    action: SignatureAction<'_>,
    allowed: &[(Man, Sig)],
) -> Vec<[(Man, Sig); 2]> {
    let (ok, last, (na, nb)) = run_killed(&t.join("full"), r, action, (None, None));
    assert!(ok);
    assert!(na >= 2 && nb >= 2, "{na} {nb}");
    let mut seen = Vec::new();
    for k in 0..=(na + nb) {
        let budget = if k < na {
            (Some(k), Some(0))
        } else {
            (None, Some(k - na))
        };
        let (ok, states, _) = run_killed(&t.join(format!("k{k}")), r, action, budget);
        assert_eq!(ok, k == na + nb, "kill point {k}");
        for (store, state) in ["local", "git"].iter().zip(states) {
            assert!(
                allowed.contains(&state),
                "kill point {k}: {store} serves {state:?}"
            );
        }
        seen.push(states);
    }
    assert_eq!(seen.last(), Some(&last));
    seen
}

#[test]
fn a_signed_publish_never_serves_the_old_signature_beside_the_new_manifest() {
    let t = tempfile::tempdir().unwrap();
    let k = key(t.path());
    let r = release(t.path(), &k);
    let seen = enumerate(
        t.path(),
        &r,
        SignatureAction::Sign(r.new_sig.as_bytes()),
        &[
            (Man::Old, Sig::Old),
            (Man::Old, Sig::New),
            (Man::New, Sig::New),
        ],
    );
    // The window state exists (the enumeration reached it) and the end is new and new.
    assert!(seen.iter().any(|s| s[0] == (Man::Old, Sig::New)));
    assert!(seen.iter().any(|s| s[1] == (Man::Old, Sig::New)));
    assert_eq!(seen.last().unwrap(), &[(Man::New, Sig::New); 2]);
    // What is served at the end verifies, for both stores.
    let v = [VerifyingKey::from(&k)];
    let checks = signing::check_signature(&v, &r.new_m.to_canonical_bytes(), &r.new_sig).unwrap();
    assert!(checks[0].verified_by.is_some());
}

#[test]
fn removing_the_signature_removes_it_before_the_manifest_changes() {
    let t = tempfile::tempdir().unwrap();
    let k = key(t.path());
    let r = release(t.path(), &k);
    let seen = enumerate(
        t.path(),
        &r,
        SignatureAction::RemoveSignature {
            reason: "key lost; re-signing with a new key tomorrow",
        },
        &[
            (Man::Old, Sig::Old),
            (Man::Old, Sig::None),
            (Man::New, Sig::None),
        ],
    );
    assert!(seen.iter().any(|s| s[0] == (Man::Old, Sig::None)));
    assert_eq!(seen.last().unwrap(), &[(Man::New, Sig::None); 2]);
}

#[test]
fn an_unsigned_publish_over_a_signed_store_is_refused_before_any_effect() {
    let t = tempfile::tempdir().unwrap();
    let k = key(t.path());
    let r = release(t.path(), &k);
    let (local, remote) = signed_base(t.path(), &r);
    let head = git(&remote.bare, &["rev-parse", "Models"]);
    // An unsigned store first, then the signed ones: refused before the first is touched.
    let fresh = Recording::new(LocalStore::new(t.path().join("fresh")));
    let a = Recording::new(LocalStore::new(&local));
    let b = Recording::new(GithubStore::open(&remote.checkout, "Models").unwrap());
    for stores in [vec![&fresh as &dyn Store, &a, &b], vec![&b as &dyn Store]] {
        let e = publish(&r.new_m, &r.new_dir, &stores, &opts(), &mut |_| {}).unwrap_err();
        let Error::Refused(Refusal::SignedStore { path, .. }) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(path.as_str(), "manifests/model_names_v25.json.minisig");
        let text = e.to_string();
        let next = cli_support::NextStep::next_step(&e).unwrap_or_default();
        assert!(
            text.contains("--sign-key")
                && next.starts_with("add --sign-key")
                && next.contains("--remove-signature"),
            "{text}\nnext: {next}"
        );
        // A dry run is refused the same way.
        let mut dry = opts();
        dry.dry_run = true;
        assert!(publish(&r.new_m, &r.new_dir, &stores, &dry, &mut |_| {}).is_err());
    }
    assert!(fresh.writes().is_empty() && a.writes().is_empty() && b.writes().is_empty());
    assert!(!t.path().join("fresh").exists());
    assert_eq!(git(&remote.bare, &["rev-parse", "Models"]), head);
    assert_eq!(classify(&r, &Served::Dir(local)), (Man::Old, Sig::Old));
    assert_eq!(classify(&r, &Served::Git(remote)), (Man::Old, Sig::Old));
}

/// The same order on the Hub, through the real `hf` CLI against the Hub emulator: every Hub
/// effect is one atomic operation, so the sequence of operations fixes every kill-point state.
/// Signed: the new signature is added before the manifest. Unsigned over the signed bucket:
/// refused with no operation. RemoveSignature: the signature is deleted before the manifest.
#[test]
fn on_the_hub_the_signature_moves_before_the_manifest_and_is_never_left_stale() {
    use artifact_store::{HfBucketStore, HfConfig};
    use test_support::hub::{HubConfig, HubEmulator, HubOp, real_hf_cli};
    let Some(cli) = real_hf_cli() else { return };
    const BUCKET: &str = "StarPilot-Driving/StarPilot-Resources";
    let t = tempfile::tempdir().unwrap();
    let k = key(t.path());
    let r = release(t.path(), &k);
    let emu = HubEmulator::start(HubConfig::default()).unwrap();
    emu.create_bucket(BUCKET);
    let hub = HfBucketStore::new(
        BUCKET,
        HfConfig {
            endpoint: emu.url(),
            token: Some(emu.token().to_string()),
            cli,
            timeout: std::time::Duration::from_secs(20),
        },
    )
    .unwrap();
    let (manifest, sig) = (
        "manifests/model_names_v25.json",
        "manifests/model_names_v25.json.minisig",
    );
    let ops_on = |paths: &[&str]| -> Vec<HubOp> {
        emu.ops()
            .into_iter()
            .filter(|op| match op {
                HubOp::Add { path, .. } | HubOp::Delete { path, .. } => {
                    paths.contains(&path.as_str())
                }
                _ => false,
            })
            .collect()
    };
    let add = |p: &str| HubOp::Add {
        bucket: BUCKET.into(),
        path: p.into(),
    };
    let delete = |p: &str| HubOp::Delete {
        bucket: BUCKET.into(),
        path: p.into(),
    };

    publish_signed(
        &r.old_m,
        &r.old_dir,
        &[&hub],
        &opts(),
        SignatureAction::Sign(r.old_sig.as_bytes()),
        &mut |_| {},
    )
    .unwrap();
    emu.clear_log();
    publish_signed(
        &r.new_m,
        &r.new_dir,
        &[&hub],
        &opts(),
        SignatureAction::Sign(r.new_sig.as_bytes()),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(ops_on(&[manifest, sig]), [add(sig), add(manifest)]);
    assert_eq!(emu.bucket_file(BUCKET, sig).unwrap(), r.new_sig.as_bytes());

    // Unsigned over the signed bucket: refused, not one operation.
    emu.clear_log();
    let e = publish(&r.old_m, &r.old_dir, &[&hub], &opts(), &mut |_| {}).unwrap_err();
    assert!(
        matches!(e, Error::Refused(Refusal::SignedStore { .. })),
        "{e:?}"
    );
    assert!(emu.ops().is_empty(), "{:?}", emu.ops());

    // Unsigned on purpose: the signature goes first, then the manifest.
    publish_signed(
        &r.old_m,
        &r.old_dir,
        &[&hub],
        &opts(),
        SignatureAction::RemoveSignature { reason: "test" },
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(ops_on(&[manifest, sig]), [delete(sig), add(manifest)]);
    assert!(emu.bucket_file(BUCKET, sig).is_none());
}
