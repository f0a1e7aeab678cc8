//! The release workflow, between `release-cli` (which only parses flags and renders) and the
//! stores (`artifact-store`) and the compiler comma (`compiler-remote`).
//!
//! Every rule that decides (skip a finished build, rebuild a stale record, refuse a release
//! without a passing validation) is a function over typed values with a table test; the code
//! around it performs the I/O. Errors are [`Error`], one enum for the crate, each variant naming
//! the path or value involved and the next step.

mod error;

pub use error::{Error, Result};
pub mod gate;
pub mod preflight;
pub mod records;
