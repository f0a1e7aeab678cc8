//! The compiler's tinygrad marker and `sync`: the seed's four transfers from a local openpilot
//! tree.

use std::path::Path;

use manifest::GitCommit;

use super::checks::check_tree;
use super::session::status_text;
use super::{Compiler, SyncReport};
use crate::error::{Error, Result};
use crate::job::sync_plan;
use crate::plan;
use crate::synced::{self, SyncRecord};
use crate::tree_digest::sync_digest;

impl Compiler {
    /// The commit the compiler's tree records where the local tree does
    /// ([`crate::PinLocation`]: the seed's marker, trimmed, or the sync file's tinygrad
    /// dependency); `None` when the file is absent.
    pub fn read_marker(&self) -> Result<Option<String>> {
        let location = self.opts.pin_location;
        let marker = self.root_join(location.rel())?;
        let out = self.run(&plan::read_marker_command(&marker))?;
        match out.status.code() {
            Some(0) => location
                .commit_in(&out.stdout)
                .map(Some)
                .map_err(|problem| Error::MarkerUnreadable {
                    destination: self.dest(),
                    path: marker.to_string(),
                    problem,
                }),
            Some(3) => Ok(None),
            _ => Err(Error::RemoteCommand {
                destination: self.dest(),
                command: format!("cat {marker}"),
                status: status_text(&out.status),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            }),
        }
    }

    /// Refuse unless the compiler's marker equals `pin`.
    pub fn check_marker(&self, pin: &GitCommit) -> Result<()> {
        let path = self.root_join(self.opts.pin_location.rel())?.to_string();
        match self.read_marker()? {
            None => Err(Error::MarkerMissing {
                destination: self.dest(),
                path,
            }),
            Some(found) if found == pin.as_str() => Ok(()),
            Some(found) => Err(Error::MarkerMismatch {
                destination: self.dest(),
                path,
                found,
                expected: pin.to_string(),
            }),
        }
    }

    /// The seed's four transfers from a local openpilot tree, then the marker check, then the
    /// sync record ([`crate::synced`]): the digest of what was sent, taken before the transfers
    /// and checked again after them (a tree edited meanwhile is not recorded).
    pub fn sync(&self, openpilot: &Path, pin: &GitCommit) -> Result<SyncReport> {
        check_tree(openpilot)?;
        let root = &self.opts.remote_root;
        let mut exec = self.execute(sync_plan(&self.opts, openpilot, pin)?);
        let before = sync_digest(openpilot)?;
        // The compiler's tree is about to change: an earlier record no longer says what it has.
        synced::remove_record(openpilot)?;
        exec.run()?;
        let mut transfers = Vec::new();
        for part in crate::pin_location(openpilot).sync_parts() {
            let slash = if part.is_dir { "/" } else { "" };
            exec.send(&format!("of {}{slash}", part.rel))?;
            transfers.push(part.describe(&root.join(part.rel)?));
        }
        exec.check_marker()?;
        if sync_digest(openpilot)? != before {
            return Err(Error::TreeChangedDuringSync {
                openpilot: openpilot.to_path_buf(),
            });
        }
        let record = SyncRecord {
            destination: self.dest(),
            remote_root: root.to_string(),
            tinygrad_commit: pin.clone(),
            digest: before,
            synced_at_unix: manifest::UnixSeconds::now().0,
        };
        synced::write_record(openpilot, &record)?;
        Ok(SyncReport {
            destination: self.dest(),
            remote_root: root.to_string(),
            transfers,
            tinygrad_commit: pin.to_string(),
            digest: before,
            record: synced::record_path(openpilot),
        })
    }
}
