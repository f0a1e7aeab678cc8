//! The one error type of the migration crate, and [`one_line`], an error's text as one log line.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "another model manager is running (lock {} is held); wait for it to finish or stop it",
        path.display()
    )]
    Busy { path: PathBuf },

    /// A file or directory operation failed. Every filesystem call of this crate goes through
    /// `fs-err`, whose message names the operation and the path ("failed to open file `…`: …")
    /// and keeps the `kind()`.
    #[error(transparent)]
    Io(#[from] std::io::Error),

    /// The manager lock could not be taken for a reason other than another holder (see
    /// [`Error::Busy`]): the models directory is not a directory, or the previous build's lock
    /// file could not be opened. Not an `Io` error because the lock code must read the raw
    /// errno of the open, which `fs-err`'s wrapped error does not expose.
    #[error("could not lock {}: {source}", path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The daemon's automatic refresh holds an artifact back for the day
    /// ([`crate::rules::budget::hold`]): no transfer is started. The refresh takes it as an
    /// outcome, not a failure (`RefreshReport::held_back`).
    #[error("{0}")]
    HeldBack(crate::rules::budget::HeldBack),

    #[error("invalid param key {key:?}: keys are ASCII letters, digits and _")]
    BadParamKey { key: String },

    #[error("{}: corrupt state file ({message}); remove it to start over", path.display())]
    CorruptState { path: PathBuf, message: String },

    #[error(
        "model {id} is not in the {generation} catalog; run `refresh` first or pick a listed model"
    )]
    UnknownModel { id: String, generation: String },

    /// With trusted keys, the stored catalog does not verify against the signature kept beside
    /// it (edited, replaced by an older signed copy, or its signature missing).
    #[error(
        "{}: the stored catalog does not verify under the trusted keys ({refusal}); `resolve` \
         answers the built-in model until a signed catalog is stored again",
        path.display()
    )]
    CatalogNotTrusted {
        path: PathBuf,
        refusal: manifest::signature::Refusal,
    },

    /// Neither copy of the accepted release (the rollback floor: the state file in the models
    /// directory and its param mirror) can be read, so the device cannot tell which signed
    /// releases are older than one it accepted. Nothing is fetched; nothing was changed.
    #[error(
        "the accepted release (the rollback floor) cannot be read: {file} ({file_problem}); param \
         {param} ({param_problem}). The device accepts no manifest until it knows its floor, and \
         resetting it silently would let an older signed release back in",
        file = file.display(),
        param = param.display()
    )]
    TrustStateUnreadable {
        file: PathBuf,
        file_problem: String,
        param: PathBuf,
        param_problem: String,
        generation: String,
    },

    #[error("no {generation} catalog on this device yet; run `refresh` while online")]
    NoCatalog { generation: String },

    #[error(
        "the catalog would take {size} bytes on the device, over the {limit}-byte limit it is read \
         back with; nothing was changed (the publisher must add a `generation` field to the \
         manifest or shrink it)"
    )]
    CatalogTooLarge { size: u64, limit: u64 },

    #[error(
        "the built-in model is missing at {}; reinstall the openpilot checkout (or pass \
         --builtin-dir)",
        path.display()
    )]
    BuiltinMissing { path: PathBuf },

    /// `IsOnroad` is set: nothing was purged, migrated or downloaded, and every file is as it
    /// was. The daemon serves the request once the car is offroad.
    #[error(
        "deferred while driving: {what} waits until the car is offroad (IsOnroad is set); nothing was changed"
    )]
    Onroad { what: String },

    /// A GPU-only model without a ready external GPU (upstream's "External GPU required...").
    #[error(
        "model {id} needs the external GPU (Chestnut), and none is ready; set AllowGpuModelDownloadWithoutGpu to download it anyway"
    )]
    ExternalGpuRequired { id: String },

    /// modeld could not start this very artifact (its load receipt said
    /// `selected-load-failed`): not downloaded again until the catalog lists other bytes.
    #[error("{why}")]
    FailedToStart { id: String, why: String },

    #[error(transparent)]
    Download(#[from] downloader::Error),

    #[error("{path}: not verified: {source}")]
    NotVerified {
        path: String,
        #[source]
        source: chunker::Error,
    },

    #[error(transparent)]
    Manifest(#[from] manifest::Error),

    /// `--data-dir` is not an existing directory; it is never created (on a comma `/data`
    /// always exists, so a missing one is a typo or the wrong machine).
    #[error("--data-dir {}: {problem}", path.display())]
    DataDir {
        path: PathBuf,
        problem: String,
        exists: bool,
    },

    /// The trusted keys file given (or the default one) cannot be used: refused rather than run
    /// unprotected.
    #[error(transparent)]
    TrustedKeysUnusable(downloader::Error),

    /// `--generation` is not the generation of the tree's tinygrad: a usage error, nothing
    /// touched.
    #[error(
        "--generation {given} disagrees with the openpilot tree {}: its tinygrad {commit} is \
         {tree}'s pin; nothing was touched",
        openpilot_dir.display()
    )]
    GenerationDisagrees {
        given: manifest::Generation,
        tree: manifest::Generation,
        commit: manifest::GitCommit,
        openpilot_dir: PathBuf,
    },

    /// A simulated crash (tests only, see `Effects`): nothing after effect `effect` ran.
    #[error("simulated crash after effect {effect} ({what})")]
    Crashed { effect: usize, what: String },
}

/// A message of several lines (an error listing each origin's reason) as one log line: the
/// lines joined with `; `, after a line ending in a colon just a space. Pure.
pub fn one_line(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !out.is_empty() {
            out.push_str(if out.ends_with(':') { " " } else { "; " });
        }
        out.push_str(line);
    }
    out
}
