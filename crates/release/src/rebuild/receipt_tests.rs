//! The rebuild under a contract with build receipts (v26, and a made-up v27 with v26's
//! contract): each artifact built gets its receipt beside it, its stamp checked first; under
//! v25 nothing is written beside it. Driven by a builder that writes stamped OOB pickles.

use std::collections::HashMap;

use manifest::ContractName;
use manifest::receipt::read_receipt;

use super::*;

const V26_PIN: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";
const V27_PIN: &str = "27b0c0ffee27b0c0ffee27b0c0ffee27b0c0ffee";

const BASE: &str = r#"{"models": [
  {"id": "pop223", "name": "Pop", "version": "v11", "series": "OP Series", "released": "2025-01-01", "community_favorite": true},
  {"id": "sc23", "name": "SC", "version": "v9", "series": "OP Series", "released": "2025-01-02", "community_favorite": false}
]}"#;

/// A protocol-5 pickle of the stamp dict in an OOB container with one buffer record.
fn stamped(pairs: &[(&str, &str)], format_version: u8, payload: &[u8]) -> Vec<u8> {
    let s = |out: &mut Vec<u8>, v: &str| {
        out.push(0x8c);
        out.push(v.len() as u8);
        out.extend_from_slice(v.as_bytes());
    };
    let mut p = vec![0x80, 5, b'}', 0x94, b'('];
    for (k, v) in pairs {
        s(&mut p, k);
        s(&mut p, v);
    }
    s(&mut p, "format_version");
    p.extend_from_slice(&[b'K', format_version]);
    s(&mut p, "weights");
    p.push(0x97);
    p.extend_from_slice(b"u.");
    let mut out = (p.len() as i64).to_le_bytes().to_vec();
    out.extend_from_slice(&p);
    out.extend_from_slice(&(payload.len() as i64).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Builds each model as a stamped artifact naming `revision[id]` (else the default).
struct StampingBuilder {
    revision: String,
    per_model: HashMap<ModelId, String>,
}

impl Builder for StampingBuilder {
    fn fetch_sources(
        &mut self,
        model: &PlannedModel,
        dir: &Path,
        _say: &mut dyn FnMut(&str),
    ) -> Result<Vec<PathBuf>, BuildError> {
        fs::create_dir_all(dir).unwrap();
        let src = dir.join(format!("{}_driving_supercombo.onnx", model.source.id));
        fs::write(&src, model.source.source_id.as_str()).unwrap();
        Ok(vec![src])
    }

    fn compile(
        &mut self,
        model: &PlannedModel,
        _sources: &[PathBuf],
        out: &Path,
        _log: &Path,
        _say: &mut dyn FnMut(&str),
    ) -> Result<FetchedArtifact, BuildError> {
        let id = &model.source.id;
        let rev = self.per_model.get(id).unwrap_or(&self.revision);
        let version = model.version.to_string();
        let bytes = stamped(
            &[
                ("artifact_abi", "tinygrad_single_v1_arena"),
                ("compiler_revision", rev),
                ("behavior_version", &version),
                ("model_type", "supercombo"),
                ("image_history_pipeline", "policy"),
                ("execution_device", "QCOM"),
                ("warp_device", "QCOM"),
            ],
            1,
            id.as_str().as_bytes(),
        );
        let name = manifest::layout::artifact_file_name(id)
            .as_str()
            .to_string();
        fs::create_dir_all(out).unwrap();
        let r = chunker::split_reader(
            &bytes[..],
            bytes.len() as u64,
            &name,
            out,
            &chunker::SplitOptions { chunk_size: 64 },
        )
        .unwrap();
        Ok(FetchedArtifact {
            files: chunker::set_file_names(&name, r.chunk_count),
            name,
            size: r.size,
            sha256: r.sha256,
            chunk_count: r.chunk_count,
        })
    }

    fn compile_variant(
        &mut self,
        _model: &PlannedModel,
        _variant: &str,
        _sources: &[PathBuf],
        _out: &Path,
        _log: &Path,
        _say: &mut dyn FnMut(&str),
    ) -> Result<Option<FetchedArtifact>, BuildError> {
        Ok(None)
    }
}

fn setup(dir: &Path) -> (PathBuf, PathBuf) {
    let map = dir.join("map.json");
    fs::write(&map, r#"{"pop223": {}, "sc23": {}}"#).unwrap();
    let base = dir.join("base.json");
    fs::write(&base, BASE).unwrap();
    (map, base)
}

fn run(r: &Rebuild, b: &mut StampingBuilder) -> Summary {
    r.run_with(b, Overlap::default(), &mut |_| {}).unwrap()
}

#[test]
fn each_built_artifact_gets_its_receipt_and_a_foreign_stamp_fails_the_model() {
    for (generation, pin, other) in [(26, V26_PIN, V27_PIN), (27, V27_PIN, V26_PIN)] {
        let t = tempfile::tempdir().unwrap();
        let (map, base) = setup(t.path());
        let ws = t.path().join("ws");
        let r = Rebuild::prepare(
            ws.clone(),
            &map,
            &base,
            &[],
            Generation::new(generation),
            pin.parse().unwrap(),
        )
        .unwrap()
        .with_contract(ContractName::V26.contract());
        let mut b = StampingBuilder {
            revision: pin.into(),
            per_model: HashMap::from([("sc23".parse().unwrap(), other.to_string())]),
        };
        let summary = run(&r, &mut b);
        let status: Vec<_> = summary
            .models
            .iter()
            .map(|o| (o.id.as_str(), o.status))
            .collect();
        assert_eq!(
            status,
            [("pop223", "compiled"), ("sc23", "failed")],
            "v{generation}"
        );
        let error = summary.models[1].error.as_deref().unwrap();
        assert!(
            error.contains("compiler_revision") && error.contains(other),
            "{error}"
        );

        let w = Workspace::new(&ws);
        let pop: ModelId = "pop223".parse().unwrap();
        let receipt_path = w
            .ready_model(&pop)
            .join("pop223_driving_tinygrad.build.json");
        let receipt: serde_json::Value =
            serde_json::from_slice(&fs::read(&receipt_path).unwrap()).unwrap();
        // Checked from the contract's field list, not with our reader.
        let keys: Vec<&str> = receipt
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "model_id",
                "behavior_version",
                "model_type",
                "artifact_abi",
                "compiler_revision",
                "source_sha256",
                "artifact_sha256",
                "artifact_size",
                "execution_device",
                "warp_device",
                "image_history_pipeline",
                "camera_resolutions"
            ]
        );
        let (sha, size) = crate::loadable::digest_of(&w.ready_artifact(&pop)).unwrap();
        assert_eq!(receipt["model_id"], "pop223");
        assert_eq!(receipt["behavior_version"], "v11");
        assert_eq!(receipt["artifact_abi"], "tinygrad_single_v1_arena");
        assert_eq!(receipt["compiler_revision"], pin);
        assert_eq!(receipt["artifact_sha256"], sha.to_string());
        assert_eq!(receipt["artifact_size"], size);
        assert_eq!(receipt["model_type"], "supercombo");
        assert_eq!(
            receipt["camera_resolutions"],
            serde_json::json!([[1928, 1208], [1344, 760]])
        );
        assert_eq!(
            receipt["source_sha256"]["pop223_driving_supercombo.onnx"],
            chunker::Sha256Digest::of_bytes(b"pop223").to_string()
        );
        assert!(read_receipt(&fs::read(&receipt_path).unwrap()[..]).is_ok());
        // The refused model has no receipt.
        let sc: ModelId = "sc23".parse().unwrap();
        assert!(
            !w.ready_model(&sc)
                .join("sc23_driving_tinygrad.build.json")
                .exists()
        );
    }
}

#[test]
fn under_v25_no_receipt_is_written() {
    let t = tempfile::tempdir().unwrap();
    let (map, base) = setup(t.path());
    let ws = t.path().join("ws");
    let r = Rebuild::prepare(
        ws.clone(),
        &map,
        &base,
        &[],
        Generation::new(25),
        manifest::layout::current_tinygrad_commit(),
    )
    .unwrap();
    assert_eq!(r.contract.name, ContractName::V25);
    let mut b = StampingBuilder {
        revision: "anything".into(),
        per_model: HashMap::new(),
    };
    let summary = run(&r, &mut b);
    assert_eq!(summary.compiled, 2);
    let pop: ModelId = "pop223".parse().unwrap();
    let names: Vec<String> = fs::read_dir(Workspace::new(&ws).ready_model(&pop))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.ends_with(".build.json")),
        "{names:?}"
    );
}
