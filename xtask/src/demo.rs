//! `cargo xtask demo [WORK_DIR]`: the main job end to end, offline, on this machine. Builds the
//! two binaries and the demo driver, then runs `starpilot-demo` (the story in
//! `tests/src/story.rs`): chunk stand-in artifacts, publish v25 to a local store and a git
//! `Models` branch, serve the store on 127.0.0.1, migrate a v24-looking device with
//! `device-modeld-manager refresh`, and print what was deleted, kept, downloaded and selected.

use std::process::Command;

use crate::util;

pub fn run(args: &[String]) -> Result<(), String> {
    util::cargo(&[
        "build",
        "--quiet",
        "-p",
        "release-cli",
        "-p",
        "device-modeld-manager",
        "-p",
        "integration-tests",
        "--bin",
        "release-cli",
        "--bin",
        "device-modeld-manager",
        "--bin",
        "starpilot-demo",
    ])?;
    let status = Command::new(util::target_dir().join("debug/starpilot-demo"))
        .args(args)
        .env("STARPILOT_DEMO_PROFILE", "debug")
        .status()
        .map_err(|e| format!("cannot run starpilot-demo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the demo failed ({status})"))
    }
}
