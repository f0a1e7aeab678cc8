//! The migration crate's integration tests, one binary: each module refreshes devices in-process
//! against the fault-injecting server on 127.0.0.1 (`common`), and `upstream` reads the result
//! the way StarPilot's Python side does.

mod byte_shape;
mod common;
mod crash_enumeration;
mod device_contract;
mod fallback;
mod load_receipt;
mod operations;
mod preview;
mod signed_crash;
mod upstream;
use test_support::upstream_v26;
mod v26_device;
