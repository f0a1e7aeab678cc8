//! The rebuild's rules, driven by a fake builder: no store, no SSH.

use std::collections::HashMap;

use compiler_remote::InputFormat;

use super::*;

const PIN: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";
const OTHER_PIN: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";
const REF: &str = "62bf6fb072880905a4c490f0f4f4a6b3c23346ec";

const BASE: &str = r#"{"models": [
  {"id": "pop223", "name": "Pop", "version": "v11", "series": "OP Series", "released": "2025-01-01", "community_favorite": true, "artifact_format": "tinygrad_single_v1", "artifact_size": 5, "artifact_sha256": "0000000000000000000000000000000000000000000000000000000000000000", "artifact_chunk_count": 1, "uses_external_gpu": false},
  {"id": "sc23", "name": "SC", "version": "v9", "series": "OP Series", "released": "2025-01-02", "community_favorite": false},
  {"id": "bmrlnapv6", "name": "B", "version": "v16", "series": "WM Series", "released": "2025-01-03", "community_favorite": false, "uses_external_gpu": true}
]}"#;

/// [`variant_block_for`] under v25 with the record's pin.
fn variant_block(
    base: &manifest::ModelEntry,
    record: Option<&BuildRecord>,
) -> (Option<serde_json::Value>, Vec<VariantDropped>) {
    let pin = record.map(|r| r.tinygrad_commit.clone());
    variant_block_for(
        base,
        record,
        manifest::ContractName::V25.contract(),
        pin.as_ref(),
    )
}

/// [`build_manifest_for`] under v25.
fn build_manifest(
    base: &Manifest,
    records: &[BuildRecord],
    generation: Generation,
    pin: &GitCommit,
) -> Result<Manifest> {
    let v25 = manifest::ContractName::V25.contract();
    build_manifest_for(base, records, generation, pin, v25)
}

fn base() -> Manifest {
    Manifest::from_slice(BASE.as_bytes()).unwrap()
}

fn id(s: &str) -> ModelId {
    s.parse().unwrap()
}

#[test]
fn source_map_shapes() {
    let map = parse_source_map(
        format!(
            r#"{{"pop223": {{"source_id": "pop22", "input_format": "split", "ref": "{REF}"}},
                "sc23": {{"input_format": "supercombo"}},
                "new1": {{"input_format": "auto", "uses_external_gpu": true}}}}"#
        )
        .as_bytes(),
        Path::new("m.json"),
    )
    .unwrap();
    assert_eq!(map.len(), 3);
    assert_eq!(map[0].source_id.as_str(), "pop22");
    assert_eq!(map[0].input_format, InputFormat::Split);
    assert_eq!(map[0].source_commit.as_ref().unwrap().as_str(), REF);
    assert_eq!(map[1].source_id.as_str(), "sc23");
    assert_eq!(map[2].uses_external_gpu, Some(true));
    for bad in [
        r#"[]"#,
        r#"{"Bad": {}}"#,
        r#"{"a": {"input_format": "onnx"}}"#,
        r#"{"a": {"ref": "62bf6fb"}}"#,
        r#"{"a": {"uses_external_gpu": "yes"}}"#,
    ] {
        assert!(
            matches!(
                parse_source_map(bad.as_bytes(), Path::new("m")),
                Err(Error::SourceMap { .. })
            ),
            "{bad}"
        );
    }
}

#[test]
fn plan_keeps_versions_and_never_adds_models() {
    let map = parse_source_map(
        br#"{"pop223": {"input_format": "split"}, "new1": {}, "bmrlnapv6": {}}"#,
        Path::new("m"),
    )
    .unwrap();
    let (p, missing) = plan(&map, &base(), &[]).unwrap();
    assert_eq!(p.len(), 2);
    assert_eq!(p[0].version.to_string(), "v11");
    assert!(!p[0].gpu);
    assert!(
        p[1].gpu,
        "uses_external_gpu comes from the catalog when the map is silent"
    );
    assert_eq!(missing, vec![id("new1")]);
    assert!(matches!(
        plan(&map, &base(), &[id("new1")]),
        Err(Error::NotInCatalog { .. })
    ));
    assert!(matches!(
        plan(&map, &base(), &[id("sc23")]),
        Err(Error::NotInSourceMap { .. })
    ));
    let (p, _) = plan(&map, &base(), &[id("bmrlnapv6")]).unwrap();
    assert_eq!(p.len(), 1);
}

fn record(g: Generation, pin: &GitCommit) -> BuildRecord {
    BuildRecord {
        id: id("sc23"),
        status: "compiled".into(),
        generation: g,
        tinygrad_commit: pin.clone(),
        version: "v9".parse().unwrap(),
        source_id: id("sc23"),
        input_format: InputFormat::Supercombo,
        uses_external_gpu: false,
        source_commit: Some(REF.parse().unwrap()),
        sources: vec!["a.onnx".into()],
        artifact: RecordedArtifact {
            name: "sc23_driving_tinygrad.pkl".into(),
            size: 2500,
            sha256: chunker::Sha256Digest::of_bytes(b"x"),
            chunk_count: 3,
            files: vec![],
            // A record written before per-chunk digests were kept.
            chunk_sha256: vec![],
        },
        variants: vec![],
        log: "l".into(),
    }
}

#[test]
fn manifest_from_records() {
    let pin: GitCommit = PIN.parse().unwrap();
    let g = Generation::new(26);
    let rec = record(g, &pin);
    assert!(record_matches(&rec, g, &pin));
    assert!(!record_matches(&rec, Generation::new(25), &pin));
    assert!(!record_matches(&rec, g, &OTHER_PIN.parse().unwrap()));

    let m = build_manifest(&base(), std::slice::from_ref(&rec), g, &pin).unwrap();
    assert_eq!(m.generation(), Some(g));
    assert_eq!(m.tinygrad_commit(), Some(pin.clone()));
    let sc = m.get(&id("sc23")).unwrap();
    assert_eq!(sc.version().unwrap().to_string(), "v9");
    assert_eq!(sc.artifact_size().unwrap().get(), 2500);
    assert_eq!(sc.artifact_chunk_count().unwrap().get(), 3);
    assert_eq!(sc.source_commit().unwrap().as_str(), REF);
    // The v25 digest of pop223 describes another generation's pickle: gone.
    let pop = m.get(&id("pop223")).unwrap();
    assert!(pop.artifact_sha256().is_none() && pop.artifact_format().is_none());
    assert_eq!(pop.version().unwrap().to_string(), "v11");
    assert_eq!(m.models().len(), 3);
    assert!(
        sc.chunk_digests().is_none(),
        "no digests recorded, none written"
    );

    // With per-chunk digests recorded, they go into the manifest in chunk order.
    let digests: Vec<_> = [b"a", b"b", b"c"]
        .iter()
        .map(|b| chunker::Sha256Digest::of_bytes(&b[..]))
        .collect();
    let mut with = rec.clone();
    with.artifact.chunk_sha256 = digests.clone();
    let m = build_manifest(&base(), &[with], g, &pin).unwrap();
    let sc = m.get(&id("sc23")).unwrap();
    assert_eq!(sc.chunk_digests().unwrap(), digests);
}

#[test]
fn a_record_fits_only_the_plan_it_was_built_from() {
    let pin: GitCommit = PIN.parse().unwrap();
    let rec = record(Generation::new(26), &pin);
    let map = parse_source_map(
        format!(r#"{{"sc23": {{"input_format": "supercombo", "ref": "{REF}"}}}}"#).as_bytes(),
        Path::new("m"),
    )
    .unwrap();
    let (planned, _) = plan(&map, &base(), &[]).unwrap();
    assert!(record_fits(&rec, &planned[0]));
    type Change = fn(&mut PlannedModel);
    let changes: [(&str, Change); 5] = [
        ("version", |p| p.version = "v10".parse().unwrap()),
        ("input format", |p| {
            p.source.input_format = InputFormat::Split
        }),
        ("source id", |p| p.source.source_id = "sc2".parse().unwrap()),
        ("ref", |p| p.source.source_commit = None),
        ("gpu", |p| p.gpu = true),
    ];
    for (what, change) in changes {
        let mut p = planned[0].clone();
        change(&mut p);
        assert!(!record_fits(&rec, &p), "{what} changed");
    }
}

#[test]
fn which_compiler_errors_stop_the_run() {
    use compiler_remote::{Error as E, Side};
    let table = [
        (
            E::MarkerMissing {
                destination: "c".into(),
                path: "p".into(),
            },
            true,
        ),
        (
            E::MarkerMismatch {
                destination: "c".into(),
                path: "p".into(),
                found: "x".into(),
                expected: PIN.into(),
            },
            true,
        ),
        (
            E::HostKeyNotKnown {
                destination: "c".into(),
                detail: String::new(),
            },
            true,
        ),
        (
            E::RsyncMissing {
                side: Side::Remote,
                host: "c".into(),
                detail: "d".into(),
            },
            true,
        ),
        (
            E::RsyncIncompatible {
                side: Side::Local,
                host: String::new(),
                version: "openrsync".into(),
                detail: "d".into(),
            },
            true,
        ),
        (
            E::CompileFailed {
                model: "sc23".into(),
                status: "exit 1".into(),
                log: "l".into(),
            },
            false,
        ),
        (E::Io(std::io::Error::other("disk")), false),
        (
            E::Stream {
                destination: "c".into(),
                command: "./models".into(),
                source: std::io::Error::other("channel closed"),
            },
            false,
        ),
        (
            E::RemoteCommand {
                destination: "c".into(),
                command: "ls".into(),
                status: "1".into(),
                stderr: String::new(),
            },
            false,
        ),
    ];
    for (e, stops) in table {
        let text = e.to_string();
        assert_eq!(BuildError::from(e).stops_the_run(), stops, "{text}");
    }
}

/// Which steps' failures stop the run (the store, the compiler session, the verdict's record,
/// a builder that cannot validate), each said in its cause's own words.
#[test]
fn which_build_failures_stop_the_run() {
    let io = || std::io::Error::other("disk full");
    let cause = || Box::new(Error::Io(io()));
    let table = [
        (BuildError::SourceStore(io().into()), true),
        (BuildError::Sources(cause()), false),
        (BuildError::Connect(io().into()), true),
        (BuildError::Compiler(io().into()), false),
        (BuildError::ChunkDigests(cause()), false),
        (BuildError::Receipt(cause()), false),
        (BuildError::InstallVariant(cause()), false),
        (BuildError::ValidationJob(cause()), false),
        (BuildError::ValidationRecord(cause()), true),
    ];
    for (e, stops) in table {
        assert_eq!(e.stops_the_run(), stops, "{e:?}");
        assert_eq!(e.to_string(), "disk full", "{e:?}");
    }
    for (e, text) in [
        (
            BuildError::CannotValidate,
            "this builder cannot validate on the device",
        ),
        (
            BuildError::NoDeviceCheck,
            "this builder was not given a device check",
        ),
    ] {
        assert!(e.stops_the_run(), "{e:?}");
        assert_eq!(e.to_string(), text);
    }
}

// ---- the run, with a fake builder ---------------------------------------------------------

/// Builds a model by splitting a few bytes derived from its plan into a real chunk set; fails
/// the models it is told to.
#[derive(Default)]
struct FakeBuilder {
    fail: HashMap<ModelId, BuildError>,
    fetched: Vec<ModelId>,
    compiled: Vec<ModelId>,
    /// Builds accelerator variants (a compiler that can target them), else answers "cannot".
    variants: bool,
    /// Variant builds that fail.
    variant_fail: Vec<ModelId>,
}

impl Builder for FakeBuilder {
    fn fetch_sources(
        &mut self,
        model: &PlannedModel,
        dir: &Path,
        _say: &mut dyn FnMut(&str),
    ) -> Result<Vec<PathBuf>, BuildError> {
        self.fetched.push(model.source.id.clone());
        fs::create_dir_all(dir).unwrap();
        let src = dir.join("driving_supercombo.onnx");
        fs::write(&src, model.source.source_id.as_str()).unwrap();
        Ok(vec![src])
    }

    fn compile(
        &mut self,
        model: &PlannedModel,
        _sources: &[PathBuf],
        out: &Path,
        log: &Path,
        say: &mut dyn FnMut(&str),
    ) -> Result<FetchedArtifact, BuildError> {
        let id = &model.source.id;
        self.compiled.push(id.clone());
        say("fake compile");
        fs::write(log, format!("compiling {id}\n")).unwrap();
        if let Some(e) = self.fail.remove(id) {
            return Err(e);
        }
        let bytes = format!("{id} {} {} {:?}", model.version, model.gpu, model.source);
        let name = manifest::layout::artifact_file_name(id)
            .as_str()
            .to_string();
        fs::create_dir_all(out).unwrap();
        let r = chunker::split_reader(
            bytes.as_bytes(),
            bytes.len() as u64,
            &name,
            out,
            &chunker::SplitOptions { chunk_size: 16 },
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
        model: &PlannedModel,
        variant: &str,
        _sources: &[PathBuf],
        out: &Path,
        _log: &Path,
        _say: &mut dyn FnMut(&str),
    ) -> Result<Option<FetchedArtifact>, BuildError> {
        let id = &model.source.id;
        if !self.variants {
            return Ok(None);
        }
        if self.variant_fail.contains(id) {
            let failed = std::io::Error::other(format!("{variant} compile of {id} failed"));
            return Err(BuildError::Compiler(failed.into()));
        }
        let bytes = format!("{id} {variant} {}", model.version);
        let name = format!("{id}_driving_{variant}_tinygrad.pkl");
        fs::write(out.join(&name), &bytes).unwrap();
        Ok(Some(FetchedArtifact {
            files: vec![name.clone()],
            name,
            size: bytes.len() as u64,
            sha256: chunker::Sha256Digest::of_bytes(bytes.as_bytes()),
            chunk_count: 0,
        }))
    }
}

/// The variant rule: a rebuilt manifest carries a variant only when it was rebuilt with its
/// model for this generation; every other variant of the base is dropped and named. For v25
/// and a made-up v26.
#[test]
fn variant_block_table() {
    let base_entry = |variants: bool| {
        let mut e = serde_json::json!({"id": "gwm8223", "name": "GWM", "version": "v11"});
        if variants {
            e["accelerator_artifacts"] = serde_json::json!({"chestnut": {
                "artifact_format": "tinygrad_single_v1",
                "artifact_filename": "gwm8223_driving_chestnut_tinygrad.pkl",
                "artifact_size": 67571389,
                "artifact_sha256": "5198df6889af1244f1daa9cd29388e2a3992328f91d7f44d2633e8702a4e19d1",
                "artifact_chunk_count": 0,
                "execution_device": "AMD"}});
        }
        manifest::ModelEntry::from_map(e.as_object().unwrap().clone()).unwrap()
    };
    let rebuilt = RecordedVariant {
        variant: "chestnut".into(),
        execution_device: Some("AMD".into()),
        artifact: RecordedArtifact {
            name: "gwm8223_driving_chestnut_tinygrad.pkl".into(),
            size: 42,
            sha256: chunker::Sha256Digest::of_bytes(b"new"),
            chunk_count: 0,
            files: vec![],
            chunk_sha256: vec![],
        },
    };
    for (g, pin) in [
        (Generation::new(25), PIN),
        (
            Generation::new(26),
            "26a0c0ffee26a0c0ffee26a0c0ffee26a0c0ffee",
        ),
    ] {
        let pin: GitCommit = pin.parse().unwrap();
        let mut rec = record(g, &pin);
        rec.id = id("gwm8223");
        let mut with = rec.clone();
        with.variants = vec![rebuilt.clone()];
        // (case, base has a variant, record, block written (size), dropped reasons)
        type Case<'a> = (
            &'a str,
            bool,
            Option<&'a BuildRecord>,
            Option<u64>,
            Vec<&'a str>,
        );
        let cases: Vec<Case> = vec![
            ("no variant, no build", false, None, None, vec![]),
            ("no variant, built", false, Some(&rec), None, vec![]),
            (
                "variant, no build for this generation",
                true,
                None,
                None,
                vec!["the model has no build for this generation"],
            ),
            (
                "variant, model built but variant not",
                true,
                Some(&rec),
                None,
                vec!["it was not rebuilt for this generation"],
            ),
            ("variant rebuilt", true, Some(&with), Some(42), vec![]),
        ];
        for (name, has, r, want_size, want_dropped) in cases {
            let (block, dropped) = variant_block(&base_entry(has), r);
            let size = block
                .as_ref()
                .map(|b| b["chestnut"]["artifact_size"].as_u64().unwrap());
            assert_eq!(size, want_size, "{g} {name}");
            let reasons: Vec<&str> = dropped.iter().map(|d| d.reason.as_str()).collect();
            assert_eq!(reasons, want_dropped, "{g} {name}");
            for d in &dropped {
                let text = d.to_string();
                assert!(
                    text.contains("model gwm8223: accelerator variant \"chestnut\" dropped"),
                    "{text}"
                );
            }
            // The manifest never carries the base block: rebuilt values or nothing.
            let base = Manifest::from_value(
                serde_json::json!({"models": [base_entry(has).fields().clone()]}),
            )
            .unwrap();
            let m = build_manifest(
                &base,
                r.into_iter().cloned().collect::<Vec<_>>().as_slice(),
                g,
                &pin,
            )
            .unwrap();
            let e = m.get(&id("gwm8223")).unwrap();
            match want_size {
                Some(n) => {
                    let acc = e.accelerators();
                    assert_eq!(acc.len(), 1, "{g} {name}");
                    assert_eq!(acc[0].1.size.unwrap().get(), n);
                    assert_eq!(acc[0].1.execution_device.as_deref(), Some("AMD"));
                }
                None => assert!(e.get("accelerator_artifacts").is_none(), "{g} {name}"),
            }
        }
    }
}

/// A run over a base with a Chestnut variant: a builder that cannot build variants drops it
/// with a named warning; one that can writes the rebuilt variant, never the base's values.
#[test]
fn a_run_rebuilds_variants_or_drops_them_with_a_warning() {
    let s = setup();
    let with_variant = BASE.replace(
        r#""released": "2025-01-02", "community_favorite": false}"#,
        r#""released": "2025-01-02", "community_favorite": false, "accelerator_artifacts": {"chestnut": {"artifact_format": "tinygrad_single_v1", "artifact_filename": "sc23_driving_chestnut_tinygrad.pkl", "artifact_size": 67571389, "artifact_sha256": "5198df6889af1244f1daa9cd29388e2a3992328f91d7f44d2633e8702a4e19d1", "artifact_chunk_count": 0, "execution_device": "AMD"}}}"#,
    );
    assert_ne!(with_variant, BASE);
    fs::write(&s.base, with_variant).unwrap();

    let r = rebuild(&s, PIN, &[]);
    let (summary, lines) = run(&r, &mut FakeBuilder::default());
    assert_eq!(summary.variants_dropped.len(), 1);
    assert_eq!(summary.variants_dropped[0].id, id("sc23"));
    assert!(
        lines.iter().any(|l| l
            .contains("sc23: accelerator variant chestnut: this builder cannot build it; dropped")),
        "{lines:#?}"
    );
    let m = Manifest::from_slice(&fs::read(&summary.manifest).unwrap()).unwrap();
    assert!(
        m.get(&id("sc23"))
            .unwrap()
            .get("accelerator_artifacts")
            .is_none()
    );
    assert!(
        m.validate(manifest::ValidationMode::Release)
            .iter()
            .all(|p| !p.path.contains("accelerator"))
    );

    // A builder that builds variants, after the records above were removed.
    fs::remove_dir_all(&s.ws).unwrap();
    let mut b = FakeBuilder {
        variants: true,
        ..Default::default()
    };
    let (summary, _) = run(&r, &mut b);
    assert!(
        summary.variants_dropped.is_empty(),
        "{:?}",
        summary.variants_dropped
    );
    let m = Manifest::from_slice(&fs::read(&summary.manifest).unwrap()).unwrap();
    let acc = m.get(&id("sc23")).unwrap().accelerators();
    assert_eq!(acc.len(), 1);
    let v = &acc[0].1;
    let bytes = fs::read(s.ws.join("ready/sc23/sc23_driving_chestnut_tinygrad.pkl")).unwrap();
    assert_eq!(v.sha256, Some(chunker::Sha256Digest::of_bytes(&bytes)));
    assert_eq!(v.size.unwrap().get(), bytes.len() as u64);
    // A failed variant build drops the variant, not the model.
    fs::remove_dir_all(&s.ws).unwrap();
    let mut b = FakeBuilder {
        variants: true,
        variant_fail: vec![id("sc23")],
        ..Default::default()
    };
    let (summary, lines) = run(&r, &mut b);
    assert!(summary.result().is_ok());
    assert_eq!(summary.variants_dropped.len(), 1);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("accelerator variant chestnut FAILED")),
        "{lines:#?}"
    );
}

struct Setup {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    map: PathBuf,
    base: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let map = dir.path().join("map.json");
    fs::write(
        &map,
        format!(
            r#"{{"pop223": {{"source_id": "pop22", "input_format": "split", "ref": "{REF}"}},
                "sc23": {{}}, "bmrlnapv6": {{}}, "newmodel": {{}}}}"#
        ),
    )
    .unwrap();
    let base = dir.path().join("base.json");
    fs::write(&base, BASE).unwrap();
    Setup {
        ws: dir.path().join("ws"),
        map,
        base,
        _dir: dir,
    }
}

fn rebuild(s: &Setup, pin: &str, only: &[ModelId]) -> Rebuild {
    Rebuild::prepare(
        s.ws.clone(),
        &s.map,
        &s.base,
        only,
        Generation::new(26),
        pin.parse().unwrap(),
    )
    .unwrap()
}

/// Run and return the summary and the progress lines.
fn run(r: &Rebuild, b: &mut FakeBuilder) -> (Summary, Vec<String>) {
    let mut lines = Vec::new();
    let s = r
        .run_with(b, Overlap::default(), &mut |p| {
            lines.push(format!(
                "[{} of {}] {}: {}",
                p.index + 1,
                p.total,
                p.id,
                p.message
            ))
        })
        .unwrap();
    (s, lines)
}

fn statuses(s: &Summary) -> Vec<(&str, &str)> {
    s.models.iter().map(|o| (o.id.as_str(), o.status)).collect()
}

#[test]
fn a_rerun_skips_what_is_done_and_the_manifest_lists_it() {
    let s = setup();
    let r = rebuild(&s, PIN, &[]);
    let mut b = FakeBuilder::default();
    let (first, lines) = run(&r, &mut b);
    assert_eq!(
        statuses(&first),
        [
            ("pop223", "compiled"),
            ("sc23", "compiled"),
            ("bmrlnapv6", "compiled")
        ]
    );
    assert!(first.result().is_ok() && first.complete());
    assert_eq!(first.not_in_catalog, [id("newmodel")]);
    assert!(lines.contains(&"[1 of 3] pop223: compiling (v11, split)".to_string()));
    assert!(lines.contains(&"[3 of 3] bmrlnapv6: compiling (v16, supercombo, gpu)".to_string()));
    let m = Manifest::from_slice(&fs::read(&first.manifest).unwrap()).unwrap();
    assert_eq!(m.generation(), Some(Generation::new(26)));
    assert!(m.get(&id("sc23")).unwrap().chunk_digests().is_some());

    let mut again = FakeBuilder::default();
    let (second, lines) = run(&r, &mut again);
    assert!(again.fetched.is_empty() && again.compiled.is_empty());
    assert_eq!(second.skipped, 3);
    assert!(lines.iter().all(|l| l.ends_with("done earlier, skipped")));
    assert_eq!(fs::read(&second.manifest).unwrap(), m.to_canonical_bytes());
}

/// What makes a finished model stale, so that the next run builds it again.
#[test]
fn stale_records_are_rebuilt() {
    type Change = fn(&Setup) -> Option<&'static str>;
    let table: [(&str, &str, Change); 7] = [
        ("behaviour version changed in the catalog", "pop223", |s| {
            let base = BASE.replace(r#""version": "v11""#, r#""version": "v12""#);
            fs::write(&s.base, base).unwrap();
            None
        }),
        ("source id changed", "pop223", |s| {
            let map = fs::read_to_string(&s.map)
                .unwrap()
                .replace(r#""source_id": "pop22""#, r#""source_id": "pop23""#);
            fs::write(&s.map, map).unwrap();
            None
        }),
        ("ref changed", "pop223", |s| {
            let map = fs::read_to_string(&s.map).unwrap().replace(REF, PIN);
            fs::write(&s.map, map).unwrap();
            None
        }),
        ("input format changed", "pop223", |s| {
            let map = fs::read_to_string(&s.map).unwrap().replace(
                r#""input_format": "split""#,
                r#""input_format": "supercombo""#,
            );
            fs::write(&s.map, map).unwrap();
            None
        }),
        ("GPU target changed", "sc23", |s| {
            let map = fs::read_to_string(&s.map)
                .unwrap()
                .replace(r#""sc23": {}"#, r#""sc23": {"uses_external_gpu": true}"#);
            fs::write(&s.map, map).unwrap();
            None
        }),
        ("ready chunk set no longer verifies", "sc23", |s| {
            let dir = s.ws.join("ready/sc23");
            let chunk = fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.to_string_lossy().contains(".chunk01of"))
                .unwrap();
            fs::write(chunk, b"tampered").unwrap();
            None
        }),
        ("another tinygrad pin", "*", |_| Some(OTHER_PIN)),
    ];
    for (what, rebuilt, change) in table {
        let s = setup();
        run(&rebuild(&s, PIN, &[]), &mut FakeBuilder::default());
        let pin = change(&s).unwrap_or(PIN);
        let mut b = FakeBuilder::default();
        let (summary, _) = run(&rebuild(&s, pin, &[]), &mut b);
        let want: Vec<ModelId> = if rebuilt == "*" {
            vec![id("pop223"), id("sc23"), id("bmrlnapv6")]
        } else {
            vec![id(rebuilt)]
        };
        assert_eq!(b.compiled, want, "{what}");
        assert_eq!(summary.compiled, want.len(), "{what}");
        assert_eq!(summary.skipped, 3 - want.len(), "{what}");
        let rec: BuildRecord = read_json(&s.ws.join(format!("results/{}.json", want[0]))).unwrap();
        assert_eq!(rec.tinygrad_commit.as_str(), pin, "{what}");
    }
}

#[test]
fn a_model_failure_is_recorded_and_the_run_goes_on() {
    let s = setup();
    let r = rebuild(&s, PIN, &[]);
    run(&r, &mut FakeBuilder::default());
    // sc23 is stale now (GPU target), and its rebuild fails.
    fs::write(
        &s.map,
        fs::read_to_string(&s.map)
            .unwrap()
            .replace(r#""sc23": {}"#, r#""sc23": {"uses_external_gpu": true}"#),
    )
    .unwrap();
    let r = rebuild(&s, PIN, &[]);
    let mut b = FakeBuilder::default();
    b.fail.insert(
        id("sc23"),
        BuildError::Compiler(std::io::Error::other("compile of sc23 failed; see sc23.log").into()),
    );
    let (summary, lines) = run(&r, &mut b);
    assert_eq!(
        statuses(&summary),
        [
            ("pop223", "skipped"),
            ("sc23", "failed"),
            ("bmrlnapv6", "skipped")
        ]
    );
    assert!(lines.contains(&"[2 of 3] sc23: FAILED: compile of sc23 failed; see sc23.log".into()));
    match summary.result() {
        Err(Error::ModelsFailed { ids, .. }) => assert_eq!(ids, [id("sc23")]),
        other => panic!("{other:?}"),
    }
    // The older success record is gone with the failed attempt; the manifest has no sc23
    // artifact, the others keep theirs.
    assert!(!s.ws.join("results/sc23.json").exists());
    let failure: FailureRecord = read_json(&s.ws.join("results/sc23.failure.json")).unwrap();
    assert!(failure.error.contains("sc23.log"));
    assert_eq!(summary.without_artifact, [id("sc23")]);
    assert_eq!(summary.with_artifact, 2);

    // Fixed: the retry clears the failure record.
    let (summary, _) = run(&r, &mut FakeBuilder::default());
    assert_eq!(summary.compiled, 1);
    assert!(summary.result().is_ok());
    assert!(!s.ws.join("results/sc23.failure.json").exists());
}

#[test]
fn an_error_every_model_would_meet_stops_the_run() {
    for stop in [
        BuildError::Connect(std::io::Error::other("could not open an SSH session").into()),
        BuildError::from(compiler_remote::Error::MarkerMismatch {
            destination: "c".into(),
            path: "p".into(),
            found: "x".into(),
            expected: PIN.into(),
        }),
    ] {
        let s = setup();
        let r = rebuild(&s, PIN, &[]);
        let mut b = FakeBuilder::default();
        let message = stop.to_string();
        b.fail.insert(id("pop223"), stop);
        let (summary, _) = run(&r, &mut b);
        assert_eq!(
            b.compiled,
            [id("pop223")],
            "nothing after the stop is tried"
        );
        assert_eq!(statuses(&summary), [("pop223", "failed")]);
        assert_eq!(summary.not_attempted, [id("sc23"), id("bmrlnapv6")]);
        match summary.result() {
            Err(Error::RunStopped { reason }) => assert_eq!(reason, message),
            other => panic!("{other:?}"),
        }
        // The manifest is still written, with no artifact for this generation.
        assert!(summary.manifest.is_file());
        assert_eq!(summary.with_artifact, 0);
    }
}

#[test]
fn a_partial_rerun_keeps_finished_work_outside_its_selection() {
    let s = setup();
    run(&rebuild(&s, PIN, &[]), &mut FakeBuilder::default());
    let mut b = FakeBuilder::default();
    let (summary, _) = run(&rebuild(&s, PIN, &[id("sc23")]), &mut b);
    assert_eq!(statuses(&summary), [("sc23", "skipped")]);
    assert_eq!(summary.with_artifact, 3, "{summary:?}");
    // A record outside the selection whose behaviour version the catalog changed is dropped.
    fs::write(
        &s.base,
        BASE.replace(r#""version": "v16""#, r#""version": "v17""#),
    )
    .unwrap();
    let (summary, _) = run(&rebuild(&s, PIN, &[id("sc23")]), &mut b);
    assert_eq!(summary.without_artifact, [id("bmrlnapv6")]);
}

/// A missing source map is named, with the command that writes the generation's map
/// (`source-map next`); other file errors come from fs-err, naming the operation and the file.
#[test]
fn a_missing_source_map_names_its_path() {
    let s = setup();
    fs::remove_file(&s.map).unwrap();
    let Err(e) = Rebuild::prepare(
        s.ws.clone(),
        &s.map,
        &s.base,
        &[],
        Generation::new(26),
        PIN.parse().unwrap(),
    ) else {
        panic!("prepared without a source map")
    };
    assert!(matches!(e, Error::SourceMapMissing { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&*s.map.to_string_lossy())
            && text.contains("`release-cli source-map next --openpilot DIR`")
            && text.contains("scripts/model_source_map_v26.json"),
        "{text}"
    );
    // A directory there is a file error naming it, as before.
    fs::create_dir(&s.map).unwrap();
    let Err(e) = Rebuild::prepare(
        s.ws.clone(),
        &s.map,
        &s.base,
        &[],
        Generation::new(26),
        PIN.parse().unwrap(),
    ) else {
        panic!("prepared from a directory")
    };
    assert!(e.to_string().contains(&*s.map.to_string_lossy()), "{e}");
}

/// `rebuild --generation` must be the generation of the tinygrad it builds with: v25 with the
/// built-in table, a made-up v26 recorded in a tree's table.
#[test]
fn the_generation_is_the_one_of_the_trees_tinygrad() {
    let v25 = Generation::new(25);
    let v26 = Generation::new(26);
    let v27 = Generation::new(27);
    let pin25 = manifest::layout::current_tinygrad_commit();
    let pin26: GitCommit = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf".parse().unwrap();
    let builtin = manifest::PinTable::builtin();
    let mut bumped = manifest::PinTable::builtin();
    bumped.record(v26, &pin26).unwrap();
    let owner = |r: Result<()>| match r {
        Ok(()) => Ok(()),
        Err(Error::RebuildGeneration { owner, .. }) => Err(owner),
        Err(other) => panic!("{other:?}"),
    };
    type Case<'a> = (
        &'a manifest::PinTable,
        Generation,
        &'a GitCommit,
        Result<(), Option<Generation>>,
    );
    let cases: Vec<Case> = vec![
        (&builtin, v25, &pin25, Ok(())),
        (&builtin, v26, &pin25, Err(Some(v25))),
        (&builtin, v26, &pin26, Err(None)),
        (&bumped, v26, &pin26, Ok(())),
        (&bumped, v25, &pin25, Ok(())),
        (&bumped, v27, &pin26, Err(Some(v26))),
        (&bumped, v25, &pin26, Err(Some(v26))),
        (&bumped, v26, &pin25, Err(Some(v25))),
    ];
    for (pins, g, pin, want) in cases {
        assert_eq!(owner(generation_rule(pins, g, pin, "x")), want, "{g} {pin}");
    }
    let e = generation_rule(&bumped, v27, &pin26, "op/tinygrad_repo/TINYGRAD_COMMIT")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rebuild --generation v27 refused")
            && e.contains("op/tinygrad_repo/TINYGRAD_COMMIT")
            && e.contains("is v26's pin")
            && e.contains("rerun with --generation v26")
            && e.contains("`release-cli tinygrad bump` the tree to v27's tinygrad first"),
        "{e}"
    );
    // An older generation than the tree's: no bump can get there (v25's pin belongs to v25).
    let e = generation_rule(&bumped, v25, &pin26, "op/tinygrad_repo/TINYGRAD_COMMIT")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rebuild --generation v25 refused")
            && e.contains("rerun with --generation v26;")
            && e.contains("an openpilot checkout still at v25's pin")
            && !e.contains("tinygrad bump"),
        "{e}"
    );
}

/// Issue 23: the source map and the base manifest are read size-capped and regular-file only:
/// a FIFO does not hang `rebuild`, /dev/zero behind a symlink is not read, an oversized file is
/// refused by its size; each error names the file.
#[test]
fn planted_source_map_and_base_manifest_are_refused_unread() {
    let t = tempfile::tempdir().unwrap();
    let map = t.path().join("map.json");
    fs::write(
        &map,
        br#"{"pop223": {"source_id": "pop223", "input_format": "supercombo"}}"#,
    )
    .unwrap();
    let base_file = t.path().join("base.json");
    fs::write(&base_file, BASE).unwrap();
    let fifo = t.path().join("fifo");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let zero = t.path().join("zero");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let big = t.path().join("big.json");
    fs::write(&big, vec![b' '; (MAX_SOURCE_MAP_BYTES + 1) as usize]).unwrap();
    let prepare = |map: &Path, base: &Path| {
        Rebuild::prepare(
            t.path().join("ws"),
            map,
            base,
            &[],
            Generation::new(26),
            PIN.parse().unwrap(),
        )
    };
    assert!(prepare(&map, &base_file).is_ok());
    for (m, b, named, says) in [
        (&fifo, &base_file, &fifo, "not a regular file"),
        (&zero, &base_file, &zero, "not a regular file"),
        (&big, &base_file, &big, "limit"),
        (&map, &fifo, &fifo, "not a regular file"),
        (&map, &zero, &zero, "not a regular file"),
        (&map, &big, &big, "limit"),
    ] {
        let Err(e) = prepare(m, b) else {
            panic!("{} / {}: prepared", m.display(), b.display())
        };
        let e = e.to_string();
        assert!(
            e.contains(&*named.to_string_lossy()) && e.contains(says),
            "{e}"
        );
    }
}

/// The dry run reads what a run would skip and plans the rest: with every model done it skips
/// them all and makes no check of the compiler; with one model to build it makes the checks a
/// run makes before connecting (here: no rsync at the given path), and writes nothing either way.
#[test]
fn the_dry_run_skips_what_is_done_and_checks_the_compiler_only_to_build() {
    let s = setup();
    let r = rebuild(&s, PIN, &[]);
    run(&r, &mut FakeBuilder::default());
    let opts = compiler_remote::ConnectOptions {
        rsync: s.ws.join("no-such-rsync"),
        ..Default::default()
    };
    let before = tree(&s.ws);
    let plan = r.dry_run(&opts, "store").unwrap();
    assert_eq!(plan.building(), 0);
    assert!(
        plan.models
            .iter()
            .all(|m| m.action == "skip" && m.fetch.is_none())
    );
    assert_eq!(plan.manifest, s.ws.join("ready/model_names_v26.json"));
    assert_eq!(plan.not_in_catalog, [id("newmodel")]);

    fs::remove_file(s.ws.join("results/sc23.json")).unwrap();
    let before_one_gone = tree(&s.ws);
    let e = r.dry_run(&opts, "store").unwrap_err();
    assert!(
        matches!(
            e,
            Error::Compiler(compiler_remote::Error::RsyncMissing { .. })
        ),
        "{e:?}"
    );
    assert_eq!(tree(&s.ws), before_one_gone);
    assert_eq!(before.len(), before_one_gone.len() + 1);
}

/// Every file under `dir` with its bytes.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

// ---- the v26 contract --------------------------------------------------------------------

/// The tree of a v26-contract generation: `sc23` (lab-eligible, no GPU), `bmrlnapv6` (GPU, its
/// version v17 where the base says v16) and `new9` (a row the base lacks); `pop223` is not a row.
fn v26_tree(generation: Generation, revision: &GitCommit) -> manifest::TreeDeclaration {
    let row = |id: &str, v: u32, gpu: bool, lab: bool| manifest::contract::TreeCatalogRow {
        id: id.parse().unwrap(),
        name: id.to_uppercase(),
        version: manifest::BehaviorVersion::new(v),
        uses_external_gpu: gpu,
        model_lab_eligible: lab,
    };
    manifest::TreeDeclaration {
        generation,
        contract: manifest::ContractName::V26,
        compiler_revision: revision.clone(),
        catalog: vec![
            row("sc23", 9, false, true),
            row("bmrlnapv6", 17, true, false),
            row("new9", 8, false, false),
        ],
    }
}

fn v26_variant(name: &str) -> RecordedVariant {
    RecordedVariant {
        variant: name.into(),
        execution_device: Some("AMD".into()),
        artifact: RecordedArtifact {
            name: format!("sc23_driving_{name}_tinygrad.pkl"),
            size: 900,
            sha256: chunker::Sha256Digest::of_bytes(name.as_bytes()),
            chunk_count: 0,
            files: vec![],
            chunk_sha256: vec![],
        },
    }
}

#[test]
fn variant_rules_by_contract() {
    let v25 = manifest::ContractName::V25.contract();
    let v26 = manifest::ContractName::V26.contract();
    // (contract, key, gpu, lab, allowed)
    for (c, key, gpu, lab, allowed) in [
        (v25, "chestnut", false, false, true),
        (v25, "chestnut", true, false, true),
        (v25, "amd", false, false, true),
        (v26, "amd", false, true, true),
        (v26, "amd", true, true, false),
        (v26, "amd", false, false, false),
        (v26, "chestnut", false, true, false),
    ] {
        assert_eq!(
            variant_refusal(c, key, gpu, lab).is_none(),
            allowed,
            "{} {key} gpu={gpu} lab={lab}",
            c.name
        );
    }
    let entry = |v: serde_json::Value| {
        manifest::ModelEntry::from_map(v.as_object().unwrap().clone()).unwrap()
    };
    let declared = entry(serde_json::json!({"id": "sc23", "model_lab_eligible": true,
        "accelerator_artifacts": {"chestnut": {"execution_device": "AMD"}}}));
    assert_eq!(
        variants_to_build(&declared, v25, false),
        [("chestnut".to_string(), Some("AMD".to_string()))]
    );
    assert_eq!(
        variants_to_build(&declared, v26, false),
        [("amd".to_string(), Some("AMD".to_string()))]
    );
    assert!(variants_to_build(&declared, v26, true).is_empty());
    let plain = entry(serde_json::json!({"id": "sc23"}));
    assert!(variants_to_build(&plain, v26, false).is_empty());
    assert!(remote::variant_is_gpu_build_for(v26, "amd"));
    assert!(!remote::variant_is_gpu_build_for(v26, "chestnut"));
}

/// The rebuilt manifest of a v26-contract generation (v26 and a made-up v27) from a v25-shaped
/// base: the tree's rows with their versions and GPU flags, the contract's top-level keys, the
/// arena format, an `amd` variant only where allowed (a `chestnut` one dropped), and an
/// independent checker of the schema accepts it.
#[test]
fn a_v26_contract_manifest_from_the_tree_passes_the_independent_checker() {
    for (generation, revision) in [
        (Generation::new(26), OTHER_PIN.parse::<GitCommit>().unwrap()),
        (
            Generation::new(27),
            "2222222222222222222222222222222222222222".parse().unwrap(),
        ),
    ] {
        let tree = v26_tree(generation, &revision);
        let mut b = base();
        // The v25 base carries the v25 extensions and a chestnut variant on sc23.
        b.set_generation(Generation::new(25));
        b.set_tinygrad_commit(&PIN.parse().unwrap());
        b.get_mut(&id("sc23"))
            .unwrap()
            .set(
                manifest::keys::ACCELERATOR_ARTIFACTS,
                serde_json::json!({"chestnut": {"execution_device": "AMD"}}),
            )
            .unwrap();
        let (tb, dropped) = tree_base(&b, &tree).unwrap();
        assert_eq!(dropped, vec![id("pop223")]);
        assert_eq!(
            tb.ids().map(|i| i.as_str()).collect::<Vec<_>>(),
            ["sc23", "bmrlnapv6", "new9"]
        );
        let contract = manifest::ContractName::V26.contract();
        let mut rec = record(generation, &revision);
        rec.variants = vec![v26_variant("amd"), v26_variant("chestnut")];
        let mut gpu = rec.clone();
        gpu.id = id("bmrlnapv6");
        gpu.version = manifest::BehaviorVersion::new(17);
        gpu.uses_external_gpu = true;
        gpu.variants = vec![v26_variant("amd")];
        let m =
            build_manifest_for(&tb, &[rec.clone(), gpu], generation, &revision, contract).unwrap();
        assert_eq!(
            m.top_level().map(|(k, _)| k).collect::<Vec<_>>(),
            ["generation", "compiler_revision", "artifact_abi"],
            "tinygrad_commit is not a v26 key"
        );
        let sc = m.get(&id("sc23")).unwrap();
        assert_eq!(
            sc.accelerators()
                .into_iter()
                .map(|(k, _)| k)
                .collect::<Vec<_>>(),
            ["amd"]
        );
        assert_eq!(
            sc.get(manifest::keys::ACCELERATOR_ARTIFACTS).unwrap()["amd"]["compiler_revision"],
            revision.as_str()
        );
        assert!(
            m.get(&id("bmrlnapv6"))
                .unwrap()
                .get(manifest::keys::ACCELERATOR_ARTIFACTS)
                .is_none()
        );
        let (_, why) = variant_block_for(
            tb.get(&id("sc23")).unwrap(),
            Some(&rec),
            contract,
            Some(&revision),
        );
        assert_eq!(why.len(), 1);
        assert!(
            why[0].variant == "chestnut" && why[0].reason.contains("only"),
            "{why:?}"
        );

        // Only the models built are listed (new9, a row without a build, is not): every
        // manifest a run writes is publishable.
        assert!(m.get(&id("new9")).is_none());
        // The independent checker.
        let gen_text = generation.to_string();
        let catalog = serde_json::to_vec(&serde_json::json!({"models": tree.catalog.iter().map(|r| serde_json::json!({
            "id": r.id.as_str(), "version": r.version.to_string(), "uses_external_gpu": r.uses_external_gpu
        })).collect::<Vec<_>>()})).unwrap();
        let rt = test_support::v26_checker::Runtime {
            generation: &gen_text,
            compiler_revision: revision.as_str(),
            artifact_abi: "tinygrad_single_v1_arena",
            bundled: "bundled-current",
            catalog: test_support::v26_checker::catalog_rows(&catalog),
        };
        let rows = test_support::v26_checker::check_manifest(&m.to_canonical_bytes(), &rt)
            .unwrap_or_else(|e| panic!("{generation}: {e}\n{}", m.to_canonical_string()));
        assert_eq!(rows.len(), 2);
        // And our own validator, given the tree, at the release level.
        let problems = m.validate_for_contract(
            manifest::ValidationMode::Release,
            contract,
            &manifest::Expectation {
                generation: Some(generation),
                revision: Some(&revision),
                tree: Some(&tree),
            },
        );
        assert!(problems.is_empty(), "{problems:#?}");
        // The v25 contract's manifest from the same inputs is today's.
        let v25 = build_manifest_for(
            &b,
            std::slice::from_ref(&rec),
            generation,
            &revision,
            manifest::ContractName::V25.contract(),
        )
        .unwrap();
        assert_eq!(
            v25,
            build_manifest(&b, &[rec], generation, &revision).unwrap()
        );
    }
}

/// `under_contract`: v25 by default and for a v25 table; a v26-contract generation with its
/// tree plans from the tree's rows (versions and GPU flags the tree's), and a tree of another
/// generation is refused.
#[test]
fn a_rebuild_under_the_v26_contract_plans_from_the_tree() {
    let t = tempfile::tempdir().unwrap();
    let map_path = t.path().join("map.json");
    fs::write(
        &map_path,
        br#"{"sc23": {}, "bmrlnapv6": {"uses_external_gpu": false}, "pop223": {}}"#,
    )
    .unwrap();
    let base_path = t.path().join("base.json");
    fs::write(&base_path, BASE).unwrap();
    let revision: GitCommit = OTHER_PIN.parse().unwrap();
    for g in [26, 27] {
        let generation = Generation::new(g);
        let r = Rebuild::prepare(
            t.path().join("ws"),
            &map_path,
            &base_path,
            &[],
            generation,
            revision.clone(),
        )
        .unwrap();
        assert_eq!(r.contract.name, manifest::ContractName::V25);
        let tree = v26_tree(generation, &revision);
        let mut pins = manifest::PinTable::builtin();
        pins.declare(&tree).unwrap();
        let (r, dropped) = r.under_contract(&pins, Some(&tree)).unwrap();
        assert_eq!(r.contract.name, manifest::ContractName::V26);
        assert_eq!(dropped, vec![id("pop223")]);
        let planned: Vec<(String, String, bool)> = r
            .planned
            .iter()
            .map(|p| (p.source.id.to_string(), p.version.to_string(), p.gpu))
            .collect();
        assert_eq!(
            planned,
            [
                ("sc23".into(), "v9".into(), false),
                ("bmrlnapv6".into(), "v17".into(), true)
            ]
        );
        let other = v26_tree(Generation::new(g + 1), &revision);
        let r = Rebuild::prepare(
            t.path().join("ws"),
            &map_path,
            &base_path,
            &[],
            generation,
            revision.clone(),
        )
        .unwrap();
        assert!(matches!(
            r.under_contract(&pins, Some(&other)),
            Err(Error::RebuildTreeGeneration { .. })
        ));
    }
}

/// One generation, one workspace: a rebuild of the next generation in a workspace that holds
/// the previous one's staged release (its manifest, chunk sets, records, publish history) sets
/// that release aside in generations/<gen>/ before it writes anything, so it stays publishable
/// from there (audit's mend names that workspace); the new release is at the top level. Rerun,
/// nothing moves again. For a v25 workspace rebuilt as a made-up v26, and that v26 as a v27.
#[test]
fn a_rebuild_of_the_next_generation_sets_the_previous_one_aside() {
    for (old, new) in [(25, 26), (26, 27)] {
        let (old, new) = (Generation::new(old), Generation::new(new));
        let s = setup();
        let ws = Workspace::new(&s.ws);
        // The previous generation's release, as rebuild, preflight and publish left it.
        let staged = ws.ready_manifest(old);
        fs::create_dir_all(ws.ready_model(&id("pop223"))).unwrap();
        fs::write(
            ws.ready_model(&id("pop223")).join("old.chunk01of01"),
            b"old",
        )
        .unwrap();
        fs::write(
            &staged,
            format!(r#"{{"generation": "{old}", "models": []}}"#),
        )
        .unwrap();
        fs::write(crate::records::publish_record_path(&staged), b"{}").unwrap();
        fs::create_dir_all(ws.results()).unwrap();
        fs::write(ws.preflight(), b"{\"old\": true}").unwrap();
        let before = tree(ws.root());
        let r = Rebuild::prepare(
            s.ws.clone(),
            &s.map,
            &s.base,
            &[],
            new,
            PIN.parse().unwrap(),
        )
        .unwrap();
        let (summary, _) = run(&r, &mut FakeBuilder::default());
        let aside = ws.generation_dir(old);
        assert_eq!(
            summary.set_aside.as_deref(),
            Some(aside.root()),
            "{old} -> {new}"
        );
        // Every file of the old release is under generations/<old>/, byte for byte.
        for (path, bytes) in before {
            let rel = path.strip_prefix(ws.root()).unwrap();
            assert_eq!(
                fs::read(aside.root().join(rel)).unwrap(),
                bytes,
                "{old} -> {new}: {}",
                rel.display()
            );
        }
        assert!(!staged.exists() && ws.ready_manifest(new).is_file());
        assert_eq!(ws.holding(old), aside);
        assert_eq!(ws.holding(new), ws);
        // The mend audit prints for the old generation publishes from where it now is.
        let mend = crate::audit::MendContext {
            workspace: s.ws.clone(),
            sign_keys: vec![],
            openpilot: None,
        };
        let store = crate::audit::StoreRef::Local {
            root: "/store".into(),
        };
        let line = mend.republish(old, &store, false);
        let at = aside.root().display().to_string();
        assert!(
            line.contains(&format!("--manifest {at}/ready/model_names_{old}.json"))
                && line.contains(&format!("--artifacts {at}/ready "))
                && line.contains(&format!("--workspace {at} ")),
            "{line}"
        );
        assert!(
            mend.republish(new, &store, false)
                .contains(&format!("--workspace {} ", ws.display()))
        );
        // A rerun finds its own generation at the top level and moves nothing.
        let (again, _) = run(&r, &mut FakeBuilder::default());
        assert_eq!(again.set_aside, None);
    }
}
