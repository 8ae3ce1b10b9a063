//! The CLI as a client of the server's actions, through one trait with two implementations:
//! `Http` talks to a running `millrace serve` (which holds the drives: each member is locked),
//! `InProcess` opens the pools here and calls the same service functions the server's handlers
//! call. A command is written once against the trait; what it prints comes from the same
//! response structs either way.

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use millrace_server::model::*;
use millrace_server::{service, ApiError, State};
use millrace_volume::VolumeInfo;

use crate::client::{seg, Api};

pub trait Service {
    /// A server answers: exports start at once, shares can be made. Otherwise what is asked
    /// is recorded in the pools and served when `millrace serve` next starts.
    fn live(&self) -> bool;
    fn pools(&self) -> Result<PoolList>;
    fn volumes(&self, pool: &str) -> Result<VolumeList>;
    fn create_volume(&self, pool: &str, req: CreateVolume) -> Result<VolumeInfo>;
    fn volume(&self, pool: &str, vol: &str) -> Result<VolumeInfo>;
    fn grow_volume(&self, pool: &str, vol: &str, req: GrowVolume) -> Result<VolumeInfo>;
    fn delete_volume(&self, pool: &str, vol: &str) -> Result<Deleted>;
    fn exports(&self) -> Result<ExportsView>;
    fn add_nvme(&self, req: NvmeExportRequest) -> Result<NvmeExportConfig>;
    fn remove_nvme(&self, pool: &str, vol: &str) -> Result<Removed>;
    fn add_nbd(&self, req: NbdExportRequest) -> Result<NbdExportConfig>;
    fn remove_nbd(&self, pool: &str, vol: &str) -> Result<Removed>;
    fn shares(&self) -> Result<ShareList>;
    fn create_share(&self, req: ShareRequest) -> Result<ShareView>;
    fn delete_share(&self, pool: &str, vol: &str) -> Result<Deleted>;
    /// Ends the session: an in-process one closes its pools (recorded clean).
    fn finish(self: Box<Self>) -> Result<()>;
}

/// The server that runs for this home (or `--server`), else the pools opened here.
pub fn open<'a>(home: &Path, api: Option<&'a Api>) -> Result<Box<dyn Service + 'a>> {
    match api {
        Some(a) => Ok(Box::new(Http(a))),
        None => Ok(Box::new(InProcess::open(home)?)),
    }
}

/// The pools opened by this process, with no server running.
pub struct InProcess {
    // Declared before the runtime: the state's export services are dropped inside it.
    state: Arc<State>,
    rt: tokio::runtime::Runtime,
}

impl InProcess {
    pub fn open(home: &Path) -> Result<InProcess> {
        // The export services the state holds are tokio objects, even when they serve nothing.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let state = {
            let _g = rt.enter();
            Arc::new(State::open_offline(home)?)
        };
        Ok(InProcess { state, rt })
    }

    fn call<T>(&self, f: impl FnOnce(&Arc<State>) -> Result<T, ApiError>) -> Result<T> {
        let _g = self.rt.enter();
        f(&self.state).map_err(|e| anyhow!("{}", e.message))
    }
}

impl Service for InProcess {
    fn live(&self) -> bool {
        false
    }
    fn pools(&self) -> Result<PoolList> {
        self.call(service::pools)
    }
    fn volumes(&self, pool: &str) -> Result<VolumeList> {
        self.call(|s| service::volumes(s, pool))
    }
    fn create_volume(&self, pool: &str, req: CreateVolume) -> Result<VolumeInfo> {
        self.call(|s| service::create_volume(s, pool, req))
    }
    fn volume(&self, pool: &str, vol: &str) -> Result<VolumeInfo> {
        self.call(|s| service::volume(s, pool, vol))
    }
    fn grow_volume(&self, pool: &str, vol: &str, req: GrowVolume) -> Result<VolumeInfo> {
        self.call(|s| service::grow_volume(s, pool, vol, req))
    }
    fn delete_volume(&self, pool: &str, vol: &str) -> Result<Deleted> {
        self.call(|s| service::delete_volume(s, pool, vol))
    }
    fn exports(&self) -> Result<ExportsView> {
        self.call(service::exports)
    }
    fn add_nvme(&self, req: NvmeExportRequest) -> Result<NvmeExportConfig> {
        self.call(|s| service::add_nvme(s, req))
    }
    fn remove_nvme(&self, pool: &str, vol: &str) -> Result<Removed> {
        self.call(|s| service::remove_nvme(s, pool, vol))
    }
    fn add_nbd(&self, req: NbdExportRequest) -> Result<NbdExportConfig> {
        self.call(|s| service::add_nbd(s, req))
    }
    fn remove_nbd(&self, pool: &str, vol: &str) -> Result<Removed> {
        self.call(|s| service::remove_nbd(s, pool, vol))
    }
    fn shares(&self) -> Result<ShareList> {
        self.call(service::shares)
    }
    fn create_share(&self, req: ShareRequest) -> Result<ShareView> {
        self.call(|s| service::create_share(s, req))
    }
    fn delete_share(&self, pool: &str, vol: &str) -> Result<Deleted> {
        self.call(|s| service::delete_share(s, pool, vol))
    }
    fn finish(self: Box<Self>) -> Result<()> {
        let _g = self.rt.enter();
        self.state.close()
    }
}

/// A running server, through its HTTP API.
pub struct Http<'a>(pub &'a Api);

fn vol_path(pool: &str, vol: &str) -> String {
    format!("/api/v1/pools/{}/volumes/{}", seg(pool), seg(vol))
}

impl Service for Http<'_> {
    fn live(&self) -> bool {
        true
    }
    fn pools(&self) -> Result<PoolList> {
        self.0.get_as("/api/v1/pools")
    }
    fn volumes(&self, pool: &str) -> Result<VolumeList> {
        self.0
            .get_as(&format!("/api/v1/pools/{}/volumes", seg(pool)))
    }
    fn create_volume(&self, pool: &str, req: CreateVolume) -> Result<VolumeInfo> {
        self.0
            .post_as(&format!("/api/v1/pools/{}/volumes", seg(pool)), &req)
    }
    fn volume(&self, pool: &str, vol: &str) -> Result<VolumeInfo> {
        self.0.get_as(&vol_path(pool, vol))
    }
    fn grow_volume(&self, pool: &str, vol: &str, req: GrowVolume) -> Result<VolumeInfo> {
        self.0.patch_as(&vol_path(pool, vol), &req)
    }
    fn delete_volume(&self, pool: &str, vol: &str) -> Result<Deleted> {
        self.0.delete_as(&vol_path(pool, vol))
    }
    fn exports(&self) -> Result<ExportsView> {
        self.0.get_as("/api/v1/exports")
    }
    fn add_nvme(&self, req: NvmeExportRequest) -> Result<NvmeExportConfig> {
        self.0.post_as("/api/v1/exports/nvme", &req)
    }
    fn remove_nvme(&self, pool: &str, vol: &str) -> Result<Removed> {
        self.0
            .delete_as(&format!("/api/v1/exports/nvme/{}/{}", seg(pool), seg(vol)))
    }
    fn add_nbd(&self, req: NbdExportRequest) -> Result<NbdExportConfig> {
        self.0.post_as("/api/v1/exports/nbd", &req)
    }
    fn remove_nbd(&self, pool: &str, vol: &str) -> Result<Removed> {
        self.0
            .delete_as(&format!("/api/v1/exports/nbd/{}/{}", seg(pool), seg(vol)))
    }
    fn shares(&self) -> Result<ShareList> {
        self.0.get_as("/api/v1/shares")
    }
    fn create_share(&self, req: ShareRequest) -> Result<ShareView> {
        self.0.post_as("/api/v1/shares", &req)
    }
    fn delete_share(&self, pool: &str, vol: &str) -> Result<Deleted> {
        self.0
            .delete_as(&format!("/api/v1/shares/{}/{}", seg(pool), seg(vol)))
    }
    fn finish(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
