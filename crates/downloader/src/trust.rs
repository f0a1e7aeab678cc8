//! Signed manifests on the device: the trusted minisign public keys, and the check a fetched
//! manifest must pass before anything on the device acts on it (docs/device.md, "Trust").
//!
//! With trusted keys, a manifest is accepted only when its detached signature
//! (`model_names_<gen>.json.minisig`, see `manifest::signature`) verifies under one of them, the
//! signed comment names the generation fetched, it has not expired, and its release is not lower
//! than the last one this device accepted. Ed25519 and minisign's format are `minisign-verify`'s;
//! the rules are `manifest::signature::check_signed_comment`.

use std::fmt;
use std::path::{Path, PathBuf};

use manifest::signature::{self, Refusal, SignatureBlock};
use manifest::{Generation, ReleaseNumber, UnixSeconds};
use minisign_verify::{PublicKey, Signature};

use crate::error::{Error, Result};

/// Where StarPilot keeps the release keys it trusts: shipped read-only with the openpilot tree,
/// so whoever can write a store cannot change them.
pub const DEFAULT_TRUSTED_KEYS: &str = "/data/openpilot/starpilot/assets/model_release_keys.pub";

/// A trusted keys file is a few lines per key.
const MAX_KEYS_FILE_BYTES: u64 = 64 * 1024;

/// One trusted minisign public key.
#[derive(Clone)]
pub struct TrustedKey {
    key: PublicKey,
    /// The untrusted comment of its `.pub` file (`minisign public key <ID>`), or `key <n>`.
    name: String,
}

impl TrustedKey {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for TrustedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrustedKey")
            .field("name", &self.name)
            .finish()
    }
}

/// The keys a device trusts: one or more, e.g. the current and the next one during a rotation.
#[derive(Clone, Debug)]
pub struct TrustedKeys {
    path: PathBuf,
    keys: Vec<TrustedKey>,
}

impl TrustedKeys {
    /// Read a keys file: minisign `.pub` files concatenated (an `untrusted comment:` line, then
    /// the base64 key), or bare base64 keys one per line; blank lines and `#` comments allowed.
    pub fn load(path: &Path) -> Result<Self> {
        use std::io::Read;
        let bad = |message: String| Error::TrustedKeys {
            path: path.to_path_buf(),
            message,
        };
        // An unreadable file is an I/O error naming it (fs-err); what is in it, `TrustedKeys`.
        let file = fs_err::File::open(path)?;
        let mut text = String::new();
        file.take(MAX_KEYS_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| bad(e.to_string()))?;
        if text.len() as u64 > MAX_KEYS_FILE_BYTES {
            return Err(bad(format!("larger than {MAX_KEYS_FILE_BYTES} bytes")));
        }
        Self::parse(&text, path)
    }

    /// Parse the text of a keys file (`path` is only for messages).
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let bad = |message: String| Error::TrustedKeys {
            path: path.to_path_buf(),
            message,
        };
        let mut keys = Vec::new();
        let mut comment: Option<String> = None;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(c) = line.strip_prefix("untrusted comment:") {
                comment = Some(c.trim().to_string());
                continue;
            }
            let key = PublicKey::from_base64(line).map_err(|e| {
                bad(format!(
                    "line {}: not a minisign public key ({e}); each key is the second line of a \
                     `minisign -G` .pub file",
                    n + 1
                ))
            })?;
            let name = comment
                .take()
                .unwrap_or_else(|| format!("key {}", keys.len() + 1));
            keys.push(TrustedKey { key, name });
        }
        if keys.is_empty() {
            return Err(bad(
                "no public key in the file; put the release key's .pub file there".into(),
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
            keys,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn keys(&self) -> &[TrustedKey] {
        &self.keys
    }
}

/// What a verified signature vouched for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    pub generation: Generation,
    pub release: ReleaseNumber,
    pub expires: UnixSeconds,
    /// The name of the trusted key that signed it.
    pub key: String,
}

/// The device's decision over a fetched manifest's bytes and its signature file (`None` when
/// the origin has none). `accepted` is the last release of `generation` this device accepted.
pub fn verify_manifest(
    keys: &TrustedKeys,
    manifest_bytes: &[u8],
    signature_file: Option<&[u8]>,
    generation: Generation,
    accepted: Option<ReleaseNumber>,
    now: UnixSeconds,
) -> std::result::Result<Accepted, Refusal> {
    let Some(bytes) = signature_file else {
        return Err(Refusal::Unsigned);
    };
    let text = std::str::from_utf8(bytes).map_err(|_| Refusal::Malformed {
        reason: "not UTF-8 text".into(),
    })?;
    let blocks = signature::signature_blocks(text)?;
    // A block that verifies but whose comment is refused explains more than "untrusted".
    let mut refusal = Refusal::UntrustedSignature { keys: keys.len() };
    for (i, block) in blocks.iter().enumerate() {
        let sig = decode(block).map_err(|e| Refusal::Malformed {
            reason: format!("block {}: {e}", i + 1),
        })?;
        for key in &keys.keys {
            if key.key.verify(manifest_bytes, &sig, false).is_err() {
                continue;
            }
            match signature::check_signed_comment(sig.trusted_comment(), generation, accepted, now)
            {
                Ok(c) => {
                    return Ok(Accepted {
                        generation: c.generation,
                        release: c.release,
                        expires: c.expires,
                        key: key.name.clone(),
                    });
                }
                Err(r) => refusal = r,
            }
        }
    }
    Err(refusal)
}

fn decode(block: &SignatureBlock) -> std::result::Result<Signature, minisign_verify::Error> {
    Signature::decode(block.as_str())
}

/// The trust refusals inside a manifest fetch failure, per origin.
pub fn refusals(e: &Error) -> Vec<(&str, &Refusal)> {
    match e {
        Error::ManifestUnavailable { attempts, .. } => attempts
            .iter()
            .filter_map(|(origin, e)| match e {
                Error::Refused { refusal, .. } => Some((origin.as_str(), refusal)),
                _ => None,
            })
            .collect(),
        Error::Refused { refusal, url } => vec![(url.as_str(), refusal)],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_files_in_pub_and_bare_form() {
        let text = "# release keys\nuntrusted comment: minisign public key E489F5DAA160FDCC\n\
                    RWTM/WCh2vWJ5FOlNWV7Cv7N0d8nS28mNhqDKexnSWh1HhlBLHnm7ZpY\n\n\
                    RWTMLyxaBulJv/ZNJXLLT5jJcUQadbBr9OyWpIfKHNK0AGZpOCc6FHFC\n";
        let k = TrustedKeys::parse(text, Path::new("k.pub")).unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(k.keys()[0].name(), "minisign public key E489F5DAA160FDCC");
        assert_eq!(k.keys()[1].name(), "key 2");
        for bad in [
            "",
            "# nothing\n",
            "untrusted comment: x\nnot-base64!\n",
            "RWQ=\n",
        ] {
            let e = TrustedKeys::parse(bad, Path::new("k.pub")).unwrap_err();
            assert!(e.to_string().contains("k.pub"), "{e}");
        }
    }
}
