//! Shares: a volume formatted with XFS and exported by the kernel's NFS server (v3 and v4.2).
//!
//! The stack, bottom up: the volume; an NBD export of it on a Unix socket of the share's own;
//! the kernel NBD client attached to that socket (/dev/nbdN); XFS on the device, aligned to the
//! pool's strips and full stripes; the mount; and `exportfs` entries, one per client. The
//! settings live in the volume's props under "share.nfs", so `millrace serve` rebuilds the stack
//! after a restart, and every step is undone, in reverse, when a later one fails or the share is
//! deleted. The kernel pieces (nbd, xfs, nfsd) are driven with their own tools rather than
//! syscalls: they are what an administrator knows and can inspect.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use millrace_volume::VolumeInfo;
use serde::{Deserialize, Serialize};

use crate::api::ApiError;
use crate::exports::NbdExportConfig;
use crate::state::{PoolEntry, State};

pub const SHARE_PROP: &str = "share.nfs";

/// Where shares are mounted unless a request names another place.
pub const SHARE_ROOT: &str = "/srv/millrace";

/// The NBD client's I/O timeout, in seconds. Generous: a request can wait behind a rebuild of a
/// degraded stripe, and on timeout the kernel drops the connection, failing every I/O after it.
const NBD_TIMEOUT_S: u64 = 300;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ShareConfig {
    /// NFS clients allowed (addresses, networks such as 10.0.0.0/24, or host names).
    pub clients: Vec<String>,
    /// Writes are acknowledged only once stable (NFS `sync`); `async` is faster and loses
    /// acknowledged writes if the server dies.
    #[serde(default = "yes")]
    pub sync: bool,
    /// Requests from root on a client are mapped to nobody.
    #[serde(default = "yes")]
    pub root_squash: bool,
    pub mountpoint: PathBuf,
    /// The Unix socket of the share's own NBD export, which the kernel NBD client uses.
    pub nbd_socket: PathBuf,
    /// The NBD device it was last attached to (informational: a restart may pick another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd_device: Option<String>,
}

fn yes() -> bool {
    true
}

/// A share as the API lists it.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ShareView {
    pub pool: String,
    pub volume: String,
    pub size_bytes: u64,
    #[serde(flatten)]
    pub config: ShareConfig,
    /// The XFS is mounted at the mountpoint.
    pub mounted: bool,
    /// The kernel NFS server exports the mountpoint.
    pub exported: bool,
    /// What clients mount: SERVER:PATH.
    pub nfs_path: String,
    /// The port nfsd takes NFS/RDMA mounts on (`-o proto=rdma,port=20049`); null where the
    /// host has no RDMA device or nfsd does not listen for RDMA.
    pub nfs_rdma_port: Option<u16>,
}

/// One lock for everything that changes shares: two creates must not pick the same free
/// /dev/nbdN, and a delete must not race the restore at startup.
static SHARES: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// A program from the PATH or the sbin folders (a service's PATH often lacks them).
fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(prog))
        .find(|f| f.is_file())
}

/// Runs a tool to its end; the error is a sentence with the command and what it said.
fn run(prog: &str, args: &[&str]) -> Result<String, String> {
    let exe = which(prog).ok_or_else(|| format!("{prog} is not installed"))?;
    tracing::info!("running {prog} {}", args.join(" "));
    let out = Command::new(&exe)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {prog}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let out_s = String::from_utf8_lossy(&out.stdout);
        let said = if err.trim().is_empty() {
            out_s.trim()
        } else {
            err.trim()
        };
        Err(format!(
            "`{prog} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            said
        ))
    }
}

/// Starts a daemon that forks into the background. Its output goes nowhere: a pipe held open
/// by the daemon would make us wait for it forever.
fn start_daemon(prog: &str, args: &[&str]) -> Result<(), String> {
    let exe = which(prog).ok_or_else(|| format!("{prog} is not installed"))?;
    tracing::info!("starting {prog} {}", args.join(" "));
    let st = Command::new(&exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run {prog}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{prog} did not start ({st})"))
    }
}

fn modprobe(m: &str) -> bool {
    Path::new(&format!("/sys/module/{m}")).exists() || run("modprobe", &[m]).is_ok()
}

/// What this host lacks to serve shares, as a list of short phrases; empty when nothing.
pub fn missing_prerequisites() -> Vec<String> {
    let mut miss = Vec::new();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        miss.push("root privileges (attaching block devices, mounting and exporting need them; run `millrace serve` as root)".to_string());
        return miss;
    }
    if !modprobe("nbd") || !Path::new("/sys/block/nbd0").exists() {
        miss.push(
            "the kernel's NBD client (`modprobe nbd` fails: the kernel lacks the nbd module)"
                .into(),
        );
    }
    if which("nbd-client").is_none() {
        miss.push("nbd-client (apt-get install nbd-client)".into());
    }
    if which("mkfs.xfs").is_none() {
        miss.push("mkfs.xfs (apt-get install xfsprogs)".into());
    }
    let has_xfs = |fs: &str| {
        fs.lines()
            .any(|l| l.split_whitespace().last() == Some("xfs"))
    };
    if !std::fs::read_to_string("/proc/filesystems").is_ok_and(|f| has_xfs(&f)) && !modprobe("xfs")
    {
        miss.push("XFS in the kernel (`modprobe xfs` fails)".into());
    }
    if !Path::new("/proc/fs/nfsd").exists() && !modprobe("nfsd") {
        miss.push("the kernel NFS server (`modprobe nfsd` fails: the kernel lacks nfsd)".into());
    }
    for (prog, pkg) in [
        ("exportfs", "nfs-kernel-server"),
        ("rpc.nfsd", "nfs-kernel-server"),
        ("rpc.mountd", "nfs-kernel-server"),
        ("rpcbind", "rpcbind"),
        ("rpcinfo", "rpcbind"),
    ] {
        if which(prog).is_none() {
            miss.push(format!("{prog} (apt-get install {pkg})"));
        }
    }
    miss
}

fn check_prerequisites() -> Result<(), ApiError> {
    let miss = missing_prerequisites();
    if miss.is_empty() {
        Ok(())
    } else {
        Err(ApiError::conflict(format!(
            "this host cannot serve NFS shares; it lacks {}",
            miss.join(", ")
        )))
    }
}

/// Clients as exportfs takes them: IPv4 addresses and networks, host names, wildcards.
fn check_client(c: &str) -> Result<(), ApiError> {
    let bad = || {
        ApiError::bad_request(format!(
            "'{c}' is not an NFS client this server can export to; write an IPv4 address (10.0.0.5), a network (10.0.0.0/24) or a host name"
        ))
    };
    if c.is_empty() || c.contains(':') {
        return Err(bad());
    }
    if let Some((net, len)) = c.split_once('/') {
        let ok =
            net.parse::<std::net::Ipv4Addr>().is_ok() && len.parse::<u8>().is_ok_and(|l| l <= 32);
        return if ok { Ok(()) } else { Err(bad()) };
    }
    if c.chars()
        .all(|ch| ch.is_ascii_alphanumeric() || "-.*?_".contains(ch))
    {
        Ok(())
    } else {
        Err(bad())
    }
}

/// A stable NFS file system id from the volume's uuid: clients keep their file handles across
/// restarts and re-attachments (a device number would change). Never 0: that is the v4 root.
fn fsid(v: &VolumeInfo) -> u32 {
    let b = v.uuid.as_bytes();
    (u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff).max(1)
}

fn is_mounted(mountpoint: &Path) -> bool {
    let want = mountpoint.to_string_lossy();
    std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
        m.lines().any(|l| {
            // /proc/mounts escapes spaces as \040; our mountpoints have none.
            l.split_whitespace().nth(1) == Some(&want)
        })
    })
}

fn is_exported(mountpoint: &Path) -> bool {
    let want = mountpoint.to_string_lossy();
    std::fs::read_to_string("/var/lib/nfs/etab").is_ok_and(|t| {
        t.lines()
            .any(|l| l.split_whitespace().next() == Some(&want))
    })
}

fn nbd_size(dev: &str) -> u64 {
    let name = dev.trim_start_matches("/dev/");
    std::fs::read_to_string(format!("/sys/block/{name}/size"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// NBD devices nobody uses: the kernel reports size 0 for an unconnected one.
fn free_nbd_devices() -> Vec<String> {
    let mut devs: Vec<(u32, String)> = std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            let i: u32 = n.strip_prefix("nbd")?.parse().ok()?;
            let busy = e.path().join("pid").exists() || nbd_size(&n) != 0;
            (!busy && Path::new(&format!("/dev/{n}")).exists()).then(|| (i, format!("/dev/{n}")))
        })
        .collect();
    devs.sort();
    devs.into_iter().map(|(_, d)| d).collect()
}

/// Attaches the kernel NBD client to the share's socket; returns the device.
fn attach(c: &ShareConfig, export: &str) -> Result<String, String> {
    let sock = c.nbd_socket.to_string_lossy().into_owned();
    let timeout = NBD_TIMEOUT_S.to_string();
    let mut last = "no /dev/nbdN is free (all are attached); load the module with more devices (modprobe nbd nbds_max=64)".to_string();
    for dev in free_nbd_devices().into_iter().take(4) {
        // -unix: the host argument is a Unix socket; -b 4096: the volume's natural sector.
        match run(
            "nbd-client",
            &[
                "-unix", &sock, &dev, "-N", export, "-b", "4096", "-t", &timeout,
            ],
        ) {
            Ok(_) => {
                let t0 = Instant::now();
                while nbd_size(&dev) == 0 && t0.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                if nbd_size(&dev) == 0 {
                    let _ = run("nbd-client", &["-d", &dev]);
                    last = format!("{dev} attached but shows no size");
                    continue;
                }
                return Ok(dev);
            }
            // Another program may have taken the device since we looked: try the next.
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn detach(dev: &str) -> Result<(), String> {
    run("nbd-client", &["-d", dev])?;
    let t0 = Instant::now();
    while nbd_size(dev) != 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The mount options. largeio and swalloc make XFS report and allocate in full stripes;
/// logbsize=256k lets log writes cover whole strips; discard sends the extents of deleted files
/// to the volume as NBD trims, so their whole stripes go back to the pool's drives (#17).
const MOUNT_OPTS: &str = "noatime,inode64,largeio,swalloc,logbsize=256k,discard";

fn mount(dev: &str, mountpoint: &Path) -> Result<(), String> {
    run(
        "mount",
        &[
            "-t",
            "xfs",
            "-o",
            MOUNT_OPTS,
            dev,
            &mountpoint.to_string_lossy(),
        ],
    )
    .map(|_| ())
}

/// Unmounts, waiting a little for nfsd to let go of the files it caches after an unexport.
fn umount(mountpoint: &Path) -> Result<(), String> {
    let mp = mountpoint.to_string_lossy().into_owned();
    // NFSv4 opens and locks pin files; this asks nfsd to drop its state on the file system.
    let _ = std::fs::write("/proc/fs/nfsd/unlock_filesystem", format!("{mp}\n"));
    let t0 = Instant::now();
    loop {
        if !is_mounted(mountpoint) {
            return Ok(());
        }
        match run("umount", &[&mp]) {
            Ok(_) => return Ok(()),
            Err(_) if t0.elapsed() > Duration::from_secs(5) => break,
            Err(_) => {
                let _ = run("exportfs", &["-f"]);
                std::thread::sleep(Duration::from_millis(300));
            }
        }
    }
    // Clients that keep the share mounted (even idle) leave nfsd holding it after the
    // unexport: its file cache and NFSv4 state pin it. Stopping nfsd's threads for a moment
    // lets go of everything; clients (hard mounts, the default) just retry until it is back.
    let threads: u32 = std::fs::read_to_string("/proc/fs/nfsd/threads")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    if threads == 0 {
        return run("umount", &[&mp]).map(|_| ());
    }
    tracing::warn!(
        "{mp} is still held after the unexport; restarting nfsd's {threads} threads to release it"
    );
    let _ = run("rpc.nfsd", &["0"]);
    let mut r = Err(String::new());
    for _ in 0..20 {
        r = run("umount", &[&mp]).map(|_| ());
        if r.is_ok() || !is_mounted(mountpoint) {
            r = Ok(());
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    if let Err(e) = start_nfsd(threads) {
        tracing::error!("cannot restart nfsd after unmounting {mp}: {e}");
    }
    r
}

/// Starts nfsd's threads offering NFSv3 and v4.x.
fn start_nfsd(threads: u32) -> Result<(), String> {
    run(
        "rpc.nfsd",
        &[
            "-V",
            "3",
            "-V",
            "4",
            "-V",
            "4.1",
            "-V",
            "4.2",
            &threads.to_string(),
        ],
    )?;
    crate::nfs_rdma::ensure();
    Ok(())
}

/// Starts the kernel NFS server if it is not running; leaves a running one (and its thread
/// count) as it is. Idempotent: a host with nfs-server.service already has all of this.
fn ensure_nfs_server() -> Result<(), String> {
    for d in [
        "/var/lib/nfs/v4recovery",
        "/var/lib/nfs/sm",
        "/var/lib/nfs/sm.bak",
    ] {
        let _ = std::fs::create_dir_all(d);
    }
    if !Path::new("/etc/exports").exists() {
        let _ = std::fs::write("/etc/exports", "");
    }
    if !Path::new("/proc/fs/nfsd/threads").exists() {
        if !modprobe("nfsd") {
            return Err("the kernel lacks nfsd (`modprobe nfsd` fails)".into());
        }
        run("mount", &["-t", "nfsd", "nfsd", "/proc/fs/nfsd"])?;
    }
    let registered = || run("rpcinfo", &["-p", "127.0.0.1"]).unwrap_or_default();
    if run("rpcinfo", &["-p", "127.0.0.1"]).is_err() {
        start_daemon("rpcbind", &[])?;
        let t0 = Instant::now();
        while run("rpcinfo", &["-p", "127.0.0.1"]).is_err() {
            if t0.elapsed() > Duration::from_secs(10) {
                return Err("rpcbind started but does not answer `rpcinfo -p 127.0.0.1`".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // NFSv3 clients lock through NLM, which needs statd on both ends.
    if !registered().contains("status") {
        if let Err(e) = start_daemon("rpc.statd", &[]) {
            tracing::warn!("{e}; NFSv3 clients will need -o nolock");
        }
    }
    let threads: u32 = std::fs::read_to_string("/proc/fs/nfsd/threads")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    if threads == 0 {
        // Sized to the machine: nfsd threads mostly wait on the disks, so several per core.
        let n = std::thread::available_parallelism().map_or(2, |n| n.get()) as u32;
        start_nfsd((4 * n).max(8))?;
    }
    if !registered().contains("mountd") {
        start_daemon("rpc.mountd", &[])?;
        let t0 = Instant::now();
        while !registered().contains("mountd") {
            if t0.elapsed() > Duration::from_secs(10) {
                return Err("rpc.mountd started but did not register with rpcbind".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let versions = std::fs::read_to_string("/proc/fs/nfsd/versions").unwrap_or_default();
    for v in ["+3", "+4.2"] {
        if !versions.split_whitespace().any(|x| x == v) {
            tracing::warn!(
                "the running NFS server does not offer NFS version {} (versions: {}); enable it in /etc/nfs.conf and restart nfs-server",
                &v[1..],
                versions.trim()
            );
        }
    }
    // Whoever started nfsd, RDMA clients need its RDMA listener (it is not on by default).
    crate::nfs_rdma::ensure();
    Ok(())
}

fn export_opts(c: &ShareConfig, fsid: u32) -> String {
    format!(
        "rw,{},no_wdelay,{},no_subtree_check,fsid={fsid}",
        if c.sync { "sync" } else { "async" },
        if c.root_squash {
            "root_squash"
        } else {
            "no_root_squash"
        }
    )
}

fn export(c: &ShareConfig, fsid: u32, client: &str) -> Result<(), String> {
    let spec = format!("{client}:{}", c.mountpoint.display());
    run("exportfs", &["-o", &export_opts(c, fsid), &spec]).map(|_| ())
}

fn unexport(c: &ShareConfig, client: &str) -> Result<(), String> {
    let spec = format!("{client}:{}", c.mountpoint.display());
    run("exportfs", &["-u", &spec]).map(|_| ())
}

/// Steps done so far, undone in reverse when a later one fails: nothing is left half-applied.
#[derive(Default)]
struct Undo(Vec<UndoStep>);

type UndoStep = Box<dyn FnOnce(&State)>;

impl Undo {
    fn push(&mut self, f: impl FnOnce(&State) + 'static) {
        self.0.push(Box::new(f));
    }
    fn run(self, s: &State) {
        for f in self.0.into_iter().rev() {
            f(s);
        }
    }
}

fn internal(what: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("{what}: {e}"))
}

impl State {
    fn share_config(v: &VolumeInfo) -> Option<ShareConfig> {
        v.props
            .get(SHARE_PROP)
            .and_then(|c| serde_json::from_str(c).ok())
    }

    fn nbd_export_name(pool: &str, vol: &str) -> String {
        format!("{pool}/{vol}")
    }

    /// Creates a volume and serves it as an NFS share; see the module's comment for the steps.
    #[allow(clippy::too_many_arguments)]
    pub fn create_share(
        &self,
        pool: &str,
        vol: &str,
        size: u64,
        clients: Vec<String>,
        sync: bool,
        root_squash: bool,
    ) -> Result<ShareView, ApiError> {
        if !self.serving {
            return Err(ApiError::conflict(
                "shares need the running server (the kernel's NBD client reads through it); start `millrace serve` first",
            ));
        }
        if clients.is_empty() {
            return Err(ApiError::bad_request(format!(
                "shares are closed by default: name the NFS clients that may mount {pool}/{vol} (--client 10.0.0.0/24, repeat for several)"
            )));
        }
        for c in &clients {
            check_client(c)?;
        }
        // mkfs.xfs (since xfsprogs 5.19) refuses file systems under 300 MiB.
        if size < 300 << 20 {
            return Err(ApiError::bad_request(format!(
                "a share needs at least 300 MiB (XFS's smallest file system); ask for --size 300M or more for {pool}/{vol}"
            )));
        }
        let e = self.entry(pool)?;
        if e.volumes.get(vol).is_some() {
            return Err(ApiError::conflict(format!(
                "pool {pool} already has a volume named {vol}; a share makes its own volume, so pick another name"
            )));
        }
        let mountpoint = Path::new(SHARE_ROOT).join(pool).join(vol);
        if is_mounted(&mountpoint) {
            return Err(ApiError::conflict(format!(
                "something is already mounted on {}; unmount it first",
                mountpoint.display()
            )));
        }
        check_prerequisites()?;
        let _g = SHARES.lock();
        let mut undo = Undo::default();
        let r = self.create_share_steps(
            &e,
            pool,
            vol,
            size,
            clients,
            sync,
            root_squash,
            mountpoint,
            &mut undo,
        );
        if r.is_err() {
            undo.run(self);
        }
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn create_share_steps(
        &self,
        e: &std::sync::Arc<PoolEntry>,
        pool: &str,
        vol: &str,
        size: u64,
        clients: Vec<String>,
        sync: bool,
        root_squash: bool,
        mountpoint: PathBuf,
        undo: &mut Undo,
    ) -> Result<ShareView, ApiError> {
        let v = self.create_volume(pool, vol, size, false, BTreeMap::new())?;
        {
            let e = e.clone();
            let vol = vol.to_string();
            undo.push(move |_| {
                let _ = e.volumes.delete(&vol);
            });
        }
        let mut c = ShareConfig {
            clients,
            sync,
            root_squash,
            mountpoint,
            nbd_socket: self.home.join("shares").join(format!("{pool}.{vol}.sock")),
            nbd_device: None,
        };
        let name = Self::nbd_export_name(pool, vol);
        let nbd = self.add_nbd_export(
            pool,
            vol,
            Some(name.clone()),
            Vec::new(),
            None,
            Some(c.nbd_socket.clone()),
        )?;
        debug_assert_eq!(nbd.name, name);
        {
            let (pool, vol) = (pool.to_string(), vol.to_string());
            undo.push(move |s| {
                let _ = s.drop_nbd_export(&pool, &vol);
            });
        }
        let dev = attach(&c, &name)
            .map_err(|e| internal(&format!("cannot attach {pool}/{vol} as a block device"), e))?;
        {
            let dev = dev.clone();
            undo.push(move |_| {
                let _ = detach(&dev);
            });
        }
        c.nbd_device = Some(dev.clone());
        let info = e.pool.info();
        // su = the strip, sw = the data strips of a full stripe across every group: writes of
        // whole full stripes need no read-modify-write of parity.
        let su = info.strip_bytes;
        let sw = (info.full_stripe_bytes / su.max(1)).max(1);
        let label: String = vol.chars().take(12).collect();
        let mut data = format!("su={su},sw={sw}");
        if v.size_bytes < 1 << 30 {
            // mkfs.xfs (since 5.19) wants a 64 MiB log, which must fit in one allocation group;
            // under 1 GiB its stripe-aligned default of 8 groups leaves them too small.
            data.push_str(",agcount=4");
        }
        run(
            "mkfs.xfs",
            &[
                "-f", "-q",
                "-K", // a new volume needs no discard, and discarding 500 GB takes a while
                "-d", &data, "-L", &label, &dev,
            ],
        )
        .map_err(|e| internal("cannot make the XFS file system", e))?;
        if !c.mountpoint.exists() {
            std::fs::create_dir_all(&c.mountpoint)
                .map_err(|e| internal(&format!("cannot create {}", c.mountpoint.display()), e))?;
            let mp = c.mountpoint.clone();
            undo.push(move |_| {
                let _ = std::fs::remove_dir(&mp);
            });
        }
        mount(&dev, &c.mountpoint).map_err(|e| internal("cannot mount the share", e))?;
        {
            let mp = c.mountpoint.clone();
            undo.push(move |_| {
                let _ = umount(&mp);
            });
        }
        ensure_nfs_server().map_err(|e| internal("cannot start the kernel NFS server", e))?;
        let id = fsid(&v);
        for client in c.clients.clone() {
            export(&c, id, &client).map_err(|e| internal("cannot export the share", e))?;
            let c2 = c.clone();
            undo.push(move |_| {
                let _ = unexport(&c2, &client);
            });
        }
        let v = e
            .volumes
            .set_prop(vol, SHARE_PROP, Some(&serde_json::to_string(&c).unwrap()))
            .map_err(|e| internal("cannot record the share", e))?;
        // Recorded: from here on nothing is undone.
        undo.0.clear();
        Ok(self.share_view(pool, &v, c))
    }

    fn share_view(&self, pool: &str, v: &VolumeInfo, config: ShareConfig) -> ShareView {
        let host = hostname();
        ShareView {
            pool: pool.to_string(),
            volume: v.name.clone(),
            size_bytes: v.size_bytes,
            mounted: is_mounted(&config.mountpoint),
            exported: is_exported(&config.mountpoint),
            nfs_path: format!("{host}:{}", config.mountpoint.display()),
            nfs_rdma_port: crate::nfs_rdma::listening_port(),
            config,
        }
    }

    pub fn list_shares(&self) -> Vec<ShareView> {
        let mut out = Vec::new();
        for e in self.entries() {
            let pool = e.pool.name();
            for v in e.volumes.list() {
                if let Some(c) = Self::share_config(&v) {
                    out.push(self.share_view(&pool, &v, c));
                }
            }
        }
        out
    }

    /// Undoes every step of `create_share`: unexport, unmount, detach, the NBD export, the
    /// volume, the mountpoint.
    pub fn delete_share(&self, pool: &str, vol: &str) -> Result<(), ApiError> {
        let (e, v) = self.volume(pool, vol)?;
        let Some(c) = Self::share_config(&v) else {
            return Err(ApiError::not_found(format!(
                "{pool}/{vol} is not a share; `millrace share list` shows the shares"
            )));
        };
        if !self.serving {
            return Err(ApiError::conflict(
                "shares are taken down by the running server; start `millrace serve` first",
            ));
        }
        let _g = SHARES.lock();
        self.take_down(&c, &fsid(&v))?;
        e.volumes
            .set_prop(vol, SHARE_PROP, None)
            .map_err(|e| internal("cannot forget the share", e))?;
        if v.props.contains_key(crate::exports::NBD_PROP) {
            self.drop_nbd_export(pool, vol)?;
        }
        e.volumes
            .delete(vol)
            .map_err(|e| internal(&format!("cannot delete volume {pool}/{vol}"), e))?;
        let _ = std::fs::remove_dir(&c.mountpoint);
        // /srv/millrace/POOL goes too once its last share is gone.
        if let Some(parent) = c.mountpoint.parent() {
            let _ = std::fs::remove_dir(parent);
        }
        let _ = std::fs::remove_file(&c.nbd_socket);
        Ok(())
    }

    /// Unexports, unmounts and detaches one share; its record stays. If the unmount fails (the
    /// file system is busy) the share is exported again and nothing else changes.
    fn take_down(&self, c: &ShareConfig, fsid: &u32) -> Result<(), ApiError> {
        for client in &c.clients {
            if let Err(e) = unexport(c, client) {
                tracing::warn!("{e}");
            }
        }
        if let Err(err) = umount(&c.mountpoint) {
            for client in &c.clients {
                let _ = export(c, *fsid, client);
            }
            return Err(ApiError::conflict(format!(
                "cannot unmount {} ({err}); something on this host still uses it (`fuser -vm {}` shows what); stop that and try again",
                c.mountpoint.display(),
                c.mountpoint.display()
            )));
        }
        for dev in self.devices_of(c) {
            if let Err(e) = detach(&dev) {
                tracing::warn!("cannot detach {dev}: {e}");
            }
        }
        Ok(())
    }

    /// The NBD devices attached to the share's socket (normally one, the recorded one).
    fn devices_of(&self, c: &ShareConfig) -> Vec<String> {
        let mut devs: Vec<String> = c
            .nbd_device
            .iter()
            .filter(|d| nbd_size(d) != 0)
            .cloned()
            .collect();
        devs.dedup();
        devs
    }

    /// At startup: rebuilds every recorded share (attach, mount, export) on the NBD exports the
    /// pools already serve. A share that cannot come back is logged and left for the
    /// administrator; the rest of the server runs.
    pub fn restore_shares(&self) {
        for problem in self.restore_shares_of(None) {
            eprintln!("millrace serve: {problem}");
        }
    }

    /// Rebuilds the recorded shares of these pools (all when None), as at startup; for a pool
    /// imported into a running server. Returns a sentence for each share that could not come
    /// back (also logged).
    pub fn restore_shares_of(&self, pools: Option<&[String]>) -> Vec<String> {
        let _g = SHARES.lock();
        let mut problems = Vec::new();
        for e in self.entries() {
            let pool = e.pool.name();
            if pools.is_some_and(|only| !only.contains(&pool)) {
                continue;
            }
            for v in e.volumes.list() {
                let Some(c) = Self::share_config(&v) else {
                    continue;
                };
                match self.restore_share(&e, &pool, &v, c) {
                    Ok(dev) => {
                        tracing::info!(pool = %pool, volume = %v.name, "share restored on {dev}")
                    }
                    Err(err) => {
                        tracing::error!(pool = %pool, volume = %v.name, "cannot restore the share: {err}");
                        problems.push(format!("cannot restore the share {pool}/{}: {err}", v.name));
                    }
                }
            }
        }
        problems
    }

    fn restore_share(
        &self,
        e: &PoolEntry,
        pool: &str,
        v: &VolumeInfo,
        mut c: ShareConfig,
    ) -> Result<String, String> {
        let miss = missing_prerequisites();
        if !miss.is_empty() {
            return Err(format!("this host lacks {}", miss.join(", ")));
        }
        // A server that died without taking its shares down leaves a mount on a dead device:
        // clear it first (the log replay at the next mount recovers the file system).
        if is_mounted(&c.mountpoint) {
            for client in &c.clients {
                let _ = unexport(&c, client);
            }
            if umount(&c.mountpoint).is_err() {
                run("umount", &["-l", &c.mountpoint.to_string_lossy()])?;
            }
        }
        if let Some(d) = &c.nbd_device {
            if nbd_size(d) != 0 {
                let _ = detach(d);
            }
        }
        let name = v
            .props
            .get(crate::exports::NBD_PROP)
            .and_then(|n| serde_json::from_str::<NbdExportConfig>(n).ok())
            .map(|n| n.name)
            .ok_or("its NBD export is not recorded")?;
        let dev = attach(&c, &name)?;
        let _ = std::fs::create_dir_all(&c.mountpoint);
        if let Err(err) = mount(&dev, &c.mountpoint) {
            let _ = detach(&dev);
            return Err(err);
        }
        ensure_nfs_server()?;
        let id = fsid(v);
        for client in &c.clients {
            export(&c, id, client)?;
        }
        if c.nbd_device.as_deref() != Some(&dev) {
            c.nbd_device = Some(dev.clone());
            if let Err(err) = e.volumes.set_prop(
                &v.name,
                SHARE_PROP,
                Some(&serde_json::to_string(&c).unwrap()),
            ) {
                tracing::warn!(pool = %pool, volume = %v.name, "cannot record the share's device: {err}");
            }
        }
        Ok(dev)
    }

    /// At a clean shutdown, before the NBD server stops: every share unexported, unmounted
    /// (the unmount flushes through the NBD server) and detached, so the pools close clean.
    pub fn stop_shares(&self) {
        let _g = SHARES.lock();
        for e in self.entries() {
            let pool = e.pool.name();
            for v in e.volumes.list() {
                let Some(c) = Self::share_config(&v) else {
                    continue;
                };
                if !is_mounted(&c.mountpoint) && self.devices_of(&c).is_empty() {
                    continue;
                }
                if let Err(err) = self.take_down(&c, &fsid(&v)) {
                    tracing::error!(pool = %pool, volume = %v.name, "{}", err.message);
                    eprintln!("millrace serve: share {pool}/{}: {}", v.name, err.message);
                }
            }
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "SERVER".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_checked() {
        for ok in ["10.0.0.5", "10.0.0.0/24", "nfs-client.lab", "*.lab"] {
            assert!(check_client(ok).is_ok(), "{ok}");
        }
        for bad in ["", "10.0.0.0/33", "::1", "a b", "x(rw)", "10.0.0.0/x"] {
            assert!(check_client(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn export_options_follow_the_config() {
        let c = ShareConfig {
            clients: vec!["127.0.0.1".into()],
            sync: true,
            root_squash: true,
            mountpoint: "/srv/millrace/tank/data".into(),
            nbd_socket: "/tmp/x.sock".into(),
            nbd_device: None,
        };
        assert_eq!(
            export_opts(&c, 7),
            "rw,sync,no_wdelay,root_squash,no_subtree_check,fsid=7"
        );
        let c2 = ShareConfig {
            sync: false,
            root_squash: false,
            ..c.clone()
        };
        assert_eq!(
            export_opts(&c2, 7),
            "rw,async,no_wdelay,no_root_squash,no_subtree_check,fsid=7"
        );
        // Older records without the booleans read as the safe defaults.
        let old: ShareConfig =
            serde_json::from_str(r#"{"clients":["a"],"mountpoint":"/m","nbd_socket":"/s"}"#)
                .unwrap();
        assert!(old.sync && old.root_squash);
    }
}
