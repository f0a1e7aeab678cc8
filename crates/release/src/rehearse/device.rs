//! A device data directory as the previous generation's Python manager leaves it, for the
//! rehearsal (and for any test that needs an old device): the selected model downloaded as one
//! plain file with its `.sha256`, another model as legacy `.pNN` parts, a third as a native chunk
//! set, an eGPU variant and a pre-v23 split file, a `local-` model with its sidecar, the four DM
//! files, the three `.model_*.json` caches, and the persistent params (selection, Small/Big
//! profiles, catalog lists, `ModelManifestVersion`), with the names and shapes
//! `docs/device.md` ("Migration") and the previous manager use.
//!
//! Every artifact holds stand-in bytes that name their generation and model, so a file that
//! survives a migration is recognisable by its digest.

use fs_err as fs;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use chunker::Sha256Digest;
use manifest::{Generation, ModelId, NamedModel, layout};
use serde_json::{Value, json};

use crate::Result;

/// What to build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OldDeviceSpec {
    /// The generation the old manager last installed (`ModelManifestVersion`).
    pub generation: Generation,
    /// The selected model (`Model`, `DrivingModel`, the Small profile), installed as one plain
    /// file with its `.sha256`, plus a stale `.p00` part and an eGPU variant.
    pub selected: NamedModel,
    /// Other models of the old catalog: the first is installed as legacy `.pNN` parts, the second
    /// as a native chunk set; every one is listed in the caches and catalog params.
    pub others: Vec<NamedModel>,
    /// The `local-` model built on this device (kept by every migration).
    pub local: ModelId,
    /// Size of each stand-in artifact, bytes.
    pub artifact_size: usize,
}

/// The device that was built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OldDevice {
    /// The data root (`--data-dir`): `models/` and `params/d/` are below it.
    pub data: PathBuf,
    /// Every old-generation driving file written under `models/`, name → digest: after a
    /// migration none of these bytes may remain.
    pub driving: BTreeMap<String, Sha256Digest>,
    /// The files every migration keeps (the `local-` model and its sidecar, the DM files),
    /// name → digest.
    pub kept: BTreeMap<String, Sha256Digest>,
}

impl OldDevice {
    pub fn models_dir(&self) -> PathBuf {
        self.data.join("models")
    }

    pub fn params_dir(&self) -> PathBuf {
        self.data.join("params/d")
    }
}

/// Deterministic stand-in bytes for one old artifact: the text `old <gen> <what>` repeated.
pub fn stand_in(generation: Generation, what: &str, len: usize) -> Vec<u8> {
    let unit = format!("old {generation} {what}\n");
    unit.bytes().cycle().take(len.max(1)).collect()
}

/// What becomes of a file written on the old device.
#[derive(Clone, Copy)]
enum Fate {
    /// An old-generation driving file: no migration may leave these bytes.
    Driving,
    /// A file every migration keeps.
    Kept,
    /// A cache, neither.
    Cache,
}

/// Writes the old device's `models/` files, recording each driving and kept file's digest.
struct Writer<'a> {
    models: PathBuf,
    dev: &'a mut OldDevice,
}

impl Writer<'_> {
    /// Write `models/<name>`, refusing to overwrite anything.
    fn write(&mut self, name: &str, bytes: &[u8], fate: Fate) -> Result<()> {
        let path = self.models.join(name);
        if path.symlink_metadata().is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "{}: already exists; build the device in an empty directory",
                    path.display()
                ),
            )
            .into());
        }
        fs::write(&path, bytes)?;
        let digest = Sha256Digest::of_bytes(bytes);
        match fate {
            Fate::Driving => self.dev.driving.insert(name.to_string(), digest),
            Fate::Kept => self.dev.kept.insert(name.to_string(), digest),
            Fate::Cache => None,
        };
        Ok(())
    }

    /// A plain artifact `name` and its `.sha256` sidecar, both driving files.
    fn sidecar(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        self.write(
            &chunker::sidecar_name(name),
            chunker::format_sidecar(&Sha256Digest::of_bytes(bytes), name).as_bytes(),
            Fate::Driving,
        )
    }
}

fn file(id: &ModelId) -> String {
    layout::artifact_file_name(id).as_str().to_string()
}

/// Build `data/` as the previous generation's manager leaves it. `data` must not exist yet or
/// be empty: nothing already there is overwritten.
pub fn build_old_device(data: &Path, spec: &OldDeviceSpec) -> Result<OldDevice> {
    let models = data.join("models");
    let params = data.join("params/d");
    fs::create_dir_all(&models)?;
    fs::create_dir_all(&params)?;
    let mut dev = OldDevice {
        data: data.to_path_buf(),
        driving: BTreeMap::new(),
        kept: BTreeMap::new(),
    };
    let mut w = Writer {
        models,
        dev: &mut dev,
    };
    write_driving(&mut w, spec)?;
    write_kept(&mut w, spec)?;
    write_caches(&mut w, spec)?;
    write_params(&params, spec)?;
    Ok(dev)
}

/// The old generation's driving files: the selected model as one plain file and its sidecar, a
/// stale part of an older download and its eGPU variant; a pre-v23 split file; the first other
/// model as legacy parts, the second as a native chunk set.
fn write_driving(w: &mut Writer, spec: &OldDeviceSpec) -> Result<()> {
    let (g, size) = (spec.generation, spec.artifact_size);
    let sel = &spec.selected;
    let sel_bytes = stand_in(g, sel.id.as_str(), size);
    let sel_name = file(&sel.id);
    w.write(&sel_name, &sel_bytes, Fate::Driving)?;
    w.sidecar(&sel_name, &sel_bytes)?;
    w.write(
        &chunker::legacy_part_name(&sel_name, 0),
        &sel_bytes[..sel_bytes.len() / 2],
        Fate::Driving,
    )?;
    w.write(
        &format!("{}_driving_chestnut_tinygrad.pkl", sel.id),
        &stand_in(g, &format!("{} chestnut", sel.id), size / 2),
        Fate::Driving,
    )?;
    // A pre-v23 split file, which only the driving_ prefix marks.
    w.write(
        "driving_vision_tinygrad.pkl",
        &stand_in(g, "driving_vision", size / 4),
        Fate::Driving,
    )?;

    // Legacy multipart parts with their sidecar.
    if let Some(m) = spec.others.first() {
        let name = file(&m.id);
        let bytes = stand_in(g, m.id.as_str(), size);
        let part = bytes.len().div_ceil(3).max(1);
        for (i, p) in bytes.chunks(part).enumerate() {
            w.write(
                &chunker::legacy_part_name(&name, i as u32),
                p,
                Fate::Driving,
            )?;
        }
        w.sidecar(&name, &bytes)?;
    }
    // A native chunk set, chunk manifest last as the chunker writes it.
    if let Some(m) = spec.others.get(1) {
        let name = file(&m.id);
        let bytes = stand_in(g, m.id.as_str(), size);
        let part = bytes.len().div_ceil(2).max(1);
        let count = bytes.chunks(part).count() as u32;
        for (i, p) in bytes.chunks(part).enumerate() {
            let chunk = chunker::chunk_name(&name, i as u32 + 1, count);
            w.write(&chunk, p, Fate::Driving)?;
        }
        w.write(
            &chunker::chunk_manifest_name(&name),
            chunker::format_chunk_manifest(count).as_bytes(),
            Fate::Driving,
        )?;
    }
    Ok(())
}

/// A model built on this device and its sidecar, and the DM set: both stay.
fn write_kept(w: &mut Writer, spec: &OldDeviceSpec) -> Result<()> {
    let (g, size) = (spec.generation, spec.artifact_size);
    let local = stand_in(g, spec.local.as_str(), size / 2);
    w.write(&file(&spec.local), &local, Fate::Kept)?;
    let sidecar = json!({"name": "Rehearsal Local", "version": "v11", "uses_external_gpu": false});
    let sidecar_name = format!("{}.json", spec.local);
    w.write(&sidecar_name, sidecar.to_string().as_bytes(), Fate::Kept)?;
    for dm in layout::DM_FILES {
        w.write(dm, &stand_in(g, dm, size / 8), Fate::Kept)?;
    }
    Ok(())
}

/// The old catalog in order: the selected model, then the others.
fn catalog(spec: &OldDeviceSpec) -> Vec<&NamedModel> {
    std::iter::once(&spec.selected)
        .chain(spec.others.iter())
        .collect()
}

/// The three caches, in the shapes the previous manager writes them.
fn write_caches(w: &mut Writer, spec: &OldDeviceSpec) -> Result<()> {
    let g = spec.generation;
    let mut versions = serde_json::Map::new();
    let mut artifacts = serde_json::Map::new();
    let mut urls = serde_json::Map::new();
    for m in catalog(spec) {
        let bytes = stand_in(g, m.id.as_str(), spec.artifact_size);
        versions.insert(m.id.to_string(), json!(m.version));
        artifacts.insert(
            m.id.to_string(),
            json!({
                "artifact_format": "tinygrad_single_v1",
                "artifact_filename": "",
                "artifact_size": bytes.len(),
                "artifact_sha256": Sha256Digest::of_bytes(&bytes).to_hex(),
                "artifact_chunk_count": 1,
                "artifact_url": "",
                "uses_external_gpu": false,
                "model_size": "small",
                "model_size_declared": false,
                "model_lab_eligible": true,
                "accelerator_artifacts": {},
            }),
        );
        let name = file(&m.id);
        urls.insert(
            m.id.to_string(),
            json!({ name.clone(): format!(
                "https://huggingface.co/buckets/{}/resolve/models/{g}/{}/{name}",
                layout::HF_BUCKET, m.id
            )}),
        );
    }
    for (cache, body) in [
        (".model_versions.json", Value::Object(versions)),
        (".model_artifacts.json", Value::Object(artifacts)),
        (".model_artifact_urls.json", Value::Object(urls)),
    ] {
        w.write(cache, body.to_string().as_bytes(), Fate::Cache)?;
    }
    Ok(())
}

/// Params as the previous manager left them.
fn write_params(params: &Path, spec: &OldDeviceSpec) -> Result<()> {
    let catalog = catalog(spec);
    let sel = &spec.selected;
    // The catalog lists, comma-joined in catalog order, local models appended.
    let list = |f: &dyn Fn(&NamedModel) -> String, local: &str| {
        catalog
            .iter()
            .map(|m| f(m))
            .chain(std::iter::once(local.to_string()))
            .collect::<Vec<_>>()
            .join(",")
    };
    let version = sel.version.clone();
    let available = list(&|m| m.id.to_string(), spec.local.as_str());
    let names = list(&|m| m.name.replace(',', " "), "Rehearsal Local");
    let versions = list(&|m| m.version.clone(), "v11");
    let generation = spec.generation.to_string();
    for (key, value) in [
        ("Model", sel.id.as_str()),
        ("DrivingModel", sel.id.as_str()),
        ("DrivingModelName", sel.name.as_str()),
        ("ModelVersion", version.as_str()),
        ("DrivingModelVersion", version.as_str()),
        ("ActiveSmallModel", sel.id.as_str()),
        ("ActiveSmallModelName", sel.name.as_str()),
        ("ActiveSmallModelVersion", version.as_str()),
        ("ActiveBigModel", "none"),
        ("AvailableModels", available.as_str()),
        ("AvailableModelNames", names.as_str()),
        ("ModelVersions", versions.as_str()),
        ("ModelManifestVersion", generation.as_str()),
    ] {
        fs::write(params.join(key), value.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: &str, v: u32) -> NamedModel {
        NamedModel {
            id: id.parse().unwrap(),
            name: format!("Model {id}"),
            version: manifest::BehaviorVersion::new(v).to_string(),
        }
    }

    #[test]
    fn the_old_device_has_every_form_the_previous_manager_leaves() {
        let t = tempfile::tempdir().unwrap();
        let spec = OldDeviceSpec {
            generation: Generation::new(24),
            selected: m("pop223", 11),
            others: vec![m("tr14223", 12), m("sc23", 16)],
            local: "local-mine".parse().unwrap(),
            artifact_size: 3000,
        };
        let dev = build_old_device(&t.path().join("data"), &spec).unwrap();
        let names: Vec<&str> = dev.driving.keys().map(String::as_str).collect();
        for want in [
            "pop223_driving_tinygrad.pkl",
            "pop223_driving_tinygrad.pkl.sha256",
            "pop223_driving_tinygrad.pkl.p00",
            "pop223_driving_chestnut_tinygrad.pkl",
            "driving_vision_tinygrad.pkl",
            "tr14223_driving_tinygrad.pkl.p02",
            "sc23_driving_tinygrad.pkl.chunk02of02",
            "sc23_driving_tinygrad.pkl.chunkmanifest",
        ] {
            assert!(names.contains(&want), "{want} not in {names:?}");
        }
        assert!(dev.kept.contains_key("local-mine_driving_tinygrad.pkl"));
        assert!(dev.kept.contains_key("local-mine.json"));
        for dm in layout::DM_FILES {
            assert!(dev.kept.contains_key(dm), "{dm}");
        }
        let p = |k: &str| fs::read_to_string(dev.params_dir().join(k)).unwrap();
        assert_eq!(p("ModelManifestVersion"), "v24");
        assert_eq!(p("ActiveSmallModel"), "pop223");
        assert_eq!(p("AvailableModels"), "pop223,tr14223,sc23,local-mine");
        let caches: Value = serde_json::from_slice(
            &fs::read(dev.models_dir().join(".model_versions.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(caches["tr14223"], "v12");
        // Every recorded digest is the file's.
        for (name, d) in dev.driving.iter().chain(dev.kept.iter()) {
            let (got, _) = Sha256Digest::of_file(&dev.models_dir().join(name)).unwrap();
            assert_eq!(&got, d, "{name}");
        }
        // Building over an existing device is refused, nothing overwritten.
        let before = fs::read(dev.models_dir().join("pop223_driving_tinygrad.pkl")).unwrap();
        let e = build_old_device(&dev.data, &spec).unwrap_err();
        assert!(e.to_string().contains("already exists"), "{e}");
        assert_eq!(
            fs::read(dev.models_dir().join("pop223_driving_tinygrad.pkl")).unwrap(),
            before
        );
    }
}
