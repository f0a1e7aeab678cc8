//! The compiler's tinygrad marker and `sync`: the seed's four transfers from a local openpilot
//! tree.

use std::path::Path;

use manifest::GitCommit;

use super::session::status_text;
use super::{Compiler, SyncReport};
use crate::error::{Error, Result};
use crate::plan::{self, shell_quote, shell_words};

impl Compiler {
    /// The compiler's tinygrad marker, trimmed; `None` when the file is absent.
    pub fn read_marker(&self) -> Result<Option<String>> {
        let marker = self.root_join(plan::MARKER)?;
        let q = shell_quote(marker.as_str());
        // Exit 3 is our "no such file", distinct from a failing cat or ssh (255).
        let out = self.run(&format!("[ -f {q} ] || exit 3; cat {q}"))?;
        match out.status.code() {
            Some(0) => Ok(Some(
                String::from_utf8_lossy(&out.stdout).trim().to_string(),
            )),
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
        let path = self.root_join(plan::MARKER)?.to_string();
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

    /// The seed's four transfers from a local openpilot tree, then the marker check.
    pub fn sync(&self, openpilot: &Path, pin: &GitCommit) -> Result<SyncReport> {
        let parts = [
            ("tinygrad_repo", true),
            ("selfdrive/modeld", true),
            ("scripts/model_compiler.py", false),
            ("models", false),
        ];
        for (rel, is_dir) in parts {
            let p = openpilot.join(rel);
            let ok = if is_dir { p.is_dir() } else { p.exists() };
            if !ok {
                return Err(Error::TreeIncomplete { path: p });
            }
        }
        let root = &self.opts.remote_root;
        let dirs = [
            root.join("tinygrad_repo")?,
            root.join("selfdrive/modeld")?,
            root.join("scripts")?,
        ];
        self.run_checked(&format!(
            "mkdir -p {}",
            shell_words(&dirs.each_ref().map(|d| d.as_str()))
        ))?;

        let mut transfers = Vec::new();
        let local = |rel: &str, slash: bool| {
            let mut s = openpilot.join(rel).into_os_string();
            if slash {
                s.push("/");
            }
            s
        };
        // 1. tinygrad_repo/ exactly, without git metadata or bytecode.
        let dst = root.join("tinygrad_repo")?;
        self.rsync(
            "of tinygrad_repo/",
            vec![
                "-az".into(),
                "--delete".into(),
                "--exclude=.git".into(),
                "--exclude=__pycache__".into(),
                local("tinygrad_repo", true),
                self.remote_arg(&dst, true),
            ],
        )?;
        transfers.push(format!("tinygrad_repo/ -> {dst}/ (--delete)"));
        // 2. selfdrive/modeld/.
        let dst = root.join("selfdrive/modeld")?;
        self.rsync(
            "of selfdrive/modeld/",
            vec![
                "-az".into(),
                local("selfdrive/modeld", true),
                self.remote_arg(&dst, true),
            ],
        )?;
        transfers.push(format!("selfdrive/modeld/ -> {dst}/"));
        // 3. the compiler script.
        let dst = root.join("scripts/model_compiler.py")?;
        self.rsync(
            "of scripts/model_compiler.py",
            vec![
                "-az".into(),
                local("scripts/model_compiler.py", false),
                self.remote_arg(&dst, false),
            ],
        )?;
        transfers.push(format!("scripts/model_compiler.py -> {dst}"));
        // 4. the ./models launcher.
        let dst = root.join("models")?;
        self.rsync(
            "of models",
            vec![
                "-az".into(),
                local("models", false),
                self.remote_arg(&dst, false),
            ],
        )?;
        transfers.push(format!("models -> {dst}"));

        self.check_marker(pin)?;
        Ok(SyncReport {
            destination: self.dest(),
            remote_root: root.to_string(),
            transfers,
            tinygrad_commit: pin.to_string(),
        })
    }
}
