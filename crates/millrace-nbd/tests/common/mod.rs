//! A tiny NBD client for the tests: enough of the protocol to drive the server byte by byte,
//! including things a well-behaved client never sends.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use millrace_block::{BlockDevice, BufResult, IoBuf, IoFuture, MemBlockDevice};
use millrace_nbd::proto::*;
use millrace_nbd::{Export, NbdServer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

pub struct OptReply {
    pub option: u32,
    pub kind: u32,
    pub data: Vec<u8>,
}

/// What GO/INFO told us.
#[derive(Debug, Default, Clone)]
pub struct Info {
    pub size: u64,
    pub flags: u16,
    pub name: Option<String>,
    pub description: Option<String>,
    pub block: Option<(u32, u32, u32)>,
}

pub struct Reply {
    pub handle: u64,
    pub error: u32,
    pub data: Vec<u8>,
    pub message: String,
}

pub struct Client<S: Stream> {
    pub s: S,
    pub info: Info,
    pub structured: bool,
    next: u64,
}

/// Reads the greeting and sends client flags (fixed newstyle, no zeroes).
pub async fn greet<S: Stream>(s: &mut S) -> io::Result<()> {
    let mut g = [0u8; 18];
    s.read_exact(&mut g).await?;
    assert_eq!(&g[0..16], b"NBDMAGICIHAVEOPT");
    assert_eq!(u16::from_be_bytes([g[16], g[17]]), 3);
    s.write_all(&3u32.to_be_bytes()).await
}

pub async fn send_option<S: Stream>(s: &mut S, opt: u32, data: &[u8]) -> io::Result<()> {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).await
}

pub async fn read_opt_reply<S: Stream>(s: &mut S) -> io::Result<OptReply> {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).await?;
    assert_eq!(
        u64::from_be_bytes(h[0..8].try_into().unwrap()),
        OPT_REPLY_MAGIC
    );
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    let mut data = vec![0u8; len as usize];
    s.read_exact(&mut data).await?;
    Ok(OptReply {
        option: u32::from_be_bytes(h[8..12].try_into().unwrap()),
        kind: u32::from_be_bytes(h[12..16].try_into().unwrap()),
        data,
    })
}

pub fn info_data(name: &str, reqs: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(reqs.len() as u16).to_be_bytes());
    for r in reqs {
        d.extend_from_slice(&r.to_be_bytes());
    }
    d
}

/// Sends INFO or GO and collects the replies up to the final one: Ok(info) on ACK, Err(reply
/// type and message) on an error reply.
pub async fn info_or_go<S: Stream>(
    s: &mut S,
    opt: u32,
    name: &str,
) -> io::Result<Result<Info, (u32, String)>> {
    send_option(
        s,
        opt,
        &info_data(name, &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
    )
    .await?;
    let mut info = Info::default();
    loop {
        let r = read_opt_reply(s).await?;
        assert_eq!(r.option, opt);
        match r.kind {
            REP_ACK => return Ok(Ok(info)),
            REP_INFO => {
                let d = &r.data;
                match u16::from_be_bytes([d[0], d[1]]) {
                    INFO_EXPORT => {
                        info.size = u64::from_be_bytes(d[2..10].try_into().unwrap());
                        info.flags = u16::from_be_bytes([d[10], d[11]]);
                    }
                    INFO_NAME => info.name = Some(String::from_utf8(d[2..].to_vec()).unwrap()),
                    INFO_DESCRIPTION => {
                        info.description = Some(String::from_utf8(d[2..].to_vec()).unwrap())
                    }
                    INFO_BLOCK_SIZE => {
                        let g = |i: usize| u32::from_be_bytes(d[i..i + 4].try_into().unwrap());
                        info.block = Some((g(2), g(6), g(10)));
                    }
                    t => panic!("unexpected info type {t}"),
                }
            }
            k if k & 0x8000_0000 != 0 => {
                return Ok(Err((k, String::from_utf8_lossy(&r.data).into_owned())))
            }
            k => panic!("unexpected option reply type {k:#x}"),
        }
    }
}

impl<S: Stream> Client<S> {
    /// Negotiates with NBD_OPT_GO (after NBD_OPT_STRUCTURED_REPLY if asked).
    pub async fn go(mut s: S, name: &str, structured: bool) -> io::Result<Self> {
        greet(&mut s).await?;
        if structured {
            send_option(&mut s, OPT_STRUCTURED_REPLY, &[]).await?;
            let r = read_opt_reply(&mut s).await?;
            assert_eq!(r.kind, REP_ACK);
        }
        let info = info_or_go(&mut s, OPT_GO, name)
            .await?
            .map_err(|(k, m)| io::Error::other(format!("GO refused ({k:#x}): {m}")))?;
        Ok(Self {
            s,
            info,
            structured,
            next: 1,
        })
    }

    /// A client on a stream that already negotiated (by NBD_OPT_EXPORT_NAME, say).
    pub fn raw(s: S, structured: bool) -> Self {
        Self {
            s,
            info: Info::default(),
            structured,
            next: 1,
        }
    }

    pub async fn send(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        len: u32,
        data: &[u8],
    ) -> io::Result<u64> {
        let handle = self.next;
        self.next += 1;
        let h = encode_request(&Request {
            flags,
            kind,
            handle,
            offset,
            len,
        });
        let mut b = h.to_vec();
        b.extend_from_slice(data);
        self.s.write_all(&b).await?;
        Ok(handle)
    }

    /// Reads one complete reply. `read_lens` maps handles of reads in flight to their length
    /// (a simple reply does not say whether data follows).
    pub async fn recv(&mut self, read_lens: &HashMap<u64, u32>) -> io::Result<Reply> {
        let mut m = [0u8; 4];
        self.s.read_exact(&mut m).await?;
        match u32::from_be_bytes(m) {
            SIMPLE_REPLY_MAGIC => {
                let mut h = [0u8; 12];
                self.s.read_exact(&mut h).await?;
                let error = u32::from_be_bytes(h[0..4].try_into().unwrap());
                let handle = u64::from_be_bytes(h[4..12].try_into().unwrap());
                let mut data = Vec::new();
                if error == 0 {
                    if let Some(&l) = read_lens.get(&handle) {
                        data = vec![0u8; l as usize];
                        self.s.read_exact(&mut data).await?;
                    }
                }
                Ok(Reply {
                    handle,
                    error,
                    data,
                    message: String::new(),
                })
            }
            STRUCTURED_REPLY_MAGIC => {
                let mut data = Vec::new();
                let (mut error, mut message) = (0, String::new());
                loop {
                    let mut h = [0u8; 16];
                    self.s.read_exact(&mut h).await?;
                    let flags = u16::from_be_bytes([h[0], h[1]]);
                    let kind = u16::from_be_bytes([h[2], h[3]]);
                    let handle = u64::from_be_bytes(h[4..12].try_into().unwrap());
                    let len = u32::from_be_bytes(h[12..16].try_into().unwrap());
                    let mut p = vec![0u8; len as usize];
                    self.s.read_exact(&mut p).await?;
                    match kind {
                        REPLY_TYPE_NONE => {}
                        REPLY_TYPE_OFFSET_DATA => data.extend_from_slice(&p[8..]),
                        REPLY_TYPE_ERROR => {
                            error = u32::from_be_bytes(p[0..4].try_into().unwrap());
                            let ml = u16::from_be_bytes([p[4], p[5]]) as usize;
                            message = String::from_utf8_lossy(&p[6..6 + ml]).into_owned();
                        }
                        k => panic!("unexpected chunk type {k:#x}"),
                    }
                    if flags & REPLY_FLAG_DONE != 0 {
                        return Ok(Reply {
                            handle,
                            error,
                            data,
                            message,
                        });
                    }
                    let mut m = [0u8; 4];
                    self.s.read_exact(&mut m).await?;
                    assert_eq!(u32::from_be_bytes(m), STRUCTURED_REPLY_MAGIC);
                }
            }
            x => panic!("bad reply magic {x:#x}"),
        }
    }

    /// One request, one reply.
    pub async fn call(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        len: u32,
        data: &[u8],
    ) -> io::Result<Reply> {
        let h = self.send(kind, flags, offset, len, data).await?;
        let mut lens = HashMap::new();
        if kind == CMD_READ {
            lens.insert(h, len);
        }
        let r = self.recv(&lens).await?;
        assert_eq!(r.handle, h);
        Ok(r)
    }

    pub async fn read(&mut self, offset: u64, len: u32) -> io::Result<Vec<u8>> {
        let r = self.call(CMD_READ, 0, offset, len, &[]).await?;
        if r.error != 0 {
            return Err(io::Error::other(format!(
                "read error {}: {}",
                r.error, r.message
            )));
        }
        Ok(r.data)
    }

    pub async fn write(&mut self, offset: u64, data: &[u8], flags: u16) -> io::Result<u32> {
        Ok(self
            .call(CMD_WRITE, flags, offset, data.len() as u32, data)
            .await?
            .error)
    }

    pub async fn disconnect(mut self) -> io::Result<()> {
        self.send(CMD_DISC, 0, 0, 0, &[]).await?;
        // The server closes after finishing what is in flight.
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), self.s.read_to_end(&mut rest))
            .await
            .expect("the server closes after NBD_CMD_DISC")?;
        assert!(rest.is_empty());
        Ok(())
    }
}

/// Deterministic bytes that differ per offset, so misplaced data shows.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A device that wraps a RAM disk, counts flushes, can delay reads at chosen offsets (to force
/// out-of-order completion), and records the most calls it saw at once.
pub struct TestDev {
    pub mem: MemBlockDevice,
    pub flushes: AtomicUsize,
    pub slow_offsets: Mutex<Vec<u64>>,
    pub delay: Duration,
    pub active: AtomicUsize,
    pub max_active: AtomicUsize,
    pub discards: AtomicUsize,
    pub zeroes: AtomicUsize,
}

impl TestDev {
    pub fn new(size: u64) -> Arc<Self> {
        Arc::new(Self {
            mem: MemBlockDevice::new(size),
            flushes: AtomicUsize::new(0),
            slow_offsets: Mutex::new(Vec::new()),
            delay: Duration::from_millis(300),
            active: AtomicUsize::new(0),
            max_active: AtomicUsize::new(0),
            discards: AtomicUsize::new(0),
            zeroes: AtomicUsize::new(0),
        })
    }
    fn enter(&self) {
        let n = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_active.fetch_max(n, Ordering::SeqCst);
    }
    fn leave(&self) {
        self.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl BlockDevice for TestDev {
    fn size_bytes(&self) -> u64 {
        self.mem.size_bytes()
    }
    fn preferred_io_bytes(&self) -> u64 {
        // A RAID6 stripe of 6 data strips of 64 KiB: not a power of two.
        6 * 65536
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.enter();
        if self.slow_offsets.lock().unwrap().contains(&offset) {
            std::thread::sleep(self.delay);
        }
        let r = self.mem.read_at(offset, buf);
        self.leave();
        r
    }
    /// The data path's face: a slow read waits without holding the core (as a drive's
    /// completion would), so other requests overtake it.
    fn read_async(&self, offset: u64, mut buf: IoBuf) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            self.enter();
            if self.slow_offsets.lock().unwrap().contains(&offset) {
                tokio::time::sleep(self.delay).await;
            }
            let r = self.mem.read_at(offset, &mut buf);
            self.leave();
            (r, buf)
        })
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.enter();
        let r = self.mem.write_at(offset, data);
        self.leave();
        r
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.discards.fetch_add(1, Ordering::SeqCst);
        self.mem.write_zeroes(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zeroes.fetch_add(1, Ordering::SeqCst);
        self.mem.write_zeroes(offset, len)
    }
}

pub fn export(name: &str, dev: Arc<dyn BlockDevice>, allowed: &[&str]) -> Export {
    Export {
        name: name.into(),
        description: format!("test export {name}"),
        dev,
        read_only: false,
        // Bare addresses are a network of one.
        allowed: allowed
            .iter()
            .map(|a| {
                a.parse()
                    .or_else(|_| a.parse::<std::net::IpAddr>().map(Into::into))
                    .unwrap()
            })
            .collect(),
    }
}

/// A server on an ephemeral 127.0.0.1 port; returns the server and the address.
pub async fn tcp_server(server: &NbdServer) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let s = server.clone();
    tokio::spawn(async move { s.serve_tcp(l).await });
    addr
}

/// A server on a Unix socket in `dir`.
pub fn unix_server(server: &NbdServer, dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("nbd.sock");
    let l = tokio::net::UnixListener::bind(&path).unwrap();
    let s = server.clone();
    tokio::spawn(async move { s.serve_unix(l).await });
    path
}

/// Waits, at most 10 s, until the server has seen every connection close (it sees a close in
/// its own time); the caller asserts the count.
pub async fn wait_all_closed(server: &NbdServer) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while server.stats().connections_open != 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
