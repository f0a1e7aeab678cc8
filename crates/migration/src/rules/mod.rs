//! The decisions, over values already read: what modeld and the UIs are given (the contract and
//! upstream's byte shapes), what the user chose and when a fallback retries, what a generation
//! change and `gc` delete, what a refresh or download does, the rollback floor, the daily byte
//! budget, and what to do after each failure. Nothing here depends on `run`.
//!
//! Read in this order: [`contract`] (what the device's readers expect), [`shape`] (the same,
//! byte for byte as upstream writes it), [`choice`] (the user's choice and its retries),
//! [`plan`] (what is deleted and what a refresh does per model), `decisions` (what `refresh`
//! and `download` do, from what was read), `floor` (the rollback floor), [`budget`] (the
//! daily byte budget), [`next_step`] (exit codes and what to do after each error).

pub mod budget;
pub mod choice;
pub mod contract;
pub(crate) mod decisions;
pub(crate) mod floor;
pub mod next_step;
pub mod plan;
pub mod shape;
