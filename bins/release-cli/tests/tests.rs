//! The real `release-cli` binary, one test binary: every module runs it (`common::cli`) on
//! temporary files, local stores and git remotes, a real sshd, the Hub emulator, and HTTP on
//! 127.0.0.1.

mod audit_cli;
mod bounds_cli;
mod build_cli;
mod chunk_cli;
mod chunk_inputs_cli;
mod cli_surface;
mod common;
mod loadable_cli;
mod manifest_cli;
mod manifest_v26_cli;
mod publish_rules_cli;
mod publish_v26_cli;
mod rehearse_cli;
mod release_contract;
mod sign_cli;
mod store_cli;
mod tree_pin_cli;
