//! `resolve`: the path modeld should load, verified, or the built-in.

use fs_err as fs;
use std::path::PathBuf;

use manifest::{ModelId, NamedModel};

use crate::device::{Device, VerifyState};
use crate::error::Result;

impl Device {
    /// Whether the built-in chunk set is there (the one thing `resolve` cannot do without).
    pub fn builtin_present(&self) -> bool {
        matches!(chunker::resolve(&self.builtin_path()), Ok(Some(_)))
    }

    /// The path modeld should load: the selected model when it is verified for this generation
    /// (or a `local-*` plain file), else the built-in. Never an unverified or old-generation
    /// file: while a migration is unfinished the answer is the built-in. A verified copy of an
    /// earlier publish in this generation ([`VerifyState::Outdated`]) is used until the new one
    /// verifies.
    pub fn resolve(&self) -> Result<(PathBuf, NamedModel)> {
        let sel = self.selection()?;
        if crate::contract::is_builtin_id(&sel.id) || !self.is_current()? {
            return Ok((self.builtin_path(), NamedModel::builtin()));
        }
        let Ok(id) = sel.id.parse::<ModelId>() else {
            return Ok((self.builtin_path(), NamedModel::builtin()));
        };
        let sel = NamedModel {
            id: id.clone(),
            name: sel.name,
            version: sel.version,
        };
        if id.is_local() {
            let path = self.artifact_path(&id);
            let ok = fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() > 0);
            return Ok(if ok {
                (path, sel)
            } else {
                (self.builtin_path(), NamedModel::builtin())
            });
        }
        let Some(catalog) = self.catalog()? else {
            return Ok((self.builtin_path(), NamedModel::builtin()));
        };
        match catalog.get(&id) {
            Some(entry)
                if matches!(
                    self.verify_entry(entry, false)?,
                    VerifyState::Verified | VerifyState::Outdated
                ) && crate::load_receipt::condemned(self, entry).is_none() =>
            {
                Ok((self.artifact_path(&id), sel))
            }
            _ => Ok((self.builtin_path(), NamedModel::builtin())),
        }
    }
}
