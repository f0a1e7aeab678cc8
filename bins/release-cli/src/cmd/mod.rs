//! One module per command group. Each exposes a clap `Args`/`Subcommand` type and a `run`.

pub mod chunk;

use clap::Subcommand;

use crate::CliResult;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Split, join and verify chunk sets (`NAME.chunkNNofMM` + `.chunkmanifest` + `.sha256`).
    #[command(subcommand)]
    Chunk(chunk::ChunkCommand),
}

pub fn run(command: Command) -> CliResult {
    match command {
        Command::Chunk(c) => chunk::run(c),
    }
}
