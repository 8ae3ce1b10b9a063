//! The reservation commands from the host's side, and the Reservation Report decoded, for
//! tests and tools that drive the target's reservations.

use super::{Error, HostQueue};
use crate::cmd::{io, Sqe};

/// One registrant as a Reservation Report (extended data structure) lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportedRegistrant {
    pub cntlid: u16,
    /// It holds the reservation.
    pub holds: bool,
    pub key: u64,
    pub hostid: [u8; 16],
}

/// A Reservation Report (extended data structure), decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservationReport {
    pub generation: u32,
    /// The reservation type held (0: none).
    pub rtype: u8,
    /// The number of registrants (the descriptors may be fewer, when the buffer was short).
    pub registrants_count: u16,
    pub ptpl: bool,
    pub registrants: Vec<ReportedRegistrant>,
}

impl ReservationReport {
    /// Decodes a report; None when it is shorter than its 64-byte header.
    pub fn decode(b: &[u8]) -> Option<ReservationReport> {
        let h = b.get(..64)?;
        let n = u16::from_le_bytes([h[5], h[6]]);
        let registrants = (b[64..].chunks_exact(64))
            .take(n as usize)
            .map(|e| ReportedRegistrant {
                cntlid: u16::from_le_bytes([e[0], e[1]]),
                holds: e[2] & 1 != 0,
                key: u64::from_le_bytes(e[8..16].try_into().unwrap()),
                hostid: e[16..32].try_into().unwrap(),
            })
            .collect();
        Some(ReservationReport {
            generation: u32::from_le_bytes(h[0..4].try_into().unwrap()),
            rtype: h[4],
            registrants_count: n,
            ptpl: h[9] & 1 != 0,
            registrants,
        })
    }
}

fn keys(a: u64, b: u64) -> Vec<u8> {
    let mut d = a.to_le_bytes().to_vec();
    d.extend_from_slice(&b.to_le_bytes());
    d
}

impl HostQueue {
    /// Reservation Register: `action` 0 register, 1 unregister, 2 replace; `cptpl` 0 no
    /// change, 2 clear, 3 set Persist Through Power Loss.
    pub async fn resv_register(
        &self,
        nsid: u32,
        action: u8,
        iekey: bool,
        cptpl: u8,
        crkey: u64,
        nrkey: u64,
    ) -> Result<(), Error> {
        let mut s = Sqe::new(io::RESERVATION_REGISTER, 0, nsid);
        s.set_cdw(
            10,
            u32::from(action & 7) | u32::from(iekey) << 3 | u32::from(cptpl & 3) << 30,
        );
        self.submit(s, Some(keys(crkey, nrkey)), 0)
            .await
            .map(|_| ())
    }

    /// Reservation Acquire: `action` 0 acquire, 1 preempt, 2 preempt and abort; `rtype` 1-6.
    pub async fn resv_acquire(
        &self,
        nsid: u32,
        action: u8,
        rtype: u8,
        crkey: u64,
        prkey: u64,
    ) -> Result<(), Error> {
        let mut s = Sqe::new(io::RESERVATION_ACQUIRE, 0, nsid);
        s.set_cdw(10, u32::from(action & 7) | u32::from(rtype) << 8);
        self.submit(s, Some(keys(crkey, prkey)), 0)
            .await
            .map(|_| ())
    }

    /// Reservation Release: `action` 0 release (of a reservation of type `rtype`), 1 clear.
    pub async fn resv_release(
        &self,
        nsid: u32,
        action: u8,
        rtype: u8,
        crkey: u64,
    ) -> Result<(), Error> {
        let mut s = Sqe::new(io::RESERVATION_RELEASE, 0, nsid);
        s.set_cdw(10, u32::from(action & 7) | u32::from(rtype) << 8);
        self.submit(s, Some(crkey.to_le_bytes().to_vec()), 0)
            .await
            .map(|_| ())
    }

    /// Reservation Report with the extended data structure, `len` bytes (a multiple of 4).
    pub async fn resv_report(&self, nsid: u32, len: usize) -> Result<ReservationReport, Error> {
        let mut s = Sqe::new(io::RESERVATION_REPORT, 0, nsid);
        s.set_cdw(10, (len / 4).max(1) as u32 - 1);
        s.set_cdw(11, 1);
        let c = self.submit(s, None, len).await?;
        ReservationReport::decode(&c.data)
            .ok_or_else(|| Error::Protocol("a reservation report shorter than its header".into()))
    }
}
