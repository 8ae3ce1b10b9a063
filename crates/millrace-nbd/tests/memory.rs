//! The buffer pool is the bound on the server's payload memory (issues #15 and #16 item 3):
//! thousands of concurrent requests over several connections stay within a small pool with
//! every byte right, and clients that announce large writes and never send them (or never read
//! their replies) hold no more than their share of the pool, are timed out, and do not keep
//! another client from its I/O.
//!
//! The tests measure the process's RSS, so they run one at a time (a lock), in a test binary
//! of their own.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use millrace_block::{BlockDevice, BufResult, IoBuf, IoFuture, MemBlockDevice};
use millrace_io::{BufPool, Cores, CoresConfig, PoolConfig};
use millrace_nbd::proto::*;
use millrace_nbd::{Limits, NbdServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A RAM disk whose reads and writes take a millisecond to complete, as a drive's would, without
/// holding the core: requests stay in flight, holding their buffers, so the pool runs out.
struct Slow(MemBlockDevice);

impl BlockDevice for Slow {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.write_at(offset, data)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn read_async(&self, offset: u64, mut buf: IoBuf) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            let r = self.0.read_at(offset, &mut buf);
            (r, buf)
        })
    }
    fn write_async(&self, offset: u64, buf: IoBuf, _fua: bool) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            let r = self.0.write_at(offset, &buf);
            (r, buf)
        })
    }
}

fn rss_bytes() -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * KIB
}

fn data_path(pool_bytes: usize, cores: usize, max_buf: usize) -> (Arc<Cores>, BufPool) {
    let pool = BufPool::new(&PoolConfig {
        bytes: pool_bytes,
        slices: cores,
        max_buf,
        populate: true,
    })
    .unwrap();
    let cores = Cores::start(CoresConfig {
        cores,
        pool: Some(pool.clone()),
        ..CoresConfig::default()
    })
    .unwrap();
    (Arc::new(cores), pool)
}

/// A TCP connection to `addr` from the loopback address `from` (127.0.0.0/8 is all local, so
/// each test client can be a client of its own to the server).
async fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{from}:0").parse().unwrap()).unwrap();
    s.connect(addr).await.unwrap()
}

enum Op {
    Write(u64, Vec<u8>),
    Read(u64, usize),
}

/// One connection's requests, and for each read the bytes it must return (made before the
/// load starts, so the RSS measured during it is the server's and the sockets').
struct Work {
    ops: Vec<Op>,
    wants: Vec<Option<Vec<u8>>>,
    image: Vec<u8>,
}

/// Sends every op without waiting for replies, while reading the replies as they come (in any
/// order), and checks each: writes succeed, reads return the bytes expected.
async fn pipeline(c: Client<TcpStream>, ops: Vec<Op>, wants: Vec<Option<Vec<u8>>>) {
    let (mut r, mut w) = c.s.into_split();
    let n = ops.len();
    let sender = tokio::spawn(async move {
        for (i, o) in ops.into_iter().enumerate() {
            let (kind, off, len, data) = match &o {
                Op::Write(off, d) => (CMD_WRITE, *off, d.len(), &d[..]),
                Op::Read(off, len) => (CMD_READ, *off, *len, &[][..]),
            };
            let h = encode_request(&Request {
                flags: 0,
                kind,
                handle: i as u64 + 1,
                offset: off,
                len: len as u32,
            });
            w.write_all(&h).await.unwrap();
            w.write_all(data).await.unwrap();
        }
        w
    });
    let mut seen = vec![false; n];
    for _ in 0..n {
        let mut h = [0u8; 16];
        r.read_exact(&mut h).await.unwrap();
        assert_eq!(
            u32::from_be_bytes(h[0..4].try_into().unwrap()),
            SIMPLE_REPLY_MAGIC
        );
        let error = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let handle = u64::from_be_bytes(h[8..16].try_into().unwrap());
        assert_eq!(error, 0, "request {handle} failed");
        let i = (handle - 1) as usize;
        assert!(!seen[i], "one reply per request");
        seen[i] = true;
        if let Some(want) = &wants[i] {
            let mut d = vec![0u8; want.len()];
            r.read_exact(&mut d).await.unwrap();
            assert!(d == *want, "read {handle} returned the bytes written");
        }
    }
    let mut w = sender.await.unwrap();
    w.write_all(&encode_request(&Request {
        flags: 0,
        kind: CMD_DISC,
        handle: 0,
        offset: 0,
        len: 0,
    }))
    .await
    .unwrap();
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).await.unwrap();
}

/// One connection's work on its own 4 MiB of the device: the first 2 MiB in 4 KiB writes in a
/// shuffled order, the second in 1 MiB and 256 KiB writes (sent first, so large requests meet
/// a full pool), then everything read back in pieces of the same sizes.
fn work_for(conn: usize) -> Work {
    let base = (conn * 4 * MIB) as u64;
    let image = pattern(conn as u64 + 100, 4 * MIB);
    let mut ops = Vec::new();
    let big = [
        (2 * MIB, MIB),
        (3 * MIB, 256 * KIB),
        (3 * MIB + 256 * KIB, 256 * KIB),
    ];
    let big = big.into_iter().chain([(3 * MIB + 512 * KIB, 512 * KIB)]);
    let big: Vec<(usize, usize)> = big.collect();
    for &(off, len) in &big {
        ops.push(Op::Write(base + off as u64, image[off..off + len].to_vec()));
    }
    let mut slots: Vec<usize> = (0..512).collect();
    // A fixed shuffle (an LCG), so a failure repeats.
    let mut x = conn as u64 * 7919 + 1;
    for i in (1..slots.len()).rev() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        slots.swap(i, (x >> 33) as usize % (i + 1));
    }
    for &s in &slots {
        let off = s * 4 * KIB;
        ops.push(Op::Write(
            base + off as u64,
            image[off..off + 4 * KIB].to_vec(),
        ));
    }
    let mut wants: Vec<Option<Vec<u8>>> = ops.iter().map(|_| None).collect();
    let reads = slots.iter().map(|&s| (s * 4 * KIB, 4 * KIB));
    for (off, len) in reads.chain(big.iter().copied()) {
        ops.push(Op::Read(base + off as u64, len));
        wants.push(Some(image[off..off + len].to_vec()));
    }
    Work { ops, wants, image }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousands_of_requests_stay_within_a_small_pool() {
    let _one = SERIAL.lock().await;
    const CONNS: usize = 8;
    // Two cores, each with a 1 MiB slice of the pool: one 1 MiB request fills a slice.
    let (cores, pool) = data_path(2 * MIB, 2, MIB);
    let limits = Limits {
        max_in_flight: 128,
        ..Limits::default()
    };
    let server = NbdServer::with_data_path(limits, cores, pool.clone());
    let dev = Arc::new(Slow(MemBlockDevice::new((CONNS * 4 * MIB) as u64)));
    // Touch the device's memory first, so the RSS below measures the server, not the disk.
    dev.write_at(0, &vec![0xEE; CONNS * 4 * MIB]).unwrap();
    server
        .add_export(export("vol", dev.clone(), &["127.0.0.0/8"]))
        .unwrap();
    let addr = tcp_server(&server).await;
    let work: Vec<Work> = (0..CONNS).map(work_for).collect();
    let requests: usize = work.iter().map(|w| w.ops.len()).sum();
    assert!(requests > 8000, "{requests} requests");
    let rss0 = rss_bytes();

    let mut tasks = Vec::new();
    let mut images = Vec::new();
    for (i, w) in work.into_iter().enumerate() {
        images.push(w.image);
        // Each connection a client of its own (its own address), so the pool, not one
        // client's share, is what runs out.
        let s = connect_from(&format!("127.0.0.{}", i + 1), addr).await;
        let c = Client::go(s, "vol", false).await.unwrap();
        assert_eq!(
            c.info.block.unwrap().2,
            MIB as u32,
            "the pool's largest buffer is advertised"
        );
        tasks.push(tokio::spawn(pipeline(c, w.ops, w.wants)));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rss1 = rss_bytes();

    for (i, image) in images.iter().enumerate() {
        let mut got = vec![0u8; 4 * MIB];
        dev.read_at((i * 4 * MIB) as u64, &mut got).unwrap();
        assert!(got == *image, "connection {i}'s region holds what it wrote");
    }
    wait_all_closed(&server).await;
    let u = pool.usage();
    assert_eq!(server.stats().connections_open, 0);
    assert!(u.waits > 0, "back-pressure happened: {u:?}");
    assert!(u.peak_bytes <= u.capacity_bytes, "{u:?}");
    assert!(
        u.gets as usize >= requests,
        "every read and write took a pool buffer: {u:?}"
    );
    assert_eq!(u.in_use_bytes, 0, "nothing leaked: {u:?}");
    let grown = rss1.saturating_sub(rss0);
    eprintln!(
        "{requests} requests, pool {u:?}, RSS grew by {} KiB",
        grown / KIB
    );
    // The pool was counted before the load (populated); what is left is per-connection state
    // of both ends (BufReaders, tasks) and the test client's own buffers.
    assert!(grown < 16 * MIB, "RSS grew by {grown} bytes");
}

/// Waits until `f` holds, for at most `secs` seconds; says whether it did.
async fn until(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalled_clients_hold_only_their_share_and_are_timed_out() {
    let _one = SERIAL.lock().await;
    const POOL: usize = 8 * MIB;
    const SHARE: usize = 2 * MIB;
    let timeout = Duration::from_secs(6);
    let (cores, pool) = data_path(POOL, 1, MIB);
    let limits = Limits {
        max_client_bytes: Some(SHARE),
        payload_timeout: timeout,
        ..Limits::default()
    };
    let server = NbdServer::with_data_path(limits, cores, pool.clone());
    let dev = Arc::new(MemBlockDevice::new(8 * MIB as u64));
    dev.write_at(0, &vec![0u8; 8 * MIB]).unwrap();
    server
        .add_export(export("vol", dev.clone(), &["127.0.0.0/8"]))
        .unwrap();
    let addr = tcp_server(&server).await;
    let rss0 = rss_bytes();

    // Client 127.0.0.1: 24 connections, each announcing a 1 MiB write and sending half of it
    // (24 MiB announced, three times the pool). Client 127.0.0.3: one connection that asks for
    // 24 MiB of reads and never reads a reply.
    let mut writers = Vec::new();
    for _ in 0..24 {
        let s = connect_from("127.0.0.1", addr).await;
        let mut c = Client::go(s, "vol", false).await.unwrap();
        c.send(CMD_WRITE, 0, 0, MIB as u32, &vec![1u8; MIB / 2])
            .await
            .unwrap();
        writers.push(c);
    }
    let s = connect_from("127.0.0.3", addr).await;
    let mut reader = Client::go(s, "vol", false).await.unwrap();
    for i in 0..24u64 {
        reader
            .send(CMD_READ, 0, (i % 8) * MIB as u64, MIB as u32, &[])
            .await
            .unwrap();
    }
    let started = Instant::now();
    // Each stalled client holds its share, no more: two shares of the pool in use.
    let held = until(5, || pool.usage().in_use_bytes as usize >= 2 * SHARE).await;
    assert!(
        held,
        "the stalled clients took their shares: {:?}",
        pool.usage()
    );
    for _ in 0..10 {
        let u = pool.usage();
        assert!(
            u.in_use_bytes as usize <= 2 * SHARE,
            "no client holds past its share: {u:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Another client (127.0.0.2) does its I/O meanwhile, with every byte right.
    let s = connect_from("127.0.0.2", addr).await;
    let mut good = Client::go(s, "vol", false).await.unwrap();
    let d = pattern(5, MIB);
    assert_eq!(
        good.write(2 * MIB as u64, &d, CMD_FLAG_FUA).await.unwrap(),
        0
    );
    assert!(good.read(2 * MIB as u64, MIB as u32).await.unwrap() == d);
    for i in 0..64u64 {
        let d = pattern(i, 4 * KIB);
        assert_eq!(
            good.write(4 * MIB as u64 + i * 4096, &d, 0).await.unwrap(),
            0
        );
        assert!(good.read(4 * MIB as u64 + i * 4096, 4096).await.unwrap() == d);
    }
    // ... while the stalled ones still held their buffers: it did not wait for the timeout.
    assert!(
        pool.usage().in_use_bytes as usize >= 2 * SHARE && started.elapsed() < timeout,
        "the other client was served while the stalled ones held their shares ({:?} after they started): {:?}",
        started.elapsed(),
        pool.usage()
    );
    good.disconnect().await.unwrap();

    // The payload timeout closes the stalled writers that hold buffers, and the reader that
    // takes no replies.
    // (The reader is not read from here: that would take its replies.)
    let mut closed = 0;
    for c in writers.iter_mut() {
        let mut b = vec![0u8; 64 * KIB];
        let eof = tokio::time::timeout(Duration::from_millis(20), async {
            loop {
                match c.s.read(&mut b).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        });
        if eof.await.is_ok() {
            closed += 1;
        }
    }
    assert_eq!(closed, 0, "nothing is closed before the timeout");
    tokio::time::sleep(timeout + Duration::from_secs(1)).await;
    let mut closed = 0;
    for c in writers.iter_mut().chain(std::iter::once(&mut reader)) {
        let mut b = vec![0u8; 256 * KIB];
        let eof = tokio::time::timeout(Duration::from_millis(200), async {
            loop {
                match c.s.read(&mut b).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        });
        if eof.await.is_ok() {
            closed += 1;
        }
    }
    // Two writers held the 127.0.0.1 share (1 MiB each); the reader held its share.
    assert!(
        closed >= 3,
        "the stalled connections holding buffers were closed ({closed})"
    );
    drop(writers);
    drop(reader);
    let freed = until(10, || {
        pool.usage().in_use_bytes == 0 && server.stats().connections_open == 0
    })
    .await;
    let u = pool.usage();
    assert!(freed, "every buffer came back: {u:?}, {:?}", server.stats());
    assert!(u.peak_bytes as usize <= 2 * SHARE + MIB, "{u:?}");
    let grown = rss_bytes().saturating_sub(rss0);
    eprintln!(
        "stalled clients: pool {u:?}, RSS grew by {} KiB",
        grown / KIB
    );
    assert!(
        grown < 16 * MIB,
        "RSS grew by {grown} bytes with 24 MiB announced"
    );
}

/// With every buffer of the pool held elsewhere, a read waits for one (the back-pressure)
/// instead of failing or allocating, and is answered with the device's bytes once the pool has
/// buffers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_waits_for_a_pool_buffer_and_is_answered_once_one_comes_back() {
    let _serial = SERIAL.lock().await;
    let (cores, pool) = data_path(MIB, 1, 256 * KIB);
    let server = NbdServer::with_data_path(Limits::default(), cores, pool.clone());
    let dev = TestDev::new(4 * MIB as u64);
    let data = pattern(9, 4 * MIB);
    dev.write_at(0, &data).unwrap();
    server
        .add_export(export("vol", dev.clone(), &["127.0.0.0/8"]))
        .unwrap();
    let addr = tcp_server(&server).await;
    let mut held = Vec::new();
    while let Ok(Some(b)) = pool.try_get(4 * KIB) {
        held.push(b);
    }
    assert!(
        held.len() >= 256,
        "the pool is taken ({} buffers)",
        held.len()
    );
    let mut c = Client::go(TcpStream::connect(addr).await.unwrap(), "vol", false)
        .await
        .unwrap();
    let read = tokio::spawn(async move { c.read(MIB as u64, 8192).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!read.is_finished(), "a read waits for a pool buffer");
    drop(held);
    let got = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("answered once the pool has buffers")
        .unwrap();
    assert!(got == data[MIB..MIB + 8192]);
}
