//! The vocabulary of the server's actions: one request struct and one response struct per
//! call, as the HTTP API sends and takes them (serde) and as the OpenAPI document describes
//! them (utoipa). The CLI speaks the same types, in-process or over HTTP.

use std::collections::BTreeMap;
use std::path::PathBuf;

use millrace_array::PoolInfo;
use millrace_volume::VolumeInfo;
use serde::{Deserialize, Serialize};

use crate::props::ShareConfig;

pub use crate::jobs::JobView;
pub use crate::props::{NbdExportConfig, NvmeExportConfig};

/// The most one raw read or write of a pool may move in one call: the CLI sends larger
/// transfers in pieces, and no request makes the server allocate without bound.
pub const MAX_RAW_IO: u64 = 64 << 20;

fn yes() -> bool {
    true
}

/// A pool as the API shows it: what `pool show --json` prints, plus volumes and counters.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PoolView {
    #[serde(flatten)]
    pub info: PoolInfo,
    pub volumes: Vec<VolumeInfo>,
    /// Bytes no volume holds, and the largest volume that could be created now (free space
    /// may lie in several ranges); what an orchestrator places volumes by.
    #[serde(default)]
    pub free_bytes: u64,
    #[serde(default)]
    pub largest_free_bytes: u64,
    /// Bytes of the volumes that hold data by the pool's allocation map (whole full stripes):
    /// what writes take and trims and zeroes of whole stripes give back.
    #[serde(default)]
    pub allocated_bytes: u64,
    /// Bytes the members' drive files take on their filesystems (their allocated blocks, parity
    /// and metadata included); null where a member is a block device or missing.
    #[serde(default)]
    pub member_allocated_bytes: Option<u64>,
    pub stats: PoolStats,
    /// I/O of each member slot, in member order.
    #[serde(default)]
    pub member_stats: Vec<MemberIo>,
    /// What assembling or creating the pool found worth saying (drives of unequal size, a
    /// stale member left out, a crash recovered).
    #[serde(default)]
    pub notes: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemberIo {
    pub index: usize,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    pub errors: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PoolStats {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_ops: u64,
    pub write_ops: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PoolList {
    pub pools: Vec<PoolView>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatePool {
    pub name: String,
    /// raid0, raid1, raid10, raid5, raid6, raid50 or raid60.
    pub level: String,
    pub strip_bytes: Option<u64>,
    pub group: Option<usize>,
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub drives: Vec<PathBuf>,
    /// Create missing drive files of this size.
    pub create_size_bytes: Option<u64>,
    /// Where the data area starts on each member (default: after the metadata).
    #[serde(default)]
    pub data_offset_bytes: Option<u64>,
    #[serde(default)]
    pub force: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImportRequest {
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub drives: Vec<PathBuf>,
    #[serde(default)]
    pub force: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImportResponse {
    pub pools: Vec<PoolView>,
    pub notes: Vec<String>,
}

/// Where in a pool raw bytes are read or written.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema, utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct DataQuery {
    /// Byte offset in the pool.
    pub offset: u64,
    /// How many bytes to read (reads only).
    pub length: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Written {
    pub written: usize,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Destroyed {
    pub destroyed: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PathRequest {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub path: PathBuf,
    #[serde(default)]
    pub force: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Message {
    pub message: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReplaceRequest {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub old: PathBuf,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub new: PathBuf,
    #[serde(default)]
    pub force: bool,
    pub rate_bytes_per_sec: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReplaceResponse {
    pub message: String,
    /// The rebuild onto the new drive, when one started.
    pub job: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScrubRequest {
    #[serde(default)]
    pub repair: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RebuildRequest {
    pub rate_bytes_per_sec: Option<u64>,
}

/// A job that was started.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobStarted {
    pub job: u64,
    /// What the job leaves out or cannot use, said before it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The rebuild job, or null when nothing waits for one.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RebuildResponse {
    pub job: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobList {
    pub jobs: Vec<JobView>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VolumeList {
    pub volumes: Vec<VolumeInfo>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateVolume {
    pub name: String,
    /// Rounded up to the pool's full stripe.
    pub size_bytes: u64,
    /// Create even where the pool's data area holds something that is not a volume table.
    #[serde(default)]
    pub force: bool,
    /// Tags of the client's own (an orchestrator's), written with the volume: keys of letters,
    /// digits, '.', '_', '-', '/'; not export.* or share*.
    #[serde(default)]
    pub props: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GrowVolume {
    pub size_bytes: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Deleted {
    pub deleted: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Removed {
    pub removed: String,
}

/// Every export and who is connected.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExportsView {
    pub nvme: Vec<NvmeExportView>,
    pub nbd: Vec<NbdExportView>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NvmeExportView {
    pub pool: String,
    pub volume: String,
    pub nqn: String,
    pub hosts: Vec<String>,
    pub allow_any_host: bool,
    /// The subsystem is live and the NVMe/TCP port listens.
    pub serving: bool,
    pub connections: Vec<NvmeConnection>,
    /// The namespace's ANA group.
    #[serde(default = "one")]
    pub ana_group: u32,
    /// Each path (listener) to the export, with its ANA state (empty while not serving).
    #[serde(default)]
    pub paths: Vec<NvmePath>,
    /// In-band authentication (DH-HMAC-CHAP) per host: `none`, `host` (the host proves
    /// itself) or `bidirectional` (the controller too). Never the secrets.
    #[serde(default)]
    pub dhchap: std::collections::BTreeMap<String, String>,
    /// The hosts that have a TLS PSK (NVMe/TCP's secure channel, on listeners that require
    /// TLS). Never the keys.
    #[serde(default)]
    pub tls_psk: Vec<String>,
    /// The namespace's persistent reservations: who is registered and who holds what (null
    /// while not serving).
    #[serde(default)]
    pub reservation: Option<NvmeReservation>,
}

/// An NVMe export's persistent reservations, as `nvme resv-report` shows them to a host.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NvmeReservation {
    /// The reservation held: write-exclusive, exclusive-access, their -registrants-only and
    /// -all-registrants forms; null when none is.
    #[serde(rename = "type")]
    pub rtype: Option<String>,
    /// The host NQN that holds it; null when none does, or when every registrant does (the
    /// all-registrants types).
    pub holder: Option<String>,
    pub registrants: Vec<NvmeRegistrant>,
    /// Counts registrations, preemptions and clears.
    pub generation: u32,
    /// A host asked for the state to persist through power loss: it is recorded in the
    /// server's home and comes back when the server starts again.
    pub ptpl: bool,
}

/// A host registered with an export's namespace.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NvmeRegistrant {
    /// The host NQN it registered from.
    pub host: String,
    /// Its Host Identifier (32 hex digits): what reservations know a host by.
    pub hostid: String,
    /// Its reservation key (0x and 16 hex digits).
    pub key: String,
    /// It holds the reservation.
    pub holds: bool,
}

fn one() -> u32 {
    1
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NvmeConnection {
    pub host: String,
    pub peer: String,
    pub io_queues: usize,
    /// tcp or rdma.
    pub transport: String,
    /// The listener (ADDR:PORT) the host connected through: its path.
    #[serde(default)]
    pub listener: Option<String>,
    /// Whether the host connected with TLS (NVMe/TCP's secure channel).
    #[serde(default)]
    pub tls: bool,
}

/// One path to an NVMe export: a listener, and the ANA state of the export's group there.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NvmePath {
    /// tcp or rdma.
    pub transport: String,
    /// ADDR:PORT, as `millrace serve --nvme` (or `--nvme-rdma`) listens.
    pub listener: String,
    /// optimized, non-optimized, inaccessible, persistent-loss or change.
    pub state: String,
}

/// Sets the ANA state of an NVMe export's group on one path.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AnaRequest {
    /// The listener (ADDR:PORT) whose state changes, as `export list` shows it.
    pub listener: String,
    /// tcp (the default) or rdma.
    #[serde(default)]
    pub transport: Option<String>,
    /// optimized, non-optimized, inaccessible, persistent-loss or change.
    pub state: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NbdExportView {
    pub pool: String,
    pub volume: String,
    pub name: String,
    pub clients: Vec<String>,
    pub listen: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub socket: Option<PathBuf>,
    pub serving: bool,
    /// Open client connections.
    pub connections: u64,
    /// Who: each client's address, or "local socket".
    pub connected: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NvmeExportRequest {
    pub pool: String,
    pub volume: String,
    /// The subsystem NQN (default: nqn.2026-11.dev.millrace:POOL.VOLUME).
    pub nqn: Option<String>,
    /// Host NQNs allowed to connect.
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub allow_any_host: bool,
    /// The namespace's ANA group, 1 to 128 (default 1).
    #[serde(default)]
    pub ana_group: Option<u32>,
    /// A DH-HMAC-CHAP secret (`DHHC-1:XX:BASE64:`, as `nvme gen-dhchap-key` prints it) every
    /// named host must authenticate with. Kept by the server, never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_secret: Option<String>,
    /// The controller's secret, for bidirectional authentication (needs dhchap_secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrl_secret: Option<String>,
}

impl std::fmt::Debug for NvmeExportRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (f.debug_struct("NvmeExportRequest"))
            .field("pool", &self.pool)
            .field("volume", &self.volume)
            .field("nqn", &self.nqn)
            .field("hosts", &self.hosts)
            .field("allow_any_host", &self.allow_any_host)
            .field("ana_group", &self.ana_group)
            .field(
                "dhchap_secret",
                &self.dhchap_secret.as_ref().map(|_| "hidden"),
            )
            .finish()
    }
}

/// A host's DH-HMAC-CHAP secrets on an export, to set or rotate them.
#[derive(Serialize, Deserialize, Clone)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NvmeHostKeysRequest {
    /// The host's secret, `DHHC-1:XX:BASE64:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_secret: Option<String>,
    /// The controller's secret, for bidirectional authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrl_secret: Option<String>,
    /// The host's TLS PSK, `NVMeTLSkey-1:HH:BASE64:` (as `nvme gen-tls-key` writes it), for
    /// listeners that require TLS (`millrace serve --nvme-tls required`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_psk: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NbdExportRequest {
    pub pool: String,
    pub volume: String,
    /// The export name (default: POOL/VOLUME).
    pub name: Option<String>,
    /// TCP clients (addresses or networks) allowed.
    #[serde(default)]
    pub clients: Vec<String>,
    /// A TCP address of the export's own to listen on.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub listen: Option<std::net::SocketAddr>,
    /// A Unix socket of the export's own.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub socket: Option<PathBuf>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShareList {
    pub shares: Vec<ShareView>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShareRequest {
    pub pool: String,
    pub volume: String,
    pub size_bytes: u64,
    /// NFS clients allowed (addresses, networks such as 10.0.0.0/24, or host names).
    pub clients: Vec<String>,
    /// NFS `sync` unless asked otherwise: acknowledged writes survive a crash.
    #[serde(default = "yes")]
    #[cfg_attr(feature = "openapi", schema(default = true))]
    pub sync: bool,
    #[serde(default = "yes")]
    #[cfg_attr(feature = "openapi", schema(default = true))]
    pub root_squash: bool,
}

/// A share as the API lists it.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// The server at a glance.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Status {
    pub version: String,
    pub uptime_s: u64,
    /// When this server started (seconds since the Unix epoch).
    pub started_unix: u64,
    /// The server before this one on this home did not stop in order (a crash or a kill).
    pub previous_stop_unclean: bool,
    /// Pools found recorded in use at this start (resynced).
    pub pools_found_unclean: Vec<String>,
    pub pools: usize,
    pub volumes: usize,
    pub exports: usize,
    /// Pools the cache knows that could not be assembled, with the reason.
    pub unavailable_pools: BTreeMap<String, String>,
    pub rdma: RdmaView,
    /// Where NVMe hosts connect (an address of 0.0.0.0 or :: means every address of the
    /// server): what an orchestrator hands the nodes it attaches.
    pub nvme_listeners: Vec<NvmeListener>,
    pub nvme_hosts: NvmeHosts,
}

/// Hosts connected to the NVMe-oF target now (controllers), per transport.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NvmeHosts {
    pub tcp: u64,
    pub rdma: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NvmeListener {
    /// tcp or rdma.
    pub transport: String,
    pub address: String,
    pub port: u16,
}

/// The host's RDMA devices and nfsd's NFS/RDMA listener.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RdmaView {
    pub devices: Vec<RdmaDevice>,
    pub nfs_rdma_port: Option<u16>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RdmaDevice {
    pub name: String,
    pub node_guid: String,
    pub ports: Vec<RdmaPort>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RdmaPort {
    pub port: u32,
    pub state: String,
    pub link_layer: String,
    pub rate: String,
    pub netdev: Option<String>,
}

/// A bench run: a simulated pool, or a pool's workloads (only its reads while it is served).
/// Its job's result holds `results` (as `millrace bench --json`) and `table`.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BenchRequest {
    /// A pool (its read workloads only, unless `write`).
    pub pool: Option<String>,
    /// A simulated pool instead: DRIVESxRATE[:IOPS], e.g. 16x400M.
    pub sim: Option<String>,
    pub level: Option<String>,
    pub strip_bytes: Option<u64>,
    pub group: Option<usize>,
    /// seq, rand, mixed or all.
    pub suite: Option<String>,
    pub jobs: Option<Vec<usize>>,
    pub iodepth: Option<Vec<usize>>,
    #[serde(default)]
    pub bs: Vec<u64>,
    pub degraded: Option<Vec<usize>>,
    pub seconds: Option<f64>,
    /// Run a pool's write workloads too: they overwrite its data, so a served pool refuses them.
    #[serde(default)]
    pub write: bool,
    /// Also measure a rebuild of one member (of a pool only with `write`: it rewrites a member).
    #[serde(default)]
    pub rebuild: bool,
}

/// Raw bytes of a pool (the body of a data read or write).
#[derive()]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(value_type = String, format = Binary))]
pub struct RawBytes(pub Vec<u8>);
