//! `gc` beside the Python manager (issue 25 item 6), through the real binary: its temporaries
//! (`tmpXXXXXXXX` in the models dir) are removed only when none is held open by a process and
//! none was written in the last 15 minutes; a download in flight keeps all of them. For v25
//! and for a made-up v26.

use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use crate::common::*;
use test_support::http_server::FaultServer;
use test_support::published::{artifact_bytes, manifest_json, publish_model, write_manifest};

fn age(path: &std::path::Path, secs: u64) {
    fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(secs))
        .unwrap();
}

fn gc(d: &Device, base: &str) -> Vec<String> {
    let out = d.command(base, &["gc", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut v: Vec<String> = r["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn gc_never_removes_a_python_temporary_that_is_open_or_young() {
    for (generation, v26) in [("v25", false), ("v26", true)] {
        let d = Device::new();
        if v26 {
            set_tree(&d.openpilot(), V26_PIN, Some(&v26_pins()));
        }
        let root = d.dir.path().join("origin");
        let p = publish_model(&root, generation, "pop223", &artifact_bytes(7, 999), None);
        write_manifest(
            &root,
            generation,
            manifest_json(generation, &[p], true).as_bytes(),
        );
        let server = FaultServer::start(&root).unwrap();
        let base = server.url();
        d.set_param("Model", "pop223");
        d.set_param("DrivingModel", "pop223");
        let out = d.command(&base, &["refresh"]).output().unwrap();
        assert!(out.status.success(), "{generation}: {}", stderr(&out));

        // A chunked Python download in flight: its current temporary open (and old, as after
        // a long stall), a finished chunk closed and old beside it.
        let m = d.models();
        let (current, finished) = (m.join("tmpcur0001"), m.join("tmpdone002"));
        for t in [&current, &finished] {
            fs::write(t, b"partial").unwrap();
            age(t, 3600);
        }
        let mut holder = Command::new("sh")
            .args(["-c", "exec 3<\"$1\"; exec sleep 60", "sh"])
            .arg(&current)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let fd_dir = format!("/proc/{}/fd", holder.id());
        wait_for("the holder to open it", Duration::from_secs(10), || {
            fs::read_dir(&fd_dir).is_ok_and(|fds| {
                fds.flatten()
                    .any(|f| fs::read_link(f.path()).is_ok_and(|l| l == current))
            })
        });
        assert_eq!(gc(&d, &base), Vec::<String>::new(), "{generation}: open");
        assert!(current.exists() && finished.exists(), "{generation}");
        // `--dry-run` agrees.
        let out = d
            .command(&base, &["gc", "--dry-run", "--json"])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("\"would_remove\":[]"),
            "{generation}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        holder.kill().unwrap();
        holder.wait().unwrap();

        // Closed, but one was written a minute ago: still a download that may go on.
        age(&current, 60);
        assert_eq!(gc(&d, &base), Vec::<String>::new(), "{generation}: young");
        assert!(current.exists() && finished.exists(), "{generation}");

        // Closed and quiet for 15 minutes and more: leftovers, removed, with ours.
        age(&current, 15 * 60 + 5);
        fs::write(m.join(".tmp-1-2-pop223_driving_tinygrad.pkl"), b"x").unwrap();
        assert_eq!(
            gc(&d, &base),
            [
                ".tmp-1-2-pop223_driving_tinygrad.pkl".to_string(),
                "tmpcur0001".into(),
                "tmpdone002".into()
            ],
            "{generation}"
        );
        assert!(d.installed("pop223").is_some(), "{generation}");
    }
}
