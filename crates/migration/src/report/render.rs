//! The device's reports as the binary prints them: `status` (with the trust state and the
//! openpilot tree), `verify`, `resolve`, the paused `status` and the daemon's tree line here;
//! `refresh`, `download` and `gc` in [`command`]; their dry runs in [`dry_run`]. Each is a typed
//! document that serializes to the command's `--json` shape and renders its text as
//! [`Line`]s ([`Render`]). The binary builds one, then prints it.

use std::path::PathBuf;

use serde::Serialize;

use crate::error::Result;
use crate::report::{PendingCase, ResolveReport, StatusReport, VerifyReport};
use crate::state::effects::lock;
use crate::state::tree::{PausedStatus, TreeStatus};

pub mod command;
pub mod dry_run;

/// One line a command prints, in the order it prints them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// On stdout; not with `--json`.
    Out(String),
    /// On stderr, hidden by `-q` (`cli_support::info!`); not with `--json`.
    Note(String),
    /// On stderr as `warning: …`, with `--json` too (before the document).
    Warning(String),
}

/// A command's report: with `--json` its serialization on one line of stdout (after its
/// warnings), otherwise its [`Line`]s.
pub trait Render: Serialize {
    fn text(&self) -> Vec<Line>;
}

/// `lines` on stdout, then `notes` on stderr.
pub(crate) fn out_then_notes(
    lines: impl IntoIterator<Item = String>,
    notes: impl IntoIterator<Item = String>,
) -> Vec<Line> {
    let out = lines.into_iter().map(Line::Out);
    out.chain(notes.into_iter().map(Line::Note)).collect()
}
use crate::state::trust_state::{self, AcceptedRelease, FloorSource, RefusedManifest};
pub use crate::state::trust_state::{CopyStates, FloorCopies};
use crate::{Device, VerifyState};
use crate::{Phase, Progress, state::params};

/// A verification state as `status` and `verify` print it.
pub fn state_text(s: VerifyState) -> &'static str {
    match s {
        VerifyState::Outdated => "outdated (verified copy of an earlier publish; in use)",
        other => dry_run::state_name(other),
    }
}

/// `tree: …` as `status` and the daemon's log say it.
pub fn tree_line(t: &TreeStatus) -> String {
    format!(
        "tree: {} runs tinygrad {} ({})",
        t.openpilot_dir.display(),
        t.tinygrad_commit
            .as_ref()
            .map_or("unreadable".to_string(), |c| c.to_string()),
        match (t.generation, t.state) {
            (Some(g), _) => format!("{g}'s pin"),
            (None, "unknown") => "no known generation's pin: paused".to_string(),
            (None, _) => "paused".to_string(),
        }
    )
}

/// The `trust` object of `status --json`: whether manifests must be signed, by which keys, the
/// accepted release (the rollback floor) and the last refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrustReport {
    pub protected: bool,
    pub keys_file: Option<PathBuf>,
    /// The keys' names.
    pub keys: Vec<String>,
    pub accepted_release: Option<AcceptedRelease>,
    /// With keys only: where the accepted release comes from.
    #[serde(flatten)]
    pub floor: Option<FloorCopies>,
    /// With keys only.
    pub last_refusal: Option<RefusedManifest>,
}

impl TrustReport {
    /// The device's trust state (its trusted keys are the downloader's).
    pub fn of(device: &Device) -> Result<Self> {
        let (accepted_release, floor) = trust_state::floor_report(device);
        // The last refusal report; a corrupt or unreadable one is read as absent with a warning
        // (it is a report, not the floor).
        let refused: Option<RefusedManifest> = device.read_json_or_warn(
            trust_state::REFUSED_MANIFEST_FILE,
            crate::state::bounded::JOURNAL_LIMIT,
        )?;
        let keys = device.trusted_keys.as_ref();
        let names = keys
            .iter()
            .flat_map(|k| k.keys())
            .map(|k| k.name().to_string());
        Ok(TrustReport {
            protected: keys.is_some(),
            keys_file: keys.map(|k| k.path().to_path_buf()),
            keys: names.collect(),
            accepted_release,
            floor: keys.map(|_| floor),
            last_refusal: refused.filter(|_| keys.is_some()),
        })
    }

    /// The human lines of `status` for the trust state.
    pub fn lines(&self) -> Vec<String> {
        let (Some(keys_file), Some(floor)) = (&self.keys_file, &self.floor) else {
            return vec![
                "manifest trust: UNPROTECTED (no --trusted-keys): any manifest the stores serve \
                 is installed"
                    .to_string(),
            ];
        };
        let mut lines = vec![format!(
            "manifest trust: signed manifests only ({} key(s) from {}); only artifacts whose \
             SHA-256, size and chunk count the signature covers are installed",
            self.keys.len(),
            keys_file.display()
        )];
        let (file, param) = (
            trust_state::ACCEPTED_RELEASE_FILE,
            params::keys::MODEL_MANIFEST_ACCEPTED_RELEASE,
        );
        let copies = &floor.accepted_release_copies;
        let from = match floor.accepted_release_source {
            FloorSource::Both => format!("from {file} and the param {param} (they agree)"),
            FloorSource::File => format!("from {file} (the param {param}: {})", copies.param),
            FloorSource::Param => format!("from the param {param} ({file}: {})", copies.file),
            FloorSource::None => String::new(),
        };
        lines.push(
            match (&self.accepted_release, &floor.accepted_release_problem) {
                (Some(a), _) => format!(
                    "  accepted release: {} (signed by {}, expires {}) {from}",
                    a.release, a.key, a.expires.0
                ),
                (None, Some(p)) => format!("  accepted release: UNKNOWN: {p}"),
                (None, None) => "  accepted release: none yet".to_string(),
            },
        );
        if let Some(r) = &self.last_refusal {
            lines.push(format!(
                "  last refusal ({} at {}): {}",
                r.generation, r.at.0, r.text
            ));
            lines.extend(r.reasons.iter().map(|reason| format!("    {reason}")));
        }
        lines
    }
}

/// The manager holding the lock, and what the UI's memory params say it is doing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AnotherManager {
    pub pid: u32,
    /// The UI request pending or being served: a model id, or `all` (`DownloadAllModels`).
    pub request: Option<String>,
    /// `ModelDownloadProgress` as the UI shows it (e.g. `42%`).
    pub progress: Option<String>,
}

impl AnotherManager {
    /// The manager holding `device`'s lock, if any (`crate::run::lock::holder`), with its request
    /// and progress read from the memory params (nothing read counts as none).
    pub fn of(device: &Device) -> Option<Self> {
        let pid = crate::run::lock::holder(&device.models_dir())?;
        let value = |key| match device.memory.read(key) {
            crate::state::params::ParamRead::Value(v) => Some(v.trim().to_string()),
            _ => None,
        };
        let request = match device.memory.get_bool(params::keys::DOWNLOAD_ALL_MODELS) {
            Ok(true) => Some("all".to_string()),
            _ => value(params::keys::MODEL_TO_DOWNLOAD),
        };
        Some(AnotherManager {
            pid,
            request,
            progress: value(params::keys::MODEL_DOWNLOAD_PROGRESS),
        })
    }
}

impl StatusReport {
    /// The lines `status` prints on stdout.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![
            format!("generation: {}", self.generation),
            tree_line(&self.tree),
            format!(
                "manifest version: {}",
                self.manifest_version.as_deref().unwrap_or("none")
            ),
            format!(
                "selected: {} ({} {})",
                self.selected.id, self.selected.name, self.selected.version
            ),
            format!("resolves to: {}", self.resolved.display()),
        ];
        if let Some(run) = &self.running {
            lines.extend(run.lines());
        }
        lines.extend(catalog_lines(self));
        lines.push(format!(
            "free space: {}",
            self.free_bytes
                .map_or("unknown".into(), cli_support::progress::bytes)
        ));
        lines.extend(fallback_lines(self));
        lines.extend(self.under_way_lines());
        lines.extend(fetched_today_lines(self));
        lines.extend(self.unreadable.iter().map(|p| format!("unreadable: {p}")));
        lines.extend(self.trust.lines());
        lines
    }

    /// An interrupted migration, the manager holding the lock and its request, and the
    /// staged downloads (under way while it holds the lock, interrupted otherwise).
    fn under_way_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(j) = &self.interrupted_migration {
            lines.push(format!(
                "interrupted migration: {} -> {} at the {} phase",
                j.from.as_deref().unwrap_or("none"),
                j.to,
                match j.phase {
                    Phase::Purge => "purge",
                    Phase::Download => "download",
                }
            ));
        }
        if let Some(m) = &self.another_manager {
            lines.push(format!(
                "manager running: pid {} holds the lock (the daemon, or a refresh or download)",
                m.pid
            ));
            if let Some(request) = &m.request {
                lines.push(format!(
                    "downloading now: {request} (the UI's request){}",
                    m.progress
                        .as_ref()
                        .map_or(String::new(), |p| format!(", progress: {p}"))
                ));
            }
        }
        for d in &self.interrupted_downloads {
            let staged = format!(
                "{} ({}), {} of {} staged",
                d.id.as_deref().unwrap_or("not in the catalog"),
                d.file,
                cli_support::progress::bytes(d.done_bytes),
                cli_support::progress::bytes(d.size),
            );
            lines.push(match (&self.another_manager, d.current) {
                (Some(_), _) => format!("downloading now: {staged}"),
                (None, true) => {
                    format!("interrupted download: {staged}; the next download of it resumes there")
                }
                (None, false) => format!(
                    "interrupted download: {staged}; not the catalog's bytes now, a download \
                     starts over"
                ),
            });
        }
        lines
    }
}

/// The catalog's state, and its models: bad artifacts, entries this device cannot install,
/// installed ones, and those waiting for a Chestnut.
fn catalog_lines(r: &StatusReport) -> Vec<String> {
    let mut lines = vec![match (r.catalog_models, &r.catalog_problem) {
        (Some(n), _) => format!("catalog: {n} models"),
        (None, Some(p)) => format!("catalog: NOT USED: {p}"),
        (None, None) => "catalog: none yet".to_string(),
    }];
    for b in &r.bad_artifacts {
        lines.push(format!("  bad artifact: {}", b.text));
    }
    for n in &r.not_installable {
        lines.push(format!("  {} ({}): {}", n.id, n.file, n.reason));
    }
    for m in &r.installed {
        lines.push(format!("  {} {}", m.id, state_text(m.state)));
    }
    for w in &r.waiting_for_chestnut {
        let slot = match w.slot {
            "big_profile" => "big profile",
            other => other,
        };
        lines.push(format!("  {} ({slot}): {}", w.id, w.reason));
    }
    lines
}

/// The models retried with a backoff, and those dropped for good.
fn fallback_lines(r: &StatusReport) -> Vec<String> {
    let Some(fb) = &r.fallback else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    for p in &fb.pending {
        let case = match p.case {
            PendingCase::Temporary => "waiting for",
            PendingCase::Update => "update pending for",
        };
        lines.push(format!(
            "{case} {}: {} failed attempt(s), next retry at unix {} ({})",
            p.id, p.failures, p.next_retry, p.reason
        ));
    }
    if !fb.dropped.is_empty() {
        lines.push(format!(
            "dropped for good (not in the catalog): {}",
            fb.dropped.join(", ")
        ));
    }
    lines
}

/// What each artifact fetched today of its daily budget (or why that is unknown).
fn fetched_today_lines(r: &StatusReport) -> Vec<String> {
    let today = &r.fetched_today;
    let unknown = today.unknown.iter().map(|why| {
        format!("fetched today: unknown ({why}); counted afresh from the next download")
    });
    let artifacts = today.artifacts.iter().map(|a| {
        format!(
            "fetched today: {} {} of its daily {}{}",
            a.artifact,
            cli_support::progress::bytes(a.bytes),
            cli_support::progress::bytes(a.budget),
            if a.held_back {
                "; the automatic refresh fetches it again tomorrow (UTC), a request from the UI \
                 now"
            } else {
                ""
            }
        )
    });
    unknown.chain(artifacts).collect()
}

impl StatusReport {
    /// The `next:` hint `status` adds on stderr, if any.
    pub fn next(&self) -> Option<String> {
        let hint = self.next_alone()?;
        Some(match self.another_manager.as_ref().map(|m| m.pid) {
            // Every command that changes the device would exit 3 (busy) meanwhile.
            Some(pid) => format!(
                "the manager running as pid {pid} holds the lock and does this itself (`status` \
                 again follows it; its log says what it does); `refresh`, `download` and `gc` \
                 exit 3 while it runs"
            ),
            None => hint,
        })
    }

    /// The hint when no other manager runs.
    fn next_alone(&self) -> Option<String> {
        if self.interrupted_migration.is_some() {
            Some("`refresh` finishes the interrupted migration".into())
        } else if self.catalog_models.is_none() {
            Some(format!(
                "`refresh` (online) fetches the {} catalog",
                self.generation
            ))
        } else if self
            .installed
            .iter()
            .any(|m| m.state == VerifyState::Corrupt)
        {
            Some(
                "`download <ID>` replaces a corrupt model; `resolve` never hands one to modeld"
                    .into(),
            )
        } else {
            self.interrupted_downloads
                .iter()
                .find(|d| d.current)
                .and_then(|d| d.id.as_deref())
                .map(|id| {
                    format!(
                        "`download {id}` resumes the interrupted download (so does the next \
                         `refresh` when it wants it)"
                    )
                })
        }
    }
}

impl Render for StatusReport {
    fn text(&self) -> Vec<Line> {
        out_then_notes(self.lines(), self.next().map(|n| format!("next: {n}")))
    }
}

/// `status` while paused (its `--json` is the [`PausedStatus`]).
impl Render for PausedStatus {
    fn text(&self) -> Vec<Line> {
        let lines = [
            "generation: none (paused)".to_string(),
            tree_line(&self.tree),
            format!("resolves to: {}", self.resolved.display()),
            format!(
                "problem: {}",
                self.tree.problem.as_deref().unwrap_or_default()
            ),
        ];
        let next = self.tree.next.as_ref().map(|n| format!("next: {n}"));
        out_then_notes(lines, next)
    }
}

impl VerifyReport {
    /// How `verify` ends once the report is printed: exit 6 unless every model verified.
    pub fn failure(&self) -> Option<cli_support::Failure> {
        let code = crate::rules::next_step::code::NOT_VERIFIED;
        (!self.all_verified()).then(|| {
            crate::rules::next_step::failure(
                code,
                "some models are missing or do not match the catalog; run `download <ID>` for \
                 each one not listed as verified",
            )
        })
    }

    /// One `<id> <state>` line per model.
    pub fn lines(&self) -> Vec<String> {
        (self.models.iter())
            .map(|m| format!("{} {}", m.id, state_text(m.state)))
            .collect()
    }

    /// How `verify` ends once the report is printed (`json`: with `--json`, whose report
    /// already says what failed).
    pub fn outcome(&self, json: bool) -> std::result::Result<(), cli_support::Failure> {
        match self.failure() {
            Some(f) if json => Err(f.after_json_report()),
            Some(f) => Err(f),
            None => Ok(()),
        }
    }
}

impl Render for VerifyReport {
    fn text(&self) -> Vec<Line> {
        let none = self.models.is_empty();
        let note = none.then(|| "no installed models to verify".to_string());
        out_then_notes(self.lines(), note)
    }
}

/// The line `resolve` prints on stdout: the path, or with `--json` the report.
pub fn resolve_line(r: &ResolveReport, json: bool) -> String {
    match json {
        true => serde_json::to_string(r).expect("a resolve report serializes"),
        false => r.path.display().to_string(),
    }
}

/// `resolve`: why the built-in is answered (a warning, with `--json` too), what it is, and the
/// path as the last line of stdout.
impl Render for ResolveReport {
    fn text(&self) -> Vec<Line> {
        let doubt = self.doubt.iter();
        let warning = doubt.map(|d| Line::Warning(format!("answering the built-in model: {d}")));
        let mut lines: Vec<Line> = warning.collect();
        lines.push(Line::Note(format!(
            "model: {} ({} {})",
            self.model.id, self.model.name, self.model.version
        )));
        lines.push(Line::Out(resolve_line(self, false)));
        lines
    }
}

/// Typed progress as the device binary shows it on stderr. On a terminal a download is one
/// indicatif bar, `LABEL [====>   ] DONE/TOTAL RATE eta ETA`, as wide as the terminal and
/// redrawn in place ([`StderrProgress`] draws it; this view only drops the percentages that
/// would go backwards); elsewhere (logs, pipes) every tenth percent gets a line `LABEL N%`
/// (`-v`: every percent). Other progress always gets a line of its own; `-q` shows nothing.
/// Parallel workers report out of order: a percentage at or below the highest shown for the
/// label is dropped.
#[derive(Debug)]
pub struct ProgressView {
    tty: bool,
    verbosity: cli_support::Verbosity,
    label: String,
    highest: Option<u64>,
    last_logged: Option<u64>,
}

impl ProgressView {
    pub fn new(tty: bool, verbosity: cli_support::Verbosity) -> Self {
        ProgressView {
            tty,
            verbosity,
            label: String::new(),
            highest: None,
            last_logged: None,
        }
    }

    /// What the following percentages are about, e.g. `pop223`.
    pub fn label(&mut self, label: &str) {
        self.label = label.to_string();
        self.highest = None;
        self.last_logged = None;
    }

    /// Whether the bar is drawn at all: on a terminal, unless `-q`.
    pub fn draws_bar(&self) -> bool {
        self.tty && self.verbosity != cli_support::Verbosity::Quiet
    }

    /// Whether `pct` moves the label's progress forward (and records it).
    fn advance(&mut self, pct: u64) -> bool {
        if self.highest.is_some_and(|h| pct <= h) {
            return false;
        }
        self.highest = Some(pct);
        true
    }

    /// What to write to stderr for `p` as text (empty: nothing; on a terminal a percentage is
    /// the bar's, never text).
    pub fn render(&mut self, p: &Progress) -> String {
        use cli_support::Verbosity;
        if self.verbosity == Verbosity::Quiet {
            return String::new();
        }
        let t = match p {
            Progress::Percent(t) | Progress::PercentOf(_, t) => t,
            _ => return format!("{p}\n"),
        };
        let pct = t.percent();
        if !self.advance(pct) || self.tty {
            return String::new();
        }
        let every = self.verbosity == Verbosity::Verbose;
        if every || self.last_logged.is_none_or(|l| pct / 10 > l / 10) {
            self.last_logged = Some(pct);
            return format!("{} {pct}%\n", self.label);
        }
        String::new()
    }
}

/// A [`ProgressView`] that the download's workers share, writing to stderr; on a terminal it
/// owns the indicatif bar of the label's download.
#[derive(Debug)]
pub struct StderrProgress(std::sync::Mutex<Shared>);

/// What the workers share: the view, the bar drawn now, the last text line (not repeated).
#[derive(Debug)]
struct Shared {
    view: ProgressView,
    bar: Option<indicatif::ProgressBar>,
    last_text: Option<String>,
}

impl StderrProgress {
    /// `tty`: stderr is a terminal. The verbosity is the run's (`cli_support::verbosity`).
    pub fn new(tty: bool) -> Self {
        let view = ProgressView::new(tty, cli_support::verbosity());
        StderrProgress(std::sync::Mutex::new(Shared {
            view,
            bar: None,
            last_text: None,
        }))
    }

    /// What the following percentages are about, e.g. `pop223` (ends a drawn bar).
    pub fn label(&self, label: &str) {
        let mut s = lock(&self.0);
        end_bar(&mut s.bar);
        s.view.label(label);
    }

    pub fn say(&self, p: &Progress) {
        let mut s = lock(&self.0);
        let Shared {
            view,
            bar,
            last_text,
        } = &mut *s;
        if !view.draws_bar() {
            eprint!("{}", view.render(p));
            return;
        }
        match p {
            Progress::Percent(t) | Progress::PercentOf(_, t) => {
                if !view.advance(t.percent()) {
                    return;
                }
                match bar {
                    Some(b) => {
                        b.set_length(t.total);
                        b.set_position(t.done);
                    }
                    None => *bar = Some(new_bar(&view.label, *t)),
                }
            }
            text => {
                // The same text twice in a row (a request's end said by the download and by
                // the request) is shown once.
                let shown = text.to_string();
                if last_text.as_deref() == Some(shown.as_str()) {
                    return;
                }
                *last_text = Some(shown);
                // The bar stays as it last was; the text goes on the next line.
                end_bar(bar);
                // What the next percentages are about, when the text says it.
                match text {
                    Progress::Downloading(name) => view.label(name.as_str()),
                    Progress::DownloadingSelected(id) => view.label(id.as_str()),
                    _ => {}
                }
                eprintln!("{text}");
            }
        }
    }

    /// A line of its own among the progress (above a drawn bar, which stays).
    pub fn line(&self, text: impl std::fmt::Display) {
        let s = lock(&self.0);
        if s.view.verbosity == cli_support::Verbosity::Quiet {
            return;
        }
        match &s.bar {
            Some(bar) => bar.suspend(|| eprintln!("{text}")),
            None => eprintln!("{text}"),
        }
    }

    /// End a drawn bar, leaving it as it last was.
    pub fn finish(&self) {
        end_bar(&mut lock(&self.0).bar);
    }
}

/// Leave the drawn bar as it last was (`abandon`: indicatif's `finish` would fill it, so a
/// failed download would claim all its bytes) and end its line (indicatif leaves the cursor at
/// the right edge; without the newline the next text would wrap onto the bar's line).
fn end_bar(bar: &mut Option<indicatif::ProgressBar>) {
    if let Some(b) = bar.take() {
        b.abandon();
        eprintln!();
    }
}

/// The bar of one download on stderr ([`cli_support::progress::WIDE_BYTES_TEMPLATE`]), from
/// `t` on: a resumed download starts part-way, and its rate counts only what this run moves.
fn new_bar(label: &str, t: crate::Transferred) -> indicatif::ProgressBar {
    use cli_support::progress::{BAR_CHARS, WIDE_BYTES_TEMPLATE};
    let style = indicatif::ProgressStyle::with_template(WIDE_BYTES_TEMPLATE)
        .expect("the template parses (cli_support's tests)")
        .progress_chars(BAR_CHARS);
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(t.total),
        indicatif::ProgressDrawTarget::stderr_with_hz(10),
    )
    .with_style(style)
    .with_message(label.to_string())
    .with_position(t.done);
    bar.reset_eta();
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::InstalledModel;
    use manifest::signature::{ReleaseNumber, UnixSeconds};

    fn release(n: u64) -> AcceptedRelease {
        AcceptedRelease {
            release: ReleaseNumber::try_from(n).unwrap(),
            expires: UnixSeconds(1_900_000_000),
            key: "starpilot-2026".into(),
        }
    }

    fn keyed(source: FloorSource, accepted: Option<AcceptedRelease>) -> TrustReport {
        TrustReport {
            protected: true,
            keys_file: Some("/data/params/starpilot_keys.pub".into()),
            keys: vec!["a".into(), "b".into()],
            accepted_release: accepted,
            floor: Some(FloorCopies {
                accepted_release_source: source,
                accepted_release_copies: CopyStates {
                    file: "valid".into(),
                    param: "corrupt: eof".into(),
                },
                accepted_release_problem: None,
            }),
            last_refusal: None,
        }
    }

    /// The `trust` object keeps its two shapes, key for key in this order.
    #[test]
    fn trust_documents_keep_their_shapes() {
        let bare = TrustReport {
            protected: false,
            keys_file: None,
            keys: Vec::new(),
            accepted_release: None,
            floor: None,
            last_refusal: None,
        };
        assert_eq!(
            serde_json::to_string(&bare).unwrap(),
            r#"{"protected":false,"keys_file":null,"keys":[],"accepted_release":null,"last_refusal":null}"#
        );
        assert_eq!(
            bare.lines(),
            [
                "manifest trust: UNPROTECTED (no --trusted-keys): any manifest the stores serve is installed"
            ]
        );
        let mut t = keyed(FloorSource::File, Some(release(3)));
        t.last_refusal = Some(RefusedManifest {
            generation: "v26".into(),
            at: UnixSeconds(1_800_000_000),
            text: "Model list refused: not signed".into(),
            reasons: vec!["hf: not signed".into(), "github: not signed".into()],
        });
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            r#"{"protected":true,"keys_file":"/data/params/starpilot_keys.pub","keys":["a","b"],"accepted_release":{"release":3,"expires":1900000000,"key":"starpilot-2026"},"accepted_release_source":"file","accepted_release_copies":{"file":"valid","param":"corrupt: eof"},"accepted_release_problem":null,"last_refusal":{"generation":"v26","at":1800000000,"text":"Model list refused: not signed","reasons":["hf: not signed","github: not signed"]}}"#
        );
        assert_eq!(
            t.lines(),
            [
                "manifest trust: signed manifests only (2 key(s) from /data/params/starpilot_keys.pub); only artifacts whose SHA-256, size and chunk count the signature covers are installed",
                "  accepted release: 3 (signed by starpilot-2026, expires 1900000000) from .accepted-release.json (the param ModelManifestAcceptedRelease: corrupt: eof)",
                "  last refusal (v26 at 1800000000): Model list refused: not signed",
                "    hf: not signed",
                "    github: not signed",
            ]
        );
    }

    /// Where the accepted release comes from, each case its line.
    #[test]
    fn accepted_release_lines() {
        let line = |t: TrustReport| t.lines()[1].clone();
        assert!(line(keyed(FloorSource::Both, Some(release(1)))).ends_with(
            "from .accepted-release.json and the param ModelManifestAcceptedRelease (they agree)"
        ));
        assert!(line(keyed(FloorSource::Param, Some(release(1)))).ends_with(
            "from the param ModelManifestAcceptedRelease (.accepted-release.json: valid)"
        ));
        assert!(line(keyed(FloorSource::None, Some(release(1)))).ends_with("expires 1900000000) "));
        assert_eq!(
            line(keyed(FloorSource::None, None)),
            "  accepted release: none yet"
        );
        let mut t = keyed(FloorSource::None, None);
        t.floor.as_mut().unwrap().accepted_release_problem = Some("both unreadable".into());
        assert_eq!(line(t), "  accepted release: UNKNOWN: both unreadable");
    }

    #[test]
    fn verify_documents() {
        let report = VerifyReport {
            dry_run: false,
            models: vec![
                InstalledModel {
                    id: "pop223".into(),
                    state: VerifyState::Verified,
                    digest_source: Some("manifest"),
                },
                InstalledModel {
                    id: "wd40".into(),
                    state: VerifyState::Outdated,
                    digest_source: None,
                },
            ],
        };
        let doc = |dry_run| VerifyReport {
            dry_run,
            ..report.clone()
        };
        let models = r#"[{"id":"pop223","state":"verified","digest_source":"manifest"},{"id":"wd40","state":"outdated","digest_source":null}]"#;
        assert_eq!(
            serde_json::to_string(&doc(false)).unwrap(),
            format!(r#"{{"models":{models}}}"#)
        );
        assert_eq!(
            serde_json::to_string(&doc(true)).unwrap(),
            format!(r#"{{"dry_run":true,"models":{models}}}"#)
        );
        let failure = doc(true)
            .failure()
            .expect("an outdated copy is not verified");
        assert_eq!((failure.code, failure.kind), (6, "not_verified"));
        assert!(failure.message.starts_with("some models are missing"));
        let mut verified = doc(false);
        verified.models.truncate(1);
        assert_eq!(verified.failure(), None);
        assert_eq!(
            doc(false).lines(),
            [
                "pop223 verified",
                "wd40 outdated (verified copy of an earlier publish; in use)"
            ]
        );
    }

    /// `resolve`: the doubt as a warning (printed with `--json` too), then what it is, then
    /// the path as the last line of stdout.
    #[test]
    fn resolve_prints_its_doubt_first_and_the_path_last() {
        let mut r = ResolveReport {
            path: "/op/selfdrive/modeld/models/driving_tinygrad.pkl".into(),
            model: manifest::NamedModel {
                id: "rdf43".into(),
                name: "RDF V4".into(),
                version: "v15".into(),
            },
            builtin: true,
            doubt: None,
        };
        let path = Line::Out("/op/selfdrive/modeld/models/driving_tinygrad.pkl".into());
        let model = Line::Note("model: rdf43 (RDF V4 v15)".into());
        assert_eq!(r.text(), [model.clone(), path.clone()]);
        r.doubt = Some("param Model read as unset".into());
        let warning =
            Line::Warning("answering the built-in model: param Model read as unset".into());
        assert_eq!(r.text(), [warning, model, path]);
    }

    fn view(tty: bool, verbosity: cli_support::Verbosity) -> ProgressView {
        let mut v = ProgressView::new(tty, verbosity);
        v.label("pop223");
        v
    }

    fn pct(p: u64) -> Progress {
        Progress::Percent(crate::Transferred {
            done: p * 1024,
            total: 100 * 1024,
        })
    }

    /// The rendering of each progress in turn.
    fn shown(v: &mut ProgressView, ps: &[Progress]) -> Vec<String> {
        ps.iter().map(|p| v.render(p)).collect()
    }

    #[test]
    fn logs_get_a_line_per_tenth_and_never_go_backwards() {
        let mut v = view(false, cli_support::Verbosity::Normal);
        let ps = [
            pct(0),
            pct(3),
            pct(12),
            pct(9),
            pct(13),
            pct(25),
            pct(100),
            Progress::Downloaded,
        ];
        let out: Vec<String> = shown(&mut v, &ps)
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
        assert_eq!(
            out,
            [
                "pop223 0%\n",
                "pop223 12%\n",
                "pop223 25%\n",
                "pop223 100%\n",
                "Downloaded!\n"
            ]
        );
        // A new label starts over.
        v.label("other");
        assert_eq!(shown(&mut v, &[pct(5)]), ["other 5%\n"]);
    }

    #[test]
    fn quiet_shows_no_progress_and_verbose_logs_every_percentage() {
        let ps = [
            pct(0),
            pct(3),
            pct(12),
            pct(9),
            pct(13),
            Progress::Downloaded,
        ];
        for tty in [false, true] {
            let mut q = view(tty, cli_support::Verbosity::Quiet);
            assert!(shown(&mut q, &ps).iter().all(String::is_empty), "tty {tty}");
        }
        let mut v = view(false, cli_support::Verbosity::Verbose);
        assert_eq!(
            shown(&mut v, &ps),
            [
                "pop223 0%\n",
                "pop223 3%\n",
                "pop223 12%\n",
                "",
                "pop223 13%\n",
                "Downloaded!\n"
            ],
            "every new percentage, still never backwards"
        );
    }

    /// On a terminal a percentage is never text (the indicatif bar draws it, see
    /// `StderrProgress`; the tmux test watches it at 80 columns), other progress is a line, and
    /// a finished transfer says size, time, origin and rate.
    #[test]
    fn a_terminal_gets_text_only_for_what_is_not_a_percentage() {
        let mut v = view(true, cli_support::Verbosity::Normal);
        assert!(v.draws_bar());
        assert_eq!(shown(&mut v, &[pct(5), pct(50)]), ["", ""]);
        let fetched = Progress::Fetched(crate::report::progress::Fetched {
            what: "pop223".into(),
            size: 12 << 20,
            moved: 12 << 20,
            took: std::time::Duration::from_secs(4),
            origin: "GitHub".into(),
            after: vec!["Hugging Face".into()],
        });
        assert_eq!(
            shown(&mut v, &[Progress::Verifying, fetched]),
            [
                "Verifying authenticity...\n",
                "downloaded pop223: 12.00 MiB in 4.0 s from GitHub (3.00 MiB/s), after Hugging Face failed\n"
            ]
        );
        assert!(!view(true, cli_support::Verbosity::Quiet).draws_bar());
        assert!(!view(false, cli_support::Verbosity::Normal).draws_bar());
    }
}
