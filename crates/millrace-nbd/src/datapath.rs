//! Where connections run and what their payloads live in: the server's cores (one
//! thread-per-core tokio runtime each, `millrace_io::Cores`) and its buffer pool
//! (`millrace_io::BufPool`), shared by every connection. The pool is the global bound on payload
//! memory: a request takes one buffer for its whole payload, and when the pool is empty the
//! connection stops reading from its socket until buffers come back (docs/DATAPATH.md).
//!
//! One client (a TCP source address, or every local-socket client together) may hold at most its
//! share of the pool, so that a client whose connections announce large writes and never send
//! them waits behind its own share instead of taking the whole pool; the payload timeout then
//! closes its stalled connections and gives their buffers back.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;

use millrace_io::{BufPool, Cores, CoresConfig, PoolConfig};

use crate::proto::MAX_PAYLOAD;
use crate::Peer;

/// The cores connections run on and the pool their payloads use.
#[derive(Clone)]
pub struct DataPath {
    pub cores: Arc<Cores>,
    pub pool: BufPool,
}

impl DataPath {
    /// What a server gets when nobody gave it cores and a pool (tests, tools): one core and a
    /// 64 MiB pool whose pages are faulted in as they are first used.
    pub fn small() -> io::Result<DataPath> {
        let pool = BufPool::new(&PoolConfig {
            bytes: 64 << 20,
            slices: 1,
            max_buf: MAX_PAYLOAD as usize,
            populate: false,
        })?;
        let cores = Cores::start(CoresConfig {
            cores: 1,
            pool: Some(pool.clone()),
            ..CoresConfig::default()
        })?;
        Ok(DataPath {
            cores: Arc::new(cores),
            pool,
        })
    }

    /// The largest request this server takes: the pool's largest buffer, within the protocol's
    /// portable 32 MiB.
    pub fn max_payload(&self) -> u32 {
        (self.pool.max_buf() as u64).min(MAX_PAYLOAD as u64) as u32
    }
}

/// Whose share of the pool a connection's requests count against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientKey {
    /// A TCP client's source address (every port of it).
    Ip(IpAddr),
    /// The local-socket clients of one user (its uid, from the socket's peer credentials), or
    /// those whose user is unknown, together.
    Local(Option<u32>),
}

pub(crate) fn client_key(peer: &Peer) -> ClientKey {
    match peer {
        Peer::Unix(uid) => ClientKey::Local(*uid),
        Peer::Tcp(a) => ClientKey::Ip(a.ip().to_canonical()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_share_per_client_address() {
        let a: Peer = Peer::Tcp("10.0.0.1:5000".parse().unwrap());
        let a2: Peer = Peer::Tcp("10.0.0.1:5001".parse().unwrap());
        let a6: Peer = Peer::Tcp("[::ffff:10.0.0.1]:5002".parse().unwrap());
        let b: Peer = Peer::Tcp("10.0.0.2:5000".parse().unwrap());
        assert_eq!(client_key(&a), client_key(&a2), "same address, same share");
        assert_eq!(
            client_key(&a),
            client_key(&a6),
            "an IPv4-mapped address is the same"
        );
        assert_ne!(client_key(&a), client_key(&b));
        assert_eq!(
            client_key(&Peer::Unix(Some(1000))),
            client_key(&Peer::Unix(Some(1000))),
            "one user's local clients share one"
        );
        assert_ne!(
            client_key(&Peer::Unix(Some(1000))),
            client_key(&Peer::Unix(Some(0))),
            "local users have a share each"
        );
        let shares = millrace_io::Shares::default();
        let x = shares.of(client_key(&a), 100);
        assert!(x.same(&shares.of(client_key(&a2), 100)));
        assert!(!x.same(&shares.of(client_key(&Peer::Unix(None)), 100)));
    }
}
