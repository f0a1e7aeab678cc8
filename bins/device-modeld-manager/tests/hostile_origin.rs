//! The real binary against an origin that redirects to a URL with no host (issue 16's HIGH
//! item): this used to panic inside the HTTP client (exit 101) before GitHub was tried. Now the
//! origin is given up, GitHub serves, and the command succeeds.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use test_support::http_server::{Fault, FaultServer};
use test_support::published::{
    GH_DIR, HF_DIR, artifact_bytes, manifest_json, publish_model, write_manifest,
};

const BIN: &str = env!("CARGO_BIN_EXE_device-modeld-manager");

fn run(dir: &Path, server: &FaultServer, args: &[&str]) -> Output {
    // A comma's data root always exists; the manager never creates it.
    std::fs::create_dir_all(dir.join("data")).unwrap();
    Command::new(BIN)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--hf-base")
        .arg(format!("{}/{HF_DIR}", server.url()))
        .arg("--github-base")
        .arg(format!("{}/{GH_DIR}", server.url()))
        .arg("--generation")
        .arg("v25")
        .arg("--builtin-dir")
        .arg(dir.join("builtin"))
        .arg("--memory-params-dir")
        .arg(dir.join("shm"))
        .arg("--space-margin-mib")
        .arg("0")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_redirect_to_a_hostless_url_never_kills_the_manager() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("origin");
    let data = artifact_bytes(16, 300 * 1024);
    let m = publish_model(&root, "v25", "pop223", &data, Some(128 * 1024));
    write_manifest(&root, "v25", manifest_json("v25", &[m], true).as_bytes());
    fs::create_dir_all(dir.path().join("builtin")).unwrap();
    fs::write(
        dir.path().join("builtin/driving_tinygrad.pkl.chunk01of01"),
        b"builtin",
    )
    .unwrap();
    fs::write(
        dir.path()
            .join("builtin/driving_tinygrad.pkl.chunkmanifest"),
        b"1",
    )
    .unwrap();
    let server = FaultServer::start(&root).unwrap();
    for location in [
        "file:///etc/passwd",
        "data:,x",
        "mailto:a@b.c",
        "unix:/run/x.sock",
    ] {
        server.clear_faults();
        // Everything on Hugging Face redirects there: the manifest, the chunk manifest, chunks.
        server.add_fault(
            &format!("/{HF_DIR}/*"),
            Fault::Redirect {
                status: 302,
                location: Some(location.to_string()),
            },
            None,
        );
        let out = run(dir.path(), &server, &["refresh"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{location}: {stderr}");
        assert!(
            out.status.success(),
            "{location}: {:?} {stderr}",
            out.status
        );

        let _ = fs::remove_file(dir.path().join("data/models/pop223_driving_tinygrad.pkl"));
        let out = run(dir.path(), &server, &["download", "pop223"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{location}: {stderr}");
        assert!(
            out.status.success(),
            "{location}: {:?} {stderr}",
            out.status
        );
        assert_eq!(
            fs::read(dir.path().join("data/models/pop223_driving_tinygrad.pkl")).unwrap(),
            data
        );
    }
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.path.starts_with(&format!("/{GH_DIR}/"))),
        "GitHub served"
    );
}
