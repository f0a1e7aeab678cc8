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
//!
//! # Example
//!
//! Publish one model into a directory store: split its artifact into `<artifacts>/<id>/`, give
//! the manifest its size and digest, and publish. The store then holds the chunk set under
//! `models/v25/<id>/` and, written last, `manifests/model_names_v25.json`; publishing again
//! uploads nothing.
//!
//! ```
//! use artifact_store::publish::{PublishOptions, publish};
//! use artifact_store::retry::RetryPolicy;
//! use artifact_store::{LocalStore, Store};
//! use chunker::{SplitOptions, Sha256Digest, split_file};
//! use manifest::{Generation, Manifest};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//!
//! // A v25 driving artifact is an out-of-band pickle container: an 8-byte little-endian
//! // length, that many pickle opcodes (PROTO 5, None, STOP), then length-prefixed buffers.
//! let weights = vec![0x5au8; 2_500];
//! let mut artifact = 4u64.to_le_bytes().to_vec();
//! artifact.extend([0x80, 0x05, b'N', b'.']);
//! artifact.extend((weights.len() as u64).to_le_bytes());
//! artifact.extend(&weights);
//!
//! // The compiler's hand-over: `<artifacts>/<id>/`, split into 1000-byte chunks.
//! let model_dir = dir.path().join("artifacts/pop223");
//! std::fs::create_dir_all(&model_dir)?;
//! let src = dir.path().join("pop223_driving_tinygrad.pkl");
//! std::fs::write(&src, &artifact)?;
//! let split = split_file(&src, &model_dir, &SplitOptions { chunk_size: 1_000 })?;
//!
//! let manifest = Manifest::from_slice(
//!     format!(
//!         r#"{{"generation": "v25",
//!             "tinygrad_commit": "{pin}",
//!             "models": [{{
//!               "id": "pop223", "name": "Pop 223", "version": "v15", "series": "Pop",
//!               "released": "2025-06-01", "community_favorite": false,
//!               "artifact_format": "tinygrad_single_v1", "artifact_size": {size},
//!               "artifact_sha256": "{sha}", "artifact_chunk_count": {count},
//!               "uses_external_gpu": false}}]}}"#,
//!         pin = manifest::layout::CURRENT_TINYGRAD_COMMIT,
//!         size = split.size,
//!         sha = split.sha256,
//!         count = split.chunk_count,
//!     )
//!     .as_bytes(),
//! )?;
//!
//! let store = LocalStore::new(dir.path().join("store"));
//! let opts = PublishOptions {
//!     generation: Generation::new(25),
//!     dry_run: false,
//!     retry: RetryPolicy::default(),
//!     deep_verify: true,
//!     contract: Default::default(),
//! };
//! let report = publish(&manifest, &dir.path().join("artifacts"), &[&store], &opts, &mut |_| {})?;
//! assert_eq!(report.stores[0].manifest, "written");
//! assert_eq!(report.stores[0].uploaded_files, 5); // 3 chunks, .sha256, .chunkmanifest
//!
//! let live = store.read_small(&"manifests/model_names_v25.json".parse()?, 1 << 20)?;
//! assert_eq!(live.as_deref(), Some(manifest.to_canonical_bytes().as_slice()));
//! assert_eq!(split.sha256, Sha256Digest::of_bytes(&artifact));
//!
//! // Everything is in place: a second publish uploads nothing and leaves the manifest alone.
//! let again = publish(&manifest, &dir.path().join("artifacts"), &[&store], &opts, &mut |_| {})?;
//! assert_eq!(again.stores[0].uploaded_files, 0);
//! assert_eq!(again.stores[0].manifest, "unchanged");
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

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
pub use location::{Location, StoreAccess, StoreSpec};
pub use paths::StorePath;
pub use store::{FileStat, ListEntry, Store, StoreName, digest_of};
