//! What one origin publishes for a target: the chunk count, the digest and the size the
//! manifest entry leaves open, learned with a few small requests (no payload); and the layout an
//! entry declaring all of them implies, which a transfer may start on while those requests are
//! in flight ([`implied_plan`]), kept only when they confirm it.

use std::path::Path;

use chunker::Sha256Digest;

use super::plan::Plan;
use super::retry::with_retries;
use super::{DigestSource, DownloadConfig, Target};
use crate::error::{Error, Result};
use crate::http::{Ctl, Http};

/// A sidecar's digest as upstream reads it: the first token, 64 hex digits in either case.
pub(crate) fn parse_remote_sidecar(body: &[u8], url: &str) -> Result<Sha256Digest> {
    let token = std::str::from_utf8(body)
        .ok()
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or("");
    token.to_ascii_lowercase().parse().map_err(|_| {
        Error::protocol(
            url,
            format!(
                "malformed .sha256 sidecar: first token is not 64 hex digits (got {:?})",
                &token[..token.len().min(80)]
            ),
        )
    })
}

/// Where a target's piece count comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CountSource {
    /// The entry declares 0: one plain file.
    Plain,
    /// The entry's count, taken as it is (the origin is not asked).
    Declared(u32),
    /// The origin's `.chunkmanifest` (checked against the entry's count when it has one).
    ChunkManifest,
}

/// The piece count's source for an entry declaring `declared`, on a device whose contract
/// takes the count from the manifest alone (`from_manifest`) or asks the origin. Pure.
pub(crate) fn count_source(declared: Option<u32>, from_manifest: bool) -> CountSource {
    match (declared, from_manifest) {
        (Some(0), _) => CountSource::Plain,
        (Some(n), true) => CountSource::Declared(n),
        _ => CountSource::ChunkManifest,
    }
}

/// Everything one origin must tell before the first payload byte (chunk count, digest, size,
/// first chunk length) that the entry leaves open or must be checked. A few small requests.
pub(crate) fn resolve_plan(
    http: &Http,
    config: &DownloadConfig,
    target: &Target,
    count_from_manifest: bool,
    ctl: &Ctl,
    url_of: &(dyn Fn(&str) -> Result<String> + Sync),
) -> Result<(Plan, u64)> {
    let remote = target.remote_name.as_str();
    let ask = Ask {
        http,
        config,
        ctl,
        url_of,
    };
    // When the entry declares a chunk count, the first chunk's name is known before the
    // `.chunkmanifest` answers: its HEAD (the chunk length) goes out at the same time, so the
    // two round trips cost one.
    std::thread::scope(|s| {
        let early_head = target.chunk_count.filter(|n| *n > 1).map(|n| {
            let name = chunker::chunk_name(remote, 1, n);
            s.spawn(move || ask.head_len(&name))
        });
        let source = count_source(target.chunk_count, count_from_manifest);
        resolve_with(ask, target, source, early_head)
    })
}

/// The plan (and first chunk length) an entry declaring size, digest and chunk count implies,
/// when the origin would still be asked before the first payload byte: a transfer may start on
/// it meanwhile, kept only if [`resolve_plan`] gives the same. Pure.
pub(crate) fn implied_plan(target: &Target, count_from_manifest: bool) -> Option<(Plan, u64)> {
    let (size, sha256, count) = (target.size?, target.sha256?, target.chunk_count?);
    let asks = match count_source(Some(count), count_from_manifest) {
        CountSource::Plain => false,
        CountSource::Declared(n) => n > 1,
        CountSource::ChunkManifest => true,
    };
    if !asks {
        return None;
    }
    let plan = Plan {
        size,
        sha256,
        digest_source: DigestSource::Manifest,
        chunk_count: count,
        chunk_sha256: target.chunk_sha256.clone(),
    };
    Some((plan, implied_chunk_len(size, count)?))
}

/// The first chunk's length an artifact of `size` bytes in `count > 0` chunks most likely has:
/// the whole artifact for one chunk; else the native chunk size, when `count` such chunks hold
/// exactly `size` bytes (the last one 1 to chunk-size bytes); else `size / count` rounded up
/// when that fits the same way; else `None`. A guess, confirmed by the origin. Pure.
pub(crate) fn implied_chunk_len(size: u64, count: u32) -> Option<u64> {
    let n = u64::from(count);
    let fits = |len: u64| len > 0 && chunker::chunk_count_for(size, len) == n;
    match count {
        0 => None,
        1 => Some(size),
        _ => [chunker::DEFAULT_CHUNK_SIZE, size.div_ceil(n)]
            .into_iter()
            .find(|&len| fits(len)),
    }
}

/// Where the resolve's requests go: one origin's URLs, asked with retries under its control.
#[derive(Clone, Copy)]
struct Ask<'a> {
    http: &'a Http,
    config: &'a DownloadConfig,
    ctl: &'a Ctl,
    url_of: &'a (dyn Fn(&str) -> Result<String> + Sync),
}

/// Whether the origin says a file is not there.
fn is_gone(e: &Error) -> bool {
    matches!(
        e,
        Error::Status {
            status: 404 | 403 | 410,
            ..
        }
    )
}

fn resolve_with(
    ask: Ask<'_>,
    target: &Target,
    source: CountSource,
    early_head: Option<std::thread::ScopedJoinHandle<'_, Result<u64>>>,
) -> Result<(Plan, u64)> {
    let url_of = ask.url_of;
    let remote = target.remote_name.as_str();
    let chunk_count = ask.chunk_count(target, source)?;
    if let Some(list) = &target.chunk_sha256
        && list.len() != chunk_count as usize
    {
        return Err(Error::ChunkCountMismatch {
            url: url_of(&chunker::chunk_manifest_name(remote))?,
            expected: list.len() as u32,
            remote: chunk_count,
        });
    }
    let (sha256, digest_source) = match target.sha256 {
        Some(d) => (d, DigestSource::Manifest),
        None => (ask.sidecar_digest(target)?, DigestSource::Sidecar),
    };
    let first_len = match early_head {
        // Asked for under the declared count, which the `.chunkmanifest` just confirmed.
        Some(h) if chunk_count > 1 => Some(h.join().unwrap_or_else(|_| {
            Err(Error::protocol(
                &url_of(remote).unwrap_or_default(),
                "the HEAD request's thread panicked",
            ))
        })?),
        _ if chunk_count > 1 => Some(ask.head_len(&chunker::chunk_name(remote, 1, chunk_count))?),
        _ => None,
    };
    let size = match target.size {
        Some(s) => s,
        None => ask.learned_size(remote, chunk_count, first_len)?,
    };
    let plan = Plan {
        size,
        sha256,
        digest_source,
        chunk_count,
        chunk_sha256: target.chunk_sha256.clone(),
    };
    Ok((plan, first_len.unwrap_or(size)))
}

impl Ask<'_> {
    /// The length `HEAD` gives for the remote file `name`.
    fn head_len(&self, name: &str) -> Result<u64> {
        let url = (self.url_of)(name)?;
        let (len, _) = with_retries(self.config, self.ctl, &url, || {
            self.http.head(&url, self.ctl)
        })?;
        len.ok_or_else(|| Error::protocol(&url, "HEAD gave no Content-Length"))
    }

    /// How many chunks the artifact is published as: 0 for a plain file, the entry's count, or
    /// the origin's `.chunkmanifest` (which must agree with a declared count).
    fn chunk_count(&self, target: &Target, source: CountSource) -> Result<u32> {
        let (http, ctl) = (self.http, self.ctl);
        let url = match source {
            CountSource::Plain => return Ok(0),
            CountSource::Declared(n) => return Ok(n),
            CountSource::ChunkManifest => {
                (self.url_of)(&chunker::chunk_manifest_name(target.remote_name.as_str()))?
            }
        };
        let declared = target.chunk_count;
        match with_retries(self.config, ctl, &url, || http.get_small(&url, 64, ctl)) {
            Ok(body) => {
                let remote_count =
                    chunker::parse_chunk_manifest(&body, Path::new(&url)).map_err(|source| {
                        Error::BadChunkManifest {
                            url: url.clone(),
                            source,
                        }
                    })?;
                if let Some(expected) = declared
                    && remote_count != expected
                {
                    return Err(Error::ChunkCountMismatch {
                        url,
                        expected,
                        remote: remote_count,
                    });
                }
                Ok(remote_count)
            }
            // Nothing published as chunks, and the entry does not say there are any: upstream
            // then reads the name as one plain file.
            Err(e) if declared.is_none() && is_gone(&e) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// The digest from the origin's `.sha256` sidecar, for an entry that declares none.
    fn sidecar_digest(&self, target: &Target) -> Result<chunker::Sha256Digest> {
        let (http, ctl) = (self.http, self.ctl);
        let url = (self.url_of)(&chunker::sidecar_name(target.remote_name.as_str()))?;
        match with_retries(self.config, ctl, &url, || http.get_small(&url, 1024, ctl)) {
            Ok(body) => parse_remote_sidecar(&body, &url),
            Err(e) if is_gone(&e) => Err(Error::NotDownloadable {
                model: target.id.to_string(),
                reason: format!(
                    "the manifest declares no artifact_sha256 and the origin has no sidecar ({url}: {e}); nothing to verify the bytes against"
                ),
            }),
            Err(e) => Err(e),
        }
    }

    /// The size of an entry that declares none, from the published files' lengths (every chunk
    /// but the last is as long as the first).
    fn learned_size(&self, remote: &str, chunk_count: u32, first_len: Option<u64>) -> Result<u64> {
        let learned = match (chunk_count, first_len) {
            (0, _) => self.head_len(remote)?,
            (1, _) => self.head_len(&chunker::chunk_name(remote, 1, 1))?,
            (n, Some(first)) => {
                let last = self.head_len(&chunker::chunk_name(remote, n, n))?;
                first
                    .checked_mul(u64::from(n - 1))
                    .and_then(|b| b.checked_add(last))
                    .unwrap_or(u64::MAX)
            }
            (_, None) => unreachable!("the first chunk's length is read for n > 1"),
        };
        Ok(manifest::ArtifactSize::new(learned)
            .map_err(|e| {
                Error::size_mismatch(
                    &(self.url_of)(remote).unwrap_or_default(),
                    format!("the published files add up to {learned} bytes: {e}"),
                )
            })?
            .get())
    }
}

#[cfg(test)]
mod count_tests {
    use super::{CountSource, count_source, implied_chunk_len};
    use manifest::contract::ContractName;

    /// v25 asks the origin's `.chunkmanifest` for every chunked entry; a contract taking the
    /// count from the manifest (v26) never does; a declared 0 is a plain file for both.
    #[test]
    fn where_the_piece_count_comes_from() {
        let v25 = ContractName::V25.contract().chunk_count_from_manifest;
        let v26 = ContractName::V26.contract().chunk_count_from_manifest;
        let table = [
            (v25, Some(0), CountSource::Plain),
            (v25, Some(3), CountSource::ChunkManifest),
            (v25, None, CountSource::ChunkManifest),
            (v26, Some(0), CountSource::Plain),
            (v26, Some(1), CountSource::Declared(1)),
            (v26, Some(3), CountSource::Declared(3)),
            (v26, None, CountSource::ChunkManifest),
        ];
        for (from_manifest, declared, want) in table {
            assert_eq!(count_source(declared, from_manifest), want, "{declared:?}");
        }
    }

    /// Whether a transfer starts before the origin answers, per generation as the pin table
    /// gives its contract (v25; v26 recorded with upstream's v26 contract; a made-up v27 that
    /// inherits it): v25 asks every chunked entry's `.chunkmanifest` first (docs/formats.md),
    /// so every declared chunk count starts early; the v26 contract takes the count from the
    /// manifest and asks only the first chunk's HEAD of a set of two or more, so a one-chunk
    /// entry has no round trip to save; a plain file (count 0) never starts early.
    #[test]
    fn when_a_transfer_starts_before_the_origin_answers() {
        use super::implied_plan;
        use crate::download::Target;
        use manifest::{Generation, PinTable};
        let mut pins = PinTable::builtin();
        pins.record_contract(Generation::new(26), ContractName::V26)
            .unwrap();
        let target = |count| Target {
            id: "pop".parse().unwrap(),
            remote_name: "pop_driving_tinygrad.pkl".parse().unwrap(),
            local_name: "pop_driving_tinygrad.pkl".parse().unwrap(),
            size: Some(180_000_000),
            sha256: Some(chunker::Sha256Digest::from_bytes([7; 32])),
            chunk_count: Some(count),
            chunk_sha256: None,
        };
        let table = [
            (25, [false, true, true]),
            (26, [false, false, true]),
            (27, [false, false, true]),
        ];
        for (generation, want) in table {
            let contract = pins.contract(Generation::new(generation));
            for (count, want) in [0, 1, 4].into_iter().zip(want) {
                let early = implied_plan(&target(count), contract.chunk_count_from_manifest);
                assert_eq!(early.is_some(), want, "v{generation}, {count} chunk(s)");
            }
        }
    }

    /// The chunk length a transfer starts on before the origin confirms it: the native 45 MiB
    /// when it fits the count, else the size split evenly (rounded up), else none.
    #[test]
    fn the_implied_chunk_length() {
        const MIB: u64 = 1 << 20;
        let native = chunker::DEFAULT_CHUNK_SIZE;
        let table = [
            // The field's model: four native chunks, the last one short.
            (180_000_000, 4, Some(native)),
            (4 * native, 4, Some(native)),
            (3 * native + 1, 4, Some(native)),
            // Cut with another chunk size: evenly, or nearly.
            (64 * MIB, 4, Some(16 * MIB)),
            (
                3 * 64 * 1024 + 100,
                4,
                Some((3 * 64 * 1024 + 100_u64).div_ceil(4)),
            ),
            (5, 4, None),
            (1000, 1, Some(1000)),
            (1000, 0, None),
        ];
        for (size, count, want) in table {
            assert_eq!(implied_chunk_len(size, count), want, "{size} in {count}");
        }
    }
}
