//! The real [`Builder`]: ONNX sources from a store, compiles on the compiler comma over SSH.

use fs_err as fs;
use std::path::{Path, PathBuf};

use artifact_store::{HfConfig, Store, StoreSpec};
use chunker::atomic;
use compiler_remote::{CompileRequest, Compiler, ConnectOptions, FetchedArtifact};
use manifest::{FileName, GitCommit, ModelId};

use super::{BuildError, Builder, PlannedModel};

/// The real builder: sources from a store (`onnx/<source-id>/*.onnx`), compiles on the compiler
/// comma. The store is opened and the SSH session made on first use, so a run with every model
/// done touches neither.
pub struct RemoteBuilder<'a> {
    pub sources: StoreSpec,
    pub hf: HfConfig,
    pub github_branch: String,
    pub connect: ConnectOptions,
    pub pin: GitCommit,
    /// Live compiler output.
    pub live: &'a mut dyn FnMut(&str),
    store: Option<Box<dyn Store>>,
    compiler: Option<Compiler>,
}

impl<'a> RemoteBuilder<'a> {
    pub fn new(
        sources: StoreSpec,
        hf: HfConfig,
        github_branch: String,
        connect: ConnectOptions,
        pin: GitCommit,
        live: &'a mut dyn FnMut(&str),
    ) -> Self {
        Self {
            sources,
            hf,
            github_branch,
            connect,
            pin,
            live,
            store: None,
            compiler: None,
        }
    }
}

impl Builder for RemoteBuilder<'_> {
    fn fetch_sources(
        &mut self,
        model: &PlannedModel,
        dir: &Path,
        _say: &mut dyn FnMut(&str),
    ) -> Result<Vec<PathBuf>, BuildError> {
        if self.store.is_none() {
            let store = self
                .sources
                .open(&self.hf, &self.github_branch)
                .map_err(BuildError::run)?;
            self.store = Some(store);
        }
        let store = self.store.as_deref().expect("opened");
        fetch_sources(store, &model.source.source_id, dir).map_err(BuildError::model)
    }

    fn compile(
        &mut self,
        model: &PlannedModel,
        sources: &[PathBuf],
        out: &Path,
        log: &Path,
        say: &mut dyn FnMut(&str),
    ) -> Result<FetchedArtifact, BuildError> {
        if self.compiler.is_none() {
            say(&format!("connecting to {}", self.connect.destination));
            self.compiler = Some(Compiler::connect(self.connect.clone()).map_err(|e| {
                // Connecting is the run's first contact with the compiler: whatever the
                // reason, no further model would get further.
                BuildError::run(e)
            })?);
        }
        let req = CompileRequest {
            id: model.source.id.clone(),
            version: model.version,
            gpu: model.gpu,
            input_format: model.source.input_format,
            local: false,
        };
        let c = self.compiler.as_ref().expect("connected");
        Ok(c.compile(&req, sources, &self.pin, out, log, &mut *self.live)?)
    }
}

/// Fetch `onnx/<source-id>/*.onnx` into `dir`, streamed; a file already there with the listed
/// size is kept (resume), anything else there is removed.
pub fn fetch_sources(
    store: &dyn Store,
    source_id: &ModelId,
    dir: &Path,
) -> Result<Vec<PathBuf>, String> {
    let prefix: manifest::StorePath = format!("onnx/{source_id}")
        .parse()
        .map_err(|e: manifest::Error| e.to_string())?;
    let listed = store
        .list(&prefix)
        .map_err(|e| format!("listing {} {prefix}: {e}", store.describe()))?;
    let onnx: Vec<_> = listed
        .into_iter()
        .filter(|e| e.path.file_name().ends_with(".onnx"))
        .collect();
    if onnx.is_empty() {
        return Err(format!(
            "no ONNX sources under {} {prefix}/; archive them there or fix source_id",
            store.describe()
        ));
    }
    fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let wanted: Vec<String> = onnx
        .iter()
        .map(|e| e.path.file_name().to_string())
        .collect();
    for entry in fs::read_dir(dir).map_err(|e| e.to_string())? {
        let entry = entry.map_err(|e| e.to_string())?;
        if !wanted.contains(&entry.file_name().to_string_lossy().into_owned()) {
            let _ = fs::remove_file(entry.path());
        }
    }
    let mut out = Vec::new();
    for e in &onnx {
        let name: FileName = e
            .path
            .file_name()
            .parse()
            .map_err(|err: manifest::Error| err.to_string())?;
        let local = dir.join(name.as_str());
        let have = fs::metadata(&local).map(|m| m.len()).ok();
        if have != Some(e.size) {
            let mut reader = store
                .open(&e.path)
                .map_err(|err| format!("{} {}: {err}", store.describe(), e.path))?;
            let mut f = atomic::AtomicFile::create(&local)
                .map_err(|err| format!("{}: {err}", local.display()))?;
            let n = std::io::copy(&mut reader, &mut f)
                .map_err(|err| format!("{} {}: {err}", store.describe(), e.path))?;
            if n != e.size {
                return Err(format!(
                    "{} {}: listed as {} bytes, read {n}",
                    store.describe(),
                    e.path,
                    e.size
                ));
            }
            f.commit_and_sync_dir()
                .map_err(|err| format!("{}: {err}", local.display()))?;
        }
        out.push(local);
    }
    Ok(out)
}
