//! Whatever ends `millrace serve` is in its log with its cause, and its exit status says
//! which: a requested stop (SIGTERM, SIGINT) is 0; another signal that asks a process to end
//! is an orderly stop with status 128+N; a fatal signal is logged and then ends the process
//! as that signal. A starting server tells systemd when it is ready, and the CLI waits for
//! a server that holds its home but is still starting.

use crate::common;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

fn start(dir: &Path, notify: Option<&Path>) -> Child {
    let env: Vec<(&str, &Path)> = notify.map(|n| ("NOTIFY_SOCKET", n)).into_iter().collect();
    common::spawn_serve(dir, &["--no-nvme"], &env)
}

fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
}

fn wait(child: &mut Child) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no exit in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_catchable_signal_that_ends_the_server_is_logged_with_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let orderly = [
        (libc::SIGTERM, "SIGTERM", Some(0)),
        (libc::SIGINT, "SIGINT", Some(0)),
        (libc::SIGHUP, "SIGHUP", Some(128 + libc::SIGHUP)),
        (libc::SIGUSR1, "SIGUSR1", Some(128 + libc::SIGUSR1)),
        (libc::SIGUSR2, "SIGUSR2", Some(128 + libc::SIGUSR2)),
        (libc::SIGALRM, "SIGALRM", Some(128 + libc::SIGALRM)),
        (libc::SIGXCPU, "SIGXCPU", Some(128 + libc::SIGXCPU)),
        (libc::SIGPWR, "SIGPWR", Some(128 + libc::SIGPWR)),
    ];
    for (sig, name, code) in orderly {
        let mut child = start(dir.path(), None);
        // SAFETY: kill(2) of the child this test started, not yet reaped.
        unsafe { libc::kill(child.id() as i32, sig) };
        let st = wait(&mut child);
        let log = log_of(dir.path());
        assert_eq!(st.code(), code, "{name}: {st}\n{log}");
        assert!(
            log.contains(&format!("stopping: {name} received")),
            "{name} is not named in the log:\n{log}"
        );
        assert!(log.contains("stopped"), "{name}: no orderly stop:\n{log}");
        assert!(
            !dir.path().join("home/server.json").exists(),
            "{name}: the server file outlives an orderly stop"
        );
    }
    let fatal = [
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGSYS, "SIGSYS"),
        (libc::SIGTRAP, "SIGTRAP"),
    ];
    for (sig, name) in fatal {
        let mut child = start(dir.path(), None);
        // SAFETY: kill(2) of the child this test started, not yet reaped.
        unsafe { libc::kill(child.id() as i32, sig) };
        let st = wait(&mut child);
        let log = log_of(dir.path());
        assert_eq!(st.signal(), Some(sig), "{name}: {st}\n{log}");
        assert!(
            log.contains(&format!("stopping on {name}")),
            "{name} is not named in the log:\n{log}"
        );
    }
    // The next start knows the last one did not stop in order, and says so on /metrics.
    let mut child = start(dir.path(), None);
    let sf: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("home/server.json")).unwrap())
            .unwrap();
    let url = sf["url"].as_str().unwrap();
    let metrics = ureq::get(&format!("{url}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    assert!(
        metrics.contains("millrace_server_previous_stop_unclean 1"),
        "{metrics}"
    );
    assert!(metrics.contains("millrace_server_start_time_seconds "));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(wait(&mut child).success());
}

#[test]
fn a_starting_server_says_when_it_is_ready_and_the_cli_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("notify.sock");
    let listener = UnixDatagram::bind(&sock).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut child = start(dir.path(), Some(&sock));
    let mut buf = [0u8; 256];
    let n = listener
        .recv(&mut buf)
        .expect("READY=1 reaches NOTIFY_SOCKET");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.contains("READY=1"), "{msg}");
    assert!(
        dir.path().join("home/server.json").exists(),
        "ready is told only once the server file is there"
    );
    // SAFETY: kill(2) of the child this test started, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let n = listener
        .recv(&mut buf)
        .expect("STOPPING=1 reaches NOTIFY_SOCKET");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1"));
    assert!(wait(&mut child).success());

    // A server that holds the home (its lock) but has written no server file yet is starting:
    // the CLI waits for it instead of opening the pools itself, and says so.
    let home = dir.path().join("home");
    let lock = std::fs::File::create(home.join("server.lock")).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) },
        0
    );
    let out = common::millrace(dir.path())
        .env("MILLRACE_START_WAIT", "1")
        .args(["pool", "list"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("is starting"), "{err}");
    assert!(err.contains("has not finished starting"), "{err}");
}
