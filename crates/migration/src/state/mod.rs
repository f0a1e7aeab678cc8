//! What is on the device, and how it is read and written: the params, the files of each
//! generation under `<data>/models`, the journal, the trust state, the openpilot tree, modeld's
//! load receipt, and the view a command decides from.
//!
//! Read in this order: [`bounded`] (every read is capped), [`params`] (openpilot's params),
//! [`effects`] (the one writer of device state), [`layout`] (where a generation's files live),
//! `device` (the device as a whole), `journal` (where a migration stands), [`trust_state`]
//! (the signed manifests remembered), [`tree`] (which generation the device is on),
//! [`load_receipt`] (what modeld actually runs), [`view`] (what a command reads at its top).

pub mod bounded;
pub(crate) mod device;
pub mod effects;
pub(crate) mod journal;
pub mod layout;
pub mod load_receipt;
pub mod params;
pub mod tree;
pub mod trust_state;
pub mod view;
