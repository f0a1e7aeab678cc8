//! The refusal and problem values [`crate::Error`] carries (a leaf: it uses no other module
//! of this crate, so `error` and the modules that find these problems do not import each
//! other). Each module that finds them re-exports its own: `signing::KeyProblem`,
//! `reuse::ReuseRefusal`, `publish::StoreProblem`, `oob::NotOob`.

use chunker::{OobDefect, Sha256Digest};
use manifest::{GitCommit, ModelId, StorePath};

/// The accepted spellings, for refusals.
pub const ACCEPTED_STORE_FORMS: &str = "hf://buckets/NS/NAME, hf://datasets/ORG/REPO, github:PATH, file:PATH, or a plain path without a `word:` prefix";

/// Environment variable holding the passphrase of an encrypted secret key, for unattended use.
pub const PASSPHRASE_ENV: &str = "STARPILOT_SIGN_PASSPHRASE";

/// Why a key file cannot sign. `Display` is the cause and the next step; it never shows key
/// material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyProblem {
    #[error("{reason}")]
    /// The file cannot be read (missing, not a regular file, too large): the reason names it.
    File {
        /// Why, naming the file.
        reason: String,
    },
    #[error("this is a minisign public key; signing needs the secret key")]
    /// A `.pub` file was given where the secret key is needed.
    PublicKeyGiven,
    #[error("not a minisign secret key ({reason})")]
    /// Not the two-line minisign format, or not base64, or the wrong length.
    NotASecretKey {
        /// What is wrong.
        reason: String,
    },
    #[error("unsupported {field} {found} (minisign writes `Ed`, `Sc` or none, `B2`)")]
    /// A field names an algorithm minisign does not write.
    Unsupported {
        /// The field.
        field: &'static str,
        /// The value found.
        found: String,
    },
    #[error("the key is encrypted with a passphrase, and {reason}")]
    /// An encrypted key, and no passphrase could be had.
    NoPassphrase {
        /// Why (no terminal, the environment variable unset, ...).
        reason: String,
    },
    #[error("wrong passphrase: the key does not decrypt with it")]
    /// The passphrase given does not decrypt the key (its checksum fails after decryption).
    WrongPassphrase,
    #[error("cannot derive the key from the passphrase ({reason})")]
    /// The KDF refused to run (parameters out of range).
    Kdf {
        /// The KDF's error.
        reason: String,
    },
    #[error("the key is damaged ({reason})")]
    /// The key fails its checksum or its own sign-and-verify check.
    Damaged {
        /// What failed.
        reason: String,
    },
}

const MAKE_UNATTENDED: &str = "`minisign -G -W -p release.pub -s release.key`";
const MAKE_WITH_PASSPHRASE: &str = "`minisign -G -p release.pub -s release.key`";

impl cli_support::NextStep for KeyProblem {
    fn next_step(&self) -> Option<String> {
        Some(match self {
            KeyProblem::File { .. } => {
                "pass the secret key file `minisign -G` wrote (e.g. release.key)".into()
            }
            KeyProblem::PublicKeyGiven => "pass the .key file `minisign -G` wrote beside this \
                 .pub (the .pub is what devices trust)"
                .into(),
            KeyProblem::NotASecretKey { .. } => format!(
                "pass the .key file of `minisign -G`; to make one: {MAKE_WITH_PASSPHRASE}, or \
                 {MAKE_UNATTENDED} for unattended use (docs/release.md)"
            ),
            KeyProblem::Unsupported { .. } => {
                format!("make a key with minisign: {MAKE_WITH_PASSPHRASE}, or {MAKE_UNATTENDED}")
            }
            KeyProblem::NoPassphrase { .. } => format!(
                "set {} to its passphrase, or run on a terminal to type it; for unattended \
                 signing make a key without a passphrase: {MAKE_UNATTENDED}",
                PASSPHRASE_ENV
            ),
            KeyProblem::WrongPassphrase => format!(
                "check {} (or retype it); a forgotten passphrase cannot be recovered: make a new \
                 key and rotate to it (docs/release.md, \"Key rotation\")",
                PASSPHRASE_ENV
            ),
            KeyProblem::Kdf { .. } => "re-encrypt it with minisign 0.11 (`minisign -C -s \
                 release.key`) or make a new key"
                .into(),
            KeyProblem::Damaged { .. } => "restore release.key from its backup; without one, \
                 make a new key and rotate to it (docs/release.md, \"Key rotation\")"
                .into(),
        })
    }
}

/// Why a reuse was refused (`Error::ReuseRefused`); nothing was written. Each names the
/// model, store or path involved and renders the next step in `Display`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReuseRefusal {
    #[error("the source catalog has no model {source_id:?}; pass --source-id with the ID it uses")]
    /// The source catalog has no entry with this ID.
    UnknownSource {
        /// The source ID asked for.
        source_id: ModelId,
    },
    #[error("{}", differences_text(source_id, differences))]
    /// The source cannot be proven built from the same tinygrad and source-model commits.
    Incompatible {
        /// The source ID.
        source_id: ModelId,
        /// Every difference.
        differences: Vec<Difference>,
    },
    #[error(
        "the source catalog entry {source_id} has no artifact_size/artifact_sha256/artifact_chunk_count"
    )]
    /// The source entry has no artifact fields.
    NoArtifact {
        /// The source ID.
        source_id: ModelId,
    },
    #[error(
        "the source artifact of {source_id} is one plain file (artifact_chunk_count 0); reuse copies chunk sets"
    )]
    /// The source artifact is one plain file, not a chunk set.
    PlainFile {
        /// The source ID.
        source_id: ModelId,
    },
    #[error("{store} {path} is missing{}", if *whole_set { ": the source chunk set is incomplete" } else { "" })]
    /// A file of the source chunk set is not in the source store. `whole_set` when it is the
    /// `.chunkmanifest`, i.e. the set as a whole is incomplete.
    SourceFileMissing {
        /// The source store.
        store: String,
        /// The missing file's path.
        path: StorePath,
        /// Whether it is the `.chunkmanifest` (the whole set is incomplete).
        whole_set: bool,
    },
    #[error("{store} {path} says {found} chunks, the source catalog says {catalog}")]
    /// The source `.chunkmanifest` disagrees with the source catalog's chunk count.
    ChunkCountDiffers {
        /// The source store.
        store: String,
        /// The `.chunkmanifest`'s path.
        path: StorePath,
        /// The count it says.
        found: u32,
        /// The count the source catalog says.
        catalog: u32,
    },
    #[error("{store} {path} says {found}, the source catalog says {catalog}")]
    /// The source `.sha256` disagrees with the source catalog's digest.
    DigestDiffers {
        /// The source store.
        store: String,
        /// The `.sha256`'s path.
        path: StorePath,
        /// The digest it says.
        found: Sha256Digest,
        /// The digest the source catalog says.
        catalog: Sha256Digest,
    },
    #[error("the source chunks hold {total} bytes, the source catalog says {catalog}")]
    /// The source chunks add up to another size than the source catalog's.
    SizeDiffers {
        /// The chunks' total size in bytes.
        total: u64,
        /// The size the source catalog says.
        catalog: u64,
    },
    #[error("{0}")]
    /// The source bytes are not an out-of-band pickle container.
    NotOob(NotOob),
    #[error(
        "the manifest has no entry {model}; reuse does not add models (add the entry first if the release asks for it)"
    )]
    /// Our manifest has no entry for the model; reuse does not add models.
    NoManifestEntry {
        /// The model.
        model: ModelId,
    },
}

/// One way a source fails to prove compatibility.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Difference {
    /// The source catalog records no top-level `tinygrad_commit`.
    NoTinygradCommit,
    /// The source catalog's `tinygrad_commit` is not the one given.
    TinygradCommit {
        /// The source catalog's.
        recorded: GitCommit,
        /// The one given.
        given: GitCommit,
    },
    /// The source entry records no `source_commit`.
    NoSourceCommit,
    /// The source entry's `source_commit` is not the one given.
    SourceCommit {
        /// The source entry's.
        recorded: GitCommit,
        /// The one given.
        given: GitCommit,
    },
}

impl cli_support::NextStep for ReuseRefusal {
    fn next_step(&self) -> Option<String> {
        match self {
            ReuseRefusal::Incompatible { source_id, .. } => Some(format!(
                "nothing was written; rebuild {source_id} for this generation with `release-cli \
                 compile --model ID --version vN --source ONNX --out DIR` (ID: the model's ID in \
                 this generation; vN: its behaviour version; ONNX: its source model; DIR: where \
                 the chunk set goes); names and release dates do not prove compatibility"
            )),
            _ => None,
        }
    }
}

/// [`ReuseRefusal::Incompatible`]: every difference, joined by `; `.
fn differences_text(source_id: &ModelId, differences: &[Difference]) -> String {
    let one = |d: &Difference| match d {
        Difference::NoTinygradCommit => format!(
            "the source catalog records no tinygrad commit (top-level \"{}\"), so compatibility cannot be proven; rebuild instead",
            manifest::keys::TINYGRAD_COMMIT
        ),
        Difference::TinygradCommit { recorded, given } => format!(
            "tinygrad commit differs: the source catalog records {recorded}, you gave {given}"
        ),
        Difference::NoSourceCommit => format!(
            "the source catalog entry {source_id} records no source-model commit (\"{}\"), so compatibility cannot be proven; rebuild instead",
            manifest::keys::SOURCE_COMMIT
        ),
        Difference::SourceCommit { recorded, given } => format!(
            "source-model commit differs: the source catalog entry {source_id} records {recorded}, you gave {given}"
        ),
    };
    differences.iter().map(one).collect::<Vec<_>>().join("; ")
}

/// One thing wrong in the store with a model the new manifest lists and publish does not
/// upload (`Error::Incomplete`).
#[derive(Debug, thiserror::Error)]
#[error("model {model}: {}", kind_text(model, kind))]
pub struct StoreProblem {
    /// The model.
    pub model: ModelId,
    /// What is wrong.
    pub kind: StoreProblemKind,
}

/// What is wrong with a model's files in the store.
#[derive(Debug)]
pub enum StoreProblemKind {
    /// The manifest entry has no artifact fields to check the store against.
    NoArtifactFields,
    /// A plain artifact file or the `.sha256` is not in the store.
    FileMissing {
        /// The missing file.
        path: StorePath,
    },
    /// The `.chunkmanifest` is not in the store: the directory is incomplete or absent.
    ChunkManifestMissing {
        /// The `.chunkmanifest`'s path.
        path: StorePath,
    },
    /// A chunk named by the `.chunkmanifest` is not in the store.
    ChunkMissing {
        /// The missing chunk.
        path: StorePath,
    },
    /// The `.chunkmanifest` or `.sha256` cannot be read as one.
    Malformed(chunker::Error),
    /// The `.chunkmanifest` names another count than the manifest.
    ChunkCountDiffers {
        /// The `.chunkmanifest`'s path.
        path: StorePath,
        /// The count it says.
        found: u32,
        /// The manifest's `artifact_chunk_count`.
        manifest: u32,
    },
    /// The `.sha256` names another digest than the manifest.
    SidecarDiffers {
        /// The `.sha256`'s path.
        path: StorePath,
        /// The digest it says.
        found: Sha256Digest,
        /// The manifest's `artifact_sha256`.
        manifest: Sha256Digest,
    },
    /// The files add up to another size than the manifest's.
    SizeDiffers {
        /// The files' total size in bytes.
        total: u64,
        /// The manifest's `artifact_size`.
        manifest: u64,
    },
    /// The stored bytes are not an out-of-band pickle container.
    NotOob(NotOob),
    /// The stored bytes hash to another digest than the manifest's (deep check).
    Corrupt {
        /// The model's store directory.
        dir: StorePath,
        /// The digest of the stored bytes.
        found: Sha256Digest,
        /// The manifest's `artifact_sha256`.
        manifest: Sha256Digest,
    },
    /// A problem with one of the entry's `accelerator_artifacts` variants, which is neither in
    /// `--artifacts <id>/` nor complete in the store.
    Variant {
        /// The `accelerator_artifacts` key.
        variant: String,
        /// What is wrong with it.
        problem: Box<StoreProblemKind>,
    },
    /// A variant lacks its size, SHA-256 or chunk count, or its file name is not a bare name.
    VariantUnpublishable {
        /// The `accelerator_artifacts` key.
        variant: String,
        /// What it lacks.
        reason: String,
    },
}

/// [`StoreProblem`]'s message for `kind` of model `id`.
fn kind_text(id: &ModelId, kind: &StoreProblemKind) -> String {
    match kind {
        StoreProblemKind::Variant { variant, problem } => format!(
            "accelerator variant {variant:?}: {} (next: put the variant's file in --artifacts {id}/, or run `release-cli rebuild`, which rebuilds the variant or drops the block)",
            kind_text(id, problem)
        ),
        StoreProblemKind::VariantUnpublishable { variant, reason } => format!(
            "accelerator variant {variant:?}: {reason} (next: run `release-cli manifest validate --mode release`, then `release-cli rebuild`)"
        ),
        StoreProblemKind::NoArtifactFields => {
            "the manifest entry has no artifact_size/artifact_sha256/artifact_chunk_count".into()
        }
        StoreProblemKind::FileMissing { path } => format!("{path} is missing"),
        StoreProblemKind::ChunkManifestMissing { path } => format!(
            "{path} is missing (the artifact directory is incomplete or absent; put its chunk set in the artifacts directory)"
        ),
        StoreProblemKind::ChunkMissing { path } => format!("chunk {path} is missing"),
        StoreProblemKind::Malformed(e) => format!("{e}"),
        StoreProblemKind::ChunkCountDiffers {
            path,
            found,
            manifest,
        } => format!("{path} says {found} chunks, the manifest says {manifest}"),
        StoreProblemKind::SidecarDiffers {
            path,
            found,
            manifest,
        } => format!("{path} says {found}, the manifest says {manifest}"),
        StoreProblemKind::SizeDiffers { total, manifest } => {
            format!("the store holds {total} bytes, the manifest says {manifest}")
        }
        StoreProblemKind::NotOob(not_oob) => format!("{not_oob}"),
        StoreProblemKind::Corrupt {
            dir,
            found,
            manifest,
        } => format!(
            "the stored artifact's SHA-256 is {found}, the manifest says {manifest} (a chunk in {dir} is corrupt; put the model's chunk set in --artifacts {id}/ so publish replaces it)"
        ),
    }
}

/// A chunk set in a store whose bytes are not an OOB container.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", chunker::Error::NotOob { what: what.clone(), offset: *offset, defect: defect.clone() })]
pub struct NotOob {
    /// The logical artifact, as the user names it (`hf://buckets/…/x.pkl`).
    pub what: String,
    /// Byte offset of the field that is wrong.
    pub offset: u64,
    /// What is wrong there.
    pub defect: OobDefect,
}
