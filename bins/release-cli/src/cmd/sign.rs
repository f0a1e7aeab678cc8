//! `release-cli manifest sign|verify`: the front of `artifact_store::signing` (docs/formats.md, "Signed manifests").

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use artifact_store::signing::{self, PASSPHRASE_ENV, SigningKey, VerifyingKey};
use clap::Args;
use manifest::signature;
use manifest::{Generation, Manifest, ReleaseNumber, UnixSeconds};
use serde::Serialize;

use crate::input::read_manifest;
use crate::output::print_json;
use crate::{CliError, CliResult};

pub use release::publish::DEFAULT_EXPIRES_IN_DAYS;

#[derive(Debug, Args)]
pub struct SignArgs {
    /// The release secret key (`minisign -G`'s .key file). Repeat during a key rotation to sign
    /// with both keys (the first one's signature is what `minisign -V` checks). An encrypted
    /// key's passphrase comes from STARPILOT_SIGN_PASSPHRASE, else from the terminal.
    #[arg(long, value_name = "KEY", required = true)]
    pub key: Vec<PathBuf>,
    /// The release number (default: one more than the signature already beside the manifest,
    /// when the key verifies it, else 1). Devices refuse a release lower than one they accepted.
    #[arg(long, value_name = "N")]
    pub release: Option<ReleaseNumber>,
    /// Days until devices refuse the signature (re-sign before then): 1 to 3650 (10 years; the
    /// expiry is what stops a withdrawn manifest being served again, so it has an upper bound).
    #[arg(long, value_name = "DAYS", default_value_t = DEFAULT_EXPIRES_IN_DAYS)]
    pub expires_in: u64,
    /// The generation signed for (default: the manifest's `generation` key, else its file name).
    #[arg(long, value_name = "vNN")]
    pub generation: Option<Generation>,
    /// Where to write the signature (default: MANIFEST.minisig).
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Make every check and the signature itself in memory (canonical form, generation, keys
    /// loaded and unlocked, release number from the existing signature) and print what would be
    /// written; leaves the signature file untouched (no temporary either).
    #[arg(long)]
    pub dry_run: bool,
    /// Print `{"manifest","signature","generation","release","expires","keys":[…]}` (with
    /// `"dry_run":true` and `"replaces"` under --dry-run).
    #[arg(long)]
    pub json: bool,
    /// The manifest (`model_names_<gen>.json`, in canonical form), signed byte for byte.
    #[arg(value_name = "MANIFEST")]
    pub manifest: PathBuf,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A public key file (`minisign -G`'s .pub; several keys may be concatenated), or repeat.
    #[arg(long, value_name = "PUB", required = true)]
    pub key: Vec<PathBuf>,
    /// The signature (default: MANIFEST.minisig).
    #[arg(long, value_name = "FILE")]
    pub signature: Option<PathBuf>,
    /// The generation a device would be fetching (default: the manifest's, else its file name).
    #[arg(long, value_name = "vNN")]
    pub generation: Option<Generation>,
    /// Print `{"manifest","signature","accepted","blocks":[{"block","verified_by","comment"}],
    /// "release","expires","refusal"}`.
    #[arg(long)]
    pub json: bool,
    /// The manifest the signature is for.
    #[arg(value_name = "MANIFEST")]
    pub manifest: PathBuf,
}

/// An encrypted key's passphrase: the environment variable, else the terminal (never echoed,
/// never logged).
pub(crate) fn ask_passphrase(path: &Path) -> Result<String, String> {
    if let Ok(p) = std::env::var(PASSPHRASE_ENV) {
        return Ok(p);
    }
    if !std::io::stdin().is_terminal() {
        return Err(format!(
            "{PASSPHRASE_ENV} is not set and there is no terminal to ask for it"
        ));
    }
    rpassword::prompt_password(format!("passphrase for {}: ", path.display()))
        .map_err(|e| format!("cannot read the passphrase: {e}"))
}

/// Load every `--key`/`--sign-key`, in order. Each error names the cause and its next step.
pub fn load_signing_keys(paths: &[PathBuf]) -> CliResult<Vec<SigningKey>> {
    paths
        .iter()
        .map(|p| SigningKey::load(p, &mut ask_passphrase).map_err(CliError::usage_from))
        .collect()
}

/// `manifest sign --json`: `dry_run` and `replaces` only under --dry-run.
#[derive(Serialize)]
struct SignReport<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    dry_run: Option<bool>,
    manifest: &'a Path,
    signature: &'a Path,
    generation: String,
    release: u64,
    expires: u64,
    keys: &'a [&'a str],
    #[serde(skip_serializing_if = "Option::is_none")]
    replaces: Option<bool>,
}

/// `manifest verify --json`: the blocks and the device's decision over them.
#[derive(Serialize)]
struct VerifyReport<'a> {
    manifest: &'a Path,
    signature: &'a Path,
    accepted: bool,
    blocks: &'a [signing::BlockCheck],
    release: Option<u64>,
    expires: Option<u64>,
    refusal: Option<String>,
}

fn default_signature_path(manifest: &Path) -> PathBuf {
    let mut s = manifest.as_os_str().to_owned();
    s.push(signature::SIGNATURE_SUFFIX);
    PathBuf::from(s)
}

/// The generation of a manifest file: `--generation`, else its `generation` key, else its name.
fn generation_of(path: &Path, m: &Manifest, flag: Option<Generation>) -> CliResult<Generation> {
    if let Some(g) = flag {
        if let Some(found) = m.generation()
            && found != g
        {
            return Err(CliError::usage(format!(
                "{}: the manifest says generation {found}, --generation says {g}",
                path.display()
            )));
        }
        return Ok(g);
    }
    m.generation()
        .or_else(|| {
            path.file_name()
                .and_then(|n| n.to_str())
                .and_then(manifest::layout::parse_manifest_file_name)
        })
        .ok_or_else(|| {
            CliError::usage(format!(
                "{}: no `generation` key and not named model_names_<gen>.json; pass --generation",
                path.display()
            ))
        })
}

pub fn sign(a: SignArgs) -> CliResult {
    let (bytes, m) = read_manifest(&a.manifest)?;
    if m.to_canonical_bytes() != bytes {
        return Err(CliError::check_failed(format!(
            "{}: not in canonical form, which is what publish uploads, so this signature would \
             not match the published bytes",
            a.manifest.display()
        ))
        .with_next(format!(
            "`release-cli manifest fmt {} > FIXED` and sign FIXED, or sign while publishing \
             with `publish --sign-key`",
            a.manifest.display()
        )));
    }
    let generation = generation_of(&a.manifest, &m, a.generation)?;
    signing::require_covered(&m, &a.manifest.display().to_string())
        .map_err(CliError::check_failed)?;
    let keys = load_signing_keys(&a.key)?;
    let output = a
        .output
        .clone()
        .unwrap_or_else(|| default_signature_path(&a.manifest));
    // The release before this one: the existing signature beside the manifest, if ours.
    let verifying: Vec<VerifyingKey> = keys.iter().map(VerifyingKey::from).collect();
    let existing =
        chunker::bounded::read_capped(&output, signature::MAX_SIGNATURE_BYTES).map_err(|e| {
            CliError::check_failed(format!("cannot read the signature already there: {e}"))
                .with_next("remove it, or write the new one elsewhere with --output")
        })?;
    let release = release::publish::release_beside(
        &verifying,
        &bytes,
        existing.as_deref(),
        generation,
        a.release,
    )
    .map_err(CliError::usage)?;
    let comment =
        signing::new_comment(generation, release, a.expires_in).map_err(CliError::usage)?;
    let text = signing::sign_manifest(&keys, &bytes, &comment).map_err(CliError::failure)?;
    let ids: Vec<&str> = keys.iter().map(|k| k.id()).collect();
    let report = |dry_run: Option<bool>, replaces: Option<bool>| SignReport {
        dry_run,
        manifest: &a.manifest,
        signature: &output,
        generation: generation.to_string(),
        release: release.get(),
        expires: comment.expires.0,
        keys: &ids,
        replaces,
    };
    if a.dry_run {
        let replaces = output.exists();
        if a.json {
            return print_json(&report(Some(true), Some(replaces)));
        }
        crate::outln!(
            "dry run: would write {} ({}{}): {} as {generation} release {release} with key {} (expires {})",
            output.display(),
            cli_support::progress::bytes(text.len() as u64),
            if replaces {
                ", replacing the signature there"
            } else {
                ""
            },
            a.manifest.display(),
            ids.join(" and "),
            cli_support::time::rfc3339(comment.expires.0),
        )?;
        return crate::outln!("nothing was changed; run the same command without --dry-run");
    }
    // The error names the signature file (fs_err).
    chunker::atomic::write_atomic(&output, text.as_bytes())
        .map_err(|e| CliError::failure(e.to_string()))?;
    if a.json {
        return print_json(&report(None, None));
    }
    crate::outln!(
        "signed {} as {generation} release {release} with key {} (expires {}): {}",
        a.manifest.display(),
        ids.join(" and "),
        cli_support::time::rfc3339(comment.expires.0),
        output.display()
    )?;
    // The public key `minisign -G` wrote beside the (first) secret key, when it is there.
    let public = a
        .key
        .first()
        .map(|k| k.with_extension("pub"))
        .filter(|p| p.is_file())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "release.pub".into());
    cli_support::info!(
        "next: check it with `minisign -V -p {public} -m {} -x {}` or `release-cli manifest \
         verify --key {public} {0}`",
        a.manifest.display(),
        output.display()
    );
    Ok(())
}

pub fn verify(a: VerifyArgs) -> CliResult {
    let (bytes, m) = read_manifest(&a.manifest)?;
    let generation = generation_of(&a.manifest, &m, a.generation)?;
    let mut keys = Vec::new();
    for k in &a.key {
        keys.extend(VerifyingKey::load_all(k).map_err(CliError::usage_from)?);
    }
    let sig_path = a
        .signature
        .clone()
        .unwrap_or_else(|| default_signature_path(&a.manifest));
    // Size-capped, regular files only: a signature symlinked to /dev/zero or a FIFO is refused
    // at once, not read.
    let raw = chunker::bounded::read_capped(&sig_path, signature::MAX_SIGNATURE_BYTES)
        .map_err(|e| {
            CliError::check_failed(e).with_next(
                "pass the .minisig file `manifest sign` or `publish --sign-key` wrote (a few \
                 hundred bytes per key)",
            )
        })?
        .ok_or_else(|| {
            CliError::check_failed(format!("{}: no such file", sig_path.display())).with_next(
                format!(
                    "sign the manifest with `release-cli manifest sign --key KEY {}`",
                    a.manifest.display()
                ),
            )
        })?;
    let text = String::from_utf8_lossy(&raw);
    let (blocks, outcome) = match signing::check_signature(&keys, &bytes, &text) {
        Err(r) => (Vec::new(), Err(r)),
        Ok(blocks) => {
            let outcome = signature::decide_blocks(
                blocks.iter().map(|b| b.outcome()),
                keys.len(),
                generation,
                None,
                UnixSeconds::now(),
            );
            (blocks, outcome)
        }
    };
    if a.json {
        print_json(&VerifyReport {
            manifest: &a.manifest,
            signature: &sig_path,
            accepted: outcome.is_ok(),
            blocks: &blocks,
            release: outcome.as_ref().ok().map(|c| c.release.get()),
            expires: outcome.as_ref().ok().map(|c| c.expires.0),
            refusal: outcome.as_ref().err().map(|r| r.to_string()),
        })?;
    } else {
        for b in &blocks {
            crate::outln!(
                "block {}: {} ({})",
                b.block,
                match (&b.verified_by, &b.error) {
                    (_, Some(e)) => format!("not a decodable signature ({e}), skipped"),
                    (Some(id), None) => format!("verified by key {id}"),
                    (None, None) => "not verified by the given key(s)".to_string(),
                },
                b.comment
            )?;
        }
    }
    match outcome {
        Ok(c) => {
            if !a.json {
                crate::outln!(
                    "devices with these keys accept it: {generation} release {} (expires {})",
                    c.release,
                    cli_support::time::rfc3339(c.expires.0)
                )?;
            }
            Ok(())
        }
        Err(r) => {
            let e = CliError::check_failed(format!(
                "{}: devices would refuse it: {r}",
                a.manifest.display()
            ));
            // With --json the report above already carries the refusal.
            Err(if a.json { e.after_json_report() } else { e })
        }
    }
}
