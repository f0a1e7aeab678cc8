//! Errors as the user sees them, with stable exit codes, and `--json` printing.

use std::fmt::Display;
use std::process::ExitCode;

use cli_support::{Failure, NextStep};
use serde::Serialize;

/// An error with its exit code: the [`Failure`] both binaries report through. The message says
/// what failed; the next step, where there is one, is kept apart from it ([`NextStep`]).
#[derive(Debug)]
pub struct CliError(pub Failure);

pub type CliResult<T = ()> = Result<T, CliError>;

/// Exit code for an operation that failed.
pub const EXIT_FAILURE: u8 = 1;
/// Exit code for a usage error (clap uses it too).
pub const EXIT_USAGE: u8 = 2;
/// Exit code for a check that found a problem (verify, validate, release guard).
pub const EXIT_CHECK_FAILED: u8 = 3;

/// The stable name of an exit code, the `kind` of a `--json` error document.
fn kind(code: u8) -> &'static str {
    match code {
        EXIT_USAGE => "usage",
        EXIT_CHECK_FAILED => "check_failed",
        _ => "failure",
    }
}

impl CliError {
    fn new(code: u8, message: impl Display) -> Self {
        Self(Failure::new(code, kind(code), message))
    }

    pub fn failure(message: impl Display) -> Self {
        Self::new(EXIT_FAILURE, message)
    }

    pub fn usage(message: impl Display) -> Self {
        Self::new(EXIT_USAGE, message)
    }

    pub fn check_failed(message: impl Display) -> Self {
        Self::new(EXIT_CHECK_FAILED, message)
    }

    /// An error's message and its [`NextStep`], with an exit code.
    pub fn from_error<E: Display + NextStep + ?Sized>(code: u8, e: &E) -> Self {
        Self(Failure::from_error(code, kind(code), e))
    }

    /// [`CliError::usage`] of an error, with its next step.
    pub fn usage_from<E: Display + NextStep>(e: E) -> Self {
        Self::from_error(EXIT_USAGE, &e)
    }

    /// The next step under the message.
    pub fn with_next(self, next: impl Into<String>) -> Self {
        Self(self.0.with_next(Some(next)))
    }

    /// An exit code with nothing to say: the output already said it (`manifest diff` found
    /// differences).
    pub fn quiet(code: u8) -> Self {
        Self(Failure::new(code, kind(code), "").after_json_report())
    }

    /// Mark that the command's `--json` document, which says what failed, is already out.
    pub fn after_json_report(self) -> Self {
        Self(self.0.after_json_report())
    }

    /// The exit code.
    pub fn code(&self) -> u8 {
        self.0.code
    }

    /// The same error with another exit code (and its kind).
    pub fn with_code(mut self, code: u8) -> Self {
        self.0.code = code;
        self.0.kind = kind(code);
        self
    }

    /// Print the failure ([`Failure::report`]).
    pub fn report(&self, json: bool) -> ExitCode {
        self.0.report(json)
    }
}

impl From<chunker::Error> for CliError {
    fn from(e: chunker::Error) -> Self {
        use chunker::Error as E;
        let code = match e {
            E::MissingChunk { .. }
            | E::MalformedChunkManifest { .. }
            | E::MalformedSidecar { .. }
            | E::CountMismatch { .. }
            | E::SizeMismatch { .. }
            | E::DigestMismatch { .. }
            | E::NotOob { .. } => EXIT_CHECK_FAILED,
            // A missing input file is exit 1 for every command, as an I/O error is.
            E::NotFound { .. } => EXIT_FAILURE,
            E::TooManyChunks { .. }
            | E::ZeroChunkSize
            | E::InvalidName { .. }
            | E::EmptyInput { .. } => EXIT_USAGE,
            _ => EXIT_FAILURE,
        };
        CliError::from_error(code, &e)
    }
}

pub(crate) fn store_error(e: artifact_store::Error) -> CliError {
    use artifact_store::Error as E;
    let code = match e {
        E::InvalidStore { .. } | E::InvalidPath { .. } => EXIT_USAGE,
        _ if e.is_check_failure() => EXIT_CHECK_FAILED,
        _ => EXIT_FAILURE,
    };
    CliError::from_error(code, &e)
}

/// Map a compiler error to the CLI's exit codes: refused flags are usage errors, failed checks
/// (marker, digest, outputs) are check failures, the rest are failures.
pub fn remote_error(e: compiler_remote::Error) -> CliError {
    use compiler_remote::Error as E;
    match e {
        E::OtherCompiler { .. } | E::InvalidDestination { .. } | E::InvalidRemotePath { .. } => {
            CliError::usage(e)
        }
        E::Pin { .. } | E::TreeIncomplete { .. } | E::Source { .. } => CliError::usage(e),
        E::MarkerMissing { .. }
        | E::MarkerMismatch { .. }
        | E::MarkerUnreadable { .. }
        | E::DigestMismatch { .. }
        | E::InvalidOutputs { .. }
        | E::MissingOutputs { .. }
        | E::DmIncomplete { .. }
        | E::NotSynced { .. }
        | E::SyncRecord { .. }
        | E::TreeChangedDuringSync { .. }
        | E::HostKeyNotKnown { .. } => CliError::check_failed(e),
        other => CliError::failure(other),
    }
}

/// A `release` error's exit code, the one mapping of every command (the table of `--help` and
/// docs/release.md): a flag or argument refused before anything ran is a usage error, a refused
/// check (gate, guard, pin, record, loadable, latency) a failed check, the rest failures. A
/// `--workspace` that is not a directory is a failure, as a missing input file is.
impl From<release::Error> for CliError {
    fn from(e: release::Error) -> Self {
        use release::Error as E;
        let code = match e {
            E::Chunk(e) => return e.into(),
            E::Store(e) => return store_error(e),
            E::Compiler(e) => return remote_error(e),
            E::NotADirectory {
                flag: "--workspace",
                ..
            } => EXIT_FAILURE,
            E::NotADirectory { .. }
            | E::NotACheckout { .. }
            | E::ValidateInput { .. }
            | E::RehearseInput { .. }
            | E::NotAnOpenpilotTree { .. }
            | E::SourceMap { .. }
            | E::SourceMapExists { .. }
            | E::NotInSourceMap { .. }
            | E::NotInCatalog { .. }
            | E::NoBehaviourVersion { .. }
            | E::ManifestFile { .. }
            | E::RecordMissing { .. }
            | E::LastGeneration { .. }
            | E::BumpNeedsCommit { .. }
            | E::PinBuiltin { .. }
            | E::PinNotRecorded { .. }
            | E::PinNoStoreChecked { .. }
            | E::SkipValidationNoReason
            | E::PublishNeedsWorkspace
            | E::PublishInput(_) => EXIT_USAGE,
            E::Record { .. }
            | E::ValidationGate { .. }
            | E::GpuFlag { .. }
            | E::Pins { .. }
            | E::GenerationSelector { .. }
            | E::TreePinDisagrees { .. }
            | E::BumpRefused { .. }
            | E::BumpPinned { .. }
            | E::CheckoutAtOtherCommit { .. }
            | E::CheckoutDirty { .. }
            | E::CheckoutWithoutCommit { .. }
            | E::SidecarMismatch { .. }
            | E::ReusePin { .. }
            | E::PinLive { .. }
            | E::PinStoreUnreadable { .. }
            | E::PinCorrectionRefused { .. }
            | E::RebuildGeneration { .. }
            | E::ReuseManifestPin { .. }
            | E::SignRefused(_)
            | E::LeftOutOfGeneration { .. }
            | E::NotLoadable { .. }
            | E::LatencyBound { .. }
            | E::ValidationBinding { .. } => EXIT_CHECK_FAILED,
            _ => EXIT_FAILURE,
        };
        CliError::from_error(code, &e)
    }
}

/// Print a value as one line of JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) -> CliResult {
    let mut text = serde_json::to_string(value).map_err(CliError::failure)?;
    text.push('\n');
    write_stdout(text.as_bytes())
}

/// `println!` for stdout that survives a closed pipe: evaluates to a [`CliResult`].
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format!("{}\n", format_args!($($arg)*)).as_bytes())
    };
}

/// Write bytes to stdout; a closed pipe (`| head`) is not an error worth a panic.
pub fn write_stdout(bytes: &[u8]) -> CliResult {
    cli_support::write_stdout(bytes)
        .map(drop)
        .map_err(|e| CliError::failure(format!("stdout: {e}")))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// The variants the command-by-command mappings disagreed on (`release_error` said 1 for
    /// every usage error and refused check but a few, `From` said 1 for a bad checkout, an
    /// unreadable record, the gate's refusal and the GPU flag; validate, rehearse and publish
    /// each had their own exceptions) now have the one exit code of the table.
    #[test]
    fn a_release_error_has_one_exit_code_whichever_command_meets_it() {
        use release::Error as E;
        let dir = |flag| E::NotADirectory {
            flag,
            path: PathBuf::from("/x"),
        };
        let problem = || "a problem".to_string();
        let table = [
            (dir("--workspace"), EXIT_FAILURE),
            (dir("--openpilot"), EXIT_USAGE),
            (dir("--artifacts"), EXIT_USAGE),
            (
                E::NotACheckout {
                    openpilot: PathBuf::from("/op"),
                    reason: problem(),
                },
                EXIT_USAGE,
            ),
            (E::ValidateInput { problem: problem() }, EXIT_USAGE),
            (E::RehearseInput { problem: problem() }, EXIT_USAGE),
            (E::SkipValidationNoReason, EXIT_USAGE),
            (
                E::Record {
                    path: PathBuf::from("/ws/results/a.validation.json"),
                    reason: problem(),
                },
                EXIT_CHECK_FAILED,
            ),
            (
                E::ValidationGate {
                    workspace: PathBuf::from("/ws"),
                    gaps: vec![problem()],
                },
                EXIT_CHECK_FAILED,
            ),
            (
                E::GpuFlag {
                    mismatches: vec![problem()],
                },
                EXIT_CHECK_FAILED,
            ),
            (
                E::PinLive {
                    generation: manifest::Generation::new(25),
                    store: "file:/s".into(),
                    path: "manifests/model_names_v25.json".into(),
                    recorded: None,
                },
                EXIT_CHECK_FAILED,
            ),
            (
                E::Store(artifact_store::Error::InvalidStore {
                    spec: "nope:".into(),
                    reason: problem(),
                }),
                EXIT_USAGE,
            ),
            (E::Chunk(chunker::Error::ZeroChunkSize), EXIT_USAGE),
            (E::Io(std::io::Error::other("disk")), EXIT_FAILURE),
        ];
        for (e, code) in table {
            let what = format!("{e:?}");
            let got = CliError::from(e);
            assert_eq!(got.code(), code, "{what}");
            assert_eq!(got.0.kind, kind(code), "{what}");
        }
    }
}
