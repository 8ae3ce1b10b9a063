//! Writes seed inputs for the fuzz targets in the top-level `fuzz/` (valid PDU streams that the
//! fuzzer then mutates: random bytes alone rarely get past a PDU header's length checks).
//!
//! `cargo run -p millrace-nvmf --example nvmf_fuzz_seeds -- fuzz/corpus` (fuzz/seed.sh runs it)
//! writes `<dir>/pdu_decode/*` and `<dir>/conn_session/*`. The first bytes of each seed are the
//! harness's own choices; the fuzz targets describe them.

use millrace_nvmf::cmd::{admin, fctype, io, prop, Cqe, DsmRange, Sgl, Sqe, Status};
use millrace_nvmf::initiator::{connect_data, HostOptions};
use millrace_nvmf::pdu::{encode, fes, DataHdr, Head, IcReq, IcResp, R2t};
use std::path::Path;

const NQN: &str = "nqn.2024-01.io.millrace:fuzz";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000f022";

fn ic_req(hd: bool, dd: bool) -> Vec<u8> {
    let r = IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: hd,
        ddgst: dd,
        maxr2t: 0,
    };
    encode(&Head::IcReq(r), &[], false, false, 1)
}

fn connect(qid: u16, cntlid: u16, hd: bool, dd: bool) -> Vec<u8> {
    let o = HostOptions {
        hostnqn: HOST.into(),
        ..Default::default()
    };
    let mut s = Sqe::fabrics(fctype::CONNECT, 1);
    s.set_connect(qid, 15, 0);
    s.set_sgl(Sgl::InCapsule {
        offset: 0,
        len: 1024,
    });
    encode(&Head::Cmd(s), &connect_data(&o, NQN, cntlid), hd, dd, 1)
}

fn cmd(s: Sqe, icd: &[u8], hd: bool, dd: bool) -> Vec<u8> {
    let mut s = s;
    if s.sgl() == (Sgl::Other { id: 0 }) {
        s.set_sgl(Sgl::InCapsule {
            offset: 0,
            len: icd.len() as u32,
        });
    }
    encode(&Head::Cmd(s), icd, hd, dd, 1)
}

fn with_sgl(mut s: Sqe, sgl: Sgl) -> Sqe {
    s.set_sgl(sgl);
    s
}

fn rw(op: u8, cid: u16, slba: u64, blocks: u32) -> Sqe {
    let mut s = Sqe::new(op, cid, 1);
    s.set_lba_range(slba, blocks);
    s
}

/// Admin traffic after Connect: enable, identify, log pages, features, events, keep-alive.
fn admin_session(hd: bool, dd: bool) -> Vec<u8> {
    let mut b = Vec::new();
    let mut p = Sqe::fabrics(fctype::PROPERTY_SET, 2);
    p.set_prop(false, prop::CC, 1 | 6 << 16 | 4 << 20);
    b.extend(cmd(p, &[], hd, dd));
    let mut g = Sqe::fabrics(fctype::PROPERTY_GET, 3);
    g.set_prop(true, prop::CAP, 0);
    b.extend(cmd(g, &[], hd, dd));
    let mut id = Sqe::new(admin::IDENTIFY, 4, 0);
    id.set_cdw(10, 1);
    b.extend(cmd(with_sgl(id, Sgl::Transport { len: 4096 }), &[], hd, dd));
    let mut lp = Sqe::new(admin::GET_LOG_PAGE, 5, u32::MAX);
    lp.set_cdw(10, 0x02 | 127 << 16);
    b.extend(cmd(with_sgl(lp, Sgl::Transport { len: 512 }), &[], hd, dd));
    let mut sf = Sqe::new(admin::SET_FEATURES, 6, 0);
    sf.set_cdw(10, 0x07);
    sf.set_cdw(11, 3 | 3 << 16);
    b.extend(cmd(sf, &[], hd, dd));
    b.extend(cmd(Sqe::new(admin::ASYNC_EVENT_REQUEST, 7, 0), &[], hd, dd));
    b.extend(cmd(Sqe::new(admin::KEEP_ALIVE, 8, 0), &[], hd, dd));
    b.extend(cmd(Sqe::fabrics(fctype::DISCONNECT, 9), &[], hd, dd));
    b
}

/// I/O traffic after Connect: writes in the capsule and after an R2T, reads, flush, write
/// zeroes, deallocate, and a read past the end.
fn io_session(hd: bool, dd: bool) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(cmd(rw(io::WRITE, 2, 0, 1), &[0xa5; 4096], hd, dd));
    let big = 16384u32;
    b.extend(cmd(
        with_sgl(rw(io::WRITE, 3, 8, 4), Sgl::Transport { len: big }),
        &[],
        hd,
        dd,
    ));
    for (i, chunk) in [0u32, 8192].into_iter().enumerate() {
        let d = DataHdr {
            cccid: 3,
            ttag: 3,
            datao: chunk,
            datal: 8192,
            last: i == 1,
            success: false,
        };
        b.extend(encode(&Head::H2CData(d), &[0x3c; 8192], hd, dd, 1));
    }
    b.extend(cmd(
        with_sgl(rw(io::READ, 4, 0, 2), Sgl::Transport { len: 8192 }),
        &[],
        hd,
        dd,
    ));
    b.extend(cmd(Sqe::new(io::FLUSH, 5, 1), &[], hd, dd));
    b.extend(cmd(rw(io::WRITE_ZEROES, 6, 16, 8), &[], hd, dd));
    let mut dsm = Sqe::new(io::DATASET_MANAGEMENT, 7, 1);
    dsm.set_cdw(11, 1 << 2);
    let r = DsmRange {
        attributes: 0,
        blocks: 4,
        slba: 20,
    };
    b.extend(cmd(dsm, &r.encode(), hd, dd));
    b.extend(cmd(
        with_sgl(rw(io::READ, 8, 255, 2), Sgl::Transport { len: 8192 }),
        &[],
        hd,
        dd,
    ));
    b
}

/// A reservation command: `op`, CDW10 and CDW11, its data in the capsule.
fn resv(op: u8, cid: u16, c10: u32, c11: u32, data: &[u8], hd: bool, dd: bool) -> Vec<u8> {
    let mut s = Sqe::new(op, cid, 1);
    s.set_cdw(10, c10);
    s.set_cdw(11, c11);
    cmd(s, data, hd, dd)
}

fn keys(a: u64, b: u64) -> Vec<u8> {
    [a.to_le_bytes(), b.to_le_bytes()].concat()
}

/// Reservations on an I/O queue: register (asking for persistence), replace with its data
/// after an R2T, acquire, a write under it, a report, preempt and abort, release, clear; then
/// malformed ones (`resv_malformed`).
fn resv_session(hd: bool, dd: bool) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(resv(
        io::RESERVATION_REGISTER,
        2,
        3 << 30,
        0,
        &keys(0, 0xa),
        hd,
        dd,
    ));
    let mut replace = with_sgl(
        Sqe::new(io::RESERVATION_REGISTER, 3, 1),
        Sgl::Transport { len: 16 },
    );
    replace.set_cdw(10, 2);
    b.extend(cmd(replace, &[], hd, dd));
    let d = DataHdr {
        cccid: 3,
        ttag: 3,
        datao: 0,
        datal: 16,
        last: true,
        success: false,
    };
    b.extend(encode(&Head::H2CData(d), &keys(0xa, 0xb), hd, dd, 1));
    b.extend(resv(
        io::RESERVATION_ACQUIRE,
        4,
        2 << 8,
        0,
        &keys(0xb, 0),
        hd,
        dd,
    ));
    b.extend(cmd(rw(io::WRITE, 5, 0, 1), &[0x5a; 4096], hd, dd));
    let mut report = Sqe::new(io::RESERVATION_REPORT, 6, 1);
    report.set_cdw(10, 1023);
    report.set_cdw(11, 1);
    b.extend(cmd(
        with_sgl(report, Sgl::Transport { len: 4096 }),
        &[],
        hd,
        dd,
    ));
    b.extend(resv(
        io::RESERVATION_ACQUIRE,
        7,
        2 | 6 << 8,
        0,
        &keys(0xb, 0),
        hd,
        dd,
    ));
    b.extend(resv(
        io::RESERVATION_RELEASE,
        8,
        6 << 8,
        0,
        &0xbu64.to_le_bytes(),
        hd,
        dd,
    ));
    b.extend(resv(
        io::RESERVATION_RELEASE,
        9,
        1,
        0,
        &0xbu64.to_le_bytes(),
        hd,
        dd,
    ));
    b.extend(resv_malformed(hd, dd));
    b
}

/// A short key, a reserved type, a report without the extended structure, a report asking for
/// more than its buffer.
fn resv_malformed(hd: bool, dd: bool) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(resv(io::RESERVATION_REGISTER, 10, 0, 0, &[1; 8], hd, dd));
    b.extend(resv(
        io::RESERVATION_ACQUIRE,
        11,
        9 << 8,
        0,
        &keys(1, 2),
        hd,
        dd,
    ));
    let mut report = Sqe::new(io::RESERVATION_REPORT, 12, 1);
    report.set_cdw(10, 15);
    b.extend(cmd(
        with_sgl(report, Sgl::Transport { len: 64 }),
        &[],
        hd,
        dd,
    ));
    report.set_cdw(10, u32::MAX);
    report.set_cdw(11, 1);
    report.set_cid(13);
    b.extend(cmd(
        with_sgl(report, Sgl::Transport { len: 64 }),
        &[],
        hd,
        dd,
    ));
    b
}

/// The reservation side of the admin queue: the notification log, the masks, persistence and
/// the host identifier.
fn resv_admin_session(hd: bool, dd: bool) -> Vec<u8> {
    let mut b = Vec::new();
    let mut lp = Sqe::new(admin::GET_LOG_PAGE, 2, u32::MAX);
    lp.set_cdw(10, 0x80 | 15 << 16);
    b.extend(cmd(with_sgl(lp, Sgl::Transport { len: 64 }), &[], hd, dd));
    for (cid, op, fid, nsid, v) in [
        (3, admin::SET_FEATURES, 0x82, u32::MAX, 0b1110),
        (4, admin::SET_FEATURES, 0x83, 1, 1),
        (5, admin::GET_FEATURES, 0x83, 1, 0),
        (6, admin::GET_FEATURES, 0x82, 7, 0),
    ] {
        let mut s = Sqe::new(op, cid, nsid);
        s.set_cdw(10, fid);
        s.set_cdw(11, v);
        b.extend(cmd(s, &[], hd, dd));
    }
    let mut hid = Sqe::new(admin::GET_FEATURES, 7, 0);
    hid.set_cdw(10, 0x81);
    hid.set_cdw(11, 1);
    b.extend(cmd(with_sgl(hid, Sgl::Transport { len: 16 }), &[], hd, dd));
    b
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(name), bytes)
}

fn main() -> std::io::Result<()> {
    let root = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "fuzz/corpus".into());

    // pdu_decode: [flags: 1 host side, 2 after IC, 4 hdgst, 8 ddgst][max_data u16][multiplier].
    let d = root.join("pdu_decode");
    for (hd, dd) in [(false, false), (true, true)] {
        let f = (hd as u8) << 2 | (dd as u8) << 3;
        let cfg = |extra: u8| [f | extra, 0x00, 0x20, 7];
        let mut s = cfg(0).to_vec();
        s.extend(ic_req(hd, dd));
        s.extend(connect(0, 0xffff, hd, dd));
        write(&d, &format!("ic_connect_{hd}_{dd}"), &s)?;
        let mut s = cfg(2).to_vec();
        s.extend(io_session(hd, dd));
        write(&d, &format!("io_{hd}_{dd}"), &s)?;
        let mut s = cfg(1).to_vec();
        let r = IcResp {
            pfv: 0,
            cpda: 0,
            hdgst: hd,
            ddgst: dd,
            maxh2cdata: 131072,
        };
        s.extend(encode(&Head::IcResp(r), &[], false, false, 1));
        s.extend(encode(
            &Head::Resp(Cqe::new(1, Status::SUCCESS, 1)),
            &[],
            hd,
            dd,
            1,
        ));
        let dh = DataHdr {
            cccid: 2,
            ttag: 0,
            datao: 0,
            datal: 4096,
            last: true,
            success: true,
        };
        s.extend(encode(&Head::C2HData(dh), &[7; 4096], hd, dd, 1));
        let r2t = R2t {
            cccid: 3,
            ttag: 3,
            r2to: 0,
            r2tl: 65536,
        };
        s.extend(encode(&Head::R2t(r2t), &[], hd, dd, 1));
        let t = Head::TermReq {
            h2c: false,
            fes: fes::PDU_SEQUENCE_ERROR,
            fei: 0,
        };
        s.extend(encode(&t, &[0; 24], hd, dd, 1));
        write(&d, &format!("host_{hd}_{dd}"), &s)?;
    }

    // conn_session: [mode: 1 ICReq, 2 hdgst, 4 ddgst, 8 fix digests, bits 4-6 the Connect].
    let d = root.join("conn_session");
    let mut raw = ic_req(false, false);
    raw.extend(connect(0, 0xffff, false, false));
    raw.extend(admin_session(false, false));
    write(&d, "raw_admin", &[&[0u8][..], &raw].concat())?;
    for (hd, dd) in [(false, false), (true, false), (true, true)] {
        let digests = (hd as u8) << 1 | (dd as u8) << 2 | 8;
        let admin_mode = 1 | digests | 1 << 4;
        let s = [&[admin_mode][..], &admin_session(hd, dd)].concat();
        write(&d, &format!("admin_{hd}_{dd}"), &s)?;
        let io_mode = 1 | digests | 3 << 4;
        let s = [&[io_mode][..], &io_session(hd, dd)].concat();
        write(&d, &format!("io_{hd}_{dd}"), &s)?;
        let s = [&[io_mode][..], &resv_session(hd, dd)].concat();
        write(&d, &format!("resv_{hd}_{dd}"), &s)?;
        let s = [&[admin_mode][..], &resv_admin_session(hd, dd)].concat();
        write(&d, &format!("resv_admin_{hd}_{dd}"), &s)?;
    }
    for (name, variant) in [
        ("unknown_nqn", 5u8),
        ("host_not_allowed", 6),
        ("bad_cntlid", 7),
    ] {
        let s = [&[1 | 8 | variant << 4][..], &admin_session(false, false)].concat();
        write(&d, name, &s)?;
    }
    println!("seeds written under {}", root.display());
    Ok(())
}
