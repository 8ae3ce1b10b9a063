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
//! The pieces: [`wire`] (private data, SGLs), [`accept`] (the connect decision), [`sizing`]
//! (queue resources, work ids), [`regpool`] (the data pool registered once per device),
//! [`queue`] (one queue pair's loop), [`port`] (the listener and accept path), and
//! [`commands`], the seam to the target's command handling (one implementation per queue).
//!
//! Status: the seam is not yet implemented by the target (its split into transport and command
//! handling is landing), so `millrace serve --nvme-rdma` does not exist yet. [`queue`] and
//! [`port`] have carried the Linux host's Connect end to end (`examples/rdma_refuse.rs`, run by
//! `tests/guest/nvme-rdma.sh`: CM accept with private data, the capsule by SEND, its data by
//! RDMA READ of the host's keyed SGL, the refusal by SEND with invalidate, which the host
//! reports as "not allowed"), but no RDMA WRITE of read data and no I/O yet; the same test
//! holds the kernel's nvmet-rdma to the I/O checks meanwhile.

pub mod accept;
pub mod commands;
pub mod port;
pub mod queue;
mod queue_io;
pub mod regpool;
pub mod sizing;
pub mod wire;
