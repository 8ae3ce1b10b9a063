//! The decision on a connect request, before any verbs resource exists for it: the private
//! data is read, the queue sizes checked against the target's limits, and the queue sized for
//! the device; a request that fails any of these is rejected with the NVMe/RDMA reason, so the
//! host's log says why (`nvme_rdma: Connect rejected: status N (reason)`).

use crate::sizing::{self, QueuePlan};
use crate::wire::{self, CmRequest, QueueLimits, QueueSizes, RejectReason};
use millrace_rdma::verbs::DeviceAttr;

/// What the transport knows when a connect request arrives.
#[derive(Clone, Copy, Debug)]
pub struct Offer<'a> {
    /// The host's private data as the CM delivered it (padded).
    pub private_data: &'a [u8],
    /// RDMA READs the host lets us have outstanding to it (its responder resources).
    pub host_responder_resources: u8,
}

/// An accepted queue: its sizes, its resources, and the private data of the accept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    pub request: CmRequest,
    pub sizes: QueueSizes,
    pub plan: QueuePlan,
    pub reply: [u8; wire::ACCEPT_LEN],
}

/// Accepts or rejects a connect request (no side effects: the caller acts on the answer).
pub fn decide(
    o: &Offer,
    limits: &QueueLimits,
    dev: &DeviceAttr,
    in_capsule: usize,
) -> Result<Accepted, RejectReason> {
    let request = CmRequest::decode(o.private_data)?;
    let sizes = wire::negotiate(&request, limits)?;
    if o.host_responder_resources == 0 {
        // We could never fetch a write's data (nor an admin Connect's) with RDMA READ.
        return Err(RejectReason::InvalidIrd);
    }
    let plan = sizing::plan(&sizes, dev, in_capsule, o.host_responder_resources)
        .ok_or(RejectReason::NoResources)?;
    Ok(Accepted {
        request,
        sizes,
        plan,
        reply: wire::accept_data(sizes.recv),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: QueueLimits = QueueLimits {
        admin_depth: 32,
        io_depth: 128,
        max_qid: 8,
    };
    const DEV: DeviceAttr = DeviceAttr {
        max_qp_wr: 16384,
        max_sge: 30,
        max_cqe: 65535,
        max_qp_rd_atom: 16,
        max_qp_init_rd_atom: 16,
        max_mr_size: u64::MAX,
    };

    fn offer(pd: &[u8], ird: u8) -> Offer<'_> {
        Offer {
            private_data: pd,
            host_responder_resources: ird,
        }
    }

    fn pd(qid: u16, hrq: u16, hsq: u16) -> Vec<u8> {
        let mut v = CmRequest {
            qid,
            hrqsize: hrq,
            hsqsize: hsq,
            cntlid: 0xffff,
        }
        .encode()
        .to_vec();
        v.resize(56, 0);
        v
    }

    #[test]
    fn an_admin_queue_is_accepted_with_its_receive_queue_size() {
        let a = decide(&offer(&pd(0, 32, 31), 16), &LIMITS, &DEV, 8192).unwrap();
        assert_eq!(a.sizes.recv, 32);
        assert_eq!(a.reply[2..4], 32u16.to_le_bytes());
        assert_eq!(a.plan.in_capsule, 0);
    }

    #[test]
    fn every_refusal_names_its_reason() {
        let d = |p: &[u8], ird| decide(&offer(p, ird), &LIMITS, &DEV, 8192).err();
        assert_eq!(d(&[], 16), Some(RejectReason::InvalidLength));
        let mut bad = pd(0, 32, 31);
        bad[1] = 1;
        assert_eq!(d(&bad, 16), Some(RejectReason::InvalidRecfmt));
        assert_eq!(d(&pd(9, 32, 31), 16), Some(RejectReason::InvalidQid));
        assert_eq!(d(&pd(0, 64, 63), 16), Some(RejectReason::InvalidHsqsize));
        assert_eq!(d(&pd(1, 8, 15), 16), Some(RejectReason::InvalidHrqsize));
        assert_eq!(d(&pd(1, 128, 127), 0), Some(RejectReason::InvalidIrd));
        let small = DeviceAttr {
            max_qp_wr: 64,
            ..DEV
        };
        assert_eq!(
            decide(&offer(&pd(1, 128, 127), 16), &LIMITS, &small, 8192).err(),
            Some(RejectReason::NoResources)
        );
    }
}
