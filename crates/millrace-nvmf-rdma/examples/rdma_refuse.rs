//! A probe of the NVMe/RDMA transport with the stock Linux host, before the target's command
//! handling is wired to it: a port whose every queue fetches the host's Connect data (RDMA READ
//! of the keyed SGL the Linux host sends on the admin queue), prints the host and subsystem
//! NQNs it read, and refuses the Connect as "host not allowed" (SEND with invalidate). The
//! guest test runs it and checks the host's refusal and the NQNs printed.
//!   usage: rdma_refuse ADDR:PORT

use millrace_io::{BufPool, Cores, CoresConfig, IoBuf, PoolConfig};
use millrace_nvmf::cmd::{fctype, ConnectData, Cqe, Sqe, Status, Transfer};
use millrace_nvmf_rdma::commands::{Commands, Exec, Outcome};
use millrace_nvmf_rdma::port::{self, PortConfig, PortStats, QueueFactory};
use millrace_nvmf_rdma::wire::QueueLimits;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

struct Refuse {
    closing: CancellationToken,
}

impl Commands for Refuse {
    type Plan = ();
    fn admit(&mut self, sqe: &Sqe, x: &Transfer) -> Result<(), Status> {
        match (sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT, x) {
            (true, Transfer::InCapsule(_)) => Ok(()),
            _ => Err(Status::COMMAND_SEQUENCE_ERROR),
        }
    }
    fn fetches_data(&self, _: &()) -> bool {
        false
    }
    fn execute(&mut self, _: &Sqe, _: (), data: Option<IoBuf>) -> Exec {
        let d = data.as_deref().unwrap_or(&[]);
        match ConnectData::decode(d) {
            Ok(c) => println!("connect from {} to {} refused", c.hostnqn, c.subnqn),
            Err(at) => println!("connect data unreadable at byte {at}"),
        }
        Exec::Now(Outcome::Complete {
            status: Status::CONNECT_INVALID_HOST,
            result: 0,
        })
    }
    fn qid(&self) -> u16 {
        0
    }
    fn is_connected(&self) -> bool {
        false
    }
    fn closing(&self) -> CancellationToken {
        self.closing.clone()
    }
    fn parked(&mut self) -> Option<tokio::sync::mpsc::Receiver<Cqe>> {
        None
    }
}

struct Factory(CancellationToken);

impl QueueFactory for Factory {
    type C = Refuse;
    fn open(&self, _: SocketAddr, _: Option<SocketAddr>) -> Refuse {
        Refuse {
            closing: self.0.clone(),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .expect("usage: rdma_refuse ADDR:PORT");
    let listener = match millrace_rdma::cm::Listener::bind(addr, 64) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rdma_refuse: {e}");
            std::process::exit(2);
        }
    };
    println!("listening on {}", listener.local_addr());
    let pool = BufPool::new(&PoolConfig {
        bytes: 8 << 20,
        slices: 1,
        max_buf: 1 << 20,
        populate: false,
    })
    .expect("a small buffer pool");
    let cfg = PortConfig {
        limits: QueueLimits {
            admin_depth: 32,
            io_depth: 128,
            max_qid: 8,
        },
        in_capsule: 8192,
        max_transfer: 1 << 20,
        max_queues: 64,
        max_queues_per_address: 64,
        deadlines: Default::default(),
    };
    let cores = Cores::start(CoresConfig {
        cores: 1,
        pool: Some(pool.clone()),
        ..CoresConfig::default()
    })
    .expect("a core for the queues");
    let stop = CancellationToken::new();
    let f = Arc::new(Factory(stop.clone()));
    let stats = Arc::new(PortStats::default());
    let cores = Arc::new(cores);
    if let Err(e) = port::serve(listener, pool, cores, cfg, f, stats, stop).await {
        eprintln!("rdma_refuse: {e}");
    }
}
