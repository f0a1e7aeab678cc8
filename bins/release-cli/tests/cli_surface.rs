//! The CLI surface as a whole, against the real binary: the exit-code table in `--help`,
//! `--json` on every command that reports, completions, `serve --json`, `manifest fmt --check
//! --json`, and the flag spellings shared across subcommands.

use crate::common::{BIN, cli, http_get, serve, text};

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

const PIN: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";

/// The subcommand names under `Commands:` in a help text, except `help`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect()
}

/// Every leaf subcommand path of a binary, with its help text.
fn leaves(bin: &str, path: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let o = Command::new(bin).args(path).arg("--help").output().unwrap();
    assert!(o.status.success(), "{path:?} --help");
    let help = text(&o.stdout);
    let subs = subcommands(&help);
    if subs.is_empty() {
        out.push((path.to_vec(), help));
    }
    for s in subs {
        let mut p = path.to_vec();
        p.push(s);
        leaves(bin, &p, out);
    }
}

#[test]
fn help_lists_the_exit_codes() {
    let help = text(&cli(&["--help"]).stdout);
    for line in [
        "Exit codes",
        "0  success",
        "2  usage error",
        "3  a check failed",
    ] {
        assert!(help.contains(line), "{line:?} missing from:\n{help}");
    }
}

#[test]
fn every_command_that_reports_has_json_with_a_documented_shape() {
    let mut all = Vec::new();
    leaves(BIN, &[], &mut all);
    let names: Vec<String> = all.iter().map(|(p, _)| p.join(" ")).collect();
    for must in [
        "chunk split",
        "publish",
        "serve",
        "tinygrad bump",
        "completions",
    ] {
        assert!(
            names.contains(&must.to_string()),
            "{must} not found in {names:?}"
        );
    }
    for (path, help) in &all {
        let name = path.join(" ");
        if name == "completions" {
            continue;
        }
        let json_line = help
            .lines()
            .find(|l| l.trim_start().starts_with("--json"))
            .unwrap_or_else(|| panic!("`{name}` has no --json:\n{help}"));
        // The shape is spelled out (an object or a JSON line), not just "as JSON": look at
        // the flag's own help, up to the next flag.
        let from_json = &help[help.find(json_line).unwrap()..];
        let own: String = from_json
            .lines()
            .enumerate()
            .take_while(|(i, l)| *i == 0 || !l.trim_start().starts_with('-'))
            .map(|(_, l)| l)
            .collect();
        assert!(
            own.contains('{'),
            "`{name} --json` does not document its shape:\n{help}"
        );
    }
}

#[test]
fn shared_flags_are_spelled_the_same_everywhere() {
    let mut all = Vec::new();
    leaves(BIN, &[], &mut all);
    for (path, help) in &all {
        let name = path.join(" ");
        for (flag, value) in [
            ("--generation", "<vNN>"),
            ("--hf-cli", "<PATH>"),
            ("--github-branch", "<BRANCH>"),
            ("--remote", "<[USER@]HOST>"),
            ("--tinygrad-commit", "<SHA>"),
            ("--openpilot", "<DIR>"),
            ("--model", "<ID>"),
        ] {
            for l in help.lines().filter(|l| l.contains(&format!("{flag} "))) {
                let l = l.trim_start();
                if l.starts_with(flag) {
                    assert!(
                        l.starts_with(&format!("{flag} {value}")),
                        "`{name}`: {flag} is not spelled `{flag} {value}`: {l}"
                    );
                }
            }
        }
    }
}

#[test]
fn completions_name_the_subcommands_and_survive_a_closed_pipe() {
    for shell in ["bash", "zsh", "fish"] {
        let o = cli(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", text(&o.stderr));
        let script = text(&o.stdout);
        for word in ["release-cli", "publish", "rebuild", "generation"] {
            assert!(script.contains(word), "{shell}: {word} missing");
        }
    }
    let mut child = Command::new(BIN)
        .args(["completions", "zsh"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    stdout.read_exact(&mut [0u8; 1]).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    assert!(
        !text(&out.stderr).contains("panicked"),
        "{}",
        text(&out.stderr)
    );
    assert!(out.status.success());
}

#[test]
fn serve_json_gives_the_device_base_urls() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    fs::create_dir_all(store.join("manifests")).unwrap();
    fs::create_dir_all(store.join("models/v25/pop223")).unwrap();
    fs::write(
        store.join("manifests/model_names_v25.json"),
        b"{\"models\": []}\n",
    )
    .unwrap();
    fs::write(store.join("models/v25/pop223/x.chunkmanifest"), b"1").unwrap();
    let server = serve(&["--json", "--store", store.to_str().unwrap()]);
    let v: serde_json::Value =
        serde_json::from_str(&server.first_line).expect("first line is JSON");
    let url = v["url"].as_str().unwrap().to_string();
    let get = |full: &str| {
        let path = full.strip_prefix(&url).expect("under the base URL");
        http_get(url.strip_prefix("http://").unwrap(), path)
    };
    let hf = v["hf_base"].as_str().unwrap();
    let gh = v["github_base"].as_str().unwrap();
    let r = get(&format!("{hf}/manifests/model_names_v25.json"));
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let r = get(&format!("{gh}/model_names_v25.json"));
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let r = get(&format!("{gh}/v25/pop223/x.chunkmanifest"));
    assert!(
        r.starts_with("HTTP/1.1 200") && r.ends_with("\r\n\r\n1"),
        "{r}"
    );
    assert_eq!(Path::new(v["store"].as_str().unwrap()), store);
}

#[test]
fn manifest_fmt_check_json() {
    let t = tempfile::tempdir().unwrap();
    let good = t.path().join("good.json");
    let bad = t.path().join("bad.json");
    let doc = "{\n  \"models\": [\n    {\n      \"id\": \"pop223\",\n      \"name\": \"Pop\"\n    }\n  ]\n}\n";
    fs::write(&good, doc).unwrap();
    fs::write(&bad, doc.replace('\n', "")).unwrap();
    let o = cli(&[
        "manifest",
        "fmt",
        "--check",
        "--json",
        good.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["canonical"], true);
    let o = cli(&[
        "manifest",
        "fmt",
        "--check",
        "--json",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(3));
    // The report says what failed: it is the whole --json answer.
    let out = text(&o.stdout);
    assert_eq!(out.lines().count(), 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(v["canonical"], false);
    assert_eq!(Path::new(v["file"].as_str().unwrap()), bad);
    // --json only means something with --check or --write (fmt itself prints the manifest).
    let o = cli(&["manifest", "fmt", "--json", good.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn out_and_out_dir_are_both_accepted() {
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("m_driving_tinygrad.pkl");
    fs::write(&file, vec![7u8; 3000]).unwrap();
    let out = t.path().join("set");
    let o = cli(&[
        "chunk",
        "split",
        file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--chunk-size",
        "1000",
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(out.join("m_driving_tinygrad.pkl.chunkmanifest").is_file());

    // compile and dm take --out-dir too; the refusal of another compiler comes after parsing
    // and before any network, so it proves the flag was accepted.
    for cmd in [
        vec![
            "compile",
            "--model",
            "pop223",
            "--version",
            "v11",
            "--source",
            "x.onnx",
        ],
        vec!["dm", "--source", "x.onnx"],
    ] {
        let mut args = cmd.clone();
        args.extend([
            "--out-dir",
            "o",
            "--remote",
            "other@127.0.0.1",
            "--tinygrad-commit",
            PIN,
        ]);
        let o = cli(&args);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains("allow-other-compiler"),
            "{cmd:?}: {}",
            text(&o.stderr)
        );
    }
}

/// Regression: clap_complete labels a hyphenated binary's `case` arms differently from the state
/// its word loop builds, so bash completed file names after the first word.
#[test]
fn bash_completes_past_the_first_word() {
    let script = text(&cli(&["completions", "bash"]).stdout);
    let complete = |words: &[&str]| test_support::shell::bash_complete(&script, words);
    let top = complete(&["release-cli", ""]);
    assert!(top.contains(&"chunk".to_string()), "{top:?}");
    let mut chunk = complete(&["release-cli", "chunk", ""]);
    chunk.sort();
    for sub in ["join", "split", "verify"] {
        assert!(chunk.contains(&sub.to_string()), "chunk <TAB>: {chunk:?}");
    }
    assert!(!chunk.contains(&"publish".to_string()), "{chunk:?}");
    let flags = complete(&["release-cli", "publish", "--gen"]);
    assert_eq!(flags, ["--generation"], "publish --gen<TAB>");
}

/// Regression: with `--json`, an error the argument parser found itself (a missing argument, a
/// bad value) printed clap's text only and nothing on stdout.
#[test]
fn parser_usage_errors_with_json_print_the_error_document() {
    for args in [
        &["chunk", "join", "x", "--json"][..],
        &["tinygrad", "bump", "--json", "--commit", "abc"],
    ] {
        let o = cli(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let out = text(&o.stdout);
        assert_eq!(out.lines().count(), 1, "{args:?}: {out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["error"]["kind"], "usage", "{v}");
        assert!(text(&o.stderr).starts_with("error: "), "{args:?}");
    }
    let o = cli(&["chunk", "join", "x"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty(), "no --json, no document");
}

/// A missing input file is one exit code, 1, for every command that reads one, and the message
/// names the path; nothing is created. (`manifest diff` keeps diff(1)'s 2, since its 1 means
/// "the manifests differ"; a missing `--sign-key` is a refused flag, 2.)
#[test]
fn a_missing_input_file_is_exit_1_for_every_command() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let gone = |name: &str| dir.join(name).display().to_string();
    let (json, pkl) = (gone("gone.json"), gone("gone.pkl"));
    let artifacts = dir.join("artifacts");
    fs::create_dir_all(&artifacts).unwrap();
    let a = artifacts.display().to_string();
    let store = gone("store");
    let sha = "00".repeat(32);
    let cases: Vec<Vec<&str>> = vec![
        vec!["manifest", "validate", &json],
        vec!["manifest", "fmt", &json],
        vec!["chunk", "verify", &pkl],
        vec!["chunk", "verify", &pkl, "--sha256", &sha],
        vec!["chunk", "join", &pkl, "--output", "out.pkl"],
        vec!["chunk", "oob", &pkl],
        vec!["chunk", "split", &pkl, "--out-dir", "out"],
        vec![
            "publish",
            "--generation",
            "v25",
            "--manifest",
            &json,
            "--artifacts",
            &a,
            "--to",
            &store,
            "--skip-validation",
            "test",
        ],
        vec![
            "reuse",
            "--model",
            "pop223",
            "--from",
            "hf://buckets/o/b/models/v25/pop223/pop223_driving_tinygrad.pkl",
            "--source-catalog",
            &json,
            "--source-commit",
            PIN,
            "--tinygrad-commit",
            PIN,
            "--to",
            &store,
            "--generation",
            "v25",
        ],
    ];
    for args in cases {
        let o = Command::new(BIN)
            .args(&args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("gone."), "{args:?} names the path: {err}");
        let left: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["artifacts"], "{args:?} created something");
    }
}
