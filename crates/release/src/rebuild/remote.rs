//! The real [`Builder`]: ONNX sources from a store, compiles on the compiler comma over SSH.

use fs_err as fs;
use std::path::{Path, PathBuf};

use artifact_store::{Store, StoreAccess, StoreSpec};
use chunker::atomic;
use compiler_remote::{CompileJob, CompileRequest, Compiler, ConnectOptions, FetchedArtifact};
use manifest::{FileName, GitCommit, ModelId};

use super::{BuildError, Builder, PlannedModel};
use crate::Error;

/// The real builder: sources from a store (`onnx/<source-id>/*.onnx`), compiles on the compiler
/// comma. The store is opened and the SSH session made on first use, so a run with every model
/// done touches neither.
pub struct RemoteBuilder<'a> {
    pub sources: StoreSpec,
    pub access: StoreAccess,
    pub connect: ConnectOptions,
    pub pin: GitCommit,
    /// Live compiler output.
    pub live: &'a mut dyn FnMut(&str),
    /// The sources of the model in turn (the first; the rest come from [`Builder::fetcher`]'s).
    in_turn: super::StoreFetcher,
    compiler: Option<Compiler>,
    /// The contract whose accelerator variant this builder builds (v25 until told).
    contract: &'static manifest::Contract,
    /// How `rebuild --validate` validates on the device (`None`: it cannot).
    device_check: Option<DeviceCheck>,
}

/// What `validate` takes besides the workspace: the pins (the runtime gate's contract), the
/// models directory on the compiler and the validator's Python (`validate`'s defaults).
#[derive(Debug, Clone)]
pub struct DeviceCheck {
    pub pins: manifest::PinTable,
    pub models_dir: compiler_remote::RemotePath,
    pub python: String,
}

impl<'a> RemoteBuilder<'a> {
    pub fn new(
        sources: StoreSpec,
        access: StoreAccess,
        connect: ConnectOptions,
        pin: GitCommit,
        live: &'a mut dyn FnMut(&str),
    ) -> Self {
        Self {
            in_turn: super::StoreFetcher::new(sources.clone(), access.clone()),
            sources,
            access,
            connect,
            pin,
            live,
            compiler: None,
            contract: manifest::ContractName::V25.contract(),
            device_check: None,
        }
    }

    /// Validate on the device after each compile (`rebuild --validate`) with `check`.
    pub fn with_device_check(mut self, check: DeviceCheck) -> Self {
        self.device_check = Some(check);
        self
    }

    /// Build the accelerator variant of `contract` (v26: `amd`) instead of v25's.
    pub fn with_contract(mut self, contract: &'static manifest::Contract) -> Self {
        self.contract = contract;
        self
    }
}

impl Builder for RemoteBuilder<'_> {
    fn fetch_sources(
        &mut self,
        model: &PlannedModel,
        dir: &Path,
        _say: &mut dyn FnMut(&str),
    ) -> Result<Vec<PathBuf>, BuildError> {
        use super::SourceFetcher;
        self.in_turn.fetch(model, dir)
    }

    /// The next model's sources from the same store, on a store client of their own.
    fn fetcher(&self) -> Option<Box<dyn super::SourceFetcher>> {
        Some(Box::new(super::StoreFetcher::new(
            self.sources.clone(),
            self.access.clone(),
        )))
    }

    /// `validate --model ID --workspace WS`'s job on the same session: the runtime gate, the
    /// device's verdict, the record `results/<id>.validation.json`.
    fn validate(
        &mut self,
        model: &PlannedModel,
        ws: &crate::Workspace,
        say: &mut dyn FnMut(&str),
    ) -> Result<bool, BuildError> {
        let Some(check) = self.device_check.clone() else {
            return Err(BuildError::NoDeviceCheck);
        };
        let id = &model.source.id;
        let (artifact, log) = (ws.ready_artifact(id), ws.validate_log(id));
        let (job, contract) = crate::validate::DeviceValidation {
            id,
            version: model.version,
            artifact: &artifact,
            log: &log,
            models_dir: &check.models_dir,
            python: &check.python,
        }
        .job(&check.pins, &self.pin)
        .map_err(|e| BuildError::ValidationJob(e.into()))?;
        self.connect_once(say)?;
        let c = self.compiler.as_ref().expect("connected");
        let verdict = c.validate(&job, &self.pin, &mut *self.live)?;
        let record = ws.validation(id);
        let (_, passed) = crate::validate::record_verdict(
            id,
            model.version,
            self.pin.clone(),
            verdict,
            log,
            &record,
            contract,
        )
        .map_err(|e| BuildError::ValidationRecord(e.into()))?;
        Ok(passed)
    }

    fn compile(
        &mut self,
        model: &PlannedModel,
        sources: &[PathBuf],
        out: &Path,
        log: &Path,
        say: &mut dyn FnMut(&str),
    ) -> Result<FetchedArtifact, BuildError> {
        self.connect_once(say)?;
        let job = CompileJob {
            request: CompileRequest {
                id: model.source.id.clone(),
                version: model.version,
                gpu: model.gpu,
                input_format: model.source.input_format,
                local: false,
            },
            sources: sources.to_vec(),
            out: out.to_path_buf(),
            log: log.to_path_buf(),
        };
        let c = self.compiler.as_ref().expect("connected");
        Ok(c.compile(&job, &self.pin, &mut *self.live)?)
    }

    /// A `chestnut` variant is the model compiled for the external AMD GPU (`./models --gpu`),
    /// as the seed's Chestnut batch builds it; any other accelerator is not built here. The
    /// compiler's `<id>_driving_tinygrad.pkl` chunk set is fetched into a directory of its own
    /// (so the model's set in `out` is never touched) and installed in `out` under the
    /// variant's name, with its `.sha256` rewritten for that name. Its log is
    /// `<id>.<variant>.log` beside the model's.
    fn compile_variant(
        &mut self,
        model: &PlannedModel,
        variant: &str,
        sources: &[PathBuf],
        out: &Path,
        log: &Path,
        say: &mut dyn FnMut(&str),
    ) -> Result<Option<FetchedArtifact>, BuildError> {
        if !variant_is_gpu_build_for(self.contract, variant) {
            return Ok(None);
        }
        self.connect_once(say)?;
        let id = &model.source.id;
        let tmp = out.join(format!(".variant-{variant}"));
        let _ = fs::remove_dir_all(&tmp);
        let job = CompileJob {
            request: CompileRequest {
                id: id.clone(),
                version: model.version,
                gpu: true,
                input_format: model.source.input_format,
                local: false,
            },
            sources: sources.to_vec(),
            out: tmp.clone(),
            log: log.with_file_name(format!("{id}.{variant}.log")),
        };
        let c = self.compiler.as_ref().expect("connected");
        let built = c.compile(&job, &self.pin, &mut *self.live)?;
        let installed = install_variant(&built, &tmp, out, id, variant)
            .map_err(|e| BuildError::InstallVariant(e.into()));
        let _ = fs::remove_dir_all(&tmp);
        installed.map(Some)
    }
}

/// Whether this builder builds the `accelerator_artifacts` key `variant`: `chestnut` (the
/// external AMD GPU, `./models --gpu`). Pure.
#[cfg(test)]
fn variant_is_gpu_build(variant: &str) -> bool {
    variant_is_gpu_build_for(manifest::ContractName::V25.contract(), variant)
}

/// Whether this builder builds the `accelerator_artifacts` key `variant` under `contract`: the
/// contract's accelerator (v25 `chestnut`, v26 `amd`; both the external AMD GPU build,
/// `./models --gpu`). Pure.
pub fn variant_is_gpu_build_for(contract: &manifest::Contract, variant: &str) -> bool {
    variant == contract.accelerator.key
}

/// Move the verified chunk set `built` from `tmp` into `out` as
/// `<id>_driving_<variant>_tinygrad.pkl…`, its `.sha256` written for the new name.
fn install_variant(
    built: &FetchedArtifact,
    tmp: &Path,
    out: &Path,
    id: &ModelId,
    variant: &str,
) -> crate::Result<FetchedArtifact> {
    let name = format!("{id}_driving_{variant}_tinygrad.pkl");
    let mut files = Vec::new();
    for f in &built.files {
        let Some(tail) = f.strip_prefix(built.name.as_str()) else {
            return Err(Error::UnexpectedOutput {
                file: f.clone(),
                artifact: built.name.clone(),
            });
        };
        let new = format!("{name}{tail}");
        let dest = out.join(&new);
        if new == chunker::sidecar_name(&name) {
            let sidecar = chunker::format_sidecar(&built.sha256, &name);
            atomic::write_atomic(&dest, sidecar.as_bytes())?;
        } else {
            fs::rename(tmp.join(f), &dest)?;
        }
        files.push(new);
    }
    Ok(FetchedArtifact {
        name,
        size: built.size,
        sha256: built.sha256,
        chunk_count: built.chunk_count,
        files,
    })
}

impl RemoteBuilder<'_> {
    /// The SSH session, made on first use.
    fn connect_once(&mut self, say: &mut dyn FnMut(&str)) -> Result<(), BuildError> {
        if self.compiler.is_none() {
            say(&format!("connecting to {}", self.connect.destination));
            // Connecting is the run's first contact with the compiler: whatever the reason, no
            // further model would get further.
            let compiler = Compiler::connect(self.connect.clone()).map_err(BuildError::Connect)?;
            self.compiler = Some(compiler);
        }
        Ok(())
    }
}

/// Fetch `onnx/<source-id>/*.onnx` into `dir`, streamed; a file already there with the listed
/// size is kept (resume), anything else there is removed.
pub fn fetch_sources(
    store: &dyn Store,
    source_id: &ModelId,
    dir: &Path,
) -> crate::Result<Vec<PathBuf>> {
    let prefix: manifest::StorePath = format!("onnx/{source_id}").parse()?;
    let listed = store
        .list(&prefix)
        .map_err(|source| Error::SourcesUnlisted {
            store: store.describe(),
            prefix: prefix.clone(),
            source: Box::new(source),
        })?;
    let onnx: Vec<_> = listed
        .into_iter()
        .filter(|e| e.path.file_name().ends_with(".onnx"))
        .collect();
    if onnx.is_empty() {
        return Err(Error::NoSources {
            store: store.describe(),
            prefix,
        });
    }
    fs::create_dir_all(dir)?;
    let wanted: Vec<String> = onnx
        .iter()
        .map(|e| e.path.file_name().to_string())
        .collect();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if !wanted.contains(&entry.file_name().to_string_lossy().into_owned()) {
            let _ = fs::remove_file(entry.path());
        }
    }
    let mut out = Vec::new();
    for e in &onnx {
        let name: FileName = e.path.file_name().parse()?;
        let local = dir.join(name.as_str());
        let have = fs::metadata(&local).map(|m| m.len()).ok();
        if have != Some(e.size) {
            let unread = |source| Error::SourceRead {
                store: store.describe(),
                path: e.path.clone(),
                source: Box::new(source),
            };
            let unwritten = |source| Error::Write {
                path: local.clone(),
                source,
            };
            let mut reader = store.open(&e.path).map_err(unread)?;
            let mut f = atomic::AtomicFile::create(&local).map_err(unwritten)?;
            let n = std::io::copy(&mut reader, &mut f)
                .map_err(|err| unread(artifact_store::Error::Io(err)))?;
            if n != e.size {
                return Err(Error::SourceShort {
                    store: store.describe(),
                    path: e.path.clone(),
                    listed: e.size,
                    read: n,
                });
            }
            f.commit_and_sync_dir().map_err(unwritten)?;
        }
        out.push(local);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_variants_this_builder_builds() {
        for (variant, built) in [
            ("chestnut", true),
            ("amd", false),
            ("", false),
            ("Chestnut", false),
        ] {
            assert_eq!(variant_is_gpu_build(variant), built, "{variant:?}");
        }
    }

    /// Sources come from the store's `onnx/<source-id>/` (a stray file in the directory goes);
    /// a store without any says where it looked and what to do, in the text it always had.
    #[test]
    fn sources_are_fetched_or_their_absence_named() {
        let t = tempfile::tempdir().unwrap();
        let store = artifact_store::LocalStore::new(t.path().join("store"));
        let (dir, id): (_, ModelId) = (t.path().join("onnx"), "sc23".parse().unwrap());
        let e = fetch_sources(&store, &id, &dir).unwrap_err();
        assert!(matches!(e, Error::NoSources { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "no ONNX sources under {} onnx/sc23/; archive them there or fix source_id",
                store.describe()
            )
        );
        fs::create_dir_all(t.path().join("store/onnx/sc23")).unwrap();
        fs::write(t.path().join("store/onnx/sc23/a.onnx"), b"onnx").unwrap();
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("stray.onnx"), b"old").unwrap();
        assert_eq!(
            fetch_sources(&store, &id, &dir).unwrap(),
            [dir.join("a.onnx")]
        );
        assert!(!dir.join("stray.onnx").exists());
        assert_eq!(fs::read(dir.join("a.onnx")).unwrap(), b"onnx");
    }

    /// The variant's chunk set is moved under its own name; the `.sha256` names it; the
    /// model's files in `out` are not touched.
    #[test]
    fn a_built_variant_is_installed_under_its_name() {
        let t = tempfile::tempdir().unwrap();
        let (tmp, out) = (t.path().join("out/.variant-chestnut"), t.path().join("out"));
        let data = vec![7u8; 2500];
        fs::create_dir_all(&tmp).unwrap();
        let r = chunker::split_reader(
            &data[..],
            data.len() as u64,
            "sc23_driving_tinygrad.pkl",
            &tmp,
            &chunker::SplitOptions { chunk_size: 1000 },
        )
        .unwrap();
        fs::write(
            out.join("sc23_driving_tinygrad.pkl.chunk01of01"),
            b"the model",
        )
        .unwrap();
        let built = FetchedArtifact {
            name: "sc23_driving_tinygrad.pkl".into(),
            size: r.size,
            sha256: r.sha256,
            chunk_count: r.chunk_count,
            files: chunker::set_file_names("sc23_driving_tinygrad.pkl", r.chunk_count),
        };
        let id: ModelId = "sc23".parse().unwrap();
        let v = install_variant(&built, &tmp, &out, &id, "chestnut").unwrap();
        assert_eq!(v.name, "sc23_driving_chestnut_tinygrad.pkl");
        assert_eq!(v.files.len(), built.files.len());
        assert!(
            v.files
                .iter()
                .all(|f| f.starts_with("sc23_driving_chestnut_tinygrad.pkl"))
        );
        chunker::verify(
            &out.join(&v.name),
            &chunker::Expected {
                sha256: Some(r.sha256),
                size: Some(r.size),
                chunk_count: Some(r.chunk_count),
                chunk_sha256: None,
                ..chunker::Expected::default()
            },
        )
        .unwrap();
        let sidecar =
            fs::read_to_string(out.join("sc23_driving_chestnut_tinygrad.pkl.sha256")).unwrap();
        assert_eq!(sidecar, chunker::format_sidecar(&r.sha256, &v.name));
        assert_eq!(
            fs::read(out.join("sc23_driving_tinygrad.pkl.chunk01of01")).unwrap(),
            b"the model"
        );
    }
}
