//! What a refresh decides from, read once: the journal, `ModelManifestVersion`, the remembered
//! choice and the slots the params say. The decisions (`decisions`, `journal`) take it as a
//! value; only the run (`manager`) reads the device.

use manifest::Generation;

use crate::choice::{self, Choice, Slots};
use crate::contract;
use crate::device::Device;
use crate::error::Result;
use crate::journal::{Journal, read_journal};
use crate::params::keys;

#[derive(Debug, Clone)]
pub struct DeviceView {
    pub generation: Generation,
    /// `ModelManifestVersion` as the param says it.
    pub previous: Option<String>,
    pub journal: Option<Journal>,
    /// The remembered choice (`.choice.json`).
    pub choice: Option<Choice>,
    /// The slots as the params say them.
    pub slots: Slots,
}

impl DeviceView {
    pub fn read(device: &Device) -> Result<Self> {
        Ok(Self {
            generation: device.config.generation,
            previous: device.params.get_str(keys::MODEL_MANIFEST_VERSION)?,
            journal: read_journal(device)?,
            choice: device.choice()?,
            slots: param_slots(device)?,
        })
    }

    /// What the user wants now: the params, with slots still in a fallback taken from the
    /// remembered choice (see [`choice::remember`]).
    pub fn remembered(&self) -> Slots {
        choice::remember(self.choice.as_ref(), &self.slots)
    }
}

/// The slots as the params say them now (selection under upstream's precedence).
pub(crate) fn param_slots(device: &Device) -> Result<Slots> {
    let (selection, _) = contract::selected(&device.selection_params()?);
    let p = device.profiles_read()?;
    Ok(Slots {
        selection: Some(selection),
        small: p.small.map(|s| s.to_ascii_lowercase()),
        big: p.big.map(|b| b.to_ascii_lowercase()),
    })
}
