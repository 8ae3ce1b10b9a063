//! Verbs: device contexts, protection domains, registered memory, completion queues waited on
//! with tokio, and reliable-connected queue pairs.
//!
//! Posting work is `unsafe`: the device reads and writes the memory a work request names until
//! its completion arrives, which the type system cannot see. The NVMe/RDMA transport keeps every
//! buffer it posts in a slot of its own until that slot's completion is polled.
//!
//! `resources` holds what the device owns (contexts, protection domains, memory regions);
//! `cq` the completion queues and queue pairs built on them. This module only gathers both
//! under one path.

mod cq;
mod resources;

pub use cq::{Completion, CompletionQueue, Opcode, QpCaps, QueuePair, SendOp};
pub use resources::*;
