//! `millrace pool`: create, inspect, import and destroy pools, their members and their
//! rebuilds and scrubs, through the service layer (the server's API when one runs, else the
//! pools opened here).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use millrace_array::engine::ScrubReport;
use millrace_array::{Level, PoolInfo};
use millrace_service::model::{
    CreatePool, ImportRequest, PathRequest, PoolView, RebuildRequest, ReplaceRequest, ScrubRequest,
};

use crate::format::{human, parse_bytes, table};
use crate::service::{follow_job, Scope, Service};

#[derive(Subcommand)]
pub enum PoolCmd {
    /// Create a pool from drives (block devices or files).
    #[command(
        after_help = "Example:\n  millrace pool create tank --level raid6 --strip 64k --create 2G ./drives/d{0..7}.img"
    )]
    Create(CreateArgs),
    /// Show a pool: size, level, geometry, state and each member.
    Show {
        name: String,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// List known pools.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Find and assemble the pools on these drives (after a restart or a move).
    Import {
        #[arg(required = true)]
        drives: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
        /// Assemble even a pool that crashed and lost a drive since (rows being written at the
        /// crash may come back damaged in the missing drive's strips).
        #[arg(long)]
        force: bool,
    },
    /// Take a member out of service, as a drive failure would (refused if the pool would go offline).
    Fail { name: String, drive: PathBuf },
    /// Manage hot spares.
    #[command(subcommand)]
    Spare(SpareCmd),
    /// Put a new drive in place of a member and rebuild onto it.
    Replace {
        name: String,
        old: PathBuf,
        new: PathBuf,
        /// Overwrite a new drive that holds other data.
        #[arg(long)]
        force: bool,
        /// Cap the rebuild's write rate, e.g. 200M (bytes per second).
        #[arg(long, value_parser = parse_bytes)]
        rate: Option<u64>,
    },
    /// Run (or resume) the rebuild of members being rebuilt, with progress.
    Rebuild {
        name: String,
        /// Cap the rebuild's write rate, e.g. 200M (bytes per second).
        #[arg(long, value_parser = parse_bytes)]
        rate: Option<u64>,
    },
    /// Verify every stripe's redundancy; report, and with --repair fix.
    Scrub {
        name: String,
        #[arg(long)]
        repair: bool,
        #[arg(long)]
        json: bool,
    },
    /// Erase a pool's superblocks; its data is gone for good.
    Destroy {
        name: String,
        /// Confirm that the pool's data may be lost.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Args)]
pub struct CreateArgs {
    /// The pool's name.
    name: String,
    /// raid0, raid1, raid10, raid5, raid6, raid50 or raid60.
    #[arg(long)]
    level: Level,
    /// Bytes per drive per stripe: a power of two from 4k to 1M.
    #[arg(long, default_value = "64k", value_parser = parse_bytes)]
    strip: u64,
    /// Drives per group for raid10 (mirror copies, default 2), raid50 and raid60 (parity group).
    #[arg(long)]
    group: Option<usize>,
    /// Create missing drive files of this size (sparse), e.g. 2G.
    #[arg(long, value_parser = parse_bytes)]
    create: Option<u64>,
    /// Overwrite drives that hold other data or belong to another pool.
    #[arg(long)]
    force: bool,
    /// Metadata area at each drive's start (default: 1/64 of the drive, 1M to 64M).
    #[arg(long, value_parser = parse_bytes)]
    data_offset: Option<u64>,
    #[arg(long)]
    json: bool,
    /// The drives, in layout order.
    #[arg(required = true)]
    drives: Vec<PathBuf>,
}

#[derive(Subcommand)]
pub enum SpareCmd {
    /// Add a hot spare: rebuild onto it starts when a member fails.
    Add {
        name: String,
        drive: PathBuf,
        #[arg(long)]
        force: bool,
    },
}

/// The pool commands, written once against the service layer: a running server's API, or the
/// pools opened here. Which pools a session must open (when no server runs) is `scope`.
pub fn scope(cmd: &PoolCmd) -> Scope {
    match cmd {
        PoolCmd::List { .. } => Scope::All,
        PoolCmd::Import { .. } => Scope::None,
        PoolCmd::Create(CreateArgs { name, .. })
        | PoolCmd::Show { name, .. }
        | PoolCmd::Fail { name, .. }
        | PoolCmd::Spare(SpareCmd::Add { name, .. })
        | PoolCmd::Replace { name, .. }
        | PoolCmd::Rebuild { name, .. }
        | PoolCmd::Scrub { name, .. }
        | PoolCmd::Destroy { name, .. } => Scope::Pool(name.clone()),
    }
}

pub fn run(svc: &dyn Service, cmd: PoolCmd) -> Result<()> {
    match cmd {
        PoolCmd::Create(a) => create(svc, a),
        PoolCmd::Show { name, json } => print_pool(&svc.pool(&name)?, json),
        PoolCmd::List { json } => list(svc, json),
        PoolCmd::Import {
            drives,
            json,
            force,
        } => {
            let drives = drives.iter().map(|d| abs(d)).collect();
            let v = svc.import(ImportRequest { drives, force })?;
            for n in &v.notes {
                eprintln!("note: {n}");
            }
            let infos: Vec<PoolInfo> = v.pools.into_iter().map(|p| p.info).collect();
            print_imported(&infos, json)
        }
        PoolCmd::Fail { name, drive } => {
            let req = PathRequest {
                path: abs(&drive),
                force: false,
            };
            println!("{}", svc.fail(&name, req)?.message);
            follow_rebuild(svc, &name)
        }
        PoolCmd::Spare(SpareCmd::Add { name, drive, force }) => {
            let req = PathRequest {
                path: abs(&drive),
                force,
            };
            println!("{}", svc.add_spare(&name, req)?.message);
            follow_rebuild(svc, &name)
        }
        PoolCmd::Replace {
            name,
            old,
            new,
            force,
            rate,
        } => {
            let req = ReplaceRequest {
                old: abs(&old),
                new: abs(&new),
                force,
                rate_bytes_per_sec: rate,
            };
            println!("{}", svc.replace(&name, req)?.message);
            follow_rebuild(svc, &name)
        }
        PoolCmd::Rebuild { name, rate } => rebuild(svc, &name, rate),
        PoolCmd::Scrub { name, repair, json } => scrub(svc, &name, repair, json),
        PoolCmd::Destroy { name, yes } => {
            if !yes {
                bail!(
                    "destroying pool '{name}' erases it for good; run again with --yes to confirm"
                );
            }
            svc.destroy_pool(&name)?;
            println!("pool '{name}' destroyed");
            Ok(())
        }
    }
}

fn create(svc: &dyn Service, a: CreateArgs) -> Result<()> {
    let CreateArgs {
        name,
        level,
        strip,
        group,
        create,
        force,
        data_offset,
        json,
        drives,
    } = a;
    let req = CreatePool {
        name,
        level: level.to_string(),
        strip_bytes: Some(strip),
        group,
        drives: drives.iter().map(|d| abs(d)).collect(),
        create_size_bytes: create,
        data_offset_bytes: data_offset,
        force,
    };
    let v = svc.create_pool(req)?;
    // What creating found worth saying (drives of unequal size); `pool show` of a pool opened
    // here would repeat what assembling it found each time, which a server says once in its log.
    for n in &v.notes {
        eprintln!("note: {n}");
    }
    print_pool(&v, json)
}

fn list(svc: &dyn Service, json: bool) -> Result<()> {
    let mut rows: Vec<ListRow> = (svc.pools()?.pools.into_iter())
        .map(|p| Ok(p.info))
        .collect();
    rows.extend(svc.status()?.unavailable_pools.into_iter().map(Err));
    rows.sort_by(|a, b| row_name(a).cmp(row_name(b)));
    print_list(&rows, json)
}

fn row_name(r: &ListRow) -> &str {
    match r {
        Ok(i) => &i.name,
        Err((n, _)) => n,
    }
}

fn rebuild(svc: &dyn Service, name: &str, rate: Option<u64>) -> Result<()> {
    let req = RebuildRequest {
        rate_bytes_per_sec: rate,
    };
    match svc.rebuild(name, req)?.job {
        Some(id) => finish_rebuild(svc, name, id),
        None => {
            let state = svc.pool(name)?.info.state;
            println!("nothing to rebuild in pool '{name}' ({state})");
            Ok(())
        }
    }
}

/// Follows a rebuild job to its end and says how fast it went.
fn finish_rebuild(svc: &dyn Service, name: &str, id: u64) -> Result<()> {
    let t0 = std::time::Instant::now();
    let j = follow_job(svc, id, "rebuilding")?;
    let info = svc.pool(name)?.info;
    if j.message == "nothing to rebuild" {
        println!("nothing to rebuild in pool '{name}' ({})", info.state);
        return Ok(());
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "rebuild finished in {secs:.1} s ({}/s per rebuilt drive); pool '{name}' is {}",
        human((info.member_data_bytes as f64 / secs.max(1e-3)) as u64),
        info.state
    );
    Ok(())
}

fn scrub(svc: &dyn Service, name: &str, repair: bool, json: bool) -> Result<()> {
    let id = svc.scrub(name, ScrubRequest { repair })?.job;
    let what = if repair {
        "scrubbing and repairing"
    } else {
        "scrubbing"
    };
    let j = follow_job(svc, id, what)?;
    let rep: ScrubReport = serde_json::from_value(j.result.unwrap_or_default())?;
    print_scrub(name, &rep, repair, json)
}

fn abs(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// After a failure, a new spare or a replacement a rebuild may have started: follow it to its
/// end. A server goes on rebuilding without us, so where no one watches (output not a
/// terminal) the command says so and returns; pools opened here must be rebuilt before it ends.
fn follow_rebuild(svc: &dyn Service, name: &str) -> Result<()> {
    let running = (svc.jobs()?.jobs.into_iter())
        .find(|j| j.pool == name && j.kind == "rebuild" && j.state == "running");
    let Some(id) = running.map(|j| j.id) else {
        return Ok(());
    };
    if svc.live() && !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        println!("the server is rebuilding pool '{name}' (job {id}); `millrace pool show {name}` shows its progress");
        return Ok(());
    }
    finish_rebuild(svc, name, id)
}

fn print_imported(infos: &[PoolInfo], json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(infos)?);
    } else {
        for i in infos {
            println!(
                "imported pool '{}' ({}, {}, {})",
                i.name,
                i.level,
                human(i.size_bytes),
                i.state
            );
        }
    }
    Ok(())
}

fn print_scrub(name: &str, rep: &ScrubReport, repair: bool, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(rep)?);
    } else {
        let mut t = table(&[
            "rows checked",
            "mismatches",
            "located (raid6)",
            "repaired",
            "skipped (degraded)",
        ]);
        t.add_row(vec![
            rep.rows_checked.to_string(),
            rep.mismatches.to_string(),
            rep.located.to_string(),
            rep.repaired.to_string(),
            rep.skipped_degraded.to_string(),
        ]);
        println!("{t}");
        if rep.mismatches > 0 && !repair {
            println!("run `millrace pool scrub {name} --repair` to fix them");
        }
    }
    Ok(())
}

/// What `pool show --json` prints: the pool's info, and how much of it holds data.
#[derive(serde::Serialize)]
struct Shown<'a> {
    #[serde(flatten)]
    info: &'a PoolInfo,
    allocated_bytes: u64,
    member_allocated_bytes: Option<u64>,
}

fn print_pool(v: &PoolView, json: bool) -> Result<()> {
    let i = &v.info;
    if json {
        let shown = Shown {
            info: i,
            allocated_bytes: v.allocated_bytes,
            member_allocated_bytes: v.member_allocated_bytes,
        };
        println!("{}", serde_json::to_string_pretty(&shown)?);
        return Ok(());
    }
    println!("pool {}  ({})", i.name, i.uuid);
    let mut t = table(&[
        "size",
        "level",
        "drives",
        "group size",
        "strip",
        "full stripe",
        "state",
    ]);
    t.add_row(vec![
        human(i.size_bytes),
        i.level.to_string(),
        i.members.len().to_string(),
        i.group_size.to_string(),
        human(i.strip_bytes),
        human(i.full_stripe_bytes),
        match &i.rebuild {
            Some(r) => format!("{} {:.0}%", i.state, r.percent),
            None => i.state.clone(),
        },
    ]);
    println!("{t}");
    let mut m = table(&["#", "group", "drive", "state", "data offset"]);
    for mem in &i.members {
        m.add_row(vec![
            mem.index.to_string(),
            mem.group.to_string(),
            mem.path.clone().unwrap_or_else(|| "(missing)".into()),
            format!("{:?}", mem.state).to_lowercase(),
            human(mem.data_offset_bytes),
        ]);
    }
    println!("{m}");
    for s in &i.spares {
        println!("hot spare: {s}");
    }
    print_allocated(v);
    Ok(())
}

/// How much of the pool holds data: what trimming and deleting give back.
fn print_allocated(v: &PoolView) {
    let in_volumes: u64 = v.volumes.iter().map(|v| v.size_bytes).sum();
    print!(
        "allocated: {} of the volumes' {} hold data",
        human(v.allocated_bytes),
        human(in_volumes)
    );
    match v.member_allocated_bytes {
        Some(b) => println!("; the drive files take {}", human(b)),
        None => println!(),
    }
}

/// A pool the cache knows that could not be assembled, as `pool list --json` shows it.
#[derive(serde::Serialize)]
struct Unavailable<'a> {
    name: &'a str,
    state: &'a str,
    error: &'a str,
}

type ListRow = std::result::Result<PoolInfo, (String, String)>;

fn print_list(infos: &[ListRow], json: bool) -> Result<()> {
    if json {
        let v: Vec<serde_json::Value> = (infos.iter())
            .map(|r| match r {
                Ok(i) => serde_json::to_value(i),
                Err((name, error)) => serde_json::to_value(Unavailable {
                    name,
                    state: "unavailable",
                    error,
                }),
            })
            .collect::<Result<_, _>>()?;
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if infos.is_empty() {
        println!("no pools known here (create one with `millrace pool create`)");
        return Ok(());
    }
    let mut t = table(&["name", "level", "drives", "size", "state"]);
    for r in infos {
        match r {
            Ok(i) => t.add_row(vec![
                i.name.clone(),
                i.level.to_string(),
                i.members.len().to_string(),
                human(i.size_bytes),
                i.state.clone(),
            ]),
            Err((n, e)) => t.add_row(vec![
                n.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                format!("unavailable: {e}"),
            ]),
        };
    }
    println!("{t}");
    Ok(())
}

pub fn status(svc: &dyn Service, json: bool) -> Result<()> {
    list(svc, json).context("cannot read the pools' status")?;
    if !json {
        if svc.live() {
            let st = svc.status()?;
            crate::rdma_fmt::print(&st.rdma);
            crate::rdma_fmt::print_nvme(&st);
        } else {
            crate::rdma_fmt::print_local();
        }
    }
    Ok(())
}
