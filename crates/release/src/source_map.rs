//! `release-cli source-map next`: the next generation's source map,
//! `scripts/model_source_map_<gen>.json` in the openpilot tree, written from the previous
//! generation's map and the tree's reviewed catalog (docs/release.md, "Bumping to the next
//! generation", step 4).
//!
//! The maps are kept one per generation so a recovered source never rewrites older history;
//! the next one starts as the previous one, entry for entry and in its order (release ids are
//! stable across generations: the same id, the same `source_id`, `input_format` and `ref`).
//! Under a contract whose entries are the tree's reviewed catalog (v26's), the map follows the
//! catalog: an entry the catalog does not list is left out, a catalog row without an entry gets
//! `{"source_id": <id>, "input_format": "auto"}` (its archive directory `onnx/<id>/`), and a
//! `uses_external_gpu` that disagrees with the row takes the row's value. [`next_map`] is the
//! pure decision; [`write_next`] reads and writes.

use std::path::{Path, PathBuf};

use manifest::{Generation, ModelId, TreeDeclaration};
use serde::Serialize;

use crate::{Error, Result};

/// Where a generation's source map lives in the openpilot tree.
pub fn map_path(openpilot: &Path, generation: Generation) -> PathBuf {
    openpilot
        .join("scripts")
        .join(format!("model_source_map_{generation}.json"))
}

/// The next map, decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NextMap {
    /// The map's bytes (pretty JSON, entries in the previous map's order, new rows last).
    pub bytes: Vec<u8>,
    /// Ids carried over from the previous map.
    pub kept: Vec<ModelId>,
    /// Ids of the previous map the tree's catalog does not list (left out).
    pub dropped: Vec<ModelId>,
    /// Catalog rows the previous map had no entry for (added with the defaults).
    pub added: Vec<ModelId>,
    /// Entries whose `uses_external_gpu` was set to the catalog's value.
    pub gpu_from_catalog: Vec<ModelId>,
}

/// The next map from the previous one's bytes (`from`, named in errors) and the tree's
/// declaration when it takes the entries from its catalog (`None`: every entry carried over).
/// Pure.
pub fn next_map(
    previous: &[u8],
    from: &Path,
    catalog: Option<&TreeDeclaration>,
) -> Result<NextMap> {
    // The previous map must be one rebuild reads.
    crate::rebuild::parse_source_map(previous, from)?;
    let doc: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(previous)
        .map_err(|e| Error::SourceMap {
            path: from.to_path_buf(),
            problem: format!("not a JSON object: {e}"),
        })?;
    let mut out = serde_json::Map::new();
    let mut next = NextMap::default();
    for (key, value) in doc {
        let id: ModelId = key.parse().expect("checked by parse_source_map");
        let mut value = value;
        if let Some(d) = catalog {
            let Some(row) = d.catalog.iter().find(|r| r.id == id) else {
                next.dropped.push(id);
                continue;
            };
            let entry = value.as_object_mut().expect("checked by parse_source_map");
            if let Some(serde_json::Value::Bool(gpu)) = entry.get("uses_external_gpu")
                && *gpu != row.uses_external_gpu
            {
                entry.insert(
                    "uses_external_gpu".into(),
                    serde_json::Value::Bool(row.uses_external_gpu),
                );
                next.gpu_from_catalog.push(id.clone());
            }
        }
        next.kept.push(id);
        out.insert(key, value);
    }
    if let Some(d) = catalog {
        for row in &d.catalog {
            if out.contains_key(row.id.as_str()) {
                continue;
            }
            out.insert(
                row.id.to_string(),
                serde_json::json!({"source_id": row.id.as_str(), "input_format": "auto"}),
            );
            next.added.push(row.id.clone());
        }
    }
    let mut bytes =
        serde_json::to_vec_pretty(&serde_json::Value::Object(out)).expect("JSON serializes");
    bytes.push(b'\n');
    next.bytes = bytes;
    Ok(next)
}

/// What `source-map next` did (or, with `dry_run`, would do).
#[derive(Debug, Clone, Serialize)]
pub struct NextMapReport {
    pub generation: Generation,
    pub from: PathBuf,
    pub source_map: PathBuf,
    pub models: usize,
    pub kept: Vec<ModelId>,
    pub dropped: Vec<ModelId>,
    pub added: Vec<ModelId>,
    pub gpu_from_catalog: Vec<ModelId>,
    pub dry_run: bool,
    /// `false` on a dry run, and when the file already held exactly these bytes.
    pub written: bool,
    /// The map is already there with other content (a dry run says so; a real run refuses).
    pub differs_from_existing: bool,
}

/// Write `generation`'s source map in `openpilot` from `from` (default: the previous
/// generation's map beside it). `generation` defaults to the tree's (the one whose pin its
/// tinygrad is, its selectors agreeing). A map already there with other bytes is refused
/// (it may hold hand edits); the same bytes again change nothing.
pub fn write_next(
    openpilot: &Path,
    from: Option<&Path>,
    generation: Option<Generation>,
    dry_run: bool,
) -> Result<NextMapReport> {
    let tree_generation = crate::tree::check_selectors(openpilot)?;
    let generation = generation
        .or(tree_generation)
        .ok_or_else(|| Error::SourceMap {
            path: openpilot.to_path_buf(),
            problem: "no generation given and the tree's tinygrad is no generation's pin; \
                      pass --generation vNN"
                .into(),
        })?;
    let from = match from {
        Some(p) => p.to_path_buf(),
        None => {
            let prev = generation.previous().ok_or_else(|| Error::SourceMap {
                path: openpilot.to_path_buf(),
                problem: format!("{generation} has no previous generation; pass --from FILE"),
            })?;
            map_path(openpilot, prev)
        }
    };
    let previous =
        chunker::bounded::read_capped_existing(&from, crate::rebuild::MAX_SOURCE_MAP_BYTES)?;
    let (_, declared) = crate::tree::load_tree(Some(openpilot))?;
    let pins = crate::tree::load_pins(Some(openpilot))?;
    let catalog = declared.filter(|d| {
        d.generation == generation && pins.contract(generation).entries_from_tree_catalog
    });
    let next = next_map(&previous, &from, catalog.as_ref())?;
    let path = map_path(openpilot, generation);
    if path == from {
        return Err(Error::SourceMap {
            path,
            problem: "--from is the map being written; pass the previous generation's".into(),
        });
    }
    let existing = chunker::bounded::read_capped(&path, crate::rebuild::MAX_SOURCE_MAP_BYTES)?;
    if existing.is_none() && path.symlink_metadata().is_ok() {
        return Err(Error::SourceMap {
            path,
            problem: "is there but not a regular file; remove it and run this again".into(),
        });
    }
    let differs = existing.as_ref().is_some_and(|b| *b != next.bytes);
    let written = match existing {
        Some(bytes) if bytes == next.bytes => false,
        Some(_) if dry_run => false,
        Some(_) => {
            return Err(Error::SourceMapExists {
                path,
                openpilot: openpilot.to_path_buf(),
            });
        }
        None if dry_run => false,
        None => {
            if let Some(dir) = path.parent() {
                fs_err::create_dir_all(dir)?;
            }
            chunker::atomic::write_atomic(&path, &next.bytes)?;
            true
        }
    };
    Ok(NextMapReport {
        generation,
        from,
        source_map: path,
        models: next.kept.len() + next.added.len(),
        kept: next.kept,
        dropped: next.dropped,
        added: next.added,
        gpu_from_catalog: next.gpu_from_catalog,
        dry_run,
        written,
        differs_from_existing: differs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREVIOUS: &str = r#"{
  "pop223": {"source_id": "pop22", "input_format": "split", "ref": "62bf6fb072880905a4c490f0f4f4a6b3c23346ec"},
  "bmrlnapv6": {"source_id": "bmrlnapv6", "input_format": "supercombo", "uses_external_gpu": true},
  "sc2": {"input_format": "auto"}
}"#;

    fn declaration(generation: &str, rows: &[(&str, bool)]) -> TreeDeclaration {
        let t = tempfile::tempdir().unwrap();
        let rows: Vec<test_support::v26_checker::Row<'_>> = rows
            .iter()
            .map(|(id, gpu)| (*id, *id, "v11", *gpu, false))
            .collect();
        test_support::v26_checker::write_tree(t.path(), generation, &"2".repeat(40), &rows);
        crate::tree::tree_declaration(t.path()).unwrap().unwrap()
    }

    /// v25 (no tree catalog): every entry carried over, byte for byte in value and order. v26's
    /// contract and a made-up v27: the catalog decides which ids, ids stay stable, new rows get
    /// the archive defaults, GPU flags follow the rows. The result is a map rebuild reads.
    #[test]
    fn the_next_map_keeps_ids_and_follows_the_catalog() {
        let from = Path::new("scripts/model_source_map_v25.json");
        let n = next_map(PREVIOUS.as_bytes(), from, None).unwrap();
        let ids = |v: &[ModelId]| v.iter().map(ModelId::to_string).collect::<Vec<_>>();
        assert_eq!(ids(&n.kept), ["pop223", "bmrlnapv6", "sc2"]);
        assert!(n.dropped.is_empty() && n.added.is_empty() && n.gpu_from_catalog.is_empty());
        let a: serde_json::Value = serde_json::from_slice(&n.bytes).unwrap();
        let b: serde_json::Value = serde_json::from_str(PREVIOUS).unwrap();
        assert_eq!(a, b);
        crate::rebuild::parse_source_map(&n.bytes, from).unwrap();

        for generation in ["v26", "v27"] {
            let d = declaration(
                generation,
                &[("pop223", false), ("bmrlnapv6", false), ("newmodel", false)],
            );
            let n = next_map(PREVIOUS.as_bytes(), from, Some(&d)).unwrap();
            assert_eq!(ids(&n.kept), ["pop223", "bmrlnapv6"], "{generation}");
            assert_eq!(ids(&n.dropped), ["sc2"], "{generation}");
            assert_eq!(ids(&n.added), ["newmodel"], "{generation}");
            assert_eq!(ids(&n.gpu_from_catalog), ["bmrlnapv6"], "{generation}");
            let map = crate::rebuild::parse_source_map(&n.bytes, from).unwrap();
            let order: Vec<String> = map.iter().map(|e| e.id.to_string()).collect();
            assert_eq!(order, ["pop223", "bmrlnapv6", "newmodel"]);
            assert_eq!(map[0].source_id.as_str(), "pop22", "ids and sources stable");
            assert_eq!(
                map[0].source_commit.as_ref().unwrap().as_str(),
                "62bf6fb072880905a4c490f0f4f4a6b3c23346ec"
            );
            assert_eq!(map[1].uses_external_gpu, Some(false));
            assert_eq!(map[2].source_id.as_str(), "newmodel");
        }
        // A previous map rebuild would refuse is refused here, naming it.
        let e = next_map(br#"{"x": {"ref": "abc"}}"#, from, None).unwrap_err();
        assert!(e.to_string().contains("model_source_map_v25.json"), "{e}");
    }

    /// The command in a tree: the previous generation's map beside it is read, the next one
    /// written once; the same run again changes nothing; a hand-edited map is never
    /// overwritten; a dry run writes nothing.
    #[test]
    fn writing_the_next_map_in_a_tree() {
        let t = tempfile::tempdir().unwrap();
        let op = t.path();
        fs_err::create_dir_all(op.join("tinygrad_repo")).unwrap();
        let pin = "2".repeat(40);
        fs_err::write(op.join("tinygrad_repo/TINYGRAD_COMMIT"), format!("{pin}\n")).unwrap();
        fs_err::write(
            op.join(manifest::pins::PINS_FILE),
            format!(r#"{{"v26": "{pin}"}}"#),
        )
        .unwrap();
        let v26 = Generation::new(26);
        // No previous map: the error names the file it looked for.
        let e = write_next(op, None, None, false).unwrap_err().to_string();
        assert!(e.contains("model_source_map_v25.json"), "{e}");
        fs_err::create_dir_all(op.join("scripts")).unwrap();
        fs_err::write(map_path(op, Generation::new(25)), PREVIOUS).unwrap();
        let r = write_next(op, None, None, true).unwrap();
        assert!(!r.written && r.dry_run);
        assert!(!map_path(op, v26).exists(), "a dry run wrote the map");
        let r = write_next(op, None, None, false).unwrap();
        assert_eq!((r.generation, r.models, r.written), (v26, 3, true));
        let again = write_next(op, None, None, false).unwrap();
        assert!(!again.written);
        fs_err::write(map_path(op, v26), "{}\n").unwrap();
        let dry = write_next(op, None, None, true).unwrap();
        assert!(dry.differs_from_existing && !dry.written);
        let e = write_next(op, None, None, false).unwrap_err();
        assert!(matches!(e, Error::SourceMapExists { .. }), "{e}");
        assert_eq!(fs_err::read_to_string(map_path(op, v26)).unwrap(), "{}\n");
    }
}
