//! A model that fails its first start is not retried forever: the daemon's watch reads a fake
//! modeld's receipt saying `selected-load-failed` after the selected artifact was installed,
//! marks that SHA-256 bad, `resolve` answers the built-in while the choice stays saved, no
//! download fetches those bytes again, and once the catalog publishes other bytes for the model
//! they are downloaded. The device reads its receipt by v26's contract (the artifacts here are
//! the v25 origin's: the receipt rule does not depend on the layout).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use downloader::CancelToken;
use manifest::contract::ContractName;
use migration::state::load_receipt::{BAD_ARTIFACTS_FILE, Source, Watcher, monotonic_ns};
use serde_json::{Value, json};

use crate::common::{Origin, refresh};

fn me() -> (u64, u64) {
    let stat = fs::read_to_string("/proc/self/stat").unwrap();
    let tail = &stat[stat.rfind(')').unwrap() + 2..];
    (
        std::process::id() as u64,
        tail.split_whitespace().nth(19).unwrap().parse().unwrap(),
    )
}

fn modeld_writes(dir: &std::path::Path, body: &Value) {
    fs::create_dir_all(dir).unwrap();
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).unwrap();
    let f = dir.join("load-v1.json");
    fs::write(&f, serde_json::to_vec(body).unwrap()).unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn a_model_that_fails_its_first_start_is_marked_and_not_downloaded_again() {
    let mut origin = Origin::start();
    let f = origin.refreshed(&[("Model", "pop223")]);
    let shm = f.dir.path().join("shm-root");
    let mut device = f.device();
    device.load_receipt = Source::of(ContractName::V26.contract(), Some(&shm), None);
    let pop = "pop223".parse().unwrap();
    let artifact = device.artifact_path(&pop);
    assert!(artifact.exists());
    let sha = origin.sha("pop223").to_string();

    let lines = std::cell::RefCell::new(Vec::<String>::new());
    let log = |l: &str| lines.borrow_mut().push(l.to_string());
    let shown = std::cell::RefCell::new(Vec::<String>::new());
    let say = |p: &migration::Progress| shown.borrow_mut().push(p.to_string());
    let mut watch = Watcher::default();
    let t0 = Instant::now();
    // No receipt yet: the watch sees pop223 installed, says what runs is unavailable.
    watch.tick(&device, t0, &log, &say);
    assert!(
        lines.borrow()[0].contains("running: unavailable"),
        "{lines:?}"
    );

    // modeld starts after that, cannot load pop223, and runs the bundled model.
    let (pid, ticks) = me();
    let dir = shm.join("starpilot_modeld_d");
    modeld_writes(
        &dir,
        &json!({"version": 1, "pid": pid, "processStartTicks": ticks,
                "loadedMonoNs": monotonic_ns(), "modelId": "bundled-current", "variant": "small",
                "artifactSha256": "ab".repeat(32), "fallbackReason": "selected-load-failed"}),
    );
    // Not due yet (the contract's 5 s): nothing read.
    watch.tick(&device, t0 + Duration::from_secs(1), &log, &say);
    assert_eq!(lines.borrow().len(), 1);
    watch.tick(&device, t0 + Duration::from_secs(5), &log, &say);
    let text = lines.borrow().join("\n");
    assert!(text.contains("marked bad") && text.contains(&sha), "{text}");
    assert!(
        shown.borrow().last().unwrap()
            == &format!(
                "Running bundled-current (small, sha256 {}), fallback: selected-load-failed",
                &"ab".repeat(6)
            ),
        "{shown:?}"
    );
    let bad: Value =
        serde_json::from_slice(&fs::read(device.models_dir().join(BAD_ARTIFACTS_FILE)).unwrap())
            .unwrap();
    assert_eq!(bad["artifacts"][0]["sha256"], json!(sha));
    assert_eq!(bad["artifacts"][0]["id"], json!("pop223"));
    // The choice stays saved; what modeld is handed is the built-in.
    assert_eq!(f.param("Model").as_deref(), Some("pop223"));
    let (path, sel) = device.resolve().unwrap();
    assert!(migration::is_builtin_id(sel.id.as_str()), "{path:?}");
    // `status` says so.
    let status = migration::report::status(&device, crate::common::tree()).unwrap();
    assert_eq!(status.bad_artifacts.len(), 1);
    assert!(status.bad_artifacts[0].current);
    assert!(
        status.bad_artifacts[0]
            .text
            .contains("not downloaded again"),
        "{:?}",
        status.bad_artifacts
    );
    let running = status.running.unwrap();
    assert_eq!(running.fallback_reason, Some("selected-load-failed"));
    assert_eq!(
        running.matches_selection,
        Some(true),
        "the built-in is what resolve answers now"
    );
    // Marking is once: the next looks change nothing.
    watch.tick(&device, t0 + Duration::from_secs(10), &log, &say);
    assert_eq!(text.matches("marked bad").count(), 1);

    // The artifact goes (removed by hand); neither a download nor a refresh fetches it again.
    fs::remove_file(&artifact).unwrap();
    let e = migration::download_model(
        &device,
        &origin.downloader(),
        &pop,
        &CancelToken::new(),
        &|_| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("not downloaded again"), "{e}");
    let all = migration::download_all(
        &device,
        &origin.downloader(),
        &CancelToken::new(),
        &|_, _| {},
        &|_| {},
    )
    .unwrap();
    assert!(
        all.models.iter().all(|(id, _)| id.as_str() != "pop223"),
        "{all:?}"
    );
    refresh(&device, &origin.downloader()).unwrap();
    assert!(!artifact.exists());
    // The built-in stands in (the params modeld reads), the user's choice is kept in
    // `.choice.json`, and the retry records no attempt.
    let choice: Value =
        serde_json::from_slice(&fs::read(device.models_dir().join(".choice.json")).unwrap())
            .unwrap();
    assert_eq!(choice["wanted"]["selection"], json!("pop223"), "{choice}");
    // No retry is scheduled for bytes that cannot start: nothing loops on them.
    assert!(choice["retry"].get("pop223").is_none(), "{choice}");

    // The catalog publishes other bytes for pop223: they are tried, and resolve hands them out.
    origin.republish("pop223", 99);
    // The daemon's own refresh fetches them at once (no backoff was left behind), and puts the
    // kept choice back in the params.
    refresh(&device, &origin.downloader()).unwrap();
    assert_eq!(
        crate::common::sha_of(&artifact).as_deref(),
        Some(origin.sha("pop223"))
    );
    assert_eq!(f.param("Model").as_deref(), Some("pop223"));
    let (path, sel) = device.resolve().unwrap();
    assert_eq!((sel.id.as_str(), path), ("pop223", artifact));
    let status = migration::report::status(&device, crate::common::tree()).unwrap();
    assert!(
        !status.bad_artifacts[0].current,
        "{:?}",
        status.bad_artifacts
    );
}
