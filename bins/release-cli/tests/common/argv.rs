//! The argument vectors the `release-cli` tests build again and again, in one place: the
//! integration tests' `common` and the binary's own hint tests (`src/hint_tests.rs`) both
//! include this file.

/// `publish --generation GENERATION --manifest MANIFEST --artifacts ARTIFACTS`, `--to STORE` for
/// each of `to` in order, then `extra` as given.
pub fn publish_argv(
    generation: &str,
    manifest: &str,
    artifacts: &str,
    to: &[&str],
    extra: &[&str],
) -> Vec<String> {
    let mut args: Vec<String> = [
        "publish",
        "--generation",
        generation,
        "--manifest",
        manifest,
        "--artifacts",
        artifacts,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for t in to {
        args.push("--to".into());
        args.push(t.to_string());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Owned arguments as the `&[&str]` the runners take.
pub fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}
