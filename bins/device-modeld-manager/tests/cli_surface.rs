//! The CLI surface for operators: `--json` on `download` and `resolve`, `completions`,
//! the exit-code table in `--help`, and errors that say what to do next. The real binary
//! against a real HTTP server on 127.0.0.1.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common::*;
use test_support::http_server::{Fault, FaultServer};
use test_support::published::{artifact_bytes, manifest_json, publish_model, write_manifest};

const CHUNK: usize = 64 * 1024;

/// A fresh device (no params, no models) and an origin publishing v25 with `pop223`.
struct Fresh {
    device: Device,
    server: FaultServer,
}

impl std::ops::Deref for Fresh {
    type Target = Device;
    fn deref(&self) -> &Device {
        &self.device
    }
}

impl Fresh {
    fn new() -> Fresh {
        let device = Device::new();
        let root = device.dir.path().join("origin");
        fs::create_dir_all(&root).unwrap();
        let pop = publish_model(
            &root,
            "v25",
            "pop223",
            &artifact_bytes(7, 3 * CHUNK + 5),
            Some(CHUNK),
        );
        write_manifest(&root, "v25", manifest_json("v25", &[pop], true).as_bytes());
        let server = FaultServer::start(&root).unwrap();
        Fresh { device, server }
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(&self.server.url(), args).output().unwrap()
    }
}

/// Every path under `dir` with its bytes (directories as `None`), to compare before and after.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.push((p.clone(), None));
                todo.push(p);
            } else {
                out.push((p.clone(), Some(fs::read(&p).unwrap())));
            }
        }
    }
    out.sort();
    out
}

fn ok(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().expect("a line on stdout");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn download_and_resolve_report_as_json() {
    let w = Fresh::new();
    ok(&w.run(&["refresh", "--json"]));
    let installed = w.data().join("models/pop223_driving_tinygrad.pkl");

    // The selection of a fresh device is the built-in: resolve says so.
    let r = ok(&w.run(&["resolve", "--json"]));
    assert_eq!(r["id"], "rdf43");
    assert_eq!(r["builtin"], true);
    assert_eq!(
        Path::new(r["path"].as_str().unwrap()),
        w.builtin().join("driving_tinygrad.pkl")
    );

    // First download fetches it, the second finds it verified and fetches nothing.
    let d = ok(&w.run(&["download", "pop223", "--json"]));
    assert_eq!(d["models"][0]["id"], "pop223");
    assert_eq!(d["models"][0]["downloaded"], true);
    assert_eq!(
        Path::new(d["models"][0]["path"].as_str().unwrap()),
        installed
    );
    assert!(installed.is_file());
    w.server.clear_requests();
    let d = ok(&w.run(&["download", "--all", "--json"]));
    assert_eq!(d["models"].as_array().unwrap().len(), 1);
    assert_eq!(d["models"][0]["downloaded"], false);
    assert!(w.server.requests().is_empty(), "{:?}", w.server.requests());

    // The built-in is never downloaded, and its path is the built-in's, not /data/models.
    let d = ok(&w.run(&["download", "rdf43", "--json"]));
    assert_eq!(d["models"][0]["downloaded"], false);
    assert_eq!(
        Path::new(d["models"][0]["path"].as_str().unwrap()),
        w.builtin().join("driving_tinygrad.pkl")
    );
    let human = w.run(&["download", "rdf43"]);
    assert_eq!(
        String::from_utf8_lossy(&human.stdout).trim(),
        w.builtin()
            .join("driving_tinygrad.pkl")
            .display()
            .to_string()
    );

    // Once selected (the UI writes the params), resolve points at the verified install.
    let params = w.data().join("params/d");
    for key in ["Model", "DrivingModel"] {
        fs::write(params.join(key), "pop223").unwrap();
    }
    let r = ok(&w.run(&["resolve", "--json"]));
    assert_eq!(r["id"], "pop223");
    assert_eq!(r["builtin"], false);
    assert_eq!(Path::new(r["path"].as_str().unwrap()), installed);
    // Without --json the last line stays the bare path (the modeld contract).
    let plain = w.run(&["resolve"]);
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout).lines().last(),
        Some(installed.display().to_string().as_str())
    );
}

#[test]
fn errors_say_what_to_do_next() {
    let w = Fresh::new();
    // No catalog yet.
    let out = w.run(&["download", "pop223"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("run `refresh` while online"),
        "{}",
        stderr(&out)
    );

    // Offline: exit 5, and the next step is named (with what the offline first boot did).
    w.server.add_fault("/*", Fault::Status(503), None);
    let out = w.run(&["refresh"]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("next: check the network"),
        "{}",
        stderr(&out)
    );

    // A bad ID is named, with where to find good ones.
    let out = w.run(&["download", "../x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("../x") && stderr(&out).contains("next:"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn download_failure_names_the_next_step_and_keeps_exit_4() {
    let w = Fresh::new();
    ok(&w.run(&["refresh", "--json"]));
    w.server
        .add_fault("/hf/models/v25/pop223/*", Fault::Status(404), None);
    w.server
        .add_fault("/gh/v25/pop223/*", Fault::Status(404), None);
    let out = w.run(&["download", "pop223", "--json"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one error document");
    assert_eq!(v["error"]["kind"], "download_failed", "{v}");
    assert!(
        v["error"]["next"]
            .as_str()
            .unwrap()
            .starts_with("the previously installed model"),
        "{v}"
    );
    assert!(
        stderr(&out).contains("next: the previously installed model"),
        "{}",
        stderr(&out)
    );
    assert!(!w.data().join("models/pop223_driving_tinygrad.pkl").exists());
}

#[test]
fn help_lists_the_exit_codes() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for line in [
        "Exit codes",
        "3  busy",
        "5  no origin served a valid manifest",
        "8  not enough free space",
    ] {
        assert!(help.contains(line), "{line:?} missing from:\n{help}");
    }
}

#[test]
fn completions_for_every_shell_name_the_subcommands() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = String::from_utf8_lossy(&out.stdout);
        for word in ["device-modeld-manager", "refresh", "resolve", "data-dir"] {
            assert!(script.contains(word), "{shell}: {word} missing");
        }
    }
    // Completions never touch a device: no data dir is created for them.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = Command::new(BIN)
        .arg("--data-dir")
        .arg(&data)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!data.exists());
    let out = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

#[test]
fn completions_into_a_closed_pipe_do_not_panic() {
    let mut child = Command::new(BIN)
        .args(["completions", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read one byte, then close the pipe, as `| head -c1` would.
    let mut stdout = child.stdout.take().unwrap();
    let mut one = [0u8; 1];
    stdout.read_exact(&mut one).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.status.success(), "{err}");
}

#[test]
fn every_command_that_reports_has_json_with_a_documented_shape() {
    let top = String::from_utf8_lossy(&Command::new(BIN).arg("--help").output().unwrap().stdout)
        .into_owned();
    let subs: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|n| n != "help")
        .collect();
    assert!(subs.len() >= 8, "{subs:?}");
    for sub in subs {
        // `run` is the daemon (it reports through params) and `completions` prints a script.
        if sub == "run" || sub == "completions" {
            continue;
        }
        let help = String::from_utf8_lossy(
            &Command::new(BIN)
                .args([&sub, "--help"])
                .output()
                .unwrap()
                .stdout,
        )
        .into_owned();
        let at = help
            .find("--json")
            .unwrap_or_else(|| panic!("`{sub}` has no --json:\n{help}"));
        let own: String = help[at..]
            .lines()
            .enumerate()
            .take_while(|(i, l)| *i == 0 || !l.trim_start().starts_with('-'))
            .map(|(_, l)| l)
            .collect();
        assert!(
            own.contains('{'),
            "`{sub} --json` does not document its shape:\n{help}"
        );
    }
}

/// Regression: clap_complete labels a hyphenated binary's `case` arms differently from the state
/// its word loop builds, so bash completed file names after the first word.
#[test]
fn bash_completes_past_the_first_word() {
    let out = Command::new(BIN)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    let script = String::from_utf8_lossy(&out.stdout);
    let complete = |words: &[&str]| test_support::shell::bash_complete(&script, words);
    let top = complete(&["device-modeld-manager", ""]);
    for sub in ["status", "refresh", "download", "resolve"] {
        assert!(top.contains(&sub.to_string()), "{top:?}");
    }
    let flags = complete(&["device-modeld-manager", "download", "--al"]);
    assert_eq!(flags, ["--all"], "download --al<TAB>");
    let flags = complete(&["device-modeld-manager", "status", "--js"]);
    assert_eq!(flags, ["--json"], "status --js<TAB>");
}

/// Regression: `--data-dir /nonexistent status` answered for an empty device and exited 0.
#[test]
fn a_missing_data_dir_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nonexistent");
    let file = dir.path().join("file");
    fs::write(&file, b"x").unwrap();
    for (data, says) in [(&missing, "No such file"), (&file, "not a directory")] {
        for sub in [
            &["status"][..],
            &["status", "--json"],
            &["gc"],
            &["resolve"],
        ] {
            let out = Command::new(BIN)
                .arg("--data-dir")
                .arg(data)
                .args(sub)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(1), "{sub:?}: {}", stderr(&out));
            let err = stderr(&out);
            assert!(err.contains("--data-dir") && err.contains(says), "{err}");
            if sub.contains(&"--json") {
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                assert_eq!(v["error"]["kind"], "failure", "{v}");
            } else {
                assert!(out.stdout.is_empty());
            }
        }
    }
    assert!(!missing.exists(), "the data dir was created");
}

/// Regression: with `--json`, a failure (here `refresh` offline) printed no JSON at all.
#[test]
fn json_failures_print_one_error_document_and_keep_the_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    fs::create_dir_all(&data).unwrap();
    // A port nothing listens on: every origin is offline.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let run = |args: &[&str]| {
        Command::new(BIN)
            .arg("--data-dir")
            .arg(&data)
            .arg("--openpilot-dir")
            .arg(openpilot_tree(&data))
            .args(["--hf-base", &url, "--github-base", &url])
            .arg("--memory-params-dir")
            .arg(dir.path().join("shm"))
            .arg("--builtin-dir")
            .arg(dir.path().join("builtin"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["refresh", "--json"]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 1, "one document: {text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["kind"], "manifest_unavailable", "{v}");
    assert!(!v["error"]["message"].as_str().unwrap().is_empty(), "{v}");
    assert!(
        v["error"]["next"].as_str().unwrap().contains("refresh"),
        "{v}"
    );
    // Without --json, stdout stays empty and the message goes to stderr.
    let out = run(&["refresh"]);
    assert_eq!(out.status.code(), Some(5));
    assert!(out.stdout.is_empty());
    assert!(stderr(&out).contains("next: "));
    // `download --json` of an unknown id: kind failure, exit 1.
    let out = run(&["download", "--json", "Not An Id"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["kind"], "failure", "{v}");
}

#[test]
fn gc_dry_run_lists_what_gc_removes_and_changes_nothing() {
    let w = Fresh::new();
    ok(&w.run(&["refresh", "--json"]));
    let models = w.data().join("models");
    fs::write(models.join("gone223_driving_tinygrad.pkl"), b"old").unwrap();
    fs::write(models.join(".tmp-stale"), b"x").unwrap();
    fs::write(models.join("local-mine_driving_tinygrad.pkl"), b"mine").unwrap();
    let _ = fs::remove_file(models.join(".manager.lock"));
    let before = snapshot(&w.data());

    let plan = ok(&w.run(&["gc", "--dry-run", "--json"]));
    assert_eq!(plan["dry_run"], true);
    let would: Vec<String> = serde_json::from_value(plan["would_remove"].clone()).unwrap();
    assert_eq!(would, [".tmp-stale", "gone223_driving_tinygrad.pkl"]);
    let out = w.run(&["gc", "--dry-run"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "would remove .tmp-stale\nwould remove gone223_driving_tinygrad.pkl\n"
    );
    assert_eq!(
        snapshot(&w.data()),
        before,
        "a dry run changes nothing, not even the lock"
    );

    let done = ok(&w.run(&["gc", "--json"]));
    assert_eq!(done["removed"], plan["would_remove"]);
    assert!(!models.join("gone223_driving_tinygrad.pkl").exists());
    assert!(models.join("local-mine_driving_tinygrad.pkl").exists());
}

#[test]
fn quiet_prints_only_the_answer_and_verbose_each_step() {
    // Two fresh devices, so both refreshes do the same work; the origins' ports differ.
    let answer = |w: &Fresh, out: &Output| {
        String::from_utf8_lossy(&out.stdout).replace(&w.server.url(), "ORIGIN")
    };
    let w = Fresh::new();
    let normal = w.run(&["refresh"]);
    assert!(normal.status.success(), "{}", stderr(&normal));
    assert!(stderr(&normal).contains("next: "), "{}", stderr(&normal));
    let normal = answer(&w, &normal);

    let w = Fresh::new();
    let quiet = w.run(&["-q", "refresh"]);
    assert!(quiet.status.success(), "{}", stderr(&quiet));
    assert_eq!(stderr(&quiet), "", "no progress, no hints");
    assert_eq!(answer(&w, &quiet), normal, "the answer is the same");

    let verbose = w.run(&["download", "pop223", "--verbose"]);
    assert!(verbose.status.success(), "{}", stderr(&verbose));
    let err = stderr(&verbose);
    assert!(
        err.contains(&format!("data dir {}", w.data().display())) && err.contains("origins http"),
        "{err}"
    );
    // The SHA-256 code in use is named: the CPU's instructions, or the portable fallback.
    let backend = err
        .lines()
        .find_map(|l| {
            l.split_once("SHA-256 backend: ")
                .map(|(_, b)| b.to_string())
        })
        .unwrap_or_else(|| panic!("no SHA-256 backend named: {err}"));
    assert_eq!(backend, chunker::hash_backend(), "{err}");
    let status = w.run(&["status", "-v"]);
    assert!(
        stderr(&status).contains(&format!("SHA-256 backend: {backend}")),
        "{}",
        stderr(&status)
    );
    // Off a terminal the default logs each tenth; -v every percentage it reaches.
    let lines = err
        .lines()
        .filter(|l| l.starts_with("pop223 ") && l.ends_with('%'));
    assert!(lines.count() > 11, "{err}");
    let quiet = w.run(&["download", "pop223", "-q"]);
    assert_eq!(stderr(&quiet), "");
    assert_eq!(
        String::from_utf8_lossy(&quiet.stdout).trim_end(),
        w.data()
            .join("models/pop223_driving_tinygrad.pkl")
            .display()
            .to_string()
    );
    // A failure still says why under -q.
    let fail = w.run(&["-q", "verify", "nope223"]);
    assert_eq!(fail.status.code(), Some(1));
    assert!(stderr(&fail).starts_with("error: "), "{}", stderr(&fail));
    let both = w.run(&["-q", "-v", "status"]);
    assert_eq!(both.status.code(), Some(2), "-q and -v conflict");
}

/// `status --json | head -c1` and `status | head -c1`: the closed pipe ends the output quietly.
#[test]
fn status_into_a_closed_pipe_does_not_panic() {
    let w = Fresh::new();
    ok(&w.run(&["refresh", "--json"]));
    for json in [true, false] {
        let mut args = vec!["status"];
        if json {
            args.push("--json");
        }
        let mut child = w
            .command(&w.server.url(), &args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        stdout.read_exact(&mut [0u8; 1]).unwrap();
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{err}");
        assert!(out.status.success(), "json {json}: {err}");
    }
}

/// No GET of a model byte: only manifests, `.chunkmanifest`, `.sha256` sidecars and `HEAD`s.
fn payload_requests(w: &Fresh) -> Vec<String> {
    w.server
        .requests()
        .into_iter()
        .filter(|r| {
            r.method == "GET"
                && !r.path.ends_with(".json")
                && !r.path.ends_with(".json.minisig")
                && !r.path.ends_with(".chunkmanifest")
                && !r.path.ends_with(".sha256")
        })
        .map(|r| r.path)
        .collect()
}

#[test]
fn refresh_dry_run_predicts_the_migration_and_changes_nothing() {
    let w = Fresh::new();
    // A v24 device selecting pop223, with a v24 artifact and legacy parts to purge.
    w.make_v24(
        &[
            "pop223_driving_tinygrad.pkl",
            "old1_driving_tinygrad.pkl.p01",
        ],
        "",
    );
    let before = snapshot(w.dir.path());

    let plan = ok(&w.run(&["refresh", "--dry-run", "--json"]));
    assert_eq!(plan["dry_run"], true);
    assert_eq!(plan["migrating"], true, "{plan}");
    assert_eq!(plan["would_download"][0]["id"], "pop223", "{plan}");
    assert_eq!(plan["selected"], "pop223", "{plan}");
    let list = |k: &str| -> Vec<String> { serde_json::from_value(plan[k].clone()).unwrap() };
    assert!(
        list("would_purge").contains(&"pop223_driving_tinygrad.pkl".to_string()),
        "{plan}"
    );
    assert!(
        list("would_write").contains(&".catalog.json".to_string()),
        "{plan}"
    );
    assert!(
        plan["would_set_params"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["key"] == "ModelManifestVersion" && p["value"] == "v25"),
        "{plan}"
    );
    let human = w.run(&["refresh", "--dry-run"]);
    let text = String::from_utf8_lossy(&human.stdout);
    for want in [
        "would migrate from ",
        "would purge pop223_driving_tinygrad.pkl",
        "would download pop223 (installed: missing)",
        "would write .catalog.json",
        "would set param ModelManifestVersion = v25",
        "would select pop223",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    assert_eq!(
        snapshot(w.dir.path()),
        before,
        "a dry run writes nothing: no lock, no param, no cache"
    );
    assert_eq!(payload_requests(&w), Vec::<String>::new());

    // Driving: refused as the real run is (exit 9), before one request.
    w.set_param("IsOnroad", "1");
    let before = snapshot(w.dir.path());
    w.server.clear_requests();
    for args in [
        &["refresh", "--dry-run"][..],
        &["download", "--all", "--dry-run"],
    ] {
        let out = w.run(args);
        assert_eq!(out.status.code(), Some(9), "{args:?}: {}", stderr(&out));
    }
    assert!(w.server.requests().is_empty());
    assert_eq!(snapshot(w.dir.path()), before);
    w.set_param("IsOnroad", "0");

    // The real run does what the dry run said.
    let done = ok(&w.run(&["refresh", "--json"]));
    assert_eq!(done["selected"], plan["selected"]);
    assert_eq!(done["purged"], plan["would_purge"]);
    assert!(w.models().join(".catalog.json").exists());
    assert_eq!(w.param("ModelManifestVersion").as_deref(), Some("v25"));
    // Now nothing is left to do but keep the verified selection.
    let again = ok(&w.run(&["refresh", "--dry-run", "--json"]));
    assert_eq!(again["migrating"], false, "{again}");
    assert_eq!(again["would_download"], serde_json::json!([]), "{again}");
    assert_eq!(
        again["would_keep"],
        serde_json::json!(["pop223"]),
        "{again}"
    );
    assert_eq!(again["would_write"], serde_json::json!([]), "{again}");
    assert_eq!(again["would_set_params"], serde_json::json!([]), "{again}");
}

/// Offline, the real refresh still migrates a v24 device to the built-in before it fails (exit
/// 5); its dry run fails the same way, names those effects in the error, and changes nothing.
#[test]
fn an_offline_refresh_dry_run_fails_as_the_refresh_and_names_what_it_still_does() {
    let w = Fresh::new();
    w.make_v24(&["pop223_driving_tinygrad.pkl"], "");
    let before = snapshot(w.dir.path());
    let offline = |args: &[&str]| w.command("http://127.0.0.1:1", args).output().unwrap();
    let out = offline(&["refresh", "--dry-run", "--json"]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let err: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(err["error"]["kind"], "manifest_unavailable", "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    for want in [
        "before failing, the real run would:",
        "to the built-in model offline",
        "purge pop223_driving_tinygrad.pkl",
        "write .migration.json",
        "set param Model = rdf43",
    ] {
        assert!(message.contains(want), "{want}: {err}");
    }
    assert!(err["error"]["next"].is_string(), "{err}");
    assert_eq!(snapshot(w.dir.path()), before);

    let real = offline(&["refresh"]);
    assert_eq!(real.status.code(), Some(5), "{}", stderr(&real));
    assert!(!w.models().join("pop223_driving_tinygrad.pkl").exists());
    assert_eq!(w.param("Model").as_deref(), Some("rdf43"));
}

#[test]
fn download_dry_run_names_what_it_would_fetch_and_changes_nothing() {
    let w = Fresh::new();
    ok(&w.run(&["refresh", "--json"]));
    ok(&w.run(&["download", "pop223", "--json"]));
    // A verified copy: nothing to fetch.
    let plan = ok(&w.run(&["download", "pop223", "--dry-run", "--json"]));
    assert_eq!(plan["models"][0]["action"], "installed", "{plan}");
    // Replace it with stale chunk-set leftovers: the dry run names the download and the cleanup.
    let models = w.models();
    fs::remove_file(models.join("pop223_driving_tinygrad.pkl")).unwrap();
    fs::write(models.join("pop223_driving_tinygrad.pkl.chunk01of02"), b"x").unwrap();
    let _ = fs::remove_file(models.join(".manager.lock"));
    w.server.clear_requests();
    let before = snapshot(w.dir.path());

    let plan = ok(&w.run(&["download", "pop223", "--dry-run", "--json"]));
    assert_eq!(plan["dry_run"], true);
    let a = &plan["models"][0]["artifacts"][0];
    assert_eq!(plan["models"][0]["action"], "download", "{plan}");
    assert_eq!(a["size"], 3 * CHUNK as u64 + 5, "{plan}");
    assert_eq!(a["pieces"], 4, "{plan}");
    assert_eq!(
        a["would_install"],
        serde_json::json!(["pop223_driving_tinygrad.pkl"]),
        "{plan}"
    );
    assert_eq!(
        a["would_remove"],
        serde_json::json!(["pop223_driving_tinygrad.pkl.chunk01of02"]),
        "{plan}"
    );
    let human = w.run(&["download", "--all", "--dry-run"]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("would download pop223_driving_tinygrad.pkl (")
            && text.contains("would remove pop223_driving_tinygrad.pkl.chunk01of02"),
        "{text}"
    );
    assert_eq!(snapshot(w.dir.path()), before, "no staging file, no lock");
    assert_eq!(payload_requests(&w), Vec::<String>::new());

    // The space check refuses as the real run would (exit 8), still writing nothing.
    let full = w.run(&[
        "download",
        "pop223",
        "--dry-run",
        "--json",
        "--space-margin-mib",
        "100000000",
    ]);
    assert_eq!(full.status.code(), Some(8), "{}", stderr(&full));
    let err: serde_json::Value = serde_json::from_slice(&full.stdout).unwrap();
    assert_eq!(err["error"]["kind"], "no_space");
    assert_eq!(snapshot(w.dir.path()), before);

    ok(&w.run(&["download", "pop223", "--json"]));
    assert!(
        !models
            .join("pop223_driving_tinygrad.pkl.chunk01of02")
            .exists()
    );
}

/// `verify` records what it hashed in `.verified.json`; `verify --dry-run` reports the same
/// states and exit code and writes nothing.
#[test]
fn verify_dry_run_reports_the_same_and_records_nothing() {
    let w = Fresh::new();
    ok(&w.run(&["refresh", "--json"]));
    ok(&w.run(&["download", "pop223", "--json"]));
    let models = w.models();
    let _ = fs::remove_file(models.join(".manager.lock"));
    fs::remove_file(models.join(".verified.json")).unwrap();
    let before = snapshot(w.dir.path());

    let dry = ok(&w.run(&["verify", "--dry-run", "--json"]));
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["models"][0]["id"], "pop223");
    assert_eq!(dry["models"][0]["state"], "verified", "{dry}");
    assert_eq!(snapshot(w.dir.path()), before, "no .verified.json");

    // Other bytes of the same size: the same refusal (exit 6) from both, only one records it.
    let path = models.join("pop223_driving_tinygrad.pkl");
    let mut bytes = fs::read(&path).unwrap();
    bytes[0] ^= 1;
    fs::write(&path, &bytes).unwrap();
    let before = snapshot(w.dir.path());
    let dry = w.run(&["verify", "pop223", "--dry-run", "--json"]);
    assert_eq!(dry.status.code(), Some(6), "{}", stderr(&dry));
    let text = String::from_utf8_lossy(&dry.stdout);
    assert!(text.contains(r#""state":"corrupt""#), "{text}");
    assert_eq!(snapshot(w.dir.path()), before);
    let real = w.run(&["verify", "pop223", "--json"]);
    assert_eq!(real.status.code(), Some(6));
    assert!(
        models.join(".verified.json").exists(),
        "the real run records it"
    );
}
