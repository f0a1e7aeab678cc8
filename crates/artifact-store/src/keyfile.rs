//! The layout of a `minisign -G` secret key file, read by us before the `minisign` crate sees it,
//! and every reason a key cannot sign, each with its next step.
//!
//! The file is two lines: `untrusted comment: …` and the base64 of 158 bytes:
//!
//! | bytes | field |
//! |---|---|
//! | 2 | signature algorithm, `Ed` |
//! | 2 | KDF algorithm: `Sc` (scrypt; the key is encrypted with a passphrase) or `\0\0` (none) |
//! | 2 | checksum algorithm, `B2` (BLAKE2b-256) |
//! | 32 + 8 + 8 | KDF salt, ops limit, memory limit (all zero without a KDF) |
//! | 8 + 64 + 32 | key ID, Ed25519 secret key (seed and public half), checksum over `Ed`‖key ID‖secret key |
//!
//! Why we read it ourselves: `minisign -G -W` (0.11, no passphrase, as unattended CI makes keys)
//! writes KDF `\0\0` and leaves the checksum all zero, and the `minisign` crate at its latest
//! version (0.10.0) recomputes the checksum for an unencrypted key and refuses that one as
//! "Corrupted key". A zero checksum therefore means "none written", and such a key is instead
//! checked by signing a probe and verifying it with the key's own public half (see
//! `signing::SigningKey::load`), which catches a damaged seed or public half. The first line says
//! "encrypted secret key" for both kinds, so it is never used to decide.

use std::fmt;

use base64::Engine;

/// Decoded length of a secret key.
pub const SECRET_KEY_LEN: usize = 158;
/// Decoded length of a public key (`Ed` + key ID + 32 bytes): what a `.pub` holds.
const PUBLIC_KEY_LEN: usize = 42;
const CHECKSUM_RANGE: std::ops::Range<usize> = 126..158;

/// How the secret key is protected at rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// KDF `\0\0`: `minisign -G -W`.
    None,
    /// KDF `Sc`: encrypted with a passphrase (`minisign -G`).
    Scrypt,
}

/// A secret key file's decoded bytes and what they say about themselves.
pub struct SecretKeyFile {
    pub protection: Protection,
    /// The 158 bytes (still encrypted when `protection` is `Scrypt`).
    pub bytes: Vec<u8>,
}

impl SecretKeyFile {
    /// Whether the checksum field is all zero (written by `minisign -G -W`).
    pub fn checksum_absent(&self) -> bool {
        self.bytes[CHECKSUM_RANGE].iter().all(|&b| b == 0)
    }
}

impl fmt::Debug for SecretKeyFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the bytes.
        f.debug_struct("SecretKeyFile")
            .field("protection", &self.protection)
            .finish_non_exhaustive()
    }
}

pub use crate::refusal::KeyProblem;

/// Read a secret key file's text. Pure: decides the format and protection, decrypts nothing.
pub fn parse_secret_key_file(text: &str) -> Result<SecretKeyFile, KeyProblem> {
    let not = |reason: &str| KeyProblem::NotASecretKey {
        reason: reason.into(),
    };
    let mut lines = text.lines().map(|l| l.trim_end_matches('\r'));
    let comment = lines.next().unwrap_or_default();
    if !comment.starts_with("untrusted comment:") {
        return Err(not("its first line is not `untrusted comment: …`"));
    }
    let encoded = lines.next().unwrap_or_default().trim();
    if encoded.is_empty() {
        return Err(not("no key line after the comment"));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| not("its second line is not base64"))?;
    if bytes.len() == PUBLIC_KEY_LEN {
        return Err(KeyProblem::PublicKeyGiven);
    }
    if bytes.len() != SECRET_KEY_LEN {
        return Err(not(&format!(
            "{} bytes, a minisign secret key has {SECRET_KEY_LEN}",
            bytes.len()
        )));
    }
    let shown = |b: &[u8]| format!("{:?}", String::from_utf8_lossy(b));
    if &bytes[0..2] != b"Ed" {
        return Err(KeyProblem::Unsupported {
            field: "signature algorithm",
            found: shown(&bytes[0..2]),
        });
    }
    if &bytes[4..6] != b"B2" {
        return Err(KeyProblem::Unsupported {
            field: "checksum algorithm",
            found: shown(&bytes[4..6]),
        });
    }
    let protection = match &bytes[2..4] {
        b"Sc" => Protection::Scrypt,
        [0, 0] => Protection::None,
        other => {
            return Err(KeyProblem::Unsupported {
                field: "key encryption (KDF) algorithm",
                found: shown(other),
            });
        }
    };
    Ok(SecretKeyFile { protection, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(bytes: &[u8]) -> String {
        format!(
            "untrusted comment: minisign encrypted secret key\n{}\n",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
    }

    fn key(kdf: &[u8; 2], chk: u8) -> Vec<u8> {
        let mut b = vec![0u8; SECRET_KEY_LEN];
        b[0..2].copy_from_slice(b"Ed");
        b[2..4].copy_from_slice(kdf);
        b[4..6].copy_from_slice(b"B2");
        b[54..126].fill(7);
        b[CHECKSUM_RANGE].fill(chk);
        b
    }

    /// Every form a key file can take, and what it is read as.
    #[test]
    fn secret_key_file_table() {
        let mut bad_sig = key(b"Sc", 1);
        bad_sig[0..2].copy_from_slice(b"Xx");
        let mut bad_chk = key(b"Sc", 1);
        bad_chk[4..6].copy_from_slice(b"S2");
        let mut public = vec![0u8; PUBLIC_KEY_LEN];
        public[0..2].copy_from_slice(b"Ed");
        type Want = Result<(Protection, bool), &'static str>;
        let cases: Vec<(String, Want)> = vec![
            // minisign -G -W: no KDF, checksum left zero.
            (file(&key(&[0, 0], 0)), Ok((Protection::None, true))),
            // An unencrypted key with a checksum (the minisign crate writes one).
            (file(&key(&[0, 0], 9)), Ok((Protection::None, false))),
            (file(&key(b"Sc", 9)), Ok((Protection::Scrypt, false))),
            // \r\n endings.
            (
                file(&key(b"Sc", 9)).replace('\n', "\r\n"),
                Ok((Protection::Scrypt, false)),
            ),
            (file(&public), Err("public")),
            (file(&key(b"Ar", 0)), Err("KDF")),
            (file(&bad_sig), Err("signature algorithm")),
            (file(&bad_chk), Err("checksum algorithm")),
            (file(&key(b"Sc", 0)[..100]), Err("100 bytes")),
            ("".into(), Err("first line")),
            ("untrusted comment: x\n".into(), Err("no key line")),
            ("untrusted comment: x\n!!!\n".into(), Err("not base64")),
            (
                file(&key(b"Sc", 9)).replace("untrusted comment", "comment"),
                Err("first line"),
            ),
        ];
        for (text, want) in cases {
            match (parse_secret_key_file(&text), want) {
                (Ok(k), Ok((p, zero))) => {
                    assert_eq!((k.protection, k.checksum_absent()), (p, zero), "{text:?}");
                    assert_eq!(k.bytes.len(), SECRET_KEY_LEN);
                }
                (Err(e), Err(needle)) => {
                    let s = e.to_string();
                    assert!(s.contains(needle), "{text:?}: {s}");
                    let next = cli_support::NextStep::next_step(&e);
                    assert!(next.is_some_and(|n| !n.is_empty()), "no next step: {s}");
                    assert!(!s.contains("next:"), "a next step glued in: {s}");
                }
                (got, want) => panic!("{text:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// Each problem names its cause and a next step that fits it.
    #[test]
    fn every_key_problem_says_what_to_do() {
        let cases = [
            (
                KeyProblem::WrongPassphrase,
                &["wrong passphrase", "STARPILOT_SIGN_PASSPHRASE"][..],
            ),
            (
                KeyProblem::NoPassphrase {
                    reason: "there is no terminal".into(),
                },
                &["encrypted", "STARPILOT_SIGN_PASSPHRASE", "minisign -G -W"][..],
            ),
            (KeyProblem::PublicKeyGiven, &["public key", ".key"][..]),
            (
                KeyProblem::Damaged {
                    reason: "checksum".into(),
                },
                &["damaged", "backup"][..],
            ),
            (
                KeyProblem::Kdf { reason: "x".into() },
                &["passphrase", "minisign -C"][..],
            ),
        ];
        for (p, needles) in cases {
            // As reported: the cause, then the next step on its own line.
            let next = cli_support::NextStep::next_step(&p).unwrap_or_default();
            let s = format!("{p}\nnext: {next}");
            for n in needles {
                assert!(s.contains(n), "{p:?}: {s}");
            }
            // The wrong-passphrase answer must not send the engineer to make a new key first.
            if p == KeyProblem::WrongPassphrase {
                assert!(!s.contains("generate a key"), "{s}");
            }
        }
    }
}
