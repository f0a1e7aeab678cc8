//! `release-cli publish`'s release rules as an engineer meets them, for v25 and a made-up v26
//! (made-up pin recorded in the tree's `tinygrad_pins.json`): GitHub never ahead of the Hub,
//! and `uses_external_gpu` against the build records. Each refusal leaves every store as it was.

use std::path::{Path, PathBuf};

use crate::common::{cli, covering_records, entry, refused, snapshot, text};
use serde_json::{Value, json};
use test_support::published::artifact_bytes;
use test_support::release_stores::GitRemote;

/// A made-up next generation's pin.
const V26_PIN: &str = "26a0c0ffee26a0c0ffee26a0c0ffee26a0c0ffee";
/// And the one after it.
const V27_PIN: &str = "27b0c0ffee27b0c0ffee27b0c0ffee27b0c0ffee";

/// One generation's release: artifacts, manifest (canonical), an openpilot tree whose
/// tinygrad_pins.json knows the pin, and a workspace with covering records.
struct Release {
    generation: String,
    artifacts: PathBuf,
    manifest: PathBuf,
    openpilot: PathBuf,
    workspace: PathBuf,
}

fn release(dir: &Path, generation: &str, data: &[u8], gpu: bool) -> Release {
    let (artifacts, v25_manifest) = crate::common::release(dir, data);
    let pin = match generation {
        "v25" => manifest::PinTable::builtin()
            .get("v25".parse().unwrap())
            .unwrap()
            .to_string(),
        "v27" => V27_PIN.to_string(),
        _ => V26_PIN.to_string(),
    };
    let mut e = entry("pop223", data, data.len().div_ceil(1000) as u32);
    e["uses_external_gpu"] = json!(gpu);
    let raw = dir.join("raw.json");
    std::fs::write(
        &raw,
        json!({"generation": generation, "tinygrad_commit": pin, "models": [e]}).to_string(),
    )
    .unwrap();
    let o = cli(&["manifest", "fmt", raw.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    std::fs::remove_file(&v25_manifest).unwrap();
    let manifest = dir.join(format!("model_names_{generation}.json"));
    std::fs::write(&manifest, &o.stdout).unwrap();
    let openpilot = dir.join("openpilot");
    std::fs::create_dir_all(&openpilot).unwrap();
    if generation == "v27" {
        std::fs::write(
            openpilot.join("tinygrad_pins.json"),
            json!({ "v26": V26_PIN, "v27": V27_PIN }).to_string(),
        )
        .unwrap();
    } else if generation != "v25" {
        std::fs::write(
            openpilot.join("tinygrad_pins.json"),
            json!({ generation: pin }).to_string(),
        )
        .unwrap();
    }
    let workspace = covering_records(&dir.join("ws"), &manifest);
    Release {
        generation: generation.to_string(),
        artifacts,
        manifest,
        openpilot,
        workspace,
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn publish(r: &Release, to: &[&str], extra: &[&str]) -> std::process::Output {
    let mut a = vec![
        "publish",
        "--generation",
        &r.generation,
        "--manifest",
        s(&r.manifest),
        "--artifacts",
        s(&r.artifacts),
        "--workspace",
        s(&r.workspace),
        "--openpilot",
        s(&r.openpilot),
    ];
    for t in to {
        a.push("--to");
        a.push(t);
    }
    a.extend_from_slice(extra);
    cli(&a)
}

/// The checkout's working tree and branch head (opening a github: store fetches, which
/// changes `.git/FETCH_HEAD`; that is no change to the store).
fn checkout_state(dir: &Path) -> (Vec<(String, Vec<u8>)>, String) {
    let tree = snapshot(dir)
        .into_iter()
        .filter(|(p, _)| !p.starts_with(".git"))
        .collect();
    (
        tree,
        test_support::release_stores::git(dir, &["rev-parse", "HEAD"]),
    )
}

fn record(r: &Release) -> Value {
    let p = release::records::publish_record_path(&r.manifest);
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn github_alone_is_refused_unless_the_hub_holds_the_manifest_or_a_reason_is_given() {
    for generation in ["v25", "v26"] {
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation, &artifact_bytes(61, 2500), false);
        // A local directory stands in for the Hub store (--hub takes any store).
        let hub = t.path().join("hub");
        std::fs::create_dir_all(&hub).unwrap();

        // Refused: the Hub holds no manifest of this generation. Nothing pushed, the checkout
        // untouched, no publish record.
        let remote = GitRemote::new(&t.path().join("git"), "Models", None);
        let gh = format!("github:{}", remote.checkout.display());
        let before = checkout_state(&remote.checkout);
        let err = refused(&publish(&r, &[&gh], &["--hub", s(&hub)]));
        assert!(
            err.contains("GitHub would be ahead of the Hub")
                && err.contains(&format!("holds no manifests/model_names_{generation}.json"))
                && err.contains("--github-only \"REASON\""),
            "{generation}: {err}"
        );
        assert_eq!(remote.remote_subjects(), ["init"], "{generation}");
        assert_eq!(checkout_state(&remote.checkout), before, "{generation}");
        assert!(!release::records::publish_record_path(&r.manifest).exists());

        // Refused too: the Hub holds another manifest of this generation; and local + GitHub
        // without the Hub is GitHub ahead of the Hub as well.
        let hub_manifest = hub.join(format!("manifests/model_names_{generation}.json"));
        std::fs::create_dir_all(hub_manifest.parent().unwrap()).unwrap();
        std::fs::write(&hub_manifest, b"{\"models\": []}\n").unwrap();
        let local = t.path().join("local");
        let err = refused(&publish(&r, &[s(&local), &gh], &["--hub", s(&hub)]));
        assert!(err.contains("holds another"), "{generation}: {err}");
        assert_eq!(remote.remote_subjects(), ["init"], "{generation}");
        assert!(!local.exists(), "{generation}");

        // An empty reason is no reason.
        let o = publish(&r, &[&gh], &["--github-only", " "]);
        assert!(!o.status.success());
        assert!(text(&o.stderr).contains("--github-only needs a reason"));
        assert_eq!(remote.remote_subjects(), ["init"], "{generation}");

        // Allowed: the Hub serves exactly this manifest; the record says so.
        std::fs::copy(&r.manifest, &hub_manifest).unwrap();
        let o = publish(&r, &[&gh], &["--hub", s(&hub)]);
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
        assert_eq!(
            remote.remote_subjects().last().unwrap(),
            &format!("Publish model_names_{generation}.json")
        );
        let rec = record(&r);
        assert_eq!(rec["github_only"]["allowed"], "hub_holds_same", "{rec}");
        assert_eq!(rec["github_only"]["hub"], s(&hub), "{rec}");

        // Allowed with a reason, which is recorded (a fresh remote; the Hub holds nothing).
        std::fs::remove_file(&hub_manifest).unwrap();
        let fresh = GitRemote::new(&t.path().join("git2"), "Models", None);
        let gh2 = format!("github:{}", fresh.checkout.display());
        let o = publish(
            &r,
            &[&gh2],
            &[
                "--hub",
                s(&hub),
                "--github-only",
                "Hub outage; republished there later",
            ],
        );
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
        assert!(text(&o.stderr).contains("warning: publishing to GitHub without the Hub"));
        let rec = record(&r);
        assert_eq!(
            rec["github_only"],
            json!({"allowed": "flag", "reason": "Hub outage; republished there later"})
        );
    }
}

/// GitHub alone, and the Hub's manifest cannot be read (here: larger than any manifest, as a
/// hostile or broken Hub could serve): the publish stops with what to do next, nothing written.
#[test]
fn github_alone_with_an_unreadable_hub_says_what_to_do_and_writes_nothing() {
    for generation in ["v25", "v26"] {
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation, &artifact_bytes(63, 2500), false);
        let hub = t.path().join("hub");
        let hub_manifest = hub.join(format!("manifests/model_names_{generation}.json"));
        std::fs::create_dir_all(hub_manifest.parent().unwrap()).unwrap();
        std::fs::File::create(&hub_manifest)
            .unwrap()
            .set_len(manifest::Limits::DEFAULT_MAX_MANIFEST_BYTES + 1)
            .unwrap();
        let remote = GitRemote::new(&t.path().join("git"), "Models", None);
        let gh = format!("github:{}", remote.checkout.display());
        let before = checkout_state(&remote.checkout);
        let o = publish(&r, &[&gh], &["--hub", s(&hub)]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{generation}: {err}");
        assert!(
            err.contains("cannot tell whether GitHub would be ahead of the Hub")
                && err.contains(&format!("manifests/model_names_{generation}.json"))
                && err.contains("next: pass --hub STORE")
                && err.contains("--github-only \"REASON\""),
            "{generation}: {err}"
        );
        assert_eq!(remote.remote_subjects(), ["init"], "{generation}");
        assert_eq!(checkout_state(&remote.checkout), before, "{generation}");
        assert!(!release::records::publish_record_path(&r.manifest).exists());
    }
}

/// A new generation whose artifact is byte for byte one the store's previous generation
/// published (a pickle compiled with the previous tinygrad, e.g. a Chestnut variant or chunk
/// set copied across) is refused before any upload, store unchanged; the same release with
/// rebuilt bytes goes through. For v25 -> v26 and a made-up v26 -> v27.
#[test]
fn an_artifact_the_previous_generation_published_is_refused() {
    for (old, new) in [("v25", "v26"), ("v26", "v27")] {
        let t = tempfile::tempdir().unwrap();
        let store = t.path().join("store");
        let data = artifact_bytes(71, 2500);
        let r_old = release(&t.path().join(old), old, &data, false);
        let o = publish(&r_old, &[s(&store)], &[]);
        assert!(o.status.success(), "{old}: {}", text(&o.stderr));

        let carried = release(&t.path().join(new), new, &data, false);
        let before = snapshot(&store);
        let err = refused(&publish(&carried, &[s(&store)], &[]));
        assert!(
            err.contains(&format!("it departs from {old}"))
                && err.contains("model pop223: artifact artifact_sha256")
                && err.contains("previous generation's artifact of model pop223")
                && err.contains("release-cli rebuild"),
            "{old} -> {new}: {err}"
        );
        assert_eq!(
            snapshot(&store),
            before,
            "{old} -> {new}: the store changed"
        );
        assert!(!release::records::publish_record_path(&carried.manifest).exists());

        let rebuilt = release(
            &t.path().join(format!("{new}-rebuilt")),
            new,
            &artifact_bytes(72, 2500),
            false,
        );
        let o = publish(&rebuilt, &[s(&store)], &[]);
        assert!(o.status.success(), "{old} -> {new}: {}", text(&o.stderr));
    }
}

#[test]
fn a_gpu_flag_that_is_not_what_was_built_is_refused_before_any_store() {
    for generation in ["v25", "v26"] {
        for (built_gpu, published_gpu) in [(false, true), (true, false)] {
            let t = tempfile::tempdir().unwrap();
            let data = artifact_bytes(62, 2500);
            let r = release(t.path(), generation, &data, published_gpu);
            // The rebuild's success record of exactly this artifact.
            let rec = release::rebuild::BuildRecord {
                id: "pop223".parse().unwrap(),
                status: "compiled".into(),
                generation: generation.parse().unwrap(),
                tinygrad_commit: manifest::Manifest::from_slice(
                    &std::fs::read(&r.manifest).unwrap(),
                )
                .unwrap()
                .tinygrad_commit()
                .unwrap(),
                version: "v15".parse().unwrap(),
                source_id: "pop223".parse().unwrap(),
                input_format: compiler_remote::InputFormat::Supercombo,
                uses_external_gpu: built_gpu,
                source_commit: None,
                sources: vec!["a.onnx".into()],
                artifact: release::rebuild::RecordedArtifact {
                    name: "pop223_driving_tinygrad.pkl".into(),
                    size: data.len() as u64,
                    sha256: chunker::Sha256Digest::of_bytes(&data),
                    chunk_count: 3,
                    files: vec![],
                    chunk_sha256: vec![],
                },
                variants: vec![],
                log: "l".into(),
            };
            std::fs::write(
                r.workspace.join("results/pop223.json"),
                serde_json::to_vec_pretty(&rec).unwrap(),
            )
            .unwrap();
            let store = t.path().join("store");
            let err = refused(&publish(&r, &[s(&store)], &[]));
            assert!(
                err.contains(&format!(
                    "model pop223: the manifest says uses_external_gpu: {published_gpu}"
                )) && err.contains("next:"),
                "{generation}: {err}"
            );
            assert!(!store.exists(), "{generation}: nothing written");

            // With the flag the build says, the same publish goes through.
            let mut m: Value =
                serde_json::from_slice(&std::fs::read(&r.manifest).unwrap()).unwrap();
            m["models"][0]["uses_external_gpu"] = json!(built_gpu);
            std::fs::write(&r.manifest, m.to_string()).unwrap();
            let r = Release {
                workspace: covering_records(&r.workspace, &r.manifest),
                ..r
            };
            let o = publish(&r, &[s(&store)], &[]);
            assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
        }
    }
}

#[test]
fn release_validation_names_each_missing_variant_field_with_the_command_that_fixes_it() {
    for generation in ["v25", "v26"] {
        let t = tempfile::tempdir().unwrap();
        let data = artifact_bytes(63, 2500);
        let r = release(t.path(), generation, &data, false);
        let mut m: Value = serde_json::from_slice(&std::fs::read(&r.manifest).unwrap()).unwrap();
        m["models"][0]["accelerator_artifacts"] = json!({"chestnut": {
            "artifact_format": "tinygrad_single_v1",
            "artifact_filename": "pop223_driving_chestnut_tinygrad.pkl",
            "artifact_size": 1800,
            "execution_device": "AMD"
        }});
        std::fs::write(&r.manifest, m.to_string()).unwrap();
        // The records (the rehearsal among them) are of the manifest as it is published.
        covering_records(&r.workspace, &r.manifest);
        let before = std::fs::read(&r.manifest).unwrap();
        let o = cli(&["manifest", "validate", "--mode", "release", s(&r.manifest)]);
        assert_eq!(
            o.status.code(),
            Some(3),
            "{generation}: {}",
            text(&o.stderr)
        );
        let out = format!("{}{}", text(&o.stdout), text(&o.stderr));
        for field in ["artifact_sha256", "artifact_chunk_count"] {
            assert!(
                out.contains(&format!(
                    "models[0].accelerator_artifacts.chestnut.{field}: missing; required for every published accelerator variant"
                )),
                "{generation}: {out}"
            );
        }
        assert!(
            out.contains(
                "release-cli manifest set-artifact MANIFEST DIR --model pop223 --variant chestnut"
            ),
            "{generation}: {out}"
        );
        // The catalog level does not ask for them; the file is untouched.
        let o = cli(&["manifest", "validate", s(&r.manifest)]);
        assert!(
            !text(&o.stdout).contains("artifact_chunk_count"),
            "{generation}: {}",
            text(&o.stdout)
        );
        assert_eq!(std::fs::read(&r.manifest).unwrap(), before);

        // And publish refuses it before opening any store.
        let store = t.path().join("store");
        let err = refused(&publish(&r, &[s(&store)], &[]));
        assert!(
            err.contains("accelerator_artifacts.chestnut"),
            "{generation}: {err}"
        );
        assert!(!store.exists());
    }
}

/// `rebuild` of a made-up v26 against the loopback sshd and the stand-in `./models`: the base
/// catalog's v25 Chestnut variant is rebuilt with `--gpu` (never copied), lands beside the
/// model's chunk set under the variant's name, and `publish` uploads it from `ready/`.
#[test]
fn rebuild_rebuilds_a_chestnut_variant_on_the_compiler_and_publish_uploads_it() {
    use test_support::sshd::{DeviceRoot, Sshd};
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(Some(V26_PIN));
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let write = |p: &str, body: &[u8]| {
        let p = root.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    };
    write("store/onnx/sc23/driving_supercombo.onnx", b"sc supercombo");
    write("map.json", br#"{"sc23": {"input_format": "supercombo"}}"#);
    let v25_variant = json!({
        "artifact_format": "tinygrad_single_v1",
        "artifact_filename": "sc23_driving_chestnut_tinygrad.pkl",
        "artifact_size": 67571389,
        "artifact_sha256": "5198df6889af1244f1daa9cd29388e2a3992328f91d7f44d2633e8702a4e19d1",
        "artifact_chunk_count": 0,
        "execution_device": "AMD"
    });
    let base = json!({"models": [{
        "id": "sc23", "name": "SC", "version": "v9", "series": "OP Series",
        "released": "2025-01-02", "community_favorite": true, "model_size": "small",
        "accelerator_artifacts": {"chestnut": v25_variant}
    }]});
    write("base.json", base.to_string().as_bytes());
    // A v26 tree (its pin recorded, as `tinygrad bump` leaves it), synced to the compiler: the
    // rebuild's generation and pin come from it.
    write(
        "op/tinygrad_repo/TINYGRAD_COMMIT",
        format!("{V26_PIN}\n").as_bytes(),
    );
    write("op/tinygrad_repo/tinygrad/tensor.py", b"tensor");
    write("op/selfdrive/modeld/modeld.py", b"#");
    write("op/scripts/model_compiler.py", b"#");
    std::fs::copy(dev.remote_root().join("models"), root.join("op/models")).unwrap();
    write(
        "op/tinygrad_pins.json",
        json!({ "v26": V26_PIN }).to_string().as_bytes(),
    );
    let ssh_config = s(sshd.ssh_config()).to_string();
    let remote_root = dev.remote_root().to_str().unwrap().to_string();
    let remote_flags = [
        "--remote",
        Sshd::alias(),
        "--allow-other-compiler",
        "--ssh-config",
        &ssh_config,
        "--remote-root",
        &remote_root,
        "--openpilot",
        "op",
    ];
    let mut sync = vec!["sync"];
    sync.extend(remote_flags);
    let o = crate::common::cli_in(&sync, root);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = crate::common::cli_in(
        &[
            "rebuild",
            "--workspace",
            "ws",
            "--source-map",
            "map.json",
            "--base-manifest",
            "base.json",
            "--sources",
            "store",
            "--generation",
            "v26",
            "--json",
            "--remote",
            Sshd::alias(),
            "--allow-other-compiler",
            "--ssh-config",
            &ssh_config,
            "--remote-root",
            &remote_root,
            "--openpilot",
            "op",
        ],
        root,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["variants_dropped"], json!([]), "{summary}");
    let calls = dev.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls[0].starts_with("--sc23 --version v9 --input-dir"),
        "{calls:?}"
    );
    assert!(
        calls[1].starts_with("--sc23 --version v9 --gpu"),
        "{calls:?}"
    );

    let ready = root.join("ws/ready");
    let mpath = ready.join("model_names_v26.json");
    let m: Value = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
    let v = &m["models"][0]["accelerator_artifacts"]["chestnut"];
    assert_ne!(v["artifact_sha256"], v25_variant["artifact_sha256"], "{v}");
    assert_eq!(v["artifact_filename"], "sc23_driving_chestnut_tinygrad.pkl");
    assert_eq!(v["execution_device"], "AMD");
    // The variant's chunk set in ready/sc23/ verifies against the manifest's fields, and the
    // model's own set is untouched by it (a different build: QCOM).
    let vsha = v["artifact_sha256"].as_str().unwrap();
    let count = v["artifact_chunk_count"].to_string();
    let o = cli(&[
        "chunk",
        "verify",
        s(&ready.join("sc23/sc23_driving_chestnut_tinygrad.pkl")),
        "--sha256",
        vsha,
        "--chunk-count",
        &count,
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_ne!(m["models"][0]["artifact_sha256"].as_str().unwrap(), vsha);
    assert!(!ready.join("sc23/.variant-chestnut").exists());

    // publish takes the variant from ready/sc23/.
    let openpilot = root.join("openpilot");
    std::fs::create_dir_all(&openpilot).unwrap();
    std::fs::write(
        openpilot.join("tinygrad_pins.json"),
        json!({"v26": V26_PIN}).to_string(),
    )
    .unwrap();
    let ws = covering_records(&root.join("ws"), &mpath);
    let store = root.join("store-out");
    let o = cli(&[
        "publish",
        "--generation",
        "v26",
        "--manifest",
        s(&mpath),
        "--artifacts",
        s(&ready),
        "--workspace",
        s(&ws),
        "--openpilot",
        s(&openpilot),
        "--to",
        s(&store),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        store
            .join("models/v26/sc23/sc23_driving_chestnut_tinygrad.pkl.chunkmanifest")
            .is_file()
    );
}

/// `release-cli ARGS` exactly as a hint prints it (`sh -c`, the binary first on PATH).
fn run_as_printed(command: &str) -> std::process::Output {
    let bin_dir = Path::new(crate::common::BIN).parent().unwrap();
    std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .env(
            "PATH",
            format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
        )
        .env("HF_TOKEN", "")
        .output()
        .unwrap()
}

/// A first publish of a whole-manifest generation into a store that holds no previous
/// generation is guarded against the previous generation's manifest the workspace set aside:
/// a model it leaves out is refused (exit 3, nothing written) naming the model and
/// `--drop-model`, and the printed command, which names it, publishes. For v25 and made-up
/// v26 and v27 (no tree declares them, so they keep v25's contract).
#[test]
fn a_first_publish_that_leaves_out_a_catalog_model_is_refused_unless_named() {
    for (generation, previous) in [("v25", "v24"), ("v26", "v25"), ("v27", "v26")] {
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation, &artifact_bytes(67, 2500), false);
        let aside = r.workspace.join(format!("generations/{previous}/ready"));
        std::fs::create_dir_all(&aside).unwrap();
        let row = |id: &str| json!({"id": id, "name": id, "version": "v15"});
        std::fs::write(
            aside.join(format!("model_names_{previous}.json")),
            json!({"generation": previous, "models": [row("pop223"), row("gwm8")]}).to_string(),
        )
        .unwrap();
        let store = t.path().join("store");
        let err = refused(&publish(&r, &[s(&store)], &[]));
        assert!(
            err.contains("leaves out gwm8") && err.contains("--drop-model gwm8`"),
            "{generation}: {err}"
        );
        assert!(!store.exists(), "{generation}: a refusal wrote the store");
        let next = err
            .lines()
            .find_map(|l| l.strip_prefix("next: "))
            .unwrap_or_else(|| panic!("{generation}: no next step in {err}"));
        let command = next.split('`').nth(1).unwrap();
        let o = run_as_printed(command);
        assert!(
            o.status.success(),
            "{generation}: {command}: {}",
            text(&o.stderr)
        );
        assert!(
            store
                .join(format!("manifests/model_names_{generation}.json"))
                .is_file()
        );
    }
}

/// A `github:` publish on a git older than 2.36 (which ignores `core.fsync`) is refused before
/// anything is written, naming the version and what to install; the same publish with a
/// current git goes through. For v25 and a made-up v26.
#[test]
fn a_github_publish_with_a_git_older_than_2_36_is_refused() {
    let real_git = std::process::Command::new("sh")
        .args(["-c", "command -v git"])
        .output()
        .unwrap();
    let real_git = text(&real_git.stdout).trim().to_string();
    for generation in ["v25", "v26"] {
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation, &artifact_bytes(69, 2500), false);
        let remote = GitRemote::new(&t.path().join("git"), "Models", None);
        let gh = format!("github:{}", remote.checkout.display());
        let bin = t.path().join("oldgit");
        std::fs::create_dir_all(&bin).unwrap();
        let fake = bin.join("git");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\n[ \"$1\" = --version ] && {{ echo 'git version 2.34.1'; exit 0; }}\n\
                 exec '{real_git}' \"$@\"\n"
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let argv: Vec<String> = [
            "publish",
            "--generation",
            &r.generation,
            "--manifest",
            s(&r.manifest),
            "--artifacts",
            s(&r.artifacts),
            "--workspace",
            s(&r.workspace),
            "--openpilot",
            s(&r.openpilot),
            "--to",
            &gh,
            "--github-only",
            "test",
        ]
        .map(String::from)
        .to_vec();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
        let o = crate::common::command()
            .args(&argv)
            .env("PATH", &path)
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{generation}: {err}");
        assert!(
            err.contains("git 2.34 ignores core.fsync") && err.contains("install git 2.36"),
            "{generation}: {err}"
        );
        assert_eq!(remote.remote_subjects(), ["init"], "{generation}");
        let o = crate::common::command().args(&argv).output().unwrap();
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
    }
}
