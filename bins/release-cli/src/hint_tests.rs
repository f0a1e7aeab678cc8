//! Every next step the scenarios below print runs as printed: each scenario runs in-process
//! through the binary's own parser and `cmd::run`, and every command its failure names (the
//! `next:` line, which is also the `next` of the `--json` error document, and the commands in the
//! message's lines, as the validation gate lists them) is checked against `Cli::command()` by
//! [`test_support::hints::check_hint`]: the subcommand and flags exist, required flags are
//! present, and a placeholder left in is one the hint explains.

use std::path::Path;

use clap::{CommandFactory, Parser};
use cli_support::Failure;
use test_support::hints::check_hint;

use crate::cmd::Cli;

/// The argument-vector builders the integration tests use too.
#[path = "../tests/common/argv.rs"]
mod argv;

const BIN: &str = "release-cli";
const PIN: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";
/// A made-up next generation and its made-up pin.
const NEXT_GEN: &str = "v26";
const NEXT_PIN: &str = "0123456789abcdef0123456789abcdef01234567";

/// The failure of `release-cli ARGS`, run in-process; `None` when it succeeded.
fn run(args: &[&str]) -> Option<Failure> {
    run_capturing(args).0
}

/// [`run`], with the `next:` lines it printed on stderr (a success's next step).
fn run_capturing(args: &[&str]) -> (Option<Failure>, Vec<String>) {
    let argv = std::iter::once(BIN).chain(args.iter().copied());
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{args:?} does not parse: {e}"));
    let (r, lines) = cli_support::capture_info(|| crate::cmd::run(cli.command));
    let next = lines
        .into_iter()
        .filter(|l| l.starts_with("next:"))
        .collect();
    (r.err().map(|e| e.0), next)
}

/// The texts that carry commands: the next step and each line of the message.
fn hint_texts(f: &Failure) -> Vec<String> {
    f.next
        .iter()
        .cloned()
        .chain(f.message.lines().map(str::to_string))
        .collect()
}

#[derive(Default)]
struct Collector {
    hints: Vec<(String, String)>,
    problems: Vec<String>,
}

impl Collector {
    fn check(&mut self, scenario: &str, hint: &str) {
        let cmd = Cli::command();
        for p in check_hint(&cmd, BIN, hint) {
            self.problems
                .push(format!("{scenario}: {p}\n    in: {hint}"));
        }
        self.hints.push((scenario.to_string(), hint.to_string()));
    }

    /// Run a scenario that must fail, and check what it prints.
    fn failing(&mut self, scenario: &str, args: &[&str]) -> Failure {
        let (f, printed) = run_capturing(args);
        let f = f.unwrap_or_else(|| panic!("{scenario}: {args:?} succeeded"));
        for h in hint_texts(&f).into_iter().chain(printed) {
            self.check(scenario, &h);
        }
        f
    }

    /// Run a scenario that must succeed, and check the `next:` lines it prints; how many.
    fn succeeding(&mut self, scenario: &str, args: &[&str]) -> usize {
        let (f, printed) = run_capturing(args);
        if let Some(f) = f {
            panic!(
                "{scenario}: {args:?} failed: {}\nnext: {:?}",
                f.message, f.next
            );
        }
        for h in &printed {
            self.check(scenario, h);
        }
        printed.len()
    }

    fn finish(self, at_least: usize) {
        for (s, h) in &self.hints {
            eprintln!("hint [{s}]: {h}");
        }
        assert!(
            self.problems.is_empty(),
            "hints that do not run as printed:\n{}",
            self.problems.join("\n")
        );
        let with_commands = self
            .hints
            .iter()
            .filter(|(_, h)| h.contains("`release-cli "))
            .count();
        assert!(
            with_commands >= at_least,
            "only {with_commands} hints named a release-cli command: {:?}",
            self.hints
        );
    }
}

/// A chunked artifact of `pop223` in `dir/artifacts/pop223/` and a manifest of `generation`
/// pinned to `pin` listing it.
fn release(dir: &Path, generation: &str, pin: &str) -> (String, String) {
    let payload: Vec<u8> = (0..2400u32).map(|i| (i % 251) as u8).collect();
    let data = test_support::published::oob_container(&payload, 1000);
    let pkl = dir.join("build/pop223_driving_tinygrad.pkl");
    std::fs::create_dir_all(pkl.parent().unwrap()).unwrap();
    std::fs::write(&pkl, &data).unwrap();
    let artifacts = dir.join("artifacts");
    let out = artifacts.join("pop223");
    assert!(
        run(&[
            "chunk",
            "split",
            pkl.to_str().unwrap(),
            "--out-dir",
            out.to_str().unwrap(),
            "--chunk-size",
            "1000",
        ])
        .is_none()
    );
    let sha = test_support::published::sha256_hex(&data);
    let doc = serde_json::json!({"generation": generation, "tinygrad_commit": pin, "models": [{
        "id": "pop223", "name": "pop223", "version": "v15", "series": "OP Series",
        "released": "2025-06-01", "community_favorite": false,
        "artifact_format": "tinygrad_single_v1", "artifact_size": data.len(),
        "artifact_sha256": sha, "artifact_chunk_count": data.len().div_ceil(1000), "uses_external_gpu": false}]});
    let manifest = dir.join(format!("model_names_{generation}.json"));
    std::fs::write(&manifest, doc.to_string()).unwrap();
    (
        artifacts.to_str().unwrap().to_string(),
        manifest.to_str().unwrap().to_string(),
    )
}

/// The validation gate's refusal, for v25 and a made-up next generation: every gap line's
/// command (preflight, validate, validate --check, rehearse) parses, with the workspace and the
/// pin filled in.
#[test]
fn the_validation_gates_hints_run() {
    for (generation, pin) in [("v25", PIN), (NEXT_GEN, NEXT_PIN)] {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let (artifacts, manifest) = release(tmp.path(), generation, pin);
        // The built set in the workspace, as `rebuild` leaves it: a device check is bound to
        // the artifacts in `ready/` it was made on.
        let ready = ws.join("ready/pop223");
        std::fs::create_dir_all(&ready).unwrap();
        for e in std::fs::read_dir(Path::new(&artifacts).join("pop223")).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), ready.join(e.file_name())).unwrap();
        }
        let store = tmp.path().join("store");
        let mut c = Collector::default();
        let publish = [
            "publish",
            "--generation",
            generation,
            "--manifest",
            &manifest,
            "--artifacts",
            &artifacts,
            "--to",
            store.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
        ];
        let f = c.failing(&format!("{generation} publish with no records"), &publish);
        assert!(!store.exists(), "a refused publish wrote the store");
        let lines = hint_texts(&f).join("\n");
        for want in [
            format!("--workspace {}`", ws.display()),
            format!("--tinygrad-commit {pin}"),
            "--by NAME".to_string(),
            "--model pop223".to_string(),
        ] {
            assert!(lines.contains(&want), "{want} missing from:\n{lines}");
        }
        c.finish(1);

        // The device-check hints run as printed (with the values the hint asks for filled in)
        // and cover their cells: the next refusal no longer lists them.
        let top: Vec<String> = Cli::command()
            .get_subcommands()
            .map(|s| s.get_name().to_string())
            .collect();
        let top: Vec<&str> = top.iter().map(String::as_str).collect();
        let mut ran = 0;
        for line in f.message.lines().filter(|l| l.contains("validate --check")) {
            for argv in test_support::hints::commands_for(line, BIN, &top) {
                let filled: Vec<&str> = argv[1..]
                    .iter()
                    .map(|w| match w.as_str() {
                        "TEXT" => "steady at 20 Hz",
                        "NAME" => "ana",
                        w => w,
                    })
                    .collect();
                if let Some(f) = run(&filled) {
                    panic!("{filled:?} failed: {}\nnext: {:?}", f.message, f.next);
                }
                ran += 1;
            }
        }
        assert_eq!(ran, 3, "model-v2 and driver-state at two resolutions");
        let again = run(&publish).expect("still refused: no validation");
        assert!(
            !again.message.contains("validate --check"),
            "{}",
            again.message
        );
        assert!(
            again.message.contains("validate --model pop223"),
            "{}",
            again.message
        );
        assert!(!store.exists(), "a refused publish wrote the store");
    }
}

/// The gate's rule over the made-up generation directly (publish refuses it before the gate):
/// every line `decide` makes for a workspace names runnable commands.
#[test]
fn the_gates_lines_run_for_a_made_up_generation_too() {
    for (generation, pin) in [("v25", PIN), (NEXT_GEN, NEXT_PIN)] {
        let doc = serde_json::json!({"generation": generation, "tinygrad_commit": pin,
            "models": [{"id": "a15", "name": "a15", "version": "v15", "series": "OP Series",
            "released": "2025-06-01", "community_favorite": false,
            "artifact_format": "tinygrad_single_v1", "artifact_size": 5,
            "artifact_sha256": "ab".repeat(32), "artifact_chunk_count": 1,
            "uses_external_gpu": true}]});
        let m = manifest::Manifest::from_slice(doc.to_string().as_bytes()).unwrap();
        let cov = release::gate::coverage(&m, &release::gate::Records::default());
        let ws = Path::new("/tmp/rebuild ws");
        let e = release::gate::decide(Some(ws), Some(&cov), None).unwrap_err();
        let f = Failure::from_error(3, "check_failed", &e);
        let mut c = Collector::default();
        for h in hint_texts(&f) {
            c.check(&format!("{generation} gate"), &h);
        }
        assert!(
            f.message.contains("--workspace '/tmp/rebuild ws'`"),
            "{}",
            f.message
        );
        assert!(f.message.contains(&format!("--generation {generation} ")));
        c.finish(4);
    }
}

/// Publish refusals and chunk errors: each failure's next step runs as printed.
#[test]
fn refusals_and_chunk_errors_print_hints_that_run() {
    let tmp = tempfile::tempdir().unwrap();
    let (artifacts, manifest) = release(tmp.path(), "v25", PIN);
    // A plain pickle, not an OOB container, listed with its own digest.
    let plain_dir = tmp.path().join("plain");
    let (plain_artifacts, plain_manifest) = release(&plain_dir, "v25", PIN);
    let plain = format!("{plain_artifacts}/pop223");
    for e in std::fs::read_dir(&plain).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let bytes: Vec<u8> = (0..2400u32).map(|i| (i % 7) as u8).collect();
    let pkl = plain_dir.join("build/pop223_driving_tinygrad.pkl");
    std::fs::write(&pkl, &bytes).unwrap();
    assert!(
        run(&[
            "chunk",
            "split",
            pkl.to_str().unwrap(),
            "--out-dir",
            &plain,
            "--chunk-size",
            "1000"
        ])
        .is_none()
    );
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&plain_manifest).unwrap()).unwrap();
    doc["models"][0]["artifact_sha256"] = test_support::published::sha256_hex(&bytes).into();
    doc["models"][0]["artifact_size"] = bytes.len().into();
    std::fs::write(&plain_manifest, doc.to_string()).unwrap();
    let next_dir = tmp.path().join("next");
    let (next_artifacts, next_manifest) = release(&next_dir, NEXT_GEN, NEXT_PIN);
    let store = tmp.path().join("store");
    let store = store.to_str().unwrap();
    let missing = tmp.path().join("nothing/here.pkl");
    let missing = missing.to_str().unwrap();
    let empty_ws = tmp.path().join("no-such-ws");
    // A workspace whose v24 release was set aside, listing a model the v25 manifest leaves out.
    let left_ws = tmp.path().join("left out ws");
    let v24 = left_ws.join("generations/v24/ready");
    std::fs::create_dir_all(&v24).unwrap();
    let row = |id: &str| serde_json::json!({"id": id, "name": id, "version": "v15"});
    let doc = serde_json::json!({"generation": "v24", "models": [row("pop223"), row("gwm8")]});
    std::fs::write(v24.join("model_names_v24.json"), doc.to_string()).unwrap();
    let mut c = Collector::default();
    let own = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    let publish = |generation: &str, manifest: &str, artifacts: &str, extra: &[&str]| {
        argv::publish_argv(generation, manifest, artifacts, &[store], extra)
    };
    let scenarios: Vec<(&str, Vec<String>)> = vec![
        (
            "publish without --workspace",
            publish("v25", &manifest, &artifacts, &[]),
        ),
        (
            "publish with an empty skip reason",
            publish("v25", &manifest, &artifacts, &["--skip-validation", " "]),
        ),
        (
            "publish of a generation the manifest is not",
            publish(
                NEXT_GEN,
                &manifest,
                &artifacts,
                &["--skip-validation", "test"],
            ),
        ),
        (
            "publish with a missing workspace",
            publish(
                "v25",
                &manifest,
                &artifacts,
                &["--workspace", empty_ws.to_str().unwrap()],
            ),
        ),
        (
            "publish of a generation with no recorded pin",
            publish(
                NEXT_GEN,
                &next_manifest,
                &next_artifacts,
                &["--skip-validation", "test"],
            ),
        ),
        (
            "publish of an artifact that is not OOB",
            publish(
                "v25",
                &plain_manifest,
                &plain_artifacts,
                &["--skip-validation", "test"],
            ),
        ),
        (
            "first publish leaving out a model of the previous generation",
            publish(
                "v25",
                &manifest,
                &artifacts,
                &[
                    "--workspace",
                    left_ws.to_str().unwrap(),
                    "--skip-validation",
                    "test",
                ],
            ),
        ),
        (
            "chunk verify of a missing file",
            own(&["chunk", "verify", missing]),
        ),
        (
            "chunk join of a missing file",
            own(&["chunk", "join", missing, "--output", missing]),
        ),
        (
            "manifest validate of a missing file",
            own(&["manifest", "validate", missing]),
        ),
        (
            "audit of an empty store",
            own(&["audit", "--generation", "v25", "--store", store]),
        ),
    ];
    for (name, args) in &scenarios {
        c.failing(name, &argv::strs(args));
    }
    assert!(!Path::new(store).exists(), "a refusal wrote the store");
    c.finish(0);
}

/// The wrong-passphrase and reuse refusals' next steps, as the errors give them.
#[test]
fn key_and_reuse_hints_run() {
    use cli_support::NextStep;
    let mut c = Collector::default();
    let e = artifact_store::Error::Key {
        path: "/keys/release.key".into(),
        problem: artifact_store::signing::KeyProblem::WrongPassphrase,
    };
    let next = e.next_step().unwrap();
    assert!(next.contains("`minisign -S -s /keys/release.key -m /dev/null -x /dev/null`"));
    c.check("wrong passphrase", &next);
    c.finish(0);
}

/// The commands `audit` prints to mend a store (`mend:`, the `mend` of its JSON) parse for every
/// store kind, signed or not, for v25 and a made-up next generation; paths with spaces are
/// quoted as one word.
#[test]
fn audits_mend_commands_run() {
    use release::audit::{MendContext, StoreRef};
    let mut c = Collector::default();
    let stores = [
        StoreRef::Local {
            root: "/srv/release store".into(),
        },
        StoreRef::Hub {
            bucket: "starpilot/models".into(),
        },
        StoreRef::Github {
            checkout: "/srv/models checkout".into(),
            branch: "Models".into(),
        },
    ];
    let contexts = [
        MendContext {
            workspace: "/home/ana/rebuild ws".into(),
            sign_keys: vec!["/keys/release.key".into()],
            openpilot: Some("/home/ana/openpilot".into()),
        },
        // `audit`'s default workspace.
        MendContext {
            workspace: ".".into(),
            ..MendContext::default()
        },
    ];
    for generation in ["v25", NEXT_GEN] {
        let g: manifest::Generation = generation.parse().unwrap();
        for store in &stores {
            for ctx in &contexts {
                for signed in [false, true] {
                    let mend = ctx.republish(g, store, signed);
                    assert!(mend.starts_with("release-cli publish "), "{mend}");
                    c.check(&format!("audit mend {generation}"), &format!("`{mend}`"));
                    let cmd = Cli::command();
                    let words = test_support::hints::commands_for(&format!("`{mend}`"), BIN, &[]);
                    assert_eq!(words.len(), 1);
                    // The store is one word, whatever its path.
                    let to = words[0].iter().position(|w| w == "--to").unwrap();
                    assert_eq!(words[0][to + 1], store.spec(), "{mend}");
                    assert!(cmd.try_get_matches_from(&words[0]).is_ok(), "{mend}");
                }
            }
        }
    }
    c.finish(24);
}

/// What successes print next: a chunk split and join, a publish (dry run and real, unsigned) with
/// validation skipped, for v25 and a made-up v26.
#[test]
fn successes_print_next_steps_that_run() {
    for (generation, pin) in [("v25", PIN), (NEXT_GEN, NEXT_PIN)] {
        let tmp = tempfile::tempdir().unwrap();
        let (artifacts, manifest) = release(tmp.path(), generation, pin);
        let store = tmp.path().join("store");
        let store = store.to_str().unwrap();
        let joined = tmp.path().join("joined.pkl");
        let set = format!("{artifacts}/pop223/pop223_driving_tinygrad.pkl");
        let mut c = Collector::default();
        let mut printed = 0;
        // The made-up generation's pin is recorded in the openpilot tree, as `tinygrad bump`
        // records it.
        let op = tmp.path().join("openpilot");
        std::fs::create_dir_all(op.join("tinygrad_repo")).unwrap();
        std::fs::write(op.join("tinygrad_repo/TINYGRAD_COMMIT"), format!("{pin}\n")).unwrap();
        std::fs::write(
            op.join(manifest::pins::PINS_FILE),
            format!("{{\n  \"v25\": \"{PIN}\",\n  \"v26\": \"{NEXT_PIN}\"\n}}\n"),
        )
        .unwrap();
        let op = op.to_str().unwrap().to_string();
        let publish = |extra: &[&'static str]| -> Vec<String> {
            let mut a: Vec<String> = [
                "publish",
                "--generation",
                generation,
                "--manifest",
                &manifest,
                "--artifacts",
                &artifacts,
                "--to",
                store,
                "--skip-validation",
                "hint test",
            ]
            .map(String::from)
            .to_vec();
            a.extend(extra.iter().map(|s| s.to_string()));
            if generation == NEXT_GEN {
                a.extend(["--openpilot".to_string(), op.clone()]);
            }
            a
        };
        let scenarios: Vec<(&str, Vec<String>)> = vec![
            (
                "chunk split",
                [
                    "chunk",
                    "split",
                    &tmp.path()
                        .join("build/pop223_driving_tinygrad.pkl")
                        .to_string_lossy(),
                    "--out-dir",
                    &tmp.path().join("again").to_string_lossy(),
                    "--chunk-size",
                    "1000",
                ]
                .map(String::from)
                .to_vec(),
            ),
            (
                "chunk join",
                [
                    "chunk",
                    "join",
                    set.as_str(),
                    "--output",
                    &joined.to_string_lossy(),
                ]
                .map(String::from)
                .to_vec(),
            ),
            ("publish --dry-run", publish(&["--dry-run"])),
            ("publish", publish(&[])),
        ];
        for (name, args) in &scenarios {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            printed += c.succeeding(&format!("{generation} {name}"), &args);
        }
        assert!(printed >= 4, "{generation}: {:?}", c.hints);
        c.finish(3);
    }
}

/// `status`'s rebuild step, as `status` prints it (the command, then its reason in parentheses),
/// runs as printed for v25 and a made-up v26: the source map and the base manifest each have a
/// placeholder of their own, and the reason says what each one is.
#[test]
fn the_status_rebuild_step_names_each_file() {
    for generation in ["v25", NEXT_GEN] {
        let n = release::status::rebuild_step("/ws", generation, "/op", "pop223 is stale");
        let printed = format!("next       {}\n           ({})", n.command, n.why);
        let problems = check_hint(&Cli::command(), BIN, &printed);
        assert!(problems.is_empty(), "{printed}: {problems:?}");
        // Quoted, the command's own words do not count as explaining its placeholders.
        let quoted = format!("`{}` ({})", n.command, n.why);
        let problems = check_hint(&Cli::command(), BIN, &quoted);
        assert!(problems.is_empty(), "{quoted}: {problems:?}");
        // One name per file: no placeholder stands for two values.
        let mut placeholders: Vec<&str> = n
            .command
            .split_whitespace()
            .filter(|w| cli_support::hints::is_placeholder(w))
            .collect();
        let all = placeholders.len();
        placeholders.sort();
        placeholders.dedup();
        assert_eq!(placeholders.len(), all, "{}", n.command);
        assert!(
            n.command
                .contains("--source-map SOURCE_MAP --base-manifest BASE_MANIFEST")
        );
        assert!(n.command.contains(&format!("--generation {generation} ")));
    }
}

/// The hints issue 26 found failing when copied, as they were printed: the checker refuses each.
#[test]
fn the_known_wrong_hints_are_caught() {
    let cmd = Cli::command();
    for old in [
        "stable modelV2 from modeld: missing: check it on the device, then `release-cli validate \
         --check model-v2 --passed --note TEXT --workspace WS`",
        "validate one of pop223 (`release-cli validate --model ID --workspace WS`)",
        "run `release-cli rehearse --generation vNN --manifest FILE --artifacts DIR --openpilot \
         DIR --workspace WS`",
        "next: devices pick up v25 on their next refresh; try it offline with `release-cli serve \
         --store DIR` and `device-modeld-manager refresh`",
        "record the new generation's pin with `release-cli tinygrad bump` and pass --openpilot",
        "next: `release-cli compile --model ID …` for one model",
        "next: release-cli publish --artifacts ws/ready --manifest ws/ready/model_names_v25.json",
        "next: `release-cli publish --generation v25 --manifest m.json --workspace ws …`",
        "nothing was written; rebuild x for this generation with `release-cli compile` (names \
         and release dates do not prove compatibility)",
        "`release-cli rebuild --workspace /ws --generation v25 --openpilot /op --source-map FILE \
         --base-manifest FILE` (pop223 is stale)",
    ] {
        assert!(!check_hint(&cmd, BIN, old).is_empty(), "not caught: {old}");
    }
}

/// `reuse` into a local store, for v25 and a made-up v26 (its pin recorded in the openpilot
/// tree): a refused reuse (another source commit) and a reuse that succeeds print next steps
/// that parse, and the publish a success names runs as printed with DIR and WS filled in: it
/// reaches the validation gate (it is not refused for a missing --workspace).
#[test]
fn reuse_hints_run() {
    const SRC: &str = "1111111111111111111111111111111111111111";
    for (generation, pin) in [("v25", PIN), (NEXT_GEN, NEXT_PIN)] {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let payload: Vec<u8> = (0..1400u32).map(|i| (i % 13) as u8).collect();
        let data = test_support::published::oob_container(&payload, 1000);
        let src = root.join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("x.pkl"), &data).unwrap();
        let x = src.join("x.pkl");
        let x = x.to_str().unwrap();
        assert!(run(&["chunk", "split", x, "--chunk-size", "1000"]).is_none());
        std::fs::remove_file(src.join("x.pkl")).unwrap();
        let sha = test_support::published::sha256_hex(&data);
        let count = data.len().div_ceil(1000);
        let catalog = root.join("catalog.json");
        std::fs::write(
            &catalog,
            serde_json::json!({"tinygrad_commit": pin, "models": [{
                "id": "x", "name": "x", "version": "v15", "series": "OP Series",
                "released": "2025-06-01", "community_favorite": false,
                "artifact_format": "tinygrad_single_v1", "artifact_size": data.len(),
                "artifact_sha256": sha, "artifact_chunk_count": count,
                "uses_external_gpu": false, "source_commit": SRC}]})
            .to_string(),
        )
        .unwrap();
        let ours = root.join(format!("model_names_{generation}.json"));
        std::fs::write(
            &ours,
            serde_json::json!({"generation": generation, "tinygrad_commit": pin, "models": [{
                "id": "pop223", "name": "pop223", "version": "v15", "series": "OP Series",
                "released": "2025-06-01", "community_favorite": false,
                "artifact_format": "tinygrad_single_v1", "artifact_size": 3,
                "artifact_sha256": "ab".repeat(32), "artifact_chunk_count": 1,
                "uses_external_gpu": false}]})
            .to_string(),
        )
        .unwrap();
        let op = root.join("openpilot");
        std::fs::create_dir_all(&op).unwrap();
        std::fs::write(
            op.join(manifest::pins::PINS_FILE),
            format!("{{\n  \"v25\": \"{PIN}\",\n  \"v26\": \"{NEXT_PIN}\"\n}}\n"),
        )
        .unwrap();
        let store = root.join("store");
        let (catalog, ours, op, store_s) = (
            catalog.to_str().unwrap(),
            ours.to_str().unwrap(),
            op.to_str().unwrap(),
            store.to_str().unwrap(),
        );
        let reuse = |source_commit: &'static str| -> Vec<String> {
            [
                "reuse",
                "--model",
                "pop223",
                "--source-id",
                "x",
                "--from",
                x,
                "--source-catalog",
                catalog,
                "--source-commit",
                source_commit,
                "--tinygrad-commit",
                pin,
                "--to",
                store_s,
                "--generation",
                generation,
                "--manifest",
                ours,
                "--openpilot",
                op,
            ]
            .map(String::from)
            .to_vec()
        };
        let strs = |v: &[String]| {
            v.iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join("\u{0}")
        };
        let mut c = Collector::default();
        let refused = reuse("2222222222222222222222222222222222222222");
        let refused = strs(&refused);
        c.failing(
            &format!("{generation} reuse of another source commit"),
            &refused.split('\u{0}').collect::<Vec<_>>(),
        );
        assert!(!store.exists(), "a refused reuse wrote the store");
        let ok = reuse(SRC);
        let ok = strs(&ok);
        let ok: Vec<&str> = ok.split('\u{0}').collect();
        let (f, printed) = run_capturing(&ok);
        assert!(
            f.is_none(),
            "{generation} reuse: {:?}",
            f.map(|f| f.message)
        );
        let next = printed
            .iter()
            .find(|l| l.contains("`release-cli publish"))
            .unwrap_or_else(|| panic!("no publish hint in {printed:?}"))
            .clone();
        c.check(&format!("{generation} reuse"), &next);
        c.finish(2);

        // Run it as printed, with DIR an empty directory holding pop223/ and WS a workspace.
        let dir = root.join("empty");
        std::fs::create_dir_all(dir.join("pop223")).unwrap();
        let ws = root.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let words = &test_support::hints::commands_for(&next, BIN, &[])[0];
        let mut filled: Vec<String> = words[1..]
            .iter()
            .map(|w| match w.as_str() {
                "DIR" => dir.display().to_string(),
                "WS" => ws.display().to_string(),
                w => w.to_string(),
            })
            .collect();
        if generation == NEXT_GEN {
            // The made-up pin is in the tree's table, which publish reads with --openpilot.
            filled.extend(["--openpilot".to_string(), op.to_string()]);
        }
        let filled: Vec<&str> = filled.iter().map(String::as_str).collect();
        let f = run(&filled).expect("refused by the validation gate: no records");
        assert_eq!(f.code, 3, "{}", f.message);
        assert!(
            f.message
                .contains("do not cover the seed's validation matrix"),
            "{}",
            f.message
        );
    }
}

/// A stand-in openpilot checkout at tinygrad `pin`: `./dev` and `.venv/bin/pytest` scripts,
/// pytest exiting `pytest_exit`.
fn stand_in_checkout(dir: &Path, pin: &str, pytest_exit: i32) -> String {
    use std::os::unix::fs::PermissionsExt;
    let op = dir.join("openpilot");
    std::fs::create_dir_all(op.join("tinygrad_repo")).unwrap();
    std::fs::write(op.join("tinygrad_repo/TINYGRAD_COMMIT"), format!("{pin}\n")).unwrap();
    for (path, body) in [
        ("dev", "#!/bin/sh\necho \"syncing $*\"\n".to_string()),
        (
            ".venv/bin/pytest",
            format!("#!/bin/sh\necho \"pytest $*\"\nexit {pytest_exit}\n"),
        ),
    ] {
        let p = op.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    op.to_str().unwrap().to_string()
}

/// `preflight`'s next steps (dry run, pass, failure), for v25's pin and a made-up one: each
/// parses, with the workspace filled in.
#[test]
fn preflight_hints_run() {
    for pin in [PIN, NEXT_PIN] {
        let mut c = Collector::default();
        for (exit, dry) in [(0, true), (0, false), (1, false)] {
            let tmp = tempfile::tempdir().unwrap();
            let op = stand_in_checkout(tmp.path(), pin, exit);
            let ws = tmp.path().join("rebuild ws");
            let ws = ws.to_str().unwrap();
            let mut args = vec!["preflight", "--openpilot", &op, "--workspace", ws];
            if dry {
                args.push("--dry-run");
            }
            let scenario = format!("preflight {pin} exit {exit} dry {dry}");
            if exit == 0 {
                assert!(
                    c.succeeding(&scenario, &args) >= 1,
                    "{scenario}: no next line"
                );
            } else {
                c.failing(&scenario, &args);
            }
        }
        assert!(
            c.hints.iter().any(|(_, h)| h.contains("/rebuild ws'`")),
            "{:?}",
            c.hints
        );
        c.finish(1);
    }
}

/// The generation guard's refusal of an artifact carried from the previous generation names a
/// rebuild that runs as printed (the text names no generation: `vNN` is explained, so it reads
/// the same for v25 into v26 as for any made-up later pair); the old bare `release-cli rebuild`
/// is caught.
#[test]
fn the_carried_artifact_refusal_names_a_rebuild_that_runs() {
    let cmd = Cli::command();
    for (id, variant) in [("pop223", None), ("gwm", Some("chestnut".to_string()))] {
        let change = manifest::GenerationChange::Carried {
            id: id.parse().unwrap(),
            variant: variant.clone(),
            sha256: manifest::Sha256Digest::of_bytes(id.as_bytes()),
            from: id.parse().unwrap(),
            from_variant: variant,
        };
        let text = change.to_string();
        assert!(text.contains("`release-cli rebuild --"), "{text}");
        assert_eq!(check_hint(&cmd, BIN, &text), Vec::<String>::new(), "{text}");
    }
    let old = "~ model pop: artifact artifact_sha256 x is the previous generation's artifact of \
               model pop, compiled with the previous tinygrad (rebuild it for this generation \
               with `release-cli rebuild`, or drop the variant; never carry an artifact across \
               generations)";
    assert!(!check_hint(&cmd, BIN, old).is_empty(), "not caught: {old}");
}

/// The tree and source-map hints run as printed, for v25's pin and a made-up v26 (and a v27
/// after it, whose map starts from v26's): `source-map next`'s next step (the rebuild from the
/// map it wrote), its refusal of a map with other content, rebuild's refusal of a missing map
/// (naming `source-map next`), a tree whose `MANIFEST_CANDIDATES` names another generation
/// (refused by preflight, with the edit), and the gate's line for a preflight of uncommitted
/// changes (the preflight to run again, workspace filled in).
#[test]
fn tree_and_source_map_hints_run() {
    let v27_pin = "2727272727272727272727272727272727272727";
    for (generation, pin) in [("v25", PIN), (NEXT_GEN, NEXT_PIN), ("v27", v27_pin)] {
        let tmp = tempfile::tempdir().unwrap();
        let op = stand_in_checkout(tmp.path(), pin, 0);
        let opp = Path::new(&op);
        std::fs::write(
            opp.join(manifest::pins::PINS_FILE),
            format!("{{\"v26\": \"{NEXT_PIN}\", \"v27\": \"{v27_pin}\"}}\n"),
        )
        .unwrap();
        let g: manifest::Generation = generation.parse().unwrap();
        let mut c = Collector::default();
        // The previous generation's map (for v25, the map is written from a v24 one).
        let previous = g.previous().unwrap();
        std::fs::create_dir_all(opp.join("scripts")).unwrap();
        std::fs::write(
            opp.join(format!("scripts/model_source_map_{previous}.json")),
            r#"{"pop223": {"source_id": "pop22", "input_format": "split"}}"#,
        )
        .unwrap();
        let ws = tmp.path().join("ws");
        let ws = ws.to_str().unwrap();
        let map = opp.join(format!("scripts/model_source_map_{generation}.json"));
        let map = map.to_str().unwrap();
        // rebuild before the map exists: refused, naming source-map next (v25's pin is built
        // in; the made-up ones need a synced tree, so rebuild's unit test covers them).
        if generation == "v25" {
            let f = c.failing(
                &format!("{generation} rebuild without its source map"),
                &[
                    "rebuild",
                    "--workspace",
                    ws,
                    "--source-map",
                    map,
                    "--base-manifest",
                    map,
                    "--generation",
                    generation,
                    "--tinygrad-commit",
                    pin,
                    "--dry-run",
                ],
            );
            assert!(
                f.message.contains("release-cli source-map next"),
                "{}",
                f.message
            );
        }
        let scenario = format!("{generation} source-map next");
        assert_eq!(
            c.succeeding(&scenario, &["source-map", "next", "--openpilot", &op]),
            1
        );
        assert!(Path::new(map).is_file());
        std::fs::write(map, "{}\n").unwrap();
        let f = c.failing(
            &format!("{generation} source-map next over a hand-edited map"),
            &["source-map", "next", "--openpilot", &op],
        );
        assert!(f.message.contains("--dry-run --json"), "{}", f.message);
        // A tree selecting another generation than its tinygrad's.
        std::fs::create_dir_all(opp.join("starpilot/assets")).unwrap();
        std::fs::write(
            opp.join("starpilot/assets/model_manager.py"),
            format!("MANIFEST_CANDIDATES = (\"{previous}\",)\n"),
        )
        .unwrap();
        let f = c.failing(
            &format!("{generation} preflight of a tree selecting {previous}"),
            &["preflight", "--openpilot", &op, "--workspace", ws],
        );
        assert!(
            f.message
                .contains(&format!("set it to (\"{generation}\",)")),
            "{}",
            f.message
        );
        c.finish(2);
    }
    // The gate's line for a preflight of uncommitted changes names the preflight to run again.
    let m = manifest::Manifest::from_slice(
        format!(
            r#"{{"generation": "v25", "tinygrad_commit": "{PIN}", "models": [{{"id": "pop223",
            "name": "P", "version": "v11", "artifact_format": "tinygrad_single_v1",
            "artifact_size": 5, "artifact_sha256": "{}", "artifact_chunk_count": 1}}]}}"#,
            "ab".repeat(32)
        )
        .as_bytes(),
    )
    .unwrap();
    let p = release::gate::PreflightRecord {
        openpilot: "/home/me/open pilot".into(),
        openpilot_commit: None,
        openpilot_dirty: Some(true),
        tinygrad_commit: PIN.parse().unwrap(),
        commands: vec![],
        passed: true,
        finished_at: manifest::UnixSeconds(1),
        log: "/ws/logs/preflight.log".into(),
    };
    let records = release::gate::Records {
        preflight: Some(p),
        ..Default::default()
    };
    let cov = release::gate::coverage(&m, &records);
    let mut c = Collector::default();
    let line = cov
        .gap_lines()
        .into_iter()
        .find(|l| l.starts_with("preflight"))
        .unwrap();
    let line = release::gate::fill_workspace(&line, Some(Path::new("/r ws")));
    assert!(
        line.contains("--openpilot '/home/me/open pilot' --workspace '/r ws'`"),
        "{line}"
    );
    c.check("a preflight of uncommitted changes", &line);
    c.finish(1);
}
