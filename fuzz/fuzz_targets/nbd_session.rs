//! A whole NBD connection driven by arbitrary bytes: the handshake's option parsing and the
//! transmission phase's request parsing. The server must answer or hang up, never panic, and
//! never keep the connection open once the client has stopped sending. The pure parsers are fed
//! the same bytes too.
//!
//! The first byte chooses what the harness sends before the fuzzed bytes, so that inputs reach
//! past the handshake: bit 0 the client flags (fixed newstyle, no zeroes), bit 1
//! NBD_OPT_STRUCTURED_REPLY, bit 2 NBD_OPT_SET_META_CONTEXT base:allocation, bit 3 NBD_OPT_GO
//! (the fuzzed bytes are then requests), bit 4 the read-only export instead of the writable
//! one, bits 5-6 who the client is (the local socket, an allowed TCP address, one that no
//! export allows).

#![no_main]

use libfuzzer_sys::fuzz_target;
use millrace_block::MemBlockDevice;
use millrace_nbd::meta::{parse_meta_request, OPT_SET_META_CONTEXT};
use millrace_nbd::proto::*;
use millrace_nbd::{Export, Limits, NbdServer};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

/// Longer than any honest exchange here takes (the payload timeout is 2 s); an input that runs
/// into it kept the server's side open after the client stopped sending.
const SESSION_LIMIT: Duration = Duration::from_secs(10);

struct World {
    rt: Runtime,
    server: NbdServer,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let server = NbdServer::with_limits(Limits {
            handshake_timeout: Duration::from_secs(2),
            payload_timeout: Duration::from_secs(2),
            max_in_flight: 8,
            ..Limits::default()
        });
        for (name, read_only) in [("vol", false), ("ro", true)] {
            server
                .add_export(Export {
                    name: name.into(),
                    description: "fuzz".into(),
                    dev: Arc::new(MemBlockDevice::new(1 << 20)),
                    read_only,
                    allowed: vec!["127.0.0.0/8".parse().expect("a network")],
                })
                .expect("an export");
        }
        World { rt, server }
    })
}

fn option(out: &mut Vec<u8>, opt: u32, data: &[u8]) {
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&opt.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

fn prefix(mode: u8) -> Vec<u8> {
    let mut out = Vec::new();
    if mode & 1 == 0 {
        return out;
    }
    out.extend_from_slice(&(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).to_be_bytes());
    let name: &[u8] = if mode & 16 != 0 { b"ro" } else { b"vol" };
    if mode & 2 != 0 {
        option(&mut out, OPT_STRUCTURED_REPLY, &[]);
    }
    if mode & 4 != 0 {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name);
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(&15u32.to_be_bytes());
        d.extend_from_slice(b"base:allocation");
        option(&mut out, OPT_SET_META_CONTEXT, &d);
    }
    if mode & 8 != 0 {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name);
        d.extend_from_slice(&0u16.to_be_bytes());
        option(&mut out, OPT_GO, &d);
    }
    out
}

async fn session(w: &World, mode: u8, rest: &[u8]) {
    let peer: Option<SocketAddr> = match (mode >> 5) & 3 {
        0 | 3 => None,
        1 => Some("127.0.0.1:40000".parse().expect("an address")),
        _ => Some("192.0.2.1:40000".parse().expect("an address")),
    };
    let mut out = prefix(mode);
    out.extend_from_slice(rest);
    let (client, server_end) = tokio::io::duplex(256 << 10);
    let (mut rd, mut wr) = tokio::io::split(client);
    let serve = w.server.serve_stream(server_end, peer);
    let send = async move {
        // The server may hang up at any point: a failed write is an answer, not an error.
        if wr.write_all(&out).await.is_ok() {
            let _ = wr.shutdown().await;
        }
        wr
    };
    let recv = async move {
        let mut first = Vec::new();
        let mut sink = vec![0u8; 64 << 10];
        while let Ok(n) = rd.read(&mut sink).await {
            if n == 0 {
                break;
            }
            if first.len() < 18 {
                first.extend_from_slice(&sink[..n.min(18)]);
            }
        }
        first
    };
    let all = async { tokio::join!(serve, send, recv) };
    let Ok((_, _, first)) = tokio::time::timeout(SESSION_LIMIT, all).await else {
        panic!("the server kept the connection open {SESSION_LIMIT:?} after the client stopped sending");
    };
    // Whoever connects is greeted first (serve_stream leaves refusing addresses to the
    // negotiation), whatever follows.
    assert!(first.starts_with(b"NBDMAGICIHAVEOPT"), "no greeting: {first:?}");
}

fuzz_target!(|input: &[u8]| {
    // The pure parsers, on the raw bytes.
    if let Ok(h) = <&[u8; REQUEST_LEN]>::try_from(input.get(..REQUEST_LEN).unwrap_or_default()) {
        let _ = parse_request(h);
    }
    if let Ok(h) = <&[u8; 16]>::try_from(input.get(..16).unwrap_or_default()) {
        let _ = parse_option_header(h);
    }
    let _ = parse_info_request(input);
    let _ = parse_meta_request(input);
    let _ = parse_name(input);

    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let w = world();
    w.rt.block_on(session(w, mode, rest));
});
