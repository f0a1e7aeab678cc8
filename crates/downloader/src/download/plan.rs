//! Pure planning of one download: what the payload must be ([`Plan`]), the pieces an artifact
//! is published as, and the segments a run fetches, resuming after what is already on disk.
//! No I/O: every function here is decided by its arguments.

use std::collections::{BTreeMap, BTreeSet};

use chunker::Sha256Digest;

use super::DigestSource;

/// What one origin publishes for a target, every unknown resolved: what the payload must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub size: u64,
    pub sha256: Sha256Digest,
    pub digest_source: DigestSource,
    pub chunk_count: u32,
    pub chunk_sha256: Option<Vec<Sha256Digest>>,
}

/// One remote file of the artifact, placed at `offset` in the assembled artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// 1-based chunk index (1 for a plain file).
    pub index: u32,
    /// The remote file name (`NAME` or `NAME.chunkNNofMM`).
    pub remote: String,
    /// Where its bytes go in the artifact.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u64,
}

/// A byte range `[start, end)` of one piece, fetched by one request (plus retries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segment {
    /// Index into the pieces (not the 1-based chunk index).
    pub piece: usize,
    pub start: u64,
    pub end: u64,
}

/// Pieces of an artifact of `size` bytes published as `count` chunks whose first chunk has
/// `chunk_len` bytes (ignored for `count <= 1`). Pure: no I/O.
pub fn plan_pieces(
    remote_name: &str,
    size: u64,
    count: u32,
    chunk_len: u64,
) -> std::result::Result<Vec<Piece>, String> {
    if count == 0 {
        return Ok(vec![Piece {
            index: 1,
            remote: remote_name.to_string(),
            offset: 0,
            len: size,
        }]);
    }
    let n = u64::from(count);
    let chunk_len = if count == 1 { size } else { chunk_len };
    let before_last = chunk_len
        .checked_mul(n - 1)
        .filter(|b| *b < size && chunk_len > 0)
        .ok_or_else(|| {
            format!("{count} chunks of {chunk_len} bytes cannot hold a {size}-byte artifact")
        })?;
    let last = size - before_last;
    if last > chunk_len {
        return Err(format!(
            "{count} chunks of {chunk_len} bytes leave {last} bytes for the last chunk; more than a chunk"
        ));
    }
    Ok((1..=count)
        .map(|i| Piece {
            index: i,
            remote: chunker::chunk_name(remote_name, i, count),
            offset: u64::from(i - 1) * chunk_len,
            len: if i == count { last } else { chunk_len },
        })
        .collect())
}

/// The names among `names` (a models directory's listing) that installing the plain file `name`
/// removes, in the order they go: its `.chunkmanifest` first (no reader ever sees a manifest
/// without its chunks), then its chunks and legacy `.pNN` parts, then its `.sha256` sidecar
/// (rewritten afterwards when the digest came from the origin's). Pure.
pub fn other_forms<'a>(names: impl IntoIterator<Item = &'a str>, name: &str) -> Vec<String> {
    use chunker::Form;
    let names: Vec<(&str, Option<Form>)> = names
        .into_iter()
        .map(|n| (n, chunker::form_of(name, n)))
        .collect();
    let of = |keep: fn(Form) -> bool| {
        names
            .iter()
            .filter(move |(_, f)| f.is_some_and(keep))
            .map(|(n, _)| n.to_string())
    };
    let mut out: Vec<String> = of(|f| f == Form::ChunkManifest).collect();
    out.extend(of(|f| {
        matches!(f, Form::Chunk { .. } | Form::LegacyPart(_))
    }));
    out.extend(of(|f| f == Form::Sidecar));
    out
}

/// Byte ranges `[a, b)` of pieces already on disk (by piece index), kept merged.
pub(crate) type Partial = BTreeMap<u32, Vec<(u64, u64)>>;

/// Adds `[a, b)` to a sorted list of disjoint ranges, merging what touches. Pure.
pub(crate) fn add_range(ranges: &mut Vec<(u64, u64)>, (a, b): (u64, u64)) {
    if a >= b {
        return;
    }
    ranges.push((a, b));
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for &(x, y) in ranges.iter() {
        match merged.last_mut() {
            Some((_, end)) if x <= *end => *end = (*end).max(y),
            _ => merged.push((x, y)),
        }
    }
    *ranges = merged;
}

/// Split every piece not yet done into up to `ranges` segments of at least 1 MiB, each starting
/// after whatever prefix of it `partial` already has on disk (so a resume never fetches those
/// bytes again). A segment wholly on disk stays, empty, so its piece still gets finished. Pure.
pub(crate) fn plan_segments(
    pieces: &[Piece],
    done: &BTreeSet<u32>,
    partial: &Partial,
    ranges: usize,
) -> Vec<Segment> {
    const MIN_SEGMENT: u64 = 1024 * 1024;
    let mut out = Vec::new();
    for (i, p) in pieces.iter().enumerate() {
        if done.contains(&p.index) {
            continue;
        }
        let have = partial.get(&p.index).map(Vec::as_slice).unwrap_or(&[]);
        let parts = (ranges.max(1) as u64)
            .min(p.len.div_ceil(MIN_SEGMENT))
            .max(1);
        let step = p.len.div_ceil(parts);
        let mut start = 0;
        while start < p.len {
            let end = (start + step).min(p.len);
            let mut from = start;
            for &(a, b) in have {
                if a <= from && from < b {
                    from = b.min(end);
                }
            }
            out.push(Segment {
                piece: i,
                start: from,
                end,
            });
            start = end;
        }
    }
    out
}

/// The smallest share of one connection worth cutting for: below this per connection, each
/// segment is its own block (a small artifact is fetched as planned, one request a segment).
pub(crate) const MIN_BLOCK: u64 = 2 * 1024 * 1024;

/// The share of the bytes fetched in the last round, in smaller blocks (1/`TAIL_DIV`).
const TAIL_DIV: u64 = 7;

/// One connection's unit of work: consecutive bytes of the artifact, as the segments (one per
/// piece it spans) that fetch them, in order.
pub(crate) type Block = Vec<Segment>;

/// Cut `segments` (in artifact order) into the blocks `workers` connections take off the queue,
/// so every connection stays busy and bytes arrive roughly in artifact order for the digest:
/// the first 6/7 of the bytes in `workers` equal blocks, the last 1/7 in `workers` smaller ones
/// (the digest catches up meanwhile, leaving only a small last round to hash). Blocks span
/// pieces but never a hole; below [`MIN_BLOCK`] per connection each segment is a block, and a
/// last round below it is dropped. Pure.
pub(crate) fn plan_blocks(segments: Vec<Segment>, workers: usize) -> Vec<Block> {
    let total: u64 = segments.iter().map(|s| s.end - s.start).sum();
    let n = workers.max(1) as u64;
    if total / n < MIN_BLOCK {
        return segments.into_iter().map(|s| vec![s]).collect();
    }
    let tail = Some(total / TAIL_DIV)
        .filter(|t| t / n >= MIN_BLOCK)
        .unwrap_or(0);
    // Where each block ends, in fetched bytes.
    let mut ends = Vec::with_capacity(2 * n as usize);
    for (from, len) in [(0, total - tail), (total - tail, tail)] {
        if len == 0 {
            continue;
        }
        for k in 1..=n {
            let end = from + len * k / n;
            if ends.last() != Some(&end) {
                ends.push(end);
            }
        }
    }
    let mut out: Vec<Block> = Vec::with_capacity(ends.len());
    let mut block: Block = Vec::new();
    let mut ends = ends.into_iter().peekable();
    let mut fetched = 0u64;
    // A hole between two segments (bytes on disk) ends nothing by itself: a block spans
    // segments in order.
    for s in segments {
        let mut start = s.start;
        while start < s.end {
            let Some(&end) = ends.peek() else { break };
            let take = (end - fetched).min(s.end - start);
            block.push(Segment {
                piece: s.piece,
                start,
                end: start + take,
            });
            start += take;
            fetched += take;
            if fetched == end {
                out.push(std::mem::take(&mut block));
                ends.next();
            }
        }
        if s.start == s.end {
            // An empty segment (a piece wholly on disk) still finishes its piece.
            block.push(s.clone());
        }
    }
    if !block.is_empty() {
        out.push(block);
    }
    out
}

/// Byte ranges `[a, b)` of the artifact already on disk when a run starts: everything of its
/// `size` bytes that none of `segments` (of `pieces`) is about to fetch. Sorted, merged. Pure.
pub(crate) fn present_ranges(pieces: &[Piece], segments: &[Segment], size: u64) -> Vec<(u64, u64)> {
    let mut fetched: Vec<(u64, u64)> = Vec::new();
    for s in segments {
        let at = pieces[s.piece].offset;
        add_range(&mut fetched, (at + s.start, at + s.end));
    }
    let mut out = Vec::new();
    let mut cursor = 0;
    for (a, b) in fetched {
        if a > cursor {
            out.push((cursor, a));
        }
        cursor = cursor.max(b);
    }
    if cursor < size {
        out.push((cursor, size));
    }
    out
}

/// Bytes of `pieces` on disk according to `done` and `partial`.
pub(crate) fn bytes_on_disk(pieces: &[Piece], done: &BTreeSet<u32>, partial: &Partial) -> u64 {
    pieces
        .iter()
        .map(|p| {
            if done.contains(&p.index) {
                p.len
            } else {
                partial
                    .get(&p.index)
                    .map(|r| {
                        r.iter()
                            .map(|(a, b)| b.min(&p.len).saturating_sub(*a))
                            .sum()
                    })
                    .unwrap_or(0)
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_match_the_chunk_format() {
        let p = plan_pieces("a.pkl", 10, 3, 4).unwrap();
        assert_eq!(
            p.iter()
                .map(|p| (p.remote.as_str(), p.offset, p.len))
                .collect::<Vec<_>>(),
            [
                ("a.pkl.chunk01of03", 0, 4),
                ("a.pkl.chunk02of03", 4, 4),
                ("a.pkl.chunk03of03", 8, 2)
            ]
        );
        assert_eq!(plan_pieces("a.pkl", 10, 0, 0).unwrap()[0].remote, "a.pkl");
        assert_eq!(plan_pieces("a.pkl", 10, 1, 999).unwrap()[0].len, 10);
        assert!(
            plan_pieces("a.pkl", 10, 3, 3).is_err(),
            "last chunk would be 4 > 3"
        );
        assert!(
            plan_pieces("a.pkl", 10, 3, 5).is_err(),
            "two chunks already hold it all"
        );
        assert!(plan_pieces("a.pkl", 10, 3, 0).is_err());
    }

    #[test]
    fn other_forms_of_an_artifact() {
        let name = "a_driving_tinygrad.pkl";
        let listing = [
            "a_driving_tinygrad.pkl.sha256",
            "a_driving_tinygrad.pkl.chunk02of02",
            "a_driving_tinygrad.pkl",
            "a_driving_tinygrad.pkl.p01",
            "a_driving_tinygrad.pkl.chunkmanifest",
            "a_driving_tinygrad.pkl.chunk01of02",
            "a_driving_tinygrad.pkl.p1",
            "b_driving_tinygrad.pkl.chunk01of02",
            "ab_driving_tinygrad.pkl.chunkmanifest",
        ];
        assert_eq!(
            other_forms(listing, name),
            [
                "a_driving_tinygrad.pkl.chunkmanifest",
                "a_driving_tinygrad.pkl.chunk02of02",
                "a_driving_tinygrad.pkl.p01",
                "a_driving_tinygrad.pkl.chunk01of02",
                "a_driving_tinygrad.pkl.sha256",
            ]
        );
        assert!(other_forms([name], name).is_empty());
    }

    #[test]
    fn ranges_merge() {
        type Ranges = &'static [(u64, u64)];
        let table: &[(Ranges, (u64, u64), Ranges)] = &[
            (&[], (0, 5), &[(0, 5)]),
            (&[(0, 5)], (5, 9), &[(0, 9)]),
            (&[(0, 5)], (7, 9), &[(0, 5), (7, 9)]),
            (&[(0, 5), (7, 9)], (4, 8), &[(0, 9)]),
            (&[(2, 3)], (3, 3), &[(2, 3)]),
            (&[(2, 8)], (3, 4), &[(2, 8)]),
        ];
        for (have, add, want) in table {
            let mut r = have.to_vec();
            add_range(&mut r, *add);
            assert_eq!(&r, want, "{have:?} + {add:?}");
        }
    }

    /// A resume starts each segment after the prefix already on disk and keeps wholly present
    /// segments (empty) so their piece is still finished and checked.
    #[test]
    fn segments_resume_inside_a_piece() {
        let pieces = plan_pieces("a", 5 << 20, 2, 3 << 20).unwrap();
        let mut partial = Partial::new();
        partial.insert(1, vec![(0, 1000)]);
        partial.insert(2, vec![(0, 2 << 20)]);
        let segs = plan_segments(&pieces, &BTreeSet::new(), &partial, 1);
        assert_eq!(
            segs,
            [
                Segment {
                    piece: 0,
                    start: 1000,
                    end: 3 << 20
                },
                Segment {
                    piece: 1,
                    start: 2 << 20,
                    end: 2 << 20
                }
            ]
        );
        assert_eq!(
            bytes_on_disk(&pieces, &BTreeSet::new(), &partial),
            1000 + (2 << 20)
        );
        assert_eq!(
            bytes_on_disk(&pieces, &BTreeSet::from([1]), &partial),
            5 << 20
        );
        // A range that does not start at a segment's start does not move it.
        partial.insert(1, vec![(10, 1000)]);
        assert_eq!(
            plan_segments(&pieces, &BTreeSet::new(), &partial, 1)[0].start,
            0
        );
    }

    /// Blocks keep artifact order and cover every byte of every segment once; the first 6/7
    /// of the bytes go in one equal block per connection (spanning pieces), the last 1/7 in
    /// one equal small block per connection; a small artifact keeps one block per segment. The
    /// rule depends only on the bytes, so it holds for v25's 45 MiB chunks and a made-up next
    /// generation's 90 MiB ones alike.
    #[test]
    fn blocks_cover_in_order_with_a_small_last_round() {
        const M: u64 = 1 << 20;
        for (size, chunk, workers, rounds) in [
            (256 * M, 45 * M, 8, 2),
            (256 * M, 45 * M, 4, 2),
            (1100 * M, 90 * M, 8, 2),
            (30 * M, 45 * M, 4, 1),
        ] {
            let count = size.div_ceil(chunk) as u32;
            let pieces = plan_pieces("a", size, count, chunk).unwrap();
            let segs = plan_segments(&pieces, &BTreeSet::new(), &Partial::new(), 1);
            let blocks = plan_blocks(segs, workers);
            assert_eq!(blocks.len(), rounds * workers, "{size} {workers}");
            let mut last_end = 0;
            let mut lens = Vec::new();
            for b in &blocks {
                let mut len = 0;
                for s in b {
                    let at = pieces[s.piece].offset;
                    assert_eq!(at + s.start, last_end, "in artifact order");
                    assert!(s.end > s.start);
                    last_end = at + s.end;
                    len += s.end - s.start;
                }
                lens.push(len);
            }
            assert_eq!(last_end, size);
            for round in lens.chunks(workers) {
                let (lo, hi) = (round.iter().min().unwrap(), round.iter().max().unwrap());
                assert!(hi - lo <= 1, "equal blocks in a round: {round:?}");
            }
            if rounds == 2 {
                let first: u64 = lens[..workers].iter().sum();
                assert_eq!(first, size - size / 7);
            }
        }
        // Segments of a small artifact are each their own block; an empty one is kept.
        let seg = |piece, start, end| Segment { piece, start, end };
        let small = vec![seg(0, 0, 3 * M), seg(1, 100, 2 * M), seg(2, 5, 5)];
        assert_eq!(
            plan_blocks(small.clone(), 4),
            small.into_iter().map(|s| vec![s]).collect::<Vec<_>>()
        );
        assert!(plan_blocks(Vec::new(), 4).is_empty());
        // A block spans a hole (bytes on disk) and the end of a piece; 20 MiB over two
        // connections is one round (a last round would be below the floor).
        let resumed = vec![seg(0, 0, 5 * M), seg(0, 10 * M, 15 * M), seg(1, 0, 10 * M)];
        assert_eq!(
            plan_blocks(resumed, 2),
            [
                vec![seg(0, 0, 5 * M), seg(0, 10 * M, 15 * M)],
                vec![seg(1, 0, 10 * M)],
            ]
        );
        let spanning = vec![seg(0, 0, 12 * M), seg(1, 0, 8 * M)];
        assert_eq!(
            plan_blocks(spanning, 2),
            [
                vec![seg(0, 0, 10 * M)],
                vec![seg(0, 10 * M, 12 * M), seg(1, 0, 8 * M)],
            ]
        );
    }

    /// What is on disk before a run is what no segment fetches: whole done pieces and the
    /// prefixes a resume starts after.
    #[test]
    fn present_is_what_no_segment_fetches() {
        let pieces = plan_pieces("a", 10, 3, 4).unwrap();
        let seg = |piece, start, end| Segment { piece, start, end };
        type Case<'a> = (&'a [Segment], &'a [(u64, u64)]);
        let table: &[Case] = &[
            (&[seg(0, 0, 4), seg(1, 0, 4), seg(2, 0, 2)], &[]),
            (&[seg(1, 0, 4)], &[(0, 4), (8, 10)]),
            (&[seg(0, 1, 4), seg(2, 1, 2)], &[(0, 1), (4, 9)]),
            (&[seg(1, 4, 4)], &[(0, 10)]),
            (&[], &[(0, 10)]),
        ];
        for (segs, want) in table {
            assert_eq!(&present_ranges(&pieces, segs, 10), want, "{segs:?}");
        }
    }

    #[test]
    fn segments_cover_each_missing_piece_once() {
        let pieces = plan_pieces("a", 5 << 20, 2, 3 << 20).unwrap();
        let segs = plan_segments(&pieces, &BTreeSet::new(), &Partial::new(), 4);
        for (i, p) in pieces.iter().enumerate() {
            let mut covered = 0;
            for s in segs.iter().filter(|s| s.piece == i) {
                assert_eq!(s.start, covered);
                covered = s.end;
            }
            assert_eq!(covered, p.len);
        }
        assert_eq!(segs.len(), 3 + 2);
        let segs = plan_segments(&pieces, &BTreeSet::from([1]), &Partial::new(), 1);
        assert_eq!(
            segs,
            [Segment {
                piece: 1,
                start: 0,
                end: 2 << 20
            }]
        );
    }
}
