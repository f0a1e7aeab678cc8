//! Getting release bytes to the fleet: the [`Store`] trait over a store root in the bucket layout
//! (`manifests/model_names_<gen>.json`, `models/<gen>/<id>/<file>`, `onnx/<source-id>/<file>`)
//! and its backends, plus the three release operations built on it:
//!
//! - [`LocalStore`]: a directory, written atomically through `chunker::atomic`;
//! - [`HfBucketStore`]: a Hugging Face bucket, read over HTTP (resolve URLs and the tree API),
//!   written and copied server-side through the `hf` CLI;
//! - [`GithubStore`]: a checkout of the `Models` branch, one commit per file, one push per model;
//! - [`publish`]: chunks, then `.sha256`, then `.chunkmanifest`, then a completeness check, the
//!   release guard against the freshly fetched live manifest, and the manifest last;
//! - [`reuse`]: adopt a compatible artifact by server-side copy, renamed to the stable ID;
//! - [`serve`]: an HTTP mirror of a local store in both URL layouts devices use.
//!
//! It does not build, split or verify artifacts (that is `chunker`), and it does not parse
//! manifests or decide what may change (that is `manifest`: parsing, layout, guard).

mod error;
pub mod github;
pub mod hf;
mod keyfile;
pub mod local;
pub mod location;
pub mod oob;
pub mod paths;
pub mod progress;
pub mod publish;
mod refusal;
pub mod retry;
pub mod reuse;

pub mod serve;
pub mod signing;
mod store;

pub use error::{Error, HfFailure, Refusal, Result};
pub use github::GithubStore;
pub use hf::{HfBucketStore, HfConfig};
pub use local::LocalStore;
pub use location::{Location, StoreSpec};
pub use paths::StorePath;
pub use store::{FileStat, ListEntry, Store};
