//! An NVMe/TCP target daemon over one file: the guest test (tests/guest/nvme-tcp.sh) runs it
//! against the Linux kernel initiator and nvme-cli.
//!
//! cargo run -p millrace-nvmf --example nvmf_target -- --file /tmp/vol.img --size 256M \
//!     --nqn nqn.2024-01.io.millrace:test --host nqn.2014-08.org.nvmexpress:uuid:... --port 4420

use clap::Parser;
use millrace_block::{check_range, BlockDevice};
use millrace_nvmf::{Namespace, SubsystemConfig, Target, TargetConfig};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser)]
struct Args {
    /// The backing file (created at --size if missing).
    #[arg(long)]
    file: PathBuf,
    /// Size for a new file, e.g. 256M, 1G.
    #[arg(long, default_value = "256M")]
    size: String,
    #[arg(long)]
    nqn: String,
    /// A host NQN allowed to connect (repeatable).
    #[arg(long)]
    host: Vec<String>,
    #[arg(long)]
    allow_any_host: bool,
    #[arg(long, default_value = "127.0.0.1")]
    addr: String,
    #[arg(long, default_value_t = 4420)]
    port: u16,
    /// The separate discovery port (0: none).
    #[arg(long, default_value_t = 8009)]
    discovery_port: u16,
    /// Logical block size: 512 or 4096.
    #[arg(long, default_value_t = 4096)]
    block: u32,
    /// Preferred I/O size reported to hosts (bytes).
    #[arg(long, default_value_t = 65536)]
    preferred_io: u64,
}

/// A file as a block device: pread/pwrite, fdatasync, hole punching for discard.
struct FileDevice {
    f: File,
    size: u64,
    block: u32,
    preferred: u64,
}

impl BlockDevice for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn preferred_io_bytes(&self) -> u64 {
        self.preferred
    }
    fn block_bytes(&self) -> u32 {
        self.block
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
        // SAFETY: fallocate on an open descriptor with in-range arguments touches no memory.
        let r = unsafe {
            libc::fallocate(
                self.f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            // Filesystems without hole punching: write the zeroes instead.
            self.write_zeroes(offset, len)
        }
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .map(|n| n * mul)
        .map_err(|_| format!("{s:?} is not a size (try 256M or 1G)"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let a = Args::parse();
    let size = parse_size(&a.size)?;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&a.file)?;
    if f.metadata()?.len() == 0 {
        f.set_len(size)?;
    }
    let size = f.metadata()?.len();
    let dev = Arc::new(FileDevice {
        f,
        size,
        block: a.block,
        preferred: a.preferred_io,
    });
    let t = Target::new(TargetConfig::default());
    t.add_subsystem(SubsystemConfig {
        nqn: a.nqn.clone(),
        serial: "MR-EXAMPLE-0001".into(),
        model: "Millrace NVMe/TCP example".into(),
        namespaces: vec![Namespace {
            nsid: 1,
            dev,
            uuid: *b"millrace-example",
            nguid: *b"MILLRACE-EXAMPLE",
            ana_group: 0,
        }],
        allowed_hosts: a.host.clone(),
        allow_any_host: a.allow_any_host,
    })?;
    let io = tokio::net::TcpListener::bind((a.addr.as_str(), a.port)).await?;
    if a.discovery_port != 0 {
        let d = tokio::net::TcpListener::bind((a.addr.as_str(), a.discovery_port)).await?;
        let t2 = t.clone();
        tokio::spawn(async move { t2.serve_discovery(d).await });
    }
    println!(
        "nvmf_target: serving {} ({} bytes) as {} on {}:{} (discovery port {})",
        a.file.display(),
        size,
        a.nqn,
        a.addr,
        a.port,
        a.discovery_port
    );
    t.serve(io).await?;
    Ok(())
}
