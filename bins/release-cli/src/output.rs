//! Errors as the user sees them, with stable exit codes, and `--json` printing.

use std::fmt::Display;
use std::process::ExitCode;

use serde::Serialize;

/// An error with its exit code. The message says what failed and, where it helps, what to do.
#[derive(Debug)]
pub struct CliError {
    pub code: u8,
    pub message: String,
    /// The command already printed its `--json` document (a validation report before exit 3),
    /// so no error document follows it.
    pub json_printed: bool,
}

pub type CliResult<T = ()> = Result<T, CliError>;

/// Exit code for an operation that failed.
pub const EXIT_FAILURE: u8 = 1;
/// Exit code for a usage error (clap uses it too).
pub const EXIT_USAGE: u8 = 2;
/// Exit code for a check that found a problem (verify, validate, release guard).
pub const EXIT_CHECK_FAILED: u8 = 3;

impl CliError {
    pub fn failure(message: impl Display) -> Self {
        Self {
            code: EXIT_FAILURE,
            message: message.to_string(),
            json_printed: false,
        }
    }

    pub fn usage(message: impl Display) -> Self {
        Self {
            code: EXIT_USAGE,
            message: message.to_string(),
            json_printed: false,
        }
    }

    pub fn check_failed(message: impl Display) -> Self {
        Self {
            code: EXIT_CHECK_FAILED,
            message: message.to_string(),
            json_printed: false,
        }
    }

    /// An exit code with nothing to say: the output already said it (`manifest diff` found
    /// differences).
    pub fn quiet(code: u8) -> Self {
        Self {
            code,
            message: String::new(),
            json_printed: true,
        }
    }

    /// Mark that the command's `--json` document, which says what failed, is already out.
    pub fn after_json_report(mut self) -> Self {
        self.json_printed = true;
        self
    }

    /// The stable name of the exit code, the `kind` of a `--json` error document.
    pub fn kind(&self) -> &'static str {
        match self.code {
            EXIT_USAGE => "usage",
            EXIT_CHECK_FAILED => "check_failed",
            _ => "failure",
        }
    }

    /// Print the message on stderr and, for a `--json` command, one error document
    /// `{"error":{"kind","message","next"}}` on stdout; the exit code is the same either way.
    pub fn report(&self, json: bool) -> ExitCode {
        if !self.message.is_empty() {
            eprintln!("error: {}", self.message);
        }
        if json && !self.json_printed {
            let _ = write_stdout(cli_support::error_json(self.kind(), &self.message).as_bytes());
        }
        ExitCode::from(self.code)
    }
}

impl From<chunker::Error> for CliError {
    fn from(e: chunker::Error) -> Self {
        use chunker::Error as E;
        match e {
            E::MissingChunk { .. }
            | E::MalformedChunkManifest { .. }
            | E::MalformedSidecar { .. }
            | E::CountMismatch { .. }
            | E::SizeMismatch { .. }
            | E::DigestMismatch { .. }
            | E::NotOob { .. } => CliError::check_failed(e),
            // A missing input file is exit 1 for every command, as an I/O error is.
            E::NotFound { .. } => CliError::failure(e),
            E::TooManyChunks { .. }
            | E::ZeroChunkSize
            | E::InvalidName { .. }
            | E::EmptyInput { .. } => CliError::usage(e),
            other => CliError::failure(other),
        }
    }
}

impl From<release::Error> for CliError {
    fn from(e: release::Error) -> Self {
        use release::Error as E;
        match e {
            E::Chunk(e) => e.into(),
            E::Store(e) => crate::cmd::store::store_error(e),
            E::Compiler(e) => crate::cmd::build::remote_error(e),
            E::NotADirectory { .. }
            | E::NotAnOpenpilotTree { .. }
            | E::SourceMap { .. }
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
            | E::PublishInput(_) => CliError::usage(e),
            E::Pins { .. }
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
            | E::SignRefused(_) => CliError::check_failed(e),
            other => CliError::failure(other),
        }
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
