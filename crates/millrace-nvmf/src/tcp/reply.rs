//! The sending side of an NVMe/TCP connection: what the reader and the commands' tasks hand
//! the writer task ([`Out`]), how completions reach it ([`Replier`], [`completer`]), and the
//! writer itself, which sends batches of PDUs with vectored writes, read data straight from the
//! buffer the device filled.

use crate::cmd::{Cqe, Status};
use crate::gather::{Fmt, Gather};
use crate::io_commands::IoDone;
use crate::model::Inner;
use crate::pdu::{self, encode, Head, R2t};
use millrace_io::share::Held;
use millrace_io::IoBuf;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

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

/// What the reader and the commands' tasks have queued for the writer. A queue under a lock,
/// not a channel: a push is one uncontended lock and, when the queue was empty, one wake of
/// the writer, which then takes the whole queue at once; a bounded channel cost a semaphore
/// permit, a list node and a waker per reply (about 6% of the core per 4K read,
/// docs/PERFORMANCE.md). It needs no bound of its own: a queue holds at most one completion per
/// command in flight (the host may not have more than its queue size) and one R2T per transfer
/// waiting for data, and read data is in buffers of the pool, which is bounded.
pub(super) struct Outbox {
    queue: Mutex<Queue>,
    wake: Notify,
    /// Repliers alive: the writer stops once none is left and the queue is empty.
    senders: AtomicUsize,
    inflight: AtomicUsize,
    t: Arc<Inner>,
}

#[derive(Default)]
struct Queue {
    items: Vec<Out>,
    /// The writer has stopped (the socket failed or the connection ended): what is pushed now
    /// is dropped at once, its buffers back to the pool.
    closed: bool,
}

impl Outbox {
    /// The first replier of a new connection's queue.
    pub fn open(t: Arc<Inner>) -> Replier {
        let out = Arc::new(Outbox {
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            senders: AtomicUsize::new(1),
            inflight: AtomicUsize::new(0),
            t,
        });
        Replier { out, qid: 0 }
    }

    /// Queues `o` for the writer; false (and `o` dropped) once the writer has stopped.
    fn push(&self, o: Out) -> bool {
        let mut q = self.queue.lock();
        if q.closed {
            return false;
        }
        q.items.push(o);
        let first = q.items.len() == 1;
        drop(q);
        if first {
            self.wake.notify_one();
        }
        true
    }
}

/// Sends completions and keeps the in-flight count, which must drop before the host can see
/// the completion (it may reuse the slot at once).
pub(super) struct Replier {
    out: Arc<Outbox>,
    pub qid: u16,
}

impl Clone for Replier {
    fn clone(&self) -> Replier {
        self.out.senders.fetch_add(1, Ordering::Relaxed);
        Replier {
            out: self.out.clone(),
            qid: self.qid,
        }
    }
}

impl Drop for Replier {
    fn drop(&mut self) {
        if self.out.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.out.wake.notify_one();
        }
    }
}

impl Replier {
    /// Commands in flight now (admitted, not yet completed).
    pub fn in_flight(&self) -> usize {
        self.out.inflight.load(Ordering::Relaxed)
    }

    /// Counts a command in flight and returns how many are.
    pub fn admit(&self) -> usize {
        self.out.inflight.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The writer this replier's queue feeds, which sends with `f` and stamps responses with
    /// the submission queue head `sqhd`.
    pub fn writer(
        &self,
        wr: OwnedWriteHalf,
        f: Fmt,
        sqhd: Arc<AtomicU16>,
    ) -> impl std::future::Future<Output = ()> {
        writer(wr, self.out.clone(), f, sqhd)
    }

    /// Queues anything but a completion (an R2T, a termination, the close).
    pub fn send(&self, o: Out) {
        self.out.push(o);
    }

    /// A command's completion, made ready to queue: it no longer counts as in flight (before
    /// the host can see it) and carries this queue's id.
    fn retire(&self, mut c: Cqe) -> Cqe {
        self.out.inflight.fetch_sub(1, Ordering::Relaxed);
        c.sqid = self.qid;
        c
    }

    pub fn done(&self, cid: u16, status: Status, result: u64) {
        if !status.is_success() {
            self.out.t.counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.out
            .push(Out::Resp(self.retire(Cqe::new(cid, status, result))));
    }

    pub fn data(&self, cid: u16, data: IoBuf, held: Option<Held>, result: u64) {
        let cqe = self.retire(Cqe::new(cid, Status::SUCCESS, result));
        self.out.push(Out::Data { cqe, data, held });
    }

    /// Completes an I/O command as it ended.
    pub fn finish(&self, cid: u16, d: IoDone) {
        match d {
            IoDone::Status(st) => self.done(cid, st, 0),
            IoDone::Read { data, held } => self.data(cid, data, held, 0),
        }
    }
}

/// Completes an admin queue's parked commands from any task: the in-flight count drops before
/// the host can see the completion, and comes back if the writer has stopped (false).
pub(super) fn completer(r: &Replier) -> crate::model::Completer {
    let r = r.clone();
    Arc::new(move |c: Cqe| {
        if r.out.push(Out::Resp(r.retire(c))) {
            return true;
        }
        r.out.inflight.fetch_add(1, Ordering::Relaxed);
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

/// Sends what the batch holds within `limit`; a host that has not taken it by then is stalled
/// (or hostile), and the connection ends (TimedOut), giving back what the replies are sent from.
async fn send(
    g: &mut Gather,
    wr: &mut OwnedWriteHalf,
    limit: std::time::Duration,
) -> std::io::Result<()> {
    match tokio::time::timeout(limit, g.flush(wr)).await {
        Ok(r) => r,
        Err(_) => {
            tracing::info!(
                "closing an NVMe/TCP connection: the host did not take its replies within {} s",
                limit.as_secs_f64()
            );
            Err(std::io::ErrorKind::TimedOut.into())
        }
    }
}

async fn writer(mut wr: OwnedWriteHalf, out: Arc<Outbox>, f: Fmt, sqhd: Arc<AtomicU16>) {
    let limit = out.t.cfg.reply_timeout;
    let mut g = Gather::default();
    let mut batch = Vec::new();
    // A send that failed (or timed out) is not tried again on the way out.
    let mut failed = false;
    'run: loop {
        // Take everything queued at once; send when the queue runs dry or the batch is big.
        std::mem::swap(&mut out.queue.lock().items, &mut batch);
        if batch.is_empty() {
            if send(&mut g, &mut wr, limit).await.is_err() {
                failed = true;
                break;
            }
            if out.senders.load(Ordering::Acquire) == 0 {
                // The last replier may have queued something just before it went.
                if out.queue.lock().items.is_empty() {
                    break;
                }
                continue;
            }
            out.wake.notified().await;
            continue;
        }
        let resp = |mut c: Cqe| {
            c.sqhd = sqhd.load(Ordering::Relaxed);
            Head::Resp(c)
        };
        for msg in batch.drain(..) {
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
                    break 'run;
                }
                Out::Close => break 'run,
            }
            if g.is_big() && send(&mut g, &mut wr, limit).await.is_err() {
                failed = true;
                break 'run;
            }
        }
    }
    if !failed {
        let _ = send(&mut g, &mut wr, limit).await;
    }
    let _ = wr.shutdown().await;
    // What is still queued goes (its buffers back to the pool) outside the lock.
    let left = {
        let mut q = out.queue.lock();
        q.closed = true;
        std::mem::take(&mut q.items)
    };
    drop(left);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::{read_head, Negotiated, Side};
    use crate::target::Target;
    use crate::TargetConfig;
    use tokio::net::{TcpListener, TcpStream};

    /// Completions queued from many tasks all reach the host, each once; the writer stops when
    /// the last replier is gone (the host then reads the end of the stream), and what is queued
    /// after it stopped is dropped, its buffer back to the pool.
    #[tokio::test]
    async fn every_completion_arrives_and_the_writer_ends_with_its_last_replier() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (target, _) = l.accept().await.unwrap();
        let (_rd, wr) = target.into_split();
        let t = Target::new(TargetConfig::default()).inner;
        let f = Fmt {
            hdgst: false,
            ddgst: false,
            align: 4,
        };
        let first = Outbox::open(t);
        let writer = tokio::spawn(first.writer(wr, f, Arc::new(AtomicU16::new(0))));
        let n: u16 = 2000;
        let tasks: Vec<_> = (0..8u16)
            .map(|k| {
                let r = first.clone();
                tokio::spawn(async move {
                    for cid in (k..n).step_by(8) {
                        r.admit();
                        r.done(cid, Status::SUCCESS, 0);
                        if cid % 64 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        let out = first.out.clone();
        drop(first);
        let neg = Negotiated {
            ic_done: true,
            hdgst: false,
            ddgst: false,
            max_data: 1 << 20,
        };
        let mut host = tokio::io::BufReader::new(host);
        let mut seen = vec![false; n as usize];
        for _ in 0..n {
            match read_head(&mut host, Side::Host, &neg).await.unwrap().0 {
                Head::Resp(c) => {
                    assert!(
                        !std::mem::replace(&mut seen[c.cid as usize], true),
                        "{} twice",
                        c.cid
                    );
                }
                h => panic!("unexpected PDU {h:?}"),
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        tokio::time::timeout(std::time::Duration::from_secs(10), writer)
            .await
            .expect("the writer ends once no replier is left")
            .unwrap();
        let mut rest = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut host, &mut rest)
            .await
            .unwrap();
        assert!(rest.is_empty());
        assert_eq!(out.inflight.load(Ordering::Relaxed), 0);
        let pool = millrace_io::BufPool::new(&millrace_io::PoolConfig {
            bytes: 64 << 10,
            slices: 1,
            max_buf: 4096,
            populate: false,
        })
        .unwrap();
        out.push(Out::Data {
            cqe: Cqe::new(1, Status::SUCCESS, 0),
            data: pool.try_get(4096).unwrap().unwrap(),
            held: None,
        });
        assert_eq!(pool.usage().in_use_bytes, 0);
        assert!(out.queue.lock().items.is_empty());
    }
}
