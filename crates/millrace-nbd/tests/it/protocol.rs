//! The server against the tests' own small client, over 127.0.0.1 and a Unix socket: data round
//! trips, FUA and flush, trim and write-zeroes, pipelining, and every refusal we promise.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use millrace_block::{BlockDevice, MemBlockDevice};
use millrace_nbd::proto::*;
use millrace_nbd::{Limits, NbdServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

const MIB: u64 = 1 << 20;

/// Reads until the server closes; fails if it does not within a few seconds.
async fn expect_closed<S: Stream>(s: &mut S) {
    let mut rest = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    assert!(r.is_ok(), "the server should have closed the connection");
}

async fn round_trips<S: Stream>(mut c: Client<S>, dev: &TestDev) {
    let size = c.info.size;
    assert_eq!(size, 8 * MIB);
    // Unaligned, aligned, large (the 32 MiB maximum is tested elsewhere) and at the very end.
    for (i, (off, len)) in [
        (12_345u64, 777usize),
        (4096, 65536),
        (MIB, 3 * MIB as usize),
        (size - 100, 100),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(i as u64, len);
        assert_eq!(c.write(off, &data, 0).await.unwrap(), 0);
        assert_eq!(c.read(off, len as u32).await.unwrap(), data);
        let mut direct = vec![0u8; len];
        dev.read_at(off, &mut direct).unwrap();
        assert_eq!(direct, data, "the device holds what the client wrote");
    }
    // FUA and FLUSH reach the device's flush.
    let f0 = dev.flushes.load(Ordering::SeqCst);
    assert_eq!(c.write(0, b"durable", CMD_FLAG_FUA).await.unwrap(), 0);
    assert_eq!(dev.flushes.load(Ordering::SeqCst), f0 + 1);
    assert_eq!(c.call(CMD_FLUSH, 0, 0, 0, &[]).await.unwrap().error, 0);
    assert_eq!(dev.flushes.load(Ordering::SeqCst), f0 + 2);
    // Trim: reads back as zeroes (the block contract's discard zeroes).
    assert_eq!(
        c.call(CMD_TRIM, 0, 4096, 65536, &[]).await.unwrap().error,
        0
    );
    assert_eq!(c.read(4096, 65536).await.unwrap(), vec![0u8; 65536]);
    assert_eq!(dev.discards.load(Ordering::SeqCst), 1);
    // Write-zeroes with NO_HOLE writes zeroes; without it may punch a hole (discard).
    let z0 = dev.zeroes.load(Ordering::SeqCst);
    let r = c
        .call(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, MIB, 1000, &[])
        .await
        .unwrap();
    assert_eq!(r.error, 0);
    assert_eq!(dev.zeroes.load(Ordering::SeqCst), z0 + 1);
    assert_eq!(c.read(MIB, 1000).await.unwrap(), vec![0u8; 1000]);
    let r = c
        .call(CMD_WRITE_ZEROES, CMD_FLAG_FUA, 2 * MIB, 5000, &[])
        .await
        .unwrap();
    assert_eq!(r.error, 0);
    assert_eq!(dev.discards.load(Ordering::SeqCst), 2);
    assert_eq!(c.read(2 * MIB, 5000).await.unwrap(), vec![0u8; 5000]);
    // Cache is a hint: accepted, nothing changes.
    assert_eq!(c.call(CMD_CACHE, 0, 0, 4096, &[]).await.unwrap().error, 0);
    // Zero-length requests succeed and do nothing.
    assert_eq!(c.read(100, 0).await.unwrap(), Vec::<u8>::new());
    assert_eq!(c.write(100, &[], 0).await.unwrap(), 0);
    c.disconnect().await.unwrap();
}

#[tokio::test]
async fn tcp_round_trip_fua_flush_trim_zeroes() {
    let server = NbdServer::new();
    let dev = TestDev::new(8 * MIB);
    server
        .add_export(export("vol", dev.clone(), &["127.0.0.1/32"]))
        .unwrap();
    let addr = tcp_server(&server).await;
    let c = Client::go(TcpStream::connect(addr).await.unwrap(), "vol", false)
        .await
        .unwrap();
    let f = c.info.flags;
    for flag in [
        TF_HAS_FLAGS,
        TF_SEND_FLUSH,
        TF_SEND_FUA,
        TF_SEND_TRIM,
        TF_SEND_WRITE_ZEROES,
        TF_CAN_MULTI_CONN,
    ] {
        assert_ne!(f & flag, 0, "flag {flag:#x} is advertised");
    }
    assert_eq!(f & (TF_READ_ONLY | TF_SEND_DF), 0);
    assert_eq!(c.info.name.as_deref(), Some("vol"));
    assert_eq!(c.info.description.as_deref(), Some("test export vol"));
    // 6 x 64 KiB stripes round up to the next power of two.
    assert_eq!(c.info.block, Some((1, 512 << 10, 32 << 20)));
    round_trips(c, &dev).await;
    let st = server.stats();
    assert!(st.writes >= 6 && st.reads >= 8, "{st:?}");
    assert!(
        st.bytes_written >= 3 * MIB && st.bytes_read >= 3 * MIB,
        "{st:?}"
    );
    assert_eq!(st.connections_total, 1);
    let es = server.export_stats("vol").unwrap();
    assert_eq!((es.flushes, es.trims, es.zeroes), (1, 1, 2));
}

#[tokio::test]
async fn unix_round_trip_with_structured_replies() {
    let dir = tempfile::tempdir().unwrap();
    let server = NbdServer::new();
    let dev = TestDev::new(8 * MIB);
    // No TCP client is allowed; the Unix socket reaches it anyway.
    server.add_export(export("vol", dev.clone(), &[])).unwrap();
    let path = unix_server(&server, dir.path());
    let c = Client::go(UnixStream::connect(&path).await.unwrap(), "vol", true)
        .await
        .unwrap();
    assert_ne!(c.info.flags & TF_SEND_DF, 0, "structured replies allow DF");
    round_trips(c, &dev).await;
    // Errors come as structured error chunks with a message.
    let mut c = Client::go(UnixStream::connect(&path).await.unwrap(), "vol", true)
        .await
        .unwrap();
    let r = c
        .call(CMD_READ, CMD_FLAG_DF, 8 * MIB - 10, 20, &[])
        .await
        .unwrap();
    assert_eq!(r.error, EINVAL);
    assert!(r.message.contains("past the end"), "{}", r.message);
    assert_eq!(c.read(0, 10).await.unwrap().len(), 10);
}

/// Reads (a 3 MiB one among them) arrive whole and in order, in simple replies over TCP and
/// structured ones over a Unix socket.
#[tokio::test]
async fn reads_arrive_whole_in_simple_and_structured_replies() {
    let dir = tempfile::tempdir().unwrap();
    for structured in [false, true] {
        let server = NbdServer::new();
        let dev = TestDev::new(8 * MIB);
        server
            .add_export(export("vol", dev.clone(), &["127.0.0.1/32"]))
            .unwrap();
        if structured {
            let path = unix_server(&server, dir.path());
            let s = UnixStream::connect(&path).await.unwrap();
            round_trips(Client::go(s, "vol", true).await.unwrap(), &dev).await;
        } else {
            let s = TcpStream::connect(tcp_server(&server).await).await.unwrap();
            round_trips(Client::go(s, "vol", false).await.unwrap(), &dev).await;
        }
    }
}

#[tokio::test]
async fn export_name_and_list_and_default_export() {
    let dir = tempfile::tempdir().unwrap();
    let server = NbdServer::new();
    server
        .add_export(export("b", Arc::new(MemBlockDevice::new(MIB)), &[]))
        .unwrap();
    server
        .add_export(export(
            "a",
            Arc::new(MemBlockDevice::new(2 * MIB)),
            &["127.0.0.1/32"],
        ))
        .unwrap();
    let path = unix_server(&server, dir.path());
    let addr = tcp_server(&server).await;

    // LIST over the socket shows both; over TCP only the export this address may use.
    for (mut s, want) in [
        (
            Box::new(UnixStream::connect(&path).await.unwrap()) as Box<dyn Stream>,
            vec!["a", "b"],
        ),
        (Box::new(TcpStream::connect(addr).await.unwrap()), vec!["a"]),
    ] {
        greet(&mut s).await.unwrap();
        send_option(&mut s, OPT_LIST, &[]).await.unwrap();
        let mut names = Vec::new();
        loop {
            let r = read_opt_reply(&mut s).await.unwrap();
            match r.kind {
                REP_SERVER => names.push(String::from_utf8(r.data[4..].to_vec()).unwrap()),
                REP_ACK => break,
                k => panic!("unexpected {k:#x}"),
            }
        }
        assert_eq!(names, want);
        // The empty name is the default export when exactly one is visible.
        let r = info_or_go(&mut s, OPT_INFO, "").await.unwrap();
        if want.len() == 1 {
            assert_eq!(r.unwrap().size, 2 * MIB);
        } else {
            // Refused, with the names of the exports this client may use.
            let (kind, msg) = r.unwrap_err();
            assert_eq!(kind, REP_ERR_UNKNOWN);
            assert!(msg.contains("a, b"), "{msg}");
        }
        send_option(&mut s, OPT_ABORT, &[]).await.unwrap();
        assert_eq!(read_opt_reply(&mut s).await.unwrap().kind, REP_ACK);
    }

    // The old way in: NBD_OPT_EXPORT_NAME, answered with size and flags and no zeroes.
    let mut s = UnixStream::connect(&path).await.unwrap();
    greet(&mut s).await.unwrap();
    send_option(&mut s, OPT_EXPORT_NAME, b"b").await.unwrap();
    let mut b = [0u8; 10];
    s.read_exact(&mut b).await.unwrap();
    assert_eq!(u64::from_be_bytes(b[0..8].try_into().unwrap()), MIB);
    let flags = u16::from_be_bytes([b[8], b[9]]);
    assert_ne!(flags & TF_CAN_MULTI_CONN, 0);
    let mut c = Client::raw(s, false);
    c.write(5, b"hello", 0).await.unwrap();
    assert_eq!(c.read(5, 5).await.unwrap(), b"hello");
    c.disconnect().await.unwrap();

    // An unknown name through EXPORT_NAME can only be refused by hanging up.
    let mut s = UnixStream::connect(&path).await.unwrap();
    greet(&mut s).await.unwrap();
    send_option(&mut s, OPT_EXPORT_NAME, b"nope").await.unwrap();
    expect_closed(&mut s).await;
}

/// An export's own socket serves that export alone: LIST shows only it, the empty name picks
/// it, and another export's name is unknown there.
#[tokio::test]
async fn an_exports_own_socket_serves_it_alone() {
    let dir = tempfile::tempdir().unwrap();
    let server = NbdServer::new();
    for (n, size) in [("a", MIB), ("b", 2 * MIB)] {
        let dev = Arc::new(MemBlockDevice::new(size));
        server.add_export(export(n, dev, &[])).unwrap();
    }
    let path = dir.path().join("b.sock");
    let l = tokio::net::UnixListener::bind(&path).unwrap();
    let srv = server.clone();
    tokio::spawn(async move { srv.serve_unix_only(l, "b").await });
    let mut s = UnixStream::connect(&path).await.unwrap();
    greet(&mut s).await.unwrap();
    send_option(&mut s, OPT_LIST, &[]).await.unwrap();
    let mut names = Vec::new();
    loop {
        let r = read_opt_reply(&mut s).await.unwrap();
        match r.kind {
            REP_SERVER => names.push(String::from_utf8(r.data[4..].to_vec()).unwrap()),
            REP_ACK => break,
            k => panic!("unexpected {k:#x}"),
        }
    }
    assert_eq!(names, vec!["b"]);
    let (kind, msg) = info_or_go(&mut s, OPT_INFO, "a")
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(kind, REP_ERR_UNKNOWN);
    assert!(msg.contains("serves only export \"b\""), "{msg}");
    let info = info_or_go(&mut s, OPT_GO, "").await.unwrap().unwrap();
    assert_eq!(info.size, 2 * MIB);
    // The server lists the client once its connection enters transmission, just after the ack.
    let mut who = Vec::new();
    for _ in 0..100 {
        who = server.export_clients("b").unwrap();
        if !who.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(who, vec!["local socket"]);
    assert!(server.export_clients("a").unwrap().is_empty());
}

#[tokio::test]
async fn refusals_keep_the_connection_usable() {
    let server = NbdServer::new();
    let dev = TestDev::new(MIB);
    server
        .add_export(export("vol", dev.clone(), &["127.0.0.0/8"]))
        .unwrap();
    let mut ro = export("ro", Arc::new(MemBlockDevice::new(MIB)), &["127.0.0.1/32"]);
    ro.read_only = true;
    server.add_export(ro).unwrap();
    let addr = tcp_server(&server).await;

    // Negotiation refusals: unknown export, unknown option, malformed option, TLS.
    let mut s = TcpStream::connect(addr).await.unwrap();
    greet(&mut s).await.unwrap();
    let (k, msg) = info_or_go(&mut s, OPT_GO, "missing")
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(k, REP_ERR_UNKNOWN);
    assert!(msg.contains("missing"), "{msg}");
    send_option(&mut s, 0x1234, b"whatever").await.unwrap();
    assert_eq!(read_opt_reply(&mut s).await.unwrap().kind, REP_ERR_UNSUP);
    send_option(&mut s, OPT_GO, &[0, 0, 0, 50, b'x'])
        .await
        .unwrap();
    assert_eq!(read_opt_reply(&mut s).await.unwrap().kind, REP_ERR_INVALID);
    send_option(&mut s, OPT_LIST, b"junk").await.unwrap();
    assert_eq!(read_opt_reply(&mut s).await.unwrap().kind, REP_ERR_INVALID);
    send_option(&mut s, OPT_STARTTLS, &[]).await.unwrap();
    assert_eq!(read_opt_reply(&mut s).await.unwrap().kind, REP_ERR_POLICY);
    // An oversized option is skipped and refused; haggling goes on.
    send_option(&mut s, OPT_GO, &vec![0u8; 100_000])
        .await
        .unwrap();
    assert_eq!(read_opt_reply(&mut s).await.unwrap().kind, REP_ERR_INVALID);
    // ... and the client can still GO.
    let info = info_or_go(&mut s, OPT_GO, "vol").await.unwrap().unwrap();
    assert_eq!(info.size, MIB);
    let mut c = Client::raw(s, false);

    // Transmission refusals, each followed by a working request.
    let r = c.call(CMD_READ, 0, MIB - 1, 2, &[]).await.unwrap();
    assert_eq!((r.error, r.data.len()), (EINVAL, 0), "a read past the end");
    let r = c.call(CMD_READ, 0, u64::MAX - 1, 4096, &[]).await.unwrap();
    assert_eq!(r.error, EINVAL, "an offset that overflows");
    assert_eq!(
        c.write(MIB - 2, b"abcd", 0).await.unwrap(),
        ENOSPC,
        "a write past the end"
    );
    assert_eq!(
        c.call(CMD_TRIM, 0, MIB, 1, &[]).await.unwrap().error,
        ENOSPC
    );
    assert_eq!(
        c.call(CMD_WRITE_ZEROES, 0, MIB - 1, 2, &[])
            .await
            .unwrap()
            .error,
        ENOSPC
    );
    assert_eq!(
        c.call(CMD_READ, 0, 0, (32 << 20) + 1, &[])
            .await
            .unwrap()
            .error,
        EINVAL,
        "over the maximum block size"
    );
    assert_eq!(
        c.call(99, 0, 0, 0, &[]).await.unwrap().error,
        EINVAL,
        "an unknown command"
    );
    assert_eq!(
        c.call(CMD_READ, CMD_FLAG_NO_HOLE, 0, 1, &[])
            .await
            .unwrap()
            .error,
        EINVAL,
        "a flag not valid on reads"
    );
    assert_eq!(
        c.call(CMD_READ, CMD_FLAG_DF, 0, 1, &[])
            .await
            .unwrap()
            .error,
        EINVAL,
        "DF without structured replies"
    );
    let mut direct = [0u8; 2];
    dev.read_at(MIB - 2, &mut direct).unwrap();
    assert_eq!(direct, [0, 0], "a refused write leaves the device alone");
    assert_eq!(c.write(7, b"still fine", 0).await.unwrap(), 0);
    assert_eq!(c.read(7, 10).await.unwrap(), b"still fine");
    c.disconnect().await.unwrap();

    // A read-only export refuses writes, trims and zeroing with EPERM.
    let mut c = Client::go(TcpStream::connect(addr).await.unwrap(), "ro", false)
        .await
        .unwrap();
    assert_ne!(c.info.flags & TF_READ_ONLY, 0);
    assert_eq!(c.info.flags & (TF_SEND_TRIM | TF_SEND_WRITE_ZEROES), 0);
    assert_eq!(c.write(0, b"x", 0).await.unwrap(), EPERM);
    assert_eq!(c.call(CMD_TRIM, 0, 0, 10, &[]).await.unwrap().error, EPERM);
    assert_eq!(
        c.call(CMD_WRITE_ZEROES, 0, 0, 10, &[]).await.unwrap().error,
        EPERM
    );
    assert_eq!(c.read(0, 1).await.unwrap(), [0]);
    assert!(server.stats().errors >= 12);
}

#[tokio::test]
async fn clients_not_allowed_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let server = NbdServer::new();
    // Only a network we are not on, so 127.0.0.1 may not even get a greeting.
    server
        .add_export(export(
            "far",
            Arc::new(MemBlockDevice::new(MIB)),
            &["10.0.0.0/8"],
        ))
        .unwrap();
    let addr = tcp_server(&server).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut b = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut b))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 0, "a refused client gets nothing, not even the greeting");
    assert_eq!(server.stats().connections_refused, 1);

    // Allowed to connect for one export, refused (NBD_REP_ERR_POLICY) for another.
    server
        .add_export(export(
            "near",
            Arc::new(MemBlockDevice::new(MIB)),
            &["127.0.0.1"],
        ))
        .unwrap();
    let mut s = TcpStream::connect(addr).await.unwrap();
    greet(&mut s).await.unwrap();
    let (k, _) = info_or_go(&mut s, OPT_GO, "far")
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(k, REP_ERR_POLICY);
    assert_eq!(
        info_or_go(&mut s, OPT_INFO, "near")
            .await
            .unwrap()
            .unwrap()
            .size,
        MIB
    );
    // Through NBD_OPT_EXPORT_NAME the refusal is a hang-up.
    send_option(&mut s, OPT_EXPORT_NAME, b"far").await.unwrap();
    expect_closed(&mut s).await;
    // The unix socket may use it.
    let path = unix_server(&server, dir.path());
    let mut c = Client::go(UnixStream::connect(&path).await.unwrap(), "far", false)
        .await
        .unwrap();
    assert_eq!(c.read(0, 3).await.unwrap(), [0, 0, 0]);
}

#[tokio::test]
async fn garbage_and_truncation_end_the_connection_cleanly() {
    let server = NbdServer::with_limits(Limits {
        handshake_timeout: Duration::from_secs(2),
        ..Limits::default()
    });
    server
        .add_export(export(
            "vol",
            Arc::new(MemBlockDevice::new(MIB)),
            &["127.0.0.1/32"],
        ))
        .unwrap();
    let addr = tcp_server(&server).await;

    // Garbage instead of the client flags, and unknown client flags.
    for junk in [&b"GET / HTTP/1.1\r\n\r\n"[..], &[0, 0, 0, 0x80]] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).await.unwrap();
        s.write_all(junk).await.unwrap();
        expect_closed(&mut s).await;
    }
    // A bad option magic, and an option claiming 4 GiB of data.
    let mut s = TcpStream::connect(addr).await.unwrap();
    greet(&mut s).await.unwrap();
    s.write_all(&[0xAB; 16]).await.unwrap();
    expect_closed(&mut s).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    greet(&mut s).await.unwrap();
    let mut h = IHAVEOPT.to_be_bytes().to_vec();
    h.extend_from_slice(&OPT_GO.to_be_bytes());
    h.extend_from_slice(&u32::MAX.to_be_bytes());
    s.write_all(&h).await.unwrap();
    expect_closed(&mut s).await;
    // A client that never finishes negotiating is dropped after the handshake timeout.
    let mut s = TcpStream::connect(addr).await.unwrap();
    greet(&mut s).await.unwrap();
    expect_closed(&mut s).await;

    // A bad request magic during transmission.
    let mut c = Client::go(TcpStream::connect(addr).await.unwrap(), "vol", false)
        .await
        .unwrap();
    c.s.write_all(&[0x55; 28]).await.unwrap();
    expect_closed(&mut c.s).await;
    // A truncated header, then a hang-up.
    let mut c = Client::go(TcpStream::connect(addr).await.unwrap(), "vol", false)
        .await
        .unwrap();
    c.s.write_all(&REQUEST_MAGIC.to_be_bytes()).await.unwrap();
    c.s.shutdown().await.unwrap();
    expect_closed(&mut c.s).await;
    // A write announcing 4 GiB - 1 of data: refused without buffering it; the client then
    // stops half way through the (skipped) payload.
    let mut c = Client::go(TcpStream::connect(addr).await.unwrap(), "vol", false)
        .await
        .unwrap();
    c.send(CMD_WRITE, 0, 0, u32::MAX, &vec![1u8; 1 << 20])
        .await
        .unwrap();
    c.s.shutdown().await.unwrap();
    expect_closed(&mut c.s).await;
    // A write whose data is cut short.
    let mut c = Client::go(TcpStream::connect(addr).await.unwrap(), "vol", false)
        .await
        .unwrap();
    c.send(CMD_WRITE, 0, 0, 4096, &[7u8; 100]).await.unwrap();
    c.s.shutdown().await.unwrap();
    expect_closed(&mut c.s).await;

    // After all that, the server still serves, and nothing is left open.
    let mut c = Client::go(TcpStream::connect(addr).await.unwrap(), "vol", false)
        .await
        .unwrap();
    assert_eq!(c.write(0, b"ok", 0).await.unwrap(), 0);
    c.disconnect().await.unwrap();
    wait_all_closed(&server).await;
    assert_eq!(server.stats().connections_open, 0);
}

#[tokio::test]
async fn pipelined_requests_complete_out_of_order_within_the_limit() {
    let server = NbdServer::with_limits(Limits {
        max_in_flight: 4,
        ..Limits::default()
    });
    let dev = TestDev::new(4 * MIB);
    dev.slow_offsets.lock().unwrap().push(0);
    server
        .add_export(export("vol", dev.clone(), &["127.0.0.1/32"]))
        .unwrap();
    let addr = tcp_server(&server).await;
    let mut c = Client::go(TcpStream::connect(addr).await.unwrap(), "vol", false)
        .await
        .unwrap();

    // A slow read first, then a fast one: the fast one's reply overtakes.
    let mut lens = HashMap::new();
    let slow = c.send(CMD_READ, 0, 0, 4096, &[]).await.unwrap();
    let fast = c.send(CMD_READ, 0, 8192, 4096, &[]).await.unwrap();
    lens.insert(slow, 4096);
    lens.insert(fast, 4096);
    assert_eq!(c.recv(&lens).await.unwrap().handle, fast);
    assert_eq!(c.recv(&lens).await.unwrap().handle, slow);
    dev.slow_offsets.lock().unwrap().clear();

    // Many writes then many reads, all sent before any reply is read.
    let n = 64u64;
    let mut want = HashMap::new();
    for i in 0..n {
        let d = pattern(i, 30_000);
        c.send(CMD_WRITE, 0, i * 32768, d.len() as u32, &d)
            .await
            .unwrap();
    }
    for _ in 0..n {
        assert_eq!(c.recv(&HashMap::new()).await.unwrap().error, 0);
    }
    let mut lens = HashMap::new();
    for i in 0..n {
        let h = c.send(CMD_READ, 0, i * 32768, 30_000, &[]).await.unwrap();
        lens.insert(h, 30_000);
        want.insert(h, pattern(i, 30_000));
    }
    for _ in 0..n {
        let r = c.recv(&lens).await.unwrap();
        assert_eq!(r.error, 0);
        assert_eq!(r.data, want[&r.handle]);
    }
    let most = dev.max_active.load(Ordering::SeqCst);
    assert!(
        most <= 4,
        "at most 4 requests at the device at once, saw {most}"
    );
    c.disconnect().await.unwrap();
}

#[tokio::test]
async fn removing_an_export_closes_its_connections() {
    let server = NbdServer::new();
    server
        .add_export(export(
            "vol",
            Arc::new(MemBlockDevice::new(MIB)),
            &["127.0.0.1/32"],
        ))
        .unwrap();
    assert!(server
        .add_export(export("vol", Arc::new(MemBlockDevice::new(MIB)), &[]))
        .is_err());
    assert!(server
        .add_export(export("", Arc::new(MemBlockDevice::new(MIB)), &[]))
        .is_err());
    let addr = tcp_server(&server).await;
    let mut c = Client::go(TcpStream::connect(addr).await.unwrap(), "vol", false)
        .await
        .unwrap();
    assert_eq!(c.read(0, 1).await.unwrap(), [0]);
    assert_eq!(server.export_stats("vol").unwrap().connections_open, 1);
    server.remove_export("vol").unwrap();
    assert!(server.remove_export("vol").is_err());
    expect_closed(&mut c.s).await;
    // With no export left, TCP clients are refused outright.
    let mut s = TcpStream::connect(addr).await.unwrap();
    expect_closed(&mut s).await;
    assert!(server.exports().is_empty());
}

#[tokio::test]
async fn multi_conn_flush_covers_other_connections() {
    // A flush on one connection reaches the shared device's flush, which covers writes that
    // completed on another: the basis of NBD_FLAG_CAN_MULTI_CONN.
    let server = NbdServer::new();
    let dev = TestDev::new(MIB);
    server
        .add_export(export("vol", dev.clone(), &["127.0.0.1/32"]))
        .unwrap();
    let addr = tcp_server(&server).await;
    let mut a = Client::go(TcpStream::connect(addr).await.unwrap(), "vol", false)
        .await
        .unwrap();
    let mut b = Client::go(TcpStream::connect(addr).await.unwrap(), "vol", false)
        .await
        .unwrap();
    assert_ne!(a.info.flags & TF_CAN_MULTI_CONN, 0);
    assert_eq!(a.write(0, b"from a", 0).await.unwrap(), 0);
    let f0 = dev.flushes.load(Ordering::SeqCst);
    assert_eq!(b.call(CMD_FLUSH, 0, 0, 0, &[]).await.unwrap().error, 0);
    assert_eq!(dev.flushes.load(Ordering::SeqCst), f0 + 1);
    assert_eq!(b.read(0, 6).await.unwrap(), b"from a");
    assert_eq!(server.stats().connections_open, 2);
}

#[tokio::test]
async fn a_maximal_request_round_trips() {
    let server = NbdServer::new();
    server
        .add_export(export(
            "vol",
            Arc::new(MemBlockDevice::new(40 * MIB)),
            &["127.0.0.1/32"],
        ))
        .unwrap();
    let addr = tcp_server(&server).await;
    let mut c = Client::go(TcpStream::connect(addr).await.unwrap(), "vol", true)
        .await
        .unwrap();
    let d = pattern(9, 32 << 20);
    assert_eq!(c.write(4 * MIB + 1, &d, CMD_FLAG_FUA).await.unwrap(), 0);
    assert!(c.read(4 * MIB + 1, 32 << 20).await.unwrap() == d);
}

/// Connects to `addr` from the local address `from` (any port).
async fn connect_from(from: &str, addr: std::net::SocketAddr) -> TcpStream {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind(format!("{from}:0").parse().unwrap()).unwrap();
    s.connect(addr).await.unwrap()
}

/// Issue #16 item 2: one client address cannot take every connection place. Past its bound a
/// new connection from that address is closed before the greeting and counted as refused,
/// while another address still gets in; a place comes back when its connection ends.
#[tokio::test]
async fn connections_per_address_are_bounded() {
    let server = NbdServer::with_limits(Limits {
        max_connections_per_address: 3,
        ..Limits::default()
    });
    server
        .add_export(export(
            "vol",
            Arc::new(MemBlockDevice::new(MIB)),
            &["127.0.0.0/8"],
        ))
        .unwrap();
    let addr = tcp_server(&server).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = connect_from("127.0.0.1", addr).await;
        greet(&mut s).await.unwrap();
        held.push(s);
    }
    let mut over = connect_from("127.0.0.1", addr).await;
    let mut b = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), over.read_to_end(&mut b))
        .await
        .expect("the fourth connection from one address should be closed at once")
        .unwrap();
    assert_eq!(
        n, 0,
        "a connection over the bound gets nothing, not even the greeting"
    );
    assert_eq!(server.stats().connections_refused, 1);
    // Another address is not held back by the first one's connections, and does I/O.
    let mut c = Client::go(connect_from("127.0.0.2", addr).await, "vol", false)
        .await
        .unwrap();
    c.write(0, b"other", 0).await.unwrap();
    assert_eq!(c.read(0, 5).await.unwrap(), b"other");
    // One of the first address's connections ends: its place comes back.
    drop(held.pop());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut s = connect_from("127.0.0.1", addr).await;
        if greet(&mut s).await.is_ok() {
            // Held, so the server cannot see it close before the count below is read.
            held.push(s);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the place of a closed connection did not come back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.stats().connections_open, 4);
}
