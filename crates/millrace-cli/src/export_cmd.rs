//! `millrace export`: volumes served over NVMe/TCP and NBD. The settings live in the volume's
//! own metadata, so exports survive restarts and travel with the pool. Through the server's
//! API when one runs (the export starts at once); else recorded for the next `millrace serve`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Subcommand;
use serde_json::{json, Value};

use crate::client::{seg, Api};
use crate::format::table;
use crate::volume_cmd::split;

#[derive(Subcommand)]
pub enum ExportCmd {
    /// NVMe/TCP exports (subsystems with one namespace), for `nvme connect`.
    #[command(subcommand)]
    Nvme(NvmeCmd),
    /// NBD exports, for nbd-client, qemu, libnbd and fio's nbd engine.
    #[command(subcommand)]
    Nbd(NbdCmd),
    /// Every export, and who is connected.
    List {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum NvmeCmd {
    /// Export a volume. Closed by default: name the hosts that may connect.
    #[command(
        after_help = "Example:\n  millrace export nvme add tank/scratch --host nqn.2014-08.org.nvmexpress:uuid:...\n  (a host's NQN is in its /etc/nvme/hostnqn)"
    )]
    Add {
        /// POOL/VOLUME
        volume: String,
        /// A host NQN allowed to connect (repeat for several).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Let any host connect (explicit: exports are closed by default).
        #[arg(long)]
        allow_any_host: bool,
        /// The subsystem NQN (default nqn.2026-11.dev.millrace:POOL.VOLUME).
        #[arg(long)]
        nqn: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Stop exporting a volume.
    Remove { volume: String },
    /// List NVMe/TCP exports.
    List {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum NbdCmd {
    /// Export a volume over NBD: on MILLRACE_HOME/nbd.sock, and on TCP for listed clients.
    #[command(
        after_help = "Examples:\n  millrace export nbd add tank/vm1 --socket /run/millrace/vm1.sock\n  millrace export nbd add tank/vm1 --listen 127.0.0.1:10809 --client 127.0.0.1"
    )]
    Add {
        /// POOL/VOLUME
        volume: String,
        /// The export name clients ask for (default POOL/VOLUME).
        #[arg(long)]
        name: Option<String>,
        /// A Unix socket of the export's own.
        #[arg(long, conflicts_with = "listen")]
        socket: Option<PathBuf>,
        /// A TCP address of the export's own (needs --client).
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// A client address or network allowed over TCP (repeat for several).
        #[arg(long = "client")]
        clients: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Stop exporting a volume.
    Remove { volume: String },
    /// List NBD exports.
    List {
        #[arg(long)]
        json: bool,
    },
}

/// Runs `f` on a server state: the live one through the API, or one opened offline.
fn offline<T>(
    home: &Path,
    f: impl FnOnce(&millrace_server::State) -> Result<T, millrace_server::ApiError>,
) -> Result<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let _g = rt.enter();
    let st = millrace_server::State::open_offline(home)?;
    let r = f(&st);
    st.close()?;
    r.map_err(|e| anyhow::anyhow!("{}", e.message))
}

fn list(home: &Path, api: Option<&Api>, json: bool, only: Option<&str>) -> Result<()> {
    let mut v: Value = match api {
        Some(a) => a.get("/api/v1/exports")?,
        None => offline(home, |s| Ok(s.exports_view()))?,
    };
    if let Some(k) = only {
        v = json!({ k: v[k].clone() });
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let live = api.is_some();
    let mut t = table(&["volume", "protocol", "name", "allowed", "connections"]);
    let mut any = false;
    for e in v["nvme"].as_array().into_iter().flatten() {
        any = true;
        let hosts: Vec<&str> = e["hosts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h.as_str())
            .collect();
        t.add_row(vec![
            format!(
                "{}/{}",
                e["pool"].as_str().unwrap_or(""),
                e["volume"].as_str().unwrap_or("")
            ),
            "nvme-tcp".into(),
            e["nqn"].as_str().unwrap_or("").into(),
            if e["allow_any_host"].as_bool() == Some(true) {
                "any host".into()
            } else {
                hosts.join("\n")
            },
            if live {
                let c: Vec<String> = e["connections"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        format!(
                            "{} from {}",
                            c["host"].as_str().unwrap_or("?"),
                            c["peer"].as_str().unwrap_or("?")
                        )
                    })
                    .collect();
                if c.is_empty() {
                    "0".into()
                } else {
                    c.join("\n")
                }
            } else {
                "(server not running)".into()
            },
        ]);
    }
    for e in v["nbd"].as_array().into_iter().flatten() {
        any = true;
        let clients: Vec<&str> = e["clients"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h.as_str())
            .collect();
        let mut allowed = vec!["unix socket".to_string()];
        allowed.extend(clients.iter().map(|c| c.to_string()));
        t.add_row(vec![
            format!(
                "{}/{}",
                e["pool"].as_str().unwrap_or(""),
                e["volume"].as_str().unwrap_or("")
            ),
            "nbd".into(),
            e["name"].as_str().unwrap_or("").into(),
            allowed.join("\n"),
            if live {
                // Each client by name (address, or "local socket"), as for NVMe hosts.
                let who: Vec<&str> = e["connected"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.as_str())
                    .collect();
                if who.is_empty() {
                    "none".into()
                } else {
                    who.join("\n")
                }
            } else {
                "(server not running)".into()
            },
        ]);
    }
    if any {
        println!("{t}");
    } else {
        println!("no exports (add one with `millrace export nvme add POOL/VOLUME --host NQN`)");
    }
    Ok(())
}

pub fn run(home: &Path, api: Option<&Api>, cmd: ExportCmd) -> Result<()> {
    match cmd {
        ExportCmd::List { json } => list(home, api, json, None),
        ExportCmd::Nvme(NvmeCmd::List { json }) => list(home, api, json, Some("nvme")),
        ExportCmd::Nbd(NbdCmd::List { json }) => list(home, api, json, Some("nbd")),
        ExportCmd::Nvme(NvmeCmd::Add {
            volume,
            hosts,
            allow_any_host,
            nqn,
            json,
        }) => {
            let (pool, vol) = split(&volume)?;
            let c: Value = match api {
                Some(a) => a.post(
                    "/api/v1/exports/nvme",
                    &json!({"pool": pool, "volume": vol, "nqn": nqn, "hosts": hosts, "allow_any_host": allow_any_host}),
                )?,
                None => serde_json::to_value(offline(home, |s| {
                    s.add_nvme_export(pool, vol, nqn.clone(), hosts.clone(), allow_any_host)
                })?)?,
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&c)?);
            } else {
                println!(
                    "{volume} is exported over NVMe/TCP as {}{}",
                    c["nqn"].as_str().unwrap_or("?"),
                    if api.is_some() {
                        ""
                    } else {
                        " (served when `millrace serve` starts)"
                    }
                );
            }
            Ok(())
        }
        ExportCmd::Nvme(NvmeCmd::Remove { volume }) => {
            let (pool, vol) = split(&volume)?;
            match api {
                Some(a) => {
                    a.delete(&format!("/api/v1/exports/nvme/{}/{}", seg(pool), seg(vol)))?;
                }
                None => offline(home, |s| s.remove_nvme_export(pool, vol))?,
            }
            println!("{volume} is no longer exported over NVMe/TCP");
            Ok(())
        }
        ExportCmd::Nbd(NbdCmd::Add {
            volume,
            name,
            socket,
            listen,
            clients,
            json,
        }) => {
            let (pool, vol) = split(&volume)?;
            let socket = socket.map(|p| std::path::absolute(&p).unwrap_or(p));
            let c: Value = match api {
                Some(a) => a.post(
                    "/api/v1/exports/nbd",
                    &json!({"pool": pool, "volume": vol, "name": name, "clients": clients, "listen": listen, "socket": socket}),
                )?,
                None => serde_json::to_value(offline(home, |s| {
                    s.add_nbd_export(pool, vol, name.clone(), clients.clone(), listen, socket.clone())
                })?)?,
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&c)?);
            } else {
                let mut at = vec![millrace_server::nbd_socket(home).display().to_string()];
                if let Some(s) = c["socket"].as_str() {
                    at.push(s.to_string());
                }
                if let Some(l) = c["listen"].as_str() {
                    at.push(format!("tcp {l}"));
                }
                println!(
                    "{volume} is exported over NBD as '{}' on {}{}",
                    c["name"].as_str().unwrap_or("?"),
                    at.join(", "),
                    if api.is_some() {
                        ""
                    } else {
                        " (served when `millrace serve` starts)"
                    }
                );
            }
            Ok(())
        }
        ExportCmd::Nbd(NbdCmd::Remove { volume }) => {
            let (pool, vol) = split(&volume)?;
            match api {
                Some(a) => {
                    a.delete(&format!("/api/v1/exports/nbd/{}/{}", seg(pool), seg(vol)))?;
                }
                None => offline(home, |s| s.remove_nbd_export(pool, vol))?,
            }
            println!("{volume} is no longer exported over NBD");
            Ok(())
        }
    }
}
