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
use manifest::{Generation, GitCommit, PinTable};
use serde::Serialize;

use crate::{Error, Result};

/// `tinygrad_pins.json` holds one line per generation; a megabyte is far beyond any real table.
pub const MAX_PINS_FILE_BYTES: u64 = 1 << 20;

/// The built-in pins plus those `tinygrad bump` recorded in `<openpilot>/tinygrad_pins.json`.
pub fn load_pins(openpilot: Option<&Path>) -> Result<PinTable> {
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
    /// The tinygrad tree at the new commit (a git checkout is checked against `commit`).
    pub tinygrad_src: PathBuf,
    /// The full tinygrad commit.
    pub commit: GitCommit,
    /// Decide and report, write nothing.
    pub dry_run: bool,
}

/// A generation change: `from` is the current generation, `to` the one the new pin makes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GenerationMove {
    pub from: Generation,
    pub to: Generation,
}

/// What `tinygrad bump` did (or, with `dry_run`, would do).
#[derive(Debug, Clone, Serialize)]
pub struct BumpReport {
    pub openpilot: PathBuf,
    pub commit: GitCommit,
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
    let current = candidates
        .as_ref()
        .and_then(|(_, _, gens)| gens.iter().max().copied())
        .unwrap_or(manifest::layout::CURRENT_GENERATION);
    let generation = next_generation(&mut pins, current, &req.commit)?;
    check_checkout(src, &req.commit)?;

    let op = &req.openpilot;
    let dest = op.join("tinygrad_repo");
    let pins_path = op.join(manifest::pins::PINS_FILE);
    let mut written = vec![dest.clone(), dest.join("TINYGRAD_COMMIT")];
    if generation.is_some() {
        written.push(pins_path.clone());
    }
    let removed = if dest.exists() {
        vec![dest.clone()]
    } else {
        vec![]
    };
    let files = if req.dry_run {
        walk_tree_without_git(src, None)?
    } else {
        let files = replace_tree(src, op, &req.commit)?;
        // Recorded after the swap: a crash in between leaves the pair unrecorded, and rerunning
        // the same bump records it.
        if generation.is_some() {
            atomic::write_atomic(&pins_path, pins.to_json().as_bytes())?;
        }
        files
    };
    Ok(BumpReport {
        openpilot: op.clone(),
        commit: req.commit.clone(),
        files,
        generation,
        manifest_candidates: candidates.map(|(p, line, _)| format!("{}:{line}", p.display())),
        current,
        dry_run: req.dry_run,
        written,
        removed,
    })
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

/// A git checkout must be at the commit about to be recorded; a tree without `.git` is taken
/// as it is.
fn check_checkout(src: &Path, commit: &GitCommit) -> Result<()> {
    if !src.join(".git").exists() {
        return Ok(());
    }
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(src)
        .args(["rev-parse", "HEAD"])
        .output()
        .map_err(|source| Error::Git {
            path: src.to_path_buf(),
            source,
        })?;
    let head = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || head != commit.as_str() {
        return Err(Error::CheckoutAtOtherCommit {
            path: src.to_path_buf(),
            head,
            commit: commit.clone(),
        });
    }
    Ok(())
}

/// Copy `src` (without git metadata) beside `<op>/tinygrad_repo`, write its TINYGRAD_COMMIT,
/// and swap it in by rename so `tinygrad_repo/` is never half old, half new. Returns the number
/// of files copied.
fn replace_tree(src: &Path, op: &Path, commit: &GitCommit) -> Result<u64> {
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
        format!("{commit}\n").as_bytes(),
    )?;
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
                let Ok(text) = fs::read_to_string(&p) else {
                    continue;
                };
                for (i, line) in text.lines().enumerate() {
                    if let Some(rest) = line.trim_start().strip_prefix("MANIFEST_CANDIDATES") {
                        let gens = parse_generations(rest);
                        if !gens.is_empty() {
                            return Some((p, i + 1, gens));
                        }
                    }
                }
            }
        }
    }
    None
}

/// The `"vNN"` strings in a Python tuple literal.
fn parse_generations(text: &str) -> Vec<Generation> {
    text.split(['"', '\''])
        .filter_map(|s| s.parse::<Generation>().ok())
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    const V25: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";
    const NEW: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";

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
            commit: NEW.parse().unwrap(),
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
}
