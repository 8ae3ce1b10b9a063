//! `millrace export`: volumes served over NVMe/TCP and NBD. The settings live in the volume's
//! own metadata, so exports survive restarts and travel with the pool. Through the server's
//! API when one runs (the export starts at once); else recorded for the next `millrace serve`.
//! Written once against the service layer.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Subcommand;
use millrace_server::model::{AnaRequest, NbdExportRequest, NvmeExportRequest};
use serde_json::Value;

use crate::format::table;
use crate::service::Service;
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
        /// The namespace's ANA group, 1 to 128 (default 1); each path's state is kept per group.
        #[arg(long, value_name = "N")]
        ana_group: Option<u32>,
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
    /// Paths and their ANA states: how each listener reaches the export, for hosts' multipath.
    #[command(subcommand)]
    Ana(AnaCmd),
    /// Persistent reservations hosts hold on an export (`export list` shows them).
    #[command(subcommand)]
    Reservation(ReservationCmd),
}

#[derive(Subcommand)]
pub enum ReservationCmd {
    /// Clear the export's reservation and every registration, as a cluster's own fencing
    /// would: for an operator whose cluster holding it is gone. The registered hosts are told
    /// their reservation was preempted; a state kept through restarts is cleared too.
    #[command(after_help = "Example:\n  millrace export nvme reservation clear tank/quorum")]
    Clear {
        /// POOL/VOLUME
        volume: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum AnaCmd {
    /// Set the ANA state of an export on one path (listener). Hosts connected through it are
    /// told at once; their multipath sends I/O down optimized paths first and none down an
    /// inaccessible one. States last until the server restarts (then every path is optimized).
    #[command(
        after_help = "Examples:\n  millrace export nvme ana set tank/db --listener 10.0.0.5:4420 --state inaccessible\n  millrace export nvme ana set tank/db --listener 10.0.0.5:4420 --state optimized\n  (`millrace export list` shows each export's paths and their states)"
    )]
    Set {
        /// POOL/VOLUME
        volume: String,
        /// The listener, ADDR:PORT as `millrace serve --nvme` (or --nvme-rdma) listens.
        #[arg(long, value_name = "ADDR:PORT")]
        listener: String,
        /// The listener's transport.
        #[arg(long, default_value = "tcp", value_parser = ["tcp", "rdma"])]
        transport: String,
        /// optimized, non-optimized, inaccessible, persistent-loss or change.
        #[arg(long)]
        state: String,
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

fn list(svc: &dyn Service, json: bool, only: Option<&str>) -> Result<()> {
    let view = svc.exports()?;
    if json {
        // Through a Value, whose keys are sorted, as this command has always printed them.
        let mut v = serde_json::to_value(&view)?;
        if let (Some(k), Value::Object(all)) = (only, &mut v) {
            let kept = all.remove(k).unwrap_or(Value::Null);
            v = Value::Object([(k.to_string(), kept)].into_iter().collect());
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let live = svc.live();
    let not_running = || "(server not running)".to_string();
    let mut t = table(&["volume", "protocol", "name", "allowed", "connections"]);
    let nvme = if only == Some("nbd") {
        &[][..]
    } else {
        &view.nvme[..]
    };
    let nbd = if only == Some("nvme") {
        &[][..]
    } else {
        &view.nbd[..]
    };
    for e in nvme {
        let connections: Vec<String> = (e.connections.iter())
            .map(|c| match &c.listener {
                Some(l) => format!("{} from {} via {l}", c.host, c.peer),
                None => format!("{} from {}", c.host, c.peer),
            })
            .collect();
        let mut name = vec![e.nqn.clone()];
        name.extend(paths(e));
        name.extend(reservation(e));
        t.add_row(vec![
            format!("{}/{}", e.pool, e.volume),
            "nvme-tcp".into(),
            name.join("\n"),
            if e.allow_any_host {
                "any host".into()
            } else {
                e.hosts.join("\n")
            },
            match (live, connections.is_empty()) {
                (false, _) => not_running(),
                (true, true) => "0".into(),
                (true, false) => connections.join("\n"),
            },
        ]);
    }
    for e in nbd {
        let mut allowed = vec!["unix socket".to_string()];
        allowed.extend(e.clients.iter().cloned());
        t.add_row(vec![
            format!("{}/{}", e.pool, e.volume),
            "nbd".into(),
            e.name.clone(),
            allowed.join("\n"),
            if live {
                // Each client by name (address, or "local socket"), as for NVMe hosts.
                if e.connected.is_empty() {
                    "none".into()
                } else {
                    e.connected.join("\n")
                }
            } else {
                not_running()
            },
        ]);
    }
    if nvme.is_empty() && nbd.is_empty() {
        println!("no exports (add one with `millrace export nvme add POOL/VOLUME --host NQN`)");
    } else {
        println!("{t}");
    }
    Ok(())
}

/// An NVMe export's paths, one line each: "path tcp 10.0.0.5:4420 optimized (ANA group 1)".
fn paths(e: &millrace_server::model::NvmeExportView) -> Vec<String> {
    (e.paths.iter())
        .map(|p| {
            format!(
                "path {} {} {} (ANA group {})",
                p.transport, p.listener, p.state, e.ana_group
            )
        })
        .collect()
}

/// An NVMe export's reservation, when a host registered or holds one: "reservation
/// write-exclusive held by NQN; 2 hosts registered (kept through restarts)".
fn reservation(e: &millrace_server::model::NvmeExportView) -> Option<String> {
    let r = e.reservation.as_ref()?;
    if r.rtype.is_none() && r.registrants.is_empty() {
        return None;
    }
    let held = match (&r.rtype, &r.holder) {
        (None, _) => "none".to_string(),
        (Some(t), Some(h)) => format!("{t} held by {h}"),
        (Some(t), None) => format!("{t} held by every registrant"),
    };
    let n = r.registrants.len();
    Some(format!(
        "reservation {held}; {n} host{} registered{}",
        if n == 1 { "" } else { "s" },
        if r.ptpl {
            " (kept through restarts)"
        } else {
            ""
        }
    ))
}

fn clear_reservation(svc: &dyn Service, cmd: ReservationCmd) -> Result<()> {
    let ReservationCmd::Clear { volume, json } = cmd;
    let (pool, vol) = split(&volume)?;
    let v = svc.clear_nvme_reservation(pool, vol)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{volume}: reservation and registrations cleared; the hosts that were registered are told");
    }
    Ok(())
}

fn set_ana(svc: &dyn Service, cmd: AnaCmd) -> Result<()> {
    let AnaCmd::Set {
        volume,
        listener,
        transport,
        state,
        json,
    } = cmd;
    let (pool, vol) = split(&volume)?;
    let v = svc.set_nvme_ana(
        pool,
        vol,
        AnaRequest {
            listener: listener.clone(),
            transport: Some(transport.clone()),
            state,
        },
    )?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for p in &v.paths {
        let mark = match p.listener == listener && p.transport == transport {
            true => "  (changed)",
            false => "",
        };
        println!(
            "{volume} over {} {}: {} (ANA group {}){mark}",
            p.transport, p.listener, p.state, v.ana_group
        );
    }
    Ok(())
}

/// What an export made with no server running adds to its line.
fn when(svc: &dyn Service) -> &'static str {
    if svc.live() {
        ""
    } else {
        " (served when `millrace serve` starts)"
    }
}

pub fn run(home: &Path, svc: &dyn Service, cmd: ExportCmd) -> Result<()> {
    match cmd {
        ExportCmd::List { json } => list(svc, json, None),
        ExportCmd::Nvme(NvmeCmd::List { json }) => list(svc, json, Some("nvme")),
        ExportCmd::Nbd(NbdCmd::List { json }) => list(svc, json, Some("nbd")),
        ExportCmd::Nvme(NvmeCmd::Ana(cmd)) => set_ana(svc, cmd),
        ExportCmd::Nvme(NvmeCmd::Reservation(cmd)) => clear_reservation(svc, cmd),
        ExportCmd::Nvme(NvmeCmd::Add {
            volume,
            hosts,
            allow_any_host,
            nqn,
            ana_group,
            json,
        }) => {
            let (pool, vol) = split(&volume)?;
            let c = svc.add_nvme(NvmeExportRequest {
                pool: pool.into(),
                volume: vol.into(),
                nqn,
                hosts,
                allow_any_host,
                ana_group,
            })?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::to_value(&c)?)?
                );
            } else {
                println!(
                    "{volume} is exported over NVMe/TCP as {}{}",
                    c.nqn,
                    when(svc)
                );
            }
            Ok(())
        }
        ExportCmd::Nvme(NvmeCmd::Remove { volume }) => {
            let (pool, vol) = split(&volume)?;
            svc.remove_nvme(pool, vol)?;
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
            let c = svc.add_nbd(NbdExportRequest {
                pool: pool.into(),
                volume: vol.into(),
                name,
                clients,
                listen,
                socket,
            })?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::to_value(&c)?)?
                );
            } else {
                let mut at = vec![millrace_server::nbd_socket(home).display().to_string()];
                at.extend(c.socket.as_ref().map(|s| s.display().to_string()));
                at.extend(c.listen.map(|l| format!("tcp {l}")));
                println!(
                    "{volume} is exported over NBD as '{}' on {}{}",
                    c.name,
                    at.join(", "),
                    when(svc)
                );
            }
            Ok(())
        }
        ExportCmd::Nbd(NbdCmd::Remove { volume }) => {
            let (pool, vol) = split(&volume)?;
            svc.remove_nbd(pool, vol)?;
            println!("{volume} is no longer exported over NBD");
            Ok(())
        }
    }
}
