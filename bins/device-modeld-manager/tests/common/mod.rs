//! The device every test runs the real binary on: a temporary directory laid out like a comma
//! (the data root, the in-memory params, the openpilot checkout's built-in model, an empty sysfs),
//! and the command line that points the binary at it and at an origin on 127.0.0.1.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use test_support::published::{GH_DIR, HF_DIR};
use test_support::upstream_v26::{COMPILER_REVISION, Runtime, declare_tree};

pub const BIN: &str = env!("CARGO_BIN_EXE_device-modeld-manager");

/// The files of the built-in model in the openpilot checkout (a one-chunk set).
const BUILTIN_FILES: [(&str, &[u8]); 2] = [
    ("driving_tinygrad.pkl.chunk01of01", b"builtin"),
    ("driving_tinygrad.pkl.chunkmanifest", b"1"),
];

/// What a v24 device selecting `pop223` has in its params.
const V24_SELECTION: [(&str, &str); 6] = [
    ("Model", "pop223"),
    ("DrivingModel", "pop223"),
    ("DrivingModelName", "Model pop223"),
    ("ModelVersion", "v16"),
    ("DrivingModelVersion", "v16"),
    ("ModelManifestVersion", "v24"),
];

/// A made-up next generation's tinygrad pin (no real tinygrad commit).
pub const V26_PIN: &str = "26262626262626262626262626262626262626aa";

/// A made-up v27's tinygrad pin.
pub const V27_PIN: &str = "27272727272727272727272727272727272727bb";

/// The tinygrad of a tree declaring `generation` on upstream's v26 contract: upstream's own
/// for v26, [`V27_PIN`] for a later one.
pub fn contract_pin(generation: &str) -> &'static str {
    if generation == "v26" {
        COMPILER_REVISION
    } else {
        V27_PIN
    }
}

/// The reviewed catalog rows of a tree declaring upstream's v26 contract: `ids`, none for the
/// external GPU, each named `Model <id>` as the published manifests name them.
pub fn contract_rows(ids: &[&str]) -> Vec<Value> {
    ids.iter()
        .map(|id| json!({"id": id, "name": format!("Model {id}"), "version": "v16"}))
        .collect()
}

/// The openpilot checkout beside the data root `data` (`<data>/../openpilot`), created when it
/// does not exist as a v25 tree: `tinygrad_repo/TINYGRAD_COMMIT` holds v25's pin and there is no pins file
/// (the built-in table knows v25). A test moves it to another tinygrad with [`set_tree`].
pub fn openpilot_tree(data: &Path) -> PathBuf {
    let op = data.parent().unwrap().join("openpilot");
    if !op.exists() {
        set_tree(&op, manifest::layout::CURRENT_TINYGRAD_COMMIT, None);
    }
    op
}

const TREE_MARKER: &str = "tinygrad_repo/TINYGRAD_COMMIT";

/// Make `op` an openpilot tree at tinygrad `pin` (the marker with a newline, as `release-cli
/// tinygrad bump` writes it), with `pins` as its `tinygrad_pins.json` (`None`: no pins file).
pub fn set_tree(op: &Path, pin: &str, pins: Option<&str>) {
    fs::create_dir_all(op.join("tinygrad_repo")).unwrap();
    fs::write(op.join(TREE_MARKER), format!("{pin}\n")).unwrap();
    let file = op.join("tinygrad_pins.json");
    match pins {
        Some(body) => fs::write(&file, body).unwrap(),
        None => {
            let _ = fs::remove_file(&file);
        }
    }
}

/// The pins file of a tree bumped to the made-up v26.
pub fn v26_pins() -> String {
    format!(
        "{{\n  \"v25\": \"{}\",\n  \"v26\": \"{V26_PIN}\"\n}}\n",
        manifest::layout::CURRENT_TINYGRAD_COMMIT
    )
}

/// `device-modeld-manager` for the device whose data root is `data`, with the built-in model in
/// `builtin`, the in-memory params in `memory` and sysfs at `sysfs`, against the origins below
/// `base` (`{base}/hf` and `{base}/gh`), no space margin. The generation comes from the
/// openpilot tree beside `data` ([`openpilot_tree`]: v25 unless the test moved it), as on a
/// comma: no `--generation`.
pub fn manager(data: &Path, memory: &Path, builtin: &Path, sysfs: &Path, base: &str) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--data-dir")
        .arg(data)
        .arg("--openpilot-dir")
        .arg(openpilot_tree(data))
        .arg("--hf-base")
        .arg(format!("{base}/{HF_DIR}"))
        .arg("--github-base")
        .arg(format!("{base}/{GH_DIR}"))
        .args(["--space-margin-mib", "0"])
        .arg("--builtin-dir")
        .arg(builtin)
        .arg("--memory-params-dir")
        .arg(memory)
        .arg("--sysfs-root")
        .arg(sysfs);
    c
}

/// A comma under a temporary directory: `data/` (created, as a comma's `/data` always exists),
/// `shm/params/d`, `builtin/` (with the built-in model), `openpilot/` (a v25 tree, see
/// [`openpilot_tree`]) and `sys/` (absent until a test plugs in a device).
pub struct Device {
    pub dir: tempfile::TempDir,
}

impl Device {
    pub fn new() -> Device {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("data")).unwrap();
        let d = Device { dir };
        fs::create_dir_all(d.builtin()).unwrap();
        for (name, body) in BUILTIN_FILES {
            fs::write(d.builtin().join(name), body).unwrap();
        }
        // Before the first command, so a snapshot of the whole directory sees it already.
        openpilot_tree(&d.data());
        d
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }
    pub fn models(&self) -> PathBuf {
        self.data().join("models")
    }
    pub fn params(&self) -> PathBuf {
        self.data().join("params/d")
    }
    pub fn memory(&self) -> PathBuf {
        self.dir.path().join("shm/params/d")
    }
    pub fn builtin(&self) -> PathBuf {
        self.dir.path().join("builtin")
    }
    /// The openpilot checkout the binary is pointed at (see [`openpilot_tree`]).
    pub fn openpilot(&self) -> PathBuf {
        openpilot_tree(&self.data())
    }

    /// Make this device's tree declare `generation` on upstream's v26 contract with `rows`, on
    /// [`contract_pin`]'s tinygrad; what the device runs.
    pub fn declare(&self, generation: &str, rows: &[Value]) -> Runtime {
        declare_tree(
            &self.openpilot(),
            generation,
            contract_pin(generation),
            rows,
        )
    }

    /// What a device on this tree runs once it declares `generation` ([`Device::declare`]).
    pub fn runtime(&self, generation: &str) -> Runtime {
        Runtime::of_tree(&self.openpilot(), generation, contract_pin(generation))
    }

    /// `<models>/<gen>`: where a generation of upstream's v26 contract keeps its files.
    pub fn root(&self, generation: &str) -> PathBuf {
        self.models().join(generation)
    }

    /// The binary for this device against the origins below `base`, with `args`.
    pub fn command(&self, base: &str, args: &[&str]) -> Command {
        let mut c = manager(
            &self.data(),
            &self.memory(),
            &self.builtin(),
            &self.dir.path().join("sys"),
            base,
        );
        c.args(args);
        c
    }

    pub fn param(&self, key: &str) -> Option<String> {
        fs::read_to_string(self.params().join(key)).ok()
    }
    pub fn set_param(&self, key: &str, value: &str) {
        fs::create_dir_all(self.params()).unwrap();
        fs::write(self.params().join(key), value).unwrap();
    }
    pub fn mem(&self, key: &str) -> Option<String> {
        fs::read_to_string(self.memory().join(key)).ok()
    }
    pub fn set_mem(&self, key: &str, value: &str) {
        fs::create_dir_all(self.memory()).unwrap();
        fs::write(self.memory().join(key), value).unwrap();
    }

    /// The installed driving artifact of `id`, if any.
    pub fn installed(&self, id: &str) -> Option<Vec<u8>> {
        fs::read(self.models().join(format!("{id}_driving_tinygrad.pkl"))).ok()
    }

    /// The names in the models directory, sorted.
    pub fn model_files(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.models())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Makes this a v24 device selecting `pop223`: `old` files in the models directory (a
    /// `.chunkmanifest` holds `chunks`, every other file `old`) and the v24 selection params.
    pub fn make_v24(&self, old: &[&str], chunks: &str) {
        fs::create_dir_all(self.models()).unwrap();
        for name in old {
            let body = if name.ends_with("chunkmanifest") {
                chunks
            } else {
                "old"
            };
            fs::write(self.models().join(name), body).unwrap();
        }
        for (k, v) in V24_SELECTION {
            self.set_param(k, v);
        }
    }
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Polls `f` every 20 ms until it holds; fails the test naming `what` after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
