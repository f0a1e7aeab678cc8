//! The pin `sync`, `compile`, `dm` and `validate` build with comes from where the openpilot tree
//! records it, as upstream's compiler reads it: a tree that declares its generation
//! (`starpilot/models/catalog.py`, `catalog-vNN.json`, `upstream-sync.json`; no
//! `tinygrad_repo/TINYGRAD_COMMIT`) runs the `tinygrad_repo` dependency of its sync file, and
//! `compile` and `dm` write build receipts naming that revision and the bytes fetched; a v25 tree
//! runs its marker and gets no receipts. A declared tree whose marker names another commit is
//! refused before anything connects. Run as the real binary against the loopback sshd.
//!
//! Receipts are read here as upstream's compiler writes them (its twelve keys, JSON), not with
//! the toolkit's receipt reader.

use std::fs;
use std::path::Path;

use crate::common::{cli_in as cli, snapshot, text};
use test_support::sshd::{DeviceRoot, Sshd};

const V25_PIN: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";
const ABI: &str = "tinygrad_single_v1_arena";

fn write(path: &Path, body: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, body).unwrap();
}

/// The seed's four sync parts and a DM source, plus (for `Some(generation)`) the declaration
/// of a v26-contract generation; the marker only for v25.
fn tree(op: &Path, dev: &DeviceRoot, declared: Option<(&str, &str)>) {
    write(&op.join("tinygrad_repo/tinygrad/tensor.py"), b"#");
    write(&op.join("selfdrive/modeld/modeld.py"), b"#");
    write(&op.join("scripts/model_compiler.py"), b"#");
    write(
        &op.join("selfdrive/modeld/models/dmonitoring_model.onnx"),
        b"dm",
    );
    fs::copy(dev.remote_root().join("models"), op.join("models")).unwrap();
    match declared {
        Some((generation, revision)) => {
            test_support::v26_checker::write_tree(
                op,
                generation,
                revision,
                &[("pop223", "Pop", "v15", false, true)],
            );
        }
        None => write(
            &op.join("tinygrad_repo/TINYGRAD_COMMIT"),
            format!("{V25_PIN}\n").as_bytes(),
        ),
    }
}

fn remote_flags(sshd: &Sshd, dev: &DeviceRoot) -> Vec<String> {
    vec![
        "--remote".into(),
        Sshd::alias().into(),
        "--allow-other-compiler".into(),
        "--ssh-config".into(),
        sshd.ssh_config().to_str().unwrap().into(),
        "--remote-root".into(),
        dev.remote_root().to_str().unwrap().into(),
    ]
}

fn run(dir: &Path, args: &[&str], remote: &[String]) -> std::process::Output {
    let mut a: Vec<&str> = args.to_vec();
    a.extend(remote.iter().map(String::as_str));
    cli(&a, dir)
}

fn sha_hex(data: &[u8]) -> String {
    chunker::Sha256Digest::of_bytes(data).to_string()
}

/// The bytes of the chunk set `name` in `dir` (its chunks in order).
fn set_bytes(dir: &Path, name: &str) -> Vec<u8> {
    let n: usize = fs::read_to_string(dir.join(format!("{name}.chunkmanifest")))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut out = Vec::new();
    for i in 1..=n {
        out.extend(fs::read(dir.join(format!("{name}.chunk{i:02}of{n:02}"))).unwrap());
    }
    out
}

fn receipt(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

/// v25 (marker, no receipts), v26 and a made-up v27 (upstream-sync.json alone, receipts naming
/// its revision): sync, compile and dm through the CLI; then a marker that disagrees with the
/// declaration refuses sync, compile, dm and validate with nothing sent or written.
#[test]
fn builds_take_the_pin_where_the_tree_records_it_and_receipt_it() {
    let Some(sshd) = Sshd::start() else { return };
    let v26 = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";
    let v27 = "27b0c0ffee27b0c0ffee27b0c0ffee27b0c0ffee";
    for declared in [None, Some(("v26", v26)), Some(("v27", v27))] {
        let label = declared.map_or("v25", |d| d.0);
        let revision = declared.map_or(V25_PIN, |d| d.1);
        let dev = DeviceRoot::new(None);
        if declared.is_some() {
            // A compiler that stamps (the v26 contract), with the revision it is synced to.
            dev.set("stamp", ABI);
        }
        let t = tempfile::tempdir().unwrap();
        let op = t.path().join("openpilot");
        tree(&op, &dev, declared);
        let op_s = op.to_str().unwrap();
        let remote = remote_flags(&sshd, &dev);
        write(&t.path().join("src/driving_supercombo.onnx"), b"onnx");

        let out = run(t.path(), &["sync", "--openpilot", op_s, "--json"], &remote);
        assert_eq!(out.status.code(), Some(0), "{label}: {}", text(&out.stderr));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["tinygrad_commit"], revision, "{label}");
        assert_eq!(
            dev.remote_root().join("upstream-sync.json").is_file(),
            declared.is_some(),
            "{label}"
        );

        let compile = [
            "compile",
            "--model",
            "pop223",
            "--version",
            "v15",
            "--source",
            "src/driving_supercombo.onnx",
            "--out",
            "out",
            "--openpilot",
            op_s,
        ];
        let out = run(t.path(), &compile, &remote);
        assert_eq!(out.status.code(), Some(0), "{label}: {}", text(&out.stderr));
        let dir = t.path().join("out");
        let receipt_path = dir.join("pop223_driving_tinygrad.build.json");
        let dm_args = ["dm", "--out", "dm", "--openpilot", op_s];
        let out = run(t.path(), &dm_args, &remote);
        assert_eq!(out.status.code(), Some(0), "{label}: {}", text(&out.stderr));
        let dm = t.path().join("dm");
        // The device validation: under the v26 contract the validator is given the contract's
        // bound (`--max-p95-ms 50`, as upstream's rebuild runs it) and fails a camera over it;
        // v25 has no bound and gives none.
        dev.set("p95_ms", "75");
        let models_dir = dev.models_dir();
        let validate = [
            "validate",
            "--python",
            "python3",
            "--remote-models-dir",
            models_dir.to_str().unwrap(),
            "--model",
            "pop223",
            "--version",
            "v15",
            "--artifact",
            "out/pop223_driving_tinygrad.pkl",
            "--record",
            "v.json",
            "--log",
            "v.log",
            "--openpilot",
            op_s,
        ];
        let out = run(t.path(), &validate, &remote);
        let calls = dev.validator_calls();
        assert_eq!(
            calls.len(),
            1,
            "{label}: {calls:?} {} {}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let record = receipt(&t.path().join("v.json"));
        if declared.is_none() {
            assert_eq!(out.status.code(), Some(0), "{label}: {}", text(&out.stderr));
            assert!(!calls[0].contains("--max-p95-ms"), "{label}: {calls:?}");
        } else {
            let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
            assert_eq!(out.status.code(), Some(3), "{label}: {all}");
            assert!(calls[0].ends_with("--max-p95-ms 50"), "{label}: {calls:?}");
            assert!(
                all.contains("no p95 latency for every camera"),
                "{label}: {all}"
            );
            // The device's report, kept as its verdict: the cameras it failed over the bound.
            assert_eq!(record["verdict"]["passed"], false, "{label}");
            assert!(
                record["verdict"]["cameras"][0]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("exceeds 50.00 ms")),
                "{label}: {record}"
            );
        }
        if declared.is_none() {
            assert!(!receipt_path.exists(), "v25 wrote a receipt");
            assert!(
                !fs::read_dir(&dm).unwrap().any(|e| e
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".build.json")),
                "v25 wrote DM receipts"
            );
            continue;
        }
        // The compiled model's receipt: upstream's keys, this revision, these bytes.
        let bytes = set_bytes(&dir, "pop223_driving_tinygrad.pkl");
        let r = receipt(&receipt_path);
        let keys: std::collections::BTreeSet<&str> =
            r.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "model_id",
                "behavior_version",
                "model_type",
                "artifact_abi",
                "compiler_revision",
                "source_sha256",
                "artifact_sha256",
                "artifact_size",
                "execution_device",
                "warp_device",
                "image_history_pipeline",
                "camera_resolutions"
            ]
            .into_iter()
            .collect()
        );
        assert_eq!(r["model_id"], "pop223");
        assert_eq!(r["behavior_version"], "v15");
        assert_eq!(r["artifact_abi"], ABI);
        assert_eq!(r["compiler_revision"], revision, "{label}");
        assert_eq!(r["artifact_sha256"], sha_hex(&bytes));
        assert_eq!(r["artifact_size"], bytes.len());
        assert_eq!(
            r["source_sha256"]["driving_supercombo.onnx"],
            sha_hex(b"onnx")
        );
        // Each DM file's receipt: this revision, its bytes.
        for name in manifest::layout::DM_FILES {
            let data = fs::read(dm.join(name)).unwrap();
            let stem = name.strip_suffix(".pkl").unwrap();
            let r = receipt(&dm.join(format!("{stem}.build.json")));
            assert_eq!(r["compiler_revision"], revision, "{label} {name}");
            assert_eq!(r["artifact_sha256"], sha_hex(&data), "{label} {name}");
            assert_eq!(r["artifact_size"], data.len(), "{label} {name}");
        }

        // Publish reads these receipts: the DM set `dm` wrote ships in a release of this
        // generation, is refused (naming the receipt's revision) in a release of the other,
        // and is refused (naming the digest) once a file is no longer the bytes its receipt
        // names; nothing is uploaded.
        let other = if label == "v26" { "v27" } else { "v26" };
        let install_dm = |r: &crate::loadable_cli::Release| {
            for e in fs::read_dir(&dm).unwrap() {
                let e = e.unwrap();
                fs::copy(e.path(), r.models_dir().join(e.file_name())).unwrap();
            }
        };
        let p = tempfile::tempdir().unwrap();
        let r = crate::loadable_cli::release(p.path(), label);
        install_dm(&r);
        let o = crate::loadable_cli::publish(&r, &p.path().join("store"), &[]);
        assert!(o.status.success(), "{label}: {}", text(&o.stderr));
        let p = tempfile::tempdir().unwrap();
        let r = crate::loadable_cli::release(p.path(), other);
        crate::loadable_cli::assert_refused(
            &r,
            install_dm,
            &["DM file", "compiler_revision", revision],
        );
        let p = tempfile::tempdir().unwrap();
        let r = crate::loadable_cli::release(p.path(), label);
        crate::loadable_cli::assert_refused(
            &r,
            |r| {
                install_dm(r);
                let f = r.models_dir().join(manifest::layout::DM_FILES[0]);
                let mut data = fs::read(&f).unwrap();
                data.push(b'!');
                fs::write(&f, data).unwrap();
            },
            &["DM file dmonitoring_model_tinygrad.pkl", "artifact_sha256"],
        );

        // A marker that names another commit than the declaration: every build refuses before
        // connecting, naming both files and both values; nothing changes.
        write(
            &op.join("tinygrad_repo/TINYGRAD_COMMIT"),
            format!("{V25_PIN}\n").as_bytes(),
        );
        let calls = dev.calls();
        let local = snapshot(t.path());
        let device = snapshot(&dev.remote_root());
        for args in [
            &["sync", "--openpilot", op_s][..],
            &compile[..],
            &dm_args[..],
            &validate[..],
        ] {
            let out = run(t.path(), args, &remote);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(3), "{label} {}: {err}", args[0]);
            for want in [
                "TINYGRAD_COMMIT",
                "upstream-sync.json",
                V25_PIN,
                revision,
                "next:",
            ] {
                assert!(
                    err.contains(want),
                    "{label} {}: {want} not in {err}",
                    args[0]
                );
            }
            assert_eq!(snapshot(t.path()), local, "{label} {}", args[0]);
            assert_eq!(snapshot(&dev.remote_root()), device, "{label} {}", args[0]);
            assert_eq!(dev.calls(), calls, "{label} {}", args[0]);
        }
    }
}
