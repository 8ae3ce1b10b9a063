//! `millrace serve`: the data server. It assembles the pools the cache knows, opens their
//! volumes, serves the exports recorded in the volumes' props (NVMe/TCP and NBD), and answers
//! the HTTP API, /metrics and the dashboard. Exports stay ignorant of parity: they see volumes
//! as block devices; this crate is where the layers meet.

// Functions stay under 100 lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

// Dependencies point one way (tests/layers.rs checks it), from the bottom up: error, props
// (what volumes record); jobs, metered; model (requests and responses); state (the pools held); exports; shares; pools (taking
// pools into service brings their exports and shares back); bench, metrics, rdma; api.
mod api;
mod bench;
pub mod datapath;
mod error;
mod exports;
mod jobs;
mod metered;
mod metrics;
pub mod model;
pub mod nfs_rdma;
mod pools;
mod props;
mod rdma;
pub mod service;
mod shares;
mod sockpath;
mod state;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

pub use error::ApiError;
pub use model::ShareView;
pub use props::{NbdExportConfig, NvmeExportConfig, ShareConfig};
pub use rdma::view as rdma_view;
pub use state::State;

/// Where the server listens and what it guards.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub home: PathBuf,
    pub api: SocketAddr,
    /// The NVMe/TCP I/O port; `None` serves no NVMe/TCP.
    pub nvme: Option<SocketAddr>,
    pub discovery_port: Option<u16>,
    /// NVMe/RDMA listeners (`--nvme-rdma`); one that cannot start is reported and skipped.
    pub nvme_rdma: Vec<SocketAddr>,
    /// A TCP listener for NBD clients; the Unix socket under `home` is always there.
    pub nbd_listen: Option<SocketAddr>,
    /// The bearer token the API demands (required when `api` is not a loopback address).
    pub token: Option<String>,
    /// Serve the API over HTTPS with this certificate chain and key (PEM files).
    pub tls: Option<TlsFiles>,
    /// The cores and the buffer pool every export's connections run on.
    pub data_path: datapath::DataPathConfig,
}

#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What `millrace serve` leaves in MILLRACE_HOME while it runs, so the CLI finds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServerFile {
    pub url: String,
    pub pid: u32,
    pub nbd_socket: PathBuf,
    /// The API's certificate when it speaks HTTPS, for the CLI on this machine to trust.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
}

pub fn server_file(home: &std::path::Path) -> PathBuf {
    home.join("server.json")
}

pub fn nbd_socket(home: &std::path::Path) -> PathBuf {
    home.join("nbd.sock")
}

/// Runs the server until SIGINT or SIGTERM: named start-up steps, the API until a signal,
/// then the shutdown in the order that keeps the pools clean.
pub async fn run(cfg: ServeConfig) -> Result<()> {
    check_config(&cfg)?;
    let sf = claim_home(&cfg)?;
    // The certificate is checked before any pool is touched.
    let tls = load_tls(&cfg).await?;
    // Sizes are checked and the pool mapped before any pool is touched.
    let dp = datapath::DataPath::start(&cfg.data_path)?;
    let state = open_state(&cfg.home).await?;
    (state.nvmf).set_data_path(dp.pool.clone(), Some(dp.cores.clone()))?;
    // A warning, not a failure: an export's own socket may already have served a client, which
    // gave the NBD server a core and pool of its own.
    if let Err(e) = state.nbd.set_data_path(dp.cores.clone(), dp.pool.clone()) {
        tracing::warn!("NBD keeps its own core and buffer pool: {e}");
    }
    let _ = state.data_path.set(dp);
    let api = tokio::net::TcpListener::bind(cfg.api)
        .await
        .with_context(|| format!("cannot listen for the API on {}", cfg.api))?;
    let api_addr = api.local_addr()?;
    let nvme_at = start_nvme(&cfg, &state).await?;
    let rdma_at = start_nvme_rdma(&state, &cfg.nvme_rdma);
    let sock = start_nbd(&cfg, &state).await?;
    state.start_pending_rebuilds();
    // Shares come back once their NBD exports serve (the pools started them above): the
    // kernel's NBD client attaches through them.
    {
        let s = state.clone();
        tokio::task::spawn_blocking(move || s.restore_shares()).await?;
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    write_server_file(&cfg, &sf, format!("{scheme}://{api_addr}"), &sock)?;
    tracing::info!(api = %api_addr, "millrace serve is up");
    announce(&cfg, scheme, api_addr, nvme_at, &rdma_at, &sock);
    let app = api::router(state.clone(), cfg.token.clone());
    let served = serve_api(api, app, tls).await;
    eprintln!("millrace serve: stopping");
    shut_down(state, &sf, &sock).await?;
    served.context("the API server failed")
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

/// Makes the home and refuses it while another live server holds it; returns its server file.
fn claim_home(cfg: &ServeConfig) -> Result<PathBuf> {
    std::fs::create_dir_all(&cfg.home)
        .with_context(|| format!("cannot create {}", cfg.home.display()))?;
    let sf = server_file(&cfg.home);
    if let Ok(text) = std::fs::read_to_string(&sf) {
        if let Ok(old) = serde_json::from_str::<ServerFile>(&text) {
            // SAFETY: kill with signal 0 only asks whether the process exists.
            if old.pid != std::process::id() && unsafe { libc::kill(old.pid as i32, 0) } == 0 {
                bail!(
                    "another millrace server (pid {}) already serves {} at {}; stop it first",
                    old.pid,
                    cfg.home.display(),
                    old.url
                );
            }
        }
    }
    Ok(sf)
}

async fn load_tls(cfg: &ServeConfig) -> Result<Option<axum_server::tls_rustls::RustlsConfig>> {
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
    Ok(Some(c))
}

async fn open_state(home: &std::path::Path) -> Result<Arc<State>> {
    let home = home.to_path_buf();
    Ok(Arc::new(
        tokio::task::spawn_blocking(move || State::open(&home)).await??,
    ))
}

/// The NVMe/TCP port and its discovery port; returns where NVMe/TCP really listens (port 0 in
/// the config picks a free port).
async fn start_nvme(cfg: &ServeConfig, state: &Arc<State>) -> Result<Option<SocketAddr>> {
    let Some(addr) = cfg.nvme else {
        return Ok(None);
    };
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for NVMe/TCP on {addr}"))?;
    let at = l.local_addr()?;
    state
        .nvme_listening
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let t = state.nvmf.clone();
    tokio::spawn(async move { t.serve(l).await });
    if let Some(p) = cfg.discovery_port {
        let d = SocketAddr::new(addr.ip(), p);
        let l = tokio::net::TcpListener::bind(d)
            .await
            .with_context(|| format!("cannot listen for NVMe discovery on {d}"))?;
        let t = state.nvmf.clone();
        tokio::spawn(async move { t.serve_discovery(l).await });
    }
    Ok(Some(at))
}

/// NBD on TCP when asked and on the home's Unix socket always; returns the socket's path.
async fn start_nbd(cfg: &ServeConfig, state: &Arc<State>) -> Result<PathBuf> {
    if let Some(addr) = cfg.nbd_listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen for NBD on {addr}"))?;
        let s = state.nbd.clone();
        tokio::spawn(async move { s.serve_tcp(l).await });
    }
    let sock = nbd_socket(&cfg.home);
    let _ = std::fs::remove_file(&sock);
    let ul = tokio::net::UnixListener::bind(&sock)
        .with_context(|| format!("cannot listen for NBD on {}", sock.display()))?;
    let s = state.nbd.clone();
    tokio::spawn(async move { s.serve_unix(ul).await });
    Ok(sock)
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
    nvme_at: Option<SocketAddr>,
    rdma_at: &str,
    sock: &std::path::Path,
) {
    let nvme = nvme_at
        .map(|a| {
            let discovery = (cfg.discovery_port)
                .map(|p| p.to_string())
                .unwrap_or("off".into());
            format!("{a} (discovery {discovery})")
        })
        .unwrap_or("off".into());
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

/// Resolves on SIGINT or SIGTERM.
async fn signalled() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}

/// Answers the API (over TLS when configured) until a signal.
async fn serve_api(
    api: tokio::net::TcpListener,
    app: axum::Router,
    tls: Option<axum_server::tls_rustls::RustlsConfig>,
) -> std::io::Result<()> {
    let Some(tls) = tls else {
        return axum::serve(api, app)
            .with_graceful_shutdown(signalled())
            .await;
    };
    let handle = axum_server::Handle::new();
    tokio::spawn({
        let handle = handle.clone();
        async move {
            signalled().await;
            handle.graceful_shutdown(Some(std::time::Duration::from_secs(5)));
        }
    });
    axum_server::from_tcp_rustls(api.into_std()?, tls)?
        .handle(handle)
        .serve(app.into_make_service())
        .await
}

async fn shut_down(state: Arc<State>, sf: &std::path::Path, sock: &std::path::Path) -> Result<()> {
    // Shares first, while the NBD server still runs: their unmount flushes through it.
    {
        let s = state.clone();
        tokio::task::spawn_blocking(move || s.stop_shares()).await?;
    }
    state.nvmf.shutdown();
    state.nbd.shutdown();
    let _ = std::fs::remove_file(sf);
    let _ = std::fs::remove_file(sock);
    tokio::task::spawn_blocking(move || state.close()).await??;
    Ok(())
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
                state.nvme_rdma.lock().push(l);
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
