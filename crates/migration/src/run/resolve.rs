//! `resolve`: the path modeld should load, verified, or the built-in.

use fs_err as fs;
use std::path::PathBuf;

use manifest::{ModelId, NamedModel};

use crate::error::Result;
use crate::state::device::{Device, VerifyState};

impl Device {
    /// The path modeld should load: the selected model when it is verified for this generation
    /// (or a `local-*` plain file), else the built-in. Never an unverified or old-generation
    /// file: while a migration is unfinished the answer is the built-in. A verified copy of an
    /// earlier publish in this generation ([`VerifyState::Outdated`]) is used until the new one
    /// verifies.
    pub fn resolve(&self) -> Result<(PathBuf, NamedModel)> {
        if self.files().generation_files().is_some() {
            return self.resolve_per_generation();
        }
        let builtin = || (self.builtin_path(), NamedModel::builtin());
        let sel = self.selection()?;
        if crate::rules::contract::is_builtin_id(&sel.id) || !self.is_current()? {
            return Ok(builtin());
        }
        let Ok(id) = sel.id.parse::<ModelId>() else {
            return Ok(builtin());
        };
        let sel = NamedModel {
            id: id.clone(),
            name: sel.name,
            version: sel.version,
        };
        if id.is_local() {
            let path = self.artifact_path(&id);
            let ok = fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() > 0);
            return Ok(if ok { (path, sel) } else { builtin() });
        }
        let Some(catalog) = self.catalog()? else {
            return Ok(builtin());
        };
        match catalog.get(&id) {
            Some(entry)
                if matches!(
                    self.verify_entry(entry, false)?,
                    VerifyState::Verified | VerifyState::Outdated
                ) && crate::state::load_receipt::condemned(self, entry).is_none() =>
            {
                Ok((self.artifact_path(&id), sel))
            }
            _ => Ok(builtin()),
        }
    }

    /// The selected id as the layout's own store keeps it (per generation: `preferences.json`'s
    /// small profile, its bundled id read as the built-in; the built-in when there is none).
    pub fn layout_selection(&self) -> Result<String> {
        Ok(self
            .stored_slots()?
            .and_then(|s| s.selection)
            .unwrap_or_else(|| crate::rules::contract::builtin_id().to_string()))
    }

    /// [`Device::resolve`] per generation, as upstream's resolver: `preferences.json`'s small
    /// profile when it verifies against the accepted `<gen>/catalog.json` and modeld has not
    /// failed to start those bytes; else the built-in. Our params, `.catalog.json` and journal
    /// play no part: upstream's modeld does not read them.
    fn resolve_per_generation(&self) -> Result<(PathBuf, NamedModel)> {
        let builtin = || (self.builtin_path(), NamedModel::builtin());
        let sel = self.layout_selection()?;
        let Ok(id) = sel.parse::<ModelId>() else {
            return Ok(builtin());
        };
        if crate::rules::contract::is_builtin_id(id.as_str()) {
            return Ok(builtin());
        }
        let Some(catalog) = self.files().accepted_catalog() else {
            return Ok(builtin());
        };
        let Some(entry) = catalog.get(&id) else {
            return Ok(builtin());
        };
        let path = self.artifact_path(&id);
        let plain = fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
        if !plain || self.verify_entry(entry, false)? != VerifyState::Verified {
            return Ok(builtin());
        }
        // Bytes modeld could not start here: it runs the bundled model instead, and so is told.
        if crate::state::load_receipt::condemned(self, entry).is_some() {
            return Ok(builtin());
        }
        let named = self.device_catalog(&catalog)?.named(&id);
        Ok((path, named))
    }
}
