//! Whether a printed next step runs as printed: the commands a hint names for a binary, and the
//! problems the binary's own clap parser finds in each (a subcommand or flag that does not exist,
//! a required flag left out, a placeholder the hint does not explain). The binaries' hint tests
//! run every hint their scenarios print through [`check_hint`].

use cli_support::hints::is_placeholder;

/// The commands `hint` names for `bin`: every backtick span that starts with `bin` or with one of
/// `top_level` (the binary's subcommands, as a device hint says `` `status` ``), and, in a hint
/// without backticks, the text from `bin` to the end of its clause. Each is split into words
/// (single quotes group a word); the binary's name is the first word.
pub fn commands_for(hint: &str, bin: &str, top_level: &[&str]) -> Vec<Vec<String>> {
    let mut spans: Vec<&str> = hint.split('`').skip(1).step_by(2).collect();
    if let Some(bare) = bare_command(hint, bin) {
        spans.push(&hint[bare]);
    }
    spans
        .into_iter()
        .filter_map(|span| {
            let words = split_words(span);
            let first = words.first()?;
            if first == bin {
                Some(words)
            } else if top_level.contains(&first.as_str()) {
                Some(std::iter::once(bin.to_string()).chain(words).collect())
            } else {
                None
            }
        })
        .collect()
}

/// In a hint without backticks, where its one command stands: from `bin` to the end of its clause
/// (an opening parenthesis or a semicolon), without trailing punctuation.
fn bare_command(hint: &str, bin: &str) -> Option<std::ops::Range<usize>> {
    if hint.contains('`') {
        return None;
    }
    let at = find_word(hint, bin)?;
    let rest = &hint[at..];
    let end = rest.find(['(', ';']).unwrap_or(rest.len());
    Some(at..at + rest[..end].trim_end_matches([' ', ',', '.']).len())
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    text.match_indices(word).map(|(i, _)| i).find(|&i| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '-') && after.is_some_and(|c| c == ' ')
    })
}

fn split_words(span: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in span.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(cur);
    }
    words
}

/// Whether the hint's own words (outside its commands, backticked or bare) say what
/// `placeholder` stands for.
fn explained(hint: &str, bin: &str, placeholder: &str) -> bool {
    let prose: String = match bare_command(hint, bin) {
        Some(bare) => format!("{} {}", &hint[..bare.start], &hint[bare.end..]),
        None => hint.split('`').step_by(2).collect::<Vec<_>>().join(" "),
    };
    let bare = placeholder.trim_start_matches('<').trim_end_matches('>');
    find_word(&prose, bare).is_some()
        || prose.contains(&format!("{bare}:"))
        || prose.contains(&format!("{bare}/"))
}

/// Every problem of `hint`'s commands for `bin` against the binary's parser `cmd`: the parser's
/// refusal (unknown subcommand or flag, a required flag missing, a bad value that is not a
/// placeholder) and each placeholder the hint does not explain. An empty list: it runs as
/// printed.
pub fn check_hint(cmd: &clap::Command, bin: &str, hint: &str) -> Vec<String> {
    let top: Vec<&str> = cmd.get_subcommands().map(|s| s.get_name()).collect();
    let mut problems = Vec::new();
    for words in commands_for(hint, bin, &top) {
        let shown = words.join(" ");
        for w in words.iter().skip(1) {
            if w.contains('…') || w == "..." {
                problems.push(format!("`{shown}`: elided arguments ({w})"));
            } else if is_placeholder(w) && !explained(hint, bin, w) {
                problems.push(format!(
                    "`{shown}`: placeholder {w} is not explained by the hint"
                ));
            }
        }
        let argv: Vec<&String> = words
            .iter()
            .filter(|w| !w.contains('…') && *w != "...")
            .collect();
        match cmd.clone().try_get_matches_from(argv) {
            Ok(_) => {}
            Err(e) => {
                use clap::error::{ContextKind, ContextValue, ErrorKind};
                let on_placeholder = matches!(
                    e.kind(),
                    ErrorKind::ValueValidation | ErrorKind::InvalidValue
                ) && matches!(
                    e.get(ContextKind::InvalidValue),
                    Some(ContextValue::String(v)) if is_placeholder(v)
                );
                if !matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
                    && !on_placeholder
                {
                    let first = e.to_string();
                    let first = first.lines().next().unwrap_or_default().to_string();
                    problems.push(format!("`{shown}`: {first}"));
                }
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli() -> clap::Command {
        clap::Command::new("tool")
            .subcommand(
                clap::Command::new("publish")
                    .arg(clap::Arg::new("workspace").long("workspace").required(true))
                    .arg(clap::Arg::new("dry-run").long("dry-run").num_args(0)),
            )
            .subcommand(clap::Command::new("status"))
    }

    #[test]
    fn hints_table() {
        let cases: &[(&str, usize)] = &[
            ("run `tool publish --workspace /w`", 0),
            (
                "`tool publish --workspace WS` (WS: the rebuild workspace)",
                0,
            ),
            ("`tool publish --workspace WS`", 1),
            ("`tool publish`", 1),
            ("`tool publish --workspace /w --bogus`", 1),
            ("`tool publsh --workspace /w`", 1),
            ("`tool publish --workspace /w …`", 1),
            ("`status` shows when", 0),
            ("run `refresh` again", 0),
            ("next: tool publish --dry-run; then more", 1),
            ("next: tool publish --workspace '/a b' (quoted)", 0),
            // A bare command's own words do not explain its placeholders.
            ("next: tool publish --workspace WS", 1),
            (
                "run tool publish --workspace WS (WS: the rebuild workspace)",
                0,
            ),
            ("`minisign -G -p release.pub`", 0),
        ];
        for (hint, want) in cases {
            let got = check_hint(&cli(), "tool", hint);
            assert_eq!(got.len(), *want, "{hint}: {got:?}");
        }
    }

    #[test]
    fn commands_are_split_as_a_shell_would() {
        assert_eq!(
            commands_for(
                "run `tool publish --workspace 'a b'` or `status`",
                "tool",
                &["status"]
            ),
            vec![
                vec!["tool", "publish", "--workspace", "a b"],
                vec!["tool", "status"]
            ]
        );
        assert!(commands_for("retool publish", "tool", &[]).is_empty());
    }
}
