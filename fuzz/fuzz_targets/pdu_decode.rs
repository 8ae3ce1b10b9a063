//! The PDU decoder and the command decoders behind it, fed arbitrary bytes on both sides and in
//! every negotiation state. The first four bytes choose the receiver and the negotiation (byte 0:
//! 1 host side, 2 after the IC exchange, 4 header digests, 8 data digests; bytes 1-2 and 3: the
//! data limit, a u16 times 1 to 16); the rest is read as a stream of PDUs, the way a connection
//! would.

#![no_main]

use libfuzzer_sys::fuzz_target;
use millrace_nvmf::cmd::{self, fctype, io, ConnectData, DsmRange, Transfer};
use millrace_nvmf::pdu::{decode, encode, Head, Negotiated, Side};

/// The transfer limit the commands are checked against (the target's default MDTS).
const MAX_TRANSFER: usize = 1 << 20;

fn commands(sqe: &cmd::Sqe, icd: &[u8]) {
    match cmd::transfer(sqe, icd.len(), MAX_TRANSFER) {
        Ok(Transfer::InCapsule(r)) => {
            assert!(
                r.start <= r.end && r.end <= icd.len(),
                "{r:?} of {}",
                icd.len()
            );
            let data = &icd[r];
            if sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT {
                if let Ok(d) = ConnectData::decode(data) {
                    assert!(d.subnqn.len() <= cmd::NQN_MAX && d.hostnqn.len() <= cmd::NQN_MAX);
                }
            }
            if sqe.opcode() == io::DATASET_MANAGEMENT {
                for r in data.chunks_exact(DsmRange::LEN) {
                    let d = DsmRange::decode(r);
                    assert_eq!(DsmRange::decode(&d.encode()), d);
                }
            }
        }
        Ok(Transfer::FromHost(n) | Transfer::ToHost(n)) => assert!(n <= MAX_TRANSFER),
        Ok(Transfer::None) | Err(_) => {}
    }
    // A namespace of 2^20 blocks of 512 bytes up to 2^44 blocks of 64 KiB.
    for (blocks, shift) in [(1u64 << 20, 9u32), (1 << 44, 16)] {
        if let Ok((off, len)) = cmd::lba_range(sqe.slba(), sqe.nlb() as u64, blocks, shift) {
            assert!(off.checked_add(len).is_some_and(|e| e <= blocks << shift));
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((cfg, mut buf)) = input.split_first_chunk::<4>() else {
        return;
    };
    let side = if cfg[0] & 1 == 0 {
        Side::Controller
    } else {
        Side::Host
    };
    let hd = cfg[0] & 4 != 0;
    let dd = cfg[0] & 8 != 0;
    let mut neg = Negotiated {
        ic_done: cfg[0] & 2 != 0,
        hdgst: hd,
        ddgst: dd,
        max_data: u16::from_le_bytes([cfg[1], cfg[2]]) as u32 * (1 + cfg[3] as u32 % 16),
    };
    if !neg.ic_done {
        neg = Negotiated::initial();
    }
    loop {
        // A refusal ends the stream as it ends a connection; so does a data digest error here,
        // since decode then does not say where the next PDU starts.
        let Ok(Some((pdu, used))) = decode(buf, side, &neg) else {
            return;
        };
        assert!(
            used > 0 && used <= buf.len(),
            "claimed {used} of {} bytes",
            buf.len()
        );
        assert!(pdu.data.len() as u64 <= neg.max_data.max(128) as u64);
        if let Head::Cmd(sqe) = &pdu.head {
            commands(sqe, &pdu.data);
        }
        // What decodes, re-encoded, decodes to the same thing.
        let again = encode(&pdu.head, &pdu.data, neg.hdgst, neg.ddgst, 1);
        let (back, n) = decode(&again, side, &neg)
            .expect("a re-encoded PDU decodes")
            .expect("a re-encoded PDU is whole");
        assert_eq!((back, n), (pdu.clone(), again.len()));
        if matches!(pdu.head, Head::IcReq(_) | Head::IcResp(_)) {
            neg = Negotiated {
                ic_done: true,
                hdgst: hd,
                ddgst: dd,
                max_data: neg.max_data.max(4096),
            };
        }
        buf = &buf[used..];
    }
});
