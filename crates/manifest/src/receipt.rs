//! Build receipts (docs/formats.md, "Build receipt"): `<file stem>.build.json` beside every
//! artifact a contract with [`Contract::build_receipts`] builds, in the compiler's shape:
//! `model_id`, `behavior_version`, `model_type`, `artifact_abi`, `compiler_revision`,
//! `source_sha256` (`{name: sha}`), `artifact_sha256`, `artifact_size`, `execution_device`,
//! `warp_device`, `image_history_pipeline`, `camera_resolutions`.
//!
//! A receipt ties a file to the pin that built it: the driving models and the built-in also
//! carry a stamp inside them ([`crate::stamp`]), the driver-monitoring set carries nothing else.
//! [`read_receipt`] is strict (bounded, every field present with its type, no other key);
//! [`BuildReceipt::to_json`] writes what the compiler writes (`json.dumps(indent=2)` and a
//! newline, keys in the order above). [`check_receipt`] is the decision.

use std::fmt;
use std::io::Read;

use serde::{Deserialize, Serialize};

use crate::contract::Contract;
use crate::types::GitCommit;
use chunker::Sha256Digest;

/// A receipt is a few hundred bytes; anything past this is not one.
pub const MAX_RECEIPT_BYTES: u64 = 64 * 1024;

/// The suffix replacing an artifact's extension: `x_driving_tinygrad.pkl` →
/// `x_driving_tinygrad.build.json`.
pub const RECEIPT_SUFFIX: &str = ".build.json";

/// The receipt's file name for an artifact's (logical) file name: its extension replaced, as
/// the compiler's `with_suffix(".build.json")` does.
pub fn receipt_file_name(artifact: &str) -> String {
    let stem = match artifact.rfind('.') {
        Some(i) if i > 0 => &artifact[..i],
        _ => artifact,
    };
    format!("{stem}{RECEIPT_SUFFIX}")
}

/// One build receipt. Field order is the file's key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildReceipt {
    /// The model ID (or the DM file's stem for the DM set).
    pub model_id: String,
    /// The behaviour version (`v8` … `v16`); `null` for a file with none (the DM set).
    pub behavior_version: Option<String>,
    /// What the artifact is, as the compiler names it (`vision_policy`, ...).
    pub model_type: String,
    /// The ABI the artifact is built for; must be the contract's.
    pub artifact_abi: String,
    /// The tinygrad revision that compiled it; must be the generation's pin.
    pub compiler_revision: GitCommit,
    /// `{source file name: sha256}`, in the order the build hashed them.
    pub source_sha256: SourceDigests,
    /// SHA-256 of the artifact as written; must be the bytes that ship.
    pub artifact_sha256: Sha256Digest,
    /// Size of the artifact in bytes; must be the bytes that ship.
    pub artifact_size: u64,
    /// The device the artifact runs on (`QCOM`, `AMD`).
    pub execution_device: String,
    /// The device the camera warp runs on.
    pub warp_device: String,
    /// Which image-history pipeline the artifact was built with (`policy`, ...).
    pub image_history_pipeline: String,
    /// The camera resolutions `[width, height]` it was compiled for.
    pub camera_resolutions: Vec<[u32; 2]>,
}

/// `source_sha256`: an ordered `{name: sha}` object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceDigests(pub Vec<(String, Sha256Digest)>);

impl Serialize for SourceDigests {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for SourceDigests {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = SourceDigests;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of source file name to sha256")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Self::Value, A::Error> {
                let mut v: Vec<(String, Sha256Digest)> = Vec::new();
                while let Some((k, sha)) = a.next_entry::<String, Sha256Digest>()? {
                    if v.iter().any(|(n, _)| *n == k) {
                        return Err(serde::de::Error::custom(format!(
                            "source {k:?} is listed twice"
                        )));
                    }
                    v.push((k, sha));
                }
                Ok(SourceDigests(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// Why a receipt could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptReadError {
    /// Reading the receipt failed.
    #[error("could not read the build receipt: {0}")]
    Io(std::io::Error),
    /// The receipt is over the size cap.
    #[error("more than {limit} bytes: not a build receipt")]
    TooLarge {
        /// The cap, in bytes ([`MAX_RECEIPT_BYTES`]).
        limit: u64,
    },
    /// Not JSON, a field missing or of the wrong type, or an unknown key; serde_json's message.
    #[error("not a build receipt: {0}")]
    Invalid(String),
}

/// Read a receipt: at most [`MAX_RECEIPT_BYTES`], every field with its type, no other key.
pub fn read_receipt(input: impl Read) -> Result<BuildReceipt, ReceiptReadError> {
    let limit = MAX_RECEIPT_BYTES;
    match chunker::bounded::read_up_to(input, limit).map_err(ReceiptReadError::Io)? {
        Some(bytes) => parse_receipt(&bytes),
        None => Err(ReceiptReadError::TooLarge { limit }),
    }
}

/// Parse a receipt from bytes (no size cap): every field with its type, no other key.
pub fn parse_receipt(bytes: &[u8]) -> Result<BuildReceipt, ReceiptReadError> {
    serde_json::from_slice(bytes).map_err(|e| ReceiptReadError::Invalid(e.to_string()))
}

impl BuildReceipt {
    /// The file as the compiler writes it: `json.dumps(receipt, indent=2) + "\n"` (the same
    /// bytes for the ASCII a receipt holds; non-ASCII would be written raw).
    pub fn to_json(&self) -> String {
        crate::json::to_canonical_string(self)
    }
}

/// A receipt that does not tie its file to this pin and these bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{file}: its build receipt's {field} is {found}, but this generation and file need \
     {expected}; rebuild it with the pinned tinygrad (its receipt is written beside it)"
)]
pub struct ReceiptRefusal {
    /// The artifact's file name.
    pub file: String,
    /// The receipt field that disagrees.
    pub field: &'static str,
    /// What the contract, pin or bytes need.
    pub expected: String,
    /// What the receipt says.
    pub found: String,
}

/// The decision: `receipt` (of `file`) against the contract's ABI, the pin, and the bytes that
/// ship (`digest`, `size`). A contract without build receipts accepts anything.
pub fn check_receipt(
    file: &str,
    receipt: &BuildReceipt,
    contract: &Contract,
    pin: &GitCommit,
    digest: &Sha256Digest,
    size: u64,
) -> Result<(), ReceiptRefusal> {
    if !contract.build_receipts {
        return Ok(());
    }
    let refuse = |field, expected: String, found: String| {
        Err(ReceiptRefusal {
            file: file.to_string(),
            field,
            expected,
            found,
        })
    };
    if let Some(abi) = contract.artifact_abi
        && receipt.artifact_abi != abi
    {
        return refuse("artifact_abi", abi.into(), receipt.artifact_abi.clone());
    }
    if &receipt.compiler_revision != pin {
        return refuse(
            "compiler_revision",
            pin.to_string(),
            receipt.compiler_revision.to_string(),
        );
    }
    if &receipt.artifact_sha256 != digest {
        return refuse(
            "artifact_sha256",
            digest.to_string(),
            receipt.artifact_sha256.to_string(),
        );
    }
    if receipt.artifact_size != size {
        return refuse(
            "artifact_size",
            size.to_string(),
            receipt.artifact_size.to_string(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::ContractName;

    const REV: &str = "9d0446a4ba8a532c8b674fb6ad795af015cd9dcf";

    fn sha(c: char) -> Sha256Digest {
        c.to_string().repeat(64).parse().unwrap()
    }

    fn receipt() -> BuildReceipt {
        BuildReceipt {
            model_id: "sc2".into(),
            behavior_version: Some("v12".into()),
            model_type: "vision_policy".into(),
            artifact_abi: "tinygrad_single_v1_arena".into(),
            compiler_revision: REV.parse().unwrap(),
            source_sha256: SourceDigests(vec![
                ("sc2_driving_vision.onnx".into(), sha('a')),
                ("sc2_driving_policy.onnx".into(), sha('b')),
            ]),
            artifact_sha256: sha('c'),
            artifact_size: 123_456,
            execution_device: "QCOM".into(),
            warp_device: "QCOM".into(),
            image_history_pipeline: "policy".into(),
            camera_resolutions: vec![[1928, 1208], [1344, 760]],
        }
    }

    #[test]
    fn names() {
        assert_eq!(
            receipt_file_name("sc2_driving_tinygrad.pkl"),
            "sc2_driving_tinygrad.build.json"
        );
        assert_eq!(
            receipt_file_name("sc2_driving_amd_tinygrad.pkl"),
            "sc2_driving_amd_tinygrad.build.json"
        );
        assert_eq!(
            receipt_file_name("dm_warp_1344x760_tinygrad.pkl"),
            "dm_warp_1344x760_tinygrad.build.json"
        );
    }

    #[test]
    fn written_as_python_writes_and_read_back() {
        let r = receipt();
        let text = r.to_json();
        assert_eq!(read_receipt(text.as_bytes()).unwrap(), r);
        // The key order is the compiler's.
        let keys: Vec<String> =
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&text)
                .unwrap()
                .keys()
                .cloned()
                .collect();
        assert_eq!(keys.first().map(String::as_str), Some("model_id"));
        // python3's json.dumps(indent=2) of the same document gives the same bytes.
        let out = std::process::Command::new("python3")
            .arg("-c")
            .arg("import json,sys; d=json.load(sys.stdin); sys.stdout.write(json.dumps(d, indent=2) + '\\n')")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn();
        let Ok(mut child) = out else {
            test_support::skip::skipped("python3 not runnable: receipt bytes not compared");
            return;
        };
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8(out.stdout).unwrap(), text);
    }

    #[test]
    fn strict_reading() {
        let good: serde_json::Value = serde_json::from_str(&receipt().to_json()).unwrap();
        let mut unknown = good.clone();
        unknown["extra"] = 1.into();
        let mut missing = good.clone();
        missing.as_object_mut().unwrap().remove("compiler_revision");
        let mut short_rev = good.clone();
        short_rev["compiler_revision"] = "abc".into();
        let mut bad_sha = good.clone();
        bad_sha["artifact_sha256"] = "C".repeat(64).into();
        let mut negative = good.clone();
        negative["artifact_size"] = (-1).into();
        let mut twice = receipt().to_json();
        twice = twice.replace("\"sc2_driving_policy.onnx\"", "\"sc2_driving_vision.onnx\"");
        for (what, text) in [
            ("unknown", unknown.to_string()),
            ("missing", missing.to_string()),
            ("short rev", short_rev.to_string()),
            ("bad sha", bad_sha.to_string()),
            ("negative", negative.to_string()),
            ("twice", twice),
            ("not json", "{".into()),
        ] {
            assert!(
                matches!(
                    read_receipt(text.as_bytes()),
                    Err(ReceiptReadError::Invalid(_))
                ),
                "{what}"
            );
        }
        let huge = vec![b' '; MAX_RECEIPT_BYTES as usize + 1];
        assert!(matches!(
            read_receipt(&huge[..]),
            Err(ReceiptReadError::TooLarge { .. })
        ));
        // An endless input stops at the cap.
        assert!(matches!(
            read_receipt(std::io::repeat(b' ')),
            Err(ReceiptReadError::TooLarge { .. })
        ));
    }

    /// v25 (no receipts), v26, and a made-up v27 with v26's contract and its own pin.
    #[test]
    fn check_receipt_table() {
        let v25 = ContractName::V25.contract();
        let v26 = ContractName::V26.contract();
        let pin26: GitCommit = REV.parse().unwrap();
        let pin27: GitCommit = "2".repeat(40).parse().unwrap();
        let r26 = receipt();
        let mut r27 = receipt();
        r27.compiler_revision = pin27.clone();
        let mut old_abi = receipt();
        old_abi.artifact_abi = "tinygrad_single_v1".into();
        let (d, other, size) = (sha('c'), sha('e'), 123_456);
        type Case<'a> = (
            &'a str,
            &'a BuildReceipt,
            &'a Contract,
            &'a GitCommit,
            &'a Sha256Digest,
            u64,
            Option<&'a str>,
        );
        let cases: Vec<Case<'_>> = vec![
            ("v25: anything", &old_abi, v25, &pin27, &d, 1, None),
            ("v26", &r26, v26, &pin26, &d, size, None),
            ("v27", &r27, v26, &pin27, &d, size, None),
            (
                "v26 receipt in v27",
                &r26,
                v26,
                &pin27,
                &d,
                size,
                Some("compiler_revision"),
            ),
            (
                "v27 receipt in v26",
                &r27,
                v26,
                &pin26,
                &d,
                size,
                Some("compiler_revision"),
            ),
            ("abi", &old_abi, v26, &pin26, &d, size, Some("artifact_abi")),
            (
                "another digest",
                &r26,
                v26,
                &pin26,
                &other,
                size,
                Some("artifact_sha256"),
            ),
            (
                "another size",
                &r26,
                v26,
                &pin26,
                &d,
                size + 1,
                Some("artifact_size"),
            ),
        ];
        for (what, r, c, pin, digest, size, want) in cases {
            let got = check_receipt("f.pkl", r, c, pin, digest, size);
            match want {
                None => assert_eq!(got, Ok(()), "{what}"),
                Some(field) => {
                    let e = got.unwrap_err();
                    assert_eq!(e.field, field, "{what}");
                    let msg = e.to_string();
                    assert!(
                        msg.contains("f.pkl")
                            && msg.contains(&e.expected)
                            && msg.contains(&e.found),
                        "{msg}"
                    );
                }
            }
        }
    }
}
