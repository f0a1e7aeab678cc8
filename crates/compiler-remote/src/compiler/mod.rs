//! The I/O shell: one SSH session to the compiler comma, reused for every command and every
//! rsync transfer through its ControlMaster socket.
//!
//! - [`session`]: connecting (policy, both rsyncs, host-key refusal) and running commands, with
//!   live output;
//! - [`sync`]: the tinygrad marker and `sync`'s four transfers;
//! - [`build`]: `compile`, `build_dm` and `validate` on the comma;
//! - [`execute`]: a plan's steps run in order, exactly as built;
//! - [`fetch`]: fetched outputs land in a private directory and are moved into place last;
//! - [`checks`]: the local checks made before anything is sent;
//! - [`known_hosts`]: a key for the compiler must already be known (the dry run's check).

mod build;
pub(crate) mod checks;
mod execute;
pub(crate) mod fetch;
mod known_hosts;
mod session;
mod sync;

use std::path::PathBuf;

pub(crate) use known_hosts::check_host_key_known;
pub(crate) use session::check_local_rsync;

use openssh::Session;
use serde::Serialize;

use crate::error::Result;
use crate::target::{Destination, RemotePath};

/// The prefix of every line of compiler output echoed to the user.
pub const DEVICE_PREFIX: &str = "[device] ";
/// The prefix of lines the remote command (or ssh itself) wrote to stderr, when not merged.
pub const DEVICE_STDERR_PREFIX: &str = "[device:stderr] ";

pub use crate::target::ConnectOptions;

/// What `sync` did.
#[derive(Debug, Clone, Serialize)]
pub struct SyncReport {
    pub destination: String,
    pub remote_root: String,
    /// The four transfers, in order, as `local -> remote`.
    pub transfers: Vec<String>,
    /// The marker read back from the compiler, equal to the pin.
    pub tinygrad_commit: String,
    /// The digest of what was sent (`compile` and `rebuild` compare the tree with it).
    pub digest: crate::tree_digest::TreeDigest,
    /// Where the sync record was written.
    pub record: PathBuf,
}

/// One DM file fetched and placed.
#[derive(Debug, Clone, Serialize)]
pub struct DmFile {
    pub name: String,
    pub size: u64,
    pub sha256: chunker::Sha256Digest,
}

/// The device validator's verdict, exactly as it printed it.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub passed: bool,
    pub verdict: serde_json::Value,
    /// The SHA-256 of the verified chunk set that was sent to the device.
    pub artifact_sha256: chunker::Sha256Digest,
}

/// A sink for live compiler output, one line at a time (already prefixed).
pub type LineSink<'a> = &'a mut dyn FnMut(&str);

/// An open session to the compiler comma. Dropping it closes the ControlMaster.
pub struct Compiler {
    rt: tokio::runtime::Runtime,
    session: Option<Session>,
    opts: ConnectOptions,
    steps_run: std::sync::Mutex<Vec<crate::job::Step>>,
}

impl Compiler {
    pub fn destination(&self) -> &Destination {
        &self.opts.destination
    }

    pub fn remote_root(&self) -> &RemotePath {
        &self.opts.remote_root
    }

    pub(crate) fn session(&self) -> &Session {
        self.session.as_ref().expect("session is open until drop")
    }

    pub(crate) fn dest(&self) -> String {
        self.opts.destination.to_string()
    }

    pub(crate) fn root_join(&self, rest: &str) -> Result<RemotePath> {
        self.opts.remote_root.join(rest)
    }
}

impl Drop for Compiler {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = self.rt.block_on(s.close());
        }
    }
}
