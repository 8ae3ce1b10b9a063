//! The crate's integration tests in one binary (issue #47): a binary per file linked every
//! dependency again, which made the test build a third longer; each file is a module here.

#[path = "../common/mod.rs"]
mod common;

mod protocol;
mod real_clients;
