//! The host's side of DH-HMAC-CHAP (for tests of the target): one transaction on a connected
//! queue, and the raw Authentication Send and Receive commands.

use super::{Error, HostQueue};
use crate::cmd::{fctype, Sqe};
use crate::dhchap::ffdhe::KeyPair;
use crate::dhchap::msg::{self, Msg, Negotiate, Reply};
use crate::dhchap::{augment, random_bytes, response, same, DhGroup, Hash, Role, Secret};

/// What a host authenticates with.
#[derive(Clone, Debug)]
pub struct HostAuth {
    pub secret: Secret,
    /// The controller's secret: with it the host asks the controller to prove itself.
    pub ctrl_secret: Option<Secret>,
    /// Offered in the Negotiate (the controller picks).
    pub hashes: Vec<Hash>,
    pub groups: Vec<DhGroup>,
}

impl HostAuth {
    /// Every hash and group offered, as the Linux host does.
    pub fn new(secret: Secret, ctrl_secret: Option<Secret>) -> HostAuth {
        HostAuth {
            secret,
            ctrl_secret,
            hashes: Hash::ALL.to_vec(),
            groups: DhGroup::ALL.to_vec(),
        }
    }
}

/// The largest message the host takes (Authentication Receive's allocation length).
const RECEIVE_LEN: usize = 4096;

/// Authentication Send or Receive's SQE: SECP E9h, SPSP0 and SPSP1 01h, and the length.
pub fn auth_sqe(fctype: u8, len: usize) -> Sqe {
    let mut s = Sqe::fabrics(fctype, 0);
    s.set_cdw(
        10,
        u32::from_le_bytes([0, msg::SPSP0, msg::SPSP1, msg::SECP]),
    );
    s.set_cdw(11, len as u32);
    s
}

impl HostQueue {
    /// Authentication Send of `m` as it is.
    pub async fn auth_send(&self, m: &[u8]) -> Result<(), Error> {
        let s = auth_sqe(fctype::AUTH_SEND, m.len());
        self.submit(s, Some(m.to_vec()), 0).await.map(|_| ())
    }

    /// Authentication Receive of at most `len` bytes.
    pub async fn auth_receive(&self, len: usize) -> Result<Vec<u8>, Error> {
        let s = auth_sqe(fctype::AUTH_RECEIVE, len);
        Ok(self.submit(s, None, len).await?.data)
    }

    async fn auth_next(&self) -> Result<Msg, Error> {
        let b = self.auth_receive(RECEIVE_LEN).await?;
        match Msg::decode(&b) {
            Ok(Msg::Failure { why, .. }) => Err(Error::Protocol(format!(
                "the target refused the authentication (AUTH_Failure1, reason {why:#04x})"
            ))),
            Ok(m) => Ok(m),
            Err(e) => Err(Error::Protocol(format!("an authentication message: {e}"))),
        }
    }

    /// One DH-HMAC-CHAP transaction with transaction id `tid`: Negotiate, Challenge, Reply,
    /// Success1, and Success2 (or Failure2) when the host asks the controller to prove itself.
    pub async fn authenticate(
        &self,
        a: &HostAuth,
        hostnqn: &str,
        subnqn: &str,
        tid: u16,
    ) -> Result<(), Error> {
        let n = Msg::Negotiate(Negotiate {
            tid,
            sc_c: 0,
            hashes: a.hashes.iter().map(|h| h.id()).collect(),
            groups: a.groups.iter().map(|g| g.id()).collect(),
        });
        self.auth_send(&n.encode()).await?;
        let Msg::Challenge(c) = self.auth_next().await? else {
            return Err(Error::Protocol(
                "the target did not send a Challenge".into(),
            ));
        };
        let (shared, dhv) = match KeyPair::new(c.group) {
            None => (None, Vec::new()),
            Some(mut kp) => {
                let s = kp.shared(&c.dhv).map_err(|e| Error::Protocol(e.into()))?;
                (Some(s), std::mem::take(&mut kp.public))
            }
        };
        let kh = a.secret.transformed(hostnqn);
        let ca1 = augment(c.hash, shared.as_ref().map(|s| s.as_slice()), &c.c1);
        let r1 = response(
            c.hash,
            &kh,
            &ca1,
            c.seqnum,
            tid,
            Role::Host,
            hostnqn,
            subnqn,
        );
        let c2 = a.ctrl_secret.as_ref().map(|_| random_bytes(c.hash.bytes()));
        let s2 = if c2.is_some() { 0x5eed_0001 } else { 0 };
        let reply = Reply {
            tid,
            r1,
            c2: c2.clone(),
            seqnum: s2,
            dhv,
        };
        self.auth_send(&Msg::Reply(reply).encode()).await?;
        let Msg::Success1 { r2, .. } = self.auth_next().await? else {
            return Err(Error::Protocol("the target did not send Success1".into()));
        };
        let (Some(kc), Some(c2)) = (&a.ctrl_secret, c2) else {
            return Ok(());
        };
        let ca2 = augment(c.hash, shared.as_ref().map(|s| s.as_slice()), &c2);
        let want = response(
            c.hash,
            &kc.transformed(subnqn),
            &ca2,
            s2,
            tid,
            Role::Controller,
            hostnqn,
            subnqn,
        );
        if r2.is_some_and(|r| same(&r, &want)) {
            return self.auth_send(&Msg::Success2 { tid }.encode()).await;
        }
        let f = Msg::Failure {
            tid,
            first: false,
            why: msg::why::FAILED,
        };
        let _ = self.auth_send(&f.encode()).await;
        Err(Error::Protocol(
            "the controller's response does not match its secret".into(),
        ))
    }
}
