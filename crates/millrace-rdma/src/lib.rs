//! Millrace's thin, safe layer over rdma-core: the RDMA connection manager (librdmacm) and the
//! verbs (libibverbs) that an NVMe-oF RDMA target needs, and nothing about NVMe itself.
//!
//! # The binding, and why this one
//! The raw FFI comes from [`rdma_mummy_sys`] (the `rdma-mummy-sys` crate, maintained by the
//! RDMA-Rust project, which also publishes `sideway`). It was chosen over the alternatives on
//! crates.io for three reasons:
//! - **Loaded at run time.** It links a small static shim that `dlopen`s `libibverbs.so.1` and
//!   `librdmacm.so.1` when the process starts. A `millrace` binary therefore runs on hosts
//!   without rdma-core installed; only `--nvme-rdma` then fails, with a sentence (see
//!   [`Error::NoLibrary`]). `rdma-sys` and `ibverbs-sys` link the libraries at build time (so
//!   the whole binary would need them), and `ibverbs-sys` builds rdma-core from source.
//! - **It covers librdmacm**, including accept and reject with private data, which the NVMe/RDMA
//!   transport needs for its connect handshake; `ibverbs` and `ibverbs-sys` have no CM at all.
//! - **The static inline verbs are there.** `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and
//!   `ibv_req_notify_cq` are `static inline` functions in `<infiniband/verbs.h>` that call through
//!   the provider's `ibv_context_ops` table; bindgen cannot bind them. The crate writes them in
//!   Rust over the same table, as rdma-core's header does in C.
//!
//! `sideway` (the safe layer over the same sys crate) was not used: its `accept` sends no private
//! data, it has no `reject` with private data and no send-with-invalidate, and it pulls in table
//! formatting and serde. What Millrace needs is small enough to wrap here directly.
//!
//! Building needs `cmake`, a C compiler and libclang (bindgen) at build time, which
//! `scripts/setup.sh` installs (`cmake`, `libclang-dev`); running needs `libibverbs1` and
//! `librdmacm1` (with `ibverbs-providers`) only where RDMA is used.
//!
//! # What is here
//! - [`devices`]: the RDMA devices and ports this host has, read from sysfs (no library needed).
//! - [`cm`]: an RDMA CM listener whose connect requests carry their private data, accepted or
//!   rejected with private data of our own; per-connection event streams; all on tokio.
//! - [`verbs`]: protection domains, memory regions, completion queues with completion channels
//!   (awaited on tokio), and reliable-connected queue pairs with SEND, SEND with invalidate,
//!   RDMA READ and RDMA WRITE.

// Functions stay under 100 lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod cm;
// In a crate of its own so that status pages list devices without linking the binding.
pub use millrace_rdma_devices as devices;
mod error;
mod ffi;
pub mod verbs;

pub use error::Error;
