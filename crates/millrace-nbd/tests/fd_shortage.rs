//! Issue #16 item 2: a shortage of file descriptors (EMFILE on accept) does not stop NBD
//! service: the accept loop backs off and accepts the waiting connection once descriptors come
//! back, and the connection already open goes on meanwhile. Its own test binary: it lowers the
//! process's descriptor limit.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use millrace_block::MemBlockDevice;
use millrace_nbd::NbdServer;
use tokio::net::TcpStream;

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

fn set_soft_limit(n: u64) -> libc::rlimit {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
        let new = libc::rlimit {
            rlim_cur: n.min(old.rlim_max),
            rlim_max: old.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &new), 0);
    }
    old
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_descriptors_does_not_stop_the_accept_loop() {
    let server = NbdServer::new();
    server
        .add_export(export(
            "vol",
            Arc::new(MemBlockDevice::new(1 << 20)),
            &["127.0.0.1"],
        ))
        .unwrap();
    let addr = tcp_server(&server).await;
    let mut before = Client::go(TcpStream::connect(addr).await.unwrap(), "vol", false)
        .await
        .unwrap();
    before.write(0, b"before", 0).await.unwrap();
    // Every descriptor but one in use: the client's socket takes the last, so the server's
    // accept fails with EMFILE while the connection waits in the backlog.
    let old = set_soft_limit(open_fds() + 32);
    let mut fill = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        fill.push(f);
    }
    drop(fill.pop());
    let waiting = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The connection already open is still served while accepts fail.
    assert_eq!(before.read(0, 6).await.unwrap(), b"before");
    drop(fill);
    // SAFETY: restores the limit read above.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) };
    // The waiting connection is accepted and served, and new clients get in.
    let mut c = tokio::time::timeout(Duration::from_secs(10), Client::go(waiting, "vol", false))
        .await
        .expect("the connection that waited in the backlog was never served")
        .unwrap();
    assert_eq!(c.read(0, 6).await.unwrap(), b"before");
    let mut n = Client::go(TcpStream::connect(addr).await.unwrap(), "vol", false)
        .await
        .unwrap();
    n.write(6, b"after", 0).await.unwrap();
    assert_eq!(c.read(6, 5).await.unwrap(), b"after");
}
