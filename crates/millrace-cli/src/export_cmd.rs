//! `millrace export`: volumes served over NVMe/TCP and NBD. The settings live in the volume's
//! own metadata, so exports survive restarts and travel with the pool. Through the server's
//! API when one runs (the export starts at once); else recorded for the next `millrace serve`.
//! Written once against the service layer.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Subcommand;
use millrace_service::model::{
    AnaRequest, NbdExportRequest, NvmeExportRequest, NvmeHostKeysRequest,
};
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
        #[command(flatten)]
        secrets: Secrets,
        #[arg(long)]
        json: bool,
    },
    /// The hosts of an export: let one more connect, set or rotate its secrets.
    #[command(subcommand)]
    Host(HostCmd),
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

/// In-band authentication (DH-HMAC-CHAP): files holding the secrets, as
/// `nvme gen-dhchap-key` prints them (`DHHC-1:XX:BASE64:`).
#[derive(clap::Args)]
pub struct Secrets {
    /// A file with the host's DH-HMAC-CHAP secret: the host must authenticate with it.
    #[arg(long, value_name = "FILE")]
    dhchap_secret: Option<PathBuf>,
    /// A file with the controller's secret: the export proves itself to the host too
    /// (bidirectional; needs --dhchap-secret).
    #[arg(long, value_name = "FILE", requires = "dhchap_secret")]
    dhchap_ctrl_secret: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum HostCmd {
    /// Let one more host connect to an export (with --dhchap-secret, it must authenticate;
    /// the secret is set before the host is let in).
    Add {
        /// POOL/VOLUME
        volume: String,
        /// The host's NQN (its /etc/nvme/hostnqn).
        host: String,
        #[command(flatten)]
        secrets: Secrets,
        /// A file with the host's TLS PSK (`NVMeTLSkey-1:HH:BASE64:`, as `nvme gen-tls-key`
        /// writes it), for listeners that require TLS (`millrace serve --nvme-tls required`).
        #[arg(long, value_name = "FILE")]
        tls_psk: Option<PathBuf>,
    },
    /// Set or rotate the DH-HMAC-CHAP secrets a host authenticates with, or its TLS PSK; its
    /// next authentication (or TLS handshake) uses them.
    #[command(
        after_help = "Examples:\n  nvme gen-dhchap-key -n HOSTNQN > host.key\n  millrace export nvme host set-key tank/db HOSTNQN --dhchap-secret host.key\n  nvme gen-tls-key -i > host.psk   (NVMeTLSkey-1:01:...:)\n  millrace export nvme host set-key tank/db HOSTNQN --tls-psk host.psk"
    )]
    SetKey {
        /// POOL/VOLUME
        volume: String,
        /// The host's NQN.
        host: String,
        #[command(flatten)]
        secrets: Secrets,
        /// A file with the host's TLS PSK (`NVMeTLSkey-1:HH:BASE64:`), for listeners that
        /// require TLS (`millrace serve --nvme-tls required`).
        #[arg(long, value_name = "FILE")]
        tls_psk: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

/// Reads and checks a secret file; errors name the file, never its content.
fn read_secret(what: &str, path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read the {what} file {}: {e}", path.display()))?;
    millrace_service::nvme_auth::check_secret(&text)
        .map_err(|e| anyhow::anyhow!("the {what} in {} is refused: {e}", path.display()))
}

/// Reads and checks a TLS PSK file; errors name the file, never its content.
fn read_psk(path: Option<&Path>) -> Result<Option<String>> {
    let Some(path) = path else { return Ok(None) };
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read the TLS PSK file {}: {e}", path.display()))?;
    millrace_service::nvme_tls::check_psk(&text)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("the TLS PSK in {} is refused: {e}", path.display()))
}

impl Secrets {
    /// The host's secret and the controller's, read and checked.
    fn read(&self) -> Result<(Option<String>, Option<String>)> {
        let host = (self.dhchap_secret.as_deref())
            .map(|p| read_secret("DH-HMAC-CHAP secret", p))
            .transpose()?;
        let ctrl = (self.dhchap_ctrl_secret.as_deref())
            .map(|p| read_secret("DH-HMAC-CHAP controller secret", p))
            .transpose()?;
        Ok((host, ctrl))
    }
}

fn host_cmd(svc: &dyn Service, cmd: HostCmd) -> Result<()> {
    match cmd {
        HostCmd::Add {
            volume,
            host,
            secrets,
            tls_psk,
        } => {
            let (pool, vol) = split(&volume)?;
            let (secret, ctrl) = secrets.read()?;
            let tls_psk = read_psk(tls_psk.as_deref())?;
            if secret.is_some() || tls_psk.is_some() {
                let req = NvmeHostKeysRequest {
                    dhchap_secret: secret,
                    dhchap_ctrl_secret: ctrl,
                    tls_psk,
                };
                svc.set_nvme_host_keys(pool, vol, &host, req)?;
            }
            svc.add_nvme_host(pool, vol, &host)?;
            println!("{host} may connect to {volume}{}", when(svc));
            Ok(())
        }
        HostCmd::SetKey {
            volume,
            host,
            secrets,
            tls_psk,
            json,
        } => {
            let (pool, vol) = split(&volume)?;
            let (secret, ctrl) = secrets.read()?;
            let tls_psk = read_psk(tls_psk.as_deref())?;
            if secret.is_none() && tls_psk.is_none() {
                anyhow::bail!("give the host's secret with --dhchap-secret FILE, or its TLS PSK with --tls-psk FILE");
            }
            let tls = tls_psk.is_some();
            let dhchap = secret.is_some();
            let req = NvmeHostKeysRequest {
                dhchap_secret: secret,
                dhchap_ctrl_secret: ctrl,
                tls_psk,
            };
            let v = svc.set_nvme_host_keys(pool, vol, &host, req)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else if !dhchap && tls {
                println!(
                    "{host} proves itself to {volume} over TLS with its new PSK{}",
                    when(svc)
                );
            } else {
                let mode = v.dhchap.get(&host).map_or("host", |m| m.as_str());
                println!(
                    "{host} authenticates to {volume} with its new secret ({mode}){}",
                    when(svc)
                );
            }
            Ok(())
        }
    }
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
            allowed(e),
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

/// An NVMe export's allowed hosts, one a line, each with its authentication when it has one:
/// "HOSTNQN (dhchap: host)".
fn allowed(e: &millrace_service::model::NvmeExportView) -> String {
    let mut v: Vec<String> = (e.hosts.iter())
        .map(|h| {
            let tls = if e.tls_psk.contains(h) {
                " (tls psk)"
            } else {
                ""
            };
            match e.dhchap.get(h).map(String::as_str) {
                None | Some("none") => format!("{h}{tls}"),
                Some(m) => format!("{h} (dhchap: {m}){tls}"),
            }
        })
        .collect();
    if e.allow_any_host {
        v.insert(0, "any host".into());
    }
    v.join("\n")
}

/// An NVMe export's paths, one line each: "path tcp 10.0.0.5:4420 optimized (ANA group 1)".
fn paths(e: &millrace_service::model::NvmeExportView) -> Vec<String> {
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
fn reservation(e: &millrace_service::model::NvmeExportView) -> Option<String> {
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
        ExportCmd::Nvme(NvmeCmd::Host(cmd)) => host_cmd(svc, cmd),
        ExportCmd::Nvme(NvmeCmd::Reservation(cmd)) => clear_reservation(svc, cmd),
        ExportCmd::Nvme(NvmeCmd::Add {
            volume,
            hosts,
            allow_any_host,
            nqn,
            ana_group,
            secrets,
            json,
        }) => {
            let (pool, vol) = split(&volume)?;
            let (dhchap_secret, dhchap_ctrl_secret) = secrets.read()?;
            let c = svc.add_nvme(NvmeExportRequest {
                dhchap_secret,
                dhchap_ctrl_secret,
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
                let mut at = vec![millrace_service::nbd_socket(home).display().to_string()];
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
