//! The typed service layer: every action on pools, volumes, exports, shares, jobs and the bench
//! as one function (`service`) over the state a server holds (`state`), with the requests and
//! responses the HTTP API speaks (`model`). The server's API handlers call it, and so does the
//! CLI when no server runs (it opens the pools itself). No HTTP stack, TLS or RDMA binding is
//! linked here: the CLI links this crate, not the server (docs/ARCHITECTURE.md).

// Functions stay under 100 lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

// Dependencies point one way (scripts/module-circles.py checks it), from the bottom up: error,
// home, props (what volumes record), nvme_resv (NVMe reservations recorded in the home); jobs,
// metered; model (requests and responses); state (the pools held); exports; shares; pools
// (taking pools into service brings their exports and shares back); bench, rdma; service.
pub mod bench;
pub mod datapath;
mod error;
mod exports;
mod home;
pub mod jobs;
pub mod metered;
pub mod model;
pub mod nfs_rdma;
pub mod nvme_auth;
mod nvme_resv;
pub mod nvme_tls;
mod pools;
mod props;
pub mod rdma;
pub mod service;
mod shares;
mod sockpath;
pub mod state;

pub use error::{ApiError, ErrorBody, StatusCode};
pub use home::{nbd_socket, server_file, server_lock, server_running, ServerFile};
pub use model::ShareView;
pub use props::{NbdExportConfig, NvmeExportConfig, ShareConfig};
pub use rdma::view as rdma_view;
pub use state::{QueueCounts, State};

/// The default of `ServeConfig::bench_memory` (`serve --bench-memory`).
pub const DEFAULT_BENCH_MEMORY: u64 = 1 << 30;
