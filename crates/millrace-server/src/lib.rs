//! `millrace serve`: the data server. It assembles the pools the cache knows, opens their
//! volumes, serves the exports recorded in the volumes' props (NVMe/TCP and NBD), and answers
//! the HTTP API, /metrics and the dashboard. Exports stay ignorant of parity: they see volumes
//! as block devices; this crate is where the layers meet.

// Functions stay under 100 lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

// Dependencies point one way (tests/it/layers.rs checks it), from the bottom up: error (the
// service's refusals as HTTP answers), lifecycle, http (the accept loop); metrics, rdma; api.
// The service layer (state, operations, model) is millrace-service, below this crate.
mod api;
mod error;
mod http;
pub mod lifecycle;
mod metrics;
mod rdma;

// The service crate's modules under their old names: the API, /metrics and the tests reach
// them as before, through this crate.
pub use millrace_service::{
    bench, datapath, jobs, metered, model, nbd_socket, nfs_rdma, nvme_auth, rdma_view, server_file,
    server_lock, server_running, service, state, NbdExportConfig, NvmeExportConfig, ServerFile,
    ShareConfig, ShareView, State, DEFAULT_BENCH_MEMORY,
};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};

pub use error::ApiError;
pub use http::HttpLimits;

/// Where the server listens and what it guards.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub home: PathBuf,
    pub api: SocketAddr,
    /// The NVMe/TCP I/O listeners, each a path to every subsystem (`--nvme`, repeatable);
    /// none serves no NVMe/TCP.
    pub nvme: Vec<SocketAddr>,
    /// Whether every NVMe/TCP I/O listener requires TLS 1.3 with a PSK (`--nvme-tls`); the
    /// discovery ports stay plain.
    pub nvme_tls: millrace_service::nvme_tls::TlsMode,
    pub discovery_port: Option<u16>,
    /// NVMe/RDMA listeners (`--nvme-rdma`); one that cannot start is reported and skipped.
    pub nvme_rdma: Vec<SocketAddr>,
    /// A TCP listener for NBD clients; the Unix socket under `home` is always there.
    pub nbd_listen: Option<SocketAddr>,
    /// The bearer token the API demands (required when `api` is not a loopback address).
    pub token: Option<String>,
    /// Serve the API over HTTPS with this certificate chain and key (PEM files).
    pub tls: Option<TlsFiles>,
    /// The API's timeouts, connection bound and the host names it answers.
    pub http: HttpLimits,
    /// The most memory one bench run may use for its requests' buffers.
    pub bench_memory: u64,
    /// The cores and the buffer pool every export's connections run on.
    pub data_path: datapath::DataPathConfig,
}

#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Runs the server until a signal asks it to stop: named start-up steps, the API until the
/// signal, then the shutdown in the order that keeps the pools clean. Returns why it stopped
/// (the caller turns that into the exit status); whatever ends it is logged first.
pub async fn run(cfg: ServeConfig) -> Result<lifecycle::StopCause> {
    lifecycle::prepare_process();
    // Taken now, so a stop asked for while the pools are assembled is served once they are.
    let stop = lifecycle::StopSignals::install();
    check_config(&cfg)?;
    // Held until this function returns: while it is, no second server starts on this home.
    let (sf, _lock) = claim_home(&cfg)?;
    // A server that stops in order removes its file; one still here was left by a crash.
    // Removed at once: the CLI waits for this server's file, not a dead one's.
    let previous_stop_unclean = std::fs::remove_file(&sf).is_ok();
    // The certificate and every port are checked before any pool is touched: a start that
    // cannot bind (an address in use) leaves the pools as they were, clean.
    let tls = load_tls(&cfg).await?;
    let ports = bind_ports(&cfg)?;
    // Sizes are checked and the pool mapped before any pool is touched.
    let dp = datapath::DataPath::start(&cfg.data_path)?;
    let mut state = tokio::task::spawn_blocking({
        let home = cfg.home.clone();
        move || State::open(&home)
    })
    .await??;
    state.bench_memory = cfg.bench_memory;
    state.previous_stop_unclean = previous_stop_unclean;
    if previous_stop_unclean {
        tracing::warn!("the last server on this home did not stop in order (a crash or a kill); pools it left in use are resynced");
    }
    let state = Arc::new(state);
    let served = serve_opened(&cfg, &state, dp, ports, tls, &sf, stop).await;
    let why = match &served {
        Ok(cause) => cause.to_string(),
        Err(e) => format!("{e:#}"),
    };
    tracing::warn!("stopping: {why}");
    eprintln!("millrace serve: stopping: {why}");
    lifecycle::notify_stopping();
    shut_down(state, &sf, &nbd_socket(&cfg.home), cfg.http.drain_timeout).await?;
    eprintln!("millrace serve: stopped");
    served
}

/// Everything between the pools' opening and the signal; whatever it returns, the caller
/// closes the pools.
async fn serve_opened(
    cfg: &ServeConfig,
    state: &Arc<State>,
    dp: datapath::DataPath,
    ports: Ports,
    tls: Option<Arc<rustls::ServerConfig>>,
    sf: &std::path::Path,
    stop: lifecycle::StopSignals,
) -> Result<lifecycle::StopCause> {
    (state.nvmf).set_data_path(dp.pool.clone(), Some(dp.cores.clone()))?;
    // A warning, not a failure: an export's own socket may already have served a client, which
    // gave the NBD server a core and pool of its own.
    if let Err(e) = state.nbd.set_data_path(dp.cores.clone(), dp.pool.clone()) {
        tracing::warn!("NBD keeps its own core and buffer pool: {e}");
    }
    let _ = state.data_path.set(dp);
    state.start_pending_rebuilds();
    // Shares come back once their NBD exports serve (the pools started them, on the exports'
    // own sockets): the kernel's NBD client attaches through them.
    {
        let s = state.clone();
        tokio::task::spawn_blocking(move || s.restore_shares()).await?;
    }
    // Only now do the ports answer, and the server file is written at once: a client (or a
    // script waiting for a port) never finds a port answering for a server still starting.
    let ports = ports.listen()?;
    let api_addr = ports.api.local_addr()?;
    let nvme_at = start_nvme(state, ports.nvme, ports.discovery, cfg.nvme_tls)?;
    let rdma_at = start_nvme_rdma(state, &cfg.nvme_rdma);
    let sock = start_nbd(cfg, state, ports.nbd_tcp, ports.nbd_unix);
    let scheme = if tls.is_some() { "https" } else { "http" };
    write_server_file(cfg, sf, format!("{scheme}://{api_addr}"), &sock)?;
    lifecycle::notify_ready();
    tracing::info!(api = %api_addr, "millrace serve is up");
    announce(cfg, scheme, api_addr, nvme_at, &rdma_at, &sock);
    let hosts = api::HostGuard::new(api_addr, &cfg.http.allowed_hosts);
    let app = api::router(state.clone(), cfg.token.clone(), hosts);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stopped = async move {
        let _ = tx.send(stop.wait().await);
    };
    http::serve(ports.api, app, tls, cfg.http.clone(), stopped).await;
    Ok(rx
        .await
        .unwrap_or(lifecycle::StopCause::Requested(libc::SIGTERM)))
}

/// The listeners, bound before any pool is opened (so an address in use stops the start
/// before it touches a pool) and listening only once the server is ready.
struct Ports {
    api: socket2::Socket,
    nvme: Vec<socket2::Socket>,
    discovery: Vec<socket2::Socket>,
    nbd_tcp: Option<socket2::Socket>,
    nbd_unix: socket2::Socket,
}

/// The same listeners, answering.
struct Listening {
    api: tokio::net::TcpListener,
    nvme: Vec<tokio::net::TcpListener>,
    discovery: Vec<tokio::net::TcpListener>,
    nbd_tcp: Option<tokio::net::TcpListener>,
    nbd_unix: tokio::net::UnixListener,
}

/// The backlog of each listener: connections the kernel holds until they are accepted.
const BACKLOG: i32 = 1024;

fn bind_tcp(addr: SocketAddr, what: &str) -> Result<socket2::Socket> {
    use socket2::{Domain, Socket, Type};
    let bound = Socket::new(Domain::for_address(addr), Type::STREAM, None).and_then(|s| {
        // As tokio's bind does: a restarted server takes its port back at once.
        s.set_reuse_address(true)?;
        s.bind(&addr.into())?;
        Ok(s)
    });
    bound.with_context(|| format!("cannot listen for {what} on {addr}"))
}

fn listen_tcp(s: socket2::Socket) -> Result<tokio::net::TcpListener> {
    s.listen(BACKLOG)?;
    s.set_nonblocking(true)?;
    Ok(tokio::net::TcpListener::from_std(s.into())?)
}

impl Ports {
    fn listen(self) -> Result<Listening> {
        let nbd_unix = {
            self.nbd_unix.listen(BACKLOG)?;
            self.nbd_unix.set_nonblocking(true)?;
            let fd: std::os::fd::OwnedFd = self.nbd_unix.into();
            tokio::net::UnixListener::from_std(fd.into())?
        };
        Ok(Listening {
            api: listen_tcp(self.api)?,
            nvme: (self.nvme.into_iter().map(listen_tcp)).collect::<Result<_>>()?,
            discovery: (self.discovery.into_iter().map(listen_tcp)).collect::<Result<_>>()?,
            nbd_tcp: self.nbd_tcp.map(listen_tcp).transpose()?,
            nbd_unix,
        })
    }
}

fn bind_ports(cfg: &ServeConfig) -> Result<Ports> {
    let api = bind_tcp(cfg.api, "the API")?;
    let mut nvme = Vec::new();
    for (i, &addr) in cfg.nvme.iter().enumerate() {
        if addr.port() != 0 && cfg.nvme[..i].contains(&addr) {
            bail!("--nvme {addr} is given twice; name each listener once");
        }
        nvme.push(bind_tcp(addr, "NVMe/TCP")?);
    }
    let mut discovery = Vec::new();
    if let Some(p) = cfg.discovery_port {
        for ip in discovery_ips(&cfg.nvme) {
            discovery.push(bind_tcp(SocketAddr::new(ip, p), "NVMe discovery")?);
        }
    }
    let nbd_tcp = cfg.nbd_listen.map(|a| bind_tcp(a, "NBD")).transpose()?;
    // The home is ours (its lock is held), so a socket left there is a dead server's.
    let sock = nbd_socket(&cfg.home);
    let _ = std::fs::remove_file(&sock);
    let nbd_unix = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)
        .and_then(|s| {
            s.bind(&socket2::SockAddr::unix(&sock)?)?;
            Ok(s)
        })
        .with_context(|| format!("cannot listen for NBD on {}", sock.display()))?;
    Ok(Ports {
        api,
        nvme,
        discovery,
        nbd_tcp,
        nbd_unix,
    })
}

/// The addresses the discovery port listens on: each NVMe/TCP listener's, once, and none
/// beside an any-address of its family (which covers them).
fn discovery_ips(nvme: &[SocketAddr]) -> Vec<std::net::IpAddr> {
    let mut ips: Vec<std::net::IpAddr> = Vec::new();
    for a in nvme {
        let ip = a.ip();
        let covered = ips
            .iter()
            .any(|i| *i == ip || (i.is_unspecified() && i.is_ipv4() == ip.is_ipv4()));
        if covered {
            continue;
        }
        if ip.is_unspecified() {
            ips.retain(|i| i.is_ipv4() != ip.is_ipv4());
        }
        ips.push(ip);
    }
    ips
}

fn check_config(cfg: &ServeConfig) -> Result<()> {
    if !cfg.api.ip().is_loopback() && cfg.token.is_none() {
        bail!(
            "the API would listen on {}, beyond this machine, without a token; give one with --token-file FILE (or MILLRACE_TOKEN), or listen on 127.0.0.1",
            cfg.api
        );
    }
    Ok(())
}

/// Makes the home and takes its server lock, or refuses while another live server holds it;
/// returns its server file and the held lock.
fn claim_home(cfg: &ServeConfig) -> Result<(PathBuf, std::fs::File)> {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(&cfg.home)
        .with_context(|| format!("cannot create {}", cfg.home.display()))?;
    let path = server_lock(&cfg.home);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: flock on a descriptor we own; it is released when the file is closed.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::WouldBlock {
            bail!("cannot lock {}: {e}", path.display());
        }
        let sf = server_file(&cfg.home);
        let who = std::fs::read_to_string(&sf)
            .ok()
            .and_then(|t| serde_json::from_str::<ServerFile>(&t).ok())
            .map(|f| format!(" (pid {}, at {})", f.pid, f.url))
            .unwrap_or_default();
        bail!(
            "another millrace server{who} already serves {}; stop it first",
            cfg.home.display()
        );
    }
    Ok((server_file(&cfg.home), lock))
}

async fn load_tls(cfg: &ServeConfig) -> Result<Option<Arc<rustls::ServerConfig>>> {
    let Some(t) = &cfg.tls else {
        return Ok(None);
    };
    // One process-wide provider; a second install (tests start several servers) is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let c = axum_server::tls_rustls::RustlsConfig::from_pem_file(&t.cert, &t.key)
        .await
        .with_context(|| {
            format!(
                "cannot use the TLS certificate {} with the key {} (both PEM; the certificate chain first, then a PKCS#8, PKCS#1 or SEC1 key)",
                t.cert.display(),
                t.key.display()
            )
        })?;
    // The API speaks HTTP/1.1 (its header timer is HTTP/1's): offer only that.
    let mut c = (*c.get_inner()).clone();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(Arc::new(c)))
}

/// Serves NVMe/TCP on each bound listener (each a path to every subsystem) and the discovery
/// ports; returns where NVMe/TCP listens (port 0 in the config picks a free port).
fn start_nvme(
    state: &Arc<State>,
    nvme: Vec<tokio::net::TcpListener>,
    discovery: Vec<tokio::net::TcpListener>,
    tls: millrace_service::nvme_tls::TlsMode,
) -> Result<Vec<SocketAddr>> {
    let mut at = Vec::new();
    if tls == millrace_service::nvme_tls::TlsMode::Required
        && !millrace_service::nvme_tls::kernel_tls_listed()
    {
        tracing::warn!("NVMe/TCP requires TLS, but this kernel does not list kernel TLS yet (/proc/sys/net/ipv4/tcp_available_ulp): each TLS connection loads the tls module, and where there is none it is refused with a logged reason (modprobe tls)");
    }
    for l in nvme {
        at.push(l.local_addr()?);
        state
            .nvme_listening
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let t = state.nvmf.clone();
        tokio::spawn(async move { t.serve_with(l, tls).await });
    }
    for l in discovery {
        let t = state.nvmf.clone();
        tokio::spawn(async move { t.serve_discovery(l).await });
    }
    Ok(at)
}

/// NBD on TCP when asked and on the home's Unix socket always; returns the socket's path.
fn start_nbd(
    cfg: &ServeConfig,
    state: &Arc<State>,
    tcp: Option<tokio::net::TcpListener>,
    unix: tokio::net::UnixListener,
) -> PathBuf {
    if let Some(l) = tcp {
        let s = state.nbd.clone();
        tokio::spawn(async move { s.serve_tcp(l).await });
    }
    let s = state.nbd.clone();
    tokio::spawn(async move { s.serve_unix(unix).await });
    nbd_socket(&cfg.home)
}

fn write_server_file(
    cfg: &ServeConfig,
    sf: &std::path::Path,
    url: String,
    sock: &std::path::Path,
) -> Result<()> {
    let file = ServerFile {
        url,
        pid: std::process::id(),
        nbd_socket: sock.to_path_buf(),
        tls_cert: cfg
            .tls
            .as_ref()
            .map(|t| std::fs::canonicalize(&t.cert).unwrap_or_else(|_| t.cert.clone())),
    };
    std::fs::write(sf, serde_json::to_vec_pretty(&file)?)
        .with_context(|| format!("cannot write {}", sf.display()))
}

fn announce(
    cfg: &ServeConfig,
    scheme: &str,
    api_addr: SocketAddr,
    nvme_at: Vec<SocketAddr>,
    rdma_at: &str,
    sock: &std::path::Path,
) {
    let nvme = match nvme_at.is_empty() {
        true => "off".to_string(),
        false => {
            let discovery = (cfg.discovery_port)
                .map(|p| p.to_string())
                .unwrap_or("off".into());
            let at: Vec<String> = nvme_at.iter().map(|a| a.to_string()).collect();
            format!("{} (discovery {discovery})", at.join(" and "))
        }
    };
    eprintln!(
        "millrace serve: API on {scheme}://{api_addr}{}, NVMe/TCP on {nvme}{rdma_at}, NBD on {}{}",
        if cfg.token.is_some() {
            " (token required)"
        } else {
            ""
        },
        sock.display(),
        cfg.nbd_listen
            .map(|a| format!(" and {a}"))
            .unwrap_or_default()
    );
}

/// Stops in the order that keeps the pools clean: the API has drained already; shares are
/// unmounted (their writeback flushes through NBD); then the exports' requests are drained (no
/// new one is let into a volume, the ones inside finish, at most `drain` long) and only then
/// are the pools flushed and recorded clean. Requests still inside after `drain` leave the
/// pools recorded in use, so the next start resyncs what they may have touched.
async fn shut_down(
    state: Arc<State>,
    sf: &std::path::Path,
    sock: &std::path::Path,
    drain: std::time::Duration,
) -> Result<()> {
    {
        let s = state.clone();
        tokio::task::spawn_blocking(move || s.stop_shares()).await?;
    }
    state.meters.gate.close();
    state.nvmf.shutdown();
    state.nbd.shutdown();
    let drained = state.meters.gate.drained(drain).await;
    let _ = std::fs::remove_file(sf);
    let _ = std::fs::remove_file(sock);
    if !drained {
        tracing::error!("export requests still running after {drain:?}; the pools are left recorded in use, and the next start resyncs them");
        eprintln!("millrace serve: export requests did not finish within {drain:?}; the pools will be resynced at the next start");
        return Ok(());
    }
    tokio::task::spawn_blocking(move || state.close()).await??;
    Ok(())
}

/// An NVMe/RDMA listener as the service layer holds it: counted by /metrics, alive as long as
/// the state holds it.
struct RdmaQueues(millrace_nvmf_rdma::serve::RdmaListener);

impl millrace_service::QueueCounts for RdmaQueues {
    fn queues(&self) -> (usize, u64, u64) {
        self.0.queues()
    }
    fn hangups(&self) -> (u64, u64) {
        self.0.hangups()
    }
}

/// Starts the NVMe/RDMA listeners. One that cannot start (no RDMA device, no rdma-core, an
/// address no RDMA device has) is reported with its reason and skipped: NVMe/TCP and the rest
/// serve as before. Returns what the start-up line says about them.
fn start_nvme_rdma(state: &Arc<State>, addrs: &[SocketAddr]) -> String {
    let mut up = Vec::new();
    for &addr in addrs {
        let listening = match state.data_path.get() {
            Some(dp) => {
                millrace_nvmf_rdma::serve::listen_with_pool(&state.nvmf, addr, dp.pool.clone())
            }
            None => millrace_nvmf_rdma::serve::listen(
                &state.nvmf,
                addr,
                millrace_nvmf_rdma::serve::DEFAULT_POOL_BYTES,
            ),
        };
        match listening {
            Ok(l) => {
                up.push(l.local_addr().to_string());
                state.nvme_rdma.lock().push(Box::new(RdmaQueues(l)));
            }
            Err(e) => {
                tracing::error!(%addr, "NVMe/RDMA is off: {e}");
                eprintln!("millrace serve: cannot serve NVMe/RDMA on {addr}: {e}");
            }
        }
    }
    match up.is_empty() {
        true if addrs.is_empty() => String::new(),
        true => ", NVMe/RDMA off".into(),
        false => format!(", NVMe/RDMA on {}", up.join(" and ")),
    }
}
