//! Host-to-controller transfers of an NVMe/TCP queue: a pool buffer taken for each write whose
//! data the host sends after our R2T, the H2CData PDUs received straight into it, and the write
//! then run, or held for the write that continues it (`crate::plug`).

use super::{Conn, Out, Stop};
use crate::cmd::{self, Sqe, Status};
use crate::pdu::{DataHdr, Frame, PduError, R2t};
use crate::plug::{Chain, HeldWrite};
use millrace_io::share::Held;
use millrace_io::IoBuf;
use std::sync::atomic::Ordering;

/// A command waiting for its data in H2CData PDUs (after our R2T).
pub(super) struct Pending {
    pub sqe: Sqe,
    buf: IoBuf,
    held: Option<Held>,
    received: usize,
    digest_error: bool,
}

impl Conn {
    /// Takes a pool buffer for a host-to-controller transfer (its bytes of the host's share
    /// first) and asks for the data.
    pub(super) async fn start_r2t(&mut self, sqe: Sqe, len: usize) -> Result<(), Stop> {
        let cid = sqe.cid();
        if self.pending.lock().contains_key(&cid) {
            self.reply.done(cid, Status::CID_CONFLICT, 0);
            return Ok(());
        }
        let pending = self.pending.clone();
        let register = move |buf: IoBuf, held: Option<Held>| {
            pending.lock().insert(
                cid,
                Pending {
                    sqe,
                    buf,
                    held,
                    received: 0,
                    digest_error: false,
                },
            );
            Out::R2t(R2t {
                cccid: cid,
                ttag: cid,
                r2to: 0,
                r2tl: len as u32,
            })
        };
        let Some(share) = self.session.share().cloned() else {
            // Connect's own data (at most CONNECT_DATA_MAX, one per connection): a host not yet
            // admitted takes nothing from the pool.
            let out = register(IoBuf::standalone(len), None);
            self.reply.send(out);
            return Ok(());
        };
        let pool = self.session.pool().clone();
        if len > pool.max_buf() {
            self.reply.done(cid, Status::INVALID_FIELD, 0);
            return Ok(());
        }
        let held = share.try_take(len);
        if held.is_some() {
            if let Ok(Some(b)) = pool.try_get(len) {
                let out = register(b, held);
                self.reply.send(out);
                return Ok(());
            }
        }
        // The host's share or the pool is short: wait in a task of its own so this reader
        // keeps receiving the data that will free buffers. The host sends nothing for this
        // command until the R2T.
        let reply = self.reply.clone();
        let dead = self.session.closing();
        let waiting = self.r2t_waiting.clone();
        waiting.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            let got = async {
                let held = match held {
                    Some(h) => h,
                    None => share.take(len).await,
                };
                pool.get(len).await.ok().map(|b| (b, held))
            };
            tokio::select! {
                _ = dead.cancelled() => {}
                r = got => if let Some((b, held)) = r {
                    // In `pending` before it stops counting as waiting.
                    let out = register(b, Some(held));
                    waiting.fetch_sub(1, Ordering::AcqRel);
                    reply.send(out);
                    return;
                },
            }
            waiting.fetch_sub(1, Ordering::AcqRel);
        });
        Ok(())
    }

    pub(super) async fn h2c_data(&mut self, d: DataHdr, f: &Frame, raw: &[u8]) -> Result<(), Stop> {
        if f.data_len > self.maxh2cdata {
            return Err(Stop::Fatal(
                PduError::TooLarge(f.data_len as u64),
                raw.to_vec(),
            ));
        }
        let Some(mut p) = self.pending.lock().remove(&d.ttag) else {
            return Err(Stop::Fatal(PduError::InvalidField(10), raw.to_vec()));
        };
        if p.sqe.cid() != d.cccid {
            return Err(Stop::Fatal(PduError::InvalidField(8), raw.to_vec()));
        }
        // Data must arrive in order and inside the R2T's range.
        let off = d.datao as usize;
        if off != p.received || off + f.data_len > p.buf.len() {
            return Err(Stop::Fatal(PduError::OutOfRange, raw.to_vec()));
        }
        let ok = match self.data(f, &mut p.buf[off..off + f.data_len]).await {
            Ok(ok) => ok,
            Err(s) => {
                self.pending.lock().insert(d.ttag, p);
                return Err(s);
            }
        };
        p.digest_error |= !ok;
        p.received += f.data_len;
        let complete = p.received == p.buf.len();
        if d.last != complete {
            return Err(Stop::Fatal(PduError::OutOfRange, raw.to_vec()));
        }
        if !complete {
            self.pending.lock().insert(d.ttag, p);
            return Ok(());
        }
        let chain = self.plug.release(p.sqe.cid());
        if p.digest_error {
            self.reply
                .done(p.sqe.cid(), Status::TRANSIENT_TRANSPORT_ERROR, 0);
            self.run_held(chain).await;
            return Ok(());
        }
        let w = HeldWrite {
            sqe: p.sqe,
            buf: p.buf,
            held: p.held,
        };
        if let Some(next) = self.continuation(&w.sqe) {
            self.plug.hold(next, chain, w);
            return Ok(());
        }
        self.run_held(chain).await;
        self.execute(w.sqe, Some(w.buf), 0, w.held).await;
        Ok(())
    }

    /// The write waiting for its data (after our R2T) that continues `sqe`'s inside the
    /// device's write granule, if any (`crate::plug`).
    fn continuation(&self, sqe: &Sqe) -> Option<u16> {
        if !self.plug.holds() {
            return None;
        }
        let span = self.session.write_span(sqe)?;
        let pending = self.pending.lock();
        pending
            .iter()
            .find(|(_, q)| {
                let s = &q.sqe;
                s.opcode() == cmd::io::WRITE
                    && !s.is_fabrics()
                    && span.continued_at(s.nsid(), s.slba())
            })
            .map(|(cid, _)| *cid)
    }

    /// Sends held writes to the device, oldest first.
    async fn run_held(&mut self, chain: Option<Chain>) {
        self.run_writes(chain.map(|c| c.writes).unwrap_or_default())
            .await;
    }

    async fn run_writes(&mut self, writes: Vec<HeldWrite>) {
        for w in writes {
            self.execute(w.sqe, Some(w.buf), 0, w.held).await;
        }
    }

    /// Every held write goes on: the longest wait is over.
    pub(super) async fn release_held(&mut self) {
        let all = self.plug.release_all();
        self.run_writes(all).await;
    }
}
