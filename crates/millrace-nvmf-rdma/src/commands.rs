//! What the RDMA transport needs from the target's command handling, per queue. The NVMe-oF
//! target implements it (its per-queue session: Connect, properties, admin, I/O, discovery);
//! the transport only moves capsules and data.

use millrace_io::share::{Held, Share};
use millrace_io::IoBuf;
use millrace_nvmf::cmd::{Cqe, Sqe, Status, Transfer};
use std::future::Future;
use std::pin::Pin;
use tokio_util::sync::CancellationToken;

/// How a command ends.
pub enum Outcome {
    /// Complete with this status and result (DW0, DW1).
    Complete { status: Status, result: u64 },
    /// Place `data` (its length is what goes) in the host's memory, then complete with success;
    /// `held`, the bytes of the host's share of the pool the buffer counts against, goes back
    /// with the buffer.
    Data {
        result: u64,
        data: IoBuf,
        held: Option<Held>,
    },
    /// Completed later through the queue's parked-completion channel (Async Event Requests).
    Parked,
    /// Complete with success, then close the queue.
    Disconnect,
}

impl Outcome {
    pub fn err(status: Status) -> Outcome {
        Outcome::Complete { status, result: 0 }
    }
}

/// A command's handling: done now, or a future that awaits the device.
pub enum Exec {
    Now(Outcome),
    Later(Pin<Box<dyn Future<Output = Outcome> + Send>>),
}

/// The target's side of one queue.
pub trait Commands: Send + 'static {
    /// What `admit` decided, handed back to `execute`.
    type Plan: Send + 'static;
    /// Whether the queue takes `sqe` whose data travels as `x`; nothing is held when refused.
    fn admit(&mut self, sqe: &Sqe, x: &Transfer) -> Result<Self::Plan, Status>;
    /// Whether the host's data must be fetched before `execute` (writes; not a Flush).
    fn fetches_data(&self, p: &Self::Plan) -> bool;
    /// Runs an admitted command with its data (in-capsule or fetched).
    fn execute(&mut self, sqe: &Sqe, p: Self::Plan, data: Option<IoBuf>) -> Exec;
    /// The queue id once connected (0 before Connect and on admin queues).
    fn qid(&self) -> u16;
    /// Whether Connect has bound this queue to a controller.
    fn is_connected(&self) -> bool;
    /// Cancelled when the queue must close (its controller went away, the target stops).
    fn closing(&self) -> CancellationToken;
    /// Takes the receiving end of completions for parked commands (once, at start).
    fn parked(&mut self) -> Option<tokio::sync::mpsc::Receiver<Cqe>>;
    /// The connected host's share of the pool, taken before a buffer for its data (None: no
    /// share, only the pool bounds the queue).
    fn share(&self) -> Option<Share> {
        None
    }
}
