//! Connecting to the compiler (the one-compiler policy, both rsyncs, a host key that must
//! already be known) and running commands on it, with live output.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use fs_err::File;
use openssh::{KnownHosts, SessionBuilder};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use super::{Compiler, ConnectOptions, DEVICE_PREFIX, DEVICE_STDERR_PREFIX, LineSink};
use crate::error::{Error, Result, Side};
use crate::rsync;

impl Compiler {
    /// Check the one-compiler policy, check the local rsync, open the session, check the remote
    /// rsync. The policy is checked before anything touches the network.
    pub fn connect(opts: ConnectOptions) -> Result<Compiler> {
        opts.destination.check_policy(opts.allow_other_compiler)?;
        check_local_rsync(&opts.rsync)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        let mut builder = SessionBuilder::default();
        builder
            .known_hosts_check(KnownHosts::Strict)
            .connect_timeout(opts.connect_timeout)
            .server_alive_interval(Duration::from_secs(30))
            .control_directory(std::env::temp_dir());
        if let Some(cfg) = &opts.ssh_config {
            builder.config_file(cfg);
        }
        let dest = opts.destination.as_str().to_string();
        let session = rt.block_on(builder.connect(&dest)).map_err(|source| {
            let detail = connect_detail(&source);
            if is_host_key_refusal(&detail) {
                Error::HostKeyNotKnown {
                    destination: dest.clone(),
                    detail,
                }
            } else {
                Error::Connect {
                    destination: dest.clone(),
                    detail,
                    source,
                }
            }
        })?;
        let compiler = Compiler {
            rt,
            session: Some(session),
            opts,
            steps_run: Default::default(),
        };
        compiler.check_remote_rsync()?;
        Ok(compiler)
    }

    /// Run one shell command line on the comma and return its output, whatever the exit.
    pub fn run(&self, command: &str) -> Result<std::process::Output> {
        self.rt
            .block_on(self.session().raw_command(command).output())
            .map_err(|source| Error::Ssh {
                destination: self.dest(),
                command: command.to_string(),
                source,
            })
    }

    /// Run one shell command line; a non-zero exit is an error quoting its stderr.
    pub fn run_checked(&self, command: &str) -> Result<String> {
        let out = self.run(command)?;
        if !out.status.success() {
            return Err(Error::RemoteCommand {
                destination: self.dest(),
                command: command.to_string(),
                status: status_text(&out.status),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Run `command`, echoing every output line to `sink` with [`DEVICE_PREFIX`] as it arrives
    /// and appending it to `log`. Returns the exit status.
    pub fn run_streaming(
        &self,
        command: &str,
        log: &mut File,
        sink: LineSink<'_>,
    ) -> Result<ExitStatus> {
        let ssh_err = |source| Error::Ssh {
            destination: self.dest(),
            command: command.to_string(),
            source,
        };
        self.rt.block_on(async {
            let mut child = self
                .session()
                .raw_command(command)
                .stdin(openssh::Stdio::null())
                .stdout(openssh::Stdio::piped())
                .stderr(openssh::Stdio::piped())
                .spawn()
                .await
                .map_err(ssh_err)?;
            let stdout = child.stdout().take().expect("stdout is piped");
            let mut stderr = child.stderr().take().expect("stderr is piped");
            // ssh's own diagnostics arrive on stderr; read it alongside so it can never fill up
            // and stall the remote command.
            let err_task = async {
                let mut text = Vec::new();
                let _ = stderr.read_to_end(&mut text).await;
                text
            };
            let out_task = async {
                let mut reader = BufReader::new(stdout);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    let n = reader.read_until(b'\n', &mut buf).await.map_err(|source| {
                        Error::Stream {
                            destination: self.dest(),
                            command: command.to_string(),
                            source,
                        }
                    })?;
                    if n == 0 {
                        break;
                    }
                    log.write_all(&buf)?;
                    let line = String::from_utf8_lossy(&buf);
                    sink(&format!(
                        "{DEVICE_PREFIX}{}",
                        line.trim_end_matches(['\n', '\r'])
                    ));
                }
                Ok::<(), Error>(())
            };
            let (out_res, err_text) = tokio::join!(out_task, err_task);
            out_res?;
            if !err_text.is_empty() {
                log.write_all(&err_text)?;
                for line in String::from_utf8_lossy(&err_text).lines() {
                    sink(&format!("{DEVICE_STDERR_PREFIX}{line}"));
                }
            }
            log.flush()?;
            child.wait().await.map_err(ssh_err)
        })
    }

    pub(crate) fn check_remote_rsync(&self) -> Result<()> {
        let out = self.run("rsync --version")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(Error::RsyncMissing {
                side: Side::Remote,
                host: format!(" ({})", self.dest()),
                detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        let host = format!(" ({})", self.dest());
        check_banner(
            Side::Remote,
            host,
            &text,
            "not an rsync version banner".into(),
        )
    }

    /// Run local rsync with the session's ControlMaster as its remote shell.
    pub(crate) fn rsync(&self, what: &str, args: Vec<OsString>) -> Result<()> {
        let shell = rsync::remote_shell(
            self.session().control_socket(),
            self.opts.ssh_config.as_deref(),
        );
        let out = Command::new(&self.opts.rsync)
            .arg("-e")
            .arg(shell)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| local_missing(&self.opts.rsync, e))?;
        if !out.status.success() {
            return Err(Error::Rsync {
                what: what.to_string(),
                status: status_text(&out.status),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(())
    }
}

pub(crate) fn check_local_rsync(program: &Path) -> Result<()> {
    let out = Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| local_missing(program, e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let not_banner = format!(
        "{} did not print an rsync version banner",
        program.display()
    );
    check_banner(Side::Local, String::new(), &text, not_banner)
}

fn local_missing(program: &Path, e: std::io::Error) -> Error {
    Error::RsyncMissing {
        side: Side::Local,
        host: String::new(),
        detail: format!("{}: {e}", program.display()),
    }
}

/// rsync's `--version` output `text` on `side` (`host`: ` (DEST)` for the compiler): a version
/// banner (else `not_banner`) of a compatible rsync.
fn check_banner(side: Side, host: String, text: &str, not_banner: String) -> Result<()> {
    let incompatible = |version, detail| Error::RsyncIncompatible {
        side,
        host: host.clone(),
        version,
        detail,
    };
    let v = rsync::parse_version(text).map_err(|first| incompatible(first, not_banner))?;
    let banner = text.lines().next().unwrap_or("").to_string();
    rsync::check_compatible(&v).map_err(|detail| incompatible(banner, detail))
}

pub(crate) fn status_text(status: &ExitStatus) -> String {
    match status.code() {
        Some(c) => format!("exit code {c}"),
        None => "a signal".to_string(),
    }
}

/// Whether ssh's own words say it refused the server's host key (unknown or changed).
pub(crate) fn is_host_key_refusal(detail: &str) -> bool {
    [
        "Host key verification failed",
        "No ED25519 host key is known",
        "No RSA host key is known",
        "No ECDSA host key is known",
        "REMOTE HOST IDENTIFICATION HAS CHANGED",
    ]
    .iter()
    .any(|m| detail.contains(m))
}

pub(crate) fn connect_detail(e: &openssh::Error) -> String {
    use std::error::Error as _;
    match e.source() {
        Some(s) => format!(" ({s})"),
        None => String::new(),
    }
}
