//! Issue #16 item 2: a shortage of file descriptors (EMFILE on accept) does not stop NVMe/TCP
//! service: the accept loop backs off and accepts the waiting connection once descriptors come
//! back. Its own test binary: it lowers the process's descriptor limit.

use millrace_block::MemBlockDevice;
use millrace_nvmf::initiator::{ic_req_pdu, HostController, HostOptions};
use millrace_nvmf::pdu;
use millrace_nvmf::{Namespace, SubsystemConfig, Target, TargetConfig};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

const NQN: &str = "nqn.2024-01.io.millrace:fds";

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

#[test]
fn running_out_of_descriptors_does_not_stop_the_accept_loop() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let t = Target::new(TargetConfig::default());
    t.add_subsystem(SubsystemConfig {
        nqn: NQN.into(),
        serial: "MR-FDS".into(),
        model: "Millrace fds".into(),
        namespaces: vec![Namespace {
            nsid: 1,
            dev: Arc::new(MemBlockDevice::new(8 << 20)),
            uuid: [5; 16],
            nguid: [5; 16],
            ana_group: 0,
        }],
        allowed_hosts: vec![],
        allow_any_host: true,
    })
    .unwrap();
    let addr = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let t2 = t.clone();
        tokio::spawn(async move { t2.serve(l).await });
        addr
    });
    // Every descriptor but one in use: the client's socket takes the last, so the target's
    // accept fails with EMFILE while the connection waits in the backlog.
    let old = set_soft_limit(open_fds() + 32);
    let mut fill = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        fill.push(f);
    }
    drop(fill.pop());
    let mut client = std::net::TcpStream::connect(addr).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    drop(fill);
    // SAFETY: restores the limit read above.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) };
    // The waiting connection is accepted and served.
    client.write_all(&ic_req_pdu()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut resp = [0u8; 128];
    client.read_exact(&mut resp).unwrap();
    assert_eq!(resp[0], pdu::pdu_type::IC_RESP);
    // And new hosts get in and do I/O.
    rt.block_on(async {
        let o = HostOptions::default();
        let c = HostController::connect(addr, NQN, &o, 1).await.unwrap();
        c.io[0].write(1, 2, vec![4; 4096], 4096).await.unwrap();
        assert_eq!(c.io[0].read(1, 2, 1, 4096).await.unwrap(), vec![4; 4096]);
    });
    t.shutdown();
}
