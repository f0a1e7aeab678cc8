//! Signed manifests, end to end: the real `device-modeld-manager` with `--trusted-keys` against a
//! real HTTP server on 127.0.0.1 serving both store layouts. Signatures are made with the
//! `minisign` crate (the release side's implementation), so the device's `minisign-verify` is
//! checked against another implementation of the format.

use std::collections::BTreeMap;
use std::fs;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::*;
use serde_json::Value;
use test_support::http_server::FaultServer;
use test_support::published::{
    GH_DIR, HF_DIR, PublishedModel, artifact_bytes, manifest_json, publish_model, write_manifest,
};

pub(crate) const CHUNK: usize = 64 * 1024;

/// A generation the trust tests run for: v25 (in this build's pin table, its tree has no pins
/// file) and a made-up v26 (only the device's openpilot tree knows its pin: the marker at
/// [`V26_PIN`] and `tinygrad_pins.json` recording it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gen {
    V25,
    V26,
}

impl Gen {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Gen::V25 => "v25",
            Gen::V26 => "v26",
        }
    }

    /// The tinygrad pin of this generation (the tree's marker, the manifest's
    /// `tinygrad_commit`).
    pub(crate) fn pin(self) -> &'static str {
        match self {
            Gen::V25 => manifest::layout::CURRENT_TINYGRAD_COMMIT,
            Gen::V26 => V26_PIN,
        }
    }

    /// The other generation of the two (a signature for it is refused).
    pub(crate) fn other(self) -> Gen {
        match self {
            Gen::V25 => Gen::V26,
            Gen::V26 => Gen::V25,
        }
    }

    /// Make `op` this generation's openpilot tree.
    fn set_tree(self, op: &Path) {
        match self {
            Gen::V25 => set_tree(op, self.pin(), None),
            Gen::V26 => set_tree(op, self.pin(), Some(&v26_pins())),
        }
    }

    /// The signature file's name beside this generation's manifest.
    pub(crate) fn sig(self) -> String {
        format!("model_names_{}.json.minisig", self.name())
    }

    /// A signature comment for `release` of this generation, expiring in a day.
    pub(crate) fn comment(self, release: u64) -> String {
        format!(
            "generation={} release={release} expires={}",
            self.name(),
            now() + 86_400
        )
    }
}

pub(crate) struct Key {
    pub(crate) pk: minisign::PublicKey,
    pub(crate) sk: minisign::SecretKey,
}

impl Key {
    pub(crate) fn new() -> Key {
        let kp = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
        Key {
            pk: kp.pk,
            sk: kp.sk,
        }
    }

    pub(crate) fn pub_file(&self) -> String {
        self.pk.to_box().unwrap().into_string()
    }

    pub(crate) fn sign(&self, data: &[u8], comment: &str) -> String {
        minisign::sign(
            Some(&self.pk),
            &self.sk,
            Cursor::new(data),
            Some(comment),
            None,
        )
        .unwrap()
        .into_string()
    }
}

/// Each test `$t` (a `fn(Gen)`) as two tests, `<$t>::v25` and `<$t>::v26`: the device's
/// openpilot tree, the origin's manifest and the signatures all at that generation.
macro_rules! for_each_generation {
    ($($t:ident),* $(,)?) => {$(
        mod $t {
            use $crate::signed::Gen;
            #[test]
            fn v25() {
                super::$t(Gen::V25)
            }
            #[test]
            fn v26() {
                super::$t(Gen::V26)
            }
        }
    )*};
}
pub(crate) use for_each_generation;

for_each_generation!(
    pinned_key_installs_and_every_bad_signature_is_refused_without_a_change,
    a_replayed_older_release_is_refused_and_the_newer_state_kept,
    key_rotation_with_two_keys,
    a_bad_signature_on_hugging_face_falls_through_to_github,
    without_keys_nothing_changes_but_status_says_unprotected,
    the_daemon_shows_a_refusal_in_model_download_progress,
    a_crash_after_each_new_effect_is_completed_by_the_next_refresh,
);

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

pub(crate) struct World {
    pub(crate) generation: Gen,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) root: PathBuf,
    pub(crate) server: FaultServer,
    pub(crate) pop: PublishedModel,
    pub(crate) pop_bytes: Vec<u8>,
    pub(crate) other: PublishedModel,
}

/// The origin publishing `generation`'s models, and the openpilot tree every device of this
/// world is pointed at (`<dir>/openpilot`, see [`openpilot_tree`]) at that generation.
pub(crate) fn world_for(generation: Gen) -> World {
    let dir = tempfile::tempdir().unwrap();
    generation.set_tree(&dir.path().join("openpilot"));
    let root = dir.path().join("origin");
    fs::create_dir_all(&root).unwrap();
    let g = generation.name();
    let pop_bytes = artifact_bytes(25, 3 * CHUNK / 2);
    let pop = publish_model(&root, g, "pop223", &pop_bytes, Some(CHUNK));
    let other = publish_model(&root, g, "other", &artifact_bytes(26, CHUNK), Some(CHUNK));
    let server = FaultServer::start(&root).unwrap();
    World {
        generation,
        dir,
        root,
        server,
        pop,
        pop_bytes,
        other,
    }
}

impl World {
    /// This generation's catalog of `models`, naming its tinygrad pin.
    fn catalog(&self, models: &[PublishedModel]) -> Vec<u8> {
        manifest_json(self.generation.name(), models, true)
            .replacen(
                "\"models\":",
                &format!(
                    "\"tinygrad_commit\": \"{}\",\n  \"models\":",
                    self.generation.pin()
                ),
                1,
            )
            .into_bytes()
    }

    /// Release 1's catalog: `pop223` only.
    pub(crate) fn m1(&self) -> Vec<u8> {
        self.catalog(std::slice::from_ref(&self.pop))
    }

    /// A later catalog: `pop223` and `other`.
    pub(crate) fn m2(&self) -> Vec<u8> {
        self.catalog(&[self.pop.clone(), self.other.clone()])
    }

    /// A signature comment for `release` of this world's generation.
    pub(crate) fn comment(&self, release: u64) -> String {
        self.generation.comment(release)
    }

    /// Serve `manifest` with `sig` (or no signature file) from both origins.
    pub(crate) fn serve(&self, manifest: &[u8], sig: Option<&str>) {
        write_manifest(&self.root, self.generation.name(), manifest);
        let sig_name = self.generation.sig();
        for dir in [
            self.root.join(HF_DIR).join("manifests"),
            self.root.join(GH_DIR),
        ] {
            match sig {
                Some(s) => fs::write(dir.join(&sig_name), s).unwrap(),
                None => {
                    let _ = fs::remove_file(dir.join(&sig_name));
                }
            }
        }
    }

    pub(crate) fn serve_at(&self, layout_dir: &str, manifest: &[u8], sig: &str) {
        test_support::published::write_manifest_at(
            &self.root,
            layout_dir,
            self.generation.name(),
            manifest,
        );
        let dir = if layout_dir == HF_DIR {
            self.root.join(HF_DIR).join("manifests")
        } else {
            self.root.join(GH_DIR)
        };
        fs::write(dir.join(self.generation.sig()), sig).unwrap();
    }

    pub(crate) fn keys_file(&self, name: &str, keys: &[&Key]) -> PathBuf {
        let p = self.dir.path().join(name);
        let text: String = keys.iter().map(|k| k.pub_file()).collect();
        fs::write(&p, text).unwrap();
        p
    }

    /// The device's data root; created, as a comma's `/data` always exists.
    pub(crate) fn data(&self, device: &str) -> PathBuf {
        let d = self.dir.path().join(device);
        fs::create_dir_all(&d).unwrap();
        d
    }

    pub(crate) fn run(&self, device: &str, keys: Option<&Path>, args: &[&str]) -> Output {
        let mut c = manager(
            &self.data(device),
            &self.dir.path().join(device).join("shm"),
            &self.dir.path().join("builtin"),
            &self.dir.path().join("sys"),
            &self.server.url(),
        );
        if let Some(k) = keys {
            c.arg("--trusted-keys").arg(k);
        }
        c.args(args).stdin(Stdio::null()).output().unwrap()
    }

    pub(crate) fn status(&self, device: &str, keys: Option<&Path>) -> Value {
        let out = self.run(device, keys, &["status", "--json"]);
        assert!(out.status.success(), "{}", text(&out));
        let s: Value = serde_json::from_slice(&out.stdout).unwrap();
        // The device reads its generation from the tree this world set up.
        assert_eq!(s["generation"], self.generation.name(), "{s}");
        assert_eq!(s["tree"]["tinygrad_commit"], self.generation.pin(), "{s}");
        s
    }

    pub(crate) fn param(&self, device: &str, key: &str) -> Option<String> {
        fs::read_to_string(self.data(device).join("params/d").join(key)).ok()
    }

    /// Every file of the device's data dir (models, params, state) and its bytes, except the
    /// refusal report, which exists to say what was refused.
    pub(crate) fn snapshot(&self, device: &str) -> BTreeMap<PathBuf, Vec<u8>> {
        fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
            for e in fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, base, out);
                } else if p.file_name().unwrap() != ".refused-manifest.json" {
                    out.insert(p.strip_prefix(base).unwrap().into(), fs::read(&p).unwrap());
                }
            }
        }
        let mut out = BTreeMap::new();
        let d = self.data(device);
        walk(&d, &d, &mut out);
        out
    }
}

pub(crate) fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn pinned_key_installs_and_every_bad_signature_is_refused_without_a_change(g: Gen) {
    let w = world_for(g);
    let (a, b) = (Key::new(), Key::new());
    let keys = w.keys_file("a.pub", &[&a]);

    // Signed by the pinned key: accepted, and its model installs.
    let m1 = w.m1();
    w.serve(&m1, Some(&a.sign(&m1, &w.comment(1))));
    let out = w.run("dev", Some(&keys), &["refresh"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = w.run("dev", Some(&keys), &["download", "pop223"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        fs::read(w.data("dev").join("models/pop223_driving_tinygrad.pkl")).unwrap(),
        w.pop_bytes
    );
    let s = w.status("dev", Some(&keys));
    assert_eq!(s["trust"]["protected"], true);
    assert_eq!(s["trust"]["accepted_release"]["release"], 1);
    assert_eq!(s["trust"]["last_refusal"], Value::Null);
    let before = w.snapshot("dev");
    assert_eq!(w.param("dev", "AvailableModels").as_deref(), Some("pop223"));

    // Every bad case serves the newer catalog (which would add `other`) with a bad signature.
    let m2 = w.m2();
    let mut tampered = m2.clone();
    let sig_of_m2 = a.sign(&m2, &w.comment(2));
    let pos = tampered.windows(6).position(|x| x == b"pop223").unwrap();
    tampered[pos..pos + 6].copy_from_slice(b"pwn223");
    let expired = format!("generation={} release=2 expires={}", g.name(), now() - 60);
    let cases: Vec<(&str, Vec<u8>, Option<String>, &str)> = vec![
        (
            "tampered after signing",
            tampered,
            Some(sig_of_m2.clone()),
            "Model list refused: not signed by a trusted key",
        ),
        (
            "unsigned",
            m2.clone(),
            None,
            "Model list refused: not signed",
        ),
        (
            "signed by another key",
            m2.clone(),
            Some(b.sign(&m2, &w.comment(2))),
            "Model list refused: not signed by a trusted key",
        ),
        (
            "other generation in the comment",
            m2.clone(),
            Some(a.sign(
                &m2,
                &format!(
                    "generation={} release=2 expires={}",
                    g.other().name(),
                    now() + 86_400
                ),
            )),
            "Model list refused: signed for another generation",
        ),
        (
            "expired",
            m2.clone(),
            Some(a.sign(&m2, &expired)),
            "Model list refused: signature expired",
        ),
        (
            "signature file of garbage",
            m2.clone(),
            Some("not a signature\n".into()),
            "Model list refused: not signed by a trusted key",
        ),
    ];
    for (what, manifest, sig, ui) in cases {
        w.serve(&manifest, sig.as_deref());
        let out = w.run("dev", Some(&keys), &["refresh"]);
        assert_eq!(out.status.code(), Some(5), "{what}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("manifest refused"), "{what}: {err}");
        assert!(
            err.contains("nothing on this device was changed"),
            "{what}: {err}"
        );
        assert_eq!(w.snapshot("dev"), before, "{what}: the device changed");
        let s = w.status("dev", Some(&keys));
        assert_eq!(s["trust"]["last_refusal"]["text"], ui, "{what}");
        assert_eq!(
            s["trust"]["last_refusal"]["reasons"]
                .as_array()
                .unwrap()
                .len(),
            2,
            "{what}: both origins were tried"
        );
        assert_eq!(s["trust"]["accepted_release"]["release"], 1, "{what}");
        let human = w.run("dev", Some(&keys), &["status"]);
        assert!(
            String::from_utf8_lossy(&human.stdout).contains(ui),
            "{what}: {}",
            text(&human)
        );
    }

    // The properly signed catalog is accepted after all that, and clears the refusal.
    w.serve(&m2, Some(&sig_of_m2));
    let out = w.run("dev", Some(&keys), &["refresh"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        w.param("dev", "AvailableModels").as_deref(),
        Some("pop223,other")
    );
    let s = w.status("dev", Some(&keys));
    assert_eq!(s["trust"]["accepted_release"]["release"], 2);
    assert_eq!(s["trust"]["last_refusal"], Value::Null);
}

fn a_replayed_older_release_is_refused_and_the_newer_state_kept(g: Gen) {
    let w = world_for(g);
    let a = Key::new();
    let keys = w.keys_file("a.pub", &[&a]);
    let (m1, m2) = (w.m1(), w.m2());
    let (s1, s2) = (a.sign(&m1, &w.comment(1)), a.sign(&m2, &w.comment(2)));

    w.serve(&m1, Some(&s1));
    assert!(w.run("dev", Some(&keys), &["refresh"]).status.success());
    w.serve(&m2, Some(&s2));
    assert!(w.run("dev", Some(&keys), &["refresh"]).status.success());
    let newer = w.snapshot("dev");
    assert_eq!(
        w.param("dev", "AvailableModels").as_deref(),
        Some("pop223,other")
    );

    // Release 1 again, validly signed, served by both origins: a rollback.
    w.serve(&m1, Some(&s1));
    let out = w.run("dev", Some(&keys), &["refresh"]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("older than release 2"),
        "{}",
        text(&out)
    );
    assert_eq!(w.snapshot("dev"), newer);
    let s = w.status("dev", Some(&keys));
    assert_eq!(s["trust"]["accepted_release"]["release"], 2);
    assert_eq!(
        s["trust"]["last_refusal"]["text"],
        "Model list refused: older than the installed one"
    );

    // The same release fetched again is fine.
    w.serve(&m2, Some(&s2));
    assert!(w.run("dev", Some(&keys), &["refresh"]).status.success());
}

fn key_rotation_with_two_keys(g: Gen) {
    let w = world_for(g);
    let (old, new) = (Key::new(), Key::new());
    let only_old = w.keys_file("old.pub", &[&old]);
    let only_new = w.keys_file("new.pub", &[&new]);
    let both = w.keys_file("both.pub", &[&old, &new]);
    let (m1, m2) = (w.m1(), w.m2());

    // 1. Before the rotation: the old key signs; devices have the old key, or already both.
    w.serve(&m1, Some(&old.sign(&m1, &w.comment(1))));
    for (dev, keys) in [("old", &only_old), ("both", &both)] {
        let out = w.run(dev, Some(keys), &["refresh"]);
        assert!(out.status.success(), "{dev}: {}", text(&out));
    }

    // 2. The overlap: one signature file with a block per key. Every device accepts it, also
    //    a freshly installed one that only knows the new key.
    let overlap = format!(
        "{}{}",
        new.sign(&m2, &w.comment(2)),
        old.sign(&m2, &w.comment(2))
    );
    w.serve(&m2, Some(&overlap));
    for (dev, keys) in [("old", &only_old), ("both", &both), ("new", &only_new)] {
        let out = w.run(dev, Some(keys), &["refresh"]);
        assert!(out.status.success(), "{dev}: {}", text(&out));
        assert_eq!(
            w.status(dev, Some(keys))["trust"]["accepted_release"]["release"],
            2,
            "{dev}"
        );
    }

    // 3. The old key retired: only the new key signs. A device still on the old key alone
    //    refuses (and keeps release 2); the others accept.
    w.serve(&m1, Some(&new.sign(&m1, &w.comment(3))));
    let before = w.snapshot("old");
    let out = w.run("old", Some(&only_old), &["refresh"]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    assert_eq!(w.snapshot("old"), before);
    for (dev, keys) in [("both", &both), ("new", &only_new)] {
        let out = w.run(dev, Some(keys), &["refresh"]);
        assert!(out.status.success(), "{dev}: {}", text(&out));
        assert_eq!(w.param(dev, "AvailableModels").as_deref(), Some("pop223"));
    }
}

fn a_bad_signature_on_hugging_face_falls_through_to_github(g: Gen) {
    let w = world_for(g);
    let (a, b) = (Key::new(), Key::new());
    let keys = w.keys_file("a.pub", &[&a]);
    let m2 = w.m2();
    w.serve_at(HF_DIR, &m2, &b.sign(&m2, &w.comment(1)));
    w.serve_at(GH_DIR, &m2, &a.sign(&m2, &w.comment(1)));
    let out = w.run("dev", Some(&keys), &["refresh", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        r["manifest_origin"].as_str().unwrap().starts_with("GitHub"),
        "{r}"
    );
    // Accepted, but what Hugging Face served is reported.
    let s = w.status("dev", Some(&keys));
    assert_eq!(s["trust"]["accepted_release"]["release"], 1);
    let reasons = s["trust"]["last_refusal"]["reasons"].as_array().unwrap();
    assert_eq!(reasons.len(), 1, "{s}");
    assert!(
        reasons[0].as_str().unwrap().starts_with("Hugging Face"),
        "{s}"
    );
    // Once Hugging Face serves the signed manifest again, the report is cleared.
    w.serve_at(HF_DIR, &m2, &a.sign(&m2, &w.comment(1)));
    assert!(w.run("dev", Some(&keys), &["refresh"]).status.success());
    assert_eq!(
        w.status("dev", Some(&keys))["trust"]["last_refusal"],
        Value::Null
    );
}

fn without_keys_nothing_changes_but_status_says_unprotected(g: Gen) {
    let w = world_for(g);
    let m1 = w.m1();
    w.serve(&m1, None);
    let out = w.run("dev", None, &["refresh"]);
    assert!(out.status.success(), "{}", text(&out));
    let s = w.status("dev", None);
    assert_eq!(s["trust"]["protected"], false);
    let human = w.run("dev", None, &["status"]);
    assert!(
        String::from_utf8_lossy(&human.stdout).contains("manifest trust: UNPROTECTED"),
        "{}",
        text(&human)
    );
    // A keys file that was asked for but cannot be read is an error, not "unprotected".
    let missing = w.dir.path().join("missing.pub");
    let out = w.run("dev", Some(&missing), &["status"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("missing.pub"),
        "{}",
        text(&out)
    );
}

fn the_daemon_shows_a_refusal_in_model_download_progress(g: Gen) {
    let w = world_for(g);
    let (a, b) = (Key::new(), Key::new());
    let keys = w.keys_file("a.pub", &[&a]);
    let m1 = w.m1();
    w.serve(&m1, Some(&b.sign(&m1, &w.comment(1))));
    let mut child = Command::new(BIN)
        .arg("--data-dir")
        .arg(w.data("dev"))
        .arg("--openpilot-dir")
        .arg(openpilot_tree(&w.data("dev")))
        .arg("--hf-base")
        .arg(format!("{}/{HF_DIR}", w.server.url()))
        .arg("--github-base")
        .arg(format!("{}/{GH_DIR}", w.server.url()))
        .arg("--builtin-dir")
        .arg(w.dir.path().join("builtin"))
        .arg("--memory-params-dir")
        .arg(w.dir.path().join("shm"))
        .arg("--trusted-keys")
        .arg(&keys)
        .args(["run", "--poll-ms", "20"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let progress = w.dir.path().join("shm/ModelDownloadProgress");
    let start = Instant::now();
    let shown = loop {
        if let Ok(t) = fs::read_to_string(&progress)
            && t.starts_with("Model list refused")
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
    assert_eq!(shown, "Model list refused: not signed by a trusted key");
    assert_eq!(w.param("dev", "AvailableModels"), None);
}

/// A signed refresh stores, in order: the signature file with the new and the old block, the
/// catalog, the signature file with the new block alone, the accepted release (file, then its
/// param mirror), then removes the old refusal report. The state a crash leaves after each of
/// them, made from a twin device that took release 2 cleanly: `resolve` still answers the
/// selected model from a catalog that verifies, a replay of release 1 is refused as soon as
/// release 2's catalog is stored, and the next refresh ends where the twin is.
fn a_crash_after_each_new_effect_is_completed_by_the_next_refresh(g: Gen) {
    let w = world_for(g);
    let a = Key::new();
    let keys = w.keys_file("a.pub", &[&a]);
    let (m1, m2) = (w.m1(), w.m2());
    let (s1, s2) = (a.sign(&m1, &w.comment(1)), a.sign(&m2, &w.comment(2)));
    let builtin = w.dir.path().join("builtin");
    fs::create_dir_all(&builtin).unwrap();
    fs::write(builtin.join("driving_tinygrad.pkl.chunk01of01"), b"builtin").unwrap();
    fs::write(builtin.join("driving_tinygrad.pkl.chunkmanifest"), b"1").unwrap();
    w.serve(&m2, Some(&s2));
    assert!(w.run("twin", Some(&keys), &["refresh"]).status.success());
    let twin = |name: &str| fs::read(w.data("twin").join("models").join(name)).unwrap();
    let param_2 = w.param("twin", "ModelManifestAcceptedRelease").unwrap();
    assert!(param_2.contains("\"release\":2"), "{param_2}");

    let steps = [
        "signature file with both blocks",
        "catalog stored",
        "signature file with the new block",
        "accepted release file raised",
        "param mirror raised",
    ];
    for (n, crash_after) in steps.iter().enumerate() {
        let dev = format!("dev-{n}");
        let models = w.data(&dev).join("models");
        fs::create_dir_all(w.data(&dev).join("params/d")).unwrap();
        for (k, v) in [("Model", "pop223"), ("DrivingModel", "pop223")] {
            fs::write(w.data(&dev).join("params/d").join(k), v).unwrap();
        }
        w.serve(&m1, Some(&s1));
        assert!(w.run(&dev, Some(&keys), &["refresh"]).status.success());
        // A refused fetch leaves a refusal report behind.
        w.serve(&m2, None);
        assert_eq!(
            w.run(&dev, Some(&keys), &["refresh"]).status.code(),
            Some(5)
        );
        assert!(models.join(".refused-manifest.json").exists());
        // The crash.
        let old_sig = fs::read(models.join(".catalog.json.minisig")).unwrap();
        let both = [twin(".catalog.json.minisig"), old_sig].concat();
        fs::write(models.join(".catalog.json.minisig"), &both).unwrap();
        if n >= 1 {
            fs::write(models.join(".catalog.json"), twin(".catalog.json")).unwrap();
        }
        if n >= 2 {
            fs::write(
                models.join(".catalog.json.minisig"),
                twin(".catalog.json.minisig"),
            )
            .unwrap();
        }
        if n >= 3 {
            fs::write(
                models.join(".accepted-release.json"),
                twin(".accepted-release.json"),
            )
            .unwrap();
        }
        if n >= 4 {
            fs::write(
                w.data(&dev).join("params/d/ModelManifestAcceptedRelease"),
                &param_2,
            )
            .unwrap();
        }
        let out = w.run(&dev, Some(&keys), &["resolve", "--json"]);
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["builtin"], false, "{crash_after}: {r} {}", text(&out));
        assert_eq!(r.get("doubt"), None, "{crash_after}: {r}");
        w.serve(&m1, Some(&s1));
        let replay = w.run(&dev, Some(&keys), &["refresh", "--dry-run"]);
        assert_eq!(
            replay.status.success(),
            n == 0,
            "{crash_after}: release 1 replayed: {}",
            text(&replay)
        );
        w.serve(&m2, Some(&s2));
        let out = w.run(&dev, Some(&keys), &["refresh"]);
        assert!(out.status.success(), "{crash_after}: {}", text(&out));
        assert_eq!(
            w.param(&dev, "AvailableModels").as_deref(),
            Some("pop223,other"),
            "{crash_after}"
        );
        for name in [
            ".catalog.json",
            ".catalog.json.minisig",
            ".accepted-release.json",
        ] {
            assert_eq!(
                fs::read(models.join(name)).unwrap(),
                twin(name),
                "{crash_after}: {name}"
            );
        }
        assert_eq!(
            w.param(&dev, "ModelManifestAcceptedRelease").as_deref(),
            Some(param_2.as_str()),
            "{crash_after}"
        );
        assert!(
            !models.join(".refused-manifest.json").exists(),
            "{crash_after}"
        );
        assert!(w.run(&dev, Some(&keys), &["gc"]).status.success());
        assert!(models.join(".catalog.json.minisig").exists(), "gc keeps it");
        let s = w.status(&dev, Some(&keys));
        assert_eq!(
            s["trust"]["accepted_release"]["release"], 2,
            "{crash_after}"
        );
        assert_eq!(
            s["trust"]["accepted_release_source"], "both",
            "{crash_after}"
        );
        assert_eq!(s["trust"]["last_refusal"], Value::Null, "{crash_after}");
    }
}
