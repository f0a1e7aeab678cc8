//! Workspace integration: the end-to-end story (release -> store -> serve -> device) shared by
//! `cargo xtask demo` (the `starpilot-demo` binary) and the integration tests in `tests/tests/`.

pub mod binaries;
pub mod bump;
pub mod story;
