//! Millrace's NVMe over Fabrics target: a user-space NVMe/TCP target (like SPDK's) that exports
//! block devices (`millrace_block::BlockDevice`) as namespaces to the stock Linux initiator
//! and nvme-cli, with a discovery service, and a small initiator for tests and host-side load.
//!
//! ```no_run
//! # async fn f(dev: std::sync::Arc<dyn millrace_block::BlockDevice>) -> std::io::Result<()> {
//! use millrace_nvmf::{Namespace, SubsystemConfig, Target, TargetConfig};
//! let t = Target::new(TargetConfig::default());
//! t.add_subsystem(SubsystemConfig {
//!     nqn: "nqn.2024-01.io.millrace:vol1".into(),
//!     serial: "MR0001".into(),
//!     model: "Millrace Volume".into(),
//!     namespaces: vec![Namespace { nsid: 1, dev, uuid: [1; 16], nguid: [1; 16], ana_group: 0 }],
//!     allowed_hosts: vec!["nqn.2014-08.org.nvmexpress:uuid:...".into()],
//!     allow_any_host: false,
//! }).unwrap();
//! let io = tokio::net::TcpListener::bind("0.0.0.0:4420").await?;
//! let disc = tokio::net::TcpListener::bind("0.0.0.0:8009").await?;
//! let t2 = t.clone();
//! tokio::spawn(async move { t2.serve_discovery(disc).await });
//! t.serve(io).await
//! # }
//! ```

// The layers, each using only those below it:
//   wire:       `cmd` (commands, statuses), `pdu` (NVMe/TCP framing), `error` (the API's errors)
//   model:      subsystems, namespaces, controllers, counters (`model`)
//               (`ana`: each path's ANA state per group, the ANA log page; `reservation`:
//               each namespace's registrations and reservation, their rules and wire forms;
//               both below `model`)
//   commands:   `admin` (admin commands), `io_commands` (the NVM command set), both over
//               `resv_commands` (reservation commands, notices, records, features)
//   (each host's share of the buffer pool is a millrace_io::Shares keyed by host NQN)
//   session:    one queue's command handling, transport-agnostic (`session`)
//   secure channel: TLS 1.3 with PSKs, handshake in OpenSSL, records in the kernel (`tls`)
//   transport:  NVMe/TCP (`tcp`, with `plug`: writes held for the one continuing them);
//               NVMe/RDMA lives in millrace-nvmf-rdma, over `Session`
//   target:     the public API and the TCP accept loop (`target`)
mod admin;
mod ana;
pub mod cmd;
pub mod dhchap;
mod error;
mod gather;
pub mod initiator;
pub mod io_commands;
mod model;
pub mod pdu;
mod plug;
mod reservation;
mod resv_commands;
pub mod session;
mod target;
mod tcp;
pub mod tls;

pub use admin::{FIRMWARE, MAX_DEALLOCATE_BYTES, NVME_VERSION};
pub use ana::{AnaState, ANA_GROUP_MAX};
pub use error::Error;
pub use model::{
    Completer, HostInfo, Namespace, NamespaceInfo, PathInfo, Stats, SubsystemConfig, SubsystemInfo,
    TargetConfig, Transport, TransportInfo, DEFAULT_DISCOVERY_PORT, DEFAULT_IO_PORT, DISCOVERY_NQN,
};
pub use reservation::{
    HostId, Registrant, ReservationState, ReservationStore, ReservationType, MAX_REGISTRANTS,
};
pub use session::{Action, ErrorCounter, Session};
pub use target::{ListenerGuard, Target};
