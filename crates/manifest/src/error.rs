//! The one error type of this crate.

use std::fmt;

/// This crate's result type, with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading, building or editing a manifest. Every variant names the
/// value or the JSON path at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value that does not fit one of the crate's newtypes (`ModelId`, `Generation`, ...).
    #[error("invalid {kind} {value:?}: {reason}")]
    InvalidValue {
        /// What the value was meant to be (`model ID`, `generation`, ...).
        kind: &'static str,
        /// The value refused, cut to 80 characters.
        value: String,
        /// Why it is refused.
        reason: String,
    },

    /// The manifest is larger than [`crate::Limits::max_manifest_bytes`]; checked before parsing
    /// so a hostile server cannot make us parse endless data.
    #[error("manifest is {actual} bytes, more than the limit of {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
        /// The manifest's size (or the bytes read before the limit was passed).
        actual: u64,
    },

    /// The bytes are not JSON (or not UTF-8); serde_json's error says where.
    #[error("manifest is not valid JSON: {0}")]
    Json(#[source] serde_json::Error),

    /// Reading the manifest from its reader failed.
    #[error("could not read manifest: {0}")]
    Read(#[source] std::io::Error),

    /// The document parsed as JSON but breaks the rules every reader enforces. Every problem is
    /// listed, each with its JSON path.
    #[error("manifest is invalid ({} problem{}):\n{}", .0.len(), if .0.len() == 1 { "" } else { "s" }, Lines(.0, "  "))]
    Invalid(Vec<Problem>),

    /// A setter was given a value for a known field that is not valid for that field.
    #[error("invalid value for {key}: {problems}", problems = Lines(.problems, "  "))]
    InvalidField {
        /// The field's JSON key.
        key: String,
        /// What is wrong with the value.
        problems: Vec<Problem>,
    },

    /// [`crate::Manifest::insert`] was given a model the manifest already has; holds its ID.
    #[error("model {0} is already in the manifest")]
    DuplicateId(String),

    /// An edit would remove or change an entry's `id` in place.
    #[error("the `id` of an entry cannot be removed or changed in place; build a new entry")]
    IdIsFixed,
}

impl Error {
    pub(crate) fn invalid(kind: &'static str, value: &str, reason: impl Into<String>) -> Self {
        Self::InvalidValue {
            kind,
            value: abbreviate(value),
            reason: reason.into(),
        }
    }
}

/// One problem found in a manifest: where (a JSON path such as `models[3].artifact_sha256`, or
/// `$` for the whole document) and what.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Problem {
    /// The JSON path, e.g. `models[3].artifact_sha256`, or `$` for the whole document.
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Cuts long values so that a hostile manifest cannot flood an error message.
pub(crate) fn abbreviate(s: &str) -> String {
    const MAX: usize = 80;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Items one a line, each after a prefix.
pub(crate) struct Lines<'a, T>(pub(crate) &'a [T], pub(crate) &'static str);

impl<T: fmt::Display> fmt::Display for Lines<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}{c}", self.1)?;
        }
        Ok(())
    }
}

/// Every message of this crate says what to do where there is something to do; none carries a
/// separate next step.
impl cli_support::NextStep for Error {
    fn next_step(&self) -> Option<String> {
        None
    }
}
