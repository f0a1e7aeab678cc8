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
//! A tree that carries a contract's declaration (upstream's v26 catalog module, the reviewed
//! `catalog-vNN.json` beside it and `upstream-sync.json`: `manifest::contract::declaration`)
//! says its generation, its contract and its tinygrad itself: the commit is the sync file's,
//! and the pair is [`PinTable::declare`]d into the table. A declaration that is there but
//! cannot be read pauses the manager as an unknown tinygrad does.
//!
//! [`read`] reads the files (size-capped, regular files only); [`decide`] is the pure rule
//! over what was read and an optional `--generation` override. The generation it decides
//! carries its contract (`&'static Contract`), which says where the device keeps its files
//! (`crate::state::layout`). A tinygrad no table knows, or a
//! tree that cannot be read, [`Paused`]s the manager: nothing on the device is changed,
//! `resolve` answers the built-in ([`resolve_paused`]), and `status`, the daemon's log and
//! `ModelDownloadProgress` say which tinygrad and what to do.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use manifest::contract::{Contract, TreeDeclaration, TreeFiles, declaring_contracts};
use manifest::pins::PINS_FILE;
use manifest::{Generation, GitCommit, PinTable};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::report::ResolveReport;
use crate::report::progress::Progress;
use crate::rules::contract;
use crate::run::daemon::DaemonConfig;
use crate::state::bounded::read_capped;
use crate::state::params::{Params, keys};

/// The tree's tinygrad marker, relative to the openpilot checkout.
pub const MARKER_FILE: &str = "tinygrad_repo/TINYGRAD_COMMIT";
/// The marker is one commit (40 hex digits and a newline): anything near this size is not one.
pub const MARKER_LIMIT: u64 = 1024;
/// `tinygrad_pins.json`: one line per generation.
pub const PINS_LIMIT: u64 = 64 * 1024;
/// A declaring tree's reviewed catalog (`catalog-vNN.json`): read with the manifest's cap, as
/// upstream reads it.
pub const TREE_CATALOG_LIMIT: u64 = crate::state::bounded::CATALOG_LIMIT;
/// `upstream-sync.json`: one entry per dependency of the tree.
pub const SYNC_FILE_LIMIT: u64 = 1024 * 1024;
/// Where the openpilot checkout is on a comma.
pub const DEFAULT_OPENPILOT_DIR: &str = "/data/openpilot";
/// Where the built-in model is, relative to the openpilot checkout.
pub const BUILTIN_SUBDIR: &str = "selfdrive/modeld/models";

/// A file of the tree that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct Unreadable {
    pub path: PathBuf,
    pub problem: String,
}

/// The tree as read: its tinygrad, the pin table (built-in plus the tree's pins file), and
/// the contract declaration it carries, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeRead {
    pub openpilot_dir: PathBuf,
    pub marker: std::result::Result<GitCommit, Unreadable>,
    pub pins: std::result::Result<PinTable, Unreadable>,
    /// `Ok(None)`: the tree declares nothing (a v25 tree); `Err`: it carries a declaring
    /// contract's catalog module, but the declaration cannot be read.
    pub declaration: std::result::Result<Option<TreeDeclaration>, Unreadable>,
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
    /// The tree's tinygrad is `generation`'s pin (and `--generation`, if given, agrees);
    /// `contract` is the one the generation runs (declared by the tree, else recorded or
    /// inherited in the pin table).
    Known {
        generation: Generation,
        commit: GitCommit,
        contract: &'static Contract,
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
/// be that one. A tree that declares its contract gives its tinygrad in the declaration (the
/// marker is not needed then), and the declaration is recorded in the table first. A tree
/// that cannot be read, whose declaration cannot be read or taken, or whose tinygrad no table
/// knows is [`Paused`] whatever `overridden` says: the flag cannot vouch for a tinygrad.
pub fn decide(read: &TreeRead, overridden: Option<Generation>) -> Decision {
    let declared = match &read.declaration {
        Ok(d) => d.as_ref(),
        Err(u) => return Decision::Paused(Paused::Unreadable(u.clone())),
    };
    let mut table = match &read.pins {
        Ok(p) => p.clone(),
        Err(u) => return Decision::Paused(Paused::Unreadable(u.clone())),
    };
    let commit = match declared {
        Some(d) => {
            if let Err(refusal) = table.declare(d) {
                return Decision::Paused(Paused::Unreadable(Unreadable {
                    path: declaration_path(&read.openpilot_dir, d),
                    problem: format!(
                        "the tree declares {} on tinygrad {}, which the pin table refuses: {refusal}",
                        d.generation, d.compiler_revision
                    ),
                }));
            }
            d.compiler_revision.clone()
        }
        None => match &read.marker {
            Ok(c) => c.clone(),
            Err(u) => return Decision::Paused(Paused::Unreadable(u.clone())),
        },
    };
    match table.owner_of(&commit) {
        None => Decision::Paused(Paused::Unknown {
            commit,
            marker: read.openpilot_dir.join(MARKER_FILE),
            pins_file: read.openpilot_dir.join(PINS_FILE),
            known: table.iter().map(|(g, c)| (g, c.clone())).collect(),
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
                contract: table.contract(tree),
            },
        },
    }
}

/// The reviewed catalog a declaration was read from (what a refused declaration names).
fn declaration_path(openpilot_dir: &Path, d: &TreeDeclaration) -> PathBuf {
    let path = d
        .contract
        .contract()
        .tree_catalog_path(d.generation)
        .unwrap_or_default();
    openpilot_dir.join(path)
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

/// The tinygrad commit a marker's bytes name, read as upstream reads the file: a UTF-8
/// byte-order mark and surrounding whitespace (a trailing newline, CRLF) are ignored, and hex
/// digits in either case name the same commit. Anything else is refused. Pure.
pub fn marker_commit(bytes: &[u8]) -> std::result::Result<GitCommit, manifest::Error> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let text = String::from_utf8_lossy(bytes);
    text.trim().to_ascii_lowercase().parse::<GitCommit>()
}

/// Read the tree at `openpilot_dir`: the marker (required) and the pins file (optional: without
/// it the table is the built-in one).
pub fn read(openpilot_dir: &Path) -> TreeRead {
    let marker_path = openpilot_dir.join(MARKER_FILE);
    let marker = match read_tree_file(&marker_path, MARKER_LIMIT) {
        Ok(Some(bytes)) => marker_commit(&bytes).map_err(|e| Unreadable {
            path: marker_path.clone(),
            problem: format!("not a tinygrad commit ({e})"),
        }),
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
    let pins = read_tree_file(&pins_path, PINS_LIMIT).and_then(|bytes| {
        let mut table = PinTable::builtin();
        if let Some(bytes) = bytes {
            let path = pins_path.clone();
            table
                .merge_json(&bytes)
                .map_err(|problem| Unreadable { path, problem })?;
        }
        Ok(table)
    });
    TreeRead {
        openpilot_dir: openpilot_dir.to_path_buf(),
        marker,
        pins,
        declaration: read_declaration(openpilot_dir),
    }
}

/// The declaration the tree carries: for each contract whose trees declare themselves, its
/// catalog module, the reviewed catalogs beside it and the sync file, read with the crate's
/// bounded reader and handed to `manifest::contract::declaration`. The first contract whose
/// module is there decides; none there is `Ok(None)`.
pub fn read_declaration(
    openpilot_dir: &Path,
) -> std::result::Result<Option<TreeDeclaration>, Unreadable> {
    for contract in declaring_contracts() {
        let Some(markers) = contract.tree else {
            continue;
        };
        let module = openpilot_dir.join(markers.catalog_module);
        let unreadable = |path: &Path, problem: String| Unreadable {
            path: path.to_path_buf(),
            problem,
        };
        match std::fs::symlink_metadata(&module) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(unreadable(&module, e.to_string())),
            Ok(m) if !m.is_file() => {
                return Err(unreadable(&module, "not a regular file".into()));
            }
            Ok(_) => {}
        }
        let dir = module.parent().unwrap_or(openpilot_dir);
        let entries = std::fs::read_dir(dir).map_err(|e| unreadable(dir, e.to_string()))?;
        let mut catalogs = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| unreadable(dir, e.to_string()))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if manifest::contract::parse_tree_catalog_name(contract, &name).is_none() {
                continue;
            }
            let path = dir.join(&name);
            if let Some(bytes) = read_tree_file(&path, TREE_CATALOG_LIMIT)? {
                catalogs.push((name, bytes));
            }
        }
        catalogs.sort();
        let sync_path = openpilot_dir.join(markers.sync_file);
        let files = TreeFiles {
            catalog_module: true,
            catalogs,
            sync_file: read_tree_file(&sync_path, SYNC_FILE_LIMIT)?,
        };
        return manifest::contract::declaration(contract.name, &files)
            .map_err(|problem| unreadable(&module, problem));
    }
    Ok(None)
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
        let (commit, generation, state, paused) = match decision {
            Decision::Known {
                generation, commit, ..
            }
            | Decision::OverrideDisagrees {
                tree: generation,
                commit,
                ..
            } => (Some(commit), Some(*generation), "known", None),
            Decision::Paused(p @ Paused::Unknown { commit, .. }) => {
                (Some(commit), None, "unknown", Some(p))
            }
            Decision::Paused(p) => (None, None, "unreadable", Some(p)),
        };
        TreeStatus {
            openpilot_dir: openpilot_dir.to_path_buf(),
            tinygrad_commit: commit.cloned(),
            generation,
            state,
            problem: paused.map(Paused::message),
            next: paused.map(Paused::next),
        }
    }
}

/// `resolve` while paused: the built-in, whatever is selected (an installed model was built for
/// a tinygrad the tree may no longer run), with the reason in `doubt`. Fails only when the
/// built-in is missing, like [`crate::report::resolve`].
pub fn resolve_paused(builtin_dir: &Path, paused: &Paused) -> Result<ResolveReport> {
    let path = crate::state::device::builtin_path_in(builtin_dir);
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
        resolved: crate::state::device::builtin_path_in(builtin_dir),
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
        for bad in crate::run::daemon::sweep_bad_params(memory) {
            log(&bad.to_string());
        }
        if let Some(request) = crate::run::daemon::read_request(memory)? {
            let what = crate::run::daemon::describe(&request);
            log(&format!("{what}: not served, {}", paused.progress()));
            announce(memory, paused)?;
            crate::run::daemon::finish(memory, &request)?;
        } else if memory.get_bool(keys::CANCEL_MODEL_DOWNLOAD)? {
            memory.remove(keys::CANCEL_MODEL_DOWNLOAD)?;
        }
        crate::run::daemon::nap(config.poll, stopping);
    }
    log("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use manifest::layout;
    use std::time::{Duration, Instant};

    /// Issue 37: a marker in uppercase, with a byte-order mark or CRLF names its commit (the
    /// device was paused by these); a short, long or non-hex one is still refused.
    #[test]
    fn the_marker_is_read_as_upstream_reads_it() {
        let c = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";
        let upper = c.to_ascii_uppercase();
        for ok in [
            c.to_string(),
            format!("{c}\n"),
            format!("  {c}\r\n"),
            upper.clone(),
            format!("\u{feff}{c}\n"),
            format!("\u{feff}{upper}\r\n"),
        ] {
            assert_eq!(marker_commit(ok.as_bytes()).unwrap().as_str(), c, "{ok:?}");
        }
        for bad in [
            "",
            "\u{feff}",
            &c[..39],
            &format!("{c}0"),
            &format!("{}g", &c[..39]),
            &format!("{c} extra"),
            &format!("\u{feff}\u{feff}{c}"),
        ] {
            assert!(marker_commit(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

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
            declaration: Ok(None),
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
        // These trees declare nothing: every generation inherits the v25 contract.
        let known = |generation, commit: &GitCommit| Decision::Known {
            generation,
            commit: commit.clone(),
            contract: manifest::contract::ContractName::V25.contract(),
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
                commit: pin(V26_PIN),
                contract: manifest::contract::ContractName::V25.contract(),
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

    const DECLARED_PIN: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";

    /// A tree carrying upstream's declaration: the catalog module, `catalog-<gen>.json` beside
    /// it and `upstream-sync.json` naming `pin` for `tinygrad_repo`.
    fn declaring_tree(op: &Path, generation: &str, pin: &str) {
        let v26 = manifest::contract::ContractName::V26.contract();
        let markers = v26.tree.unwrap();
        write(&op.join(markers.catalog_module), b"# the catalog module\n");
        write(
            &op.join(markers.catalog_json.replace("{gen}", generation)),
            br#"{"generation": "x", "models": [{"id": "sc2", "name": "SC", "version": "v9"}]}"#,
        );
        write(
            &op.join(markers.sync_file),
            format!(
                r#"{{"dependencies": [{{"path": "panda", "commit": "{}"}}, {{"path": "{}", "commit": "{pin}"}}]}}"#,
                "a".repeat(40),
                markers.tinygrad_dependency
            )
            .as_bytes(),
        );
    }

    /// A declaring tree decides its own generation, contract and tinygrad (the sync file's,
    /// not the marker's), for v26 and a made-up v27; a v25 tree is decided as before; a
    /// declaration that cannot be read or taken pauses, naming the file and why.
    #[test]
    fn a_declaring_tree_decides_generation_contract_and_tinygrad() {
        let v25 = manifest::contract::ContractName::V25.contract();
        let v26 = manifest::contract::ContractName::V26.contract();
        // v25: no module, nothing declared, the marker decides.
        let t = tempfile::tempdir().unwrap();
        let op = t.path();
        write(
            &op.join(MARKER_FILE),
            format!("{}\n", layout::current_tinygrad_commit()).as_bytes(),
        );
        let r = read(op);
        assert_eq!(r.declaration, Ok(None));
        assert_eq!(
            decide(&r, None),
            Decision::Known {
                generation: layout::CURRENT_GENERATION,
                commit: layout::current_tinygrad_commit(),
                contract: v25,
            }
        );
        for generation in ["v26", "v27"] {
            let t = tempfile::tempdir().unwrap();
            let op = t.path();
            declaring_tree(op, generation, DECLARED_PIN);
            // The marker says something else (or is missing): the sync file decides.
            let r = read(op);
            assert!(r.marker.is_err(), "no marker in this tree");
            let d = r.declaration.clone().unwrap().unwrap();
            assert_eq!(d.generation.to_string(), generation);
            assert_eq!(
                decide(&r, None),
                Decision::Known {
                    generation: d.generation,
                    commit: pin(DECLARED_PIN),
                    contract: v26,
                },
                "{generation}"
            );
            write(&op.join(MARKER_FILE), format!("{V26_PIN}\n").as_bytes());
            assert!(matches!(
                decide(&read(op), None),
                Decision::Known { ref commit, .. } if *commit == pin(DECLARED_PIN)
            ));
            assert!(matches!(
                decide(&read(op), Some(layout::CURRENT_GENERATION)),
                Decision::OverrideDisagrees { .. }
            ));
            // Broken declarations pause, each saying why.
            let markers = v26.tree.unwrap();
            let sync = op.join(markers.sync_file);
            type Break<'a> = Box<dyn Fn() + 'a>;
            let cases: Vec<(Break, &str)> = vec![
                (
                    Box::new(|| std::fs::remove_file(&sync).unwrap()),
                    "upstream-sync.json is missing",
                ),
                (Box::new(|| write(&sync, b"{")), "not JSON"),
                (
                    Box::new(|| {
                        write(
                            &sync,
                            format!(
                                r#"{{"dependencies": [{{"path": "tinygrad_repo", "commit": "{}"}}]}}"#,
                                layout::current_tinygrad_commit()
                            )
                            .as_bytes(),
                        )
                    }),
                    "already",
                ),
                (
                    Box::new(|| {
                        std::fs::remove_file(&sync).unwrap();
                        std::os::unix::fs::symlink("/dev/zero", &sync).unwrap();
                    }),
                    "not a regular file",
                ),
            ];
            for (break_it, says) in cases {
                declaring_tree(op, generation, DECLARED_PIN);
                let _ = std::fs::remove_file(&sync);
                declaring_tree(op, generation, DECLARED_PIN);
                break_it();
                let decision = decide(&read(op), Some(d.generation));
                let Decision::Paused(p @ Paused::Unreadable(_)) = &decision else {
                    panic!("{generation} {says}: {decision:?}")
                };
                assert!(p.message().contains(says), "{says}: {}", p.message());
                assert!(p.message().contains("nothing on this device was changed"));
                assert_eq!(p.progress(), Progress::TreeUnknown(None));
            }
            let _ = std::fs::remove_file(&sync);
            declaring_tree(op, generation, DECLARED_PIN);
            // Two reviewed catalogs: which one is the tree's is unknown.
            write(
                &op.join(markers.catalog_json.replace("{gen}", "v30")),
                br#"{"models": []}"#,
            );
            let decision = decide(&read(op), None);
            assert!(
                matches!(&decision, Decision::Paused(p) if p.message().contains("several")),
                "{decision:?}"
            );
        }
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
