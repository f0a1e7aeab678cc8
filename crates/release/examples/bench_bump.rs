//! `cargo xtask bench --only bump`'s contender (issue 39 item 2): a bump of N models with a
//! stand-in builder that takes a fixed time per compile and per validation and writes a real
//! chunk set (an OOB container of MIB MiB, pseudo-random, cut in 8 MiB chunks), into the store
//! STORE (the Hub emulator through the pinned `hf` CLI in `HF_CLI`, or a directory).
//!
//! - `sequential`: `rebuild --validate` without overlap (each model validated after its
//!   compile, nothing uploaded), then publish of every model and the manifest last.
//! - `overlap`: `rebuild --validate --upload-to STORE` (the upload worker beside the compiles),
//!   then publish, which finds the artifacts (the upload records) and writes the manifest.
//! - `one`: one model built untimed, then its artifact files uploaded alone (the worker's unit).
//!
//! The release gates (validation records, rehearsal) are release-cli's and not timed: publish
//! here is `artifact_store::publish::publish_known`, the transfer. Prints `seconds=S`.
//!
//! Usage: bench_bump MODE WORK N COMPILE_MS VALIDATE_MS MIB STORE

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use artifact_store::publish::{PublishOptions, SignatureAction, publish_known};
use artifact_store::retry::RetryPolicy;
use artifact_store::{StoreAccess, StoreSpec};
use compiler_remote::FetchedArtifact;
use manifest::{Generation, Manifest, ModelId};
use release::rebuild::{
    BuildError, Builder, Overlap, PlannedModel, Rebuild, StoreUploader, Uploader, known_files,
};

const PIN: &str = "e837e367aac9e1a66e689f4f32ce20ca9367df13";

struct StandIn {
    compile: Duration,
    validate: Duration,
    mib: usize,
}

impl Builder for StandIn {
    fn fetch_sources(
        &mut self,
        model: &PlannedModel,
        dir: &Path,
        _say: &mut dyn FnMut(&str),
    ) -> Result<Vec<PathBuf>, BuildError> {
        std::fs::create_dir_all(dir).map_err(|e| BuildError::Sources(Box::new(e.into())))?;
        let src = dir.join("driving_supercombo.onnx");
        std::fs::write(&src, model.source.id.as_str())
            .map_err(|e| BuildError::Sources(Box::new(e.into())))?;
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
        let started = Instant::now();
        let id = &model.source.id;
        let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ id.as_str().len() as u64;
        for b in id.as_str().bytes() {
            state = state.rotate_left(7) ^ u64::from(b);
        }
        let payload: Vec<u8> = (0..self.mib << 17)
            .flat_map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()
            })
            .collect();
        let bytes = test_support::published::oob_container(&payload, 1 << 20);
        let name = manifest::layout::artifact_file_name(id)
            .as_str()
            .to_string();
        std::fs::create_dir_all(out).map_err(compiler_remote::Error::from)?;
        let options = chunker::SplitOptions {
            chunk_size: 8 << 20,
        };
        let r = chunker::split_reader(&bytes[..], bytes.len() as u64, &name, out, &options)
            .map_err(compiler_remote::Error::from)?;
        // The compile takes its fixed time, writing the chunk set included.
        std::thread::sleep(self.compile.saturating_sub(started.elapsed()));
        Ok(FetchedArtifact {
            files: chunker::set_file_names(&name, r.chunk_count),
            name,
            size: r.size,
            sha256: r.sha256,
            chunk_count: r.chunk_count,
        })
    }

    fn validate(
        &mut self,
        _model: &PlannedModel,
        _ws: &release::Workspace,
        _say: &mut dyn FnMut(&str),
    ) -> Result<bool, BuildError> {
        std::thread::sleep(self.validate);
        Ok(true)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args) {
        eprintln!("bench_bump: {e}");
        std::process::exit(1);
    }
}

type Failure = Box<dyn std::error::Error>;

fn run(args: &[String]) -> Result<(), Failure> {
    let [mode, work, n, compile_ms, validate_ms, mib, store] = args else {
        return Err("usage: bench_bump MODE WORK N COMPILE_MS VALIDATE_MS MIB STORE".into());
    };
    let work = Path::new(work);
    let n: usize = n.parse()?;
    let ms = |s: &String| -> Result<Duration, Failure> { Ok(Duration::from_millis(s.parse()?)) };
    let mut builder = StandIn {
        compile: ms(compile_ms)?,
        validate: ms(validate_ms)?,
        mib: mib.parse()?,
    };
    let spec = StoreSpec::parse(store)?;
    let access = StoreAccess {
        hf_cli: std::env::var_os("HF_CLI").map(PathBuf::from),
        github_branch: manifest::layout::GITHUB_BRANCH.into(),
    };
    let rebuild = prepare(work, if mode == "one" { 1 } else { n })?;
    let generation = rebuild.generation;
    let mut say = |_: release::rebuild::Progress<'_>| {};
    let started = Instant::now();
    match mode.as_str() {
        "sequential" | "overlap" => {
            let uploader: Option<Box<dyn Uploader>> = match mode == "overlap" {
                true => Some(Box::new(StoreUploader::open(
                    std::slice::from_ref(&spec),
                    &access,
                    generation,
                    rebuild.contract,
                )?)),
                false => None,
            };
            let overlap = Overlap {
                validate: true,
                uploader,
            };
            let summary = rebuild.run_with(&mut builder, overlap, &mut say)?;
            summary.result()?;
            if let Some(u) = summary.uploads.iter().find(|u| u.status != "uploaded") {
                return Err(format!("upload of {}: {:?}", u.id, u.error).into());
            }
            publish(&rebuild, &summary.manifest, &spec, &access)?;
        }
        "one" => {
            builder.compile = Duration::ZERO;
            builder.validate = Duration::ZERO;
            let summary = rebuild.run_with(&mut builder, Overlap::default(), &mut say)?;
            let manifest = Manifest::from_slice(&std::fs::read(&summary.manifest)?)?;
            let mut up = StoreUploader::open(&[spec], &access, generation, rebuild.contract)?;
            let id: ModelId = "bench1".parse()?;
            let started = Instant::now();
            up.upload(0, &rebuild.workspace.ready(), &id, &manifest)?;
            println!("seconds={:.3}", started.elapsed().as_secs_f64());
            return Ok(());
        }
        other => return Err(format!("unknown mode {other:?}").into()),
    }
    println!("seconds={:.3}", started.elapsed().as_secs_f64());
    Ok(())
}

/// A fresh workspace under `work` and a rebuild of `n` models `bench1`…`benchN` (v25, its pin).
fn prepare(work: &Path, n: usize) -> Result<Rebuild, Failure> {
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work)?;
    let ids: Vec<String> = (1..=n).map(|i| format!("bench{i}")).collect();
    let map: serde_json::Map<String, serde_json::Value> = ids
        .iter()
        .map(|id| {
            (
                id.clone(),
                serde_json::json!({"input_format": "supercombo"}),
            )
        })
        .collect();
    let models: Vec<serde_json::Value> = ids
        .iter()
        .map(|id| {
            serde_json::json!({"id": id, "name": id, "version": "v16", "series": "OP Series",
                "released": "2026-01-01", "community_favorite": false,
                "uses_external_gpu": false})
        })
        .collect();
    std::fs::write(work.join("map.json"), serde_json::to_vec(&map)?)?;
    let base = serde_json::json!({ "models": models });
    std::fs::write(work.join("base.json"), serde_json::to_vec(&base)?)?;
    Ok(Rebuild::prepare(
        work.join("ws"),
        &work.join("map.json"),
        &work.join("base.json"),
        &[],
        Generation::new(25),
        PIN.parse()?,
    )?)
}

/// Publish the rebuilt manifest and `ready/` to `spec`: what is missing, then the manifest last,
/// taking the workspace's upload records as `release-cli publish --workspace` does.
fn publish(
    rebuild: &Rebuild,
    manifest_path: &Path,
    spec: &StoreSpec,
    access: &StoreAccess,
) -> Result<(), Failure> {
    let manifest = Manifest::from_slice(&std::fs::read(manifest_path)?)?;
    let store = spec.open(access)?;
    let opts = PublishOptions {
        generation: rebuild.generation,
        dry_run: false,
        retry: RetryPolicy::immediate(1),
        deep_verify: false,
        contract: Default::default(),
    };
    let known = known_files(
        &rebuild.workspace,
        rebuild.generation,
        manifest.ids().cloned(),
        &[release::publish::canonical_store_name(spec)],
    );
    publish_known(
        &manifest,
        &rebuild.workspace.ready(),
        &[store.as_ref()],
        &opts,
        SignatureAction::Unsigned,
        &known,
        &mut |_| {},
    )?;
    Ok(())
}
