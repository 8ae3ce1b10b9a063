//! The crate's integration tests in one binary (issue #47): a binary per file linked every
//! dependency again (the workspace's test build took 854 CPU seconds so, 490 with one binary per
//! crate); each file is a module here.

#[path = "../common/drained.rs"]
mod drained;

mod auth;
mod host_share;
mod hostile;
mod integration;
mod multipath;
mod pdu_props;
mod plug;
mod reservations;
