//! The release workflow, between `release-cli` (which only parses flags and renders) and the
//! stores (`artifact-store`) and the compiler comma (`compiler-remote`):
//!
//! - [`rebuild`]: the resumable bulk rebuild of a generation, its rules (skip what is done,
//!   rebuild stale records, stop the run) over a [`rebuild::Builder`];
//! - [`tree`]: edits of the openpilot checkout, `tinygrad bump` and `builtin`, each decided
//!   before anything is written and able to stop there (dry run);
//! - [`publish`]: the gates, the signature, the upload and the publish record, in order;
//! - [`reuse`]: when an artifact built elsewhere may be adopted, and the copy;
//! - [`rehearse`]: the staged release played on old-generation devices before it is published;
//! - [`source_map`]: the next generation's source map from the previous one and the tree.
//!
//! Every rule that decides is a function over typed values with a table test; the code around
//! it performs the I/O. Errors are [`Error`], one enum for the crate, each variant naming the
//! path or value involved and the next step.

mod error;
pub mod flags;
pub mod rebuild;
pub mod reuse;
pub mod tree;
mod workspace;

pub use error::{Error, Result};
pub use workspace::Workspace;
pub mod audit;
pub mod catalog_guard;
pub mod gate;
pub mod loadable;
pub mod preflight;
pub mod publish;
mod recorded;
pub mod records;
pub mod rehearse;
pub mod source_map;
pub mod status;
pub mod validate;
