//! The stores' integration tests, one binary: publish to a local store and a local git remote,
//! the Hub emulator with the real `hf` CLI, republish kill points, and `serve` against hostile
//! clients. Shared fixtures are in `common`.

mod common;
mod github_resume;
mod hub_serve_reuse;
mod power_loss;
mod publish_local_git;
mod publish_progress;
mod publish_reads;
mod publish_rules;
mod republish_window;
mod serve_hostile;
mod signature_window;
mod stale_split;
