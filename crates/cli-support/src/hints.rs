//! The words of a printed next step: which are placeholders for a value. The binaries' hint
//! tests check every hint against the parser with `test_support::hints::check_hint`.

/// Whether a word of a command is a placeholder for a value: `DIR`, `WS`, `<ID>`, `vNN`, `…`.
pub fn is_placeholder(word: &str) -> bool {
    let caps = word.len() >= 2
        && word
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && word.chars().any(|c| c.is_ascii_uppercase());
    caps || (word.starts_with('<') && word.ends_with('>'))
        || word == "vN"
        || word == "vNN"
        || word.contains('…')
        || word == "..."
}
