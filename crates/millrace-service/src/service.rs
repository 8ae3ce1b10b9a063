//! Every action of the server as one typed function: the names of what it acts on (pool,
//! volume) and a request struct in, a response struct out (`model`). The HTTP handlers call
//! these, and so does the CLI when no server runs (it opens the pools itself). All of them
//! block (pools do disk I/O): the API runs them on the blocking threads.

use std::sync::Arc;

use millrace_volume::VolumeInfo;

use crate::error::ApiError;
use crate::model::*;
use crate::state::State;

type R<T> = Result<T, ApiError>;

pub fn status(s: &Arc<State>) -> R<Status> {
    let entries = s.entries();
    let volumes: usize = entries.iter().map(|e| e.volumes.list().len()).sum();
    let ex = s.exports_view();
    Ok(Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        uptime_s: s.started.elapsed().as_secs(),
        started_unix: s.started_unix,
        previous_stop_unclean: s.previous_stop_unclean,
        pools_found_unclean: s.found_unclean.read().clone(),
        pools: entries.len(),
        volumes,
        exports: ex.nvme.len() + ex.nbd.len(),
        unavailable_pools: s.unavailable.read().clone(),
        rdma: crate::rdma::view(),
        nvme_listeners: (s.nvmf.listeners().iter())
            .map(|(t, a)| NvmeListener {
                transport: t.as_str().to_string(),
                address: a.ip().to_string(),
                port: a.port(),
            })
            .collect(),
        nvme_hosts: crate::rdma::hosts_per_transport(&s.nvmf),
    })
}

pub fn pools(s: &Arc<State>) -> R<PoolList> {
    let pools = s.entries().iter().map(|e| s.pool_view(e)).collect();
    Ok(PoolList { pools })
}

pub fn pool(s: &Arc<State>, pool: &str) -> R<PoolView> {
    Ok(s.pool_view(&*s.entry(pool)?))
}

pub fn create_pool(s: &Arc<State>, req: CreatePool) -> R<PoolView> {
    s.create_pool(req)
}

pub fn import(s: &Arc<State>, req: ImportRequest) -> R<ImportResponse> {
    let (pools, notes) = s.import(&req.drives, req.force)?;
    Ok(ImportResponse { pools, notes })
}

pub fn read_data(s: &Arc<State>, pool: &str, q: DataQuery) -> R<Vec<u8>> {
    let Some(len) = q.length else {
        return Err(ApiError::bad_request(
            "say how many bytes to read with ?length=N",
        ));
    };
    s.read_pool(pool, q.offset, len)
}

pub fn write_data(s: &Arc<State>, pool: &str, offset: u64, data: &[u8]) -> R<Written> {
    s.write_pool(pool, offset, data)?;
    Ok(Written {
        written: data.len(),
    })
}

pub fn destroy_pool(s: &Arc<State>, pool: &str) -> R<Destroyed> {
    s.destroy_pool(pool)?;
    Ok(Destroyed {
        destroyed: pool.to_string(),
    })
}

pub fn fail(s: &Arc<State>, pool: &str, req: PathRequest) -> R<Message> {
    let message = s.fail(pool, &req.path)?;
    // A hot spare may have taken the failed member's place: the cache records where the
    // members are now, so the pool is found again after a restart.
    s.remember(&*s.entry(pool)?);
    Ok(Message { message })
}

pub fn add_spare(s: &Arc<State>, pool: &str, req: PathRequest) -> R<Message> {
    let message = s.add_spare(pool, &req.path, req.force)?;
    Ok(Message { message })
}

pub fn replace(s: &Arc<State>, pool: &str, req: ReplaceRequest) -> R<ReplaceResponse> {
    let (message, job) = s.replace(pool, &req.old, &req.new, req.force, req.rate_bytes_per_sec)?;
    Ok(ReplaceResponse { message, job })
}

pub fn scrub(s: &Arc<State>, pool: &str, req: ScrubRequest) -> R<JobStarted> {
    let job = s.scrub(pool, req.repair)?;
    Ok(JobStarted {
        job,
        notes: Vec::new(),
    })
}

pub fn rebuild(s: &Arc<State>, pool: &str, req: RebuildRequest) -> R<RebuildResponse> {
    let job = s.rebuild(pool, req.rate_bytes_per_sec)?;
    Ok(RebuildResponse { job })
}

pub fn jobs(s: &Arc<State>) -> R<JobList> {
    Ok(JobList {
        jobs: s.jobs.list(),
    })
}

pub fn job(s: &Arc<State>, id: u64) -> R<JobView> {
    s.jobs.get(id).ok_or_else(|| {
        ApiError::not_found(format!("there is no job {id}; GET /api/v1/jobs lists them"))
    })
}

pub fn bench(s: &Arc<State>, req: BenchRequest) -> R<JobStarted> {
    let (job, notes) = s.start_bench(req)?;
    Ok(JobStarted { job, notes })
}

pub fn volumes(s: &Arc<State>, pool: &str) -> R<VolumeList> {
    Ok(VolumeList {
        volumes: s.entry(pool)?.volumes.list(),
    })
}

pub fn create_volume(s: &Arc<State>, pool: &str, req: CreateVolume) -> R<VolumeInfo> {
    s.create_volume(pool, &req.name, req.size_bytes, req.force, req.props)
}

pub fn volume(s: &Arc<State>, pool: &str, vol: &str) -> R<VolumeInfo> {
    Ok(s.volume(pool, vol)?.1)
}

pub fn grow_volume(s: &Arc<State>, pool: &str, vol: &str, req: GrowVolume) -> R<VolumeInfo> {
    s.grow_volume(pool, vol, req.size_bytes)
}

pub fn delete_volume(s: &Arc<State>, pool: &str, vol: &str) -> R<Deleted> {
    s.delete_volume(pool, vol)?;
    Ok(Deleted {
        deleted: format!("{pool}/{vol}"),
    })
}

pub fn exports(s: &Arc<State>) -> R<ExportsView> {
    Ok(s.exports_view())
}

pub fn add_nvme(s: &Arc<State>, req: NvmeExportRequest) -> R<NvmeExportConfig> {
    let keys =
        match (&req.dhchap_secret, &req.dhchap_ctrl_secret) {
            (None, None) => None,
            (None, Some(_)) => return Err(ApiError::bad_request(
                "a DH-HMAC-CHAP controller secret needs the host's secret too (--dhchap-secret)",
            )),
            (Some(h), c) => Some(crate::nvme_auth::parse_keys(h, c.as_deref())?),
        };
    s.add_nvme_export(
        &req.pool,
        &req.volume,
        req.nqn,
        req.hosts,
        req.allow_any_host,
        req.ana_group,
        keys,
    )
}

pub fn set_nvme_host_keys(
    s: &Arc<State>,
    pool: &str,
    vol: &str,
    host: &str,
    req: NvmeHostKeysRequest,
) -> R<NvmeExportView> {
    if let Some(p) = &req.tls_psk {
        s.set_nvme_host_tls_psk(pool, vol, host, p)?;
    }
    match &req.dhchap_secret {
        Some(secret) => {
            s.set_nvme_host_keys(pool, vol, host, secret, req.dhchap_ctrl_secret.as_deref())
        }
        None if req.dhchap_ctrl_secret.is_some() => Err(ApiError::bad_request(
            "a DH-HMAC-CHAP controller secret needs the host's secret too (--dhchap-secret)",
        )),
        None if req.tls_psk.is_some() => s.nvme_export_view(pool, vol),
        None => Err(ApiError::bad_request(
            "give the host's DH-HMAC-CHAP secret (--dhchap-secret FILE) or TLS PSK (--tls-psk FILE)",
        )),
    }
}

pub fn set_nvme_ana(s: &Arc<State>, pool: &str, vol: &str, req: AnaRequest) -> R<NvmeExportView> {
    s.set_nvme_ana(pool, vol, &req)
}

pub fn clear_nvme_reservation(s: &Arc<State>, pool: &str, vol: &str) -> R<NvmeExportView> {
    s.clear_nvme_reservation(pool, vol)
}

pub fn remove_nvme(s: &Arc<State>, pool: &str, vol: &str) -> R<Removed> {
    s.remove_nvme_export(pool, vol)?;
    Ok(Removed {
        removed: format!("{pool}/{vol}"),
    })
}

pub fn add_nvme_host(s: &Arc<State>, pool: &str, vol: &str, host: &str) -> R<NvmeExportConfig> {
    s.add_nvme_host(pool, vol, host)
}

pub fn remove_nvme_host(s: &Arc<State>, pool: &str, vol: &str, host: &str) -> R<NvmeExportConfig> {
    s.remove_nvme_host(pool, vol, host)
}

pub fn add_nbd(s: &Arc<State>, req: NbdExportRequest) -> R<NbdExportConfig> {
    s.add_nbd_export(
        &req.pool,
        &req.volume,
        req.name,
        req.clients,
        req.listen,
        req.socket,
    )
}

pub fn remove_nbd(s: &Arc<State>, pool: &str, vol: &str) -> R<Removed> {
    s.remove_nbd_export(pool, vol)?;
    Ok(Removed {
        removed: format!("{pool}/{vol}"),
    })
}

pub fn shares(s: &Arc<State>) -> R<ShareList> {
    Ok(ShareList {
        shares: s.list_shares(),
    })
}

pub fn create_share(s: &Arc<State>, req: ShareRequest) -> R<ShareView> {
    s.create_share(
        &req.pool,
        &req.volume,
        req.size_bytes,
        req.clients,
        req.sync,
        req.root_squash,
    )
}

pub fn delete_share(s: &Arc<State>, pool: &str, vol: &str) -> R<Deleted> {
    s.delete_share(pool, vol)?;
    Ok(Deleted {
        deleted: format!("{pool}/{vol}"),
    })
}
