//! Round trips and refusals of the PDU codec.

use super::*;
use crate::cmd::{io, Cqe, Sgl, Sqe, Status};

fn neg(hdgst: bool, ddgst: bool) -> Negotiated {
    Negotiated {
        ic_done: true,
        hdgst,
        ddgst,
        max_data: 1 << 20,
    }
}

fn round_trip(head: Head, data: &[u8], side: Side, hd: bool, dd: bool) {
    let b = encode(&head, data, hd, dd, 1);
    let n = if matches!(head, Head::IcReq(_) | Head::IcResp(_)) {
        Negotiated::initial()
    } else {
        neg(hd, dd)
    };
    let (p, used) = decode(&b, side, &n).unwrap().unwrap();
    assert_eq!(used, b.len());
    assert_eq!(p.head, head);
    assert_eq!(p.data, data);
    // Every strict prefix is "need more", never an error or a panic.
    for cut in 0..b.len() {
        assert_eq!(decode(&b[..cut], side, &n), Ok(None), "prefix {cut}");
    }
}

#[test]
fn every_pdu_type_round_trips_with_and_without_digests() {
    let ic = IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: true,
        ddgst: false,
        maxr2t: 0,
    };
    round_trip(Head::IcReq(ic), &[], Side::Controller, false, false);
    let icr = IcResp {
        pfv: 0,
        cpda: 0,
        hdgst: true,
        ddgst: true,
        maxh2cdata: 131072,
    };
    round_trip(Head::IcResp(icr), &[], Side::Host, false, false);
    for (hd, dd) in [(false, false), (true, false), (false, true), (true, true)] {
        let mut s = Sqe::new(io::WRITE, 9, 1);
        s.set_lba_range(4, 2);
        s.set_sgl(Sgl::InCapsule {
            offset: 0,
            len: 8192,
        });
        round_trip(Head::Cmd(s), &[0xab; 8192], Side::Controller, hd, dd);
        round_trip(
            Head::Cmd(Sqe::new(io::FLUSH, 1, 1)),
            &[],
            Side::Controller,
            hd,
            dd,
        );
        round_trip(
            Head::Resp(Cqe::new(9, Status::LBA_OUT_OF_RANGE, 5)),
            &[],
            Side::Host,
            hd,
            dd,
        );
        let d = DataHdr {
            cccid: 9,
            ttag: 3,
            datao: 4096,
            datal: 100,
            last: true,
            success: false,
        };
        round_trip(Head::H2CData(d), &[1; 100], Side::Controller, hd, dd);
        round_trip(
            Head::C2HData(DataHdr { success: true, ..d }),
            &[2; 100],
            Side::Host,
            hd,
            dd,
        );
        let r = R2t {
            cccid: 9,
            ttag: 3,
            r2to: 0,
            r2tl: 65536,
        };
        round_trip(Head::R2t(r), &[], Side::Host, hd, dd);
        for h2c in [true, false] {
            let t = Head::TermReq {
                h2c,
                fes: fes::HEADER_DIGEST_ERROR,
                fei: 0,
            };
            let side = if h2c { Side::Controller } else { Side::Host };
            round_trip(t, &[7; 24], side, hd, dd);
        }
    }
}

/// Found by the pdu_decode fuzzer: an H2CData with the SUCCESS bit set (reserved there)
/// decoded as "success" but encoded without it, so the PDU did not survive a round trip.
#[test]
fn the_success_bit_of_an_h2c_data_pdu_is_reserved_and_ignored() {
    let d = DataHdr {
        cccid: 3,
        ttag: 3,
        datao: 8192,
        datal: 16,
        last: false,
        success: false,
    };
    let mut b = encode(&Head::H2CData(d), &[7; 16], false, false, 1);
    b[1] |= flags::DATA_SUCCESS;
    let (p, used) = decode(&b, Side::Controller, &neg(false, false))
        .unwrap()
        .unwrap();
    assert_eq!(used, b.len());
    assert_eq!(p.head, Head::H2CData(d));
    let again = encode(&p.head, &p.data, false, false, 1);
    let (back, _) = decode(&again, Side::Controller, &neg(false, false))
        .unwrap()
        .unwrap();
    assert_eq!(back, p);
}

#[test]
fn data_is_placed_at_the_receivers_alignment() {
    let d = DataHdr {
        cccid: 1,
        ttag: 0,
        datao: 0,
        datal: 10,
        last: true,
        success: false,
    };
    let b = encode(&Head::C2HData(d), &[5; 10], true, false, 32);
    assert_eq!(b[3], 32);
    let (p, _) = decode(&b, Side::Host, &neg(true, false)).unwrap().unwrap();
    assert_eq!(p.data, vec![5; 10]);
}

#[test]
fn bad_digests_are_refused() {
    let s = Sqe::new(io::WRITE, 9, 1);
    let mut b = encode(&Head::Cmd(s), &[3; 64], true, true, 1);
    let n = neg(true, true);
    b[20] ^= 1; // inside the SQE
    assert_eq!(
        decode(&b, Side::Controller, &n),
        Err(PduError::HeaderDigest)
    );
    b[20] ^= 1;
    let last = b.len() - 10;
    b[last] ^= 1; // inside the data
    assert_eq!(decode(&b, Side::Controller, &n), Err(PduError::DataDigest));
}

#[test]
fn refusals() {
    let n = neg(false, false);
    let s = Sqe::new(io::READ, 1, 1);
    let good = encode(&Head::Cmd(s), &[], false, false, 1);
    // Unknown type, wrong direction, wrong HLEN, PLEN shorter than the header.
    let mut b = good.clone();
    b[0] = 0x42;
    assert_eq!(
        decode(&b, Side::Controller, &n),
        Err(PduError::InvalidField(0))
    );
    assert_eq!(
        decode(&good, Side::Host, &n),
        Err(PduError::InvalidField(0))
    );
    let mut b = good.clone();
    b[2] = 71;
    assert_eq!(
        decode(&b, Side::Controller, &n),
        Err(PduError::InvalidField(2))
    );
    let mut b = good.clone();
    b[4..8].copy_from_slice(&10u32.to_le_bytes());
    assert_eq!(
        decode(&b, Side::Controller, &n),
        Err(PduError::InvalidField(4))
    );
    // Digest flags that disagree with the negotiation.
    assert_eq!(
        decode(&good, Side::Controller, &neg(true, false)),
        Err(PduError::InvalidField(1))
    );
    // Huge PLEN is refused from the header alone, before anything is read or allocated.
    let mut b = good.clone();
    b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    b[3] = CMD_HLEN as u8;
    assert_eq!(
        decode(&b[..CH_LEN], Side::Controller, &n),
        Err(PduError::TooLarge(u32::MAX as u64 - CMD_HLEN as u64))
    );
    // PDO inside the header.
    let mut b = encode(&Head::Cmd(s), &[1; 16], false, false, 1);
    b[3] = 8;
    assert_eq!(
        decode(&b, Side::Controller, &n),
        Err(PduError::InvalidField(3))
    );
    // DATAL that disagrees with PLEN.
    let d = DataHdr {
        cccid: 1,
        ttag: 1,
        datao: 0,
        datal: 16,
        last: true,
        success: false,
    };
    let mut b = encode(&Head::H2CData(d), &[1; 16], false, false, 1);
    b[16] = 17;
    assert_eq!(
        decode(&b, Side::Controller, &n),
        Err(PduError::InvalidField(16))
    );
    // An ICReq after the exchange, a command before it.
    let ic = encode(
        &Head::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: false,
            ddgst: false,
            maxr2t: 0,
        }),
        &[],
        false,
        false,
        1,
    );
    assert_eq!(
        decode(&ic, Side::Controller, &n),
        Err(PduError::Sequence(0))
    );
    assert_eq!(
        decode(&good, Side::Controller, &Negotiated::initial()),
        Err(PduError::Sequence(4))
    );
    // A non-zero PDU format version.
    let mut b = ic.clone();
    b[8] = 1;
    assert_eq!(
        decode(&b, Side::Controller, &Negotiated::initial()),
        Err(PduError::InvalidField(8))
    );
    // A data PDU without data; a response with data.
    let mut b = encode(&Head::H2CData(d), &[1; 16], false, false, 1);
    b[4..8].copy_from_slice(&24u32.to_le_bytes());
    assert_eq!(
        decode(&b, Side::Controller, &n),
        Err(PduError::InvalidField(4))
    );
    let mut b = encode(&Head::Resp(Cqe::default()), &[], false, false, 1);
    b[4..8].copy_from_slice(&40u32.to_le_bytes());
    b.resize(40, 0);
    assert_eq!(decode(&b, Side::Host, &n), Err(PduError::InvalidField(4)));
}
