//! The device's state on disk: `<data>/models`, `<data>/params/d`, the memory params, the stored
//! catalog, the verification cache, and `resolve` for modeld.

use fs_err as fs;
use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

use manifest::{Generation, Manifest, ModelId, NamedModel, Sha256Digest};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::rules::choice::{CHOICE_FILE, Choice};
use crate::rules::contract::{self, Catalog, LocalModel, ProfilesRead, SelectionParams};
pub use crate::rules::plan::VerifyState;
use crate::state::bounded::{self, read_capped};
use crate::state::effects::{Changes, Effect, Effects, ParamChange};
use crate::state::params::{Params, keys};

/// The stored catalog: the validated manifest this device last accepted.
pub const CATALOG_FILE: &str = ".catalog.json";
/// With trusted keys: the signature block(s) of the stored catalog, checked on every read of
/// it ([`Device::catalog`]). Replaced with the catalog, in a crash-safe order
/// (`trust_state::store_accepted`).
pub const CATALOG_SIGNATURE_FILE: &str = ".catalog.json.minisig";
/// Verification results keyed by file name, valid while the stat signature is unchanged.
pub const VERIFIED_FILE: &str = ".verified.json";
/// Present while a generation migration is in progress.
pub const JOURNAL_FILE: &str = ".migration.json";
/// The entries the last accepted manifest had that this device left out, with their reasons
/// (`[{"index","id","reason"}]`), for `status`.
pub const REFUSED_FILE: &str = ".catalog-refused.json";

/// One manifest entry the device left out of its catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedModel {
    /// Position in the published `models` array.
    pub index: usize,
    /// The `id` as published, when it had a string one.
    pub id: Option<String>,
    pub reason: String,
}

impl From<&manifest::RefusedEntry> for RefusedModel {
    fn from(r: &manifest::RefusedEntry) -> Self {
        Self {
            index: r.index,
            id: r.id.clone(),
            reason: r.reason(),
        }
    }
}

/// What an installed artifact is checked against, and where that came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpectedDigest {
    pub sha256: Sha256Digest,
    /// `None` when only the sidecar is known (it carries no size).
    pub size: Option<u64>,
    pub source: downloader::DigestSource,
}

/// Where things are on this device.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    pub data_dir: PathBuf,
    /// The memory params `d` directory (`/dev/shm/params/d` on a comma).
    pub memory_params_dir: PathBuf,
    /// The directory holding the built-in `driving_tinygrad.pkl` (chunk set).
    pub builtin_dir: PathBuf,
    pub generation: Generation,
}

#[derive(Debug, Clone)]
pub struct Device {
    pub config: DeviceConfig,
    pub params: Params,
    pub memory: Params,
    /// Where the USB devices are listed (`/sys` on a comma), for the external-GPU check.
    pub sysfs_root: PathBuf,
    /// The release keys this device trusts (`--trusted-keys`), the same the downloader checks
    /// fetched manifests with: with them, the stored catalog is re-verified on every read and
    /// only artifacts the signed manifest pins are installed or handed to modeld.
    pub trusted_keys: Option<downloader::trust::TrustedKeys>,
    /// modeld's load receipt, on a contract that has one (`None`: v25, nothing read).
    pub load_receipt: Option<crate::state::load_receipt::Source>,
    /// The daily byte budget a download on this device is held to (`Some` for the daemon's
    /// automatic refresh, [`crate::rules::budget`]); `None`: a person asked, served whatever the
    /// count. Bytes are counted either way.
    pub budget: Option<crate::rules::budget::DailyBudget>,
    pub(crate) effects: Effects,
    /// The contract the device's generation runs, as the tree decided it
    /// ([`crate::state::tree::Decision::Known`]); [`manifest::contract::BASE_CONTRACT`] until told.
    contract: &'static manifest::contract::Contract,
    /// What the tree declared about its generation, when it declared it.
    tree: Option<std::sync::Arc<manifest::TreeDeclaration>>,
}

/// The bytes `.catalog.json` gets for `m`: `raw` (what `m` was parsed from) when it names
/// `generation` and fits the read limit; else `m` tagged with `generation`, canonical (over the
/// limit the device would refuse its own catalog: [`Error::CatalogTooLarge`]).
pub(crate) fn catalog_body(
    raw: Option<&[u8]>,
    m: &Manifest,
    generation: Generation,
) -> Result<Vec<u8>> {
    if let Some(raw) = raw
        && m.generation() == Some(generation)
        && (raw.len() as u64) <= bounded::CATALOG_LIMIT
    {
        return Ok(raw.to_vec());
    }
    let mut m = m.clone();
    m.set_generation(generation);
    let body = m.to_canonical_string();
    if body.len() as u64 > bounded::CATALOG_LIMIT {
        return Err(Error::CatalogTooLarge {
            size: body.len() as u64,
            limit: bounded::CATALOG_LIMIT,
        });
    }
    Ok(body.into_bytes())
}

/// The names of the regular files and symlinks directly in `dir`, sorted (none when `dir` is
/// not there).
fn file_names(dir: &Path) -> Result<Vec<String>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    Ok(names)
}

/// The built-in `driving_tinygrad.pkl` (a chunk set) in `builtin_dir`.
pub fn builtin_path_in(builtin_dir: &Path) -> PathBuf {
    builtin_dir.join("driving_tinygrad.pkl")
}

impl Device {
    pub fn new(config: DeviceConfig) -> Self {
        Self::with_effects(config, Effects::none())
    }

    /// A device whose every durable effect reports to `effects` (the crash enumeration).
    pub fn with_effects(config: DeviceConfig, effects: Effects) -> Self {
        let params =
            Params::with_effects(config.data_dir.join("params").join("d"), effects.clone());
        let memory =
            Params::new(config.memory_params_dir.clone()).sharing_warnings(params.warnings());
        Self {
            config,
            params,
            memory,
            sysfs_root: PathBuf::from("/sys"),
            trusted_keys: None,
            load_receipt: None,
            budget: None,
            effects,
            contract: manifest::contract::BASE_CONTRACT.contract(),
            tree: None,
        }
    }

    /// This device, on a tree that declared `tree` (its reviewed catalog is what the
    /// per-generation selection is checked against).
    pub fn with_declaration(mut self, tree: Option<manifest::TreeDeclaration>) -> Self {
        self.tree = tree.map(std::sync::Arc::new);
        self
    }

    /// Where the generation's files live and how each is written ([`crate::state::layout`]).
    pub fn files(&self) -> crate::state::layout::DeviceFiles {
        self.files_of(self.config.generation)
    }

    /// [`Device::files`] of another generation, in this device's layout.
    fn files_of(&self, generation: Generation) -> crate::state::layout::DeviceFiles {
        let (data, tree) = (&self.config.data_dir, self.tree.clone());
        crate::state::layout::DeviceFiles::new(self.contract, data, generation, tree)
            .with_effects(self.effects.clone())
    }

    /// This device, on a generation that runs `contract` (what the tree decided).
    pub fn with_contract(mut self, contract: &'static manifest::contract::Contract) -> Self {
        self.contract = contract;
        self
    }

    /// The contract the device's generation runs.
    pub fn contract(&self) -> &'static manifest::contract::Contract {
        self.contract
    }

    /// Whether the car is driving (`IsOnroad`).
    pub fn is_onroad(&self) -> Result<bool> {
        self.params.get_bool(keys::IS_ONROAD)
    }

    /// [`Error::Onroad`] while the car is driving: called before anything that purges,
    /// migrates or downloads, so none of it happens onroad.
    pub fn ensure_offroad(&self, what: &str) -> Result<()> {
        if self.is_onroad()? {
            return Err(Error::Onroad {
                what: what.to_string(),
            });
        }
        Ok(())
    }

    /// The external GPU as upstream detects it, under [`Device::sysfs_root`].
    pub fn chestnut(&self) -> downloader::egpu::Chestnut {
        downloader::egpu::detect_chestnut(&self.sysfs_root)
    }

    /// Write a state or cache file in the models dir atomically and report the effect; nothing
    /// is written when the file holds these bytes already.
    pub(crate) fn write_file(&self, name: &str, body: &[u8]) -> Result<()> {
        let old = self
            .effects
            .read(&self.models_dir().join(name), body.len() as u64);
        if old.is_ok_and(|old| old.as_deref() == Some(body)) {
            return Ok(());
        }
        self.effects.write_file(&self.models_dir(), name, body)
    }

    /// A JSON state file of the models dir (`.choice.json`, `.migration.json`, the trust
    /// records): `None` when it is not there; over `limit` bytes, not a regular file, or not
    /// parsing as `T` is an [`Error::CorruptState`] naming it.
    pub(crate) fn read_json<T: DeserializeOwned>(
        &self,
        name: &str,
        limit: u64,
    ) -> Result<Option<T>> {
        let path = self.models_dir().join(name);
        let Some(b) = self.effects.read(&path, limit)? else {
            return Ok(None);
        };
        serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| Error::CorruptState {
                path,
                message: e.to_string(),
            })
    }

    /// [`Device::read_json`] for a record, not a safeguard (`.choice.json`,
    /// `.refused-manifest.json`): one that cannot be read is absent, with a warning, so it never
    /// wedges `refresh` or `status`; the next write replaces it.
    pub(crate) fn read_json_or_warn<T: DeserializeOwned>(
        &self,
        name: &str,
        limit: u64,
    ) -> Result<Option<T>> {
        match self.read_json(name, limit) {
            Err(e @ Error::CorruptState { .. }) => {
                self.warnings()
                    .add(format!("{e}; read as absent, the next write replaces it"));
                Ok(None)
            }
            other => other,
        }
    }

    /// What was read as absent because it could not be read (params, state records), since
    /// the last [`Warnings::take`](crate::state::params::Warnings::take).
    pub fn warnings(&self) -> &crate::state::params::Warnings {
        self.params.warnings()
    }

    /// Write a JSON state file of the models dir (pretty) with [`Device::write_file`].
    pub(crate) fn write_json<T: Serialize + ?Sized>(&self, name: &str, value: &T) -> Result<()> {
        self.write_file(
            name,
            &serde_json::to_vec_pretty(value).expect("state serializes"),
        )
    }

    /// Remove a file of the models dir and report the effect (nothing when it is not there).
    pub(crate) fn remove_file(&self, name: &str) -> Result<()> {
        self.effects.remove_file(&self.models_dir(), name)
    }

    /// The writer of this device's state (see [`Effects`]).
    pub fn effects(&self) -> &Effects {
        &self.effects
    }

    /// This device with every effect recorded and skipped ([`Effects::plan`]): a dry run is
    /// the real run on it. The memory params are planned apart (their log is not kept).
    pub fn planning(&self) -> Device {
        let effects = Effects::plan();
        let mut d = Device::with_effects(self.config.clone(), effects);
        d.memory = Params::with_effects(self.config.memory_params_dir.clone(), Effects::plan())
            .sharing_warnings(d.params.warnings());
        d.sysfs_root = self.sysfs_root.clone();
        d.trusted_keys = self.trusted_keys.clone();
        d.contract = self.contract;
        d.tree = self.tree.clone();
        d
    }

    /// What this device, planned ([`Device::planning`]), changes against `now` (the same
    /// device, unplanned): the state files its log writes whose bytes then differ (or that it
    /// wrote and removed again: a new journal), in the order first written; the files there
    /// now and gone after it; the params it writes whose value then differs, in key order.
    pub(crate) fn planned_changes(&self, now: &Device) -> Result<Changes> {
        let (mut files, mut keys) = (Vec::<(String, bool)>::new(), BTreeSet::new());
        for e in self.effects.effects() {
            let (name, written) = match e {
                Effect::WriteFile { name, .. } => (name, true),
                Effect::RemoveFile { name } => (name, false),
                Effect::SetParam { key, .. } | Effect::RemoveParam { key } => {
                    keys.insert(key);
                    continue;
                }
                _ => continue,
            };
            match files.iter_mut().find(|(n, _)| *n == name) {
                Some((_, w)) => *w |= written,
                None => files.push((name, written)),
            }
        }
        let (mut write, mut remove, mut params) = (Vec::new(), Vec::new(), Vec::new());
        let read = |d: &Device, name: &str| {
            (d.effects
                .read(&d.models_dir().join(name), bounded::CATALOG_LIMIT))
            .ok()
        };
        for (name, written) in files {
            let (before, after) = (read(now, &name), read(self, &name));
            if written && (before != after || after == Some(None)) {
                write.push(name.clone());
            }
            if matches!(before, Some(Some(_))) && after == Some(None) {
                remove.push(name);
            }
        }
        for key in keys {
            // A value that cannot be read now (a FIFO, oversized) counts as unset, as the run
            // reads it (`Params::get_str`).
            let value = self.params.get(&key).ok().flatten();
            if now.params.get(&key).ok().flatten() != value {
                params.push(ParamChange { key, value });
            }
        }
        Ok((write, remove, params))
    }

    /// The five selection params as read.
    pub fn selection_params(&self) -> Result<SelectionParams> {
        let g = |k| self.params.get_str(k);
        Ok(SelectionParams {
            model: g(keys::MODEL)?,
            driving_model: g(keys::DRIVING_MODEL)?,
            model_version: g(keys::MODEL_VERSION)?,
            driving_model_version: g(keys::DRIVING_MODEL_VERSION)?,
            driving_model_name: g(keys::DRIVING_MODEL_NAME)?,
        })
    }

    /// The profile ids as read (`ActiveSmallModel`, `ActiveBigModel`).
    pub fn profiles_read(&self) -> Result<ProfilesRead> {
        Ok(ProfilesRead {
            small: self.params.get_str(keys::ACTIVE_SMALL_MODEL)?,
            big: self.params.get_str(keys::ACTIVE_BIG_MODEL)?,
        })
    }

    /// File names directly in the models dir (regular files and symlinks).
    pub fn model_file_names(&self) -> Result<Vec<String>> {
        file_names(&self.models_dir())
    }

    /// The catalog as the UIs list it: the stored manifest's entries plus the local models in
    /// the models dir with their sidecars (`local-<id>.json`, used when it parses as a JSON
    /// object, as upstream reads it).
    pub fn device_catalog(&self, manifest: &Manifest) -> Result<Catalog> {
        let names = self.model_file_names()?;
        let locals: Vec<LocalModel> = contract::discover_locals(names.iter().map(String::as_str))
            .into_iter()
            .map(|id| {
                let sidecar = read_capped(
                    &self.models_dir().join(format!("{id}.json")),
                    bounded::SIDECAR_LIMIT,
                )
                .ok()
                .flatten()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v.as_object().cloned());
                LocalModel { id, sidecar }
            })
            .collect();
        Ok(Catalog::for_contract(manifest, &locals, self.contract))
    }

    /// Whether a local model's artifact is there (a non-empty plain file or a chunk set).
    pub fn local_present(&self, id: &ModelId) -> bool {
        let path = self.artifact_path(id);
        match chunker::resolve(&path) {
            Ok(Some(r)) => r
                .pieces()
                .iter()
                .all(|(p, _)| fs::symlink_metadata(p).is_ok_and(|m| m.is_file() && m.len() > 0)),
            _ => false,
        }
    }

    pub fn models_dir(&self) -> PathBuf {
        self.config.data_dir.join("models")
    }

    pub fn builtin_path(&self) -> PathBuf {
        builtin_path_in(&self.config.builtin_dir)
    }

    /// Where `id`'s artifact is installed: the layout's answer ([`crate::state::layout`]).
    pub fn artifact_path(&self, id: &ModelId) -> PathBuf {
        self.files()
            .artifact_path(id, crate::state::layout::Variant::Standard)
    }

    pub fn ensure_dirs(&self) -> Result<()> {
        self.effects.create_dir(&self.models_dir())
    }

    /// The selection from params under upstream's precedence: unset means the default
    /// (`rdf43`/`v15`); when `Model` and `DrivingModel` differ the non-default one wins,
    /// preferring `DrivingModel` (and likewise for the versions).
    /// The id is as the params hold it (canonical, lower-cased), not necessarily a valid one.
    pub fn selection(&self) -> Result<NamedModel<String>> {
        let p = self.selection_params()?;
        let (id, version) = contract::selected(&p);
        Ok(NamedModel {
            name: p.driving_model_name.unwrap_or_default(),
            version,
            id,
        })
    }

    /// Write the five selection params, `Model`/`DrivingModel` last (the tests' setup).
    #[cfg(test)]
    pub fn select(&self, s: &NamedModel) -> Result<()> {
        self.params.put(keys::DRIVING_MODEL_NAME, &s.name)?;
        self.params.put(keys::MODEL_VERSION, &s.version)?;
        self.params.put(keys::DRIVING_MODEL_VERSION, &s.version)?;
        self.params.put(keys::MODEL, s.id.as_str())?;
        self.params.put(keys::DRIVING_MODEL, s.id.as_str())?;
        Ok(())
    }

    /// The stored catalog, if it is for this device's generation. With trusted keys it is
    /// accepted only when the signature kept beside it verifies over its bytes, for this
    /// generation, at a release not lower than the accepted one ([`Error::CatalogNotTrusted`]
    /// otherwise: `resolve` then answers the built-in and says why).
    pub fn catalog(&self) -> Result<Option<Manifest>> {
        let path = self.models_dir().join(CATALOG_FILE);
        let Some(bytes) = self.effects.read(&path, bounded::CATALOG_LIMIT)? else {
            return Ok(None);
        };
        if let Some(keys) = &self.trusted_keys {
            return self.signed_catalog(keys, path, &bytes);
        }
        let m = Manifest::from_slice(&bytes).map_err(|e| Error::CorruptState {
            path: path.clone(),
            message: e.to_string(),
        })?;
        Ok((m.generation() == Some(self.config.generation)).then_some(m))
    }

    /// [`Device::catalog`] with trusted keys: one Ed25519 check of the stored bytes against the
    /// signature kept beside them, then the bytes read as a fetched manifest is read.
    fn signed_catalog(
        &self,
        keys: &downloader::trust::TrustedKeys,
        path: PathBuf,
        bytes: &[u8],
    ) -> Result<Option<Manifest>> {
        use manifest::signature::{MAX_SIGNATURE_BYTES, Refusal};
        let generation = self.config.generation;
        // A signature file that cannot be read (oversized, a FIFO, a symlink to a device) is a
        // catalog that does not verify, like a missing or damaged one: `refresh` stores the
        // signed pair again.
        let sig = match self.effects.read(
            &self.models_dir().join(CATALOG_SIGNATURE_FILE),
            MAX_SIGNATURE_BYTES,
        ) {
            Ok(sig) => sig,
            Err(e) => {
                return Err(Error::CatalogNotTrusted {
                    path,
                    refusal: Refusal::Malformed {
                        reason: e.to_string(),
                    },
                });
            }
        };
        let copies = crate::rules::floor::read_copies(
            &self.models_dir(),
            &self
                .params
                .path(crate::state::params::keys::MODEL_MANIFEST_ACCEPTED_RELEASE),
        );
        // Bounded by this catalog's own signed release (`floor::bound`): a floor raised from
        // outside never refuses the catalog the device holds.
        let held = downloader::trust::verify_stored(keys, bytes, sig.as_deref(), generation, None)
            .ok()
            .map(|a| crate::rules::floor::AcceptedRelease::from(&a));
        let copies = crate::rules::floor::bound(&copies.0, &copies.1, generation, held.as_ref());
        let floor = crate::rules::floor::for_read(&copies, generation);
        match downloader::trust::verify_stored(keys, bytes, sig.as_deref(), generation, floor) {
            Ok(_) => {}
            // A catalog validly signed for another generation (left by an earlier build): not
            // this generation's, as without keys.
            Err(Refusal::OtherGeneration { .. }) => return Ok(None),
            Err(refusal) => return Err(Error::CatalogNotTrusted { path, refusal }),
        }
        let read =
            Manifest::from_slice_tolerant(bytes, &manifest::Limits::default()).map_err(|e| {
                Error::CorruptState {
                    path: path.clone(),
                    message: e.to_string(),
                }
            })?;
        let mut m = read.manifest;
        if m.generation().is_some_and(|g| g != generation) {
            return Ok(None);
        }
        m.set_generation(generation);
        Ok(Some(m))
    }

    /// The stored catalog's verified signature (release, expiry, key) with trusted keys,
    /// ignoring the accepted release: what bounds the floor (`floor::bound`).
    pub(crate) fn stored_signed(&self) -> Option<crate::rules::floor::AcceptedRelease> {
        let keys = self.trusted_keys.as_ref()?;
        let dir = self.models_dir();
        let bytes = self
            .effects
            .read(&dir.join(CATALOG_FILE), bounded::CATALOG_LIMIT)
            .ok()??;
        let sig = self
            .effects
            .read(
                &dir.join(CATALOG_SIGNATURE_FILE),
                manifest::signature::MAX_SIGNATURE_BYTES,
            )
            .ok()??;
        downloader::trust::verify_stored(keys, &bytes, Some(&sig), self.config.generation, None)
            .ok()
            .map(|a| crate::rules::floor::AcceptedRelease::from(&a))
    }

    /// Whether this device installs only what a signed manifest pins (it has trusted keys).
    pub fn is_protected(&self) -> bool {
        self.trusted_keys.is_some()
    }

    /// Store `m` as the catalog (tagged with this generation), atomically (the tests' setup).
    #[cfg(test)]
    pub fn store_catalog(&self, m: &Manifest) -> Result<()> {
        self.write_file(
            CATALOG_FILE,
            &catalog_body(None, m, self.config.generation)?,
        )
    }

    /// Give upstream the accepted manifest `raw` where and how its layout reads it (per
    /// generation: `<gen>/catalog.json`, see
    /// [`crate::state::layout::DeviceFiles::upstream_catalog`]); nothing on a flat layout. One effect, atomic.
    pub fn publish_catalog(&self, raw: &[u8]) -> Result<()> {
        let Some((name, body)) = self.files().upstream_catalog(raw)? else {
            return Ok(());
        };
        self.effects.create_dir(&self.files().root())?;
        self.write_file(&name, &body)
    }

    /// The selection as the layout's own store keeps it, in the slots the refresh decides
    /// over: per generation, `preferences.json` when it is there (read as upstream reads it;
    /// its bundled id is the built-in, its `""` big profile is the disabled one); `None` on a
    /// flat layout (the params are the store) or before any preferences exist.
    pub fn stored_slots(&self) -> Result<Option<crate::rules::choice::Slots>> {
        let files = self.files();
        let Some(gf) = files.generation_files() else {
            return Ok(None);
        };
        if !self.effects.exists(&files.root().join(gf.preferences)) {
            return Ok(None);
        }
        self.slots_of(&files.read_preferences()?).map(Some)
    }

    /// Carry the flat-layout choice the params hold (selection, profiles, favourites,
    /// exclusions, sort mode, randomizer) into the preferences of this per-generation device,
    /// once: preferences already there (upstream's, or ours) are the user's and are kept.
    /// Returns the preferences now in force (`None` on a flat layout).
    pub fn carry_choice(
        &self,
        from: &'static manifest::contract::Contract,
    ) -> Result<Option<crate::state::layout::Preferences>> {
        let slots = crate::state::view::param_slots(self)?;
        self.carry_slots(from, &slots, None)
    }

    /// [`Device::carry_choice`] with the selection and profiles given (a migration's journal
    /// keeps them while the params point at the built-in); the rest from the params.
    pub(crate) fn carry_slots(
        &self,
        from: &'static manifest::contract::Contract,
        slots: &crate::rules::choice::Slots,
        from_generation: Option<&str>,
    ) -> Result<Option<crate::state::layout::Preferences>> {
        let files = self.files();
        let Some(gf) = files.generation_files() else {
            return Ok(None);
        };
        let path = files.root().join(gf.preferences);
        if self.effects.exists(&path) {
            return files.read_preferences().map(Some);
        }
        // Preferences the generation moved from kept in this layout are the user's choice,
        // read as upstream reads them against this generation's catalog.
        let carried = match self.previous_preferences(from_generation) {
            Some(prev) => prev.read_preferences_as(&files)?,
            None => {
                let choice = crate::state::layout::FlatChoice {
                    slots: slots.clone(),
                    favorites: self.params.get_str(keys::USER_FAVORITES)?,
                    blacklisted: self.params.get_str(keys::BLACKLISTED_MODELS)?,
                    sort_mode: self.params.get_str(keys::MODEL_SORT_MODE)?,
                    randomizer: self.params.get_bool(keys::MODEL_RANDOMIZER)?,
                };
                let rows = files.tree().map_or(&[][..], |t| t.catalog.as_slice());
                crate::state::layout::carry_flat_choice(from, self.contract, rows, &choice)
            }
        };
        let body = carried.to_bytes();
        self.effects.create_dir(&files.root())?;
        let name = format!("{}/{}", files.generation(), gf.preferences);
        files.with_state_lock(|| self.write_file(&name, &body))?;
        Ok(Some(carried))
    }

    /// The remembered choice (`.choice.json`), if any.
    /// A corrupt or unreadable one is read as absent, with a warning
    /// (`Device::read_json_or_warn`).
    pub fn choice(&self) -> Result<Option<Choice>> {
        self.read_json_or_warn(CHOICE_FILE, bounded::JOURNAL_LIMIT)
    }

    pub(crate) fn store_choice(&self, c: &Choice) -> Result<()> {
        self.write_json(CHOICE_FILE, c)
    }

    pub fn require_catalog(&self) -> Result<Manifest> {
        self.catalog()?.ok_or_else(|| Error::NoCatalog {
            generation: self.config.generation.to_string(),
        })
    }

    /// Whether the device has finished migrating to this build's generation.
    pub fn is_current(&self) -> Result<bool> {
        Ok(!self.models_dir().join(JOURNAL_FILE).exists()
            && self
                .params
                .get_str(keys::MODEL_MANIFEST_VERSION)?
                .as_deref()
                == Some(self.config.generation.to_string().as_str()))
    }

    /// The entries the stored catalog's manifest had that were left out (none if unknown).
    /// A report, never trusted for a decision: bounded like the catalog it describes.
    pub fn refused(&self) -> Vec<RefusedModel> {
        self.read_json(REFUSED_FILE, bounded::CATALOG_LIMIT)
            .ok()
            .flatten()
            .unwrap_or_default()
    }
}

// ---- A move between two generations that keep their own roots ----

impl Device {
    /// The files generation `from` kept in this device's per-generation layout, when it kept
    /// any (its root `<models>/<from>/` is a directory; a generation of a flat contract has no
    /// root of its own, so `None`; `None` as well for this very generation and on a flat
    /// layout).
    pub fn previous_files(&self, from: &str) -> Option<crate::state::layout::DeviceFiles> {
        let generation = from.parse::<manifest::Generation>().ok()?;
        if generation == self.config.generation {
            return None;
        }
        self.files().generation_files()?;
        let prev = self.files_of(generation);
        fs::symlink_metadata(prev.root())
            .is_ok_and(|m| m.is_dir())
            .then_some(prev)
    }

    /// [`Device::previous_files`] when that root holds preferences (the user's choice there).
    fn previous_preferences(
        &self,
        from: Option<&str>,
    ) -> Option<crate::state::layout::DeviceFiles> {
        let prev = self.previous_files(from?)?;
        let gf = prev.generation_files()?;
        self.effects
            .exists(&prev.root().join(gf.preferences))
            .then_some(prev)
    }

    /// The selection a migration from `from` starts with: this generation's own store
    /// ([`Device::stored_slots`]), else that of the generation moved from, read against this
    /// catalog; `None` when the params are the store.
    pub(crate) fn slots_for_move(
        &self,
        from: Option<&str>,
    ) -> Result<Option<crate::rules::choice::Slots>> {
        if let Some(s) = self.stored_slots()? {
            return Ok(Some(s));
        }
        let Some(prev) = self.previous_preferences(from) else {
            return Ok(None);
        };
        self.slots_of(&prev.read_preferences_as(&self.files())?)
            .map(Some)
    }

    /// Preferences as the refresh's slots (the bundled id is the built-in, `""` big the
    /// disabled profile).
    fn slots_of(
        &self,
        p: &crate::state::layout::Preferences,
    ) -> Result<crate::rules::choice::Slots> {
        let builtin = manifest::contract::BASE_CONTRACT
            .contract()
            .bundled_selection;
        let id = |s: &str| match s == self.contract.bundled_selection {
            true => builtin.to_string(),
            false => s.to_string(),
        };
        Ok(crate::rules::choice::Slots {
            selection: Some(id(&p.small)),
            small: Some(id(&p.small)),
            big: match p.big.as_str() {
                "" => Some(contract::BIG_DISABLED.to_string()),
                b if b == self.contract.bundled_selection => None,
                b => Some(b.to_string()),
            },
        })
    }

    /// The driving artifacts generation `from` installed under its own root
    /// (`<from>/<id>/...`), as (directory, file name), `local-*` models excepted; nothing when
    /// `from` kept no root in this layout.
    pub(crate) fn previous_artifacts(&self, from: Option<&str>) -> Result<Vec<(PathBuf, String)>> {
        let Some(prev) = from.and_then(|g| self.previous_files(g)) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let rd = match fs::read_dir(prev.root()) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e.into()),
        };
        let mut dirs: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        dirs.sort();
        for dir in dirs {
            let names = file_names(&dir)?;
            for name in crate::rules::plan::purge_plan(names.iter().map(String::as_str)) {
                out.push((dir.clone(), name));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use manifest::ModelEntry;
    use std::collections::BTreeMap;

    fn device(root: &Path) -> Device {
        Device::new(DeviceConfig {
            data_dir: root.join("data"),
            memory_params_dir: root.join("shm"),
            builtin_dir: root.join("builtin"),
            generation: manifest::layout::CURRENT_GENERATION,
        })
    }

    /// Every JSON state file (journal, choice, trust records) is read one way: absent is
    /// `None`; torn, oversized or not a regular file is `CorruptState` naming it.
    #[test]
    fn state_files_are_read_capped_and_a_bad_one_is_named() {
        let t = tempfile::tempdir().unwrap();
        let d = device(t.path());
        d.ensure_dirs().unwrap();
        let none: Option<BTreeMap<String, u32>> = d.read_json("s.json", 64).unwrap();
        assert_eq!(none, None);
        d.write_json("s.json", &BTreeMap::from([("a", 1)])).unwrap();
        let got: Option<BTreeMap<String, u32>> = d.read_json("s.json", 64).unwrap();
        assert_eq!(got, Some(BTreeMap::from([("a".to_string(), 1)])));
        let path = d.models_dir().join("s.json");
        for (body, limit) in [(&b"{\"a\": "[..], 64), (&b"{\"a\": 1}"[..], 4)] {
            fs::write(&path, body).unwrap();
            let e = d
                .read_json::<BTreeMap<String, u32>>("s.json", limit)
                .unwrap_err();
            assert!(matches!(e, Error::CorruptState { .. }), "{e:?}");
            assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}");
        }
    }

    /// A device on the current generation whose catalog lists `pop223` and selects it.
    fn current_device_selecting_pop223(root: &Path) -> (Device, ModelEntry) {
        let d = device(root);
        d.ensure_dirs().unwrap();
        let data = b"pop223 artifact bytes";
        let m = Manifest::from_value(serde_json::json!({"models": [{
            "id": "pop223", "name": "Pop", "version": "v16",
            "artifact_format": "tinygrad_single_v1", "artifact_size": data.len(),
            "artifact_sha256": chunker::Sha256Digest::of_bytes(data).to_hex(),
            "artifact_chunk_count": 1,
        }]}))
        .unwrap();
        d.store_catalog(&m).unwrap();
        d.params
            .put(
                keys::MODEL_MANIFEST_VERSION,
                &d.config.generation.to_string(),
            )
            .unwrap();
        let entry = m.models()[0].clone();
        d.select(&NamedModel::of_entry(&entry)).unwrap();
        (d, entry)
    }

    #[test]
    fn malformed_local_chunkmanifest_is_corrupt_not_an_error() {
        // A torn `.chunkmanifest` (the Python manager never fsyncs) must not wedge the manager:
        // the model reads as corrupt, so `download` replaces it and `resolve` answers the
        // built-in instead of failing.
        let t = tempfile::tempdir().unwrap();
        let (d, entry) = current_device_selecting_pop223(t.path());
        let cm = d
            .models_dir()
            .join(chunker::chunk_manifest_name("pop223_driving_tinygrad.pkl"));
        for torn in [&b""[..], b"\0\0", b"two"] {
            fs::write(&cm, torn).unwrap();
            assert_eq!(
                d.verify_entry(&entry, false).unwrap(),
                VerifyState::Corrupt,
                "{torn:?}"
            );
            let (path, sel) = d.resolve().unwrap();
            assert_eq!(path, d.builtin_path(), "{torn:?}");
            assert!(contract::is_builtin_id(sel.id.as_str()));
        }
    }

    /// The read-only check answers what `verify_entry` answers and writes nothing.
    #[test]
    fn a_read_only_check_gives_the_same_state_and_records_nothing() {
        let t = tempfile::tempdir().unwrap();
        let (d, entry) = current_device_selecting_pop223(t.path());
        let path = d.artifact_path(entry.id());
        let cache = d.models_dir().join(VERIFIED_FILE);
        let recorded = || fs::read(&cache).ok();
        assert_eq!(
            d.planning().verify_entry(&entry, false).unwrap(),
            VerifyState::Missing
        );
        fs::write(&path, b"pop223 artifact bytes").unwrap();
        for force in [false, true] {
            assert_eq!(
                d.planning().verify_entry(&entry, force).unwrap(),
                VerifyState::Verified
            );
            assert_eq!(recorded(), None, "force {force}");
        }
        assert_eq!(
            d.verify_entry(&entry, false).unwrap(),
            VerifyState::Verified
        );
        let on_record = recorded().expect("verify_entry records");
        fs::write(&path, b"POP223 ARTIFACT BYTES").unwrap();
        for force in [false, true] {
            assert_eq!(
                d.planning().verify_entry(&entry, force).unwrap(),
                VerifyState::Corrupt
            );
            assert_eq!(recorded().as_ref(), Some(&on_record), "force {force}");
        }
        assert_eq!(d.verify_entry(&entry, false).unwrap(), VerifyState::Corrupt);
        assert_ne!(recorded().as_ref(), Some(&on_record));
    }

    #[test]
    fn a_recorded_verification_is_reused_until_the_file_changes() {
        let t = tempfile::tempdir().unwrap();
        let (d, entry) = current_device_selecting_pop223(t.path());
        let path = d.artifact_path(entry.id());
        fs::write(&path, b"pop223 artifact bytes").unwrap();
        let artifact = entry.artifact().unwrap();
        d.record_verified(&entry, &artifact.sha256, artifact.size.get())
            .unwrap();
        assert_eq!(
            d.verify_entry(&entry, false).unwrap(),
            VerifyState::Verified
        );
        assert_eq!(d.resolve().unwrap().0, path);

        // Any change to the file (here: same size, other bytes) invalidates the record.
        fs::write(&path, b"POP223 ARTIFACT BYTES").unwrap();
        assert_eq!(d.verify_entry(&entry, false).unwrap(), VerifyState::Corrupt);
        assert_eq!(d.resolve().unwrap().0, d.builtin_path());
    }
}
