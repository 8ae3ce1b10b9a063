//! Completion queues (waited on through their completion channel with tokio) and the work
//! requests posted to queue pairs.

use super::resources::{self as verbs, Context, Sge};
use crate::error::{Error, Result};
use crate::ffi::Fd;
use rdma_mummy_sys as sys;
use std::ffi::CStr;
use std::mem::MaybeUninit;
use tokio::io::unix::AsyncFd;

/// Completion events are acknowledged in batches of this many (each ack takes a lock).
const ACK_BATCH: u32 = 64;
/// Most work requests one `post_send` chains (a transfer and its response, in pieces).
pub const MAX_CHAIN: usize = 16;

/// One completed work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    /// 0 is success; otherwise an `ibv_wc_status` (see [`Completion::status_text`]).
    pub status: u32,
    /// Bytes received (receives only).
    pub byte_len: u32,
    pub is_recv: bool,
}

impl Completion {
    pub fn ok(&self) -> bool {
        self.status == sys::ibv_wc_status::IBV_WC_SUCCESS
    }
    /// Flushed because the queue pair went to the error state (a disconnect), not a fault.
    pub fn flushed(&self) -> bool {
        self.status == sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR
    }
    pub fn status_text(&self) -> String {
        // SAFETY: ibv_wc_status_str returns a static string for any value.
        unsafe {
            let p = sys::ibv_wc_status_str(self.status);
            if p.is_null() {
                return format!("status {}", self.status);
            }
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// A completion queue with its own completion channel.
pub struct CompletionQueue {
    cq: *mut sys::ibv_cq,
    ch: *mut sys::ibv_comp_channel,
    /// Taken out (deregistered) in Drop before the channel closes its descriptor.
    afd: Option<AsyncFd<Fd>>,
    unacked: u32,
    armed: bool,
}

// SAFETY: one task owns the CQ; verbs calls on it are thread-safe; freed only in Drop.
unsafe impl Send for CompletionQueue {}
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// A CQ of at least `entries` entries on the device. Must run inside a tokio runtime.
    pub fn new(ctx: Context, entries: u32) -> Result<CompletionQueue> {
        let (ch, afd) = verbs::cq_channel(ctx)?;
        // SAFETY: context and channel are live; no CQ context pointer is used.
        let cq = unsafe {
            sys::ibv_create_cq(
                verbs::ctx_raw(ctx),
                entries.min(i32::MAX as u32) as i32,
                std::ptr::null_mut(),
                ch,
                0,
            )
        };
        if cq.is_null() {
            let e = Error::last("ibv_create_cq");
            drop(afd);
            // SAFETY: no CQ uses the channel.
            unsafe { sys::ibv_destroy_comp_channel(ch) };
            return Err(e);
        }
        Ok(CompletionQueue {
            cq,
            ch,
            afd: Some(afd),
            unacked: 0,
            armed: false,
        })
    }

    pub(crate) fn raw(&self) -> *mut sys::ibv_cq {
        self.cq
    }

    /// Takes up to `out.len()` completions without waiting; returns how many.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        let mut wc: [MaybeUninit<sys::ibv_wc>; 32] = [const { MaybeUninit::uninit() }; 32];
        let want = out.len().min(wc.len()) as i32;
        // SAFETY: the CQ is live; wc has room for `want` entries.
        let n = unsafe { sys::ibv_poll_cq(self.cq, want, wc.as_mut_ptr() as *mut sys::ibv_wc) };
        if n < 0 {
            return Err(Error::Call {
                call: "ibv_poll_cq",
                source: std::io::Error::from_raw_os_error(-n),
            });
        }
        for (i, slot) in wc.iter().take(n as usize).enumerate() {
            // SAFETY: the first n entries were written by the provider.
            let w = unsafe { slot.assume_init_ref() };
            out[i] = Completion {
                wr_id: w.wr_id,
                status: w.status,
                byte_len: w.byte_len,
                is_recv: w.opcode & sys::ibv_wc_opcode::IBV_WC_RECV != 0,
            };
        }
        Ok(n as usize)
    }

    /// Waits for completions. The first call after completions were taken only arms the queue
    /// and returns, so the caller polls once more (closing the race between its last poll and
    /// the arming); the next call waits for the completion event.
    pub async fn wait(&mut self) -> Result<()> {
        if !self.armed {
            // SAFETY: the CQ is live.
            let rc = unsafe { sys::ibv_req_notify_cq(self.cq, 0) };
            if rc != 0 {
                return Err(Error::code("ibv_req_notify_cq", rc));
            }
            self.armed = true;
            return Ok(());
        }
        loop {
            let afd = self.afd.as_ref().expect("the queue is open until dropped");
            let mut guard = afd.readable().await.map_err(|e| Error::Call {
                call: "waiting for completions",
                source: e,
            })?;
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: the channel is live; the event is acknowledged (in batches) below.
            if unsafe { sys::ibv_get_cq_event(self.ch, &mut cq, &mut ctx) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::WouldBlock {
                    guard.clear_ready();
                    continue;
                }
                return Err(Error::Call {
                    call: "ibv_get_cq_event",
                    source: e,
                });
            }
            self.unacked += 1;
            if self.unacked >= ACK_BATCH {
                // SAFETY: acknowledges events we took from this CQ.
                unsafe { sys::ibv_ack_cq_events(self.cq, self.unacked) };
                self.unacked = 0;
            }
            self.armed = false;
            return Ok(());
        }
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        drop(self.afd.take());
        // SAFETY: the owner destroyed every QP using this CQ first (the CM id goes before it);
        // all events taken are acknowledged before the CQ is destroyed, as verbs requires.
        unsafe {
            if self.unacked > 0 {
                sys::ibv_ack_cq_events(self.cq, self.unacked);
            }
            sys::ibv_destroy_cq(self.cq);
            sys::ibv_destroy_comp_channel(self.ch);
        }
    }
}

/// The sizes a queue pair is created with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// What a send-queue work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    Send,
    /// SEND that also invalidates the peer's memory key (the NVMe/RDMA host registered the
    /// buffer for this one command, and this spares it a local invalidation).
    SendInvalidate(u32),
    /// Place local data in the peer's memory.
    RdmaWrite {
        remote_addr: u64,
        rkey: u32,
    },
    /// Fetch the peer's memory into the local buffer.
    RdmaRead {
        remote_addr: u64,
        rkey: u32,
    },
}

/// One send-queue work request with one local buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendOp {
    pub wr_id: u64,
    pub op: Opcode,
    pub sge: Sge,
    /// Ask for a completion (unsignaled requests complete silently, in order before a later
    /// signaled one).
    pub signaled: bool,
}

/// A reliable-connected queue pair, owned by its [`crate::cm::CmId`]: valid while that id is.
pub struct QueuePair(*mut sys::ibv_qp);

// SAFETY: posting to a QP is thread-safe in libibverbs.
unsafe impl Send for QueuePair {}
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// # Safety
    /// `qp` lives as long as the value.
    pub(crate) unsafe fn from_raw(qp: *mut sys::ibv_qp) -> QueuePair {
        QueuePair(qp)
    }

    pub fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live.
        unsafe { (*self.0).qp_num }
    }

    /// Moves the queue pair to the error state: its posted work is flushed, and from then on it
    /// answers nothing the peer sends, as a host whose queue pair failed (tests use it to play
    /// such a host).
    pub fn to_error(&self) -> Result<()> {
        // SAFETY: zeroed attributes are valid; only the state is applied (the mask).
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_ERR;
        let mask = sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32;
        // SAFETY: the QP is live; attr outlives the call.
        let rc = unsafe { sys::ibv_modify_qp(self.0, &mut attr, mask) };
        if rc != 0 {
            return Err(Error::code("ibv_modify_qp", rc));
        }
        Ok(())
    }

    /// Posts one receive into `sge`.
    ///
    /// # Safety
    /// The buffer stays registered, allocated and untouched until its completion is polled,
    /// and the owning CM id is alive.
    pub unsafe fn post_recv(&self, wr_id: u64, sge: Sge) -> Result<()> {
        let mut s = verbs::sge_raw(&sge);
        let mut wr = sys::ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut s,
            num_sge: 1,
        };
        let mut bad = std::ptr::null_mut();
        let rc = sys::ibv_post_recv(self.0, &mut wr, &mut bad);
        if rc != 0 {
            return Err(Error::code("ibv_post_recv", rc));
        }
        Ok(())
    }

    /// Posts `ops` as one chain, in order.
    ///
    /// # Safety
    /// Every local buffer stays registered and allocated, and is neither read (for a READ) nor
    /// written (for a SEND or WRITE) by us, until a signaled completion at or after its request
    /// is polled; the remote addresses and keys are the peer's to answer for.
    pub unsafe fn post_send(&self, ops: &[SendOp]) -> Result<()> {
        if ops.is_empty() || ops.len() > MAX_CHAIN {
            return Err(Error::Invalid(format!(
                "a chain of {} work requests (1 to {MAX_CHAIN} are posted at once)",
                ops.len()
            )));
        }
        let mut sges: [sys::ibv_sge; MAX_CHAIN] = std::mem::zeroed();
        let mut wrs: [sys::ibv_send_wr; MAX_CHAIN] = std::mem::zeroed();
        let n = ops.len();
        for (i, op) in ops.iter().enumerate() {
            sges[i] = verbs::sge_raw(&op.sge);
        }
        let base = wrs.as_mut_ptr();
        for (i, op) in ops.iter().enumerate() {
            let w = &mut wrs[i];
            w.wr_id = op.wr_id;
            w.sg_list = sges.as_mut_ptr().add(i);
            w.num_sge = if op.sge.len == 0 { 0 } else { 1 };
            w.send_flags = if op.signaled {
                sys::ibv_send_flags::IBV_SEND_SIGNALED.0
            } else {
                0
            };
            w.next = if i + 1 < n {
                base.add(i + 1)
            } else {
                std::ptr::null_mut()
            };
            fill(w, op.op);
        }
        let mut bad = std::ptr::null_mut();
        let rc = sys::ibv_post_send(self.0, base, &mut bad);
        if rc != 0 {
            return Err(Error::code("ibv_post_send", rc));
        }
        Ok(())
    }
}

fn fill(w: &mut sys::ibv_send_wr, op: Opcode) {
    use sys::ibv_wr_opcode::*;
    match op {
        Opcode::Send => w.opcode = IBV_WR_SEND,
        Opcode::SendInvalidate(rkey) => {
            w.opcode = IBV_WR_SEND_WITH_INV;
            w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
        }
        Opcode::RdmaWrite { remote_addr, rkey } => {
            w.opcode = IBV_WR_RDMA_WRITE;
            w.wr.rdma = sys::rdma_t { remote_addr, rkey };
        }
        Opcode::RdmaRead { remote_addr, rkey } => {
            w.opcode = IBV_WR_RDMA_READ;
            w.wr.rdma = sys::rdma_t { remote_addr, rkey };
        }
    }
}
