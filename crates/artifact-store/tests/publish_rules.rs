//! Publish's release rules about accelerator variants and fixed fields, for v25 and a made-up
//! v26 (made-up pin), against a real local directory store and a real git remote. Every
//! refusal is shown to change nothing in the store.

use std::path::{Path, PathBuf};

use crate::common::*;
use artifact_store::publish::{PublishOptions, StoreProblemKind, publish};
use artifact_store::retry::RetryPolicy;
use artifact_store::{Error, GithubStore, LocalStore, Store};
use manifest::{Generation, GitCommit, Manifest, PinTable};
use serde_json::{Value, json};
use test_support::release_stores::GitRemote;

/// A made-up next generation's pin.
const V26_PIN: &str = "26a0c0ffee26a0c0ffee26a0c0ffee26a0c0ffee";

/// The two generations every rule is tested for: (generation, pin, pin table knowing it).
fn generations() -> Vec<(Generation, GitCommit, PinTable)> {
    let v25 = Generation::new(25);
    let v26 = Generation::new(26);
    let builtin = PinTable::builtin();
    let pin25 = builtin.get(v25).unwrap().clone();
    let pin26: GitCommit = V26_PIN.parse().unwrap();
    let mut with26 = PinTable::builtin();
    with26.record(v26, &pin26).unwrap();
    vec![(v25, pin25, builtin), (v26, pin26, with26)]
}

fn opts(generation: Generation, pins: &PinTable) -> PublishOptions {
    PublishOptions {
        generation,
        dry_run: false,
        retry: RetryPolicy::immediate(2),
        deep_verify: true,
        contract: artifact_store::publish::Contract {
            pins: pins.clone(),
            ..Default::default()
        },
    }
}

fn manifest_for(generation: Generation, pin: &GitCommit, entries: Vec<Value>) -> Manifest {
    Manifest::from_value(json!({
        "generation": generation.to_string(),
        "tinygrad_commit": pin.to_string(),
        "models": entries,
    }))
    .unwrap()
}

/// `entry` with a `chestnut` variant of `variant` (one plain file, as v25's are).
fn with_variant(mut e: Value, id: &str, variant: &[u8]) -> Value {
    e["accelerator_artifacts"] = json!({"chestnut": {
        "artifact_format": "tinygrad_single_v1",
        "artifact_filename": format!("{id}_driving_chestnut_tinygrad.pkl"),
        "artifact_size": variant.len(),
        "artifact_sha256": chunker::Sha256Digest::of_bytes(variant).to_hex(),
        "artifact_chunk_count": 0,
        "execution_device": "AMD"
    }});
    e
}

fn put_variant(artifacts: &Path, id: &str, bytes: &[u8]) -> PathBuf {
    let p = artifacts
        .join(id)
        .join(format!("{id}_driving_chestnut_tinygrad.pkl"));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Every file under `dir` with its bytes (a store's full state).
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd {
            let e = e.unwrap();
            let p = e.path();
            if e.file_name() == ".git" {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push((
                    p.strip_prefix(root).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn variant_problem(err: &Error) -> bool {
    matches!(err, Error::Incomplete { problems, .. }
        if problems.iter().any(|p| matches!(p.kind, StoreProblemKind::Variant { .. })))
}

#[test]
fn a_variant_missing_everywhere_is_refused_before_any_upload_local_and_git() {
    for (generation, pin, pins) in generations() {
        let t = tempfile::tempdir().unwrap();
        let a = model("gwm8223", 31, 2500);
        let variant = bytes(32, 1800);
        let dir = artifacts_dir(t.path(), &[&a]);
        let m = manifest_for(
            generation,
            &pin,
            vec![with_variant(
                entry("gwm8223", &a.data, "GWM"),
                "gwm8223",
                &variant,
            )],
        );

        // A local store: no write at all, the directory never created.
        let root = t.path().join("store");
        let store = Recording::new(LocalStore::new(&root));
        let err = publish(&m, &dir, &[&store], &opts(generation, &pins), &mut |_| {}).unwrap_err();
        let msg = err.to_string();
        assert!(variant_problem(&err), "{generation}: {msg}");
        assert!(
            msg.contains("accelerator variant \"chestnut\"")
                && msg.contains(&format!(
                    "models/{generation}/gwm8223/gwm8223_driving_chestnut_tinygrad.pkl is missing"
                ))
                && msg.contains("next: put the variant's file in --artifacts gwm8223/"),
            "{generation}: {msg}"
        );
        assert!(
            store.writes().is_empty(),
            "{generation}: {:?}",
            store.writes()
        );
        assert!(!root.exists());

        // A git store: no commit, no push, the checkout unchanged.
        let remote = GitRemote::new(&t.path().join("gh"), "Models", None);
        let before_subjects = remote.remote_subjects();
        let before = snapshot(&remote.checkout);
        let gh = GithubStore::open(&remote.checkout, "Models").unwrap();
        let err = publish(&m, &dir, &[&gh], &opts(generation, &pins), &mut |_| {}).unwrap_err();
        assert!(variant_problem(&err), "{generation}: {err}");
        assert_eq!(remote.remote_subjects(), before_subjects, "{generation}");
        assert_eq!(snapshot(&remote.checkout), before, "{generation}");
    }
}

#[test]
fn a_variant_in_the_artifacts_is_uploaded_and_then_found_in_the_store() {
    for (generation, pin, pins) in generations() {
        let t = tempfile::tempdir().unwrap();
        let a = model("sc23", 33, 2100);
        let variant = bytes(34, 1700);
        let dir = artifacts_dir(t.path(), &[&a]);
        put_variant(&dir, "sc23", &variant);
        let m = manifest_for(
            generation,
            &pin,
            vec![with_variant(entry("sc23", &a.data, "SC"), "sc23", &variant)],
        );
        let root = t.path().join("store");
        let store = Recording::new(LocalStore::new(&root));
        publish(&m, &dir, &[&store], &opts(generation, &pins), &mut |_| {}).unwrap();
        let vpath = format!("models/{generation}/sc23/sc23_driving_chestnut_tinygrad.pkl");
        let writes = store.writes();
        assert!(
            writes.contains(&format!("write {vpath}")),
            "{generation}: {writes:?}"
        );
        assert_eq!(
            writes.last().unwrap(),
            &format!("write manifests/model_names_{generation}.json")
        );
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut store.open(&p(&vpath)).unwrap(), &mut got).unwrap();
        assert_eq!(got, variant);

        // Already in the store: an empty <id>/ (nothing to upload) passes the check.
        let empty = t.path().join("again");
        std::fs::create_dir_all(empty.join("sc23")).unwrap();
        let again = Recording::new(LocalStore::new(&root));
        publish(&m, &empty, &[&again], &opts(generation, &pins), &mut |_| {}).unwrap();
        assert!(
            again.writes().is_empty(),
            "{generation}: {:?}",
            again.writes()
        );
    }
}

#[test]
fn a_variant_that_is_no_oob_container_is_refused_from_the_artifacts_and_in_the_store() {
    for (generation, pin, pins) in generations() {
        let t = tempfile::tempdir().unwrap();
        let a = model("pop223", 35, 1500);
        let plain = test_support::published::random_bytes(36, 1200);
        let dir = artifacts_dir(t.path(), &[&a]);
        put_variant(&dir, "pop223", &plain);
        let m = manifest_for(
            generation,
            &pin,
            vec![with_variant(
                entry("pop223", &a.data, "Pop"),
                "pop223",
                &plain,
            )],
        );
        let root = t.path().join("store");
        let store = Recording::new(LocalStore::new(&root));
        let err = publish(&m, &dir, &[&store], &opts(generation, &pins), &mut |_| {}).unwrap_err();
        assert!(
            err.to_string()
                .contains("pop223_driving_chestnut_tinygrad.pkl"),
            "{err}"
        );
        assert!(
            store.writes().is_empty(),
            "{generation}: {:?}",
            store.writes()
        );

        // The same bytes already in the store (put there by hand): refused too, nothing written.
        let vdir = root.join(format!("models/{generation}/pop223"));
        std::fs::create_dir_all(&vdir).unwrap();
        std::fs::write(vdir.join("pop223_driving_chestnut_tinygrad.pkl"), &plain).unwrap();
        let before = snapshot(&root);
        let only_main = artifacts_dir(&t.path().join("main"), &[&a]);
        let store = Recording::new(LocalStore::new(&root));
        let err = publish(
            &m,
            &only_main,
            &[&store],
            &opts(generation, &pins),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(
            matches!(&err, Error::Incomplete { problems, .. } if problems.iter().any(|p| matches!(
                &p.kind,
                StoreProblemKind::Variant { problem, .. } if matches!(**problem, StoreProblemKind::NotOob(_))
            ))),
            "{generation}: {err}"
        );
        assert!(
            store.writes().is_empty(),
            "{generation}: {:?}",
            store.writes()
        );
        assert_eq!(snapshot(&root), before, "{generation}");
    }
}

#[test]
fn the_guard_refuses_a_version_or_gpu_change_of_a_model_with_a_directory() {
    for (generation, pin, pins) in generations() {
        let t = tempfile::tempdir().unwrap();
        let a = model("pop223", 37, 900);
        let root = t.path().join("store");
        let dir = artifacts_dir(&t.path().join("one"), &[&a]);
        let m1 = manifest_for(generation, &pin, vec![entry("pop223", &a.data, "Pop")]);
        publish(
            &m1,
            &dir,
            &[&LocalStore::new(&root)],
            &opts(generation, &pins),
            &mut |_| {},
        )
        .unwrap();
        let before = snapshot(&root);

        // A rebuild gives pop223 a directory; its manifest flips the GPU flag and the version.
        let a2 = model("pop223", 38, 950);
        let dir2 = artifacts_dir(&t.path().join("two"), &[&a2]);
        let mut e = entry("pop223", &a2.data, "Pop");
        e["uses_external_gpu"] = json!(true);
        e["version"] = json!("v16");
        let m2 = manifest_for(generation, &pin, vec![e]);
        let store = Recording::new(LocalStore::new(&root));
        let err =
            publish(&m2, &dir2, &[&store], &opts(generation, &pins), &mut |_| {}).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Guard { .. }), "{msg}");
        assert!(
            msg.contains(
                "model pop223: version \"v15\" -> \"v16\" would change within the generation"
            ) && msg.contains("model pop223: uses_external_gpu false -> true"),
            "{generation}: {msg}"
        );
        assert!(
            !store.writes().iter().any(|w| w.contains("manifests/")),
            "{generation}: {:?}",
            store.writes()
        );
        // The live manifest is still the first one.
        let live = LocalStore::new(&root)
            .read_small(
                &p(&format!("manifests/model_names_{generation}.json")),
                1 << 20,
            )
            .unwrap()
            .unwrap();
        assert_eq!(live, m1.to_canonical_bytes());
        // Refused before any upload: the store holds exactly what it held.
        assert!(
            store.writes().is_empty(),
            "{generation}: {:?}",
            store.writes()
        );
        assert_eq!(snapshot(&root), before, "{generation}");
    }
}

/// GitHub alone against the Hub emulator through the real `hf` CLI: refused while the Hub holds
/// another manifest of the generation (the git store unchanged), allowed once it holds the same
/// one, and publish then goes to GitHub. For v25 and a made-up v26.
#[test]
fn github_alone_is_compared_with_the_hub_manifest_through_the_real_hf_cli() {
    use artifact_store::HfBucketStore;
    use artifact_store::hf::HfConfig;
    use artifact_store::publish::{GithubOnly, check_github_only};
    use test_support::hub::{HubConfig, HubEmulator, real_hf_cli};
    let Some(cli) = real_hf_cli() else { return };
    const BUCKET: &str = "StarPilot-Driving/StarPilot-Resources";
    for (generation, pin, pins) in generations() {
        let emu = HubEmulator::start(HubConfig::default()).unwrap();
        emu.create_bucket(BUCKET);
        let config = HfConfig {
            endpoint: emu.url(),
            token: Some(emu.token().to_string()),
            cli: cli.clone(),
            timeout: std::time::Duration::from_secs(20),
        };
        let t = tempfile::tempdir().unwrap();
        let a = model("pop223", 41, 1500);
        let dir = artifacts_dir(t.path(), &[&a]);
        let m = manifest_for(generation, &pin, vec![entry("pop223", &a.data, "Pop")]);
        let older = manifest_for(
            generation,
            &pin,
            vec![entry("pop223", &bytes(42, 1500), "Pop")],
        );
        let path = format!("manifests/model_names_{generation}.json");
        emu.seed_bucket_file(BUCKET, &path, &older.to_canonical_bytes());
        let remote = GitRemote::new(&t.path().join("gh"), "Models", None);
        let github_alone = [(false, true)];
        let mut open_hub = || -> artifact_store::Result<Box<dyn Store>> {
            Ok(Box::new(HfBucketStore::new(BUCKET, config.clone())?))
        };

        let err =
            check_github_only(&github_alone, None, generation, &m, &mut open_hub).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("GitHub would be ahead of the Hub")
                && msg.contains(&format!("holds another {path}")),
            "{generation}: {msg}"
        );
        assert_eq!(remote.remote_subjects(), ["init"]);
        assert!(emu.ops().is_empty(), "the Hub is only read");

        emu.seed_bucket_file(BUCKET, &path, &m.to_canonical_bytes());
        let ok = check_github_only(&github_alone, None, generation, &m, &mut open_hub).unwrap();
        assert!(
            matches!(ok, GithubOnly::HubHoldsSame { .. }),
            "{generation}: {ok:?}"
        );
        let gh = GithubStore::open(&remote.checkout, "Models").unwrap();
        publish(&m, &dir, &[&gh], &opts(generation, &pins), &mut |_| {}).unwrap();
        assert_eq!(
            remote.remote_subjects().last().unwrap(),
            &format!("Publish model_names_{generation}.json")
        );
    }
}

/// A listed model that is in neither `--artifacts` nor the stores: the real run refuses it
/// before the first upload, as the dry run does (one check both make), so nothing reaches any
/// store (a local directory, the Hub emulator through the real `hf` CLI, a real git remote),
/// although the other model would have gone first. For v25 and a made-up v26.
#[test]
fn a_listed_model_in_no_store_is_refused_before_any_upload_to_every_store() {
    use artifact_store::HfBucketStore;
    use artifact_store::hf::HfConfig;
    use test_support::hub::{HubConfig, HubEmulator, real_hf_cli};
    const BUCKET: &str = "StarPilot-Driving/StarPilot-Resources";
    let cli = real_hf_cli();
    for (generation, pin, pins) in generations() {
        let t = tempfile::tempdir().unwrap();
        let a = model("pop223", 51, 2600);
        let absent = model("wd40", 52, 1900);
        let dir = artifacts_dir(t.path(), &[&a]);
        let m = manifest_for(
            generation,
            &pin,
            vec![
                entry("pop223", &a.data, "Pop"),
                entry("wd40", &absent.data, "WD"),
            ],
        );
        let missing = format!("models/{generation}/wd40/wd40_driving_tinygrad.pkl.chunkmanifest");
        let refused = |err: &Error| {
            let msg = err.to_string();
            assert!(
                matches!(err, Error::Incomplete { problems, .. }
                if problems.iter().all(|p| p.model.as_str() == "wd40")
                    && problems.iter().any(|p| matches!(
                        &p.kind,
                        StoreProblemKind::ChunkManifestMissing { path } if path.as_str() == missing
                    ))),
                "{generation}: {msg}"
            );
        };

        let root = t.path().join("store");
        let local = Recording::new(LocalStore::new(&root));
        let remote = GitRemote::new(&t.path().join("gh"), "Models", None);
        let before_subjects = remote.remote_subjects();
        let before = snapshot(&remote.checkout);
        let gh = GithubStore::open(&remote.checkout, "Models").unwrap();
        let emu = cli.as_ref().map(|cli| {
            let emu = HubEmulator::start(HubConfig::default()).unwrap();
            emu.create_bucket(BUCKET);
            let config = HfConfig {
                endpoint: emu.url(),
                token: Some(emu.token().to_string()),
                cli: cli.clone(),
                timeout: std::time::Duration::from_secs(20),
            };
            (emu, HfBucketStore::new(BUCKET, config).unwrap())
        });
        // The Hub first, as publish orders stores; then a directory, then GitHub.
        let mut stores: Vec<&dyn Store> = Vec::new();
        if let Some((_, hub)) = &emu {
            stores.push(hub);
        }
        stores.push(&local);
        stores.push(&gh);
        for dry_run in [true, false] {
            let mut events = Vec::new();
            let o = PublishOptions {
                dry_run,
                ..opts(generation, &pins)
            };
            let err = publish(&m, &dir, &stores, &o, &mut |e| events.push(e.clone())).unwrap_err();
            refused(&err);
            assert!(events.is_empty(), "{generation} dry {dry_run}: {events:?}");
            assert!(
                local.writes().is_empty(),
                "{generation}: {:?}",
                local.writes()
            );
            assert!(!root.exists(), "{generation}");
            assert_eq!(remote.remote_subjects(), before_subjects, "{generation}");
            assert_eq!(snapshot(&remote.checkout), before, "{generation}");
            if let Some((emu, _)) = &emu {
                assert!(emu.ops().is_empty(), "{generation}: {:?}", emu.ops());
                assert!(emu.bucket_paths(BUCKET).is_empty(), "{generation}");
            }
        }

        // Once the model is in the artifacts too, the same publish goes through everywhere.
        let dir = artifacts_dir(&t.path().join("both"), &[&a, &absent]);
        publish(&m, &dir, &stores, &opts(generation, &pins), &mut |_| {}).unwrap();
        assert_eq!(
            local.writes().last().unwrap(),
            &format!("write manifests/model_names_{generation}.json")
        );
        if let Some((emu, _)) = &emu {
            assert!(
                emu.bucket_file(BUCKET, &missing).is_some(),
                "{generation}: {:?}",
                emu.bucket_paths(BUCKET)
            );
        }
    }
}

/// Publish's plain-file rule, per generation as the pin table gives its contract (v25; v26
/// recorded with upstream's v26 contract; a made-up v27 inheriting it): a model whose entry
/// says `artifact_chunk_count` 0 is read as one plain file in `<id>/` where the contract
/// publishes an artifact of one chunk so (v26 and on), and refused where release builds are
/// chunk sets (v25).
#[test]
fn a_models_plain_file_is_published_only_where_the_contract_allows_one() {
    use artifact_store::Refusal;
    use artifact_store::publish::prepare_local_for;
    use manifest::contract::ContractName;
    let t = tempfile::tempdir().unwrap();
    let m = model("pop", 7, 1_800);
    let mut e = entry(m.id, &m.data, "Pop");
    e["artifact_chunk_count"] = json!(0);
    let manifest = manifest_of(vec![e]);
    let dir = t.path().join("artifacts");
    std::fs::create_dir_all(dir.join("pop")).unwrap();
    std::fs::write(dir.join("pop/pop_driving_tinygrad.pkl"), &m.data).unwrap();
    let mut pins = PinTable::builtin();
    pins.record_contract(Generation::new(26), ContractName::V26)
        .unwrap();
    for (generation, plain_ok) in [(25, false), (26, true), (27, true)] {
        let contract = pins.contract(Generation::new(generation));
        let got = prepare_local_for(&dir, &manifest, contract);
        if !plain_ok {
            assert!(
                matches!(got, Err(Error::Refused(Refusal::PlainFileCount { .. }))),
                "v{generation}: {got:?}"
            );
            continue;
        }
        let local = got.unwrap_or_else(|e| panic!("v{generation}: {e}"));
        assert_eq!(local.len(), 1, "v{generation}");
        let names: Vec<&str> = local[0].files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["pop_driving_tinygrad.pkl"], "v{generation}");
        assert_eq!(local[0].files[0].size, m.data.len() as u64, "v{generation}");
    }
}
