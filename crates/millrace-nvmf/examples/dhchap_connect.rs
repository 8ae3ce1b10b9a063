//! Connects to an NVMe/TCP subsystem as a host that authenticates (DH-HMAC-CHAP) offering one
//! hash and one DH group, and reads the first block of namespace 1. The guest test
//! tests/guest/nvme-auth.sh runs it against the Linux kernel's target (nvmet) for every hash
//! and group: the Linux host offers them all and Millrace's target picks one, so this is how
//! Millrace's computations (the `dhchap` module its target uses too) meet Linux's for the
//! others. Exit 0 when every queue authenticated and the read worked; 1 with a sentence if not.
//!
//! cargo run -p millrace-nvmf --example dhchap_connect -- --addr 127.0.0.1:4420 --nqn NQN \
//!     --host HOSTNQN --secret-file host.key [--ctrl-secret-file ctrl.key] --hash 2 --group 3

use clap::Parser;
use millrace_nvmf::dhchap::{DhGroup, Hash, Secret};
use millrace_nvmf::initiator::{HostAuth, HostController, HostOptions};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    addr: SocketAddr,
    /// The subsystem's NQN.
    #[arg(long)]
    nqn: String,
    /// The host's NQN.
    #[arg(long)]
    host: String,
    /// A file with the host's secret (DHHC-1:XX:BASE64:, as nvme gen-dhchap-key prints it).
    #[arg(long)]
    secret_file: PathBuf,
    /// A file with the controller's secret: the controller must prove itself too.
    #[arg(long)]
    ctrl_secret_file: Option<PathBuf>,
    /// The one hash offered: 1 SHA-256, 2 SHA-384, 3 SHA-512.
    #[arg(long)]
    hash: u8,
    /// The one DH group offered: 0 null, 1 ffdhe2048 ... 5 ffdhe8192.
    #[arg(long)]
    group: u8,
}

fn secret(p: &Path) -> Result<Secret, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    Secret::parse(&text).map_err(|e| format!("{}: {e}", p.display()))
}

async fn run(a: Args) -> Result<String, String> {
    let hash = Hash::from_id(a.hash).ok_or("--hash is 1, 2 or 3")?;
    let group = DhGroup::from_id(a.group).ok_or("--group is 0 to 5")?;
    let ctrl = a.ctrl_secret_file.as_deref().map(secret).transpose()?;
    let auth = HostAuth {
        hashes: vec![hash],
        groups: vec![group],
        ..HostAuth::new(secret(&a.secret_file)?, ctrl)
    };
    let o = HostOptions {
        hostnqn: a.host,
        ..Default::default()
    };
    let c = HostController::connect_auth(a.addr, &a.nqn, &o, 1, Some(&auth))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    if !c.admin.auth_required {
        return Err("the target did not ask this host to authenticate".into());
    }
    // The namespace's block size: its format's LBADS (Identify Namespace).
    let ns = (c.admin.identify(0, 1).await).map_err(|e| format!("identify: {e}"))?;
    let lbads = ns[128 + 4 * (ns[26] & 0xf) as usize + 2];
    let data = (c.io[0].read(1, 0, 1, 1 << lbads).await).map_err(|e| format!("read: {e}"))?;
    Ok(format!(
        "authenticated with {} and {}{}: admin and I/O queue; read {} bytes",
        hash.name(),
        group.name(),
        if auth.ctrl_secret.is_some() {
            ", both ways"
        } else {
            ""
        },
        data.len()
    ))
}

fn main() {
    let a = Args::parse();
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    match rt.block_on(run(a)) {
        Ok(said) => println!("dhchap_connect: {said}"),
        Err(e) => {
            eprintln!("dhchap_connect: {e}");
            std::process::exit(1);
        }
    }
}
