//! How big one NVMe/RDMA queue's verbs resources are, from what the host asked for (the
//! negotiated [`QueueSizes`]), what the target allows and what the device can do; and how work
//! requests are named (`wr_id`) so a completion finds its slot without a lookup.

use crate::wire::QueueSizes;
use millrace_rdma::verbs::{DeviceAttr, QpCaps};

/// Bytes of a command capsule without data.
pub const SQE_BYTES: usize = 64;
/// Bytes of a response capsule.
pub const CQE_BYTES: usize = 16;

/// The resources of one queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuePlan {
    /// Receive buffers posted at once, one per submission queue entry.
    pub recv_slots: u32,
    /// Bytes of each receive buffer: a capsule plus the in-capsule data this queue takes.
    pub recv_bytes: usize,
    /// Command contexts: twice the receives, as a command's response may still be in flight
    /// after its receive was posted again and the host has sent the next command.
    pub cmd_slots: u32,
    /// In-capsule data the queue accepts (0 on admin queues, as Linux sends none there).
    pub in_capsule: usize,
    pub caps: QpCaps,
    pub cq_entries: u32,
    /// RDMA READs we keep outstanding (the host's responder resources, the device's limit).
    pub max_reads: u8,
}

/// Sizes a queue; `None` when the device cannot hold it (the connect is then rejected for lack
/// of resources). `in_capsule` is the target's in-capsule data for I/O queues.
pub fn plan(
    q: &QueueSizes,
    dev: &DeviceAttr,
    in_capsule: usize,
    host_responder_resources: u8,
) -> Option<QueuePlan> {
    let recv_slots = q.recv as u32;
    let cmd_slots = recv_slots.checked_mul(2)?;
    let in_capsule = if q.qid == 0 { 0 } else { in_capsule };
    // Per command: up to one RDMA READ or WRITE and one SEND on the send queue, plus one for
    // the drain at teardown.
    let send_wr = cmd_slots.checked_mul(2)?.checked_add(1)?;
    let recv_wr = recv_slots.checked_add(1)?;
    if send_wr > dev.max_qp_wr || recv_wr > dev.max_qp_wr {
        return None;
    }
    let cq_entries = send_wr.checked_add(recv_wr)?;
    if cq_entries > dev.max_cqe {
        return None;
    }
    let max_reads = host_responder_resources.min(dev.max_qp_init_rd_atom);
    if max_reads == 0 {
        return None;
    }
    Some(QueuePlan {
        recv_slots,
        recv_bytes: SQE_BYTES + in_capsule,
        cmd_slots,
        in_capsule,
        caps: QpCaps {
            max_send_wr: send_wr,
            max_recv_wr: recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        cq_entries,
        max_reads,
    })
}

/// What a work request was for, packed into its 64-bit `wr_id`: the kind in the top byte, the
/// slot (receive or command) below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// A receive into receive buffer N.
    Recv(u32),
    /// An RDMA READ of command N's data from the host.
    Read(u32),
    /// The response SEND of command N (its RDMA WRITE, if any, goes unsignaled before it).
    Send(u32),
}

const KIND_SHIFT: u32 = 56;

impl Work {
    pub fn wr_id(self) -> u64 {
        let (k, n) = match self {
            Work::Recv(n) => (1u64, n),
            Work::Read(n) => (2, n),
            Work::Send(n) => (3, n),
        };
        k << KIND_SHIFT | n as u64
    }
    /// The work a completion names, or None for an id this queue never posted.
    pub fn from_wr_id(id: u64) -> Option<Work> {
        let n = u32::try_from(id & ((1 << KIND_SHIFT) - 1)).ok()?;
        match id >> KIND_SHIFT {
            1 => Some(Work::Recv(n)),
            2 => Some(Work::Read(n)),
            3 => Some(Work::Send(n)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rxe() -> DeviceAttr {
        // What soft-RoCE reports (rdma-core 44, Linux 6.1).
        DeviceAttr {
            max_qp_wr: 1 << 20,
            max_sge: 32,
            max_cqe: (1 << 18) - 1,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_mr_size: u64::MAX,
        }
    }

    #[test]
    fn linux_host_queues_fit_and_admin_queues_take_no_in_capsule_data() {
        let admin = QueueSizes {
            qid: 0,
            recv: 32,
            send: 32,
        };
        let p = plan(&admin, &rxe(), 8192, 16).unwrap();
        assert_eq!((p.recv_slots, p.cmd_slots, p.in_capsule), (32, 64, 0));
        assert_eq!(p.recv_bytes, 64);
        assert_eq!(p.caps.max_send_wr, 129);
        assert_eq!(p.caps.max_recv_wr, 33);
        assert_eq!(p.cq_entries, 162);
        assert_eq!(p.max_reads, 16);
        let io = QueueSizes {
            qid: 1,
            recv: 128,
            send: 128,
        };
        let p = plan(&io, &rxe(), 8192, 255).unwrap();
        assert_eq!((p.recv_bytes, p.in_capsule), (64 + 8192, 8192));
        assert_eq!(p.max_reads, 128);
    }

    #[test]
    fn queues_beyond_the_device_or_without_read_credit_are_refused() {
        let io = QueueSizes {
            qid: 1,
            recv: 128,
            send: 128,
        };
        let small = DeviceAttr {
            max_qp_wr: 256,
            ..rxe()
        };
        assert!(plan(&io, &small, 8192, 16).is_none());
        let tiny_cq = DeviceAttr {
            max_cqe: 300,
            ..rxe()
        };
        assert!(plan(&io, &tiny_cq, 8192, 16).is_none());
        assert!(plan(&io, &rxe(), 8192, 0).is_none());
    }

    #[test]
    fn work_ids_round_trip_and_foreign_ids_are_not_ours() {
        for w in [
            Work::Recv(0),
            Work::Recv(127),
            Work::Read(255),
            Work::Send(u32::MAX),
        ] {
            assert_eq!(Work::from_wr_id(w.wr_id()), Some(w));
        }
        assert_eq!(Work::from_wr_id(0), None);
        assert_eq!(Work::from_wr_id(9 << 56), None);
    }
}
