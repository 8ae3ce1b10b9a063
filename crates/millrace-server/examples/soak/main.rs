//! The soak client (tests/soak/run.sh runs it against a `millrace serve`): many clients over
//! loopback, each in a loop of NVMe/TCP controllers that write and read back, controllers
//! dropped in the middle of a write, NBD connections that write and read back, NBD writes
//! abandoned half-way through their payload, connections that send half an ICReq and vanish,
//! and HTTP requests sent half and complete. Each client owns a range of blocks and writes them
//! in passes, each pass's data its own; a block that a dropped NVMe/TCP write may still reach
//! is never written again (an abandoned NBD write has no whole payload, so none of it may
//! land), so every block's last acknowledged write must read back right after it, and at the
//! end (over a fresh controller or connection) that write or a later dropped one, nothing else.
//! Exits non-zero if one does not.
//!
//! Usage: soak NVME_ADDR NQN API_ADDR SECONDS CLIENTS VOLUME_BYTES SALT NBD_SOCKET NBD_EXPORT
//! NBD_VOLUME_BYTES (SALT: a run's own data, so blocks written by an earlier run with another
//! salt do not read as this run's).

mod nbd;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use millrace_nvmf::initiator::{HostController, HostOptions};
use parking_lot::Mutex;

const BLOCK: u64 = 4096;

static SALT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What pass `pass` writes to `block`.
fn pattern((block, pass): (u64, u64)) -> Vec<u8> {
    let salt = SALT.load(std::sync::atomic::Ordering::Relaxed);
    let mut x = (block ^ salt << 40 ^ pass << 52).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..BLOCK)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

struct Shared {
    nvme: SocketAddr,
    api: SocketAddr,
    nqn: String,
    nbd_sock: PathBuf,
    nbd_export: String,
    nbd_size: u64,
    /// Each block's last acknowledged pass over NVMe/TCP, and over NBD (another volume).
    acked: Mutex<BTreeMap<u64, u64>>,
    nbd_acked: Mutex<BTreeMap<u64, u64>>,
    /// The pass of the unacknowledged write each tainted block last saw (it may have landed
    /// after the block's last acknowledged write, or not), NVMe/TCP and NBD.
    unacked: Mutex<BTreeMap<u64, u64>>,
    nbd_unacked: Mutex<BTreeMap<u64, u64>>,
    /// Writes acknowledged, NVMe/TCP and NBD.
    writes: Mutex<[u64; 2]>,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    nvme_rounds: u64,
    nvme_dropped: u64,
    nbd_rounds: u64,
    nbd_dropped: u64,
    nbd_unread: u64,
    half: u64,
    http: u64,
}

/// Blocks one client writes: its own range of each volume, pass after pass, skipping blocks
/// an unacknowledged write may still reach (it could land after a later pass's write).
struct Range {
    start: u64,
    next: u64,
    end: u64,
    pass: u64,
    tainted: BTreeSet<u64>,
}

impl Range {
    fn new(start: u64, end: u64) -> Range {
        Range {
            start,
            next: start,
            end,
            pass: 0,
            tainted: BTreeSet::new(),
        }
    }

    /// The next block and its pass; None once every block is tainted.
    fn take(&mut self) -> Option<(u64, u64)> {
        for _ in self.start..=self.end {
            if self.next >= self.end {
                self.next = self.start;
                self.pass += 1;
            }
            let b = self.next;
            self.next += 1;
            if !self.tainted.contains(&b) {
                return Some((b, self.pass));
            }
        }
        None
    }

    /// A block whose write was not acknowledged: never written again.
    fn taint(&mut self, (b, _): (u64, u64)) {
        self.tainted.insert(b);
    }
}

async fn lba_bytes(c: &HostController) -> Option<u32> {
    let id = c.admin.identify(0, 1).await.ok()?;
    let f = (id[26] & 0xf) as usize;
    Some(1 << id[128 + 4 * f + 2])
}

fn host(client: u64) -> HostOptions {
    HostOptions {
        hostnqn: format!("nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-{client:012}"),
        ..Default::default()
    }
}

/// One controller: a few blocks written (each acknowledged one recorded), each read back.
async fn writes(s: &Shared, client: u64, r: &mut Range) -> Result<(), String> {
    let c = HostController::connect(s.nvme, &s.nqn, &host(client), 1)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let lba = lba_bytes(&c).await.ok_or("identify failed")?;
    let per = BLOCK / lba as u64;
    for _ in 0..8 {
        let Some(t) = r.take() else { break };
        let b = t.0;
        c.io[0]
            .write(1, b * per, pattern(t), lba)
            .await
            .map_err(|e| format!("write of block {b}: {e}"))?;
        s.acked.lock().insert(b, t.1);
        s.writes.lock()[0] += 1;
        let back = c.io[0]
            .read(1, b * per, per as u32, lba)
            .await
            .map_err(|e| format!("read of block {b}: {e}"))?;
        if back != pattern(t) {
            return Err(format!("block {b} read back wrong right after its write"));
        }
    }
    Ok(())
}

/// A controller dropped while its write is in flight: that block is never written again.
async fn dropped_write(s: &Shared, client: u64, r: &mut Range, wait_us: u64) {
    let Ok(c) = HostController::connect(s.nvme, &s.nqn, &host(client), 1).await else {
        return;
    };
    let Some(lba) = lba_bytes(&c).await else {
        return;
    };
    let Some(t) = r.take() else { return };
    r.taint(t);
    s.unacked.lock().insert(t.0, t.1);
    let q = c.io[0].clone();
    let per = BLOCK / lba as u64;
    let w = tokio::spawn(async move { q.write(1, t.0 * per, pattern(t), lba).await });
    tokio::time::sleep(Duration::from_micros(wait_us)).await;
    w.abort();
    drop(c);
}

/// One NBD connection: a few blocks written and read back; it says goodbye, or just goes.
async fn nbd_writes(s: &Shared, r: &mut Range, polite: bool) -> Result<(), String> {
    let mut c = nbd::Nbd::connect(&s.nbd_sock, &s.nbd_export).await?;
    for _ in 0..8 {
        let Some(t) = r.take() else { break };
        let b = t.0;
        c.write(b * BLOCK, &pattern(t)).await?;
        s.nbd_acked.lock().insert(b, t.1);
        s.writes.lock()[1] += 1;
        if c.read(b * BLOCK, BLOCK as u32).await? != pattern(t) {
            return Err(format!(
                "NBD block {b} read back wrong right after its write"
            ));
        }
    }
    if polite {
        c.disconnect().await;
    }
    Ok(())
}

/// An NBD write abandoned half-way through its payload: none of it may land.
async fn nbd_dropped(s: &Shared, r: &mut Range) {
    let Ok(c) = nbd::Nbd::connect(&s.nbd_sock, &s.nbd_export).await else {
        return;
    };
    if let Some(t) = r.take() {
        // Not tainted: half a payload must never reach the volume, so the block is written
        // again in later passes and a landed half would read back wrong.
        s.nbd_unacked.lock().insert(t.0, t.1);
        c.half_write(t.0 * BLOCK, &pattern(t)).await;
    }
}

/// Half of an ICReq, then gone; or half an HTTP request; or a whole one.
async fn half(s: &Shared, kind: u64) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    match kind {
        0 => {
            let mut t = tokio::net::TcpStream::connect(s.nvme)
                .await
                .map_err(|e| e.to_string())?;
            let _ = t.write_all(&[0u8, 0, 128, 0, 128, 0, 0, 0, 0, 0]).await;
        }
        1 => {
            let mut t = tokio::net::TcpStream::connect(s.api)
                .await
                .map_err(|e| e.to_string())?;
            let _ = t
                .write_all(format!("GET /api/v1/status HTTP/1.1\r\nHost: {}\r\n", s.api).as_bytes())
                .await;
        }
        _ => {
            let mut t = tokio::net::TcpStream::connect(s.api)
                .await
                .map_err(|e| e.to_string())?;
            t.write_all(
                format!(
                    "GET /api/v1/status HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                    s.api
                )
                .as_bytes(),
            )
            .await
            .map_err(|e| e.to_string())?;
            let mut out = Vec::new();
            tokio::time::timeout(Duration::from_secs(30), t.read_to_end(&mut out))
                .await
                .map_err(|_| "the API did not answer in 30 s".to_string())?
                .map_err(|e| e.to_string())?;
            if !out.starts_with(b"HTTP/1.1 200") {
                return Err(format!(
                    "the API answered {:?}",
                    String::from_utf8_lossy(&out[..out.len().min(80)])
                ));
            }
        }
    }
    Ok(())
}

async fn client(
    s: Arc<Shared>,
    id: u64,
    mut nvme: Range,
    mut nbd: Range,
    until: Instant,
) -> Result<(), String> {
    let mut rng = Rng(id.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
    while Instant::now() < until {
        match rng.next() % 15 {
            0..=3 => {
                writes(&s, id, &mut nvme).await?;
                s.counts.lock().nvme_rounds += 1;
            }
            4..=5 => {
                dropped_write(&s, id, &mut nvme, rng.next() % 2000).await;
                s.counts.lock().nvme_dropped += 1;
            }
            6 => {
                half(&s, 0).await?;
                s.counts.lock().half += 1;
            }
            7 => {
                half(&s, 1).await?;
                s.counts.lock().half += 1;
            }
            8..=9 => {
                half(&s, 2).await?;
                s.counts.lock().http += 1;
            }
            10..=11 => {
                nbd_writes(&s, &mut nbd, rng.next().is_multiple_of(2)).await?;
                s.counts.lock().nbd_rounds += 1;
            }
            13 => {
                nbd_dropped(&s, &mut nbd).await;
                s.counts.lock().nbd_dropped += 1;
            }
            _ => {
                if let Ok(c) = nbd::Nbd::connect(&s.nbd_sock, &s.nbd_export).await {
                    c.unread_reads(s.nbd_size).await;
                }
                s.counts.lock().nbd_unread += 1;
            }
        }
    }
    Ok(())
}

/// What a block read back at the end held.
#[derive(Default, Clone, Copy)]
struct Tally {
    /// Neither its last acknowledged write nor a later unacknowledged one: lost.
    wrong: usize,
    /// A later unacknowledged write's data, which may land.
    landed: usize,
}

impl Tally {
    fn judge(&mut self, back: &[u8], (b, pass): (u64, u64), unacked: &BTreeMap<u64, u64>) {
        if back == pattern((b, pass)) {
            return;
        }
        match unacked.get(&b) {
            Some(&u) if u > pass && back == pattern((b, u)) => self.landed += 1,
            _ => self.wrong += 1,
        }
    }
}

/// What the acknowledged blocks read back at the end: NVMe/TCP's over a fresh controller,
/// NBD's over a fresh connection.
async fn lost(s: &Shared) -> Result<(Tally, Tally), String> {
    let acked = s.acked.lock().clone();
    let unacked = s.unacked.lock().clone();
    let c = HostController::connect(s.nvme, &s.nqn, &host(999_999), 1)
        .await
        .map_err(|e| format!("a fresh controller after the soak: {e}"))?;
    let lba = lba_bytes(&c).await.ok_or("identify failed")?;
    let per = BLOCK / lba as u64;
    let mut nvme = Tally::default();
    for (&b, &pass) in &acked {
        let back = c.io[0]
            .read(1, b * per, per as u32, lba)
            .await
            .map_err(|e| format!("reading block {b} back: {e}"))?;
        nvme.judge(&back, (b, pass), &unacked);
    }
    let _ = c.shutdown().await;
    let acked = s.nbd_acked.lock().clone();
    let unacked = s.nbd_unacked.lock().clone();
    let mut c = nbd::Nbd::connect(&s.nbd_sock, &s.nbd_export).await?;
    let mut nbd = Tally::default();
    for (&b, &pass) in &acked {
        let back = c.read(b * BLOCK, BLOCK as u32).await?;
        nbd.judge(&back, (b, pass), &unacked);
    }
    c.disconnect().await;
    Ok((nvme, nbd))
}

#[tokio::main]
async fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 11 {
        eprintln!("usage: soak NVME_ADDR NQN API_ADDR SECONDS CLIENTS VOLUME_BYTES SALT NBD_SOCKET NBD_EXPORT NBD_VOLUME_BYTES");
        std::process::exit(2);
    }
    SALT.store(
        a[7].parse().expect("SALT"),
        std::sync::atomic::Ordering::Relaxed,
    );
    let s = Arc::new(Shared {
        nvme: a[1].parse().expect("NVME_ADDR"),
        nqn: a[2].clone(),
        api: a[3].parse().expect("API_ADDR"),
        nbd_sock: a[8].clone().into(),
        nbd_export: a[9].clone(),
        nbd_size: a[10].parse().expect("NBD_VOLUME_BYTES"),
        acked: Mutex::default(),
        nbd_acked: Mutex::default(),
        unacked: Mutex::default(),
        nbd_unacked: Mutex::default(),
        writes: Mutex::default(),
        counts: Mutex::default(),
    });
    let seconds: u64 = a[4].parse().expect("SECONDS");
    let clients: u64 = a[5].parse().expect("CLIENTS");
    let per = a[6].parse::<u64>().expect("VOLUME_BYTES") / BLOCK / clients;
    let nbd_per = a[10].parse::<u64>().expect("NBD_VOLUME_BYTES") / BLOCK / clients;
    let until = Instant::now() + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let nvme = Range::new(i * per, (i + 1) * per);
            let nbd = Range::new(i * nbd_per, (i + 1) * nbd_per);
            tokio::spawn(client(s.clone(), i, nvme, nbd, until))
        })
        .collect();
    let mut failed = false;
    for t in tasks {
        if let Err(e) = t.await.expect("a client panicked") {
            eprintln!("soak: a client failed: {e}");
            failed = true;
        }
    }
    let (nvme, nbd) = match lost(&s).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("soak: reading back failed: {e}");
            std::process::exit(1);
        }
    };
    let n = std::mem::take(&mut *s.counts.lock());
    let (acked, nbd_acked) = (s.acked.lock().len(), s.nbd_acked.lock().len());
    let [w, nbd_w] = *s.writes.lock();
    let mib = |n: u64| (n * BLOCK) >> 20;
    println!(
        "soak: {clients} clients for {seconds} s: NVMe/TCP {} write rounds and {} dropped writes, {w} acknowledged writes ({} MiB, each read back at once), {acked} blocks read back at the end, {} wrong, {} held a later dropped write; NBD {} write rounds and {} abandoned writes, {nbd_w} acknowledged writes ({} MiB, each read back at once), {nbd_acked} blocks read back at the end, {} wrong, {} held a later abandoned write, {} connections gone with their read replies unread; {} half ICReqs and half HTTP requests, {} HTTP requests",
        n.nvme_rounds, n.nvme_dropped, mib(w), nvme.wrong, nvme.landed, n.nbd_rounds, n.nbd_dropped, mib(nbd_w), nbd.wrong, nbd.landed, n.nbd_unread, n.half, n.http
    );
    let _ = std::io::stdout().flush();
    if failed || nvme.wrong + nbd.wrong > 0 || acked == 0 || nbd_acked == 0 {
        std::process::exit(1);
    }
}
