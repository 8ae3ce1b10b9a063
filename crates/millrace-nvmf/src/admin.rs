//! Admin commands and the data structures they return: properties, Identify, log pages and
//! features. Offsets follow the NVMe base specification (2.0 numbering of the same 1.4 fields)
//! and the NVMe over Fabrics specification.

use crate::ana;
use crate::cmd::{admin, prop, Sqe, Status};
use crate::model::{Controller, Inner, Ns, Transport, TransportInfo, AERL, DISCOVERY_NQN};
use crate::resv_commands;
use crate::tls::TlsMode;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

/// The NVMe version this target reports: 1.3 (namespace descriptors, no command set profiles).
pub const NVME_VERSION: u32 = 0x0001_0300;
/// Firmware revision reported in Identify and the firmware slot log (8 ASCII bytes).
pub const FIRMWARE: &str = concat!("MR", env!("CARGO_PKG_VERSION"));
/// Error log entries, zero-based.
const ELPE: u8 = 0;
/// Keep-alive granularity reported (KAS), in units of 100 ms.
const KAS: u16 = 10;
/// The most bytes one Dataset Management (deallocate) command should cover, as DMRSL and DMSL
/// tell hosts. A volume on a parity array deallocates by writing zeroes through the array, so a
/// command's time grows with its size; with no limit Linux sends a whole device in one command,
/// which outlives the host's I/O timeout (30 s) on any large volume, and the host then resets
/// the controller and sends it again, for ever. Counted in 4 KiB blocks, so a namespace of
/// 512-byte blocks gets an eighth of it.
pub const MAX_DEALLOCATE_BYTES: u64 = 16 << 20;

pub(crate) struct Ctx<'a> {
    pub t: &'a Inner,
    pub ctrl: &'a Controller,
    /// This connection's local address (the discovery log names it when listening on any).
    pub local: Option<SocketAddr>,
    /// What carries the queue: Identify reports its SGL support and capsule sizes.
    pub transport: TransportInfo,
}

pub(crate) struct Reply {
    pub status: Status,
    pub result: u64,
    pub data: Option<Vec<u8>>,
}

fn ok(result: u64) -> Reply {
    Reply {
        status: Status::SUCCESS,
        result,
        data: None,
    }
}
fn err(status: Status) -> Reply {
    Reply {
        status,
        result: 0,
        data: None,
    }
}
fn with_data(d: Vec<u8>) -> Reply {
    Reply {
        status: Status::SUCCESS,
        result: 0,
        data: Some(d),
    }
}

/// CAP: queue size, contiguous queues required, a 7.5 s ready timeout, NVM command set,
/// 4 KiB memory pages.
pub(crate) fn cap(t: &Inner) -> u64 {
    let mqes = (t.cfg.max_queue_depth.max(2) - 1) as u64;
    mqes | 1 << 16 | 15 << 24 | 1 << 37
}

pub(crate) fn property(t: &Inner, c: &Controller, sqe: &Sqe) -> (Status, u64) {
    let set = sqe.fctype() == crate::cmd::fctype::PROPERTY_SET;
    let off = sqe.prop_offset();
    if !set {
        let regs = c.regs.lock();
        return match off {
            prop::CAP => (Status::SUCCESS, cap(t)),
            prop::VS => (Status::SUCCESS, NVME_VERSION as u64),
            prop::CC => (Status::SUCCESS, regs.cc as u64),
            prop::CSTS => (Status::SUCCESS, regs.csts as u64),
            _ => (Status::INVALID_FIELD, 0),
        };
    }
    if off != prop::CC {
        return (Status::INVALID_FIELD, 0);
    }
    let v = sqe.prop_value() as u32;
    let mut r = c.regs.lock();
    let was = r.cc & 1 != 0;
    let en = v & 1 != 0;
    r.cc = v;
    if en && !was {
        r.csts |= 1;
        c.enabled.store(true, Ordering::Relaxed);
    } else if !en && was {
        // A controller reset: not ready, shutdown state cleared.
        r.csts = 0;
        c.enabled.store(false, Ordering::Relaxed);
    }
    // Shutdown notification: nothing is cached here beyond the devices' own flush, which the
    // host issues before; report shutdown complete at once.
    if (v >> 14) & 3 != 0 {
        r.csts = (r.csts & !0xc) | (2 << 2);
    } else {
        r.csts &= !0xc;
    }
    (Status::SUCCESS, 0)
}

pub(crate) fn execute(x: &Ctx, sqe: &Sqe, _data: Option<&[u8]>) -> Reply {
    match sqe.opcode() {
        admin::IDENTIFY => identify(x, sqe),
        admin::GET_LOG_PAGE => get_log_page(x, sqe),
        admin::SET_FEATURES => set_features(x, sqe),
        admin::GET_FEATURES => get_features(x, sqe),
        admin::KEEP_ALIVE => ok(0),
        // Commands finish quickly here; report "not aborted" (bit 0 of DW0).
        admin::ABORT => ok(1),
        _ => err(Status::INVALID_OPCODE),
    }
}

fn put_str(b: &mut [u8], s: &str) {
    // ASCII fields are space-padded, never NUL-terminated.
    b.fill(b' ');
    for (d, c) in b.iter_mut().zip(s.bytes()) {
        *d = if c.is_ascii_graphic() || c == b' ' {
            c
        } else {
            b'?'
        };
    }
}
fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn put128(b: &mut [u8], at: usize, v: u128) {
    b[at..at + 16].copy_from_slice(&v.to_le_bytes());
}
fn put_nqn(b: &mut [u8], nqn: &str) {
    let n = nqn.len().min(b.len() - 1);
    b[..n].copy_from_slice(&nqn.as_bytes()[..n]);
}

/// MDTS: the largest transfer as a power of two of 4 KiB pages.
fn mdts(t: &Inner) -> u8 {
    let pages = ((t.max_transfer() / 4096) as u32).max(1);
    (31 - pages.leading_zeros()) as u8
}

pub(crate) fn identify_controller(x: &Ctx) -> Vec<u8> {
    let t = x.t;
    let s = &x.ctrl.subsys;
    let mut b = vec![0u8; 4096];
    // PCI vendor ids stay zero: Millrace is not a PCI device.
    put_str(&mut b[4..24], &s.serial);
    put_str(&mut b[24..64], &s.model);
    put_str(&mut b[64..72], FIRMWARE);
    b[72] = 6; // recommended arbitration burst
    if !s.discovery {
        // CMIC: multiple controllers may share the subsystem (several hosts or paths), and
        // ANA reporting.
        b[76] = 1 << 1 | 1 << 3;
    }
    b[77] = mdts(t);
    put16(&mut b, 78, x.ctrl.cntlid);
    put32(&mut b, 80, NVME_VERSION);
    put32(&mut b, 96, 1); // CTRATT: 128-bit host identifiers (Connect's HOSTID)
    if s.discovery {
        put32(&mut b, 92, 1 << 31); // OAES: discovery log change notices
    } else {
        put32(&mut b, 92, 1 << 8 | 1 << 11); // OAES: namespace attribute and ANA change notices
    }
    b[111] = if s.discovery { 2 } else { 1 }; // CNTRLTYPE
    b[258] = 3; // ACL, zero-based
    b[259] = AERL;
    b[260] = 1 << 1 | 1; // one firmware slot, read-only
    b[261] = 1 << 2; // LPA: extended data for Get Log Page (NUMDU, offsets)
    b[262] = ELPE;
    put16(&mut b, 266, 0x157); // WCTEMP 343 K
    put16(&mut b, 268, 0x175); // CCTEMP 373 K
    put16(&mut b, 320, KAS);
    if !s.discovery {
        b[342] = ana::ANATT;
        b[343] = ana::ANACAP;
        put32(&mut b, 344, ana::ANA_GROUP_MAX); // ANAGRPMAX
        put32(&mut b, 348, ana::ANA_GROUP_MAX); // NANAGRPID
    }
    b[512] = 0x66; // SQES: 64-byte entries
    b[513] = 0x44; // CQES: 16-byte entries
    put16(&mut b, 514, t.cfg.max_queue_depth);
    if !s.discovery {
        // NN: the largest namespace id the subsystem could hold.
        put32(&mut b, 516, 1024);
        // ONCS: Dataset Management, Write Zeroes, reservations.
        put16(&mut b, 520, 1 << 2 | 1 << 3 | 1 << 5);
        b[525] = 1; // VWC: a volatile write cache, so hosts send Flush
        put32(&mut b, 540, 1024); // MNAN
    }
    // SGLS: SGLs supported, any alignment; address as offset (in-capsule data). Over RDMA
    // also keyed SGL data blocks (the host's memory by key), which the Linux host requires.
    let keyed = if x.transport.kind == Transport::Rdma {
        1 << 2
    } else {
        0
    };
    put32(&mut b, 536, 1 | keyed | 1 << 20);
    put_nqn(&mut b[768..1024], &s.nqn);
    let icd = if x.ctrl.subsys.discovery {
        0
    } else {
        x.transport.in_capsule
    };
    put32(&mut b, 1792, (64 + icd) / 16); // IOCCSZ
    put32(&mut b, 1796, 1); // IORCSZ
    put16(&mut b, 1800, 0); // ICDOFF
    b[1802] = 0; // FCATT: dynamic controller model
    b[1803] = 1; // MSDBD
    put16(&mut b, 1804, 1); // OFCS: Disconnect supported
                            // Power state 0: 0 W reported (a network target has no power states to manage).
    b
}

pub(crate) fn identify_namespace(ns: &Ns) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    put64(&mut b, 0, ns.blocks); // NSZE
    put64(&mut b, 8, ns.blocks); // NCAP
    put64(&mut b, 16, ns.blocks); // NUSE
    let mut nsfeat = 0u8;
    if ns.pref_blocks > 0 {
        nsfeat |= 1 << 4; // OPTPERF: NPWG, NPWA, NPDG, NPDA, NOWS are valid
    }
    b[24] = nsfeat;
    b[25] = 0; // NLBAF: one format
    b[26] = 0; // FLBAS: format 0
    b[30] = 1; // NMIC: may be shared by several controllers
    b[31] = resv_commands::RESCAP; // PTPL added by Identify where reservations are recorded
    b[33] = 1; // DLFEAT: deallocated blocks read as zeroes
    if ns.pref_blocks > 0 {
        // As md reports io_min and io_opt: writes of a strip, aligned to one, are the
        // granularity (Linux takes io_min from NPWG), and a full stripe is the optimal size
        // (io_opt from NOWS), so mkfs.xfs takes su = strip and sw = data drives.
        let g = (ns.pref_blocks.min(65536) - 1) as u16;
        let m = (ns.min_blocks.clamp(1, 65536) - 1) as u16;
        put16(&mut b, 64, m); // NPWG
        put16(&mut b, 66, m); // NPWA
        put16(&mut b, 68, g); // NPDG
        put16(&mut b, 70, g); // NPDA
        put16(&mut b, 72, g); // NOWS
                              // NOIOB: hosts split I/O at this boundary; only a power of two makes a good one.
        if ns.pref_blocks.is_power_of_two() && ns.pref_blocks <= 65535 {
            put16(&mut b, 46, ns.pref_blocks as u16);
        }
    }
    put128(&mut b, 48, (ns.blocks as u128) << ns.lba_shift); // NVMCAP
    put32(&mut b, 92, ns.ana_group); // ANAGRPID
    b[104..120].copy_from_slice(&ns.nguid);
    // LBA format 0: no metadata, LBADS, best relative performance.
    put32(&mut b, 128, ns.lba_shift << 16);
    b
}

fn ns_descriptors(ns: &Ns) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    let mut at = 0;
    if ns.nguid != [0; 16] {
        b[at] = 2;
        b[at + 1] = 16;
        b[at + 4..at + 20].copy_from_slice(&ns.nguid);
        at += 20;
    }
    if ns.uuid != [0; 16] {
        b[at] = 3;
        b[at + 1] = 16;
        b[at + 4..at + 20].copy_from_slice(&ns.uuid);
        at += 20;
    }
    // Command set identifier: NVM.
    b[at] = 4;
    b[at + 1] = 1;
    b[at + 4] = 0;
    b
}

/// I/O command set specific controller data for NVM (CNS 06h): the deallocate limits. Write
/// Zeroes (WZSL zero) is bounded by MDTS, as Linux assumes.
pub(crate) fn identify_controller_nvm() -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    let blocks = MAX_DEALLOCATE_BYTES >> 12;
    put32(&mut b, 4, blocks as u32); // DMRSL: blocks in one range
    put64(&mut b, 8, blocks); // DMSL: blocks in all ranges of one command
    b
}

fn identify(x: &Ctx, sqe: &Sqe) -> Reply {
    let cns = sqe.cdw(10) & 0xff;
    let csi = sqe.cdw(11) >> 24;
    let s = &x.ctrl.subsys;
    let nsid = sqe.nsid();
    match cns {
        0x00 => match s.ns(nsid) {
            Some(ns) => {
                let mut b = identify_namespace(&ns);
                b[31] |= resv_commands::ptpl_capable(x.t) as u8;
                with_data(b)
            }
            // An inactive id inside the supported range reads as zeroes.
            None if nsid != 0 && nsid <= 1024 && !s.discovery => with_data(vec![0; 4096]),
            None => err(Status::INVALID_NAMESPACE),
        },
        0x01 => with_data(identify_controller(x)),
        0x02 => {
            if nsid >= 0xffff_fffe {
                return err(Status::INVALID_NAMESPACE);
            }
            let mut b = vec![0u8; 4096];
            for (i, ns) in s
                .namespaces
                .load()
                .iter()
                .filter(|n| n.nsid > nsid)
                .take(1024)
                .enumerate()
            {
                put32(&mut b, i * 4, ns.nsid);
            }
            with_data(b)
        }
        0x03 => match s.ns(nsid) {
            Some(ns) => with_data(ns_descriptors(&ns)),
            None => err(Status::INVALID_NAMESPACE),
        },
        0x06 if csi == 0 && !s.discovery => with_data(identify_controller_nvm()),
        _ => err(Status::INVALID_FIELD),
    }
}

fn get_log_page(x: &Ctx, sqe: &Sqe) -> Reply {
    let c10 = sqe.cdw(10);
    let lid = (c10 & 0xff) as u8;
    let numd = ((sqe.cdw(11) as u64 & 0xffff) << 16 | (c10 >> 16) as u64) + 1;
    let len = numd * 4;
    let off = sqe.cdw(12) as u64 | (sqe.cdw(13) as u64) << 32;
    if !off.is_multiple_of(4) || len > x.t.max_transfer() as u64 {
        return err(Status::INVALID_FIELD);
    }
    let s = &x.ctrl.subsys;
    let page = match lid {
        0x01 => vec![0u8; 64 * (ELPE as usize + 1)],
        0x02 if !s.discovery => smart_log(x),
        0x03 if !s.discovery => {
            let mut b = vec![0u8; 512];
            b[0] = 1; // active firmware slot 1
            put_str(&mut b[8..16], FIRMWARE);
            b
        }
        0x04 if !s.discovery => {
            let mut b = vec![0u8; 4096];
            let list = std::mem::take(&mut *x.ctrl.changed.lock());
            for (i, id) in list.iter().take(1024).enumerate() {
                put32(&mut b, i * 4, *id);
            }
            b
        }
        0x0c if !s.discovery => ana_log(x, (c10 >> 8) & 0xf),
        // RAE (bit 15): the notice stays outstanding.
        0x80 if !s.discovery => resv_commands::log_page(x.ctrl, off == 0, c10 & 1 << 15 != 0),
        0x70 if s.discovery => discovery_log(x),
        _ => return err(Status::INVALID_LOG_PAGE),
    };
    if off > page.len() as u64 {
        return err(Status::INVALID_FIELD);
    }
    let mut d = page[off as usize..].to_vec();
    d.resize(len as usize, 0);
    with_data(d)
}

/// The ANA log page as seen through the path this controller was connected on; LSP bit 0
/// (RGO) leaves out the namespace ids.
fn ana_log(x: &Ctx, lsp: u32) -> Vec<u8> {
    let s = &x.ctrl.subsys;
    let groups: Vec<_> = (s.ana_groups().into_iter())
        .map(|(g, ids)| (g, s.ana.state(x.ctrl.port, g), ids))
        .collect();
    ana::log_page(s.ana.changes(), &groups, lsp & 1 != 0)
}

fn smart_log(x: &Ctx) -> Vec<u8> {
    let io = &x.ctrl.subsys.io;
    let r = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as u128;
    let mut b = vec![0u8; 512];
    put16(&mut b, 1, 313); // composite temperature: 40 C in Kelvin
    b[3] = 100; // available spare
    b[4] = 10; // available spare threshold
               // Data units are thousands of 512-byte units, rounded up.
    put128(&mut b, 32, r(&io.bytes_read).div_ceil(512_000));
    put128(&mut b, 48, r(&io.bytes_written).div_ceil(512_000));
    put128(&mut b, 64, r(&io.read_commands));
    put128(&mut b, 80, r(&io.write_commands));
    put128(&mut b, 112, 1); // power cycles
    put128(&mut b, 128, (x.t.epoch.elapsed().as_secs() / 3600) as u128);
    b
}

/// The discovery log: one entry per subsystem this host may see, per I/O port.
pub(crate) fn discovery_log(x: &Ctx) -> Vec<u8> {
    let host = &x.ctrl.hostnqn;
    let mut subs: Vec<_> =
        x.t.subsystems
            .read()
            .values()
            .filter(|s| s.host_allowed(host))
            .map(|s| s.nqn.clone())
            .collect();
    subs.sort();
    let ports: Vec<(u16, SocketAddr, Transport, bool)> = (x.t.ports.lock().iter())
        .map(|p| (p.id, p.addr, p.transport, p.tls == TlsMode::Required))
        .collect();
    let n = subs.len() * ports.len();
    let mut b = vec![0u8; 1024 * (n + 1)];
    put64(&mut b, 0, x.t.genctr.load(Ordering::Relaxed));
    put64(&mut b, 8, n as u64);
    let mut at = 1024;
    for nqn in &subs {
        for (id, addr, transport, tls) in &ports {
            let e = &mut b[at..at + 1024];
            e[0] = transport.trtype();
            let mut ip = addr.ip();
            if ip.is_unspecified() {
                // Listening on any address: name the one this host reached us on.
                if let Some(l) = x.local {
                    ip = l.ip();
                }
            }
            e[1] = if ip.is_ipv4() { 1 } else { 2 }; // ADRFAM
            e[2] = 2; // SUBTYPE: NVM subsystem
                      // TREQ: secure channel required (01b) on a TLS listener, else not required (10b).
            e[3] = if *tls { 1 } else { 2 };
            put16(e, 4, *id);
            put16(e, 6, 0xffff); // dynamic controllers
            put16(e, 8, x.t.cfg.admin_queue_depth);
            put_str(&mut e[32..64], &addr.port().to_string());
            put_nqn(&mut e[256..512], nqn);
            put_str(&mut e[512..768], &ip.to_string());
            if *transport == Transport::Rdma {
                // TSAS for RDMA: reliable connected, no provider named, RDMA CM.
                e[768] = 1;
                e[769] = 1;
                e[770] = 1;
            }
            // TSAS for TCP: SECTYPE 2 (TLS 1.3) on a TLS listener, else 0 (no security).
            if *tls {
                e[768] = 2;
            }
            at += 1024;
        }
    }
    debug_assert!(x.ctrl.subsys.nqn == DISCOVERY_NQN);
    b
}

fn set_features(x: &Ctx, sqe: &Sqe) -> Reply {
    let c10 = sqe.cdw(10);
    if c10 & (1 << 31) != 0 {
        return err(Status::FEATURE_NOT_SAVEABLE);
    }
    let v = sqe.cdw(11);
    let c = x.ctrl;
    match c10 & 0xff {
        0x07 => {
            let (nsq, ncq) = (v & 0xffff, v >> 16);
            if nsq == 0xffff || ncq == 0xffff {
                return err(Status::INVALID_FIELD);
            }
            let want = nsq.max(ncq) + 1;
            let n = want.min(x.t.cfg.max_io_queues as u32).max(1) as u16;
            c.io_queues.store(n, Ordering::Relaxed);
            let z = (n - 1) as u64;
            ok(z | z << 16)
        }
        0x0f => {
            c.kato_ms.store(v, Ordering::Relaxed);
            ok(0)
        }
        0x0b => {
            c.aen.lock().config = v;
            ok(0)
        }
        // Volatile write cache: the devices flush on Flush either way; accept the setting.
        0x06 => ok(0),
        0x82 | 0x83 if !c.subsys.discovery => match resv_commands::set_feature(x.t, c, sqe) {
            Ok(r) => ok(r),
            Err(st) => err(st),
        },
        _ => err(Status::INVALID_FIELD),
    }
}

fn get_features(x: &Ctx, sqe: &Sqe) -> Reply {
    let c = x.ctrl;
    match sqe.cdw(10) & 0xff {
        0x01 => ok(0),
        0x02 => ok(0),
        0x04 => ok(0x157),
        0x05 => ok(0),
        0x06 => ok(1),
        0x07 => {
            let z = (c.io_queues.load(Ordering::Relaxed).max(1) - 1) as u64;
            ok(z | z << 16)
        }
        0x08 => ok(0),
        0x0b => ok(c.aen.lock().config as u64),
        0x0f => ok(c.kato_ms.load(Ordering::Relaxed) as u64),
        0x81..=0x83 if !c.subsys.discovery => match resv_commands::get_feature(c, sqe) {
            Ok((result, data)) => Reply {
                status: Status::SUCCESS,
                result,
                data,
            },
            Err(st) => err(st),
        },
        _ => err(Status::INVALID_FIELD),
    }
}
