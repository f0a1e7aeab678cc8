//! The out-of-band (OOB) pickle container every v25 driving artifact must be, checked without
//! reading the weights.
//!
//! The format (`docs/formats.md`, "Artifact payload"): an 8-byte little-endian signed length
//! `L`, then `L` bytes of a pickle protocol-5 opcode stream, then zero or more records of an
//! 8-byte little-endian signed length `n` followed by `n` raw buffer bytes, until the end of the
//! file. The device's loader decides "OOB" from the first 10 bytes: `2 <= L <= 1 GiB`, byte 8 is
//! the pickle `PROTO` opcode `0x80` and byte 9 is a protocol the loader knows (at most 5).
//!
//! [`check_oob_at`] reads the 10-byte head, the last opcode byte (a pickle ends with `STOP`,
//! `.`) and each record's 8-byte length, seeking over the buffers, and requires the records to
//! tile the file exactly: no record may run past the end and nothing may follow the last one. Its
//! cost grows with the number of buffers, not with their size. A plain pickle, a truncated
//! buffer or trailing bytes are refused with the offset where the container stops making sense.

use std::io::{self, Read, Seek, SeekFrom};

/// Largest opcode stream the device's loader treats as OOB (1 GiB).
pub const MAX_OPCODE_LEN: u64 = 1 << 30;
/// Highest pickle protocol the device's loader knows.
pub const MAX_PICKLE_PROTOCOL: u8 = 5;
/// Pickle `PROTO` opcode.
const PROTO: u8 = 0x80;
/// Pickle `STOP` opcode: the last byte of every pickle.
const STOP: u8 = b'.';
/// More buffer records than any compiled model has; past this the file is not a model (a run of
/// zero bytes parses as endless empty records).
pub const MAX_BUFFERS: u64 = 1 << 20;

/// The shape of a well-formed OOB container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct OobLayout {
    /// Total size in bytes.
    pub size: u64,
    /// Length of the pickle opcode stream.
    pub opcode_len: u64,
    /// Pickle protocol (byte 9).
    pub protocol: u8,
    /// Number of out-of-band buffer records.
    pub buffers: u64,
    /// Sum of the buffer lengths (the weights).
    pub buffer_bytes: u64,
}

/// Why a file is not an OOB container, at which byte offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OobDefect {
    /// Shorter than the 10-byte head.
    #[error("only {size} bytes; an OOB container has a 10-byte head")]
    TooShort {
        /// The file's size in bytes.
        size: u64,
    },
    /// `L` is outside `2..=1 GiB` (a plain pickle starts with `0x80 0x05` and fails here).
    #[error("opcode length {value} is not in 2..={MAX_OPCODE_LEN}")]
    OpcodeLength {
        /// The length `L` read from bytes 0..8.
        value: i64,
    },
    /// Byte 8 is not the pickle `PROTO` opcode.
    #[error(
        "byte 8 is 0x{found:02x}, not the pickle PROTO opcode 0x80 (a plain pickle, not an OOB container?)"
    )]
    NoProtoOpcode {
        /// The byte found at offset 8.
        found: u8,
    },
    /// Byte 9 is a protocol the loader does not know.
    #[error("pickle protocol {found} is above {MAX_PICKLE_PROTOCOL}, which devices cannot load")]
    Protocol {
        /// The protocol byte found at offset 9.
        found: u8,
    },
    /// The opcode stream runs past the end of the file.
    #[error("the opcode stream would end at byte {end}, past the end")]
    OpcodesTruncated {
        /// The byte offset the opcode stream would end at.
        end: u64,
    },
    /// The opcode stream does not end with `STOP`.
    #[error("the opcode stream ends with 0x{found:02x}, not the pickle STOP opcode '.'")]
    NoStopOpcode {
        /// The last byte of the opcode stream.
        found: u8,
    },
    /// Fewer than 8 bytes left for a record's length.
    #[error("{left} trailing byte(s), too few for a buffer record's 8-byte length")]
    RecordHeaderTruncated {
        /// Bytes left after the previous record.
        left: u64,
    },
    /// A negative record length.
    #[error("buffer record length {value} is negative")]
    NegativeRecord {
        /// The length read.
        value: i64,
    },
    /// A record runs past the end of the file.
    #[error("a {len}-byte buffer record with only {left} byte(s) left (truncated)")]
    RecordTruncated {
        /// The record's declared length in bytes.
        len: u64,
        /// The bytes left in the file after its 8-byte length.
        left: u64,
    },
    /// More than [`MAX_BUFFERS`] records.
    #[error("more than {MAX_BUFFERS} buffer records")]
    TooManyBuffers,
}

/// A defect and where: the offset of the field that is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OobError {
    /// Byte offset of the field that is wrong.
    pub offset: u64,
    /// What is wrong there.
    pub defect: OobDefect,
}

/// An OOB check failure: a defect, or the reader failing.
#[derive(Debug)]
pub enum OobCheckError {
    /// The file is not an OOB container.
    Defect(OobError),
    /// Reading failed.
    Io(io::Error),
}

impl From<io::Error> for OobCheckError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

fn defect(offset: u64, defect: OobDefect) -> OobCheckError {
    OobCheckError::Defect(OobError { offset, defect })
}

/// Check that `size` bytes read through `read_at(offset, buf)` (which must fill `buf` from
/// `offset`) are an OOB container whose records tile them exactly. Reads 11 bytes plus 8 per
/// buffer record.
pub fn check_oob_at(
    size: u64,
    mut read_at: impl FnMut(u64, &mut [u8]) -> io::Result<()>,
) -> Result<OobLayout, OobCheckError> {
    if size < 10 {
        return Err(defect(0, OobDefect::TooShort { size }));
    }
    let mut head = [0u8; 10];
    read_at(0, &mut head)?;
    let value = i64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    if !(2..=MAX_OPCODE_LEN as i64).contains(&value) {
        return Err(defect(0, OobDefect::OpcodeLength { value }));
    }
    if head[8] != PROTO {
        return Err(defect(8, OobDefect::NoProtoOpcode { found: head[8] }));
    }
    if head[9] > MAX_PICKLE_PROTOCOL {
        return Err(defect(9, OobDefect::Protocol { found: head[9] }));
    }
    let opcode_len = value as u64;
    let end = 8 + opcode_len;
    if end > size {
        return Err(defect(0, OobDefect::OpcodesTruncated { end }));
    }
    let mut last = [0u8; 1];
    read_at(end - 1, &mut last)?;
    if last[0] != STOP {
        return Err(defect(end - 1, OobDefect::NoStopOpcode { found: last[0] }));
    }
    let mut pos = end;
    let mut buffers = 0u64;
    let mut buffer_bytes = 0u64;
    while pos < size {
        let left = size - pos;
        if left < 8 {
            return Err(defect(pos, OobDefect::RecordHeaderTruncated { left }));
        }
        if buffers == MAX_BUFFERS {
            return Err(defect(pos, OobDefect::TooManyBuffers));
        }
        let mut len = [0u8; 8];
        read_at(pos, &mut len)?;
        let value = i64::from_le_bytes(len);
        if value < 0 {
            return Err(defect(pos, OobDefect::NegativeRecord { value }));
        }
        let len = value as u64;
        if len > left - 8 {
            return Err(defect(
                pos,
                OobDefect::RecordTruncated {
                    len,
                    left: left - 8,
                },
            ));
        }
        pos += 8 + len;
        buffers += 1;
        buffer_bytes += len;
    }
    Ok(OobLayout {
        size,
        opcode_len,
        protocol: head[9],
        buffers,
        buffer_bytes,
    })
}

/// [`check_oob_at`] over a `Read + Seek` of `size` bytes (an [`crate::ArtifactReader`] over a
/// chunk set, a file): seeks over every buffer.
pub fn check_oob<R: Read + Seek>(reader: &mut R, size: u64) -> Result<OobLayout, OobCheckError> {
    check_oob_at(size, |offset, buf| {
        reader.seek(SeekFrom::Start(offset))?;
        reader.read_exact(buf)
    })
}

/// Write the head of an OOB container (`L` and nothing else) and a record length: what a
/// writer needs, and what tests build fixtures with.
pub fn length_prefix(len: u64) -> [u8; 8] {
    (len as i64).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn container(opcodes: &[u8], buffers: &[&[u8]]) -> Vec<u8> {
        let mut v = length_prefix(opcodes.len() as u64).to_vec();
        v.extend_from_slice(opcodes);
        for b in buffers {
            v.extend_from_slice(&length_prefix(b.len() as u64));
            v.extend_from_slice(b);
        }
        v
    }

    fn check(bytes: &[u8]) -> Result<OobLayout, OobError> {
        check_oob(&mut Cursor::new(bytes), bytes.len() as u64).map_err(|e| match e {
            OobCheckError::Defect(d) => d,
            OobCheckError::Io(e) => panic!("io: {e}"),
        })
    }

    const PICKLE: &[u8] = &[0x80, 0x05, b'N', b'.'];

    #[test]
    fn well_formed_containers_pass() {
        let l = check(&container(PICKLE, &[])).unwrap();
        assert_eq!((l.opcode_len, l.buffers, l.buffer_bytes), (4, 0, 0));
        let l = check(&container(PICKLE, &[b"abc", b"", &[7u8; 100]])).unwrap();
        assert_eq!((l.protocol, l.buffers, l.buffer_bytes), (5, 3, 103));
        assert_eq!(l.size, 12 + 8 * 3 + 103);
    }

    #[test]
    fn defects_table() {
        let good = container(PICKLE, &[b"abcd"]);
        let mut plain_pickle = vec![0x80, 0x05];
        plain_pickle.extend_from_slice(&[0x95, 1, 0, 0, 0, 0, 0, 0, b'N', b'.']);
        let mut trailing = good.clone();
        trailing.extend_from_slice(&[1, 2, 3]);
        let mut truncated = good.clone();
        truncated.pop();
        let mut negative = container(PICKLE, &[]);
        negative.extend_from_slice(&(-1i64).to_le_bytes());
        let mut bad_proto = good.clone();
        bad_proto[8] = 0x81;
        let mut high_protocol = good.clone();
        high_protocol[9] = 6;
        let no_stop = container(&[0x80, 0x05, b'N', b'N'], &[]);
        let short_opcodes = {
            let mut v = length_prefix(100).to_vec();
            v.extend_from_slice(&[0x80, 0x05, b'.']);
            v
        };
        let cases: Vec<(&str, Vec<u8>, u64, OobDefect)> = vec![
            ("empty", vec![], 0, OobDefect::TooShort { size: 0 }),
            // A protocol-5 plain pickle: PROTO 5, FRAME <8-byte length>; byte 8 is inside the
            // frame length, as the device's loader sees it too.
            (
                "plain pickle",
                plain_pickle,
                8,
                OobDefect::NoProtoOpcode { found: 0 },
            ),
            (
                "length over 1 GiB",
                {
                    let mut v = length_prefix(MAX_OPCODE_LEN + 1).to_vec();
                    v.extend_from_slice(&[0x80, 0x05, b'.']);
                    v
                },
                0,
                OobDefect::OpcodeLength {
                    value: MAX_OPCODE_LEN as i64 + 1,
                },
            ),
            (
                "length 1",
                container(&[0x80], &[b"x"]),
                0,
                OobDefect::OpcodeLength { value: 1 },
            ),
            (
                "not PROTO",
                bad_proto,
                8,
                OobDefect::NoProtoOpcode { found: 0x81 },
            ),
            (
                "protocol 6",
                high_protocol,
                9,
                OobDefect::Protocol { found: 6 },
            ),
            (
                "opcodes past end",
                short_opcodes,
                0,
                OobDefect::OpcodesTruncated { end: 108 },
            ),
            (
                "no STOP",
                no_stop,
                11,
                OobDefect::NoStopOpcode { found: b'N' },
            ),
            (
                "trailing bytes",
                trailing,
                24,
                OobDefect::RecordHeaderTruncated { left: 3 },
            ),
            (
                "truncated buffer",
                truncated,
                12,
                OobDefect::RecordTruncated { len: 4, left: 3 },
            ),
            (
                "negative length",
                negative,
                12,
                OobDefect::NegativeRecord { value: -1 },
            ),
        ];
        for (name, bytes, offset, want) in cases {
            let got = check(&bytes).expect_err(name);
            assert_eq!(
                got,
                OobError {
                    offset,
                    defect: want
                },
                "{name}"
            );
        }
    }

    #[test]
    fn endless_empty_records_are_refused() {
        let mut v = container(PICKLE, &[]);
        v.resize(v.len() + 8 * (MAX_BUFFERS as usize + 1), 0);
        let e = check(&v).unwrap_err();
        assert_eq!(e.defect, OobDefect::TooManyBuffers);
    }

    #[test]
    fn only_headers_are_read() {
        let big = vec![0xAAu8; 1 << 20];
        let bytes = container(PICKLE, &[&big, &big, &big]);
        let mut read = 0usize;
        let l = check_oob_at(bytes.len() as u64, |off, buf| {
            read += buf.len();
            buf.copy_from_slice(&bytes[off as usize..off as usize + buf.len()]);
            Ok(())
        })
        .unwrap();
        assert_eq!(l.buffers, 3);
        assert_eq!(read, 10 + 1 + 3 * 8);
    }
}
