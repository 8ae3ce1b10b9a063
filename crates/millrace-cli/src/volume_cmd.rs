//! `millrace volume`: named, stripe-aligned ranges of a pool. Through the server's API when one
//! runs, else on the pool directly.

use std::path::Path;

use anyhow::{anyhow, Result};
use clap::Subcommand;
use millrace_array::Cache;
use millrace_volume::{VolumeInfo, Volumes};
use serde_json::json;

use crate::client::{seg, Api};
use crate::format::{human, parse_bytes, table};

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

fn offline<T>(home: &Path, pool: &str, f: impl FnOnce(&Volumes) -> Result<T>) -> Result<T> {
    let p = Cache::load(home)?.open(pool)?;
    let vols = Volumes::open(p.array().clone())?;
    let r = f(&vols);
    p.close()?;
    r
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

pub fn run(home: &Path, api: Option<&Api>, cmd: VolumeCmd) -> Result<()> {
    match cmd {
        VolumeCmd::Create {
            name,
            size,
            force,
            json,
        } => {
            let (pool, vol) = split(&name)?;
            let v: VolumeInfo = match api {
                Some(a) => serde_json::from_value(a.post(
                    &format!("/api/v1/pools/{}/volumes", seg(pool)),
                    &json!({"name": vol, "size_bytes": size, "force": force}),
                )?)?,
                None => offline(home, pool, |vs| {
                    if force && vs.holds_foreign_data() {
                        vs.claim()?;
                    }
                    Ok(vs.create(vol, size)?)
                })?,
            };
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
        VolumeCmd::List { pool, json } => {
            let mut all: Vec<(String, VolumeInfo)> = Vec::new();
            let pools: Vec<String> = match (&pool, api) {
                (Some(p), _) => vec![p.clone()],
                (None, Some(a)) => a.get("/api/v1/pools")?["pools"]
                    .as_array()
                    .map(|ps| {
                        ps.iter()
                            .filter_map(|p| p["name"].as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default(),
                (None, None) => Cache::load(home)?.pools.keys().cloned().collect(),
            };
            for p in pools {
                let vs: Vec<VolumeInfo> = match api {
                    Some(a) => serde_json::from_value(
                        a.get(&format!("/api/v1/pools/{}/volumes", seg(&p)))?["volumes"].clone(),
                    )?,
                    None => offline(home, &p, |vs| Ok(vs.list()))?,
                };
                all.extend(vs.into_iter().map(|v| (p.clone(), v)));
            }
            let infos: Vec<VolumeInfo> = all.iter().map(|(_, v)| v.clone()).collect();
            if json {
                let v: Vec<_> = all
                    .iter()
                    .map(|(p, v)| {
                        let mut j = serde_json::to_value(v).unwrap();
                        j["pool"] = json!(p);
                        j
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let pool_of = |i: &VolumeInfo| {
                all.iter()
                    .find(|(_, v)| v.uuid == i.uuid)
                    .map(|(p, _)| p.clone())
                    .unwrap_or_default()
            };
            print(&infos, &pool_of, false)
        }
        VolumeCmd::Show { name, json } => {
            let (pool, vol) = split(&name)?;
            let v: VolumeInfo = match api {
                Some(a) => serde_json::from_value(a.get(&format!(
                    "/api/v1/pools/{}/volumes/{}",
                    seg(pool),
                    seg(vol)
                ))?)?,
                None => offline(home, pool, |vs| {
                    vs.get(vol).ok_or_else(|| anyhow!("pool {pool} has no volume named {vol}; `millrace volume list {pool}` shows the ones it has"))
                })?,
            };
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
            let v: VolumeInfo = match api {
                Some(a) => serde_json::from_value(a.patch(
                    &format!("/api/v1/pools/{}/volumes/{}", seg(pool), seg(vol)),
                    &json!({"size_bytes": size}),
                )?)?,
                None => offline(home, pool, |vs| Ok(vs.grow(vol, size)?))?,
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("volume {pool}/{vol} is now {}", human(v.size_bytes));
            }
            Ok(())
        }
        VolumeCmd::Delete { name } => {
            let (pool, vol) = split(&name)?;
            match api {
                Some(a) => {
                    a.delete(&format!("/api/v1/pools/{}/volumes/{}", seg(pool), seg(vol)))?;
                }
                None => offline(home, pool, |vs| {
                    let v = vs
                        .get(vol)
                        .ok_or_else(|| anyhow!("pool {pool} has no volume named {vol}"))?;
                    if v.props
                        .keys()
                        .any(|k| k.starts_with("export.") || k.starts_with("share"))
                    {
                        anyhow::bail!("volume {pool}/{vol} is exported or shared; remove its exports first (`millrace export list`)");
                    }
                    Ok(vs.delete(vol)?)
                })?,
            }
            println!("deleted volume {pool}/{vol}");
            Ok(())
        }
    }
}
