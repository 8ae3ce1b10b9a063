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

pub mod accept;
pub mod sizing;
pub mod wire;
