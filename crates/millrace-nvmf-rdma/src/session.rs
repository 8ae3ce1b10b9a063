//! The target's command handling on an RDMA queue: [`Commands`] over the target's transport-
//! agnostic [`Session`], so a host over RDMA meets the same Connect admission, allow-lists,
//! admin commands and namespaces as over TCP. Read data comes from the registered pool (the
//! session reads the device straight into it) and leaves by RDMA WRITE without a copy.

use crate::commands::{Commands, Exec, Outcome};
use millrace_io::{BufPool, IoBuf};
use millrace_nvmf::cmd::{Cqe, Sqe, Status, Transfer};
use millrace_nvmf::io_commands::IoDone;
use millrace_nvmf::{Action, Session};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What `admit` decided: whether the host's data is fetched first, and the length of the
/// host's buffer for data coming back.
pub struct Admitted {
    fetch: bool,
    c2h_len: usize,
}

/// One RDMA queue's side of the target.
pub struct SessionCommands {
    s: Session,
    pool: BufPool,
    parked: Option<mpsc::Receiver<Cqe>>,
    /// Cancelled when the queue must close; follows the session's own token, which changes
    /// from the target's shutdown to the controller's end at Connect.
    close: CancellationToken,
    watching_controller: bool,
}

impl SessionCommands {
    /// `s` must be a session made for this queue (`Target::session`), with its transport set.
    pub fn new(s: Session, pool: BufPool) -> SessionCommands {
        // Async Event Requests: at most AERL + 1 parked per admin queue.
        let (tx, rx) = mpsc::channel(8);
        let s = s.with_completer(Arc::new(move |c: Cqe| tx.try_send(c).is_ok()));
        let close = CancellationToken::new();
        follow(s.closing(), close.clone());
        SessionCommands {
            s,
            pool,
            parked: Some(rx),
            close,
            watching_controller: false,
        }
    }

    fn outcome(&mut self, a: Action, c2h_len: usize) -> Exec {
        match a {
            Action::Complete { status, result } => {
                if !status.is_success() {
                    self.s.failed();
                }
                Exec::Now(Outcome::Complete { status, result })
            }
            Action::Data { result, .. } if c2h_len == 0 => Exec::Now(Outcome::Complete {
                status: Status::SUCCESS,
                result,
            }),
            Action::Data { data, result } => self.admin_data(data, result, c2h_len),
            Action::Parked => Exec::Now(Outcome::Parked),
            Action::Disconnect => Exec::Now(Outcome::Disconnect),
            Action::Io(cmd) => {
                let errors = self.s.error_counter();
                Exec::Later(Box::pin(async move {
                    match cmd.run().await {
                        IoDone::Status(status) => {
                            if !status.is_success() {
                                errors.add();
                            }
                            Outcome::Complete { status, result: 0 }
                        }
                        IoDone::Read { data, held } => Outcome::Data {
                            result: 0,
                            data,
                            held,
                        },
                    }
                }))
            }
        }
    }

    /// An admin command's data (Identify, a log page) goes to the host from a pool buffer:
    /// RDMA WRITE reaches only registered memory. Padded with zeroes to the host's length.
    fn admin_data(&mut self, data: Vec<u8>, result: u64, len: usize) -> Exec {
        let fill = move |mut b: IoBuf| -> Outcome {
            if b.set_len(len).is_err() {
                return Outcome::err(Status::INTERNAL_ERROR);
            }
            let n = data.len().min(len);
            b[..n].copy_from_slice(&data[..n]);
            b[n..].fill(0);
            Outcome::Data {
                result,
                data: b,
                held: None,
            }
        };
        match self.pool.try_get(len) {
            Ok(Some(b)) => Exec::Now(fill(b)),
            Ok(None) => {
                let pool = self.pool.clone();
                Exec::Later(Box::pin(async move {
                    match pool.get(len).await {
                        Ok(b) => fill(b),
                        Err(_) => Outcome::err(Status::INTERNAL_ERROR),
                    }
                }))
            }
            Err(_) => Exec::Now(Outcome::err(Status::INVALID_FIELD)),
        }
    }
}

/// Cancels `close` when `watched` is cancelled (or stops watching once `close` is).
fn follow(watched: CancellationToken, close: CancellationToken) {
    tokio::spawn(async move {
        tokio::select! {
            _ = watched.cancelled() => close.cancel(),
            _ = close.cancelled() => {}
        }
    });
}

impl Drop for SessionCommands {
    fn drop(&mut self) {
        // Ends the watching task; the session's own drop ends the queue's part in its
        // controller.
        self.close.cancel();
    }
}

impl Commands for SessionCommands {
    type Plan = Admitted;

    fn admit(&mut self, sqe: &Sqe, x: &Transfer) -> Result<Admitted, Status> {
        self.s.received();
        if let Err(st) = self.s.admit_transfer(sqe, x) {
            self.s.failed();
            return Err(st);
        }
        Ok(Admitted {
            fetch: matches!(x, Transfer::FromHost(n) if *n > 0),
            c2h_len: match x {
                Transfer::ToHost(n) => *n,
                _ => 0,
            },
        })
    }

    fn fetches_data(&self, p: &Admitted) -> bool {
        p.fetch
    }

    fn execute(&mut self, sqe: &Sqe, p: Admitted, data: Option<IoBuf>) -> Exec {
        let a = self.s.command(sqe, data, p.c2h_len);
        if self.s.is_connected() && !self.watching_controller {
            // Connected: the queue now ends with its controller (keep-alive timeout, the host
            // taken off the allow-list, the subsystem removed).
            self.watching_controller = true;
            follow(self.s.closing(), self.close.clone());
        }
        self.outcome(a, p.c2h_len)
    }

    fn qid(&self) -> u16 {
        self.s.qid()
    }

    fn is_connected(&self) -> bool {
        self.s.is_connected()
    }

    fn closing(&self) -> CancellationToken {
        self.close.clone()
    }

    fn parked(&mut self) -> Option<mpsc::Receiver<Cqe>> {
        self.parked.take()
    }

    fn share(&self) -> Option<millrace_io::Share> {
        self.s.share().cloned()
    }
}
