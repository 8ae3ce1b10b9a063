//! `millrace share`: NFS shares. A share is a volume with XFS on it, attached through the kernel
//! NBD client, mounted under /srv/millrace/POOL/VOLUME and exported by the kernel NFS server.
//! Only the running server can do this (the NBD client reads through it), so every command goes
//! through its API.

use std::path::Path;

use anyhow::{bail, Result};
use clap::Subcommand;
use millrace_service::model::ShareRequest;

use crate::format::{human, parse_bytes, table};
use crate::service::Service;
use crate::volume_cmd::split;

#[derive(Subcommand)]
pub enum ShareCmd {
    /// Create a volume, format it with XFS aligned to the pool's stripes, mount it and export
    /// it over NFS (v3 and v4.2) to the listed clients.
    #[command(
        after_help = "Example:\n  millrace share create tank/datasets --size 500G --client 10.0.0.0/24\n  # on a client: mount -t nfs -o vers=4.2 SERVER:/srv/millrace/tank/datasets /data\n  # over RDMA (where the server has an RDMA device): mount -t nfs -o vers=4.2,proto=rdma,port=20049 SERVER:/srv/millrace/tank/datasets /data"
    )]
    Create {
        /// POOL/VOLUME
        volume: String,
        /// The size (rounded up to whole full stripes), e.g. 500G.
        #[arg(long, value_parser = parse_bytes)]
        size: u64,
        /// An NFS client allowed to mount (address, network such as 10.0.0.0/24, or host name;
        /// repeat for several).
        #[arg(long = "client", required = true)]
        clients: Vec<String>,
        /// Acknowledge writes once stable (the default).
        #[arg(long, conflicts_with = "async_")]
        sync: bool,
        /// Acknowledge writes before they are stable: faster, but a server crash loses them.
        #[arg(long = "async")]
        async_: bool,
        /// Let root on a client act as root on the share (squashed to nobody by default).
        #[arg(long)]
        no_root_squash: bool,
        #[arg(long)]
        json: bool,
    },
    /// List the shares.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Unexport, unmount, detach and delete a share and its volume (its data is gone).
    Delete {
        /// POOL/VOLUME
        volume: String,
    },
}

pub fn run(home: &Path, svc: &dyn Service, cmd: ShareCmd) -> Result<()> {
    if !svc.live() {
        bail!(
            "shares need the running server (the kernel's NBD client reads through it); start `millrace serve` first (MILLRACE_HOME is {})",
            home.display()
        );
    }
    match cmd {
        ShareCmd::Create {
            volume,
            size,
            clients,
            sync: _,
            async_,
            no_root_squash,
            json,
        } => {
            let (pool, vol) = split(&volume)?;
            let v = svc.create_share(ShareRequest {
                pool: pool.into(),
                volume: vol.into(),
                size_bytes: size,
                clients: clients.clone(),
                sync: !async_,
                root_squash: !no_root_squash,
            })?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::to_value(&v)?)?
                );
                return Ok(());
            }
            let device = v.config.nbd_device.as_deref().unwrap_or("?");
            let path = &v.nfs_path;
            println!(
                "{volume} is shared over NFS as {path} ({}, on {device}) to {}",
                human(v.size_bytes),
                clients.join(", ")
            );
            println!("  on a client: mount -t nfs -o vers=4.2 {path} /mnt");
            if let Some(p) = v.nfs_rdma_port {
                println!(
                    "  over RDMA:   mount -t nfs -o vers=4.2,proto=rdma,port={p} {path} /mnt   (or vers=3)"
                );
            }
            Ok(())
        }
        ShareCmd::List { json } => list(svc, json),
        ShareCmd::Delete { volume } => {
            let (pool, vol) = split(&volume)?;
            svc.delete_share(pool, vol)?;
            println!("{volume} is no longer shared; its volume is deleted");
            Ok(())
        }
    }
}

fn list(svc: &dyn Service, json: bool) -> Result<()> {
    let list = svc.shares()?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::to_value(&list)?)?
        );
        return Ok(());
    }
    if list.shares.is_empty() {
        println!("no shares (create one with `millrace share create POOL/NAME --size 100G --client 10.0.0.0/24`)");
        return Ok(());
    }
    let mut t = table(&["share", "size", "nfs path", "clients", "options", "state"]);
    for s in &list.shares {
        let rdma = (s.nfs_rdma_port)
            .map(|p| format!(", TCP and RDMA (port {p})"))
            .unwrap_or_else(|| ", TCP".into());
        let state = match (s.mounted, s.exported) {
            (true, true) => format!(
                "exported ({}){rdma}",
                s.config.nbd_device.as_deref().unwrap_or("?")
            ),
            (true, false) => "mounted, not exported".into(),
            _ => "down".into(),
        };
        let c = &s.config;
        t.add_row(vec![
            format!("{}/{}", s.pool, s.volume),
            human(s.size_bytes),
            s.nfs_path.clone(),
            c.clients.join("\n"),
            format!(
                "{}, {}",
                if c.sync { "sync" } else { "async" },
                if c.root_squash {
                    "root_squash"
                } else {
                    "no_root_squash"
                }
            ),
            state,
        ]);
    }
    println!("{t}");
    Ok(())
}
