//! Latency and byte counts of every request the exports make of a volume, for /metrics, and
//! the gate every such request passes, which lets the server drain the exports at shutdown:
//! once closed, new requests fail (the client sees an error, so nothing it was told is done is
//! lost), and the server waits for the ones already inside before it records the pools clean.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use millrace_block::{BlockDevice, BufResult, Extent, IoBuf, IoFuture};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub pool: String,
    pub volume: String,
    pub op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VolLabels {
    pub pool: String,
    pub volume: String,
}

fn latency_histogram() -> Histogram {
    // 10 us to about 80 ms: NVMe-class latencies up to a drive having a bad day.
    Histogram::new(exponential_buckets(10e-6, 2.0, 14))
}

#[derive(Clone)]
pub struct Meters {
    pub latency: Family<OpLabels, Histogram, fn() -> Histogram>,
    pub bytes: Family<OpLabels, Counter>,
    pub inflight: Family<VolLabels, Gauge>,
    pub gate: Arc<Gate>,
}

impl Default for Meters {
    fn default() -> Self {
        Meters {
            latency: Family::new_with_constructor(latency_histogram),
            bytes: Family::default(),
            inflight: Family::default(),
            gate: Arc::default(),
        }
    }
}

/// Lets the exports' requests into the volumes and, once closed, lets no new one in. A request
/// inside counts in its volume's in-flight gauge and nowhere else: a count of its own here cost
/// two more locked instructions per request, on a line every core shared.
#[derive(Default)]
pub struct Gate {
    closed: AtomicBool,
    /// The in-flight gauge of every volume wrapped (one each, however often it is wrapped).
    counts: parking_lot::Mutex<Vec<Gauge>>,
    idle: tokio::sync::Notify,
}

/// One request inside the gate; it leaves when this is dropped.
pub struct Pass<'a> {
    gate: &'a Gate,
    inflight: &'a Gauge,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        // Only a closed gate has anyone waiting (`drained` runs after `close`); a wake of the
        // waiter list per request cost about 0.5% of a core at 4K (docs/PERFORMANCE.md).
        if self.inflight.inner().fetch_sub(1, SeqCst) == 1 && self.gate.closed.load(SeqCst) {
            self.gate.idle.notify_waiters();
        }
    }
}

impl Gate {
    fn watch(&self, inflight: &Gauge) {
        let mut c = self.counts.lock();
        if !c.iter().any(|g| std::ptr::eq(g.inner(), inflight.inner())) {
            c.push(inflight.clone());
        }
    }

    /// Lets a request in, unless the gate is closed. Counted before the check, so `drained`
    /// never misses one that got in just as the gate closed.
    fn enter<'a>(&'a self, inflight: &'a Gauge) -> Option<Pass<'a>> {
        inflight.inner().fetch_add(1, SeqCst);
        let pass = Pass {
            gate: self,
            inflight,
        };
        (!self.closed.load(SeqCst)).then_some(pass)
    }

    fn inside(&self) -> i64 {
        self.counts
            .lock()
            .iter()
            .map(|g| g.inner().load(SeqCst))
            .sum()
    }

    pub fn close(&self) {
        self.closed.store(true, SeqCst);
    }

    /// Waits until no request is inside, at most `bound`; whether none is.
    pub async fn drained(&self, bound: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.inside() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.inside() == 0;
            }
        }
    }
}

fn stopping() -> io::Error {
    io::Error::other("the server is stopping; the request was not carried out")
}

/// Longest a volume's deletion (or its pool's destruction) waits for the exports' requests
/// still inside it. A request leaves when its member I/O completes (replies are sent from the
/// request's own buffer, never from the volume's bytes), so only a drive that stops answering
/// keeps one inside this long.
const OUT_BOUND: Duration = Duration::from_secs(40);

impl Meters {
    /// Waits until no request of an export is inside any of `volumes` of `pool`, at most
    /// `OUT_BOUND`; the requests still inside, if any are: the space of a deleted volume or a
    /// destroyed pool goes to other data, which a write still in flight would overwrite.
    pub fn wait_out(&self, pool: &str, volumes: &[String]) -> Option<i64> {
        let t0 = Instant::now();
        loop {
            let inside: i64 = volumes
                .iter()
                .map(|v| {
                    let l = VolLabels {
                        pool: pool.into(),
                        volume: v.clone(),
                    };
                    self.inflight.get(&l).map_or(0, |g| g.get())
                })
                .sum();
            if inside <= 0 {
                return None;
            }
            if t0.elapsed() > OUT_BOUND {
                return Some(inside);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn wrap(
        &self,
        pool: &str,
        volume: &str,
        dev: Arc<dyn BlockDevice>,
    ) -> Arc<dyn BlockDevice> {
        let vl = VolLabels {
            pool: pool.into(),
            volume: volume.into(),
        };
        let per_op = |op: Op| {
            let l = OpLabels {
                pool: pool.into(),
                volume: volume.into(),
                op: op.name().into(),
            };
            OpMeters {
                latency: self.latency.get_or_create(&l).clone(),
                bytes: self.bytes.get_or_create(&l).clone(),
            }
        };
        let inflight = self.inflight.get_or_create(&vl).clone();
        self.gate.watch(&inflight);
        Arc::new(Metered {
            dev,
            gate: self.gate.clone(),
            inflight,
            ops: Op::ALL.map(per_op),
        })
    }
}

/// The requests a volume is timed for, each a label value of /metrics.
#[derive(Clone, Copy)]
enum Op {
    Read,
    Write,
    Flush,
    Discard,
    WriteZeroes,
}

impl Op {
    const ALL: [Op; 5] = [Op::Read, Op::Write, Op::Flush, Op::Discard, Op::WriteZeroes];
    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Discard => "discard",
            Op::WriteZeroes => "write_zeroes",
        }
    }
}

/// One request kind's series of one volume. Looked up once when the volume is wrapped: a
/// lookup per request (label strings built, hashed and compared under the family's lock) cost
/// about 4% of a core at 4K on NVMe/TCP (docs/PERFORMANCE.md).
struct OpMeters {
    latency: Histogram,
    bytes: Counter,
}

struct Metered {
    dev: Arc<dyn BlockDevice>,
    gate: Arc<Gate>,
    inflight: Gauge,
    ops: [OpMeters; Op::ALL.len()],
}

impl Metered {
    fn record(&self, op: Op, t0: Instant, ok: bool, bytes: u64) {
        let m = &self.ops[op as usize];
        m.latency.observe(t0.elapsed().as_secs_f64());
        if ok && bytes > 0 {
            m.bytes.inc_by(bytes);
        }
    }

    fn time<T>(&self, op: Op, bytes: u64, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let Some(_pass) = self.gate.enter(&self.inflight) else {
            return Err(stopping());
        };
        let t0 = Instant::now();
        let r = f();
        self.record(op, t0, r.is_ok(), bytes);
        r
    }

    /// `time` for a device call on the data path: the clock runs across the await, the
    /// request counts in flight until it ends.
    async fn time_async<T>(
        &self,
        op: Op,
        bytes: u64,
        call: IoFuture<'_, T>,
        ok: impl Fn(&T) -> bool,
        _pass: Pass<'_>,
    ) -> T {
        let t0 = Instant::now();
        let r = call.await;
        self.record(op, t0, ok(&r), bytes);
        r
    }
}

impl BlockDevice for Metered {
    fn size_bytes(&self) -> u64 {
        self.dev.size_bytes()
    }
    fn preferred_io_bytes(&self) -> u64 {
        self.dev.preferred_io_bytes()
    }
    fn min_io_bytes(&self) -> u64 {
        self.dev.min_io_bytes()
    }
    fn write_granule_bytes(&self) -> u64 {
        self.dev.write_granule_bytes()
    }
    fn block_bytes(&self) -> u32 {
        self.dev.block_bytes()
    }
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        self.dev.allocation(offset, len)
    }
    fn zeroes_fast(&self, offset: u64, len: u64) -> bool {
        self.dev.zeroes_fast(offset, len)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let n = buf.len() as u64;
        self.time(Op::Read, n, || self.dev.read_at(offset, buf))
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.time(Op::Write, data.len() as u64, || {
            self.dev.write_at(offset, data)
        })
    }
    fn flush(&self) -> io::Result<()> {
        self.time(Op::Flush, 0, || self.dev.flush())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.time(Op::Discard, 0, || self.dev.discard(offset, len))
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.time(Op::WriteZeroes, 0, || self.dev.write_zeroes(offset, len))
    }
    fn read_async(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, BufResult> {
        let Some(pass) = self.gate.enter(&self.inflight) else {
            return Box::pin(async move { (Err(stopping()), buf) });
        };
        let n = buf.len() as u64;
        let call = self.dev.read_async(offset, buf);
        Box::pin(self.time_async(Op::Read, n, call, |r| r.0.is_ok(), pass))
    }
    fn write_async(&self, offset: u64, buf: IoBuf, fua: bool) -> IoFuture<'_, BufResult> {
        let Some(pass) = self.gate.enter(&self.inflight) else {
            return Box::pin(async move { (Err(stopping()), buf) });
        };
        let n = buf.len() as u64;
        let call = self.dev.write_async(offset, buf, fua);
        Box::pin(self.time_async(Op::Write, n, call, |r| r.0.is_ok(), pass))
    }
    fn flush_async(&self) -> IoFuture<'_, io::Result<()>> {
        let Some(pass) = self.gate.enter(&self.inflight) else {
            return Box::pin(async { Err(stopping()) });
        };
        let call = self.dev.flush_async();
        Box::pin(self.time_async(Op::Flush, 0, call, |r| r.is_ok(), pass))
    }
    fn discard_async(&self, offset: u64, len: u64) -> IoFuture<'_, io::Result<()>> {
        let Some(pass) = self.gate.enter(&self.inflight) else {
            return Box::pin(async { Err(stopping()) });
        };
        let call = self.dev.discard_async(offset, len);
        Box::pin(self.time_async(Op::Discard, 0, call, |r| r.is_ok(), pass))
    }
    fn write_zeroes_async(&self, offset: u64, len: u64) -> IoFuture<'_, io::Result<()>> {
        let Some(pass) = self.gate.enter(&self.inflight) else {
            return Box::pin(async { Err(stopping()) });
        };
        let call = self.dev.write_zeroes_async(offset, len);
        Box::pin(self.time_async(Op::WriteZeroes, 0, call, |r| r.is_ok(), pass))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_gate_drains_the_requests_of_every_volume_and_lets_none_in() {
        let m = Meters::default();
        let (a, b) = (Gauge::default(), Gauge::default());
        m.gate.watch(&a);
        m.gate.watch(&b);
        m.gate.watch(&a);
        let in_a = m.gate.enter(&a).expect("open");
        let in_b = m.gate.enter(&b).expect("open");
        assert_eq!(
            (a.get(), b.get()),
            (1, 1),
            "each request counts in its volume"
        );
        m.gate.close();
        assert!(m.gate.enter(&a).is_none(), "a closed gate lets nothing in");
        assert_eq!(a.get(), 1, "a refused request leaves no count behind");
        let short = Duration::from_millis(50);
        assert!(!m.gate.drained(short).await);
        drop(in_a);
        assert!(
            !m.gate.drained(short).await,
            "volume b still has one inside"
        );
        let gate = m.gate.clone();
        let wait = tokio::spawn(async move { gate.drained(Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(in_b);
        assert!(wait.await.unwrap(), "the last request out wakes the drain");
        assert_eq!((a.get(), b.get()), (0, 0));
    }
}
