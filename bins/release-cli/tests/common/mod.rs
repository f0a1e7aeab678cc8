//! Shared by the `release-cli` test binaries: run the real binary, read its output.
//! (Each test binary uses some of these, hence the `dead_code` allowance.)
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_release-cli");

/// The binary with an environment that does not depend on the developer's: no token for the
/// Hub, no replacement ssh config.
pub fn command() -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("HF_TOKEN").env_remove("STARPILOT_SSH_CONFIG");
    c
}

/// Run `release-cli ARGS`.
pub fn cli(args: &[&str]) -> Output {
    command().args(args).output().expect("run release-cli")
}

/// Run `release-cli ARGS` in `cwd`.
pub fn cli_in(args: &[&str], cwd: &Path) -> Output {
    command()
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run release-cli")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
