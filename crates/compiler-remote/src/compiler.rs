//! The I/O shell: one SSH session to the compiler comma, reused for every command and every
//! rsync transfer through its ControlMaster socket.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use fs_err::{self as fs, File};

use manifest::{BehaviorVersion, GitCommit, ModelId};
use openssh::{KnownHosts, Session, SessionBuilder};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use crate::error::{Error, Result, Side, SourceProblem};
use crate::outputs::{self, FetchedArtifact, OutputProblem};
use crate::plan::{self, CompileRequest, shell_quote, shell_words};
use crate::rsync;
use crate::target::{Destination, RemotePath};

/// The prefix of every line of compiler output echoed to the user.
pub const DEVICE_PREFIX: &str = "[device] ";
/// The prefix of lines the remote command (or ssh itself) wrote to stderr, when not merged.
pub const DEVICE_STDERR_PREFIX: &str = "[device:stderr] ";

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
        }
    }
}

/// What `sync` did.
#[derive(Debug, Clone, Serialize)]
pub struct SyncReport {
    pub destination: String,
    pub remote_root: String,
    /// The four transfers, in order, as `local -> remote`.
    pub transfers: Vec<String>,
    /// The marker read back from the compiler, equal to the pin.
    pub tinygrad_commit: String,
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
}

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
        };
        compiler.check_remote_rsync()?;
        Ok(compiler)
    }

    pub fn destination(&self) -> &Destination {
        &self.opts.destination
    }

    pub fn remote_root(&self) -> &RemotePath {
        &self.opts.remote_root
    }

    fn session(&self) -> &Session {
        self.session.as_ref().expect("session is open until drop")
    }

    fn dest(&self) -> String {
        self.opts.destination.to_string()
    }

    fn root_join(&self, rest: &str) -> Result<RemotePath> {
        self.opts.remote_root.join(rest)
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

    fn check_remote_rsync(&self) -> Result<()> {
        let out = self.run("rsync --version")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(Error::RsyncMissing {
                side: Side::Remote,
                host: format!(" ({})", self.dest()),
                detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        let v = rsync::parse_version(&text).map_err(|first| Error::RsyncIncompatible {
            side: Side::Remote,
            host: format!(" ({})", self.dest()),
            version: first,
            detail: "not an rsync version banner".to_string(),
        })?;
        rsync::check_compatible(&v).map_err(|detail| Error::RsyncIncompatible {
            side: Side::Remote,
            host: format!(" ({})", self.dest()),
            version: text.lines().next().unwrap_or("").to_string(),
            detail,
        })
    }

    /// Run local rsync with the session's ControlMaster as its remote shell.
    fn rsync(&self, what: &str, args: Vec<OsString>) -> Result<()> {
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
            .map_err(|e| Error::RsyncMissing {
                side: Side::Local,
                host: String::new(),
                detail: format!("{}: {e}", self.opts.rsync.display()),
            })?;
        if !out.status.success() {
            return Err(Error::Rsync {
                what: what.to_string(),
                status: status_text(&out.status),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(())
    }

    fn remote_arg(&self, path: &RemotePath, trailing_slash: bool) -> OsString {
        let slash = if trailing_slash { "/" } else { "" };
        OsString::from(format!("{}:{}{slash}", self.dest(), path))
    }

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

    /// Compile one model: marker check, clean staging, stage exactly `sources`, run `./models`
    /// with its output streamed to `sink` and saved to `log`, fetch and verify the outputs into
    /// `out`, clean the remote directories.
    pub fn compile(
        &self,
        req: &CompileRequest,
        sources: &[PathBuf],
        pin: &GitCommit,
        out: &Path,
        log: &Path,
        sink: LineSink<'_>,
    ) -> Result<FetchedArtifact> {
        // Refuse on a wrong tinygrad before anything on the device changes.
        self.check_marker(pin)?;
        check_sources(sources)?;
        let staging = self.root_join(plan::STAGING_DIR)?;
        let remote_out = self.root_join(plan::OUTPUT_DIR)?;
        let name = req.artifact_name();

        let mut log_file = create_log(log)?;
        self.run_checked(&plan::prepare_command(&staging, &remote_out, &name))?;
        let result = self.compile_staged(
            req,
            sources,
            &staging,
            &remote_out,
            &name,
            out,
            log,
            &mut log_file,
            sink,
        );
        // Clean up whatever happened; a cleanup failure must not hide the build's own error.
        let cleanup = self.run_checked(&plan::cleanup_command(&staging, &remote_out, &name));
        let artifact = result?;
        cleanup?;
        Ok(artifact)
    }

    #[allow(clippy::too_many_arguments)]
    fn compile_staged(
        &self,
        req: &CompileRequest,
        sources: &[PathBuf],
        staging: &RemotePath,
        remote_out: &RemotePath,
        name: &str,
        out: &Path,
        log: &Path,
        log_file: &mut File,
        sink: LineSink<'_>,
    ) -> Result<FetchedArtifact> {
        let model = req.build_id().to_string();
        let mut args: Vec<OsString> = vec!["-a".into()];
        args.extend(sources.iter().map(|s| s.clone().into_os_string()));
        args.push(self.remote_arg(staging, true));
        self.rsync(&format!("of the sources of {model}"), args)?;

        let command = plan::run_models_command(
            &self.opts.remote_root,
            &req.models_args(staging, remote_out),
        );
        writeln!(log_file, "# {} on {}", command, self.dest())?;
        let status = self.run_streaming(&command, log_file, sink)?;
        if !status.success() {
            return Err(Error::CompileFailed {
                model,
                status: status_text(&status),
                log: log.to_path_buf(),
            });
        }

        fs::create_dir_all(out)?;
        let fetch = FetchDir::new(out, name)?;
        self.rsync(
            &format!("of the outputs of {model}"),
            vec![
                "-a".into(),
                format!("--include={name}").into(),
                format!("--include={name}.*").into(),
                "--exclude=*".into(),
                self.remote_arg(remote_out, true),
                fetch.path().into(),
            ],
        )?;
        let checked = if req.local {
            outputs::check_local(fetch.path(), name)?
        } else {
            outputs::check_release(fetch.path(), name)?
        };
        let artifact = match checked {
            Ok(a) => a,
            Err(OutputProblem::Missing) => {
                return Err(Error::MissingOutputs {
                    model,
                    expected: if req.local {
                        name.to_string()
                    } else {
                        format!("{name}.chunk*")
                    },
                    remote_dir: format!("{}:{remote_out}", self.dest()),
                    log: log.to_path_buf(),
                });
            }
            Err(OutputProblem::Invalid(detail)) => {
                return Err(Error::InvalidOutputs {
                    model,
                    detail,
                    log: log.to_path_buf(),
                });
            }
            Err(OutputProblem::Digest { expected, actual }) => {
                return Err(Error::DigestMismatch {
                    model,
                    expected,
                    actual,
                    log: log.to_path_buf(),
                });
            }
        };
        fetch.install(out, name, &artifact.files)?;
        Ok(artifact)
    }

    /// Build the DM set: stage `sources`, run `./models --dm`, fetch the four files into `out`.
    /// Nothing is written to `out` unless all four came back.
    pub fn build_dm(
        &self,
        sources: &[PathBuf],
        pin: &GitCommit,
        remote_dm_out: &RemotePath,
        out: &Path,
        log: &Path,
        sink: LineSink<'_>,
    ) -> Result<Vec<DmFile>> {
        self.check_marker(pin)?;
        check_sources(sources)?;
        let staging = self.root_join(plan::STAGING_DIR)?;
        let dm_paths: Vec<String> = plan::DM_FILES
            .iter()
            .map(|f| remote_dm_out.join(f).map(|p| p.to_string()))
            .collect::<Result<_>>()?;
        let clear_dm = format!("rm -f {}", shell_words(&dm_paths));
        let s = shell_quote(staging.as_str());
        self.run_checked(&format!(
            "rm -rf {s} && mkdir -p {s} {} && {clear_dm}",
            shell_quote(remote_dm_out.as_str())
        ))?;
        let mut log_file = create_log(log)?;
        let result = (|| {
            let mut args: Vec<OsString> = vec!["-a".into()];
            args.extend(sources.iter().map(|s| s.clone().into_os_string()));
            args.push(self.remote_arg(&staging, true));
            self.rsync("of the DM sources", args)?;
            let command = plan::run_models_command(
                &self.opts.remote_root,
                &plan::dm_args(&staging, remote_dm_out),
            );
            writeln!(log_file, "# {} on {}", command, self.dest())?;
            let status = self.run_streaming(&command, &mut log_file, sink)?;
            if !status.success() {
                return Err(Error::CompileFailed {
                    model: "dm".to_string(),
                    status: status_text(&status),
                    log: log.to_path_buf(),
                });
            }
            fs::create_dir_all(out)?;
            let fetch = FetchDir::new(out, "dm")?;
            let mut args: Vec<OsString> = vec!["-a".into()];
            args.extend(
                plan::DM_FILES
                    .iter()
                    .map(|f| OsString::from(format!("--include={f}"))),
            );
            args.push("--exclude=*".into());
            args.push(self.remote_arg(remote_dm_out, true));
            args.push(fetch.path().into());
            self.rsync("of the DM outputs", args)?;
            let missing = outputs::missing_dm_files(fetch.path());
            if !missing.is_empty() {
                return Err(Error::DmIncomplete {
                    missing,
                    out: out.to_path_buf(),
                    log: log.to_path_buf(),
                });
            }
            let mut files = Vec::new();
            for f in plan::DM_FILES {
                let (sha256, size) = chunker::Sha256Digest::of_file(&fetch.path().join(f))?;
                files.push(DmFile {
                    name: f.to_string(),
                    size,
                    sha256,
                });
            }
            let names: Vec<String> = plan::DM_FILES.iter().map(|s| s.to_string()).collect();
            fetch.install_files(out, &names)?;
            Ok(files)
        })();
        let cleanup = self.run_checked(&format!("rm -rf {s} && mkdir -p {s} && {clear_dm}"));
        let files = result?;
        cleanup?;
        Ok(files)
    }

    /// Run the device-side validator on the compiler for the chunk set at `artifact` (a logical
    /// path whose chunk files sit beside it) and return its JSON verdict, never one of ours.
    #[allow(clippy::too_many_arguments)]
    pub fn validate(
        &self,
        id: &ModelId,
        version: BehaviorVersion,
        artifact: &Path,
        pin: &GitCommit,
        models_dir: &RemotePath,
        python: &str,
        log: &Path,
        sink: LineSink<'_>,
    ) -> Result<Verdict> {
        self.check_marker(pin)?;
        let name = artifact
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dir = match artifact.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let (files, artifact_sha256) = match outputs::check_release(&dir, &name)? {
            Ok(a) => (a.files, a.sha256),
            Err(problem) => {
                return Err(Error::Validator {
                    model: id.to_string(),
                    detail: format!(
                        "{} is not a verified chunk set: {problem:?}",
                        artifact.display()
                    ),
                    log: log.to_path_buf(),
                });
            }
        };
        let m = shell_quote(models_dir.as_str());
        let q = shell_quote(&name);
        self.run_checked(&format!("mkdir -p {m} && rm -f {m}/{q} {m}/{q}.*"))?;
        let mut args: Vec<OsString> = vec!["-a".into()];
        args.extend(files.iter().map(|f| dir.join(f).into_os_string()));
        args.push(self.remote_arg(models_dir, true));
        self.rsync(&format!("of {name} to {models_dir}"), args)?;

        let mut log_file = create_log(log)?;
        let command = format!(
            "cd {} && {} scripts/validate_model_artifact.py --model {} --version {}",
            shell_quote(self.opts.remote_root.as_str()),
            shell_quote(python),
            shell_quote(id.as_str()),
            version
        );
        writeln!(log_file, "# {} on {}", command, self.dest())?;
        let mut last = String::new();
        let status = {
            // The verdict is the last line on stdout; stderr is kept apart so a warning printed
            // after the verdict cannot hide it.
            let mut tee = |line: &str| {
                if let Some(text) = line.strip_prefix(DEVICE_PREFIX)
                    && !text.trim().is_empty()
                {
                    last = text.trim().to_string();
                }
                sink(line);
            };
            self.run_streaming(&command, &mut log_file, &mut tee)
        };
        let cleanup = self.run_checked(&format!("rm -f {m}/{q} {m}/{q}.*"));
        let status = status?;
        cleanup?;
        if !status.success() {
            return Err(Error::Validator {
                model: id.to_string(),
                detail: format!("the validator exited with {}", status_text(&status)),
                log: log.to_path_buf(),
            });
        }
        let verdict: serde_json::Value =
            serde_json::from_str(&last).map_err(|e| Error::Validator {
                model: id.to_string(),
                detail: format!("its last output line is not a JSON verdict ({e}): {last:?}"),
                log: log.to_path_buf(),
            })?;
        let passed = verdict
            .get("passed")
            .and_then(|v| v.as_bool())
            .ok_or_else(|| Error::Validator {
                model: id.to_string(),
                detail: format!("the verdict has no boolean \"passed\": {last}"),
                log: log.to_path_buf(),
            })?;
        Ok(Verdict {
            passed,
            verdict,
            artifact_sha256,
        })
    }
}

impl Drop for Compiler {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = self.rt.block_on(s.close());
        }
    }
}

/// A private directory inside `out` that fetched files land in before they are checked, so a
/// bad fetch never replaces a good artifact.
struct FetchDir {
    path: PathBuf,
}

impl FetchDir {
    fn new(out: &Path, name: &str) -> Result<FetchDir> {
        let path = out.join(format!("{}fetch-{name}", chunker::atomic::TEMP_PREFIX));
        if path.exists() {
            fs::remove_dir_all(&path)?;
        }
        fs::create_dir_all(&path)?;
        Ok(FetchDir { path })
    }

    fn path(&self) -> &Path {
        &self.path
    }

    /// Replace any earlier set of `name` in `out` with the checked files, `.chunkmanifest`
    /// last (it is what makes a set complete to readers).
    fn install(self, out: &Path, name: &str, files: &[String]) -> Result<()> {
        // Retract an older chunk set first: without its `.chunkmanifest` it reads as "not
        // present", so a crash while the rest goes never leaves a manifest over missing chunks.
        let old_manifest = out.join(chunker::chunk_manifest_name(name));
        if chunker::atomic::remove_if_exists(&old_manifest)? {
            chunker::atomic::sync_dir(out)?;
        }
        for entry in fs::read_dir(out)? {
            let entry = entry?;
            let f = entry.file_name().to_string_lossy().into_owned();
            if (f == name || f.starts_with(&format!("{name}."))) && entry.path().is_file() {
                chunker::atomic::remove_if_exists(entry.path())?;
            }
        }
        self.install_files(out, files)
    }

    /// Move `files` into `out` in the given order. The last one (the `.chunkmanifest` of a chunk
    /// set) is renamed only after the renames before it are durable, so that after a power cut
    /// a present chunk manifest always means its chunks are there too.
    fn install_files(self, out: &Path, files: &[String]) -> Result<()> {
        for (i, f) in files.iter().enumerate() {
            let src = self.path.join(f);
            File::open(&src)?.sync_all()?;
            if i + 1 == files.len() && i > 0 {
                chunker::atomic::sync_dir(out)?;
            }
            fs::rename(&src, out.join(f))?;
        }
        chunker::atomic::sync_dir(out)?;
        Ok(())
    }
}

impl Drop for FetchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

fn create_log(log: &Path) -> Result<File> {
    if let Some(dir) = log.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    Ok(File::create(log)?)
}

fn check_sources(sources: &[PathBuf]) -> Result<()> {
    if sources.is_empty() {
        return Err(Error::Source {
            path: PathBuf::from("--source"),
            problem: SourceProblem::NoneGiven,
        });
    }
    let mut names = std::collections::BTreeSet::new();
    for s in sources {
        let meta = fs::metadata(s)?;
        if !meta.is_file() || meta.len() == 0 {
            return Err(Error::Source {
                path: s.clone(),
                problem: SourceProblem::NotANonEmptyFile,
            });
        }
        let name = s.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        if !names.insert(name) {
            return Err(Error::Source {
                path: s.clone(),
                problem: SourceProblem::DuplicateName,
            });
        }
    }
    Ok(())
}

fn check_local_rsync(program: &Path) -> Result<()> {
    let out = Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::RsyncMissing {
            side: Side::Local,
            host: String::new(),
            detail: format!("{}: {e}", program.display()),
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = rsync::parse_version(&text).map_err(|first| Error::RsyncIncompatible {
        side: Side::Local,
        host: String::new(),
        version: first,
        detail: format!(
            "{} did not print an rsync version banner",
            program.display()
        ),
    })?;
    rsync::check_compatible(&v).map_err(|detail| Error::RsyncIncompatible {
        side: Side::Local,
        host: String::new(),
        version: text.lines().next().unwrap_or("").to_string(),
        detail,
    })
}

fn status_text(status: &ExitStatus) -> String {
    match status.code() {
        Some(c) => format!("exit code {c}"),
        None => "a signal".to_string(),
    }
}

/// Whether ssh's own words say it refused the server's host key (unknown or changed).
fn is_host_key_refusal(detail: &str) -> bool {
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

fn connect_detail(e: &openssh::Error) -> String {
    use std::error::Error as _;
    match e.source() {
        Some(s) => format!(" ({s})"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Source problems are typed (callers match on them) and render what they rendered as
    /// `Error::Pin` before, path first.
    #[test]
    fn source_problems_are_typed_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.onnx");
        fs::write(&empty, b"").unwrap();
        let a = dir.path().join("a").join("m.onnx");
        let b = dir.path().join("b").join("m.onnx");
        for p in [&a, &b] {
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, b"onnx").unwrap();
        }
        let cases: [(Vec<PathBuf>, SourceProblem, &str); 3] = [
            (
                vec![],
                SourceProblem::NoneGiven,
                "--source: no source files given",
            ),
            (
                vec![empty.clone()],
                SourceProblem::NotANonEmptyFile,
                "empty.onnx: not a non-empty file",
            ),
            (
                vec![a.clone(), b.clone()],
                SourceProblem::DuplicateName,
                "m.onnx: two sources share this file name",
            ),
        ];
        for (sources, want, text) in cases {
            let err = check_sources(&sources).unwrap_err();
            assert!(
                matches!(&err, Error::Source { problem, .. } if *problem == want),
                "{err:?}"
            );
            assert!(err.to_string().contains(text), "{err}");
        }
        check_sources(std::slice::from_ref(&a)).unwrap();
        // A source that is not there: fs-err's message names the path.
        let missing = dir.path().join("gone.onnx");
        let err = check_sources(&[a, missing.clone()]).unwrap_err();
        assert!(matches!(err, Error::Io(_)), "{err:?}");
        assert!(
            err.to_string().contains(&missing.display().to_string()),
            "{err}"
        );
    }
}
