//! The NVMe over Fabrics RDMA transport (NVMe-oF 1.1, "RDMA Transport Binding"), as the Linux
//! host (`nvme-rdma`) speaks it, for Millrace's user-space target.
//!
//! - Connection: RDMA CM in the TCP port space. The host's connect request carries 32 bytes of
//!   private data (record format 0, queue id, host receive and send queue sizes); the target
//!   accepts with its own (record format, controller receive queue size) or rejects with a
//!   reason ([`wire`]).
//! - Capsules: each command capsule arrives in one RDMA SEND into a receive buffer of 64 bytes
//!   plus the queue's in-capsule data size; each response capsule (16 bytes) leaves in one SEND.
//! - Data: a keyed SGL data block names the host's memory (address, length, remote key). The
//!   target fetches a write's data with RDMA READ and places a read's data with RDMA WRITE,
//!   straight between the host's memory and the registered buffer the device reads or writes.
//!   When the host asks for invalidation (SGL subtype Fh) the response goes out as SEND with
//!   invalidate, so the host need not invalidate its key itself. Small writes may carry their
//!   data in the capsule (SGL data block, offset subtype) on I/O queues.
//!
//! Proved with the stock Linux host on soft-RoCE by `tests/guest/nvme-rdma-serve.sh` (`millrace
//! serve --nvme-rdma`: discovery, connect, fio with verify across a drive failure, reconnect, a
//! host refused) and `tests/guest/nvme-rdma.sh` (the transport alone, `examples/rdma_refuse.rs`);
//! `tests/session.rs` holds the target's side to its refusals without any RDMA device.
//!
//! The pieces: [`wire`] (private data, SGLs), [`accept`] (the connect decision), [`sizing`]
//! (queue resources, work ids), [`regpool`] (the data pool registered once per device),
//! [`queue`] (one queue pair's loop), [`port`] (the listener, and the accept path that puts
//! each queue on a core of the data path, docs/DATAPATH.md), [`commands`],
//! the seam to the target's command handling, [`session`], which implements it over the
//! target's transport-agnostic `millrace_nvmf::Session`, and [`serve`], which serves a
//! `millrace_nvmf::Target` (`millrace serve --nvme-rdma ADDR:PORT`).

pub mod accept;
pub mod commands;
pub mod port;
pub mod queue;
mod queue_io;
pub mod regpool;
pub mod serve;
pub mod session;
pub mod sizing;
pub mod wire;
