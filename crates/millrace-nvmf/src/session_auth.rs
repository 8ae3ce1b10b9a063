//! A queue's in-band authentication (DH-HMAC-CHAP, `crate::dhchap`): whether Connect asks
//! for it (AUTHREQ.ATR in the Connect result), Authentication Send and Receive, and the
//! outcome, logged (host, address, subsystem, queue, why) and counted per subsystem. Until the
//! transaction succeeds a queue takes only Authentication Send and Receive and Disconnect;
//! other commands get Authentication Required.

use super::{Action, Session};
use crate::cmd::{fctype, Sqe, Status, Transfer};
use crate::dhchap::txn::{Outcome, QueueAuth, MSG_MAX};
use crate::model::Subsystem;
use std::sync::atomic::Ordering;

/// AUTHREQ.ATR in the Connect result (DW0 bit 17): an authentication transaction is required.
pub(super) const CONNECT_ATR: u64 = 1 << 17;

impl Session {
    /// At a successful Connect of `hostnqn` to `s`: the AUTHREQ bits of the result. A host
    /// with a secret on the subsystem must authenticate this queue.
    pub(super) fn auth_at_connect(&mut self, s: &Subsystem, hostnqn: &str) -> u64 {
        if s.auth.keys_of(hostnqn).is_none() {
            self.auth = None;
            return 0;
        }
        self.auth = Some(Box::new(QueueAuth::new(hostnqn, &s.nqn)));
        CONNECT_ATR
    }

    /// Whether the queue may run commands other than authentication.
    pub(super) fn authenticated(&self) -> bool {
        self.auth.as_ref().is_none_or(|a| a.authenticated())
    }

    /// Whether the queue is still being set up: not connected, or connected but not yet
    /// authenticated. A transport holds such a queue to its handshake deadline.
    pub fn is_handshaking(&self) -> bool {
        self.q.is_none() || !self.authenticated()
    }

    /// `admit_transfer` of a connected queue not yet authenticated: only an Authentication
    /// Send's message, of at most 4 KiB.
    pub(super) fn admit_before_auth(&self, sqe: &Sqe, x: &Transfer) -> Result<(), Status> {
        let send = sqe.is_fabrics() && sqe.fctype() == fctype::AUTH_SEND;
        match (send, x) {
            (true, Transfer::FromHost(n)) if *n <= MSG_MAX => Ok(()),
            (true, _) => Err(Status::INVALID_FIELD),
            (false, _) => Err(Status::AUTH_REQUIRED),
        }
    }

    /// Authentication Send and Receive.
    pub(super) fn auth_command(&mut self, sqe: &Sqe, data: Option<&[u8]>) -> Action {
        let Some(q) = &self.q else {
            return Action::status(Status::COMMAND_SEQUENCE_ERROR);
        };
        let (subsys, ctrl) = (q.ctrl.subsys.clone(), q.ctrl.clone());
        let qid = q.qid;
        // A host without a secret here has nothing to authenticate with.
        let Some(a) = self.auth.as_mut() else {
            return Action::status(Status::INVALID_FIELD);
        };
        let (action, outcome) = if sqe.fctype() == fctype::AUTH_SEND {
            let keys = subsys.auth.keys_of(&ctrl.hostnqn);
            let (st, out) = a.send(sqe, data.unwrap_or(&[]), keys);
            (Action::status(st), out)
        } else {
            match a.receive(sqe) {
                (Ok(data), out) => (Action::Data { data, result: 0 }, out),
                (Err(st), out) => (Action::status(st), out),
            }
        };
        if outcome.is_some() {
            a.settle();
        }
        let (hash, group) = a.agreed().map_or(("-", "-"), |(h, g)| (h.name(), g.name()));
        match outcome {
            Some(Outcome::Succeeded) => {
                subsys.auth.succeeded.fetch_add(1, Ordering::Relaxed);
                tracing::info!(peer = %self.peer, host = %ctrl.hostnqn, subsystem = %subsys.nqn, qid, hash, group, "a host authenticated (DH-HMAC-CHAP)");
            }
            Some(Outcome::Failed(why)) => self.auth_refused(&subsys, &ctrl.hostnqn, qid, &why),
            None => {}
        }
        action
    }

    /// Counts and logs (rate-limited) a refused authentication.
    fn auth_refused(&self, subsys: &Subsystem, hostnqn: &str, qid: u16, why: &str) {
        subsys.auth.failed.fetch_add(1, Ordering::Relaxed);
        if let Some(n) = self.t.connect_log.allow() {
            tracing::warn!(peer = %self.peer, transport = self.transport.kind.as_str(), host = %hostnqn, subsystem = %subsys.nqn, qid, "refused an authentication: {why} ({n} more refusals not logged)");
        }
    }

    /// At the queue's end: a queue told to authenticate that closes before any transaction
    /// ended was refused too (the Linux host without a secret hangs up right after Connect),
    /// and is counted and logged as such.
    pub(super) fn auth_at_close(&self) {
        let (Some(q), Some(a)) = (&self.q, &self.auth) else {
            return;
        };
        if a.abandoned() {
            let why =
                "the host closed the queue without authenticating (it has no secret, or gave up)";
            self.auth_refused(&q.ctrl.subsys, &q.ctrl.hostnqn, q.qid, why);
        }
    }
}
