//! The stamp reader against real pickles: checked-in fixtures made once with python3's `pickle`
//! module, and pickles python3 makes at test time (skipped, and said so, where there is no
//! python3).
//!
//! The fixtures in `tests/fixtures/stamp/` were made with (bash, `$S` set first):
//!
//! ```text
//! S='S=dict(artifact_abi="tinygrad_single_v1_arena",compiler_revision="9d0446a4ba8a532c8b674fb6ad795af015cd9dcf",format_version=1,behavior_version="v12",model_type="vision_policy",image_history_pipeline="policy",frame_skip=4,metadata=dict(vision=dict(input_shapes=dict(img=(1,12,128,256)),output_slices=dict(plan=slice(0,10)))),execution_device="QCOM",warp_device="QCOM");S[(1928,1208)]=None'
//! python3 -c "import pickle,sys;$S;sys.stdout.buffer.write(pickle.dumps(S,protocol=2))" > plain_p2.pkl
//! python3 -c "import pickle,sys;$S;sys.stdout.buffer.write(pickle.dumps(S,protocol=5))" > plain_p5.pkl
//! python3 -c "import pickle,struct,sys;$S;b=[];p=pickle.dumps(dict(S,weights=pickle.PickleBuffer(bytearray(range(16)))),protocol=5,buffer_callback=b.append);sys.stdout.buffer.write(struct.pack('<q',len(p))+p+b''.join(struct.pack('<q',len(x.raw()))+bytes(x.raw()) for x in b))" > oob_records.bin
//! python3 -c "import io,pickle,struct,sys;$S;P=type('P',(pickle.Pickler,),{'persistent_id':lambda s,o:(0,16) if type(o) is bytearray else None});f=io.BytesIO();P(f,protocol=5).dump(dict(S,weights=bytearray(16)));p=f.getvalue();sys.stdout.buffer.write(struct.pack('<q',len(p))+p+bytes(16))" > length_arena.bin
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

use manifest::contract::ContractName;
use manifest::stamp::{Framing, Stamp, StampDefect, StampLimits, StampValue, read_stamp};
use serde_json::Value;

const REVISION: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/stamp")
            .join(name),
    )
    .unwrap()
}

fn read(bytes: &[u8]) -> Stamp {
    read_stamp(bytes, &StampLimits::default()).unwrap()
}

fn assert_fixture_stamp(s: &Stamp) {
    let rule = ContractName::V26.contract().stamp.unwrap();
    assert_eq!(s.str(rule.abi_key), Some("tinygrad_single_v1_arena"));
    assert_eq!(s.str(rule.compiler_revision_key), Some(REVISION));
    assert_eq!(s.int(rule.format_version_key), Some(1));
    assert_eq!(s.str(rule.behavior_version_key), Some("v12"));
    assert_eq!(s.str("model_type"), Some("vision_policy"));
    assert_eq!(s.str("image_history_pipeline"), Some("policy"));
    assert_eq!(s.int("frame_skip"), Some(4));
    assert_eq!(s.get("metadata"), Some(&StampValue::Other("dict")));
    assert_eq!(s.str("execution_device"), Some("QCOM"));
    // The camera-size key is a tuple: counted, not kept.
    assert_eq!(s.other_keys, 1);
}

#[test]
fn fixtures_of_every_framing_read() {
    let s = read(&fixture("plain_p2.pkl"));
    assert_eq!((s.framing, s.protocol), (Framing::Plain, 2));
    assert_fixture_stamp(&s);

    let s = read(&fixture("plain_p5.pkl"));
    assert_eq!((s.framing, s.protocol), (Framing::Plain, 5));
    assert_fixture_stamp(&s);

    let bytes = fixture("oob_records.bin");
    let s = read(&bytes);
    let opcode_len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert_eq!(
        s.framing,
        Framing::OobRecords {
            opcode_len,
            buffers: 1
        }
    );
    assert_eq!(s.get("weights"), Some(&StampValue::Other("buffer")));
    assert_fixture_stamp(&s);
    // The same file is a container chunker's OOB check accepts.
    let layout =
        chunker::oob::check_oob(&mut std::io::Cursor::new(&bytes), bytes.len() as u64).unwrap();
    assert_eq!((layout.opcode_len, layout.buffers), (opcode_len, 1));

    let bytes = fixture("length_arena.bin");
    let s = read(&bytes);
    let opcode_len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert_eq!(
        s.framing,
        Framing::LengthArena {
            opcode_len,
            persistent_ids: 1
        }
    );
    assert_eq!(s.get("weights"), Some(&StampValue::Other("persistent id")));
    assert_fixture_stamp(&s);
}

#[test]
fn fixtures_cut_short_or_extended_are_errors() {
    for name in [
        "plain_p2.pkl",
        "plain_p5.pkl",
        "oob_records.bin",
        "length_arena.bin",
    ] {
        let bytes = fixture(name);
        let opcode_end = if name.ends_with(".pkl") {
            bytes.len()
        } else {
            8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
        };
        for cut in [0, 1, 5, 9, 10, opcode_end / 2, opcode_end - 1] {
            let e = read_stamp(&bytes[..cut], &StampLimits::default()).unwrap_err();
            assert!(
                matches!(
                    e.defect,
                    StampDefect::Truncated
                        | StampDefect::UnknownFraming { .. }
                        | StampDefect::HugeLength { .. }
                ),
                "{name} cut at {cut}: {e}"
            );
        }
    }
    let mut trailing = fixture("plain_p5.pkl");
    trailing.push(0);
    assert_eq!(
        read_stamp(&trailing[..], &StampLimits::default())
            .unwrap_err()
            .defect,
        StampDefect::TrailingData
    );
    // An arena pickle with its arena cut off.
    let bytes = fixture("length_arena.bin");
    let e = read_stamp(&bytes[..bytes.len() - 16], &StampLimits::default()).unwrap_err();
    assert!(matches!(e.defect, StampDefect::BadTail { .. }), "{e}");
    // An OOB pickle with its records cut off.
    let bytes = fixture("oob_records.bin");
    let e = read_stamp(&bytes[..bytes.len() - 24], &StampLimits::default()).unwrap_err();
    assert!(matches!(e.defect, StampDefect::BadTail { .. }), "{e}");
}

/// python3 makes pickles of many shapes (every protocol 2..=5; ints of every opcode size,
/// including past 64 bits; non-ASCII and long strings; shared and repeated values through the
/// memo; more than one SETITEMS batch; frames; nested containers; objects rebuilt by REDUCE)
/// and writes, beside each, the top-level dict's plain values as JSON. The reader must agree
/// with python on every plain value and call every other value not plain.
#[test]
fn python_pickles_agree_with_python() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import json, pickle, sys, os, collections, datetime
out = sys.argv[1]
shared = "shared-string"
base = {
    "artifact_abi": "tinygrad_single_v1_arena", "compiler_revision": "%s", "format_version": 1,
    "behavior_version": "v16", "model_type": "supercombo", "frame_skip": 20,
    "ints": 0, "neg": -1, "k": 255, "m": 65535, "j": -2**31, "big": 2**62, "bigneg": -2**63,
    "huge": 2**70, "float": 1.5, "t": True, "f": False, "n": None,
    "unicode": "vélo 🚲", "a": shared, "b": shared, "long": "x" * 70000, "bytes": b"\x00\x01",
    "nested": {"x": [1, 2, {"y": (3, 4)}], "z": {1, 2}}, "slice": slice(1, None),
    "od": collections.OrderedDict(a=1), "date": datetime.date(2026, 1, 2),
    (1928, 1208): "runner", 7: "int key",
}
for i in range(1500):
    base["key%%d" %% i] = i
deep = []
for _ in range(200):
    deep = [deep]
base["deep"] = deep
def plain(v):
    return (isinstance(v, str) and len(v.encode()) <= 4096) or v is None or isinstance(v, bool) or (isinstance(v, int) and -2**63 <= v < 2**63)
for proto in range(2, 6):
    name = os.path.join(out, "p%%d" %% proto)
    with open(name + ".pkl", "wb") as f:
        f.write(pickle.dumps(base, protocol=proto))
    with open(name + ".json", "w") as f:
        json.dump([[k, v] for k, v in base.items() if isinstance(k, str) and plain(v)], f)
        f.write("\n")
    with open(name + ".other", "w") as f:
        f.write("\n".join(k for k, v in base.items() if isinstance(k, str) and not plain(v)))
"#
    .replace("%s", REVISION)
    .replace("%%", "%");
    let status = match Command::new("python3")
        .arg("-c")
        .arg(&script)
        .arg(dir.path())
        .status()
    {
        Ok(s) => s,
        Err(e) => {
            test_support::skip::skipped(&format!(
                "python3 not runnable ({e}); the checked-in fixtures still ran"
            ));
            return;
        }
    };
    assert!(status.success());
    for proto in 2..=5u8 {
        let base: PathBuf = dir.path().join(format!("p{proto}"));
        let bytes = std::fs::read(base.with_extension("pkl")).unwrap();
        let s = read(&bytes);
        assert_eq!((s.framing, s.protocol), (Framing::Plain, proto));
        let want: Value =
            serde_json::from_slice(&std::fs::read(base.with_extension("json")).unwrap()).unwrap();
        let want = want.as_array().unwrap();
        for pair in want {
            let key = pair[0].as_str().unwrap();
            let got = s.get(key).unwrap_or_else(|| panic!("p{proto}: no {key}"));
            let expected = match &pair[1] {
                Value::String(v) => StampValue::Str(v.clone()),
                Value::Bool(b) => StampValue::Bool(*b),
                Value::Null => StampValue::None,
                Value::Number(n) => StampValue::Int(n.as_i64().unwrap()),
                other => panic!("unexpected {other}"),
            };
            assert_eq!(got, &expected, "p{proto}: {key}");
        }
        let others = std::fs::read_to_string(base.with_extension("other")).unwrap();
        for key in others.lines() {
            assert!(
                matches!(s.get(key), Some(StampValue::Other(_))),
                "p{proto}: {key} is {:?}",
                s.get(key)
            );
        }
        assert_eq!(s.entries.len(), want.len() + others.lines().count());
        assert_eq!(s.other_keys, 2, "p{proto}");
    }
}
