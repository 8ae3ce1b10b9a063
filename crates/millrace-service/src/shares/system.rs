//! The kernel's pieces of a share, driven with their own tools (nbd-client, mkfs.xfs, mount,
//! exportfs, rpc.nfsd): what an administrator knows and can inspect. No state of the server here.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use millrace_volume::VolumeInfo;

use crate::error::ApiError;
use crate::props::ShareConfig;

use super::NBD_TIMEOUT_S;

/// A program from the PATH or the sbin folders (a service's PATH often lacks them).
pub(super) fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(prog))
        .find(|f| f.is_file())
}

/// Runs a tool to its end; the error is a sentence with the command and what it said.
pub(super) fn run(prog: &str, args: &[&str]) -> Result<String, String> {
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
pub(super) fn start_daemon(prog: &str, args: &[&str]) -> Result<(), String> {
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

pub(super) fn modprobe(m: &str) -> bool {
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

pub(super) fn check_prerequisites() -> Result<(), ApiError> {
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
pub(super) fn check_client(c: &str) -> Result<(), ApiError> {
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
pub(super) fn fsid(v: &VolumeInfo) -> u32 {
    let b = v.uuid.as_bytes();
    (u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff).max(1)
}

pub(super) fn is_mounted(mountpoint: &Path) -> bool {
    let want = mountpoint.to_string_lossy();
    std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
        m.lines().any(|l| {
            // /proc/mounts escapes spaces as \040; our mountpoints have none.
            l.split_whitespace().nth(1) == Some(&want)
        })
    })
}

pub(super) fn is_exported(mountpoint: &Path) -> bool {
    let want = mountpoint.to_string_lossy();
    std::fs::read_to_string("/var/lib/nfs/etab").is_ok_and(|t| {
        t.lines()
            .any(|l| l.split_whitespace().next() == Some(&want))
    })
}

pub(super) fn nbd_size(dev: &str) -> u64 {
    let name = dev.trim_start_matches("/dev/");
    std::fs::read_to_string(format!("/sys/block/{name}/size"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// NBD devices nobody uses: the kernel reports size 0 for an unconnected one.
pub(super) fn free_nbd_devices() -> Vec<String> {
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
pub(super) fn attach(c: &ShareConfig, export: &str) -> Result<String, String> {
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

pub(super) fn detach(dev: &str) -> Result<(), String> {
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

pub(super) fn mount(dev: &str, mountpoint: &Path) -> Result<(), String> {
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
pub(super) fn umount(mountpoint: &Path) -> Result<(), String> {
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
pub(super) fn start_nfsd(threads: u32) -> Result<(), String> {
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
pub(super) fn ensure_nfs_server() -> Result<(), String> {
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

/// XFS on the share's device, aligned to the pool: su = the strip, sw = the data strips of a
/// full stripe across every group, so writes of whole full stripes need no read-modify-write
/// of parity.
pub(super) fn mkfs_xfs(
    dev: &str,
    vol: &str,
    size_bytes: u64,
    strip_bytes: u64,
    full_stripe_bytes: u64,
) -> Result<(), String> {
    let su = strip_bytes;
    let sw = (full_stripe_bytes / su.max(1)).max(1);
    let label: String = vol.chars().take(12).collect();
    let mut data = format!("su={su},sw={sw}");
    if size_bytes < 1 << 30 {
        // mkfs.xfs (since 5.19) wants a 64 MiB log, which must fit in one allocation group;
        // under 1 GiB its stripe-aligned default of 8 groups leaves them too small.
        data.push_str(",agcount=4");
    }
    run(
        "mkfs.xfs",
        &[
            "-f", "-q",
            "-K", // a new volume needs no discard, and discarding 500 GB takes a while
            "-d", &data, "-L", &label, dev,
        ],
    )
    .map(|_| ())
}

pub(super) fn export_opts(c: &ShareConfig, fsid: u32) -> String {
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

pub(super) fn export(c: &ShareConfig, fsid: u32, client: &str) -> Result<(), String> {
    let spec = format!("{client}:{}", c.mountpoint.display());
    run("exportfs", &["-o", &export_opts(c, fsid), &spec]).map(|_| ())
}

pub(super) fn unexport(c: &ShareConfig, client: &str) -> Result<(), String> {
    let spec = format!("{client}:{}", c.mountpoint.display());
    run("exportfs", &["-u", &spec]).map(|_| ())
}

pub(super) fn hostname() -> String {
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
