//! The downloader's integration tests, one binary: each module plays against a real HTTP server
//! on 127.0.0.1 (`common::World`).

mod common;
mod early;
mod faults;
mod field;
mod hostile;
mod origins;
mod tree_pin;
