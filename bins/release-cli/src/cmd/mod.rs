//! The command line ([`Cli`], with the exit codes `--help` shows) and one module per command
//! group. Each exposes a clap `Args`/`Subcommand` type and a `run`.

pub mod audit;
pub mod build;
pub mod chunk;
pub mod gate;
pub mod manifest;
pub mod rebuild;
pub mod rehearse;
pub mod sign;
pub mod source_map;
pub mod store;

use clap::{Parser, Subcommand};

use crate::CliResult;

/// The exit codes, as `--help` shows them.
const EXIT_CODES_HELP: &str = "\
Exit codes (stable, see docs/release.md):
  0  success
  1  the operation failed (I/O, network, remote command); the message names what and where
  2  usage error: bad flags or arguments, or a refused flag (another compiler, store order)
  3  a check failed: verification, validation, tinygrad marker, or a refused release guard

Every command that reports takes --json and then prints JSON on stdout (shapes in --help and
docs/release.md); progress and messages go to stderr. A --json command that fails prints one
{\"error\":{\"kind\",\"message\",\"next\"}} document instead (kind: failure, usage,
check_failed), with the same exit code; a report that already says what failed (manifest
validate, fmt --check, diff, the rebuild summary) is not followed by one.";

/// The StarPilot release engineer's tool: chunk artifacts, check manifests, publish generations.
#[derive(Debug, Parser)]
#[command(
    name = "release-cli",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_help = EXIT_CODES_HELP
)]
pub struct Cli {
    #[command(flatten)]
    pub output: cli_support::OutputFlags,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Split, join and verify chunk sets (`NAME.chunkNNofMM` + `.chunkmanifest` + `.sha256`).
    #[command(subcommand)]
    Chunk(chunk::ChunkCommand),
    /// Validate, format, diff, sign and verify manifests (`model_names_<gen>.json`).
    #[command(subcommand)]
    Manifest(manifest::ManifestCommand),
    /// Tinygrad pin changes: `tinygrad bump` replaces tinygrad_repo/ and records the commit.
    #[command(subcommand)]
    Tinygrad(build::TinygradCommand),
    /// Send tinygrad_repo/, selfdrive/modeld/, the compiler and ./models to the compiler comma,
    /// then check its tinygrad marker.
    Sync(build::SyncArgs),
    /// Compile one model on the compiler comma and fetch its verified chunk set.
    // `--version` is the model's behaviour version here, not the tool's.
    #[command(disable_version_flag = true)]
    Compile(build::CompileArgs),
    /// Build the four driver-monitoring files on the compiler comma (all or nothing).
    Dm(build::DmArgs),
    /// Replace the built-in RDF V4 in an openpilot tree with its native chunk set.
    Builtin(build::BuiltinArgs),
    /// The next generation's source map (`source-map next`), from the previous one and the tree.
    #[command(subcommand)]
    SourceMap(source_map::SourceMapCommand),
    /// Resumable bulk rebuild of a generation: fetch sources, compile, stage, write the manifest.
    Rebuild(rebuild::RebuildArgs),
    /// Run `./dev sync` and the seed's repository tests in the openpilot checkout and record
    /// the result (publish requires a passing one).
    Preflight(gate::PreflightArgs),
    /// Run the device-side validator on the compiler comma and record its verdict per camera
    /// resolution (or record a modelV2/driverStateV2 check made on the device).
    #[command(disable_version_flag = true)]
    Validate(build::ValidateArgs),
    /// Play the staged release on devices as the previous generation leaves them, with the real
    /// device-modeld-manager against it served on 127.0.0.1, and record the result (publish
    /// requires a passing one).
    Rehearse(rehearse::RehearseArgs),
    /// Where the release stands (tree, compiler, builds, DM, built-in, gates, stores) and the
    /// next command to run; reads only.
    Status(rehearse::StatusArgs),
    /// Publish a generation: artifacts, then the manifest, to each store in order.
    Publish(store::PublishArgs),
    /// Adopt a compatible artifact by server-side copy, renamed to the stable model ID.
    Reuse(store::ReuseArgs),
    /// Serve a local store over HTTP in the Hugging Face and GitHub URL layouts.
    Serve(store::ServeArgs),
    /// Check what is live for a generation in each store: manifest, signature and its expiry,
    /// every artifact whole, nothing stale, stores in agreement. Exits 3 naming each problem
    /// with the command that mends it.
    Audit(audit::AuditArgs),
    /// Print a shell completion script, e.g. `release-cli completions bash > /etc/bash_completion.d/release-cli`.
    Completions {
        /// The shell to generate for.
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
}

pub fn run(command: Command) -> CliResult {
    match command {
        Command::Chunk(c) => chunk::run(c),
        Command::Manifest(c) => manifest::run(c),
        Command::Tinygrad(c) => build::tinygrad(c),
        Command::Sync(a) => build::sync(a),
        Command::Compile(a) => build::compile(a),
        Command::Dm(a) => build::dm(a),
        Command::Builtin(a) => build::builtin(a),
        Command::SourceMap(c) => source_map::run(c),
        Command::Rebuild(a) => rebuild::run(a),
        Command::Preflight(a) => gate::preflight(a),
        Command::Validate(a) => build::validate(a),
        Command::Rehearse(a) => rehearse::rehearse(a),
        Command::Status(a) => rehearse::status(a),
        Command::Publish(a) => store::publish_cmd(a),
        Command::Reuse(a) => store::reuse_cmd(a),
        Command::Serve(a) => store::serve_cmd(a),
        Command::Audit(a) => audit::run(a),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let script = cli_support::completion_script(shell, &mut cmd, "release-cli");
            crate::output::write_stdout(&script)
        }
    }
}
