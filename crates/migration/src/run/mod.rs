//! What acts: the manager lock, opening the device a command runs on, the operations
//! (`refresh` with its journaled migration, `download`, `verify`, `gc`, `resolve`), their dry
//! runs, the daemon's request protocol, and each command as the binary calls it.
//!
//! Read in this order: [`lock`] (one manager at a time), [`open`] (the device a command runs
//! on), `manager` (the operations, the migration's state machine and the first boot with no
//! network), `resolve` (modeld's path), `verify` (installed means verified),
//! [`downloads`] (`download` and `download --all`), [`preview`] (`refresh --dry-run`),
//! [`daemon`] (the UI's requests), [`commands`] (each command, one call).

pub mod commands;
pub mod daemon;
pub mod downloads;
pub mod lock;
pub(crate) mod manager;
pub mod open;
pub mod preview;
pub(crate) mod resolve;
pub(crate) mod verify;
