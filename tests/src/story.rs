//! The main job, end to end, with the real binaries: build stand-in artifacts and chunk them,
//! publish generation v25 to a local store and a local git `Models` branch, serve the store on
//! 127.0.0.1, prepare a device data dir that looks like a v24 device, run
//! `device-modeld-manager refresh` against it, and report what changed.
//!
//! `cargo xtask demo` prints the report; the workspace integration tests assert on it, including
//! the failure versions (Hugging Face down, selected model missing from v25).
//!
//! Everything runs as child processes (`release-cli`, `device-modeld-manager`, `git`) on real
//! files and a real HTTP server; nothing is mocked. The only stand-ins are the artifact bytes
//! (deterministic pseudo-random, not real tinygrad pickles, which only modeld looks into).

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Instant;

use manifest::layout::{self, DM_FILES};
use manifest::{Artifact, ArtifactSize, ChunkCount, Manifest, ModelId, Sha256Digest};

/// The real v25 catalog; the story publishes a few of its models.
const CATALOG: &str =
    include_str!("../../crates/manifest/tests/fixtures/model_names_v25.catalog.json");

/// The generation the device moves from.
pub const OLD_GENERATION: &str = "v24";
/// The generation published.
pub const NEW_GENERATION: &str = "v25";
/// A `local-` model built on the device; never touched.
pub const LOCAL_MODEL: &str = "local-mine";

pub type Result<T, E = String> = std::result::Result<T, E>;

/// Set to a `device-modeld-manager` built elsewhere (e.g. the aarch64 one from
/// `cargo xtask dist`) to play the story with it instead of `target/<profile>`'s.
pub const DEVICE_BIN_ENV: &str = "STARPILOT_DEVICE_BIN";
/// Set to a program that runs the device binary, e.g. `/usr/bin/qemu-aarch64-static`: the story
/// then runs `RUNNER DEVICE_BIN ARGS…` (qemu-user reads `QEMU_LD_PREFIX` and `QEMU_CPU` from
/// the environment, which the child inherits).
pub const DEVICE_RUNNER_ENV: &str = "STARPILOT_DEVICE_RUNNER";

/// Where the two binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub release_cli: PathBuf,
    pub device_manager: PathBuf,
    /// Runs `device_manager` (an emulator) when set.
    pub device_runner: Option<PathBuf>,
}

impl Binaries {
    /// The binaries of this workspace's `target/<profile>` directory (honouring
    /// `CARGO_TARGET_DIR`), refused when missing or stale (see [`crate::binaries`]).
    /// `cargo xtask demo` builds them first. [`DEVICE_BIN_ENV`] and [`DEVICE_RUNNER_ENV`] swap in
    /// another device binary (`cargo xtask dist --test` plays the story with the aarch64 one
    /// under qemu).
    pub fn in_target_dir(profile: &str) -> Result<Self> {
        let target = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(t) => PathBuf::from(t),
            None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        };
        Self::in_dir(&target.join(profile))
    }

    /// The binaries next to the running test executable (`target/<profile>/`, where the same
    /// `cargo test` invocation put them), refused when missing or older than their sources.
    pub fn next_to_test_executable() -> Result<Self> {
        Self::in_dir(&crate::binaries::profile_dir_of_current_exe()?)
    }

    fn in_dir(dir: &Path) -> Result<Self> {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap_or(Path::new(".."));
        let mut bins = Self {
            release_cli: dir.join("release-cli"),
            device_manager: dir.join("device-modeld-manager"),
            device_runner: None,
        };
        crate::binaries::check(
            &bins.release_cli,
            workspace,
            &workspace.join("bins/release-cli"),
        )?;
        let swapped = std::env::var_os(DEVICE_BIN_ENV).is_some_and(|v| !v.is_empty());
        if !swapped {
            crate::binaries::check(
                &bins.device_manager,
                workspace,
                &workspace.join("bins/device-modeld-manager"),
            )?;
        }
        if let Some(dev) = std::env::var_os(DEVICE_BIN_ENV).filter(|v| !v.is_empty()) {
            bins.device_manager = PathBuf::from(dev);
            bins.device_runner = std::env::var_os(DEVICE_RUNNER_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from);
            for b in std::iter::once(&bins.device_manager).chain(&bins.device_runner) {
                if !b.is_file() {
                    return Err(format!(
                        "{} (from {DEVICE_BIN_ENV}/{DEVICE_RUNNER_ENV}) is not a file",
                        b.display()
                    ));
                }
            }
            eprintln!("story: device binary {}", bins.describe_device());
        }
        Ok(bins)
    }

    /// A command that runs the device binary (through its runner, if any).
    pub fn device_command(&self) -> Command {
        match &self.device_runner {
            Some(runner) => {
                let mut c = Command::new(runner);
                c.arg(&self.device_manager);
                c
            }
            None => Command::new(&self.device_manager),
        }
    }

    /// `BIN` or `RUNNER BIN`, for messages.
    pub fn describe_device(&self) -> String {
        match &self.device_runner {
            Some(r) => format!("{} {}", r.display(), self.device_manager.display()),
            None => self.device_manager.display().to_string(),
        }
    }
}

/// What to play.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Models published in v25 (IDs from the real catalog) with their stand-in artifact sizes.
    pub published: Vec<(&'static str, usize)>,
    /// The device's selected model, also published unless `selected_missing`.
    pub selected: &'static str,
    /// Leave the selected model out of v25: the device must fall back to the built-in.
    pub selected_missing: bool,
    /// Hugging Face refuses connections: the device must use GitHub.
    pub hf_down: bool,
    /// Chunk size for the stand-in artifacts (small, so that every model has several chunks).
    pub chunk_size: u64,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            published: vec![
                ("pop223", 300_000),
                ("gwm8223", 200_000),
                ("tr16223", 120_000),
            ],
            selected: "pop223",
            selected_missing: false,
            hf_down: false,
            chunk_size: 64 * 1024,
        }
    }
}

/// One request logged by `release-cli serve -v`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The URL path, e.g. `/buckets/NS/NAME/resolve/models/v25/pop223/…`.
    pub target: String,
    pub status: u16,
}

impl Request {
    /// The store path asked for, with the layout's prefix removed: the Hugging Face layout's
    /// paths as they are, the GitHub layout's as stored on the branch.
    pub fn path(&self) -> &str {
        let hf = format!("/buckets/{}/resolve/", layout::HF_BUCKET);
        let gh = format!("/{}/{}/", layout::GITHUB_REPO, layout::GITHUB_BRANCH);
        self.target
            .strip_prefix(&hf)
            .or_else(|| self.target.strip_prefix(&gh))
            .unwrap_or(&self.target)
    }

    /// Whether the path is one of the generation's own: its manifest or its artifact directory.
    /// The v25 downloader must never ask for anything else (no unversioned, no v24 path).
    pub fn is_generation_path(&self, generation: &str) -> bool {
        let p = self.path();
        p == format!("manifests/model_names_{generation}.json")
            || p == format!("model_names_{generation}.json")
            || p.starts_with(&format!("models/{generation}/"))
            || p.starts_with(&format!("{generation}/"))
    }

    pub fn is_github(&self) -> bool {
        self.target
            .starts_with(&format!("/{}/", layout::GITHUB_REPO))
    }
}

/// What happened, for the demo's report and the tests' assertions.
#[derive(Debug, Clone)]
pub struct Report {
    pub work: PathBuf,
    /// `name -> sha256` of every file in `<data>/models` before and after the refresh.
    pub before: BTreeMap<String, String>,
    pub after: BTreeMap<String, String>,
    pub params_before: BTreeMap<String, String>,
    pub params_after: BTreeMap<String, String>,
    /// What `device-modeld-manager resolve` printed last: the file modeld should load.
    pub resolved: PathBuf,
    /// `refresh --json`.
    pub refresh: serde_json::Value,
    /// The published v25 manifest.
    pub manifest: Manifest,
    /// Commit subjects on the GitHub origin's `Models` branch, oldest first.
    pub github_commits: Vec<String>,
    /// Every request the device made to the mirror, in order, from `release-cli serve -v`.
    pub requests: Vec<Request>,
    /// The origin URLs the device was given.
    pub hf_base: String,
    pub github_base: String,
    pub builtin_dir: PathBuf,
    pub models_dir: PathBuf,
    pub seconds: f64,
}

impl Report {
    pub fn deleted(&self) -> Vec<&str> {
        names(self.before.keys().filter(|n| !self.after.contains_key(*n)))
    }

    pub fn kept(&self) -> Vec<&str> {
        names(
            self.before
                .iter()
                .filter(|(n, d)| self.after.get(*n) == Some(d))
                .map(|(n, _)| n),
        )
    }

    /// New files, and files whose content was replaced (the manager's own dotfiles aside).
    pub fn downloaded(&self) -> Vec<&str> {
        names(
            self.after
                .iter()
                .filter(|(n, d)| !n.starts_with('.') && self.before.get(*n) != Some(d))
                .map(|(n, _)| n),
        )
    }

    /// The manager's own state files (catalog cache, lock, verification cache).
    pub fn manager_state(&self) -> Vec<&str> {
        names(self.after.keys().filter(|n| n.starts_with('.')))
    }

    pub fn selected_after(&self) -> Option<&str> {
        self.params_after.get("Model").map(String::as_str)
    }
}

fn names<'a>(it: impl Iterator<Item = &'a String>) -> Vec<&'a str> {
    it.map(String::as_str).collect()
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |f: &mut fmt::Formatter<'_>, title: &str, items: Vec<&str>| {
            writeln!(f, "  {title} ({}):", items.len())?;
            if items.is_empty() {
                writeln!(f, "    (none)")?;
            }
            for i in items {
                writeln!(f, "    {i}")?;
            }
            Ok(())
        };
        let p =
            |m: &BTreeMap<String, String>, k: &str| m.get(k).cloned().unwrap_or("(unset)".into());
        writeln!(
            f,
            "device {} after `device-modeld-manager refresh`:",
            self.models_dir.display()
        )?;
        list(f, "deleted", self.deleted())?;
        list(f, "kept", self.kept())?;
        list(f, "downloaded", self.downloaded())?;
        list(f, "manager state", self.manager_state())?;
        writeln!(
            f,
            "  manifest from: {}",
            self.refresh["manifest_origin"].as_str().unwrap_or("?")
        )?;
        writeln!(
            f,
            "  generation:    {} -> {}",
            p(&self.params_before, "ModelManifestVersion"),
            p(&self.params_after, "ModelManifestVersion")
        )?;
        writeln!(
            f,
            "  selected:      {} -> {} ({})",
            p(&self.params_before, "Model"),
            p(&self.params_after, "Model"),
            p(&self.params_after, "DrivingModelName")
        )?;
        writeln!(
            f,
            "  profiles:      small {} -> {}, big {}",
            p(&self.params_before, "ActiveSmallModel"),
            p(&self.params_after, "ActiveSmallModel"),
            p(&self.params_after, "ActiveBigModel")
        )?;
        writeln!(f, "  modeld loads:  {}", self.resolved.display())?;
        let stray = self
            .requests
            .iter()
            .filter(|r| !r.is_generation_path(NEW_GENERATION))
            .count();
        writeln!(
            f,
            "  requests the device made to the mirror ({}; outside the {NEW_GENERATION} paths: {stray}):",
            self.requests.len()
        )?;
        for r in &self.requests {
            let origin = if r.is_github() { "GitHub" } else { "HF" };
            writeln!(
                f,
                "    {:<4} {:<6} {} {}",
                r.method,
                origin,
                r.status,
                r.path()
            )?;
        }
        Ok(())
    }
}

/// Kills a child process when dropped, so a failed step never leaves a server running.
pub(crate) struct Running(pub(crate) Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Play `scenario` in the empty directory `work`. Prints each step to stderr when `narrate`.
pub fn play(bins: &Binaries, scenario: &Scenario, work: &Path, narrate: bool) -> Result<Report> {
    let start = Instant::now();
    let say = |s: String| {
        if narrate {
            eprintln!("{s}");
        }
    };
    fs::create_dir_all(work).map_err(|e| format!("{}: {e}", work.display()))?;

    say("1. build stand-in artifacts and chunk them (release-cli chunk split)".into());
    let ready = work.join("ready");
    let mut published = Vec::new();
    for (i, (id, size)) in scenario.published.iter().enumerate() {
        if scenario.selected_missing && *id == scenario.selected {
            continue;
        }
        let split = build_chunk_set(
            bins,
            work,
            &ready,
            id,
            *size,
            1000 + i as u64,
            scenario.chunk_size,
        )?;
        say(format!(
            "   {id}: {} bytes, {} chunks, sha256 {}",
            split.size,
            split.chunks.len(),
            split.sha256
        ));
        published.push((model_id(id)?, split));
    }
    let manifest = v25_manifest(&published)?;
    let manifest_path = ready.join(format!("model_names_{NEW_GENERATION}.json"));
    fs::write(&manifest_path, manifest.to_canonical_bytes()).map_err(|e| e.to_string())?;

    say("2. publish v25 to a local store and a git Models branch (release-cli publish)".into());
    let store = work.join("store");
    let origin = work.join("github-origin.git");
    let checkout = work.join("models-checkout");
    init_models_branch(&origin, &checkout)?;
    run(Command::new(&bins.release_cli)
        .args(["publish", "--generation", NEW_GENERATION, "--manifest"])
        .arg(&manifest_path)
        .arg("--artifacts")
        .arg(&ready)
        .arg("--to")
        .arg(&store)
        .arg("--to")
        .arg(format!("github:{}", checkout.display()))
        // The local store is this story's Hub: it goes first, and GitHub is never ahead of it.
        .arg("--hub")
        .arg(&store)
        // Stand-in bytes that never ran on a device: the story is about delivery and migration,
        // and says so in the publish record instead of faking validation records.
        .args([
            "--skip-validation",
            "end-to-end story: stand-in artifacts, no device validation",
        ])
        .envs(git_identity()))?;
    let github_commits = git(&origin, &["log", "--reverse", "--format=%s", "Models"])?
        .lines()
        .map(str::to_string)
        .collect();

    say("3. serve the store on 127.0.0.1 (release-cli serve)".into());
    let serve_log = work.join("serve.log");
    let (server, url) = serve(bins, &store, &serve_log)?;
    let hf_base = if scenario.hf_down {
        format!(
            "{}/buckets/{}/resolve",
            closed_port_url()?,
            layout::HF_BUCKET
        )
    } else {
        format!("{url}/buckets/{}/resolve", layout::HF_BUCKET)
    };
    let github_base = format!("{url}/{}/{}", layout::GITHUB_REPO, layout::GITHUB_BRANCH);
    say(format!("   Hugging Face layout: {hf_base}"));
    say(format!("   GitHub layout:       {github_base}"));

    say("4. prepare a device that looks like a v24 device".into());
    let device = work.join("device");
    let data = device.join("data");
    let models_dir = data.join("models");
    // The openpilot checkout the device runs: its tinygrad is v25's pin, which decides the
    // generation; the built-in model is where the checkout keeps it.
    let openpilot = device.join("openpilot");
    let builtin_dir = openpilot.join("selfdrive/modeld/models");
    prepare_openpilot_tree(&openpilot)?;
    prepare_v24_device(bins, scenario, &data, &builtin_dir)?;
    let before = digests(&models_dir)?;
    let params_before = params(&data)?;

    say(format!(
        "5. device-modeld-manager refresh ({})",
        bins.describe_device()
    ));
    let manager = |args: &[&str]| {
        // As the documented service entry runs it: no --generation, no --builtin-dir; the tree
        // decides both.
        let mut c = bins.device_command();
        c.arg("--data-dir")
            .arg(&data)
            .arg("--memory-params-dir")
            .arg(device.join("shm/params/d"))
            .arg("--openpilot-dir")
            .arg(&openpilot)
            .args(["--hf-base", &hf_base, "--github-base", &github_base])
            .args(args);
        c
    };
    let out = run(&mut manager(&["refresh", "--json"]))?;
    let refresh: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "refresh --json printed no JSON ({e}): {}",
            text(&out.stdout)
        )
    })?;
    let out = run(&mut manager(&["resolve"]))?;
    let resolved = PathBuf::from(
        text(&out.stdout)
            .lines()
            .last()
            .ok_or("resolve printed nothing")?
            .trim(),
    );
    drop(server);
    let requests = parse_serve_log(&serve_log)?;

    Ok(Report {
        work: work.to_path_buf(),
        after: digests(&models_dir)?,
        params_after: params(&data)?,
        before,
        params_before,
        resolved,
        refresh,
        manifest,
        github_commits,
        requests,
        hf_base,
        github_base,
        builtin_dir,
        models_dir,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// What `release-cli chunk split --json` reported.
#[derive(Debug, Clone)]
pub struct Split {
    pub size: u64,
    pub sha256: Sha256Digest,
    pub chunks: Vec<Sha256Digest>,
}

pub(crate) fn build_chunk_set(
    bins: &Binaries,
    work: &Path,
    ready: &Path,
    id: &str,
    size: usize,
    seed: u64,
    chunk_size: u64,
) -> Result<Split> {
    let build = work.join("build");
    fs::create_dir_all(&build).map_err(|e| e.to_string())?;
    let full = build.join(format!("{id}{}", layout::ARTIFACT_SUFFIX));
    fs::write(&full, stand_in_bytes(seed, size)).map_err(|e| e.to_string())?;
    let out = run(Command::new(&bins.release_cli)
        .args(["chunk", "split"])
        .arg(&full)
        .arg("--out-dir")
        .arg(ready.join(id))
        .args(["--chunk-size", &chunk_size.to_string(), "--json"]))?;
    // Release builds keep only the chunk set (docs/formats.md, "Chunk sets").
    fs::remove_file(&full).map_err(|e| e.to_string())?;
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("chunk split --json: {e}"))?;
    let digest = |v: &serde_json::Value| -> Result<Sha256Digest> {
        v.as_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("chunk split --json: bad sha256 {v}"))
    };
    Ok(Split {
        size: v["size"].as_u64().ok_or("chunk split --json: no size")?,
        sha256: digest(&v["sha256"])?,
        chunks: v["chunks"]
            .as_array()
            .ok_or("chunk split --json: no chunks")?
            .iter()
            .map(|c| digest(&c["sha256"]))
            .collect::<Result<_>>()?,
    })
}

/// The v25 manifest: the real catalog's entries for the published models, with their artifact
/// fields (and without the Chestnut variants the story does not build), the generation and the
/// tinygrad pin.
fn v25_manifest(published: &[(ModelId, Split)]) -> Result<Manifest> {
    let mut m = Manifest::from_slice(CATALOG.as_bytes()).map_err(|e| e.to_string())?;
    let all: Vec<ModelId> = m.ids().cloned().collect();
    for id in all {
        if !published.iter().any(|(p, _)| *p == id) {
            m.remove(&id);
        }
    }
    for (id, split) in published {
        let entry = m
            .get_mut(id)
            .ok_or_else(|| format!("{id} is not in the v25 catalog"))?;
        let artifact = Artifact::tinygrad(
            ArtifactSize::new(split.size).map_err(|e| e.to_string())?,
            split.sha256,
            ChunkCount::new(split.chunks.len() as u64).map_err(|e| e.to_string())?,
        );
        entry
            .set_artifact_with_chunks(&artifact, &split.chunks)
            .map_err(|e| e.to_string())?;
        // The story builds no Chestnut variant, so its manifest names none: publish refuses a
        // variant whose files are in neither the artifacts nor the store.
        entry
            .remove("accelerator_artifacts")
            .map_err(|e| e.to_string())?;
    }
    m.set_generation(NEW_GENERATION.parse().map_err(|e| format!("{e}"))?);
    m.set_tinygrad_commit(&layout::current_tinygrad_commit());
    Ok(m)
}

/// Deterministic, incompressible stand-in bytes (at least 11), shaped as a real driving
/// artifact: an out-of-band pickle container (8-byte LE opcode length, a protocol-5 opcode
/// stream ending in STOP, then (8-byte LE length, buffer) records tiling the rest), so that
/// `publish`'s OOB check passes as it does for real builds.
pub fn stand_in_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    let opcodes = if len >= 25 { 9 } else { len - 8 };
    out[..8].copy_from_slice(&chunker::oob::length_prefix(opcodes as u64));
    out[8] = 0x80;
    out[9] = 5;
    out[8 + opcodes - 1] = b'.';
    let mut pos = 8 + opcodes;
    while pos < len {
        let left = len - pos;
        let mut n = (left - 8).min(4096);
        if (1..8).contains(&(left - 8 - n)) {
            n = left - 8;
        }
        out[pos..pos + 8].copy_from_slice(&chunker::oob::length_prefix(n as u64));
        pos += 8 + n;
    }
    out
}

pub(crate) fn git_identity() -> [(&'static str, &'static str); 4] {
    [
        ("GIT_AUTHOR_NAME", "StarPilot release"),
        ("GIT_AUTHOR_EMAIL", "release@localhost"),
        ("GIT_COMMITTER_NAME", "StarPilot release"),
        ("GIT_COMMITTER_EMAIL", "release@localhost"),
    ]
}

pub(crate) fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let out = run(Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .envs(git_identity()))?;
    Ok(text(&out.stdout))
}

/// A bare repository standing in for GitHub, with a `Models` branch, and a checkout of it.
pub(crate) fn init_models_branch(origin: &Path, checkout: &Path) -> Result<()> {
    let parent = origin.parent().ok_or("origin has no parent")?;
    git(
        parent,
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            layout::GITHUB_BRANCH,
            &origin.to_string_lossy(),
        ],
    )?;
    git(
        parent,
        &[
            "init",
            "-q",
            "-b",
            layout::GITHUB_BRANCH,
            &checkout.to_string_lossy(),
        ],
    )?;
    fs::write(
        checkout.join("README.md"),
        "StarPilot model artifacts (Models branch)\n",
    )
    .map_err(|e| e.to_string())?;
    git(checkout, &["add", "README.md"])?;
    git(checkout, &["commit", "-q", "-m", "Models branch"])?;
    git(
        checkout,
        &["remote", "add", "origin", &origin.to_string_lossy()],
    )?;
    git(
        checkout,
        &["push", "-q", "-u", "origin", layout::GITHUB_BRANCH],
    )?;
    Ok(())
}

/// Start `release-cli serve -v` on a free loopback port, logging requests to `log`; its first
/// stdout line is the base URL.
pub(crate) fn serve(bins: &Binaries, store: &Path, log: &Path) -> Result<(Running, String)> {
    let log = fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut child = Command::new(&bins.release_cli)
        .arg("serve")
        .arg("--store")
        .arg(store)
        .args(["--addr", "127.0.0.1:0", "--verbose"])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|e| format!("cannot start release-cli serve: {e}"))?;
    let stdout = child.stdout.take().ok_or("serve has no stdout")?;
    let running = Running(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let url = line.trim().trim_end_matches('/').to_string();
    if !url.starts_with("http://127.0.0.1:") {
        return Err(format!("release-cli serve printed {line:?}, not its URL"));
    }
    Ok((running, url))
}

/// The requests in a `release-cli serve -v` log (`… method=GET target=/… status=200 …`).
pub(crate) fn parse_serve_log(log: &Path) -> Result<Vec<Request>> {
    let text = fs::read_to_string(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let field = |line: &str, key: &str| -> Option<String> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key).map(str::to_string))
    };
    Ok(text
        .lines()
        .filter_map(|line| {
            Some(Request {
                method: field(line, "method=")?,
                target: field(line, "target=")?,
                status: field(line, "status=")?.parse().ok()?,
            })
        })
        .collect())
}

/// A URL on a loopback port nobody listens on: connections are refused, as when a host is down.
fn closed_port_url() -> Result<String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = l.local_addr().map_err(|e| e.to_string())?.port();
    drop(l);
    Ok(format!("http://127.0.0.1:{port}"))
}

/// The openpilot checkout's `tinygrad_repo/TINYGRAD_COMMIT` at the new generation's pin, as
/// `release-cli tinygrad bump` leaves it.
fn prepare_openpilot_tree(openpilot: &Path) -> Result<()> {
    let generation: manifest::Generation = NEW_GENERATION.parse().map_err(|e| format!("{e}"))?;
    let pin = manifest::PinTable::builtin()
        .get(generation)
        .cloned()
        .ok_or_else(|| format!("no built-in tinygrad pin for {NEW_GENERATION}"))?;
    let marker = openpilot.join("tinygrad_repo/TINYGRAD_COMMIT");
    fs::create_dir_all(marker.parent().unwrap())
        .map_err(|e| format!("{}: {e}", marker.display()))?;
    fs::write(&marker, format!("{pin}\n")).map_err(|e| format!("{}: {e}", marker.display()))
}

/// A v24 device: the selected model as a plain PKL, another as legacy `.pNN` parts, a third as
/// a chunk set, a `local-` model, the DM set, and a built-in RDF V4 chunk set.
fn prepare_v24_device(
    bins: &Binaries,
    scenario: &Scenario,
    data: &Path,
    builtin_dir: &Path,
) -> Result<()> {
    let models = data.join("models");
    let params = data.join("params/d");
    for d in [&models, &params, builtin_dir] {
        fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let write = |path: PathBuf, bytes: &[u8]| {
        fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))
    };
    let name = |id: &str| format!("{id}{}", layout::ARTIFACT_SUFFIX);
    let others: Vec<&str> = scenario
        .published
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| *id != scenario.selected)
        .collect();

    // The selected model, downloaded in v24 as one plain file.
    write(
        models.join(name(scenario.selected)),
        &stand_in_bytes(24, 50_000),
    )?;

    // Legacy multipart parts with their sidecar.
    if let Some(legacy) = others.first() {
        let bytes = stand_in_bytes(25, 40_000);
        for (i, part) in bytes.chunks(16_000).enumerate() {
            write(models.join(format!("{}.p{i:02}", name(legacy))), part)?;
        }
        write(
            models.join(chunker::sidecar_name(&name(legacy))),
            chunker::format_sidecar(&Sha256Digest::of_bytes(&bytes), &name(legacy)).as_bytes(),
        )?;
    }

    // A v24 native chunk set.
    if let Some(chunked) = others.get(1) {
        let full = data.join(name(chunked));
        write(full.clone(), &stand_in_bytes(26, 30_000))?;
        run(Command::new(&bins.release_cli)
            .args(["chunk", "split"])
            .arg(&full)
            .arg("--out-dir")
            .arg(&models)
            .args(["--chunk-size", "16000"]))?;
        fs::remove_file(&full).map_err(|e| e.to_string())?;
        let sidecar = models.join(chunker::sidecar_name(&name(chunked)));
        fs::remove_file(&sidecar).map_err(|e| e.to_string())?;
    }

    // A model built on this device, and the driver-monitoring set: both stay.
    write(models.join(name(LOCAL_MODEL)), &stand_in_bytes(27, 20_000))?;
    for (i, dm) in DM_FILES.iter().enumerate() {
        write(models.join(dm), &stand_in_bytes(30 + i as u64, 5_000))?;
    }

    // The three JSON caches the v24 manager wrote, with an entry for a model v25 dropped.
    let sel = scenario.selected;
    for (cache, body) in [
        (
            ".model_versions.json",
            format!(r#"{{"{sel}": "v11", "dropped223": "v9"}}"#),
        ),
        (
            ".model_artifacts.json",
            format!(
                r#"{{"{sel}": {{"artifact_sha256": "{}", "artifact_size": 50000, "uses_external_gpu": false}}, "dropped223": {{"uses_external_gpu": false}}}}"#,
                Sha256Digest::of_bytes(&stand_in_bytes(24, 50_000)).to_hex()
            ),
        ),
        (
            ".model_artifact_urls.json",
            r#"{"dropped223": {"dropped223_driving_tinygrad.pkl": "https://example.invalid/v24"}}"#
                .to_string(),
        ),
    ] {
        write(models.join(cache), body.as_bytes())?;
    }

    // The built-in RDF V4 shipped in the openpilot tree, as its native chunk set.
    let builtin = builtin_dir.join("driving_tinygrad.pkl");
    write(builtin.clone(), &stand_in_bytes(43, 70_000))?;
    run(Command::new(&bins.release_cli)
        .args(["chunk", "split"])
        .arg(&builtin)
        .args(["--chunk-size", "32000"]))?;
    fs::remove_file(&builtin).map_err(|e| e.to_string())?;

    // Params as the v24 Python manager left them.
    let entry_name = Manifest::from_slice(CATALOG.as_bytes())
        .ok()
        .and_then(|m| {
            let id: ModelId = scenario.selected.parse().ok()?;
            let e = m.get(&id)?;
            Some((e.name()?.to_string(), e.version()?.to_string()))
        })
        .unwrap_or_else(|| (scenario.selected.to_string(), "v11".into()));
    for (key, value) in [
        ("Model", scenario.selected),
        ("DrivingModel", scenario.selected),
        ("DrivingModelName", entry_name.0.as_str()),
        ("ModelVersion", entry_name.1.as_str()),
        ("DrivingModelVersion", entry_name.1.as_str()),
        // The Small/Big profiles modeld actually loads from.
        ("ActiveSmallModel", scenario.selected),
        ("ActiveSmallModelName", entry_name.0.as_str()),
        ("ActiveSmallModelVersion", entry_name.1.as_str()),
        ("ActiveBigModel", "none"),
        ("ModelManifestVersion", OLD_GENERATION),
    ] {
        write(params.join(key), value.as_bytes())?;
    }
    Ok(())
}

/// `name -> sha256` of every regular file in `dir`.
pub fn digests(dir: &Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        if !entry.file_type().map_err(|e| e.to_string())?.is_file() {
            continue;
        }
        let (d, _) = Sha256Digest::of_file(&entry.path()).map_err(|e| e.to_string())?;
        out.insert(entry.file_name().to_string_lossy().into_owned(), d.to_hex());
    }
    Ok(out)
}

pub fn params(data: &Path) -> Result<BTreeMap<String, String>> {
    let dir = data.join("params/d");
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        if let Ok(v) = fs::read_to_string(entry.path()) {
            out.insert(entry.file_name().to_string_lossy().into_owned(), v);
        }
    }
    Ok(out)
}

pub(crate) fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{:?} {:?} failed ({}):\n{}{}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        ))
    }
}

fn model_id(id: &str) -> Result<ModelId> {
    id.parse().map_err(|e| format!("{e}"))
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
