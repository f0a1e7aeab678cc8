//! The offline first boot: a build of another generation than the device's, started with no
//! network. The device must not keep loading the old generation's pickles until it is online, so
//! the migration's first steps run without a manifest: the choice is journaled, everything
//! modeld and the UIs read points at the built-in (listed with the local models, the only ones
//! known without a catalog), and the old generation's driving artifacts are purged. Once a
//! manifest is fetched, `refresh` resumes the journal at its download phase and installs the
//! user's model. The steps themselves are `manager::begin_migration`'s, run by
//! `manager::failed_fetch` over [`offline_catalog`].

use manifest::{Manifest, layout};
use serde_json::json;

use crate::error::Result;
use crate::rules::contract::Catalog;
use crate::state::device::Device;

/// The catalog a device knows without a manifest: the built-in and its local models.
pub(crate) fn offline_catalog(device: &Device) -> Result<Catalog> {
    let builtin = Manifest::from_value(json!({"models": [{
        "id": layout::BUILTIN_MODEL_ID,
        "name": layout::BUILTIN_MODEL_NAME,
        "version": layout::BUILTIN_MODEL_VERSION.to_string(),
    }]}))?;
    device.device_catalog(&builtin)
}
