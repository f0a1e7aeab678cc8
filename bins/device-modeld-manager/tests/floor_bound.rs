//! A rollback floor that cannot be raised from outside (docs/device.md, *Trust*): a floor
//! copy raised past the signed catalog the device holds is bounded by it and rewritten, never
//! copied into the param; a copy that is a directory, a symlink, a FIFO, oversized or garbage
//! is rewritten from the valid one (or, the other missing, from the signed catalog), never a
//! wedge. Through the real binary with trusted keys, for v25 and a made-up v26.

use std::fs;
use std::path::Path;

use serde_json::Value;

use crate::signed::{Gen, Key, World, for_each_generation, text, world_for};

const PARAM: &str = "ModelManifestAcceptedRelease";
const FILE: &str = ".accepted-release.json";

for_each_generation!(
    a_floor_raised_from_outside_is_bounded_by_the_held_catalog,
    every_special_file_at_either_floor_copy_is_repaired_without_a_wedge,
);

/// A device selecting `pop223` that accepted release 2 (release 1 first).
fn at_release_2(w: &World, keys: &Path, a: &Key) {
    let p = w.data("dev").join("params/d");
    fs::create_dir_all(&p).unwrap();
    for k in ["Model", "DrivingModel"] {
        fs::write(p.join(k), "pop223").unwrap();
    }
    let (m1, m2) = (w.m1(), w.m2());
    w.serve(&m1, Some(&a.sign(&m1, &w.comment(1))));
    ok(w, keys, &["refresh"]);
    w.serve(&m2, Some(&a.sign(&m2, &w.comment(2))));
    ok(w, keys, &["refresh"]);
}

fn ok(w: &World, keys: &Path, args: &[&str]) {
    let out = w.run("dev", Some(keys), args);
    assert!(out.status.success(), "{args:?}: {}", text(&out));
}

/// The release a floor copy holds for the world's generation (`None`: not valid JSON).
fn release_in(w: &World, body: &str) -> Option<u64> {
    let v: Value = serde_json::from_str(body).ok()?;
    v[w.generation.name()]["release"].as_u64()
}

fn file_release(w: &World) -> Option<u64> {
    release_in(
        w,
        &fs::read_to_string(w.data("dev").join("models").join(FILE)).ok()?,
    )
}

fn param_release(w: &World) -> Option<u64> {
    release_in(w, &w.param("dev", PARAM)?)
}

/// `.accepted-release.json` set to the largest release by a writer of the models directory:
/// bounded by the param and the held catalog's release 2, rewritten, never copied into the
/// param; the next release installs, an older one is still refused. (Without a valid param the
/// file is the only record and stands, see `floor::bound`.)
fn a_floor_raised_from_outside_is_bounded_by_the_held_catalog(g: Gen) {
    let w = world_for(g);
    let a = Key::new();
    let keys = w.keys_file("a.pub", &[&a]);
    at_release_2(&w, &keys, &a);
    let file = w.data("dev").join("models").join(FILE);
    let raised = format!(
        r#"{{"{}": {{"release": {}, "expires": 4102444800, "key": "x"}}}}"#,
        g.name(),
        u64::MAX
    );
    for round in 0..2 {
        fs::write(&file, &raised).unwrap();
        let s = w.status("dev", Some(&keys));
        assert_eq!(s["trust"]["accepted_release"]["release"], 2, "{s}");
        // The held catalog is still accepted (no doubt), the built-in is not forced.
        let out = w.run("dev", Some(&keys), &["resolve", "--json"]);
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["builtin"], false, "{r}");
        ok(&w, &keys, &["refresh"]);
        assert_eq!(file_release(&w), Some(2), "{round}");
        assert_eq!(param_release(&w), Some(2), "{round}: never raised");
        assert_eq!(
            w.status("dev", Some(&keys))["trust"]["accepted_release_source"],
            "both"
        );
    }
    // The next release is accepted, and an older one is still refused.
    let m2 = w.m2();
    w.serve(&m2, Some(&a.sign(&m2, &w.comment(3))));
    ok(&w, &keys, &["refresh"]);
    assert_eq!((file_release(&w), param_release(&w)), (Some(3), Some(3)));
    let m1 = w.m1();
    w.serve(&m1, Some(&a.sign(&m1, &w.comment(2))));
    let out = w.run("dev", Some(&keys), &["refresh"]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
}

fn plant(path: &Path, kind: &str) {
    if fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        fs::remove_dir_all(path).unwrap();
    } else {
        let _ = fs::remove_file(path);
    }
    match kind {
        "garbage" => fs::write(path, b"{\"v2").unwrap(),
        "oversized" => fs::File::create(path).unwrap().set_len(1 << 30).unwrap(),
        "directory" => {
            fs::create_dir_all(path.join("inner")).unwrap();
            fs::write(path.join("inner/x"), b"{}").unwrap();
        }
        "symlink to /dev/zero" => std::os::unix::fs::symlink("/dev/zero", path).unwrap(),
        "dangling symlink" => std::os::unix::fs::symlink("/nonexistent/floor", path).unwrap(),
        "fifo" => {
            let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        }
        _ => unreachable!("{kind}"),
    }
}

const SPECIAL: [&str; 6] = [
    "garbage",
    "oversized",
    "directory",
    "symlink to /dev/zero",
    "dangling symlink",
    "fifo",
];

/// Each special file at the file copy, then at the param: `refresh` succeeds and rewrites it
/// from the other copy. With the other copy missing: rewritten from the held signed catalog.
fn every_special_file_at_either_floor_copy_is_repaired_without_a_wedge(g: Gen) {
    let w = world_for(g);
    let a = Key::new();
    let keys = w.keys_file("a.pub", &[&a]);
    at_release_2(&w, &keys, &a);
    let file = w.data("dev").join("models").join(FILE);
    let param = w.data("dev").join("params/d").join(PARAM);
    for kind in SPECIAL {
        for (at, other, other_missing) in [
            (&file, &param, false),
            (&param, &file, false),
            (&file, &param, true),
            (&param, &file, true),
        ] {
            let ctx = format!(
                "{kind} at {} (other missing: {other_missing})",
                at.display()
            );
            plant(at, kind);
            if other_missing {
                fs::remove_file(other).unwrap();
            }
            let s = w.status("dev", Some(&keys));
            // A dangling link holds nothing: read as missing, and with the other copy gone
            // the floor is the held catalog's at the fetch (`release_floor`), then recorded.
            let want = match (kind, other_missing) {
                ("dangling symlink", true) => Value::Null,
                _ => 2.into(),
            };
            assert_eq!(
                s["trust"]["accepted_release"]["release"], want,
                "{ctx}: {s}"
            );
            ok(&w, &keys, &["refresh"]);
            assert_eq!(file_release(&w), Some(2), "{ctx}");
            assert_eq!(param_release(&w), Some(2), "{ctx}");
            assert!(fs::symlink_metadata(at).unwrap().is_file(), "{ctx}");
            assert_eq!(
                w.status("dev", Some(&keys))["trust"]["accepted_release_source"],
                "both",
                "{ctx}"
            );
        }
    }
}
