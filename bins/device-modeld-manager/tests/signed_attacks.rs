//! The attacks on a device with `--trusted-keys` that issue 23 found, each against the real
//! binary and a local origin: no attacker byte reaches `resolve`, and nothing is lost.
//!
//! - a signed entry (or Chestnut variant) without a SHA-256, size and chunk count, whose bytes
//!   and `.sha256` sidecar the attacker wrote to the store;
//! - the stored `.catalog.json` edited beside a planted model file;
//! - the rollback floor `.accepted-release.json` deleted or lowered (and an older signed catalog
//!   put back);
//! - a corrupt trust state file, and both copies of the floor unreadable.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use test_support::published::{artifact_dirs, publish_model, sha256_hex};

use crate::common::manager;
use crate::signed::{CHUNK, Gen, Key, World, for_each_generation, text, world_for};

const RELEASE_PARAM: &str = "ModelManifestAcceptedRelease";
const FLOOR_FILE: &str = ".accepted-release.json";

/// What an attacker with write access to the store (or to `/data/models`) serves or plants.
fn evil() -> Vec<u8> {
    b"EVIL PICKLE ".repeat(100)
}

impl World {
    fn models(&self, device: &str) -> PathBuf {
        self.data(device).join("models")
    }

    fn set_param(&self, device: &str, key: &str, value: &str) {
        let d = self.data(device).join("params/d");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(key), value).unwrap();
    }

    /// The built-in model in the openpilot checkout (`resolve` needs it to answer it).
    fn with_builtin(&self) {
        let b = self.dir.path().join("builtin");
        fs::create_dir_all(&b).unwrap();
        fs::write(b.join("driving_tinygrad.pkl.chunk01of01"), b"builtin").unwrap();
        fs::write(b.join("driving_tinygrad.pkl.chunkmanifest"), b"1").unwrap();
    }

    /// `resolve --json` (it always answers), and its stderr.
    fn resolve(&self, device: &str, keys: &Path) -> (Value, String) {
        let out = self.run(device, Some(keys), &["resolve", "--json"]);
        assert!(out.status.success(), "{}", text(&out));
        (
            serde_json::from_slice(&out.stdout).unwrap(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn human_status(&self, device: &str, keys: &Path) -> String {
        let out = self.run(device, Some(keys), &["status"]);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A device that selected `pop223` and refreshed `manifest` (signed by `sig`).
    fn selecting_pop(&self, device: &str, keys: &Path, manifest: &[u8], sig: &str) {
        self.set_param(device, "Model", "pop223");
        self.set_param(device, "DrivingModel", "pop223");
        self.serve(manifest, Some(sig));
        let out = self.run(device, Some(keys), &["refresh"]);
        assert!(out.status.success(), "{}", text(&out));
    }
}

for_each_generation!(
    an_unsigned_digest_with_an_evil_sidecar_never_reaches_resolve,
    an_edited_catalog_beside_a_planted_file_answers_the_built_in,
    a_deleted_or_lowered_floor_lets_no_older_release_back_in,
    a_corrupt_trust_file_is_replaced_from_the_param_and_two_bad_copies_are_named,
    a_forged_verification_cache_beside_a_planted_file_answers_the_built_in,
    planted_trust_files_are_refused_without_hanging_or_reading_them,
);

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn files_of(dir: &Path, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect();
    v.sort();
    v
}

/// The signed manifest lists `pwn223` the live way (no SHA-256, size or chunk count) and gives
/// `pop223` a Chestnut variant without them; the store holds the attacker's bytes for both,
/// each with a matching `.sha256` sidecar. With keys neither is installed or handed to modeld
/// (before, the sidecar's digest was taken and `status` said "verified"); `download` and
/// `ModelDownloadProgress` say why, `status` lists them, and a copy planted beside its sidecar
/// in `/data/models` is not "verified" either. Without keys the sidecar is still used (the
/// unprotected device's documented behaviour).
fn an_unsigned_digest_with_an_evil_sidecar_never_reaches_resolve(g: Gen) {
    let w = world_for(g);
    w.with_builtin();
    let a = Key::new();
    let keys = w.keys_file("a.pub", &[&a]);
    let evil = evil();
    publish_model(&w.root, g.name(), "pwn223", &evil, Some(CHUNK));
    for dir in artifact_dirs(&w.root, g.name(), "pop223") {
        fs::write(dir.join("pop223_amd.pkl"), &evil).unwrap();
        fs::write(
            dir.join("pop223_amd.pkl.sha256"),
            format!("{}  pop223_amd.pkl\n", sha256_hex(&evil)),
        )
        .unwrap();
    }
    let mut m: Value = serde_json::from_slice(&w.m1()).unwrap();
    m["models"][0]["accelerator_artifacts"] = json!({"chestnut": {
        "execution_device": "AMD", "artifact_format": "tinygrad_single_v1",
        "artifact_filename": "pop223_amd.pkl"}});
    m["models"].as_array_mut().unwrap().push(json!({
        "id": "pwn223", "name": "Pwn", "version": "v16", "series": "Test Series",
        "released": "2025-01-01", "community_favorite": false,
        "artifact_format": "tinygrad_single_v1", "uses_external_gpu": false}));
    let m = serde_json::to_vec_pretty(&m).unwrap();
    w.serve(&m, Some(&a.sign(&m, &w.comment(1))));
    // A ready Chestnut, so the variant would be fetched.
    let usb = w.dir.path().join("sys/bus/usb/devices/2-1");
    fs::create_dir_all(&usb).unwrap();
    fs::write(usb.join("idVendor"), "add1\n").unwrap();
    fs::write(usb.join("idProduct"), "0001\n").unwrap();
    fs::write(usb.join("product"), "custom ed4e39b7-CLEAN\n").unwrap();

    // The selected pwn223 cannot be had: the refresh falls back to the built-in.
    w.set_param("dev", "Model", "pwn223");
    w.set_param("dev", "DrivingModel", "pwn223");
    let out = w.run("dev", Some(&keys), &["refresh"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(files_of(&w.models("dev"), "pwn223").is_empty());
    assert_eq!(w.resolve("dev", &keys).0["builtin"], true);

    // Asked for explicitly: refused before a request, with the reason; nothing changes.
    let before = w.snapshot("dev");
    let out = w.run("dev", Some(&keys), &["download", "pwn223"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        stderr(&out).contains(
            "not installable: the signed manifest gives no SHA-256, size, chunk count for \
             pwn223_driving_tinygrad.pkl"
        ),
        "{}",
        text(&out)
    );
    assert!(
        stderr(&out).contains("manifest set-artifact"),
        "{}",
        text(&out)
    );
    assert_eq!(w.snapshot("dev"), before);
    // Its dry run says the same.
    let out = w.run("dev", Some(&keys), &["download", "pwn223", "--dry-run"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(stderr(&out).contains("not installable"), "{}", text(&out));

    // pop223 itself is pinned and installs; its unpinned Chestnut build is left out.
    let out = w.run("dev", Some(&keys), &["download", "pop223"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        fs::read(w.models("dev").join("pop223_driving_tinygrad.pkl")).unwrap(),
        w.pop_bytes
    );
    assert_eq!(
        files_of(&w.models("dev"), "pop223_driving_chestnut"),
        Vec::<String>::new()
    );
    // Download-all takes neither pwn223 nor the variant.
    let out = w.run("dev", Some(&keys), &["download", "--all"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(files_of(&w.models("dev"), "pwn223").is_empty());
    assert!(files_of(&w.models("dev"), "pop223_driving_chestnut").is_empty());

    let s = w.status("dev", Some(&keys));
    let listed: Vec<(&str, &str)> = s["not_installable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n["file"].as_str().unwrap()))
        .collect();
    assert_eq!(
        listed,
        [
            ("pop223", "pop223_driving_chestnut_tinygrad.pkl"),
            ("pwn223", "pwn223_driving_tinygrad.pkl")
        ],
        "{s}"
    );
    let human = w.human_status("dev", &keys);
    assert!(
        human.contains("pwn223 (pwn223_driving_tinygrad.pkl): not installable: the signed manifest gives no SHA-256"),
        "{human}"
    );

    // The attacker plants the bytes in /data/models with the sidecar a download would keep,
    // and selects them: not verified, never resolved.
    let models = w.models("dev");
    fs::write(models.join("pwn223_driving_tinygrad.pkl"), &evil).unwrap();
    fs::write(
        models.join("pwn223_driving_tinygrad.pkl.sha256"),
        format!("{}  pwn223_driving_tinygrad.pkl\n", sha256_hex(&evil)),
    )
    .unwrap();
    w.set_param("dev", "Model", "pwn223");
    w.set_param("dev", "DrivingModel", "pwn223");
    let s = w.status("dev", Some(&keys));
    let pwn = s["installed"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "pwn223")
        .cloned()
        .unwrap();
    assert_eq!(pwn["state"], "unverified", "{s}");
    assert_eq!(pwn["digest_source"], Value::Null, "{s}");
    let (r, _) = w.resolve("dev", &keys);
    assert_eq!(r["builtin"], true, "{r}");
    assert!(!w.human_status("dev", &keys).contains("pwn223 verified"));

    // The daemon shows the reason in ModelDownloadProgress.
    let mut c = manager(
        &w.data("dev"),
        &w.dir.path().join("dev").join("shm"),
        &w.dir.path().join("builtin"),
        &w.dir.path().join("sys"),
        &w.server.url(),
    );
    let mut child = c
        .arg("--trusted-keys")
        .arg(&keys)
        .args(["run", "--poll-ms", "20"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let shm = w.dir.path().join("dev").join("shm");
    fs::create_dir_all(&shm).unwrap();
    fs::write(shm.join("ModelToDownload"), "pwn223").unwrap();
    let start = Instant::now();
    let shown = loop {
        if let Ok(t) = fs::read_to_string(shm.join("ModelDownloadProgress"))
            && t.starts_with("Download failed")
        {
            break t;
        }
        if start.elapsed() > Duration::from_secs(30) {
            break String::new();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        shown,
        "Download failed: not installable: the signed model list gives no SHA-256, size or \
         chunk count for it"
    );
    assert_eq!(
        fs::read(models.join("pwn223_driving_tinygrad.pkl")).unwrap(),
        evil,
        "the daemon fetched nothing over it"
    );

    // Without keys the sidecar is what the bytes are checked against (unprotected device).
    let out = w.run("open", None, &["refresh"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = w.run("open", None, &["download", "pwn223"]);
    assert!(out.status.success(), "{}", text(&out));
    let s = w.status("open", None);
    assert_eq!(s["not_installable"], json!([]), "{s}");
}

/// The stored catalog edited to name a planted file's digest: `resolve` answers the built-in
/// and says why (stderr, `--json`, `status`); so does a catalog whose signature file is gone.
/// A refresh stores the signed catalog again and the genuine model comes back.
fn an_edited_catalog_beside_a_planted_file_answers_the_built_in(g: Gen) {
    let w = world_for(g);
    w.with_builtin();
    let a = Key::new();
    let keys = w.keys_file("a.pub", &[&a]);
    let m1 = w.m1();
    w.selecting_pop("dev", &keys, &m1, &a.sign(&m1, &w.comment(1)));
    let models = w.models("dev");
    let pop_path = models.join("pop223_driving_tinygrad.pkl");
    let (r, _) = w.resolve("dev", &keys);
    assert_eq!(r["path"], json!(pop_path), "{r}");

    // The attack: a plain file of other bytes, and the catalog edited to name them.
    let evil = evil();
    for name in files_of(&models, "pop223_driving_tinygrad.pkl") {
        fs::remove_file(models.join(name)).unwrap();
    }
    fs::write(&pop_path, &evil).unwrap();
    let _ = fs::remove_file(models.join(".verified.json"));
    let mut cat: Value =
        serde_json::from_slice(&fs::read(models.join(".catalog.json")).unwrap()).unwrap();
    let e = &mut cat["models"][0];
    e["artifact_sha256"] = json!(sha256_hex(&evil));
    e["artifact_size"] = json!(evil.len());
    e["artifact_chunk_count"] = json!(0);
    e.as_object_mut().unwrap().remove("artifact_chunk_sha256");
    fs::write(
        models.join(".catalog.json"),
        serde_json::to_vec_pretty(&cat).unwrap(),
    )
    .unwrap();

    let (r, err) = w.resolve("dev", &keys);
    assert_eq!(r["builtin"], true, "{r}");
    assert_eq!(
        r["path"],
        json!(w.dir.path().join("builtin/driving_tinygrad.pkl"))
    );
    assert!(
        r["doubt"]
            .as_str()
            .unwrap()
            .contains("the stored catalog does not verify under the trusted keys"),
        "{r}"
    );
    assert!(
        err.contains("warning: answering the built-in model"),
        "{err}"
    );
    let s = w.status("dev", Some(&keys));
    assert!(
        s["catalog_problem"]
            .as_str()
            .unwrap()
            .contains("does not verify"),
        "{s}"
    );
    assert_eq!(s["resolved"], r["path"], "{s}");
    assert!(w.human_status("dev", &keys).contains("catalog: NOT USED"));
    // Nothing acts on the edited catalog.
    let before = w.snapshot("dev");
    let out = w.run("dev", Some(&keys), &["download", "pop223"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr(&out).contains("next: run `refresh`"),
        "{}",
        text(&out)
    );
    assert_eq!(w.snapshot("dev"), before);

    // The signature kept beside it removed: the same answer.
    let sig = models.join(".catalog.json.minisig");
    let kept_sig = fs::read(&sig).unwrap();
    fs::remove_file(&sig).unwrap();
    let (r, _) = w.resolve("dev", &keys);
    assert_eq!(r["builtin"], true, "{r}");
    fs::write(&sig, kept_sig).unwrap();

    // Nothing lost: a refresh stores the signed catalog again and replaces the planted file.
    let out = w.run("dev", Some(&keys), &["refresh"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read(models.join(".catalog.json")).unwrap(), m1);
    let (r, err) = w.resolve("dev", &keys);
    assert_eq!(r["path"], json!(pop_path), "{r} {err}");
    assert_eq!(fs::read(&pop_path).unwrap(), w.pop_bytes);
    assert_eq!(w.status("dev", Some(&keys))["catalog_problem"], Value::Null);
}

/// The floor deleted or lowered in `/data/models`: the param mirror keeps release 2, a replay
/// of release 1 is refused and nothing changes (the file is restored from the param); an older
/// signed catalog put back locally is not used. `status` says which copy the floor comes from.
fn a_deleted_or_lowered_floor_lets_no_older_release_back_in(g: Gen) {
    let w = world_for(g);
    w.with_builtin();
    let a = Key::new();
    let keys = w.keys_file("a.pub", &[&a]);
    let (m1, m2) = (w.m1(), w.m2());
    let (s1, s2) = (a.sign(&m1, &w.comment(1)), a.sign(&m2, &w.comment(2)));
    w.selecting_pop("dev", &keys, &m1, &s1);
    w.serve(&m2, Some(&s2));
    assert!(w.run("dev", Some(&keys), &["refresh"]).status.success());
    let s = w.status("dev", Some(&keys));
    assert_eq!(s["trust"]["accepted_release"]["release"], 2, "{s}");
    assert_eq!(s["trust"]["accepted_release_source"], "both", "{s}");
    assert!(
        w.param("dev", RELEASE_PARAM)
            .unwrap()
            .contains("\"release\":2")
    );
    let models = w.models("dev");
    let newer = w.snapshot("dev");

    // Deleted, and release 1 replayed by both stores.
    fs::remove_file(models.join(FLOOR_FILE)).unwrap();
    let s = w.status("dev", Some(&keys));
    assert_eq!(s["trust"]["accepted_release"]["release"], 2, "{s}");
    assert_eq!(s["trust"]["accepted_release_source"], "param", "{s}");
    assert_eq!(
        s["trust"]["accepted_release_copies"]["file"], "missing",
        "{s}"
    );
    assert!(
        w.human_status("dev", &keys).contains(
            "from the param ModelManifestAcceptedRelease (.accepted-release.json: missing)"
        )
    );
    w.serve(&m1, Some(&s1));
    let out = w.run("dev", Some(&keys), &["refresh"]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    assert!(
        stderr(&out).contains("older than release 2"),
        "{}",
        text(&out)
    );
    assert_eq!(
        w.snapshot("dev"),
        newer,
        "the file is back, nothing else changed"
    );

    // Lowered to release 1, with release 1's signed catalog put back beside it.
    fs::write(
        models.join(FLOOR_FILE),
        format!(
            r#"{{"{}": {{"release": 1, "expires": 4102444800, "key": "x"}}}}"#,
            g.name()
        ),
    )
    .unwrap();
    fs::write(models.join(".catalog.json"), &m1).unwrap();
    fs::write(models.join(".catalog.json.minisig"), &s1).unwrap();
    let (r, _) = w.resolve("dev", &keys);
    assert_eq!(r["builtin"], true, "{r}");
    assert!(
        r["doubt"]
            .as_str()
            .unwrap()
            .contains("older than release 2"),
        "{r}"
    );
    assert_eq!(
        w.status("dev", Some(&keys))["trust"]["accepted_release_source"],
        "param"
    );
    let out = w.run("dev", Some(&keys), &["refresh"]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    assert!(
        w.param("dev", RELEASE_PARAM)
            .unwrap()
            .contains("\"release\":2")
    );

    // Release 2 served again: everything as it was.
    w.serve(&m2, Some(&s2));
    let out = w.run("dev", Some(&keys), &["refresh"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(w.snapshot("dev"), newer);
    let (r, _) = w.resolve("dev", &keys);
    assert_eq!(
        r["path"],
        json!(models.join("pop223_driving_tinygrad.pkl")),
        "{r}"
    );
}

/// A corrupt, oversized or non-regular floor file no longer wedges `refresh` ("remove it to
/// start over" reset rollback protection): it is rewritten from the param. With neither copy
/// valid, `refresh` refuses with both named and a next step, changes nothing, and `status`
/// says the floor is unknown.
fn a_corrupt_trust_file_is_replaced_from_the_param_and_two_bad_copies_are_named(g: Gen) {
    let w = world_for(g);
    w.with_builtin();
    let a = Key::new();
    let keys = w.keys_file("a.pub", &[&a]);
    let m1 = w.m1();
    w.selecting_pop("dev", &keys, &m1, &a.sign(&m1, &w.comment(1)));
    let models = w.models("dev");
    let floor = models.join(FLOOR_FILE);
    let before = w.snapshot("dev");

    for case in ["garbage", "huge", "fifo"] {
        let _ = fs::remove_file(&floor);
        match case {
            "garbage" => fs::write(&floor, format!("{{\"{}\": {{\"rel", g.name())).unwrap(),
            "huge" => fs::File::create(&floor).unwrap().set_len(1 << 30).unwrap(),
            _ => assert!(
                std::process::Command::new("mkfifo")
                    .arg(&floor)
                    .status()
                    .unwrap()
                    .success()
            ),
        }
        let s = w.status("dev", Some(&keys));
        assert_eq!(s["trust"]["accepted_release"]["release"], 1, "{case}: {s}");
        assert_eq!(
            s["trust"]["accepted_release_source"], "param",
            "{case}: {s}"
        );
        assert!(
            s["trust"]["accepted_release_copies"]["file"]
                .as_str()
                .unwrap()
                .starts_with("corrupt"),
            "{case}: {s}"
        );
        let out = w.run("dev", Some(&keys), &["refresh"]);
        assert!(out.status.success(), "{case}: {}", text(&out));
        assert_eq!(w.snapshot("dev"), before, "{case}: the file is restored");
        assert_eq!(
            w.status("dev", Some(&keys))["trust"]["accepted_release_source"],
            "both",
            "{case}"
        );
    }

    // Both copies unreadable: refused, both named, a next step that resets nothing itself.
    fs::write(&floor, "not json").unwrap();
    w.set_param("dev", RELEASE_PARAM, "not json either");
    let broken = w.snapshot("dev");
    let out = w.run("dev", Some(&keys), &["refresh"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the accepted release (the rollback floor) cannot be read"),
        "{err}"
    );
    assert!(
        err.contains(FLOOR_FILE) && err.contains(RELEASE_PARAM),
        "{err}"
    );
    assert!(err.contains("\nnext: restore one copy"), "{err}");
    assert!(!err.contains("remove it to start over"), "{err}");
    assert_eq!(w.snapshot("dev"), broken);
    assert!(
        w.human_status("dev", &keys)
            .contains("accepted release: UNKNOWN")
    );

    // The next step: one copy restored with the release this device accepted.
    w.set_param(
        "dev",
        RELEASE_PARAM,
        &format!(
            r#"{{"{}": {{"release": 1, "expires": 0, "key": "restored"}}}}"#,
            g.name()
        ),
    );
    let out = w.run("dev", Some(&keys), &["refresh"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        w.status("dev", Some(&keys))["trust"]["accepted_release_source"],
        "both"
    );
}

/// The stat signature `.verified.json` keeps for a plain artifact file (device, inode, size,
/// mtime, ctime), as a writer of `/data/models` can compute it for a file it planted.
fn stat_signature(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let m = fs::symlink_metadata(path).unwrap();
    format!(
        "{}:{}:{}:{}.{}:{}.{};",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    )
}

/// The verification cache `.verified.json` lives in `/data/models` too: a writer of that
/// directory plants other bytes and a cache entry matching their stat, either claiming the
/// signed digest (`verified`) or a digest verified "against an earlier catalog" (`outdated`).
/// With trusted keys the cache decides nothing: `resolve` and `status` hash the file, answer
/// the built-in, and a refresh puts the genuine model back (nothing lost).
fn a_forged_verification_cache_beside_a_planted_file_answers_the_built_in(g: Gen) {
    let w = world_for(g);
    w.with_builtin();
    let a = Key::new();
    let keys = w.keys_file("a.pub", &[&a]);
    let m1 = w.m1();
    w.selecting_pop("dev", &keys, &m1, &a.sign(&m1, &w.comment(1)));
    let models = w.models("dev");
    let pop_path = models.join("pop223_driving_tinygrad.pkl");
    let (r, _) = w.resolve("dev", &keys);
    assert_eq!(r["path"], json!(pop_path), "{r}");
    let cache_path = models.join(".verified.json");
    let genuine: Value = serde_json::from_slice(&fs::read(&cache_path).unwrap()).unwrap();
    let name = "pop223_driving_tinygrad.pkl";
    assert!(genuine[name]["catalog_verified"] == true, "{genuine}");

    let evil = evil();
    for (what, claimed_sha, claimed_size) in [
        (
            "the signed digest",
            genuine[name]["sha256"].clone(),
            genuine[name]["size"].clone(),
        ),
        (
            "an earlier verified copy",
            json!(sha256_hex(&evil)),
            json!(evil.len()),
        ),
    ] {
        for f in files_of(&models, name) {
            fs::remove_file(models.join(f)).unwrap();
        }
        fs::write(&pop_path, &evil).unwrap();
        let mut cache = genuine.clone();
        cache[name] = json!({
            "signature": stat_signature(&pop_path),
            "sha256": claimed_sha,
            "size": claimed_size,
            "catalog_verified": true,
        });
        fs::write(&cache_path, serde_json::to_vec(&cache).unwrap()).unwrap();

        let (r, err) = w.resolve("dev", &keys);
        assert_eq!(r["builtin"], true, "{what}: {r} {err}");
        let s = w.status("dev", Some(&keys));
        assert_ne!(s["resolved"], json!(pop_path), "{what}: {s}");
        assert_eq!(fs::read(&pop_path).unwrap(), evil, "{what}");
    }

    // Nothing lost: a refresh (and the download it starts for the selected model) puts the
    // genuine bytes back, and they are answered again.
    let out = w.run("dev", Some(&keys), &["refresh"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = w.run("dev", Some(&keys), &["download", "pop223"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read(&pop_path).unwrap(), w.pop_bytes);
    let (r, err) = w.resolve("dev", &keys);
    assert_eq!(r["path"], json!(pop_path), "{r} {err}");
}

/// `run` with a deadline: a read that blocks on a planted FIFO fails the test instead of
/// hanging it.
fn run_within(w: &World, device: &str, keys: &Path, args: &[&str]) -> Output {
    let (tx, rx) = std::sync::mpsc::channel();
    let (dir, url) = (w.dir.path().to_path_buf(), w.server.url());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let (device, keys, shown) = (device.to_string(), keys.to_path_buf(), args.clone());
    std::thread::spawn(move || {
        let mut c = manager(
            &dir.join(&device),
            &dir.join(&device).join("shm"),
            &dir.join("builtin"),
            &dir.join("sys"),
            &url,
        );
        c.arg("--trusted-keys").arg(&keys).args(&args);
        let _ = tx.send(c.stdin(Stdio::null()).output().unwrap());
    });
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("{shown:?} hung on a planted file"))
}

/// The device's trust files and `--trusted-keys` planted as a FIFO or a symlink to `/dev/zero`:
/// read capped and only as regular files, so nothing hangs or fills memory. A planted keys file
/// is an error naming it (never "unprotected"); a planted catalog signature or catalog makes
/// `resolve` answer the built-in; a refresh stores the signed pair again (nothing lost).
fn planted_trust_files_are_refused_without_hanging_or_reading_them(g: Gen) {
    let w = world_for(g);
    w.with_builtin();
    let a = Key::new();
    let keys = w.keys_file("a.pub", &[&a]);
    let m1 = w.m1();
    w.selecting_pop("dev", &keys, &m1, &a.sign(&m1, &w.comment(1)));
    let models = w.models("dev");
    let pop_path = models.join("pop223_driving_tinygrad.pkl");
    let planted = w.dir.path().join("planted");
    fs::create_dir_all(&planted).unwrap();
    let fifo = planted.join("fifo");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let zero = planted.join("zero");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();

    for bad in [&fifo, &zero] {
        let out = run_within(&w, "dev", bad, &["status", "--json"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(
            stderr(&out).contains("not a regular file")
                && stderr(&out).contains(bad.to_str().unwrap()),
            "{}",
            text(&out)
        );
    }

    for name in [".catalog.json.minisig", ".catalog.json"] {
        let path = models.join(name);
        let kept = fs::read(&path).unwrap();
        for bad in [&fifo, &zero] {
            fs::remove_file(&path).unwrap();
            std::os::unix::fs::symlink(bad, &path).unwrap();
            let out = run_within(&w, "dev", &keys, &["resolve", "--json"]);
            assert!(out.status.success(), "{name}: {}", text(&out));
            let r: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(r["builtin"], true, "{name} -> {bad:?}: {r}");
            // `status` reports a planted signature as a catalog not used; a planted catalog
            // as a corrupt state file, named (as without keys).
            let out = run_within(&w, "dev", &keys, &["status", "--json"]);
            if name == ".catalog.json" {
                assert_eq!(out.status.code(), Some(1), "{name}: {}", text(&out));
                assert!(
                    stderr(&out).contains(path.to_str().unwrap()),
                    "{}",
                    text(&out)
                );
            } else {
                assert!(out.status.success(), "{name}: {}", text(&out));
                let s: Value = serde_json::from_slice(&out.stdout).unwrap();
                assert!(
                    s["catalog_problem"]
                        .as_str()
                        .is_some_and(|p| p.contains("not a regular file")),
                    "{s}"
                );
            }
        }
        // Nothing lost: a refresh stores the signed pair again.
        let out = run_within(&w, "dev", &keys, &["refresh"]);
        assert!(out.status.success(), "{name}: {}", text(&out));
        assert_eq!(fs::read(&path).unwrap(), kept, "{name}");
        let (r, err) = w.resolve("dev", &keys);
        assert_eq!(r["path"], json!(pop_path), "{name}: {r} {err}");
    }
}
