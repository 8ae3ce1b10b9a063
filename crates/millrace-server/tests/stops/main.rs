//! The server tests that stop their server with SIGTERM, as an operator does, in one binary of
//! their own: the signal reaches every server in the process, so they take turns (ONE_AT_A_TIME)
//! and share the binary with no other test. One binary, not one each (issue #47).

#[path = "../common/mod.rs"]
mod common;

mod ana;
mod drain;
mod nvme_auth;
mod nvme_resv;
mod nvme_tls;

/// Held by each test while its servers run: a SIGTERM stops every server in the process.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Stops the server the calling test started, as an operator does: SIGTERM to this process.
fn sigterm() {
    // SAFETY: a plain kill(2) of this process; the server's signal handler takes it.
    unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
}
