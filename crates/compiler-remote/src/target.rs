//! Where to build: the SSH destination, the remote root, and the one-compiler policy.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};

/// The supported compiler. The seed: "never substitute another comma without explicit approval".
pub const SUPPORTED_COMPILER: &str = "comma@192.168.3.110";

/// Where openpilot lives on the comma.
pub const DEFAULT_REMOTE_ROOT: &str = "/data/openpilot";

/// An SSH destination, `[USER@]HOST` (HOST may be an alias from `~/.ssh/config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination(String);

impl Destination {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is the supported compiler, the only one allowed without approval.
    pub fn is_supported_compiler(&self) -> bool {
        self.0 == SUPPORTED_COMPILER
    }

    /// Refuse anything but the supported compiler unless the caller has approval.
    pub fn check_policy(&self, allow_other_compiler: bool) -> Result<()> {
        if self.is_supported_compiler() || allow_other_compiler {
            Ok(())
        } else {
            Err(Error::OtherCompiler {
                destination: self.0.clone(),
                supported: SUPPORTED_COMPILER,
            })
        }
    }
}

impl Default for Destination {
    fn default() -> Self {
        Destination(SUPPORTED_COMPILER.to_string())
    }
}

impl FromStr for Destination {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason| Error::InvalidDestination {
            value: s.to_string(),
            reason,
        };
        if s.is_empty() {
            return Err(bad("it is empty"));
        }
        // A leading '-' would be read by ssh and rsync as an option.
        if s.starts_with('-') {
            return Err(bad("it starts with '-'"));
        }
        if s.contains("://") {
            return Err(bad("URLs are not accepted; put a port in ~/.ssh/config"));
        }
        let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@' | ':');
        if !s.chars().all(ok) {
            return Err(bad(
                "only letters, digits, '.', '-', '_', '@' and ':' are allowed",
            ));
        }
        let (user, host) = match s.split_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, s),
        };
        if user.is_some_and(str::is_empty) || host.is_empty() || host.contains('@') {
            return Err(bad("it must be HOST or USER@HOST"));
        }
        Ok(Destination(s.to_string()))
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An absolute path on the comma, restricted to characters that need no quoting anywhere
/// (remote shells, rsync's remote argument parsing on old versions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotePath(String);

impl RemotePath {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `self/rest`; `rest` is a relative path that must itself be safe.
    pub fn join(&self, rest: &str) -> Result<RemotePath> {
        let base = self.0.trim_end_matches('/');
        format!("{base}/{rest}").parse()
    }
}

impl Default for RemotePath {
    fn default() -> Self {
        RemotePath(DEFAULT_REMOTE_ROOT.to_string())
    }
}

impl FromStr for RemotePath {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason| Error::InvalidRemotePath {
            value: s.to_string(),
            reason,
        };
        if !s.starts_with('/') {
            return Err(bad("it must be absolute"));
        }
        let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/' | '+');
        if !s.chars().all(ok) {
            return Err(bad(
                "only letters, digits, '.', '-', '_', '+' and '/' are allowed",
            ));
        }
        if s.split('/').any(|seg| seg == "..") {
            return Err(bad("'..' is not allowed"));
        }
        let trimmed = if s.len() > 1 {
            s.trim_end_matches('/')
        } else {
            s
        };
        Ok(RemotePath(trimmed.to_string()))
    }
}

impl fmt::Display for RemotePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How to reach the compiler.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub destination: Destination,
    /// The release owner approved a compiler other than the supported one.
    pub allow_other_compiler: bool,
    pub remote_root: RemotePath,
    /// An ssh config file to use instead of `~/.ssh/config` (which ssh reads by default).
    pub ssh_config: Option<PathBuf>,
    /// The local rsync program.
    pub rsync: PathBuf,
    pub connect_timeout: Duration,
    /// Where the compiler's tree records its tinygrad: as the local tree does
    /// ([`crate::pin_location`]); the seed's marker when there is no local tree.
    pub pin_location: crate::plan::PinLocation,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            destination: Destination::default(),
            allow_other_compiler: false,
            remote_root: RemotePath::default(),
            ssh_config: None,
            rsync: PathBuf::from("rsync"),
            connect_timeout: Duration::from_secs(10),
            pin_location: crate::plan::PinLocation::Marker,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_supported_compiler_without_approval() {
        let d: Destination = SUPPORTED_COMPILER.parse().unwrap();
        assert!(d.check_policy(false).is_ok());
        let other: Destination = "comma@192.168.3.109".parse().unwrap();
        match other.check_policy(false) {
            Err(Error::OtherCompiler { destination, .. }) => {
                assert_eq!(destination, "comma@192.168.3.109")
            }
            r => panic!("{r:?}"),
        }
        assert!(other.check_policy(true).is_ok());
        // Same host, other user: still not the supported compiler.
        let root: Destination = "root@192.168.3.110".parse().unwrap();
        assert!(root.check_policy(false).is_err());
    }

    #[test]
    fn destinations() {
        for ok in [
            "comma@192.168.3.110",
            "mycomma",
            "u_1@host-2.lan",
            "host:22",
        ] {
            assert!(ok.parse::<Destination>().is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-oProxyCommand=x",
            "a b",
            "@host",
            "u@",
            "a@b@c",
            "ssh://h",
            "h;rm",
        ] {
            assert!(bad.parse::<Destination>().is_err(), "{bad}");
        }
    }

    #[test]
    fn remote_paths() {
        let p: RemotePath = "/data/openpilot/".parse().unwrap();
        assert_eq!(p.as_str(), "/data/openpilot");
        assert_eq!(
            p.join("tinygrad_repo/TINYGRAD_COMMIT").unwrap().as_str(),
            "/data/openpilot/tinygrad_repo/TINYGRAD_COMMIT"
        );
        for bad in ["data", "/a b", "/a/../b", "/a;b", "/a$(x)"] {
            assert!(bad.parse::<RemotePath>().is_err(), "{bad}");
        }
        assert!(p.join("../x").is_err());
    }
}
