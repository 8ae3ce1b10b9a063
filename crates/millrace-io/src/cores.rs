//! The per-core runtime: one thread per core, optionally pinned, each running a tokio
//! current-thread runtime with a `LocalSet`, this core's ring (see [`crate::ring`]) and this
//! core's slice of the buffer pool. Connections are placed on a core and stay there: their
//! socket, their member I/O and their buffers are served by that core alone (SPDK's reactors,
//! Seastar's shards), so the data path takes no lock and crosses no thread.
//!
//! Why futures rather than callbacks: tokio's current-thread runtime already is an event loop
//! that polls sockets (epoll) and timers; a future per request keeps a request's state in one
//! place (its stack frame) and completes on the core that submitted it. Callbacks would need
//! the state machine written by hand for every protocol.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{mpsc, oneshot};

use crate::ring::{self, RingStats};
use crate::BufPool;

/// How to start the cores.
#[derive(Clone)]
pub struct CoresConfig {
    /// Threads to run (at least one).
    pub cores: usize,
    /// Pin core i to CPU `cpus[i % cpus.len()]` (None: let the scheduler place them).
    pub cpus: Option<Vec<usize>>,
    /// Submission ring entries per core.
    pub ring_entries: u32,
    /// The pool whose slices the cores use (slice i on core i) and register with their rings.
    pub pool: Option<BufPool>,
}

impl Default for CoresConfig {
    fn default() -> Self {
        CoresConfig {
            cores: 1,
            cpus: None,
            ring_entries: 256,
            pool: None,
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

struct Core {
    tx: mpsc::UnboundedSender<Job>,
    /// Tasks spawned here that have not finished: what "least loaded" compares.
    load: Arc<AtomicUsize>,
    ring: Arc<RingStats>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The running cores. Dropping it stops them: each core drops its tasks, then waits for its
/// ring's in-flight operations before its thread exits.
pub struct Cores {
    cores: Vec<Core>,
}

thread_local! {
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The index of the core this thread is, if it is one.
pub fn current_core() -> Option<usize> {
    CURRENT.with(|c| c.get())
}

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET and sched_setaffinity act on this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::warn!(
                "could not pin a core thread to CPU {cpu}: {}",
                io::Error::last_os_error()
            );
        }
    }
}

fn core_main(
    i: usize,
    cfg: CoresConfig,
    rx: mpsc::UnboundedReceiver<Job>,
    stats: Arc<RingStats>,
    ready: std::sync::mpsc::Sender<io::Result<()>>,
) {
    CURRENT.with(|c| c.set(Some(i)));
    crate::pool::set_thread_slice(i);
    crate::scratch::set_thread_pool(cfg.pool.clone());
    if let Some(cpus) = cfg.cpus.as_ref().filter(|c| !c.is_empty()) {
        pin_to(cpus[i % cpus.len()]);
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        match ring::install(cfg.ring_entries, cfg.pool.as_ref(), stats) {
            Ok(driver) => {
                tokio::task::spawn_local(driver);
            }
            Err(e) => {
                tracing::warn!("core {i} has no io_uring ({e}); its member I/O runs synchronously")
            }
        }
        let _ = ready.send(Ok(()));
        let mut rx = rx;
        while let Some(job) = rx.recv().await {
            job();
        }
    });
    // Tasks go first (a dropped request leaves its buffers to the ring), then the ring, which
    // waits for the kernel to finish with them.
    drop(local);
    drop(rt);
    ring::uninstall();
}

impl Cores {
    pub fn start(cfg: CoresConfig) -> io::Result<Cores> {
        let n = cfg.cores.max(1);
        let mut cores = Vec::with_capacity(n);
        for i in 0..n {
            let (tx, rx) = mpsc::unbounded_channel();
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let stats = Arc::new(RingStats::default());
            let (c, s) = (cfg.clone(), stats.clone());
            let thread = std::thread::Builder::new()
                .name(format!("millrace-core-{i}"))
                .spawn(move || core_main(i, c, rx, s, ready_tx))?;
            ready_rx
                .recv()
                .map_err(|_| io::Error::other(format!("core {i} stopped while starting")))??;
            cores.push(Core {
                tx,
                load: Arc::new(AtomicUsize::new(0)),
                ring: stats,
                thread: Some(thread),
            });
        }
        Ok(Cores { cores })
    }

    pub fn len(&self) -> usize {
        self.cores.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cores.is_empty()
    }

    /// Tasks running on each core now.
    pub fn loads(&self) -> Vec<usize> {
        self.cores
            .iter()
            .map(|c| c.load.load(Ordering::Relaxed))
            .collect()
    }

    /// Core `i`'s ring counters: entries queued, io_uring_enter calls, completion rounds.
    pub fn ring_stats(&self, i: usize) -> &RingStats {
        &self.cores[i].ring
    }

    /// The core running the fewest tasks.
    pub fn least_loaded(&self) -> usize {
        (0..self.cores.len())
            .min_by_key(|&i| self.cores[i].load.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// Runs `make()` on core `core` and spawns the future it returns there. The closure is
    /// Send; the future need not be (it may hold the core's Rc state, and a socket converted
    /// there with `TcpStream::from_std` registers with that core's reactor).
    pub fn spawn_on<F, Fut>(&self, core: usize, make: F) -> CoreTask<Fut::Output>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        let c = &self.cores[core % self.cores.len()];
        let (tx, rx) = oneshot::channel();
        let load = c.load.clone();
        load.fetch_add(1, Ordering::Relaxed);
        let job: Job = Box::new(move || {
            tokio::task::spawn_local(async move {
                struct Done(Arc<AtomicUsize>);
                impl Drop for Done {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                let _done = Done(load);
                let out = make().await;
                let _ = tx.send(out);
            });
        });
        if c.tx.send(job).is_err() {
            c.load.fetch_sub(1, Ordering::Relaxed);
        }
        CoreTask { rx }
    }

    /// [`Cores::spawn_on`] the least-loaded core.
    pub fn spawn<F, Fut>(&self, make: F) -> CoreTask<Fut::Output>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        self.spawn_on(self.least_loaded(), make)
    }
}

impl Drop for Cores {
    fn drop(&mut self) {
        for c in &mut self.cores {
            // Closing the channel ends the core's loop.
            let (dead, _) = mpsc::unbounded_channel();
            drop(std::mem::replace(&mut c.tx, dead));
        }
        for c in &mut self.cores {
            if let Some(t) = c.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// The output of a task spawned on a core. Err: the task was dropped (its core stopped) before
/// it finished. Dropping this handle does not stop the task.
pub struct CoreTask<T> {
    rx: oneshot::Receiver<T>,
}

impl<T> Future for CoreTask<T> {
    type Output = io::Result<T>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx).poll(cx).map(|r| {
            r.map_err(|_| io::Error::other("the task's core stopped before the task finished"))
        })
    }
}

impl<T> CoreTask<T> {
    /// Waits for the task from a thread that is not running an async runtime (tests, the CLI).
    pub fn wait(self) -> io::Result<T> {
        self.rx
            .blocking_recv()
            .map_err(|_| io::Error::other("the task's core stopped before the task finished"))
    }
}
