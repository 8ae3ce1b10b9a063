use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use millrace_array::{Cache, CreateOptions, Level, Pool, PoolInfo};

use millrace_server::model::{
    CreatePool, ImportRequest, ImportResponse, JobStarted, Message, PathRequest, PoolView,
    RebuildRequest, RebuildResponse, ReplaceRequest, ReplaceResponse, ScrubRequest,
};

use crate::client::{seg, Api};
use crate::format::{human, parse_bytes, progress_bar, table};

#[derive(Subcommand)]
pub enum PoolCmd {
    /// Create a pool from drives (block devices or files).
    #[command(
        after_help = "Example:\n  millrace pool create tank --level raid6 --strip 64k --create 2G ./drives/d{0..7}.img"
    )]
    Create {
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
    },
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

fn rebuild(pool: &Pool, rate: Option<u64>) -> Result<()> {
    let bar = progress_bar("rebuilding");
    let t0 = std::time::Instant::now();
    let did = pool.rebuild(rate, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    if did? {
        let bytes = pool.info().member_data_bytes;
        println!(
            "rebuild finished in {:.1} s ({}/s per rebuilt drive); pool '{}' is {}",
            t0.elapsed().as_secs_f64(),
            human((bytes as f64 / t0.elapsed().as_secs_f64().max(1e-3)) as u64),
            pool.name(),
            pool.state()
        );
    } else {
        println!(
            "nothing to rebuild in pool '{}' ({})",
            pool.name(),
            pool.state()
        );
    }
    Ok(())
}

/// A served pool is always recorded in use (not clean) while the server runs: no note then.
static SERVED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The pool commands through a running server's API.
fn run_api(api: &Api, cmd: PoolCmd) -> Result<()> {
    SERVED.store(true, std::sync::atomic::Ordering::Relaxed);
    let p = |name: &str| format!("/api/v1/pools/{}", seg(name));
    match cmd {
        PoolCmd::Create {
            name,
            level,
            strip,
            group,
            create,
            force,
            data_offset,
            json,
            drives,
        } => {
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
            let v: PoolView = api.post_as("/api/v1/pools", &req)?;
            print_pool(&v.info, json)
        }
        PoolCmd::Show { name, json } => print_pool(&api.get_as(&p(&name))?, json),
        PoolCmd::List { json } => api_list(api, json),
        PoolCmd::Import {
            drives,
            json,
            force,
        } => {
            let drives: Vec<PathBuf> = drives
                .iter()
                .map(|d| std::path::absolute(d).unwrap_or(d.clone()))
                .collect();
            let v: ImportResponse =
                api.post_as("/api/v1/pools/import", &ImportRequest { drives, force })?;
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
            let v: Message = api.post_as(&format!("{}/fail", p(&name)), &req)?;
            println!("{}", v.message);
            follow_rebuild(api, &name)
        }
        PoolCmd::Spare(SpareCmd::Add { name, drive, force }) => {
            let req = PathRequest {
                path: abs(&drive),
                force,
            };
            let v: Message = api.post_as(&format!("{}/spares", p(&name)), &req)?;
            println!("{}", v.message);
            follow_rebuild(api, &name)
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
            let v: ReplaceResponse = api.post_as(&format!("{}/replace", p(&name)), &req)?;
            println!("{}", v.message);
            follow_rebuild(api, &name)
        }
        PoolCmd::Rebuild { name, rate } => api_rebuild(api, &name, rate),
        PoolCmd::Scrub { name, repair, json } => api_scrub(api, &name, repair, json),
        PoolCmd::Destroy { name, yes } => {
            if !yes {
                bail!(
                    "destroying pool '{name}' erases it for good; run again with --yes to confirm"
                );
            }
            api.delete(&p(&name))?;
            println!("pool '{name}' destroyed");
            Ok(())
        }
    }
}

fn api_list(api: &Api, json: bool) -> Result<()> {
    let v = api.get("/api/v1/pools")?;
    let infos: Vec<PoolInfo> = serde_json::from_value(v["pools"].clone())?;
    let st = api.get("/api/v1/status")?;
    let mut rows: Vec<std::result::Result<PoolInfo, (String, String)>> =
        infos.into_iter().map(Ok).collect();
    if let Some(u) = st["unavailable_pools"].as_object() {
        rows.extend(
            u.iter()
                .map(|(n, e)| Err((n.clone(), e.as_str().unwrap_or("").to_string()))),
        );
    }
    print_list(&rows, json, "the server")
}

fn api_rebuild(api: &Api, name: &str, rate: Option<u64>) -> Result<()> {
    let p = |name: &str| format!("/api/v1/pools/{}", seg(name));
    let req = RebuildRequest {
        rate_bytes_per_sec: rate,
    };
    let v: RebuildResponse = api.post_as(&format!("{}/rebuild", p(name)), &req)?;
    match v.job {
        Some(id) => {
            let j = api.follow_job(id, "rebuilding")?;
            let info: PoolInfo = api.get_as(&p(name))?;
            println!(
                "{}; pool '{name}' is {}",
                j["message"].as_str().unwrap_or("rebuilt"),
                info.state
            );
        }
        None => println!("nothing to rebuild in pool '{name}'"),
    }
    Ok(())
}

fn api_scrub(api: &Api, name: &str, repair: bool, json: bool) -> Result<()> {
    let p = |name: &str| format!("/api/v1/pools/{}", seg(name));
    let v: JobStarted = api.post_as(&format!("{}/scrub", p(name)), &ScrubRequest { repair })?;
    let id = v.job;
    let j = api.follow_job(
        id,
        if repair {
            "scrubbing and repairing"
        } else {
            "scrubbing"
        },
    )?;
    let rep: millrace_array::engine::ScrubReport = serde_json::from_value(j["result"].clone())?;
    print_scrub(name, &rep, repair, json)
}

fn offline_fail(home: &Path, name: &str, drive: &Path) -> Result<()> {
    let pool = Cache::load(home)?.open(name)?;
    let msg = pool.fail(drive)?;
    println!("{msg}");
    let cache_paths_changed = pool.info().rebuild.is_some();
    if cache_paths_changed {
        let mut cache = Cache::load(home)?;
        cache.remember(&pool);
        cache.save(home)?;
        rebuild(&pool, None)?;
    }
    pool.close()?;
    Ok(())
}

fn offline_spare(home: &Path, name: &str, drive: &Path, force: bool) -> Result<()> {
    let pool = Cache::load(home)?.open(name)?;
    println!("{}", pool.add_spare(drive, force)?);
    let mut cache = Cache::load(home)?;
    cache.remember(&pool);
    cache.save(home)?;
    if pool.info().rebuild.is_some() {
        rebuild(&pool, None)?;
    }
    pool.close()?;
    Ok(())
}

fn offline_scrub(home: &Path, name: &str, repair: bool, json: bool) -> Result<()> {
    let pool = Cache::load(home)?.open(name)?;
    let bar = progress_bar(if repair {
        "scrubbing and repairing"
    } else {
        "scrubbing"
    });
    let rep = pool.scrub(repair, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    pool.close()?;
    print_scrub(name, &rep, repair, json)?;
    Ok(())
}

fn offline_create(home: &Path, opts: CreateOptions, drives: &[PathBuf], json: bool) -> Result<()> {
    // Held to the end: a server or another CLI creating the same name waits, then is refused.
    let _lock = Cache::lock(home)?;
    let mut cache = Cache::load(home)?;
    if cache.pools.contains_key(&opts.name) {
        if cache.open(&opts.name).is_ok() {
            bail!(
            "a pool named '{name}' already exists; pick another name, or destroy it first with `millrace pool destroy {name} --yes`",
            name = opts.name
        );
        }
        cache.pools.remove(&opts.name);
    }
    let pool = Pool::create(&opts, drives)?;
    for n in &pool.notes {
        eprintln!("note: {n}");
    }
    if !pool.superblock().clean {
        let bar = progress_bar("initialising parity");
        pool.resync(|done, total| {
            bar.set_length(total);
            bar.set_position(done);
        })?;
        bar.finish_and_clear();
    }
    pool.close()?;
    cache.remember(&pool);
    if let Err(e) = cache.save(home) {
        // Superblocks nobody records would be found by a later import as a pool: erase them.
        let info = pool.info();
        let _ = pool.destroy();
        return Err(anyhow::anyhow!(
            "{e}; the pool '{}' was not kept",
            info.name
        ));
    }
    print_pool(&pool.info(), json)
}

fn offline_import(home: &Path, drives: &[PathBuf], json: bool, force: bool) -> Result<()> {
    let (pools, notes) = Pool::import_with(drives, force)?;
    for n in &notes {
        eprintln!("note: {n}");
    }
    if pools.is_empty() {
        bail!(
            "no Millrace pool was found on the {} drives given",
            drives.len()
        );
    }
    let mut cache = Cache::load(home)?;
    let mut infos = Vec::new();
    for p in &pools {
        for n in &p.notes {
            eprintln!("note: {n}");
        }
        cache.remember(p);
        infos.push(p.info());
    }
    cache.save(home)?;
    print_imported(&infos, json)
}

fn abs(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// After a failure or a new spare the server may have started a rebuild: follow it to its end.
fn follow_rebuild(api: &Api, name: &str) -> Result<()> {
    let jobs = api.get("/api/v1/jobs")?;
    let running = jobs["jobs"].as_array().into_iter().flatten().find(|j| {
        j["pool"].as_str() == Some(name)
            && j["kind"].as_str() == Some("rebuild")
            && j["state"].as_str() == Some("running")
    });
    if let Some(id) = running.and_then(|j| j["id"].as_u64()) {
        if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            let j = api.follow_job(id, "rebuilding")?;
            println!("{}", j["message"].as_str().unwrap_or("rebuilt"));
        } else {
            println!("the server is rebuilding pool '{name}' (job {id}); `millrace pool show {name}` shows its progress");
        }
    }
    Ok(())
}

pub fn run(home: &Path, api: Option<&Api>, cmd: PoolCmd) -> Result<()> {
    if let Some(a) = api {
        return run_api(a, cmd);
    }
    match cmd {
        PoolCmd::Fail { name, drive } => offline_fail(home, &name, &drive),
        PoolCmd::Spare(SpareCmd::Add { name, drive, force }) => {
            offline_spare(home, &name, &drive, force)
        }
        PoolCmd::Replace {
            name,
            old,
            new,
            force,
            rate,
        } => {
            let pool = Cache::load(home)?.open(&name)?;
            println!("{}", pool.replace(&old, &new, force)?);
            let mut cache = Cache::load(home)?;
            cache.remember(&pool);
            cache.save(home)?;
            rebuild(&pool, rate)?;
            pool.close()?;
            Ok(())
        }
        PoolCmd::Rebuild { name, rate } => {
            let pool = Cache::load(home)?.open(&name)?;
            rebuild(&pool, rate)?;
            pool.close()?;
            Ok(())
        }
        PoolCmd::Scrub { name, repair, json } => offline_scrub(home, &name, repair, json),
        PoolCmd::Create {
            name,
            level,
            strip,
            group,
            create,
            force,
            data_offset,
            json,
            drives,
        } => {
            let opts = CreateOptions {
                name,
                level,
                strip,
                group,
                data_offset,
                create_size: create,
                force,
            };
            offline_create(home, opts, &drives, json)
        }
        PoolCmd::Show { name, json } => {
            let pool = Cache::load(home)?.open(&name)?;
            for n in &pool.notes {
                eprintln!("note: {n}");
            }
            print_pool(&pool.info(), json)
        }
        PoolCmd::List { json } => list(home, json),
        PoolCmd::Import {
            drives,
            json,
            force,
        } => offline_import(home, &drives, json, force),
        PoolCmd::Destroy { name, yes } => {
            if !yes {
                bail!(
                    "destroying pool '{name}' erases it for good; run again with --yes to confirm"
                );
            }
            let mut cache = Cache::load(home)?;
            let pool = cache.open(&name)?;
            pool.destroy()?;
            cache.pools.remove(&name);
            cache.save(home)?;
            println!("pool '{name}' destroyed");
            Ok(())
        }
    }
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

fn print_scrub(
    name: &str,
    rep: &millrace_array::engine::ScrubReport,
    repair: bool,
    json: bool,
) -> Result<()> {
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

fn print_pool(i: &PoolInfo, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(i)?);
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
            None => format!(
                "{}{}",
                i.state,
                if i.clean || SERVED.load(std::sync::atomic::Ordering::Relaxed) {
                    ""
                } else {
                    " (in use or not shut down cleanly)"
                }
            ),
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
    Ok(())
}

fn list(home: &Path, json: bool) -> Result<()> {
    let cache = Cache::load(home)?;
    let mut infos = Vec::new();
    for name in cache.pools.keys() {
        match cache.open(name) {
            Ok(p) => infos.push(Ok(p.info())),
            Err(e) => infos.push(Err((name.clone(), e.to_string()))),
        }
    }
    print_list(&infos, json, &home.display().to_string())
}

/// A pool the cache knows that could not be assembled, as `pool list --json` shows it.
#[derive(serde::Serialize)]
struct Unavailable<'a> {
    name: &'a str,
    state: &'a str,
    error: &'a str,
}

type ListRow = std::result::Result<PoolInfo, (String, String)>;

fn print_list(infos: &[ListRow], json: bool, where_: &str) -> Result<()> {
    if json {
        let v: Vec<serde_json::Value> = infos
            .iter()
            .map(|r| match r {
                Ok(i) => serde_json::to_value(i).unwrap(),
                Err((name, error)) => serde_json::to_value(Unavailable {
                    name,
                    state: "unavailable",
                    error,
                })
                .unwrap(),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if infos.is_empty() {
        println!("no pools known to {where_} (create one with `millrace pool create`)");
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

pub fn status(home: &Path, api: Option<&Api>, json: bool) -> Result<()> {
    match api {
        Some(a) => {
            run_api(a, PoolCmd::List { json })?;
            if !json {
                let st: millrace_server::model::Status = a.get_as("/api/v1/status")?;
                crate::rdma_fmt::print(&st.rdma);
                crate::rdma_fmt::print_nvme(&st);
            }
            Ok(())
        }
        None => {
            list(home, json).context("cannot read the pools' status")?;
            if !json {
                crate::rdma_fmt::print_local();
            }
            Ok(())
        }
    }
}
