//! `release-cli manifest validate|fmt|diff|set-artifact`.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};
use manifest::{Limits, Manifest, ManifestDiff, ValidationMode};
use serde_json::{Value, json};

use crate::input::{parse_manifest, read_bounded, read_limited, read_manifest, too_large_message};
use crate::output::print_json;
use crate::{CliError, CliResult};

#[derive(Debug, Subcommand)]
pub enum ManifestCommand {
    /// Check a manifest and list every problem with its JSON path. Exits 3 if there is any.
    Validate(ValidateArgs),
    /// Print the manifest's canonical bytes (what the Python release tools write) on stdout.
    Fmt(FmtArgs),
    /// Show, model by model, what was added, removed and changed between two manifests.
    ///
    /// Exits 0 when they are the same, 1 when they differ (as diff(1)), 2 when a file cannot be
    /// read, 3 when one is not a valid manifest. Coloured on a terminal unless NO_COLOR is set (see --color).
    Diff(DiffArgs),
    /// Sign a manifest with a minisign key: writes MANIFEST.minisig with the trusted comment
    /// `generation=<gen> release=<N> expires=<unix seconds>`.
    Sign(super::sign::SignArgs),
    /// Check a manifest's signature as a device with these public keys would. Exits 3 if a
    /// device would refuse it.
    Verify(super::sign::VerifyArgs),
    /// Write a chunk set's size, SHA-256, chunk count and per-chunk digests into its model's
    /// entry (after checking that it is an OOB container and agrees with its `.sha256`).
    SetArtifact(SetArtifactArgs),
}

#[derive(Debug, Args)]
pub struct SetArtifactArgs {
    /// The manifest to update in place (atomically, in canonical form).
    pub manifest: PathBuf,
    /// The model's chunk set directory, e.g. `ready/pop223/` (holding
    /// `pop223_driving_tinygrad.pkl.chunkNNofMM` and `.chunkmanifest`).
    pub dir: PathBuf,
    /// The model ID (default: DIR's name).
    #[arg(long, value_name = "ID")]
    pub model: Option<manifest::ModelId>,
    /// Set the entry's `accelerator_artifacts.<NAME>` variant (e.g. `chestnut`) instead of the
    /// entry's own artifact: DIR holds the variant's chunk set (named by its
    /// `artifact_filename`); size, SHA-256 and chunk count are written into the variant.
    #[arg(long, value_name = "NAME")]
    pub variant: Option<String>,
    /// Make every check (the entry exists, a complete chunk set, OOB container, every chunk
    /// read and hashed, the `.sha256` sidecar agrees) and print the values that would be written
    /// into the entry. Leaves MANIFEST untouched (no temporary either).
    #[arg(long)]
    pub dry_run: bool,
    /// Print `{"manifest","model","size","sha256","chunk_count","chunk_sha256":[…]}` (with
    /// `"dry_run":true` under --dry-run).
    #[arg(long)]
    pub json: bool,
}

/// How much `validate` demands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// What every device enforces when reading: shape, valid unique IDs, well-formed fields.
    Reader,
    /// A complete catalog, with or without artifact fields (e.g. the v25 catalog).
    Catalog,
    /// What `publish` accepts: every entry downloadable (format, size, SHA-256, chunk count).
    Release,
}

impl From<Mode> for ValidationMode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Reader => ValidationMode::Reader,
            Mode::Catalog => ValidationMode::Catalog,
            Mode::Release => ValidationMode::Release,
        }
    }
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The manifest, e.g. `model_names_v25.json`.
    pub file: PathBuf,
    /// Strictness; `release` is what `publish` requires.
    #[arg(long, value_enum, default_value_t = Mode::Catalog)]
    pub mode: Mode,
    /// The openpilot checkout: its recorded pins and what it declares (a v26 tree's catalog
    /// module, reviewed `catalog-vNN.json` and `upstream-sync.json`) decide the contract the
    /// manifest's generation runs, and the manifest must then carry that generation's revision
    /// and (v26) only rows of the tree's reviewed catalog. Without it, a manifest whose
    /// `artifact_abi` names a contract is judged by that contract's rules.
    #[arg(long, value_name = "DIR")]
    pub openpilot: Option<PathBuf>,
    /// Print `{"file","mode","contract","valid","models","problems":[{"path","message"}]}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("fmt_mode").args(["check", "write"])))]
pub struct FmtArgs {
    /// The manifest to format.
    pub file: PathBuf,
    /// Print nothing; exit 3 if the file is not already in canonical form.
    #[arg(long)]
    pub check: bool,
    /// Rewrite FILE in canonical form (atomically) instead of printing it.
    #[arg(long, conflicts_with = "check")]
    pub write: bool,
    /// With --write: parse FILE and print whether it would be rewritten; leaves FILE untouched
    /// (no temporary either).
    #[arg(long, requires = "write")]
    pub dry_run: bool,
    /// With --check: print `{"file","canonical"}`; with --write: `{"file","changed"}` (with
    /// `"dry_run":true` under --dry-run).
    #[arg(long, requires = "fmt_mode")]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The old manifest (e.g. the live one).
    pub old: PathBuf,
    /// The new manifest.
    pub new: PathBuf,
    /// Print `{"top_level":[…],"added":[…],"removed":[…],"changed":[{"id","fields":[{"field","old","new"}]}]}`.
    #[arg(long)]
    pub json: bool,
}

pub fn run(command: ManifestCommand) -> CliResult {
    match command {
        ManifestCommand::Validate(a) => validate(a),
        ManifestCommand::Fmt(a) => fmt(a),
        ManifestCommand::Diff(a) => diff(a),
        ManifestCommand::Sign(a) => super::sign::sign(a),
        ManifestCommand::Verify(a) => super::sign::verify(a),
        ManifestCommand::SetArtifact(a) => set_artifact(a),
    }
}

fn set_artifact(args: SetArtifactArgs) -> CliResult {
    let id = model_of(&args)?;
    let manifest_bytes = read_limited(&args.manifest)?;
    let mut m = parse_manifest(&args.manifest, &manifest_bytes)?;
    // The manifest's contract decides the artifact format written, and whether one plain file
    // (count 0) may stand for an artifact that fits one chunk.
    let contract =
        manifest::contract::for_manifest(&manifest::PinTable::builtin(), &manifest_bytes)
            .1
            .contract();
    let name = artifact_name(&m, &id, &args)?;
    let logical = args.dir.join(&name);
    let (pieces, plain) = artifact_pieces(&logical, &name, &args.dir, contract)?;
    chunker::check_oob_reader(
        &mut chunker::ArtifactReader::new(pieces.clone()),
        &logical.display().to_string(),
    )?;
    let mut h = hash_pieces(&pieces)?;
    let sidecar = logical.with_file_name(chunker::sidecar_name(&name));
    if let Some(found) = chunker::read_sidecar(&sidecar)?
        && found != h.sha256
    {
        return Err(CliError::check_failed(format!(
            "{}: says {found}, the chunks hash to {}; nothing was written",
            sidecar.display(),
            h.sha256
        )));
    }
    let count = if plain { 0 } else { pieces.len() as u64 };
    if plain {
        h.chunk_sha256.clear();
    }
    let artifact = manifest::Artifact::for_contract(
        contract,
        manifest::ArtifactSize::new(h.size).map_err(CliError::check_failed)?,
        h.sha256,
        manifest::ChunkCount::new(count).map_err(CliError::check_failed)?,
    );
    let entry = m.get_mut(&id).expect("looked up above");
    match &args.variant {
        None if plain => {
            entry.set_artifact(&artifact);
            Ok(())
        }
        None => entry.set_artifact_with_chunks(&artifact, &h.chunk_sha256),
        Some(v) => entry.set_accelerator_artifact(v, &artifact),
    }
    .map_err(CliError::failure)?;
    if !args.dry_run {
        // The error names the manifest (fs_err).
        chunker::atomic::write_atomic(&args.manifest, &m.to_canonical_bytes())
            .map_err(|e| CliError::failure(e.to_string()))?;
    }
    report_set_artifact(&args, &id, &h, count)
}

/// The model `set-artifact` sets: `--model`, else the directory's name.
fn model_of(args: &SetArtifactArgs) -> CliResult<manifest::ModelId> {
    match &args.model {
        Some(id) => Ok(id.clone()),
        None => args
            .dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .parse()
            .map_err(|e| {
                CliError::usage(format!(
                    "{}: the directory name is not a model ID ({e}); pass --model ID",
                    args.dir.display()
                ))
            }),
    }
}

/// The logical file name of `id`'s artifact (or its `--variant`'s) in `m`.
fn artifact_name(
    m: &Manifest,
    id: &manifest::ModelId,
    args: &SetArtifactArgs,
) -> CliResult<String> {
    let entry = m.get(id).ok_or_else(|| {
        CliError::check_failed(format!(
            "{}: no entry for model {id}; add it first (nothing was written)",
            args.manifest.display()
        ))
    })?;
    let name = match &args.variant {
        None => entry.file_name(),
        Some(v) => entry.accelerator_file_name(v).ok_or_else(|| {
            CliError::check_failed(format!(
                "{}: model {id} has no accelerator_artifacts.{v} variant; add it (with its \
                 execution_device) first (nothing was written)",
                args.manifest.display()
            ))
        })?,
    };
    Ok(name.as_str().to_string())
}

/// The files of the artifact at `logical` (each with its size), and whether it is one plain
/// file the contract publishes as such (count 0).
fn artifact_pieces(
    logical: &Path,
    name: &str,
    dir: &Path,
    contract: &manifest::contract::Contract,
) -> CliResult<(Vec<(PathBuf, u64)>, bool)> {
    match chunker::resolve(logical)? {
        Some(chunker::Resolved::Chunked { pieces, .. }) => Ok((pieces, false)),
        Some(chunker::Resolved::Plain { path, size })
            if contract.plain_file_when_one_chunk && size <= chunker::DEFAULT_CHUNK_SIZE =>
        {
            Ok((vec![(path, size)], true))
        }
        Some(chunker::Resolved::Plain { size, .. }) if contract.plain_file_when_one_chunk => {
            Err(CliError::check_failed(format!(
                "{}: a plain file of {size} bytes; the {} contract publishes a plain file only \
                 when it fits one chunk ({} bytes): split it with `release-cli chunk split` \
                 (nothing was written)",
                logical.display(),
                contract.name,
                chunker::DEFAULT_CHUNK_SIZE
            )))
        }
        Some(other) => Err(CliError::check_failed(format!(
            "{}: found a {} artifact; a release entry describes a chunk set (release-cli chunk split)",
            logical.display(),
            other.form()
        ))),
        None => Err(CliError::check_failed(format!(
            "{}: no complete chunk set ({name}.chunkmanifest and every chunk)",
            dir.display()
        ))),
    }
}

/// An artifact's size and digests, read in one pass.
struct Hashed {
    size: u64,
    sha256: chunker::Sha256Digest,
    /// Each piece's digest, in order.
    chunk_sha256: Vec<chunker::Sha256Digest>,
}

/// One pass over `pieces`: each chunk's digest and the whole artifact's.
fn hash_pieces(pieces: &[(PathBuf, u64)]) -> CliResult<Hashed> {
    use std::io::Read;
    let mut whole = chunker::Hasher::new();
    let mut chunk_sha256 = Vec::new();
    let mut size = 0u64;
    let mut buf = vec![0u8; chunker::IO_BUFFER_SIZE];
    for (path, _) in pieces {
        let failed = |e: std::io::Error| CliError::failure(format!("{}: {e}", path.display()));
        let mut f = std::fs::File::open(path).map_err(failed)?;
        let mut h = chunker::Hasher::new();
        loop {
            let n = f.read(&mut buf).map_err(failed)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            whole.update(&buf[..n]);
            size += n as u64;
        }
        chunk_sha256.push(h.finish());
    }
    Ok(Hashed {
        size,
        sha256: whole.finish(),
        chunk_sha256,
    })
}

/// What `set-artifact` set (or would set under `--dry-run`), as text or `--json`.
fn report_set_artifact(
    args: &SetArtifactArgs,
    id: &manifest::ModelId,
    h: &Hashed,
    count: u64,
) -> CliResult {
    if args.json {
        #[derive(serde::Serialize)]
        struct SetArtifactReport<'a, V: serde::Serialize> {
            manifest: &'a Path,
            model: &'a str,
            variant: &'a V,
            size: u64,
            sha256: String,
            chunk_count: usize,
            chunk_sha256: Vec<String>,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            dry_run: bool,
        }
        return print_json(&SetArtifactReport {
            manifest: &args.manifest,
            model: id.as_str(),
            variant: &args.variant,
            size: h.size,
            sha256: h.sha256.to_hex(),
            chunk_count: count as usize,
            chunk_sha256: h.chunk_sha256.iter().map(|d| d.to_hex()).collect(),
            dry_run: args.dry_run,
        });
    }
    crate::outln!(
        "{}{}: {id} {}= {} bytes, sha256 {}, {} chunk(s) (with per-chunk digests)",
        if args.dry_run { "dry run: " } else { "" },
        args.manifest.display(),
        if args.dry_run { "would be set " } else { "" },
        h.size,
        h.sha256,
        count
    )?;
    if args.dry_run {
        crate::outln!("nothing was changed; run the same command without --dry-run")?;
    }
    Ok(())
}

fn load(path: &Path) -> CliResult<Manifest> {
    Ok(read_manifest(path)?.1)
}

fn validate(args: ValidateArgs) -> CliResult {
    let (bytes, problems) = match read_bounded(&args.file)? {
        Ok(bytes) => {
            let problems =
                validate_under_contract(&bytes, args.mode.into(), args.openpilot.as_deref())?;
            (bytes, problems)
        }
        Err(size) => (
            Vec::new(),
            (
                manifest::contract::BASE_CONTRACT,
                vec![manifest::Problem {
                    path: "$".into(),
                    message: too_large_message(size),
                }],
            ),
        ),
    };
    let (contract, problems) = problems;
    // The number of entries the file lists, valid or not; `None` when it has no models array.
    let models = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|doc| match doc {
            serde_json::Value::Array(items) => Some(items.len()),
            doc => doc.get("models")?.as_array().map(Vec::len),
        });
    let mode = clap::ValueEnum::to_possible_value(&args.mode)
        .map(|v| v.get_name().to_string())
        .unwrap_or_default();
    if args.json {
        #[derive(serde::Serialize)]
        struct ProblemLine<'a> {
            path: &'a str,
            message: &'a str,
        }
        #[derive(serde::Serialize)]
        struct ValidateReport<'a> {
            file: &'a Path,
            mode: &'a str,
            contract: manifest::ContractName,
            valid: bool,
            models: Option<usize>,
            problems: Vec<ProblemLine<'a>>,
        }
        print_json(&ValidateReport {
            file: &args.file,
            mode: &mode,
            contract,
            valid: problems.is_empty(),
            models,
            problems: problems
                .iter()
                .map(|p| ProblemLine {
                    path: &p.path,
                    message: &p.message,
                })
                .collect(),
        })?;
    } else if problems.is_empty() {
        crate::outln!(
            "ok: {} is a valid manifest ({} models, {mode} rules{})",
            args.file.display(),
            models.unwrap_or(0),
            if contract == manifest::contract::BASE_CONTRACT {
                String::new()
            } else {
                format!(", {contract} contract")
            }
        )?;
        if args.mode != Mode::Release {
            cli_support::info!(
                "next: `release-cli manifest validate --mode release {}` checks what publish requires",
                args.file.display()
            );
        }
    } else {
        for p in &problems {
            crate::outln!("{p}")?;
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CliError::check_failed(format!(
            "{}: {} problem{} ({mode} rules{})",
            args.file.display(),
            problems.len(),
            if problems.len() == 1 { "" } else { "s" },
            if contract == manifest::contract::BASE_CONTRACT {
                String::new()
            } else {
                format!(", {contract} contract")
            }
        ))
        .after_json_report())
    }
}

/// The contract that judges `bytes` ([`manifest::contract::for_manifest`] over the pins of
/// `openpilot`, or the built-in ones) and its problems. With a tree, the generation's pin and
/// the tree's declaration (for the same generation) are expected; without one, nothing is.
fn validate_under_contract(
    bytes: &[u8],
    mode: ValidationMode,
    openpilot: Option<&Path>,
) -> CliResult<(manifest::ContractName, Vec<manifest::Problem>)> {
    let (pins, declared) = release::tree::load_tree(openpilot)?;
    let (generation, contract) = manifest::contract::for_manifest(&pins, bytes);
    let with_tree = openpilot.is_some();
    let expect = manifest::Expectation {
        generation: generation.filter(|_| with_tree),
        revision: generation.filter(|_| with_tree).and_then(|g| pins.get(g)),
        tree: declared
            .as_ref()
            .filter(|d| Some(d.generation) == generation),
    };
    Ok((
        contract,
        manifest::validate_for_contract(
            bytes,
            mode,
            contract.contract(),
            &expect,
            &Limits::default(),
        ),
    ))
}

fn fmt(args: FmtArgs) -> CliResult {
    let original = read_limited(&args.file)?;
    let canonical = parse_manifest(&args.file, &original)?.to_canonical_bytes();
    if args.check {
        let is_canonical = canonical == original;
        if args.json {
            #[derive(serde::Serialize)]
            struct FmtCheck<'a> {
                file: &'a Path,
                canonical: bool,
            }
            print_json(&FmtCheck {
                file: &args.file,
                canonical: is_canonical,
            })?;
        }
        return if is_canonical {
            Ok(())
        } else {
            Err(CliError::check_failed(format!(
                "{} is not in canonical form; `release-cli manifest fmt --write {}` rewrites it",
                args.file.display(),
                args.file.display()
            ))
            .after_json_report())
        };
    }
    if args.write {
        let changed = canonical != original;
        if changed && !args.dry_run {
            // The error names the file (fs_err).
            chunker::atomic::write_atomic(&args.file, &canonical)
                .map_err(|e| CliError::failure(e.to_string()))?;
        }
        if args.json {
            #[derive(serde::Serialize)]
            struct FmtWrite<'a> {
                file: &'a Path,
                changed: bool,
                #[serde(skip_serializing_if = "std::ops::Not::not")]
                dry_run: bool,
            }
            return print_json(&FmtWrite {
                file: &args.file,
                changed,
                dry_run: args.dry_run,
            });
        }
        let what = match (changed, args.dry_run) {
            (true, false) => "rewritten in canonical form".to_string(),
            (true, true) => format!(
                "dry run: would be rewritten in canonical form ({} bytes, was {}); nothing was changed",
                canonical.len(),
                original.len()
            ),
            (false, _) => "already canonical".to_string(),
        };
        // A dry run's answer is its result: stdout, like the other dry runs.
        if args.dry_run {
            crate::outln!("{}: {what}", args.file.display())?;
        } else {
            cli_support::info!("{}: {what}", args.file.display());
        }
        return Ok(());
    }
    crate::output::write_stdout(&canonical)
}

fn diff(args: DiffArgs) -> CliResult {
    // As diff(1): 1 means "they differ", so a file that cannot be read is 2, not 1.
    let trouble = |e: CliError| {
        if e.code() == crate::output::EXIT_FAILURE {
            e.with_code(crate::output::EXIT_USAGE)
        } else {
            e
        }
    };
    let old = load(&args.old).map_err(trouble)?;
    let new = load(&args.new).map_err(trouble)?;
    let d = manifest::diff(&old, &new);
    if args.json {
        print_json(&diff_json(&d))?;
    } else {
        let mut text = render_diff(&d, cli_support::colour_on(false));
        if !d.is_empty() {
            text.push_str(&format!(
                "summary: {} added, {} removed, {} changed\n",
                d.added.len(),
                d.removed.len(),
                d.changed.len()
            ));
        }
        crate::output::write_stdout(text.as_bytes())?;
    }
    if d.is_empty() {
        Ok(())
    } else {
        Err(CliError::quiet(crate::output::EXIT_FAILURE))
    }
}

/// The diff's text, one line per change; with `color`, added lines green, removed red, changed
/// yellow (anstyle's ANSI SGR, as clap styles its help).
fn render_diff(d: &ManifestDiff, color: bool) -> String {
    use anstyle::AnsiColor;
    let plain = d.to_string();
    if !color {
        return plain;
    }
    plain
        .lines()
        .map(|l| {
            let colour = match l.chars().next() {
                Some('+') => AnsiColor::Green,
                Some('-') => AnsiColor::Red,
                Some('~') => AnsiColor::Yellow,
                _ => return format!("{l}\n"),
            };
            let style = colour.on_default();
            format!("{style}{l}{style:#}\n")
        })
        .collect()
}

fn diff_json(d: &ManifestDiff) -> Value {
    let field = |c: &manifest::FieldChange| json!({"field": c.field, "old": c.old, "new": c.new});
    json!({
        "top_level": d.top_level.iter().map(field).collect::<Vec<_>>(),
        "added": d.added.iter().map(|id| id.as_str()).collect::<Vec<_>>(),
        "removed": d.removed.iter().map(|id| id.as_str()).collect::<Vec<_>>(),
        "changed": d.changed.iter().map(|m| json!({
            "id": m.id.as_str(),
            "fields": m.fields.iter().map(field).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_marks_added_removed_and_changed_lines_only() {
        let old = Manifest::from_slice(
            br#"{"models": [{"id": "a1", "name": "A"}, {"id": "b1", "name": "B"}]}"#,
        )
        .unwrap();
        let new = Manifest::from_slice(
            br#"{"models": [{"id": "a1", "name": "A2"}, {"id": "c1", "name": "C"}]}"#,
        )
        .unwrap();
        let d = manifest::diff(&old, &new);
        let plain = render_diff(&d, false);
        assert!(!plain.contains('\x1b'));
        let coloured = render_diff(&d, true);
        assert!(
            coloured.contains("\x1b[32m+ model c1\x1b[0m\n"),
            "{coloured:?}"
        );
        assert!(
            coloured.contains("\x1b[31m- model b1\x1b[0m\n"),
            "{coloured:?}"
        );
        assert!(
            coloured.contains("\x1b[33m~ model a1\x1b[0m\n"),
            "{coloured:?}"
        );
        // Field lines under a changed model stay plain.
        assert!(coloured.contains("\n    name"), "{coloured:?}");
        let stripped = coloured.replace("\x1b[32m", "").replace("\x1b[31m", "");
        let stripped = stripped.replace("\x1b[33m", "").replace("\x1b[0m", "");
        assert_eq!(stripped, plain);
    }
}
