//! The `release-cli chunk` contract, run against the real binary.

use crate::common::{cli_in as cli, snapshot, text};

use std::fs;
use std::path::Path;

const NAME: &str = "pop223_driving_tinygrad.pkl";

fn artifact(dir: &Path, len: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    fs::write(dir.join(NAME), &data).unwrap();
    data
}

#[test]
fn split_json_join_verify_round_trip() {
    let t = tempfile::tempdir().unwrap();
    let data = artifact(t.path(), 2500);
    let out = cli(
        &[
            "chunk",
            "split",
            NAME,
            "--out-dir",
            "out",
            "--chunk-size",
            "1KiB",
            "--json",
        ],
        t.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["name"], NAME);
    assert_eq!(v["size"], 2500);
    assert_eq!(v["chunk_count"], 3);
    let chunks = v["chunks"].as_array().unwrap();
    assert_eq!(chunks.len(), 3);
    assert_eq!(chunks[0]["name"], format!("{NAME}.chunk01of03"));
    assert_eq!(chunks[0]["size"], 1024);
    assert_eq!(chunks[2]["size"], 2500 - 2048);
    assert_eq!(v["sha256"].as_str().unwrap().len(), 64);
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["name", "size", "sha256", "chunk_count", "chunks"]);

    let logical = format!("out/{NAME}");
    let out = cli(&["chunk", "verify", &logical], t.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sha = v["sha256"].as_str().unwrap();
    let out = cli(
        &[
            "chunk",
            "verify",
            &logical,
            "--sha256",
            sha,
            "--size",
            "2500",
            "--chunk-count",
            "3",
        ],
        t.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = cli(
        &["chunk", "join", &logical, "--output", "joined.pkl"],
        t.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(fs::read(t.path().join("joined.pkl")).unwrap(), data);
}

#[test]
fn default_out_dir_is_the_files_directory_and_default_chunk_size_is_45_mib() {
    let t = tempfile::tempdir().unwrap();
    artifact(t.path(), 100);
    let out = cli(&["chunk", "split", NAME, "--json"], t.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(t.path().join(format!("{NAME}.chunk01of01")).exists());
    assert_eq!(
        fs::read_to_string(t.path().join(format!("{NAME}.chunkmanifest"))).unwrap(),
        "1"
    );
}

#[test]
fn verify_fails_with_the_reason() {
    let t = tempfile::tempdir().unwrap();
    artifact(t.path(), 3000);
    let out = cli(
        &[
            "chunk",
            "split",
            NAME,
            "--out-dir",
            "o",
            "--chunk-size",
            "1000",
        ],
        t.path(),
    );
    assert!(out.status.success());
    let logical = format!("o/{NAME}");

    let out = cli(
        &["chunk", "verify", &logical, "--chunk-count", "2"],
        t.path(),
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("chunk count mismatch"),
        "{}",
        text(&out.stderr)
    );

    let out = cli(&["chunk", "verify", &logical, "--size", "3001"], t.path());
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("expected 3001 bytes"),
        "{}",
        text(&out.stderr)
    );

    fs::write(
        t.path().join(format!("o/{NAME}.chunk02of03")),
        vec![0u8; 1000],
    )
    .unwrap();
    let out = cli(&["chunk", "verify", &logical], t.path());
    assert_eq!(out.status.code(), Some(3));
    let err = text(&out.stderr);
    assert!(
        err.contains("SHA-256 mismatch") && err.contains("expected"),
        "{err}"
    );

    fs::remove_file(t.path().join(format!("o/{NAME}.chunk02of03"))).unwrap();
    let out = cli(&["chunk", "verify", &logical], t.path());
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("chunk 2 of 3 is missing"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bad_input_is_a_clear_usage_error() {
    let t = tempfile::tempdir().unwrap();
    artifact(t.path(), 1000);
    let out = cli(
        &["chunk", "split", NAME, "--chunk-size", "5 parsecs"],
        t.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("unknown unit"),
        "{}",
        text(&out.stderr)
    );

    let out = cli(&["chunk", "split", NAME, "--chunk-size", "10"], t.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("more than the limit of 99"),
        "{}",
        text(&out.stderr)
    );

    // Regression: a directory was reported as "<input>: Is a directory" and left --out-dir
    // created behind it.
    fs::create_dir(t.path().join("adir")).unwrap();
    let out = cli(&["chunk", "split", "adir", "--out-dir", "made"], t.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("adir is not a regular file"),
        "{}",
        text(&out.stderr)
    );
    assert!(!t.path().join("made").exists());

    fs::write(t.path().join("empty.pkl"), b"").unwrap();
    let out = cli(&["chunk", "split", "empty.pkl"], t.path());
    // An empty input is a bad argument like too many chunks: exit 2, not 1 (an I/O failure).
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("empty"), "{}", text(&out.stderr));

    let out = cli(&["chunk", "verify", NAME], t.path());
    assert_eq!(
        out.status.code(),
        Some(2),
        "plain file without sidecar or --sha256"
    );
    assert!(
        text(&out.stderr).contains("--sha256"),
        "{}",
        text(&out.stderr)
    );

    // A huge bogus sidecar is reported as malformed (exit 3), read only as far as a sidecar
    // could reach.
    let out = cli(&["chunk", "split", NAME, "--chunk-size", "300"], t.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    fs::remove_file(t.path().join(NAME)).unwrap();
    fs::write(t.path().join(format!("{NAME}.sha256")), "a".repeat(8 << 20)).unwrap();
    let out = cli(&["chunk", "verify", NAME], t.path());
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("malformed SHA-256 sidecar"),
        "{}",
        text(&out.stderr)
    );
}

/// Regression: `--json` failures printed no JSON. Now one `{"error":{…}}` document, same exit.
#[test]
fn json_failures_print_one_error_document_with_the_same_exit_code() {
    let t = tempfile::tempdir().unwrap();
    let data = artifact(t.path(), 2500);
    let doc = |out: &std::process::Output| -> serde_json::Value {
        let s = text(&out.stdout);
        assert_eq!(s.lines().count(), 1, "one document: {s}");
        serde_json::from_str(&s).unwrap()
    };
    // A missing input: failure, exit 1.
    let out = cli(&["chunk", "split", "missing.pkl", "--json"], t.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let v = doc(&out);
    assert_eq!(v["error"]["kind"], "failure", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("missing.pkl"),
        "{v}"
    );

    // A chunk set that does not match: check failed, exit 3, with and without --json.
    let out = cli(&["chunk", "split", NAME, "--chunk-size", "1KiB"], t.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    fs::remove_file(t.path().join(NAME)).unwrap();
    let mut bad = data[..1024].to_vec();
    bad[0] ^= 1;
    fs::write(t.path().join(format!("{NAME}.chunk01of03")), &bad).unwrap();
    let out = cli(&["chunk", "verify", NAME, "--json"], t.path());
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let v = doc(&out);
    assert_eq!(v["error"]["kind"], "check_failed", "{v}");
    let out = cli(&["chunk", "verify", NAME], t.path());
    assert_eq!(out.status.code(), Some(3));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));

    // manifest validate --json: its report is the one document, not followed by an error.
    fs::write(t.path().join("m.json"), r#"{"models": [{"name": "x"}]}"#).unwrap();
    let out = cli(&["manifest", "validate", "m.json", "--json"], t.path());
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(doc(&out)["valid"], false);
}

/// Regression: a Ctrl-C'd split left its `.tmp-*` files for good; the next split removes them.
#[test]
fn a_split_cleans_its_own_stale_temporaries() {
    let t = tempfile::tempdir().unwrap();
    artifact(t.path(), 2500);
    // A pid above the kernel's limit (2^22) cannot be running.
    let stale = t.path().join(format!(".tmp-4194305-0-{NAME}.chunk01of03"));
    fs::write(&stale, b"half").unwrap();
    let out = cli(&["chunk", "split", NAME, "--chunk-size", "1KiB"], t.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!stale.exists());
}

/// Regression: `chunk split -q` printed its `next:` hint on stdout, where `-q` keeps only the
/// requested output; the hint now goes to stderr and `-q` leaves it out.
#[test]
fn a_quiet_split_prints_only_its_report() {
    let t = tempfile::tempdir().unwrap();
    artifact(t.path(), 2500);
    let out = cli(&["chunk", "split", NAME, "--chunk-size", "1KiB"], t.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !text(&out.stdout).contains("next:"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains("next: check it with"),
        "{}",
        text(&out.stderr)
    );
    let out = cli(
        &["-q", "chunk", "split", NAME, "--chunk-size", "1KiB"],
        t.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(NAME), "{}", text(&out.stdout));
    assert!(
        !text(&out.stdout).contains("next:"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(text(&out.stderr), "", "-q printed on stderr");
}

#[test]
fn split_dry_run_names_the_chunks_and_removals_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    artifact(t.path(), 2500);
    let split = |extra: &[&str]| {
        let mut args = vec!["chunk", "split", NAME, "--out-dir", "out"];
        args.extend_from_slice(extra);
        cli(&args, t.path())
    };
    // An earlier set of 5 chunks is there; a new split in 3 chunks would remove it.
    let out = split(&["--chunk-size", "500"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let before = snapshot(t.path());

    let out = split(&["--chunk-size", "1KiB", "--dry-run", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        snapshot(t.path()),
        before,
        "a split dry run wrote something"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["chunk_count"], 3);
    assert_eq!(v["chunks"][2]["size"], 2500 - 2048);
    assert_eq!(
        v["written"],
        serde_json::json!([
            format!("{NAME}.chunk01of03"),
            format!("{NAME}.chunk02of03"),
            format!("{NAME}.chunk03of03"),
            format!("{NAME}.sha256"),
            format!("{NAME}.chunkmanifest"),
        ])
    );
    let removed: Vec<String> = (1..=5).map(|i| format!("{NAME}.chunk{i:02}of05")).collect();
    assert_eq!(v["removed"], serde_json::json!(removed));

    let out = split(&["--chunk-size", "1KiB", "--dry-run"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let human = text(&out.stdout);
    assert!(
        human.contains(&format!("would write {NAME}.chunk03of03  452 B")),
        "{human}"
    );
    assert!(
        human.contains(&format!("would remove {NAME}.chunk05of05")),
        "{human}"
    );
    assert!(human.contains("nothing was changed"), "{human}");

    // A refusal still refuses: too many chunks.
    let out = split(&["--chunk-size", "10", "--dry-run"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--chunk-size"),
        "{}",
        text(&out.stderr)
    );
    // Into a directory that is not there yet: it is not created.
    let out = cli(
        &["chunk", "split", NAME, "--out-dir", "new", "--dry-run"],
        t.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("would create the directory"));
    assert_eq!(
        snapshot(t.path()),
        before,
        "a split dry run wrote something"
    );
}

#[test]
fn join_dry_run_checks_the_set_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let data = artifact(t.path(), 2500);
    let out = cli(
        &[
            "chunk",
            "split",
            NAME,
            "--out-dir",
            "out",
            "--chunk-size",
            "1KiB",
        ],
        t.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let logical = format!("out/{NAME}");
    let before = snapshot(t.path());

    let out = cli(
        &["chunk", "join", &logical, "-o", NAME, "--dry-run", "--json"],
        t.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(snapshot(t.path()), before, "a join dry run wrote something");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["size"], data.len());
    assert_eq!(v["replaces"], true);
    assert_eq!(
        v["sha256"],
        chunker::Sha256Digest::of_bytes(&data).to_hex().as_str()
    );
    let out = cli(
        &["chunk", "join", &logical, "-o", "j.pkl", "--dry-run"],
        t.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("would write j.pkl (2.44 KiB"),
        "{}",
        text(&out.stdout)
    );

    // The checks the join makes still refuse: a chunk that does not match the sidecar.
    fs::write(
        t.path().join(format!("out/{NAME}.chunk02of03")),
        [0u8; 1024],
    )
    .unwrap();
    let before = snapshot(t.path());
    let out = cli(
        &["chunk", "join", &logical, "-o", "j.pkl", "--dry-run"],
        t.path(),
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(
        snapshot(t.path()),
        before,
        "a refused join dry run wrote something"
    );
}
