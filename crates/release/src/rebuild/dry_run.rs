//! `rebuild --dry-run`: per model, whether a run would skip it (done earlier) or build it, with
//! the sources it would fetch and the compile plan ([`compiler_remote::dry_run`]); opens no
//! store, connects to nothing, writes nothing.

use std::path::PathBuf;

use compiler_remote::dry_run::{self, Plan};
use compiler_remote::{CompileJob, CompileRequest, ConnectOptions, InputFormat};
use manifest::{BehaviorVersion, Generation, GitCommit, ModelId};
use serde::Serialize;

use super::Rebuild;
use crate::{Result, Workspace};

/// Where a model's sources would come from and go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fetch {
    pub from: String,
    pub to: PathBuf,
}

/// One model of `rebuild --dry-run`.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedBuild {
    pub id: ModelId,
    /// `skip` (done earlier) or `build`.
    pub action: &'static str,
    pub version: BehaviorVersion,
    pub source_id: ModelId,
    pub input_format: InputFormat,
    pub gpu: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fetch: Option<Fetch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
}

/// What a run would do. Serializes to `rebuild --dry-run --json`.
#[derive(Debug, Clone, Serialize)]
pub struct DryRun {
    pub dry_run: bool,
    pub workspace: Workspace,
    pub generation: Generation,
    pub tinygrad_commit: GitCommit,
    pub sources: String,
    pub manifest: PathBuf,
    pub not_in_catalog: Vec<ModelId>,
    pub models: Vec<PlannedBuild>,
}

impl DryRun {
    /// How many models would be built.
    pub fn building(&self) -> usize {
        self.models.iter().filter(|m| m.plan.is_some()).count()
    }
}

impl Rebuild {
    /// The dry run of [`Rebuild::run_with`] with sources from `sources` (as given) on the compiler
    /// `opts` names: reads the records and verifies the ready chunk sets of models done earlier
    /// and, when a model would be built, makes the checks a run makes before it connects.
    pub fn dry_run(&self, opts: &ConnectOptions, sources: &str) -> Result<DryRun> {
        let ws = &self.workspace;
        let mut models = Vec::new();
        for p in &self.planned {
            let id = &p.source.id;
            let mut m = PlannedBuild {
                id: id.clone(),
                action: "skip",
                version: p.version,
                source_id: p.source.source_id.clone(),
                input_format: p.source.input_format,
                gpu: p.gpu,
                fetch: None,
                plan: None,
            };
            if !self.is_done(p) {
                let onnx = ws.onnx(id);
                let job = CompileJob {
                    request: CompileRequest {
                        id: id.clone(),
                        version: p.version,
                        gpu: p.gpu,
                        input_format: p.source.input_format,
                        local: false,
                    },
                    sources: vec![onnx.join("*.onnx")],
                    out: ws.ready_model(id),
                    log: ws.build_log(id),
                };
                let mut plan = dry_run::compile_plan(opts, &job, &self.pin)?;
                plan.writes.insert(0, onnx.join("*.onnx"));
                plan.writes.push(ws.build_record(id));
                m.action = "build";
                m.fetch = Some(Fetch {
                    from: format!("{sources}/onnx/{}/*.onnx", p.source.source_id),
                    to: onnx,
                });
                m.plan = Some(plan);
            }
            models.push(m);
        }
        // The real run connects before its first build: the same checks, only then.
        if models.iter().any(|m| m.plan.is_some()) {
            dry_run::check_before_connect(opts)?;
        }
        Ok(DryRun {
            dry_run: true,
            workspace: ws.clone(),
            generation: self.generation,
            tinygrad_commit: self.pin.clone(),
            sources: sources.to_string(),
            manifest: ws.ready_manifest(self.generation),
            not_in_catalog: self.not_in_catalog.clone(),
            models,
        })
    }
}
