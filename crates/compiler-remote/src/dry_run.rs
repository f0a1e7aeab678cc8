//! What `sync`, `compile`, `build_dm` and `validate` would do, worked out without connecting to
//! the compiler: the checks the real run makes before and besides talking to it (the
//! one-compiler policy, the local rsync, a host key already in known_hosts, the openpilot tree,
//! the sources, the chunk set to validate) and then the plan: each command the comma would run,
//! each rsync transfer, each local file written or replaced.
//!
//! Nothing here writes a file or opens a connection. What only the comma can tell is not
//! checked: whether its host key matches the pinned one, its rsync, its tinygrad marker (the
//! plan's first step says what it must be).

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use manifest::{BehaviorVersion, GitCommit, ModelId};
use serde::Serialize;

use crate::compiler::checks::{check_sources, check_tree, release_set_to_validate};
use crate::compiler::fetch::earlier_set;
use crate::compiler::{ConnectOptions, check_local_rsync};
use crate::error::{Error, Result};
use crate::outputs::FetchedArtifact;
use crate::plan::{self, CompileRequest};
use crate::target::RemotePath;

/// One thing a run would do on the compiler, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// Read the compiler's tinygrad marker; anything but `expected` refuses the run.
    CheckMarker { path: String, expected: String },
    /// A command line run on the compiler.
    Run { command: String },
    /// An rsync transfer from this machine to the compiler.
    Send {
        from: Vec<PathBuf>,
        to: String,
        options: Vec<String>,
    },
    /// An rsync transfer from the compiler to this machine (into a private directory first;
    /// moved into place only once checked).
    Fetch {
        from: String,
        to: PathBuf,
        options: Vec<String>,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::CheckMarker { path, expected } => {
                write!(f, "check  {path} must be {expected}")
            }
            Step::Run { command } => write!(f, "run    {command}"),
            Step::Send { from, to, options } => {
                let from: Vec<String> = from.iter().map(|p| p.display().to_string()).collect();
                write!(
                    f,
                    "send   {} -> {to} (rsync {})",
                    from.join(" "),
                    options.join(" ")
                )
            }
            Step::Fetch { from, to, options } => write!(
                f,
                "fetch  {from} -> {} (rsync {})",
                to.display(),
                options.join(" ")
            ),
        }
    }
}

/// What a run would do: its steps on the compiler and the local files it would write or remove.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub destination: String,
    pub remote_root: String,
    /// The pin the compiler's marker must equal.
    pub tinygrad_commit: String,
    pub steps: Vec<Step>,
    /// Local files that would be written (created or replaced). A name ending in `*` stands for
    /// files whose number only the build decides (`NAME.chunk*`).
    pub writes: Vec<PathBuf>,
    /// Local files that exist now and would be removed (an earlier set of the same artifact).
    pub removes: Vec<PathBuf>,
}

impl Plan {
    fn new(opts: &ConnectOptions, pin: &GitCommit) -> Plan {
        Plan {
            destination: opts.destination.to_string(),
            remote_root: opts.remote_root.to_string(),
            tinygrad_commit: pin.to_string(),
            steps: Vec::new(),
            writes: Vec::new(),
            removes: Vec::new(),
        }
    }

    fn remote(&self, path: &RemotePath, trailing_slash: bool) -> String {
        let slash = if trailing_slash { "/" } else { "" };
        format!("{}:{path}{slash}", self.destination)
    }

    fn check_marker(&mut self, opts: &ConnectOptions) -> Result<()> {
        self.steps.push(Step::CheckMarker {
            path: opts.remote_root.join(plan::MARKER)?.to_string(),
            expected: self.tinygrad_commit.clone(),
        });
        Ok(())
    }

    fn run(&mut self, command: String) {
        self.steps.push(Step::Run { command });
    }
}

/// The checks [`crate::Compiler::connect`] makes before the network, and one it leaves to ssh:
/// the one-compiler policy, the local rsync, and a key for the compiler in known_hosts.
pub fn check_before_connect(opts: &ConnectOptions) -> Result<()> {
    opts.destination.check_policy(opts.allow_other_compiler)?;
    check_local_rsync(&opts.rsync)?;
    check_host_key_known(opts)
}

/// Refuse, as the connection would, when no known_hosts file has a key for the compiler. ssh's
/// effective configuration comes from `ssh -G` (which reads it and connects nowhere), the
/// lookup from `ssh-keygen -F`. Whether the key matches only a connection can tell.
pub fn check_host_key_known(opts: &ConnectOptions) -> Result<()> {
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

/// `sync`: the tree check, then its `mkdir`, its four transfers and the marker check.
pub fn sync(opts: &ConnectOptions, openpilot: &Path, pin: &GitCommit) -> Result<Plan> {
    check_before_connect(opts)?;
    check_tree(openpilot)?;
    let root = &opts.remote_root;
    let mut p = Plan::new(opts, pin);
    p.run(plan::sync_mkdir_command(root)?);
    for part in plan::SYNC_PARTS {
        let slash = if part.is_dir { "/" } else { "" };
        let mut from = openpilot.join(part.rel).into_os_string();
        from.push(slash);
        let to = p.remote(&root.join(part.rel)?, part.is_dir);
        p.steps.push(Step::Send {
            from: vec![from.into()],
            to,
            options: part.options.iter().map(|o| o.to_string()).collect(),
        });
    }
    p.check_marker(opts)?;
    p.writes.push(crate::synced::record_path(openpilot));
    Ok(p)
}

/// `compile`: the checks, then what [`compile_plan`] lists.
pub fn compile(
    opts: &ConnectOptions,
    req: &CompileRequest,
    sources: &[PathBuf],
    pin: &GitCommit,
    out: &Path,
    log: &Path,
) -> Result<Plan> {
    check_before_connect(opts)?;
    check_sources(sources)?;
    compile_plan(opts, req, sources, pin, out, log)
}

/// One compile's steps and local writes, without checks (a rebuild plans models whose sources
/// it has not fetched yet).
pub fn compile_plan(
    opts: &ConnectOptions,
    req: &CompileRequest,
    sources: &[PathBuf],
    pin: &GitCommit,
    out: &Path,
    log: &Path,
) -> Result<Plan> {
    let staging = opts.remote_root.join(plan::STAGING_DIR)?;
    let remote_out = opts.remote_root.join(plan::OUTPUT_DIR)?;
    let name = req.artifact_name();
    let mut p = Plan::new(opts, pin);
    p.check_marker(opts)?;
    p.run(plan::prepare_command(&staging, &remote_out, &name));
    p.steps.push(Step::Send {
        from: sources.to_vec(),
        to: p.remote(&staging, true),
        options: plan::SEND_OPTIONS.iter().map(|o| o.to_string()).collect(),
    });
    p.run(plan::run_models_command(
        &opts.remote_root,
        &req.models_args(&staging, &remote_out),
    ));
    p.steps.push(Step::Fetch {
        from: p.remote(&remote_out, true),
        to: out.join(format!("{}fetch-{name}", chunker::atomic::TEMP_PREFIX)),
        options: plan::fetch_options(&name),
    });
    p.run(plan::cleanup_command(&staging, &remote_out, &name));
    p.writes.push(log.to_path_buf());
    if req.local {
        p.writes.push(out.join(&name));
    } else {
        p.writes.push(out.join(format!("{name}.chunk*")));
        p.writes.push(out.join(chunker::sidecar_name(&name)));
        p.writes.push(out.join(chunker::chunk_manifest_name(&name)));
    }
    if out.is_dir() {
        p.removes = earlier_set(out, &name)?;
    }
    Ok(p)
}

/// `dm`: the checks, then the DM build's steps and the four files it would write.
pub fn dm(
    opts: &ConnectOptions,
    sources: &[PathBuf],
    pin: &GitCommit,
    remote_dm_out: &RemotePath,
    out: &Path,
    log: &Path,
) -> Result<Plan> {
    check_before_connect(opts)?;
    check_sources(sources)?;
    let staging = opts.remote_root.join(plan::STAGING_DIR)?;
    let mut p = Plan::new(opts, pin);
    p.check_marker(opts)?;
    p.run(plan::dm_prepare_command(&staging, remote_dm_out)?);
    p.steps.push(Step::Send {
        from: sources.to_vec(),
        to: p.remote(&staging, true),
        options: plan::SEND_OPTIONS.iter().map(|o| o.to_string()).collect(),
    });
    p.run(plan::run_models_command(
        &opts.remote_root,
        &plan::dm_args(&staging, remote_dm_out),
    ));
    p.steps.push(Step::Fetch {
        from: p.remote(remote_dm_out, true),
        to: out.join(format!("{}fetch-dm", chunker::atomic::TEMP_PREFIX)),
        options: plan::dm_fetch_options(),
    });
    p.run(plan::dm_cleanup_command(&staging, remote_dm_out)?);
    p.writes.push(log.to_path_buf());
    p.writes.extend(plan::DM_FILES.iter().map(|f| out.join(f)));
    Ok(p)
}

/// `validate`: the checks (including the chunk set at `artifact`, verified as the real run
/// verifies it), then the validator's steps. Returns the plan and the verified chunk set.
#[allow(clippy::too_many_arguments)]
pub fn validate(
    opts: &ConnectOptions,
    id: &ModelId,
    version: BehaviorVersion,
    artifact: &Path,
    pin: &GitCommit,
    models_dir: &RemotePath,
    python: &str,
    log: &Path,
) -> Result<(Plan, FetchedArtifact)> {
    check_before_connect(opts)?;
    let (dir, name, set) = release_set_to_validate(id, artifact, log)?;
    let mut p = Plan::new(opts, pin);
    p.check_marker(opts)?;
    p.run(plan::validate_prepare_command(models_dir, &name));
    p.steps.push(Step::Send {
        from: set.files.iter().map(|f| dir.join(f)).collect(),
        to: p.remote(models_dir, true),
        options: plan::SEND_OPTIONS.iter().map(|o| o.to_string()).collect(),
    });
    p.run(plan::validate_command(
        &opts.remote_root,
        python,
        id,
        version,
    ));
    p.run(plan::validate_cleanup_command(models_dir, &name));
    p.writes.push(log.to_path_buf());
    Ok((p, set))
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

    fn opts() -> ConnectOptions {
        ConnectOptions::default()
    }

    #[test]
    fn a_compile_plan_lists_the_real_runs_commands_and_files() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        fs_err::create_dir_all(&out).unwrap();
        fs_err::write(out.join("pop223_driving_tinygrad.pkl.chunk01of02"), b"old").unwrap();
        fs_err::write(out.join("other_driving_tinygrad.pkl.chunk01of01"), b"x").unwrap();
        let req = CompileRequest {
            id: "pop223".parse().unwrap(),
            version: "v16".parse().unwrap(),
            gpu: false,
            input_format: plan::InputFormat::Supercombo,
            local: false,
        };
        let pin: GitCommit = "e837e367aac9e1a66e689f4f32ce20ca9367df13".parse().unwrap();
        let p = compile_plan(
            &opts(),
            &req,
            &[PathBuf::from("src/driving_supercombo.onnx")],
            &pin,
            &out,
            Path::new("logs/pop223.log"),
        )
        .unwrap();
        let lines: Vec<String> = p.steps.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            lines[0],
            "check  /data/openpilot/tinygrad_repo/TINYGRAD_COMMIT must be \
             e837e367aac9e1a66e689f4f32ce20ca9367df13"
        );
        assert!(lines[1].starts_with("run    rm -rf /data/openpilot/uncompiledmodels"));
        assert_eq!(
            lines[2],
            "send   src/driving_supercombo.onnx -> \
             comma@192.168.3.110:/data/openpilot/uncompiledmodels/ (rsync -a)"
        );
        assert!(
            lines[3].contains("./models --pop223 --version v16"),
            "{}",
            lines[3]
        );
        assert!(
            lines[4].starts_with("fetch  comma@192.168.3.110:/data/openpilot/compiledmodels/ -> ")
        );
        assert!(lines[4].ends_with(
            "(rsync -a --include=pop223_driving_tinygrad.pkl \
             --include=pop223_driving_tinygrad.pkl.* --exclude=*)"
        ));
        assert_eq!(lines.len(), 6);
        assert_eq!(p.writes[0], Path::new("logs/pop223.log"));
        assert_eq!(
            p.removes,
            [out.join("pop223_driving_tinygrad.pkl.chunk01of02")]
        );
    }
}
