//! Whatever bytes arrive, the PDU decoder answers "need more", a PDU, or a refusal: it never
//! panics, never claims more bytes than it was given, and never returns more data than the
//! connection allows.

use millrace_nvmf::cmd::{io, Sgl, Sqe};
use millrace_nvmf::pdu::{decode, encode, DataHdr, Head, Negotiated, Side};
use proptest::prelude::*;

fn neg(ic_done: bool, hdgst: bool, ddgst: bool, max_data: u32) -> Negotiated {
    if !ic_done {
        return Negotiated::initial();
    }
    Negotiated {
        ic_done,
        hdgst,
        ddgst,
        max_data,
    }
}

fn check(buf: &[u8], side: Side, n: &Negotiated) {
    if let Ok(Some((pdu, used))) = decode(buf, side, n) {
        assert!(used <= buf.len(), "claimed {used} of {} bytes", buf.len());
        assert!(pdu.data.len() as u64 <= n.max_data as u64 + 4096);
    }
}

/// Valid PDUs of several kinds, to mutate: random bytes alone rarely get past the first check.
fn valid(hd: bool, dd: bool) -> Vec<(Vec<u8>, Side)> {
    let mut w = Sqe::new(io::WRITE, 7, 1);
    w.set_lba_range(0, 2);
    w.set_sgl(Sgl::InCapsule {
        offset: 0,
        len: 8192,
    });
    let d = DataHdr {
        cccid: 7,
        ttag: 1,
        datao: 0,
        datal: 512,
        last: true,
        success: false,
    };
    vec![
        (
            encode(&Head::Cmd(w), &[0x5a; 8192], hd, dd, 1),
            Side::Controller,
        ),
        (
            encode(&Head::Cmd(Sqe::new(io::READ, 3, 1)), &[], hd, dd, 1),
            Side::Controller,
        ),
        (
            encode(&Head::H2CData(d), &[1; 512], hd, dd, 1),
            Side::Controller,
        ),
        (encode(&Head::C2HData(d), &[2; 512], hd, dd, 1), Side::Host),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(
        buf in proptest::collection::vec(any::<u8>(), 0..600),
        ic_done in any::<bool>(), hd in any::<bool>(), dd in any::<bool>(),
        max_data in 0u32..70_000,
    ) {
        let n = neg(ic_done, hd, dd, max_data);
        check(&buf, Side::Controller, &n);
        check(&buf, Side::Host, &n);
    }

    #[test]
    fn mutated_pdus_never_panic(
        which in 0usize..4, hd in any::<bool>(), dd in any::<bool>(),
        flips in proptest::collection::vec((0usize..9000, any::<u8>()), 1..6),
        cut in 0usize..9000, max_data in 0u32..70_000,
    ) {
        let (mut b, side) = valid(hd, dd).swap_remove(which);
        for (at, x) in flips {
            let i = at % b.len().min(80); // mostly the header, where lengths live
            b[i] ^= x;
        }
        b.truncate(cut.min(b.len()).max(1));
        let n = neg(true, hd, dd, max_data);
        check(&b, side, &n);
    }
}
