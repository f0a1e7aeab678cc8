//! End-to-end tests of the compiler client against a real sshd on 127.0.0.1, real rsync, and a
//! temporary device root with a stand-in `./models` (see `test_support::sshd`).

use std::fs;
use std::path::{Path, PathBuf};

use compiler_remote::{
    CompileJob, CompileRequest, Compiler, ConnectOptions, Destination, DmJob, Error, InputFormat,
    RemotePath, Step, ValidateJob, dry_run,
};
use manifest::GitCommit;
use test_support::sshd::{DeviceRoot, Sshd};

const PIN: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";
const OTHER: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";

fn pin() -> GitCommit {
    PIN.parse().unwrap()
}

fn opts(sshd: &Sshd, dev: &DeviceRoot) -> ConnectOptions {
    ConnectOptions {
        destination: Sshd::alias().parse().unwrap(),
        allow_other_compiler: true,
        remote_root: dev.remote_root().to_str().unwrap().parse().unwrap(),
        ssh_config: Some(sshd.ssh_config().to_path_buf()),
        ..ConnectOptions::default()
    }
}

fn request(id: &str) -> CompileRequest {
    CompileRequest {
        id: id.parse().unwrap(),
        version: "v16".parse().unwrap(),
        gpu: false,
        input_format: InputFormat::Supercombo,
        local: false,
    }
}

fn compile_job(
    request: &CompileRequest,
    sources: &[PathBuf],
    out: &Path,
    log: &Path,
) -> CompileJob {
    CompileJob {
        request: request.clone(),
        sources: sources.to_vec(),
        out: out.to_path_buf(),
        log: log.to_path_buf(),
    }
}

fn onnx(dir: &Path, name: &str, body: &[u8]) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let p = dir.join(name);
    fs::write(&p, body).unwrap();
    p
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|r| {
            r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A local openpilot tree with the four things sync sends, plus git metadata and bytecode that
/// must not be sent.
fn openpilot_tree(root: &Path, dev: &DeviceRoot, commit: &str) {
    let tg = root.join("tinygrad_repo");
    fs::create_dir_all(tg.join(".git")).unwrap();
    fs::write(tg.join(".git/HEAD"), "ref: refs/heads/master\n").unwrap();
    fs::create_dir_all(tg.join("tinygrad/__pycache__")).unwrap();
    fs::write(tg.join("tinygrad/__pycache__/x.pyc"), b"pyc").unwrap();
    fs::write(tg.join("tinygrad/tensor.py"), b"# tensor\n").unwrap();
    fs::write(tg.join("TINYGRAD_COMMIT"), format!("{commit}\n")).unwrap();
    fs::create_dir_all(root.join("selfdrive/modeld")).unwrap();
    fs::write(root.join("selfdrive/modeld/modeld.py"), b"# modeld\n").unwrap();
    fs::create_dir_all(root.join("scripts")).unwrap();
    fs::write(root.join("scripts/model_compiler.py"), b"# compiler\n").unwrap();
    fs::copy(dev.remote_root().join("models"), root.join("models")).unwrap();
}

#[test]
fn sync_sends_the_four_parts_and_checks_the_marker() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(None);
    // A file the --delete of tinygrad_repo/ must remove.
    fs::write(dev.remote_root().join("tinygrad_repo/stale.py"), b"old").unwrap();
    let local = tempfile::tempdir().unwrap();
    openpilot_tree(local.path(), &dev, PIN);

    let c = Compiler::connect(opts(&sshd, &dev)).unwrap();
    assert_eq!(c.read_marker().unwrap(), None);
    let report = c.sync(local.path(), &pin()).unwrap();
    assert_eq!(report.transfers.len(), 4);
    assert_eq!(report.tinygrad_commit, PIN);
    let r = dev.remote_root();
    assert_eq!(
        fs::read_to_string(r.join("tinygrad_repo/TINYGRAD_COMMIT")).unwrap(),
        format!("{PIN}\n")
    );
    assert!(
        !r.join("tinygrad_repo/.git").exists(),
        "git metadata was synced"
    );
    assert!(!r.join("tinygrad_repo/tinygrad/__pycache__").exists());
    assert!(
        !r.join("tinygrad_repo/stale.py").exists(),
        "--delete did not run"
    );
    assert!(r.join("tinygrad_repo/tinygrad/tensor.py").is_file());
    assert!(r.join("selfdrive/modeld/modeld.py").is_file());
    assert!(r.join("scripts/model_compiler.py").is_file());
    assert!(r.join("models").is_file());

    // Syncing a tree whose marker is not the pin is an error after the transfer.
    fs::write(
        local.path().join("tinygrad_repo/TINYGRAD_COMMIT"),
        format!("{OTHER}\n"),
    )
    .unwrap();
    match c.sync(local.path(), &pin()) {
        Err(Error::MarkerMismatch {
            found, expected, ..
        }) => {
            assert_eq!(found, OTHER);
            assert_eq!(expected, PIN);
        }
        r => panic!("{r:?}"),
    }
}

/// A tree that declares a v26-contract generation (v26, and a made-up v27 inheriting the
/// contract) records its tinygrad in `upstream-sync.json` alone: sync sends that file and the
/// catalog's package, and the compiler's pin is read from the sync file there (no
/// TINYGRAD_COMMIT anywhere). A compiler whose sync file names another commit, or none, is
/// refused before `./models` runs.
#[test]
fn a_declared_tree_records_its_pin_in_its_sync_file_on_both_ends() {
    let Some(sshd) = Sshd::start() else { return };
    for (generation, revision) in [("v26", OTHER), ("v27", "2".repeat(40).leak() as &str)] {
        let dev = DeviceRoot::new(None);
        let local = tempfile::tempdir().unwrap();
        openpilot_tree(local.path(), &dev, revision);
        fs::remove_file(local.path().join("tinygrad_repo/TINYGRAD_COMMIT")).unwrap();
        test_support::v26_checker::write_tree(
            local.path(),
            generation,
            revision,
            &[("sc2", "SC2", "v9", false, true)],
        );
        let location = compiler_remote::pin_location(local.path());
        assert_eq!(location.rel(), "upstream-sync.json");
        let o = ConnectOptions {
            pin_location: location,
            ..opts(&sshd, &dev)
        };
        let pin: GitCommit = revision.parse().unwrap();
        let c = Compiler::connect(o.clone()).unwrap();
        assert_eq!(c.read_marker().unwrap(), None);
        let report = c.sync(local.path(), &pin).unwrap();
        assert_eq!(report.transfers.len(), 6, "{:?}", report.transfers);
        assert_eq!(report.tinygrad_commit, revision);
        let r = dev.remote_root();
        assert!(r.join("upstream-sync.json").is_file());
        assert!(r.join("starpilot/models/catalog.py").is_file());
        assert!(
            r.join(format!("starpilot/models/catalog-{generation}.json"))
                .is_file()
        );
        assert!(!r.join("tinygrad_repo/TINYGRAD_COMMIT").exists());
        // The tree is what the sync sent (the digest covers the two new parts) ...
        compiler_remote::synced::check_synced(
            local.path(),
            &o.destination.to_string(),
            o.remote_root.as_str(),
        )
        .unwrap();
        // ... and an edit of the catalog is a tree the compiler does not have.
        fs::write(
            local.path().join("starpilot/models/catalog.py"),
            b"# edited\n",
        )
        .unwrap();
        assert!(
            compiler_remote::synced::check_synced(
                local.path(),
                &o.destination.to_string(),
                o.remote_root.as_str()
            )
            .is_err()
        );

        // The compiler's sync file names another tinygrad, then none: refused, nothing ran.
        let src = tempfile::tempdir().unwrap();
        let s = onnx(src.path(), "driving_supercombo.onnx", b"onnx-a");
        let out = tempfile::tempdir().unwrap();
        let log = out.path().join("logs/sc2.log");
        fs::write(
            r.join("upstream-sync.json"),
            format!(r#"{{"dependencies": [{{"path": "tinygrad_repo", "commit": "{PIN}"}}]}}"#),
        )
        .unwrap();
        let job = compile_job(&request("sc2"), std::slice::from_ref(&s), out.path(), &log);
        let err = c.compile(&job, &pin, &mut |_| {}).unwrap_err();
        assert!(matches!(err, Error::MarkerMismatch { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("upstream-sync.json") && text.contains(PIN) && text.contains(revision),
            "{text}"
        );
        fs::write(r.join("upstream-sync.json"), b"{}").unwrap();
        let err = c.compile(&job, &pin, &mut |_| {}).unwrap_err();
        assert!(matches!(err, Error::MarkerUnreadable { .. }), "{err}");
        assert!(err.to_string().contains("no `dependencies`"), "{err}");
        assert!(dev.calls().is_empty(), "./models ran: {:?}", dev.calls());
    }
}

#[test]
fn compile_refuses_on_a_wrong_or_missing_marker_before_models_runs() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(Some(OTHER));
    let src = tempfile::tempdir().unwrap();
    let s = onnx(src.path(), "driving_supercombo.onnx", b"onnx-a");
    let out = tempfile::tempdir().unwrap();
    let c = Compiler::connect(opts(&sshd, &dev)).unwrap();
    let log = out.path().join("logs/pop223.log");
    let mut lines = Vec::new();
    let err = c
        .compile(
            &compile_job(
                &request("pop223"),
                std::slice::from_ref(&s),
                out.path(),
                &log,
            ),
            &pin(),
            &mut |l| lines.push(l.to_string()),
        )
        .unwrap_err();
    assert!(matches!(err, Error::MarkerMismatch { .. }), "{err}");
    assert!(err.to_string().contains(OTHER) && err.to_string().contains(PIN));
    assert!(dev.calls().is_empty(), "./models ran: {:?}", dev.calls());
    assert!(lines.is_empty());
    // Nothing was staged either.
    assert!(names(&dev.remote_root().join("uncompiledmodels")).is_empty());

    fs::remove_file(dev.remote_root().join("tinygrad_repo/TINYGRAD_COMMIT")).unwrap();
    let err = c
        .compile(
            &compile_job(&request("pop223"), &[s], out.path(), &log),
            &pin(),
            &mut |_| {},
        )
        .unwrap_err();
    assert!(matches!(err, Error::MarkerMissing { .. }), "{err}");
    assert!(dev.calls().is_empty());
}

#[test]
fn compile_clears_a_stale_input_and_fetches_a_verified_chunk_set() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(Some(PIN));
    // An earlier run left another model's source behind; with it the compiler would see two
    // supercombo inputs.
    let staging = dev.remote_root().join("uncompiledmodels");
    onnx(&staging, "old_driving_supercombo.onnx", b"stale");
    // And an earlier, different output of this very model.
    let remote_out = dev.remote_root().join("compiledmodels");
    onnx(
        &remote_out,
        "pop223_driving_tinygrad.pkl.chunk01of09",
        b"old output",
    );
    dev.set("artifact_size", "2500");
    dev.set("chunk_size", "1000");

    let src = tempfile::tempdir().unwrap();
    let s = onnx(
        src.path(),
        "pop223_driving_supercombo.onnx",
        b"the real source",
    );
    let out = tempfile::tempdir().unwrap();
    // An older set in --out with another chunk count must be replaced, not mixed in.
    onnx(
        out.path(),
        "pop223_driving_tinygrad.pkl.chunk01of05",
        b"older",
    );
    let log = out.path().join("logs/pop223.log");
    let c = Compiler::connect(opts(&sshd, &dev)).unwrap();
    let mut lines = Vec::new();
    let a = c
        .compile(
            &compile_job(&request("pop223"), &[s], out.path(), &log),
            &pin(),
            &mut |l| lines.push(l.to_string()),
        )
        .unwrap();

    assert_eq!(a.chunk_count, 3);
    assert_eq!(a.size, 2500);
    let calls = dev.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(
        calls[0].ends_with("inputs=pop223_driving_supercombo.onnx"),
        "{}",
        calls[0]
    );
    assert!(calls[0].starts_with("--pop223 --version v16 --input-dir "));
    // Live output, prefixed, and the same text in the log.
    assert!(
        lines.iter().any(|l| l == "[device] wrote 3 chunk(s)"),
        "{lines:?}"
    );
    let logged = fs::read_to_string(&log).unwrap();
    assert!(logged.contains("compiled pop223 (2500 bytes)"));
    assert_eq!(
        names(out.path()),
        [
            "logs",
            "pop223_driving_tinygrad.pkl.chunk01of03",
            "pop223_driving_tinygrad.pkl.chunk02of03",
            "pop223_driving_tinygrad.pkl.chunk03of03",
            "pop223_driving_tinygrad.pkl.chunkmanifest",
            "pop223_driving_tinygrad.pkl.sha256",
        ]
    );
    let report = chunker::verify(
        &out.path().join("pop223_driving_tinygrad.pkl"),
        &chunker::Expected {
            sha256: Some(a.sha256),
            chunk_count: Some(3),
            size: Some(2500),
            chunk_sha256: None,
            ..chunker::Expected::default()
        },
    )
    .unwrap();
    assert_eq!(report.sha256, a.sha256);
    // The remote directories are clean again.
    assert!(names(&staging).is_empty(), "{:?}", names(&staging));
    assert!(names(&remote_out).is_empty(), "{:?}", names(&remote_out));
}

#[test]
fn split_gpu_and_local_builds() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(Some(PIN));
    let src = tempfile::tempdir().unwrap();
    let v = onnx(src.path(), "driving_vision.onnx", b"vision");
    let p = onnx(src.path(), "driving_policy.onnx", b"policy");
    let out = tempfile::tempdir().unwrap();
    let c = Compiler::connect(opts(&sshd, &dev)).unwrap();
    let mut r = request("tr14223");
    r.input_format = InputFormat::Split;
    r.version = "v11".parse().unwrap();
    r.gpu = true;
    let a = c
        .compile(
            &compile_job(
                &r,
                &[v.clone(), p.clone()],
                out.path(),
                &out.path().join("l.log"),
            ),
            &pin(),
            &mut |_| {},
        )
        .unwrap();
    assert!(a.chunk_count >= 1);
    let call = dev.calls().pop().unwrap();
    assert!(
        call.contains("--tr14223 --version v11 --gpu --input-format split"),
        "{call}"
    );
    assert!(
        call.ends_with("inputs=driving_policy.onnx,driving_vision.onnx"),
        "{call}"
    );

    r.local = true;
    r.gpu = false;
    let a = c
        .compile(
            &compile_job(&r, &[v, p], out.path(), &out.path().join("l2.log")),
            &pin(),
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(a.chunk_count, 0);
    assert_eq!(a.name, "local-tr14223_driving_tinygrad.pkl");
    assert!(
        out.path()
            .join("local-tr14223_driving_tinygrad.pkl")
            .is_file()
    );
    assert!(dev.calls().pop().unwrap().starts_with("--local-tr14223 "));
}

#[test]
fn a_failed_compile_and_a_digest_mismatch_name_the_log_and_write_nothing() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(Some(PIN));
    let src = tempfile::tempdir().unwrap();
    let s = onnx(src.path(), "driving_supercombo.onnx", b"src");
    let out = tempfile::tempdir().unwrap();
    let log = out.path().join("logs/sc23.log");
    let c = Compiler::connect(opts(&sshd, &dev)).unwrap();

    dev.set("fail", "sc23");
    let err = c
        .compile(
            &compile_job(&request("sc23"), std::slice::from_ref(&s), out.path(), &log),
            &pin(),
            &mut |_| {},
        )
        .unwrap_err();
    match &err {
        Error::CompileFailed {
            model,
            log: l,
            status,
        } => {
            assert_eq!(model, "sc23");
            assert_eq!(l, &log);
            assert_eq!(status, "exit code 3");
        }
        e => panic!("{e}"),
    }
    assert!(err.to_string().contains(&log.display().to_string()));
    assert!(
        fs::read_to_string(&log)
            .unwrap()
            .contains("injected failure")
    );
    assert_eq!(names(out.path()), ["logs"]);
    assert!(names(&dev.remote_root().join("uncompiledmodels")).is_empty());

    dev.clear("fail");
    dev.set("corrupt", "sc23");
    let err = c
        .compile(
            &compile_job(&request("sc23"), &[s], out.path(), &log),
            &pin(),
            &mut |_| {},
        )
        .unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains("sc23.log"));
    assert_eq!(
        names(out.path()),
        ["logs"],
        "a mismatching artifact was kept"
    );
    assert!(names(&dev.remote_root().join("compiledmodels")).is_empty());
}

#[test]
fn dm_needs_all_four_files() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(Some(PIN));
    let src = tempfile::tempdir().unwrap();
    let s = onnx(src.path(), "dmonitoring_model.onnx", b"dm source");
    let out = tempfile::tempdir().unwrap();
    let remote_dm: RemotePath = dev
        .remote_root()
        .join("dm_artifacts")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let c = Compiler::connect(opts(&sshd, &dev)).unwrap();

    dev.set("dm_missing", "dm_warp_1344x760_tinygrad.pkl");
    let log = out.path().join("dm.log");
    let err = c
        .build_dm(
            &DmJob {
                sources: vec![s.clone()],
                remote_out: remote_dm.clone(),
                out: out.path().join("dm"),
                log: log.clone(),
            },
            &pin(),
            &mut |_| {},
        )
        .unwrap_err();
    match &err {
        Error::DmIncomplete { missing, .. } => {
            assert_eq!(missing, &["dm_warp_1344x760_tinygrad.pkl"])
        }
        e => panic!("{e}"),
    }
    assert!(names(&out.path().join("dm")).is_empty());

    dev.clear("dm_missing");
    let files = c
        .build_dm(
            &DmJob {
                sources: vec![s],
                remote_out: remote_dm.clone(),
                out: out.path().join("dm"),
                log: log.clone(),
            },
            &pin(),
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(files.len(), 4);
    assert_eq!(
        names(&out.path().join("dm")),
        [
            "dm_warp_1344x760_tinygrad.pkl",
            "dm_warp_1928x1208_tinygrad.pkl",
            "dmonitoring_model_metadata.pkl",
            "dmonitoring_model_tinygrad.pkl",
        ]
    );
    assert!(dev.calls().last().unwrap().starts_with("--dm --input-dir "));
}

#[test]
fn another_host_is_refused_without_the_flag() {
    // No sshd needed: the policy is checked before anything touches the network.
    let mut o = ConnectOptions {
        destination: "comma@192.168.3.109".parse().unwrap(),
        ..ConnectOptions::default()
    };
    match Compiler::connect(o.clone()) {
        Err(Error::OtherCompiler { destination, .. }) => {
            assert_eq!(destination, "comma@192.168.3.109")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("connected to an unapproved compiler"),
    }
    o.destination = Destination::default();
    assert!(o.destination.check_policy(false).is_ok());
}

#[test]
fn the_loopback_host_is_refused_without_the_flag_even_though_it_is_up() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(Some(PIN));
    let mut o = opts(&sshd, &dev);
    o.allow_other_compiler = false;
    assert!(matches!(
        Compiler::connect(o.clone()),
        Err(Error::OtherCompiler { .. })
    ));
    o.allow_other_compiler = true;
    assert!(Compiler::connect(o).is_ok());
}

#[test]
fn validate_returns_the_device_verdict() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(Some(PIN));
    let src = tempfile::tempdir().unwrap();
    let s = onnx(src.path(), "driving_supercombo.onnx", b"src");
    let out = tempfile::tempdir().unwrap();
    let c = Compiler::connect(opts(&sshd, &dev)).unwrap();
    c.compile(
        &compile_job(
            &request("rdf43"),
            &[s],
            out.path(),
            &out.path().join("c.log"),
        ),
        &pin(),
        &mut |_| {},
    )
    .unwrap();
    let models: RemotePath = dev.models_dir().to_str().unwrap().parse().unwrap();
    let v = c
        .validate(
            &ValidateJob {
                id: "rdf43".parse().unwrap(),
                version: "v15".parse().unwrap(),
                artifact: out.path().join("rdf43_driving_tinygrad.pkl"),
                models_dir: models.clone(),
                python: "python3".into(),
                log: out.path().join("v.log"),
                latency_bound: None,
            },
            &pin(),
            &mut |_| {},
        )
        .unwrap();
    assert!(v.passed, "{}", v.verdict);
    assert_eq!(v.verdict["model"], "rdf43");
    assert_eq!(v.verdict["version"], "v15");
    assert_eq!(v.verdict["artifact_sha256"], v.artifact_sha256.to_string());
    // The copies sent for validation are removed again.
    assert!(names(&dev.models_dir()).is_empty());
}

/// Regression: the compiler's host key was accepted on first use (`accept-new`). An unknown key
/// is now refused with the first-connect step, and nothing is added to known_hosts.
#[test]
fn an_unknown_host_key_is_refused_not_learnt() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(None);
    let (cfg, known_hosts) = sshd.ssh_config_without_host_key();
    let mut o = opts(&sshd, &dev);
    o.ssh_config = Some(cfg);
    let err = Compiler::connect(o)
        .err()
        .expect("an unknown host key is refused");
    assert!(matches!(err, Error::HostKeyNotKnown { .. }), "{err}");
    let text = err.to_string();
    for part in [
        "never accepted on first use",
        "ssh-keygen -lf",
        "--ssh-config",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
    assert_eq!(
        fs::read_to_string(&known_hosts).unwrap(),
        "",
        "key was learnt"
    );
    // The pinned config still connects.
    Compiler::connect(opts(&sshd, &dev)).unwrap();
}

/// The dry run renders the very plan the real run executes: for sync, compile, DM and validate
/// against the loopback compiler, the steps each dry run lists are the steps the session ran,
/// in order and as rendered, and `./models` ran with the arguments its step names. A build that
/// fails runs its plan up to the failure, then the plan's cleanup step.
#[test]
fn each_real_run_executes_exactly_the_steps_its_dry_run_renders() {
    let Some(sshd) = Sshd::start() else { return };
    let dev = DeviceRoot::new(None);
    let o = opts(&sshd, &dev);
    let local = tempfile::tempdir().unwrap();
    openpilot_tree(local.path(), &dev, PIN);
    let src = tempfile::tempdir().unwrap();
    let s = onnx(src.path(), "driving_supercombo.onnx", b"src");
    let out = tempfile::tempdir().unwrap();
    // An earlier set the compile replaces (the dry run lists it as removed).
    onnx(out.path(), "rdf43_driving_tinygrad.pkl.chunk01of05", b"old");
    let c = Compiler::connect(o.clone()).unwrap();
    let rendered = |steps: &[Step]| steps.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut expected = Vec::new();
    let mut check = |plan: dry_run::Plan, c: &Compiler| {
        expected.extend(plan.steps);
        assert_eq!(rendered(&c.steps_run()), rendered(&expected));
        assert_eq!(c.steps_run(), expected);
    };

    let plan = dry_run::sync(&o, local.path(), &pin()).unwrap();
    assert_eq!(plan.steps.len(), 6);
    c.sync(local.path(), &pin()).unwrap();
    check(plan, &c);

    let job = compile_job(
        &request("rdf43"),
        std::slice::from_ref(&s),
        out.path(),
        &out.path().join("c.log"),
    );
    let plan = dry_run::compile(&o, &job, &pin()).unwrap();
    assert_eq!(
        plan.removes,
        [out.path().join("rdf43_driving_tinygrad.pkl.chunk01of05")]
    );
    let models = plan.steps[3].to_string();
    c.compile(&job, &pin(), &mut |_| {}).unwrap();
    let call = dev.calls().pop().unwrap();
    let args = call.split(" | inputs=").next().unwrap();
    assert!(
        models.contains(&format!("./models {args} 2>&1")),
        "{models} / {call}"
    );
    check(plan, &c);

    let job = DmJob {
        sources: vec![onnx(src.path(), "dmonitoring_model.onnx", b"dm")],
        remote_out: dev
            .remote_root()
            .join("dm")
            .to_str()
            .unwrap()
            .parse()
            .unwrap(),
        out: out.path().join("dm"),
        log: out.path().join("dm.log"),
    };
    let plan = dry_run::dm(&o, &job, &pin()).unwrap();
    c.build_dm(&job, &pin(), &mut |_| {}).unwrap();
    check(plan, &c);

    let job = ValidateJob {
        id: "rdf43".parse().unwrap(),
        version: "v15".parse().unwrap(),
        artifact: out.path().join("rdf43_driving_tinygrad.pkl"),
        models_dir: dev.models_dir().to_str().unwrap().parse().unwrap(),
        python: "python3".into(),
        log: out.path().join("v.log"),
        latency_bound: None,
    };
    let (plan, set) = dry_run::validate(&o, &job, &pin()).unwrap();
    let verdict = c.validate(&job, &pin(), &mut |_| {}).unwrap();
    assert_eq!(verdict.artifact_sha256, set.sha256);
    check(plan, &c);

    // A failed build: everything up to `./models`, then the cleanup; nothing fetched.
    dev.set("fail", "sc23");
    let job = compile_job(
        &request("sc23"),
        &[s],
        out.path(),
        &out.path().join("f.log"),
    );
    let plan = dry_run::compile(&o, &job, &pin()).unwrap();
    c.compile(&job, &pin(), &mut |_| {}).unwrap_err();
    let ran = c.steps_run();
    let ran = &ran[ran.len() - 5..];
    assert_eq!(ran[..4], plan.steps[..4]);
    assert!(matches!(plan.steps[4], Step::Fetch { .. }));
    assert_eq!(ran[4], plan.steps[5]);
}
