//! What a person sees in an 80×24 terminal (issue 37): the real binary in a real terminal,
//! tmux, against the fault server. `download` of a model with a 16-character id draws one
//! indicatif bar that is redrawn in place (one line for the whole download, the label, bytes
//! and ETA on it, nothing wrapped), and a foreground `run` logs a download that fell back from
//! Hugging Face to GitHub and a download that failed on both, each line stamped with the time,
//! the finished one with size, time, origin and rate, each origin named once. v25 on its flat
//! layout; v26 and a made-up v27 on a tree declaring upstream's v26 contract, where the
//! independent checker (`test_support::upstream_v26`) then reads the device as upstream's v26
//! code does: the install verified where it looks for it, the job in the state it expects.
//!
//! tmux is a real component: without it the test skips with a message, and fails when
//! `STARPILOT_REQUIRE_TMUX=1` (set by `.ci/run`, which installs it).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use test_support::http_server::{Fault, ServerConfig};
use test_support::published::{artifact_bytes, manifest_json, publish_model, write_manifest};
use test_support::upstream_v26::{Runtime, contract_manifest};

const REQUIRE_TMUX: &str = "STARPILOT_REQUIRE_TMUX";
const MIB: usize = 1024 * 1024;
/// Real catalog ids are this long; the bar must still fit 80 columns.
const LONG_ID: &str = "northstar-v3-big";
const BROKEN_ID: &str = "brokenmodel-0001";

/// A tmux server of this test's own (its own socket), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// `None` (after the skip message) when there is no tmux and CI does not require one.
    fn start() -> Option<Tmux> {
        let found = Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            let reason = "tmux is not installed (apt-get install tmux); the 80-column terminal \
                          test is not run";
            assert!(
                std::env::var(REQUIRE_TMUX).as_deref() != Ok("1"),
                "{reason} ({REQUIRE_TMUX}=1: CI requires this test to run)"
            );
            test_support::skip::skipped(reason);
            return None;
        }
        let socket = format!(
            "starpilot-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        )
        .replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "");
        Some(Tmux { socket })
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "tmux {args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Run `script` in a new 80×24 session `name`; the pane stays after it ends.
    fn run(&self, name: &str, script: &Path) {
        self.tmux(&[
            "new-session",
            "-d",
            "-x",
            "80",
            "-y",
            "24",
            "-s",
            name,
            &format!("sh {}", script.display()),
            ";",
            "set-option",
            "-g",
            "remain-on-exit",
            "on",
        ]);
    }

    /// The pane's visible lines, as drawn (a wrapped line is two lines here).
    fn screen(&self, name: &str) -> Vec<String> {
        lines(&self.tmux(&["capture-pane", "-p", "-t", &pane(name)]))
    }

    /// Everything the pane showed, history included, wrapped lines joined.
    fn joined(&self, name: &str) -> Vec<String> {
        lines(&self.tmux(&["capture-pane", "-p", "-J", "-S", "-", "-t", &pane(name)]))
    }

    /// Everything the pane showed, history included, as drawn.
    fn drawn(&self, name: &str) -> Vec<String> {
        lines(&self.tmux(&["capture-pane", "-p", "-S", "-", "-t", &pane(name)]))
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

/// The one pane of session `name`, exactly (a bare name may also match a window's name, which
/// tmux renames after the running command).
fn pane(name: &str) -> String {
    format!("={name}:0.0")
}

fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.trim_end().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// A script that runs `cmd` (its stderr the terminal), then says how it ended and stays.
fn script(dir: &Path, name: &str, cmd: &Command) -> PathBuf {
    let quote = |s: &std::ffi::OsStr| format!("'{}'", s.to_string_lossy().replace('\'', r"'\''"));
    let mut line = quote(cmd.get_program());
    for a in cmd.get_args() {
        line.push(' ');
        line.push_str(&quote(a));
    }
    let path = dir.join(format!("{name}.sh"));
    fs::write(
        &path,
        // Ctrl-C reaches the whole foreground group: the shell waits it out (a trap) and says
        // how the program ended.
        format!(
            "trap : INT\n{line} >{}/{name}.out\necho \"EXIT:$?\"\nsleep 600\n",
            dir.display()
        ),
    )
    .unwrap();
    path
}

/// `2026-12-06T09:30:01Z device-modeld-manager: ` at the start of `line`.
fn stamped(line: &str) -> bool {
    let b = line.as_bytes();
    let digits = |r: std::ops::Range<usize>| r.into_iter().all(|i| b[i].is_ascii_digit());
    b.len() > 21
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[10] == b'T'
        && b[19] == b'Z'
        && line[20..].starts_with(" device-modeld-manager: ")
}

/// Bar lines of `label` in `lines` (`label [=====>   ] …`).
fn bars<'a>(lines: &'a [String], label: &str) -> Vec<&'a String> {
    let start = format!("{label} [");
    lines.iter().filter(|l| l.starts_with(&start)).collect()
}

fn terminal_shows_the_bar_and_the_log(generation: &str) {
    let Some(tmux) = Tmux::start() else { return };
    let device = Device::new();
    // v25: the flat layout; a later generation: a tree declaring upstream's v26 contract.
    let rows = contract_rows(&[LONG_ID, BROKEN_ID]);
    let upstream = (generation != "v25").then(|| device.declare(generation, &rows));
    let root = device.dir.path().join("origin");
    let good = publish_model(
        &root,
        generation,
        LONG_ID,
        &artifact_bytes(31, 4 * MIB),
        Some(MIB),
    );
    let broken = publish_model(
        &root,
        generation,
        BROKEN_ID,
        &artifact_bytes(32, MIB),
        Some(MIB),
    );
    let manifest = match &upstream {
        None => manifest_json(generation, &[good, broken], true).into_bytes(),
        Some(rt) => contract_manifest(rt, &rows, &[good, broken]),
    };
    write_manifest(&root, generation, &manifest);
    // Where the model is installed, as upstream's reader looks for it on a contract's tree.
    let installed = match &upstream {
        None => device
            .models()
            .join(format!("{LONG_ID}_driving_tinygrad.pkl")),
        Some(_) => Runtime::artifact_path(&device.root(generation), LONG_ID, false),
    };
    // About 3 s for the 4 MiB: the bar is redrawn many times.
    let mut config = ServerConfig::new(&root);
    config.rate_per_conn = Some(400 * 1024);
    let server = test_support::http_server::FaultServer::with_config(config).unwrap();
    let base = server.url();
    let out = device.command(&base, &["refresh"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    // 1. `download` on the terminal: one bar, redrawn in place.
    let dir = device.dir.path();
    tmux.run(
        "dl",
        &script(dir, "dl", &device.command(&base, &["download", LONG_ID])),
    );
    let mut seen = std::collections::BTreeSet::new();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let screen = tmux.screen("dl");
        let drawn = bars(&screen, LONG_ID);
        assert!(
            drawn.len() <= 1,
            "more than one bar line:\n{}",
            screen.join("\n")
        );
        seen.extend(drawn.into_iter().cloned());
        if screen.iter().any(|l| l.starts_with("EXIT:")) {
            break;
        }
        assert!(
            Instant::now() < until,
            "download did not end:\n{}",
            screen.join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let all = tmux.drawn("dl");
    let text = all.join("\n");
    assert!(all.iter().any(|l| l == "EXIT:0"), "{text}");
    assert_eq!(
        bars(&all, LONG_ID).len(),
        1,
        "one line for the whole download:\n{text}"
    );
    assert!(seen.len() >= 3, "the bar was redrawn: {seen:#?}");
    for bar in &seen {
        assert!(bar.chars().count() <= 80, "{bar}");
        // Label, bytes, rate and ETA on the one line: nothing wrapped or cut.
        assert!(
            bar.contains("/4.00 MiB ") && bar.contains("/s eta "),
            "{bar}"
        );
    }
    let done = all
        .iter()
        .find(|l| l.starts_with(&format!("downloaded {LONG_ID}: 4.00 MiB in ")))
        .unwrap_or_else(|| panic!("no finished-download line:\n{text}"));
    assert!(
        done.contains(" from Hugging Face (") && done.contains("/s)"),
        "{done}"
    );
    assert_eq!(fs::read(&installed).map(|b| b.len()).ok(), Some(4 * MIB));
    upstream_reads(&device, upstream.as_ref(), generation, "completed");

    // 2. A foreground `run`: a download that falls back, one that fails, in the log.
    fs::remove_file(&installed).unwrap();
    let hf = |id: &str| format!("/hf/models/{generation}/{id}/*");
    server.add_fault(&hf(LONG_ID), Fault::Status(404), None);
    server.add_fault(&hf(BROKEN_ID), Fault::Status(404), None);
    server.add_fault(
        &format!("/gh/{generation}/{BROKEN_ID}/*"),
        Fault::Status(404),
        None,
    );
    let mut run = device.command(&base, &["run", "--poll-ms", "50", "--retry-secs", "1"]);
    run.env("HOME", dir);
    tmux.run("run", &script(dir, "run", &run));
    let wait_line = |what: &str, f: &dyn Fn(&str) -> bool| {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let screen = tmux.screen("run");
            for id in [LONG_ID, BROKEN_ID] {
                assert!(
                    bars(&screen, &format!("Model {id}")).len() <= 1,
                    "more than one bar line of {id}:\n{}",
                    screen.join("\n")
                );
            }
            if let Some(l) = tmux.joined("run").into_iter().find(|l| f(l)) {
                return l;
            }
            assert!(
                Instant::now() < until,
                "no {what} in:\n{}\n(pane: {})",
                tmux.drawn("run").join("\n"),
                tmux.tmux(&[
                    "display-message",
                    "-p",
                    "-t",
                    &pane("run"),
                    "dead=#{pane_dead} status=#{pane_dead_status} signal=#{pane_dead_signal}"
                ])
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_line("start", &|l| l.contains("device-modeld-manager: started:"));
    device.set_mem("ModelToDownload", LONG_ID);
    let fetched = wait_line("finished download", &|l| {
        l.contains(&format!("device-modeld-manager: downloaded {LONG_ID}: "))
    });
    assert!(
        fetched.contains(": 4.00 MiB in ")
            && fetched.contains(" from GitHub (")
            && fetched.ends_with(", after Hugging Face failed"),
        "{fetched}"
    );
    device.set_mem("ModelToDownload", BROKEN_ID);
    let failed = wait_line("failure", &|l| {
        l.contains(&format!("download {BROKEN_ID}: Download failed: "))
    });
    assert!(
        failed.contains("model could not be downloaded and verified")
            && failed.contains("Hugging Face: ")
            && failed.contains("GitHub: "),
        "{failed}"
    );
    for origin in ["/hf", "/gh"] {
        let url = format!("{base}{origin}");
        assert!(
            failed.matches(&format!("({url})")).count() == 0,
            "the origin's base is not repeated beside its URL: {failed}"
        );
    }
    tmux.tmux(&["send-keys", "-t", &pane("run"), "C-c"]);
    wait_line("exit", &|l| l.starts_with("EXIT:"));
    let log = tmux.joined("run");
    let text = log.join("\n");
    assert!(log.iter().any(|l| l == "EXIT:0"), "{text}");
    for l in log.iter().filter(|l| l.contains("device-modeld-manager: ")) {
        // (the terminal echoes the Ctrl-C before the last line)
        let l = l.strip_prefix("^C").unwrap_or(l);
        assert!(stamped(l), "log line without its time: {l}");
    }
    for want in [
        format!("job: download {LONG_ID}"),
        format!("download {LONG_ID}: Downloaded!"),
        format!("job: download {BROKEN_ID}"),
        "stopped:".to_string(),
    ] {
        assert!(
            log.iter().any(|l| l.contains(&want)),
            "missing {want:?}:\n{text}"
        );
    }
    // The bar of the daemon's download was drawn, in place, labelled with the model's name.
    let drawn = tmux.drawn("run");
    assert!(
        bars(&drawn, &format!("Model {LONG_ID}")).len() == 1,
        "{}",
        drawn.join("\n")
    );
    // A download that fetched nothing does not claim its bytes (where the origin's 404 comes
    // after the bar is drawn: a contract that takes the chunk count from the manifest).
    for bar in bars(&drawn, &format!("Model {BROKEN_ID}")) {
        assert!(bar.contains(" 0 B/1.00 MiB "), "{bar}");
    }
    // The fallen-back download verifies for upstream; the failed one is its last job.
    upstream_reads(&device, upstream.as_ref(), generation, "failed");
}

/// On a tree of upstream's v26 contract (`upstream`), what upstream's v26 code reads of the
/// device, read by the independent checker: `LONG_ID` installed where it verifies it, never
/// `BROKEN_ID`; the last job in `state`, no manager holding the download lock.
fn upstream_reads(device: &Device, upstream: Option<&Runtime>, generation: &str, state: &str) {
    let Some(rt) = upstream else { return };
    let root = device.root(generation);
    let entries = rt.catalog(&root);
    assert!(
        Runtime::verified_artifact(&root, LONG_ID, &entries).is_some(),
        "{generation}: upstream does not verify {LONG_ID}: {:?}",
        entries.get(LONG_ID)
    );
    assert_eq!(Runtime::verified_artifact(&root, BROKEN_ID, &entries), None);
    assert_eq!(
        rt.job_status(&root),
        (false, Some(state.to_string())),
        "{generation}: {:?}",
        rt.read_job(&root)
    );
}

mod eighty_columns {
    #[test]
    fn v25() {
        super::terminal_shows_the_bar_and_the_log("v25")
    }
    #[test]
    fn v26() {
        super::terminal_shows_the_bar_and_the_log("v26")
    }
    #[test]
    fn v27() {
        super::terminal_shows_the_bar_and_the_log("v27")
    }
}
