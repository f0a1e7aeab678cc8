//! Canonical JSON: byte-for-byte what Python's `json.dumps(obj, indent=2, ensure_ascii=False)`
//! plus `"\n"` writes, because the manifests we rewrite were written by Python tools and a
//! rewrite without changes must not show up as a diff.
//!
//! serde_json's pretty printer already matches Python on indentation, `": "` and `","`
//! separators, empty `[]`/`{}`, key order (with `preserve_order`), raw non-ASCII and escapes
//! (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, other C0 controls as lowercase `\u00XX`, DEL raw).
//! It differs on floats: Python writes `repr(float)` (`1e+16`, `1e-05`, `100.0`), serde_json
//! writes `1e16`, `1e-5`. [`PythonFormatter`] fixes that.
//!
//! Known limits, both far from anything a manifest holds: integers outside the i64/u64 range
//! are read as floats (Python keeps them exact), and `-0` is read as the float `-0.0` (Python
//! reads the integer `0`).

use std::io;

use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter};

/// Serializes `value` canonically (see the module docs), with the trailing newline.
pub fn to_canonical_string<T: Serialize + ?Sized>(value: &T) -> String {
    let mut out = Vec::with_capacity(4096);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter::new());
    // Serializing a `Value` or our manifest types into a Vec cannot fail: no I/O errors, no
    // non-string map keys.
    value
        .serialize(&mut ser)
        .expect("serializing JSON into memory does not fail");
    out.push(b'\n');
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// serde_json's 2-space pretty printer with Python's float formatting.
pub struct PythonFormatter<'a> {
    pretty: PrettyFormatter<'a>,
}

impl PythonFormatter<'_> {
    /// A formatter with the 2-space indent Python's `json.dumps(indent=2)` uses.
    pub fn new() -> Self {
        Self {
            pretty: PrettyFormatter::with_indent(b"  "),
        }
    }
}

impl Default for PythonFormatter<'_> {
    fn default() -> Self {
        Self::new()
    }
}

/// Formatter methods handed to the pretty printer as they are.
macro_rules! pretty {
    ($($name:ident($($arg:ident: $t:ty),*)),*) => {$(
        fn $name<W: ?Sized + io::Write>(&mut self, w: &mut W $(, $arg: $t)*) -> io::Result<()> {
            self.pretty.$name(w $(, $arg)*)
        }
    )*};
}

impl Formatter for PythonFormatter<'_> {
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(python_float_repr(value).as_bytes())
    }
    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        w.write_all(python_float_repr(f64::from(value)).as_bytes())
    }
    pretty!(
        begin_array(),
        end_array(),
        begin_array_value(first: bool),
        end_array_value(),
        begin_object(),
        end_object(),
        begin_object_key(first: bool),
        begin_object_value(),
        end_object_value()
    );
}

/// What Python's `json.dump(value, out, ensure_ascii=False, allow_nan=False, sort_keys=True)`
/// writes: keys sorted at every level (by code point, which is UTF-8 byte order), `", "` and
/// `": "` separators, no indentation, no trailing newline, floats as `repr(float)`. Upstream's
/// v26 manager writes its state files (`catalog.json`, `preferences.json`,
/// `.download-job.json`) this way.
pub fn to_python_sorted_string(value: &serde_json::Value) -> String {
    let mut out = Vec::with_capacity(4096);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonDumpFormatter);
    sorted(value)
        .serialize(&mut ser)
        .expect("serializing JSON into memory does not fail");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// `value` with every object's keys in sorted order (the map keeps insertion order).
fn sorted(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&map[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// Python's default `json.dump` separators without indentation, with its float formatting.
struct PythonDumpFormatter;

impl Formatter for PythonDumpFormatter {
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(python_float_repr(value).as_bytes())
    }
    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        w.write_all(python_float_repr(f64::from(value)).as_bytes())
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, in positional notation when the
/// decimal exponent is in [-4, 16), else `d.ddde+XX` with at least two exponent digits.
/// JSON has no NaN or infinity, so serde_json never hands us one.
pub(crate) fn python_float_repr(value: f64) -> String {
    // Rust's `{:e}` gives the shortest round-trip digits, like Python's repr: "1.2345e-7".
    let sci = format!("{value:e}");
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    // Python's rule is on the position of the decimal point: `decpt = exp + 1`,
    // exponent notation when decpt <= -4 or decpt > 16.
    let decpt = exp + 1;
    if !(-4 < decpt && decpt <= 16) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    let n = digits.len() as i32;
    if decpt <= 0 {
        format!("{sign}0.{}{digits}", "0".repeat((-decpt) as usize))
    } else if decpt >= n {
        format!("{sign}{digits}{}.0", "0".repeat((decpt - n) as usize))
    } else {
        let (int, frac) = digits.split_at(decpt as usize);
        format!("{sign}{int}.{frac}")
    }
}

#[cfg(test)]
mod tests {

    /// Bytes Python 3 writes for the same document with `json.dump(..., ensure_ascii=False,
    /// sort_keys=True)` (checked by hand against CPython 3.11).
    #[test]
    fn python_sorted_dump() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"z": [1, 2.5, {"b": null, "a": true}], "a": "é\n\"", "m": {}, "e": [], "f": 1e16, "g": 100.0}"#,
        )
        .unwrap();
        assert_eq!(
            to_python_sorted_string(&v),
            r#"{"a": "é\n\"", "e": [], "f": 1e+16, "g": 100.0, "m": {}, "z": [1, 2.5, {"a": true, "b": null}]}"#
        );
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn floats_match_python_repr() {
        // Expected values from CPython 3's `repr(float)`.
        let cases = [
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (1e-5, "1e-05"),
            (1.5, "1.5"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (100.0, "100.0"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (0.1, "0.1"),
            (-2.5e-7, "-2.5e-07"),
            (1234.5678, "1234.5678"),
            (9999999999999998.0, "9999999999999998.0"),
            (0.00012, "0.00012"),
        ];
        for (v, want) in cases {
            assert_eq!(python_float_repr(v), want, "{v:e}");
        }
    }

    #[test]
    fn layout_and_escapes_match_python() {
        // Expected text produced by CPython:
        // json.dumps({...}, indent=2, ensure_ascii=False) + "\n"
        let value = json!({
            "a": [],
            "b": {},
            "c": "\u{0}\u{1f}\u{7f}\u{2028}é😀\"\\/\u{8}\u{c}\n\r\t",
            "d": [1e16, 1, -3, 1.5, true, null],
            "e": {"x": {"y": []}}
        });
        let want = "{\n  \"a\": [],\n  \"b\": {},\n  \"c\": \"\\u0000\\u001f\u{7f}\u{2028}é😀\\\"\\\\/\\b\\f\\n\\r\\t\",\n  \"d\": [\n    1e+16,\n    1,\n    -3,\n    1.5,\n    true,\n    null\n  ],\n  \"e\": {\n    \"x\": {\n      \"y\": []\n    }\n  }\n}\n";
        assert_eq!(to_canonical_string(&value), want);
    }

    #[test]
    fn scalars_and_empty_top_level() {
        assert_eq!(to_canonical_string(&json!([])), "[]\n");
        assert_eq!(to_canonical_string(&json!({})), "{}\n");
        assert_eq!(to_canonical_string(&json!("x")), "\"x\"\n");
    }
}
