//! Serves a file as an NBD export over TCP and/or a Unix socket: the NBD server on its own,
//! without pools or volumes. Used by the real-client tests, the kernel guest test and the
//! benchmark against `nbdkit file`.
//!
//!   nbd_serve --file disk.img --size 1G --unix /tmp/nbd.sock
//!   nbd_serve --file disk.img --tcp 0.0.0.0:10809 --allow 10.0.0.0/8 --allow 192.168.1.7
//!
//! It prints one line per listener ("nbd_serve: listening on ...") once clients can connect,
//! and stops on SIGINT or SIGTERM.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use millrace_block::{check_range, BlockDevice};
use millrace_io::{BufPool, Cores, CoresConfig, PoolConfig};
use millrace_nbd::{Export, IpNet, Limits, NbdServer};

#[derive(Parser)]
#[command(about = "Serve a file as an NBD export (Millrace's NBD server on its own)")]
struct Args {
    /// The backing file.
    #[arg(long)]
    file: PathBuf,
    /// Create the file, or grow it, to this size (bytes; K, M, G, T suffixes are powers of 1024).
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Export name.
    #[arg(long, default_value = "vol")]
    name: String,
    #[arg(long, default_value = "")]
    description: String,
    /// Listen on this TCP address (host:port).
    #[arg(long)]
    tcp: Option<String>,
    /// Listen on this Unix socket path (replaced if it exists).
    #[arg(long)]
    unix: Option<PathBuf>,
    /// A TCP client address or network allowed to use the export; repeat for more. Without any,
    /// only the Unix socket can use it.
    #[arg(long)]
    allow: Vec<String>,
    #[arg(long)]
    read_only: bool,
    /// The preferred I/O size the device reports (a volume reports its full stripe).
    #[arg(long, value_parser = parse_size, default_value = "4096")]
    preferred_io: u64,
    /// Cores (threads, each an event loop) that run the connections.
    #[arg(long, default_value_t = 1)]
    cores: usize,
    /// Pin core i to CPU cpus[i % n] (a comma-separated list).
    #[arg(long, value_delimiter = ',')]
    cpus: Vec<usize>,
    /// Bytes of the buffer pool that holds every request's payload, faulted in at start.
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pool: u64,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, shift) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("{s:?}: the suffix must be K, M, G or T")),
            };
            (&s[..i], shift)
        }
        _ => (s, 0),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (a number with an optional K, M, G or T)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// A file as a block device: positioned reads and writes, fdatasync for flush, and fallocate
/// for discard (punch a hole) and write-zeroes (zero the range, keeping it allocated).
struct FileDev {
    f: File,
    size: u64,
    preferred: u64,
}

impl FileDev {
    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: fallocate on a file descriptor we own, with plain integer arguments.
        let r = unsafe {
            libc::fallocate(
                self.f.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn write_zero_bytes(&self, offset: u64, len: u64) -> io::Result<()> {
        let chunk = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len() as u64) as usize;
            self.f.write_all_at(&chunk[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
}

/// Filesystems without the fallocate mode (tmpfs lacks ZERO_RANGE on old kernels, 9p lacks
/// both) say so with EOPNOTSUPP; we then write zeroes by hand.
fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
    )
}

impl BlockDevice for FileDev {
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn preferred_io_bytes(&self) -> u64 {
        self.preferred
    }
    fn block_bytes(&self) -> u32 {
        512
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        self.f.read_exact_at(buf, offset)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        check_range(self.size, offset, data.len() as u64)?;
        self.f.write_all_at(data, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.f.sync_data()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        match self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            Err(e) if unsupported(&e) => self.write_zero_bytes(offset, len),
            r => r,
        }
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        match self.fallocate(
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            Err(e) if unsupported(&e) => self.write_zero_bytes(offset, len),
            r => r,
        }
    }
}

fn parse_allowed(a: &str) -> Result<IpNet, String> {
    a.parse::<IpNet>()
        .or_else(|_| a.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| {
            format!("--allow {a:?} is neither an IP address nor a network like 10.0.0.0/8")
        })
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("nbd_serve: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(io::stderr)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .init();
    let a = Args::parse();
    if a.tcp.is_none() && a.unix.is_none() {
        return Err("give --tcp ADDR, --unix PATH or both".into());
    }
    let (f, size) = open_file(&a)?;
    let server = start_server(&a, f, size)?;
    let mut tasks = listen(&a, &server).await?;
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        Some(r) = tasks.join_next() => {
            r.map_err(|e| e.to_string())?.map_err(|e| format!("a listener failed: {e}"))?;
        }
    }
    stop(&a, &server).await;
    Ok(())
}

/// The backing file, created or grown to `--size` if asked, and the size to export.
fn open_file(a: &Args) -> Result<(File, u64), String> {
    let f = OpenOptions::new()
        .read(true)
        .write(!a.read_only)
        .create(a.size.is_some() && !a.read_only)
        .truncate(false)
        .open(&a.file)
        .map_err(|e| format!("cannot open {}: {e}", a.file.display()))?;
    let mut size = f
        .metadata()
        .map_err(|e| format!("cannot stat {}: {e}", a.file.display()))?
        .len();
    if let Some(want) = a.size {
        if want > size {
            f.set_len(want)
                .map_err(|e| format!("cannot grow {} to {want} bytes: {e}", a.file.display()))?;
        }
        size = want;
    }
    Ok((f, size))
}

/// A server on its own cores and buffer pool, exporting the file.
fn start_server(a: &Args, f: File, size: u64) -> Result<NbdServer, String> {
    let allowed = a
        .allow
        .iter()
        .map(|s| parse_allowed(s))
        .collect::<Result<Vec<_>, _>>()?;
    let pool = BufPool::new(&PoolConfig {
        bytes: usize::try_from(a.pool).map_err(|_| "--pool is too large".to_string())?,
        slices: a.cores.max(1),
        max_buf: 32 << 20,
        populate: true,
    })
    .map_err(|e| e.to_string())?;
    let cores = Cores::start(CoresConfig {
        cores: a.cores.max(1),
        cpus: (!a.cpus.is_empty()).then(|| a.cpus.clone()),
        pool: Some(pool.clone()),
        ..CoresConfig::default()
    })
    .map_err(|e| format!("cannot start the cores: {e}"))?;
    let server = NbdServer::with_data_path(Limits::default(), Arc::new(cores), pool);
    server
        .add_export(Export {
            name: a.name.clone(),
            description: a.description.clone(),
            dev: Arc::new(FileDev {
                f,
                size,
                preferred: a.preferred_io,
            }),
            read_only: a.read_only,
            allowed,
        })
        .map_err(|e| e.to_string())?;
    Ok(server)
}

/// One task per listener asked for, each serving until the server shuts down.
async fn listen(
    a: &Args,
    server: &NbdServer,
) -> Result<tokio::task::JoinSet<io::Result<()>>, String> {
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(addr) = &a.tcp {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local = l.local_addr().map_err(|e| e.to_string())?;
        println!("nbd_serve: listening on tcp {local}");
        let s = server.clone();
        tasks.spawn(async move { s.serve_tcp(l).await });
    }
    if let Some(path) = &a.unix {
        let _ = std::fs::remove_file(path);
        let l = tokio::net::UnixListener::bind(path)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        println!("nbd_serve: listening on unix {}", path.display());
        let s = server.clone();
        tasks.spawn(async move { s.serve_unix(l).await });
    }
    Ok(tasks)
}

/// Shuts the server down, gives connections a moment to finish, and says what it served.
async fn stop(a: &Args, server: &NbdServer) {
    server.shutdown();
    // Connections finish their requests in flight; give them a moment before exiting.
    for _ in 0..50 {
        if server.stats().connections_open == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    if let Some(path) = &a.unix {
        let _ = std::fs::remove_file(path);
    }
    let st = server.stats();
    eprintln!(
        "nbd_serve: stopped after {} connections, {} requests, {} bytes read, {} bytes written",
        st.connections_total, st.ops, st.bytes_read, st.bytes_written
    );
}
