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
pub use crate::unsigned::{Unsigned, not_installable_text};

/// Where StarPilot keeps the release keys it trusts: shipped read-only with the openpilot tree,
/// so whoever can write a store cannot change them. This is the path on a comma, whose tree is
/// `/data/openpilot`; a device manager takes [`TREE_TRUSTED_KEYS`] under the tree it runs on.
pub const DEFAULT_TRUSTED_KEYS: &str = "/data/openpilot/starpilot/assets/model_release_keys.pub";

/// [`DEFAULT_TRUSTED_KEYS`] relative to the openpilot tree.
pub const TREE_TRUSTED_KEYS: &str = "starpilot/assets/model_release_keys.pub";

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
    /// The key's name: its `.pub` file's untrusted comment, or `key <n>`.
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
        let bad = |message: String| Error::TrustedKeys {
            path: path.to_path_buf(),
            message,
        };
        // An unreadable file is an I/O error naming it (fs-err); what is in it, `TrustedKeys`.
        // Read without blocking and only as a regular file (`chunker::bounded`): a FIFO or a
        // device planted at the path cannot hang the manager or feed it without end.
        let bytes = match chunker::bounded::read_capped_existing(path, MAX_KEYS_FILE_BYTES) {
            Ok(bytes) => bytes,
            Err(chunker::Error::NotRegularFile { .. }) => {
                return Err(bad(
                    "not a regular file; give --trusted-keys the release key's .pub file".into(),
                ));
            }
            Err(chunker::Error::FileTooLarge { .. }) => {
                return Err(bad(format!("larger than {MAX_KEYS_FILE_BYTES} bytes")));
            }
            Err(chunker::Error::Io(e)) => return Err(e.into()),
            Err(other) => return Err(bad(other.to_string())),
        };
        let text = String::from_utf8(bytes)
            .map_err(|_| bad("stream did not contain valid UTF-8".into()))?;
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

    /// The keys file they were read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are none (never so for a file that loaded).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keys, in file order.
    pub fn keys(&self) -> &[TrustedKey] {
        &self.keys
    }
}

/// What a verified signature vouched for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// The generation the signature names.
    pub generation: Generation,
    /// The release number it names.
    pub release: ReleaseNumber,
    /// When it expires, in Unix seconds.
    pub expires: UnixSeconds,
    /// The name of the trusted key that signed it.
    pub key: String,
    /// The signature block that verified: the device keeps it beside the stored catalog and
    /// checks the catalog against it on every read ([`verify_stored`]).
    pub block: SignatureBlock,
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
    verify_with(keys, manifest_bytes, signature_file, &|comment| {
        signature::check_signed_comment(comment, generation, accepted, now)
    })
}

/// The check of the device's own copy (`.catalog.json` and the signature kept beside it), on
/// every read: a trusted key signed exactly these bytes, for `generation`, at a release not
/// lower than `floor` (the accepted release). Expiry is not checked: it bounds how long a
/// *store* may serve a signed manifest; the copy this device accepted while it was valid stays
/// usable offline, and the floor keeps an older copy out.
pub fn verify_stored(
    keys: &TrustedKeys,
    catalog_bytes: &[u8],
    signature_file: Option<&[u8]>,
    generation: Generation,
    floor: Option<ReleaseNumber>,
) -> std::result::Result<Accepted, Refusal> {
    verify_with(keys, catalog_bytes, signature_file, &|comment| {
        let c: signature::TrustedComment =
            comment
                .parse()
                .map_err(|e: manifest::Error| Refusal::BadComment {
                    reason: e.to_string(),
                })?;
        if c.generation != generation {
            return Err(Refusal::OtherGeneration {
                expected: generation,
                found: c.generation,
            });
        }
        if let Some(floor) = floor
            && c.release < floor
        {
            return Err(Refusal::Rollback {
                release: c.release,
                accepted: floor,
            });
        }
        Ok(c)
    })
}

/// Accepted when a block verifies under a trusted key and its comment passes `check`; a block
/// that does not decode is skipped (a rotation's file verifies by its good block). Refused: the
/// first verified block's comment refusal, else `Malformed` when none decoded, else untrusted.
fn verify_with(
    keys: &TrustedKeys,
    bytes: &[u8],
    signature_file: Option<&[u8]>,
    check: &dyn Fn(&str) -> std::result::Result<signature::TrustedComment, Refusal>,
) -> std::result::Result<Accepted, Refusal> {
    let Some(sig_bytes) = signature_file else {
        return Err(Refusal::Unsigned);
    };
    let text = std::str::from_utf8(sig_bytes).map_err(|_| Refusal::Malformed {
        reason: "not UTF-8 text".into(),
    })?;
    let blocks = signature::signature_blocks(text)?;
    let mut comment_refusal: Option<Refusal> = None;
    let mut first_defect: Option<String> = None;
    let mut decoded = 0usize;
    for (i, block) in blocks.iter().enumerate() {
        let sig = match decode(block) {
            Ok(sig) => sig,
            Err(e) => {
                first_defect.get_or_insert_with(|| format!("block {}: {e}", i + 1));
                continue;
            }
        };
        decoded += 1;
        for key in &keys.keys {
            if key.key.verify(bytes, &sig, false).is_err() {
                continue;
            }
            match check(sig.trusted_comment()) {
                Ok(c) => {
                    return Ok(Accepted {
                        generation: c.generation,
                        release: c.release,
                        expires: c.expires,
                        key: key.name.clone(),
                        block: block.clone(),
                    });
                }
                Err(r) => {
                    comment_refusal.get_or_insert(r);
                }
            }
        }
    }
    if let Some(r) = comment_refusal {
        return Err(r);
    }
    match first_defect {
        Some(reason) if decoded == 0 => Err(Refusal::Malformed { reason }),
        _ => Err(Refusal::UntrustedSignature { keys: keys.len() }),
    }
}

/// What the bytes of an artifact (an entry's, or its Chestnut variant's) are checked against
/// before install, on this device. Pure.
///
/// - With trusted keys (`protected`), the signature covers the manifest's bytes only, so every
///   byte installed must be pinned by the manifest itself: its SHA-256, its size and its chunk
///   count. Lacking any of them, the artifact is listed but not installable (`Err` names each
///   one missing); the store's `.sha256` sidecar is never consulted, since whoever can write the
///   store can write it too.
/// - Without keys, the manifest's digest when it gives one, else the origin's sidecar (the live
///   manifest's shape; the device is unprotected anyway).
pub fn digest_rule(
    protected: bool,
    has_sha256: bool,
    has_size: bool,
    has_chunk_count: bool,
) -> std::result::Result<crate::DigestSource, Vec<Unsigned>> {
    if protected {
        let missing: Vec<Unsigned> = [
            (has_sha256, Unsigned::Sha256),
            (has_size, Unsigned::Size),
            (has_chunk_count, Unsigned::ChunkCount),
        ]
        .into_iter()
        .filter(|(has, _)| !has)
        .map(|(_, m)| m)
        .collect();
        if !missing.is_empty() {
            return Err(missing);
        }
    }
    Ok(if has_sha256 {
        crate::DigestSource::Manifest
    } else {
        crate::DigestSource::Sidecar
    })
}

/// [`digest_rule`] for a download target.
pub fn target_rule(
    protected: bool,
    target: &crate::Target,
) -> std::result::Result<crate::DigestSource, Vec<Unsigned>> {
    digest_rule(
        protected,
        target.sha256.is_some(),
        target.size.is_some(),
        target.chunk_count.is_some(),
    )
}

/// A block not in minisign's four-line form is never decoded (its defect is the reason).
fn decode(block: &SignatureBlock) -> std::result::Result<Signature, String> {
    if let Some(defect) = block.defect() {
        return Err(defect);
    }
    Signature::decode(block.as_str()).map_err(|e| e.to_string())
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
    use crate::{DigestSource, Target};
    use manifest::ModelEntry;
    use serde_json::json;

    /// Keys × which of SHA-256 / size / chunk count the entry gives × the artifact itself or
    /// its Chestnut variant: with keys, only a fully pinned artifact is installable, and never
    /// from the sidecar; without keys, the manifest's digest, else the sidecar. Checked on
    /// targets made from real entries, for v25 and a made-up v26 (the rule has no generation).
    #[test]
    fn the_digest_rule_table() {
        use Unsigned::*;
        let sha = "a".repeat(64);
        // (gives sha256, size, chunk count) -> with keys, without keys
        type Want = (
            Result<DigestSource, Vec<Unsigned>>,
            Result<DigestSource, Vec<Unsigned>>,
        );
        let table: [((bool, bool, bool), Want); 8] = [
            (
                (true, true, true),
                (Ok(DigestSource::Manifest), Ok(DigestSource::Manifest)),
            ),
            (
                (false, true, true),
                (Err(vec![Sha256]), Ok(DigestSource::Sidecar)),
            ),
            (
                (true, false, true),
                (Err(vec![Size]), Ok(DigestSource::Manifest)),
            ),
            (
                (true, true, false),
                (Err(vec![ChunkCount]), Ok(DigestSource::Manifest)),
            ),
            (
                (false, false, true),
                (Err(vec![Sha256, Size]), Ok(DigestSource::Sidecar)),
            ),
            (
                (false, true, false),
                (Err(vec![Sha256, ChunkCount]), Ok(DigestSource::Sidecar)),
            ),
            (
                (true, false, false),
                (Err(vec![Size, ChunkCount]), Ok(DigestSource::Manifest)),
            ),
            (
                (false, false, false),
                (
                    Err(vec![Sha256, Size, ChunkCount]),
                    Ok(DigestSource::Sidecar),
                ),
            ),
        ];
        for generation in ["v25", "v26"] {
            for ((has_sha, has_size, has_count), (with_keys, without)) in &table {
                let mut fields = serde_json::Map::new();
                if *has_sha {
                    fields.insert("artifact_sha256".into(), json!(sha));
                }
                if *has_size {
                    fields.insert("artifact_size".into(), json!(1000));
                }
                if *has_count {
                    fields.insert("artifact_chunk_count".into(), json!(0));
                }
                let mut variant = fields.clone();
                variant.insert("execution_device".into(), json!("AMD"));
                variant.insert("artifact_format".into(), json!("tinygrad_single_v1"));
                let mut e = fields.clone();
                e.insert("id".into(), json!(format!("pop{generation}")));
                e.insert("artifact_format".into(), json!("tinygrad_single_v1"));
                e.insert("accelerator_artifacts".into(), json!({"chestnut": variant}));
                let entry = ModelEntry::from_map(e).unwrap();
                let targets = [
                    ("artifact", Target::from_entry(&entry).unwrap()),
                    (
                        "variant",
                        Target::accelerator_variant(
                            &entry,
                            manifest::contract::BASE_CONTRACT.contract(),
                        )
                        .unwrap()
                        .unwrap(),
                    ),
                ];
                for (what, t) in &targets {
                    let ctx = format!(
                        "{generation} {what} sha={has_sha} size={has_size} count={has_count}"
                    );
                    assert_eq!(&target_rule(true, t), with_keys, "{ctx} with keys");
                    assert_eq!(&target_rule(false, t), without, "{ctx} without keys");
                }
            }
        }
        let text = not_installable_text("x_driving_tinygrad.pkl", &[Sha256, ChunkCount]);
        assert!(
            text.starts_with(
                "not installable: the signed manifest gives no SHA-256, chunk count for \
                 x_driving_tinygrad.pkl"
            ),
            "{text}"
        );
        assert!(
            text.contains("artifact_sha256, artifact_chunk_count"),
            "{text}"
        );
    }

    /// A FIFO, a directory or an oversized file at the keys path is refused at once, naming it.
    #[test]
    fn a_keys_file_is_read_capped_and_only_as_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.pub");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let big = dir.path().join("big.pub");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_KEYS_FILE_BYTES + 1)
            .unwrap();
        for (path, why) in [
            (&fifo, "not a regular file"),
            (&dir.path().to_path_buf(), "not a regular file"),
            (&big, "larger than"),
        ] {
            let e = TrustedKeys::load(path).unwrap_err().to_string();
            assert!(
                e.contains(why) && e.contains(&*path.to_string_lossy()),
                "{e}"
            );
        }
    }

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
