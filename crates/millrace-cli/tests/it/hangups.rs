//! Clients that hang up, against the real `millrace serve` binary (a test harness ignores
//! SIGPIPE for itself, so only the shipped binary can show a signal a peer raises): many NBD
//! clients over the Unix socket and over TCP announce 32 MiB writes and stall, start requests
//! and stop mid-header, pipeline reads and leave without reading the replies, and then hang up
//! every way a peer can (close, RST, half-close, a process killed with SIGKILL), in random
//! order, while a well-behaved client runs verified I/O. The server stays up, the good client
//! sees no error, no wrong byte and no wait of a second, and everything the hung-up
//! connections held comes back.

use crate::common;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{free_port, metric, millrace, run_ok, server_url};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const REQ_MAGIC: u32 = 0x2560_9513;
const REPLY_MAGIC: u32 = 0x6744_6698;
const OPT_MAGIC: u64 = 0x4948_4156_454F_5054;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const BIG: usize = 32 << 20;
const EXPORT: &str = "tank/v";

/// A byte stream to the server: the Unix socket or TCP.
trait Conn: Read + Write + Send + 'static {
    fn set_timeouts(&self, t: Option<Duration>);
    /// Hangs up with a TCP reset where the transport has one (SO_LINGER 0, then close).
    fn reset(self: Box<Self>);
    fn half_close(&self);
}

impl Conn for UnixStream {
    fn set_timeouts(&self, t: Option<Duration>) {
        self.set_read_timeout(t).unwrap();
        self.set_write_timeout(t).unwrap();
    }
    fn reset(self: Box<Self>) {
        // A Unix socket has no reset: its peer sees the close.
        drop(self);
    }
    fn half_close(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

impl Conn for std::net::TcpStream {
    fn set_timeouts(&self, t: Option<Duration>) {
        self.set_read_timeout(t).unwrap();
        self.set_write_timeout(t).unwrap();
    }
    fn reset(self: Box<Self>) {
        common::reset(*self);
    }
    fn half_close(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

#[derive(Clone)]
enum Target {
    Unix(PathBuf),
    Tcp(std::net::SocketAddr),
}

impl Target {
    fn connect(&self) -> Box<dyn Conn> {
        match self {
            Target::Unix(p) => Box::new(UnixStream::connect(p).expect("connect to nbd.sock")),
            Target::Tcp(a) => Box::new(std::net::TcpStream::connect(a).expect("connect over TCP")),
        }
    }
}

/// Fixed newstyle, NBD_OPT_EXPORT_NAME with no zero padding: the connection is then in
/// transmission; returns the export's size.
fn handshake(c: &mut dyn Conn) -> u64 {
    let mut hello = [0u8; 18];
    c.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..8], b"NBDMAGIC");
    c.write_all(&3u32.to_be_bytes()).unwrap(); // FIXED_NEWSTYLE | NO_ZEROES
    let mut opt = Vec::new();
    opt.extend_from_slice(&OPT_MAGIC.to_be_bytes());
    opt.extend_from_slice(&1u32.to_be_bytes());
    opt.extend_from_slice(&(EXPORT.len() as u32).to_be_bytes());
    opt.extend_from_slice(EXPORT.as_bytes());
    c.write_all(&opt).unwrap();
    let mut reply = [0u8; 10];
    c.read_exact(&mut reply).unwrap();
    u64::from_be_bytes(reply[..8].try_into().unwrap())
}

fn header(kind: u16, handle: u64, offset: u64, len: u32) -> [u8; 28] {
    let mut h = [0u8; 28];
    h[..4].copy_from_slice(&REQ_MAGIC.to_be_bytes());
    h[6..8].copy_from_slice(&kind.to_be_bytes());
    h[8..16].copy_from_slice(&handle.to_be_bytes());
    h[16..24].copy_from_slice(&offset.to_be_bytes());
    h[24..28].copy_from_slice(&len.to_be_bytes());
    h
}

fn reply(c: &mut dyn Conn, handle: u64, data: &mut [u8]) -> std::io::Result<()> {
    let mut r = [0u8; 16];
    c.read_exact(&mut r)?;
    assert_eq!(u32::from_be_bytes(r[..4].try_into().unwrap()), REPLY_MAGIC);
    let err = u32::from_be_bytes(r[4..8].try_into().unwrap());
    assert_eq!(err, 0, "the server answered error {err}");
    assert_eq!(u64::from_be_bytes(r[8..16].try_into().unwrap()), handle);
    c.read_exact(data)
}

/// The well-behaved client: a write and a read-back of 4 KiB, each answered within a second.
fn good_io(c: &mut dyn Conn, rng: &mut impl Rng, size: u64, handle: &mut u64) {
    let offset = rng.random_range(0..size / 4096) * 4096;
    let data: Vec<u8> = (0..4096).map(|_| rng.random()).collect();
    let t0 = Instant::now();
    *handle += 1;
    c.write_all(&header(CMD_WRITE, *handle, offset, 4096))
        .unwrap();
    c.write_all(&data).unwrap();
    reply(c, *handle, &mut []).expect("the write is answered");
    *handle += 1;
    c.write_all(&header(CMD_READ, *handle, offset, 4096))
        .unwrap();
    let mut back = vec![0u8; 4096];
    reply(c, *handle, &mut back).expect("the read is answered");
    let took = t0.elapsed();
    assert!(
        data == back,
        "read back other bytes than were written at {offset}"
    );
    assert!(
        took < Duration::from_secs(1),
        "a 4 KiB write and read took {took:?} while other clients stalled"
    );
}

/// A hostile client's part, and how it ends.
enum Hostile {
    /// Announced a 32 MiB write and sent all of it but the last 4 KiB.
    StalledWrite(Box<dyn Conn>),
    /// Sent 16 bytes of a request header.
    PartialHeader(Box<dyn Conn>),
    /// Asked for 16 reads of 64 KiB and reads none of the replies.
    UnreadReplies(Box<dyn Conn>),
    /// Another process, mid-write, to be killed with SIGKILL.
    Process(Child),
}

fn stalled_write(t: &Target, i: u64, zeros: &Arc<Vec<u8>>, done: &Arc<AtomicBool>) -> Hostile {
    let mut c = t.connect();
    handshake(&mut *c);
    c.write_all(&header(CMD_WRITE, i, 0, BIG as u32)).unwrap();
    // Past its share, the server reads no more: the rest of the payload waits in our socket.
    c.set_timeouts(Some(Duration::from_millis(200)));
    let mut sent = 0;
    let t0 = Instant::now();
    while sent < BIG - 4096
        && t0.elapsed() < Duration::from_secs(2)
        && !done.load(Ordering::Relaxed)
    {
        match c.write(&zeros[sent..BIG - 4096]) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    Hostile::StalledWrite(c)
}

fn unread_replies(t: &Target) -> Hostile {
    let mut c = t.connect();
    handshake(&mut *c);
    for h in 0..16 {
        c.write_all(&header(CMD_READ, 1000 + h, h * (64 << 10), 64 << 10))
            .unwrap();
    }
    Hostile::UnreadReplies(c)
}

/// A python3 child that does the handshake, announces a write and sends half of it.
fn killed_process(t: &Target) -> Hostile {
    let connect = match t {
        Target::Unix(p) => format!(
            "s=socket.socket(socket.AF_UNIX); s.connect({:?})",
            p.display().to_string()
        ),
        Target::Tcp(a) => format!(
            "s=socket.create_connection(({:?}, {}))",
            a.ip().to_string(),
            a.port()
        ),
    };
    let script = format!(
        "import socket,struct,time\n{connect}\n\
         b=b''\nwhile len(b)<18: b+=s.recv(18-len(b))\n\
         s.sendall(struct.pack('>I',3)+struct.pack('>QII',{OPT_MAGIC},1,{n})+b'{EXPORT}')\n\
         b=b''\nwhile len(b)<10: b+=s.recv(10-len(b))\n\
         s.sendall(struct.pack('>IHHQQI',{REQ_MAGIC},0,1,7,0,65536)+bytes(32768))\n\
         print('ready',flush=True)\ntime.sleep(600)\n",
        n = EXPORT.len()
    );
    let mut child = Command::new("python3")
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut line = [0u8; 6];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut line)
        .unwrap();
    assert_eq!(&line, b"ready\n");
    Hostile::Process(child)
}

/// Ends a hostile client one of the ways a peer hangs up.
fn hang_up(h: Hostile, how: usize) {
    let c = match h {
        Hostile::Process(mut child) => {
            child.kill().unwrap();
            child.wait().unwrap();
            return;
        }
        Hostile::StalledWrite(c) | Hostile::PartialHeader(c) | Hostile::UnreadReplies(c) => c,
    };
    match how % 3 {
        0 => drop(c),
        1 => c.reset(),
        _ => {
            c.half_close();
            std::thread::sleep(Duration::from_millis(5));
            drop(c);
        }
    }
}

/// A RAID6 pool with one volume exported over NBD on the Unix socket and on `port`.
fn serve_raid6(dir: &Path, port: u16) -> common::Server {
    common::raid6_tank(dir);
    let server = common::serve(dir);
    run_ok(millrace(dir).args(["volume", "create", EXPORT, "--size", "256M"]));
    run_ok(millrace(dir).args([
        "export",
        "nbd",
        "add",
        EXPORT,
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--client",
        "127.0.0.1",
    ]));
    server
}

fn hostile_load(target: Target, server: &mut common::Server, url: &str, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let zeros = Arc::new(vec![0u8; BIG]);
    let done = Arc::new(AtomicBool::new(false));
    // 48 stalled 32 MiB writes, each from its own thread (a full socket blocks the writer).
    let stalled: Vec<_> = (0..48)
        .map(|i| {
            let (t, z, d) = (target.clone(), zeros.clone(), done.clone());
            std::thread::spawn(move || stalled_write(&t, i, &z, &d))
        })
        .collect();
    let mut hostile: Vec<Hostile> = stalled.into_iter().map(|h| h.join().unwrap()).collect();
    for _ in 0..8 {
        let mut c = target.connect();
        handshake(&mut *c);
        c.write_all(&header(CMD_WRITE, 9, 0, 4096)[..16]).unwrap();
        hostile.push(Hostile::PartialHeader(c));
    }
    for _ in 0..8 {
        hostile.push(unread_replies(&target));
    }
    for _ in 0..4 {
        hostile.push(killed_process(&target));
    }
    // The well-behaved client, answered within a second while all of that holds.
    let mut good = target.connect();
    let size = handshake(&mut *good);
    good.set_timeouts(Some(Duration::from_secs(10)));
    let mut handle = 1u64 << 40;
    for _ in 0..5 {
        good_io(&mut *good, &mut rng, size, &mut handle);
    }
    // Then everyone hangs up, in random order and ways, while the good client goes on.
    hostile.shuffle(&mut rng);
    for (i, h) in hostile.into_iter().enumerate() {
        hang_up(h, rng.random_range(0..3) + i);
        if i % 8 == 0 {
            good_io(&mut *good, &mut rng, size, &mut handle);
        }
        assert!(server.alive(), "millrace serve ended when a client hung up");
    }
    done.store(true, Ordering::Relaxed);
    for _ in 0..5 {
        good_io(&mut *good, &mut rng, size, &mut handle);
    }
    // What the hung-up connections held comes back: only the good client is left, and the
    // buffer pool holds nothing once it is idle.
    let t0 = Instant::now();
    loop {
        let open = metric(url, "millrace_export_connections{");
        let in_use = metric(url, "millrace_buffer_pool_bytes{state=\"in_use\"}");
        if open == 1.0 && in_use == 0.0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(40),
            "after the hang-ups, {open} connections are open and {in_use} buffer bytes in use"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(good);
    // The requests the hung-up clients left in flight (the unread reads at least) were counted.
    let abandoned = metric(
        url,
        "millrace_export_requests_abandoned_total{protocol=\"nbd\"}",
    );
    assert!(abandoned > 0.0, "no request was counted as abandoned");
}

#[test]
fn nbd_clients_hanging_up_under_load_neither_end_nor_starve_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = serve_raid6(dir.path(), port);
    let home = dir.path().join("home");
    let url = server_url(&home);
    hostile_load(Target::Unix(home.join("nbd.sock")), &mut server, &url, 1);
    hostile_load(
        Target::Tcp(format!("127.0.0.1:{port}").parse().unwrap()),
        &mut server,
        &url,
        2,
    );
    assert!(server.alive());
    let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap();
    assert!(!log.contains("panic"), "the server panicked:\n{log}");
    // Hang-ups are logged at most at the rate limit, not once per connection.
    assert!(
        log.lines().count() < 200,
        "{} log lines for 136 hang-ups:\n{log}",
        log.lines().count()
    );
}
