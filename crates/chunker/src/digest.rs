//! The SHA-256 digest newtype and streaming hashing helpers.

use std::fmt;
use std::io::{self, Read};
use std::path::Path;
use std::str::FromStr;

use sha2::{Digest, Sha256};

use crate::error::Error;

/// Size of the buffers used for every streaming read in this workspace.
pub const IO_BUFFER_SIZE: usize = 1 << 20;

/// A SHA-256 digest. It can only be built from 32 bytes or from exactly 64 lowercase hex digits,
/// which is the form every StarPilot manifest and `.sha256` sidecar uses.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sha256Digest([u8; 32]);

/// Why a string is not a [`Sha256Digest`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not 64 lowercase hex digits")]
pub struct InvalidDigest;

impl Sha256Digest {
    /// The digest with these 32 raw bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The 32 raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Digest of an in-memory byte string (small inputs only: tests, sidecars).
    pub fn of_bytes(data: &[u8]) -> Self {
        Self(Sha256::digest(data).into())
    }

    /// Digest of everything `reader` yields, streamed through a bounded buffer.
    /// Returns the digest and the number of bytes read.
    pub fn of_reader(reader: impl Read) -> io::Result<(Self, u64)> {
        let mut hasher = Hasher::new();
        let total = hasher.update_from_reader(reader)?;
        Ok((hasher.finish(), total))
    }

    /// Digest and size of a file on disk, streamed.
    pub fn of_file(path: &Path) -> Result<(Self, u64), Error> {
        let file = fs_err::File::open(path)?;
        Ok(Self::of_reader(file)?)
    }
}

impl FromStr for Sha256Digest {
    type Err = InvalidDigest;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 64 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(InvalidDigest);
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|_| InvalidDigest)?;
        Ok(Self(out))
    }
}

impl fmt::Display for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256Digest({})", self.to_hex())
    }
}

impl serde::Serialize for Sha256Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for Sha256Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not 64 lowercase hex digits")))
    }
}

/// Which SHA-256 code [`Hasher`] runs on this CPU, as `sha2` chooses it at run time: its
/// instruction backend when the CPU reports the SHA instructions (x86_64's SHA extensions with
/// SSE2, SSSE3 and SSE4.1; aarch64's ARMv8 SHA-2, HWCAP `sha2`), its portable code otherwise.
/// Asked the same way `sha2` asks (the kernel's HWCAP on aarch64 Linux, CPUID on x86_64), so
/// what `status -v` names is what hashes.
pub fn hash_backend() -> &'static str {
    backend_name(hardware_sha256())
}

/// The name [`hash_backend`] prints. Pure.
pub fn backend_name(hardware: Option<&'static str>) -> &'static str {
    hardware.unwrap_or("portable (no SHA-256 instructions on this CPU)")
}

#[cfg(target_arch = "aarch64")]
fn hardware_sha256() -> Option<&'static str> {
    std::arch::is_aarch64_feature_detected!("sha2").then_some("ARMv8 SHA-2 instructions")
}

#[cfg(target_arch = "x86_64")]
fn hardware_sha256() -> Option<&'static str> {
    (std::arch::is_x86_feature_detected!("sha")
        && std::arch::is_x86_feature_detected!("sse2")
        && std::arch::is_x86_feature_detected!("ssse3")
        && std::arch::is_x86_feature_detected!("sse4.1"))
    .then_some("x86 SHA extensions")
}

#[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
fn hardware_sha256() -> Option<&'static str> {
    None
}

/// A running SHA-256 that can be fed piece by piece; a thin wrapper so callers need not depend on
/// `sha2` themselves.
#[derive(Clone, Default)]
pub struct Hasher(Sha256);

impl Hasher {
    /// A hasher that has seen no bytes yet.
    pub fn new() -> Self {
        Self(Sha256::new())
    }

    /// Feed `data` to the digest.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// Feed everything `reader` yields, streamed through a bounded buffer; returns the number
    /// of bytes read. Lets several readers (the chunks of a set) feed one digest.
    pub fn update_from_reader(&mut self, mut reader: impl Read) -> io::Result<u64> {
        let mut buf = vec![0u8; IO_BUFFER_SIZE];
        let mut total = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => return Ok(total),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.0.update(&buf[..n]);
            total += n as u64;
        }
    }

    /// The digest of every byte fed so far.
    pub fn finish(self) -> Sha256Digest {
        Sha256Digest(self.0.finalize().into())
    }
}

/// The SHA-256 of each piece of a stream cut at the given sizes: what the split and the
/// verification hash per chunk beside the whole digest. Bytes past the last size go to one
/// more piece.
pub(crate) struct PieceHashes<I> {
    sizes: I,
    left: u64,
    current: Hasher,
    digests: Vec<Sha256Digest>,
}

impl<I: Iterator<Item = u64>> PieceHashes<I> {
    pub(crate) fn new(mut sizes: I) -> Self {
        let left = sizes.next().unwrap_or(0);
        let (current, digests) = (Hasher::new(), Vec::new());
        Self {
            sizes,
            left,
            current,
            digests,
        }
    }

    /// Feed the next bytes of the stream.
    pub(crate) fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            while self.left == 0 {
                self.digests
                    .push(std::mem::take(&mut self.current).finish());
                self.left = self.sizes.next().unwrap_or(u64::MAX);
            }
            let (piece, rest) = data.split_at(self.left.min(data.len() as u64) as usize);
            self.current.update(piece);
            self.left -= piece.len() as u64;
            data = rest;
        }
    }

    /// Every piece's digest in order; pieces the stream never reached hash as empty.
    pub(crate) fn finish(mut self) -> Vec<Sha256Digest> {
        self.digests.push(self.current.finish());
        self.digests
            .extend(self.sizes.map(|_| Hasher::new().finish()));
        self.digests
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The backend is named as the CPU reports its SHA instructions, the way `sha2` asks; the
    /// portable code says so.
    #[test]
    fn the_hash_backend_is_named_as_the_cpu_reports_it() {
        assert_eq!(
            backend_name(Some("ARMv8 SHA-2 instructions")),
            "ARMv8 SHA-2 instructions"
        );
        assert!(backend_name(None).starts_with("portable"));
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            hash_backend() == "x86 SHA extensions",
            std::arch::is_x86_feature_detected!("sha")
                && std::arch::is_x86_feature_detected!("sse4.1")
        );
        #[cfg(target_arch = "aarch64")]
        assert_eq!(
            hash_backend() == "ARMv8 SHA-2 instructions",
            std::arch::is_aarch64_feature_detected!("sha2")
        );
    }

    #[test]
    fn parses_only_lowercase_hex() {
        let good = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(good.parse::<Sha256Digest>().unwrap().to_hex(), good);
        assert_eq!(Sha256Digest::of_bytes(b"").to_hex(), good);
        assert!(good.to_uppercase().parse::<Sha256Digest>().is_err());
        assert!(good[..63].parse::<Sha256Digest>().is_err());
        assert!(format!("{good}0").parse::<Sha256Digest>().is_err());
        assert!("g".repeat(64).parse::<Sha256Digest>().is_err());
    }
}
