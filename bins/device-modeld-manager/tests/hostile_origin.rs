//! The real binary against an origin that redirects to a URL with no host (issue 16's HIGH
//! item): this used to panic inside the HTTP client (exit 101) before GitHub was tried. Now the
//! origin is given up, GitHub serves, and the command succeeds.

use std::fs;

use crate::common::*;
use test_support::http_server::{Fault, FaultServer};
use test_support::published::{
    GH_DIR, HF_DIR, artifact_bytes, manifest_json, publish_model, write_manifest,
};

#[test]
fn a_redirect_to_a_hostless_url_never_kills_the_manager() {
    let dev = Device::new();
    let root = dev.dir.path().join("origin");
    let data = artifact_bytes(16, 300 * 1024);
    let m = publish_model(&root, "v25", "pop223", &data, Some(128 * 1024));
    write_manifest(&root, "v25", manifest_json("v25", &[m], true).as_bytes());
    let server = FaultServer::start(&root).unwrap();
    let run = |args: &[&str]| dev.command(&server.url(), args).output().unwrap();
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
        let out = run(&["refresh"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{location}: {stderr}");
        assert!(
            out.status.success(),
            "{location}: {:?} {stderr}",
            out.status
        );

        let _ = fs::remove_file(dev.models().join("pop223_driving_tinygrad.pkl"));
        let out = run(&["download", "pop223"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{location}: {stderr}");
        assert!(
            out.status.success(),
            "{location}: {:?} {stderr}",
            out.status
        );
        assert_eq!(
            fs::read(dev.models().join("pop223_driving_tinygrad.pkl")).unwrap(),
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
