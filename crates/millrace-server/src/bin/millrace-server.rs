//! `millrace-server`, the program `millrace serve` runs (the CLI execs it, so the command a user
//! runs for `pool show` links no HTTP stack, TLS or RDMA binding): the data server in the
//! foreground.

// Functions stay under 100 lines (clippy.toml).
#![warn(clippy::too_many_lines)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Parser};

/// Run the data server: pools, exports, the HTTP API, /metrics and the dashboard.
#[derive(Parser)]
#[command(
    name = "millrace-server",
    bin_name = "millrace serve",
    version,
    after_help = "Examples:\n  millrace serve                                   # API on 127.0.0.1:8740, NVMe/TCP on 0.0.0.0:4420 (discovery 8009)\n  millrace serve --nvme-rdma 192.168.1.10         # also NVMe/RDMA on port 4420 of that address\n  millrace serve --nvme 10.0.0.5:4420 --nvme 10.0.1.5:4420   # two paths for multipath\n  millrace serve --api 0.0.0.0:8740 --token-file /etc/millrace/token   # the API beyond this machine needs a token\n  millrace serve --api 0.0.0.0:8740 --token-file /etc/millrace/token --tls-cert /etc/millrace/api.crt --tls-key /etc/millrace/api.key"
)]
struct Cli {
    /// Where Millrace keeps its small state (the cache of known pools).
    #[arg(long, env = "MILLRACE_HOME", default_value = "millrace-data")]
    home: PathBuf,
    /// More log output (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Args)]
struct ServeArgs {
    /// Where the HTTP API, /metrics and the dashboard listen. Beyond loopback a token is required.
    #[arg(long, default_value = "127.0.0.1:8740", env = "MILLRACE_API_LISTEN")]
    api: SocketAddr,
    /// An NVMe/TCP I/O listener, ADDR:PORT (repeat for several: each is a path to every
    /// export, listed by discovery, for hosts' native multipath; `millrace export nvme ana set`
    /// sets a path's ANA state).
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:4420")]
    nvme: Vec<SocketAddr>,
    /// The NVMe/TCP discovery port (on each NVMe/TCP address).
    #[arg(long, default_value_t = 8009)]
    discovery_port: u16,
    /// Serve no NVMe/TCP at all.
    #[arg(long)]
    no_nvme: bool,
    /// Also serve NVMe/RDMA on this address (ADDR or ADDR:PORT, port 4420 by default; repeat
    /// for several). The same subsystems, allowed hosts and namespaces as NVMe/TCP. Needs an
    /// RDMA device (a RoCE or InfiniBand NIC, or soft-RoCE) and rdma-core's libraries; without
    /// them it is reported and skipped, and NVMe/TCP serves as before.
    #[arg(long = "nvme-rdma", value_name = "ADDR[:PORT]", value_parser = rdma_addr)]
    nvme_rdma: Vec<SocketAddr>,
    /// Require TLS 1.3 with a pre-shared key on every NVMe/TCP I/O listener (`required`) or
    /// not (`none`, the default): NVMe/TCP's secure channel, as Linux 6.7+ (tlshd) and SPDK
    /// hosts speak it. Give each host its PSK with `millrace export nvme host set-key
    /// POOL/VOL HOSTNQN --tls-psk FILE`. Needs kernel TLS (the tls module); the discovery
    /// port stays plain.
    #[arg(long = "nvme-tls", value_name = "none|required", default_value = "none", value_parser = millrace_service::nvme_tls::TlsMode::parse)]
    nvme_tls: millrace_service::nvme_tls::TlsMode,
    /// Also listen for NBD clients on this TCP address (only clients an export lists get in);
    /// the Unix socket MILLRACE_HOME/nbd.sock is always there.
    #[arg(long)]
    nbd_listen: Option<SocketAddr>,
    /// A file holding the API's bearer token (also MILLRACE_TOKEN). Required when --api is not loopback.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Serve the API over HTTPS with this certificate (PEM, the chain with the server's first).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Seconds an API connection has to send its request headers (and finish its TLS
    /// handshake), and the most it may sit idle between requests; then it is closed.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    api_header_timeout: u64,
    /// The most API connections served at once; more wait until one closes.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=65536))]
    api_max_connections: u64,
    /// A host name the API answers to besides loopback and its own address (repeat for
    /// several); other `Host` and `Origin` headers are refused (DNS rebinding).
    #[arg(long, value_name = "NAME")]
    api_allow_host: Vec<String>,
    /// The most memory, in MiB, one bench run through the API may use for its buffers.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    bench_memory_mib: u64,
    /// Threads that serve the exports' connections, each with its own io_uring and slice of
    /// the buffer pool (default: the CPUs this process may use, at most 16; 1 to 256).
    #[arg(long, value_name = "N")]
    cores: Option<usize>,
    /// Pin the cores to these CPUs (like taskset: 0-3,8); without --cores, one core per CPU.
    #[arg(long, value_name = "LIST", value_parser = cpu_list)]
    cpus: Option<CpuList>,
    /// The buffer pool all request data lives in, mapped at start-up: the bound on the exports'
    /// payload memory (default 256M; at least 1M per core). When it is full, requests wait.
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes, env = "MILLRACE_BUFFER_POOL")]
    buffer_pool: Option<u64>,
}

/// The CLI's sizes (4096, 64k, 2G, 1.5T).
fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s)
        .map_err(|e| format!("'{s}' is not a size ({e}); write it like 4096, 64k, 2G or 1.5T"))
}

/// A parsed `--cpus` (a newtype: clap would take a bare Vec as a repeated flag).
#[derive(Clone, Debug)]
struct CpuList(Vec<usize>);

fn cpu_list(s: &str) -> std::result::Result<CpuList, String> {
    millrace_server::datapath::parse_cpu_list(s).map(CpuList)
}

/// An address with the NVMe/RDMA port (4420) where none is given.
fn rdma_addr(s: &str) -> std::result::Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let ip = s.trim_start_matches('[').trim_end_matches(']');
    match ip.parse::<std::net::IpAddr>() {
        Ok(ip) => Ok(SocketAddr::new(ip, 4420)),
        Err(_) => Err(format!(
            "'{s}' is not an address: give ADDR or ADDR:PORT, like 192.168.1.10 or 0.0.0.0:4420"
        )),
    }
}

fn main() {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MILLRACE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .with_target(false)
        .init();
    match run(&cli.home, cli.serve) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Serves until a signal stops it; returns the exit status that says why (0 for a requested
/// stop, 128 + N for another signal N; see millrace_server::lifecycle).
fn run(home: &Path, a: ServeArgs) -> Result<i32> {
    let token = match &a.token_file {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the token file {}", f.display()))?
                .trim()
                .to_string(),
        ),
        None => std::env::var("MILLRACE_TOKEN")
            .ok()
            .filter(|t| !t.is_empty()),
    };
    if token.as_deref() == Some("") {
        anyhow::bail!(
            "the token file is empty; put a long random string in it (e.g. `openssl rand -hex 32`)"
        );
    }
    let cfg = millrace_server::ServeConfig {
        home: home.to_path_buf(),
        api: a.api,
        nvme: if a.no_nvme { Vec::new() } else { a.nvme },
        discovery_port: (!a.no_nvme && a.discovery_port != 0).then_some(a.discovery_port),
        nvme_rdma: a.nvme_rdma,
        nvme_tls: a.nvme_tls,
        nbd_listen: a.nbd_listen,
        token,
        tls: a
            .tls_cert
            .zip(a.tls_key)
            .map(|(cert, key)| millrace_server::TlsFiles { cert, key }),
        http: millrace_server::HttpLimits {
            header_timeout: std::time::Duration::from_secs(a.api_header_timeout),
            max_connections: a.api_max_connections as usize,
            allowed_hosts: a.api_allow_host,
            ..Default::default()
        },
        bench_memory: a.bench_memory_mib << 20,
        data_path: millrace_server::datapath::DataPathConfig {
            cores: a.cores,
            cpus: a.cpus.map(|c| c.0),
            buffer_pool_bytes: a.buffer_pool,
            populate: None,
        },
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("millrace-serve")
        // The kernel NBD client of a share writes back through this process: its threads must
        // not wait on that same writeback when they allocate, or memory pressure deadlocks them.
        // PR_SET_IO_FLUSHER (57, Linux 5.6) says so; without the privilege it is just skipped.
        // SAFETY: prctl with integer arguments only changes flags of the calling thread.
        .on_thread_start(|| unsafe {
            libc::prctl(57, 1, 0, 0, 0);
        })
        .build()
        .context("cannot start the server's runtime")?;
    let cause = rt.block_on(millrace_server::run(cfg))?;
    Ok(cause.exit_code())
}
