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

use millrace_volume::VolumeInfo;

use crate::error::ApiError;
use crate::model::ShareView;
use crate::props::{NbdExportConfig, ShareConfig, NBD_PROP, SHARE_PROP};
use crate::state::{PoolEntry, State};

mod system;

pub use system::missing_prerequisites;
use system::*;

/// Where shares are mounted unless a request names another place.
pub const SHARE_ROOT: &str = "/srv/millrace";

/// The NBD client's I/O timeout, in seconds. Generous: a request can wait behind a rebuild of a
/// degraded stripe, and on timeout the kernel drops the connection, failing every I/O after it.
pub(crate) const NBD_TIMEOUT_S: u64 = 300;

/// One lock for everything that changes shares: two creates must not pick the same free
/// /dev/nbdN, and a delete must not race the restore at startup.
static SHARES: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

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
        mkfs_xfs(
            &dev,
            vol,
            v.size_bytes,
            info.strip_bytes,
            info.full_stripe_bytes,
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
        if v.props.contains_key(NBD_PROP) {
            self.drop_nbd_export(pool, vol)?;
        }
        self.requests_out(pool, &[vol.to_string()])?;
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
            .get(NBD_PROP)
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
