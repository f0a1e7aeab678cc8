//! Edits of the local openpilot checkout: `tinygrad bump` (replace `tinygrad_repo/`, record the
//! generation↔pin pair) and `builtin` (the built-in driving model as a native chunk set).
//!
//! Each edit is decided in full before anything is written, and can stop there (`dry_run`),
//! reporting what it would write and remove. The writes themselves are crash-safe: the tree is
//! swapped by rename, and the built-in chunk set goes through chunker's staged install (chunks
//! durable under temporary names, then renamed into place, the chunk manifest last, the old
//! forms removed only once the new set is complete).

use fs_err as fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use chunker::{SplitOptions, atomic};
use manifest::{Generation, GitCommit, PinTable, TreeDeclaration};
use serde::Serialize;

use crate::{Error, Result};

/// `tinygrad_pins.json` holds one line per generation; a megabyte is far beyond any real table.
pub const MAX_PINS_FILE_BYTES: u64 = 1 << 20;

/// The built-in pins plus those `tinygrad bump` recorded in `<openpilot>/tinygrad_pins.json`,
/// plus what the tree declares ([`tree_declaration`]): its generation's pin and contract.
pub fn load_pins(openpilot: Option<&Path>) -> Result<PinTable> {
    Ok(load_tree(openpilot)?.0)
}

/// [`load_pins`] and the tree's declaration together (the declaration's catalog rows are what
/// a contract that takes its entries from the tree checks manifests against).
pub fn load_tree(openpilot: Option<&Path>) -> Result<(PinTable, Option<TreeDeclaration>)> {
    let mut pins = load_recorded_pins(openpilot)?;
    let Some(dir) = openpilot else {
        return Ok((pins, None));
    };
    let declared = tree_declaration(dir)?;
    if let Some(d) = &declared {
        // The catalog module of the contract the declaration came from.
        let tree = d.contract.contract().tree;
        let module = tree.map_or_else(|| dir.to_path_buf(), |t| dir.join(t.catalog_module));
        pins.declare(d).map_err(|refusal| Error::Pins {
            path: module,
            problem: format!(
                "the tree declares {} with compiler revision {} under the {} contract, but: \
                 {refusal}",
                d.generation, d.compiler_revision, d.contract
            ),
        })?;
    }
    Ok((pins, declared))
}

/// A reviewed catalog is a manifest-sized document.
pub const MAX_TREE_CATALOG_BYTES: u64 = manifest::Limits::DEFAULT_MAX_MANIFEST_BYTES;

/// What the openpilot tree declares about its generation: for each contract whose trees declare
/// themselves (upstream's v26 catalog module, its reviewed `catalog-vNN.json` beside it and
/// `upstream-sync.json`), read through the bounded reader; `None` for a tree that carries no
/// such module (a v25 tree). A module whose declaration cannot be read is an error naming it.
pub fn tree_declaration(openpilot: &Path) -> Result<Option<TreeDeclaration>> {
    for contract in manifest::contract::declaring_contracts() {
        let Some(markers) = contract.tree else {
            continue;
        };
        let module = openpilot.join(markers.catalog_module);
        let mut files = manifest::TreeFiles {
            catalog_module: fs::symlink_metadata(&module).is_ok_and(|m| m.is_file()),
            ..Default::default()
        };
        if !files.catalog_module {
            continue;
        }
        let catalog_dir = module.parent().unwrap_or(openpilot).to_path_buf();
        let mut names: Vec<String> = fs::read_dir(&catalog_dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| manifest::contract::parse_tree_catalog_name(contract, n).is_some())
            .collect();
        names.sort();
        for name in names {
            let path = catalog_dir.join(&name);
            if let Some(bytes) = chunker::bounded::read_capped(&path, MAX_TREE_CATALOG_BYTES)? {
                files.catalogs.push((name, bytes));
            }
        }
        files.sync_file =
            chunker::bounded::read_capped(&openpilot.join(markers.sync_file), MAX_PINS_FILE_BYTES)?;
        return manifest::contract::declaration(contract.name, &files).map_err(|problem| {
            Error::Pins {
                path: module,
                problem,
            }
        });
    }
    Ok(None)
}

// ---- the tinygrad a tree runs -------------------------------------------------------------

/// Where the tinygrad pin of the tree at hand is recorded, and the pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreePin {
    pub commit: GitCommit,
    /// The file that records it: the sync file of a tree that declares its generation, else
    /// `tinygrad_repo/TINYGRAD_COMMIT`.
    pub recorded_in: PathBuf,
    /// The tree's declaration, when it makes one.
    pub declared: Option<TreeDeclaration>,
}

/// The decision, pure: a tree that declares its generation records its compiler revision in
/// its sync file (`declared`); a marker (`tinygrad_repo/TINYGRAD_COMMIT`, as read, `None`
/// when absent) beside it must name the same commit or nothing can be built from it (`Err`
/// with what the marker holds). A tree that declares nothing has only its marker: `None`
/// here, and the marker's own reader says what is wrong with it.
pub fn declared_pin(
    declared: Option<&GitCommit>,
    marker: Option<&str>,
) -> std::result::Result<Option<GitCommit>, String> {
    match (declared, marker) {
        (None, _) => Ok(None),
        (Some(d), Some(m)) if m.trim() != d.as_str() => Err(m.trim().to_string()),
        (Some(d), _) => Ok(Some(d.clone())),
    }
}

/// The tinygrad the tree at `openpilot` runs, the pin every release-side reader (`sync`,
/// `compile`, `dm`, `validate`, `builtin`, `preflight`, `rehearse`, `status`) builds and judges
/// with: for a tree that declares its generation (upstream's catalog module), the compiler
/// revision its sync file records ([`load_tree`]), refused when `tinygrad_repo/TINYGRAD_COMMIT`
/// names another ([`Error::TreePinDisagrees`]); for any other tree, its marker.
pub fn tree_pin(openpilot: &Path) -> Result<TreePin> {
    let (_, declared) = load_tree(Some(openpilot))?;
    let marker_path = openpilot.join(compiler_remote::MARKER_PATH);
    let marker = compiler_remote::read_tree_pin(openpilot);
    let Some(d) = declared else {
        return Ok(TreePin {
            commit: marker?,
            recorded_in: marker_path,
            declared: None,
        });
    };
    let found = match &marker {
        Ok(c) => Some(c.to_string()),
        Err(compiler_remote::Error::Pin {
            problem: compiler_remote::PinProblem::MarkerMissing,
            ..
        }) => None,
        Err(compiler_remote::Error::Pin {
            problem: compiler_remote::PinProblem::NotACommit { found, .. },
            ..
        }) => Some(found.clone()),
        Err(_) => return Err(marker.unwrap_err().into()),
    };
    let markers = d
        .contract
        .contract()
        .tree
        .expect("a declaring contract names its tree markers");
    let sync_file = openpilot.join(markers.sync_file);
    match declared_pin(Some(&d.compiler_revision), found.as_deref()) {
        Ok(commit) => Ok(TreePin {
            commit: commit.unwrap_or_else(|| d.compiler_revision.clone()),
            recorded_in: sync_file,
            declared: Some(d),
        }),
        Err(found) => Err(Error::TreePinDisagrees {
            marker: marker_path,
            found,
            sync_file,
            declared: d.compiler_revision.clone(),
            generation: d.generation,
        }),
    }
}

/// The pin to build with: `--tinygrad-commit` when given, else [`tree_pin`] of `--openpilot`.
pub fn resolve_pin(explicit: Option<GitCommit>, openpilot: Option<&Path>) -> Result<GitCommit> {
    match (explicit, openpilot) {
        (Some(c), _) => Ok(c),
        (None, Some(dir)) => Ok(tree_pin(dir)?.commit),
        (None, None) => Ok(compiler_remote::resolve_pin(None, None)?),
    }
}

/// The built-in pins plus those recorded in `tinygrad_pins.json`.
fn load_recorded_pins(openpilot: Option<&Path>) -> Result<PinTable> {
    let mut pins = PinTable::builtin();
    let Some(dir) = openpilot else {
        return Ok(pins);
    };
    let path = dir.join(manifest::pins::PINS_FILE);
    // Size-capped, regular files only: a FIFO or /dev/zero planted here must not hang or fill
    // memory (the chunker's error names the path and the limit).
    match chunker::bounded::read_capped(&path, MAX_PINS_FILE_BYTES)? {
        Some(bytes) => pins
            .merge_json(&bytes)
            .map_err(|problem| Error::Pins { path, problem })?,
        None => {
            if !dir.is_dir() {
                return Err(Error::NotADirectory {
                    flag: "--openpilot",
                    path: dir.to_path_buf(),
                });
            }
        }
    }
    Ok(pins)
}

pub use compiler_remote::synced::SyncRecord;
pub use compiler_remote::tree_digest::TreeDigest;
/// The digest of what a sync of `openpilot` would send now: equal to the record's `digest`
/// when the tree is what the last sync sent.
pub use compiler_remote::tree_digest::sync_digest;

/// A reader that reports each read's byte count and the total to expect (for a progress bar).
struct ReadProgress<R, F> {
    inner: R,
    total: u64,
    on_read: F,
}

impl<R: Read, F: FnMut(u64, u64)> Read for ReadProgress<R, F> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        (self.on_read)(n as u64, self.total);
        Ok(n)
    }
}

// ---- tinygrad bump ------------------------------------------------------------------------

/// What `tinygrad bump` is asked to do.
#[derive(Debug, Clone)]
pub struct BumpRequest {
    /// The openpilot tree whose `tinygrad_repo/` is replaced.
    pub openpilot: PathBuf,
    /// The tinygrad tree at the new commit: a git checkout (its HEAD is the commit) or a plain
    /// directory (then `commit` is required).
    pub tinygrad_src: PathBuf,
    /// The full tinygrad commit: required for a plain directory; for a git checkout it must be
    /// HEAD when given.
    pub commit: Option<GitCommit>,
    /// Decide and report, write nothing.
    pub dry_run: bool,
}

/// A generation change: `from` is the current generation, `to` the one the new pin makes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GenerationMove {
    pub from: Generation,
    pub to: Generation,
}

/// Where `tinygrad bump` took the tree from, recorded in
/// `tinygrad_repo/`[`TINYGRAD_SOURCE_FILE`] beside `TINYGRAD_COMMIT`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct TinygradSource {
    /// The commit recorded as the tree's pin.
    pub commit: GitCommit,
    /// `git` when the commit was read from the checkout's HEAD, `directory` when it was given
    /// (`--commit`) for a tree without git metadata.
    pub kind: SourceKind,
    /// `--tinygrad-src` as given.
    pub path: PathBuf,
    /// The digest of the source tree as copied (without git metadata; see
    /// [`compiler_remote::tree_digest`]): what the given commit stands for.
    pub digest: TreeDigest,
}

/// How the commit of a tinygrad source is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    Git,
    Directory,
}

/// The source record in `tinygrad_repo/`.
pub const TINYGRAD_SOURCE_FILE: &str = "TINYGRAD_SOURCE.json";

/// What `tinygrad bump` did (or, with `dry_run`, would do).
#[derive(Debug, Clone, Serialize)]
pub struct BumpReport {
    pub openpilot: PathBuf,
    pub commit: GitCommit,
    /// Where the tree came from and its digest (also written to the tree).
    pub source: TinygradSource,
    /// Files copied from the tinygrad tree (no git metadata).
    pub files: u64,
    /// `None` when `commit` is already the current generation's pin (same ABI).
    pub generation: Option<GenerationMove>,
    /// `path:line` of `MANIFEST_CANDIDATES` in the device code, when found.
    pub manifest_candidates: Option<String>,
    /// The current generation (the highest of `MANIFEST_CANDIDATES`, else v25).
    #[serde(skip)]
    pub current: Generation,
    pub dry_run: bool,
    /// The paths written (a directory stands for its whole new content).
    pub written: Vec<PathBuf>,
    /// The paths removed (a directory stands for its whole old content).
    pub removed: Vec<PathBuf>,
}

/// Replace `tinygrad_repo/` and record the pin, or with `dry_run` say what that would do.
/// Every refusal (a pin the rules refuse, a checkout at another commit) comes before any write.
pub fn bump(req: &BumpRequest) -> Result<BumpReport> {
    let src = &req.tinygrad_src;
    for (flag, dir) in [("--tinygrad-src", src), ("--openpilot", &req.openpilot)] {
        if !dir.is_dir() {
            return Err(Error::NotADirectory {
                flag,
                path: dir.clone(),
            });
        }
    }
    // The generation↔pin pair first: the same pin as the current generation is the same ABI
    // (no new generation); a new pin makes the next generation, and a pin another generation
    // has, or a second pin for the next generation, is refused.
    let mut pins = load_pins(Some(&req.openpilot))?;
    let candidates = find_manifest_candidates(&req.openpilot);
    let tree_generation = tree_marker(&req.openpilot)?.and_then(|c| pins.owner_of(&c));
    let current = current_generation(
        candidates
            .as_ref()
            .and_then(|(_, _, gens)| gens.iter().max().copied()),
        tree_generation,
    );
    let (commit, kind) = source_commit(src, req.commit.as_ref())?;
    let generation = next_generation(&mut pins, current, &commit).map_err(|e| match e {
        Error::BumpRefused {
            refusal: manifest::PinRefusal::Conflict { generation, .. },
        } => Error::BumpPinned {
            generation,
            commit: commit.clone(),
            openpilot: req.openpilot.clone(),
            candidates: candidates
                .as_ref()
                .map(|(p, line, _)| format!("{}:{line}", p.display())),
        },
        other => other,
    })?;
    let source = TinygradSource {
        commit: commit.clone(),
        kind,
        path: src.clone(),
        digest: compiler_remote::tree_digest::dir_digest(src, &[".git"])?,
    };

    let op = &req.openpilot;
    let dest = op.join("tinygrad_repo");
    let pins_path = op.join(manifest::pins::PINS_FILE);
    let mut written = vec![
        dest.clone(),
        dest.join("TINYGRAD_COMMIT"),
        dest.join(TINYGRAD_SOURCE_FILE),
    ];
    if generation.is_some() {
        written.push(pins_path.clone());
    }
    let removed: Vec<PathBuf> = dest.exists().then(|| dest.clone()).into_iter().collect();
    let files = if req.dry_run {
        walk_tree_without_git(src, None)?
    } else {
        let files = replace_tree(src, op, &source)?;
        // Recorded after the swap: a crash in between leaves the pair unrecorded, and rerunning
        // the same bump records it.
        if generation.is_some() {
            atomic::write_atomic(&pins_path, pins.to_json().as_bytes())?;
        }
        files
    };
    Ok(BumpReport {
        openpilot: op.clone(),
        commit,
        source,
        files,
        generation,
        manifest_candidates: candidates.map(|(p, line, _)| format!("{}:{line}", p.display())),
        current,
        dry_run: req.dry_run,
        written,
        removed,
    })
}

/// The generation a bump starts from: the newest in `MANIFEST_CANDIDATES` (`candidates`); where
/// the tree has none, the generation whose pin the tree's tinygrad is (`tree`); else the
/// newest built-in one. Pure.
pub fn current_generation(candidates: Option<Generation>, tree: Option<Generation>) -> Generation {
    candidates
        .or(tree)
        .unwrap_or(manifest::layout::CURRENT_GENERATION)
}

/// `<openpilot>/tinygrad_repo/TINYGRAD_COMMIT`, capped and regular-file-only; `None` when it
/// is missing or not a commit (the bump replaces it).
fn tree_marker(openpilot: &Path) -> Result<Option<GitCommit>> {
    let path = openpilot.join(compiler_remote::MARKER_PATH);
    Ok(chunker::bounded::read_capped(&path, 1024)?
        .and_then(|b| String::from_utf8_lossy(&b).trim().parse().ok()))
}

/// The generation a bump to `commit` makes, recorded into `pins`: `None` when `commit` is
/// already `current`'s pin; else `current`'s successor, if the pin rules accept the pair.
pub fn next_generation(
    pins: &mut PinTable,
    current: Generation,
    commit: &GitCommit,
) -> Result<Option<GenerationMove>> {
    if pins.owner_of(commit) == Some(current) {
        return Ok(None);
    }
    let to = current.next().ok_or(Error::LastGeneration {
        generation: current,
    })?;
    pins.record(to, commit)
        .map_err(|refusal| Error::BumpRefused { refusal })?;
    Ok(Some(GenerationMove { from: current, to }))
}

/// The commit a bump records, and how it is known: a git checkout's HEAD (a `given` commit
/// must be it), or for a tree without git metadata the `given` commit, which is then required.
fn source_commit(src: &Path, given: Option<&GitCommit>) -> Result<(GitCommit, SourceKind)> {
    if !src.join(".git").exists() {
        return match given {
            Some(c) => Ok((c.clone(), SourceKind::Directory)),
            None => Err(Error::BumpNeedsCommit {
                path: src.to_path_buf(),
            }),
        };
    }
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(src)
            .args(args)
            .output();
        out.map_err(|source| Error::Git {
            path: src.to_path_buf(),
            source,
        })
    };
    let out = git(&["rev-parse", "--verify", "HEAD^{commit}"])?;
    let head = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let parsed: Option<GitCommit> = head.parse().ok();
    let Some(head) = parsed.filter(|_| out.status.success()) else {
        return Err(Error::CheckoutWithoutCommit {
            path: src.to_path_buf(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    };
    if let Some(c) = given.filter(|c| **c != head) {
        return Err(Error::CheckoutAtOtherCommit {
            path: src.to_path_buf(),
            head: head.to_string(),
            commit: c.clone(),
        });
    }
    // Every file but `.git` is copied, so a modified or untracked file (ignored ones are build
    // output and stay allowed) would be recorded as HEAD without being it.
    let status = git(&["status", "--porcelain", "--untracked-files=all"])?;
    if !status.status.success() {
        return Err(Error::CheckoutWithoutCommit {
            path: src.to_path_buf(),
            detail: String::from_utf8_lossy(&status.stderr).trim().to_string(),
        });
    }
    let lines: Vec<String> = String::from_utf8_lossy(&status.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    if !lines.is_empty() {
        let mut changes: Vec<String> = lines.iter().take(10).cloned().collect();
        if lines.len() > 10 {
            changes.push(format!("… {} more", lines.len() - 10));
        }
        return Err(Error::CheckoutDirty {
            path: src.to_path_buf(),
            head,
            changes,
        });
    }
    Ok((head, SourceKind::Git))
}

/// Copy `src` (without git metadata) beside `<op>/tinygrad_repo`, write its TINYGRAD_COMMIT,
/// and swap it in by rename so `tinygrad_repo/` is never half old, half new. Returns the number
/// of files copied.
fn replace_tree(src: &Path, op: &Path, source: &TinygradSource) -> Result<u64> {
    let dest = op.join("tinygrad_repo");
    let new = op.join(format!("{}tinygrad_repo-new", atomic::TEMP_PREFIX));
    let old = op.join(format!("{}tinygrad_repo-old", atomic::TEMP_PREFIX));
    for p in [&new, &old] {
        if p.exists() {
            fs::remove_dir_all(p)?;
        }
    }
    let files = walk_tree_without_git(src, Some(&new))?;
    atomic::write_atomic(
        new.join("TINYGRAD_COMMIT"),
        format!("{}\n", source.commit).as_bytes(),
    )?;
    crate::records::write(&new.join(TINYGRAD_SOURCE_FILE), source)?;
    if dest.exists() {
        fs::rename(&dest, &old)?;
    }
    fs::rename(&new, &dest)?;
    atomic::sync_dir(op)?;
    if old.exists() {
        fs::remove_dir_all(&old)?;
    }
    Ok(files)
}

/// Count the files of a tree, skipping every `.git` entry (directory or gitfile) at any depth,
/// and copy them to `dst` when given (symlinks as symlinks).
fn walk_tree_without_git(src: &Path, dst: Option<&Path>) -> Result<u64> {
    if let Some(dst) = dst {
        fs::create_dir_all(dst)?;
    }
    let mut count = 0;
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        if entry.file_name() == ".git" {
            continue;
        }
        let from = entry.path();
        let to = dst.map(|d| d.join(entry.file_name()));
        let ty = entry.file_type()?;
        if ty.is_dir() {
            count += walk_tree_without_git(&from, to.as_deref())?;
            continue;
        }
        if let Some(to) = &to {
            if ty.is_symlink() {
                let target = fs::read_link(&from)?;
                fs::os::unix::fs::symlink(&target, to)?;
            } else {
                fs::copy(&from, to)?;
            }
        }
        count += 1;
    }
    Ok(count)
}

/// The largest device source file searched for `MANIFEST_CANDIDATES`.
const MAX_TREE_SOURCE_BYTES: u64 = 4 << 20;

/// Find `MANIFEST_CANDIDATES = ("v25",)` in the device code under `starpilot/`: the file, the
/// 1-based line and the generations listed.
fn find_manifest_candidates(openpilot: &Path) -> Option<(PathBuf, usize, Vec<Generation>)> {
    let mut stack = vec![openpilot.join("starpilot")];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        let mut entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "py") {
                // Bounded and non-blocking (a FIFO named `*.py` is skipped, not waited on).
                let Ok(Some(bytes)) = chunker::bounded::read_capped(&p, MAX_TREE_SOURCE_BYTES)
                else {
                    continue;
                };
                let Ok(text) = String::from_utf8(bytes) else {
                    continue;
                };
                let lines: Vec<&str> = text.lines().collect();
                for (i, line) in lines.iter().enumerate() {
                    // The definition (`= (…)`, or annotated `: tuple[str, ...] = (…)`), not a
                    // use; a tuple that spans lines is read to its closing parenthesis.
                    let Some(rest) = line.trim_start().strip_prefix("MANIFEST_CANDIDATES") else {
                        continue;
                    };
                    if !rest.trim_start().starts_with(['=', ':']) {
                        continue;
                    }
                    let mut value = rest.to_string();
                    let mut j = i + 1;
                    while value.contains('(') && !value.contains(')') && j < lines.len() {
                        value.push_str(lines[j]);
                        j += 1;
                    }
                    return Some((p, i + 1, parse_generations(&value)));
                }
            }
        }
    }
    None
}

/// One place in the tree that names the generation the device runs: StarPilot's
/// `MANIFEST_CANDIDATES`, the catalog module's `GENERATION` and the reviewed `catalog-vNN.json`
/// of a tree that declares its contract.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    /// `MANIFEST_CANDIDATES`, `GENERATION` or `the reviewed catalog`.
    pub what: &'static str,
    pub path: PathBuf,
    /// 1-based line (0: the file as a whole, a catalog named for its generation).
    pub line: usize,
    pub generations: Vec<Generation>,
}

/// Every generation selector the tree carries ([`Selector`]); a tree with none (a stand-in
/// without StarPilot's device code) has nothing to check.
pub fn generation_selectors(openpilot: &Path) -> Result<Vec<Selector>> {
    let mut out = Vec::new();
    if let Some((path, line, generations)) = find_manifest_candidates(openpilot) {
        out.push(Selector {
            what: "MANIFEST_CANDIDATES",
            path,
            line,
            generations,
        });
    }
    for contract in manifest::contract::declaring_contracts() {
        let Some(markers) = contract.tree else {
            continue;
        };
        let module = openpilot.join(markers.catalog_module);
        if let Ok(Some(bytes)) = chunker::bounded::read_capped(&module, MAX_TREE_SOURCE_BYTES) {
            let text = String::from_utf8_lossy(&bytes);
            for (i, line) in text.lines().enumerate() {
                let Some(rest) = line.strip_prefix("GENERATION") else {
                    continue;
                };
                if rest.trim_start().starts_with(['=', ':']) {
                    out.push(Selector {
                        what: "GENERATION",
                        path: module.clone(),
                        line: i + 1,
                        generations: parse_generations(rest),
                    });
                    break;
                }
            }
        }
    }
    if let Some(d) = tree_declaration(openpilot)? {
        let markers = d.contract.contract().tree.expect("a declaring contract");
        out.push(Selector {
            what: "the reviewed catalog",
            path: openpilot.join(
                markers
                    .catalog_json
                    .replace("{gen}", &d.generation.to_string()),
            ),
            line: 0,
            generations: vec![d.generation],
        });
    }
    Ok(out)
}

/// What is wrong with the tree's selectors for a tree whose tinygrad is `generation`'s pin:
/// each must name exactly that generation (one, never an older one kept as a fallback), each
/// problem with the edit that fixes it. Pure.
pub fn selector_problems(selectors: &[Selector], generation: Generation) -> Vec<String> {
    selectors
        .iter()
        .filter(|s| s.generations != [generation])
        .map(|s| {
            let at = if s.line == 0 {
                s.path.display().to_string()
            } else {
                format!("{}:{}", s.path.display(), s.line)
            };
            let named: Vec<String> = s.generations.iter().map(|g| format!("\"{g}\"")).collect();
            match s.what {
                "MANIFEST_CANDIDATES" => format!(
                    "{at}: MANIFEST_CANDIDATES names ({},), the tree's tinygrad is {generation}'s \
                     pin: set it to (\"{generation}\",)",
                    named.join(", ")
                ),
                "GENERATION" => format!(
                    "{at}: GENERATION is {}, the tree's tinygrad is {generation}'s pin: set it to \
                     \"{generation}\"",
                    if named.is_empty() {
                        "no generation".to_string()
                    } else {
                        named.join(", ")
                    }
                ),
                _ => format!(
                    "{at}: the reviewed catalog is {}'s, the tree's tinygrad is {generation}'s \
                     pin: review its rows and rename it to {}",
                    named.join(", "),
                    s.path
                        .file_name()
                        .map(|n| n.to_string_lossy().replace(
                            &s.generations
                                .first()
                                .map(|g| g.to_string())
                                .unwrap_or_default(),
                            &generation.to_string()
                        ))
                        .unwrap_or_default()
                ),
            }
        })
        .collect()
}

/// The generation the tree runs (the one whose pin its recorded tinygrad is) and what its
/// selectors get wrong about it ([`selector_problems`]); `None` when the marker is missing or
/// no generation's pin (other checks name that).
pub fn tree_generation(openpilot: &Path) -> Result<Option<(Generation, Vec<String>)>> {
    let pins = load_pins(Some(openpilot))?;
    // The tinygrad where the tree records it (its sync file when it declares its generation).
    let Ok(marker) = tree_pin(openpilot).map(|p| p.commit) else {
        return Ok(None);
    };
    let Some(generation) = pins.owner_of(&marker) else {
        return Ok(None);
    };
    let problems = selector_problems(&generation_selectors(openpilot)?, generation);
    Ok(Some((generation, problems)))
}

/// Refuse a tree whose generation selectors do not name exactly the generation of its tinygrad
/// ([`tree_generation`]): `status`, `preflight`, `rehearse` and `publish` run this before
/// anything else. Returns the tree's generation.
pub fn check_selectors(openpilot: &Path) -> Result<Option<Generation>> {
    match tree_generation(openpilot)? {
        Some((generation, problems)) if !problems.is_empty() => Err(Error::GenerationSelector {
            openpilot: openpilot.to_path_buf(),
            generation,
            problems,
        }),
        other => Ok(other.map(|(g, _)| g)),
    }
}

/// The `"vNN"` strings in a Python tuple literal.
fn parse_generations(text: &str) -> Vec<Generation> {
    text.split(['"', '\''])
        .filter_map(|s| s.parse::<Generation>().ok())
        .collect()
}

// ---- tinygrad pin (correct an unpublished pin) ---------------------------------------------

/// What a store holds live for the generation whose pin is being corrected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveManifest {
    /// The store, as it describes itself.
    pub store: String,
    /// The manifest's path in the store.
    pub path: String,
    /// The manifest's `tinygrad_commit`, if it records one.
    pub tinygrad_commit: Option<GitCommit>,
}

/// `tinygrad pin`'s decision: the corrected table, and the pin it replaces (`None` when the
/// generation already has `new`, which changes nothing).
///
/// Refused: a generation whose pin is built in (it is code, not a record), one without a
/// recorded pin (`tinygrad bump` records one), a pin another generation has, and a generation
/// some checked store holds live with another pin (a published pin never changes: bump to the
/// next generation instead). At least one store must have been checked.
pub fn decide_pin_correction(
    pins: &PinTable,
    generation: Generation,
    new: &GitCommit,
    live: &[LiveManifest],
    stores_checked: usize,
) -> Result<(PinTable, Option<GitCommit>)> {
    if let Some(pin) = PinTable::builtin().get(generation) {
        return Err(Error::PinBuiltin {
            generation,
            pin: pin.clone(),
        });
    }
    let old = pins
        .get(generation)
        .ok_or(Error::PinNotRecorded { generation })?
        .clone();
    if stores_checked == 0 {
        return Err(Error::PinNoStoreChecked { generation });
    }
    if let Some(l) = live
        .iter()
        .find(|l| l.tinygrad_commit.as_ref() != Some(new))
    {
        return Err(Error::PinLive {
            generation,
            store: l.store.clone(),
            path: l.path.clone(),
            recorded: l.tinygrad_commit.clone(),
        });
    }
    if &old == new {
        return Ok((pins.clone(), None));
    }
    let mut corrected = PinTable::builtin();
    for (g, c) in pins.iter().filter(|(g, _)| *g != generation) {
        corrected
            .record(g, c)
            .map_err(|refusal| Error::BumpRefused { refusal })?;
    }
    corrected
        .record(generation, new)
        .map_err(|refusal| Error::PinCorrectionRefused { refusal })?;
    Ok((corrected, Some(old)))
}

/// What `tinygrad pin` is asked to do.
#[derive(Debug, Clone)]
pub struct PinRequest {
    pub openpilot: PathBuf,
    pub generation: Generation,
    pub commit: GitCommit,
    pub dry_run: bool,
}

/// What `tinygrad pin` did (or, with `dry_run`, would do).
#[derive(Debug, Clone, Serialize)]
pub struct PinReport {
    pub generation: Generation,
    /// The pin replaced; `None` when the generation already had `commit`.
    pub from: Option<GitCommit>,
    pub to: GitCommit,
    /// The stores checked for a live manifest of the generation.
    pub stores_checked: Vec<String>,
    /// `tinygrad_repo/` was copied from a git checkout at the old pin: its content is that
    /// commit, so its marker is left as it is and the tree must be bumped again from a
    /// checkout at the corrected pin.
    pub tree_from_git: bool,
    pub dry_run: bool,
    /// The files written (the pin table; the marker and the source record when they named the
    /// old pin of a tree that was not copied from git).
    pub written: Vec<PathBuf>,
}

/// The live manifest of `generation` in `store`, if it holds one.
pub fn live_manifest(
    store: &dyn artifact_store::Store,
    generation: Generation,
) -> Result<Option<LiveManifest>> {
    let path = manifest::StoreLayout::HfBucket.manifest_path(generation);
    let Some(bytes) = store.read_small(&path, manifest::Limits::DEFAULT_MAX_MANIFEST_BYTES)? else {
        return Ok(None);
    };
    let m = manifest::Manifest::from_slice(&bytes).map_err(|e| Error::PinStoreUnreadable {
        store: store.describe(),
        path: path.to_string(),
        problem: e.to_string(),
    })?;
    Ok(Some(LiveManifest {
        store: store.describe(),
        path: path.to_string(),
        tinygrad_commit: m.tinygrad_commit(),
    }))
}

/// Correct the recorded pin of a generation no checked store holds live: rewrite
/// `tinygrad_pins.json`, and when `tinygrad_repo/` was not copied from a git checkout, its
/// `TINYGRAD_COMMIT` and source record if they name the old pin. Every refusal comes before
/// any write.
pub fn correct_pin(req: &PinRequest, stores: &[&dyn artifact_store::Store]) -> Result<PinReport> {
    let op = &req.openpilot;
    let pins = load_pins(Some(op))?;
    let mut live = Vec::new();
    for store in stores {
        live.extend(live_manifest(*store, req.generation)?);
    }
    let (corrected, old) =
        decide_pin_correction(&pins, req.generation, &req.commit, &live, stores.len())?;
    let marker = op.join(compiler_remote::MARKER_PATH);
    let source_path = op.join("tinygrad_repo").join(TINYGRAD_SOURCE_FILE);
    // The source record is small; anything else there (not a regular file, too large, not
    // JSON) is not one and is left alone.
    let is_record =
        fs::symlink_metadata(&source_path).is_ok_and(|m| m.is_file() && m.len() < 64 * 1024);
    let source: Option<TinygradSource> = if is_record {
        chunker::bounded::read_capped(&source_path, 64 * 1024)?
            .and_then(|b| serde_json::from_slice(&b).ok())
    } else {
        None
    };
    let tree_from_git =
        matches!(&source, Some(s) if s.kind == SourceKind::Git && Some(&s.commit) == old.as_ref());
    let mut written = Vec::new();
    if let Some(old) = &old {
        written.push(op.join(manifest::pins::PINS_FILE));
        // Bounded and non-blocking: a marker that is not a small regular file is not the old pin.
        let marker_is_old = chunker::bounded::read_capped(&marker, 4096)
            .ok()
            .flatten()
            .is_some_and(|t| String::from_utf8_lossy(&t).trim() == old.as_str());
        if !tree_from_git && marker_is_old {
            written.push(marker.clone());
        }
        let source = source.filter(|s| !tree_from_git && &s.commit == old);
        if source.is_some() {
            written.push(source_path.clone());
        }
        if !req.dry_run {
            atomic::write_atomic(
                op.join(manifest::pins::PINS_FILE),
                corrected.to_json().as_bytes(),
            )?;
            if written.contains(&marker) {
                atomic::write_atomic(&marker, format!("{}\n", req.commit).as_bytes())?;
            }
            if let Some(mut s) = source {
                s.commit = req.commit.clone();
                crate::records::write(&source_path, &s)?;
            }
        }
    }
    Ok(PinReport {
        generation: req.generation,
        from: old,
        to: req.commit.clone(),
        stores_checked: stores.iter().map(|s| s.describe()).collect(),
        tree_from_git,
        dry_run: req.dry_run,
        written,
    })
}

// ---- builtin ------------------------------------------------------------------------------

/// The built-in model's logical name in the openpilot tree.
pub const BUILTIN_NAME: &str = "driving_tinygrad.pkl";
/// Where the built-in model lives in the openpilot tree.
pub const BUILTIN_DIR: &str = "selfdrive/modeld/models";
/// GitHub refuses files over 100 MB; nothing that size may go into the tree.
const REPOSITORY_FILE_LIMIT: u64 = 100_000_000;
// Every chunk of the built-in set is at most one default chunk.
const _: () = assert!(chunker::DEFAULT_CHUNK_SIZE < REPOSITORY_FILE_LIMIT);

/// What `builtin` did (or, with `dry_run`, would do).
#[derive(Debug, Clone, Serialize)]
pub struct BuiltinReport {
    /// The built-in model's logical path.
    pub path: PathBuf,
    pub size: u64,
    pub sha256: chunker::Sha256Digest,
    pub chunk_count: u32,
    pub dry_run: bool,
    /// The chunk-set files written, by name in the models directory.
    pub written: Vec<String>,
    /// The files of the old built-in removed (the plain PKL, legacy parts, chunks of another
    /// count); files of the same name as a new one are replaced, not listed.
    pub removed: Vec<String>,
}

/// Replace the built-in driving model in `openpilot` with the native chunk set of `artifact`
/// (a plain PKL or a chunk set), or with `dry_run` read it and say what would change.
///
/// Refused before anything changes: a tree without the models directory, an artifact that is
/// not an OOB container, or one whose bytes do not match its own `.sha256` sidecar.
/// `on_read(bytes, total)` is called as the artifact is streamed.
pub fn builtin(
    artifact: &Path,
    openpilot: &Path,
    dry_run: bool,
    on_read: impl FnMut(u64, u64),
) -> Result<BuiltinReport> {
    let models = openpilot.join(BUILTIN_DIR);
    if !models.is_dir() {
        return Err(Error::NotAnOpenpilotTree { path: models });
    }
    // The artifact may carry a sidecar (a compile output does); then it must match. Bounded
    // read: a bogus multi-gigabyte "sidecar" is reported, not loaded.
    let expected = match artifact.file_name() {
        Some(n) => chunker::read_sidecar(
            &artifact.with_file_name(chunker::sidecar_name(&n.to_string_lossy())),
        )?,
        None => None,
    };
    // The runtime gate (contracts with a stamp or receipts): the artifact's stamp must be the
    // tree's pin's and the built-in's version, its receipt beside it must name that pin and
    // these bytes; the receipt is then written beside the installed built-in.
    let receipt = builtin_gate(artifact, openpilot)?;
    let mut reader = chunker::open(artifact)?;
    // The built-in model is a driving artifact like any other: an OOB container.
    chunker::check_oob_reader(&mut reader, &artifact.display().to_string())?;
    reader.seek(SeekFrom::Start(0))?;
    let size = reader.len();
    let reader = ReadProgress {
        inner: reader,
        total: size,
        on_read,
    };
    let matches = |actual: chunker::Sha256Digest| match expected {
        Some(want) if want != actual => Err(Error::SidecarMismatch {
            path: artifact.to_path_buf(),
            actual,
            expected: want,
        }),
        _ => Ok(()),
    };
    let opts = SplitOptions::default();
    let (sha256, chunk_count, removed) = if dry_run {
        let (sha256, _) = chunker::Sha256Digest::of_reader(reader)?;
        matches(sha256)?;
        let count = chunker::chunk_count_for(size, opts.chunk_size) as u32;
        (
            sha256,
            count,
            chunker::other_forms(BUILTIN_NAME, &models, count)?,
        )
    } else {
        let staged = chunker::stage_reader(reader, size, BUILTIN_NAME, &models, &opts)
            .map_err(|e| e.naming_input(artifact))?;
        // Dropping the staged set on a mismatch removes its temporaries: nothing changed.
        matches(staged.sha256())?;
        let (report, removed) = staged.install_replacing()?;
        if let Some(r) = &receipt {
            crate::loadable::write_receipt_beside(&models.join(BUILTIN_NAME), r)?;
        }
        (report.sha256, report.chunk_count, removed)
    };
    Ok(BuiltinReport {
        path: models.join(BUILTIN_NAME),
        size,
        sha256,
        chunk_count,
        dry_run,
        written: chunker::set_file_names(BUILTIN_NAME, chunk_count),
        removed,
    })
}

/// `builtin`'s runtime gate, for the contract of the tree's pin: the artifact checked as the
/// built-in it will be; its receipt, to be written beside the installed built-in (`None`: the
/// contract has no receipts).
fn builtin_gate(
    artifact: &Path,
    openpilot: &Path,
) -> Result<Option<manifest::receipt::BuildReceipt>> {
    // A tree that declares its generation (upstream's catalog module) records its tinygrad in
    // its sync file; any other tree in tinygrad_repo/TINYGRAD_COMMIT.
    let (pins, declared) = load_tree(Some(openpilot))?;
    let pin = match declared {
        Some(_) => Some(tree_pin(openpilot)?.commit),
        None => tree_marker(openpilot)?,
    };
    let contract = match &pin {
        Some(p) => crate::loadable::contract_for_pin(&pins, p),
        None => manifest::contract::BASE_CONTRACT.contract(),
    };
    let file = crate::loadable::builtin_file(artifact);
    let checked = crate::loadable::check_files(&[file], contract, pin.as_ref())?;
    Ok(checked.into_iter().next().and_then(|c| c.receipt))
}

#[cfg(test)]
mod tests {
    use super::*;

    const V25: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";
    const NEW: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";

    /// The agreement rule, as a table: no declaration leaves the marker to its own reader; a
    /// declaration's revision is the pin when the marker is absent or names it, refused (with
    /// what the marker holds) when it names anything else.
    #[test]
    fn a_declared_revision_and_the_marker_must_agree() {
        let d: GitCommit = NEW.parse().unwrap();
        for (declared, marker, want) in [
            (None, None, Ok(None)),
            (None, Some(V25), Ok(None)),
            (Some(&d), None, Ok(Some(d.clone()))),
            (Some(&d), Some(NEW), Ok(Some(d.clone()))),
            (Some(&d), Some(&format!("{NEW}\n")[..]), Ok(Some(d.clone()))),
            (Some(&d), Some(V25), Err(V25.to_string())),
            (Some(&d), Some("9d0446a"), Err("9d0446a".to_string())),
        ] {
            assert_eq!(
                declared_pin(declared, marker),
                want,
                "{declared:?} {marker:?}"
            );
        }
    }

    /// Where each tree's pin comes from: a v25 tree's marker; a v26 tree's and a made-up v27
    /// tree's sync file, with or without a marker that agrees; refused, naming both files and
    /// both values, when the marker names another commit; `resolve_pin` the same unless
    /// `--tinygrad-commit` is given.
    #[test]
    fn the_pin_comes_from_where_the_tree_records_it() {
        let rows = [("sc2", "SC2", "v9", false, true)];
        let v25 = tempfile::tempdir().unwrap();
        fs::create_dir_all(v25.path().join("tinygrad_repo")).unwrap();
        let marker = v25.path().join("tinygrad_repo/TINYGRAD_COMMIT");
        fs::write(&marker, format!("{V25}\n")).unwrap();
        let p = tree_pin(v25.path()).unwrap();
        assert_eq!((p.commit.as_str(), &p.recorded_in), (V25, &marker));
        assert!(p.declared.is_none());
        fs::remove_file(&marker).unwrap();
        assert!(matches!(
            tree_pin(v25.path()),
            Err(Error::Compiler(compiler_remote::Error::Pin { .. }))
        ));
        for (generation, revision) in [("v26", NEW), ("v27", &"2".repeat(40)[..])] {
            let t = tempfile::tempdir().unwrap();
            test_support::v26_checker::write_tree(t.path(), generation, revision, &rows);
            let sync_file = t.path().join("upstream-sync.json");
            // Only upstream-sync.json records it.
            let p = tree_pin(t.path()).unwrap();
            assert_eq!(p.commit.as_str(), revision, "{generation}");
            assert_eq!(p.recorded_in, sync_file);
            assert_eq!(p.declared.unwrap().generation.to_string(), generation);
            assert_eq!(
                resolve_pin(None, Some(t.path())).unwrap().as_str(),
                revision
            );
            // A marker that agrees changes nothing.
            let marker = t.path().join("tinygrad_repo/TINYGRAD_COMMIT");
            fs::create_dir_all(marker.parent().unwrap()).unwrap();
            fs::write(&marker, format!("{revision}\n")).unwrap();
            assert_eq!(tree_pin(t.path()).unwrap().commit.as_str(), revision);
            // One that names another commit is refused, naming both files and values.
            fs::write(&marker, format!("{V25}\n")).unwrap();
            let e = tree_pin(t.path()).unwrap_err();
            assert!(matches!(e, Error::TreePinDisagrees { .. }), "{e:?}");
            let text = e.to_string();
            for want in [
                &marker.display().to_string()[..],
                &sync_file.display().to_string()[..],
                V25,
                revision,
                generation,
                "next:",
            ] {
                assert!(text.contains(want), "{want} not in {text}");
            }
            assert!(resolve_pin(None, Some(t.path())).is_err());
            // --tinygrad-commit is the pin as given.
            let given: GitCommit = V25.parse().unwrap();
            assert_eq!(
                resolve_pin(Some(given.clone()), Some(t.path())).unwrap(),
                given
            );
            // The built-in's gate reads the pin the same way: refused before the artifact is
            // read (it does not even exist).
            fs::create_dir_all(t.path().join(BUILTIN_DIR)).unwrap();
            let e = builtin(&t.path().join("missing.pkl"), t.path(), true, |_, _| {}).unwrap_err();
            assert!(matches!(e, Error::TreePinDisagrees { .. }), "{e:?}");
        }
    }

    /// A tree carrying the catalog module declares its generation's pin and contract through
    /// `load_pins`; a made-up v27 tree is a v26-contract generation; a pin recorded in
    /// `tinygrad_pins.json` that contradicts the declaration is refused naming the module; a
    /// v25 tree declares nothing.
    #[test]
    fn a_tree_declares_its_generation_contract_and_revision() {
        let rows = [("sc2", "SC2", "v9", false, true)];
        for (generation, revision) in [
            ("v26", NEW),
            ("v27", "2222222222222222222222222222222222222222"),
        ] {
            let t = tempfile::tempdir().unwrap();
            test_support::v26_checker::write_tree(t.path(), generation, revision, &rows);
            let (pins, declared) = load_tree(Some(t.path())).unwrap();
            let g: Generation = generation.parse().unwrap();
            let d = declared.unwrap();
            assert_eq!(d.generation, g);
            assert_eq!(d.catalog.len(), 1);
            assert_eq!(pins.get(g).unwrap().as_str(), revision);
            assert_eq!(pins.contract_of(g), manifest::ContractName::V26);
            assert_eq!(
                pins.contract_of(Generation::new(25)),
                manifest::ContractName::V25
            );
            assert_eq!(load_pins(Some(t.path())).unwrap(), pins);
            // A recorded pin that contradicts the tree.
            fs::write(
                t.path().join(manifest::pins::PINS_FILE),
                format!(r#"{{"{generation}": "{}"}}"#, "3".repeat(40)),
            )
            .unwrap();
            let e = load_pins(Some(t.path())).unwrap_err().to_string();
            assert!(e.contains("catalog.py") && e.contains(revision), "{e}");
        }
        let v25 = tempfile::tempdir().unwrap();
        let (pins, declared) = load_tree(Some(v25.path())).unwrap();
        assert!(declared.is_none());
        assert_eq!(pins, PinTable::builtin());
        // A FIFO planted as the sync file is refused, not read.
        let t = tempfile::tempdir().unwrap();
        test_support::v26_checker::write_tree(t.path(), "v26", NEW, &rows);
        fs::remove_file(t.path().join("upstream-sync.json")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(t.path().join("upstream-sync.json"))
            .status()
            .unwrap();
        assert!(made.success());
        assert!(load_pins(Some(t.path())).is_err());
    }

    /// The tree's generation selectors must name exactly the generation of its tinygrad:
    /// `MANIFEST_CANDIDATES` (v25, v26's contract, v27), the catalog module's `GENERATION` and
    /// the reviewed catalog's name (trees that declare v26's contract); each problem names the
    /// file, line, value and the edit.
    #[test]
    fn the_tree_selects_the_generation_of_its_tinygrad() {
        let rows = [("sc2", "SC2", "v9", false, true)];
        let candidates = |dir: &Path, text: &str| {
            fs::create_dir_all(dir.join("starpilot/assets")).unwrap();
            fs::write(
                dir.join("starpilot/assets/model_manager.py"),
                format!("import os\nMANIFEST_CANDIDATES = {text}\n"),
            )
            .unwrap();
        };
        let marker = |dir: &Path, pin: &str| {
            fs::create_dir_all(dir.join("tinygrad_repo")).unwrap();
            fs::write(
                dir.join("tinygrad_repo/TINYGRAD_COMMIT"),
                format!("{pin}\n"),
            )
            .unwrap();
        };
        // v25: the built-in pin.
        let t = tempfile::tempdir().unwrap();
        marker(t.path(), V25);
        assert_eq!(
            check_selectors(t.path()).unwrap(),
            Some(Generation::new(25)),
            "no selector"
        );
        candidates(t.path(), "(\"v25\",)");
        assert_eq!(
            check_selectors(t.path()).unwrap(),
            Some(Generation::new(25))
        );
        for bad in ["(\"v24\", \"v25\")", "(\"v26\",)", "()"] {
            candidates(t.path(), bad);
            let e = check_selectors(t.path()).unwrap_err();
            let text = e.to_string();
            assert!(
                matches!(e, Error::GenerationSelector { .. })
                    && text.contains("model_manager.py:2: MANIFEST_CANDIDATES names")
                    && text.contains("set it to (\"v25\",)"),
                "{bad}: {text}"
            );
        }
        // v26's contract and a made-up v27 that inherits it: the tree declares its generation.
        for (generation, revision, previous) in [
            ("v26", NEW, "v25"),
            ("v27", "2222222222222222222222222222222222222222", "v26"),
        ] {
            let t = tempfile::tempdir().unwrap();
            test_support::v26_checker::write_tree(t.path(), generation, revision, &rows);
            marker(t.path(), revision);
            candidates(t.path(), &format!("(\"{generation}\",)"));
            let g: Generation = generation.parse().unwrap();
            assert_eq!(check_selectors(t.path()).unwrap(), Some(g));
            // MANIFEST_CANDIDATES still the previous generation's (the trap).
            candidates(t.path(), &format!("(\"{previous}\",)"));
            let text = check_selectors(t.path()).unwrap_err().to_string();
            assert!(
                text.contains(&format!("names (\"{previous}\",)"))
                    && text.contains(&format!("set it to (\"{generation}\",)")),
                "{generation}: {text}"
            );
            candidates(t.path(), &format!("(\"{generation}\",)"));
            // The catalog module's GENERATION left at the previous generation.
            let module = t.path().join("starpilot/models/catalog.py");
            fs::write(&module, format!("GENERATION = \"{previous}\"\n")).unwrap();
            let text = check_selectors(t.path()).unwrap_err().to_string();
            assert!(
                text.contains("catalog.py:1: GENERATION is")
                    && text.contains(&format!("set it to \"{generation}\"")),
                "{generation}: {text}"
            );
        }
        // The pure rule over the reviewed catalog's name.
        let sel = Selector {
            what: "the reviewed catalog",
            path: "/op/starpilot/models/catalog-v26.json".into(),
            line: 0,
            generations: vec![Generation::new(26)],
        };
        let p = selector_problems(std::slice::from_ref(&sel), Generation::new(27));
        assert_eq!(p.len(), 1);
        assert!(p[0].contains("rename it to catalog-v27.json"), "{p:?}");
        assert!(selector_problems(&[sel], Generation::new(26)).is_empty());
    }

    #[test]
    fn generations_in_python() {
        assert_eq!(
            parse_generations(" = (\"v25\",)"),
            vec![Generation::new(25)]
        );
        assert_eq!(
            parse_generations(": tuple[str, ...] = ('v24', 'v25')"),
            vec![Generation::new(24), Generation::new(25)]
        );
        assert!(parse_generations(" = ()").is_empty());
    }

    /// MANIFEST_CANDIDATES first; a tree without it is on the generation of its tinygrad (v25
    /// or a made-up v26); with neither, the newest built-in generation.
    #[test]
    fn the_generation_a_bump_starts_from() {
        let (v25, v26, v27) = (
            Generation::new(25),
            Generation::new(26),
            Generation::new(27),
        );
        let cases = [
            (Some(v25), Some(v26), v25),
            (Some(v26), Some(v26), v26),
            (Some(v27), None, v27),
            (None, Some(v26), v26),
            (None, Some(v25), v25),
            (None, None, manifest::layout::CURRENT_GENERATION),
        ];
        for (candidates, tree, want) in cases {
            assert_eq!(
                current_generation(candidates, tree),
                want,
                "{candidates:?} {tree:?}"
            );
        }
    }

    #[test]
    fn the_next_generation_of_a_pin() {
        let v25 = Generation::new(25);
        let (old, new): (GitCommit, GitCommit) = (V25.parse().unwrap(), NEW.parse().unwrap());
        // The current pin: same ABI, nothing recorded.
        let mut pins = PinTable::builtin();
        assert_eq!(next_generation(&mut pins, v25, &old).unwrap(), None);
        assert_eq!(pins.to_json(), PinTable::builtin().to_json());
        // A new pin makes the next generation and is recorded; the same bump again agrees.
        let g = next_generation(&mut pins, v25, &new).unwrap().unwrap();
        assert_eq!((g.from, g.to), (v25, Generation::new(26)));
        assert_eq!(pins.get(Generation::new(26)), Some(&new));
        assert!(next_generation(&mut pins, v25, &new).unwrap().is_some());
        // The old pin for the generation after v26 is refused.
        assert!(matches!(
            next_generation(&mut pins, Generation::new(26), &old),
            Err(Error::BumpRefused { .. })
        ));
    }

    #[test]
    fn a_dry_run_bump_reports_and_writes_nothing() {
        let t = tempfile::tempdir().unwrap();
        let op = t.path().join("op");
        let src = t.path().join("tg");
        fs::create_dir_all(op.join("tinygrad_repo")).unwrap();
        fs::write(op.join("tinygrad_repo/old.py"), b"old").unwrap();
        fs::create_dir_all(src.join("a/.git")).unwrap();
        fs::write(src.join("a/x.py"), b"x").unwrap();
        fs::write(src.join("y.py"), b"y").unwrap();
        let r = bump(&BumpRequest {
            openpilot: op.clone(),
            tinygrad_src: src,
            commit: Some(NEW.parse().unwrap()),
            dry_run: true,
        })
        .unwrap();
        assert_eq!(r.files, 2);
        assert_eq!(r.generation.unwrap().to, Generation::new(26));
        assert!(r.written.contains(&op.join(manifest::pins::PINS_FILE)));
        assert_eq!(r.removed, [op.join("tinygrad_repo")]);
        // Nothing written or removed: `op` still holds only `tinygrad_repo/old.py`, as it was.
        assert_eq!(fs::read_dir(&op).unwrap().count(), 1);
        assert_eq!(fs::read_dir(op.join("tinygrad_repo")).unwrap().count(), 1);
        assert_eq!(fs::read(op.join("tinygrad_repo/old.py")).unwrap(), b"old");
    }

    /// Every file and directory under `dir` with its bytes: a tree before and after a refusal.
    fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    out.push((p.clone(), Vec::new()));
                    stack.push(p);
                } else {
                    out.push((p.clone(), std::fs::read(&p).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    /// Run git in `dir` with a fixed identity; `None` when git is not installed.
    fn git(dir: &Path, args: &[&str]) -> Option<String> {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_AUTHOR_NAME", "dev")
            .env("GIT_AUTHOR_EMAIL", "dev@localhost")
            .env("GIT_COMMITTER_NAME", "dev")
            .env("GIT_COMMITTER_EMAIL", "dev@localhost")
            .output()
            .ok()?;
        assert!(out.status.success(), "git {args:?}: {out:?}");
        Some(String::from_utf8(out.stdout).unwrap().trim().to_string())
    }

    /// A real `git init` checkout with one commit; `None` without git.
    fn checkout(dir: &Path) -> Option<GitCommit> {
        fs::create_dir_all(dir.join("tinygrad")).unwrap();
        fs::write(dir.join("tinygrad/tensor.py"), b"tensor").unwrap();
        git(dir, &["init", "-q"])?;
        git(dir, &["add", "-A"])?;
        git(dir, &["commit", "-q", "-m", "tinygrad"])?;
        Some(git(dir, &["rev-parse", "HEAD"])?.parse().unwrap())
    }

    fn checkout_head(dir: &Path) -> GitCommit {
        git(dir, &["rev-parse", "HEAD"]).unwrap().parse().unwrap()
    }

    #[test]
    fn the_commit_of_a_bump_source() {
        let t = tempfile::tempdir().unwrap();
        let plain = t.path().join("plain");
        fs::create_dir_all(&plain).unwrap();
        let new: GitCommit = NEW.parse().unwrap();
        assert!(matches!(
            source_commit(&plain, None),
            Err(Error::BumpNeedsCommit { .. })
        ));
        assert_eq!(
            source_commit(&plain, Some(&new)).unwrap(),
            (new.clone(), SourceKind::Directory)
        );
        let repo = t.path().join("repo");
        let Some(head) = checkout(&repo) else { return };
        assert_eq!(
            source_commit(&repo, None).unwrap(),
            (head.clone(), SourceKind::Git)
        );
        assert_eq!(
            source_commit(&repo, Some(&head)).unwrap(),
            (head.clone(), SourceKind::Git)
        );
        let e = source_commit(&repo, Some(&new)).unwrap_err();
        assert!(matches!(e, Error::CheckoutAtOtherCommit { .. }), "{e:?}");
        assert!(
            e.to_string()
                .contains(&format!("leave --commit out to bump to {head}")),
            "{e}"
        );
        // A modified or an untracked file is not HEAD: refused, naming it; an ignored one
        // (build output) is fine.
        fs::write(repo.join(".gitignore"), b"__pycache__/\n").unwrap();
        git(&repo, &["add", ".gitignore"]).unwrap();
        git(&repo, &["commit", "-q", "-m", "ignore"]).unwrap();
        let head = checkout_head(&repo);
        fs::create_dir_all(repo.join("tinygrad/__pycache__")).unwrap();
        fs::write(repo.join("tinygrad/__pycache__/tensor.pyc"), b"pyc").unwrap();
        assert_eq!(
            source_commit(&repo, None).unwrap(),
            (head.clone(), SourceKind::Git)
        );
        fs::write(repo.join("tinygrad/tensor.py"), b"edited").unwrap();
        fs::write(repo.join("tinygrad/extra.py"), b"new").unwrap();
        let e = source_commit(&repo, Some(&head)).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::CheckoutDirty { .. }), "{e:?}");
        assert!(
            text.contains("M tinygrad/tensor.py")
                && text.contains("?? tinygrad/extra.py")
                && text.contains("stash --include-untracked"),
            "{text}"
        );
        git(&repo, &["checkout", "-q", "tinygrad/tensor.py"]).unwrap();
        fs::remove_file(repo.join("tinygrad/extra.py")).unwrap();
        assert_eq!(source_commit(&repo, None).unwrap(), (head, SourceKind::Git));
        // A fresh `git init` has no HEAD commit.
        let empty = t.path().join("empty");
        fs::create_dir_all(&empty).unwrap();
        git(&empty, &["init", "-q"]).unwrap();
        assert!(matches!(
            source_commit(&empty, Some(&new)),
            Err(Error::CheckoutWithoutCommit { .. })
        ));
    }

    /// v25 -> v26 from a git checkout (the commit is HEAD), then v26 -> v27 from a plain
    /// directory (the commit is --commit); each records its source and digest. A plain
    /// directory without --commit, or a checkout at another commit, changes nothing.
    #[test]
    fn a_bump_records_its_source_and_its_refusals_change_nothing() {
        let t = tempfile::tempdir().unwrap();
        let op = t.path().join("op");
        fs::create_dir_all(op.join("tinygrad_repo")).unwrap();
        fs::write(op.join("tinygrad_repo/old.py"), b"old").unwrap();
        let repo = t.path().join("repo");
        let Some(head) = checkout(&repo) else { return };
        let plain = t.path().join("plain");
        fs::create_dir_all(plain.join("tinygrad")).unwrap();
        fs::write(plain.join("tinygrad/tensor.py"), b"tensor, next").unwrap();
        let req = |src: &Path, commit: Option<&str>| BumpRequest {
            openpilot: op.clone(),
            tinygrad_src: src.to_path_buf(),
            commit: commit.map(|c| c.parse().unwrap()),
            dry_run: false,
        };
        let before = snapshot(&op);
        assert!(matches!(
            bump(&req(&plain, None)),
            Err(Error::BumpNeedsCommit { .. })
        ));
        assert!(matches!(
            bump(&req(&repo, Some(NEW))),
            Err(Error::CheckoutAtOtherCommit { .. })
        ));
        assert_eq!(snapshot(&op), before, "a refused bump changed the tree");

        let r = bump(&req(&repo, None)).unwrap();
        assert_eq!(r.commit, head);
        assert_eq!(r.generation.unwrap().to, Generation::new(26));
        let recorded: TinygradSource = serde_json::from_slice(
            &fs::read(op.join("tinygrad_repo").join(TINYGRAD_SOURCE_FILE)).unwrap(),
        )
        .unwrap();
        assert_eq!(recorded, r.source);
        assert_eq!(recorded.kind, SourceKind::Git);
        assert_eq!(
            recorded.digest,
            compiler_remote::tree_digest::dir_digest(&repo, &[".git"]).unwrap()
        );
        assert_eq!(
            load_pins(Some(&op)).unwrap().get(Generation::new(26)),
            Some(&head)
        );

        // The device code now lists v26: the next bump makes v27, from a plain directory.
        fs::create_dir_all(op.join("starpilot")).unwrap();
        fs::write(
            op.join("starpilot/model_manager.py"),
            b"MANIFEST_CANDIDATES = (\"v26\",)\n",
        )
        .unwrap();
        let before = snapshot(&op);
        assert!(matches!(
            bump(&req(&plain, None)),
            Err(Error::BumpNeedsCommit { .. })
        ));
        assert_eq!(snapshot(&op), before);
        let r = bump(&req(&plain, Some(NEW))).unwrap();
        assert_eq!(r.generation.unwrap().to, Generation::new(27));
        let recorded: TinygradSource = serde_json::from_slice(
            &fs::read(op.join("tinygrad_repo").join(TINYGRAD_SOURCE_FILE)).unwrap(),
        )
        .unwrap();
        assert_eq!(recorded.kind, SourceKind::Directory);
        assert_eq!(recorded.commit.as_str(), NEW);
        assert_eq!(recorded.path, plain);
        assert_eq!(
            recorded.digest,
            compiler_remote::tree_digest::dir_digest(&plain, &[]).unwrap()
        );
        assert_eq!(
            fs::read_to_string(op.join("tinygrad_repo/TINYGRAD_COMMIT")).unwrap(),
            format!("{NEW}\n")
        );
    }

    /// The pin-correction rule: v25's built-in pin never, a made-up v26's while no store holds it
    /// live.
    #[test]
    fn which_pins_can_be_corrected() {
        let v25 = Generation::new(25);
        let v26 = Generation::new(26);
        let typo: GitCommit = "1".repeat(40).parse().unwrap();
        let meant: GitCommit = NEW.parse().unwrap();
        let mut pins = PinTable::builtin();
        pins.record(v26, &typo).unwrap();
        let live = |pin: Option<&GitCommit>| LiveManifest {
            store: "store".into(),
            path: "manifests/model_names_v26.json".into(),
            tinygrad_commit: pin.cloned(),
        };
        let kind = |r: Result<(PinTable, Option<GitCommit>)>| match r {
            Ok((t, old)) => Ok((t.get(v26).cloned(), old)),
            Err(Error::PinBuiltin { .. }) => Err("builtin"),
            Err(Error::PinNotRecorded { .. }) => Err("not recorded"),
            Err(Error::PinNoStoreChecked { .. }) => Err("no store"),
            Err(Error::PinLive { .. }) => Err("live"),
            Err(Error::PinCorrectionRefused { .. }) => Err("reused"),
            Err(e) => panic!("{e:?}"),
        };
        let pin25 = manifest::layout::current_tinygrad_commit();
        type Expected<'a> = Result<(Option<GitCommit>, Option<GitCommit>), &'a str>;
        type Case<'a> = (
            Generation,
            &'a GitCommit,
            Vec<LiveManifest>,
            usize,
            Expected<'a>,
        );
        let cases: Vec<Case> = vec![
            (
                v26,
                &meant,
                vec![],
                1,
                Ok((Some(meant.clone()), Some(typo.clone()))),
            ),
            (v26, &typo, vec![], 1, Ok((Some(typo.clone()), None))),
            (v25, &meant, vec![], 1, Err("builtin")),
            (Generation::new(27), &meant, vec![], 1, Err("not recorded")),
            (v26, &meant, vec![], 0, Err("no store")),
            (v26, &meant, vec![live(Some(&typo))], 2, Err("live")),
            (v26, &meant, vec![live(None)], 1, Err("live")),
            // What is live already has the corrected pin: the table is brought in line.
            (
                v26,
                &meant,
                vec![live(Some(&meant))],
                1,
                Ok((Some(meant.clone()), Some(typo.clone()))),
            ),
            (v26, &pin25, vec![], 1, Err("reused")),
        ];
        for (g, new, live, checked, want) in cases {
            assert_eq!(
                kind(decide_pin_correction(&pins, g, new, &live, checked)),
                want,
                "{g} {new}"
            );
        }
    }

    /// `correct_pin` on a tree bumped from a plain directory with a mistyped pin: the table, the
    /// marker and the source record are corrected; a live manifest in a store refuses it and
    /// the tree is left as it was.
    #[test]
    fn correcting_an_unpublished_pin() {
        let t = tempfile::tempdir().unwrap();
        let op = t.path().join("op");
        fs::create_dir_all(op.join("tinygrad_repo")).unwrap();
        let plain = t.path().join("plain");
        fs::create_dir_all(&plain).unwrap();
        fs::write(plain.join("tensor.py"), b"t").unwrap();
        let typo = "1".repeat(40);
        bump(&BumpRequest {
            openpilot: op.clone(),
            tinygrad_src: plain.clone(),
            commit: Some(typo.parse().unwrap()),
            dry_run: false,
        })
        .unwrap();
        let store_dir = t.path().join("store");
        fs::create_dir_all(&store_dir).unwrap();
        let store = artifact_store::LocalStore::new(&store_dir);
        let req = |dry_run| PinRequest {
            openpilot: op.clone(),
            generation: Generation::new(26),
            commit: NEW.parse().unwrap(),
            dry_run,
        };
        // A live v26 manifest with the mistyped pin: refused, nothing changed.
        fs::create_dir_all(store_dir.join("manifests")).unwrap();
        fs::write(
            store_dir.join("manifests/model_names_v26.json"),
            format!(r#"{{"generation": "v26", "tinygrad_commit": "{typo}", "models": []}}"#),
        )
        .unwrap();
        let before = snapshot(&op);
        let e = correct_pin(&req(false), &[&store]).unwrap_err();
        assert!(matches!(e, Error::PinLive { .. }), "{e:?}");
        assert!(
            e.to_string().contains("manifests/model_names_v26.json"),
            "{e}"
        );
        assert_eq!(snapshot(&op), before);
        // No store given: refused.
        assert!(matches!(
            correct_pin(&req(false), &[]),
            Err(Error::PinNoStoreChecked { .. })
        ));
        fs::remove_file(store_dir.join("manifests/model_names_v26.json")).unwrap();
        // A dry run says what it would write and writes nothing.
        let r = correct_pin(&req(true), &[&store]).unwrap();
        assert_eq!(r.written.len(), 3, "{r:?}");
        assert_eq!(snapshot(&op), before);
        let r = correct_pin(&req(false), &[&store]).unwrap();
        assert_eq!(r.from.unwrap().as_str(), typo);
        assert!(!r.tree_from_git);
        let pins = load_pins(Some(&op)).unwrap();
        assert_eq!(pins.get(Generation::new(26)).unwrap().as_str(), NEW);
        assert_eq!(
            fs::read_to_string(op.join("tinygrad_repo/TINYGRAD_COMMIT")).unwrap(),
            format!("{NEW}\n")
        );
        let source: TinygradSource = serde_json::from_slice(
            &fs::read(op.join("tinygrad_repo").join(TINYGRAD_SOURCE_FILE)).unwrap(),
        )
        .unwrap();
        assert_eq!(source.commit.as_str(), NEW);
        assert_eq!(
            source.digest,
            compiler_remote::tree_digest::dir_digest(&plain, &[]).unwrap()
        );
    }

    /// A FIFO as the tree's marker or source record is read without blocking and taken for
    /// "not the old pin" (the pin table is still corrected; the FIFO is left alone).
    #[test]
    fn a_fifo_marker_does_not_hang_the_pin_correction() {
        let t = tempfile::tempdir().unwrap();
        let op = t.path().join("op");
        fs::create_dir_all(op.join("tinygrad_repo")).unwrap();
        let plain = t.path().join("plain");
        fs::create_dir_all(&plain).unwrap();
        fs::write(plain.join("tensor.py"), b"t").unwrap();
        bump(&BumpRequest {
            openpilot: op.clone(),
            tinygrad_src: plain,
            commit: Some("1".repeat(40).parse().unwrap()),
            dry_run: false,
        })
        .unwrap();
        for f in [
            compiler_remote::MARKER_PATH.to_string(),
            format!("tinygrad_repo/{TINYGRAD_SOURCE_FILE}"),
        ] {
            let p = op.join(f);
            fs::remove_file(&p).unwrap();
            let c = std::ffi::CString::new(p.into_os_string().into_encoded_bytes()).unwrap();
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        }
        let store_dir = t.path().join("store");
        fs::create_dir_all(&store_dir).unwrap();
        let store = artifact_store::LocalStore::new(&store_dir);
        let started = std::time::Instant::now();
        let r = correct_pin(
            &PinRequest {
                openpilot: op.clone(),
                generation: Generation::new(26),
                commit: NEW.parse().unwrap(),
                dry_run: true,
            },
            &[&store],
        )
        .unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(r.written, vec![op.join(manifest::pins::PINS_FILE)]);
    }
}
