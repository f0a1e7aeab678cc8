//! StarPilot model manifests (SPEC.md sections 2 and 4). Being written.
pub use chunker::Sha256Digest;
