//! Shared test helpers: temporary trees and local servers on 127.0.0.1.
pub mod hints;
pub mod http_server;
pub mod hub;
pub mod inorder_server;
pub mod published;
pub mod release_stores;
pub mod shell;
pub mod skip;
pub mod sshd;
pub mod strict_fs;
pub mod upstream_v26;
pub mod v26_checker;
