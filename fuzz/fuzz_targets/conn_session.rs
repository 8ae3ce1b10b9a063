//! A whole target connection driven by arbitrary bytes: the target must answer with statuses or
//! a termination request and close, never panic, never hang on a peer that has stopped sending.
//!
//! The first byte chooses what the harness sends before the fuzzed bytes, so inputs reach past
//! the handshake: an ICReq (with digests), a Connect (to the admin queue of a new controller,
//! to an I/O queue of a standing one, to an unknown subsystem, or from a host not allowed), and
//! whether header and data digests in the fuzzed PDUs are recomputed so they match. Its bits:
//! 1 send an ICReq, 2 and 4 ask for header and data digests, 8 fix digests, bits 4-6 the
//! Connect (0 none, 1 a new controller, 2 a new controller of a subsystem where the host must
//! authenticate (DH-HMAC-CHAP), followed by an Authentication Send of a valid AUTH_Negotiate
//! so that the fuzzed bytes go on from the Challenge, 3-4 an I/O queue, 5 an unknown subsystem, 6 a host
//! not allowed, 7 an admin Connect naming a controller id, which the dynamic model refuses), bit
//! 7 a 4-entry queue instead of 16.

#![no_main]

use libfuzzer_sys::fuzz_target;
use millrace_block::MemBlockDevice;
use millrace_nvmf::cmd::{fctype, Sgl, Sqe};
use millrace_nvmf::dhchap::msg::{Msg, Negotiate};
use millrace_nvmf::dhchap::{Hash, HostKeys, Secret};
use millrace_nvmf::initiator::{auth_sqe, connect_data, HostController, HostOptions};
use millrace_nvmf::pdu::{self, encode, Ch, Head, IcReq, Negotiated, Side, CH_LEN, DIGEST_LEN};
use millrace_nvmf::{Namespace, ReservationStore, SubsystemConfig, Target, TargetConfig};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

const NQN: &str = "nqn.2024-01.io.millrace:fuzz";
/// The same, where the host must authenticate.
const AUTH_NQN: &str = "nqn.2024-01.io.millrace:fuzz-auth";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000f022";
/// Longer than any honest exchange here takes; an input that runs into it kept the target's
/// side of the connection open after the host stopped sending.
const SESSION_LIMIT: Duration = Duration::from_secs(10);

struct World {
    rt: Runtime,
    addr: SocketAddr,
    /// A controller whose I/O queues the inputs that ask for one connect to.
    io_ctrl: Mutex<Option<Arc<HostController>>>,
    next_qid: AtomicU16,
}

fn host() -> HostOptions {
    HostOptions {
        hostnqn: HOST.into(),
        kato_ms: 0,
        ..Default::default()
    }
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let cfg = TargetConfig {
            max_buffer_bytes: 64 << 20,
            max_io_queues: 8,
            ..Default::default()
        };
        let addr = rt.block_on(async {
            let t = Target::new(cfg);
            // Reservations that persist are "recorded" nowhere, so their paths run.
            let keep: ReservationStore = Arc::new(|_, _, _| Ok(()));
            t.set_reservation_store(keep).expect("a store");
            t.add_subsystem(SubsystemConfig {
                nqn: NQN.into(),
                serial: "MR-FUZZ".into(),
                model: "Millrace fuzz".into(),
                namespaces: vec![Namespace {
                    nsid: 1,
                    dev: Arc::new(MemBlockDevice::new(1 << 20)),
                    uuid: [1; 16],
                    nguid: [2; 16],
                    ana_group: 0,
                }],
                allowed_hosts: vec![HOST.into()],
                allow_any_host: false,
            })
            .expect("a subsystem");
            let keys = HostKeys {
                host: Secret::new(vec![7; 32], Some(Hash::Sha256)).expect("a secret"),
                ctrl: Some(Secret::new(vec![9; 48], None).expect("a secret")),
            };
            t.add_subsystem_with_keys(
                SubsystemConfig {
                    nqn: AUTH_NQN.into(),
                    serial: "MR-FUZZ-AUTH".into(),
                    model: "Millrace fuzz".into(),
                    namespaces: vec![Namespace {
                        nsid: 1,
                        dev: Arc::new(MemBlockDevice::new(1 << 20)),
                        uuid: [3; 16],
                        nguid: [4; 16],
                        ana_group: 0,
                    }],
                    allowed_hosts: vec![HOST.into()],
                    allow_any_host: false,
                },
                vec![(HOST.into(), keys)],
            )
            .expect("a subsystem with secrets");
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a loopback listener");
            let addr = l.local_addr().expect("its address");
            tokio::spawn(async move { t.serve(l).await });
            addr
        });
        World {
            rt,
            addr,
            io_ctrl: Mutex::new(None),
            next_qid: AtomicU16::new(0),
        }
    })
}

/// The standing controller's id, connected (again) when it is gone.
async fn io_controller(w: &World) -> Option<u16> {
    let standing = w.io_ctrl.lock().unwrap().clone();
    if let Some(c) = standing.filter(|c| !c.admin.is_closed()) {
        return Some(c.cntlid);
    }
    let c = HostController::connect(w.addr, NQN, &host(), 0)
        .await
        .ok()?;
    c.admin.set_features(0x07, 7 | 7 << 16).await.ok()?;
    let id = c.cntlid;
    *w.io_ctrl.lock().unwrap() = Some(Arc::new(c));
    Some(id)
}

/// Rewrites the digests of the PDUs in `b` so they match, as far as the stream frames.
fn fix_digests(b: &mut [u8], neg: &Negotiated) {
    let mut at = 0;
    while let Some(chb) = b.get(at..at + CH_LEN) {
        let ch = Ch::decode(chb.try_into().unwrap());
        let Ok(f) = pdu::frame(&ch, Side::Controller, neg) else {
            return;
        };
        let end = at + ch.plen as usize;
        if end > b.len() {
            return;
        }
        if f.hdgst {
            let d = pdu::digest(&b[at..at + f.hlen()]);
            b[at + f.hlen()..at + f.hlen() + DIGEST_LEN].copy_from_slice(&d.to_le_bytes());
        }
        if f.ddgst {
            let data = at + f.head_len();
            let d = pdu::digest(&b[data..data + f.data_len]);
            b[end - DIGEST_LEN..end].copy_from_slice(&d.to_le_bytes());
        }
        at = end;
    }
}

async fn session(w: &World, mode: u8, rest: &[u8]) {
    let (hd, dd) = (mode & 2 != 0, mode & 4 != 0);
    let neg = Negotiated {
        ic_done: true,
        hdgst: hd,
        ddgst: dd,
        max_data: 1 << 20,
    };
    let mut out = Vec::new();
    if mode & 1 != 0 {
        let ic = IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: hd,
            ddgst: dd,
            maxr2t: 0,
        };
        out.extend(encode(&Head::IcReq(ic), &[], false, false, 1));
        let mut o = host();
        let connect: Option<(&str, u16, u16)> = match (mode >> 4) & 7 {
            0 => None,
            1 => Some((NQN, 0, 0xffff)),
            2 => Some((AUTH_NQN, 0, 0xffff)),
            3 | 4 => io_controller(w).await.map(|id| {
                let q = w.next_qid.fetch_add(1, Ordering::Relaxed) % 8 + 1;
                (NQN, q, id)
            }),
            5 => Some(("nqn.2024-01.io.millrace:nobody", 0, 0xffff)),
            6 => {
                o.hostnqn = "nqn.2014-08.org.nvmexpress:uuid:intruder".into();
                Some((NQN, 0, 0xffff))
            }
            _ => Some((NQN, 0, 0x1234)),
        };
        if let Some((subnqn, qid, cntlid)) = connect {
            let mut s = Sqe::fabrics(fctype::CONNECT, 0xc0c0);
            s.set_connect(qid, if mode & 0x80 != 0 { 3 } else { 15 }, 0);
            s.set_sgl(Sgl::InCapsule {
                offset: 0,
                len: 1024,
            });
            let d = connect_data(&o, subnqn, cntlid);
            out.extend(encode(&Head::Cmd(s), &d, hd, dd, 1));
            if subnqn == AUTH_NQN {
                let n = Msg::Negotiate(Negotiate {
                    tid: 1,
                    sc_c: 0,
                    hashes: vec![1, 2, 3],
                    groups: vec![0, 1],
                })
                .encode();
                let mut a = auth_sqe(fctype::AUTH_SEND, n.len());
                a.set_cid(0xa0a0);
                a.set_sgl(Sgl::InCapsule {
                    offset: 0,
                    len: n.len() as u32,
                });
                out.extend(encode(&Head::Cmd(a), &n, hd, dd, 1));
            }
        }
    }
    let start = out.len();
    out.extend_from_slice(rest);
    if mode & 8 != 0 {
        fix_digests(&mut out[start..], &neg);
    }
    let Ok(sock) = tokio::net::TcpStream::connect(w.addr).await else {
        return;
    };
    let (mut rd, mut wr) = sock.into_split();
    let send = async move {
        // The target may close at any point: a failed write is an answer, not an error.
        if wr.write_all(&out).await.is_ok() {
            let _ = wr.shutdown().await;
        }
        // Keep the sending half open (a shut-down one) until the target is done.
        wr
    };
    let recv = async move {
        let mut got = Vec::new();
        let mut sink = vec![0u8; 64 * 1024];
        while let Ok(n) = rd.read(&mut sink).await {
            if n == 0 {
                break;
            }
            // Enough to check everything but reads of the whole device over and over.
            if got.len() < RECEIVED_CHECKED {
                got.extend_from_slice(&sink[..n]);
            }
        }
        got
    };
    let both = async { tokio::join!(send, recv) };
    let Ok((_, got)) = tokio::time::timeout(SESSION_LIMIT, both).await else {
        panic!(
            "the target kept the connection open {SESSION_LIMIT:?} after the host stopped sending"
        );
    };
    if got.len() < RECEIVED_CHECKED {
        check_answers(&got);
    }
}

const RECEIVED_CHECKED: usize = 8 << 20;

/// Whatever it was sent, the target answers with well-formed PDUs only, whole ones, with
/// matching digests, and a termination request (if any) last.
fn check_answers(mut b: &[u8]) {
    let mut neg = Negotiated::initial();
    while !b.is_empty() {
        let (p, used) = match pdu::decode(b, Side::Host, &neg) {
            Ok(Some(x)) => x,
            Ok(None) => panic!("the target's last PDU is cut short: {} bytes left", b.len()),
            Err(e) => panic!("the target sent a PDU its host side refuses: {e}"),
        };
        b = &b[used..];
        match p.head {
            Head::IcResp(r) => {
                neg = Negotiated {
                    ic_done: true,
                    hdgst: r.hdgst,
                    ddgst: r.ddgst,
                    max_data: u32::MAX,
                }
            }
            Head::TermReq { .. } => assert!(b.is_empty(), "PDUs follow a termination request"),
            _ => {}
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    // The authentication decoders alone: a message and a secret from the same bytes.
    let _ = Msg::decode(rest);
    if let Ok(text) = std::str::from_utf8(rest) {
        let _ = Secret::parse(text);
    }
    let w = world();
    // MILLRACE_FUZZ_REPEAT=N replays each input N times and reports the resident memory, to
    // tell state the target keeps per connection from the fuzzer's own growth.
    let repeat: usize = std::env::var("MILLRACE_FUZZ_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for i in 0..repeat {
        w.rt.block_on(session(w, mode, rest));
        if repeat > 1 && (i + 1) % (repeat / 10).max(1) == 0 {
            let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
            let pages: u64 = statm
                .split(' ')
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            eprintln!(
                "after {} sessions: {} MiB resident",
                i + 1,
                (pages * 4096) >> 20
            );
        }
    }
});
