//! What a user may type to name a logical artifact: the logical path itself
//! (`out/pop223_driving_tinygrad.pkl`, which is no file when the artifact is chunked, so tab
//! completion cannot produce it), any member of its set (`….chunk01of02`, `….chunkmanifest`,
//! `….sha256`, a legacy `….p00`), or the directory holding exactly one set.
//!
//! [`member_of`] is the pure naming rule; [`locate`] applies it to what is on disk.

use fs_err as fs;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The logical name a set member's file name belongs to, or `None` when the name is no
/// member's (a plain artifact, or anything else). Pure.
///
/// `NAME.chunkNNofMM` (two digits each), `NAME.chunkmanifest`, `NAME.sha256` and the legacy
/// `NAME.pNN` all give `NAME`; `NAME` must not be empty.
pub fn member_of(file_name: &str) -> Option<&str> {
    crate::member_form(file_name).map(|(name, _)| name)
}

/// The logical names of the sets whose members are among `file_names`, sorted. Pure.
pub fn sets_among<'a>(file_names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    file_names
        .into_iter()
        .filter_map(member_of)
        .map(str::to_string)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The logical artifact path `input` names: a directory holding exactly one set gives that
/// set's logical path; an existing member of a set gives the set's; anything else (the logical
/// path itself, a plain artifact) is returned as it is. [`Error::NotFound`] when `input` does
/// not exist and nothing of a set is beside it, or a directory holds no set;
/// [`Error::AmbiguousDirectory`] when it holds several.
pub fn locate(input: &Path) -> Result<PathBuf> {
    let meta = fs::symlink_metadata(input).ok();
    if meta.as_ref().is_some_and(|m| m.is_dir()) {
        let mut names = Vec::new();
        for e in fs::read_dir(input)? {
            let e = e?;
            if e.file_type()?.is_file()
                && let Some(n) = e.file_name().to_str()
            {
                names.push(n.to_string());
            }
        }
        let sets = sets_among(names.iter().map(String::as_str));
        return match sets.as_slice() {
            [one] => Ok(input.join(one)),
            [] => Err(Error::NotFound {
                path: input.to_path_buf(),
            }),
            several => Err(Error::AmbiguousDirectory {
                dir: input.to_path_buf(),
                sets: several.to_vec(),
            }),
        };
    }
    let name = input.file_name().and_then(|n| n.to_str());
    if meta.as_ref().is_some_and(|m| m.is_file())
        && let Some(logical) = name.and_then(member_of)
    {
        return Ok(input.with_file_name(logical));
    }
    if meta.is_none() && crate::read::resolve(input)?.is_none() {
        // Nothing complete under that name: "not found" unless an incomplete set is there (a
        // `.chunkmanifest` whose chunk is missing), which the strict readers name precisely.
        let cm = input.with_file_name(crate::chunk_manifest_name(name.unwrap_or_default()));
        if name.is_none() || fs::symlink_metadata(&cm).is_err() {
            return Err(Error::NotFound {
                path: input.to_path_buf(),
            });
        }
    }
    Ok(input.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: &str = "pop223_driving_tinygrad.pkl";

    #[test]
    fn member_names() {
        let table: &[(&str, Option<&str>)] = &[
            ("pop223_driving_tinygrad.pkl.chunk01of02", Some(N)),
            ("pop223_driving_tinygrad.pkl.chunk12of99", Some(N)),
            ("pop223_driving_tinygrad.pkl.chunkmanifest", Some(N)),
            ("pop223_driving_tinygrad.pkl.sha256", Some(N)),
            ("pop223_driving_tinygrad.pkl.p00", Some(N)),
            ("pop223_driving_tinygrad.pkl", None),
            ("pop223_driving_tinygrad.pkl.chunk1of2", None),
            ("pop223_driving_tinygrad.pkl.chunk01of2x", None),
            ("pop223_driving_tinygrad.pkl.p0", None),
            ("pop223_driving_tinygrad.pkl.part", None),
            (".sha256", None),
            ("sha256", None),
            ("x.chunk01of01", Some("x")),
        ];
        for (name, want) in table {
            assert_eq!(member_of(name), *want, "{name}");
        }
    }

    #[test]
    fn sets_in_a_listing() {
        let names = [
            "a.pkl.chunk01of02",
            "a.pkl.chunk02of02",
            "a.pkl.chunkmanifest",
            "README",
            "b.pkl",
        ];
        assert_eq!(sets_among(names), ["a.pkl"]);
        assert_eq!(
            sets_among(["a.pkl.sha256", "b.pkl.p00"]),
            ["a.pkl", "b.pkl"]
        );
        assert!(sets_among(["b.pkl", "notes.txt"]).is_empty());
    }

    #[test]
    fn every_form_names_the_set() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::write(d.join(format!("{N}.chunk01of02")), b"ab").unwrap();
        std::fs::write(d.join(format!("{N}.chunk02of02")), b"c").unwrap();
        std::fs::write(d.join(format!("{N}.chunkmanifest")), b"2").unwrap();
        let logical = d.join(N);
        for input in [
            d.to_path_buf(),
            d.join(format!("{N}.chunk02of02")),
            d.join(format!("{N}.chunkmanifest")),
            logical.clone(),
        ] {
            assert_eq!(locate(&input).unwrap(), logical, "{}", input.display());
        }
        // Missing: not found, whatever form was typed.
        for missing in [d.join("other.pkl"), d.join("other.pkl.chunk01of02")] {
            assert!(
                matches!(locate(&missing), Err(Error::NotFound { .. })),
                "{}",
                missing.display()
            );
        }
        let empty = d.join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(matches!(locate(&empty), Err(Error::NotFound { .. })));
        // Two sets in one directory: refused, naming both.
        std::fs::write(d.join("b.pkl.chunkmanifest"), b"1").unwrap();
        match locate(d) {
            Err(Error::AmbiguousDirectory { sets, .. }) => assert_eq!(sets, ["b.pkl", N]),
            other => panic!("{other:?}"),
        }
        // An incomplete set is left to the strict readers, which name the missing chunk.
        std::fs::remove_file(d.join(format!("{N}.chunk02of02"))).unwrap();
        assert_eq!(locate(&logical).unwrap(), logical);
    }
}
