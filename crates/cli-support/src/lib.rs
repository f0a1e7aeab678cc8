//! What the two binaries' fronts share and nothing else: shell completion scripts that work past
//! the first word, and stdout writes that survive a closed pipe (`| head -c1`).

use std::io::{self, Write};

use clap_complete::Shell;

/// The completion script for `shell`, for a binary installed as `bin`.
///
/// clap_complete's bash generator (4.6) spells the state of a hyphenated binary two ways: its
/// word loop sets `release__cli__subcmd__chunk` while the `case` arms are labelled
/// `release__subcmd__cli__subcmd__chunk`, so no arm past the first word ever matches and bash
/// falls back to file names. The arms are relabelled the way the loop spells them.
pub fn completion_script(shell: Shell, cmd: &mut clap::Command, bin: &str) -> Vec<u8> {
    let mut script = Vec::new();
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

/// The one JSON document a `--json` command prints on stdout when it fails:
/// `{"error":{"kind","message","next"}}`. A message's `next: …` line (the convention of both
/// binaries) becomes `next` (`null` without one); `kind` is a stable snake_case name of the exit
/// code.
pub fn error_json(kind: &str, message: &str) -> String {
    let (message, next) = match message.split_once("\nnext: ") {
        Some((m, n)) => (m, Some(n.trim_end())),
        None => (message, None),
    };
    let doc = serde_json::json!({"error": {"kind": kind, "message": message, "next": next}});
    format!("{doc}\n")
}

/// Whether to colour output on a stream: only on a terminal, and never when `NO_COLOR` is set to
/// a non-empty value (<https://no-color.org>).
pub fn use_color(is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
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
    fn error_documents_split_off_the_next_step() {
        let v: serde_json::Value = serde_json::from_str(&error_json(
            "manifest_unavailable",
            "no origin served a manifest\nnext: run `refresh` again",
        ))
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {"kind": "manifest_unavailable",
                "message": "no origin served a manifest", "next": "run `refresh` again"}})
        );
        let v: serde_json::Value = serde_json::from_str(&error_json("failure", "boom")).unwrap();
        assert_eq!(v["error"]["next"], serde_json::Value::Null);
        assert_eq!(error_json("failure", "a\nb").lines().count(), 1, "one line");
    }

    #[test]
    fn color_table() {
        use std::ffi::OsStr;
        for (tty, env, want) in [
            (true, None, true),
            (false, None, false),
            (true, Some(""), true),
            (true, Some("1"), false),
            (false, Some("1"), false),
        ] {
            assert_eq!(use_color(tty, env.map(OsStr::new)), want, "{tty} {env:?}");
        }
    }
}
