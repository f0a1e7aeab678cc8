//! The real `device-modeld-manager` binary, one test binary: every module runs it on a
//! temporary device laid out like a comma (`common::Device`) against a real HTTP server on
//! 127.0.0.1.

mod byte_shape;
mod chestnut_gate;
mod cli;
mod cli_surface;
mod common;
mod field;
mod first_boot;
mod floor_bound;
mod following;
mod full_disk;
mod hostile_origin;
mod hostile_params;
mod not_yet;
mod python_temps;
mod running;
mod signed;
mod signed_attacks;
mod storm;
mod terminal;
mod tree;
