//! rsync through the session's ControlMaster, and the version check that catches openrsync.
//!
//! A stock macOS `/usr/bin/rsync` is openrsync ("protocol version 29, rsync 2.6.9 compatible"),
//! which rejects or silently reinterprets options GNU-era rsync 3 accepts. Both ends must be rsync
//! 3.x; the check runs once per session, before any transfer.

use std::path::Path;

use cli_support::shell_quote;

/// What `rsync --version` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RsyncVersion {
    /// Samba rsync `major.minor.patch`, speaking `protocol`.
    Rsync {
        version: String,
        major: u32,
        protocol: u32,
    },
    /// Apple's openrsync.
    OpenRsync { protocol: u32 },
}

/// Parse the output of `rsync --version`. `Err` carries the first line for the message.
pub fn parse_version(text: &str) -> Result<RsyncVersion, String> {
    let first = text.lines().next().unwrap_or("").trim().to_string();
    let protocol = || {
        text.split("protocol version")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|p| p.parse::<u32>().ok())
            .unwrap_or(0)
    };
    if text.contains("openrsync") {
        return Ok(RsyncVersion::OpenRsync {
            protocol: protocol(),
        });
    }
    let mut words = first.split_whitespace();
    if words.next() != Some("rsync") || words.next() != Some("version") {
        return Err(first);
    }
    let version = words.next().ok_or_else(|| first.clone())?.to_string();
    let major = version
        .split('.')
        .next()
        .and_then(|m| m.trim_start_matches('v').parse().ok())
        .ok_or_else(|| first.clone())?;
    Ok(RsyncVersion::Rsync {
        version,
        major,
        protocol: protocol(),
    })
}

/// `Ok` for rsync 3.x or later; `Err(reason)` otherwise.
pub fn check_compatible(v: &RsyncVersion) -> Result<(), String> {
    match v {
        RsyncVersion::Rsync { major, .. } if *major >= 3 => Ok(()),
        RsyncVersion::Rsync { version, .. } => Err(format!(
            "rsync {version} is older than 3.0, whose filter and --delete behaviour this tool relies on"
        )),
        RsyncVersion::OpenRsync { protocol } => Err(format!(
            "this is openrsync (protocol {protocol}), the macOS default, which rejects or \
             reinterprets options rsync 3 accepts"
        )),
    }
}

/// The `-e` value that makes rsync ride on the existing ControlMaster instead of opening a new
/// connection (and so use exactly the session's host, user, key and config).
pub fn remote_shell(control_socket: &Path, ssh_config: Option<&Path>) -> String {
    let mut parts = vec![
        "ssh".to_string(),
        "-S".to_string(),
        shell_quote(&control_socket.to_string_lossy()),
        "-o".to_string(),
        "ControlMaster=no".to_string(),
        "-o".to_string(),
        "BatchMode=yes".to_string(),
    ];
    if let Some(cfg) = ssh_config {
        parts.push("-F".to_string());
        parts.push(shell_quote(&cfg.to_string_lossy()));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        let gnu = parse_version(
            "rsync  version 3.2.7  protocol version 32\nCopyright (C) 1996-2022 by Andrew Tridgell",
        )
        .unwrap();
        assert_eq!(
            gnu,
            RsyncVersion::Rsync {
                version: "3.2.7".into(),
                major: 3,
                protocol: 32
            }
        );
        assert!(check_compatible(&gnu).is_ok());

        let open =
            parse_version("openrsync: protocol version 29\nrsync version 2.6.9 compatible\n")
                .unwrap();
        assert_eq!(open, RsyncVersion::OpenRsync { protocol: 29 });
        assert!(check_compatible(&open).unwrap_err().contains("openrsync"));

        let old = parse_version("rsync  version 2.6.9  protocol version 29\n").unwrap();
        assert!(check_compatible(&old).unwrap_err().contains("2.6.9"));

        assert!(parse_version("bash: rsync: command not found").is_err());
        assert!(parse_version("").is_err());
    }

    #[test]
    fn remote_shell_uses_the_control_socket() {
        assert_eq!(
            remote_shell(Path::new("/tmp/.ssh-connection1/master"), None),
            "ssh -S /tmp/.ssh-connection1/master -o ControlMaster=no -o BatchMode=yes"
        );
        assert_eq!(
            remote_shell(Path::new("/t/m"), Some(Path::new("/a b/cfg"))),
            "ssh -S /t/m -o ControlMaster=no -o BatchMode=yes -F '/a b/cfg'"
        );
    }
}
