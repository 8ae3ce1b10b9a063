//! The sending side of an NVMe/TCP connection: what the reader and the commands' tasks hand
//! the writer task ([`Out`]), how completions reach it ([`Replier`], [`completer`]), and the
//! writer itself, which sends batches of PDUs with vectored writes, read data straight from the
//! buffer the device filled.

use crate::cmd::{Cqe, Status};
use crate::gather::{Fmt, Gather};
use crate::model::Inner;
use crate::pdu::{self, encode, Head, R2t};
use millrace_io::share::Held;
use millrace_io::IoBuf;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;

/// What the writer task sends.
pub(crate) enum Out {
    Resp(Cqe),
    /// C2HData PDUs carrying `data`, then the response capsule; `held`, the bytes of the
    /// host's share the buffer counts against, goes back with it once sent.
    Data {
        cqe: Cqe,
        data: IoBuf,
        held: Option<Held>,
    },
    R2t(R2t),
    /// A fatal error: send a C2HTermReq and close.
    Term {
        fes: u16,
        fei: u32,
        hdr: Vec<u8>,
    },
    /// Close once everything queued before is sent (after Disconnect).
    Close,
}

/// Sends completions and keeps the in-flight count, which must drop before the host can see
/// the completion (it may reuse the slot at once).
#[derive(Clone)]
pub(super) struct Replier {
    pub tx: mpsc::Sender<Out>,
    pub inflight: Arc<AtomicUsize>,
    pub qid: u16,
    pub t: Arc<Inner>,
}

impl Replier {
    pub async fn done(&self, cid: u16, status: Status, result: u64) {
        self.inflight.fetch_sub(1, Ordering::Relaxed);
        if !status.is_success() {
            self.t.counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        let mut c = Cqe::new(cid, status, result);
        c.sqid = self.qid;
        let _ = self.tx.send(Out::Resp(c)).await;
    }
    pub async fn data(&self, cid: u16, data: IoBuf, held: Option<Held>) {
        self.inflight.fetch_sub(1, Ordering::Relaxed);
        let mut c = Cqe::new(cid, Status::SUCCESS, 0);
        c.sqid = self.qid;
        let _ = self.tx.send(Out::Data { cqe: c, data, held }).await;
    }
}

/// Completes an admin queue's parked commands from any task: the in-flight count drops before
/// the host can see the completion, and comes back if the writer cannot take it now.
pub(super) fn completer(r: &Replier) -> crate::model::Completer {
    let (tx, inflight, qid) = (r.tx.clone(), r.inflight.clone(), r.qid);
    Arc::new(move |mut c: Cqe| {
        inflight.fetch_sub(1, Ordering::Relaxed);
        c.sqid = qid;
        if tx.try_send(Out::Resp(c)).is_ok() {
            return true;
        }
        inflight.fetch_add(1, Ordering::Relaxed);
        false
    })
}

pub(super) fn term(fes: u16, fei: u32, hdr: &[u8]) -> Vec<u8> {
    let hdr = &hdr[..hdr.len().min(pdu::TERM_MAX_DATA)];
    encode(
        &Head::TermReq {
            h2c: false,
            fes,
            fei,
        },
        hdr,
        false,
        false,
        1,
    )
}

pub(super) async fn writer(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Out>,
    f: Fmt,
    sqhd: Arc<AtomicU16>,
) {
    let mut g = Gather::default();
    loop {
        // Batch: queue whatever is waiting, send when the queue runs dry or the batch is big.
        let msg = match rx.try_recv() {
            Ok(m) => m,
            Err(mpsc::error::TryRecvError::Empty) => {
                if g.flush(&mut wr).await.is_err() {
                    return;
                }
                match rx.recv().await {
                    Some(m) => m,
                    None => break,
                }
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        let resp = |mut c: Cqe| {
            c.sqhd = sqhd.load(Ordering::Relaxed);
            Head::Resp(c)
        };
        match msg {
            Out::Resp(c) => g.push_head(&resp(c), &f),
            Out::Data { cqe, data, held } => {
                g.push_data(&cqe, data, &f);
                g.held.extend(held);
                g.push_head(&resp(cqe), &f);
            }
            Out::R2t(r) => g.push_head(&Head::R2t(r), &f),
            Out::Term { fes, fei, hdr } => {
                g.push_bytes(&term(fes, fei, &hdr));
                break;
            }
            Out::Close => break,
        }
        if g.is_big() && g.flush(&mut wr).await.is_err() {
            return;
        }
    }
    let _ = g.flush(&mut wr).await;
    let _ = wr.shutdown().await;
}
