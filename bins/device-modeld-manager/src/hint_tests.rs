//! Every next step the device's refusals and failures print runs as printed: each scenario runs
//! in-process through the binary's own parser and `run`, and every command its failure names
//! (the `next:` line, also the `next` of the `--json` error document, and the commands in its
//! message) is checked against `Cli::command()` by [`test_support::hints::check_hint`].

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};
use cli_support::Failure;
use test_support::hints::check_hint;

use crate::Cli;

const BIN: &str = "device-modeld-manager";
/// A made-up next generation's tinygrad pin.
const V26_PIN: &str = "26262626262626262626262626262626262626aa";
/// An origin nothing listens on.
const DEAD: &str = "http://127.0.0.1:9";

/// A comma under a temporary directory, its origins dead; the tree at tinygrad `pin` with
/// `pins` as its pins file.
struct Comma {
    dir: tempfile::TempDir,
}

impl Comma {
    fn new(pin: &str, pins: Option<String>) -> Comma {
        let dir = tempfile::tempdir().unwrap();
        for d in ["data", "shm", "builtin", "sys", "openpilot/tinygrad_repo"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let op = dir.path().join("openpilot");
        std::fs::write(op.join("tinygrad_repo/TINYGRAD_COMMIT"), format!("{pin}\n")).unwrap();
        if let Some(p) = pins {
            std::fs::write(op.join("tinygrad_pins.json"), p).unwrap();
        }
        Comma { dir }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// `device-modeld-manager` with this comma's directories and `args`, in-process; the failure.
    fn run(&self, args: &[&str]) -> Option<Failure> {
        let own: Vec<String> = [
            ("--data-dir", self.path("data")),
            ("--openpilot-dir", self.path("openpilot")),
            ("--builtin-dir", self.path("builtin")),
            ("--memory-params-dir", self.path("shm")),
            ("--sysfs-root", self.path("sys")),
        ]
        .into_iter()
        .flat_map(|(f, p)| [f.to_string(), p.display().to_string()])
        .chain(
            [
                "--hf-base",
                DEAD,
                "--github-base",
                DEAD,
                "--space-margin-mib",
                "0",
            ]
            .map(String::from),
        )
        .collect();
        let argv = std::iter::once(BIN)
            .chain(own.iter().map(String::as_str))
            .chain(args.iter().copied());
        let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        crate::run(cli).err()
    }

    /// Whether the data root holds nothing a refusal may have written.
    fn untouched(&self) -> bool {
        snapshot(&self.path("data")).is_empty()
    }
}

fn snapshot(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            out.push(e.path());
            out.extend(snapshot(&e.path()));
        }
    }
    out
}

#[derive(Default)]
struct Collector {
    hints: Vec<(String, String)>,
    problems: Vec<String>,
}

impl Collector {
    fn check(&mut self, scenario: &str, hint: &str) {
        for p in check_hint(&Cli::command(), BIN, hint) {
            self.problems
                .push(format!("{scenario}: {p}\n    in: {hint}"));
        }
        self.hints.push((scenario.to_string(), hint.to_string()));
    }

    fn failing(&mut self, scenario: &str, comma: &Comma, args: &[&str]) -> Failure {
        let f = comma
            .run(args)
            .unwrap_or_else(|| panic!("{scenario}: {args:?} succeeded"));
        assert!(f.next.is_some() || !f.message.is_empty(), "{scenario}");
        for h in f
            .next
            .iter()
            .cloned()
            .chain(f.message.lines().map(String::from))
        {
            self.check(scenario, &h);
        }
        f
    }

    fn finish(self, with_next: usize) {
        for (s, h) in &self.hints {
            eprintln!("hint [{s}]: {h}");
        }
        assert!(
            self.problems.is_empty(),
            "hints that do not run as printed:\n{}",
            self.problems.join("\n")
        );
        assert!(self.hints.len() >= with_next, "{:?}", self.hints);
    }
}

/// Device refusals and failures on a v25 tree, a tree bumped to a made-up v26, and a tree whose
/// tinygrad no table knows: no origin, unknown models, a generation flag that disagrees.
#[test]
fn device_failures_print_hints_that_run() {
    let v25 = manifest::layout::CURRENT_TINYGRAD_COMMIT;
    let v26_pins = format!("{{\n  \"v25\": \"{v25}\",\n  \"v26\": \"{V26_PIN}\"\n}}\n");
    let mut c = Collector::default();
    for (name, pin, pins) in [("v25", v25, None), ("v26", V26_PIN, Some(v26_pins.clone()))] {
        let scenarios: &[(&str, &[&str])] = &[
            ("refresh with no origin", &["refresh"]),
            (
                "refresh --dry-run with no origin",
                &["refresh", "--dry-run"],
            ),
            (
                "download of a model no catalog lists",
                &["download", "pop223"],
            ),
            ("download --all with no catalog", &["download", "--all"]),
            ("verify of a model not installed", &["verify", "pop223"]),
            (
                "--generation that is not the tree's",
                &["--generation", "v24", "status"],
            ),
        ];
        for (scenario, args) in scenarios {
            let comma = Comma::new(pin, pins.clone());
            c.failing(&format!("{name}: {scenario}"), &comma, args);
            if args.contains(&"--dry-run") || args.contains(&"--generation") {
                assert!(comma.untouched(), "{name}: {scenario} wrote the data root");
            }
        }
    }
    // A tree whose tinygrad no table knows: the device pauses; a download is refused.
    let unknown = Comma::new("0123456789abcdef0123456789abcdef01234567", None);
    c.failing(
        "unknown tinygrad: download",
        &unknown,
        &["download", "pop223"],
    );
    c.finish(6);
}
