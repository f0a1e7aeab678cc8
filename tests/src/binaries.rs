//! Finding the workspace's binaries for the end-to-end tests, and refusing stale ones.
//!
//! `cargo test -p integration-tests` does not build `release-cli` or `device-modeld-manager`
//! (a dev-dependency on a binary-only package builds no binary, and artifact dependencies are
//! not stable), so a per-package run could play the story with binaries built before the last
//! source edit. The tests therefore take the binaries from the directory the test executable was
//! built into (`target/<profile>/`, the parent of `deps/`) and refuse any binary older than the
//! newest source it is built from: its package's `src/` and `build.rs` and those of every
//! workspace crate it depends on (`[dependencies]` only; dev-dependencies, tests and
//! `Cargo.toml` edits do not rebuild a binary).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Whether a binary can be used, decided from modification times only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Freshness {
    /// Newer than (or as new as) every source it is built from.
    Fresh,
    /// Not there at all.
    Missing,
    /// Older than `source`, the newest source it is built from.
    Stale { source: PathBuf },
}

/// The rule: a missing binary is missing; a binary older than the newest source is stale; a
/// binary with no known source, or as new as its newest source, is fresh.
pub fn freshness(
    binary: Option<SystemTime>,
    newest_source: Option<(PathBuf, SystemTime)>,
) -> Freshness {
    match (binary, newest_source) {
        (None, _) => Freshness::Missing,
        (Some(built), Some((source, changed))) if changed > built => Freshness::Stale { source },
        (Some(_), _) => Freshness::Fresh,
    }
}

/// `target/<profile>/` of the running test or program: the directory of the executable, or its
/// parent when the executable sits in `deps/` (where cargo puts test executables).
pub fn profile_dir_of_current_exe() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", exe.display()))?;
    Ok(if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().unwrap_or(dir).to_path_buf()
    } else {
        dir.to_path_buf()
    })
}

/// Refuses `binary` (built from the workspace package in `package_dir`) unless it exists and is
/// not older than any of its sources; the message says what to run.
pub fn check(binary: &Path, workspace: &Path, package_dir: &Path) -> Result<(), String> {
    let built = fs::metadata(binary).and_then(|m| m.modified()).ok();
    let sources = source_roots(workspace, package_dir)?;
    match freshness(built, newest(&sources)) {
        Freshness::Fresh => Ok(()),
        Freshness::Missing => Err(format!(
            "{} is not built; run `cargo build --workspace` (or `cargo test --workspace`) first",
            binary.display()
        )),
        Freshness::Stale { source } => Err(format!(
            "stale binary: {} was built before {} changed; run `cargo build --workspace` (or \
             `cargo test --workspace`, which builds it) and rerun",
            binary.display(),
            source.display()
        )),
    }
}

/// The `src/` directories and `build.rs` files a binary of `package_dir` is built from: its own
/// and, transitively, those of the workspace crates in its `[dependencies]`.
pub fn source_roots(workspace: &Path, package_dir: &Path) -> Result<Vec<PathBuf>, String> {
    let members = workspace_path_deps(workspace)?;
    let mut seen = BTreeSet::new();
    let mut todo = vec![package_dir.to_path_buf()];
    let mut roots = Vec::new();
    while let Some(dir) = todo.pop() {
        if !seen.insert(dir.clone()) {
            continue;
        }
        roots.push(dir.join("src"));
        roots.push(dir.join("build.rs"));
        let toml = dir.join("Cargo.toml");
        let text = fs::read_to_string(&toml).map_err(|e| format!("{}: {e}", toml.display()))?;
        for name in dependency_names(&text) {
            if let Some(path) = members.iter().find(|(n, _)| *n == name).map(|(_, p)| p) {
                todo.push(workspace.join(path));
            }
        }
    }
    Ok(roots)
}

/// `name = { path = "…" }` lines of the workspace's `[workspace.dependencies]`.
fn workspace_path_deps(workspace: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let toml = workspace.join("Cargo.toml");
    let text = fs::read_to_string(&toml).map_err(|e| format!("{}: {e}", toml.display()))?;
    Ok(section(&text, "[workspace.dependencies]")
        .filter_map(|line| {
            let (name, value) = line.split_once('=')?;
            let rest = value.split_once("path")?.1;
            let path = rest.split('"').nth(1)?;
            Some((name.trim().to_string(), PathBuf::from(path)))
        })
        .collect())
}

/// The package names in a manifest's `[dependencies]` section (`name.workspace = true` or
/// `name = …`).
fn dependency_names(cargo_toml: &str) -> Vec<String> {
    section(cargo_toml, "[dependencies]")
        .filter_map(|line| {
            let key = line.split_once('=')?.0.trim();
            Some(
                key.strip_suffix(".workspace")
                    .unwrap_or(key)
                    .trim()
                    .to_string(),
            )
        })
        .collect()
}

/// The non-empty, non-comment lines of one `[section]` of a TOML file.
fn section<'a>(text: &'a str, header: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    text.lines()
        .skip_while(move |l| l.trim() != header)
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// The newest file under `roots` (files or directories; missing ones are skipped).
fn newest(roots: &[PathBuf]) -> Option<(PathBuf, SystemTime)> {
    let mut best: Option<(PathBuf, SystemTime)> = None;
    let mut todo: Vec<PathBuf> = roots.to_vec();
    while let Some(p) = todo.pop() {
        let Ok(meta) = fs::metadata(&p) else { continue };
        if meta.is_dir() {
            if let Ok(entries) = fs::read_dir(&p) {
                todo.extend(entries.filter_map(|e| e.ok().map(|e| e.path())));
            }
        } else if let Ok(t) = meta.modified()
            && best.as_ref().is_none_or(|(_, b)| t > *b)
        {
            best = Some((p, t));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn freshness_table() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let later = t0 + Duration::from_secs(1);
        let src = PathBuf::from("crates/chunker/src/lib.rs");
        let stale = Freshness::Stale {
            source: src.clone(),
        };
        type Case = (Option<SystemTime>, Option<(PathBuf, SystemTime)>, Freshness);
        let cases: [Case; 6] = [
            (None, None, Freshness::Missing),
            (None, Some((src.clone(), t0)), Freshness::Missing),
            (Some(t0), None, Freshness::Fresh),
            (Some(t0), Some((src.clone(), t0)), Freshness::Fresh),
            (Some(later), Some((src.clone(), t0)), Freshness::Fresh),
            (Some(t0), Some((src.clone(), later)), stale),
        ];
        for (built, source, want) in cases {
            assert_eq!(
                freshness(built, source.clone()),
                want,
                "{built:?} {source:?}"
            );
        }
    }

    #[test]
    fn dependency_sections() {
        let toml = "[package]\nname = \"x\"\n\n[dependencies]\nchunker.workspace = true\n# c\nclap = { workspace = true }\n\n[dev-dependencies]\ntest-support.workspace = true\n";
        assert_eq!(dependency_names(toml), ["chunker", "clap"]);
    }

    #[test]
    fn sources_follow_workspace_dependencies_only() {
        let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let roots = source_roots(&ws, &ws.join("bins/device-modeld-manager")).unwrap();
        let has = |p: &str| roots.contains(&ws.join(p));
        assert!(has("bins/device-modeld-manager/src"));
        assert!(has("crates/downloader/src") && has("crates/migration/src"));
        assert!(has("crates/chunker/src") && has("crates/manifest/src"));
        // a dev-dependency and a crate only the release side uses are not sources of the device
        assert!(!has("crates/test-support/src") && !has("crates/artifact-store/src"));
    }

    #[test]
    fn a_binary_older_than_a_source_is_refused_and_a_rebuilt_one_passes() {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path();
        fs::write(
            ws.join("Cargo.toml"),
            "[workspace.dependencies]\nlibx = { path = \"crates/libx\" }\n",
        )
        .unwrap();
        for (dir, deps) in [("bins/app", "libx.workspace = true\n"), ("crates/libx", "")] {
            fs::create_dir_all(ws.join(dir).join("src")).unwrap();
            fs::write(
                ws.join(dir).join("Cargo.toml"),
                format!("[package]\n[dependencies]\n{deps}"),
            )
            .unwrap();
        }
        let lib = ws.join("crates/libx/src/lib.rs");
        fs::write(&lib, "").unwrap();
        let bin = ws.join("app");
        assert!(
            check(&bin, ws, &ws.join("bins/app"))
                .unwrap_err()
                .contains("not built")
        );
        fs::write(&bin, "").unwrap();
        let old = SystemTime::now() - Duration::from_secs(60);
        fs::File::options()
            .write(true)
            .open(&bin)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let err = check(&bin, ws, &ws.join("bins/app")).unwrap_err();
        assert!(
            err.starts_with("stale binary") && err.contains("libx/src/lib.rs"),
            "{err}"
        );
        fs::File::options()
            .write(true)
            .open(&bin)
            .unwrap()
            .set_modified(SystemTime::now() + Duration::from_secs(60))
            .unwrap();
        check(&bin, ws, &ws.join("bins/app")).unwrap();
    }
}
