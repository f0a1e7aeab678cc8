//! The out-of-band pickle check (`chunker::oob`) on a chunk set that lives in a store: only the
//! container's headers are read, through [`Store::read_at`] (a seek on disk, an HTTP range on
//! the Hub), so checking a multi-gigabyte artifact costs a few small reads.

use chunker::OobLayout;
use chunker::oob::{self, OobCheckError};

use crate::error::{Error, Result};
use crate::paths::StorePath;
use crate::store::Store;

pub use crate::refusal::NotOob;

/// Check the concatenation of `pieces` (paths and sizes, in order) in `store`. The outer
/// `Result` is for the store failing; the inner one is the verdict.
pub fn check_pieces(
    store: &dyn Store,
    pieces: &[(StorePath, u64)],
    what: &str,
) -> Result<std::result::Result<OobLayout, NotOob>> {
    let total: u64 = pieces.iter().map(|(_, s)| s).sum();
    let mut store_error = None;
    let verdict = oob::check_oob_at(total, |offset, buf| {
        read_span(store, pieces, offset, buf).map_err(|e| {
            let msg = e.to_string();
            store_error = Some(e);
            std::io::Error::other(msg)
        })
    });
    match verdict {
        Ok(layout) => Ok(Ok(layout)),
        Err(OobCheckError::Defect(d)) => Ok(Err(NotOob {
            what: what.to_string(),
            offset: d.offset,
            defect: d.defect,
        })),
        Err(OobCheckError::Io(e)) => Err(store_error.unwrap_or_else(|| Error::StoreRead {
            what: what.to_string(),
            source: e,
        })),
    }
}

/// Fill `buf` from `offset` of the concatenated pieces, crossing chunk boundaries as needed.
fn read_span(
    store: &dyn Store,
    pieces: &[(StorePath, u64)],
    mut offset: u64,
    mut buf: &mut [u8],
) -> Result<()> {
    let mut start = 0u64;
    for (path, size) in pieces {
        if buf.is_empty() {
            break;
        }
        let end = start + size;
        if offset < end {
            let within = offset - start;
            let n = ((end - offset) as usize).min(buf.len());
            let (head, rest) = buf.split_at_mut(n);
            store.read_at(path, within, head)?;
            buf = rest;
            offset += n as u64;
        }
        start = end;
    }
    if buf.is_empty() {
        Ok(())
    } else {
        Err(Error::BadResponse {
            url: store.describe(),
            reason: format!("read past the end of the chunk set at byte {offset}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalStore;
    use chunker::OobDefect;

    #[test]
    fn reads_across_chunk_boundaries_and_names_the_offset() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::new(t.path());
        let data = test_support::published::artifact_bytes(5, 3000);
        let mut pieces = Vec::new();
        for (i, c) in data.chunks(7).enumerate() {
            let p: StorePath = format!("m/x.chunk{:02}", i % 100).parse().unwrap();
            let p: StorePath = format!("{p}-{i}").parse().unwrap();
            store.write_bytes(&p, c).unwrap();
            pieces.push((p, c.len() as u64));
        }
        let layout = check_pieces(&store, &pieces, "x").unwrap().unwrap();
        assert_eq!(layout.size, 3000);
        assert!(layout.buffers >= 4);
        // Cut the last chunk short: the last record is truncated, at its header's offset.
        let (last, _) = pieces.pop().unwrap();
        store.delete(&last).unwrap();
        let e = check_pieces(&store, &pieces, "x").unwrap().unwrap_err();
        assert!(matches!(e.defect, OobDefect::RecordTruncated { .. }), "{e}");
        assert!(e.to_string().contains("x: not an out-of-band"), "{e}");
    }
}
