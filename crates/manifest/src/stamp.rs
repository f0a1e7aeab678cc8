//! The stamp a v26-contract artifact carries inside itself (docs/formats.md, "The artifact's
//! stamp"), read without tinygrad and without running anything.
//!
//! A compiled driving model is a pickle whose top-level object is a dict. A contract with a
//! [`StampRule`] names keys of that dict (`artifact_abi`, `compiler_revision`,
//! `format_version`, `behavior_version`, …) whose values are plain strings and ints: the runtime
//! refuses the artifact before it runs when they are not its own. [`read_stamp`] reads the
//! pickle's opcodes as a stack machine that builds no object: strings, ints, bools and `None`
//! are kept (short strings only), every other value is a marker of its kind, dicts record their
//! string-keyed items, and nothing is ever imported, called or looked up. At `STOP` the
//! top-level object must be a dict; its plain items are the [`Stamp`].
//!
//! The container around the pickle is reported as a [`Framing`]:
//! - [`Framing::Plain`]: the file is the pickle itself (`PROTO` first, nothing after `STOP`);
//! - [`Framing::OobRecords`]: an 8-byte little-endian length `L`, `L` bytes of opcodes, then
//!   length-prefixed buffer records (the container `chunker::oob` checks); its opcodes refer to
//!   out-of-band buffers (`NEXT_BUFFER`);
//! - [`Framing::LengthArena`]: the same 8-byte length and opcodes, then one unframed arena the
//!   opcodes address through persistent ids (`BINPERSID`).
//!
//! Which of the last two a length-prefixed file is, is told by what its opcodes refer to; a file
//! that is neither framing, or whose opcodes refer to both kinds (or to neither, with bytes
//! following), is an error that says so.
//!
//! Hostile input is bounded ([`StampLimits`]): bytes read, values on the stack, open marks, memo
//! entries, dict items recorded, the length of any one string, bytes or line. Every declared
//! length is checked against what is left before anything is read or allocated, and kept
//! strings are at most [`StampLimits::keep_string`] bytes, so memory stays bounded whatever the
//! input declares; time is linear in the bytes read.
//!
//! [`check_stamp`] is the decision: the stamp against the contract's [`StampRule`], the pinned
//! compiler revision and the entry's behaviour version.
//!
//! [`StampRule`]: crate::contract::StampRule

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read};
use std::rc::Rc;

use crate::contract::Contract;
use crate::types::{BehaviorVersion, GitCommit};

/// Caps on what [`read_stamp`] reads and keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StampLimits {
    /// Bytes read in all (framing head, opcodes, the peek after them).
    pub max_bytes: u64,
    /// Values on the stack at once (nesting depth, items of one batch).
    pub max_stack: usize,
    /// Marks open at once.
    pub max_marks: usize,
    /// Memo entries.
    pub max_memo: usize,
    /// Dict items recorded, over all dicts.
    pub max_items: usize,
    /// The longest string or bytes value accepted (it is skipped, not kept, above
    /// [`StampLimits::keep_string`]).
    pub max_string: u64,
    /// The longest text line (protocol-0 opcodes such as `GLOBAL`, `INT`).
    pub max_line: usize,
    /// Strings up to this length are kept as values; longer ones are a marker.
    pub keep_string: usize,
}

impl Default for StampLimits {
    fn default() -> Self {
        Self {
            max_bytes: 64 << 20,
            max_stack: 1 << 16,
            max_marks: 1 << 10,
            max_memo: 1 << 20,
            max_items: 1 << 20,
            max_string: 16 << 20,
            max_line: 1 << 16,
            keep_string: 4096,
        }
    }
}

/// The container found around the pickle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "framing", rename_all = "snake_case")]
pub enum Framing {
    /// The file is the pickle.
    Plain,
    /// Length-prefixed opcodes, then out-of-band buffer records.
    OobRecords {
        /// Bytes of the opcode stream.
        opcode_len: u64,
        /// Out-of-band buffer references in the opcodes.
        buffers: u64,
    },
    /// Length-prefixed opcodes, then one unframed arena addressed by persistent ids.
    LengthArena {
        /// Bytes of the opcode stream.
        opcode_len: u64,
        /// Persistent-id references into the arena.
        persistent_ids: u64,
    },
}

impl fmt::Display for Framing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head = "length-prefixed pickle";
        match self {
            Self::Plain => f.write_str("plain pickle"),
            Self::OobRecords {
                opcode_len: n,
                buffers: b,
            } => write!(
                f,
                "{head} ({n} opcode bytes) with out-of-band buffer records ({b} buffer reference(s))"
            ),
            Self::LengthArena {
                opcode_len: n,
                persistent_ids: p,
            } => write!(
                f,
                "{head} ({n} opcode bytes) with one arena ({p} persistent id(s))"
            ),
        }
    }
}
/// A value of the top-level dict, as far as the stamp reader keeps it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum StampValue {
    /// A string, up to [`StampLimits::keep_string`] bytes.
    Str(String),
    /// An integer that fits 64 bits.
    Int(i64),
    /// `True` or `False`.
    Bool(bool),
    /// Python's `None`.
    None,
    /// Anything else, by kind (`"dict"`, `"list"`, `"float"`, `"object"`, `"long string"`, …):
    /// skipped, never built.
    Other(&'static str),
}

impl fmt::Display for StampValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Str(s) => write!(f, "{:?}", crate::error::abbreviate(s)),
            Self::Int(i) => write!(f, "{i}"),
            Self::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            Self::None => f.write_str("None"),
            Self::Other(kind) => write!(f, "<{kind}>"),
        }
    }
}

/// What [`read_stamp`] found: the framing and the top-level dict's string-keyed items.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Stamp {
    /// The container around the pickle.
    #[serde(flatten)]
    pub framing: Framing,
    /// The pickle protocol (`PROTO`).
    pub protocol: u8,
    /// The top-level dict's items with string keys, in insertion order (a key set twice keeps
    /// its last value, where it was first set).
    pub entries: Vec<(String, StampValue)>,
    /// Items of the top-level dict whose key is not a string (the runners keyed by camera size).
    pub other_keys: usize,
}

impl Stamp {
    /// The value of `key` in the top-level dict.
    pub fn get(&self, key: &str) -> Option<&StampValue> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The value of `key` when it is a string.
    pub fn str(&self, key: &str) -> Option<&str> {
        match self.get(key) {
            Some(StampValue::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// The value of `key` when it is an integer.
    pub fn int(&self, key: &str) -> Option<i64> {
        match self.get(key) {
            Some(StampValue::Int(i)) => Some(*i),
            _ => None,
        }
    }
}

/// Why the stamp could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StampDefect {
    /// Neither a pickle nor a length-prefixed pickle: the first bytes, in hex.
    #[error(
        "unknown framing: the file starts {head}, which is neither a pickle (PROTO 0x80 first) nor an 8-byte length followed by one"
    )]
    UnknownFraming {
        /// The first bytes, in hex.
        head: String,
    },
    /// A length prefix declares more opcode bytes than the cap allows.
    #[error("the length prefix declares {declared} opcode bytes, more than the cap of {cap}")]
    HugeOpcodeLength {
        /// Opcode bytes the prefix declares.
        declared: u64,
        /// The cap: [`StampLimits::max_bytes`] less the 8-byte prefix.
        cap: u64,
    },
    /// A length-prefixed pickle whose opcodes refer to both buffers and persistent ids, or to
    /// neither while bytes follow: which framing it is cannot be told.
    #[error(
        "unknown framing: a length-prefixed pickle with {buffers} buffer reference(s) and {persistent_ids} persistent id(s) is neither the out-of-band records framing nor the arena framing"
    )]
    UndecidableFraming {
        /// Buffer references found.
        buffers: u64,
        /// Persistent-id references found.
        persistent_ids: u64,
    },
    /// A plain pickle that refers to data outside itself.
    #[error("a plain pickle that refers to {what} outside itself cannot be loaded")]
    PlainWithOutside {
        /// What it refers to (an out-of-band buffer, a persistent id).
        what: &'static str,
    },
    /// A protocol outside 2..=5.
    #[error("pickle protocol {found} is not one of 2..=5")]
    Protocol {
        /// The protocol byte.
        found: u8,
    },
    /// An opcode this reader does not know.
    #[error("unknown pickle opcode 0x{opcode:02x}")]
    UnknownOpcode {
        /// The opcode byte.
        opcode: u8,
    },
    /// The input ends inside the pickle.
    #[error("the input ends inside the pickle (truncated)")]
    Truncated,
    /// More than `cap` bytes would be read.
    #[error("more than {cap} bytes without reaching the end of the pickle")]
    BytesCap {
        /// The cap, [`StampLimits::max_bytes`].
        cap: u64,
    },
    /// A string, bytes value or frame declares more bytes than the cap allows or than are left.
    #[error("a value declares {declared} bytes, more than the {cap} allowed here")]
    HugeLength {
        /// Bytes declared.
        declared: u64,
        /// The cap, or the bytes left when that is fewer.
        cap: u64,
    },
    /// A text line longer than [`StampLimits::max_line`].
    #[error("a text operand longer than {cap} bytes")]
    LineTooLong {
        /// The cap, in bytes.
        cap: usize,
    },
    /// More values on the stack than [`StampLimits::max_stack`].
    #[error("more than {cap} values on the stack (nesting too deep)")]
    StackCap {
        /// The cap.
        cap: usize,
    },
    /// More marks open than [`StampLimits::max_marks`].
    #[error("more than {cap} marks open (nesting too deep)")]
    MarkCap {
        /// The cap.
        cap: usize,
    },
    /// More memo entries than [`StampLimits::max_memo`].
    #[error("more than {cap} memo entries")]
    MemoCap {
        /// The cap.
        cap: usize,
    },
    /// More dict items than [`StampLimits::max_items`].
    #[error("more than {cap} dict items")]
    ItemsCap {
        /// The cap.
        cap: usize,
    },
    /// An opcode needs more values than the stack holds above the last mark.
    #[error("opcode 0x{opcode:02x} needs more values than the stack holds")]
    StackUnderflow {
        /// The opcode byte.
        opcode: u8,
    },
    /// An opcode needs a mark and none is open.
    #[error("opcode 0x{opcode:02x} needs a mark and none is open")]
    NoMark {
        /// The opcode byte.
        opcode: u8,
    },
    /// `GET` of an index never `PUT`.
    #[error("memo index {index} was never stored")]
    MissingMemo {
        /// The memo index.
        index: u64,
    },
    /// A malformed operand (a text int that is not one, an odd number of dict items, …).
    #[error("opcode 0x{opcode:02x}: {why}")]
    BadOperand {
        /// The opcode byte.
        opcode: u8,
        /// What is wrong with it.
        why: String,
    },
    /// The top-level object is not a dict.
    #[error("the top-level object is a {found}, not a dict: no stamp")]
    NotADict {
        /// The kind of object found (`list`, `int`, ...).
        found: &'static str,
    },
    /// `STOP` with more or fewer than one value, or with a mark open.
    #[error("STOP with {values} value(s) and {marks} mark(s) open, not one value")]
    BadStop {
        /// Values on the stack at `STOP`.
        values: usize,
        /// Marks open at `STOP`.
        marks: usize,
    },
    /// The length prefix and the pickle disagree on where the opcodes end.
    #[error(
        "the pickle stops at byte {stop_at} but the length prefix says its opcodes end at byte {declared_end}"
    )]
    StopPosition {
        /// Where `STOP` is, as a byte offset.
        stop_at: u64,
        /// Where the length prefix says the opcodes end.
        declared_end: u64,
    },
    /// Bytes follow a plain pickle's `STOP`.
    #[error("bytes follow the plain pickle's STOP")]
    TrailingData,
    /// The length-prefixed framing's tail is not what its opcodes need.
    #[error("{why}")]
    BadTail {
        /// What is wrong.
        why: String,
    },
    /// Reading the input failed.
    #[error("read failed: {message}")]
    Io {
        /// The I/O error's message.
        message: String,
    },
}

/// A defect and the byte offset where it was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at byte {offset}: {defect}")]
pub struct StampError {
    /// Byte offset where the defect was found.
    pub offset: u64,
    /// What is wrong there.
    pub defect: StampDefect,
}

type R<T> = Result<T, StampError>;

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
/// The sanity bound on a length prefix: beyond it the first 8 bytes are not a length.
const MAX_PREFIX: u64 = chunker::oob::MAX_OPCODE_LEN;

/// A value on the machine's stack.
#[derive(Debug, Clone)]
enum V {
    Str(Rc<str>),
    Int(i64),
    Bool(bool),
    None,
    Dict(usize),
    Kind(&'static str),
}

impl V {
    fn public(&self) -> StampValue {
        match self {
            V::Str(s) => StampValue::Str(s.to_string()),
            V::Int(i) => StampValue::Int(*i),
            V::Bool(b) => StampValue::Bool(*b),
            V::None => StampValue::None,
            V::Dict(_) => StampValue::Other("dict"),
            V::Kind(k) => StampValue::Other(k),
        }
    }

    fn kind(&self) -> &'static str {
        match self.public() {
            StampValue::Str(_) => "str",
            StampValue::Int(_) => "int",
            StampValue::Bool(_) => "bool",
            StampValue::None => "None",
            StampValue::Other(k) => k,
        }
    }
}

/// How an opcode of [`KIND_OPS`] reads its operand: not at all, fixed bytes, or text lines.
#[derive(Clone, Copy)]
enum Operand {
    No,
    Bytes(usize),
    Lines(u8),
}

/// The opcodes whose values are never built (objects are never imported or called), only kept
/// in their place on the stack: the operand each skips, the values it pops, whether it pops
/// to the last mark, and the kind of value it pushes (`None`: it changes the value below in
/// place, which must be there).
const KIND_OPS: [(u8, Operand, u8, bool, Option<&str>); 29] = [
    (b']', Operand::No, 0, false, Some("list")),
    (b')', Operand::No, 0, false, Some("tuple")),
    (0x8f, Operand::No, 0, false, Some("set")),
    (b'l', Operand::No, 0, true, Some("list")),
    (b't', Operand::No, 0, true, Some("tuple")),
    (0x91, Operand::No, 0, true, Some("frozenset")),
    (0x85, Operand::No, 1, false, Some("tuple")),
    (0x86, Operand::No, 2, false, Some("tuple")),
    (0x87, Operand::No, 3, false, Some("tuple")),
    (b'G', Operand::Bytes(8), 0, false, Some("float")),
    (b'F', Operand::Lines(1), 0, false, Some("float")),
    (b'c', Operand::Lines(2), 0, false, Some("global")),
    (0x93, Operand::No, 2, false, Some("global")),
    (b'i', Operand::Lines(2), 0, true, Some("object")),
    (b'o', Operand::No, 0, true, Some("object")),
    (b'R', Operand::No, 2, false, Some("object")),
    (0x81, Operand::No, 2, false, Some("object")),
    (0x92, Operand::No, 3, false, Some("object")),
    (0x82, Operand::Bytes(1), 0, false, Some("object")),
    (0x83, Operand::Bytes(2), 0, false, Some("object")),
    (0x84, Operand::Bytes(4), 0, false, Some("object")),
    (b'P', Operand::Lines(1), 0, false, Some("persistent id")),
    (b'Q', Operand::No, 1, false, Some("persistent id")),
    (0x97, Operand::No, 0, false, Some("buffer")),
    // Appends, BUILD and READONLY_BUFFER.
    (b'a', Operand::No, 1, false, None),
    (b'e', Operand::No, 0, true, None),
    (0x90, Operand::No, 0, true, None),
    (b'b', Operand::No, 1, false, None),
    (0x98, Operand::No, 0, false, None),
];

/// A dict's string-keyed items, and how many items with other keys it got.
type DictItems = (Vec<(Rc<str>, V)>, usize);

/// The bytes under the caps and the stack machine that runs over them.
struct Reader<'l, In> {
    input: In,
    pos: u64,
    /// The end of the opcode region, when a length prefix declares it.
    region_end: Option<u64>,
    limits: &'l StampLimits,
    stack: Vec<V>,
    marks: Vec<usize>,
    memo: HashMap<u64, V>,
    dicts: Vec<DictItems>,
    items: usize,
    buffers: u64,
    persistent_ids: u64,
}

impl<In: Read> Reader<'_, In> {
    fn err(&self, defect: StampDefect) -> StampError {
        let offset = self.pos;
        StampError { offset, defect }
    }

    fn bad(&self, opcode: u8, why: impl Into<String>) -> StampError {
        let why = why.into();
        self.err(StampDefect::BadOperand { opcode, why })
    }

    /// How many more bytes may be read here.
    fn left(&self) -> u64 {
        let budget = self.limits.max_bytes.saturating_sub(self.pos);
        self.region_end
            .map_or(budget, |end| budget.min(end.saturating_sub(self.pos)))
    }

    /// Read into `buf` until it is full or the input ends, past any cap; returns how many
    /// bytes came (counted in `pos` when `advance`).
    fn read_up_to(&mut self, buf: &mut [u8], advance: bool) -> R<usize> {
        let (mut done, mut failed) = (0, None);
        while done < buf.len() && failed.is_none() {
            match self.input.read(&mut buf[done..]) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => failed = Some(e.to_string()),
            }
        }
        if advance {
            self.pos += done as u64;
        }
        match failed {
            Some(message) => Err(self.err(StampDefect::Io { message })),
            None => Ok(done),
        }
    }

    /// Fill `buf` exactly, within the caps.
    fn fill(&mut self, buf: &mut [u8]) -> R<()> {
        if buf.len() as u64 > self.left() {
            return Err(self.err(match self.region_end {
                // The pickle runs on past the end its length prefix declares.
                Some(end) => StampDefect::StopPosition {
                    stop_at: self.pos + buf.len() as u64,
                    declared_end: end,
                },
                None => StampDefect::BytesCap {
                    cap: self.limits.max_bytes,
                },
            }));
        }
        if self.read_up_to(buf, true)? < buf.len() {
            return Err(self.err(StampDefect::Truncated));
        }
        Ok(())
    }

    fn le<const N: usize>(&mut self) -> R<[u8; N]> {
        let mut b = [0u8; N];
        self.fill(&mut b)?;
        Ok(b)
    }

    fn byte(&mut self) -> R<u8> {
        Ok(self.le::<1>()?[0])
    }

    /// Check a declared length against the cap and what is left, before reading anything.
    fn declared(&self, declared: u64, cap: u64) -> R<()> {
        let cap = if declared > cap { cap } else { self.left() };
        if declared > cap {
            return Err(self.err(StampDefect::HugeLength { declared, cap }));
        }
        Ok(())
    }

    /// Read `len` bytes, keeping them only when `keep` is at least `len`.
    fn bytes(&mut self, len: u64, cap: u64, keep: usize) -> R<Option<Vec<u8>>> {
        self.declared(len, cap)?;
        if len <= keep as u64 {
            let mut v = vec![0u8; len as usize];
            self.fill(&mut v)?;
            return Ok(Some(v));
        }
        let mut chunk = [0u8; 8192];
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            self.fill(&mut chunk[..n])?;
            left -= n as u64;
        }
        Ok(None)
    }

    /// A text operand up to `\n` (not included).
    fn line(&mut self) -> R<Vec<u8>> {
        let mut v = Vec::new();
        loop {
            let b = self.byte()?;
            if b == b'\n' {
                return Ok(v);
            }
            if v.len() == self.limits.max_line {
                let cap = self.limits.max_line;
                return Err(self.err(StampDefect::LineTooLong { cap }));
            }
            v.push(b);
        }
    }

    /// The framing's head: `PROTO` right away (a plain pickle) or an 8-byte length first;
    /// returns the declared opcode length (when prefixed) and the pickle protocol.
    fn head(&mut self) -> R<(Option<u64>, u8)> {
        let at_start = |defect| StampError { offset: 0, defect };
        let unknown_if_short = |e: StampError, head: &[u8]| match e.defect {
            StampDefect::Truncated if head.is_empty() => at_start(StampDefect::UnknownFraming {
                head: "empty".into(),
            }),
            StampDefect::Truncated => at_start(StampDefect::UnknownFraming {
                head: format!("{} and ends", hex(head)),
            }),
            _ => e,
        };
        let first = self.byte().map_err(|e| unknown_if_short(e, &[]))?;
        let (prefixed, protocol) = if first == PROTO {
            (None, self.byte()?)
        } else {
            let mut head = [first; 10];
            for i in 1..10 {
                head[i] = self.byte().map_err(|e| unknown_if_short(e, &head[..i]))?;
            }
            let len = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
            if !(2..=MAX_PREFIX).contains(&len) || head[8] != PROTO {
                let head = hex(&head);
                return Err(at_start(StampDefect::UnknownFraming { head }));
            }
            if 8 + len > self.limits.max_bytes {
                return Err(at_start(StampDefect::HugeOpcodeLength {
                    declared: len,
                    cap: self.limits.max_bytes.saturating_sub(8),
                }));
            }
            self.region_end = Some(8 + len);
            (Some(len), head[9])
        };
        if !(2..=5).contains(&protocol) {
            return Err(StampError {
                offset: self.pos - 1,
                defect: StampDefect::Protocol { found: protocol },
            });
        }
        Ok((prefixed, protocol))
    }

    fn push(&mut self, v: V) -> R<()> {
        if self.stack.len() >= self.limits.max_stack {
            let cap = self.limits.max_stack;
            return Err(self.err(StampDefect::StackCap { cap }));
        }
        self.stack.push(v);
        Ok(())
    }

    /// The value on top of the stack, above the last mark.
    fn top(&self, opcode: u8) -> R<V> {
        let above = &self.stack[self.marks.last().copied().unwrap_or(0)..];
        let underflow = || self.err(StampDefect::StackUnderflow { opcode });
        above.last().cloned().ok_or_else(underflow)
    }

    fn pop(&mut self, opcode: u8) -> R<V> {
        let v = self.top(opcode)?;
        self.stack.pop();
        Ok(v)
    }

    /// Pop everything above the last mark, and the mark.
    fn pop_mark(&mut self, opcode: u8) -> R<Vec<V>> {
        let Some(mark) = self.marks.pop() else {
            return Err(self.err(StampDefect::NoMark { opcode }));
        };
        Ok(self.stack.split_off(mark))
    }

    fn new_dict(&mut self) -> V {
        self.dicts.push((Vec::new(), 0));
        V::Dict(self.dicts.len() - 1)
    }

    fn set_items(&mut self, target: &V, items: Vec<V>) -> R<()> {
        let V::Dict(id) = target else {
            // Items set on an object (a dict subclass rebuilt by REDUCE): skipped.
            return Ok(());
        };
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            let V::Str(key) = k else {
                self.dicts[*id].1 += 1;
                continue;
            };
            let dict = &mut self.dicts[*id].0;
            if let Some(slot) = dict.iter_mut().find(|(k, _)| **k == *key) {
                slot.1 = v;
            } else if self.items >= self.limits.max_items {
                let cap = self.limits.max_items;
                return Err(self.err(StampDefect::ItemsCap { cap }));
            } else {
                self.items += 1;
                dict.push((key, v));
            }
        }
        Ok(())
    }

    fn memo_put(&mut self, index: u64, opcode: u8) -> R<()> {
        let v = self.top(opcode)?;
        if !self.memo.contains_key(&index) && self.memo.len() >= self.limits.max_memo {
            let cap = self.limits.max_memo;
            return Err(self.err(StampDefect::MemoCap { cap }));
        }
        self.memo.insert(index, v);
        Ok(())
    }

    /// The memo index operand: one byte, four bytes, or a decimal line.
    fn memo_index(&mut self, op: u8) -> R<u64> {
        Ok(match op {
            b'q' | b'h' => self.byte()?.into(),
            b'r' | b'j' => u32::from_le_bytes(self.le()?).into(),
            // b'p' and b'g'.
            _ => {
                let line = self.line()?;
                text_number(&line).ok_or_else(|| self.bad(op, "not a decimal index"))?
            }
        })
    }

    /// Run the opcodes from just after `PROTO` to `STOP`; returns the top-level value.
    fn run(&mut self) -> R<V> {
        loop {
            let at = self.pos;
            let op = self.byte()?;
            let at_op = |defect| StampError { offset: at, defect };
            match op {
                STOP if self.stack.len() != 1 || !self.marks.is_empty() => {
                    return Err(at_op(StampDefect::BadStop {
                        values: self.stack.len(),
                        marks: self.marks.len(),
                    }));
                }
                STOP => return Ok(self.stack.pop().expect("one value")),
                PROTO => {
                    return Err(at_op(StampDefect::BadOperand {
                        opcode: op,
                        why: "PROTO inside the pickle".into(),
                    }));
                }
                _ => {}
            }
            if !(self.stack_op(op, at)? || self.value_op(op)? || self.kind_op(op)?) {
                return Err(at_op(StampDefect::UnknownOpcode { opcode: op }));
            }
        }
    }

    /// Frames, marks, the plain stack moves, the memo and the dicts (the only containers
    /// whose items are kept); whether `op` was one of them.
    fn stack_op(&mut self, op: u8, at: u64) -> R<bool> {
        let at_op = |defect| StampError { offset: at, defect };
        match op {
            // FRAME: a hint of how many bytes follow; checked against what is left.
            0x95 => {
                let len = u64::from_le_bytes(self.le()?);
                self.declared(len, self.left())?;
            }
            b'(' if self.marks.len() >= self.limits.max_marks => {
                let cap = self.limits.max_marks;
                return Err(at_op(StampDefect::MarkCap { cap }));
            }
            b'(' => self.marks.push(self.stack.len()),
            // POP: a value, or the mark when nothing is above it.
            b'0' if self.top(op).is_ok() => drop(self.stack.pop()),
            b'0' if self.marks.pop().is_none() => {
                return Err(at_op(StampDefect::StackUnderflow { opcode: op }));
            }
            b'0' => {}
            b'1' => drop(self.pop_mark(op)?),
            b'2' => {
                let v = self.top(op)?;
                self.push(v)?;
            }
            // MEMOIZE and the three PUTs store the top value, the three GETs push one.
            0x94 => self.memo_put(self.memo.len() as u64, op)?,
            b'q' | b'r' | b'p' => {
                let index = self.memo_index(op)?;
                self.memo_put(index, op)?;
            }
            b'h' | b'j' | b'g' => {
                let index = self.memo_index(op)?;
                let missing = || self.err(StampDefect::MissingMemo { index });
                let v = self.memo.get(&index).cloned().ok_or_else(missing)?;
                self.push(v)?;
            }
            b'}' => {
                let d = self.new_dict();
                self.push(d)?;
            }
            b'd' | b'u' => {
                let items = self.pop_mark(op)?;
                if items.len() % 2 != 0 {
                    return Err(self.bad(op, "an odd number of dict items"));
                }
                let target = if op == b'd' {
                    self.new_dict()
                } else {
                    self.top(op)?
                };
                self.set_items(&target, items)?;
                if op == b'd' {
                    self.push(target)?;
                }
            }
            b's' => {
                let v = self.pop(op)?;
                let k = self.pop(op)?;
                let target = self.top(op)?;
                self.set_items(&target, vec![k, v])?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// `None`, booleans, integers (floats are in [`KIND_OPS`]), strings (kept when short and
    /// UTF-8) and bytes (skipped); whether `op` was one of them.
    fn value_op(&mut self, op: u8) -> R<bool> {
        let (max_string, keep) = (self.limits.max_string, self.limits.keep_string);
        let v = match op {
            b'N' => V::None,
            0x88 | 0x89 => V::Bool(op == 0x88),
            b'J' => V::Int(i32::from_le_bytes(self.le()?).into()),
            b'K' => V::Int(self.byte()?.into()),
            b'M' => V::Int(u16::from_le_bytes(self.le()?).into()),
            0x8a => {
                let n = self.byte()?;
                long_le(&self.bytes(n.into(), 255, 255)?.expect("kept"))
            }
            0x8b => {
                let n = self.length(op)?;
                let bytes = self.bytes(n, max_string, 8)?;
                bytes.map_or(V::Kind("big int"), |b| long_le(&b))
            }
            b'I' => match self.line()?.as_slice() {
                b"01" => V::Bool(true),
                b"00" => V::Bool(false),
                l => text_number(l)
                    .map(V::Int)
                    .ok_or_else(|| self.bad(op, "INT operand is not an integer"))?,
            },
            b'L' => {
                let line = self.line()?;
                let text = std::str::from_utf8(&line)
                    .ok()
                    .map(|s| s.trim().trim_end_matches('L'))
                    .filter(|s| {
                        let d = s.strip_prefix('-').unwrap_or(s);
                        !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())
                    })
                    .ok_or_else(|| self.bad(op, "LONG operand is not an integer"))?;
                text.parse::<i64>().map_or(V::Kind("big int"), V::Int)
            }
            0x8c | b'X' | 0x8d | b'U' | b'T' => {
                let n = self.length(op)?;
                string_value(self.bytes(n, max_string, keep)?)
            }
            b'C' | b'B' | 0x8e | 0x96 => {
                let n = self.length(op)?;
                self.bytes(n, max_string, 0)?;
                V::Kind("bytes")
            }
            // A text string (protocol 0): kept when it is plain ASCII without escapes.
            b'V' | b'S' => {
                let line = self.line()?;
                let plain = match line.as_slice() {
                    [q @ (b'\'' | b'"'), inner @ .., end] if op == b'S' && q == end => inner,
                    _ if op == b'S' => return Err(self.bad(op, "STRING operand is not quoted")),
                    all => all,
                };
                let escaped = plain.contains(&b'\\') || !plain.is_ascii();
                if escaped || plain.len() > keep {
                    V::Kind("escaped string")
                } else {
                    string_value(Some(plain.to_vec()))
                }
            }
            _ => return Ok(false),
        };
        self.push(v)?;
        Ok(true)
    }

    /// The binary length operand of a string, bytes or `LONG4` opcode.
    fn length(&mut self, op: u8) -> R<u64> {
        Ok(match op {
            0x8c | b'U' | b'C' => self.byte()?.into(),
            b'X' | b'B' => u32::from_le_bytes(self.le()?).into(),
            b'T' | 0x8b => {
                let n = i32::from_le_bytes(self.le()?);
                let name = if op == b'T' { "BINSTRING" } else { "LONG4" };
                u64::try_from(n).map_err(|_| self.bad(op, format!("negative {name} length")))?
            }
            // 0x8d, 0x8e and 0x96: eight bytes.
            _ => u64::from_le_bytes(self.le()?),
        })
    }

    /// An opcode of [`KIND_OPS`]; whether `op` was one of them.
    fn kind_op(&mut self, op: u8) -> R<bool> {
        let Some(&(_, operand, pops, mark, kind)) = KIND_OPS.iter().find(|row| row.0 == op) else {
            return Ok(false);
        };
        match operand {
            Operand::No => {}
            Operand::Bytes(n) => self.fill(&mut [0u8; 8][..n])?,
            Operand::Lines(n) => {
                for _ in 0..n {
                    self.line()?;
                }
            }
        }
        for _ in 0..pops {
            self.pop(op)?;
        }
        if mark {
            self.pop_mark(op)?;
        }
        let Some(kind) = kind else {
            return self.top(op).map(|_| true);
        };
        self.persistent_ids += u64::from(kind == "persistent id");
        self.buffers += u64::from(kind == "buffer");
        self.push(V::Kind(kind)).map(|()| true)
    }

    /// What follows `STOP`: nothing after a plain pickle; after a length-prefixed one, the
    /// framing its opcodes' references and the first bytes after them show.
    fn framing_after(&mut self, prefixed: Option<u64>) -> R<Framing> {
        let (buffers, persistent_ids) = (self.buffers, self.persistent_ids);
        let mut peek = [0u8; 8];
        let Some(opcode_len) = prefixed else {
            if buffers > 0 || persistent_ids > 0 {
                let what = if buffers > 0 {
                    "out-of-band buffers"
                } else {
                    "persistent ids"
                };
                return Err(self.err(StampDefect::PlainWithOutside { what }));
            }
            if self.read_up_to(&mut peek[..1], false)? > 0 {
                return Err(self.err(StampDefect::TrailingData));
            }
            return Ok(Framing::Plain);
        };
        let (stop_at, declared_end) = (self.pos, 8 + opcode_len);
        if stop_at != declared_end {
            return Err(self.err(StampDefect::StopPosition {
                stop_at,
                declared_end,
            }));
        }
        let got = self.read_up_to(&mut peek, false)?;
        let bad_tail = |why| Err(self.err(StampDefect::BadTail { why }));
        match (buffers, persistent_ids) {
            (b, 0) if b > 0 && got < 8 => bad_tail(format!(
                "the opcodes refer to {b} out-of-band buffer(s) but {got} byte(s) follow them, too few for a record's 8-byte length"
            )),
            (b, 0) if b > 0 && got == 8 && i64::from_le_bytes(peek) < 0 => bad_tail(format!(
                "the first buffer record's length {} is negative",
                i64::from_le_bytes(peek)
            )),
            (b, 0) if b > 0 || got == 0 => Ok(Framing::OobRecords {
                opcode_len,
                buffers,
            }),
            (0, p) if p > 0 && got == 0 => bad_tail(format!(
                "the opcodes refer to {p} persistent id(s) but no arena follows them"
            )),
            (0, p) if p > 0 => Ok(Framing::LengthArena {
                opcode_len,
                persistent_ids,
            }),
            (b, p) => Err(self.err(StampDefect::UndecidableFraming {
                buffers: b,
                persistent_ids: p,
            })),
        }
    }
}

/// A decimal number on a text line (surrounding blanks allowed).
fn text_number<T: std::str::FromStr>(line: &[u8]) -> Option<T> {
    std::str::from_utf8(line).ok()?.trim().parse().ok()
}

/// A little-endian two's-complement integer of any length, as `i64` when it fits.
fn long_le(bytes: &[u8]) -> V {
    let Some(&last) = bytes.last() else {
        return V::Int(0);
    };
    let fill = if last & 0x80 != 0 { 0xff } else { 0 };
    if bytes.len() > 8 {
        if bytes[8..].iter().any(|b| *b != fill) || (bytes[7] & 0x80 != 0) != (fill != 0) {
            return V::Kind("big int");
        }
        return long_le(&bytes[..8]);
    }
    let mut b = [fill; 8];
    b[..bytes.len()].copy_from_slice(bytes);
    V::Int(i64::from_le_bytes(b))
}

fn string_value(bytes: Option<Vec<u8>>) -> V {
    match bytes.map(String::from_utf8) {
        Some(Ok(s)) => V::Str(Rc::from(s)),
        Some(Err(_)) => V::Kind("undecodable string"),
        None => V::Kind("long string"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
}

/// Read the stamp from `input`: the framing, then the pickle's opcodes up to `STOP`, then (for
/// the framings that have one) the start of what follows them. Never reads more than
/// `limits.max_bytes` (plus at most one byte to tell a plain pickle ends at its `STOP`).
pub fn read_stamp(input: impl Read, limits: &StampLimits) -> Result<Stamp, StampError> {
    let mut r = Reader {
        input: io::BufReader::with_capacity(64 * 1024, input),
        pos: 0,
        region_end: None,
        limits,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        dicts: Vec::new(),
        items: 0,
        buffers: 0,
        persistent_ids: 0,
    };
    let (prefixed, protocol) = r.head()?;
    let top = r.run()?;
    let stop_at = r.pos;
    let framing = r.framing_after(prefixed)?;
    let V::Dict(id) = top else {
        return Err(StampError {
            offset: stop_at - 1,
            defect: StampDefect::NotADict { found: top.kind() },
        });
    };
    let (items, other_keys) = std::mem::take(&mut r.dicts[id]);
    Ok(Stamp {
        framing,
        protocol,
        entries: items
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.public()))
            .collect(),
        other_keys,
    })
}

/// An artifact whose stamp is not this generation's and this entry's: which file, which key,
/// what the contract, pin or entry expects and what the artifact says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{file}: the artifact's stamp says {key} = {found}, but this generation and entry need {expected}; the pinned runtime refuses it before it runs (rebuild it with the pinned tinygrad)"
)]
pub struct StampRefusal {
    /// The artifact's file name.
    pub file: String,
    /// The stamp key that disagrees.
    pub key: &'static str,
    /// What the contract, pin or entry expects.
    pub expected: String,
    /// The artifact's value (`missing` when the key is absent).
    pub found: String,
}

/// Whether artifacts of this contract carry a stamp to check (v25: no; v26: yes).
pub fn stamp_required(contract: &Contract) -> bool {
    contract.stamp.is_some()
}

/// The decision: `stamp` (read from `file`) against the contract's [`StampRule`], the pinned
/// compiler revision `pin` and the entry's behaviour version. A contract without a stamp rule
/// (v25) accepts any artifact: its artifacts keep that contract's rules. The keys are checked
/// in the runtime's order (ABI, compiler revision, format version, then behaviour version) and
/// the first mismatch is the refusal.
///
/// [`StampRule`]: crate::contract::StampRule
pub fn check_stamp(
    file: &str,
    stamp: &Stamp,
    contract: &Contract,
    pin: &GitCommit,
    entry_version: BehaviorVersion,
) -> Result<(), StampRefusal> {
    let Some(rule) = contract.stamp else {
        return Ok(());
    };
    let abi = contract
        .artifact_abi
        .map(|abi| (rule.abi_key, StampValue::Str(abi.into())));
    let rest = [
        (
            rule.compiler_revision_key,
            StampValue::Str(pin.as_str().into()),
        ),
        (
            rule.format_version_key,
            StampValue::Int(rule.format_version),
        ),
        (
            rule.behavior_version_key,
            StampValue::Str(entry_version.to_string()),
        ),
    ];
    for (key, expected) in abi.into_iter().chain(rest) {
        let found = stamp.get(key);
        if found != Some(&expected) {
            return Err(StampRefusal {
                file: file.to_string(),
                key,
                expected: expected.to_string(),
                found: found.map_or_else(|| "missing".to_string(), ToString::to_string),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::ContractName;
    use std::time::{Duration, Instant};

    const REV: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";

    /// `SHORT_BINUNICODE` of `s`.
    fn s(s: &str) -> Vec<u8> {
        let mut v = vec![0x8c, s.len() as u8];
        v.extend_from_slice(s.as_bytes());
        v
    }

    fn k(n: u8) -> Vec<u8> {
        vec![b'K', n]
    }

    /// A protocol-5 pickle of a dict of `items` (already encoded key/value opcodes).
    fn dict_pickle(items: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        let mut v = vec![0x80, 5, b'}', 0x94, b'('];
        for (key, value) in items {
            v.extend_from_slice(key);
            v.extend_from_slice(value);
        }
        v.extend_from_slice(b"u.");
        v
    }

    fn stamp_items(abi: &str, rev: &str, format: u8, version: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        vec![
            (s("artifact_abi"), s(abi)),
            (s("compiler_revision"), s(rev)),
            (s("format_version"), k(format)),
            (s("behavior_version"), s(version)),
            (s("model_type"), s("supercombo")),
        ]
    }

    fn prefixed(opcodes: &[u8], tail: &[u8]) -> Vec<u8> {
        let mut v = (opcodes.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(opcodes);
        v.extend_from_slice(tail);
        v
    }

    fn err(bytes: &[u8], limits: &StampLimits) -> StampError {
        read_stamp(bytes, limits).unwrap_err()
    }

    fn defect(bytes: &[u8]) -> StampDefect {
        err(bytes, &StampLimits::default()).defect
    }

    #[test]
    fn hand_made_stamp_reads() {
        let p = dict_pickle(&stamp_items("tinygrad_single_v1_arena", REV, 1, "v9"));
        let st = read_stamp(&p[..], &StampLimits::default()).unwrap();
        assert_eq!(st.framing, Framing::Plain);
        assert_eq!(st.str("compiler_revision"), Some(REV));
        assert_eq!(st.int("format_version"), Some(1));
        assert_eq!(st.str("model_type"), Some("supercombo"));
        // The same opcodes behind a length prefix, with no buffer referenced and nothing after:
        // an OOB container with no records.
        let st = read_stamp(&prefixed(&p, &[])[..], &StampLimits::default()).unwrap();
        assert_eq!(
            st.framing,
            Framing::OobRecords {
                opcode_len: p.len() as u64,
                buffers: 0
            }
        );
    }

    #[test]
    fn framing_errors_say_so() {
        for (bytes, want) in [
            (&b""[..], "empty"),
            (b"hello world, not a pickle", "unknown framing"),
            (b"\x10\0\0\0\0\0\0\0\x80", "unknown framing"),
            (b"\x10\0\0\0\0\0\0\0PK", "unknown framing"),
            (
                b"\xff\xff\xff\xff\xff\xff\xff\x7f\x80\x05",
                "unknown framing",
            ),
        ] {
            let e = err(bytes, &StampLimits::default());
            assert!(
                matches!(e.defect, StampDefect::UnknownFraming { .. }),
                "{e}"
            );
            assert!(e.to_string().contains(want), "{e}");
        }
        // Both kinds of outside reference, or neither with bytes after: undecidable.
        let both = vec![
            0x80, 5, b'}', b'(', 0x8c, 1, b'a', 0x97, 0x8c, 1, b'b', b'N', b'Q', b'u', b'.',
        ];
        assert!(matches!(
            defect(&prefixed(&both, &[0; 8])),
            StampDefect::UndecidableFraming {
                buffers: 1,
                persistent_ids: 1
            }
        ));
        let neither = dict_pickle(&[]);
        assert!(matches!(
            defect(&prefixed(&neither, &[1, 2, 3])),
            StampDefect::UndecidableFraming { .. }
        ));
        // A plain pickle cannot refer outside itself.
        let buffer = vec![0x80, 5, b'}', 0x8c, 1, b'a', 0x97, b's', b'.'];
        assert!(matches!(
            defect(&buffer),
            StampDefect::PlainWithOutside { .. }
        ));
        // The prefix and the STOP disagree.
        let p = dict_pickle(&[]);
        let mut longer = prefixed(&p, &[]);
        longer[0] += 3;
        longer.extend_from_slice(&[0; 3]);
        assert!(matches!(defect(&longer), StampDefect::StopPosition { .. }));
        let mut shorter = prefixed(&p, &[0; 16]);
        shorter[0] -= 1;
        assert!(matches!(defect(&shorter), StampDefect::StopPosition { .. }));
        assert!(matches!(
            defect(&[0x80, 1, b'}', b'.']),
            StampDefect::Protocol { found: 1 }
        ));
        assert!(matches!(
            defect(&[0x80, 6, b'}', b'.']),
            StampDefect::Protocol { found: 6 }
        ));
    }

    #[test]
    fn not_a_dict_and_malformed_stacks() {
        for (bytes, want) in [
            (&[0x80, 5, b']', b'.'][..], "list"),
            (&[0x80, 5, b'N', b'.'], "None"),
            (
                &[
                    0x80, 5, 0x8c, 1, b'a', 0x8c, 1, b'b', 0x93, b')', b'R', b'.',
                ],
                "object",
            ),
        ] {
            let e = defect(bytes);
            assert_eq!(e, StampDefect::NotADict { found: want });
        }
        assert!(matches!(
            defect(&[0x80, 5, b's', b'.']),
            StampDefect::StackUnderflow { opcode: b's' }
        ));
        assert!(matches!(
            defect(&[0x80, 5, b'}', b'u', b'.']),
            StampDefect::NoMark { opcode: b'u' }
        ));
        assert!(matches!(
            defect(&[0x80, 5, b'}', b'(', b'N', b'u', b'.']),
            StampDefect::BadOperand { opcode: b'u', .. }
        ));
        assert!(matches!(
            defect(&[0x80, 5, b'h', 3, b'.']),
            StampDefect::MissingMemo { index: 3 }
        ));
        assert!(matches!(
            defect(&[0x80, 5, b'}', b'}', b'.']),
            StampDefect::BadStop { values: 2, .. }
        ));
        assert!(matches!(
            defect(&[0x80, 5, b'(', b'}', b'.']),
            StampDefect::BadStop { marks: 1, .. }
        ));
        // A mark hides what is below it.
        assert!(matches!(
            defect(&[0x80, 5, b'}', b'N', b'(', b's', b'.']),
            StampDefect::StackUnderflow { .. }
        ));
    }

    #[test]
    fn unknown_opcodes_are_refused() {
        for op in [0x00u8, 0x99, 0xff, b'z', b'!'] {
            let e = defect(&[0x80, 5, b'}', op, b'.']);
            assert_eq!(e, StampDefect::UnknownOpcode { opcode: op });
        }
    }

    #[test]
    fn truncated_everywhere_is_an_error() {
        let p = dict_pickle(&stamp_items("a", REV, 1, "v9"));
        for cut in 0..p.len() {
            let e = err(&p[..cut], &StampLimits::default());
            assert!(
                matches!(
                    e.defect,
                    StampDefect::Truncated
                        | StampDefect::UnknownFraming { .. }
                        | StampDefect::HugeLength { .. }
                ),
                "cut {cut}: {e}"
            );
        }
    }

    #[test]
    fn huge_declared_lengths_fail_before_reading() {
        // A string declaring 2^63 bytes, a BINBYTES8, a FRAME and a LONG4: refused at once,
        // nothing allocated.
        let mut big_str = vec![0x80, 5, 0x8d];
        big_str.extend_from_slice(&(1u64 << 63).to_le_bytes());
        let mut big_bytes = vec![0x80, 5, 0x8e];
        big_bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        let mut frame = vec![0x80, 5, 0x95];
        frame.extend_from_slice(&(1u64 << 40).to_le_bytes());
        let mut long4 = vec![0x80, 5, 0x8b];
        long4.extend_from_slice(&i32::MAX.to_le_bytes());
        let mut unicode = vec![0x80, 5, b'X'];
        unicode.extend_from_slice(&u32::MAX.to_le_bytes());
        for bytes in [big_str, big_bytes, frame, long4, unicode] {
            let start = Instant::now();
            let e = err(&bytes, &StampLimits::default());
            assert!(matches!(e.defect, StampDefect::HugeLength { .. }), "{e}");
            assert!(start.elapsed() < Duration::from_secs(1));
        }
        // A prefix declaring more opcodes than the cap.
        let mut head = (1u64 << 29).to_le_bytes().to_vec();
        head.extend_from_slice(&[0x80, 5]);
        let limits = StampLimits {
            max_bytes: 1 << 20,
            ..StampLimits::default()
        };
        assert!(matches!(
            err(&head, &limits).defect,
            StampDefect::HugeOpcodeLength { .. }
        ));
        // A string within the cap but longer than what is there: truncated, not allocated
        // past the input.
        let mut short = vec![0x80, 5, b'X'];
        short.extend_from_slice(&(1u32 << 20).to_le_bytes());
        short.extend_from_slice(b"abc");
        assert_eq!(defect(&short), StampDefect::Truncated);
        // The string cap.
        let limits = StampLimits {
            max_string: 10,
            ..StampLimits::default()
        };
        let p = dict_pickle(&[(s("k"), s("a string of 20 bytes"))]);
        assert!(matches!(
            err(&p, &limits).defect,
            StampDefect::HugeLength {
                declared: 20,
                cap: 10
            }
        ));
        // Past keep_string, a string is read through and kept as a marker only.
        let limits = StampLimits {
            keep_string: 4,
            ..StampLimits::default()
        };
        let st = read_stamp(&p[..], &limits).unwrap();
        assert_eq!(st.get("k"), Some(&StampValue::Other("long string")));
    }

    #[test]
    fn deep_nesting_hits_the_caps() {
        // 100,000 nested lists without marks: the stack cap.
        let mut lists = vec![0x80, 5];
        lists.extend(std::iter::repeat_n(b']', 100_000));
        let e = defect(&lists);
        assert_eq!(
            e,
            StampDefect::StackCap {
                cap: StampLimits::default().max_stack
            }
        );
        // 100,000 marks: the mark cap.
        let mut marks = vec![0x80, 5];
        marks.extend(std::iter::repeat_n(b'(', 100_000));
        assert_eq!(
            defect(&marks),
            StampDefect::MarkCap {
                cap: StampLimits::default().max_marks
            }
        );
        // Memo entries.
        let mut memo = vec![0x80, 5, b'N'];
        memo.extend(std::iter::repeat_n(0x94, 20));
        let limits = StampLimits {
            max_memo: 10,
            ..StampLimits::default()
        };
        assert_eq!(err(&memo, &limits).defect, StampDefect::MemoCap { cap: 10 });
        // Dict items.
        let items: Vec<_> = (0..20).map(|i| (s(&format!("k{i}")), k(i))).collect();
        let limits = StampLimits {
            max_items: 10,
            ..StampLimits::default()
        };
        assert_eq!(
            err(&dict_pickle(&items), &limits).defect,
            StampDefect::ItemsCap { cap: 10 }
        );
        // A line without end.
        let mut line = vec![0x80, 5, b'c'];
        line.extend(std::iter::repeat_n(b'a', 70_000));
        assert!(matches!(defect(&line), StampDefect::LineTooLong { .. }));
    }

    /// An endless input: with the default caps the reader stops within 64 MiB and a bounded
    /// time, whatever the pattern (values pushed and popped forever; a memo grown forever; a
    /// frame that never ends; an endless string).
    #[test]
    fn endless_input_stops_at_the_byte_cap() {
        let limits = StampLimits {
            max_bytes: 1 << 20,
            ..StampLimits::default()
        };
        let cycles: [&[u8]; 3] = [b"N0", b"}\x94\x30", b"\x88\x30"];
        for cycle in cycles {
            let head = std::io::Cursor::new(vec![0x80u8, 5]);
            let endless = head.chain(EndlessCycle(cycle, 0));
            let start = Instant::now();
            let e = read_stamp(endless, &limits).unwrap_err();
            assert!(
                matches!(
                    e.defect,
                    StampDefect::BytesCap { .. } | StampDefect::MemoCap { .. }
                ),
                "{e}"
            );
            assert!(e.offset <= limits.max_bytes);
            assert!(start.elapsed() < Duration::from_secs(20));
        }
        // An endless length-prefixed stream stops at its declared end.
        let mut head = (1u64 << 19).to_le_bytes().to_vec();
        head.extend_from_slice(&[0x80, 5]);
        let endless = std::io::Cursor::new(head).chain(EndlessCycle(b"N0", 0));
        let e = read_stamp(endless, &limits).unwrap_err();
        assert!(matches!(e.defect, StampDefect::StopPosition { .. }), "{e}");
        assert!(e.offset <= 8 + (1 << 19));
    }

    struct EndlessCycle(&'static [u8], usize);

    impl Read for EndlessCycle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            for b in buf.iter_mut() {
                *b = self.0[self.1 % self.0.len()];
                self.1 += 1;
            }
            Ok(buf.len())
        }
    }

    fn row(rev: &str, format: u8, abi: &str, version: &str) -> Stamp {
        read_stamp(
            &dict_pickle(&stamp_items(abi, rev, format, version))[..],
            &StampLimits::default(),
        )
        .unwrap()
    }

    /// The decision for v25 (no stamp: anything passes), v26, and a made-up v27 that runs v26's
    /// contract with its own pin.
    #[test]
    fn check_stamp_table() {
        let v25 = ContractName::V25.contract();
        let v26 = ContractName::V26.contract();
        let pin26: GitCommit = REV.parse().unwrap();
        let pin27: GitCommit = "1111111111111111111111111111111111111111".parse().unwrap();
        let abi = v26.artifact_abi.unwrap();
        let v12 = BehaviorVersion::new(12);
        let good26 = row(REV, 1, abi, "v12");
        let good27 = row(pin27.as_str(), 1, abi, "v12");
        let wrong_abi = row(REV, 1, "tinygrad_single_v1", "v12");
        let wrong_format = row(REV, 2, abi, "v12");
        let wrong_version = row(REV, 1, abi, "v11");
        let missing = read_stamp(
            &dict_pickle(&[(s("artifact_abi"), s(abi))])[..],
            &StampLimits::default(),
        )
        .unwrap();
        type Want = Option<(&'static str, String, String)>;
        let cases: Vec<(&str, &Stamp, &Contract, &GitCommit, Want)> = vec![
            ("v25 ignores any stamp", &wrong_abi, v25, &pin26, None),
            ("v25 ignores a missing stamp", &missing, v25, &pin26, None),
            ("v26 good", &good26, v26, &pin26, None),
            ("v27 good", &good27, v26, &pin27, None),
            (
                "v26 artifact in v27",
                &good26,
                v26,
                &pin27,
                Some(("compiler_revision", pin27.to_string(), REV.into())),
            ),
            (
                "v27 artifact in v26",
                &good27,
                v26,
                &pin26,
                Some(("compiler_revision", REV.into(), pin27.to_string())),
            ),
            (
                "wrong abi",
                &wrong_abi,
                v26,
                &pin26,
                Some(("artifact_abi", abi.into(), "tinygrad_single_v1".into())),
            ),
            (
                "wrong format",
                &wrong_format,
                v26,
                &pin26,
                Some(("format_version", "1".into(), "2".into())),
            ),
            (
                "wrong version",
                &wrong_version,
                v26,
                &pin26,
                Some(("behavior_version", "v12".into(), "v11".into())),
            ),
            (
                "missing keys",
                &missing,
                v26,
                &pin26,
                Some(("compiler_revision", REV.into(), "missing".into())),
            ),
        ];
        for (what, stamp, contract, pin, want) in cases {
            let got = check_stamp("m_driving_tinygrad.pkl", stamp, contract, pin, v12);
            match want {
                None => assert_eq!(got, Ok(()), "{what}"),
                Some((key, expected, found)) => {
                    let r = got.unwrap_err();
                    assert_eq!(
                        (
                            r.key,
                            r.expected.trim_matches('"'),
                            r.found.trim_matches('"')
                        ),
                        (key, expected.as_str(), found.as_str()),
                        "{what}"
                    );
                    let msg = r.to_string();
                    assert!(msg.contains("m_driving_tinygrad.pkl"), "{msg}");
                    assert!(msg.contains(&expected) && msg.contains(&found), "{msg}");
                }
            }
        }
        assert!(!stamp_required(v25) && stamp_required(v26));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Random bytes never panic, and end within the caps.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let limits = StampLimits { max_bytes: 1 << 16, ..StampLimits::default() };
            let _ = read_stamp(&bytes[..], &limits);
        }

        /// Random opcodes after a valid head, and behind a length prefix: never a panic.
        #[test]
        fn random_opcodes_never_panic(
            body in proptest::collection::vec(proptest::sample::select(
                b"().0123NJKMIL\x88\x89GF\x8cX\x8dUTVSCB\x8e\x96}])\x8fdlt\x85\x86\x87aes\x90u\x91\x94qrphjgc\x93ioR\x81\x92b\x82\x83\x84PQ\x97\x98\x95\x8a\x8b\n".to_vec()), 0..256),
            prefix in proptest::prelude::any::<bool>(),
        ) {
            let mut p = vec![0x80, 5];
            p.extend_from_slice(&body);
            p.push(b'.');
            let bytes = if prefix { prefixed(&p, &[0; 8]) } else { p };
            let limits = StampLimits { max_bytes: 1 << 16, ..StampLimits::default() };
            let _ = read_stamp(&bytes[..], &limits);
        }
    }
}
