//! Published StarPilot trees for device tests: a model's artifact written in both store layouts
//! (Hugging Face `hf/models/<gen>/<id>/…`, GitHub `gh/<gen>/<id>/…`) under one root that a
//! [`crate::http_server::FaultServer`] serves, plus the manifest in both places.
//!
//! Written from the format description (docs/formats.md, "Chunk sets", "The manifest" and
//! "Store layout") with plain file operations, not
//! with the crates under test, so the tests check those crates against the format itself.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// URL prefix under the server root for the Hugging Face layout.
pub const HF_DIR: &str = "hf";
/// URL prefix under the server root for the GitHub layout.
pub const GH_DIR: &str = "gh";

/// What was published for one model.
#[derive(Debug, Clone)]
pub struct PublishedModel {
    pub id: String,
    pub name: String,
    pub size: u64,
    pub sha256: String,
    /// 0 = plain file.
    pub chunk_count: u32,
    pub chunk_sha256: Vec<String>,
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// A deterministic artifact of exactly `len` bytes (at least 11), different for each `seed`,
/// shaped as every v25 driving artifact is (`docs/formats.md`, "Artifact payload"): an
/// out-of-band pickle container, i.e. an 8-byte little-endian opcode length, a protocol-5
/// opcode stream ending in `STOP`, then records of (8-byte length, buffer bytes) tiling the rest.
/// The buffers are incompressible-looking (xorshift) bytes.
pub fn artifact_bytes(seed: u64, len: usize) -> Vec<u8> {
    oob_container(&random_bytes(seed, len), 700)
}

/// Frame `payload.len()` bytes as an OOB container of exactly that length (at least 11): the
/// opcode stream and buffers take their bytes from `payload`; buffers hold at most `max_buffer`
/// bytes each.
pub fn oob_container(payload: &[u8], max_buffer: usize) -> Vec<u8> {
    let size = payload.len();
    assert!(
        size >= 11,
        "an OOB container has at least 11 bytes, not {size}"
    );
    // Room for at least one record after a 9-byte opcode stream, or the opcodes take it all.
    let opcodes = if size >= 25 { 9 } else { size - 8 };
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(opcodes as i64).to_le_bytes());
    out.extend_from_slice(&[0x80, 0x05]);
    out.extend_from_slice(&payload[..opcodes - 3]);
    out.push(b'.');
    while out.len() < size {
        let left = size - out.len();
        let mut n = (left - 8).min(max_buffer.max(1));
        if (1..8).contains(&(left - 8 - n)) {
            n = left - 8;
        }
        out.extend_from_slice(&(n as i64).to_le_bytes());
        let at = out.len();
        out.extend_from_slice(&payload[at..at + n]);
    }
    out
}

/// Deterministic, incompressible-looking bytes (xorshift), different for each `seed`: not an
/// OOB container (what a plain pickle or a wrong file looks like to the OOB check).
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// `hf/models/<gen>/<id>` and `gh/<gen>/<id>` under `root`.
pub fn artifact_dirs(root: &Path, generation: &str, id: &str) -> [PathBuf; 2] {
    [
        root.join(HF_DIR).join("models").join(generation).join(id),
        root.join(GH_DIR).join(generation).join(id),
    ]
}

/// Publish `data` as model `id` in both layouts: a chunk set of `chunk_size`-byte chunks
/// (`.chunkNNofMM`, then `.chunkmanifest` with no newline, plus `.sha256`), or a plain file when
/// `chunk_size` is `None`.
pub fn publish_model(
    root: &Path,
    generation: &str,
    id: &str,
    data: &[u8],
    chunk_size: Option<usize>,
) -> PublishedModel {
    let name = format!("{id}_driving_tinygrad.pkl");
    let sha = sha256_hex(data);
    let mut chunk_sha256 = Vec::new();
    let mut count = 0u32;
    for dir in artifact_dirs(root, generation, id) {
        fs::create_dir_all(&dir).unwrap();
        match chunk_size {
            None => fs::write(dir.join(&name), data).unwrap(),
            Some(size) => {
                let chunks: Vec<&[u8]> = data.chunks(size).collect();
                count = chunks.len() as u32;
                chunk_sha256.clear();
                for (i, c) in chunks.iter().enumerate() {
                    let file = format!("{name}.chunk{:02}of{:02}", i + 1, count);
                    fs::write(dir.join(file), c).unwrap();
                    chunk_sha256.push(sha256_hex(c));
                }
                fs::write(dir.join(format!("{name}.chunkmanifest")), count.to_string()).unwrap();
                fs::write(
                    dir.join(format!("{name}.sha256")),
                    format!("{sha}  {name}\n"),
                )
                .unwrap();
            }
        }
    }
    PublishedModel {
        id: id.to_string(),
        name: format!("Model {id}"),
        size: data.len() as u64,
        sha256: sha,
        chunk_count: count,
        chunk_sha256,
    }
}

/// The manifest for `models`, as the release tools write it (object form, `generation` key).
/// With `chunk_digests`, entries carry the `artifact_chunk_sha256` extension.
pub fn manifest_json(generation: &str, models: &[PublishedModel], chunk_digests: bool) -> String {
    let mut s = format!("{{\n  \"generation\": \"{generation}\",\n  \"models\": [");
    for (i, m) in models.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(
            s,
            "\n    {{\n      \"id\": \"{}\",\n      \"name\": \"{}\",\n      \"version\": \"v16\",\n      \"series\": \"Test Series\",\n      \"released\": \"2025-01-01\",\n      \"community_favorite\": false,\n      \"artifact_format\": \"tinygrad_single_v1\",\n      \"artifact_size\": {},\n      \"artifact_sha256\": \"{}\",\n      \"artifact_chunk_count\": {},\n      \"uses_external_gpu\": false",
            m.id, m.name, m.size, m.sha256, m.chunk_count
        );
        if chunk_digests && m.chunk_count > 0 {
            let list: Vec<String> = m.chunk_sha256.iter().map(|d| format!("\"{d}\"")).collect();
            let _ = write!(
                s,
                ",\n      \"artifact_chunk_sha256\": [{}]",
                list.join(", ")
            );
        }
        s.push_str("\n    }");
    }
    s.push_str("\n  ]\n}\n");
    s
}

/// Write a manifest body to both layouts' manifest paths.
pub fn write_manifest(root: &Path, generation: &str, body: &[u8]) {
    let file = format!("model_names_{generation}.json");
    let hf = root.join(HF_DIR).join("manifests");
    fs::create_dir_all(&hf).unwrap();
    fs::write(hf.join(&file), body).unwrap();
    let gh = root.join(GH_DIR);
    fs::create_dir_all(&gh).unwrap();
    fs::write(gh.join(&file), body).unwrap();
}

/// Write a manifest body to one layout only (`HF_DIR` or `GH_DIR`).
pub fn write_manifest_at(root: &Path, layout_dir: &str, generation: &str, body: &[u8]) {
    let file = format!("model_names_{generation}.json");
    let dir = if layout_dir == HF_DIR {
        root.join(HF_DIR).join("manifests")
    } else {
        root.join(GH_DIR)
    };
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(file), body).unwrap();
}
