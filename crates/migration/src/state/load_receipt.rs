//! What actually runs: modeld's load receipt, on a contract that has one (v26 and later; see
//! `manifest::contract::LoadReceiptRule`), and what follows from it.
//!
//! modeld writes `<shm>/starpilot_modeld_<OPENPILOT_PREFIX or d>/load-v1.json` once it has
//! warmed a model: which model, which variant, the artifact's SHA-256, and why it fell back, if
//! it did. The receipt names what runs, never what was asked for: after `selected-load-failed`
//! it names the bundled model, which runs instead of the selection.
//!
//! - [`parse`] is the pure rule over the receipt's bytes (exactly the rule's keys, each once;
//!   `version` the rule's; positive process identity; a model id; a variant and a reason from
//!   the rule; a lowercase SHA-256). Anything else is [`RunningModel::Unavailable`], never a
//!   guess.
//! - [`read`] is the shell: the directory opened `O_NOFOLLOW`, owned by us, mode 0700; the file
//!   opened `O_NOFOLLOW | O_NONBLOCK` beside it, a regular file of ours that neither group nor
//!   others can reach, at most the rule's bytes, unchanged while read. A receipt whose process
//!   is gone (its pid no longer has the recorded start ticks) is [`RunningModel::Stale`].
//! - [`running_vs_selected`] says whether what runs is what the device would have modeld load.
//! - A model whose first start fails is not retried forever: [`poison_decision`] says when a
//!   `selected-load-failed` receipt condemns the artifact just installed, [`BadArtifacts`]
//!   (`<models>/.bad-artifacts.json`) remembers its SHA-256, and [`download_allowed`] keeps it
//!   from being downloaded again until the manifest publishes other bytes for that model.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use manifest::contract::{Contract, LoadReceiptRule};
use manifest::{ModelId, Sha256Digest};
use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, Stat, fstat, statat};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Result;
use crate::state::device::Device;

/// The state file remembering artifacts modeld could not start.
pub const BAD_ARTIFACTS_FILE: &str = ".bad-artifacts.json";
/// Its read cap: one line per condemned artifact.
pub const BAD_ARTIFACTS_LIMIT: u64 = 64 * 1024;

/// Where this device's receipt is, and the rule it is read by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub rule: LoadReceiptRule,
    /// The contract's "bundled model" id (`bundled-current`): the receipt names it when the
    /// bundled model runs.
    pub bundled: &'static str,
    /// The receipt's path; `Err`: why there is none (an `OPENPILOT_PREFIX` modeld refuses too).
    pub path: std::result::Result<PathBuf, String>,
    /// Where processes are listed (`/proc`), to tell a live receipt from a stale one.
    pub proc_root: PathBuf,
}

impl Source {
    /// The receipt of `contract` (`None`: the contract has none, v25), under `shm_root` (the
    /// rule's own root when `None`), for the `OPENPILOT_PREFIX` `prefix` (`None`: unset).
    pub fn of(contract: &Contract, shm_root: Option<&Path>, prefix: Option<&str>) -> Option<Self> {
        let rule = contract.load_receipt?;
        let root = shm_root.unwrap_or(Path::new(rule.shm_root));
        let path = match prefix {
            Some(p) if !valid_prefix(p, rule.prefix_max_len) => Err(format!(
                "OPENPILOT_PREFIX {p:?} is not 1 to {} of A-Z a-z 0-9 _ -, so modeld keeps no \
                 receipt",
                rule.prefix_max_len
            )),
            _ => Ok(contract
                .load_receipt_path_in(root, prefix)
                .expect("the contract has a load receipt")),
        };
        Some(Self {
            rule,
            bundled: contract.bundled_selection,
            path,
            proc_root: PathBuf::from("/proc"),
        })
    }
}

/// `OPENPILOT_PREFIX` as modeld accepts it. Pure.
pub fn valid_prefix(prefix: &str, max_len: usize) -> bool {
    (1..=max_len).contains(&prefix.len())
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Why modeld fell back: one of the rule's reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FallbackReason {
    text: &'static str,
    selected_load_failed: bool,
}

impl FallbackReason {
    pub fn as_str(&self) -> &'static str {
        self.text
    }
    /// The selected model failed to load or run; the bundled model runs instead.
    pub fn is_selected_load_failed(&self) -> bool {
        self.selected_load_failed
    }
    /// In words, for `status` and the log.
    pub fn describe(&self) -> String {
        match self.selected_load_failed {
            true => format!("{}: the selected model failed to load", self.text),
            false => self.text.to_string(),
        }
    }
}

/// One valid receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadReceipt {
    pub pid: u64,
    pub process_start_ticks: u64,
    pub loaded_mono_ns: u64,
    pub model_id: ModelId,
    /// The model is the contract's bundled one.
    pub bundled: bool,
    /// One of the rule's variants (`small`, `chestnut`).
    pub variant: &'static str,
    pub artifact_sha256: Sha256Digest,
    pub fallback: Option<FallbackReason>,
}

/// What runs, as far as the receipt can say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunningModel {
    /// A valid receipt of a live modeld.
    Loaded(LoadReceipt),
    /// A valid receipt whose process is gone: it says what ran, not what runs.
    Stale { receipt: LoadReceipt, why: String },
    /// No receipt that can be believed: missing, malformed, or not safely ours.
    Unavailable { why: String },
}

impl RunningModel {
    fn unavailable(why: impl Into<String>) -> Self {
        RunningModel::Unavailable { why: why.into() }
    }
}

/// A JSON object's members in order, duplicates kept (serde_json's map keeps the last).
struct Members(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Members, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    out.push((k, v));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// The receipt's JSON object as its members, in order, within the rule's size limit.
fn decode(bytes: &[u8], rule: &LoadReceiptRule) -> std::result::Result<Members, String> {
    if bytes.len() as u64 > rule.max_bytes {
        return Err(format!(
            "{} bytes, over the receipt's {}-byte limit",
            bytes.len(),
            rule.max_bytes
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
    serde_json::from_str(text).map_err(|e| format!("not a JSON object ({e})"))
}

/// The members by key: each key once, and exactly the rule's keys.
fn exact_fields<'m>(
    members: &'m [(String, Value)],
    rule: &LoadReceiptRule,
) -> std::result::Result<BTreeMap<&'m str, &'m Value>, String> {
    let mut fields: BTreeMap<&str, &Value> = BTreeMap::new();
    for (k, v) in members {
        if fields.insert(k.as_str(), v).is_some() {
            return Err(format!("key {k:?} appears twice"));
        }
    }
    let mut keys: Vec<&str> = fields.keys().copied().collect();
    let mut want: Vec<&str> = rule.keys.to_vec();
    keys.sort_unstable();
    want.sort_unstable();
    if keys != want {
        return Err(format!(
            "keys {keys:?}, not exactly {:?}",
            rule.keys.iter().collect::<Vec<_>>()
        ));
    }
    Ok(fields)
}

/// The receipt in `bytes`, by `rule`; `bundled` is the contract's bundled model id. Pure.
pub fn parse(
    bytes: &[u8],
    rule: &LoadReceiptRule,
    bundled: &str,
) -> std::result::Result<LoadReceipt, String> {
    let Members(members) = decode(bytes, rule)?;
    let fields = exact_fields(&members, rule)?;
    let field = |k: &str| fields[k];
    let version = field("version");
    if version.as_i64() != Some(rule.version) {
        return Err(format!(
            "version {version}, not {} (a receipt this code cannot read)",
            rule.version
        ));
    }
    let positive = |k: &str| -> std::result::Result<u64, String> {
        match field(k).as_u64() {
            Some(n) if n > 0 => Ok(n),
            _ => Err(format!("{k} {} is not a positive integer", field(k))),
        }
    };
    let pid = positive("pid")?;
    let process_start_ticks = positive("processStartTicks")?;
    let loaded_mono_ns = positive("loadedMonoNs")?;
    let model_id: ModelId = field("modelId")
        .as_str()
        .ok_or_else(|| format!("modelId {} is not a string", field("modelId")))?
        .parse()
        .map_err(|e: manifest::Error| format!("modelId: {e}"))?;
    let variant = field("variant")
        .as_str()
        .and_then(|v| rule.variants.iter().find(|w| **w == v))
        .copied()
        .ok_or_else(|| {
            format!(
                "variant {} is not one of {:?}",
                field("variant"),
                rule.variants
            )
        })?;
    let artifact_sha256 = field("artifactSha256")
        .as_str()
        .and_then(|s| s.parse::<Sha256Digest>().ok())
        .ok_or_else(|| {
            format!(
                "artifactSha256 {} is not 64 lowercase hex digits",
                field("artifactSha256")
            )
        })?;
    let fallback = match field("fallbackReason") {
        Value::Null => None,
        v => Some(
            v.as_str()
                .and_then(|s| rule.fallback_reasons.iter().find(|r| **r == s))
                .map(|text| FallbackReason {
                    text,
                    selected_load_failed: *text == rule.selected_load_failed,
                })
                .ok_or_else(|| {
                    format!(
                        "fallbackReason {v} is not null or one of {:?}",
                        rule.fallback_reasons
                    )
                })?,
        ),
    };
    Ok(LoadReceipt {
        pid,
        process_start_ticks,
        loaded_mono_ns,
        bundled: model_id.as_str() == bundled,
        model_id,
        variant,
        artifact_sha256,
        fallback,
    })
}

/// A process's start time in clock ticks since boot: field 22 of `/proc/<pid>/stat`, counted
/// after the command name's closing parenthesis (the name may hold spaces and parentheses).
/// `None`: not readable as one. Pure.
pub fn start_ticks_of(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    let tail = std::str::from_utf8(stat.get(close + 1..)?).ok()?;
    // Fields 3.. follow the name; field 22 is the 20th of them.
    tail.split_ascii_whitespace()
        .nth(19)?
        .parse()
        .ok()
        .filter(|t| *t > 0)
}

/// A valid receipt judged against its process: `ticks` is the start ticks `/proc/<pid>/stat`
/// gives now (`None`: no such process). Pure.
pub fn liveness(receipt: LoadReceipt, ticks: Option<u64>) -> RunningModel {
    match ticks {
        Some(t) if t == receipt.process_start_ticks => RunningModel::Loaded(receipt),
        Some(_) => RunningModel::Stale {
            why: format!(
                "modeld pid {} has exited (the pid now belongs to another process)",
                receipt.pid
            ),
            receipt,
        },
        None => RunningModel::Stale {
            why: format!("modeld pid {} is not running", receipt.pid),
            receipt,
        },
    }
}

fn errno_text(e: &std::io::Error) -> String {
    match e.raw_os_error().map(Errno::from_raw_os_error) {
        Some(Errno::LOOP) => "a symbolic link (not followed)".into(),
        Some(Errno::NOTDIR) => "not a directory".into(),
        _ => e.to_string(),
    }
}

fn open_at(dir: Option<&OwnedFd>, path: &Path, flags: OFlags) -> std::io::Result<OwnedFd> {
    use std::os::fd::AsFd as _;
    let at = dir.map_or(CWD, |d| d.as_fd());
    Ok(rustix::fs::openat(
        at,
        path,
        flags | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Whether two looks at a file saw the same file, unchanged (device, inode, size, times).
fn same_file(a: &Stat, b: &Stat) -> bool {
    (a.st_dev, a.st_ino, a.st_size) == (b.st_dev, b.st_ino, b.st_size)
        && (a.st_mtime, a.st_mtime_nsec, a.st_ctime, a.st_ctime_nsec)
            == (b.st_mtime, b.st_mtime_nsec, b.st_ctime, b.st_ctime_nsec)
}

/// The receipt's bytes, read as the module says (no link followed, nothing but a regular file
/// of ours in a 0700 directory of ours, at most the rule's bytes). `Err`: why not.
fn read_bytes(path: &Path, max: u64) -> std::result::Result<Vec<u8>, String> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(format!("{} is not a file path", path.display()));
    };
    let name = Path::new(name);
    let uid = rustix::process::geteuid().as_raw();
    let at = |why: &dyn std::fmt::Display| format!("{}: {why}", path.display());
    let dir_at = |why: &dyn std::fmt::Display| format!("{}: {why}", dir.display());
    let d = open_at(
        None,
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
    )
    .map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!(
            "no receipt: {} does not exist (modeld has not loaded a model since boot)",
            dir.display()
        ),
        // O_DIRECTORY | O_NOFOLLOW on a link is ENOTDIR: say which it is.
        _ if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) => {
            dir_at(&"a symbolic link (not followed)")
        }
        _ => dir_at(&errno_text(&e)),
    })?;
    let ds = fstat(&d).map_err(|e| dir_at(&e))?;
    let mode = ds.st_mode & 0o7777;
    if ds.st_uid != uid || mode != 0o700 {
        let owner = ds.st_uid;
        return Err(dir_at(&format_args!(
            "owner {owner} mode {mode:o}, not ours ({uid}) with mode 700"
        )));
    }
    let f = open_at(
        Some(&d),
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK,
    )
    .map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!(
            "no receipt: {} does not exist (modeld is loading, or has not loaded a model)",
            path.display()
        ),
        _ => at(&errno_text(&e)),
    })?;
    let before = fstat(&f).map_err(|e| at(&e))?;
    if FileType::from_raw_mode(before.st_mode) != FileType::RegularFile {
        return Err(at(&"not a regular file"));
    }
    let (owner, mode, size) = (before.st_uid, before.st_mode & 0o7777, before.st_size);
    if owner != uid || mode & 0o077 != 0 {
        let why = format_args!(
            "owner {owner} mode {mode:o}, not ours ({uid}) and closed to group and others"
        );
        return Err(at(&why));
    }
    if size as u64 > max {
        return Err(at(&format_args!(
            "{size} bytes, over the receipt's {max}-byte limit"
        )));
    }
    let mut bytes = Vec::new();
    File::from(f.try_clone().map_err(|e| e.to_string())?)
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| at(&e))?;
    if bytes.len() as u64 > max {
        return Err(at(&format_args!("over the receipt's {max}-byte limit")));
    }
    let after = fstat(&f).map_err(|e| e.to_string())?;
    let named = statat(&d, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| at(&e))?;
    if !same_file(&before, &after) || !same_file(&before, &named) {
        return Err(at(&"replaced while it was read"));
    }
    Ok(bytes)
}

/// What runs, from `source`'s receipt. Never fails: whatever cannot be believed is
/// [`RunningModel::Unavailable`] with why.
pub fn read(source: &Source) -> RunningModel {
    let path = match &source.path {
        Ok(p) => p,
        Err(why) => return RunningModel::unavailable(why.clone()),
    };
    // Once more if it was replaced while read (modeld writes it atomically).
    let mut bytes = read_bytes(path, source.rule.max_bytes);
    if bytes
        .as_ref()
        .is_err_and(|e| e.ends_with("replaced while it was read"))
    {
        bytes = read_bytes(path, source.rule.max_bytes);
    }
    let receipt = match bytes.and_then(|b| {
        parse(&b, &source.rule, source.bundled).map_err(|e| format!("{}: {e}", path.display()))
    }) {
        Ok(r) => r,
        Err(why) => return RunningModel::unavailable(why),
    };
    let stat = source.proc_root.join(receipt.pid.to_string()).join("stat");
    let ticks = crate::state::bounded::read_capped(&stat, 4096)
        .ok()
        .flatten()
        .and_then(|b| start_ticks_of(&b));
    liveness(receipt, ticks)
}

/// A receipt must name a model on the hardware the catalog gives it: an external-GPU model runs
/// as the rule's GPU variant and only such a model does (the bundled model either way).
/// `uses_external_gpu`: the catalog's flag for the model (`None`: not in the catalog, not
/// checked). Pure.
pub fn hardware_agrees(
    r: &LoadReceipt,
    uses_external_gpu: Option<bool>,
    rule: &LoadReceiptRule,
) -> std::result::Result<(), String> {
    match uses_external_gpu {
        Some(gpu) if !r.bundled && gpu != (r.variant == rule.gpu_variant) => Err(format!(
            "the receipt says {} runs as the {} variant, but the catalog lists it as {} model",
            r.model_id,
            r.variant,
            if gpu { "an external-GPU" } else { "a non-GPU" }
        )),
        _ => Ok(()),
    }
}

/// The receipt's model as the tree's reviewed catalog (upstream's `BY_ID`, what modeld's own
/// reader checks a receipt against) knows it: its external-GPU flag (`None` for the bundled
/// model), or why the receipt names no model the tree has. Pure.
pub fn tree_gpu_flag(
    r: &LoadReceipt,
    tree: &manifest::contract::TreeDeclaration,
) -> std::result::Result<Option<bool>, String> {
    if r.bundled {
        return Ok(None);
    }
    tree.row(r.model_id.as_str())
        .map(|row| Some(row.uses_external_gpu))
        .ok_or_else(|| {
            format!(
                "the receipt names {}, a model the tree's reviewed {} catalog does not list",
                r.model_id, tree.generation
            )
        })
}

/// [`read`], then the receipt's model checked as upstream's reader checks it: against the
/// tree's reviewed catalog when the tree declared one ([`tree_gpu_flag`], a model it does not
/// list is unavailable), else against `device`'s catalog; then [`hardware_agrees`]. A receipt
/// that fails either is unavailable.
pub fn read_on(device: &Device, source: &Source) -> RunningModel {
    let running = read(source);
    let receipt = match &running {
        RunningModel::Loaded(r) | RunningModel::Stale { receipt: r, .. } => r,
        RunningModel::Unavailable { .. } => return running,
    };
    let gpu = match device.files().tree() {
        Some(tree) => match tree_gpu_flag(receipt, tree) {
            Ok(gpu) => gpu,
            Err(why) => return RunningModel::unavailable(why),
        },
        None => in_catalog(device, &receipt.model_id, |e| Some(e.uses_external_gpu())),
    };
    match hardware_agrees(receipt, gpu, &source.rule) {
        Ok(()) => running,
        Err(why) => RunningModel::unavailable(why),
    }
}

// ---------------------------------------------------------------------------------------------
// What runs against what should

/// What the device would have modeld load: the bundled model, or a model with the digest its
/// installed artifact verified against (`None` when none is known, a local model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    Bundled,
    Model {
        id: ModelId,
        sha256: Option<Sha256Digest>,
    },
}

/// [`running_vs_selected`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// What runs is what should.
    Same,
    /// Another model runs (after a fallback, or modeld has not restarted since the selection
    /// changed).
    OtherModel {
        expected: String,
        running: ModelId,
        fallback: Option<FallbackReason>,
    },
    /// The same model, other bytes (modeld loaded an earlier publish; a restart loads the new).
    OtherBytes {
        id: ModelId,
        expected: Sha256Digest,
        running: Sha256Digest,
    },
    /// Nothing to compare: no live receipt.
    Unknown { why: String },
}

impl Verdict {
    /// A difference the daemon flags.
    pub fn differs(&self) -> bool {
        matches!(
            self,
            Verdict::OtherModel { .. } | Verdict::OtherBytes { .. }
        )
    }

    /// One line for `status` and the log.
    pub fn describe(&self) -> String {
        match self {
            Verdict::Same => "what runs is what is selected and installed".into(),
            Verdict::OtherModel {
                expected,
                running,
                fallback,
            } => format!(
                "differs: {expected} is selected and installed, but modeld runs {running}{}",
                fallback.map_or(
                    " (modeld has not restarted since, or fell back without saying why)".into(),
                    |f| format!(" ({})", f.describe())
                )
            ),
            Verdict::OtherBytes {
                id,
                expected,
                running,
            } => format!(
                "differs: modeld runs {id} with artifact {}, the installed one is {} (a restart \
                 of modeld loads it)",
                short(running),
                short(expected)
            ),
            Verdict::Unknown { why } => format!("unknown: {why}"),
        }
    }
}

fn short(d: &Sha256Digest) -> String {
    d.to_hex()[..12].to_string()
}

/// Whether `running` is what `expected` says should run. A stale or unavailable receipt is
/// [`Verdict::Unknown`], never a difference. The bundled model's bytes are not compared (the
/// device has no digest for them). Pure.
pub fn running_vs_selected(expected: &Expected, running: &RunningModel) -> Verdict {
    let r = match running {
        RunningModel::Loaded(r) => r,
        RunningModel::Stale { why, .. } | RunningModel::Unavailable { why } => {
            return Verdict::Unknown { why: why.clone() };
        }
    };
    match expected {
        Expected::Bundled if r.bundled => Verdict::Same,
        Expected::Model { id, sha256 } if *id == r.model_id && !r.bundled => match sha256 {
            Some(want) if *want != r.artifact_sha256 => Verdict::OtherBytes {
                id: id.clone(),
                expected: *want,
                running: r.artifact_sha256,
            },
            _ => Verdict::Same,
        },
        _ => Verdict::OtherModel {
            expected: match expected {
                Expected::Bundled => "the bundled model".into(),
                Expected::Model { id, .. } => id.to_string(),
            },
            running: r.model_id.clone(),
            fallback: r.fallback,
        },
    }
}

/// What the device would have modeld load now (`resolve`'s answer and the digest its artifact
/// verified against).
pub fn expected(device: &Device) -> Result<Expected> {
    let (_, sel) = device.resolve()?;
    // The built-in by either name: ours (`rdf43`) or the contract's (`bundled-current`).
    let bundled = device.load_receipt.as_ref().map(|s| s.bundled);
    if crate::rules::contract::is_builtin_id(sel.id.as_str()) || bundled == Some(sel.id.as_str()) {
        return Ok(Expected::Bundled);
    }
    let sha256 = in_catalog(device, &sel.id, |e| device.expected_digest(e)).map(|d| d.sha256);
    Ok(Expected::Model { id: sel.id, sha256 })
}

// ---------------------------------------------------------------------------------------------
// A model that fails its first start

/// One artifact modeld could not start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadArtifact {
    pub id: ModelId,
    pub sha256: Sha256Digest,
    /// The receipt's reason (`selected-load-failed`).
    pub reason: String,
    /// Unix seconds it was marked.
    pub marked_unix: u64,
}

/// `<models>/.bad-artifacts.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadArtifacts {
    pub version: u32,
    pub artifacts: Vec<BadArtifact>,
}

impl BadArtifacts {
    /// The record for `id`'s artifact `sha256`, if it is condemned.
    pub fn find(&self, id: &ModelId, sha256: &Sha256Digest) -> Option<&BadArtifact> {
        self.artifacts
            .iter()
            .find(|b| b.id == *id && b.sha256 == *sha256)
    }
}

/// The artifact the daemon saw installed for the selection, and when (CLOCK_MONOTONIC ns):
/// only a load after that moment can speak of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenInstall {
    pub id: ModelId,
    pub sha256: Sha256Digest,
    pub since_mono_ns: u64,
}

/// When this manager installed an artifact: the boot (the kernel's `boot_id`) and
/// CLOCK_MONOTONIC then. A receipt of the same boot speaks of the artifact only when modeld
/// loaded after that moment; a receipt lives in `/dev/shm`, so one of a later boot always
/// loaded after. Kept in the verification cache while the file is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstallMoment {
    pub boot_id: String,
    pub mono_ns: u64,
}

impl InstallMoment {
    /// Now (`None` when the boot id cannot be read: then nothing is ever inferred from it).
    pub fn now() -> Option<Self> {
        Some(Self {
            boot_id: boot_id()?,
            mono_ns: monotonic_ns(),
        })
    }

    /// The CLOCK_MONOTONIC moment of this boot (`current_boot`) after which a load speaks of
    /// the artifact: the install's own moment in the same boot, the boot's start (0) after a
    /// reboot. Pure.
    pub fn since_mono_ns(&self, current_boot: &str) -> u64 {
        match self.boot_id == current_boot {
            true => self.mono_ns,
            false => 0,
        }
    }
}

/// The kernel's id of this boot.
pub fn boot_id() -> Option<String> {
    let b = crate::state::bounded::read_capped(Path::new("/proc/sys/kernel/random/boot_id"), 64)
        .ok()??;
    let id = String::from_utf8(b).ok()?.trim().to_string();
    (!id.is_empty()).then_some(id)
}

/// The one-shot runs' look at the receipt (`refresh`, where the daemon's watch may not have
/// run since the install): when modeld says the selected model failed to load, after this
/// manager installed the artifact the device would have it load (the moment is recorded at
/// the install, [`InstallMoment`]), and the catalog still lists those bytes, the artifact is
/// marked bad as the watch marks it ([`poison_decision`]). Nothing without a receipt rule, a
/// live receipt, or a recorded install. Returns what was marked.
pub fn notice_failed_start(device: &Device) -> Result<Option<(ModelId, Sha256Digest)>> {
    let Some(source) = device.load_receipt.as_ref() else {
        return Ok(None);
    };
    let running = read_on(device, source);
    let RunningModel::Loaded(r) = &running else {
        return Ok(None);
    };
    if !r.fallback.is_some_and(|f| f.is_selected_load_failed()) {
        return Ok(None);
    }
    let Ok(Expected::Model {
        id,
        sha256: Some(sha256),
    }) = expected(device)
    else {
        return Ok(None);
    };
    let (Some(moment), Some(boot)) = (device.install_moment(&id, &sha256), boot_id()) else {
        return Ok(None);
    };
    let seen = SeenInstall {
        since_mono_ns: moment.since_mono_ns(&boot),
        id,
        sha256,
    };
    mark_if_poisoned(device, source, &running, Some(&seen))
}

/// [`poison_decision`] against the catalog's bytes now, and [`mark_bad`] when it condemns:
/// what was newly marked.
fn mark_if_poisoned(
    device: &Device,
    source: &Source,
    running: &RunningModel,
    seen: Option<&SeenInstall>,
) -> Result<Option<(ModelId, Sha256Digest)>> {
    let catalog_sha =
        seen.and_then(|s| in_catalog(device, &s.id, manifest::ModelEntry::artifact_sha256));
    let Poison::Mark { id, sha256 } = poison_decision(running, seen, catalog_sha.as_ref()) else {
        return Ok(None);
    };
    let reason = source.rule.selected_load_failed;
    let marked = mark_bad(device, &id, &sha256, reason, manifest::UnixSeconds::now().0)?;
    Ok(marked.then_some((id, sha256)))
}

/// `id`'s entry in `device`'s catalog, through `f` (`None`: no catalog, or no such entry).
fn in_catalog<T>(
    device: &Device,
    id: &ModelId,
    f: impl FnOnce(&manifest::ModelEntry) -> Option<T>,
) -> Option<T> {
    device.catalog().ok().flatten()?.get(id).and_then(f)
}

/// [`poison_decision`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poison {
    /// Mark `sha256` of `id` bad.
    Mark { id: ModelId, sha256: Sha256Digest },
    /// Nothing to mark, and why.
    No(&'static str),
}

/// Whether the receipt `running` condemns the artifact `installed` (the selection's, as the
/// daemon saw it installed): modeld says the selected model failed to load
/// (`selected-load-failed`), it runs something else, it loaded after that artifact was
/// installed, and the artifact is still the one the catalog lists (`catalog_sha256`). Pure.
pub fn poison_decision(
    running: &RunningModel,
    installed: Option<&SeenInstall>,
    catalog_sha256: Option<&Sha256Digest>,
) -> Poison {
    let RunningModel::Loaded(r) = running else {
        return Poison::No("no live receipt");
    };
    if !r.fallback.is_some_and(|f| f.is_selected_load_failed()) {
        return Poison::No("modeld did not report that the selected model failed to load");
    }
    let Some(seen) = installed else {
        return Poison::No("no downloaded artifact is selected");
    };
    if !r.bundled && r.model_id == seen.id && r.artifact_sha256 == seen.sha256 {
        return Poison::No("modeld runs the selected artifact");
    }
    if r.loaded_mono_ns <= seen.since_mono_ns {
        return Poison::No("modeld loaded before the artifact was installed");
    }
    if catalog_sha256 != Some(&seen.sha256) {
        return Poison::No("the catalog lists other bytes for the selected model now");
    }
    Poison::Mark {
        id: seen.id.clone(),
        sha256: seen.sha256,
    }
}

/// Whether `id`'s artifact with the manifest's digest `sha256` may be downloaded: not when
/// that very digest is condemned (a changed digest is a new artifact, tried again). Pure.
pub fn download_allowed(
    bad: &BadArtifacts,
    id: &ModelId,
    sha256: Option<&Sha256Digest>,
) -> std::result::Result<(), String> {
    match sha256.and_then(|d| bad.find(id, d)) {
        None => Ok(()),
        Some(b) => Err(refused_text(b)),
    }
}

/// Why a condemned artifact is not downloaded or handed to modeld.
pub fn refused_text(b: &BadArtifact) -> String {
    format!(
        "{}'s artifact {} failed its first start on this device (modeld: {}); the bundled model \
         stays in use and the choice stays saved; it is not downloaded again until the catalog \
         publishes other bytes for {}",
        b.id,
        short(&b.sha256),
        b.reason,
        b.id
    )
}

/// The condemned artifacts on `device` (absent, or unreadable with a warning: none).
pub fn bad_artifacts(device: &Device) -> BadArtifacts {
    device
        .read_json_or_warn::<BadArtifacts>(BAD_ARTIFACTS_FILE, BAD_ARTIFACTS_LIMIT)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Record `id`'s `sha256` as condemned (atomic write; nothing when it already is).
pub fn mark_bad(
    device: &Device,
    id: &ModelId,
    sha256: &Sha256Digest,
    reason: &str,
    now_unix: u64,
) -> Result<bool> {
    let mut bad = bad_artifacts(device);
    if bad.find(id, sha256).is_some() {
        return Ok(false);
    }
    bad.version = 1;
    bad.artifacts.push(BadArtifact {
        id: id.clone(),
        sha256: *sha256,
        reason: reason.to_string(),
        marked_unix: now_unix,
    });
    device.write_json(BAD_ARTIFACTS_FILE, &bad)?;
    Ok(true)
}

/// Whether `entry`'s artifact, as the catalog lists it now, is condemned on `device`.
/// Nothing on a contract without a receipt (v25): nothing could have condemned it.
pub fn condemned(device: &Device, entry: &manifest::ModelEntry) -> Option<String> {
    device.load_receipt.as_ref()?;
    let bad = bad_artifacts(device);
    if bad.artifacts.is_empty() {
        return None;
    }
    download_allowed(&bad, entry.id(), entry.artifact_sha256().as_ref()).err()
}

/// CLOCK_MONOTONIC now, in nanoseconds (modeld's `loadedMonoNs` clock).
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// The daemon's look at what runs

/// The daemon's watch over the receipt: read every `republish_secs` (so a difference is logged
/// within that long), logged and shown in `ModelDownloadProgress` when it changes, and a
/// `selected-load-failed` on the artifact just installed marks it bad.
#[derive(Debug, Default)]
pub struct Watcher {
    next: Option<std::time::Instant>,
    last_line: Option<String>,
    last_shown: Option<(ModelId, Sha256Digest, Option<&'static str>)>,
    seen: Option<SeenInstall>,
    /// What the device would have modeld load, when it was last asked, and the receipt then.
    expected: Option<(Option<Expected>, std::time::Instant, RunningModel)>,
}

/// How often a device with trusted keys works out what it would have modeld load while the
/// receipt stays the same: `resolve` re-hashes the artifact there every time (the cache
/// decides nothing), so not at every look. Without keys it is a `stat` and is asked each look.
pub const PROTECTED_RECHECK: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether the watch asks `resolve` again: never asked, the receipt changed, the device has no
/// trusted keys (a cached `stat`), or [`PROTECTED_RECHECK`] has passed. Pure.
pub fn recheck_due(
    last: Option<(&RunningModel, std::time::Instant)>,
    running: &RunningModel,
    protected: bool,
    now: std::time::Instant,
) -> bool {
    match last {
        None => true,
        Some((before, at)) => {
            before != running || !protected || now.duration_since(at) >= PROTECTED_RECHECK
        }
    }
}

impl Watcher {
    /// One look if due (nothing on a contract without a receipt). `log` gets a line when what
    /// runs, or how it compares, changes; `say` the progress text when the running model does.
    pub fn tick(
        &mut self,
        device: &Device,
        now: std::time::Instant,
        log: &dyn Fn(&str),
        say: &dyn Fn(&crate::report::progress::Progress),
    ) {
        let Some(source) = device.load_receipt.as_ref() else {
            return;
        };
        if self.next.is_some_and(|n| now < n) {
            return;
        }
        self.next = Some(now + std::time::Duration::from_secs(source.rule.republish_secs));
        let running = read_on(device, source);
        let last = self.expected.as_ref().map(|(_, at, r)| (r, *at));
        if recheck_due(last, &running, device.is_protected(), now) {
            self.expected = Some((expected(device).ok(), now, running.clone()));
        }
        let expected = self.expected.as_ref().and_then(|(e, _, _)| e.clone());
        if let Some(Expected::Model {
            id,
            sha256: Some(sha256),
        }) = &expected
            && self
                .seen
                .as_ref()
                .is_none_or(|s| s.id != *id || s.sha256 != *sha256)
        {
            self.seen = Some(SeenInstall {
                id: id.clone(),
                sha256: *sha256,
                since_mono_ns: monotonic_ns(),
            });
        }
        match mark_if_poisoned(device, source, &running, self.seen.as_ref()) {
            Ok(Some((id, sha256))) => log(&format!(
                "modeld could not start {id}'s artifact {}: marked bad; the bundled model \
                 stays in use, the choice stays saved, and it is not downloaded again until \
                 the catalog publishes other bytes for {id}",
                sha256.to_hex()
            )),
            Ok(None) => {}
            Err(e) => log(&format!(
                "could not record {}'s artifact as bad: {}",
                self.seen
                    .as_ref()
                    .map_or("the selection", |s| s.id.as_str()),
                crate::error::one_line(&e.to_string())
            )),
        }
        // The UI's param first, then the log: whoever reads the log line finds the param
        // already saying what runs.
        if let RunningModel::Loaded(r) = &running {
            let shown = (
                r.model_id.clone(),
                r.artifact_sha256,
                r.fallback.map(|f| f.as_str()),
            );
            if self.last_shown.as_ref() != Some(&shown) {
                say(&crate::report::progress::Progress::Running {
                    id: shown.0.clone(),
                    variant: r.variant,
                    sha256: shown.1,
                    fallback: shown.2,
                });
                self.last_shown = Some(shown);
            }
        }
        let report = RunningReport::of(&running, expected.as_ref());
        let line = report.lines().join("; ");
        if self.last_line.as_deref() != Some(line.as_str()) {
            log(&line);
            self.last_line = Some(line);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What `status` shows

/// What runs, as `status` and `status --json` show it (`"running"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunningReport {
    /// `running` (a live modeld's receipt), `stale` (its process is gone) or `unavailable`.
    pub state: &'static str,
    pub id: Option<String>,
    pub variant: Option<&'static str>,
    pub artifact_sha256: Option<String>,
    pub fallback_reason: Option<&'static str>,
    pub pid: Option<u64>,
    /// Why the receipt is stale or unavailable.
    pub why: Option<String>,
    /// Whether what runs is what the device would have modeld load (`null`: cannot say).
    pub matches_selection: Option<bool>,
    /// The difference in words, when there is one.
    pub difference: Option<String>,
}

impl RunningReport {
    /// The report of `running` against `expected` (`None`: not known). Pure.
    pub fn of(running: &RunningModel, expected: Option<&Expected>) -> Self {
        let verdict = expected.map(|e| running_vs_selected(e, running));
        let (state, receipt, why) = match running {
            RunningModel::Loaded(r) => ("running", Some(r), None),
            RunningModel::Stale { receipt, why } => ("stale", Some(receipt), Some(why.clone())),
            RunningModel::Unavailable { why } => ("unavailable", None, Some(why.clone())),
        };
        RunningReport {
            state,
            id: receipt.map(|r| r.model_id.to_string()),
            variant: receipt.map(|r| r.variant),
            artifact_sha256: receipt.map(|r| r.artifact_sha256.to_hex()),
            fallback_reason: receipt.and_then(|r| r.fallback.map(|f| f.as_str())),
            pid: receipt.map(|r| r.pid),
            why,
            matches_selection: match &verdict {
                Some(Verdict::Unknown { .. }) | None => None,
                Some(v) => Some(!v.differs()),
            },
            difference: verdict.filter(Verdict::differs).map(|v| v.describe()),
        }
    }

    /// The lines `status` prints.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![match (&self.id, self.state) {
            (Some(id), state) => format!(
                "running: {id} ({} variant, sha256 {}), fallback: {}{}",
                self.variant.unwrap_or("?"),
                self.artifact_sha256.as_deref().unwrap_or("?"),
                self.fallback_reason.unwrap_or("none"),
                match state {
                    "stale" => format!(" [STALE: {}]", self.why.as_deref().unwrap_or("")),
                    _ => format!(", modeld pid {}", self.pid.unwrap_or(0)),
                }
            ),
            (None, _) => format!(
                "running: unavailable ({})",
                self.why.as_deref().unwrap_or("no receipt")
            ),
        }];
        if let Some(d) = &self.difference {
            out.push(format!("  {d}"));
        }
        out
    }
}

/// One condemned artifact, as `status` shows it (`"bad_artifacts"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadArtifactReport {
    pub id: String,
    pub sha256: String,
    pub reason: String,
    /// The catalog still lists these bytes for the model (so they are not downloaded); false
    /// once it lists other bytes (those are tried).
    pub current: bool,
    pub text: String,
}

/// `status`'s `running`: `None` on a contract without a receipt (v25: nothing shown).
pub fn running_report(device: &Device) -> Option<RunningReport> {
    let source = device.load_receipt.as_ref()?;
    let running = read_on(device, source);
    let expected = expected(device).ok();
    Some(RunningReport::of(&running, expected.as_ref()))
}

/// `status`'s `bad_artifacts`: each condemned artifact and whether the catalog still lists it.
pub fn bad_report(device: &Device, catalog: Option<&manifest::Manifest>) -> Vec<BadArtifactReport> {
    if device.load_receipt.is_none() {
        return Vec::new();
    }
    bad_artifacts(device)
        .artifacts
        .iter()
        .map(|b| {
            let current = catalog
                .and_then(|c| c.get(&b.id))
                .and_then(|e| e.artifact_sha256())
                == Some(b.sha256);
            BadArtifactReport {
                id: b.id.to_string(),
                sha256: b.sha256.to_hex(),
                reason: b.reason.clone(),
                current,
                text: match current {
                    true => refused_text(b),
                    false => format!(
                        "{}'s artifact {} failed its first start; the catalog lists other bytes \
                         now, which are tried",
                        b.id,
                        short(&b.sha256)
                    ),
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use manifest::contract::ContractName;
    use serde_json::json;

    fn rule() -> LoadReceiptRule {
        ContractName::V26.contract().load_receipt.unwrap()
    }

    const SHA: &str = "1111111111111111111111111111111111111111111111111111111111111111";
    const SHA2: &str = "2222222222222222222222222222222222222222222222222222222222222222";

    fn good() -> Value {
        json!({"version": 1, "pid": 4242, "processStartTicks": 777, "loadedMonoNs": 5_000_000_000u64,
               "modelId": "pop226", "variant": "small", "artifactSha256": SHA,
               "fallbackReason": null})
    }

    fn with(k: &str, v: Value) -> Vec<u8> {
        let mut g = good();
        g[k] = v;
        serde_json::to_vec(&g).unwrap()
    }

    fn p(bytes: &[u8]) -> std::result::Result<LoadReceipt, String> {
        parse(bytes, &rule(), "bundled-current")
    }

    #[test]
    fn parse_table() {
        let ok = p(&serde_json::to_vec(&good()).unwrap()).unwrap();
        assert_eq!(
            (
                ok.pid,
                ok.process_start_ticks,
                ok.model_id.as_str(),
                ok.variant
            ),
            (4242, 777, "pop226", "small")
        );
        assert!(!ok.bundled && ok.fallback.is_none());
        let b = p(&with("modelId", json!("bundled-current"))).unwrap();
        assert!(b.bundled);
        let f = p(&with("fallbackReason", json!("selected-load-failed"))).unwrap();
        assert!(f.fallback.unwrap().is_selected_load_failed());
        let s = p(&with("fallbackReason", json!("chestnut-run-stalled"))).unwrap();
        assert_eq!(s.fallback.unwrap().as_str(), "chestnut-run-stalled");
        assert!(!s.fallback.unwrap().is_selected_load_failed());
        assert_eq!(
            p(&with("variant", json!("chestnut"))).unwrap().variant,
            "chestnut"
        );
        // (bytes, a word the reason must hold)
        let mut missing = good();
        missing.as_object_mut().unwrap().remove("loadedMonoNs");
        let mut extra = good();
        extra["model"] = json!("x");
        let dup = br#"{"version":1,"version":1,"pid":1,"processStartTicks":1,"loadedMonoNs":1,"modelId":"a","variant":"small","artifactSha256":"1111111111111111111111111111111111111111111111111111111111111111","fallbackReason":null}"#;
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"".to_vec(), "not a JSON object"),
            (b"[1]".to_vec(), "not a JSON object"),
            (b"\xff".to_vec(), "UTF-8"),
            (b"{".to_vec(), "not a JSON object"),
            (serde_json::to_vec(&missing).unwrap(), "keys"),
            (serde_json::to_vec(&extra).unwrap(), "keys"),
            (dup.to_vec(), "twice"),
            (with("version", json!(2)), "version"),
            (with("version", json!(1.0)), "version"),
            (with("version", json!(true)), "version"),
            (with("version", json!("1")), "version"),
            (with("pid", json!(0)), "pid"),
            (with("pid", json!(-1)), "pid"),
            (with("pid", json!(true)), "pid"),
            (with("pid", json!(1.5)), "pid"),
            (with("processStartTicks", json!(null)), "processStartTicks"),
            (with("loadedMonoNs", json!("5")), "loadedMonoNs"),
            (with("modelId", json!("../etc")), "modelId"),
            (with("modelId", json!("")), "modelId"),
            (with("modelId", json!(7)), "modelId"),
            (with("variant", json!("amd")), "variant"),
            (with("variant", json!(null)), "variant"),
            (
                with("artifactSha256", json!(format!("AB{}", &SHA[2..]))),
                "artifactSha256",
            ),
            (with("artifactSha256", json!(&SHA[1..])), "artifactSha256"),
            (with("artifactSha256", json!(null)), "artifactSha256"),
            (
                with("fallbackReason", json!("invented-reason")),
                "fallbackReason",
            ),
            (with("fallbackReason", json!("")), "fallbackReason"),
            (with("fallbackReason", json!(false)), "fallbackReason"),
            (vec![b' '; 1025], "limit"),
        ];
        for (bytes, word) in cases {
            let e = p(&bytes)
                .err()
                .unwrap_or_else(|| panic!("accepted {:?}", String::from_utf8_lossy(&bytes)));
            assert!(
                e.contains(word),
                "{:?}: {e}",
                String::from_utf8_lossy(&bytes)
            );
        }
        // Padding within the limit is still a receipt.
        let mut padded = serde_json::to_vec(&good()).unwrap();
        padded.resize(1024, b' ');
        assert!(p(&padded).is_ok());
    }

    #[test]
    fn prefixes_as_modeld_takes_them() {
        let c = ContractName::V26.contract();
        for (prefix, ok) in [
            (None, true),
            (Some("d"), true),
            (Some("t3_x-Y"), true),
            (Some(""), false),
            (Some("../x"), false),
            (Some("a b"), false),
            (Some(&"x".repeat(32)[..]), true),
            (Some(&"x".repeat(33)[..]), false),
        ] {
            let s = Source::of(c, Some(Path::new("/r")), prefix).unwrap();
            assert_eq!(s.path.is_ok(), ok, "{prefix:?}");
        }
        let s = Source::of(c, None, None).unwrap();
        assert_eq!(
            s.path.unwrap(),
            Path::new("/dev/shm/starpilot_modeld_d/load-v1.json")
        );
        assert_eq!(
            Source::of(ContractName::V25.contract(), None, None),
            None,
            "v25 has no receipt"
        );
    }

    #[test]
    fn start_ticks_and_liveness() {
        let stat = b"4242 (model d) (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 19 20\n";
        assert_eq!(start_ticks_of(stat), Some(777));
        assert_eq!(start_ticks_of(b"4242 (x) S 1 2"), None);
        assert_eq!(start_ticks_of(b"no parenthesis"), None);
        let me = std::fs::read(format!("/proc/{}/stat", std::process::id())).unwrap();
        assert!(start_ticks_of(&me).is_some());
        let r = p(&serde_json::to_vec(&good()).unwrap()).unwrap();
        assert!(matches!(
            liveness(r.clone(), Some(777)),
            RunningModel::Loaded(_)
        ));
        assert!(
            matches!(liveness(r.clone(), Some(778)), RunningModel::Stale { why, .. } if why.contains("another process"))
        );
        assert!(
            matches!(liveness(r, None), RunningModel::Stale { why, .. } if why.contains("not running"))
        );
    }

    fn receipt(model: &str, sha: &str, reason: Option<&str>, loaded: u64) -> RunningModel {
        let mut g = good();
        g["modelId"] = json!(model);
        g["artifactSha256"] = json!(sha);
        g["fallbackReason"] = json!(reason);
        g["loadedMonoNs"] = json!(loaded);
        RunningModel::Loaded(p(&serde_json::to_vec(&g).unwrap()).unwrap())
    }

    fn id(s: &str) -> ModelId {
        s.parse().unwrap()
    }
    fn d(s: &str) -> Sha256Digest {
        s.parse().unwrap()
    }

    #[test]
    fn running_vs_selected_table() {
        let pop = |sha: Option<&str>| Expected::Model {
            id: id("pop226"),
            sha256: sha.map(d),
        };
        let slf = Some("selected-load-failed");
        let unavailable = RunningModel::Unavailable {
            why: "no receipt".into(),
        };
        let RunningModel::Loaded(r) = receipt("pop226", SHA, None, 9) else {
            panic!()
        };
        let stale = RunningModel::Stale {
            receipt: r,
            why: "gone".into(),
        };
        // (expected, running) -> differs, words
        let cases: Vec<(Expected, RunningModel, Option<bool>, &str)> = vec![
            (
                pop(Some(SHA)),
                receipt("pop226", SHA, None, 9),
                Some(false),
                "is selected",
            ),
            (
                pop(None),
                receipt("pop226", SHA, None, 9),
                Some(false),
                "is selected",
            ),
            (
                Expected::Bundled,
                receipt("bundled-current", SHA2, None, 9),
                Some(false),
                "is selected",
            ),
            (
                pop(Some(SHA)),
                receipt("bundled-current", SHA2, slf, 9),
                Some(true),
                "failed to load",
            ),
            (
                pop(Some(SHA)),
                receipt("other226", SHA, None, 9),
                Some(true),
                "not restarted",
            ),
            (
                pop(Some(SHA2)),
                receipt("pop226", SHA, None, 9),
                Some(true),
                "restart",
            ),
            (
                Expected::Bundled,
                receipt("pop226", SHA, None, 9),
                Some(true),
                "the bundled model is selected",
            ),
            (pop(Some(SHA)), unavailable, None, "no receipt"),
            (pop(Some(SHA)), stale, None, "gone"),
        ];
        for (e, r, differs, words) in cases {
            let v = running_vs_selected(&e, &r);
            match differs {
                Some(x) => assert_eq!(v.differs(), x, "{e:?} {r:?}"),
                None => assert!(matches!(v, Verdict::Unknown { .. })),
            }
            assert!(v.describe().contains(words), "{}", v.describe());
        }
    }

    #[test]
    fn poison_decision_table() {
        let seen = SeenInstall {
            id: id("pop226"),
            sha256: d(SHA),
            since_mono_ns: 100,
        };
        let slf = Some("selected-load-failed");
        let mark = Poison::Mark {
            id: id("pop226"),
            sha256: d(SHA),
        };
        let cases: Vec<(RunningModel, Option<&SeenInstall>, Option<&str>, Poison)> = vec![
            // The artifact just installed failed its first start: marked.
            (
                receipt("bundled-current", SHA2, slf, 200),
                Some(&seen),
                Some(SHA),
                mark.clone(),
            ),
            // A reason other than selected-load-failed.
            (
                receipt("bundled-current", SHA2, Some("chestnut-load-failed"), 200),
                Some(&seen),
                Some(SHA),
                Poison::No("modeld did not report that the selected model failed to load"),
            ),
            (
                receipt("bundled-current", SHA2, Some("chestnut-run-stalled"), 200),
                Some(&seen),
                Some(SHA),
                Poison::No("modeld did not report that the selected model failed to load"),
            ),
            (
                receipt("bundled-current", SHA2, None, 200),
                Some(&seen),
                Some(SHA),
                Poison::No("modeld did not report that the selected model failed to load"),
            ),
            // Another model's failure: the receipt is from before this artifact was installed.
            (
                receipt("bundled-current", SHA2, slf, 50),
                Some(&seen),
                Some(SHA),
                Poison::No("modeld loaded before the artifact was installed"),
            ),
            // Nothing downloaded is selected.
            (
                receipt("bundled-current", SHA2, slf, 200),
                None,
                Some(SHA),
                Poison::No("no downloaded artifact is selected"),
            ),
            // The manifest's digest changed meanwhile: not this artifact's verdict.
            (
                receipt("bundled-current", SHA2, slf, 200),
                Some(&seen),
                Some(SHA2),
                Poison::No("the catalog lists other bytes for the selected model now"),
            ),
            (
                RunningModel::Unavailable { why: "x".into() },
                Some(&seen),
                Some(SHA),
                Poison::No("no live receipt"),
            ),
        ];
        for (r, s, cat, want) in cases {
            let cat = cat.map(d);
            assert_eq!(poison_decision(&r, s, cat.as_ref()), want, "{r:?} {s:?}");
        }
        // A stale receipt never condemns anything.
        let RunningModel::Loaded(r) = receipt("bundled-current", SHA2, slf, 200) else {
            panic!()
        };
        assert_eq!(
            poison_decision(
                &RunningModel::Stale {
                    receipt: r,
                    why: "gone".into()
                },
                Some(&seen),
                Some(&d(SHA))
            ),
            Poison::No("no live receipt")
        );
    }

    #[test]
    fn recheck_table() {
        use std::time::{Duration, Instant};
        let t = Instant::now();
        let a = receipt("pop226", SHA, None, 9);
        let b = receipt("pop226", SHA2, None, 9);
        // (last, now's receipt, protected, elapsed) -> due
        for (last, now, protected, after, due) in [
            (None, &a, true, 0, true),
            (Some(&a), &a, false, 0, true),
            (Some(&a), &a, true, 5, false),
            (Some(&a), &b, true, 5, true),
            (Some(&a), &a, true, 60, true),
        ] {
            assert_eq!(
                recheck_due(
                    last.map(|r| (r, t)),
                    now,
                    protected,
                    t + Duration::from_secs(after)
                ),
                due,
                "{last:?} {protected} {after}"
            );
        }
    }

    #[test]
    fn hardware_table() {
        let rule = rule();
        let r = |model: &str, variant: &str| {
            let RunningModel::Loaded(mut r) = receipt(model, SHA, None, 9) else {
                panic!()
            };
            r.variant = if variant == "chestnut" {
                "chestnut"
            } else {
                "small"
            };
            r
        };
        // (receipt, catalog's GPU flag) -> agrees
        for (rec, gpu, ok) in [
            (r("pop226", "small"), Some(false), true),
            (r("pop226", "chestnut"), Some(false), false),
            (r("big226", "chestnut"), Some(true), true),
            (r("big226", "small"), Some(true), false),
            (r("bundled-current", "chestnut"), Some(false), true),
            (r("bundled-current", "small"), None, true),
            (r("gone226", "chestnut"), None, true),
        ] {
            assert_eq!(
                hardware_agrees(&rec, gpu, &rule).is_ok(),
                ok,
                "{rec:?} {gpu:?}"
            );
        }
    }

    /// A receipt's model is known as upstream's reader knows it: by the tree's reviewed
    /// catalog (`BY_ID`), not by the live manifest. An id the tree lacks is unavailable even
    /// when a manifest lists it; one the tree has gives the tree's GPU flag.
    #[test]
    fn tree_gpu_flag_table() {
        use manifest::contract::{ContractName, TreeCatalogRow, TreeDeclaration};
        let row = |id: &str, gpu: bool| TreeCatalogRow {
            id: id.parse().unwrap(),
            name: id.into(),
            version: "v16".parse().unwrap(),
            uses_external_gpu: gpu,
            model_lab_eligible: false,
        };
        let tree = TreeDeclaration {
            generation: manifest::Generation::new(26),
            contract: ContractName::V26,
            compiler_revision: "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf".parse().unwrap(),
            catalog: vec![row("pop226", false), row("big226", true)],
        };
        let r = |model: &str| {
            let RunningModel::Loaded(r) = receipt(model, SHA, None, 9) else {
                panic!()
            };
            r
        };
        // receipt's model -> the flag, or unavailable
        for (model, want) in [
            ("pop226", Ok(Some(false))),
            ("big226", Ok(Some(true))),
            ("bundled-current", Ok(None)),
            ("gone226", Err("gone226")),
        ] {
            match (tree_gpu_flag(&r(model), &tree), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{model}"),
                (Err(why), Err(named)) => {
                    assert!(why.contains(named) && why.contains("v26"), "{why}")
                }
                (got, want) => panic!("{model}: {got:?}, want {want:?}"),
            }
        }
    }

    /// A load of this boot speaks of an install of this boot only after it; after a reboot,
    /// of any earlier install.
    #[test]
    fn install_moment_table() {
        let m = InstallMoment {
            boot_id: "boot-a".into(),
            mono_ns: 5_000,
        };
        for (boot, since) in [("boot-a", 5_000), ("boot-b", 0)] {
            assert_eq!(m.since_mono_ns(boot), since, "{boot}");
        }
        let now = InstallMoment::now().expect("Linux has a boot id");
        assert_eq!(now.boot_id, boot_id().unwrap());
        assert!(now.mono_ns <= monotonic_ns());
    }

    #[test]
    fn download_allowed_table() {
        let bad = BadArtifacts {
            version: 1,
            artifacts: vec![BadArtifact {
                id: id("pop226"),
                sha256: d(SHA),
                reason: "selected-load-failed".into(),
                marked_unix: 1,
            }],
        };
        // (id, manifest digest) -> allowed
        for (m, sha, allowed) in [
            ("pop226", Some(SHA), false),
            // The manifest's digest for it changed: a new artifact, tried again.
            ("pop226", Some(SHA2), true),
            ("pop226", None, true),
            // Another model with the same bytes is another artifact on disk.
            ("other226", Some(SHA), true),
        ] {
            let r = download_allowed(&bad, &id(m), sha.map(d).as_ref());
            assert_eq!(r.is_ok(), allowed, "{m} {sha:?}");
            if let Err(why) = r {
                assert!(
                    why.contains("not downloaded again") && why.contains("111111111111"),
                    "{why}"
                );
            }
        }
        assert!(download_allowed(&BadArtifacts::default(), &id("pop226"), Some(&d(SHA))).is_ok());
    }
}
