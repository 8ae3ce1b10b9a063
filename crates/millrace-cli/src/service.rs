//! The CLI as a client of the server's actions, through one trait with two implementations:
//! `Http` talks to a running `millrace serve` (which holds the drives: each member is locked),
//! `InProcess` opens the pools here and calls the same service functions the server's handlers
//! call. A command is written once against the trait; what it prints comes from the same
//! response structs either way.

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use millrace_service::model::*;
use millrace_service::{service, ApiError, State};
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
    fn set_nvme_ana(&self, pool: &str, vol: &str, req: AnaRequest) -> Result<NvmeExportView>;
    fn add_nvme_host(&self, pool: &str, vol: &str, host: &str) -> Result<NvmeExportConfig>;
    fn set_nvme_host_keys(
        &self,
        pool: &str,
        vol: &str,
        host: &str,
        req: NvmeHostKeysRequest,
    ) -> Result<NvmeExportView>;
    fn clear_nvme_reservation(&self, pool: &str, vol: &str) -> Result<NvmeExportView>;
    fn add_nbd(&self, req: NbdExportRequest) -> Result<NbdExportConfig>;
    fn remove_nbd(&self, pool: &str, vol: &str) -> Result<Removed>;
    fn shares(&self) -> Result<ShareList>;
    fn create_share(&self, req: ShareRequest) -> Result<ShareView>;
    fn delete_share(&self, pool: &str, vol: &str) -> Result<Deleted>;
    fn status(&self) -> Result<Status>;
    fn pool(&self, name: &str) -> Result<PoolView>;
    fn create_pool(&self, req: CreatePool) -> Result<PoolView>;
    fn import(&self, req: ImportRequest) -> Result<ImportResponse>;
    fn destroy_pool(&self, name: &str) -> Result<Destroyed>;
    fn fail(&self, pool: &str, req: PathRequest) -> Result<Message>;
    fn add_spare(&self, pool: &str, req: PathRequest) -> Result<Message>;
    fn replace(&self, pool: &str, req: ReplaceRequest) -> Result<ReplaceResponse>;
    fn rebuild(&self, pool: &str, req: RebuildRequest) -> Result<RebuildResponse>;
    fn scrub(&self, pool: &str, req: ScrubRequest) -> Result<JobStarted>;
    fn jobs(&self) -> Result<JobList>;
    fn job(&self, id: u64) -> Result<JobView>;
    fn bench(&self, req: BenchRequest) -> Result<JobStarted>;
    fn read_data(&self, pool: &str, offset: u64, length: u64) -> Result<Vec<u8>>;
    fn write_data(&self, pool: &str, offset: u64, data: &[u8]) -> Result<Written>;
    /// Ends the session: an in-process one closes its pools (recorded clean).
    fn finish(self: Box<Self>) -> Result<()>;
}

/// Which pools a session opens when no server runs: a command about one pool opens that one
/// alone (the others' drives stay untouched, and a pool that cannot be assembled does not stand
/// in the way of another).
pub enum Scope {
    All,
    Pool(String),
    /// None: an import assembles pools from the drives it is given.
    None,
}

/// Follows a job to its end with a progress bar; returns its final view, or its failure.
pub fn follow_job(svc: &dyn Service, id: u64, what: &str) -> Result<JobView> {
    let bar = crate::format::progress_bar(what);
    loop {
        let j = svc.job(id)?;
        bar.set_length(j.total.max(1));
        bar.set_position(j.done);
        match j.state.as_str() {
            "running" => std::thread::sleep(std::time::Duration::from_millis(200)),
            "failed" => {
                bar.finish_and_clear();
                return Err(anyhow!("{}", j.message));
            }
            _ => {
                bar.finish_and_clear();
                return Ok(j);
            }
        }
    }
}

/// The server that runs for this home (or `--server`), else the pools opened here.
pub fn open<'a>(home: &Path, api: Option<&'a Api>, scope: Scope) -> Result<Box<dyn Service + 'a>> {
    match api {
        Some(a) => Ok(Box::new(Http(a))),
        None => Ok(Box::new(InProcess::open(home, scope)?)),
    }
}

/// The pools opened by this process, with no server running.
pub struct InProcess {
    // Declared before the runtime: the state's export services are dropped inside it.
    state: Arc<State>,
    rt: tokio::runtime::Runtime,
}

impl InProcess {
    pub fn open(home: &Path, scope: Scope) -> Result<InProcess> {
        // The export services the state holds are tokio objects, even when they serve nothing.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let state = {
            let _g = rt.enter();
            Arc::new(match scope {
                Scope::All => State::open_offline(home)?,
                Scope::Pool(p) => State::open_offline_only(home, &[&p])?,
                Scope::None => State::open_offline_only(home, &[])?,
            })
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
    fn set_nvme_ana(&self, _pool: &str, _vol: &str, _req: AnaRequest) -> Result<NvmeExportView> {
        Err(anyhow!(
            "no server is running here; ANA states are held by a running server, so start `millrace serve` first"
        ))
    }
    fn add_nvme_host(&self, pool: &str, vol: &str, host: &str) -> Result<NvmeExportConfig> {
        self.call(|s| service::add_nvme_host(s, pool, vol, host))
    }
    fn set_nvme_host_keys(
        &self,
        pool: &str,
        vol: &str,
        host: &str,
        req: NvmeHostKeysRequest,
    ) -> Result<NvmeExportView> {
        self.call(|s| service::set_nvme_host_keys(s, pool, vol, host, req))
    }
    fn clear_nvme_reservation(&self, _pool: &str, _vol: &str) -> Result<NvmeExportView> {
        Err(anyhow!(
            "no server is running here; NVMe reservations are held by a running server, so start `millrace serve` first"
        ))
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
    fn status(&self) -> Result<Status> {
        self.call(service::status)
    }
    fn pool(&self, name: &str) -> Result<PoolView> {
        self.call(|s| service::pool(s, name))
    }
    fn create_pool(&self, req: CreatePool) -> Result<PoolView> {
        self.call(|s| service::create_pool(s, req))
    }
    fn import(&self, req: ImportRequest) -> Result<ImportResponse> {
        self.call(|s| service::import(s, req))
    }
    fn destroy_pool(&self, name: &str) -> Result<Destroyed> {
        self.call(|s| service::destroy_pool(s, name))
    }
    fn fail(&self, pool: &str, req: PathRequest) -> Result<Message> {
        self.call(|s| service::fail(s, pool, req))
    }
    fn add_spare(&self, pool: &str, req: PathRequest) -> Result<Message> {
        self.call(|s| service::add_spare(s, pool, req))
    }
    fn replace(&self, pool: &str, req: ReplaceRequest) -> Result<ReplaceResponse> {
        self.call(|s| service::replace(s, pool, req))
    }
    fn rebuild(&self, pool: &str, req: RebuildRequest) -> Result<RebuildResponse> {
        self.call(|s| service::rebuild(s, pool, req))
    }
    fn scrub(&self, pool: &str, req: ScrubRequest) -> Result<JobStarted> {
        self.call(|s| service::scrub(s, pool, req))
    }
    fn jobs(&self) -> Result<JobList> {
        self.call(service::jobs)
    }
    fn job(&self, id: u64) -> Result<JobView> {
        self.call(|s| service::job(s, id))
    }
    fn bench(&self, req: BenchRequest) -> Result<JobStarted> {
        self.call(|s| service::bench(s, req))
    }
    fn read_data(&self, pool: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        let q = DataQuery {
            offset,
            length: Some(length),
        };
        self.call(|s| service::read_data(s, pool, q))
    }
    fn write_data(&self, pool: &str, offset: u64, data: &[u8]) -> Result<Written> {
        self.call(|s| service::write_data(s, pool, offset, data))
    }
    fn finish(self: Box<Self>) -> Result<()> {
        let _g = self.rt.enter();
        self.state.close()
    }
}

/// A running server, through its HTTP API.
pub struct Http<'a>(pub &'a Api);

fn pool_path(pool: &str) -> String {
    format!("/api/v1/pools/{}", seg(pool))
}

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
    fn set_nvme_ana(&self, pool: &str, vol: &str, req: AnaRequest) -> Result<NvmeExportView> {
        let path = format!("/api/v1/exports/nvme/{}/{}/ana", seg(pool), seg(vol));
        self.0.put_as(&path, &req)
    }
    fn add_nvme_host(&self, pool: &str, vol: &str, host: &str) -> Result<NvmeExportConfig> {
        let path = format!(
            "/api/v1/exports/nvme/{}/{}/hosts/{}",
            seg(pool),
            seg(vol),
            seg(host)
        );
        self.0.put_as(&path, &serde_json::json!({}))
    }
    fn set_nvme_host_keys(
        &self,
        pool: &str,
        vol: &str,
        host: &str,
        req: NvmeHostKeysRequest,
    ) -> Result<NvmeExportView> {
        let path = format!(
            "/api/v1/exports/nvme/{}/{}/hosts/{}/dhchap",
            seg(pool),
            seg(vol),
            seg(host)
        );
        self.0.put_as(&path, &req)
    }
    fn clear_nvme_reservation(&self, pool: &str, vol: &str) -> Result<NvmeExportView> {
        let path = format!(
            "/api/v1/exports/nvme/{}/{}/reservation",
            seg(pool),
            seg(vol)
        );
        self.0.delete_as(&path)
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
    fn status(&self) -> Result<Status> {
        self.0.get_as("/api/v1/status")
    }
    fn pool(&self, name: &str) -> Result<PoolView> {
        self.0.get_as(&pool_path(name))
    }
    fn create_pool(&self, req: CreatePool) -> Result<PoolView> {
        self.0.post_as("/api/v1/pools", &req)
    }
    fn import(&self, req: ImportRequest) -> Result<ImportResponse> {
        self.0.post_as("/api/v1/pools/import", &req)
    }
    fn destroy_pool(&self, name: &str) -> Result<Destroyed> {
        self.0.delete_as(&pool_path(name))
    }
    fn fail(&self, pool: &str, req: PathRequest) -> Result<Message> {
        self.0.post_as(&format!("{}/fail", pool_path(pool)), &req)
    }
    fn add_spare(&self, pool: &str, req: PathRequest) -> Result<Message> {
        self.0.post_as(&format!("{}/spares", pool_path(pool)), &req)
    }
    fn replace(&self, pool: &str, req: ReplaceRequest) -> Result<ReplaceResponse> {
        self.0
            .post_as(&format!("{}/replace", pool_path(pool)), &req)
    }
    fn rebuild(&self, pool: &str, req: RebuildRequest) -> Result<RebuildResponse> {
        self.0
            .post_as(&format!("{}/rebuild", pool_path(pool)), &req)
    }
    fn scrub(&self, pool: &str, req: ScrubRequest) -> Result<JobStarted> {
        self.0.post_as(&format!("{}/scrub", pool_path(pool)), &req)
    }
    fn jobs(&self) -> Result<JobList> {
        self.0.get_as("/api/v1/jobs")
    }
    fn job(&self, id: u64) -> Result<JobView> {
        self.0.get_as(&format!("/api/v1/jobs/{id}"))
    }
    fn bench(&self, req: BenchRequest) -> Result<JobStarted> {
        self.0.post_as("/api/v1/bench", &req)
    }
    fn read_data(&self, pool: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        self.0.read_bytes(&seg(pool), offset, length)
    }
    fn write_data(&self, pool: &str, offset: u64, data: &[u8]) -> Result<Written> {
        self.0.write_bytes(&seg(pool), offset, data)
    }
    fn finish(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
