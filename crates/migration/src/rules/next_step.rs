//! How the device reports a failure: the exit-code table of `device-modeld-manager` (stable,
//! documented in docs/device.md), each code's `kind` in a `--json` error document, and what to
//! do next after each [`Error`] ([`cli_support::NextStep`]), kept apart from the message.

use cli_support::{Failure, NextStep};
use downloader::Error as D;

use crate::error::Error;

/// The device's exit codes.
pub mod code {
    pub const OK: u8 = 0;
    pub const FAILURE: u8 = 1;
    /// A command line clap accepted but the tree contradicts (`--generation`): clap's own code.
    pub const USAGE: u8 = 2;
    pub const BUSY: u8 = 3;
    pub const DOWNLOAD_FAILED: u8 = 4;
    pub const MANIFEST_UNAVAILABLE: u8 = 5;
    pub const NOT_VERIFIED: u8 = 6;
    pub const CANCELLED: u8 = 7;
    pub const NO_SPACE: u8 = 8;
    pub const ONROAD: u8 = 9;
    pub const PAUSED: u8 = 10;
}

/// The stable name of an exit code, the `kind` of a `--json` error document.
pub fn kind(exit_code: u8) -> &'static str {
    match exit_code {
        code::BUSY => "busy",
        code::DOWNLOAD_FAILED => "download_failed",
        code::MANIFEST_UNAVAILABLE => "manifest_unavailable",
        code::NOT_VERIFIED => "not_verified",
        code::CANCELLED => "cancelled",
        code::NO_SPACE => "no_space",
        code::ONROAD => "deferred",
        code::PAUSED => "paused",
        code::USAGE => "usage",
        _ => "failure",
    }
}

/// A failure with this exit code and its `kind`.
pub fn failure(exit_code: u8, message: impl std::fmt::Display) -> Failure {
    Failure::new(exit_code, kind(exit_code), message)
}

impl Error {
    /// The exit code the device binary ends with after this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Busy { .. } => code::BUSY,
            Error::Onroad { .. } => code::ONROAD,
            Error::Download(D::ManifestUnavailable { .. }) => code::MANIFEST_UNAVAILABLE,
            Error::Download(D::Cancelled { .. }) => code::CANCELLED,
            Error::Download(D::InsufficientSpace { .. }) => code::NO_SPACE,
            Error::Download(D::Io(_)) => code::FAILURE,
            Error::Download(_) => code::DOWNLOAD_FAILED,
            Error::NotVerified { .. } => code::NOT_VERIFIED,
            Error::GenerationDisagrees { .. } => code::USAGE,
            _ => code::FAILURE,
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::from_error(e.exit_code(), kind(e.exit_code()), &e)
    }
}

impl NextStep for Error {
    /// What to do next, for the errors whose own message does not already say it.
    fn next_step(&self) -> Option<String> {
        let text = match self {
            Error::Download(d @ D::ManifestUnavailable { .. })
                if !downloader::trust::refusals(d).is_empty() =>
            {
                "nothing on this device was changed; the stores serve no manifest the trusted \
                 keys accept (reasons above). The release engineer must publish it signed \
                 (`release-cli publish --sign-key`); `status` shows the accepted release"
                    .to_string()
            }
            Error::Download(D::ManifestUnavailable { .. }) => {
                "check the network (or --hf-base/--github-base) and run `refresh` again; a device \
                 still on another generation now uses the built-in model, and its own model is \
                 downloaded once a refresh gets the catalog"
                    .to_string()
            }
            Error::Download(D::Cancelled { .. }) => {
                "run the same command again; finished chunks are kept and not fetched twice"
                    .to_string()
            }
            Error::Download(D::InsufficientSpace { .. } | D::NotSigned { .. }) => return None,
            Error::Download(d) if d.is_not_yet() => format!(
                "nothing was counted as a failure: the store's files do not match its manifest \
                 yet (a republish in progress); the installed model (or the built-in) stays in \
                 use. Run the same command again in a few minutes: it tries at once. The \
                 daemon's own refresh asks again within {} minutes",
                crate::rules::choice::NOT_YET_RETRY.as_secs() / 60
            ),
            Error::Download(D::Io(_)) => {
                "check that the data dir is writable and not full, then run the command again"
                    .to_string()
            }
            Error::Download(_) => {
                "the previously installed model (or the built-in) stays in use; run the same \
                 command again later (finished chunks are resumed), or `status` to see what is \
                 installed"
                    .to_string()
            }
            Error::NotVerified { .. } => {
                "download the model again (`download <ID>`); `resolve` will not hand it to modeld"
                    .to_string()
            }
            Error::CatalogNotTrusted { path, .. } => format!(
                "run `refresh` (online) to fetch and verify the catalog again; if it keeps \
                 failing, someone changed files in {}",
                path.parent()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ),
            Error::TrustStateUnreadable { generation, .. } => format!(
                "restore one copy with the release this device last accepted ({{\"{generation}\": \
                 {{\"release\": N, \"expires\": 0, \"key\": \"restored\"}}}}), or, to accept the \
                 next signed release as the new floor, remove both files deliberately \
                 (docs/device.md, \"Trust\")"
            ),
            Error::DataDir { exists: true, .. } => {
                "pass the device's data root (default /data)".to_string()
            }
            Error::DataDir { exists: false, .. } => {
                "pass the device's data root (default /data); it is never created".to_string()
            }
            Error::TrustedKeysUnusable(_) => {
                "give --trusted-keys a file holding the release key's minisign .pub \
                 (docs/device.md, \"Trust\")"
                    .to_string()
            }
            Error::GenerationDisagrees { tree, .. } => format!(
                "drop --generation (the tree decides), or pass --generation {tree}, or \
                 --openpilot-dir for the checkout this device runs"
            ),
            _ => return None,
        };
        Some(text)
    }
}

/// The error's message with its next step on a line of its own, for a report that carries an
/// error as text (`status`'s `catalog_problem`, the accepted release's `problem`, `resolve`'s
/// `doubt`).
pub fn with_next(e: &Error) -> String {
    match e.next_step() {
        Some(next) => format!("{e}\nnext: {next}"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn manifest_unavailable() -> D {
        D::ManifestUnavailable {
            generation: "v25".into(),
            attempts: Vec::new(),
        }
    }

    /// The exit-code table of docs/device.md, and each code's `kind`.
    #[test]
    fn exit_codes_and_kinds() {
        let io = || std::io::Error::other("disk");
        for (e, want, kind_) in [
            (
                Error::Busy {
                    path: "/data/models/.manager.lock".into(),
                },
                3,
                "busy",
            ),
            (
                Error::Onroad {
                    what: "refresh".into(),
                },
                9,
                "deferred",
            ),
            (
                Error::Download(manifest_unavailable()),
                5,
                "manifest_unavailable",
            ),
            (
                Error::Download(D::Cancelled {
                    model: "pop223".into(),
                }),
                7,
                "cancelled",
            ),
            (
                Error::Download(D::InsufficientSpace {
                    path: "/data/models".into(),
                    needed: 2,
                    available: 1,
                }),
                8,
                "no_space",
            ),
            (Error::Download(D::Io(io())), 1, "failure"),
            (
                Error::NotVerified {
                    path: "/data/models/x".into(),
                    source: chunker::Error::Io(io()),
                },
                6,
                "not_verified",
            ),
            (Error::Io(io()), 1, "failure"),
            (
                Error::NoCatalog {
                    generation: "v26".into(),
                },
                1,
                "failure",
            ),
        ] {
            assert_eq!(e.exit_code(), want, "{e}");
            let f = Failure::from(e);
            assert_eq!((f.code, f.kind), (want, kind_));
        }
        assert_eq!(kind(code::USAGE), "usage");
        assert_eq!(kind(code::PAUSED), "paused");
        assert_eq!(kind(code::OK), "failure", "0 is never a failure's code");
    }

    /// The next step is never glued into the message; a report that carries the error as text
    /// gets it on a line of its own.
    #[test]
    fn next_steps_stay_apart_from_messages() {
        let generations = ["v25", "v26"];
        for g in generations {
            let e = Error::TrustStateUnreadable {
                file: PathBuf::from("/data/models/.accepted-release.json"),
                file_problem: "missing".into(),
                param: PathBuf::from("/data/params/d/ModelManifestAcceptedRelease"),
                param_problem: "corrupt: eof".into(),
                generation: g.into(),
            };
            let next = e.next_step().unwrap();
            assert!(!e.to_string().contains("next:"), "{e}");
            assert!(next.starts_with(&format!("restore one copy with the release this device last accepted ({{\"{g}\": {{\"release\": N,")), "{next}");
            assert_eq!(with_next(&e), format!("{e}\nnext: {next}"));
        }
        let e = Error::CatalogNotTrusted {
            path: PathBuf::from("/data/models/.catalog.json"),
            refusal: manifest::signature::Refusal::Unsigned,
        };
        assert!(!e.to_string().contains("next:"), "{e}");
        assert!(
            e.next_step()
                .unwrap()
                .ends_with("someone changed files in /data/models")
        );
        let plain = Error::NoCatalog {
            generation: "v25".into(),
        };
        assert_eq!(plain.next_step(), None);
        assert_eq!(with_next(&plain), plain.to_string());
        assert!(
            Error::Download(manifest_unavailable())
                .next_step()
                .unwrap()
                .starts_with("check the network")
        );
    }
}
