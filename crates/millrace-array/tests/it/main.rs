//! The crate's integration tests in one binary (issue #47): a binary per file linked every
//! dependency again (the workspace's test build took 854 CPU seconds so, 490 with one binary per
//! crate); each file is a module here.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/crash_file.rs"]
mod crash_file;
#[path = "../common/crash_model.rs"]
mod crash_model;

mod async_engine;
mod crash_kill;
mod crash_ring;
mod create_used;
mod discard;
mod engine_props;
mod failure_race;
mod format_upgrade;
mod log_slots;
mod merge;
mod rebuild;
mod rebuild_batch;
mod schedules;
mod stop_work;
