//! Release side of signed manifests (docs/formats.md, "Signed manifests"): loading standard
//! minisign keys (`minisign -G`, encrypted or not), signing a manifest's exact bytes with the
//! trusted comment `generation=<gen> release=<N> expires=<secs>`, checking a signature file the
//! way a release engineer wants to see it, and finding the release numbers already live in the
//! stores. Ed25519, scrypt and the file formats are the `minisign` crate's.
//!
//! The secret key stays in this process: [`SigningKey`] has no `Debug`/`Display` that shows it,
//! only signatures leave, and [`crate::publish::publish_signed`] is given the signature file's
//! bytes, never the key.

use std::fmt;
use std::io::Cursor;
use std::path::{Path, PathBuf};

use manifest::signature::{self, SignatureBlock, TrustedComment};
use manifest::{Generation, ReleaseNumber, SignatureExpiry, StoreLayout, UnixSeconds};

use crate::error::{Error, Refusal, Result};
pub use crate::keyfile::KeyProblem;
use crate::keyfile::{self, Protection};
use crate::store::Store;

pub use crate::refusal::PASSPHRASE_ENV;

/// Key files are a few hundred bytes.
const MAX_KEY_FILE_BYTES: u64 = 16 * 1024;

/// minisign's key ID: the 8-byte key number as a little-endian integer, in upper-case hex (what
/// `minisign -G` prints and puts in the `.pub` comment).
fn key_id(keynum: &[u8]) -> String {
    let mut n = [0u8; 8];
    n.copy_from_slice(&keynum[..8]);
    format!("{:016X}", u64::from_le_bytes(n))
}

fn read_key_file(path: &Path) -> Result<String> {
    let bad = |message: String| Error::Signing {
        path: path.to_path_buf(),
        message,
    };
    // The chunker's errors name the path already; `Error::Signing` names it too, so only the
    // cause is kept.
    let bytes = chunker::bounded::read_capped(path, MAX_KEY_FILE_BYTES)
        .map_err(|e| bad(file_error_cause(&e, path)))?
        .ok_or_else(|| bad("No such file or directory".into()))?;
    String::from_utf8(bytes).map_err(|_| bad("not text (is it a minisign key file?)".into()))
}

/// A chunker file error without the path it names (the caller names it once).
fn file_error_cause(e: &chunker::Error, path: &Path) -> String {
    match e {
        chunker::Error::NotRegularFile { .. } => {
            "not a regular file (a FIFO, device or directory)".into()
        }
        chunker::Error::FileTooLarge { size, limit, .. } => {
            format!("{size} bytes, too large for a minisign key file (limit {limit})")
        }
        chunker::Error::Io(io) => io
            .to_string()
            .replace(&format!(" `{}`", path.display()), ""),
        other => other.to_string(),
    }
}

/// A release signing key, decrypted in memory.
pub struct SigningKey {
    secret: minisign::SecretKey,
    public: minisign::PublicKey,
    path: PathBuf,
    id: String,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret (minisign's own Debug prints it).
        f.debug_struct("SigningKey")
            .field("path", &self.path)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// Load a `minisign -G` secret key, with or without a passphrase (`-W`). An encrypted key
    /// asks `passphrase` (called only then) for its passphrase; its `Err` is the reason there is
    /// none. Every failure is an [`Error::Key`] whose [`KeyProblem`] names the cause and the
    /// next step.
    pub fn load(
        path: &Path,
        passphrase: &mut dyn FnMut(&Path) -> std::result::Result<String, String>,
    ) -> Result<Self> {
        let problem = |problem: KeyProblem| Error::Key {
            path: path.to_path_buf(),
            problem,
        };
        let text = read_key_file(path).map_err(|e| match e {
            Error::Signing { message, .. } => problem(KeyProblem::File { reason: message }),
            other => other,
        })?;
        let file = keyfile::parse_secret_key_file(&text).map_err(problem)?;
        let secret = match file.protection {
            // `minisign -G -W` leaves the checksum zero; the probe below checks the key instead.
            Protection::None if file.checksum_absent() => {
                minisign::SecretKey::from_bytes(&file.bytes).map_err(|e| {
                    problem(KeyProblem::Damaged {
                        reason: e.to_string(),
                    })
                })?
            }
            Protection::None => minisign::SecretKeyBox::from_string(&text)
                .and_then(|b| b.into_unencrypted_secret_key())
                .map_err(|_| {
                    problem(KeyProblem::Damaged {
                        reason: "its checksum does not match its contents".into(),
                    })
                })?,
            Protection::Scrypt => {
                let pass = passphrase(path)
                    .map_err(|reason| problem(KeyProblem::NoPassphrase { reason }))?;
                minisign::SecretKeyBox::from_string(&text)
                    .and_then(|b| b.into_secret_key(Some(pass)))
                    .map_err(|e| {
                        problem(match e.kind() {
                            minisign::ErrorKind::Verify => KeyProblem::WrongPassphrase,
                            _ => KeyProblem::Kdf {
                                reason: e.to_string(),
                            },
                        })
                    })?
            }
        };
        let public = minisign::PublicKey::from_secret_key(&secret).map_err(|e| {
            problem(KeyProblem::Damaged {
                reason: e.to_string(),
            })
        })?;
        // A probe signed and checked against the key's own public half: a damaged seed or
        // public half (which a zero checksum cannot reveal) fails here, not on a device.
        minisign::sign(
            Some(&public),
            &secret,
            Cursor::new(b"starpilot key probe"),
            None,
            None,
        )
        .map_err(|_| {
            problem(KeyProblem::Damaged {
                reason: "a signature made with it does not verify with its own public half".into(),
            })
        })?;
        let id = key_id(public.keynum());
        Ok(Self {
            secret,
            public,
            path: path.to_path_buf(),
            id,
        })
    }

    /// The key ID `minisign` shows.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// One signature block over `data`.
    pub fn sign(&self, data: &[u8], comment: &TrustedComment) -> Result<SignatureBlock> {
        let untrusted = format!("signature from StarPilot release key {}", self.id);
        let sig = minisign::sign(
            Some(&self.public),
            &self.secret,
            Cursor::new(data),
            Some(&comment.to_string()),
            Some(&untrusted),
        )
        .map_err(|e| Error::Signing {
            path: self.path.clone(),
            message: format!("signing failed: {e}"),
        })?;
        SignatureBlock::from_minisign_text(&sig.into_string()).map_err(|e| Error::Signing {
            path: self.path.clone(),
            message: format!("minisign produced an unexpected signature: {e}"),
        })
    }
}

/// The signature file for `data`: one block per key, all with the same comment (more than one
/// key only during a key rotation; the first key's block is what `minisign -V` checks).
pub fn sign_manifest(keys: &[SigningKey], data: &[u8], comment: &TrustedComment) -> Result<String> {
    if keys.is_empty() {
        return Err(Error::Refused(Refusal::NoSigningKey));
    }
    let blocks = keys
        .iter()
        .map(|k| k.sign(data, comment))
        .collect::<Result<Vec<_>>>()?;
    Ok(signature::join_signature_blocks(&blocks))
}

/// Refuse to sign `manifest` (read from `manifest_path`, named in the message) unless every
/// downloadable entry and accelerator variant states its size, SHA-256 and chunk count
/// ([`manifest::signature::uncovered_artifacts`]). Call it before loading keys or writing.
pub fn require_covered(manifest: &manifest::Manifest, manifest_path: &str) -> Result<()> {
    let uncovered = signature::uncovered_artifacts(manifest);
    if uncovered.is_empty() {
        return Ok(());
    }
    Err(Error::Refused(Refusal::Uncovered {
        manifest: manifest_path.to_string(),
        uncovered,
    }))
}

/// A public key the release engineer checks signatures with.
pub struct VerifyingKey {
    public: minisign::PublicKey,
    id: String,
}

impl VerifyingKey {
    /// minisign's key ID: 16 upper-case hex digits, as `minisign -G` prints it.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn from_public(public: minisign::PublicKey) -> Self {
        let id = key_id(public.keynum());
        Self { public, id }
    }

    /// Public keys from a `.pub` file (several may be concatenated), or the public half of a
    /// secret key.
    pub fn load_all(path: &Path) -> Result<Vec<Self>> {
        let text = read_key_file(path).map_err(|e| match e {
            Error::Signing { path, message } => Error::PublicKeyFile { path, message },
            other => other,
        })?;
        let bad = |message: String| Error::Signing {
            path: path.to_path_buf(),
            message,
        };
        let mut keys = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with("untrusted comment:") {
                continue;
            }
            let pk = minisign::PublicKey::from_base64(line).map_err(|e| {
                bad(format!(
                    "line {}: not a minisign public key ({e}); pass a .pub file of `minisign -G`",
                    n + 1
                ))
            })?;
            keys.push(Self::from_public(pk));
        }
        if keys.is_empty() {
            return Err(Error::PublicKeyFile {
                path: path.to_path_buf(),
                message: "no public key in the file".into(),
            });
        }
        Ok(keys)
    }
}

impl From<&SigningKey> for VerifyingKey {
    fn from(k: &SigningKey) -> Self {
        Self::from_public(k.public.clone())
    }
}

/// One block of a signature file, checked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BlockCheck {
    /// 1-based position in the file.
    pub block: usize,
    /// The ID of the key that verified it, if any of the given keys did.
    pub verified_by: Option<String>,
    /// The trusted comment (only meaningful when verified).
    pub comment: String,
    /// Why the block is not a decodable minisign signature; such a block is skipped, the
    /// others still count (a rotation file with one damaged block).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl BlockCheck {
    /// This check as the input of [`signature::decide_blocks`].
    pub fn outcome(&self) -> signature::BlockOutcome<'_> {
        match (&self.error, &self.verified_by) {
            (Some(reason), _) => signature::BlockOutcome::Undecodable { reason },
            (None, Some(_)) => signature::BlockOutcome::Verified {
                comment: &self.comment,
            },
            (None, None) => signature::BlockOutcome::NotVerified,
        }
    }
}

/// Check every block of `signature_text` against `data` with `keys`. A block that does not
/// decode is reported with its `error` and does not stop the others.
pub fn check_signature(
    keys: &[VerifyingKey],
    data: &[u8],
    signature_text: &str,
) -> std::result::Result<Vec<BlockCheck>, signature::Refusal> {
    let blocks = signature::signature_blocks(signature_text)?;
    let mut out = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let decoded = match block.defect() {
            Some(defect) => Err(defect),
            None => minisign::SignatureBox::from_string(block.as_str()).map_err(|e| e.to_string()),
        };
        let sig = match decoded {
            Ok(sig) => sig,
            Err(e) => {
                out.push(BlockCheck {
                    block: i + 1,
                    verified_by: None,
                    comment: block.trusted_comment().to_string(),
                    error: Some(e),
                });
                continue;
            }
        };
        let verified_by = keys
            .iter()
            .find(|k| {
                minisign::verify(&k.public, &sig, Cursor::new(data), true, false, false).is_ok()
            })
            .map(|k| k.id.clone());
        out.push(BlockCheck {
            block: i + 1,
            verified_by,
            comment: block.trusted_comment().to_string(),
            error: None,
        });
    }
    Ok(out)
}

/// The signature found in one store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveSignature {
    /// The store, as described.
    pub store: String,
    /// The release of a block one of our keys verified (over the live manifest or the new one:
    /// an interrupted publish leaves the new signature beside the old manifest).
    pub verified_release: Option<ReleaseNumber>,
    /// There is a signature file, but none of our keys verified it (e.g. the previous key).
    pub unverified_comment: Option<String>,
}

/// Read every store's live manifest and signature for `generation`.
pub fn live_signatures(
    stores: &[&dyn Store],
    generation: Generation,
    keys: &[VerifyingKey],
    new_manifest: &[u8],
) -> Result<Vec<LiveSignature>> {
    let layout = StoreLayout::HfBucket;
    let mut out = Vec::new();
    for store in stores {
        let name = store.describe();
        let sig = store.read_small(
            &layout.signature_path(generation),
            signature::MAX_SIGNATURE_BYTES,
        )?;
        let Some(sig) = sig else {
            out.push(LiveSignature {
                store: name,
                verified_release: None,
                unverified_comment: None,
            });
            continue;
        };
        let live = store
            .read_small(
                &layout.manifest_path(generation),
                manifest::Limits::DEFAULT_MAX_MANIFEST_BYTES,
            )?
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&sig);
        let mut verified_release = None;
        let mut first_comment = None;
        for data in [live.as_slice(), new_manifest] {
            if let Ok(checks) = check_signature(keys, data, &text) {
                for c in checks {
                    first_comment.get_or_insert_with(|| c.comment.clone());
                    if c.verified_by.is_some()
                        && let Ok(tc) = c.comment.parse::<TrustedComment>()
                        && tc.generation == generation
                    {
                        verified_release = verified_release.max(Some(tc.release));
                    }
                }
            }
        }
        out.push(LiveSignature {
            store: name,
            unverified_comment: if verified_release.is_none() {
                Some(first_comment.unwrap_or_else(|| "(unreadable signature file)".into()))
            } else {
                None
            },
            verified_release,
        });
    }
    Ok(out)
}

/// The release number for the new signature: one more than any verified live one, or
/// `requested`. A live signature our keys cannot verify (another key, a damaged file) hides its
/// release number, so the engineer must then say the number with `--release`.
pub fn choose_release(
    live: &[LiveSignature],
    requested: Option<ReleaseNumber>,
) -> Result<ReleaseNumber> {
    if requested.is_none()
        && let Some(l) = live.iter().find(|l| l.unverified_comment.is_some())
    {
        return Err(Error::Refused(Refusal::LiveSignatureUnverified {
            store: l.store.clone(),
            comment: l.unverified_comment.clone().unwrap_or_default(),
        }));
    }
    // Unverified live releases (a rotation) only raise the ceiling of an explicit --release.
    let unverified = live
        .iter()
        .filter_map(|l| l.unverified_comment.as_deref())
        .filter_map(|c| c.parse::<TrustedComment>().ok())
        .map(|c| c.release);
    Ok(signature::next_release(
        live.iter().filter_map(|l| l.verified_release),
        unverified,
        requested,
    )?)
}

/// The comment of a new signature; `expires_in_days` is at least
/// [`signature::MIN_EXPIRES_IN_DAYS`].
pub fn new_comment(
    generation: Generation,
    release: ReleaseNumber,
    expires_in_days: u64,
) -> Result<TrustedComment> {
    Ok(TrustedComment {
        generation,
        release,
        expires: UnixSeconds::now().signature_expiry(expires_in_days)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: after the move to fs-err a missing key file was named twice
    /// ("key /k.pub: failed to open file `/k.pub`: …").
    #[test]
    fn a_missing_key_file_is_named_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.pub");
        let err = read_key_file(&path).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Signing { .. }), "{err:?}");
        assert_eq!(text.matches("absent.pub").count(), 1, "{text}");
        assert!(text.contains("No such file"), "{text}");
    }

    /// A key in the `minisign -G -W` form (KDF none, checksum left zero) loads and signs; the
    /// same key with one byte of its public half changed is caught by the sign-and-verify probe,
    /// since a zero checksum cannot reveal it.
    #[test]
    fn a_zero_checksum_key_is_checked_by_its_probe() {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let dir = tempfile::tempdir().unwrap();
        let kp = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
        let text = kp.sk.to_box(None).unwrap().into_string();
        let mut bytes = b64.decode(text.lines().nth(1).unwrap()).unwrap();
        assert_eq!(&bytes[2..4], &[0, 0]);
        bytes[126..158].fill(0);
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(
                &p,
                format!(
                    "untrusted comment: minisign encrypted secret key\n{}\n",
                    b64.encode(bytes)
                ),
            )
            .unwrap();
            p
        };
        let mut never = |_: &Path| -> std::result::Result<String, String> {
            panic!("a key without a passphrase must not ask for one")
        };
        let good = SigningKey::load(&write("w.key", &bytes), &mut never).unwrap();
        assert_eq!(good.public.to_base64(), kp.pk.to_base64());
        let comment: TrustedComment = "generation=v25 release=1 expires=99".parse().unwrap();
        let block = good.sign(b"m", &comment).unwrap();
        let checks = check_signature(&[VerifyingKey::from(&good)], b"m", block.as_str()).unwrap();
        assert!(checks[0].verified_by.is_some());

        bytes[100] ^= 1; // inside the public half of the 64-byte secret key (62..126)
        let e = SigningKey::load(&write("bad.key", &bytes), &mut never).unwrap_err();
        let Error::Key { problem, .. } = &e else {
            panic!("{e:?}")
        };
        assert!(matches!(problem, KeyProblem::Damaged { .. }), "{problem:?}");
    }
}
