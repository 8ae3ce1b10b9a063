//! The controller's side of DH-HMAC-CHAP on one queue. The host sends AUTH_Negotiate
//! (Authentication Send), takes the Challenge (Authentication Receive), sends its Reply, takes
//! Success1 or Failure1, and, when it asked the controller to prove itself, sends Success2 (or
//! Failure2). The queue counts as authenticated only once Success1 has been taken (or, in the
//! bidirectional case, Success2 received); nothing before that grants anything.
//!
//! Statuses: a Send or Receive whose SECP, SPSP0, SPSP1 or length is wrong gets Invalid Field
//! in Command; a message that cannot be decoded gets Invalid Field too; a message out of order
//! (a Reply with no transaction, a Negotiate in the middle of one, a Receive with nothing to
//! take) gets Command Sequence Error. Either ends the transaction in progress, if there is one,
//! whose AUTH_Failure1 the next Receive returns. A message in order but wrong (another transaction's id, a bad DH
//! value, a response that does not match) is taken (success) and answered with AUTH_Failure1.

use super::ffdhe::KeyPair;
use super::msg::{self, why, Challenge, Msg, Negotiate, Reply};
use super::{augment, response, same, DhGroup, Hash, HostKeys, Role};
use crate::cmd::{Sqe, Status};

/// The largest message a host may send (an ffdhe8192 Reply with SHA-512 is 1,168 bytes).
pub(crate) const MSG_MAX: usize = 4096;

/// The groups in the order the controller prefers them, among those the host offers.
const GROUP_ORDER: [DhGroup; 6] = [
    DhGroup::Ffdhe2048,
    DhGroup::Ffdhe3072,
    DhGroup::Ffdhe4096,
    DhGroup::Ffdhe6144,
    DhGroup::Ffdhe8192,
    DhGroup::Null,
];

/// How a transaction ended, for the log and the counters.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Succeeded,
    /// Why, as a sentence fragment ("its response does not match ...").
    Failed(String),
}

struct Txn {
    tid: u16,
    hash: Hash,
    c1: Vec<u8>,
    s1: u32,
    dh: Option<KeyPair>,
    keys: HostKeys,
}

enum Then {
    Done,
    AwaitSuccess2(u16),
    Failed,
}

enum State {
    Idle,
    /// The Challenge waits for Authentication Receive.
    Challenge(Box<Txn>, Vec<u8>),
    AwaitReply(Box<Txn>),
    /// Success1 or Failure1 waits for Authentication Receive.
    Answer(Vec<u8>, Then),
    AwaitSuccess2(u16),
}

/// One queue's authentication.
pub(crate) struct QueueAuth {
    hostnqn: String,
    subnqn: String,
    state: State,
    authenticated: bool,
    seq: u32,
    /// The hash and group of the last transaction begun, for the log.
    agreed: Option<(Hash, DhGroup)>,
    /// Whether a transaction has ended (either way) since the Connect: a queue closed before
    /// any did is a refusal nobody else counts (the Linux host without a secret hangs up at
    /// once).
    settled: bool,
}

type Sent = (Status, Option<Outcome>);

impl QueueAuth {
    pub(crate) fn new(hostnqn: &str, subnqn: &str) -> QueueAuth {
        let r = super::random_bytes(4);
        QueueAuth {
            hostnqn: hostnqn.into(),
            subnqn: subnqn.into(),
            state: State::Idle,
            authenticated: false,
            seq: u32::from_le_bytes([r[0], r[1], r[2], r[3]]) >> 1,
            agreed: None,
            settled: false,
        }
    }

    pub(crate) fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// The hash and DH group of the last transaction begun.
    pub(crate) fn agreed(&self) -> Option<(Hash, DhGroup)> {
        self.agreed
    }

    /// Notes that a transaction ended (its outcome counted).
    pub(crate) fn settle(&mut self) {
        self.settled = true;
    }

    /// Whether the queue was never authenticated and no transaction of it ended: closed now,
    /// its host gave up without a word (or never began).
    pub(crate) fn abandoned(&self) -> bool {
        !self.authenticated && !self.settled
    }

    /// Authentication Send with its data; `keys` are the host's secrets now (a rotated key
    /// is used from the next Negotiate on).
    pub(crate) fn send(&mut self, sqe: &Sqe, data: &[u8], keys: Option<HostKeys>) -> Sent {
        if !fields_ok(sqe) || sqe.cdw(11) as usize != data.len() || data.len() > MSG_MAX {
            return (Status::INVALID_FIELD, None);
        }
        let m = match Msg::decode(data) {
            Ok(m) => m,
            Err(e) => return self.fail(0, why::INCORRECT_PAYLOAD, Status::INVALID_FIELD, e),
        };
        let state = std::mem::replace(&mut self.state, State::Idle);
        match (state, m) {
            (State::Idle, Msg::Negotiate(n)) => self.negotiate(n, keys),
            (State::AwaitReply(t), Msg::Reply(r)) => self.reply(*t, r),
            (State::AwaitSuccess2(tid), Msg::Success2 { tid: got }) if got == tid => {
                self.authenticated = true;
                (Status::SUCCESS, Some(Outcome::Succeeded))
            }
            (State::AwaitSuccess2(tid), Msg::Failure { first: false, .. }) => self.fail(
                tid,
                why::FAILED,
                Status::SUCCESS,
                "the host did not accept the controller's response (a wrong controller secret on one side)",
            ),
            (State::AwaitSuccess2(tid), Msg::Success2 { .. }) => self.fail(
                tid,
                why::INCORRECT_PAYLOAD,
                Status::SUCCESS,
                "a Success2 with another transaction's id",
            ),
            // Outside a transaction there is none to end.
            (State::Idle, _) => (
                Status::COMMAND_SEQUENCE_ERROR,
                Some(Outcome::Failed("a message outside a transaction".into())),
            ),
            (_, m) => self.fail(
                m.tid(),
                why::INCORRECT_MESSAGE,
                Status::COMMAND_SEQUENCE_ERROR,
                "a message out of order",
            ),
        }
    }

    /// Authentication Receive: the message waiting for the host.
    pub(crate) fn receive(&mut self, sqe: &Sqe) -> (Result<Vec<u8>, Status>, Option<Outcome>) {
        if !fields_ok(sqe) {
            return (Err(Status::INVALID_FIELD), None);
        }
        let al = sqe.cdw(11) as usize;
        let len = match &self.state {
            State::Challenge(_, m) | State::Answer(m, _) => m.len(),
            State::Idle => {
                let why = "an Authentication Receive outside a transaction";
                return (
                    Err(Status::COMMAND_SEQUENCE_ERROR),
                    Some(Outcome::Failed(why.into())),
                );
            }
            _ => {
                let w = "an Authentication Receive where a message was due";
                let (_, why) = self.fail(0, why::INCORRECT_MESSAGE, Status::SUCCESS, w);
                return (Err(Status::COMMAND_SEQUENCE_ERROR), why);
            }
        };
        if al < len {
            return (Err(Status::INVALID_FIELD), None);
        }
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Challenge(t, m) => {
                self.state = State::AwaitReply(t);
                (Ok(m), None)
            }
            State::Answer(m, Then::Done) => {
                self.authenticated = true;
                (Ok(m), Some(Outcome::Succeeded))
            }
            State::Answer(m, Then::AwaitSuccess2(tid)) => {
                self.state = State::AwaitSuccess2(tid);
                (Ok(m), None)
            }
            State::Answer(m, Then::Failed) => (Ok(m), None),
            // Checked above.
            _ => (Err(Status::COMMAND_SEQUENCE_ERROR), None),
        }
    }

    /// Ends the transaction: the queue is no longer authenticated, and AUTH_Failure1 waits
    /// for the next Receive.
    fn fail(&mut self, tid: u16, code: u8, st: Status, why: &str) -> Sent {
        self.authenticated = false;
        let m = Msg::Failure {
            tid,
            first: true,
            why: code,
        };
        self.state = State::Answer(m.encode(), Then::Failed);
        (st, Some(Outcome::Failed(why.into())))
    }

    fn negotiate(&mut self, n: Negotiate, keys: Option<HostKeys>) -> Sent {
        let ok = Status::SUCCESS;
        let Some(keys) = keys else {
            return self.fail(
                n.tid,
                why::FAILED,
                ok,
                "the host has no secret here any more",
            );
        };
        if n.sc_c != 0 {
            let w = "it asked for a secure channel, which this target does not offer";
            return self.fail(n.tid, why::SCC_MISMATCH, ok, w);
        }
        let Some(hash) = [Hash::Sha512, Hash::Sha384, Hash::Sha256]
            .into_iter()
            .find(|h| n.hashes.contains(&h.id()))
        else {
            return self.fail(n.tid, why::HASH_NOT_USABLE, ok, "it offered no known hash");
        };
        let Some(group) = GROUP_ORDER.into_iter().find(|g| n.groups.contains(&g.id())) else {
            return self.fail(
                n.tid,
                why::GROUP_NOT_USABLE,
                ok,
                "it offered no known group",
            );
        };
        self.seq = self.seq.wrapping_add(1).max(1);
        self.agreed = Some((hash, group));
        let dh = KeyPair::new(group);
        let t = Txn {
            tid: n.tid,
            hash,
            c1: super::random_bytes(hash.bytes()),
            s1: self.seq,
            dh,
            keys,
        };
        let m = Msg::Challenge(Challenge {
            tid: t.tid,
            hash,
            group,
            seqnum: t.s1,
            c1: t.c1.clone(),
            dhv: t.dh.as_ref().map_or(Vec::new(), |d| d.public.clone()),
        });
        self.state = State::Challenge(Box::new(t), m.encode());
        (ok, None)
    }

    fn reply(&mut self, t: Txn, r: Reply) -> Sent {
        let ok = Status::SUCCESS;
        let bad = why::INCORRECT_PAYLOAD;
        if r.tid != t.tid {
            return self.fail(t.tid, bad, ok, "a Reply with another transaction's id");
        }
        if r.r1.len() != t.hash.bytes() {
            return self.fail(
                t.tid,
                bad,
                ok,
                "a Reply whose response is not the hash's length",
            );
        }
        let shared = match (&t.dh, r.dhv.is_empty()) {
            (None, true) => None,
            (None, false) => return self.fail(t.tid, bad, ok, "a DH value with the null group"),
            (Some(d), _) => match d.shared(&r.dhv) {
                Ok(s) => Some(s),
                Err(e) => return self.fail(t.tid, bad, ok, e),
            },
        };
        let kh = t.keys.host.transformed(&self.hostnqn);
        let ca1 = augment(t.hash, shared.as_ref().map(|s| s.as_slice()), &t.c1);
        let want = response(
            t.hash,
            &kh,
            &ca1,
            t.s1,
            t.tid,
            Role::Host,
            &self.hostnqn,
            &self.subnqn,
        );
        if !same(&want, &r.r1) {
            let w = "its response does not match (a wrong or missing host secret)";
            return self.fail(t.tid, why::FAILED, ok, w);
        }
        let Some(c2) = r.c2 else {
            let m = Msg::success1(t.tid, None, t.hash.bytes());
            self.state = State::Answer(m, Then::Done);
            return (ok, None);
        };
        let Some(kc) = &t.keys.ctrl else {
            let w = "it asked the controller to prove itself, but no controller secret is set";
            return self.fail(t.tid, why::FAILED, ok, w);
        };
        if r.seqnum == 0 || c2.len() != t.hash.bytes() {
            return self.fail(
                t.tid,
                bad,
                ok,
                "a bidirectional Reply without its sequence number",
            );
        }
        let kc = kc.transformed(&self.subnqn);
        let ca2 = augment(t.hash, shared.as_ref().map(|s| s.as_slice()), &c2);
        let r2 = response(
            t.hash,
            &kc,
            &ca2,
            r.seqnum,
            t.tid,
            Role::Controller,
            &self.hostnqn,
            &self.subnqn,
        );
        let m = Msg::success1(t.tid, Some(&r2), t.hash.bytes());
        self.state = State::Answer(m, Then::AwaitSuccess2(t.tid));
        (ok, None)
    }
}

/// SECP E9h, SPSP0 01h, SPSP1 01h (CDW10 bytes 1 to 3).
fn fields_ok(sqe: &Sqe) -> bool {
    let c = sqe.cdw(10).to_le_bytes();
    c[1] == msg::SPSP0 && c[2] == msg::SPSP1 && c[3] == msg::SECP
}
