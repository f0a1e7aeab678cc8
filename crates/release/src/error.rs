//! The crate's one error type.

/// What went wrong in a release step. Every message names the file, model or value involved and,
/// where there is one, the next step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading or writing a local file failed.
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A gate record in the workspace that does not parse.
    #[error(
        "{path}: not a readable record ({reason}); rerun the command that writes it (`release-cli \
         preflight`, or `release-cli validate` for a .validation.json or .check.json)"
    )]
    Record {
        path: std::path::PathBuf,
        reason: String,
    },
    /// `preflight --openpilot` is not an openpilot checkout it can test.
    #[error("--openpilot {openpilot}: {reason}; pass the openpilot checkout (with ./dev, .venv and tinygrad_repo/TINYGRAD_COMMIT)", openpilot = openpilot.display())]
    NotACheckout {
        openpilot: std::path::PathBuf,
        reason: String,
    },
    /// A preflight command could not be started or waited for.
    #[error("cannot run `{command}` in {dir}: {source}; is the checkout set up (`./dev` executable, `.venv` made by `./dev sync`)?", dir = dir.display())]
    Spawn {
        command: String,
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The validation gate refused a publish: every missing, failed or stale cell, one per line.
    #[error(
        "publish refused: the records in {workspace} do not cover the seed's validation matrix \
         for this manifest:\n  {}\nnext: run what each line says, or publish with \
         --skip-validation \"REASON\" (the reason is written into the publish record)",
        gaps.join("\n  "),
        workspace = workspace.display()
    )]
    ValidationGate {
        workspace: std::path::PathBuf,
        gaps: Vec<String>,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
