//! Which generation this device is on: the openpilot tree decides.
//!
//! One manifest generation is one tinygrad ABI (`manifest::pins`). The device runs the tinygrad
//! of its openpilot checkout (`<openpilot>/tinygrad_repo/TINYGRAD_COMMIT`), so its generation is
//! the one whose pin is that commit, looked up in the pins this code knows
//! ([`PinTable::builtin`]) merged with the tree's own record (`<openpilot>/tinygrad_pins.json`,
//! written by `release-cli tinygrad bump`). A bump of the tree therefore needs no new device
//! binary, and a binary older than the tree never "migrates" the device back to its own
//! generation.
//!
//! [`read`] reads the two files (size-capped, regular files only); [`decide`] is the pure rule
//! over what was read and an optional `--generation` override. A tinygrad no table knows, or a
//! tree that cannot be read, [`Paused`]s the manager: nothing on the device is changed,
//! `resolve` answers the built-in ([`resolve_paused`]), and `status`, the daemon's log and
//! `ModelDownloadProgress` say which tinygrad and what to do.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use manifest::pins::PINS_FILE;
use manifest::{Generation, GitCommit, PinTable};
use serde::Serialize;

use crate::bounded::read_capped;
use crate::contract;
use crate::daemon::{DaemonConfig, Request};
use crate::error::{Error, Result};
use crate::params::{Params, keys};
use crate::progress::Progress;
use crate::report::ResolveReport;

/// The tree's tinygrad marker, relative to the openpilot checkout.
pub const MARKER_FILE: &str = "tinygrad_repo/TINYGRAD_COMMIT";
/// The marker is one commit (40 hex digits and a newline): anything near this size is not one.
pub const MARKER_LIMIT: u64 = 1024;
/// `tinygrad_pins.json`: one line per generation.
pub const PINS_LIMIT: u64 = 64 * 1024;
/// Where the openpilot checkout is on a comma.
pub const DEFAULT_OPENPILOT_DIR: &str = "/data/openpilot";
/// Where the built-in model is, relative to the openpilot checkout.
pub const BUILTIN_SUBDIR: &str = "selfdrive/modeld/models";

/// A file of the tree that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unreadable {
    pub path: PathBuf,
    pub problem: String,
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.problem)
    }
}

/// The tree as read: its tinygrad, and the pin table (built-in plus the tree's pins file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeRead {
    pub openpilot_dir: PathBuf,
    pub marker: std::result::Result<GitCommit, Unreadable>,
    pub pins: std::result::Result<PinTable, Unreadable>,
}

/// Why the manager changes nothing: the tree's tinygrad has no generation, or the tree cannot be
/// read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Paused {
    /// The marker names a tinygrad that is no generation's pin.
    Unknown {
        commit: GitCommit,
        marker: PathBuf,
        pins_file: PathBuf,
        /// Every pin the table knows, to say so.
        known: Vec<(Generation, GitCommit)>,
    },
    /// The marker or the pins file cannot be read (missing, not a regular file, too large, not
    /// a commit, malformed).
    Unreadable(Unreadable),
}

/// The generation this device is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The tree's tinygrad is `generation`'s pin (and `--generation`, if given, agrees).
    Known {
        generation: Generation,
        commit: GitCommit,
    },
    /// Nothing is changed until the tree is fixed.
    Paused(Paused),
    /// `--generation` names another generation than the tree's: a usage error, nothing touched.
    OverrideDisagrees {
        given: Generation,
        tree: Generation,
        commit: GitCommit,
    },
}

/// The rule: the generation whose pin is the tree's tinygrad; `overridden` (`--generation`) must
/// be that one. A tree that cannot be read or whose tinygrad no table knows is [`Paused`]
/// whatever `overridden` says: the flag cannot vouch for a tinygrad.
pub fn decide(read: &TreeRead, overridden: Option<Generation>) -> Decision {
    let commit = match &read.marker {
        Ok(c) => c.clone(),
        Err(u) => return Decision::Paused(Paused::Unreadable(u.clone())),
    };
    let pins = match &read.pins {
        Ok(p) => p,
        Err(u) => return Decision::Paused(Paused::Unreadable(u.clone())),
    };
    match pins.owner_of(&commit) {
        None => Decision::Paused(Paused::Unknown {
            commit,
            marker: read.openpilot_dir.join(MARKER_FILE),
            pins_file: read.openpilot_dir.join(PINS_FILE),
            known: pins.iter().map(|(g, c)| (g, c.clone())).collect(),
        }),
        Some(tree) => match overridden {
            Some(given) if given != tree => Decision::OverrideDisagrees {
                given,
                tree,
                commit,
            },
            _ => Decision::Known {
                generation: tree,
                commit,
            },
        },
    }
}

/// A tree file, capped and regular-file-only (a FIFO or a symlink to `/dev/zero` is refused
/// without blocking); `None` when it does not exist.
fn read_tree_file(path: &Path, limit: u64) -> std::result::Result<Option<Vec<u8>>, Unreadable> {
    read_capped(path, limit).map_err(|e| Unreadable {
        path: path.to_path_buf(),
        problem: match e {
            Error::CorruptState { message, .. } => message,
            other => other.to_string(),
        },
    })
}

/// Read the tree at `openpilot_dir`: the marker (required) and the pins file (optional: without
/// it the table is the built-in one).
pub fn read(openpilot_dir: &Path) -> TreeRead {
    let marker_path = openpilot_dir.join(MARKER_FILE);
    let marker = match read_tree_file(&marker_path, MARKER_LIMIT) {
        Ok(Some(bytes)) => {
            let text = String::from_utf8_lossy(&bytes);
            text.trim().parse::<GitCommit>().map_err(|e| Unreadable {
                path: marker_path.clone(),
                problem: format!("not a tinygrad commit ({e})"),
            })
        }
        Ok(None) => Err(Unreadable {
            path: marker_path.clone(),
            problem: if openpilot_dir.is_dir() {
                "not found (the tree has no tinygrad_repo marker)".into()
            } else {
                "not found: there is no openpilot checkout at this path".into()
            },
        }),
        Err(u) => Err(u),
    };
    let pins_path = openpilot_dir.join(PINS_FILE);
    let pins = match read_tree_file(&pins_path, PINS_LIMIT) {
        Ok(None) => Ok(PinTable::builtin()),
        Ok(Some(bytes)) => {
            let mut table = PinTable::builtin();
            table
                .merge_json(&bytes)
                .map(|()| table)
                .map_err(|problem| Unreadable {
                    path: pins_path.clone(),
                    problem,
                })
        }
        Err(u) => Err(u),
    };
    TreeRead {
        openpilot_dir: openpilot_dir.to_path_buf(),
        marker,
        pins,
    }
}

fn list_known(known: &[(Generation, GitCommit)]) -> String {
    known
        .iter()
        .map(|(g, c)| format!("{g} = {c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Paused {
    /// What an operator reads: which tinygrad, and that nothing was changed.
    pub fn message(&self) -> String {
        match self {
            Paused::Unknown {
                commit,
                marker,
                known,
                ..
            } => format!(
                "the openpilot tree runs tinygrad {commit} ({}), which is no model generation's \
                 pin (known: {}); model updates are paused: nothing on this device was changed, \
                 and modeld gets the built-in model",
                marker.display(),
                list_known(known)
            ),
            Paused::Unreadable(u) => format!(
                "cannot tell which tinygrad the openpilot tree runs: {u}; model updates are \
                 paused: nothing on this device was changed, and modeld gets the built-in model"
            ),
        }
    }

    /// What to do about it.
    pub fn next(&self) -> String {
        match self {
            Paused::Unknown { pins_file, .. } => format!(
                "update the openpilot tree to a release whose tinygrad has a model generation, or \
                 record this tinygrad's generation in {} (`release-cli tinygrad bump` writes \
                 it); then run `refresh`",
                pins_file.display()
            ),
            Paused::Unreadable(u) => format!(
                "repair the openpilot checkout (update or reinstall openpilot so that {} is a \
                 regular file as `release-cli tinygrad bump` writes it), or pass --openpilot-dir \
                 for a checkout elsewhere; then run `refresh`",
                u.path.display()
            ),
        }
    }

    /// What the UI shows (`ModelDownloadProgress`).
    pub fn progress(&self) -> Progress {
        Progress::TreeUnknown(match self {
            Paused::Unknown { commit, .. } => Some(commit.clone()),
            Paused::Unreadable(_) => None,
        })
    }
}

/// The tree as `status` reports it (`"tree"` in `status --json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TreeStatus {
    pub openpilot_dir: PathBuf,
    /// The tree's tinygrad, when the marker could be read.
    pub tinygrad_commit: Option<GitCommit>,
    /// The generation it is the pin of; `None` while paused.
    pub generation: Option<Generation>,
    /// `known`, `unknown` (no generation has this pin) or `unreadable`.
    pub state: &'static str,
    /// While paused: what is wrong, and what to do.
    pub problem: Option<String>,
    pub next: Option<String>,
}

impl TreeStatus {
    pub fn of(openpilot_dir: &Path, decision: &Decision) -> Self {
        let base = TreeStatus {
            openpilot_dir: openpilot_dir.to_path_buf(),
            tinygrad_commit: None,
            generation: None,
            state: "known",
            problem: None,
            next: None,
        };
        match decision {
            Decision::Known { generation, commit }
            | Decision::OverrideDisagrees {
                tree: generation,
                commit,
                ..
            } => TreeStatus {
                tinygrad_commit: Some(commit.clone()),
                generation: Some(*generation),
                ..base
            },
            Decision::Paused(p) => TreeStatus {
                tinygrad_commit: match p {
                    Paused::Unknown { commit, .. } => Some(commit.clone()),
                    Paused::Unreadable(_) => None,
                },
                state: match p {
                    Paused::Unknown { .. } => "unknown",
                    Paused::Unreadable(_) => "unreadable",
                },
                problem: Some(p.message()),
                next: Some(p.next()),
                ..base
            },
        }
    }
}

/// `resolve` while paused: the built-in, whatever is selected (an installed model was built for
/// a tinygrad the tree may no longer run), with the reason in `doubt`. Fails only when the
/// built-in is missing, like [`crate::report::resolve`].
pub fn resolve_paused(builtin_dir: &Path, paused: &Paused) -> Result<ResolveReport> {
    let path = crate::device::builtin_path_in(builtin_dir);
    if !matches!(chunker::resolve(&path), Ok(Some(_))) {
        return Err(Error::BuiltinMissing { path });
    }
    Ok(ResolveReport {
        path,
        model: contract::Catalog::default().builtin().into_text(),
        builtin: true,
        doubt: Some(paused.message()),
    })
}

/// `status` while paused (`status --json`: `{"generation":null,"manifest_version","resolved",
/// "tree":{…}}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PausedStatus {
    /// Always `None`: the device is on no generation until the tree is fixed.
    pub generation: Option<Generation>,
    /// `ModelManifestVersion`: the generation the device was last migrated to (unread: `None`).
    pub manifest_version: Option<String>,
    pub resolved: PathBuf,
    pub tree: TreeStatus,
}

/// [`PausedStatus`] of the device at `data_dir`; reads one param, writes nothing.
pub fn status_paused(
    data_dir: &Path,
    builtin_dir: &Path,
    openpilot_dir: &Path,
    paused: &Paused,
) -> PausedStatus {
    let params = Params::new(data_dir.join("params").join("d"));
    PausedStatus {
        generation: None,
        manifest_version: params.get_str(keys::MODEL_MANIFEST_VERSION).ok().flatten(),
        resolved: crate::device::builtin_path_in(builtin_dir),
        tree: TreeStatus::of(openpilot_dir, &Decision::Paused(paused.clone())),
    }
}

/// Show the pause in `ModelDownloadProgress` (the one memory param written while paused).
pub fn announce(memory: &Params, paused: &Paused) -> Result<()> {
    memory.put(
        keys::MODEL_DOWNLOAD_PROGRESS,
        &paused.progress().to_string(),
    )
}

/// The daemon while paused: says so in `ModelDownloadProgress` and the log, answers every UI
/// request with the pause (and clears it, and any cancel flag), and otherwise does nothing (no
/// refresh, no download, no file of the data dir touched) until `stopping` is set. The tree is
/// read once at start: openpilot's updater swaps the tree at a reboot, which restarts the daemon.
pub fn run_paused(
    memory: &Params,
    paused: &Paused,
    config: &DaemonConfig,
    stopping: &Arc<AtomicBool>,
    log: &dyn Fn(&str),
) -> Result<()> {
    log(&format!("paused: {}", paused.message()));
    log(&format!("next: {}", paused.next()));
    announce(memory, paused)?;
    while !stopping.load(Ordering::SeqCst) {
        // A request param that cannot be read is removed and logged, never fatal.
        for bad in crate::daemon::sweep_bad_params(memory) {
            log(&bad.to_string());
        }
        if let Some(request) = crate::daemon::read_request_in(memory)? {
            let what = match &request {
                Request::DownloadAll => "download all".to_string(),
                Request::Download { raw, .. } => format!("download {raw}"),
            };
            log(&format!("{what}: not served, {}", paused.progress()));
            announce(memory, paused)?;
            crate::daemon::finish_in(memory, &request)?;
        } else if memory.get_bool(keys::CANCEL_MODEL_DOWNLOAD)? {
            memory.remove(keys::CANCEL_MODEL_DOWNLOAD)?;
        }
        let wake = Instant::now() + config.poll;
        while Instant::now() < wake && !stopping.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20).min(config.poll));
        }
    }
    log("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use manifest::layout;

    /// A made-up next generation's pin.
    const V26_PIN: &str = "26262626262626262626262626262626262626aa";

    fn pin(s: &str) -> GitCommit {
        s.parse().unwrap()
    }

    fn with_v26() -> PinTable {
        let mut t = PinTable::builtin();
        t.record(Generation::new(26), &pin(V26_PIN)).unwrap();
        t
    }

    fn tree(
        marker: std::result::Result<GitCommit, Unreadable>,
        pins: std::result::Result<PinTable, Unreadable>,
    ) -> TreeRead {
        TreeRead {
            openpilot_dir: "/op".into(),
            marker,
            pins,
        }
    }

    #[test]
    fn the_tree_decides_the_generation() {
        let v25 = layout::CURRENT_GENERATION;
        let v26 = Generation::new(26);
        let pin25 = layout::current_tinygrad_commit();
        let pin26 = pin(V26_PIN);
        let unreadable = |what: &str| Unreadable {
            path: PathBuf::from("/op").join(what),
            problem: "not a regular file".into(),
        };
        let unknown = |commit: &GitCommit, table: &PinTable| {
            Decision::Paused(Paused::Unknown {
                commit: commit.clone(),
                marker: "/op/tinygrad_repo/TINYGRAD_COMMIT".into(),
                pins_file: "/op/tinygrad_pins.json".into(),
                known: table.iter().map(|(g, c)| (g, c.clone())).collect(),
            })
        };
        let known = |generation, commit: &GitCommit| Decision::Known {
            generation,
            commit: commit.clone(),
        };
        let builtin = PinTable::builtin();
        let cases: Vec<(&str, TreeRead, Option<Generation>, Decision)> = vec![
            (
                "v25 tree, built-in table",
                tree(Ok(pin25.clone()), Ok(builtin.clone())),
                None,
                known(v25, &pin25),
            ),
            (
                "v25 tree, --generation v25",
                tree(Ok(pin25.clone()), Ok(with_v26())),
                Some(v25),
                known(v25, &pin25),
            ),
            (
                "v26 tree, pins file records v26",
                tree(Ok(pin26.clone()), Ok(with_v26())),
                None,
                known(v26, &pin26),
            ),
            (
                "v26 tree, --generation v26",
                tree(Ok(pin26.clone()), Ok(with_v26())),
                Some(v26),
                known(v26, &pin26),
            ),
            (
                "v26 tree, --generation v25 (a v25 habit)",
                tree(Ok(pin26.clone()), Ok(with_v26())),
                Some(v25),
                Decision::OverrideDisagrees {
                    given: v25,
                    tree: v26,
                    commit: pin26.clone(),
                },
            ),
            (
                "v25 tree, --generation v26",
                tree(Ok(pin25.clone()), Ok(with_v26())),
                Some(v26),
                Decision::OverrideDisagrees {
                    given: v26,
                    tree: v25,
                    commit: pin25.clone(),
                },
            ),
            (
                "v26 tree without a pins file: unknown",
                tree(Ok(pin26.clone()), Ok(builtin.clone())),
                None,
                unknown(&pin26, &builtin),
            ),
            (
                "unknown tinygrad: --generation does not vouch for it",
                tree(Ok(pin26.clone()), Ok(builtin.clone())),
                Some(v26),
                unknown(&pin26, &builtin),
            ),
            (
                "marker unreadable",
                tree(Err(unreadable(MARKER_FILE)), Ok(with_v26())),
                Some(v25),
                Decision::Paused(Paused::Unreadable(unreadable(MARKER_FILE))),
            ),
            (
                "pins file unreadable",
                tree(Ok(pin25.clone()), Err(unreadable(PINS_FILE))),
                None,
                Decision::Paused(Paused::Unreadable(unreadable(PINS_FILE))),
            ),
        ];
        for (what, read, overridden, want) in cases {
            assert_eq!(decide(&read, overridden), want, "{what}");
        }
    }

    fn write(path: &Path, body: &[u8]) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, body).unwrap();
    }

    #[test]
    fn reading_the_tree() {
        let t = tempfile::tempdir().unwrap();
        let op = t.path();
        let marker = op.join(MARKER_FILE);
        let pins = op.join(PINS_FILE);
        // No checkout at all.
        let r = read(&op.join("missing"));
        assert!(
            r.marker
                .unwrap_err()
                .problem
                .contains("no openpilot checkout")
        );
        // A v26 tree: marker with a newline, pins file recording v26.
        write(&marker, format!("{V26_PIN}\n").as_bytes());
        write(
            &pins,
            format!(
                "{{\"{}\": \"{}\", \"v26\": \"{V26_PIN}\"}}\n",
                layout::CURRENT_GENERATION,
                layout::current_tinygrad_commit()
            )
            .as_bytes(),
        );
        let r = read(op);
        assert_eq!(r.marker, Ok(pin(V26_PIN)));
        assert_eq!(r.pins, Ok(with_v26()));
        assert_eq!(
            decide(&r, None),
            Decision::Known {
                generation: Generation::new(26),
                commit: pin(V26_PIN)
            }
        );
        // Without the pins file: the built-in table.
        std::fs::remove_file(&pins).unwrap();
        assert_eq!(read(op).pins, Ok(PinTable::builtin()));
        // Bad markers: each names the path.
        for (body, says) in [
            (&b"e837e36\n"[..], "not a tinygrad commit"),
            (&b""[..], "not a tinygrad commit"),
            (&[b'a'; 2000][..], "over the 1024-byte limit"),
        ] {
            write(&marker, body);
            let u = read(op).marker.unwrap_err();
            assert_eq!(u.path, marker);
            assert!(u.problem.contains(says), "{body:?}: {u}");
        }
        // A symlink to /dev/zero, and a FIFO: refused at once, not read.
        std::fs::remove_file(&marker).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &marker).unwrap();
        assert!(
            read(op)
                .marker
                .unwrap_err()
                .problem
                .contains("not a regular file")
        );
        let c = std::ffi::CString::new(pins.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let u = read(op).pins.unwrap_err();
        assert!(u.problem.contains("not a regular file"), "{u}");
        // A pins file that reassigns the built-in generation's pin.
        std::fs::remove_file(&pins).unwrap();
        write(
            &pins,
            format!("{{\"{}\": \"{V26_PIN}\"}}", layout::CURRENT_GENERATION).as_bytes(),
        );
        let u = read(op).pins.unwrap_err();
        assert!(u.problem.contains("already pinned"), "{u}");
        assert_eq!(u.path, pins);
    }

    /// The paused daemon, too, removes and logs a request param it cannot read (here a FIFO
    /// and a directory) and answers the next request with the pause; nothing stops it.
    #[test]
    fn the_paused_daemon_survives_a_bad_request_param() {
        let dir = tempfile::tempdir().unwrap();
        let memory = Params::new(dir.path().join("d"));
        std::fs::create_dir_all(memory.dir()).unwrap();
        let fifo =
            std::ffi::CString::new(memory.path(keys::MODEL_TO_DOWNLOAD).to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        std::fs::create_dir(memory.path(keys::CANCEL_MODEL_DOWNLOAD)).unwrap();
        let paused = Paused::Unknown {
            commit: pin(V26_PIN),
            marker: "/op/tinygrad_repo/TINYGRAD_COMMIT".into(),
            pins_file: "/op/tinygrad_pins.json".into(),
            known: Vec::new(),
        };
        let config = DaemonConfig {
            poll: Duration::from_millis(20),
            ..Default::default()
        };
        let stopping = Arc::new(AtomicBool::new(false));
        let lines = std::sync::Mutex::new(Vec::<String>::new());
        std::thread::scope(|s| {
            let run = s.spawn(|| {
                run_paused(&memory, &paused, &config, &stopping, &|l: &str| {
                    lines.lock().unwrap().push(l.to_string())
                })
            });
            let start = Instant::now();
            while memory
                .path(keys::MODEL_TO_DOWNLOAD)
                .symlink_metadata()
                .is_ok()
                || memory.path(keys::CANCEL_MODEL_DOWNLOAD).exists()
            {
                assert!(start.elapsed() < Duration::from_secs(5), "not removed");
                std::thread::sleep(Duration::from_millis(10));
            }
            memory.put(keys::MODEL_TO_DOWNLOAD, "pop223").unwrap();
            while memory.path(keys::MODEL_TO_DOWNLOAD).exists() {
                assert!(start.elapsed() < Duration::from_secs(5), "not answered");
                std::thread::sleep(Duration::from_millis(10));
            }
            stopping.store(true, Ordering::SeqCst);
            run.join().unwrap().unwrap();
        });
        let log = lines.into_inner().unwrap().join("\n");
        for want in [
            "request param ModelToDownload ignored:",
            "request param CancelModelDownload ignored:",
            "download pop223: not served",
        ] {
            assert!(log.contains(want), "{want:?} not in:\n{log}");
        }
        assert_eq!(
            memory.get_str(keys::MODEL_DOWNLOAD_PROGRESS).unwrap(),
            Some(paused.progress().to_string())
        );
    }

    #[test]
    fn paused_texts_say_which_tinygrad_and_what_to_do() {
        let p = Paused::Unknown {
            commit: pin(V26_PIN),
            marker: "/op/tinygrad_repo/TINYGRAD_COMMIT".into(),
            pins_file: "/op/tinygrad_pins.json".into(),
            known: PinTable::builtin()
                .iter()
                .map(|(g, c)| (g, c.clone()))
                .collect(),
        };
        assert!(p.message().contains(V26_PIN), "{}", p.message());
        assert!(p.message().contains("nothing on this device was changed"));
        assert!(p.next().contains("/op/tinygrad_pins.json"), "{}", p.next());
        let ui = p.progress().to_string();
        assert!(
            ui.contains(&V26_PIN[..12]) && ui.contains("update openpilot"),
            "{ui}"
        );
        let u = Paused::Unreadable(Unreadable {
            path: "/op/tinygrad_repo/TINYGRAD_COMMIT".into(),
            problem: "not found".into(),
        });
        assert!(
            u.message()
                .contains("/op/tinygrad_repo/TINYGRAD_COMMIT: not found")
        );
        assert!(u.next().contains("--openpilot-dir"));
        let s = TreeStatus::of(Path::new("/op"), &Decision::Paused(p));
        assert_eq!((s.state, s.generation), ("unknown", None));
    }
}
