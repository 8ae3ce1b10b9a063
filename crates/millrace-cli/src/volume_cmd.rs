//! `millrace volume`: named, stripe-aligned ranges of a pool, through the service layer (the
//! server's API when one runs, else the pools opened here).

use anyhow::{anyhow, Result};
use clap::Subcommand;
use millrace_service::model::{CreateVolume, GrowVolume};
use millrace_volume::VolumeInfo;

use crate::format::{human, parse_bytes, table};
use crate::service::Service;

#[derive(Subcommand)]
pub enum VolumeCmd {
    /// Create a thick volume; its size is rounded up to whole full stripes.
    #[command(after_help = "Example:\n  millrace volume create tank/scratch --size 100G")]
    Create {
        /// POOL/VOLUME
        name: String,
        #[arg(long, value_parser = parse_bytes)]
        size: u64,
        /// Create even where the pool's data area holds something that is not a volume table.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
    /// List volumes (of one pool, or of every pool).
    List {
        pool: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Show one volume.
    Show {
        /// POOL/VOLUME
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Grow a volume in place (refused where the space after it is taken).
    Grow {
        /// POOL/VOLUME
        name: String,
        #[arg(long, value_parser = parse_bytes)]
        size: u64,
        #[arg(long)]
        json: bool,
    },
    /// Delete a volume (refused while it is exported or shared).
    Delete {
        /// POOL/VOLUME
        name: String,
    },
}

pub fn split(name: &str) -> Result<(&str, &str)> {
    name.split_once('/')
        .filter(|(p, v)| !p.is_empty() && !v.is_empty() && !v.contains('/'))
        .ok_or_else(|| anyhow!("'{name}' is not POOL/VOLUME; write it like tank/scratch"))
}

fn print(v: &[VolumeInfo], pool_of: &dyn Fn(&VolumeInfo) -> String, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(v)?);
        return Ok(());
    }
    if v.is_empty() {
        println!("no volumes (create one with `millrace volume create POOL/NAME --size 10G`)");
        return Ok(());
    }
    let mut t = table(&["volume", "size", "offset", "exports"]);
    for i in v {
        let mut ex: Vec<&str> = Vec::new();
        for k in i.props.keys() {
            match k.as_str() {
                "export.nvme" => ex.push("nvme-tcp"),
                "export.nbd" => ex.push("nbd"),
                k if k.starts_with("share") => ex.push("nfs share"),
                _ => {}
            }
        }
        ex.dedup();
        t.add_row(vec![
            format!("{}/{}", pool_of(i), i.name),
            human(i.size_bytes),
            human(i.offset_bytes),
            if ex.is_empty() {
                "-".into()
            } else {
                ex.join(", ")
            },
        ]);
    }
    println!("{t}");
    Ok(())
}

pub fn run(svc: &dyn Service, cmd: VolumeCmd) -> Result<()> {
    match cmd {
        VolumeCmd::Create {
            name,
            size,
            force,
            json,
        } => {
            let (pool, vol) = split(&name)?;
            let req = CreateVolume {
                name: vol.to_string(),
                size_bytes: size,
                force,
                props: Default::default(),
            };
            let v = svc.create_volume(pool, req)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "created volume {pool}/{} of {} at offset {}",
                    v.name,
                    human(v.size_bytes),
                    human(v.offset_bytes)
                );
            }
            Ok(())
        }
        VolumeCmd::List { pool, json } => list(svc, pool, json),
        VolumeCmd::Show { name, json } => {
            let (pool, vol) = split(&name)?;
            let v = svc.volume(pool, vol)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            print(std::slice::from_ref(&v), &|_| pool.to_string(), false)?;
            for (k, val) in &v.props {
                println!("{k}: {val}");
            }
            Ok(())
        }
        VolumeCmd::Grow { name, size, json } => {
            let (pool, vol) = split(&name)?;
            let v = svc.grow_volume(pool, vol, GrowVolume { size_bytes: size })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("volume {pool}/{vol} is now {}", human(v.size_bytes));
            }
            Ok(())
        }
        VolumeCmd::Delete { name } => {
            let (pool, vol) = split(&name)?;
            svc.delete_volume(pool, vol)?;
            println!("deleted volume {pool}/{vol}");
            Ok(())
        }
    }
}

/// A volume as `volume list --json` prints it: the volume's fields and its pool's name.
#[derive(serde::Serialize)]
struct Listed<'a> {
    pool: &'a str,
    #[serde(flatten)]
    volume: &'a VolumeInfo,
}

fn list(svc: &dyn Service, pool: Option<String>, json: bool) -> Result<()> {
    let pools: Vec<String> = match pool {
        Some(p) => vec![p],
        None => svc
            .pools()?
            .pools
            .into_iter()
            .map(|p| p.info.name)
            .collect(),
    };
    let mut all: Vec<(String, VolumeInfo)> = Vec::new();
    for p in pools {
        let vs = svc.volumes(&p)?.volumes;
        all.extend(vs.into_iter().map(|v| (p.clone(), v)));
    }
    if json {
        // Through a Value, whose keys are sorted, as this command has always printed them.
        let v: Vec<serde_json::Value> = (all.iter())
            .map(|(pool, volume)| serde_json::to_value(Listed { pool, volume }))
            .collect::<Result<_, _>>()?;
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let infos: Vec<VolumeInfo> = all.iter().map(|(_, v)| v.clone()).collect();
    let pool_of = |i: &VolumeInfo| {
        all.iter()
            .find(|(_, v)| v.uuid == i.uuid)
            .map(|(p, _)| p.clone())
            .unwrap_or_default()
    };
    print(&infos, &pool_of, false)
}
