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
//!     namespaces: vec![Namespace { nsid: 1, dev, uuid: [1; 16], nguid: [1; 16] }],
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

mod admin;
pub mod cmd;
mod conn;
pub mod initiator;
pub mod pdu;
mod target;

pub use admin::{FIRMWARE, MAX_DEALLOCATE_BYTES, NVME_VERSION};
pub use target::{
    Error, HostInfo, Namespace, NamespaceInfo, Stats, SubsystemConfig, SubsystemInfo, Target,
    TargetConfig, DEFAULT_DISCOVERY_PORT, DEFAULT_IO_PORT, DISCOVERY_NQN,
};
