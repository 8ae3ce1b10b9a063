//! `millrace`: one command for pools, I/O, the server and the bench.

// Functions stay under 100 lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod bench_cmd;
mod client;
mod export_cmd;
mod format;
mod io_cmd;
mod pool_cmd;
mod rdma_fmt;
mod serve_cmd;
mod service;
mod share_cmd;
mod volume_cmd;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "millrace",
    version,
    about = "Millrace: an open-source AI data server. Pools of NVMe drives (or drive files) as fast parity arrays.",
    long_about = None,
    propagate_version = true
)]
struct Cli {
    /// Where Millrace keeps its small state (the cache of known pools).
    #[arg(
        long,
        global = true,
        env = "MILLRACE_HOME",
        default_value = "millrace-data"
    )]
    home: PathBuf,
    /// The URL of a running server's API to use, e.g. http://10.0.0.2:8740 (default: the server
    /// `millrace serve` runs for --home, found through MILLRACE_HOME/server.json). Its token
    /// comes from MILLRACE_TOKEN.
    #[arg(long, global = true, env = "MILLRACE_SERVER")]
    server: Option<String>,
    /// More log output (-v info, -vv debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create, inspect, import and destroy pools of drives.
    #[command(subcommand)]
    Pool(pool_cmd::PoolCmd),
    /// Block volumes: named, stripe-aligned ranges of a pool.
    #[command(subcommand)]
    Volume(volume_cmd::VolumeCmd),
    /// Serve volumes over NVMe/TCP and NBD (closed by default).
    #[command(subcommand)]
    Export(export_cmd::ExportCmd),
    /// NFS shares: a volume with XFS, exported by the kernel NFS server (needs `millrace serve`).
    #[command(subcommand)]
    Share(share_cmd::ShareCmd),
    /// Run the data server: pools, exports, the HTTP API, /metrics and the dashboard (the
    /// millrace-server program beside this one; `millrace serve --help` lists its options).
    #[command(disable_help_flag = true)]
    Serve {
        /// The server's options.
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "OPTIONS"
        )]
        args: Vec<std::ffi::OsString>,
    },
    /// Read and write a pool's bytes directly (for scripts and tests).
    #[command(subcommand)]
    Io(io_cmd::IoCmd),
    /// Measure a pool (or a simulated one) against its raw drives: tables, JSON, plots.
    Bench(bench_cmd::BenchArgs),
    /// Every known pool at a glance.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a command against the service layer, and ends the session (closing pools opened here)
/// whether or not the command succeeded.
fn with_service(
    home: &std::path::Path,
    api: Option<&client::Api>,
    scope: service::Scope,
    f: impl FnOnce(&dyn service::Service) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let svc = service::open(home, api, scope)?;
    let r = f(&*svc);
    let closed = svc.finish();
    r.and(closed)
}

fn main() {
    let cli = Cli::parse();
    // Like other Unix tools, end quietly when the reader of our output goes away (`| head`).
    // Not the server: a peer that hangs up must fail its own connection, never end the
    // process (it ignores SIGPIPE, see millrace_server::lifecycle).
    if !matches!(cli.cmd, Cmd::Serve { .. }) {
        // SAFETY: setting a signal's disposition to its default before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
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
    use service::Scope::All;
    let result = (|| {
        let home = &cli.home;
        if let Cmd::Serve { args } = cli.cmd {
            return serve_cmd::exec(home, cli.verbose, args);
        }
        let api = client::Api::find(home, cli.server.as_deref())?;
        let api = api.as_ref();
        match cli.cmd {
            Cmd::Pool(c) => {
                let scope = pool_cmd::scope(&c);
                with_service(home, api, scope, |s| pool_cmd::run(s, c))
            }
            Cmd::Volume(c) => with_service(home, api, All, |s| volume_cmd::run(s, c)),
            Cmd::Export(c) => with_service(home, api, All, |s| export_cmd::run(home, s, c)),
            Cmd::Share(c) => with_service(home, api, All, |s| share_cmd::run(home, s, c)),
            Cmd::Io(c) => {
                let scope = service::Scope::Pool(c.pool().to_string());
                with_service(home, api, scope, |s| io_cmd::run(home, s, c))
            }
            Cmd::Status { json } => with_service(home, api, All, |s| pool_cmd::status(s, json)),
            // A simulated pool is benched in this process even while a server runs (its RAM
            // drives are the bench's, not the server's); a pool by whoever holds it.
            Cmd::Bench(a) => {
                let (api, scope) = match &a.pool {
                    Some(p) => (api, service::Scope::Pool(p.clone())),
                    None => (None, service::Scope::None),
                };
                with_service(home, api, scope, |s| bench_cmd::run(s, a))
            }
            Cmd::Serve { .. } => unreachable!("handled above"),
        }
    })();
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
