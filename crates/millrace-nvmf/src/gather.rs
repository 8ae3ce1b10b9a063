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
}

#[derive(Clone, Copy)]
enum Part {
    Bytes(usize, usize),
    Buf(usize, usize, usize),
}

/// Slices one vectored write passes at most.
const IOV_MAX: usize = 64;

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
        let i = self.bufs.len();
        let len = data.len();
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
            let chunk = &self.bufs[i][off..off + n];
            let dg = f.ddgst.then(|| pdu::digest(chunk).to_le_bytes());
            let start = self.bytes.len();
            pdu::encode_head_into(
                &mut self.bytes,
                &Head::C2HData(h),
                chunk,
                f.hdgst,
                f.ddgst,
                f.align,
            );
            self.queued_from(start);
            self.parts.push(Part::Buf(i, off, off + n));
            if let Some(d) = dg {
                self.push_bytes(&d);
            }
            off += n;
        }
    }

    pub(crate) fn is_big(&self) -> bool {
        self.bytes.len() >= 64 * 1024 || self.parts.len() >= IOV_MAX
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
