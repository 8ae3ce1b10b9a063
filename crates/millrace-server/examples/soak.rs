//! The soak client (tests/soak.sh runs it against a `millrace serve`): many clients over
//! loopback, each in a loop of NVMe/TCP controllers that write and read back, controllers
//! dropped in the middle of a write, connections that send half an ICReq and vanish, and HTTP
//! requests sent half and complete. Each block is written at most once, so every write the
//! target acknowledged must read back at the end, over a fresh controller; exits non-zero if one
//! does not.
//!
//! Usage: soak NVME_ADDR NQN API_ADDR SECONDS CLIENTS VOLUME_BYTES SALT (a run's own data:
//! blocks written by an earlier run with another salt do not read as this run's).

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use millrace_nvmf::initiator::{HostController, HostOptions};
use parking_lot::Mutex;

const BLOCK: u64 = 4096;

static SALT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn pattern(block: u64) -> Vec<u8> {
    let salt = SALT.load(std::sync::atomic::Ordering::Relaxed);
    let mut x = (block ^ salt << 40).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
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
    acked: Mutex<BTreeSet<u64>>,
    counts: Mutex<[u64; 5]>,
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

/// One controller: a few blocks written (each acknowledged one recorded), one read back.
async fn writes(s: &Shared, client: u64, next: &mut u64, end: u64) -> Result<(), String> {
    let c = HostController::connect(s.nvme, &s.nqn, &host(client), 1)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let lba = lba_bytes(&c).await.ok_or("identify failed")?;
    let per = BLOCK / lba as u64;
    for _ in 0..8 {
        if *next >= end {
            break;
        }
        let b = *next;
        *next += 1;
        c.io[0]
            .write(1, b * per, pattern(b), lba)
            .await
            .map_err(|e| format!("write of block {b}: {e}"))?;
        s.acked.lock().insert(b);
        let back = c.io[0]
            .read(1, b * per, per as u32, lba)
            .await
            .map_err(|e| format!("read of block {b}: {e}"))?;
        if back != pattern(b) {
            return Err(format!("block {b} read back wrong right after its write"));
        }
    }
    Ok(())
}

/// A controller dropped while its write is in flight: that block is never counted.
async fn dropped_write(s: &Shared, client: u64, next: &mut u64, end: u64, wait_us: u64) {
    let Ok(c) = HostController::connect(s.nvme, &s.nqn, &host(client), 1).await else {
        return;
    };
    let Some(lba) = lba_bytes(&c).await else {
        return;
    };
    if *next >= end {
        return;
    }
    let b = *next;
    *next += 1;
    let q = c.io[0].clone();
    let per = BLOCK / lba as u64;
    let w = tokio::spawn(async move { q.write(1, b * per, pattern(b), lba).await });
    tokio::time::sleep(Duration::from_micros(wait_us)).await;
    w.abort();
    drop(c);
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
    start: u64,
    end: u64,
    until: Instant,
) -> Result<(), String> {
    let mut rng = Rng(id.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
    let mut next = start;
    while Instant::now() < until {
        let pick = rng.next() % 10;
        match pick {
            0..=3 => writes(&s, id, &mut next, end).await?,
            4..=5 => dropped_write(&s, id, &mut next, end, rng.next() % 2000).await,
            6 => half(&s, 0).await?,
            7 => half(&s, 1).await?,
            _ => half(&s, 2).await?,
        }
        s.counts.lock()[(pick as usize).min(9) / 2] += 1;
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 8 {
        eprintln!("usage: soak NVME_ADDR NQN API_ADDR SECONDS CLIENTS VOLUME_BYTES SALT");
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
        acked: Mutex::default(),
        counts: Mutex::default(),
    });
    let seconds: u64 = a[4].parse().expect("SECONDS");
    let clients: u64 = a[5].parse().expect("CLIENTS");
    let blocks = a[6].parse::<u64>().expect("VOLUME_BYTES") / BLOCK;
    let until = Instant::now() + Duration::from_secs(seconds);
    let per = blocks / clients;
    let tasks: Vec<_> = (0..clients)
        .map(|i| tokio::spawn(client(s.clone(), i, i * per, (i + 1) * per, until)))
        .collect();
    let mut failed = false;
    for t in tasks {
        if let Err(e) = t.await.expect("a client panicked") {
            eprintln!("soak: a client failed: {e}");
            failed = true;
        }
    }
    // Every acknowledged block, over a fresh controller.
    let acked = s.acked.lock().clone();
    let c = HostController::connect(s.nvme, &s.nqn, &host(999_999), 1)
        .await
        .expect("a fresh controller connects after the soak");
    let lba = lba_bytes(&c).await.expect("identify");
    let per_block = BLOCK / lba as u64;
    let mut lost = 0;
    for &b in &acked {
        let back = c.io[0]
            .read(1, b * per_block, per_block as u32, lba)
            .await
            .expect("read");
        if back != pattern(b) {
            lost += 1;
        }
    }
    let _ = c.shutdown().await;
    let n = *s.counts.lock();
    println!(
        "soak: {clients} clients for {seconds} s: {} write rounds, {} dropped writes, {} half ICReqs and half HTTP requests, {} HTTP requests; {} acknowledged blocks, {lost} did not read back",
        n[0] + n[1], n[2], n[3], n[4], acked.len()
    );
    let _ = std::io::stdout().flush();
    if failed || lost > 0 || acked.is_empty() {
        std::process::exit(1);
    }
}
