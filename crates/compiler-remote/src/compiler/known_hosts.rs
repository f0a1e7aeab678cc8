//! A key for the compiler must already be in a known_hosts file: the check a dry run makes in
//! place of the connection, which refuses an unknown key the same way.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::ConnectOptions;
use crate::error::{Error, Result};

/// Refuse, as the connection would, when no known_hosts file has a key for the compiler. ssh's
/// effective configuration comes from `ssh -G` (which reads it and connects nowhere), the
/// lookup from `ssh-keygen -F`. Whether the key matches only a connection can tell.
pub(crate) fn check_host_key_known(opts: &ConnectOptions) -> Result<()> {
    let dest = opts.destination.as_str();
    let mut cmd = Command::new("ssh");
    cmd.arg("-G").args(["-o", "StrictHostKeyChecking=yes"]);
    if let Some(cfg) = &opts.ssh_config {
        cmd.arg("-F").arg(cfg);
    }
    let out = cmd
        .arg("--")
        .arg(dest)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::SshConfig {
            destination: dest.to_string(),
            detail: format!("cannot run ssh: {e}"),
        })?;
    if !out.status.success() {
        return Err(Error::SshConfig {
            destination: dest.to_string(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let view = SshView::parse(&String::from_utf8_lossy(&out.stdout));
    let name = view.known_hosts_name();
    for file in view.known_hosts_files.iter().filter(|f| f.is_file()) {
        let found = Command::new("ssh-keygen")
            .arg("-F")
            .arg(&name)
            .arg("-f")
            .arg(file)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::SshConfig {
                destination: dest.to_string(),
                detail: format!("cannot run ssh-keygen: {e}"),
            })?;
        if found.status.success() && !found.stdout.is_empty() {
            return Ok(());
        }
    }
    let files: Vec<String> = view
        .known_hosts_files
        .iter()
        .map(|f| f.display().to_string())
        .collect();
    Err(Error::HostKeyNotKnown {
        destination: dest.to_string(),
        detail: format!(" (no key for {name} in {})", files.join(", ")),
    })
}

/// The part of `ssh -G`'s output that says where the host key is looked up.
#[derive(Debug, Default, PartialEq, Eq)]
struct SshView {
    hostname: String,
    port: u16,
    host_key_alias: Option<String>,
    known_hosts_files: Vec<PathBuf>,
}

impl SshView {
    fn parse(text: &str) -> SshView {
        let mut v = SshView {
            port: 22,
            ..SshView::default()
        };
        let mut global = Vec::new();
        for line in text.lines() {
            let Some((key, value)) = line.split_once(' ') else {
                continue;
            };
            match key {
                "hostname" => v.hostname = value.to_string(),
                "port" => v.port = value.parse().unwrap_or(22),
                "hostkeyalias" => v.host_key_alias = Some(value.to_string()),
                "userknownhostsfile" => v
                    .known_hosts_files
                    .extend(value.split_whitespace().map(PathBuf::from)),
                "globalknownhostsfile" => {
                    global.extend(value.split_whitespace().map(PathBuf::from))
                }
                _ => {}
            }
        }
        v.known_hosts_files.extend(global);
        v
    }

    /// The name ssh looks the key up under: the alias as it is, else `host` on port 22 and
    /// `[host]:port` on any other.
    fn known_hosts_name(&self) -> String {
        match &self.host_key_alias {
            Some(a) => a.clone(),
            None if self.port == 22 => self.hostname.clone(),
            None => format!("[{}]:{}", self.hostname, self.port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_view_names_the_key_as_ssh_looks_it_up() {
        let v = SshView::parse(
            "user comma\nhostname 127.0.0.1\nport 2222\nuserknownhostsfile /k/a /k/b\n\
             globalknownhostsfile /etc/ssh/ssh_known_hosts\n",
        );
        assert_eq!(v.known_hosts_name(), "[127.0.0.1]:2222");
        assert_eq!(
            v.known_hosts_files,
            [
                PathBuf::from("/k/a"),
                PathBuf::from("/k/b"),
                PathBuf::from("/etc/ssh/ssh_known_hosts")
            ]
        );
        let v = SshView::parse("hostname 192.168.3.110\nport 22\n");
        assert_eq!(v.known_hosts_name(), "192.168.3.110");
        let v = SshView::parse("hostname h\nport 2222\nhostkeyalias comma\n");
        assert_eq!(v.known_hosts_name(), "comma");
    }
}
