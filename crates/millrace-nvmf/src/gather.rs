//! The NVMe/TCP sender's batch (`tcp::reply::writer`): PDU headers and small PDUs gathered in
//! one byte buffer, read data left in the pool buffers the device filled, all sent by vectored
//! writes.

use crate::cmd::Cqe;
use crate::pdu::{self, DataHdr, Head};
use millrace_io::share::Held;
use millrace_io::IoBuf;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;

/// Largest C2HData PDU the writer sends (longer reads go out in several).
const MAX_C2H_PDU: usize = 256 * 1024;

/// What the writer has queued and not yet sent: small PDUs and headers in one byte buffer, and
/// read data in the pool buffers the device filled, sent between them by one vectored write.
#[derive(Default)]
pub(crate) struct Gather {
    bytes: Vec<u8>,
    bufs: Vec<IoBuf>,
    /// The host's share the buffers count against, given back with them.
    pub(crate) held: Vec<Held>,
    parts: Vec<Part>,
    /// Bytes of read data queued (in `bufs`).
    data: usize,
}

#[derive(Clone, Copy)]
enum Part {
    Bytes(usize, usize),
    Buf(usize, usize, usize),
}

/// Slices one vectored write passes at most. A 4K read's reply takes two (its data, and the
/// bytes of its headers, joined with the next reply's), so this lets one write carry the
/// replies to a whole socket read of read commands (about 45 at QD64): on loopback the sender
/// also pays for the receiving side, per write more than per byte. 64 cut those batches in
/// half and cost about 0.2 us of the core per 4K read (docs/PERFORMANCE.md); the kernel takes
/// up to 1024.
const IOV_MAX: usize = 256;

/// Read data a batch holds at most before it is sent, so that large reads' pool buffers go
/// back while the batch fills (about what 64 slices allowed for 1 MiB reads before).
const DATA_MAX: usize = 8 << 20;

impl Gather {
    pub(crate) fn push_bytes(&mut self, b: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(b);
        self.queued_from(start);
    }

    /// Queues a PDU that is a header alone (a response capsule, an R2T), encoded straight into
    /// the batch.
    pub(crate) fn push_head(&mut self, head: &Head, f: &Fmt) {
        let start = self.bytes.len();
        pdu::encode_head_into(&mut self.bytes, head, &[], f.hdgst, f.ddgst, f.align);
        self.queued_from(start);
    }

    /// Queues the byte buffer's bytes from `start` on (appended since), as one slice with the
    /// bytes queued just before them.
    fn queued_from(&mut self, start: usize) {
        match self.parts.last_mut() {
            Some(Part::Bytes(_, end)) if *end == start => *end = self.bytes.len(),
            _ => self.parts.push(Part::Bytes(start, self.bytes.len())),
        }
    }

    fn slice(&self, p: Part) -> &[u8] {
        match p {
            Part::Bytes(a, b) => &self.bytes[a..b],
            Part::Buf(i, a, b) => &self.bufs[i][a..b],
        }
    }

    /// C2HData PDUs carrying `data` (headers and digests here, the data itself by reference),
    /// then the response capsule.
    pub(crate) fn push_data(&mut self, cqe: &Cqe, data: IoBuf, f: &Fmt) {
        let len = data.len();
        let seg = self.bufs.len();
        self.data += len;
        self.bufs.push(data);
        let mut off = 0;
        while off < len {
            let n = (len - off).min(MAX_C2H_PDU);
            let h = DataHdr {
                cccid: cqe.cid,
                ttag: 0,
                datao: off as u32,
                datal: n as u32,
                last: off + n == len,
                success: false,
            };
            let start = self.bytes.len();
            pdu::encode_head_len_into(
                &mut self.bytes,
                &Head::C2HData(h),
                n,
                f.hdgst,
                f.ddgst,
                f.align,
            );
            self.queued_from(start);
            self.parts.push(Part::Buf(seg, off, off + n));
            if f.ddgst {
                let crc = crc32c::crc32c(&self.bufs[seg][off..off + n]);
                self.push_bytes(&crc.to_le_bytes());
            }
            off += n;
        }
    }

    pub(crate) fn is_big(&self) -> bool {
        self.bytes.len() >= 64 * 1024 || self.parts.len() >= IOV_MAX || self.data >= DATA_MAX
    }

    /// Sends everything queued, then lets the buffers go back to the pool.
    pub(crate) async fn flush(&mut self, w: &mut OwnedWriteHalf) -> std::io::Result<()> {
        let (mut i, mut skip) = (0, 0);
        while i < self.parts.len() {
            let mut iov = [std::io::IoSlice::new(&[]); IOV_MAX];
            let mut n = 0;
            for (k, p) in self.parts[i..].iter().take(IOV_MAX).enumerate() {
                let s = self.slice(*p);
                iov[k] = std::io::IoSlice::new(if k == 0 { &s[skip..] } else { s });
                n += 1;
            }
            let mut wrote = w.write_vectored(&iov[..n]).await?;
            if wrote == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            while wrote > 0 {
                let left = self.slice(self.parts[i]).len() - skip;
                if wrote >= left {
                    wrote -= left;
                    (i, skip) = (i + 1, 0);
                } else {
                    skip += wrote;
                    wrote = 0;
                }
            }
        }
        self.parts.clear();
        self.bytes.clear();
        self.bufs.clear();
        self.data = 0;
        self.held.clear();
        Ok(())
    }
}

/// The digests and alignment the connection agreed on.
pub(crate) struct Fmt {
    pub(crate) hdgst: bool,
    pub(crate) ddgst: bool,
    pub(crate) align: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::Status;
    use crate::pdu::{read_data, read_head, Negotiated, Side};
    use tokio::net::{TcpListener, TcpStream};

    /// Every seventh reply is long (several C2HData PDUs), the rest 4 KiB.
    fn size(cid: u16) -> usize {
        if cid.is_multiple_of(7) {
            300 * 1024
        } else {
            4096
        }
    }

    fn pattern(cid: u16, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u16 ^ cid.wrapping_mul(31)) as u8)
            .collect()
    }

    /// More replies than one vectored write passes, and more bytes than the socket takes at
    /// once: every reply arrives whole and in order, its data and digests intact.
    #[tokio::test]
    async fn a_batch_longer_than_one_write_arrives_whole_and_in_order() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (target, _) = l.accept().await.unwrap();
        let (_rd, mut wr) = target.into_split();
        let f = Fmt {
            hdgst: true,
            ddgst: true,
            align: 4,
        };
        let n: u16 = 3 * IOV_MAX as u16;
        // The host reads while the target sends: the socket holds far less than the batches.
        let send = tokio::spawn(async move {
            let mut g = Gather::default();
            let mut sent_at = Vec::new();
            for cid in 0..n {
                let cqe = Cqe::new(cid, Status::SUCCESS, 0);
                g.push_data(&cqe, IoBuf::from_slice(&pattern(cid, size(cid))), &f);
                g.push_head(&Head::Resp(cqe), &f);
                if g.is_big() {
                    sent_at.push(cid);
                    g.flush(&mut wr).await.unwrap();
                }
            }
            g.flush(&mut wr).await.unwrap();
            assert!(g.parts.is_empty() && g.bufs.is_empty() && g.data == 0);
            sent_at
        });
        let neg = Negotiated {
            ic_done: true,
            hdgst: true,
            ddgst: true,
            max_data: 1 << 20,
        };
        let mut host = tokio::io::BufReader::new(host);
        for cid in 0..n {
            let mut got = Vec::new();
            loop {
                let (head, fr, _) = read_head(&mut host, Side::Host, &neg).await.unwrap();
                match head {
                    Head::C2HData(d) => {
                        assert_eq!((d.cccid, d.datao as usize), (cid, got.len()));
                        let mut b = vec![0u8; fr.data_len];
                        assert!(read_data(&mut host, &fr, &mut b).await.unwrap());
                        got.extend_from_slice(&b);
                    }
                    Head::Resp(c) => {
                        assert_eq!(c.cid, cid);
                        break;
                    }
                    h => panic!("unexpected PDU {h:?}"),
                }
            }
            assert!(got == pattern(cid, size(cid)), "reply {cid}'s data differs");
        }
        let mut rest = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut host, &mut rest)
            .await
            .unwrap();
        assert!(rest.is_empty());
        // Batches end on the slice limit or on the data limit, not on every reply.
        let sent_at = send.await.unwrap();
        assert!(sent_at.len() >= 3, "{sent_at:?}");
        assert!(sent_at.windows(2).all(|w| w[1] - w[0] > 1), "{sent_at:?}");
    }

    /// Large reads fill a batch by their data long before they fill its slices.
    #[test]
    fn a_batch_of_large_reads_is_sent_once_it_holds_its_data_limit() {
        let f = Fmt {
            hdgst: false,
            ddgst: false,
            align: 4,
        };
        let mut g = Gather::default();
        let each = 2 << 20;
        for cid in 0..(DATA_MAX / each) as u16 {
            assert!(!g.is_big(), "{cid} reads of 2 MiB");
            let cqe = Cqe::new(cid, Status::SUCCESS, 0);
            g.push_data(&cqe, IoBuf::from_slice(&vec![0; each]), &f);
            g.push_head(&Head::Resp(cqe), &f);
        }
        assert!(g.parts.len() < IOV_MAX && g.bytes.len() < 64 * 1024);
        assert!(g.is_big());
    }
}
