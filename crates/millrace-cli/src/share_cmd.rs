//! `millrace share`: NFS shares. A share is a volume with XFS on it, attached through the kernel
//! NBD client, mounted under /srv/millrace/POOL/VOLUME and exported by the kernel NFS server.
//! Only the running server can do this (the NBD client reads through it), so every command goes
//! through its API.

use std::path::Path;

use anyhow::{bail, Result};
use clap::Subcommand;
use serde_json::{json, Value};

use crate::client::{seg, Api};
use crate::format::{human, parse_bytes, table};
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

pub fn run(home: &Path, api: Option<&Api>, cmd: ShareCmd) -> Result<()> {
    let Some(api) = api else {
        bail!(
            "shares need the running server (the kernel's NBD client reads through it); start `millrace serve` first (MILLRACE_HOME is {})",
            home.display()
        );
    };
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
            let v = api.post(
                "/api/v1/shares",
                &json!({"pool": pool, "volume": vol, "size_bytes": size, "clients": clients,
                        "sync": !async_, "root_squash": !no_root_squash}),
            )?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "{volume} is shared over NFS as {} ({}, on {}) to {}",
                    v["nfs_path"].as_str().unwrap_or("?"),
                    human(v["size_bytes"].as_u64().unwrap_or(0)),
                    v["nbd_device"].as_str().unwrap_or("?"),
                    clients.join(", ")
                );
                let path = v["nfs_path"].as_str().unwrap_or("?");
                println!("  on a client: mount -t nfs -o vers=4.2 {path} /mnt");
                if let Some(p) = v["nfs_rdma_port"].as_u64() {
                    println!(
                        "  over RDMA:   mount -t nfs -o vers=4.2,proto=rdma,port={p} {path} /mnt   (or vers=3)"
                    );
                }
            }
            Ok(())
        }
        ShareCmd::List { json } => {
            let v: Value = api.get("/api/v1/shares")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let shares = v["shares"].as_array().cloned().unwrap_or_default();
            if shares.is_empty() {
                println!("no shares (create one with `millrace share create POOL/NAME --size 100G --client 10.0.0.0/24`)");
                return Ok(());
            }
            let mut t = table(&["share", "size", "nfs path", "clients", "options", "state"]);
            for s in shares {
                let clients: Vec<&str> = s["clients"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.as_str())
                    .collect();
                let rdma = s["nfs_rdma_port"]
                    .as_u64()
                    .map(|p| format!(", TCP and RDMA (port {p})"))
                    .unwrap_or_else(|| ", TCP".into());
                let state = match (s["mounted"].as_bool(), s["exported"].as_bool()) {
                    (Some(true), Some(true)) => {
                        format!(
                            "exported ({}){rdma}",
                            s["nbd_device"].as_str().unwrap_or("?")
                        )
                    }
                    (Some(true), _) => "mounted, not exported".into(),
                    _ => "down".into(),
                };
                t.add_row(vec![
                    format!(
                        "{}/{}",
                        s["pool"].as_str().unwrap_or(""),
                        s["volume"].as_str().unwrap_or("")
                    ),
                    human(s["size_bytes"].as_u64().unwrap_or(0)),
                    s["nfs_path"].as_str().unwrap_or("").into(),
                    clients.join("\n"),
                    format!(
                        "{}, {}",
                        if s["sync"].as_bool() == Some(false) {
                            "async"
                        } else {
                            "sync"
                        },
                        if s["root_squash"].as_bool() == Some(false) {
                            "no_root_squash"
                        } else {
                            "root_squash"
                        }
                    ),
                    state,
                ]);
            }
            println!("{t}");
            Ok(())
        }
        ShareCmd::Delete { volume } => {
            let (pool, vol) = split(&volume)?;
            api.delete(&format!("/api/v1/shares/{}/{}", seg(pool), seg(vol)))?;
            println!("{volume} is no longer shared; its volume is deleted");
            Ok(())
        }
    }
}
