//! `millrace`: one command for pools, I/O, the server and the bench.

mod bench_cmd;
mod format;
mod io_cmd;
mod pool_cmd;

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
    let result = match cli.cmd {
        Cmd::Pool(c) => pool_cmd::run(&cli.home, c),
        Cmd::Io(c) => io_cmd::run(&cli.home, c),
        Cmd::Status { json } => pool_cmd::status(&cli.home, json),
        Cmd::Bench(a) => bench_cmd::run(&cli.home, a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
