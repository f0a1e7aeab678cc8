//! The overlap of a rebuild (issue 39 item 2), driven by a fake builder that takes a fixed time
//! per compile and a fake uploader: what runs during what, what is uploaded, what a rerun skips.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

const PIN: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";
const BASE: &str = r#"{"models": [
  {"id": "pop223", "name": "Pop", "version": "v11", "series": "OP Series", "released": "2025-01-01", "community_favorite": true},
  {"id": "sc23", "name": "SC", "version": "v9", "series": "OP Series", "released": "2025-01-02", "community_favorite": false},
  {"id": "rdf43", "name": "R", "version": "v15", "series": "OP Series", "released": "2025-01-03", "community_favorite": false}
]}"#;
const IDS: [&str; 3] = ["pop223", "sc23", "rdf43"];

/// Events in the order they happened, from every thread.
type Log = Arc<Mutex<Vec<String>>>;

fn note(log: &Log, event: String) {
    log.lock().unwrap().push(event);
}

fn id(s: &str) -> ModelId {
    s.parse().unwrap()
}

fn fake_sources(model: &PlannedModel, dir: &Path) -> Vec<PathBuf> {
    fs::create_dir_all(dir).unwrap();
    let src = dir.join("driving_supercombo.onnx");
    fs::write(&src, model.source.source_id.as_str()).unwrap();
    vec![src]
}

struct Timed {
    log: Log,
    /// Models whose device validation fails.
    fails_validation: Vec<ModelId>,
    /// Models whose fetch ahead panics.
    prefetch_panics: Vec<ModelId>,
}

struct TimedFetcher(Log, Vec<ModelId>);

impl SourceFetcher for TimedFetcher {
    fn fetch(&mut self, model: &PlannedModel, dir: &Path) -> Result<Vec<PathBuf>, BuildError> {
        assert!(!self.1.contains(&model.source.id), "injected: a fetch bug");
        note(&self.0, format!("fetch start {}", model.source.id));
        std::thread::sleep(Duration::from_millis(60));
        note(&self.0, format!("fetch end {}", model.source.id));
        Ok(fake_sources(model, dir))
    }
}

impl Builder for Timed {
    fn fetch_sources(
        &mut self,
        model: &PlannedModel,
        dir: &Path,
        _say: &mut dyn FnMut(&str),
    ) -> Result<Vec<PathBuf>, BuildError> {
        note(&self.log, format!("fetch in turn {}", model.source.id));
        Ok(fake_sources(model, dir))
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
        note(&self.log, format!("compile start {id}"));
        std::thread::sleep(Duration::from_millis(200));
        let bytes = format!("{id} built {}", model.version).repeat(40);
        let name = manifest::layout::artifact_file_name(id)
            .as_str()
            .to_string();
        fs::create_dir_all(out).unwrap();
        let r = chunker::split_reader(
            bytes.as_bytes(),
            bytes.len() as u64,
            &name,
            out,
            &chunker::SplitOptions { chunk_size: 256 },
        )
        .unwrap();
        note(&self.log, format!("compile end {id}"));
        Ok(FetchedArtifact {
            files: chunker::set_file_names(&name, r.chunk_count),
            name,
            size: r.size,
            sha256: r.sha256,
            chunk_count: r.chunk_count,
        })
    }

    fn fetcher(&self) -> Option<Box<dyn SourceFetcher>> {
        Some(Box::new(TimedFetcher(
            self.log.clone(),
            self.prefetch_panics.clone(),
        )))
    }

    fn validate(
        &mut self,
        model: &PlannedModel,
        _ws: &Workspace,
        _say: &mut dyn FnMut(&str),
    ) -> Result<bool, BuildError> {
        note(&self.log, format!("validate {}", model.source.id));
        Ok(!self.fails_validation.contains(&model.source.id))
    }
}

/// A store that holds the store paths it was given, and fails the uploads of `fails`.
struct FakeUploader {
    log: Log,
    held: Arc<Mutex<BTreeSet<String>>>,
    fails: Vec<ModelId>,
}

impl Uploader for FakeUploader {
    fn stores(&self) -> Vec<String> {
        vec!["file:/fake".into()]
    }

    fn whole(&mut self, _store: usize, row: &UploadRow) -> crate::Result<bool> {
        let held = self.held.lock().unwrap();
        Ok(row.files.iter().all(|f| held.contains(&f.path)))
    }

    fn upload(
        &mut self,
        _store: usize,
        ready: &Path,
        id: &ModelId,
        manifest: &Manifest,
    ) -> crate::Result<Vec<UploadRow>> {
        note(&self.log, format!("upload start {id}"));
        std::thread::sleep(Duration::from_millis(60));
        if self.fails.contains(id) {
            note(&self.log, format!("upload end {id}"));
            return Err(std::io::Error::other("injected: the store answered 503").into());
        }
        let a = manifest.get(id).and_then(|e| e.artifact()).expect("a row");
        let mut files = Vec::new();
        for e in fs::read_dir(ready.join(id.as_str())).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            let path = format!("models/v26/{id}/{name}");
            self.held.lock().unwrap().insert(path.clone());
            files.push(UploadedFile {
                path,
                size: 1,
                sha256: a.sha256,
            });
        }
        note(&self.log, format!("upload end {id}"));
        Ok(vec![UploadRow {
            store: "file:/fake".into(),
            artifact: manifest::layout::artifact_file_name(id).as_str().into(),
            sha256: a.sha256,
            size: a.size.get(),
            files,
        }])
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    rebuild: Rebuild,
    log: Log,
    held: Arc<Mutex<BTreeSet<String>>>,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let map = dir.path().join("map.json");
    fs::write(&map, r#"{"pop223": {}, "sc23": {}, "rdf43": {}}"#).unwrap();
    let base = dir.path().join("base.json");
    fs::write(&base, BASE).unwrap();
    let ws = dir.path().join("ws");
    let rebuild = Rebuild::prepare(
        ws,
        &map,
        &base,
        &[],
        Generation::new(26),
        PIN.parse().unwrap(),
    )
    .unwrap();
    Setup {
        _dir: dir,
        rebuild,
        log: Log::default(),
        held: Default::default(),
    }
}

/// Run with an uploader failing `upload_fails` and a builder whose validation fails
/// `validation_fails` (validated when `validate`); the summary and the progress lines.
fn run(
    s: &Setup,
    validate: bool,
    validation_fails: &[&str],
    upload_fails: &[&str],
) -> (Summary, Vec<String>) {
    let mut builder = Timed {
        log: s.log.clone(),
        fails_validation: validation_fails.iter().map(|i| id(i)).collect(),
        prefetch_panics: Vec::new(),
    };
    let uploader = FakeUploader {
        log: s.log.clone(),
        held: s.held.clone(),
        fails: upload_fails.iter().map(|i| id(i)).collect(),
    };
    let overlap = Overlap {
        validate,
        uploader: Some(Box::new(uploader)),
    };
    let mut lines = Vec::new();
    let summary = s
        .rebuild
        .run_with(&mut builder, overlap, &mut |p| {
            lines.push(format!("{}: {}", p.id, p.message))
        })
        .unwrap();
    (summary, lines)
}

fn at(log: &[String], event: &str) -> usize {
    log.iter()
        .position(|e| e == event)
        .unwrap_or_else(|| panic!("no {event:?} in {log:#?}"))
}

fn uploads(s: &Summary) -> Vec<(&str, &str)> {
    s.uploads
        .iter()
        .map(|u| (u.id.as_str(), u.status))
        .collect()
}

/// The upload of model i runs during the compile of model i+1, and the sources of model i+1
/// are fetched during the compile of model i; each upload is recorded once done, the progress
/// says what uploads while what compiles, and the manifest is written in the workspace only.
#[test]
fn uploads_and_fetches_overlap_the_compiles() {
    let s = setup();
    let (summary, lines) = run(&s, false, &[], &[]);
    assert!(summary.result().is_ok(), "{:?}", summary.models);
    let log = s.log.lock().unwrap().clone();
    for w in IDS.windows(2) {
        let (this, next) = (w[0], w[1]);
        // Two intervals overlap when each starts before the other ends.
        let upload = (
            at(&log, &format!("upload start {this}")),
            at(&log, &format!("upload end {this}")),
        );
        let compile = (
            at(&log, &format!("compile start {next}")),
            at(&log, &format!("compile end {next}")),
        );
        assert!(
            upload.0 < compile.1 && compile.0 < upload.1,
            "upload of {this}: {log:#?}"
        );
        let fetch = (
            at(&log, &format!("fetch start {next}")),
            at(&log, &format!("fetch end {next}")),
        );
        let compile = (
            at(&log, &format!("compile start {this}")),
            at(&log, &format!("compile end {this}")),
        );
        assert!(
            fetch.0 < compile.1 && compile.0 < fetch.1,
            "fetch of {next}: {log:#?}"
        );
    }
    let in_turn: Vec<&String> = log
        .iter()
        .filter(|e| e.starts_with("fetch in turn"))
        .collect();
    assert_eq!(
        in_turn,
        ["fetch in turn pop223"],
        "only the first is fetched in turn"
    );
    assert_eq!(uploads(&summary), IDS.map(|i| (i, "uploaded")));
    for i in IDS {
        let rec: UploadRecord =
            read_json(&s.rebuild.workspace.upload_record(&id(i))).expect("recorded");
        assert_eq!(rec.uploads[0].store, "file:/fake");
    }
    assert!(lines.contains(&"sc23: uploading pop223 in the background meanwhile".to_string()));
    assert!(lines.contains(&"pop223: fetching the sources of sc23 meanwhile".to_string()));
    assert!(summary.manifest.is_file());
}

/// With validation, a model that fails it is not uploaded, and the run says so and fails.
#[test]
fn a_model_failing_validation_is_not_uploaded() {
    let s = setup();
    let (summary, lines) = run(&s, true, &["sc23"], &[]);
    assert_eq!(
        uploads(&summary),
        [("pop223", "uploaded"), ("rdf43", "uploaded")]
    );
    let sc = summary.models.iter().find(|o| o.id == id("sc23")).unwrap();
    assert_eq!((sc.status, sc.validation), ("compiled", Some("failed")));
    assert!(
        matches!(summary.result(), Err(Error::ModelsFailed { ids, .. }) if ids == [id("sc23")])
    );
    assert!(lines.contains(&"sc23: FAILED device validation; not uploaded".to_string()));
    let log = s.log.lock().unwrap().clone();
    assert!(!log.iter().any(|e| e == "upload start sc23"), "{log:#?}");
    // Compile and validation stay one after another on the device.
    assert!(at(&log, "validate pop223") > at(&log, "compile end pop223"));
    assert!(at(&log, "validate pop223") < at(&log, "compile start sc23"));
}

/// A failed upload does not stop the compiles: every model is built, the summary names the
/// model and the error (publish uploads it), nothing is recorded for it.
#[test]
fn an_upload_failure_does_not_stop_the_run() {
    let s = setup();
    let (summary, lines) = run(&s, false, &[], &["pop223"]);
    assert_eq!(summary.compiled, 3);
    assert!(summary.result().is_ok());
    assert_eq!(
        uploads(&summary),
        [
            ("pop223", "failed"),
            ("sc23", "uploaded"),
            ("rdf43", "uploaded")
        ]
    );
    assert!(summary.uploads[0].error.as_deref().unwrap().contains("503"));
    assert!(!s.rebuild.workspace.upload_record(&id("pop223")).exists());
    assert!(
        lines
            .iter()
            .any(|l| l.contains("upload to file:/fake FAILED")
                && l.contains("publish will upload it")),
        "{lines:#?}"
    );
}

/// A rerun skips what the upload record names and the store still holds whole; what the store
/// lost, or a failed upload, is uploaded again.
#[test]
fn a_rerun_skips_recorded_uploads() {
    let s = setup();
    run(&s, false, &[], &["rdf43"]);
    s.held
        .lock()
        .unwrap()
        .retain(|p| !p.starts_with("models/v26/sc23/"));
    s.log.lock().unwrap().clear();
    let (again, _) = run(&s, false, &[], &[]);
    assert_eq!(again.skipped, 3);
    assert_eq!(
        uploads(&again),
        [
            ("pop223", "recorded"),
            ("sc23", "uploaded"),
            ("rdf43", "uploaded")
        ]
    );
    let log = s.log.lock().unwrap().clone();
    assert!(
        !log.iter().any(|e| e.starts_with("upload start pop223")),
        "{log:#?}"
    );
    assert!(
        !log.iter().any(|e| e.starts_with("fetch")),
        "done models fetch nothing: {log:#?}"
    );
}

/// What publish takes from the upload records: per `--to` store (by the name publish's record
/// gives it), the recorded files of the models it publishes; another store or generation
/// contributes nothing.
#[test]
fn publish_knows_the_recorded_files_of_the_same_store_only() {
    let s = setup();
    run(&s, false, &[], &[]);
    let ws = &s.rebuild.workspace;
    let ids = || IDS.iter().map(|i| id(i));
    let stores = ["hf://buckets/a/b".to_string(), "file:/fake".to_string()];
    let known = known_files(ws, Generation::new(26), ids(), &stores);
    assert!(known[0].is_empty());
    let held = s.held.lock().unwrap().clone();
    assert_eq!(known[1].keys().cloned().collect::<BTreeSet<_>>(), held);
    let other = known_files(ws, Generation::new(27), ids(), &stores);
    assert!(other.iter().all(|k| k.is_empty()));
}

/// A panic in the uploader (a bug in a store client) is that model's failed upload, not the end
/// of the run: every model is built and the manifest written; the uploader is not used again.
#[test]
fn a_panicking_uploader_does_not_end_the_run() {
    struct Panicky(FakeUploader);
    impl Uploader for Panicky {
        fn stores(&self) -> Vec<String> {
            self.0.stores()
        }
        fn whole(&mut self, store: usize, row: &UploadRow) -> crate::Result<bool> {
            self.0.whole(store, row)
        }
        fn upload(
            &mut self,
            store: usize,
            ready: &Path,
            id: &ModelId,
            manifest: &Manifest,
        ) -> crate::Result<Vec<UploadRow>> {
            assert_ne!(id.as_str(), "sc23", "injected: a store client's bug");
            self.0.upload(store, ready, id, manifest)
        }
    }
    let s = setup();
    let mut builder = Timed {
        log: s.log.clone(),
        fails_validation: Vec::new(),
        prefetch_panics: Vec::new(),
    };
    let uploader = Panicky(FakeUploader {
        log: s.log.clone(),
        held: s.held.clone(),
        fails: Vec::new(),
    });
    let overlap = Overlap {
        validate: false,
        uploader: Some(Box::new(uploader)),
    };
    let summary = s
        .rebuild
        .run_with(&mut builder, overlap, &mut |_| {})
        .unwrap();
    assert_eq!(summary.compiled, 3);
    assert!(summary.manifest.exists());
    assert_eq!(
        uploads(&summary),
        [
            ("pop223", "uploaded"),
            ("sc23", "failed"),
            ("rdf43", "failed")
        ]
    );
    let error = summary.uploads[1].error.as_deref().unwrap();
    assert!(
        error.contains("panicked") && error.contains("injected"),
        "{error}"
    );
    assert!(!s.rebuild.workspace.upload_record(&id("rdf43")).exists());
}

/// A panic while fetching the next model's sources ahead (a bug in a store client) is not the
/// end of the run: that model's sources are fetched in turn, and no more are fetched ahead.
#[test]
fn a_panicking_prefetch_falls_back_to_fetching_in_turn() {
    let s = setup();
    let mut builder = Timed {
        log: s.log.clone(),
        fails_validation: Vec::new(),
        prefetch_panics: vec![id("sc23")],
    };
    let summary = s
        .rebuild
        .run_with(&mut builder, Overlap::default(), &mut |_| {})
        .unwrap();
    assert_eq!(summary.compiled, 3);
    assert!(summary.manifest.exists());
    let log = s.log.lock().unwrap().clone();
    at(&log, "fetch in turn sc23");
    at(&log, "fetch in turn rdf43");
}
