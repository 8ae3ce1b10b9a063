//! The rebuild as a pipeline (`Array::rebuild_pipelined`): windows of rows read from the
//! surviving members on reader threads, computed on the calling thread and written to the new
//! members on writer threads, all at once, with the checkpoint moved in row order.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::rebuild::{Computed, Loaded};
use super::{Array, Result};
use crate::aligned::AlignedBuf;

/// Windows each I/O stage of the rebuild pipeline keeps in flight: with one, a drive idled
/// between finishing a window and being given the next (its latency and the threads' wake-ups,
/// every window).
const STAGE_DEPTH: usize = 2;

/// Windows whose buffers the pipeline holds at once: STAGE_DEPTH read, one computed,
/// STAGE_DEPTH written.
const WINDOWS_HELD: u64 = 2 * STAGE_DEPTH as u64 + 1;

/// Reader threads, each keeping its own spare buffers (`aligned::recycle`).
const READER_THREADS: usize = STAGE_DEPTH;

/// What a rebuild's buffers may hold at once unless set (`Array::set_rebuild_memory`): the
/// server's default buffer pool.
pub(super) const DEFAULT_REBUILD_MEMORY: u64 = 256 << 20;

/// The nice value of the rebuild pipeline's reader and writer threads, below the default. They
/// mostly wait on drives and hand work on, so they take little CPU; but when one wakes while
/// the computation and other work hold every core, the scheduler let it wait for a time slice
/// (about 5 ms, in 100 of 240 windows of an idle rebuild on two cores) and the drives idled
/// meanwhile: at -10 the simulated 16-drive rebuild went from 0.81-0.82 to 0.89 of the new
/// drive's rate (docs/PERFORMANCE.md).
const IO_THREAD_NICE: i32 = -10;

/// Gives this thread [`IO_THREAD_NICE`] where the process may (CAP_SYS_NICE or RLIMIT_NICE);
/// elsewhere it keeps the default priority, as before.
fn favour_this_thread() {
    // SAFETY: setpriority takes plain values; on Linux PRIO_PROCESS with 0 names the calling
    // thread alone.
    let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, IO_THREAD_NICE) };
}

impl Array {
    /// (smallest, first, largest) rows per batch of an adaptive rebuild: from an eighth of the
    /// default batch under client load to four times it idle, none of them so large that the
    /// windows in flight and the reader threads' spare buffers hold more than the rebuild's
    /// memory (`set_rebuild_memory`); exactly the rows set with `set_rebuild_batch_rows`.
    pub fn rebuild_batch_bounds(&self) -> (u64, u64, u64) {
        let n = self.rebuild_batch_rows();
        if self.rebuild_batch.load(Ordering::Relaxed) != 0 {
            return (n, n, n);
        }
        let spares = (READER_THREADS * crate::aligned::SPARE_BYTES) as u64;
        let room = self
            .rebuild_memory
            .load(Ordering::Relaxed)
            .saturating_sub(spares);
        let row = (self.geo.strip * self.geo.members as u64).max(1);
        // A window also fits a reader's spares whole: one that did not came back in part, and
        // the rest was allocated and zeroed afresh every window (a third slower).
        let spare_rows = crate::aligned::SPARE_BYTES as u64 / row;
        let cap = (room / (row * WINDOWS_HELD)).min(spare_rows).max(1);
        ((n / 8).max(1).min(cap), n.min(cap), (n * 4).min(cap))
    }

    /// Bounds the bytes of buffers a rebuild holds at once (about; at least one row's windows):
    /// the server sets its buffer pool's size, so rebuilding beside the data path at most
    /// doubles what `--buffer-pool` allows for data. Unset: 256 MiB.
    pub fn set_rebuild_memory(&self, bytes: u64) {
        self.rebuild_memory.store(bytes, Ordering::Relaxed);
    }

    /// Rebuilds from row `start` as a pipeline: while earlier windows are written to their
    /// targets (on writer threads), the next one's strips are computed here and the ones after
    /// are read (on reader threads, each with its own ring), so the surviving drives, the CPU
    /// and the new drive all stay busy; with the stages taking turns the new drive idled while
    /// parity was computed. Each I/O stage keeps [`STAGE_DEPTH`] windows in flight, so a drive
    /// is given its next window before it finishes the one before. `between` runs after each
    /// window is written, in row order, with the row reached (everything before it rebuilt),
    /// and returns the rows of the windows not yet asked for (0: stop). Returns the row reached.
    pub fn rebuild_pipelined(
        &self,
        start: u64,
        first_count: u64,
        mut between: impl FnMut(u64) -> u64,
    ) -> Result<u64> {
        // The windows in flight (STAGE_DEPTH read, one computed, STAGE_DEPTH written) lock
        // disjoint shards (see `locks`), so no stage ever waits on a window another holds.
        let cap = (super::locks::SHARDS / (2 * STAGE_DEPTH + 1)) as u64;
        let rows = self.geo.rows();
        let start = start.min(rows);
        if start == rows {
            return Ok(start);
        }
        std::thread::scope(|s| {
            let (ask, asked) = std::sync::mpsc::channel::<ReadJob>();
            let (write, to_write) = std::sync::mpsc::channel::<WriteJob>();
            // Written windows' buffers go back to the readers, whose `scratch` reuses them
            // instead of allocating and zeroing a batch of buffers every window.
            let (spent_tx, spent_rx) = std::sync::mpsc::channel::<Vec<AlignedBuf>>();
            let (asked, to_write) = (Arc::new(Mutex::new(asked)), Arc::new(Mutex::new(to_write)));
            let spent_rx = Arc::new(Mutex::new(spent_rx));
            let turn = Arc::new(Turn::new(start));
            for _ in 0..STAGE_DEPTH {
                let (asked, spent_rx, turn) = (asked.clone(), spent_rx.clone(), turn.clone());
                s.spawn(move || self.read_ahead(&asked, &spent_rx, &turn));
                let (to_write, spent_tx) = (to_write.clone(), spent_tx.clone());
                s.spawn(move || self.write_behind(&to_write, &spent_tx));
            }
            let mut p = Pipeline {
                ask,
                write,
                reading: VecDeque::new(),
                writing: VecDeque::new(),
                asked_to: start,
                reached: start,
                rows,
                size: first_count.clamp(1, cap),
                cap,
            };
            p.ask_ahead();
            let mut going = true;
            while going {
                let Some(reply) = p.reading.pop_front() else {
                    break;
                };
                let cur = reply.recv().expect("a reader answers every window");
                p.ask_ahead();
                going = self.compute_and_send(&mut p, cur, &mut between)?;
            }
            // Windows read ahead but not wanted are dropped with their locks, unwritten; those
            // being written are waited for, so the checkpoint saved is where the members are.
            while !p.writing.is_empty() {
                p.collect_oldest(self, &mut between)?;
            }
            Ok(p.reached)
        })
    }

    /// Computes a window read by the pipeline and hands it to the writers, after the oldest
    /// write (told to `between`) where STAGE_DEPTH are under way; false: `between` said stop.
    /// A window to go row by row (or an error) waits for every write before it, so
    /// checkpoints move in order.
    fn compute_and_send<'a>(
        &'a self,
        p: &mut Pipeline<'a>,
        cur: Loaded<'a>,
        between: &mut impl FnMut(u64) -> u64,
    ) -> Result<bool> {
        let end = cur.first + cur.count;
        let mut going = true;
        if cur.guard.is_none() || cur.error.is_some() {
            while !p.writing.is_empty() {
                going &= p.collect_oldest(self, between)?;
            }
            self.compute_window(cur)?;
            p.reached = end;
            return Ok(p.tell(between) && going);
        }
        let targets = cur.targets.clone();
        let computed = self.compute_window(cur)?;
        while p.writing.len() >= STAGE_DEPTH {
            going &= p.collect_oldest(self, between)?;
        }
        let reply = computed.map(|c| {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            p.write
                .send(WriteJob { c, reply: tx })
                .expect("the writers live as long as the pipeline");
            rx
        });
        p.writing.push_back(Writing {
            reply,
            targets,
            end,
        });
        Ok(going)
    }

    /// A pipeline reader: loads each window asked for, reusing the buffers of windows written
    /// since.
    fn read_ahead<'a>(
        &'a self,
        asked: &Mutex<Receiver<ReadJob<'a>>>,
        spent: &Mutex<Receiver<Vec<AlignedBuf>>>,
        turn: &Turn,
    ) {
        favour_this_thread();
        loop {
            let Ok(job) = asked.lock().recv() else {
                return;
            };
            // One written window's buffers per window read: a reader that took them all would
            // keep only what its own spares hold and drop the rest, while the other reader
            // allocated and zeroed fresh ones.
            crate::aligned::recycle(spent.lock().try_iter().take(1).flatten());
            turn.wait(job.first);
            let mut loaded = self.lock_window(job.first, job.count);
            turn.pass(job.first + job.count);
            self.read_locked(&mut loaded);
            self.settle_members();
            // The pipeline may have stopped meanwhile: then the window is dropped, unwritten.
            let _ = job.reply.send(loaded);
        }
    }

    /// A pipeline writer: writes each computed window, answers, and hands its buffers back to
    /// the readers. The checkpoint is the pipeline's to move, in order.
    fn write_behind<'a>(
        &'a self,
        to_write: &Mutex<Receiver<WriteJob<'a>>>,
        spent_to: &Sender<Vec<AlignedBuf>>,
    ) {
        favour_this_thread();
        loop {
            let Ok(job) = to_write.lock().recv() else {
                return;
            };
            let mut spent = Vec::new();
            self.write_window_data(job.c, &mut spent);
            let _ = spent_to.send(spent);
            let _ = job.reply.send(());
        }
    }
}

/// Which window the pipeline's readers may lock next. They take windows' locks in row order,
/// the order the pipeline consumes them in: a reader that locked a later window first could
/// hold a shard a client request waits for while that request holds one the earlier window
/// needs, and the later window is not released until the earlier one is computed (a deadlock,
/// seen in the crash tests).
struct Turn {
    next: Mutex<u64>,
    moved: Condvar,
}

impl Turn {
    fn new(start: u64) -> Turn {
        Turn {
            next: Mutex::new(start),
            moved: Condvar::new(),
        }
    }

    /// Waits until the window starting at `first` is next.
    fn wait(&self, first: u64) {
        let mut next = self.next.lock();
        while *next != first {
            self.moved.wait(&mut next);
        }
    }

    /// Makes the window starting at `to` next.
    fn pass(&self, to: u64) {
        *self.next.lock() = to;
        self.moved.notify_all();
    }
}

/// A window for a pipeline reader: its rows, and where to answer.
struct ReadJob<'a> {
    first: u64,
    count: u64,
    reply: SyncSender<Loaded<'a>>,
}

/// A computed window for a pipeline writer, and where to say it is written.
struct WriteJob<'a> {
    c: Computed<'a>,
    reply: SyncSender<()>,
}

/// A window handed to the writers (or with nothing to write), in row order.
struct Writing {
    reply: Option<Receiver<()>>,
    targets: Vec<usize>,
    end: u64,
}

/// The main thread's side of `rebuild_pipelined`: windows asked of the readers and given to
/// the writers, in row order, and the row every window before has been written up to.
struct Pipeline<'a> {
    ask: Sender<ReadJob<'a>>,
    write: Sender<WriteJob<'a>>,
    reading: VecDeque<Receiver<Loaded<'a>>>,
    writing: VecDeque<Writing>,
    asked_to: u64,
    reached: u64,
    rows: u64,
    size: u64,
    cap: u64,
}

impl<'a> Pipeline<'a> {
    /// Keeps STAGE_DEPTH windows asked of the readers, up to the last row.
    fn ask_ahead(&mut self) {
        while self.reading.len() < STAGE_DEPTH && self.asked_to < self.rows {
            // `size` is within 1..=cap (see `tell`).
            let count = self.size.min(self.rows - self.asked_to);
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let job = ReadJob {
                first: self.asked_to,
                count,
                reply: tx,
            };
            self.ask
                .send(job)
                .expect("the readers live as long as the pipeline");
            self.reading.push_back(rx);
            self.asked_to += count;
        }
    }

    /// Waits for the oldest window given to the writers, moves the checkpoint past it and
    /// tells `between`; false: `between` said stop.
    fn collect_oldest(&mut self, a: &Array, between: &mut impl FnMut(u64) -> u64) -> Result<bool> {
        let Some(w) = self.writing.pop_front() else {
            return Ok(true);
        };
        if let Some(r) = w.reply {
            r.recv().expect("a writer answers every window");
        }
        a.advance_rebuilt(&w.targets, w.end);
        self.reached = w.end;
        a.offline_or_ok()?;
        Ok(self.tell(between))
    }

    /// Tells `between` the row reached and takes the rows it wants next; false: stop.
    fn tell(&mut self, between: &mut impl FnMut(u64) -> u64) -> bool {
        match between(self.reached) {
            0 => false,
            wanted => {
                self.size = wanted.clamp(1, self.cap);
                true
            }
        }
    }
}
