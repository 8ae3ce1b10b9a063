//! The crate's integration tests in one binary (issue #47): a binary per file linked every
//! dependency again (the workspace's test build took 854 CPU seconds so, 490 with one binary per
//! crate); each file is a module here.

#[path = "../common/mod.rs"]
mod common;

mod bench;
mod cli;
mod either_way;
mod failures;
mod hangups;
mod nbd_export;
mod nvme_hangups;
mod serve;
mod shares;
mod stop_causes;
