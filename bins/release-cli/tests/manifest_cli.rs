//! The `release-cli manifest` contract, run against the real binary.

use crate::common;
use crate::common::{cli_in as cli, snapshot, text};

use std::fs;
use std::path::{Path, PathBuf};

/// One catalog entry for the diff tests.
fn entry(id: &str, name: &str) -> String {
    format!(
        r#"{{"id": "{id}", "name": "{name}", "version": "v8", "series": "S", "released": "2025-01-01", "community_favorite": false}}"#
    )
}

fn catalog() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../crates/manifest/tests/fixtures/model_names_v25.catalog.json")
}

#[test]
fn the_real_catalog_validates_and_formats_to_itself() {
    let t = tempfile::tempdir().unwrap();
    let path = catalog();
    let p = path.to_str().unwrap();
    let out = cli(&["manifest", "validate", p], t.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("97 models"),
        "{}",
        text(&out.stdout)
    );

    let out = cli(&["manifest", "fmt", p], t.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout, fs::read(&path).unwrap());
    assert!(
        cli(&["manifest", "fmt", "--check", p], t.path())
            .status
            .success()
    );

    // The catalog has no artifact fields yet, so it is not publishable as is.
    let out = cli(
        &["manifest", "validate", "--mode", "release", "--json", p],
        t.path(),
    );
    assert_eq!(out.status.code(), Some(3));
    // The report says what failed, so it is the whole --json answer: no error document follows.
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let v = &lines[0];
    assert_eq!(v["valid"], false);
    assert_eq!(v["problems"].as_array().unwrap().len(), 4 * 97);
    assert_eq!(lines.len(), 1, "{lines:?}");
}

#[test]
fn validate_lists_every_problem_with_its_path() {
    let t = tempfile::tempdir().unwrap();
    let bad = r#"{"models": [
  {"id": "../x", "name": "A, B", "version": "v8", "series": "S", "released": "2025-01-01", "community_favorite": false},
  {"id": "ok1", "name": "Ok", "version": "v8", "series": "S", "released": "2025-01-01", "community_favorite": false,
   "artifact_format": "split", "artifact_size": 10, "artifact_sha256": "ABC", "artifact_chunk_count": 1000},
  {"id": "ok1", "name": "Dup", "version": "v8", "series": "S", "released": "2025-01-01", "community_favorite": false}
]}"#;
    fs::write(t.path().join("bad.json"), bad).unwrap();
    let out = cli(&["manifest", "validate", "bad.json"], t.path());
    assert_eq!(out.status.code(), Some(3));
    let listed = text(&out.stdout);
    for want in [
        "models[0].id",
        "models[0].name",
        "models[1].artifact_format",
        "models[1].artifact_sha256",
        "models[1].artifact_chunk_count",
        "models[2].id",
    ] {
        assert!(listed.contains(want), "missing {want} in:\n{listed}");
    }
    assert!(
        text(&out.stderr).contains("problems"),
        "{}",
        text(&out.stderr)
    );
}

/// Regression: `validate --json` reported `"models": 0` for an invalid file of three entries,
/// and named a misspelt top-level `models` key only as a missing array.
#[test]
fn validate_json_counts_the_entries_of_an_invalid_file() {
    let t = tempfile::tempdir().unwrap();
    let three = format!(
        r#"{{"models": [{}, {}, {{"id": "c1"}}]}}"#,
        entry("a1", "A"),
        entry("b1", "B")
    );
    fs::write(t.path().join("three.json"), three).unwrap();
    let out = cli(&["manifest", "validate", "--json", "three.json"], t.path());
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["valid"], false);
    assert_eq!(v["models"], 3);
    assert_eq!(v["mode"], "catalog");

    fs::write(
        t.path().join("typo.json"),
        format!(r#"{{"modles": [{}]}}"#, entry("a1", "A")),
    )
    .unwrap();
    let out = cli(&["manifest", "validate", "--json", "typo.json"], t.path());
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["models"], serde_json::Value::Null);
    let problem = v["problems"][0]["message"].as_str().unwrap();
    assert!(problem.contains(r#"did you mean "models""#), "{problem}");
}

#[test]
fn oversized_manifest_is_refused_before_parsing() {
    let t = tempfile::tempdir().unwrap();
    let mut big = String::from("{\"models\": [], \"pad\": \"");
    big.push_str(&"x".repeat(3 << 20));
    big.push_str("\"}");
    fs::write(t.path().join("big.json"), big).unwrap();
    let out = cli(&["manifest", "validate", "big.json"], t.path());
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stdout).contains("more than the limit"),
        "{}",
        text(&out.stdout)
    );
    // Regression: the message gave the bytes read (limit + 1), not the file's size.
    let size = fs::metadata(t.path().join("big.json")).unwrap().len();
    assert!(
        text(&out.stdout).contains(&format!("manifest is {size} bytes")),
        "{}",
        text(&out.stdout)
    );
    for args in [
        ["manifest", "fmt", "big.json"],
        ["manifest", "diff", "big.json"],
    ] {
        let mut args = args.to_vec();
        if args[1] == "diff" {
            args.push("big.json");
        }
        let out = cli(&args, t.path());
        assert_eq!(out.status.code(), Some(3), "{args:?}");
        assert!(
            text(&out.stderr).contains(&format!("big.json: manifest is {size} bytes")),
            "{}",
            text(&out.stderr)
        );
    }
}

#[test]
fn diff_shows_added_removed_and_changed() {
    let t = tempfile::tempdir().unwrap();
    fs::write(
        t.path().join("old.json"),
        format!(
            r#"{{"models": [{}, {}]}}"#,
            entry("a1", "A"),
            entry("b1", "B")
        ),
    )
    .unwrap();
    fs::write(
        t.path().join("new.json"),
        format!(
            r#"{{"models": [{}, {}]}}"#,
            entry("a1", "A2"),
            entry("c1", "C")
        ),
    )
    .unwrap();
    let out = cli(&["manifest", "diff", "old.json", "new.json"], t.path());
    assert_eq!(
        out.status.code(),
        Some(1),
        "they differ: {}",
        text(&out.stderr)
    );
    assert_eq!(
        text(&out.stderr),
        "",
        "differences are not an error message"
    );
    let s = text(&out.stdout);
    assert!(s.contains("+ model c1"), "{s}");
    assert!(s.contains("- model b1"), "{s}");
    assert!(
        s.contains("~ model a1") && s.contains("name: \"A\" -> \"A2\""),
        "{s}"
    );

    let out = cli(
        &["manifest", "diff", "--json", "old.json", "new.json"],
        t.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["added"], serde_json::json!(["c1"]));
    assert_eq!(v["changed"][0]["fields"][0]["new"], "A2");

    // Equal files: exit 0. A missing file is trouble (2), not "they differ" (1).
    let out = cli(&["manifest", "diff", "old.json", "old.json"], t.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "no changes\n");
    let out = cli(&["manifest", "diff", "old.json", "gone.json"], t.path());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    // Not a terminal: no colour, whatever NO_COLOR says.
    let out = cli(&["manifest", "diff", "old.json", "new.json"], t.path());
    assert!(!text(&out.stdout).contains('\x1b'));
}

/// `NO_COLOR` and `--color` where colour would show: on a pseudo-terminal (util-linux
/// `script`), the diff and clap's help are coloured by default, plain with NO_COLOR=1 or
/// `--color never`, and `--color always` colours even a pipe.
#[test]
fn colour_on_a_terminal_follows_no_color_and_the_flag() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        test_support::skip::skipped(
            "util-linux `script` (a pseudo-terminal) is not installed (apt-get install bsdutils)",
        );
        return;
    }
    let t = tempfile::tempdir().unwrap();
    fs::write(
        t.path().join("old.json"),
        format!(r#"{{"models": [{}]}}"#, entry("a1", "A")),
    )
    .unwrap();
    fs::write(
        t.path().join("new.json"),
        format!(r#"{{"models": [{}]}}"#, entry("c1", "C")),
    )
    .unwrap();
    // `script -qec CMD /dev/null` runs CMD with a terminal as its stdout and stderr.
    let on_tty = |args: &str, no_color: Option<&str>| {
        let mut c = std::process::Command::new("script");
        c.arg("-qec")
            .arg(format!("{} {args}", common::BIN))
            .arg("/dev/null")
            .current_dir(t.path())
            .env_remove("NO_COLOR");
        if let Some(v) = no_color {
            c.env("NO_COLOR", v);
        }
        text(&c.output().unwrap().stdout)
    };
    let diff = "manifest diff old.json new.json";
    let coloured = on_tty(diff, None);
    assert!(coloured.contains("\x1b[32m+ model c1"), "{coloured:?}");
    assert!(
        on_tty(diff, Some("")).contains("\x1b[32m"),
        "empty NO_COLOR is unset"
    );
    for (args, no_color) in [(diff, Some("1")), (&*format!("--color never {diff}"), None)] {
        let plain = on_tty(args, no_color);
        assert!(plain.contains("+ model c1"), "{plain:?}");
        assert!(
            !plain.contains('\x1b'),
            "{args} NO_COLOR={no_color:?}: {plain:?}"
        );
    }
    // clap's own styling follows the same rule.
    assert!(on_tty("--help", None).contains('\x1b'));
    assert!(!on_tty("--help", Some("1")).contains('\x1b'));
    // The flag overrides NO_COLOR, even off a terminal.
    let out = std::process::Command::new(common::BIN)
        .args([
            "--color", "always", "manifest", "diff", "old.json", "new.json",
        ])
        .current_dir(t.path())
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(text(&out.stdout).contains("\x1b[32m+ model c1"));
}

/// Regression: `manifest diff … | head -c1` panicked in `println!` on the closed pipe.
#[test]
fn diff_into_a_closed_pipe_does_not_panic() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let t = tempfile::tempdir().unwrap();
    let models = |n: usize, name: &str| {
        (0..n)
            .map(|i| {
                format!(
                    r#"{{"id": "m{i}", "name": "{name}", "version": "v8", "series": "S", "released": "2025-01-01", "community_favorite": false}}"#
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Enough changed lines to fill a pipe buffer many times over.
    fs::write(
        t.path().join("a.json"),
        format!(r#"{{"models": [{}]}}"#, models(3000, "A")),
    )
    .unwrap();
    fs::write(
        t.path().join("b.json"),
        format!(r#"{{"models": [{}]}}"#, models(3000, "B")),
    )
    .unwrap();
    let mut child = Command::new(common::BIN)
        .args(["manifest", "diff", "a.json", "b.json"])
        .current_dir(t.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    stdout.read_exact(&mut [0u8; 1]).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(1), "{err}");
}

#[test]
fn fmt_write_dry_run_says_whether_it_would_rewrite_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("model_names_v25.json");
    fs::write(
        &f,
        r#"{"models":[{"id":"pop223","name":"Pop","version":"v15"}]}"#,
    )
    .unwrap();
    let before = snapshot(t.path());
    let p = f.to_str().unwrap();
    let out = cli(
        &["manifest", "fmt", "--write", "--dry-run", "--json", p],
        t.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["changed"], true);
    let out = cli(&["manifest", "fmt", "--write", "--dry-run", p], t.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("would be rewritten in canonical form"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(snapshot(t.path()), before, "a fmt dry run wrote something");
    // --dry-run without --write has nothing to dry-run.
    let out = cli(&["manifest", "fmt", "--dry-run", p], t.path());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    // A manifest that does not parse is refused as the real run refuses it.
    fs::write(&f, b"{not json").unwrap();
    let before = snapshot(t.path());
    let out = cli(&["manifest", "fmt", "--write", "--dry-run", p], t.path());
    let real = cli(&["manifest", "fmt", "--write", p], t.path());
    assert_eq!(out.status.code(), real.status.code());
    assert!(!out.status.success());
    assert_eq!(snapshot(t.path()), before);
}

#[test]
fn set_artifact_dry_run_checks_the_set_prints_the_values_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let data = test_support::published::artifact_bytes(11, 2500);
    let (artifacts, manifest) = common::release(t.path(), &data);
    let doc = serde_json::json!({"generation": "v25", "tinygrad_commit": common::TG, "models": [{
        "id": "pop223", "name": "Pop", "version": "v15", "series": "OP Series",
        "released": "2025-06-01", "community_favorite": false}]});
    fs::write(&manifest, doc.to_string()).unwrap();
    let before = snapshot(t.path());
    let (m, d) = (manifest.to_str().unwrap(), artifacts.join("pop223"));
    let d = d.to_str().unwrap();
    let out = cli(
        &["manifest", "set-artifact", m, d, "--dry-run", "--json"],
        t.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["size"], 2500);
    assert_eq!(v["chunk_count"], 3);
    assert_eq!(v["sha256"], test_support::published::sha256_hex(&data));
    let out = cli(&["manifest", "set-artifact", m, d, "--dry-run"], t.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("pop223 would be set = 2500 bytes"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        snapshot(t.path()),
        before,
        "a set-artifact dry run wrote something"
    );
    // The checks still refuse: no such model.
    let out = cli(
        &[
            "manifest",
            "set-artifact",
            m,
            d,
            "--model",
            "absent",
            "--dry-run",
        ],
        t.path(),
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(snapshot(t.path()), before);
}
