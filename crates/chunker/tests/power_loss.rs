//! `chunk split --out-dir` into a directory that does not exist yet, cut by power loss, under a
//! strict-POSIX model (`test_support::strict_fs`: an entry is durable only once its directory
//! is fsynced, bytes only once the file is). After each effect of the split
//! (`chunker::effects`), no state shows a chunk manifest without the whole set behind it, and
//! once the split has returned, the whole set is durable, new directories and all.

use std::path::Path;
use std::sync::{Arc, Mutex};

use chunker::effects::{self, Effect};
use chunker::{SplitOptions, chunk_manifest_name, chunk_name, split_file};
use test_support::strict_fs::{Entry, StrictFs, Tree, View};

const NAME: &str = "pop223_driving_tinygrad.pkl";

fn file<'a>(tree: &'a Tree, p: &Path) -> Option<&'a [u8]> {
    match tree.get(p) {
        Some(Entry::File { data, .. }) => Some(&data[..]),
        _ => None,
    }
}

/// Whether a state holds the whole set in `out` (relative), or `Err` with what is wrong when a
/// chunk manifest is there without the set it names.
fn set_in(tree: &Tree, out: &Path, data: &[u8]) -> Result<bool, String> {
    let Some(cm) = file(tree, &out.join(chunk_manifest_name(NAME))) else {
        return Ok(false);
    };
    let n: u32 = std::str::from_utf8(cm)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| format!("a chunk manifest that reads {cm:?}"))?;
    let mut joined = Vec::new();
    for i in 1..=n {
        let name = chunk_name(NAME, i, n);
        joined.extend_from_slice(
            file(tree, &out.join(&name))
                .ok_or_else(|| format!("the manifest names {name}, gone"))?,
        );
    }
    if joined != data {
        return Err("the set joins to other bytes".into());
    }
    Ok(true)
}

#[test]
fn a_split_into_a_new_out_dir_is_durable_when_it_returns() {
    let t = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..2500u32).map(|i| (i * 7 % 251) as u8).collect();
    let src = t.path().join(NAME);
    std::fs::write(&src, &data).unwrap();
    let out_rel = Path::new("out/a/b");
    let model = Arc::new(Mutex::new(StrictFs::new(t.path())));
    let problems = Arc::new(Mutex::new(Vec::new()));
    let (m, pr, d) = (Arc::clone(&model), Arc::clone(&problems), data.clone());
    let obs = effects::observe(t.path(), move |e| {
        let mut m = m.lock().unwrap();
        match e {
            Effect::SyncedFile(p) => m.sync_file(p),
            Effect::SyncedDir(p) => m.sync_dir(p),
            _ => m.refresh(),
        }
        for view in View::ALL {
            if let Err(why) = set_in(&m.state(view), out_rel, &d) {
                pr.lock()
                    .unwrap()
                    .push(format!("after {e:?} ({view:?}): {why}"));
            }
        }
    });
    let report = split_file(
        &src,
        &t.path().join(out_rel),
        &SplitOptions { chunk_size: 1000 },
    )
    .unwrap();
    drop(obs);
    assert_eq!(report.chunk_count, 3);
    let problems = problems.lock().unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
    let synced = model.lock().unwrap().state(View::Synced);
    assert_eq!(
        set_in(&synced, out_rel, &data),
        Ok(true),
        "after the split returned, a power cut keeps the whole set (out/, out/a and out/a/b synced into their parents)"
    );
}
