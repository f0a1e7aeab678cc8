//! `starpilot-demo [WORK_DIR]`: the main job end to end (run through `cargo xtask demo`).
//! Plays the story in WORK_DIR (default: a fresh temporary directory, removed afterwards),
//! prints a before/after report, and leaves nothing running.

use std::path::PathBuf;
use std::process::ExitCode;

use integration_tests::story::{self, Binaries, Scenario};

fn main() -> ExitCode {
    let profile = std::env::var("STARPILOT_DEMO_PROFILE").unwrap_or_else(|_| "debug".into());
    let bins = match Binaries::in_target_dir(&profile) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("starpilot-demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (work, keep) = match std::env::args_os().nth(1) {
        Some(dir) => (PathBuf::from(dir), true),
        None => (
            std::env::temp_dir().join(format!("starpilot-demo-{}", std::process::id())),
            false,
        ),
    };
    if work.exists()
        && std::fs::read_dir(&work)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        eprintln!(
            "starpilot-demo: {} is not empty; give an empty or new directory",
            work.display()
        );
        return ExitCode::FAILURE;
    }
    let result = story::play(&bins, &Scenario::default(), &work, true);
    let code = match result {
        Ok(report) => {
            println!("\n6. report\n");
            print!("{report}");
            println!(
                "\nGitHub Models branch commits, oldest first (one per artifact file, manifest last):"
            );
            for c in &report.github_commits {
                println!("  {c}");
            }
            println!("\ndone in {:.1} s", report.seconds);
            if keep {
                println!(
                    "everything is in {} (store/, models-checkout/, device/)",
                    work.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("starpilot-demo: {e}");
            ExitCode::FAILURE
        }
    };
    if !keep {
        let _ = std::fs::remove_dir_all(&work);
    }
    code
}
