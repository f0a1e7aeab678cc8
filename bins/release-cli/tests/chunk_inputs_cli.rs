//! `chunk verify` and `chunk join` take whatever names a set (its directory, any member, the
//! logical name), check a set without a `.sha256` (as Python's chunker writes them) by count and
//! sizes, and call a missing input "not found" with exit 1. Against the real binary.

use crate::common::{cli_in as cli, snapshot, text};

use std::fs;
use std::path::Path;

const NAME: &str = "pop223_driving_tinygrad.pkl";

/// A 2500-byte artifact split into 1 KiB chunks in `dir/set/`, the original removed; its SHA-256.
fn set(dir: &Path) -> String {
    let data: Vec<u8> = (0..2500).map(|i| (i * 31 % 251) as u8).collect();
    fs::write(dir.join(NAME), &data).unwrap();
    let out = cli(
        &[
            "chunk",
            "split",
            NAME,
            "--out-dir",
            "set",
            "--chunk-size",
            "1KiB",
        ],
        dir,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    fs::remove_file(dir.join(NAME)).unwrap();
    chunker::Sha256Digest::of_bytes(&data).to_hex()
}

#[test]
fn verify_and_join_take_the_directory_any_member_or_the_logical_name() {
    let t = tempfile::tempdir().unwrap();
    let sha = set(t.path());
    for input in [
        "set".to_string(),
        "set/".to_string(),
        format!("set/{NAME}"),
        format!("set/{NAME}.chunk02of03"),
        format!("set/{NAME}.chunkmanifest"),
        format!("set/{NAME}.sha256"),
    ] {
        let out = cli(&["chunk", "verify", &input, "--json"], t.path());
        assert!(out.status.success(), "{input}: {}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["path"], format!("set/{NAME}"), "{input}");
        assert_eq!(v["sha256"], sha.as_str());
        assert!(v.get("sha256_checked").is_none(), "{v}");

        let joined = t.path().join("joined.pkl");
        let _ = fs::remove_file(&joined);
        let out = cli(&["chunk", "join", &input, "-o", "joined.pkl"], t.path());
        assert!(out.status.success(), "{input}: {}", text(&out.stderr));
        assert_eq!(
            chunker::Sha256Digest::of_file(&joined).unwrap().0.to_hex(),
            sha
        );
    }
}

#[test]
fn a_set_without_sidecar_is_checked_by_count_and_sizes_and_by_digest_when_given() {
    let t = tempfile::tempdir().unwrap();
    let sha = set(t.path());
    fs::remove_file(t.path().join(format!("set/{NAME}.sha256"))).unwrap();

    let out = cli(&["chunk", "verify", "set"], t.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("no .sha256 sidecar"), "{said}");
    let out = cli(&["chunk", "verify", "set", "--json"], t.path());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["sha256_checked"], false, "{v}");
    assert_eq!(v["chunk_count"], 3);

    // --sha256 checks the digest: the right one passes, another is exit 3.
    let out = cli(&["chunk", "verify", "set", "--sha256", &sha], t.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let wrong = "0".repeat(64);
    let out = cli(&["chunk", "verify", "set", "--sha256", &wrong], t.path());
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("SHA-256 mismatch"));

    // A chunk of the wrong size is caught without a digest: exit 3, naming the chunk.
    let first = t.path().join(format!("set/{NAME}.chunk01of03"));
    let mut bytes = fs::read(&first).unwrap();
    bytes.truncate(1000);
    fs::write(&first, &bytes).unwrap();
    let before = snapshot(t.path());
    let out = cli(&["chunk", "verify", "set"], t.path());
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("chunk 1 of 3") && err.contains("chunk01of03"),
        "{err}"
    );
    assert_eq!(snapshot(t.path()), before, "verify changed nothing");

    // A count that disagrees with --chunk-count: exit 3.
    let out = cli(&["chunk", "verify", "set", "--chunk-count", "2"], t.path());
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn a_missing_input_is_not_found_exit_1_and_two_sets_are_named() {
    let t = tempfile::tempdir().unwrap();
    set(t.path());
    for (args, missing) in [
        (vec!["chunk", "verify", "nothing.pkl"], "nothing.pkl"),
        (
            vec!["chunk", "verify", "set/nothing.pkl.chunk01of02"],
            "nothing.pkl.chunk01of02",
        ),
        (
            vec!["chunk", "join", "nothing.pkl", "-o", "x.pkl"],
            "nothing.pkl",
        ),
        (
            vec!["chunk", "verify", "nothing.pkl", "--json"],
            "nothing.pkl",
        ),
    ] {
        let before = snapshot(t.path());
        let out = cli(&args, t.path());
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let err = text(&out.stderr);
        assert!(err.contains("not found") && err.contains(missing), "{err}");
        assert_eq!(snapshot(t.path()), before, "{args:?} changed nothing");
    }
    fs::create_dir(t.path().join("empty")).unwrap();
    let out = cli(&["chunk", "verify", "empty"], t.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));

    // A directory holding two sets: usage error naming both; nothing written by join.
    fs::write(t.path().join("set/other.pkl.chunkmanifest"), "1").unwrap();
    let before = snapshot(t.path());
    let out = cli(&["chunk", "join", "set", "-o", "x.pkl"], t.path());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("other.pkl") && err.contains(NAME), "{err}");
    assert_eq!(snapshot(t.path()), before);
}

#[test]
fn join_of_a_set_without_sidecar_checks_sizes_and_a_given_digest_before_writing() {
    let t = tempfile::tempdir().unwrap();
    let sha = set(t.path());
    fs::remove_file(t.path().join(format!("set/{NAME}.sha256"))).unwrap();

    // The right digest: joined.
    let out = cli(
        &["chunk", "join", "set", "-o", "a.pkl", "--sha256", &sha],
        t.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        chunker::Sha256Digest::of_file(&t.path().join("a.pkl"))
            .unwrap()
            .0
            .to_hex(),
        sha
    );
    // Another digest: exit 3, nothing written (also with --dry-run).
    let wrong = "1".repeat(64);
    for extra in [&[][..], &["--dry-run"][..]] {
        let before = snapshot(t.path());
        let mut args = vec!["chunk", "join", "set", "-o", "b.pkl", "--sha256", &wrong];
        args.extend(extra);
        let out = cli(&args, t.path());
        assert_eq!(
            out.status.code(),
            Some(3),
            "{extra:?}: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stderr).contains("SHA-256 mismatch"));
        assert_eq!(snapshot(t.path()), before, "{extra:?}");
    }
    // No digest at all: the chunk sizes are checked; a short first chunk refuses the join.
    let first = t.path().join(format!("set/{NAME}.chunk01of03"));
    let b = fs::read(&first).unwrap();
    fs::write(&first, &b[..900]).unwrap();
    let before = snapshot(t.path());
    let out = cli(&["chunk", "join", "set", "-o", "c.pkl"], t.path());
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("chunk 1 of 3"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(snapshot(t.path()), before);
}
