//! The compiler comma over SSH and rsync: sync, marker check, stage, compile, fetch.
//!
//! StarPilot driving models are compiled on one comma (the supported compiler is
//! `comma@192.168.3.110`; another needs `allow_other_compiler`). This crate drives it:
//!
//! - [`Compiler::connect`] opens one SSH session through the system `ssh` (the `openssh` crate,
//!   one ControlMaster, `~/.ssh/config` honoured) and checks rsync on both ends;
//! - [`Compiler::sync`] runs the seed's four rsync transfers over that same master (plus, from a
//!   tree that declares its generation, its `upstream-sync.json` and `starpilot/models/`:
//!   [`PinLocation::sync_parts`]) and then checks the compiler's pin where the tree records it
//!   (`<remote-root>/tinygrad_repo/TINYGRAD_COMMIT`, or the sync file's `tinygrad_repo`
//!   dependency: [`PinLocation`]);
//! - [`Compiler::compile`] builds one model: marker check first, an emptied staging directory
//!   holding exactly that model's sources, `./models --<id> --version <vN>`, output streamed
//!   live and saved to a log, outputs fetched and checked (chunk count, SHA-256) before they are
//!   moved into place, remote directories cleaned;
//! - [`Compiler::build_dm`] builds the four driver-monitoring files, all or nothing;
//! - [`Compiler::validate`] runs the device-side validator and returns its own verdict.
//!
//! Each of these builds its plan first ([`job`]: the commands, transfers and local files, from a
//! typed request such as [`CompileJob`]) and executes it step by step; [`dry_run`] makes the
//! local checks and renders the same plan without connecting.
//!
//! The pure core — command lines ([`plan`]), rsync version policy ([`rsync`]), output checks
//! ([`outputs`]), destination policy ([`target`]) — does no I/O and is unit-tested; the
//! [`Compiler`] shell is tested against a real sshd on 127.0.0.1.
//!
//! What it does not do: fetch sources from a store, keep results or write manifests (that is the
//! release CLI's `rebuild`), or judge a model (only the device validator does).

mod compiler;
pub mod dry_run;
mod error;
pub mod job;
pub mod outputs;
pub mod plan;
pub mod rsync;
pub mod synced;
pub mod target;
pub mod tree_digest;
mod unsynced;

use std::path::Path;

pub use compiler::{
    Compiler, ConnectOptions, DEVICE_PREFIX, DEVICE_STDERR_PREFIX, DmFile, LineSink, SyncReport,
    Verdict,
};
pub use error::{Error, PinProblem, Result, Side, SourceProblem};
pub use job::{CompileJob, DmJob, Plan, Step, ValidateJob};
pub use outputs::FetchedArtifact;
pub use plan::{CompileRequest, InputFormat, LatencyBound, PinLocation};
pub use target::{DEFAULT_REMOTE_ROOT, Destination, RemotePath, SUPPORTED_COMPILER};

use manifest::GitCommit;

/// The marker file in an openpilot tree, relative to its root.
pub const MARKER_PATH: &str = plan::MARKER;

/// Where the openpilot tree at `openpilot` records its tinygrad: the sync file of a tree
/// carrying a declaring contract's catalog module (a regular file), else the seed's marker.
/// Only where: whether the declaration reads and agrees with the marker is
/// `release::tree::tree_pin`'s to say.
pub fn pin_location(openpilot: &Path) -> PinLocation {
    manifest::contract::declaring_contracts()
        .filter_map(|c| c.tree)
        .find(|m| {
            std::fs::symlink_metadata(openpilot.join(m.catalog_module)).is_ok_and(|md| md.is_file())
        })
        .map_or(PinLocation::Marker, PinLocation::Declared)
}

/// Read the tinygrad pin recorded in a local openpilot tree's marker (the seed's
/// `tinygrad_repo/TINYGRAD_COMMIT`).
pub fn read_tree_pin(openpilot: &Path) -> Result<GitCommit> {
    let path = openpilot.join(MARKER_PATH);
    // Bounded and non-blocking (a FIFO planted as the marker is an error, not a hang); a
    // marker is one commit and a newline.
    let text = match chunker::bounded::read_capped_existing(&path, chunker::SMALL_FILE_LIMIT) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(chunker::Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::Pin {
                path,
                problem: PinProblem::MarkerMissing,
            });
        }
        // Any other failure is an I/O error naming the path, as before the bounded read.
        Err(chunker::Error::Io(e)) => return Err(Error::Io(e)),
        Err(e) => return Err(Error::Io(std::io::Error::other(e.to_string()))),
    };
    text.trim()
        .parse()
        .map_err(|e: manifest::Error| Error::Pin {
            problem: PinProblem::NotACommit {
                found: text.trim().to_string(),
                reason: e.to_string(),
            },
            path,
        })
}

/// The pin to build with: `--tinygrad-commit` when given, else the openpilot tree's marker.
pub fn resolve_pin(explicit: Option<GitCommit>, openpilot: Option<&Path>) -> Result<GitCommit> {
    match (explicit, openpilot) {
        (Some(c), _) => Ok(c),
        (None, Some(dir)) => read_tree_pin(dir),
        (None, None) => Err(Error::Pin {
            path: Path::new("--tinygrad-commit").to_path_buf(),
            problem: PinProblem::NotGiven,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_resolution() {
        let t = tempfile::tempdir().unwrap();
        let c = "e837e367aac9e1a66e689f4f32ce20ca9367df13";
        let problem = |r: Result<GitCommit>| match r {
            Err(Error::Pin { problem, .. }) => problem,
            other => panic!("{other:?}"),
        };
        assert_eq!(problem(resolve_pin(None, None)), PinProblem::NotGiven);
        assert_eq!(
            problem(resolve_pin(None, Some(t.path()))),
            PinProblem::MarkerMissing
        );
        std::fs::create_dir_all(t.path().join("tinygrad_repo")).unwrap();
        std::fs::write(t.path().join(MARKER_PATH), format!("{c}\n")).unwrap();
        assert_eq!(resolve_pin(None, Some(t.path())).unwrap().as_str(), c);
        let other: GitCommit = "0000000000000000000000000000000000000000".parse().unwrap();
        assert_eq!(
            resolve_pin(Some(other.clone()), Some(t.path())).unwrap(),
            other
        );
        std::fs::write(t.path().join(MARKER_PATH), "e837e36\n").unwrap();
        let err = resolve_pin(None, Some(t.path())).unwrap_err();
        assert!(
            matches!(&err, Error::Pin { problem: PinProblem::NotACommit { found, .. }, .. } if found == "e837e36"),
            "{err:?}"
        );
        assert!(err.to_string().contains("TINYGRAD_COMMIT"), "{err}");
    }

    /// A file error other than a missing marker is an I/O error that names the path (fs-err),
    /// not a pin problem.
    #[test]
    fn an_unreadable_marker_is_an_io_error_naming_the_path() {
        let t = tempfile::tempdir().unwrap();
        // A directory where the marker file should be: reading it fails, but not NotFound.
        std::fs::create_dir_all(t.path().join(MARKER_PATH)).unwrap();
        let err = read_tree_pin(t.path()).unwrap_err();
        assert!(matches!(err, Error::Io(_)), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains(&t.path().join(MARKER_PATH).display().to_string()),
            "{text}"
        );
    }
}
