//! `release-cli audit`: is what is live right now whole and consistent? For one generation and
//! each store given: the manifest parses, passes the release rules and carries its generation's
//! pin; its signature verifies with the given keys and is not near expiry
//! ([`NEAR_EXPIRY_DAYS`]); every artifact it lists (accelerator variants included) is complete
//! by name, size, `.chunkmanifest` and `.sha256`, and with `deep` hashes to its digest; nothing
//! stale lies in the generation's directory (another split's chunks, temporaries, a plain file
//! shadowing a set, files or model directories no listed artifact owns); and every store agrees
//! with the first one (same manifest bytes, so the same artifact digests).
//!
//! The decisions are pure functions over what was read ([`Snapshot`]): [`check_store`] and
//! [`compare_stores`], each finding a [`Finding`] naming the model, the path and the command
//! that mends it. [`read`] is the thin reader over `artifact-store`'s stores.

pub mod read;

use cli_support::shell_quote;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use artifact_store::StoreSpec;
use artifact_store::signing::BlockCheck;
use chunker::Sha256Digest;
use manifest::signature::{self, Refusal, TrustedComment};
use manifest::{
    Generation, Limits, Manifest, ModelId, PinTable, StoreLayout, StorePath, UnixSeconds,
    ValidationMode,
};
use serde::Serialize;

/// A signature that expires within this many days is a problem: devices refuse an expired one,
/// and two weeks leave time to sign and publish again (`release-cli publish --sign-key`).
pub const NEAR_EXPIRY_DAYS: u64 = 14;

/// The store as the mend commands must name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StoreRef {
    /// A directory (`PATH`, `file:PATH`).
    Local { root: PathBuf },
    /// `hf://buckets/NS/NAME`.
    Hub { bucket: String },
    /// A checkout of the `Models` branch; paths in it are in the branch layout.
    Github { checkout: PathBuf, branch: String },
}

impl StoreRef {
    /// The name `--store`/`--to` takes.
    pub fn spec(&self) -> String {
        match self {
            StoreRef::Local { root } => StoreSpec::Local(root.clone()),
            StoreRef::Hub { bucket } => StoreSpec::HfBucket {
                bucket: bucket.clone(),
            },
            StoreRef::Github { checkout, .. } => StoreSpec::Github(checkout.clone()),
        }
        .to_string()
    }

    /// Where a bucket-layout path is in this store, as a user finds it: a file path, an
    /// `hf://` address, a path in the checkout (branch layout).
    pub fn locate(&self, path: &StorePath) -> String {
        match self {
            StoreRef::Local { root } => artifact_store::paths::to_fs_path(path, root)
                .display()
                .to_string(),
            StoreRef::Hub { bucket } => manifest::layout::hf_bucket_uri(bucket, path),
            StoreRef::Github { checkout, .. } => checkout
                .join(branch_path(path).as_str())
                .display()
                .to_string(),
        }
    }

    /// The shell command that removes `path` from this store.
    pub fn remove_command(&self, path: &StorePath) -> String {
        match self {
            StoreRef::Local { .. } => format!("rm -f -- {}", shell_quote(&self.locate(path))),
            StoreRef::Hub { bucket } => format!(
                "hf buckets rm {} --yes",
                shell_quote(&manifest::layout::hf_bucket_uri(bucket, path))
            ),
            StoreRef::Github { checkout, branch } => {
                let co = shell_quote(&checkout.display().to_string());
                let rel = branch_path(path);
                format!(
                    "git -C {co} rm -q -- {r} && git -C {co} commit -qm {m} && git -C {co} push -q origin HEAD:refs/heads/{branch}",
                    r = shell_quote(rel.as_str()),
                    m = shell_quote(&format!("Remove {rel}")),
                )
            }
        }
    }
}

fn branch_path(path: &StorePath) -> StorePath {
    StoreLayout::HfBucket
        .translate(path, StoreLayout::GithubBranch)
        .unwrap_or_else(|| path.clone())
}

/// What a small file beside a chunk set says instead of what the manifest says (`None`: it
/// agrees), or why it cannot be read as that file.
type SaysInstead<'a> =
    dyn Fn(&[u8], &std::path::Path) -> Result<Option<String>, chunker::Error> + 'a;

/// How the mend commands that publish again are written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MendContext {
    /// The rebuild workspace (`ready/` holds the manifest and the chunk sets).
    pub workspace: PathBuf,
    /// The secret keys to sign with, for a store that holds a signature.
    pub sign_keys: Vec<PathBuf>,
    /// `--openpilot`, for generations whose pin `tinygrad bump` recorded.
    pub openpilot: Option<PathBuf>,
}

impl MendContext {
    /// `release-cli publish` of the workspace's staged release to `store`: it uploads what is
    /// missing or different, removes what an older split left, and writes the manifest (and
    /// signature) last.
    pub fn republish(&self, generation: Generation, store: &StoreRef, signed: bool) -> String {
        // The workspace that holds this generation's release: the top level, or
        // generations/<gen>/ once a later generation's rebuild set it aside.
        let ws = crate::Workspace::new(&self.workspace).holding(generation);
        let (ready, manifest) = (ws.ready(), ws.ready_manifest(generation));
        let mut c = format!(
            "release-cli publish --generation {generation} --manifest {} --artifacts {} --workspace {} --to {}",
            shell_quote(&manifest.display().to_string()),
            shell_quote(&ready.display().to_string()),
            shell_quote(&ws.display().to_string()),
            shell_quote(&store.spec()),
        );
        if let StoreRef::Github { .. } = store {
            c.push_str(" --github-only 'audit: mend the GitHub store'");
        }
        if let Some(op) = &self.openpilot {
            c.push_str(&format!(
                " --openpilot {}",
                shell_quote(&op.display().to_string())
            ));
        }
        if signed {
            for k in &self.sign_keys {
                c.push_str(&format!(
                    " --sign-key {}",
                    shell_quote(&k.display().to_string())
                ));
            }
        }
        c
    }
}

/// What the reader found of a store's signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureRead {
    /// No `model_names_<gen>.json.minisig`.
    Absent,
    /// There is one, but no `--key` was given to check it with.
    NotChecked,
    /// Checked block by block with the given keys (or refused as a whole).
    Checked(Result<Vec<BlockCheck>, Refusal>),
}

/// Everything read from one store for one generation: the input of [`check_store`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub store: StoreRef,
    /// `manifests/model_names_<gen>.json`, or why it could not be read.
    pub manifest: Result<Option<Vec<u8>>, String>,
    pub signature: SignatureRead,
    /// Every file under `models/<gen>/` (bucket layout) with its size, temporaries included.
    pub files: BTreeMap<String, u64>,
    /// The content of every `.chunkmanifest` and `.sha256` there (or why it was not read).
    pub small: BTreeMap<String, Result<Vec<u8>, String>>,
    /// With `--deep`: the SHA-256 of every listed artifact whose files are all there, by
    /// logical path (`models/v25/pop223/pop223_driving_tinygrad.pkl`).
    pub digests: Option<BTreeMap<String, Sha256Digest>>,
    /// Entries under `models/<gen>/` no listing shows (a name no store path can hold, a FIFO,
    /// device or socket), by their escaped bucket-layout path (directory stores only).
    pub odd: BTreeMap<String, OddEntry>,
    /// With `--deep`: for each corrupt chunked artifact (by logical path), the chunks that
    /// differ from their reference ([`FailingChunk`]).
    pub failing_chunks: BTreeMap<String, Vec<FailingChunk>>,
}

/// A chunk of a corrupt artifact whose bytes are not its reference's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailingChunk {
    /// Its store path (bucket layout).
    pub path: String,
    pub sha256: Sha256Digest,
    pub expected: Sha256Digest,
    /// What said `expected`: the manifest's per-chunk digests, or the workspace's chunk.
    pub reference: String,
}

/// An entry of a store directory that no listing shows, as [`Snapshot::odd`] holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OddEntry {
    /// Where it is on disk, its name escaped ([`read::escaped`]).
    pub at: String,
    /// What it is.
    pub what: &'static str,
    /// The shell command that removes it (by inode: the name needs no quoting).
    pub mend: String,
}

/// One thing wrong, with the command that mends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The store as `--store` named it.
    pub store: String,
    /// The model concerned, when one is.
    pub model: Option<ModelId>,
    /// Where: a file path, `hf://` address or checkout path.
    pub path: String,
    /// What it is about.
    pub kind: FindingKind,
    pub message: String,
    /// A command that runs as printed and mends it.
    pub mend: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(m) = &self.model {
            write!(f, "model {m}: ")?;
        }
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// One logical artifact a manifest lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub model: ModelId,
    /// `None` for the main artifact, else the accelerator variant.
    pub variant: Option<String>,
    pub dir: StorePath,
    pub name: String,
    pub size: u64,
    pub sha256: Sha256Digest,
    /// 0: one plain file.
    pub count: u32,
}

impl Expected {
    pub fn logical(&self) -> String {
        format!("{}/{}", self.dir, self.name)
    }

    /// The files that hold its bytes, in order.
    pub fn pieces(&self) -> Vec<String> {
        if self.count == 0 {
            return vec![self.logical()];
        }
        (1..=self.count)
            .map(|i| {
                format!(
                    "{}/{}",
                    self.dir,
                    chunker::chunk_name(&self.name, i, self.count)
                )
            })
            .collect()
    }

    /// Every file of a complete publish of it.
    pub fn files(&self) -> Vec<String> {
        let mut v = self.pieces();
        if self.count > 0 {
            v.push(format!(
                "{}/{}",
                self.dir,
                chunker::chunk_manifest_name(&self.name)
            ));
            v.push(format!(
                "{}/{}",
                self.dir,
                chunker::sidecar_name(&self.name)
            ));
        }
        v
    }
}

/// The artifacts `m` lists for `generation` that a store must hold: every entry's and every
/// accelerator variant's with usable artifact fields (release validation names the others), and
/// none of a `local-` model, which lives on the device only (publish does not check those
/// either). Pure.
pub fn expected_artifacts(m: &Manifest, generation: Generation) -> Vec<Expected> {
    let mut out = Vec::new();
    for e in m.models() {
        if e.id().is_local() {
            continue;
        }
        let dir = StoreLayout::HfBucket.artifact_dir(generation, e.id());
        if let Some(a) = e.artifact() {
            out.push(Expected {
                model: e.id().clone(),
                variant: None,
                dir: dir.clone(),
                name: e.file_name().as_str().to_string(),
                size: a.size.get(),
                sha256: a.sha256,
                count: a.chunk_count.get(),
            });
        }
        for t in artifact_store::publish::variant_targets(e)
            .into_iter()
            .flatten()
        {
            out.push(Expected {
                model: e.id().clone(),
                variant: Some(t.variant),
                dir: dir.clone(),
                name: t.file_name,
                size: t.size,
                sha256: t.sha256,
                count: t.count,
            });
        }
    }
    out
}

/// The signature's state for the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SignatureState {
    /// `verified`, `unsigned`, `not_checked` (no `--key`) or `refused`.
    pub state: &'static str,
    pub release: Option<u64>,
    pub key: Option<String>,
    /// Unix seconds (JSON); the human report shows RFC 3339.
    pub expires: Option<u64>,
}

/// What [`check_store`] found in one store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreAudit {
    pub store: String,
    pub manifest_sha256: Option<Sha256Digest>,
    pub models: usize,
    /// Logical artifacts checked (variants included).
    pub artifacts: usize,
    /// Bytes those artifacts hold according to the manifest.
    pub bytes: u64,
    pub deep: bool,
    pub signature: SignatureState,
    pub problems: Vec<Finding>,
}

/// The rules [`check_store`] applies besides the store's own content.
#[derive(Debug, Clone)]
pub struct Rules<'a> {
    pub generation: Generation,
    pub pins: &'a PinTable,
    /// How many public keys were given (`--key`; 0: none): with any, an unsigned store is a
    /// problem.
    pub keys: usize,
    pub now: UnixSeconds,
    pub mend: &'a MendContext,
}

/// What a [`Finding`] is about; the JSON report names it in snake case (`file_missing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    ManifestUnreadable,
    ManifestMissing,
    /// Fails the release rules or does not parse.
    ManifestRule,
    ManifestGeneration,
    ManifestPin,
    SignatureMissing,
    SignatureNearExpiry,
    SignatureRefused,
    ChunkManifestMissing,
    ChunkCountDiffers,
    SidecarMissing,
    SidecarDiffers,
    /// A `.chunkmanifest` or `.sha256` that could not be read.
    Unreadable,
    /// A `.chunkmanifest` or `.sha256` that is not one.
    Malformed,
    FileMissing,
    SizeDiffers,
    ChunkSize,
    Corrupt,
    Temporary,
    Unlisted,
    ShadowingPlainFile,
    OtherSplit,
    OddName,
    StoresDisagree,
    ArtifactDigestDiffers,
}

/// The findings of one store as [`check_store`]'s steps add them.
struct Findings<'a> {
    s: &'a Snapshot,
    /// The command that publishes the store again, the mend of most findings.
    republish: String,
    list: Vec<Finding>,
}

impl Findings<'_> {
    fn push(
        &mut self,
        model: Option<&ModelId>,
        path: String,
        kind: FindingKind,
        message: String,
        mend: &str,
    ) {
        self.list.push(Finding {
            store: self.s.store.spec(),
            model: model.cloned(),
            path,
            kind,
            message,
            mend: mend.to_string(),
        })
    }

    /// A finding that publishing again mends.
    fn republish(&mut self, model: Option<&ModelId>, at: String, kind: FindingKind, msg: String) {
        let mend = self.republish.clone();
        self.push(model, at, kind, msg, &mend)
    }

    /// Where a bucket-layout path (as text) is in the store.
    fn at(&self, p: &str) -> String {
        match p.parse::<StorePath>() {
            Ok(p) => self.s.store.locate(&p),
            Err(_) => p.to_string(),
        }
    }
}

/// Audit one store's snapshot: its manifest, its signature, every artifact the manifest lists,
/// and what else lies in the generation's directory. Pure.
pub fn check_store(s: &Snapshot, rules: &Rules) -> StoreAudit {
    let g = rules.generation;
    let signed = rules.keys > 0 || !matches!(s.signature, SignatureRead::Absent);
    let mut f = Findings {
        s,
        republish: rules.mend.republish(g, &s.store, signed),
        list: Vec::new(),
    };
    let manifest = check_manifest(&mut f, rules);
    let signature = check_signature(&mut f, rules);
    let expected = manifest
        .as_ref()
        .map(|m| expected_artifacts(m, g))
        .unwrap_or_default();
    for e in &expected {
        check_artifact(&mut f, e);
    }
    check_stale(&mut f, manifest.is_some().then_some(&expected[..]), g);
    StoreAudit {
        store: s.store.spec(),
        manifest_sha256: s
            .manifest
            .as_ref()
            .ok()
            .and_then(Option::as_deref)
            .map(Sha256Digest::of_bytes),
        models: manifest.as_ref().map_or(0, |m| m.models().len()),
        artifacts: expected.len(),
        bytes: expected.iter().map(|e| e.size).sum(),
        deep: s.digests.is_some(),
        signature,
        problems: f.list,
    }
}

/// The manifest: read, passing the release rules of its contract, of this generation, with
/// its generation's pin. Returns it when it parses.
fn check_manifest(f: &mut Findings, rules: &Rules) -> Option<Manifest> {
    use FindingKind as K;
    let g = rules.generation;
    let at = f.s.store.locate(&StoreLayout::HfBucket.manifest_path(g));
    let b = match &f.s.manifest {
        Err(e) => {
            f.republish(None, at, K::ManifestUnreadable, e.clone());
            return None;
        }
        Ok(None) => {
            let msg =
                format!("no {g} manifest: devices of this generation find no model list here");
            f.republish(None, at, K::ManifestMissing, msg);
            return None;
        }
        Ok(Some(b)) => b,
    };
    // The rules of the generation's contract (v25: exactly `validate_bytes`'s).
    let contract = manifest::contract::for_manifest(rules.pins, b).1.contract();
    let rule_problems = manifest::validate_for_contract(
        b,
        ValidationMode::Release,
        contract,
        &manifest::Expectation::default(),
        &Limits::default(),
    );
    for p in &rule_problems {
        let msg = format!("fails the release rules at {p}");
        f.republish(None, at.clone(), K::ManifestRule, msg);
    }
    let m = match Manifest::from_slice(b) {
        Ok(m) => m,
        Err(e) => {
            if rule_problems.is_empty() {
                f.republish(None, at, K::ManifestRule, format!("does not parse: {e}"));
            }
            return None;
        }
    };
    if m.generation() != Some(g) {
        let says = m
            .generation()
            .map_or_else(|| "(none)".to_string(), |x| x.to_string());
        let msg = format!("says generation {says}, but it is the {g} manifest");
        f.republish(None, at.clone(), K::ManifestGeneration, msg);
    }
    let revision = m.revision(rules.pins.contract(g));
    if let Err(r) = manifest::pins::check_pin(rules.pins, g, revision.as_ref()) {
        f.republish(None, at, K::ManifestPin, pin_text(&r));
    }
    Some(m)
}

/// The signature: present when keys were given, verified with them and not near expiry.
fn check_signature(f: &mut Findings, rules: &Rules) -> SignatureState {
    use FindingKind as K;
    let g = rules.generation;
    let at = f.s.store.locate(&StoreLayout::HfBucket.signature_path(g));
    let mut state = SignatureState {
        state: "unsigned",
        release: None,
        key: None,
        expires: None,
    };
    let checks = match &f.s.signature {
        SignatureRead::Absent => {
            if rules.keys > 0 {
                let msg = format!(
                    "{}; devices with trusted keys refuse this generation",
                    Refusal::Unsigned
                );
                f.republish(None, at, K::SignatureMissing, msg);
            }
            return state;
        }
        SignatureRead::NotChecked => {
            state.state = "not_checked";
            return state;
        }
        SignatureRead::Checked(checks) => checks,
    };
    state.state = "refused";
    let decided = checks.as_ref().map_err(Clone::clone).and_then(|c| {
        signature::decide_blocks(
            c.iter().map(BlockCheck::outcome),
            rules.keys,
            g,
            None,
            rules.now,
        )
    });
    let TrustedComment {
        release, expires, ..
    } = match decided {
        Ok(c) => c,
        Err(r) => {
            f.republish(None, at, K::SignatureRefused, refusal_text(&r));
            return state;
        }
    };
    state.state = "verified";
    state.release = Some(release.get());
    state.expires = Some(expires.0);
    state.key = checks
        .as_ref()
        .ok()
        .and_then(|c| c.iter().find_map(|b| b.verified_by.clone()));
    if let Some(days) = near_expiry(expires, rules.now) {
        let msg = format!(
            "release {release} expires {} (in {days} day(s), within {NEAR_EXPIRY_DAYS}); devices refuse it from then on",
            expires
        );
        f.republish(None, at, K::SignatureNearExpiry, msg);
    }
    state
}

/// One listed artifact: its `.chunkmanifest` and `.sha256`, every piece there, the sizes and,
/// with `--deep`, the digest.
fn check_artifact(f: &mut Findings, e: &Expected) {
    use FindingKind as K;
    let s = f.s;
    let model = Some(&e.model);
    let what = match &e.variant {
        None => String::new(),
        Some(v) => format!("accelerator variant {v:?}: "),
    };
    let logical = f.at(&e.logical());
    if e.count > 0 {
        check_beside(f, e, &what);
    }
    let (mut missing, mut sizes) = (Vec::new(), Vec::new());
    for p in e.pieces() {
        match s.files.get(&p) {
            Some(n) => sizes.push((p, *n)),
            None => missing.push(p),
        }
    }
    for p in &missing {
        let msg = format!(
            "{what}missing (the manifest lists {} file(s) for {})",
            e.pieces().len(),
            e.name
        );
        f.republish(model, f.at(p), K::FileMissing, msg);
    }
    if !missing.is_empty() {
        return;
    }
    let total: u64 = sizes.iter().map(|(_, n)| n).sum();
    if total != e.size {
        let msg = format!(
            "{what}the store holds {} ({total} bytes), the manifest says {} ({} bytes)",
            cli_support::progress::bytes(total),
            cli_support::progress::bytes(e.size),
            e.size
        );
        f.republish(model, logical.clone(), K::SizeDiffers, msg);
    } else if let Some((p, n, want)) = bad_chunk_size(&sizes) {
        let msg = format!(
            "{what}{n} bytes: every chunk but the last must have {want} bytes, the last 1 to {want}"
        );
        f.republish(model, f.at(&p), K::ChunkSize, msg);
    }
    let Some(d) = s.digests.as_ref().and_then(|d| d.get(&e.logical())) else {
        return;
    };
    if *d == e.sha256 {
        return;
    }
    let failing = s.failing_chunks.get(&e.logical());
    let chunks: Vec<String> = failing
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{} hashes to {}, {} says {}",
                c.path, c.sha256, c.reference, c.expected
            )
        })
        .collect();
    let named = if chunks.is_empty() {
        String::new()
    } else {
        format!("; failing chunk(s): {}", chunks.join("; "))
    };
    let path = failing
        .and_then(|c| c.first())
        .map_or(logical, |c| f.at(&c.path));
    let msg = format!(
        "{what}the stored bytes hash to {d}, the manifest says {}{named}",
        e.sha256
    );
    f.republish(model, path, K::Corrupt, msg);
}

/// The `.chunkmanifest` and `.sha256` beside a chunk set: each missing, unreadable, malformed,
/// or saying other than the manifest.
fn check_beside(f: &mut Findings, e: &Expected, what: &str) {
    use FindingKind as K;
    let count: &SaysInstead = &|b, path| {
        let n = chunker::parse_chunk_manifest(b, path)?;
        Ok((n != e.count).then(|| format!("says {n} chunks, the manifest {}", e.count)))
    };
    let digest: &SaysInstead = &|b, path| {
        let d = chunker::parse_sidecar(b, path)?;
        Ok((d != e.sha256).then(|| format!("says {d}, the manifest {}", e.sha256)))
    };
    let files = [
        (
            chunker::chunk_manifest_name(&e.name),
            K::ChunkManifestMissing,
            "the .chunkmanifest is missing, so devices treat the artifact as absent",
            K::ChunkCountDiffers,
            count,
        ),
        (
            chunker::sidecar_name(&e.name),
            K::SidecarMissing,
            "the .sha256 sidecar is missing",
            K::SidecarDiffers,
            digest,
        ),
    ];
    for (file, missing, missing_msg, differs, check) in files {
        let key = format!("{}/{}", e.dir, file);
        let (kind, message) = match f.s.small.get(&key) {
            None => (missing, format!("{what}{missing_msg}")),
            Some(Err(err)) => (K::Unreadable, format!("{what}{err}")),
            Some(Ok(b)) => match check(b, std::path::Path::new(&key)) {
                Ok(None) => continue,
                Ok(Some(says)) => (differs, format!("{what}{says}")),
                Err(err) => (K::Malformed, format!("{what}{err}")),
            },
        };
        f.republish(Some(&e.model), f.at(&key), kind, message);
    }
}

/// What else lies in the generation's directory: the files no listed artifact owns (when the
/// manifest parsed: `expected`), and whatever no listing shows, manifest or not (never
/// "healthy" beside it).
fn check_stale(f: &mut Findings, expected: Option<&[Expected]>, g: Generation) {
    let s = f.s;
    let model_of = |path: &str| {
        path.split('/')
            .nth(2)
            .and_then(|id| id.parse::<ModelId>().ok())
    };
    for (path, kind, message) in expected
        .map(|e| stale_files(&s.files, e, g))
        .unwrap_or_default()
    {
        let mend = match path.parse::<StorePath>() {
            Ok(p) => s.store.remove_command(&p),
            Err(_) => f.republish.clone(),
        };
        f.push(model_of(&path).as_ref(), f.at(&path), kind, message, &mend);
    }
    for (shown, e) in &s.odd {
        let msg = format!("{shown}: {} (its name shown escaped)", e.what);
        f.push(
            model_of(shown).as_ref(),
            e.at.clone(),
            FindingKind::OddName,
            msg,
            &e.mend,
        );
    }
}

/// The days left when `expires` is within [`NEAR_EXPIRY_DAYS`] of `now` (an expired one is
/// refused by [`signature::decide_blocks`] before this is asked). Pure.
pub fn near_expiry(expires: UnixSeconds, now: UnixSeconds) -> Option<u64> {
    let left = expires.0.saturating_sub(now.0);
    (left < NEAR_EXPIRY_DAYS * 86_400).then_some(left / 86_400)
}

/// The first chunk (path, size, chunk size) whose size breaks "every chunk but the last has
/// the chunk size, the last 1 to chunk size"; the chunk size is the first chunk's. Pure.
fn bad_chunk_size(sizes: &[(String, u64)]) -> Option<(String, u64, u64)> {
    let (last, body) = sizes.split_last()?;
    let want = body.first().map_or(last.1, |f| f.1);
    if let Some((p, n)) = body.iter().find(|(_, n)| *n != want || *n == 0) {
        return Some((p.clone(), *n, want));
    }
    (last.1 == 0 || last.1 > want).then(|| (last.0.clone(), last.1, want))
}

/// Files under `models/<gen>/` that no listed artifact owns, each with a kind and why it is
/// stale: another split's chunks of a listed artifact, a temporary of an interrupted write, a
/// plain file shadowing a listed chunk set (every reader takes the plain file first), a set
/// where the manifest lists a plain file, anything in a model directory the manifest does not
/// list. Pure.
pub fn stale_files(
    files: &BTreeMap<String, u64>,
    expected: &[Expected],
    generation: Generation,
) -> Vec<(String, FindingKind, String)> {
    let owned: BTreeSet<String> = expected.iter().flat_map(Expected::files).collect();
    let listed: BTreeSet<String> = expected.iter().map(|e| e.model.to_string()).collect();
    let by_logical: BTreeMap<String, &Expected> =
        expected.iter().map(|e| (e.logical(), e)).collect();
    let prefix = format!("{}/", StoreLayout::HfBucket.generation_dir(generation));
    let mut out = Vec::new();
    for path in files.keys() {
        if owned.contains(path) {
            continue;
        }
        let Some(rest) = path.strip_prefix(&prefix) else {
            continue;
        };
        let (dir, file) = path.rsplit_once('/').unwrap_or(("", path));
        let model = rest.split('/').next().unwrap_or_default();
        let (kind, why) = if chunker::atomic::is_temp_name(file) {
            (
                FindingKind::Temporary,
                "a temporary an interrupted write left".to_string(),
            )
        } else if !listed.contains(model) {
            (
                FindingKind::Unlisted,
                format!("model {model} is not in the {generation} manifest"),
            )
        } else if let Some(e) = by_logical.get(path) {
            (
                FindingKind::ShadowingPlainFile,
                format!(
                    "a plain file shadows the listed {}-chunk set: every reader takes it first",
                    e.count
                ),
            )
        } else if let Some(e) =
            chunker::member_of(file).and_then(|l| by_logical.get(&format!("{dir}/{l}")))
        {
            match chunker::form_of(&e.name, file) {
                Some(chunker::Form::Chunk { count: n, .. }) if n != e.count => (
                    FindingKind::OtherSplit,
                    format!(
                        "a chunk of a {n}-chunk split; the manifest lists {}",
                        if e.count == 0 {
                            "a plain file".to_string()
                        } else {
                            format!("{} chunk(s)", e.count)
                        }
                    ),
                ),
                _ => (
                    FindingKind::OtherSplit,
                    format!(
                        "belongs to a chunk set of {}, which the manifest lists as a plain file",
                        e.name
                    ),
                ),
            }
        } else {
            (
                FindingKind::Unlisted,
                "no artifact the manifest lists owns this file".to_string(),
            )
        };
        out.push((path.clone(), kind, why));
    }
    out
}

/// Stores of one generation must agree: every store's manifest bytes equal the first store's,
/// so devices get the same models whichever origin answers. Each artifact whose digest differs
/// is named. Pure.
pub fn compare_stores(snapshots: &[Snapshot], rules: &Rules) -> Vec<Finding> {
    let g = rules.generation;
    let Some((first, rest)) = snapshots.split_first() else {
        return Vec::new();
    };
    let Ok(Some(reference)) = &first.manifest else {
        return Vec::new();
    };
    let ref_m = Manifest::from_slice(reference).ok();
    let mut out = Vec::new();
    for s in rest {
        let Ok(Some(bytes)) = &s.manifest else {
            continue;
        };
        if bytes == reference {
            continue;
        }
        let signed = rules.keys > 0 || !matches!(s.signature, SignatureRead::Absent);
        let mend = rules.mend.republish(g, &s.store, signed);
        let path = s.store.locate(&StoreLayout::HfBucket.manifest_path(g));
        out.push(Finding {
            store: s.store.spec(),
            model: None,
            path: path.clone(),
            kind: FindingKind::StoresDisagree,
            message: format!(
                "manifest SHA-256 {} differs from {}'s {}",
                Sha256Digest::of_bytes(bytes),
                first.store.spec(),
                Sha256Digest::of_bytes(reference)
            ),
            mend: mend.clone(),
        });
        let (Some(a), Ok(b)) = (&ref_m, Manifest::from_slice(bytes)) else {
            continue;
        };
        let digests = |m: &Manifest| -> BTreeMap<String, (ModelId, Sha256Digest)> {
            expected_artifacts(m, g)
                .into_iter()
                .map(|e| (e.logical(), (e.model.clone(), e.sha256)))
                .collect()
        };
        let (da, db) = (digests(a), digests(&b));
        // Every artifact the first store lists, then those only this one lists.
        let logicals = da.keys().chain(db.keys().filter(|l| !da.contains_key(*l)));
        let lists = |x: Option<&(ModelId, Sha256Digest)>| {
            x.map_or_else(|| "nothing".to_string(), |x| x.1.to_string())
        };
        for logical in logicals {
            let (firsts, theirs) = (da.get(logical), db.get(logical));
            if firsts.map(|x| x.1) == theirs.map(|x| x.1) {
                continue;
            }
            out.push(Finding {
                store: s.store.spec(),
                model: firsts.or(theirs).map(|x| x.0.clone()),
                path: s.store.locate(&logical.parse().expect("a layout path")),
                kind: FindingKind::ArtifactDigestDiffers,
                message: format!(
                    "{} lists {}, {} lists {}",
                    s.store.spec(),
                    lists(theirs),
                    first.store.spec(),
                    lists(firsts)
                ),
                mend: mend.clone(),
            });
        }
    }
    out
}

fn pin_text(r: &manifest::pins::PinRefusal) -> String {
    use manifest::pins::PinRefusal as P;
    match r {
        P::Missing { generation } => {
            format!("no tinygrad_commit, so nothing ties it to the {generation} pin")
        }
        P::Unknown { generation } => format!(
            "no tinygrad pin is known for {generation} (give --openpilot, whose tinygrad_pins.json `tinygrad bump` wrote)"
        ),
        P::Mismatch {
            generation,
            expected,
            found,
            belongs_to,
        } => format!(
            "tinygrad_commit {found}{} is not {generation}'s pin {expected}",
            belongs_to.map_or_else(String::new, |g| format!(" ({g}'s pin)"))
        ),
        other => format!("{other:?}"),
    }
}

fn refusal_text(r: &Refusal) -> String {
    match r {
        Refusal::Expired { expires, now } => format!(
            "the signature expired {} (the clock says {}); devices with trusted keys refuse the generation",
            expires, now
        ),
        other => format!("{other}; devices with trusted keys refuse the generation"),
    }
}

/// The whole audit: every store's findings, then the disagreements between stores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub generation: Generation,
    pub near_expiry_days: u64,
    pub stores: Vec<StoreAudit>,
    /// Findings between stores (a store's manifest bytes or digests differ from the first's).
    pub disagreements: Vec<Finding>,
    pub healthy: bool,
}

impl Report {
    /// Audit every snapshot and compare them. Pure.
    pub fn decide(snapshots: &[Snapshot], rules: &Rules) -> Self {
        let stores: Vec<StoreAudit> = snapshots.iter().map(|s| check_store(s, rules)).collect();
        let disagreements = compare_stores(snapshots, rules);
        let healthy = disagreements.is_empty() && stores.iter().all(|s| s.problems.is_empty());
        Self {
            generation: rules.generation,
            near_expiry_days: NEAR_EXPIRY_DAYS,
            stores,
            disagreements,
            healthy,
        }
    }

    /// Every finding, store by store, then the disagreements.
    pub fn findings(&self) -> impl Iterator<Item = &Finding> {
        self.stores
            .iter()
            .flat_map(|s| s.problems.iter())
            .chain(self.disagreements.iter())
    }
}

#[cfg(test)]
mod tests;
