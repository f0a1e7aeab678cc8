//! SHA-256 states that can take the same bytes together: the split's whole-artifact digest and
//! one chunk's digest, from one pass over each block.
//!
//! A split hashes every byte twice (the artifact's digest and its chunk's). On a machine with
//! two cores those two passes fill both, and reading and writing have to squeeze in beside them
//! (issue 27 item 1). A single SHA-256 is bound by the latency of its round instructions, so a
//! second, independent state fed the same message schedule costs far less than a second pass:
//! on x86_64 with the SHA extensions [`State::update_both`] interleaves the rounds of both
//! states, measured at about 1.3 times one digest's time for the two (two passes: 2.0). The split
//! uses it for the chunks its chunk hasher falls behind on. Elsewhere it is two ordinary passes.
//!
//! The block function is `sha2`'s (`compress256`) for one state and ours only for the two-state
//! rounds; [`State`] adds the buffering and the padding of FIPS 180-4 §5.1.1 around it. Every
//! path is checked against `sha2`'s own digest in the tests.

use sha2::digest::generic_array::GenericArray;
use sha2::digest::typenum::U64;

use crate::Sha256Digest;

const BLOCK: usize = 64;

/// FIPS 180-4 §5.3.3: the initial hash value.
const INITIAL: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// A running SHA-256: the chaining value, the bytes of a block not yet full, and the length.
#[derive(Clone)]
pub struct State {
    h: [u32; 8],
    block: [u8; BLOCK],
    filled: usize,
    len: u64,
}

impl Default for State {
    fn default() -> Self {
        Self::new()
    }
}

impl State {
    pub fn new() -> Self {
        Self {
            h: INITIAL,
            block: [0; BLOCK],
            filled: 0,
            len: 0,
        }
    }

    /// Feed `data` to this state alone.
    pub fn update(&mut self, data: &[u8]) {
        let data = self.absorb_head(data);
        let whole = data.len() - data.len() % BLOCK;
        compress(&mut self.h, &data[..whole]);
        self.absorb_tail(&data[whole..]);
    }

    /// Feed `data` to `self` and `other` at once. When both stand at the same place in a block
    /// (a chunk starting on a multiple of 64 bytes of the artifact), every whole block goes
    /// through the two-state rounds; otherwise this is two ordinary updates.
    pub fn update_both(&mut self, other: &mut State, data: &[u8]) {
        if self.filled != other.filled {
            self.update(data);
            other.update(data);
            return;
        }
        let rest = self.absorb_head(data);
        other.absorb_head(data);
        debug_assert_eq!(self.filled, other.filled);
        let whole = rest.len() - rest.len() % BLOCK;
        compress_both(&mut self.h, &mut other.h, &rest[..whole]);
        self.absorb_tail(&rest[whole..]);
        other.absorb_tail(&rest[whole..]);
    }

    /// The digest of everything fed: FIPS 180-4 padding, then the last block(s).
    pub fn finish(mut self) -> Sha256Digest {
        let bits = self.len.wrapping_mul(8);
        let mut tail = [0u8; 2 * BLOCK];
        tail[..self.filled].copy_from_slice(&self.block[..self.filled]);
        tail[self.filled] = 0x80;
        // The length takes the last 8 bytes: one block if they fit after the 0x80, else two.
        let end = if self.filled < BLOCK - 8 {
            BLOCK
        } else {
            2 * BLOCK
        };
        tail[end - 8..end].copy_from_slice(&bits.to_be_bytes());
        compress(&mut self.h, &tail[..end]);
        let mut out = [0u8; 32];
        for (word, bytes) in self.h.iter().zip(out.chunks_exact_mut(4)) {
            bytes.copy_from_slice(&word.to_be_bytes());
        }
        Sha256Digest::from_bytes(out)
    }

    /// Complete a partly filled block from the front of `data` (compressing it once full), count
    /// `data`'s length, and return what is left.
    fn absorb_head<'a>(&mut self, data: &'a [u8]) -> &'a [u8] {
        self.len = self.len.wrapping_add(data.len() as u64);
        if self.filled == 0 {
            return data;
        }
        let take = (BLOCK - self.filled).min(data.len());
        self.block[self.filled..self.filled + take].copy_from_slice(&data[..take]);
        self.filled += take;
        if self.filled == BLOCK {
            let block = self.block;
            compress(&mut self.h, &block);
            self.filled = 0;
        }
        &data[take..]
    }

    /// Keep `tail`, shorter than a block, for the next update (the state's block is empty).
    fn absorb_tail(&mut self, tail: &[u8]) {
        if !tail.is_empty() {
            debug_assert_eq!(self.filled, 0);
            self.block[..tail.len()].copy_from_slice(tail);
            self.filled = tail.len();
        }
    }
}

/// `sha2`'s block function over whole blocks.
fn compress(h: &mut [u32; 8], blocks: &[u8]) {
    debug_assert_eq!(blocks.len() % BLOCK, 0);
    if blocks.is_empty() {
        return;
    }
    // SAFETY: `GenericArray<u8, U64>` is `repr(transparent)` over `[u8; 64]` (alignment 1), and
    // `blocks` holds exactly `len / 64` of them.
    let blocks: &[GenericArray<u8, U64>] =
        unsafe { std::slice::from_raw_parts(blocks.as_ptr().cast(), blocks.len() / BLOCK) };
    sha2::compress256(h, blocks);
}

/// Both chaining values over the same whole blocks.
fn compress_both(a: &mut [u32; 8], b: &mut [u32; 8], blocks: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if shani::available() {
        // SAFETY: the CPU has the instructions `shani::compress_both` is compiled for.
        unsafe { shani::compress_both(a, b, blocks) };
        return;
    }
    compress(a, blocks);
    compress(b, blocks);
}

/// The two-state rounds with the x86 SHA extensions (SHA256RNDS2, SHA256MSG1/2): one message
/// schedule per block, and each pair of rounds issued for both states back to back, so that one
/// state's rounds run while the other's wait on their latency.
#[cfg(target_arch = "x86_64")]
mod shani {
    use std::arch::x86_64::*;

    /// FIPS 180-4 §4.2.2: the round constants.
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];

    pub fn available() -> bool {
        std::is_x86_feature_detected!("sha")
            && std::is_x86_feature_detected!("sse2")
            && std::is_x86_feature_detected!("ssse3")
            && std::is_x86_feature_detected!("sse4.1")
    }

    /// The chaining value `h` (a..h) as the instructions hold it: (ABEF, CDGH), A in the top lane.
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    unsafe fn load(h: &[u32; 8]) -> (__m128i, __m128i) {
        let p = h.as_ptr().cast::<__m128i>();
        // SAFETY: `h` is 32 readable bytes; unaligned loads.
        let (dcba, hgfe) = unsafe { (_mm_loadu_si128(p), _mm_loadu_si128(p.add(1))) };
        let cdab = _mm_shuffle_epi32(dcba, 0xB1);
        let efgh = _mm_shuffle_epi32(hgfe, 0x1B);
        (
            _mm_alignr_epi8(cdab, efgh, 8),
            _mm_blend_epi16(efgh, cdab, 0xF0),
        )
    }

    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    unsafe fn store(h: &mut [u32; 8], abef: __m128i, cdgh: __m128i) {
        let feba = _mm_shuffle_epi32(abef, 0x1B);
        let dchg = _mm_shuffle_epi32(cdgh, 0xB1);
        let p = h.as_mut_ptr().cast::<__m128i>();
        // SAFETY: `h` is 32 writable bytes; unaligned stores.
        unsafe {
            _mm_storeu_si128(p, _mm_blend_epi16(feba, dchg, 0xF0));
            _mm_storeu_si128(p.add(1), _mm_alignr_epi8(dchg, feba, 8));
        }
    }

    /// # Safety
    /// The CPU must have SHA, SSE2, SSSE3 and SSE4.1 ([`available`]).
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    pub unsafe fn compress_both(a: &mut [u32; 8], b: &mut [u32; 8], blocks: &[u8]) {
        // Each 32-bit word of the message is big-endian.
        let swap = _mm_set_epi64x(0x0c0d_0e0f_0809_0a0b, 0x0405_0607_0001_0203);
        // SAFETY: the caller's CPU has the features of this function.
        let ((mut a_abef, mut a_cdgh), (mut b_abef, mut b_cdgh)) = unsafe { (load(a), load(b)) };
        let k = K.as_ptr().cast::<__m128i>();
        for block in blocks.chunks_exact(64) {
            let (a0, a1, b0, b1) = (a_abef, a_cdgh, b_abef, b_cdgh);
            let p = block.as_ptr().cast::<__m128i>();
            // SAFETY: a block is 64 readable bytes, K 256; unaligned loads.
            let word = |i: usize| unsafe { _mm_shuffle_epi8(_mm_loadu_si128(p.add(i)), swap) };
            let (mut w0, mut w1, mut w2, mut w3) = (word(0), word(1), word(2), word(3));
            // Four rounds of both states with message words `w` (rounds 4i..4i+3).
            macro_rules! rounds {
                ($w:expr, $i:expr) => {{
                    // SAFETY: $i < 16, within K.
                    let wk = _mm_add_epi32($w, unsafe { _mm_loadu_si128(k.add($i)) });
                    let wk_high = _mm_shuffle_epi32(wk, 0x0E);
                    a_cdgh = _mm_sha256rnds2_epu32(a_cdgh, a_abef, wk);
                    b_cdgh = _mm_sha256rnds2_epu32(b_cdgh, b_abef, wk);
                    a_abef = _mm_sha256rnds2_epu32(a_abef, a_cdgh, wk_high);
                    b_abef = _mm_sha256rnds2_epu32(b_abef, b_cdgh, wk_high);
                }};
            }
            // The next four message words into `$w0` (which held the words 16 before them),
            // from the 16 before: σ0 and the word 16 back by MSG1, the word 7 back by ALIGNR, σ1 by MSG2.
            macro_rules! schedule {
                ($w0:ident, $w1:ident, $w2:ident, $w3:ident) => {{
                    let t =
                        _mm_add_epi32(_mm_sha256msg1_epu32($w0, $w1), _mm_alignr_epi8($w3, $w2, 4));
                    $w0 = _mm_sha256msg2_epu32(t, $w3);
                }};
            }
            rounds!(w0, 0);
            rounds!(w1, 1);
            rounds!(w2, 2);
            rounds!(w3, 3);
            for i in (4..16).step_by(4) {
                schedule!(w0, w1, w2, w3);
                rounds!(w0, i);
                schedule!(w1, w2, w3, w0);
                rounds!(w1, i + 1);
                schedule!(w2, w3, w0, w1);
                rounds!(w2, i + 2);
                schedule!(w3, w0, w1, w2);
                rounds!(w3, i + 3);
            }
            a_abef = _mm_add_epi32(a_abef, a0);
            a_cdgh = _mm_add_epi32(a_cdgh, a1);
            b_abef = _mm_add_epi32(b_abef, b0);
            b_cdgh = _mm_add_epi32(b_cdgh, b1);
        }
        // SAFETY: as for `load`.
        unsafe {
            store(a, a_abef, a_cdgh);
            store(b, b_abef, b_cdgh);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sha2::{Digest, Sha256};

    fn reference(data: &[u8]) -> Sha256Digest {
        Sha256Digest::from_bytes(Sha256::digest(data).into())
    }

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn padding_at_every_length_around_a_block() {
        // 55 and 56 are where the length stops fitting in the last block.
        for n in (0..=3 * BLOCK + 1).chain([1000, 4096, 65_537]) {
            let data = bytes(n, 7);
            let mut state = State::new();
            state.update(&data);
            assert_eq!(state.finish(), reference(&data), "length {n}");
        }
    }

    #[test]
    fn the_rounds_of_both_states_match_one_state_on_many_blocks() {
        // From the initial value and from one that is not: each state keeps its own.
        let data = bytes(64 * 1000 + 13, 3);
        let mut whole = State::new();
        whole.update(&bytes(64 * 5, 9));
        let mut chunk = State::new();
        whole.update_both(&mut chunk, &data);
        assert_eq!(chunk.finish(), reference(&data));
        let mut both = bytes(64 * 5, 9);
        both.extend_from_slice(&data);
        assert_eq!(whole.finish(), reference(&both));
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_sha_extension_rounds_are_taken_where_the_cpu_has_them() {
        // Says which path the other tests checked on this machine.
        if !shani::available() {
            eprintln!("this CPU has no SHA extensions: the two-state rounds are two passes here");
            return;
        }
        let data = bytes(64 * 3, 1);
        let (mut a, mut b) = (INITIAL, INITIAL);
        // SAFETY: available() said yes.
        unsafe { shani::compress_both(&mut a, &mut b, &data) };
        let mut expected = INITIAL;
        compress(&mut expected, &data);
        assert_eq!((a, b), (expected, expected));
    }

    proptest! {
        /// A chunk split anywhere, fed piece by piece alone or with the artifact's state, at any
        /// offset within a block: both digests are `sha2`'s.
        #[test]
        fn any_pieces_give_sha2s_digests(
            prefix in 0usize..200,
            data in proptest::collection::vec(any::<u8>(), 0..2000),
            cuts in proptest::collection::vec(0usize..2000, 0..6),
            both in proptest::collection::vec(any::<bool>(), 6),
        ) {
            let head = bytes(prefix, 5);
            let mut whole = State::new();
            whole.update(&head);
            let mut chunk = State::new();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.push(data.len());
            cuts.sort_unstable();
            let mut at = 0;
            for (i, cut) in cuts.into_iter().enumerate() {
                let piece = &data[at..cut];
                if both[i % both.len()] {
                    whole.update_both(&mut chunk, piece);
                } else {
                    whole.update(piece);
                    chunk.update(piece);
                }
                at = cut;
            }
            prop_assert_eq!(chunk.finish(), reference(&data));
            let mut all = head;
            all.extend_from_slice(&data);
            prop_assert_eq!(whole.finish(), reference(&all));
        }
    }
}
