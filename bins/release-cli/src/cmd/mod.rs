//! One module per command group. Each exposes a clap `Args`/`Subcommand` type and a `run`.

pub mod chunk;
pub mod manifest;

use clap::Subcommand;

use crate::CliResult;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Split, join and verify chunk sets (`NAME.chunkNNofMM` + `.chunkmanifest` + `.sha256`).
    #[command(subcommand)]
    Chunk(chunk::ChunkCommand),
    /// Validate, format and diff manifests (`model_names_<gen>.json`).
    #[command(subcommand)]
    Manifest(manifest::ManifestCommand),
    /// Print a shell completion script, e.g. `release-cli completions bash > /etc/bash_completion.d/release-cli`.
    Completions {
        /// The shell to generate for.
        shell: clap_complete::Shell,
    },
}

pub fn run(command: Command) -> CliResult {
    match command {
        Command::Chunk(c) => chunk::run(c),
        Command::Manifest(c) => manifest::run(c),
        Command::Completions { shell } => {
            let mut cmd = <crate::Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "release-cli", &mut script);
            crate::output::write_stdout(&script)
        }
    }
}
