//! The pure core: what to run on the comma and with which arguments. Nothing here does I/O, so
//! every command line is unit-tested.

use std::fmt;

use cli_support::shell_quote;
use manifest::{BehaviorVersion, ModelId};

use crate::target::RemotePath;

/// The staging directory for ONNX sources, under the remote root.
pub const STAGING_DIR: &str = "uncompiledmodels";
/// Where `./models` writes its outputs, under the remote root.
pub const OUTPUT_DIR: &str = "compiledmodels";
/// The tinygrad marker, under the remote root.
pub const MARKER: &str = "tinygrad_repo/TINYGRAD_COMMIT";
/// Where the seed builds the DM set.
pub const DEFAULT_DM_OUTPUT_DIR: &str = "/tmp/dm_artifacts";

/// The four driver-monitoring files, replaced together once per generation.
pub const DM_FILES: [&str; 4] = manifest::layout::DM_FILES;

/// How the model's ONNX sources are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InputFormat {
    /// One `driving_supercombo.onnx` (or `big_driving_supercombo.onnx`): the compiler default.
    #[default]
    Supercombo,
    /// Legacy split sources: `driving_vision.onnx` plus a policy ONNX.
    Split,
}

impl InputFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            InputFormat::Supercombo => "supercombo",
            InputFormat::Split => "split",
        }
    }
}

impl std::str::FromStr for InputFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "supercombo" => Ok(InputFormat::Supercombo),
            "split" => Ok(InputFormat::Split),
            other => Err(format!(
                "unknown input format {other:?}; use supercombo or split"
            )),
        }
    }
}

impl fmt::Display for InputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One model to compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileRequest {
    /// The release model ID (without `local-`; [`CompileRequest::local`] adds it).
    pub id: ModelId,
    pub version: BehaviorVersion,
    /// Compile for Chestnut, the USB AMD external GPU.
    pub gpu: bool,
    pub input_format: InputFormat,
    /// A `local-<id>` build: one plain PKL for one device, never published.
    pub local: bool,
}

impl CompileRequest {
    /// The ID the compiler builds: `local-<id>` for a local build.
    pub fn build_id(&self) -> ModelId {
        if self.local {
            self.id.to_local()
        } else {
            self.id.clone()
        }
    }

    /// `<build id>_driving_tinygrad.pkl`.
    pub fn artifact_name(&self) -> String {
        manifest::layout::artifact_file_name(&self.build_id())
            .as_str()
            .to_string()
    }

    /// The arguments after `./models`. Input and output directories are always explicit so a
    /// non-default remote root cannot make the compiler read or write the default one.
    pub fn models_args(&self, input_dir: &RemotePath, output_dir: &RemotePath) -> Vec<String> {
        let mut args = vec![
            format!("--{}", self.build_id()),
            "--version".to_string(),
            self.version.to_string(),
        ];
        if self.gpu {
            args.push("--gpu".to_string());
        }
        if self.input_format == InputFormat::Split {
            args.push("--input-format".to_string());
            args.push("split".to_string());
        }
        args.extend([
            "--input-dir".to_string(),
            input_dir.to_string(),
            "--output-dir".to_string(),
            output_dir.to_string(),
        ]);
        args
    }
}

/// Join words into one shell command line, each quoted.
pub fn shell_words<S: AsRef<str>>(words: &[S]) -> String {
    words
        .iter()
        .map(|w| shell_quote(w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `cd ROOT && ./models ARGS 2>&1`: one merged stream, so the log reads in the order it happened.
pub fn run_models_command(root: &RemotePath, args: &[String]) -> String {
    format!(
        "cd {} && ./models {} 2>&1",
        shell_quote(root.as_str()),
        shell_words(args)
    )
}

/// Empty the staging directory (a stale input there could be picked up by the compiler) and
/// remove any earlier outputs of this artifact, so whatever is fetched afterwards is new.
pub fn prepare_command(staging: &RemotePath, output: &RemotePath, artifact: &str) -> String {
    clear_command(staging, Some(output), &artifact_outputs(output, artifact))
}

/// Remove the staged sources and this artifact's outputs after a build.
pub fn cleanup_command(staging: &RemotePath, output: &RemotePath, artifact: &str) -> String {
    clear_command(staging, None, &artifact_outputs(output, artifact))
}

/// `rm -rf STAGING && mkdir -p STAGING [DIR] && rm -f FILES` (`files`: already quoted).
fn clear_command(staging: &RemotePath, also_make: Option<&RemotePath>, files: &str) -> String {
    let s = shell_quote(staging.as_str());
    let also = also_make.map_or(String::new(), |d| format!(" {}", shell_quote(d.as_str())));
    format!("rm -rf {s} && mkdir -p {s}{also} && rm -f {files}")
}

/// `OUTPUT/NAME OUTPUT/NAME.*`, quoted.
fn artifact_outputs(output: &RemotePath, artifact: &str) -> String {
    let (o, a) = (shell_quote(output.as_str()), shell_quote(artifact));
    format!("{o}/{a} {o}/{a}.*")
}

/// `cd ROOT && ./models --dm --input-dir STAGING --output-dir OUT 2>&1`.
pub fn dm_args(input_dir: &RemotePath, output_dir: &RemotePath) -> Vec<String> {
    vec![
        "--dm".to_string(),
        "--input-dir".to_string(),
        input_dir.to_string(),
        "--output-dir".to_string(),
        output_dir.to_string(),
    ]
}

/// One of `sync`'s four transfers: a part of the openpilot tree, sent to the same relative
/// path under the remote root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncPart {
    /// The path relative to the openpilot tree and to the remote root.
    pub rel: &'static str,
    /// A directory, sent as `rel/` into `rel/`.
    pub is_dir: bool,
    /// rsync's options for it.
    pub options: &'static [&'static str],
}

/// The seed's four transfers, in order: `tinygrad_repo/` exactly (without git metadata or
/// bytecode), `selfdrive/modeld/`, the compiler script, the `./models` launcher.
pub const SYNC_PARTS: [SyncPart; 4] = [
    SyncPart {
        rel: "tinygrad_repo",
        is_dir: true,
        options: &["-az", "--delete", "--exclude=.git", "--exclude=__pycache__"],
    },
    SyncPart {
        rel: "selfdrive/modeld",
        is_dir: true,
        options: &["-az"],
    },
    SyncPart {
        rel: "scripts/model_compiler.py",
        is_dir: false,
        options: &["-az"],
    },
    SyncPart {
        rel: "models",
        is_dir: false,
        options: &["-az"],
    },
];

/// Where a tree records the tinygrad it runs, on this machine and on the compiler alike: the
/// seed's marker ([`MARKER`]), or, in a tree that declares its generation (upstream's catalog
/// module, [`manifest::contract::TreeMarkers`]), the `commit` of the tinygrad dependency in its
/// sync file (`upstream-sync.json`), which is where upstream's compiler takes the revision its
/// build receipts name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PinLocation {
    #[default]
    Marker,
    Declared(manifest::contract::TreeMarkers),
}

impl PinLocation {
    /// The file, relative to the tree's root.
    pub fn rel(&self) -> &'static str {
        match self {
            PinLocation::Marker => MARKER,
            PinLocation::Declared(m) => m.sync_file,
        }
    }

    /// The commit the file's bytes record (the marker's trimmed text; the sync file's
    /// dependency), or why it records none.
    pub fn commit_in(&self, bytes: &[u8]) -> std::result::Result<String, String> {
        match self {
            PinLocation::Marker => Ok(String::from_utf8_lossy(bytes).trim().to_string()),
            PinLocation::Declared(m) => {
                manifest::contract::parse_sync_file(bytes, m.tinygrad_dependency)
                    .map(|c| c.to_string())
            }
        }
    }

    /// What `sync` sends from a tree whose pin is recorded here: the seed's four parts, and for
    /// a tree that declares its generation its sync file (the compiler's receipts take their
    /// revision from it) and the catalog module's package (upstream's compiler runs
    /// `starpilot.models.compile` and reads the catalog from there).
    pub fn sync_parts(&self) -> Vec<SyncPart> {
        let mut parts = SYNC_PARTS.to_vec();
        if let PinLocation::Declared(m) = self {
            parts.push(SyncPart {
                rel: m.sync_file,
                is_dir: false,
                options: &["-az"],
            });
            if let Some((package, _)) = m.catalog_module.rsplit_once('/') {
                parts.push(SyncPart {
                    rel: package,
                    is_dir: true,
                    options: &["-az", "--delete", "--exclude=__pycache__"],
                });
            }
        }
        parts
    }
}

impl SyncPart {
    /// How `sync` reports it: `tinygrad_repo/ -> /data/openpilot/tinygrad_repo/ (--delete)`.
    pub fn describe(&self, dst: &RemotePath) -> String {
        let slash = if self.is_dir { "/" } else { "" };
        let delete = if self.options.contains(&"--delete") {
            " (--delete)"
        } else {
            ""
        };
        format!("{}{slash} -> {dst}{slash}{delete}", self.rel)
    }
}

/// `mkdir -p` of the directories the sync transfers of `parts` go into: each directory part
/// and each file part's parent, once, in order.
pub fn sync_mkdir_command(root: &RemotePath, parts: &[SyncPart]) -> crate::Result<String> {
    let mut rels: Vec<&str> = Vec::new();
    for part in parts {
        let dir = if part.is_dir {
            Some(part.rel)
        } else {
            part.rel.rsplit_once('/').map(|(d, _)| d)
        };
        if let Some(d) = dir.filter(|d| !rels.contains(d)) {
            rels.push(d);
        }
    }
    let dirs = rels
        .iter()
        .map(|d| root.join(d).map(|p| p.to_string()))
        .collect::<crate::Result<Vec<_>>>()?;
    Ok(format!("mkdir -p {}", shell_words(&dirs)))
}

/// Print the marker, or exit 3 when there is none (distinct from a failing cat or ssh's 255).
pub fn read_marker_command(marker: &RemotePath) -> String {
    let q = shell_quote(marker.as_str());
    format!("[ -f {q} ] || exit 3; cat {q}")
}

/// rsync's options to send sources into the staging directory.
pub const SEND_OPTIONS: [&str; 1] = ["-a"];

/// rsync's options to fetch exactly the outputs of artifact `name`.
pub fn fetch_options(name: &str) -> Vec<String> {
    vec![
        "-a".to_string(),
        format!("--include={name}"),
        format!("--include={name}.*"),
        "--exclude=*".to_string(),
    ]
}

/// rsync's options to fetch exactly the four DM files.
pub fn dm_fetch_options() -> Vec<String> {
    let mut v = vec!["-a".to_string()];
    v.extend(DM_FILES.iter().map(|f| format!("--include={f}")));
    v.push("--exclude=*".to_string());
    v
}

/// The four DM files in `output`, quoted.
fn dm_paths(output: &RemotePath) -> crate::Result<String> {
    let paths: Vec<String> = DM_FILES
        .iter()
        .map(|f| output.join(f).map(|p| p.to_string()))
        .collect::<crate::Result<_>>()?;
    Ok(shell_words(&paths))
}

/// Empty the staging directory and remove earlier DM outputs before a DM build.
pub fn dm_prepare_command(staging: &RemotePath, output: &RemotePath) -> crate::Result<String> {
    Ok(clear_command(staging, Some(output), &dm_paths(output)?))
}

/// Remove the staged DM sources and the DM outputs after a DM build.
pub fn dm_cleanup_command(staging: &RemotePath, output: &RemotePath) -> crate::Result<String> {
    Ok(clear_command(staging, None, &dm_paths(output)?))
}

/// Make room for the chunk set `name` in the models directory the validator reads.
pub fn validate_prepare_command(models_dir: &RemotePath, name: &str) -> String {
    let m = shell_quote(models_dir.as_str());
    format!(
        "mkdir -p {m} && {}",
        validate_cleanup_command(models_dir, name)
    )
}

/// Remove the chunk set `name` from the models directory after validation.
pub fn validate_cleanup_command(models_dir: &RemotePath, name: &str) -> String {
    let (m, q) = (shell_quote(models_dir.as_str()), shell_quote(name));
    format!("rm -f {m}/{q} {m}/{q}.*")
}

/// The p95 latency bound a validator is given: its flag and the bound in milliseconds (the
/// contract's, `manifest::contract::LatencyReport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyBound {
    pub flag: &'static str,
    pub ms: u32,
}

/// `cd ROOT && PYTHON scripts/validate_model_artifact.py --model ID --version vN`, and the
/// latency bound's `FLAG MS` when there is one (the validator then fails a camera over it).
pub fn validate_command(
    root: &RemotePath,
    python: &str,
    id: &ModelId,
    version: BehaviorVersion,
    bound: Option<LatencyBound>,
) -> String {
    let bound = bound.map_or(String::new(), |b| {
        format!(" {} {}", shell_quote(b.flag), b.ms)
    });
    format!(
        "cd {} && {} scripts/validate_model_artifact.py --model {} --version {}{bound}",
        shell_quote(root.as_str()),
        shell_quote(python),
        shell_quote(id.as_str()),
        version
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: &str) -> CompileRequest {
        CompileRequest {
            id: id.parse().unwrap(),
            version: "v16".parse().unwrap(),
            gpu: false,
            input_format: InputFormat::Supercombo,
            local: false,
        }
    }

    #[test]
    fn models_command_lines() {
        let root: RemotePath = "/data/openpilot".parse().unwrap();
        let i = root.join(STAGING_DIR).unwrap();
        let o = root.join(OUTPUT_DIR).unwrap();
        let r = req("pop223");
        assert_eq!(
            run_models_command(&root, &r.models_args(&i, &o)),
            "cd /data/openpilot && ./models --pop223 --version v16 --input-dir \
             /data/openpilot/uncompiledmodels --output-dir /data/openpilot/compiledmodels 2>&1"
        );
        let mut g = req("bmrlnapv6");
        g.gpu = true;
        g.input_format = InputFormat::Split;
        let args = g.models_args(&i, &o);
        assert_eq!(
            &args[..6],
            [
                "--bmrlnapv6",
                "--version",
                "v16",
                "--gpu",
                "--input-format",
                "split"
            ]
        );
        let mut l = req("mine");
        l.local = true;
        assert_eq!(l.models_args(&i, &o)[0], "--local-mine");
        assert_eq!(l.artifact_name(), "local-mine_driving_tinygrad.pkl");
        assert_eq!(r.artifact_name(), "pop223_driving_tinygrad.pkl");
    }

    /// A v25 tree's pin is its marker and sync sends the seed's four parts; a tree declaring a
    /// v26-contract generation (v26, or a made-up v27 inheriting that contract: the markers
    /// are the contract's, not the generation's) records it in its sync file, and sync also
    /// sends that file and the catalog's package, making their directories first.
    #[test]
    fn where_a_tree_records_its_pin_and_what_sync_sends() {
        let root: RemotePath = "/data/openpilot".parse().unwrap();
        let v25 = PinLocation::Marker;
        assert_eq!(v25.rel(), "tinygrad_repo/TINYGRAD_COMMIT");
        assert_eq!(v25.sync_parts(), SYNC_PARTS.to_vec());
        let sha = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";
        assert_eq!(v25.commit_in(format!("{sha}\n").as_bytes()).unwrap(), sha);
        let markers = manifest::ContractName::V26.contract().tree.unwrap();
        let v26 = PinLocation::Declared(markers);
        assert_eq!(v26.rel(), "upstream-sync.json");
        let sync = format!(
            r#"{{"dependencies": [{{"path": "panda", "commit": "{}"}}, {{"path": "tinygrad_repo", "commit": "{sha}"}}]}}"#,
            "0".repeat(40)
        );
        assert_eq!(v26.commit_in(sync.as_bytes()).unwrap(), sha);
        // A marker's text is not a sync file.
        let e = v26.commit_in(format!("{sha}\n").as_bytes()).unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
        let parts = v26.sync_parts();
        let rels: Vec<&str> = parts.iter().map(|p| p.rel).collect();
        assert_eq!(
            rels,
            [
                "tinygrad_repo",
                "selfdrive/modeld",
                "scripts/model_compiler.py",
                "models",
                "upstream-sync.json",
                "starpilot/models"
            ]
        );
        assert!(parts[5].is_dir && !parts[4].is_dir);
        assert_eq!(
            sync_mkdir_command(&root, &parts).unwrap(),
            "mkdir -p /data/openpilot/tinygrad_repo /data/openpilot/selfdrive/modeld \
             /data/openpilot/scripts /data/openpilot/starpilot/models"
        );
    }

    #[test]
    fn sync_and_dm_and_validate_command_lines() {
        let root: RemotePath = "/data/openpilot".parse().unwrap();
        let described: Vec<String> = SYNC_PARTS
            .iter()
            .map(|p| p.describe(&root.join(p.rel).unwrap()))
            .collect();
        assert_eq!(
            described,
            [
                "tinygrad_repo/ -> /data/openpilot/tinygrad_repo/ (--delete)",
                "selfdrive/modeld/ -> /data/openpilot/selfdrive/modeld/",
                "scripts/model_compiler.py -> /data/openpilot/scripts/model_compiler.py",
                "models -> /data/openpilot/models",
            ]
        );
        assert_eq!(
            sync_mkdir_command(&root, &SYNC_PARTS).unwrap(),
            "mkdir -p /data/openpilot/tinygrad_repo /data/openpilot/selfdrive/modeld \
             /data/openpilot/scripts"
        );
        let s = root.join(STAGING_DIR).unwrap();
        let dm: RemotePath = DEFAULT_DM_OUTPUT_DIR.parse().unwrap();
        let prep = dm_prepare_command(&s, &dm).unwrap();
        assert!(
            prep.starts_with(
                "rm -rf /data/openpilot/uncompiledmodels && mkdir -p \
                 /data/openpilot/uncompiledmodels /tmp/dm_artifacts && rm -f /tmp/dm_artifacts/"
            ),
            "{prep}"
        );
        assert_eq!(prep.matches("/tmp/dm_artifacts/").count(), 4);
        let m: RemotePath = "/data/models".parse().unwrap();
        assert_eq!(
            validate_prepare_command(&m, "x_driving_tinygrad.pkl"),
            "mkdir -p /data/models && rm -f /data/models/x_driving_tinygrad.pkl \
             /data/models/x_driving_tinygrad.pkl.*"
        );
        assert_eq!(
            validate_command(
                &root,
                "/usr/bin/python3",
                &"x".parse().unwrap(),
                "v3".parse().unwrap(),
                None
            ),
            "cd /data/openpilot && /usr/bin/python3 scripts/validate_model_artifact.py --model x \
             --version v3"
        );
        // Under a contract with a latency bound, the validator is given it (v26's table row:
        // upstream's rebuild passes `--max-p95-ms 50`).
        let v26 = manifest::ContractName::V26.contract();
        let bound = LatencyBound {
            flag: v26.validation_latency.unwrap().bound_flag,
            ms: v26.validation_p95_ms.unwrap(),
        };
        assert_eq!(
            validate_command(
                &root,
                "/usr/bin/python3",
                &"x".parse().unwrap(),
                "v3".parse().unwrap(),
                Some(bound)
            ),
            "cd /data/openpilot && /usr/bin/python3 scripts/validate_model_artifact.py --model x \
             --version v3 --max-p95-ms 50"
        );
    }

    #[test]
    fn prepare_and_cleanup_touch_only_this_artifact() {
        let s: RemotePath = "/r/uncompiledmodels".parse().unwrap();
        let o: RemotePath = "/r/compiledmodels".parse().unwrap();
        let p = prepare_command(&s, &o, "pop223_driving_tinygrad.pkl");
        assert_eq!(
            p,
            "rm -rf /r/uncompiledmodels && mkdir -p /r/uncompiledmodels /r/compiledmodels && \
             rm -f /r/compiledmodels/pop223_driving_tinygrad.pkl \
             /r/compiledmodels/pop223_driving_tinygrad.pkl.*"
        );
        assert!(
            cleanup_command(&s, &o, "x_driving_tinygrad.pkl")
                .starts_with("rm -rf /r/uncompiledmodels")
        );
    }
}
