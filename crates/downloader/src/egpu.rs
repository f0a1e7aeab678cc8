//! The external GPU (Chestnut, an AMD GPU over USB) and what it changes about downloads.
//!
//! Detection follows upstream's ready-check: a device under `<sysfs>/bus/usb/devices/*` whose
//! `idVendor` is `add1` (or `3801`) and whose `idProduct` is `0001` is a Chestnut; it is
//! *ready* when its `product` string is exactly `custom ed4e39b7-CLEAN` (the firmware it needs).
//! Everything that decides is a pure function over typed values; [`detect_chestnut`] only reads
//! the files, under a root the caller chooses (`/sys` on a device, a directory in tests).
//!
//! The rules, as upstream applies them:
//! - a single download of a model with `uses_external_gpu` is refused without a ready Chestnut,
//!   unless the user set `AllowGpuModelDownloadWithoutGpu` for that request
//!   ([`single_download`]);
//! - "download all", a refresh and a migration fetch GPU models only with a ready Chestnut
//!   ([`unrequested_download`]; the override is for one named request only);
//! - with a ready Chestnut, an entry's `accelerator_artifacts.chestnut` variant (an AMD build)
//!   is fetched too, installed as `<id>_driving_chestnut_tinygrad.pkl` ([`artifacts_to_fetch`]).

use fs_err as fs;
use std::path::Path;

use manifest::{FileName, ModelEntry};

use crate::download::Target;
use crate::error::{Error, Result};

/// USB vendor ids a Chestnut reports (lowercase hex, as sysfs writes them).
pub const CHESTNUT_VENDORS: [&str; 2] = ["add1", "3801"];
/// The USB product id a Chestnut reports.
pub const CHESTNUT_PRODUCT: &str = "0001";
/// The `product` string of a Chestnut whose firmware is ready.
pub const CHESTNUT_READY_PRODUCT: &str = "custom ed4e39b7-CLEAN";
/// Upstream's progress text for a refused GPU-only download.
pub const EXTERNAL_GPU_REQUIRED: &str = "External GPU required...";

/// What is plugged in, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Chestnut {
    /// No Chestnut is plugged in.
    Absent,
    /// A Chestnut without the firmware it needs: upstream treats it as absent for models.
    Present,
    /// A Chestnut with the firmware it needs: accelerator variants may be used.
    Ready,
}

impl Chestnut {
    /// Whether a Chestnut variant can run.
    pub fn is_ready(self) -> bool {
        self == Self::Ready
    }
}

/// The three sysfs attributes of one USB device (`None` when the file is missing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsbDevice {
    /// `idVendor`.
    pub id_vendor: Option<String>,
    /// `idProduct`.
    pub id_product: Option<String>,
    /// `product`.
    pub product: Option<String>,
}

/// What one USB device is. Pure.
pub fn classify(dev: &UsbDevice) -> Chestnut {
    let norm = |s: &Option<String>| s.as_deref().map(|v| v.trim().to_ascii_lowercase());
    let vendor = norm(&dev.id_vendor);
    let product_id = norm(&dev.id_product);
    let is_chestnut = vendor.is_some_and(|v| CHESTNUT_VENDORS.contains(&v.as_str()))
        && product_id.as_deref() == Some(CHESTNUT_PRODUCT);
    if !is_chestnut {
        Chestnut::Absent
    } else if dev.product.as_deref().map(str::trim) == Some(CHESTNUT_READY_PRODUCT) {
        Chestnut::Ready
    } else {
        Chestnut::Present
    }
}

/// The best Chestnut state among `<sysfs_root>/bus/usb/devices/*`. Unreadable entries count
/// as absent; each attribute is read with a small cap.
pub fn detect_chestnut(sysfs_root: &Path) -> Chestnut {
    let dir = sysfs_root.join("bus/usb/devices");
    let Ok(entries) = fs::read_dir(&dir) else {
        return Chestnut::Absent;
    };
    // A sysfs attribute's size is a page whatever it holds; the cap is that page.
    let read = |p: &Path| -> Option<String> {
        let bytes = chunker::bounded::read_capped(p, 4096).ok()??;
        String::from_utf8(bytes).ok()
    };
    entries
        .flatten()
        .map(|e| {
            let p = e.path();
            classify(&UsbDevice {
                id_vendor: read(&p.join("idVendor")),
                id_product: read(&p.join("idProduct")),
                product: read(&p.join("product")),
            })
        })
        .max()
        .unwrap_or(Chestnut::Absent)
}

/// Whether a single download of a model may go ahead. `Err` carries upstream's text. Pure.
pub fn single_download(
    uses_external_gpu: bool,
    chestnut: Chestnut,
    allow_without_gpu: bool,
) -> std::result::Result<(), &'static str> {
    if uses_external_gpu && !chestnut.is_ready() && !allow_without_gpu {
        Err(EXTERNAL_GPU_REQUIRED)
    } else {
        Ok(())
    }
}

/// Whether the manager may fetch a model nobody asked for by name: a refresh's selection and
/// profile models, a migration keeping them, "download all". A GPU-only model needs a ready
/// Chestnut; the one-request override (`AllowGpuModelDownloadWithoutGpu`) never applies here.
/// Pure.
pub fn unrequested_download(uses_external_gpu: bool, chestnut: Chestnut) -> bool {
    !uses_external_gpu || chestnut.is_ready()
}

impl Target {
    /// The entry's accelerator variant as a device of `contract` fetches it (the contract's
    /// [`manifest::contract::AcceleratorRule`]: v25 `chestnut`, v26 `amd`): it must declare the
    /// rule's execution device and a format the contract loads; installed as the contract's
    /// accelerator file name (`<id>_driving_<infix>_tinygrad.pkl`). `Ok(None)` when the entry
    /// has no such variant.
    pub fn accelerator_variant(
        entry: &ModelEntry,
        contract: &manifest::Contract,
    ) -> Result<Option<Self>> {
        let rule = &contract.accelerator;
        let Some((_, v)) = entry
            .accelerators()
            .into_iter()
            .find(|(name, _)| name == rule.key)
        else {
            return Ok(None);
        };
        let bad = |reason: String| Error::NotDownloadable {
            model: entry.id().to_string(),
            reason,
        };
        if v.execution_device.as_deref() != Some(rule.execution_device) {
            return Err(bad(format!(
                "its {} variant's execution_device is {}, not {:?}",
                rule.key,
                v.execution_device
                    .as_deref()
                    .map_or_else(|| "missing".to_string(), |d| format!("{d:?}")),
                rule.execution_device,
            )));
        }
        // A whole-manifest contract loads its one format; v25 any format it knows.
        let loads = |f: &manifest::ArtifactFormat| match contract.whole_manifest_refusal {
            true => f.as_str() == contract.artifact_format,
            false => f.is_supported(),
        };
        if v.format.as_ref().is_some_and(|f| !loads(f)) {
            return Err(bad(format!(
                "its {} variant has an unsupported artifact_format",
                rule.key
            )));
        }
        let local_name: FileName = contract
            .accelerator_file_name(entry.id())
            .parse()
            .expect("a model ID makes a valid file name");
        Ok(Some(Self {
            id: entry.id().clone(),
            remote_name: v.filename.unwrap_or_else(|| local_name.clone()),
            local_name,
            size: v.size.map(|s| s.get()),
            sha256: v.sha256,
            chunk_count: v.chunk_count.map(|c| c.get()),
            chunk_sha256: None,
        }))
    }
}

/// What a device of `contract` fetches for one model: its artifact in the contract's format,
/// then with a ready external GPU the contract's accelerator variant
/// ([`Target::accelerator_variant`]) when it has one. A malformed variant is left out, never the
/// model.
pub fn artifacts_to_fetch(
    entry: &ModelEntry,
    chestnut: Chestnut,
    contract: &manifest::Contract,
) -> Result<Vec<Target>> {
    let mut out = vec![Target::from_entry_for(entry, contract)?];
    if chestnut.is_ready()
        && let Ok(Some(variant)) = Target::accelerator_variant(entry, contract)
    {
        out.push(variant);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dev(v: &str, p: &str, product: Option<&str>) -> UsbDevice {
        UsbDevice {
            id_vendor: Some(format!("{v}\n")),
            id_product: Some(format!("{p}\n")),
            product: product.map(|s| format!("{s}\n")),
        }
    }

    #[test]
    fn classification_table() {
        let ready = Some(CHESTNUT_READY_PRODUCT);
        let table = [
            (dev("add1", "0001", ready), Chestnut::Ready),
            (dev("ADD1", "0001", ready), Chestnut::Ready),
            (dev("3801", "0001", ready), Chestnut::Ready),
            (
                dev("add1", "0001", Some("custom ed4e39b7")),
                Chestnut::Present,
            ),
            (
                dev("add1", "0001", Some("custom ed4e39b7-clean")),
                Chestnut::Present,
            ),
            (dev("add1", "0001", None), Chestnut::Present),
            (dev("add1", "0002", ready), Chestnut::Absent),
            (dev("174c", "2464", ready), Chestnut::Absent),
            (dev("174c", "2463", None), Chestnut::Absent),
            (UsbDevice::default(), Chestnut::Absent),
        ];
        for (d, want) in table {
            assert_eq!(classify(&d), want, "{d:?}");
        }
    }

    #[test]
    fn download_rules_table() {
        use Chestnut::*;
        // (gpu model, chestnut, override) -> single allowed, in download-all
        let table = [
            (false, Absent, false, true, true),
            (false, Ready, false, true, true),
            (true, Absent, false, false, false),
            (true, Present, false, false, false),
            (true, Absent, true, true, false),
            (true, Ready, false, true, true),
        ];
        for (gpu, c, allow, single, all) in table {
            assert_eq!(
                single_download(gpu, c, allow).is_ok(),
                single,
                "{gpu} {c:?} {allow}"
            );
            assert_eq!(unrequested_download(gpu, c), all, "{gpu} {c:?}");
        }
        assert_eq!(
            single_download(true, Absent, false),
            Err("External GPU required...")
        );
    }

    fn entry(v: serde_json::Value) -> ModelEntry {
        ModelEntry::from_map(v.as_object().unwrap().clone()).unwrap()
    }

    #[test]
    fn chestnut_variants_are_fetched_only_with_a_ready_chestnut() {
        let base = manifest::contract::BASE_CONTRACT.contract();
        let e = entry(
            json!({"id": "gwm8223", "accelerator_artifacts": {"chestnut": {
            "artifact_format": "tinygrad_single_v1",
            "artifact_filename": "gwm8223_amd.pkl",
            "artifact_size": 7, "artifact_sha256": "5".repeat(64),
            "artifact_chunk_count": 0, "execution_device": "AMD"}}}),
        );
        let names = |c| -> Vec<(String, String)> {
            artifacts_to_fetch(&e, c, base)
                .unwrap()
                .into_iter()
                .map(|t| (t.remote_name.to_string(), t.local_name.to_string()))
                .collect()
        };
        assert_eq!(
            names(Chestnut::Absent),
            [(
                "gwm8223_driving_tinygrad.pkl".into(),
                "gwm8223_driving_tinygrad.pkl".into()
            )]
        );
        assert_eq!(names(Chestnut::Present).len(), 1);
        assert_eq!(
            names(Chestnut::Ready)[1],
            (
                "gwm8223_amd.pkl".into(),
                "gwm8223_driving_chestnut_tinygrad.pkl".into()
            )
        );
        let v = Target::accelerator_variant(&e, base).unwrap().unwrap();
        assert_eq!(v.size, Some(7));
        assert_eq!(v.chunk_count, Some(0));

        // Not AMD, or no variant: the model alone.
        let cpu = entry(json!({"id": "x1", "accelerator_artifacts": {"chestnut": {
            "execution_device": "QCOM"}}}));
        assert!(Target::accelerator_variant(&cpu, base).is_err());
        assert_eq!(
            artifacts_to_fetch(&cpu, Chestnut::Ready, base)
                .unwrap()
                .len(),
            1
        );
        let plain = entry(json!({"id": "x2"}));
        assert!(Target::accelerator_variant(&plain, base).unwrap().is_none());
        // Without a filename the remote name is the local one.
        let bare = entry(json!({"id": "x3", "accelerator_artifacts": {"chestnut": {
            "execution_device": "AMD"}}}));
        assert_eq!(
            Target::accelerator_variant(&bare, base)
                .unwrap()
                .unwrap()
                .remote_name
                .as_str(),
            "x3_driving_chestnut_tinygrad.pkl"
        );
    }

    #[test]
    fn detection_reads_a_sysfs_tree() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(detect_chestnut(root.path()), Chestnut::Absent);
        let usb = root.path().join("bus/usb/devices");
        let put = |name: &str, v: &str, p: &str, product: Option<&str>| {
            let d = usb.join(name);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("idVendor"), format!("{v}\n")).unwrap();
            fs::write(d.join("idProduct"), format!("{p}\n")).unwrap();
            if let Some(s) = product {
                fs::write(d.join("product"), format!("{s}\n")).unwrap();
            }
        };
        put("usb1", "1d6b", "0002", Some("xHCI Host Controller"));
        fs::create_dir_all(usb.join("1-0:1.0")).unwrap(); // an interface: no attributes
        assert_eq!(detect_chestnut(root.path()), Chestnut::Absent);
        put("1-1", "add1", "0001", Some("custom ed4e39b7"));
        assert_eq!(detect_chestnut(root.path()), Chestnut::Present);
        put("2-1", "add1", "0001", Some(CHESTNUT_READY_PRODUCT));
        assert_eq!(detect_chestnut(root.path()), Chestnut::Ready);
    }

    /// Each contract fetches its own accelerator and only its own: v25 the `chestnut` build,
    /// v26's contract the `amd` build in its one format, both only with a ready GPU; a variant
    /// of the wrong device or format is left out, never the model.
    #[test]
    fn each_contract_fetches_its_own_accelerator_variant() {
        use manifest::contract::ContractName;
        let v26_format = ContractName::V26.contract().artifact_format;
        let both = |amd_format: &str| {
            entry(json!({"id": "pop223", "artifact_format": v26_format,
                "accelerator_artifacts": {
                "chestnut": {"artifact_size": 5, "artifact_sha256": "4".repeat(64),
                    "execution_device": "AMD"},
                "amd": {"artifact_format": amd_format, "artifact_size": 7,
                    "artifact_sha256": "5".repeat(64), "artifact_chunk_count": 0,
                    "execution_device": "AMD"}}}))
        };
        let locals = |e: &ModelEntry, c: &manifest::Contract, gpu| -> Vec<String> {
            artifacts_to_fetch(e, gpu, c)
                .map(|ts| ts.into_iter().map(|t| t.local_name.to_string()).collect())
                .unwrap_or_default()
        };
        let v25 = ContractName::V25.contract();
        let v26 = ContractName::V26.contract();
        let e = both(v26_format);
        let table: [(&manifest::Contract, Chestnut, &[&str]); 4] = [
            (
                v26,
                Chestnut::Ready,
                &[
                    "pop223_driving_tinygrad.pkl",
                    "pop223_driving_amd_tinygrad.pkl",
                ],
            ),
            (v26, Chestnut::Present, &["pop223_driving_tinygrad.pkl"]),
            (v26, Chestnut::Absent, &["pop223_driving_tinygrad.pkl"]),
            (v25, Chestnut::Absent, &[]),
        ];
        for (c, gpu, want) in table {
            assert_eq!(locals(&e, c, gpu), want, "{} {gpu:?}", c.name_str);
        }
        // A made-up v27 inherits v26's contract from the pin table, and with it the amd build.
        let mut pins = manifest::PinTable::builtin();
        pins.record_contract(manifest::Generation::new(26), ContractName::V26)
            .unwrap();
        let v27 = pins.contract(manifest::Generation::new(27));
        assert_eq!(locals(&e, v27, Chestnut::Ready), table[0].2);
        let amd = Target::accelerator_variant(&e, v26).unwrap().unwrap();
        assert_eq!(
            (amd.remote_name.as_str(), amd.size, amd.chunk_count),
            ("pop223_driving_amd_tinygrad.pkl", Some(7), Some(0))
        );
        // v25 takes the chestnut build of an entry in a format it loads.
        let v25_entry = entry(json!({"id": "pop223", "accelerator_artifacts": {
            "chestnut": {"artifact_size": 5, "artifact_sha256": "4".repeat(64),
                "execution_device": "AMD"},
            "amd": {"execution_device": "AMD"}}}));
        assert_eq!(
            locals(&v25_entry, v25, Chestnut::Ready),
            [
                "pop223_driving_tinygrad.pkl",
                "pop223_driving_chestnut_tinygrad.pkl"
            ]
        );
        // An amd build in a format v26 does not load: the model alone.
        let wrong = both("tinygrad_single_v1");
        assert!(Target::accelerator_variant(&wrong, v26).is_err());
        assert_eq!(
            locals(&wrong, v26, Chestnut::Ready),
            ["pop223_driving_tinygrad.pkl"]
        );
    }
}
