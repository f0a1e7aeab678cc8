//! `release-cli publish`'s runtime gate, as an engineer meets it: for a generation under the v26
//! contract (v26, and a made-up v27 that inherits it), every driving artifact — the model, its
//! accelerator variant, the tree's built-in — must carry the stamp of this generation's pin and
//! of its entry, and every such artifact and DM file must have a build receipt naming that pin
//! and its bytes. Each refusal leaves the store, the tree and the workspace as they were.
//!
//! The artifacts and receipts are written here from the formats as the v26 contract states them
//! (a pickle whose top-level dict holds the stamp, framed as an OOB container; a receipt with the
//! compiler's twelve fields), not with the toolkit's own writers.

use std::path::{Path, PathBuf};

use crate::common::{cli, covering_records, entry, refused, snapshot, text};
use serde_json::json;

const V26_PIN: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";
const V27_PIN: &str = "27b0c0ffee27b0c0ffee27b0c0ffee27b0c0ffee";
const ABI: &str = "tinygrad_single_v1_arena";

/// A protocol-5 pickle of `{key: value, …, "weights": <out-of-band buffer>}` in an OOB
/// container (8-byte length, opcodes, one buffer record), its values strings or small ints.
/// The tree's built-in (stamped, as a chunk set) and DM set, each with its build receipt naming
/// `pin`: what publish's runtime gate reads in `--openpilot` for a receipt contract.
pub(crate) fn runtime_tree(openpilot: &Path, pin: &str) {
    let models = openpilot.join("selfdrive/modeld/models");
    std::fs::create_dir_all(&models).unwrap();
    let rev: &'static str = Box::leak(pin.to_string().into_boxed_str());
    let builtin = stamp_of(rev, "v15", 3);
    split(&builtin, &models, "driving_tinygrad.pkl");
    std::fs::write(
        models.join("driving_tinygrad.build.json"),
        receipt("rdf43", pin, &builtin),
    )
    .unwrap();
    for (i, name) in manifest::layout::DM_FILES.iter().enumerate() {
        let data = vec![i as u8 + 10; 700];
        std::fs::write(models.join(name), &data).unwrap();
        let stem = name.strip_suffix(".pkl").unwrap();
        std::fs::write(
            models.join(format!("{stem}.build.json")),
            receipt(stem, pin, &data),
        )
        .unwrap();
    }
}

pub(crate) fn stamped(items: &[(&str, Item)], payload: &[u8]) -> Vec<u8> {
    fn str_op(out: &mut Vec<u8>, s: &str) {
        out.push(0x8c); // SHORT_BINUNICODE
        out.push(s.len() as u8);
        out.extend_from_slice(s.as_bytes());
    }
    let mut p = vec![0x80, 5, b'}', 0x94, b'(']; // PROTO 5, EMPTY_DICT, MEMOIZE, MARK
    for (k, v) in items {
        str_op(&mut p, k);
        match v {
            Item::S(s) => str_op(&mut p, s),
            Item::I(i) => p.extend_from_slice(&[b'K', *i]), // BININT1
        }
    }
    str_op(&mut p, "weights");
    p.push(0x97); // NEXT_BUFFER
    p.extend_from_slice(b"u."); // SETITEMS, STOP
    let mut out = (p.len() as i64).to_le_bytes().to_vec();
    out.extend_from_slice(&p);
    out.extend_from_slice(&(payload.len() as i64).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

pub(crate) enum Item {
    S(&'static str),
    I(u8),
}

fn stamp_of(rev: &'static str, version: &'static str, seed: u8) -> Vec<u8> {
    stamped(
        &[
            ("artifact_abi", Item::S(ABI)),
            ("compiler_revision", Item::S(rev)),
            ("format_version", Item::I(1)),
            ("behavior_version", Item::S(version)),
            ("model_type", Item::S("supercombo")),
            ("image_history_pipeline", Item::S("policy")),
            ("frame_skip", Item::I(4)),
        ],
        &vec![seed; 1500 + seed as usize],
    )
}

fn sha_hex(data: &[u8]) -> String {
    chunker::Sha256Digest::of_bytes(data).to_string()
}

/// The compiler's receipt for `data`, as the v26 contract lists its fields.
pub(crate) fn receipt(model_id: &str, rev: &str, data: &[u8]) -> String {
    let r = json!({
        "model_id": model_id, "behavior_version": "v15", "model_type": "supercombo",
        "artifact_abi": ABI, "compiler_revision": rev,
        "source_sha256": {format!("{model_id}_driving_supercombo.onnx"): "a".repeat(64)},
        "artifact_sha256": sha_hex(data), "artifact_size": data.len(),
        "execution_device": "QCOM", "warp_device": "QCOM", "image_history_pipeline": "policy",
        "camera_resolutions": [[1928, 1208], [1344, 760]]
    });
    serde_json::to_string_pretty(&r).unwrap() + "\n"
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Split `data` into `dir` as `name`'s chunk set (1000-byte chunks).
fn split(data: &[u8], dir: &Path, name: &str) {
    let build = dir.join(".build");
    std::fs::create_dir_all(&build).unwrap();
    let pkl = build.join(name);
    std::fs::write(&pkl, data).unwrap();
    let o = cli(&[
        "chunk",
        "split",
        s(&pkl),
        "--out-dir",
        s(dir),
        "--chunk-size",
        "1000",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    std::fs::remove_dir_all(&build).unwrap();
}

pub(crate) struct Release {
    pub(crate) generation: &'static str,
    pub(crate) pin: &'static str,
    pub(crate) root: PathBuf,
    pub(crate) artifacts: PathBuf,
    pub(crate) manifest: PathBuf,
    pub(crate) openpilot: PathBuf,
    pub(crate) workspace: PathBuf,
}

impl Release {
    fn model_dir(&self) -> PathBuf {
        self.artifacts.join("pop223")
    }
    pub(crate) fn models_dir(&self) -> PathBuf {
        self.openpilot.join("selfdrive/modeld/models")
    }
}

/// A release of `pop223` (with an `amd` variant) for `generation` under the v26 contract: the
/// tree's `tinygrad_pins.json` records the contract (v27 inherits it from v26), stamped
/// artifacts with receipts, the tree's built-in and DM set with receipts, covering records.
pub(crate) fn release(root: &Path, generation: &'static str) -> Release {
    let pin = if generation == "v27" {
        V27_PIN
    } else {
        V26_PIN
    };
    let artifacts = root.join("artifacts");
    let dir = artifacts.join("pop223");
    std::fs::create_dir_all(&dir).unwrap();
    let model = stamp_of(pin, "v15", 1);
    let variant = stamp_of(pin, "v15", 2);
    split(&model, &dir, "pop223_driving_tinygrad.pkl");
    split(&variant, &dir, "pop223_driving_amd_tinygrad.pkl");
    std::fs::write(
        dir.join("pop223_driving_tinygrad.build.json"),
        receipt("pop223", pin, &model),
    )
    .unwrap();
    std::fs::write(
        dir.join("pop223_driving_amd_tinygrad.build.json"),
        receipt("pop223", pin, &variant),
    )
    .unwrap();
    // The v26 contract's manifest: top-level generation, compiler_revision and artifact_abi;
    // the arena format; an `amd` variant (on a lab-eligible non-GPU model) naming the revision.
    let mut e = entry("pop223", &model, model.len().div_ceil(1000) as u32);
    e["artifact_format"] = json!(ABI);
    e["model_lab_eligible"] = json!(true);
    e["accelerator_artifacts"] = json!({"amd": {
        "artifact_format": ABI, "artifact_size": variant.len(),
        "artifact_sha256": sha_hex(&variant),
        "artifact_chunk_count": variant.len().div_ceil(1000), "execution_device": "AMD",
        "compiler_revision": pin}});
    let raw = root.join("raw.json");
    std::fs::write(
        &raw,
        json!({"generation": generation, "compiler_revision": pin, "artifact_abi": ABI,
               "models": [e]})
        .to_string(),
    )
    .unwrap();
    let o = cli(&["manifest", "fmt", s(&raw)]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let manifest = root.join(format!("model_names_{generation}.json"));
    std::fs::write(&manifest, &o.stdout).unwrap();
    std::fs::remove_file(&raw).unwrap();

    let openpilot = root.join("openpilot");
    let pins = if generation == "v27" {
        json!({"v26": {"tinygrad": V26_PIN, "contract": "v26"}, "v27": V27_PIN})
    } else {
        json!({"v26": {"tinygrad": V26_PIN, "contract": "v26"}})
    };
    let models = openpilot.join("selfdrive/modeld/models");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::write(openpilot.join("tinygrad_pins.json"), pins.to_string()).unwrap();
    runtime_tree(&openpilot, pin);
    let workspace = covering_records(&root.join("ws"), &manifest);
    Release {
        generation,
        pin,
        root: root.to_path_buf(),
        artifacts,
        manifest,
        openpilot,
        workspace,
    }
}

pub(crate) fn publish(r: &Release, store: &Path, extra: &[&str]) -> std::process::Output {
    let mut a = vec![
        "publish",
        "--generation",
        r.generation,
        "--manifest",
        s(&r.manifest),
        "--artifacts",
        s(&r.artifacts),
        "--workspace",
        s(&r.workspace),
        "--openpilot",
        s(&r.openpilot),
        "--to",
        s(store),
    ];
    a.extend_from_slice(extra);
    cli(&a)
}

/// Every file of the release (artifacts, manifest, tree, workspace) and the store.
type Files = Vec<(String, Vec<u8>)>;

fn state(r: &Release, store: &Path) -> (Files, Option<Files>) {
    (
        snapshot(&r.root)
            .into_iter()
            .filter(|(p, _)| !p.starts_with("store"))
            .collect(),
        store.exists().then(|| snapshot(store)),
    )
}

/// Make the change, publish (and dry-run), require a refusal naming `want`, and that nothing
/// changed anywhere.
pub(crate) fn assert_refused(r: &Release, change: impl FnOnce(&Release), want: &[&str]) {
    change(r);
    let store = r.root.join("store");
    let before = state(r, &store);
    for extra in [&["--dry-run"][..], &[]] {
        let err = refused(&publish(r, &store, extra));
        for w in want {
            assert!(err.contains(w), "{}: want {w:?} in: {err}", r.generation);
        }
        assert_eq!(
            state(r, &store),
            before,
            "{}: something changed",
            r.generation
        );
        assert!(!store.exists(), "{}: the store was created", r.generation);
        assert!(!release::records::publish_record_path(&r.manifest).exists());
    }
}

#[test]
fn a_release_of_this_generation_publishes() {
    for generation in ["v26", "v27"] {
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        let store = t.path().join("store");
        let o = publish(&r, &store, &[]);
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
        // The framing found is reported for each driving artifact.
        let err = text(&o.stderr);
        for subject in [
            "model pop223",
            "model pop223's amd variant",
            "the built-in model",
        ] {
            assert!(
                err.contains(&format!("checked {subject} (")),
                "{generation}: {subject}: {err}"
            );
        }
        assert!(
            err.contains("length-prefixed pickle") && err.contains("out-of-band buffer records"),
            "{err}"
        );
        assert!(
            err.contains("checked DM file dmonitoring_model_tinygrad.pkl"),
            "{err}"
        );
        let stored = store.join(format!("models/{generation}/pop223"));
        assert!(
            stored
                .join("pop223_driving_tinygrad.pkl.chunkmanifest")
                .is_file(),
            "{generation}"
        );
        // Receipts stay local: the store holds what devices fetch.
        assert!(
            !stored.join("pop223_driving_tinygrad.build.json").exists(),
            "{generation}"
        );
        // What was published is a manifest a v26 device accepts (the independent checker).
        let published =
            std::fs::read(store.join(format!("manifests/model_names_{generation}.json"))).unwrap();
        let rows = test_support::v26_checker::check_manifest(
            &published,
            &test_support::v26_checker::Runtime {
                generation,
                compiler_revision: r.pin,
                artifact_abi: ABI,
                bundled: "bundled-current",
                catalog: [("pop223".to_string(), ("v15".to_string(), false))].into(),
            },
        )
        .unwrap_or_else(|e| panic!("{generation}: {e}"));
        assert!(rows.contains_key("pop223"), "{generation}");
    }
}

#[test]
fn a_stamp_of_another_generation_is_refused_in_a_model_a_variant_and_the_builtin() {
    for generation in ["v26", "v27"] {
        let other = if generation == "v27" {
            V26_PIN
        } else {
            V27_PIN
        };
        // The model: rebuilt by another pin (with a receipt that matches its bytes, so only
        // the stamp tells).
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        assert_refused(
            &r,
            |r| {
                replace_model(
                    r,
                    "pop223_driving_tinygrad.pkl",
                    &stamp_of(other, "v15", 1),
                    other,
                )
            },
            &["model pop223", "compiler_revision", other, r.pin],
        );
        // The variant.
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        assert_refused(
            &r,
            |r| {
                replace_model(
                    r,
                    "pop223_driving_amd_tinygrad.pkl",
                    &stamp_of(r.pin, "v14", 2),
                    r.pin,
                )
            },
            &["amd variant", "behavior_version", "v14", "v15"],
        );
        // The built-in in the tree.
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        assert_refused(
            &r,
            |r| {
                let data = stamp_of(other, "v15", 3);
                let models = r.models_dir();
                for f in std::fs::read_dir(&models).unwrap() {
                    let p = f.unwrap().path();
                    let n = p.file_name().unwrap().to_string_lossy().into_owned();
                    if n.starts_with("driving_tinygrad.pkl") {
                        std::fs::remove_file(p).unwrap();
                    }
                }
                split(&data, &models, "driving_tinygrad.pkl");
                std::fs::write(
                    models.join("driving_tinygrad.build.json"),
                    receipt("rdf43", r.pin, &data),
                )
                .unwrap();
            },
            &["the built-in model", "compiler_revision", other],
        );
        // Not a stamped pickle at all: the framing is named.
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        assert_refused(
            &r,
            |r| replace_model(r, "pop223_driving_tinygrad.pkl", &[7u8; 3000], r.pin),
            &["model pop223", "unknown framing"],
        );
    }
}

/// Replace a model's artifact in the release (its chunk set, its receipt written for `rev`,
/// the manifest's digest and size), so that only the stamp or the receipt can tell.
fn replace_model(r: &Release, name: &str, data: &[u8], rev: &str) {
    let dir = r.model_dir();
    for f in std::fs::read_dir(&dir).unwrap() {
        let p = f.unwrap().path();
        if p.file_name().unwrap().to_string_lossy().starts_with(name) {
            std::fs::remove_file(p).unwrap();
        }
    }
    split(data, &dir, name);
    let stem = name.strip_suffix(".pkl").unwrap();
    std::fs::write(
        dir.join(format!("{stem}.build.json")),
        receipt("pop223", rev, data),
    )
    .unwrap();
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&r.manifest).unwrap()).unwrap();
    let e = &mut m["models"][0];
    let target = if name.contains("_amd_") {
        &mut e["accelerator_artifacts"]["amd"]
    } else {
        e
    };
    target["artifact_sha256"] = sha_hex(data).into();
    target["artifact_size"] = data.len().into();
    target["artifact_chunk_count"] = data.len().div_ceil(1000).into();
    let raw = r.root.join("raw.json");
    std::fs::write(&raw, m.to_string()).unwrap();
    let o = cli(&["manifest", "fmt", s(&raw)]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    std::fs::write(&r.manifest, &o.stdout).unwrap();
    std::fs::remove_file(&raw).unwrap();
    // The workspace's records cover the new bytes (the subject here is the runtime gate).
    std::fs::remove_dir_all(&r.workspace).unwrap();
    covering_records(&r.workspace, &r.manifest);
}

#[test]
fn a_missing_or_foreign_receipt_is_refused_for_an_artifact_and_a_dm_file() {
    for generation in ["v26", "v27"] {
        let other = if generation == "v27" {
            V26_PIN
        } else {
            V27_PIN
        };
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        assert_refused(
            &r,
            |r| {
                std::fs::remove_file(r.model_dir().join("pop223_driving_tinygrad.build.json"))
                    .unwrap()
            },
            &["model pop223", "no build receipt"],
        );
        // A receipt for other bytes.
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        assert_refused(
            &r,
            |r| {
                std::fs::write(
                    r.model_dir().join("pop223_driving_tinygrad.build.json"),
                    receipt("pop223", r.pin, b"other bytes"),
                )
                .unwrap()
            },
            &["model pop223", "artifact_sha256"],
        );
        // A DM file left from the generation before: its receipt names the other pin.
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        assert_refused(
            &r,
            |r| {
                let name = manifest::layout::DM_FILES[2];
                let data = std::fs::read(r.models_dir().join(name)).unwrap();
                let stem = name.strip_suffix(".pkl").unwrap();
                std::fs::write(
                    r.models_dir().join(format!("{stem}.build.json")),
                    receipt(stem, other, &data),
                )
                .unwrap();
            },
            &[
                "DM file dm_warp_1928x1208_tinygrad.pkl",
                "compiler_revision",
                other,
            ],
        );
        // A DM file without a receipt.
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        assert_refused(
            &r,
            |r| {
                std::fs::remove_file(r.models_dir().join("dmonitoring_model_metadata.build.json"))
                    .unwrap()
            },
            &["DM file dmonitoring_model_metadata.pkl", "no build receipt"],
        );
        // A receipt that is not one.
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        assert_refused(
            &r,
            |r| std::fs::write(r.models_dir().join("driving_tinygrad.build.json"), b"{}").unwrap(),
            &["the built-in model", "not a build receipt"],
        );
    }
}

/// A tree on `pin` under the v26 contract (v27 inherits it) with a models directory.
fn tree(root: &Path, generation: &str, pin: &str) -> PathBuf {
    let op = root.join("op");
    std::fs::create_dir_all(op.join("selfdrive/modeld/models")).unwrap();
    std::fs::create_dir_all(op.join("tinygrad_repo")).unwrap();
    std::fs::write(op.join("tinygrad_repo/TINYGRAD_COMMIT"), format!("{pin}\n")).unwrap();
    let pins = if generation == "v27" {
        json!({"v26": {"tinygrad": V26_PIN, "contract": "v26"}, "v27": V27_PIN})
    } else {
        json!({"v26": {"tinygrad": V26_PIN, "contract": "v26"}})
    };
    std::fs::write(op.join("tinygrad_pins.json"), pins.to_string()).unwrap();
    op
}

/// A tree that declares its generation the way upstream's v26 tree does (catalog module,
/// reviewed catalog, upstream-sync.json; no tinygrad_pins.json, no TINYGRAD_COMMIT): builtin
/// judges the built-in by the declared revision.
#[test]
fn builtin_in_a_declaring_tree_uses_the_declared_revision() {
    for (generation, pin, other) in [("v26", V26_PIN, V27_PIN), ("v27", V27_PIN, V26_PIN)] {
        let t = tempfile::tempdir().unwrap();
        let op = t.path().join("op");
        std::fs::create_dir_all(op.join("selfdrive/modeld/models")).unwrap();
        test_support::v26_checker::write_tree(
            &op,
            generation,
            pin,
            &[("pop223", "Pop", "v15", false, true)],
        );
        let artifact = t.path().join("rdf43_driving_tinygrad.pkl");
        let receipt_path = t.path().join("rdf43_driving_tinygrad.build.json");
        let run = || cli(&["builtin", "--artifact", s(&artifact), "--openpilot", s(&op)]);
        let foreign = stamp_of(other, "v15", 3);
        std::fs::write(&artifact, &foreign).unwrap();
        std::fs::write(&receipt_path, receipt("rdf43", pin, &foreign)).unwrap();
        let before = snapshot(&op);
        let err = refused(&run());
        assert!(
            err.contains("compiler_revision") && err.contains(other),
            "{err}"
        );
        assert_eq!(snapshot(&op), before);
        let good = stamp_of(pin, "v15", 3);
        std::fs::write(&artifact, &good).unwrap();
        std::fs::write(&receipt_path, receipt("rdf43", pin, &good)).unwrap();
        let o = run();
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
        assert!(
            op.join("selfdrive/modeld/models/driving_tinygrad.build.json")
                .is_file()
        );
    }
}

#[test]
fn builtin_takes_only_this_pins_stamped_and_receipted_model_and_writes_its_receipt() {
    for (generation, pin, other) in [("v26", V26_PIN, V27_PIN), ("v27", V27_PIN, V26_PIN)] {
        let t = tempfile::tempdir().unwrap();
        let op = tree(t.path(), generation, pin);
        let build = t.path().join("build");
        std::fs::create_dir_all(&build).unwrap();
        let artifact = build.join("rdf43_driving_tinygrad.pkl");
        let receipt_path = build.join("rdf43_driving_tinygrad.build.json");
        let builtin = |extra: &[&str]| {
            let mut a = vec!["builtin", "--artifact", s(&artifact), "--openpilot", s(&op)];
            a.extend_from_slice(extra);
            cli(&a)
        };
        // Refused, with and without --dry-run, the tree unchanged: a stamp of the other pin
        // (its receipt matching the bytes), no receipt, a receipt of the other pin.
        let cases: [(Vec<u8>, Option<&str>, &[&str]); 3] = [
            (
                stamp_of(other, "v15", 3),
                Some(pin),
                &["compiler_revision", other],
            ),
            (stamp_of(pin, "v15", 3), None, &["no build receipt"]),
            (
                stamp_of(pin, "v15", 3),
                Some(other),
                &["build receipt", other],
            ),
        ];
        for (data, receipt_rev, want) in cases {
            std::fs::write(&artifact, &data).unwrap();
            match receipt_rev {
                Some(rev) => std::fs::write(&receipt_path, receipt("rdf43", rev, &data)).unwrap(),
                None => {
                    let _ = std::fs::remove_file(&receipt_path);
                }
            }
            let before = snapshot(&op);
            for extra in [&["--dry-run"][..], &[]] {
                let err = refused(&builtin(extra));
                for w in want {
                    assert!(err.contains(w), "{generation}: want {w:?}: {err}");
                }
                assert!(err.contains("the built-in model"), "{err}");
                assert_eq!(snapshot(&op), before, "{generation}: the tree changed");
            }
        }
        // This pin's model with its receipt: installed, the receipt beside it.
        let data = stamp_of(pin, "v15", 3);
        std::fs::write(&artifact, &data).unwrap();
        std::fs::write(&receipt_path, receipt("rdf43", pin, &data)).unwrap();
        let o = builtin(&[]);
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
        let models = op.join("selfdrive/modeld/models");
        let written: serde_json::Value = serde_json::from_slice(
            &std::fs::read(models.join("driving_tinygrad.build.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(written["compiler_revision"], pin);
        assert_eq!(written["artifact_sha256"], sha_hex(&data));
        assert_eq!(written["artifact_size"], data.len());
        assert!(models.join("driving_tinygrad.pkl.chunkmanifest").is_file());
    }
}

/// Set the device's reported p95 in the workspace's validation record of `pop223`, where
/// upstream's v26 validator reports it (`cameras[i].inference_ms.p95`; the worst camera at
/// `p95`, the other well within any bound), or (`None`) a report without timings under a
/// top-level `p95_ms` that no validator writes.
fn set_p95(r: &Release, p95: Option<f64>) {
    let path = release::Workspace::new(&r.workspace).validation(&"pop223".parse().unwrap());
    let mut rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    match p95 {
        Some(v) => {
            rec["verdict"]["cameras"] = json!([
                {"passed": true, "camera": [1928, 1208], "inference_ms": {"p95": 1.0}},
                {"passed": true, "camera": [1344, 760], "inference_ms": {"p95": v}}
            ])
        }
        None => {
            rec["verdict"].as_object_mut().unwrap().remove("cameras");
            rec["verdict"]["p95_ms"] = json!(12.5);
        }
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&rec).unwrap()).unwrap();
}

#[test]
fn a_p95_over_the_contracts_bound_or_unreported_is_refused() {
    for generation in ["v26", "v27"] {
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        assert_refused(
            &r,
            |r| set_p95(r, Some(50.5)),
            &[
                "model pop223",
                "p95 latency of 50.5 ms",
                "50 ms bound",
                "v26 contract",
            ],
        );
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        assert_refused(
            &r,
            |r| set_p95(r, None),
            &["model pop223", "no p95 latency"],
        );
        // At the bound it ships.
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        set_p95(&r, Some(50.0));
        let o = publish(&r, &t.path().join("store"), &[]);
        assert!(o.status.success(), "{generation}: {}", text(&o.stderr));
    }
}

#[test]
fn status_shows_the_receipts() {
    for generation in ["v26", "v27"] {
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        let other = if generation == "v27" {
            V26_PIN
        } else {
            V27_PIN
        };
        let models = r.models_dir();
        let data = std::fs::read(models.join(manifest::layout::DM_FILES[0])).unwrap();
        std::fs::write(
            models.join("dmonitoring_model_tinygrad.build.json"),
            receipt("dmonitoring_model_tinygrad", other, &data),
        )
        .unwrap();
        std::fs::write(models.join("dm_warp_1344x760_tinygrad.build.json"), b"[]").unwrap();
        let status = |json: bool| {
            let mut a = vec![
                "status",
                "--workspace",
                s(&r.workspace),
                "--openpilot",
                s(&r.openpilot),
                "--generation",
                generation,
            ];
            if json {
                a.push("--json");
            }
            cli(&a)
        };
        let o = status(true);
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", text(&o.stderr)));
        let receipts = doc["receipts"].as_array().unwrap();
        let by = |of: &str| {
            receipts
                .iter()
                .find(|x| x["of"] == of)
                .unwrap_or_else(|| panic!("no {of} in {receipts:?}"))
        };
        assert_eq!(receipts.len(), 5, "{receipts:?}");
        assert_eq!(by("builtin")["compiler_revision"], r.pin);
        assert_eq!(by("builtin")["matches_pin"], true);
        assert_eq!(
            by("dm dmonitoring_model_tinygrad.pkl")["matches_pin"],
            false
        );
        assert!(
            by("dm dm_warp_1344x760_tinygrad.pkl")["problem"]
                .as_str()
                .unwrap()
                .contains("not a build receipt")
        );
        let out = text(&status(false).stdout);
        assert!(out.contains("receipt    builtin"), "{out}");
        assert!(out.contains("(NOT this pin)"), "{out}");
        assert!(out.contains("UNREADABLE"), "{out}");
    }
}

#[test]
fn rehearse_refuses_a_foreign_stamp_before_staging_anything() {
    for generation in ["v26", "v27"] {
        let other = if generation == "v27" {
            V26_PIN
        } else {
            V27_PIN
        };
        let t = tempfile::tempdir().unwrap();
        let r = release(t.path(), generation);
        replace_model(
            &r,
            "pop223_driving_tinygrad.pkl",
            &stamp_of(other, "v15", 1),
            other,
        );
        // The device manager is never reached: a stand-in file is enough.
        let manager = t.path().join("device-modeld-manager");
        std::fs::write(&manager, b"#!/bin/sh\nexit 99\n").unwrap();
        let before = snapshot(t.path());
        let err = refused(&cli(&[
            "rehearse",
            "--generation",
            generation,
            "--manifest",
            s(&r.manifest),
            "--artifacts",
            s(&r.artifacts),
            "--openpilot",
            s(&r.openpilot),
            "--workspace",
            s(&r.workspace),
            "--device-manager",
            s(&manager),
        ]));
        assert!(err.contains("model pop223") && err.contains(other), "{err}");
        assert_eq!(
            snapshot(t.path()),
            before,
            "{generation}: something changed"
        );
    }
}

#[test]
fn validate_refuses_to_send_a_foreign_or_unreceipted_artifact() {
    for (generation, pin, other) in [("v26", V26_PIN, V27_PIN), ("v27", V27_PIN, V26_PIN)] {
        let t = tempfile::tempdir().unwrap();
        let op = tree(t.path(), generation, pin);
        let dir = t.path().join("build");
        std::fs::create_dir_all(&dir).unwrap();
        let artifact = dir.join("pop223_driving_tinygrad.pkl");
        let receipt_path = dir.join("pop223_driving_tinygrad.build.json");
        let (record, log) = (
            t.path().join("pop223.validation.json"),
            t.path().join("logs/v.log"),
        );
        for (data, receipt_rev, want) in [
            (
                stamp_of(other, "v15", 1),
                Some(pin),
                vec!["compiler_revision", other],
            ),
            (
                stamp_of(pin, "v14", 1),
                Some(pin),
                vec!["behavior_version", "v14"],
            ),
            (stamp_of(pin, "v15", 1), None, vec!["no build receipt"]),
        ] {
            std::fs::write(&artifact, &data).unwrap();
            match receipt_rev {
                Some(rev) => std::fs::write(&receipt_path, receipt("pop223", rev, &data)).unwrap(),
                None => {
                    let _ = std::fs::remove_file(&receipt_path);
                }
            }
            let before = snapshot(t.path());
            for extra in [&["--dry-run"][..], &[]] {
                let mut a = vec![
                    "validate",
                    "--model",
                    "pop223",
                    "--version",
                    "v15",
                    "--artifact",
                    s(&artifact),
                    "--record",
                    s(&record),
                    "--log",
                    s(&log),
                    "--openpilot",
                    s(&op),
                    // Never reached: the gate refuses before any connection.
                    "--remote",
                    "comma@127.0.0.1",
                    "--allow-other-compiler",
                ];
                a.extend_from_slice(extra);
                let err = refused(&cli(&a));
                for w in &want {
                    assert!(err.contains(w), "{generation}: want {w:?}: {err}");
                }
                assert_eq!(
                    snapshot(t.path()),
                    before,
                    "{generation}: something was written"
                );
            }
        }
    }
}
