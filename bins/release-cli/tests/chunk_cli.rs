//! The `release-cli chunk` contract, run against the real binary.

use crate::common::{cli_in as cli, text};

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
