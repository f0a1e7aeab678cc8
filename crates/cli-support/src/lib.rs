//! What the two binaries' fronts share and nothing else: shell completion scripts that work past
//! the first word, stdout writes that survive a closed pipe (`| head -c1`), the `-q`/`-v`/`--color`
//! output flags and the colour rule (`NO_COLOR`), the failure both report through ([`Failure`],
//! [`NextStep`]), the layout of a download's progress line ([`progress`]), stopping on
//! SIGTERM/SIGINT ([`stop`]) and RFC 3339 times ([`time`]).

use std::ffi::OsStr;
#[cfg(feature = "cli")]
use std::ffi::OsString;
use std::io::{self, IsTerminal, Write};
use std::sync::OnceLock;

#[cfg(feature = "cli")]
use clap_complete::Shell;

pub mod hints;
pub mod progress;
pub mod stop;
pub mod time;

pub use stop::stop_on_signals;

/// Quote one word for a POSIX shell, so a command printed for a person runs as printed: words
/// made only of safe characters stay as they are, others go in single quotes.
pub fn shell_quote(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The completion script for `shell`, for a binary installed as `bin`.
///
/// clap_complete's bash generator (4.6) spells the state of a hyphenated binary two ways: its
/// word loop sets `release__cli__subcmd__chunk` while the `case` arms are labelled
/// `release__subcmd__cli__subcmd__chunk`, so no arm past the first word ever matches and bash
/// falls back to file names. The arms are relabelled the way the loop spells them.
///
/// `-v`'s help in the script is the binary's own (the text [`parse`] was given), as in `--help`.
#[cfg(feature = "cli")]
pub fn completion_script(shell: Shell, cmd: &mut clap::Command, bin: &str) -> Vec<u8> {
    let mut script = Vec::new();
    if let Some(help) = VERBOSE_HELP.get() {
        *cmd = std::mem::take(cmd).mut_arg("verbose", |a| a.help(*help));
    }
    clap_complete::generate(shell, cmd, bin, &mut script);
    if shell == Shell::Bash && bin.contains('-') {
        let text = String::from_utf8_lossy(&script);
        return relabel_bash_arms(&text, bin).into_bytes();
    }
    script
}

/// Rewrite `case` arm labels spelled `a__subcmd__b[__subcmd__…])` for a binary `a-b` to the
/// loop's spelling `a__b[__subcmd__…])`. Only lines that start (after indentation) with the wrong
/// spelling followed by `)` or a subcommand separator are touched.
#[cfg(feature = "cli")]
fn relabel_bash_arms(script: &str, bin: &str) -> String {
    const SEP: &str = "__subcmd__";
    let wrong = bin.replace('-', SEP);
    let right = bin.replace('-', "__");
    let mut out = String::with_capacity(script.len());
    for line in script.split_inclusive('\n') {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        match body.strip_prefix(&wrong) {
            Some(rest) if rest.starts_with(')') || rest.starts_with(SEP) => {
                out.push_str(indent);
                out.push_str(&right);
                out.push_str(rest);
            }
            _ => out.push_str(line),
        }
    }
    out
}

/// Write bytes to stdout and flush. A closed pipe (`| head -c1`) ends the output quietly: it is
/// `Ok(false)`, so the caller stops writing; any other error is returned.
pub fn write_stdout(bytes: &[u8]) -> io::Result<bool> {
    let mut out = io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e),
    }
}

/// What to do next after an error, kept apart from its message: the `next:` line a binary
/// prints under `error:` and the `next` of a `--json` error document. Every crate's error enum
/// implements it (`None` where the message already says all there is to do); nothing glues a
/// `"\nnext: …"` into a message.
pub trait NextStep {
    fn next_step(&self) -> Option<String>;
}

/// A failure as both binaries report it: the exit code, its stable snake_case `kind` (each
/// binary names its own codes), the message, and the next step on a line of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: u8,
    pub kind: &'static str,
    pub message: String,
    pub next: Option<String>,
    /// The command already printed its `--json` document, which says what failed (a
    /// validation report before exit 3), so no error document follows it.
    pub json_printed: bool,
}

impl Failure {
    pub fn new(code: u8, kind: &'static str, message: impl std::fmt::Display) -> Self {
        Failure {
            code,
            kind,
            message: message.to_string(),
            next: None,
            json_printed: false,
        }
    }

    /// A failure from an error: its message and its [`NextStep`].
    pub fn from_error<E: std::fmt::Display + NextStep + ?Sized>(
        code: u8,
        kind: &'static str,
        e: &E,
    ) -> Self {
        Failure::new(code, kind, e).with_next(e.next_step())
    }

    /// Set (or, with `None`, keep) the next step.
    pub fn with_next(mut self, next: Option<impl Into<String>>) -> Self {
        if let Some(n) = next {
            self.next = Some(n.into());
        }
        self
    }

    /// Mark that the command's `--json` document, which says what failed, is already out.
    pub fn after_json_report(mut self) -> Self {
        self.json_printed = true;
        self
    }

    /// What stderr shows: `error: MESSAGE`, then `next: NEXT` on its own line (also with `-q`:
    /// an error's next step is part of the error). An empty message prints nothing.
    pub fn stderr_text(&self) -> String {
        if self.message.is_empty() {
            return String::new();
        }
        let next = self.next.as_ref().map(|n| format!("next: {n}\n"));
        format!("error: {}\n{}", self.message, next.unwrap_or_default())
    }

    /// Print the failure on stderr and, for a `--json` command, one error document
    /// `{"error":{"kind","message","next"}}` on stdout; the exit code is the same either way.
    pub fn report(&self, json: bool) -> std::process::ExitCode {
        eprint!("{}", self.stderr_text());
        if json && !self.json_printed {
            // The exit code says the same; a closed pipe changes nothing now.
            let _ = write_stdout(self.json_document().as_bytes());
        }
        std::process::ExitCode::from(self.code)
    }

    /// The one-line `--json` error document.
    pub fn json_document(&self) -> String {
        let doc = serde_json::json!({"error": {
            "kind": self.kind, "message": self.message, "next": self.next}});
        format!("{doc}\n")
    }
}

/// `--color WHEN`: `auto` colours a terminal unless `NO_COLOR` is set; the flag, asked for on
/// this one run, overrides `NO_COLOR` (<https://no-color.org>).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

/// Whether to colour (and style) output on a stream: `--color always`/`never` decide; `auto`
/// colours only a terminal, and never when `NO_COLOR` is set to a non-empty value.
pub fn use_colour(is_terminal: bool, no_color: Option<&OsStr>, flag: ColorChoice) -> bool {
    match flag {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => is_terminal && no_color.is_none_or(|v| v.is_empty()),
    }
}

/// How much a binary says on stderr besides errors (`-q`, default, `-v`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verbosity {
    /// Errors, warnings and the requested output only.
    Quiet,
    Normal,
    /// Each step as well.
    Verbose,
}

/// The output flags both binaries take before or after any subcommand.
#[cfg(feature = "cli")]
#[derive(Debug, Clone, clap::Args)]
pub struct OutputFlags {
    /// Print only the requested output on stdout plus errors and warnings on stderr: no progress
    /// bars or percentages, no informational lines, no `next:` hints. Exit codes are unchanged.
    #[arg(
        short,
        long,
        global = true,
        conflicts_with = "verbose",
        help_heading = "Output options"
    )]
    pub quiet: bool,
    /// Also print each step on stderr (what the binary's --help says under this flag). `-vv`
    /// (or more) is accepted and means the same.
    #[arg(
        short,
        long,
        global = true,
        action = clap::ArgAction::Count,
        help_heading = "Output options"
    )]
    pub verbose: u8,
    /// When to colour output (manifest diff, log lines, clap's help and errors): auto colours a
    /// terminal unless NO_COLOR is set to a non-empty value; always and never override NO_COLOR.
    /// Progress bars never use colour.
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "WHEN",
        default_value_t = ColorChoice::Auto,
        help_heading = "Output options"
    )]
    pub color: ColorChoice,
}

#[cfg(feature = "cli")]
impl OutputFlags {
    pub fn verbosity(&self) -> Verbosity {
        match (self.quiet, self.verbose) {
            (true, _) => Verbosity::Quiet,
            (false, 0) => Verbosity::Normal,
            (false, _) => Verbosity::Verbose,
        }
    }
}

static FLAGS: OnceLock<(Verbosity, ColorChoice)> = OnceLock::new();

/// The binary's help for `-v`, recorded by [`parse`] for [`completion_script`].
#[cfg(feature = "cli")]
static VERBOSE_HELP: OnceLock<&'static str> = OnceLock::new();

/// Whether the parsed subcommand's `--json` was given, recorded by [`parse`].
static JSON: OnceLock<bool> = OnceLock::new();

/// Whether the command [`parse`] parsed asked for `--json` (its innermost subcommand's `json`
/// flag; `false` before parsing): a failure then also prints a JSON error document.
pub fn json_requested() -> bool {
    JSON.get().copied().unwrap_or(false)
}

/// The run's verbosity, set once by [`parse`] (`Normal` before that, e.g. in unit tests).
pub fn verbosity() -> Verbosity {
    FLAGS.get().map_or(Verbosity::Normal, |f| f.0)
}

/// Whether this run colours stdout (`stderr: false`) or stderr: [`use_colour`] over that stream,
/// `NO_COLOR` and the `--color` that [`parse`] recorded.
pub fn colour_on(stderr: bool) -> bool {
    let tty = if stderr {
        io::stderr().is_terminal()
    } else {
        io::stdout().is_terminal()
    };
    let flag = FLAGS.get().map_or(ColorChoice::Auto, |f| f.1);
    use_colour(tty, std::env::var_os("NO_COLOR").as_deref(), flag)
}

/// An informational line on stderr, left out with `-q`.
#[macro_export]
macro_rules! info {
    ($($arg:tt)*) => {
        if $crate::verbosity() >= $crate::Verbosity::Normal {
            $crate::info_line(format_args!($($arg)*));
        }
    };
}

thread_local! {
    /// The lines [`info!`] printed on this thread while [`capture_info`] runs.
    static INFO_SINK: std::cell::RefCell<Option<Vec<String>>> = const { std::cell::RefCell::new(None) };
}

/// Print one [`info!`] line on stderr (or, inside [`capture_info`] on this thread, keep it).
#[doc(hidden)]
pub fn info_line(args: std::fmt::Arguments<'_>) {
    INFO_SINK.with(|s| match s.borrow_mut().as_mut() {
        Some(lines) => lines.push(args.to_string()),
        None => eprintln!("{args}"),
    });
}

/// Run `f` and return, with its result, the [`info!`] lines it printed on this thread (the
/// `next:` lines a command prints on success, for the binaries' hint tests).
pub fn capture_info<R>(f: impl FnOnce() -> R) -> (R, Vec<String>) {
    let previous = INFO_SINK.with(|s| s.borrow_mut().replace(Vec::new()));
    let r = f();
    let lines = INFO_SINK.with(|s| std::mem::replace(&mut *s.borrow_mut(), previous));
    (r, lines.unwrap_or_default())
}

/// A step's line on stderr, printed only with `-v`.
#[macro_export]
macro_rules! detail {
    ($($arg:tt)*) => {
        if $crate::verbosity() >= $crate::Verbosity::Verbose {
            eprintln!($($arg)*);
        }
    };
}

/// The last `--color WHEN` (or `--color=WHEN`) before a `--` in `args`; clap checks the value
/// itself later, so an unknown one here is `auto`.
#[cfg(feature = "cli")]
fn color_flag(args: &[OsString]) -> ColorChoice {
    use clap::ValueEnum;
    let mut choice = ColorChoice::Auto;
    let mut it = args.iter().skip(1).map(|a| a.to_string_lossy());
    while let Some(a) = it.next() {
        let value = match a.as_ref() {
            "--" => break,
            "--color" => it.next().map(|v| v.into_owned()),
            other => other.strip_prefix("--color=").map(str::to_string),
        };
        if let Some(v) = value {
            choice = ColorChoice::from_str(&v, false).unwrap_or(ColorChoice::Auto);
        }
    }
    choice
}

/// Parse the process's arguments into `C`, with clap's own styling (help, errors) coloured by
/// the same rule as the rest of the output, `verbose_help` as `-v`'s help, and the run's
/// verbosity recorded for [`info!`] and [`detail!`]. `flags` picks the [`OutputFlags`] out of `C`.
#[cfg(feature = "cli")]
pub fn parse<C: clap::Parser>(verbose_help: &'static str, flags: fn(&C) -> &OutputFlags) -> C {
    let args: Vec<OsString> = std::env::args_os().collect();
    let colour = use_colour(
        io::stdout().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
        color_flag(&args),
    );
    let _ = VERBOSE_HELP.set(verbose_help);
    let cmd = C::command()
        .color(if colour {
            clap::ColorChoice::Always
        } else {
            clap::ColorChoice::Never
        })
        .mut_arg("verbose", |a| a.help(verbose_help));
    let exit = |e: clap::Error| -> ! {
        if let Some(doc) = usage_error_json(&args, &e) {
            let _ = write_stdout(doc.as_bytes());
        }
        e.exit()
    };
    let matches = cmd
        .clone()
        .try_get_matches_from(&args)
        .unwrap_or_else(|e| exit(e));
    let cli = C::from_arg_matches(&matches).unwrap_or_else(|e| exit(e.format(&mut cmd.clone())));
    let f = flags(&cli);
    let _ = FLAGS.set((f.verbosity(), f.color));
    let _ = JSON.set(json_flag(&matches));
    cli
}

/// The `json` flag of the innermost subcommand in `matches` (`false` where it has none).
#[cfg(feature = "cli")]
fn json_flag(matches: &clap::ArgMatches) -> bool {
    match matches.subcommand() {
        Some((_, sub)) => json_flag(sub),
        None => matches!(matches.try_get_one::<bool>("json"), Ok(Some(true))),
    }
}

/// The error document for a usage error the argument parser found itself (an unknown flag, a
/// missing argument, a bad value) when `--json` was asked for before any `--`: kind `usage`, the
/// exit code stays clap's 2. `None` without `--json`, and for `--help`/`--version` (success).
#[cfg(feature = "cli")]
fn usage_error_json(args: &[OsString], e: &clap::Error) -> Option<String> {
    let json = args
        .iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "--json");
    if !json || e.exit_code() == 0 {
        return None;
    }
    let text = e.render().to_string();
    let text = text.split("\n\nUsage:").next().unwrap_or_default();
    let text = text
        .split("\n\nFor more information")
        .next()
        .unwrap_or_default();
    let message = text.trim().strip_prefix("error: ").unwrap_or(text.trim());
    let failure = Failure::new(2, "usage", message)
        .with_next(Some("run the command with --help for its arguments"));
    Some(failure.json_document())
}

#[cfg(test)]
#[cfg(feature = "cli")]
mod tests {
    /// Safe words as they are, every other word one single-quoted shell word.
    #[test]
    fn quoting() {
        use super::shell_quote;
        assert_eq!(shell_quote("/data/x_1.pkl"), "/data/x_1.pkl");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("$(rm -rf /)"), "'$(rm -rf /)'");
    }

    #[test]
    fn capture_info_keeps_this_threads_lines() {
        let ((), lines) = super::capture_info(|| {
            crate::info!("next: `a` {}", 1);
            let ((), inner) = super::capture_info(|| crate::info!("inner"));
            assert_eq!(inner, vec!["inner"]);
            crate::info!("after");
        });
        assert_eq!(lines, vec!["next: `a` 1", "after"]);
        // Outside a capture nothing is kept.
        let ((), none) = super::capture_info(|| ());
        assert!(none.is_empty());
    }

    use super::*;

    #[test]
    fn arms_take_the_loop_spelling_and_nothing_else_moves() {
        let script = "\
            release__cli,chunk)\n\
                cmd=\"release__cli__subcmd__chunk\"\n\
        release__cli)\n\
        release__subcmd__cli__subcmd__chunk)\n\
        release__subcmd__cli__subcmd__chunk__subcmd__split)\n\
        release__subcmd__clix)\n";
        assert_eq!(
            relabel_bash_arms(script, "release-cli"),
            "\
            release__cli,chunk)\n\
                cmd=\"release__cli__subcmd__chunk\"\n\
        release__cli)\n\
        release__cli__subcmd__chunk)\n\
        release__cli__subcmd__chunk__subcmd__split)\n\
        release__subcmd__clix)\n"
        );
    }

    #[test]
    fn two_hyphens() {
        assert_eq!(
            relabel_bash_arms(
                "  device__subcmd__modeld__subcmd__manager__subcmd__gc)\n",
                "device-modeld-manager"
            ),
            "  device__modeld__manager__subcmd__gc)\n"
        );
    }

    #[test]
    fn a_failure_prints_its_next_step_on_its_own_line_and_in_its_json() {
        struct E;
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("no origin served a manifest")
            }
        }
        impl NextStep for E {
            fn next_step(&self) -> Option<String> {
                Some("run `refresh` again".into())
            }
        }
        let f = Failure::from_error(4, "manifest_unavailable", &E);
        assert_eq!(
            f.stderr_text(),
            "error: no origin served a manifest\nnext: run `refresh` again\n"
        );
        let v: serde_json::Value = serde_json::from_str(&f.json_document()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {"kind": "manifest_unavailable",
                "message": "no origin served a manifest", "next": "run `refresh` again"}})
        );
        let plain = Failure::new(1, "failure", "boom").with_next(None::<String>);
        assert_eq!(plain.stderr_text(), "error: boom\n");
        assert_eq!(plain.json_document().lines().count(), 1);
        let multiline = Failure::new(1, "failure", "a\nb");
        assert_eq!(multiline.json_document().lines().count(), 1, "one line");
        assert_eq!(Failure::new(3, "check_failed", "").stderr_text(), "");
    }

    /// Regression: `-vv` was refused as a repeated flag.
    #[test]
    fn v_may_be_repeated_and_q_still_excludes_it() {
        #[derive(clap::Parser)]
        struct C {
            #[command(flatten)]
            out: OutputFlags,
        }
        use clap::Parser;
        for (args, want) in [
            (&["x"][..], Some(Verbosity::Normal)),
            (&["x", "-v"], Some(Verbosity::Verbose)),
            (&["x", "-vv"], Some(Verbosity::Verbose)),
            (&["x", "-v", "--verbose", "-v"], Some(Verbosity::Verbose)),
            (&["x", "-q"], Some(Verbosity::Quiet)),
            (&["x", "-q", "-v"], None),
        ] {
            let got = C::try_parse_from(args).ok().map(|c| c.out.verbosity());
            assert_eq!(got, want, "{args:?}");
        }
    }

    #[test]
    fn colour_table() {
        use ColorChoice::{Always, Auto, Never};
        for (tty, env, flag, want) in [
            (true, None, Auto, true),
            (false, None, Auto, false),
            (true, Some(""), Auto, true),
            (true, Some("1"), Auto, false),
            (false, Some("1"), Auto, false),
            // The flag is this run's explicit ask: it overrides NO_COLOR and the terminal test.
            (false, None, Always, true),
            (true, Some("1"), Always, true),
            (true, None, Never, false),
            (false, Some(""), Never, false),
        ] {
            assert_eq!(
                use_colour(tty, env.map(OsStr::new), flag),
                want,
                "{tty} {env:?} {flag:?}"
            );
        }
    }

    #[test]
    fn the_colour_flag_is_found_before_parsing() {
        let args = |a: &[&str]| -> Vec<OsString> { a.iter().map(OsString::from).collect() };
        for (a, want) in [
            (&["bin", "status"][..], ColorChoice::Auto),
            (&["bin", "--color", "never", "status"], ColorChoice::Never),
            (&["bin", "status", "--color=always"], ColorChoice::Always),
            (
                &["bin", "--color=never", "x", "--color", "always"],
                ColorChoice::Always,
            ),
            (&["bin", "--", "--color=never"], ColorChoice::Auto),
            (&["bin", "--color", "purple"], ColorChoice::Auto),
            (&["bin", "--color"], ColorChoice::Auto),
        ] {
            assert_eq!(color_flag(&args(a)), want, "{a:?}");
        }
    }

    #[derive(clap::Parser, Debug)]
    #[command(name = "bin", version)]
    struct TestCli {
        #[command(flatten)]
        output: OutputFlags,
        #[command(subcommand)]
        cmd: TestCmd,
    }

    #[derive(clap::Subcommand, Debug)]
    enum TestCmd {
        Verify {
            #[arg(long)]
            json: bool,
            #[arg(long)]
            sha256: String,
        },
    }

    fn json_for(a: &[&str]) -> Option<serde_json::Value> {
        use clap::Parser;
        let args: Vec<OsString> = a.iter().map(OsString::from).collect();
        let e = TestCli::try_parse_from(&args).unwrap_err();
        usage_error_json(&args, &e).map(|d| {
            assert_eq!(d.lines().count(), 1, "one line: {d}");
            serde_json::from_str(&d).unwrap()
        })
    }

    /// Regression: `--json` with a missing argument or a bad flag printed clap's text only, no
    /// error document.
    #[test]
    fn parser_usage_errors_with_json_are_one_document() {
        let v = json_for(&["bin", "verify", "--json"]).unwrap();
        assert_eq!(v["error"]["kind"], "usage");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("--sha256"), "{msg}");
        assert!(
            !msg.starts_with("error:") && !msg.contains("Usage:"),
            "{msg}"
        );
        assert!(v["error"]["next"].as_str().unwrap().contains("--help"));
        let v = json_for(&["bin", "verify", "--json", "--bogus", "--sha256", "x"]).unwrap();
        assert!(v["error"]["message"].as_str().unwrap().contains("--bogus"));
        // Without --json, after `--`, and for --help/--version: no document.
        assert_eq!(json_for(&["bin", "verify"]), None);
        assert_eq!(json_for(&["bin", "verify", "--", "--json"]), None);
        assert_eq!(json_for(&["bin", "verify", "--json", "--help"]), None);
        assert_eq!(json_for(&["bin", "--version", "--json"]), None);
    }

    /// A failure's JSON document follows the innermost subcommand's own `--json`.
    #[test]
    fn the_json_flag_is_the_innermost_subcommands() {
        use clap::CommandFactory;
        let flag = |a: &[&str]| json_flag(&TestCli::command().try_get_matches_from(a).unwrap());
        assert!(flag(&["bin", "verify", "--json", "--sha256", "x"]));
        assert!(!flag(&["bin", "verify", "--sha256", "x"]));
        assert!(!flag(&["bin", "-q", "verify", "--sha256=--json"]));
    }

    #[test]
    fn completion_scripts_carry_the_binarys_verbose_help() {
        use clap::CommandFactory;
        let _ = VERBOSE_HELP.set("Also print each upload on stderr");
        let want = *VERBOSE_HELP.get().unwrap();
        let script = completion_script(Shell::Fish, &mut TestCli::command(), "bin");
        let script = String::from_utf8(script).unwrap();
        assert!(script.contains(want), "{script}");
        assert!(
            !script.contains("what the binary's --help says"),
            "{script}"
        );
    }

    #[test]
    fn verbosity_of_the_flags() {
        let f = |quiet, verbose| OutputFlags {
            quiet,
            verbose,
            color: ColorChoice::Auto,
        };
        assert_eq!(f(false, 0).verbosity(), Verbosity::Normal);
        assert_eq!(f(true, 0).verbosity(), Verbosity::Quiet);
        assert_eq!(f(false, 1).verbosity(), Verbosity::Verbose);
        assert_eq!(f(false, 2).verbosity(), Verbosity::Verbose);
        assert!(Verbosity::Quiet < Verbosity::Normal && Verbosity::Normal < Verbosity::Verbose);
    }
}
