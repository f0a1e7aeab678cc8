//! The next generation, end to end, as a maintainer doing their first tinygrad bump follows
//! docs/release.md, with the real binaries only: the live release of the current generation
//! (v25), then `tinygrad bump` to a made-up tinygrad commit (whose generation, v26, comes from
//! the bump's report), `sync`, `rebuild`, `dm`, `builtin`, the validation records, `publish` to
//! a local store and a git `Models` branch, and finally a device of the old generation whose
//! openpilot tree moves to the new tinygrad, run as the documented service entry runs it.
//!
//! The compiler is a loopback sshd with the stand-in `./models` (`test-support`'s `sshd`); the
//! caller starts it and passes a [`Compiler`]. Nothing here names a generation or a pin: the
//! old generation is the newest of the built-in pin table, the new one what `tinygrad bump`
//! reports, and the new pin the `HEAD` of a git repository made here.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use manifest::layout::{self, DM_FILES};
use manifest::pins::PinTable;
use manifest::{Artifact, ArtifactSize, ChunkCount, Generation, Manifest, ModelId};

use crate::story::{
    self, Binaries, Request, Result, Running, git, git_identity, init_models_branch,
    parse_serve_log, run, serve, text,
};

/// The real v25 catalog (`/work/shared/fixtures`' copy lives in the manifest crate's fixtures):
/// the base of the first release the story plays.
const CATALOG: &str =
    include_str!("../../crates/manifest/tests/fixtures/model_names_v25.catalog.json");

/// The models the story builds, from the real catalog: a v8 and a v15 QCOM model (rdf43 is also
/// the RDF V4 built-in) and a v16 external-GPU model. Each is its own validation row.
pub const MODELS: [&str; 3] = ["tr16223", "rdf43", "bmrlnapv6"];
/// The model the device has selected (a QCOM one: the test device has no external GPU).
pub const SELECTED: &str = "tr16223";
/// The RDF V4 model whose build becomes the built-in.
pub const BUILTIN_SOURCE: &str = "rdf43";
/// A `local-` model built on the device; never touched.
pub const LOCAL_MODEL: &str = "local-mine";

/// The compiler comma: an ssh alias (with its config file) and the paths on it.
#[derive(Debug, Clone)]
pub struct Compiler {
    pub ssh_config: PathBuf,
    pub alias: String,
    /// openpilot's directory on the compiler (`--remote-root`).
    pub remote_root: PathBuf,
    /// The models directory the validator reads (`--remote-models-dir`).
    pub models_dir: PathBuf,
}

impl Compiler {
    /// The compiler options every build command takes (`--allow-other-compiler`: the loopback
    /// sshd is not `comma@192.168.3.110`).
    fn flags(&self) -> Vec<OsString> {
        vec![
            "--remote".into(),
            self.alias.clone().into(),
            "--allow-other-compiler".into(),
            "--ssh-config".into(),
            self.ssh_config.clone().into(),
            "--remote-root".into(),
            self.remote_root.clone().into(),
        ]
    }
}

/// The generation this code was released with: the newest of the built-in pin table.
pub fn current_generation() -> (Generation, String) {
    let table = PinTable::builtin();
    let (generation, pin) = table
        .iter()
        .max_by_key(|(g, _)| *g)
        .expect("the built-in pin table is not empty");
    (generation, pin.to_string())
}

/// The maintainer's machine: the openpilot checkout, the ONNX archive, the source map, the
/// stores, and one rebuild workspace per generation.
pub struct Release<'a> {
    pub bins: &'a Binaries,
    pub compiler: &'a Compiler,
    pub work: PathBuf,
    pub openpilot: PathBuf,
    pub sources: PathBuf,
    /// The current generation's source map in the tree (the next ones beside it).
    pub source_map: PathBuf,
    /// The release secret key rehearse and publish sign with, once the tree ships its public
    /// half (`starpilot/assets/model_release_keys.pub`).
    pub sign_key: Option<PathBuf>,
    /// The local store (the Hugging Face stand-in, published first).
    pub store: PathBuf,
    /// The bare repository standing in for GitHub, and the `Models` checkout published to.
    pub github_origin: PathBuf,
    pub github_checkout: PathBuf,
    /// Each step with its wall time, for the report.
    pub steps: Vec<(String, Duration)>,
    /// Every generation is rebuilt in one workspace ([`Release::workspace`]).
    pub shared_workspace: bool,
}

impl<'a> Release<'a> {
    /// Set up the maintainer's machine in the empty directory `work`: a stand-in openpilot
    /// checkout (a git repository) at the current generation's pin with the compiler's
    /// `./models` copied from `standin_models`, the ONNX archive and source map for
    /// [`MODELS`], an empty local store and a git `Models` branch.
    pub fn new(
        bins: &'a Binaries,
        compiler: &'a Compiler,
        work: &Path,
        standin_models: &Path,
    ) -> Result<Self> {
        fs::create_dir_all(work).map_err(|e| format!("{}: {e}", work.display()))?;
        let (_, pin) = current_generation();
        let openpilot = work.join("openpilot");
        standin_openpilot_tree(&openpilot, &pin, standin_models)?;
        let sources = work.join("onnx-archive");
        // The current generation's source map lives in the tree, as StarPilot keeps it
        // (`scripts/model_source_map_vNN.json`); the next one is written by `source-map next`.
        let source_map = openpilot.join(format!(
            "scripts/model_source_map_{}.json",
            current_generation().0
        ));
        let mut map = serde_json::Map::new();
        let catalog = Manifest::from_slice(CATALOG.as_bytes()).map_err(|e| e.to_string())?;
        for id in MODELS {
            let entry = catalog
                .get(&model_id(id)?)
                .ok_or_else(|| format!("{id} is not in the v25 catalog"))?;
            write(
                &sources.join(format!("onnx/{id}/driving_supercombo.onnx")),
                format!("stand-in ONNX of {id}").as_bytes(),
            )?;
            map.insert(
                id.to_string(),
                serde_json::json!({
                    "source_id": id,
                    "input_format": "supercombo",
                    "uses_external_gpu": entry.uses_external_gpu(),
                }),
            );
        }
        write(
            &source_map,
            serde_json::Value::Object(map).to_string().as_bytes(),
        )?;
        git(&openpilot, &["add", "-A"])?;
        git(
            &openpilot,
            &["commit", "-q", "-m", "the current source map"],
        )?;
        let store = work.join("store");
        fs::create_dir_all(&store).map_err(|e| e.to_string())?;
        let github_origin = work.join("github-origin.git");
        let github_checkout = work.join("models-checkout");
        init_models_branch(&github_origin, &github_checkout)?;
        Ok(Self {
            bins,
            compiler,
            work: work.to_path_buf(),
            openpilot,
            sources,
            source_map,
            sign_key: None,
            store,
            github_origin,
            github_checkout,
            steps: Vec::new(),
            shared_workspace: false,
        })
    }

    /// The rebuild workspace of `generation`: one per generation, or with
    /// [`Release::shared_workspace`] the one workspace every generation is rebuilt in (as a
    /// maintainer keeps `/Volumes/T5/StarPilot-Model-Rebuild`).
    pub fn workspace(&self, generation: Generation) -> PathBuf {
        if self.shared_workspace {
            self.work.join("rebuild")
        } else {
            self.work.join(format!("rebuild-{generation}"))
        }
    }

    /// Where `generation`'s staged release is: its workspace, or `generations/<gen>/` in it once
    /// a later generation's rebuild set it aside.
    pub fn release_dir(&self, generation: Generation) -> PathBuf {
        let ws = self.workspace(generation);
        if ws
            .join(format!("ready/model_names_{generation}.json"))
            .exists()
        {
            ws
        } else {
            ws.join(format!("generations/{generation}"))
        }
    }

    /// The manifest `rebuild` wrote for `generation`.
    pub fn built_manifest(&self, generation: Generation) -> Result<Manifest> {
        read_manifest(
            &self
                .workspace(generation)
                .join(format!("ready/model_names_{generation}.json")),
        )
    }

    /// The manifest live in the local store for `generation`.
    pub fn live_manifest(&self, generation: Generation) -> Result<Manifest> {
        read_manifest(
            &self
                .store
                .join(format!("manifests/model_names_{generation}.json")),
        )
    }

    /// Run `release-cli ARGS --json` from the maintainer's directory (adding the compiler
    /// options when `remote`), record the step's wall time, and return its JSON (the last line
    /// of stdout, which is the report for every command used here).
    fn cli(&mut self, step: &str, args: &[OsString], remote: bool) -> Result<serde_json::Value> {
        let start = Instant::now();
        let mut cmd = Command::new(&self.bins.release_cli);
        cmd.current_dir(&self.work).args(args).arg("--json");
        if remote {
            cmd.args(self.compiler.flags());
        }
        cmd.envs(git_identity());
        let out = run(&mut cmd).map_err(|e| format!("{step}: {e}"))?;
        self.steps.push((step.to_string(), start.elapsed()));
        let stdout = text(&out.stdout);
        let last = stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .ok_or_else(|| format!("{step}: printed nothing on stdout"))?;
        serde_json::from_str(last).map_err(|e| format!("{step}: stdout is not JSON ({e}): {last}"))
    }

    /// `release-cli sync --openpilot OP`: the tree's four parts to the compiler, marker checked.
    pub fn sync(&mut self) -> Result<serde_json::Value> {
        let args = os(&["sync", "--openpilot"], [&self.openpilot]);
        self.cli("sync", &args, true)
    }

    /// `generation`'s source map in the tree (`scripts/model_source_map_<gen>.json`).
    pub fn source_map_of(&self, generation: Generation) -> PathBuf {
        self.openpilot
            .join(format!("scripts/model_source_map_{generation}.json"))
    }

    /// `release-cli source-map next --openpilot OP` (runbook step 4): the tree's generation's
    /// source map from the previous one beside it; committed as the maintainer does.
    pub fn source_map_next(&mut self) -> Result<serde_json::Value> {
        let args = os(&["source-map", "next", "--openpilot"], [&self.openpilot]);
        let r = self.cli("source-map next", &args, false)?;
        self.commit_tree("the next source map")?;
        Ok(r)
    }

    /// `release-cli status --workspace WS --openpilot OP --json` for `generation`'s workspace.
    pub fn status(&mut self, generation: Generation) -> Result<serde_json::Value> {
        let mut args = os(&["status", "--workspace"], [&self.workspace(generation)]);
        args.extend(os(&["--openpilot"], [&self.openpilot]));
        self.cli("status", &args, false)
    }

    /// `release-cli audit --generation G --store STORE --workspace WS --openpilot OP --json`:
    /// its exit code and report.
    pub fn audit(&self, generation: Generation) -> Result<(Option<i32>, serde_json::Value)> {
        let out = Command::new(&self.bins.release_cli)
            .current_dir(&self.work)
            .args(["audit", "--generation", &generation.to_string(), "--json"])
            .arg("--store")
            .arg(&self.store)
            .arg("--workspace")
            .arg(self.workspace(generation))
            .arg("--openpilot")
            .arg(&self.openpilot)
            .output()
            .map_err(|e| format!("cannot run release-cli audit: {e}"))?;
        let v = serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "audit printed no JSON ({e}): {}{}",
                text(&out.stdout),
                text(&out.stderr)
            )
        })?;
        Ok((out.status.code(), v))
    }

    /// Run each distinct `mend` command an audit report printed, exactly as printed (`sh -c`,
    /// in the maintainer's directory, with release-cli's directory first on PATH).
    pub fn run_mends(&self, report: &serde_json::Value) -> Result<Vec<String>> {
        let mut mends: Vec<String> = Vec::new();
        for st in report["stores"].as_array().into_iter().flatten() {
            for p in st["problems"].as_array().into_iter().flatten() {
                if let Some(m) = p["mend"].as_str()
                    && !mends.iter().any(|x| x == m)
                {
                    mends.push(m.to_string());
                }
            }
        }
        let bin_dir = self
            .bins
            .release_cli
            .parent()
            .ok_or("release-cli has no directory")?;
        for m in &mends {
            let out = Command::new("sh")
                .arg("-c")
                .arg(m)
                .current_dir(&self.work)
                .env(
                    "PATH",
                    format!(
                        "{}:{}",
                        bin_dir.display(),
                        std::env::var("PATH").unwrap_or_default()
                    ),
                )
                .envs(git_identity())
                .output()
                .map_err(|e| format!("cannot run sh: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "the mend `{m}` failed ({}): {}{}",
                    out.status,
                    text(&out.stdout),
                    text(&out.stderr)
                ));
            }
        }
        Ok(mends)
    }

    /// Run `release-cli ARGS` expecting a refusal: its exit code and stderr.
    pub fn refused(&self, args: &[OsString]) -> Result<(Option<i32>, String)> {
        let out = Command::new(&self.bins.release_cli)
            .current_dir(&self.work)
            .args(args)
            .envs(git_identity())
            .output()
            .map_err(|e| format!("cannot run release-cli: {e}"))?;
        Ok((out.status.code(), text(&out.stderr)))
    }

    /// The arguments of [`Release::publish`] with `--dry-run` (gated on the workspace).
    pub fn publish_dry_run_args(&self, generation: Generation) -> Vec<OsString> {
        let ws = self.workspace(generation);
        let mut args = os(
            &[
                "publish",
                "--dry-run",
                "--generation",
                &generation.to_string(),
            ],
            [],
        );
        args.extend(os(
            &["--manifest"],
            [&ws.join(format!("ready/model_names_{generation}.json"))],
        ));
        args.extend(os(&["--artifacts"], [&ws.join("ready")]));
        args.extend(os(&["--to"], [&self.store]));
        args.extend(os(&["--openpilot"], [&self.openpilot]));
        args.extend(os(&["--workspace"], [&ws]));
        args
    }

    /// `release-cli rebuild` of [`MODELS`] for `generation` on top of `base` (the catalog the
    /// behaviour versions come from), from the generation's source map in the tree.
    pub fn rebuild(&mut self, generation: Generation, base: &Path) -> Result<serde_json::Value> {
        let ws = self.workspace(generation);
        let mut args: Vec<OsString> = vec!["rebuild".into(), "--workspace".into(), ws.into()];
        args.extend(os(&["--source-map"], [&self.source_map_of(generation)]));
        args.extend(os(&["--base-manifest"], [base]));
        args.extend(os(&["--sources"], [&self.sources]));
        args.extend(os(&["--generation", &generation.to_string()], []));
        args.extend(os(&["--openpilot"], [&self.openpilot]));
        self.cli(&format!("rebuild {generation}"), &args, true)
    }

    /// `release-cli dm`: the four DM files, straight into the tree's `selfdrive/modeld/models`
    /// (they are replaced together there). The compiler writes them under its openpilot root,
    /// not the shared `/tmp`.
    pub fn dm(&mut self) -> Result<serde_json::Value> {
        let out = self.openpilot.join("selfdrive/modeld/models");
        let remote_out = self.compiler.remote_root.join("dm_artifacts");
        let mut args = os(&["dm", "--out"], [&out]);
        args.extend(os(&["--openpilot"], [&self.openpilot]));
        args.extend(os(&["--remote-output-dir"], [&remote_out]));
        self.cli("dm", &args, true)
    }

    /// `release-cli builtin`: the RDF V4 build of `generation`'s workspace becomes the tree's
    /// built-in chunk set.
    pub fn builtin(&mut self, generation: Generation) -> Result<serde_json::Value> {
        let artifact = self.builtin_source(generation);
        self.builtin_from(&artifact)
    }

    /// The RDF V4 build in `generation`'s workspace (what [`Release::builtin`] installs).
    pub fn builtin_source(&self, generation: Generation) -> PathBuf {
        self.release_dir(generation).join(format!(
            "ready/{BUILTIN_SOURCE}/{BUILTIN_SOURCE}{}",
            layout::ARTIFACT_SUFFIX
        ))
    }

    /// `release-cli builtin --artifact ARTIFACT`: `artifact` becomes the tree's built-in.
    pub fn builtin_from(&mut self, artifact: &Path) -> Result<serde_json::Value> {
        let mut args = os(&["builtin", "--artifact"], [artifact]);
        args.extend(os(&["--openpilot"], [&self.openpilot]));
        self.cli("builtin", &args, false)
    }

    /// `release-cli tinygrad bump` to the tinygrad checkout `src` at `commit`, then the hand
    /// edit docs/release.md names: `MANIFEST_CANDIDATES` becomes the single new generation.
    /// Returns the generation the bump reported, and commits the tree as the maintainer would.
    pub fn tinygrad_bump(&mut self, src: &Path, commit: &str) -> Result<Generation> {
        let mut args = os(&["tinygrad", "bump", "--openpilot"], [&self.openpilot]);
        args.extend(os(&["--tinygrad-src"], [src]));
        args.extend(os(&["--commit", commit], []));
        let report = self.cli("tinygrad bump", &args, false)?;
        let to: Generation = report["generation"]["to"]
            .as_str()
            .ok_or_else(|| format!("tinygrad bump reported no next generation: {report}"))?
            .parse()
            .map_err(|e| format!("tinygrad bump reported a bad generation: {e}"))?;
        let candidates = report["manifest_candidates"]
            .as_str()
            .ok_or_else(|| format!("tinygrad bump found no MANIFEST_CANDIDATES: {report}"))?;
        let file = candidates
            .rsplit_once(':')
            .map_or(candidates, |(f, _)| f)
            .to_string();
        let file = if Path::new(&file).is_absolute() {
            PathBuf::from(file)
        } else {
            self.work.join(file)
        };
        let old = fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let new: String = old
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("MANIFEST_CANDIDATES") {
                    format!("MANIFEST_CANDIDATES = (\"{to}\",)")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n";
        write(&file, new.as_bytes())?;
        self.commit_tree(&format!("tinygrad bump to {to}"))?;
        Ok(to)
    }

    /// Commit everything in the openpilot checkout, as the maintainer does after the steps that
    /// change it (the bump and its hand edit, DM, built-in).
    pub fn commit_tree(&self, message: &str) -> Result<()> {
        git(&self.openpilot, &["add", "-A"])?;
        git(&self.openpilot, &["commit", "-q", "-m", message])?;
        Ok(())
    }

    /// `release-cli preflight`: `./dev sync` and the repository tests of the checkout.
    pub fn preflight(&mut self, generation: Generation) -> Result<serde_json::Value> {
        let mut args = os(&["preflight", "--openpilot"], [&self.openpilot]);
        args.extend(os(&["--workspace"], [&self.workspace(generation)]));
        self.cli("preflight", &args, false)
    }

    /// `release-cli validate --model ID`: the device validator on the compiler, per resolution.
    pub fn validate(&mut self, generation: Generation, id: &str) -> Result<serde_json::Value> {
        let mut args = os(
            &["validate", "--model", id, "--workspace"],
            [&self.workspace(generation)],
        );
        args.extend(os(&["--openpilot"], [&self.openpilot]));
        args.extend(os(&["--remote-models-dir"], [&self.compiler.models_dir]));
        args.extend(os(&["--python", "python3"], []));
        self.cli(&format!("validate {id}"), &args, true)
    }

    /// `release-cli validate --check …`: a check made on the device by hand, recorded.
    pub fn check(
        &mut self,
        generation: Generation,
        check: &[&str],
        note: &str,
    ) -> Result<serde_json::Value> {
        let mut args = os(&["validate", "--check"], []);
        args.extend(os(check, []));
        args.extend(os(&["--passed", "--note", note, "--by", "e2e"], []));
        args.extend(os(&["--workspace"], [&self.workspace(generation)]));
        args.extend(os(&["--openpilot"], [&self.openpilot]));
        self.cli(
            &format!("validate --check {}", check.join(" ")),
            &args,
            false,
        )
    }

    /// Every record the matrix publish requires for [`MODELS`] (docs/release.md, "The matrix
    /// publish requires"): preflight; one validation per row (v8, v15, external GPU), which
    /// here is one per model; stable `modelV2`; DM `driverStateV2` at both resolutions.
    /// Returns each model's `validate --json` report, in [`MODELS`] order.
    pub fn validation_records(&mut self, generation: Generation) -> Result<Vec<serde_json::Value>> {
        self.preflight(generation)?;
        let mut reports = Vec::new();
        for id in MODELS {
            let r = self.validate(generation, id)?;
            if r["passed"] != true {
                return Err(format!("validate {id} did not pass: {r}"));
            }
            reports.push(r);
        }
        self.check(
            generation,
            &["model-v2", "--model", SELECTED],
            "modelV2 steady at 20 Hz (stand-in device)",
        )?;
        // The two camera resolutions the seed names (`validate --check driver-state` accepts
        // exactly these).
        for res in ["1928x1208", "1344x760"] {
            self.check(
                generation,
                &["driver-state", "--resolution", res],
                "driverStateV2 steady (stand-in device)",
            )?;
        }
        Ok(reports)
    }

    /// `release-cli rehearse` for `generation`'s staged release (issue 22, item 3): its record
    /// (`--json`), which `publish` then requires.
    pub fn rehearse(&mut self, generation: Generation) -> Result<serde_json::Value> {
        // The staged manifest and artifacts, the release's tree, the workspace its record
        // (results/rehearsal.json, which publish then requires) goes to.
        let ws = self.workspace(generation);
        let mut args = os(&["rehearse", "--generation", &generation.to_string()], []);
        args.extend(os(
            &["--manifest"],
            [&ws.join(format!("ready/model_names_{generation}.json"))],
        ));
        args.extend(os(&["--artifacts"], [&ws.join("ready")]));
        args.extend(os(&["--openpilot"], [&self.openpilot]));
        args.extend(os(&["--workspace"], [&ws]));
        // The device binary under test, unless it needs a runner (the aarch64 one under qemu
        // in `cargo xtask dist --test`): then rehearse's default, the host one beside
        // release-cli.
        if self.bins.device_runner.is_none() {
            args.extend(os(&["--device-manager"], [&self.bins.device_manager]));
        }
        if let Some(key) = &self.sign_key {
            args.extend(os(&["--sign-key"], [key]));
        }
        self.cli("rehearse", &args, false)
    }

    /// `release-cli publish` of `generation`'s workspace to the local store, then the git
    /// `Models` branch (the seed's order: the Hub's stand-in before GitHub), gated on the
    /// workspace's records, or with `--skip-validation REASON` when `skip` is given.
    pub fn publish(
        &mut self,
        generation: Generation,
        skip: Option<&str>,
    ) -> Result<serde_json::Value> {
        let ws = self.workspace(generation);
        let mut args = os(&["publish", "--generation", &generation.to_string()], []);
        args.extend(os(
            &["--manifest"],
            [&ws.join(format!("ready/model_names_{generation}.json"))],
        ));
        args.extend(os(&["--artifacts"], [&ws.join("ready")]));
        args.extend(os(&["--to"], [&self.store]));
        args.push("--to".into());
        args.push(format!("github:{}", self.github_checkout.display()).into());
        // The local store is this story's Hub: it goes first, and GitHub is never ahead of it.
        args.extend(os(&["--hub"], [&self.store]));
        args.extend(os(&["--openpilot"], [&self.openpilot]));
        match skip {
            Some(reason) => args.extend(os(&["--skip-validation", reason], [])),
            None => args.extend(os(&["--workspace"], [&ws])),
        }
        if let Some(key) = &self.sign_key {
            args.extend(os(&["--sign-key"], [key]));
        }
        self.cli(&format!("publish {generation}"), &args, false)
    }

    /// `release-cli publish --dry-run` of `generation`'s workspace, which must be refused by the
    /// validation gate (exit 3, before any store is opened): the gate's lines, one per missing,
    /// failed or stale cell.
    pub fn publish_refused_gaps(&mut self, generation: Generation) -> Result<Vec<String>> {
        let ws = self.workspace(generation);
        let mut cmd = Command::new(&self.bins.release_cli);
        cmd.current_dir(&self.work)
            .args([
                "publish",
                "--dry-run",
                "--generation",
                &generation.to_string(),
            ])
            .arg("--manifest")
            .arg(ws.join(format!("ready/model_names_{generation}.json")))
            .arg("--artifacts")
            .arg(ws.join("ready"))
            .arg("--to")
            .arg(&self.store)
            .arg("--openpilot")
            .arg(&self.openpilot)
            .arg("--workspace")
            .arg(&ws);
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run release-cli publish: {e}"))?;
        let err = text(&out.stderr);
        if out.status.code() != Some(3) || !err.contains("publish refused") {
            return Err(format!(
                "publish --dry-run without records was not refused by the gate ({}):\n{err}",
                out.status
            ));
        }
        Ok(err
            .lines()
            .filter(|l| {
                l.starts_with("  ")
                    && (l.contains(": missing:")
                        || l.contains(": stale:")
                        || l.contains(": failed:"))
            })
            .map(|l| l.trim().to_string())
            .collect())
    }

    /// `release-cli publish --dry-run --skip-validation REASON` of `generation`'s workspace to
    /// both stores, with the tree: the gates that do not need the validation records (the
    /// runtime gate among them). Returns the exit code and stderr; nothing is written.
    pub fn publish_dry_run_unvalidated(
        &mut self,
        generation: Generation,
        reason: &str,
    ) -> Result<(Option<i32>, String)> {
        let ws = self.workspace(generation);
        let mut cmd = Command::new(&self.bins.release_cli);
        cmd.current_dir(&self.work)
            .args([
                "publish",
                "--dry-run",
                "--generation",
                &generation.to_string(),
            ])
            .arg("--manifest")
            .arg(ws.join(format!("ready/model_names_{generation}.json")))
            .arg("--artifacts")
            .arg(ws.join("ready"))
            .arg("--to")
            .arg(&self.store)
            .arg("--to")
            .arg(format!("github:{}", self.github_checkout.display()))
            .arg("--hub")
            .arg(&self.store)
            .arg("--openpilot")
            .arg(&self.openpilot)
            .args(["--skip-validation", reason]);
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run release-cli publish: {e}"))?;
        Ok((out.status.code(), text(&out.stderr)))
    }

    /// Commit subjects on the GitHub stand-in's `Models` branch, oldest first.
    pub fn github_commits(&self) -> Result<Vec<String>> {
        Ok(git(
            &self.github_origin,
            &["log", "--reverse", "--format=%s", layout::GITHUB_BRANCH],
        )?
        .lines()
        .map(str::to_string)
        .collect())
    }

    /// The live release of `generation` the bump starts from, staged without the compiler (its
    /// build is not this story's subject): stand-in OOB artifacts chunked with `release-cli
    /// chunk split` into the workspace's `ready/<id>/`, the real catalog's entries for
    /// [`MODELS`] with their artifact fields, `generation` and its built-in pin; then the
    /// built-in from its RDF V4 (`release-cli builtin`) and stand-in DM files in the tree, as
    /// that release shipped them. Publishing it is [`Release::publish`]'s job.
    pub fn stage_live_release(&mut self, generation: Generation) -> Result<()> {
        let start = Instant::now();
        let pin = PinTable::builtin()
            .get(generation)
            .cloned()
            .ok_or_else(|| format!("{generation} has no built-in pin"))?;
        let ready = self.workspace(generation).join("ready");
        let mut m = Manifest::from_slice(CATALOG.as_bytes()).map_err(|e| e.to_string())?;
        let all: Vec<ModelId> = m.ids().cloned().collect();
        for id in all {
            if !MODELS.contains(&id.as_str()) {
                m.remove(&id);
            }
        }
        for (i, id) in MODELS.iter().enumerate() {
            let split = story::build_chunk_set(
                self.bins,
                &self.work,
                &ready,
                id,
                60_000 + 10_000 * i,
                500 + i as u64,
                16 * 1024,
            )?;
            let artifact = Artifact::tinygrad(
                ArtifactSize::new(split.size).map_err(|e| e.to_string())?,
                split.sha256,
                ChunkCount::new(split.chunks.len() as u64).map_err(|e| e.to_string())?,
            );
            m.get_mut(&model_id(id)?)
                .ok_or_else(|| format!("{id} is not in the catalog"))?
                .set_artifact_with_chunks(&artifact, &split.chunks)
                .map_err(|e| e.to_string())?;
        }
        m.set_generation(generation);
        m.set_tinygrad_commit(&pin);
        write(
            &ready.join(format!("model_names_{generation}.json")),
            &m.to_canonical_bytes(),
        )?;
        self.steps.push((
            format!("stage the live {generation} release"),
            start.elapsed(),
        ));
        self.builtin(generation)?;
        for (i, dm) in DM_FILES.iter().enumerate() {
            write(
                &self.openpilot.join("selfdrive/modeld/models").join(dm),
                &story::stand_in_bytes(700 + i as u64, 4_000),
            )?;
        }
        self.commit_tree(&format!("{generation} built-in and DM"))
    }
}

/// A stand-in openpilot checkout at `pin`: what `sync` sends (tinygrad_repo/, selfdrive/modeld/,
/// scripts/model_compiler.py, the compiler `./models` copied from `standin_models`), the DM
/// ONNX, `MANIFEST_CANDIDATES` in the device code, and for `preflight` a `./dev` and
/// `.venv/bin/pytest` that stand in for the repository's own (the stand-in pytest fails unless
/// every test file it is given exists). A git repository with one commit.
pub fn standin_openpilot_tree(op: &Path, pin: &str, standin_models: &Path) -> Result<()> {
    write(
        &op.join("tinygrad_repo/TINYGRAD_COMMIT"),
        format!("{pin}\n").as_bytes(),
    )?;
    write(
        &op.join("tinygrad_repo/tinygrad/tensor.py"),
        format!("# the tinygrad of {pin}\n").as_bytes(),
    )?;
    write(&op.join("selfdrive/modeld/modeld.py"), b"# modeld\n")?;
    write(
        &op.join("selfdrive/modeld/models/dmonitoring_model.onnx"),
        b"stand-in DM ONNX",
    )?;
    write(&op.join("scripts/model_compiler.py"), b"# the compiler\n")?;
    let models =
        fs::read(standin_models).map_err(|e| format!("{}: {e}", standin_models.display()))?;
    write_exec(&op.join("models"), &models)?;
    write(
        &op.join("starpilot/assets/model_manager.py"),
        format!(
            "import os\nMANIFEST_CANDIDATES = (\"{}\",)\n",
            current_generation().0
        )
        .as_bytes(),
    )?;
    write_exec(&op.join("dev"), b"#!/bin/sh\necho \"stand-in ./dev $*\"\n")?;
    write_exec(
        &op.join(".venv/bin/pytest"),
        b"#!/bin/sh\n# stand-in pytest: passes when every test file named exists\nfor a in \"$@\"; do\n  case \"$a\" in -*) ;; *) [ -f \"$a\" ] || { echo \"no such test file: $a\"; exit 4; } ;; esac\ndone\necho \"stand-in pytest: $# args passed\"\n",
    )?;
    for t in [
        "starpilot/assets/tests/test_model_pipeline.py",
        "common/tests/test_file_chunker.py",
        "scripts/tests/test_model_release.py",
    ] {
        write(&op.join(t), b"def test_it():\n    pass\n")?;
    }
    git(op, &["init", "-q"])?;
    git(op, &["add", "-A"])?;
    git(
        op,
        &["commit", "-q", "-m", "openpilot at the current generation"],
    )?;
    Ok(())
}

/// A made-up tinygrad source: a git repository with one commit whose `HEAD` is the pin of the
/// next generation. Returns that commit.
pub fn made_up_tinygrad(dir: &Path) -> Result<String> {
    write(
        &dir.join("tinygrad/tensor.py"),
        b"# a made-up tinygrad for the next generation\n",
    )?;
    write(&dir.join("tinygrad/ops.py"), b"# ops\n")?;
    git(dir, &["init", "-q"])?;
    git(dir, &["add", "-A"])?;
    git(dir, &["commit", "-q", "-m", "made-up tinygrad"])?;
    Ok(git(dir, &["rev-parse", "HEAD"])?.trim().to_string())
}

/// The made-up tinygrad's next commit (the pin of the generation after the one [`made_up_tinygrad`]
/// or an earlier call pinned): one more file, one more commit. Returns that commit.
pub fn next_tinygrad_commit(dir: &Path, label: &str) -> Result<String> {
    write(
        &dir.join(format!("tinygrad/{label}.py")),
        format!("# a made-up tinygrad change: {label}\n").as_bytes(),
    )?;
    git(dir, &["add", "-A"])?;
    git(dir, &["commit", "-q", "-m", label])?;
    Ok(git(dir, &["rev-parse", "HEAD"])?.trim().to_string())
}

// ---- the device ------------------------------------------------------------------------------

/// A comma: `/data` (models and params), `/dev/shm/params/d`, and its openpilot checkout as the
/// updater ships it (the tinygrad marker, the pins file, the built-in and DM models).
pub struct Device {
    pub root: PathBuf,
    pub data: PathBuf,
    pub openpilot: PathBuf,
    pub memory_params: PathBuf,
    /// The mirror the device's origins point at: `(hf_base, github_base)`.
    pub origins: (String, String),
}

impl Device {
    pub fn new(root: &Path) -> Result<Self> {
        let d = Self {
            root: root.to_path_buf(),
            data: root.join("data"),
            openpilot: root.join("data/openpilot"),
            memory_params: root.join("shm/params/d"),
            origins: (String::new(), String::new()),
        };
        for dir in [d.data.join("models"), d.data.join("params/d")] {
            fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        Ok(d)
    }

    pub fn models_dir(&self) -> PathBuf {
        self.data.join("models")
    }

    pub fn builtin_dir(&self) -> PathBuf {
        self.openpilot.join("selfdrive/modeld/models")
    }

    /// The updater swaps in the maintainer's tree: what the device reads of it (the tinygrad
    /// marker, `tinygrad_pins.json`, `selfdrive/modeld/models/`) replaces the old tree's.
    pub fn ship_tree(&self, op: &Path) -> Result<()> {
        if self.openpilot.exists() {
            fs::remove_dir_all(&self.openpilot)
                .map_err(|e| format!("{}: {e}", self.openpilot.display()))?;
        }
        copy_file(
            &op.join("tinygrad_repo/TINYGRAD_COMMIT"),
            &self.openpilot.join("tinygrad_repo/TINYGRAD_COMMIT"),
        )?;
        let pins = op.join(manifest::pins::PINS_FILE);
        if pins.is_file() {
            copy_file(&pins, &self.openpilot.join(manifest::pins::PINS_FILE))?;
        }
        let models = op.join("selfdrive/modeld/models");
        for e in fs::read_dir(&models).map_err(|e| format!("{}: {e}", models.display()))? {
            let e = e.map_err(|e| e.to_string())?;
            copy_file(&e.path(), &self.builtin_dir().join(e.file_name()))?;
        }
        Ok(())
    }

    /// The manager as the documented service entry runs it (docs/device.md, "How the process
    /// manager starts it": `./device-modeld-manager <subcommand>`, no flags), plus only the
    /// locations a test cannot take from a comma: the data dir, the memory params, the origins,
    /// and where the openpilot tree is ([`tree_flags`]).
    pub fn manager(&self, bins: &Binaries) -> Command {
        let mut c = bins.device_command();
        c.current_dir(&self.root)
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--memory-params-dir")
            .arg(&self.memory_params)
            .args([
                "--hf-base",
                &self.origins.0,
                "--github-base",
                &self.origins.1,
            ])
            .args(tree_flags(self));
        c
    }

    /// `device-modeld-manager run`, the service entry's command: wait until the daemon logs the
    /// result of its first refresh, then stop it with SIGTERM as openpilot's manager does, and
    /// require a clean exit. Returns the daemon's stderr.
    pub fn run_daemon_once(&self, bins: &Binaries) -> Result<String> {
        let mut cmd = self.manager(bins);
        cmd.arg("run")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bins.describe_device()))?;
        let stderr = child.stderr.take().ok_or("the daemon has no stderr")?;
        let pid = child.id();
        let running = Running(child);
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                if line.contains("refresh: ") || line.contains("refresh failed") {
                    let _ = tx.send(line.clone());
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        let result = rx.recv_timeout(Duration::from_secs(60));
        let kill = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let mut running = running;
        let status = running.0.wait().map_err(|e| e.to_string())?;
        drop(running);
        let log = reader.join().unwrap_or_default();
        let line = result.map_err(|_| format!("the daemon logged no refresh in 60 s:\n{log}"))?;
        if line.contains("refresh failed") {
            return Err(format!("the daemon's refresh failed: {line}\n{log}"));
        }
        if !kill.is_ok_and(|s| s.success()) || status.code() != Some(0) {
            return Err(format!(
                "the daemon did not stop cleanly on SIGTERM ({status}):\n{log}"
            ));
        }
        Ok(log)
    }

    /// Params as the Python manager of the old generation left them: `selected` in the
    /// selection and the small profile, the big profile off.
    pub fn select(&self, selected: &str, manifest: &Manifest) -> Result<()> {
        let entry = manifest
            .get(&model_id(selected)?)
            .ok_or_else(|| format!("{selected} is not in the live manifest"))?;
        let name = entry.name().unwrap_or(selected).to_string();
        let version = entry.version().map(|v| v.to_string()).unwrap_or_default();
        let params = self.data.join("params/d");
        for (key, value) in [
            ("Model", selected),
            ("DrivingModel", selected),
            ("DrivingModelName", &name),
            ("ModelVersion", &version),
            ("DrivingModelVersion", &version),
            ("ActiveSmallModel", selected),
            ("ActiveSmallModelName", &name),
            ("ActiveSmallModelVersion", &version),
            ("ActiveBigModel", "none"),
        ] {
            write(&params.join(key), value.as_bytes())?;
        }
        Ok(())
    }
}

/// Where the device's openpilot tree is, for the manager: `--openpilot-dir`, the one flag a
/// test adds to the service entry's command line because its tree is not at `/data/openpilot`.
/// The generation and the built-in come from that tree (`DIR/tinygrad_repo/TINYGRAD_COMMIT`,
/// the pin table, `DIR/selfdrive/modeld/models`); no `--generation`, no `--builtin-dir`.
pub fn tree_flags(device: &Device) -> Vec<OsString> {
    vec!["--openpilot-dir".into(), device.openpilot.clone().into()]
}

/// What the device holds, read from its directories (not from any report of the manager).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceState {
    /// `name -> sha256` of every regular file in `<data>/models`.
    pub models: BTreeMap<String, String>,
    pub params: BTreeMap<String, String>,
}

impl DeviceState {
    pub fn read(device: &Device) -> Result<Self> {
        Ok(Self {
            models: story::digests(&device.models_dir())?,
            params: story::params(&device.data)?,
        })
    }

    /// Driving artifacts in any form (full PKL, `.pNN`, chunks, chunk manifests, sidecars),
    /// `local-` models aside.
    pub fn driving_artifacts(&self) -> Vec<&str> {
        self.models
            .keys()
            .map(String::as_str)
            .filter(|n| is_driving_artifact(n) && !n.starts_with("local-"))
            .collect()
    }

    /// `<data>/models` without the manager's own state files (dot files: catalog, caches,
    /// verification records), which a refresh of the same generation may rewrite.
    pub fn files_not_the_managers(&self) -> BTreeMap<&str, &str> {
        self.models
            .iter()
            .filter(|(n, _)| !n.starts_with('.'))
            .map(|(n, d)| (n.as_str(), d.as_str()))
            .collect()
    }
}

/// A driving artifact file by the purge's rule (docs/device.md, "Migration and recovery").
pub fn is_driving_artifact(name: &str) -> bool {
    name.contains("_driving_") || name.starts_with("driving_")
}

/// Everything the device side of the story needs from the release side: the served mirror, and
/// the requests the device made, split by phase.
pub struct Mirror {
    _server: Running,
    pub hf_base: String,
    pub github_base: String,
    log: PathBuf,
}

impl Mirror {
    /// `release-cli serve -v` of `store`, logging requests to `log`.
    pub fn serve(bins: &Binaries, store: &Path, log: &Path) -> Result<Self> {
        let (server, url) = serve(bins, store, log)?;
        Ok(Self {
            _server: server,
            hf_base: format!("{url}/buckets/{}/resolve", layout::HF_BUCKET),
            github_base: format!("{url}/{}/{}", layout::GITHUB_REPO, layout::GITHUB_BRANCH),
            log: log.to_path_buf(),
        })
    }

    pub fn requests(&self) -> Result<Vec<Request>> {
        parse_serve_log(&self.log)
    }
}

/// The old generation's device as its manager leaves it, built through the real manager: it
/// refreshes against the live release and downloads the selected model; then the leftovers the
/// Python manager of that generation leaves beside it are added: another model as a native chunk
/// set, a third as legacy `.pNN` parts with their sidecar (both copied from the live release),
/// a `local-` model, and the tree's DM files; a last refresh of that generation lists them.
pub fn prepare_old_device(
    bins: &Binaries,
    release: &Release,
    device: &Device,
    generation: Generation,
) -> Result<()> {
    let live = release.live_manifest(generation)?;
    let refresh =
        |args: &[&str]| -> Result<()> { run(device.manager(bins).args(args)).map(|_| ()) };
    refresh(&["refresh"])?;
    device.select(SELECTED, &live)?;
    refresh(&["download", SELECTED])?;

    let models = device.models_dir();
    let name = |id: &str| format!("{id}{}", layout::ARTIFACT_SUFFIX);
    let store_dir = |id: &str| release.store.join(format!("models/{generation}/{id}"));
    let others: Vec<&str> = MODELS.iter().copied().filter(|m| *m != SELECTED).collect();
    // A native chunk set, as the Python manager downloads them.
    let chunked = others[0];
    for e in fs::read_dir(store_dir(chunked)).map_err(|e| e.to_string())? {
        let e = e.map_err(|e| e.to_string())?;
        copy_file(&e.path(), &models.join(e.file_name()))?;
    }
    // Legacy multipart parts with their sidecar, from the full artifact.
    let legacy = others[1];
    let joined = device.root.join(name(legacy));
    run(Command::new(&bins.release_cli)
        .args(["chunk", "join"])
        .arg(store_dir(legacy).join(name(legacy)))
        .arg("--output")
        .arg(&joined))?;
    let bytes = fs::read(&joined).map_err(|e| e.to_string())?;
    fs::remove_file(&joined).map_err(|e| e.to_string())?;
    for (i, part) in bytes.chunks(bytes.len().div_ceil(3)).enumerate() {
        write(&models.join(format!("{}.p{i:02}", name(legacy))), part)?;
    }
    write(
        &models.join(chunker::sidecar_name(&name(legacy))),
        chunker::format_sidecar(&manifest::Sha256Digest::of_bytes(&bytes), &name(legacy))
            .as_bytes(),
    )?;
    // A model built on this device, and the DM set of the old tree.
    write(
        &models.join(name(LOCAL_MODEL)),
        &story::stand_in_bytes(27, 20_000),
    )?;
    for dm in DM_FILES {
        copy_file(&device.builtin_dir().join(dm), &models.join(dm))?;
    }
    // The manager's own refresh of that generation (as after any boot) lists the local model.
    refresh(&["refresh"])?;
    Ok(())
}

// ---- small helpers ---------------------------------------------------------------------------

fn os<const N: usize>(words: &[&str], paths: [&Path; N]) -> Vec<OsString> {
    words
        .iter()
        .map(OsString::from)
        .chain(paths.iter().map(|p| p.as_os_str().to_owned()))
        .collect()
}

fn read_manifest(path: &Path) -> Result<Manifest> {
    let bytes = fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Manifest::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

fn write_exec(path: &Path, bytes: &[u8]) -> Result<()> {
    write(path, bytes)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn copy_file(from: &Path, to: &Path) -> Result<()> {
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| format!("{} -> {}: {e}", from.display(), to.display()))
}

pub fn model_id(id: &str) -> Result<ModelId> {
    id.parse().map_err(|e| format!("{id}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driving_artifacts_are_every_form_but_local_models() {
        let state = DeviceState {
            models: [
                ("tr16223_driving_tinygrad.pkl", true),
                ("tr16223_driving_tinygrad.pkl.p00", true),
                ("rdf43_driving_tinygrad.pkl.chunk01of03", true),
                ("rdf43_driving_tinygrad.pkl.chunkmanifest", true),
                ("rdf43_driving_tinygrad.pkl.sha256", true),
                ("driving_tinygrad.pkl", true),
                ("local-mine_driving_tinygrad.pkl", false),
                ("dmonitoring_model_tinygrad.pkl", false),
                ("dm_warp_1344x760_tinygrad.pkl", false),
                (".model_versions.json", false),
            ]
            .iter()
            .map(|(n, _)| (n.to_string(), "d".to_string()))
            .collect(),
            params: BTreeMap::new(),
        };
        let mut want: Vec<&str> = [
            "tr16223_driving_tinygrad.pkl",
            "tr16223_driving_tinygrad.pkl.p00",
            "rdf43_driving_tinygrad.pkl.chunk01of03",
            "rdf43_driving_tinygrad.pkl.chunkmanifest",
            "rdf43_driving_tinygrad.pkl.sha256",
            "driving_tinygrad.pkl",
        ]
        .to_vec();
        want.sort();
        assert_eq!(state.driving_artifacts(), want);
        assert!(
            !state
                .files_not_the_managers()
                .contains_key(".model_versions.json")
        );
        assert_eq!(state.files_not_the_managers().len(), 9);
    }

    #[test]
    fn the_current_generation_is_the_newest_pinned_one() {
        let (generation, pin) = current_generation();
        assert_eq!(
            PinTable::builtin().get(generation).map(|p| p.to_string()),
            Some(pin)
        );
        assert!(PinTable::builtin().iter().all(|(g, _)| g <= generation));
    }
}
