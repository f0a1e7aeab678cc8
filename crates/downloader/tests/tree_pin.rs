//! The tinygrad pin of the device's openpilot tree (`Downloader::with_tinygrad_pin`): a manifest
//! whose `tinygrad_commit` is another tinygrad is refused like one of another generation, and the
//! next origin is tried.

use downloader::Error;
use manifest::{Generation, GitCommit, layout};
use test_support::published::{GH_DIR, HF_DIR, PublishedModel, manifest_json, write_manifest_at};

use crate::common::*;

/// A made-up next generation's pin (no real tinygrad commit).
const V26_PIN: &str = "26262626262626262626262626262626262626aa";

fn model() -> PublishedModel {
    PublishedModel {
        id: "pop223".into(),
        name: "Pop".into(),
        size: 10,
        sha256: "a".repeat(64),
        chunk_count: 1,
        chunk_sha256: vec![],
    }
}

/// `generation`'s manifest listing one model, with `pin` as its `tinygrad_commit` (none: no key).
fn manifest_with_pin(generation: &str, pin: Option<&str>) -> Vec<u8> {
    let body = manifest_json(generation, &[model()], false);
    match pin {
        None => body.into_bytes(),
        Some(pin) => body
            .replacen(
                "\"models\":",
                &format!("\"tinygrad_commit\": \"{pin}\",\n  \"models\":"),
                1,
            )
            .into_bytes(),
    }
}

#[test]
fn a_manifest_for_another_tinygrad_is_refused_and_the_next_origin_tried() {
    let v25 = layout::CURRENT_GENERATION;
    let v26 = Generation::new(26);
    let pin25 = layout::current_tinygrad_commit();
    let pin26: GitCommit = V26_PIN.parse().unwrap();
    let w = world();
    // For each generation: the tree's pin, and a pin of another tinygrad.
    for (generation, tree_pin, other) in [
        (v25, pin25.clone(), pin26.clone()),
        (v26, pin26.clone(), pin25.clone()),
    ] {
        let g = generation.to_string();
        let d = w.downloader(config()).with_tinygrad_pin(tree_pin.clone());
        assert_eq!(d.tinygrad_pin(), Some(&tree_pin));
        write_manifest_at(
            &w.root,
            GH_DIR,
            &g,
            &manifest_with_pin(&g, Some(tree_pin.as_str())),
        );
        // Hugging Face serves the other tinygrad's manifest: refused, GitHub's is taken.
        write_manifest_at(
            &w.root,
            HF_DIR,
            &g,
            &manifest_with_pin(&g, Some(other.as_str())),
        );
        let got = d.fetch_manifest(generation).unwrap();
        assert!(got.origin.starts_with("GitHub"), "{g}: {}", got.origin);
        assert_eq!(got.manifest.tinygrad_commit(), Some(tree_pin.clone()));
        // Both origins serve it: no manifest, each attempt names both pins.
        write_manifest_at(
            &w.root,
            GH_DIR,
            &g,
            &manifest_with_pin(&g, Some(other.as_str())),
        );
        let err = d.fetch_manifest(generation).unwrap_err();
        let Error::ManifestUnavailable { attempts, .. } = &err else {
            panic!("{g}: {err}");
        };
        assert_eq!(attempts.len(), 2, "{err}");
        for (_, e) in attempts {
            assert!(
                matches!(e, Error::WrongTinygrad { expected, found, .. }
                    if *expected == tree_pin && *found == other),
                "{g}: {e}"
            );
            let text = e.to_string();
            assert!(
                text.contains(other.as_str()) && text.contains(tree_pin.as_str()),
                "{text}"
            );
        }
        assert!(
            !err.is_offline(),
            "a refused manifest is not a network problem"
        );
        // A manifest without the key (the live shape) is read as before.
        write_manifest_at(&w.root, HF_DIR, &g, &manifest_with_pin(&g, None));
        let got = d.fetch_manifest(generation).unwrap();
        assert!(got.origin.starts_with("Hugging Face"), "{g}");
        // Without a tree pin nothing is compared.
        write_manifest_at(
            &w.root,
            HF_DIR,
            &g,
            &manifest_with_pin(&g, Some(other.as_str())),
        );
        let got = w.downloader(config()).fetch_manifest(generation).unwrap();
        assert!(got.origin.starts_with("Hugging Face"), "{g}");
    }
}
