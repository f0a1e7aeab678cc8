//! Run a generated bash completion script the way bash's programmable completion does.

use std::process::Command;

/// Source `script` in a fresh `bash`, complete the command line `words` (the last word is the
/// one being completed, `""` for a fresh word after a space) with the function the script
/// registered for `words[0]`, and return COMPREPLY.
pub fn bash_complete(script: &str, words: &[&str]) -> Vec<String> {
    assert!(words.len() >= 2, "a command and the word being completed");
    let quoted: Vec<String> = words
        .iter()
        .map(|w| format!("'{}'", w.replace('\'', r"'\''")))
        .collect();
    let cword = words.len() - 1;
    let program = format!(
        r#"source /dev/stdin <<'COMPLETION_SCRIPT_END'
{script}
COMPLETION_SCRIPT_END
spec=$(complete -p {bin}) || exit 90
fn=$(printf '%s\n' "$spec" | sed -n 's/.* -F \([^ ]*\) .*/\1/p')
[ -n "$fn" ] || exit 91
COMP_WORDS=({words})
COMP_CWORD={cword}
COMP_LINE="${{COMP_WORDS[*]}}"
COMP_POINT=${{#COMP_LINE}}
"$fn" "{bin}" "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s\n' "${{COMPREPLY[@]}}"
"#,
        bin = words[0],
        words = quoted.join(" "),
    );
    let out = Command::new("bash")
        .args(["--noprofile", "--norc", "-c", &program])
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "bash completion failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}
