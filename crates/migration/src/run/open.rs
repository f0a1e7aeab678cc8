//! Opening the device a command runs on: the data root must exist, the openpilot tree decides
//! the generation (or pauses every command), the downloader gets its origins, settings and the
//! trusted keys (which the device re-verifies its stored state under). The device binary passes
//! its flags and renders what it gets.

use std::path::{Path, PathBuf};

use downloader::trust::{TREE_TRUSTED_KEYS, TrustedKeys};
use downloader::{DownloadConfig, Downloader, Origins};
use manifest::{Generation, GitCommit};

use crate::error::{Error, Result};
use crate::state::tree::{self, Decision, Paused, TreeStatus};
use crate::{Device, DeviceConfig};

/// What a command is run against (the device binary's global flags).
#[derive(Debug, Clone)]
pub struct Options {
    pub data_dir: PathBuf,
    pub memory_params_dir: PathBuf,
    /// Default: `<openpilot_dir>/selfdrive/modeld/models`.
    pub builtin_dir: Option<PathBuf>,
    pub openpilot_dir: PathBuf,
    /// A check of the tree's generation, never a choice.
    pub generation: Option<Generation>,
    pub sysfs_root: PathBuf,
    pub hf_base: String,
    pub github_base: String,
    pub download: DownloadConfig,
    /// Default: `<openpilot_dir>/`[`TREE_TRUSTED_KEYS`] when that file exists, else none.
    pub trusted_keys: Option<PathBuf>,
    /// Where modeld's load receipt directory is (default: the contract's, `/dev/shm`).
    pub shm_dir: Option<PathBuf>,
    /// `OPENPILOT_PREFIX`, which names the receipt's directory (`None`: unset).
    pub openpilot_prefix: Option<String>,
}

/// The device, ready for a command.
pub struct Ready {
    pub device: Device,
    pub dl: Downloader,
    /// The tree's tinygrad, whose generation the device is on.
    pub tinygrad: GitCommit,
    pub tree: TreeStatus,
}

pub enum Opened {
    Ready(Box<Ready>),
    /// The tree's tinygrad has no generation: nothing on the device may change.
    Paused {
        paused: Paused,
        builtin_dir: PathBuf,
    },
}

impl Options {
    pub fn builtin_dir(&self) -> PathBuf {
        self.builtin_dir
            .clone()
            .unwrap_or_else(|| self.openpilot_dir.join(tree::BUILTIN_SUBDIR))
    }

    /// What `-v` says the command runs against.
    pub fn describe(&self, device: &Device, tinygrad: &GitCommit) -> String {
        format!(
            "data dir {}, models {}, memory params {}, built-in {}, openpilot tree {} (tinygrad \
             {tinygrad}), generation {}, origins {} then {}, trusted keys {}",
            self.data_dir.display(),
            device.models_dir().display(),
            self.memory_params_dir.display(),
            self.builtin_dir().display(),
            self.openpilot_dir.display(),
            device.config.generation,
            self.hf_base,
            self.github_base,
            self.trusted_keys
                .as_deref()
                .map_or("default".to_string(), |k| k.display().to_string())
        )
    }
}

/// Open the device `o` describes. Reads only: the data root, the tree, the keys file.
pub fn open(o: &Options) -> Result<Opened> {
    require_data_dir(&o.data_dir)?;
    let read = tree::read(&o.openpilot_dir);
    let decision = tree::decide(&read, o.generation);
    let (generation, tinygrad, contract) = match &decision {
        Decision::Known {
            generation,
            commit,
            contract,
        } => (*generation, commit.clone(), *contract),
        Decision::OverrideDisagrees {
            given,
            tree,
            commit,
        } => {
            return Err(Error::GenerationDisagrees {
                given: *given,
                tree: *tree,
                commit: commit.clone(),
                openpilot_dir: o.openpilot_dir.clone(),
            });
        }
        Decision::Paused(paused) => {
            return Ok(Opened::Paused {
                paused: paused.clone(),
                builtin_dir: o.builtin_dir(),
            });
        }
    };
    let mut device = Device::new(DeviceConfig {
        data_dir: o.data_dir.clone(),
        memory_params_dir: o.memory_params_dir.clone(),
        builtin_dir: o.builtin_dir(),
        generation,
    })
    .with_contract(contract)
    .with_declaration(read.declaration.clone().ok().flatten());
    device.sysfs_root = o.sysfs_root.clone();
    // What runs: modeld's load receipt, on a contract that has one.
    device.load_receipt = crate::state::load_receipt::Source::of(
        contract,
        o.shm_dir.as_deref(),
        o.openpilot_prefix.as_deref(),
    );
    // The device re-verifies what it stored under the downloader's keys on every read.
    device.trusted_keys = trusted_keys(o.trusted_keys.as_deref(), &o.openpilot_dir)?;
    let dl = Downloader::new(Origins::new(&o.hf_base, &o.github_base), o.download.clone());
    let dl = match &device.trusted_keys {
        Some(keys) => dl.with_trusted_keys(keys.clone()),
        None => dl,
    };
    Ok(Opened::Ready(Box::new(Ready {
        dl: dl
            .with_tinygrad_pin(tinygrad.clone())
            .with_contract(contract, read.declaration.clone().ok().flatten()),
        device,
        tree: TreeStatus::of(&o.openpilot_dir, &decision),
        tinygrad,
    })))
}

/// The data root must already exist: on a comma `/data` always does, so a missing one is a typo
/// (or the wrong machine), and answering for an empty device there would mislead.
pub fn require_data_dir(dir: &Path) -> Result<()> {
    let (problem, exists) = match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => ("not a directory".to_string(), true),
        Err(e) => (e.to_string(), false),
    };
    Err(Error::DataDir {
        path: dir.to_path_buf(),
        problem,
        exists,
    })
}

/// The keys file a device uses: `flag`, else the tree's (`<openpilot_dir>/`
/// [`TREE_TRUSTED_KEYS`], `/data/openpilot/...` on a comma) when it exists. Pure.
pub fn keys_path(
    flag: Option<&Path>,
    openpilot_dir: &Path,
    exists: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    match flag {
        Some(p) => Some(p.to_path_buf()),
        None => Some(openpilot_dir.join(TREE_TRUSTED_KEYS)).filter(|p| exists(p)),
    }
}

/// The keys of `flag`, or of the tree's StarPilot keys file when it exists ([`keys_path`]). A
/// given file that cannot be used is an error: a device that was meant to be protected must not
/// silently run unprotected.
pub fn trusted_keys(flag: Option<&Path>, openpilot_dir: &Path) -> Result<Option<TrustedKeys>> {
    let Some(path) = keys_path(flag, openpilot_dir, |p| p.exists()) else {
        return Ok(None);
    };
    TrustedKeys::load(&path)
        .map(Some)
        .map_err(Error::TrustedKeysUnusable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cli_support::NextStep;

    fn options(root: &Path, generation: Option<Generation>) -> Options {
        Options {
            data_dir: root.join("data"),
            memory_params_dir: root.join("shm"),
            builtin_dir: None,
            openpilot_dir: root.join("op"),
            generation,
            sysfs_root: root.join("sys"),
            hf_base: "http://127.0.0.1:9/hf".into(),
            github_base: "http://127.0.0.1:9/gh".into(),
            download: DownloadConfig::default(),
            trusted_keys: Some(root.join("keys.pub")),
            shm_dir: Some(root.join("shm")),
            openpilot_prefix: None,
        }
    }

    /// A tree on `pin`, recording `v26` with the made-up pin beside the built-in table.
    fn tree_on(root: &Path, pin: &str) {
        let op = root.join("op");
        std::fs::create_dir_all(op.join("tinygrad_repo")).unwrap();
        std::fs::write(op.join(tree::MARKER_FILE), format!("{pin}\n")).unwrap();
        std::fs::write(
            op.join(manifest::pins::PINS_FILE),
            format!(
                "{{\"{}\": \"{}\", \"v26\": \"{V26_PIN}\"}}\n",
                manifest::layout::CURRENT_GENERATION,
                manifest::layout::current_tinygrad_commit()
            ),
        )
        .unwrap();
    }

    const V26_PIN: &str = "26262626262626262626262626262626262626bb";

    /// Every refusal leaves the data root as it was: nothing is created.
    fn files(root: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut dirs = vec![root.to_path_buf()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p.clone());
                }
                out.push(p);
            }
        }
        out.sort();
        out
    }

    #[test]
    fn the_data_root_must_be_a_directory() {
        let t = tempfile::tempdir().unwrap();
        let missing = t.path().join("nope");
        let e = require_data_dir(&missing).unwrap_err();
        assert!(e.to_string().starts_with("--data-dir "), "{e}");
        assert_eq!(
            e.next_step().unwrap(),
            "pass the device's data root (default /data); it is never created"
        );
        assert!(!missing.exists());
        let file = t.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let e = require_data_dir(&file).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("--data-dir {}: not a directory", file.display())
        );
        assert_eq!(
            e.next_step().unwrap(),
            "pass the device's data root (default /data)"
        );
        assert!(require_data_dir(t.path()).is_ok());
    }

    /// The tree decides, for v25 and a made-up v26; a `--generation` it contradicts is a usage
    /// error, an unknown tinygrad pauses; neither touches anything.
    #[test]
    fn the_tree_decides_for_each_generation() {
        let current = manifest::layout::current_tinygrad_commit();
        for (pin, generation) in [
            (current.as_str(), manifest::layout::CURRENT_GENERATION),
            (V26_PIN, Generation::new(26)),
        ] {
            let t = tempfile::tempdir().unwrap();
            std::fs::create_dir(t.path().join("data")).unwrap();
            std::fs::write(t.path().join("keys.pub"), "not a key").unwrap();
            tree_on(t.path(), pin);
            let before = files(t.path());
            let other = Generation::new(if generation.number() == 26 { 25 } else { 26 });
            let e = open(&options(t.path(), Some(other))).err().unwrap();
            assert_eq!(e.exit_code(), crate::rules::next_step::code::USAGE, "{e}");
            assert!(
                e.to_string().starts_with(&format!(
                    "--generation {other} disagrees with the openpilot tree"
                )),
                "{e}"
            );
            assert!(
                e.next_step()
                    .unwrap()
                    .contains(&format!("pass --generation {generation}"))
            );
            // The keys file given is unusable: refused, not run unprotected.
            let e = open(&options(t.path(), None)).err().unwrap();
            assert!(matches!(e, Error::TrustedKeysUnusable(_)), "{e}");
            assert!(e.next_step().unwrap().starts_with("give --trusted-keys"));
            assert_eq!(files(t.path()), before, "nothing written");
            let mut o = options(t.path(), Some(generation));
            o.trusted_keys = None;
            let Ok(Opened::Ready(r)) = open(&o) else {
                panic!("{generation} tree not opened")
            };
            assert_eq!(r.device.config.generation, generation);
            assert_eq!(r.tinygrad.as_str(), pin);
            assert_eq!(r.tree.generation, Some(generation));
            assert_eq!(
                r.device.config.builtin_dir,
                t.path().join("op").join(tree::BUILTIN_SUBDIR)
            );
            assert_eq!(r.device.sysfs_root, t.path().join("sys"));
            // A tinygrad no table knows pauses.
            tree_on(t.path(), "26262626262626262626262626262626262626cc");
            assert!(matches!(open(&o), Ok(Opened::Paused { .. })));
            assert_eq!(files(t.path()).len(), before.len(), "nothing written");
        }
    }

    /// Issue 37: the default keys file follows `--openpilot-dir` (a tree elsewhere than
    /// `/data/openpilot` brings its own keys); a given flag wins; a missing default is none.
    #[test]
    fn the_default_keys_file_is_the_trees() {
        let tree = Path::new("/work/op");
        let flag = Path::new("/etc/keys.pub");
        for (given, exists, want) in [
            (
                None,
                true,
                Some("/work/op/starpilot/assets/model_release_keys.pub"),
            ),
            (None, false, None),
            (Some(flag), false, Some("/etc/keys.pub")),
            (Some(flag), true, Some("/etc/keys.pub")),
        ] {
            assert_eq!(
                keys_path(given, tree, |_| exists),
                want.map(PathBuf::from),
                "{given:?} {exists}"
            );
        }
        assert_eq!(
            keys_path(None, Path::new("/data/openpilot"), |_| true).unwrap(),
            Path::new(downloader::trust::DEFAULT_TRUSTED_KEYS),
            "on a comma it is the documented default"
        );
    }
}
