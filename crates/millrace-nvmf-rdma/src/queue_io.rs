//! The data movements and responses of a [`Queue`]: buffers from the registered pool, RDMA
//! READs of the host's write data (at most as many outstanding as the host allows), and the
//! response capsule, after an RDMA WRITE of read data where there is some, as one chain.

use crate::commands::{Commands, Outcome};
use crate::queue::{Done, Posted, Queue, Stop};
use crate::sizing::{Work, CQE_BYTES};
use millrace_nvmf::cmd::{Cqe, Status, Transfer, CONNECT_DATA_LEN};
use millrace_rdma::verbs::{Opcode, SendOp};

impl<C: Commands> Queue<C> {
    /// Takes a pool buffer for `len` bytes of the host's data (its bytes of the host's share
    /// first; waiting for either off the loop when short), then reads the data.
    pub(crate) fn fetch(&mut self, c: u32, len: usize) -> Result<(), Stop> {
        if len > self.pool.pool().max_buf() {
            return self.respond(c, Outcome::err(Status::INVALID_FIELD));
        }
        let share = self.cmds.share();
        let held = share.as_ref().and_then(|s| s.try_take(len));
        if share.is_none() || held.is_some() {
            if let Ok(Some(mut b)) = self.pool.pool().try_get(len) {
                b.set_len(len).map_err(|e| Stop::Fatal(e.to_string()))?;
                let s = &mut self.slots[c as usize];
                s.data = Some(b);
                s.held = held;
                return self.start_read(c);
            }
        }
        let pool = self.pool.clone();
        self.waits.spawn(async move {
            let held = match (held, share) {
                (Some(h), _) => Some(h),
                (None, Some(s)) => Some(s.take(len).await),
                (None, None) => None,
            };
            match pool.pool().get(len).await {
                Ok(mut b) => match b.set_len(len) {
                    Ok(()) => Done::Buffer(c, b, held),
                    Err(_) => Done::NoBuffer(c),
                },
                Err(_) => Done::NoBuffer(c),
            }
        });
        Ok(())
    }

    /// Posts the RDMA READ of slot `c`'s data, or queues it behind the outstanding ones.
    pub(crate) fn start_read(&mut self, c: u32) -> Result<(), Stop> {
        if self.reads_in_flight >= self.plan.max_reads {
            self.reads_waiting.push_back(c);
            return Ok(());
        }
        let s = &self.slots[c as usize];
        let (Some(r), Some(buf)) = (s.remote, s.data.as_ref()) else {
            return Err(Stop::Fatal("a read without its buffer".into()));
        };
        let sge = self
            .pool
            .sge(buf, r.len as usize)
            .ok_or_else(|| Stop::Fatal("a data buffer outside the registered pool".into()))?;
        let op = SendOp {
            wr_id: Work::Read(c).wr_id(),
            op: Opcode::RdmaRead {
                remote_addr: r.addr,
                rkey: r.key,
            },
            sge,
            signaled: true,
        };
        // SAFETY: the buffer stays in slot c, untouched, until this READ's completion.
        unsafe { self.qp.post_send(&[op]) }.map_err(|e| Stop::Fatal(e.to_string()))?;
        self.reads_in_flight += 1;
        self.slots[c as usize].posted = Some(Posted::Read(self.tick));
        Ok(())
    }

    pub(crate) fn next_read(&mut self) -> Result<(), Stop> {
        match self.reads_waiting.pop_front() {
            Some(c) => self.start_read(c),
            None => Ok(()),
        }
    }

    /// The host's data is here: admit a fetched Connect, or run the command.
    pub(crate) fn after_fetch(&mut self, c: u32) -> Result<(), Stop> {
        let s = &mut self.slots[c as usize];
        let data = s.data.take();
        if !s.connect_fetch {
            return self.execute(c, data);
        }
        s.connect_fetch = false;
        let sqe = s.sqe;
        let len = data.as_ref().map_or(0, |d| d.len());
        if len < CONNECT_DATA_LEN {
            return self.respond(c, Outcome::err(Status::DATA_SGL_LENGTH_INVALID));
        }
        match self.cmds.admit(&sqe, &Transfer::InCapsule(0..len)) {
            Ok(p) => {
                self.slots[c as usize].plan = Some(p);
                self.execute(c, data)
            }
            Err(st) => self.respond(c, Outcome::err(st)),
        }
    }

    /// Ends command `c` as `o` says.
    pub(crate) fn respond(&mut self, c: u32, o: Outcome) -> Result<(), Stop> {
        let cid = self.slots[c as usize].sqe.cid();
        let (status, result) = match o {
            Outcome::Complete { status, result } => (status, result),
            Outcome::Data { result, data, held } => {
                self.slots[c as usize].held = held;
                return self.respond_data(c, result, data);
            }
            Outcome::Parked => {
                self.slots[c as usize].parked = true;
                return Ok(());
            }
            Outcome::Disconnect => {
                self.close_after = Some(c);
                (Status::SUCCESS, 0)
            }
        };
        let mut cqe = Cqe::new(cid, status, result);
        cqe.sqid = self.cmds.qid();
        cqe.sqhd = self.sqhd;
        self.send_cqe(c, cqe)
    }

    fn respond_data(&mut self, c: u32, result: u64, data: millrace_io::IoBuf) -> Result<(), Stop> {
        let Some(r) = self.slots[c as usize].remote else {
            return self.respond(c, Outcome::err(Status::INTERNAL_ERROR));
        };
        let len = data.len().min(r.len as usize);
        let sge = self
            .pool
            .sge(&data, len)
            .ok_or_else(|| Stop::Fatal("read data outside the registered pool".into()))?;
        let cid = self.slots[c as usize].sqe.cid();
        self.slots[c as usize].data = Some(data);
        let write = SendOp {
            wr_id: Work::Send(c).wr_id(),
            op: Opcode::RdmaWrite {
                remote_addr: r.addr,
                rkey: r.key,
            },
            sge,
            // Completes silently: the SEND after it completes only once it did (RC order).
            signaled: false,
        };
        let mut cqe = Cqe::new(cid, Status::SUCCESS, result);
        cqe.sqid = self.cmds.qid();
        cqe.sqhd = self.sqhd;
        let send = self.response_op(c, cqe)?;
        // SAFETY: the data buffer and the response capsule stay in slot c until the SEND's
        // completion, which comes after the WRITE's.
        unsafe { self.qp.post_send(&[write, send]) }.map_err(|e| Stop::Fatal(e.to_string()))?;
        self.slots[c as usize].posted = Some(Posted::Reply(self.tick));
        Ok(())
    }

    pub(crate) fn send_cqe(&mut self, c: u32, cqe: Cqe) -> Result<(), Stop> {
        let send = self.response_op(c, cqe)?;
        // SAFETY: the response capsule stays in slot c until the SEND's completion.
        unsafe { self.qp.post_send(&[send]) }.map_err(|e| Stop::Fatal(e.to_string()))?;
        self.slots[c as usize].posted = Some(Posted::Reply(self.tick));
        Ok(())
    }

    /// Writes `cqe` into slot `c`'s response capsule and describes its SEND (with invalidate
    /// when the host asked for it).
    fn response_op(&mut self, c: u32, cqe: Cqe) -> Result<SendOp, Stop> {
        let at = c as usize * CQE_BYTES;
        let sge = self
            .rsp
            .sge(at, CQE_BYTES)
            .ok_or_else(|| Stop::Fatal(format!("response slot {c} outside its region")))?;
        let bytes = cqe.encode();
        // SAFETY: slot c's capsule is ours: its previous SEND completed before the slot was
        // handed out again.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.rsp.addr().add(at), CQE_BYTES)
        };
        let op = match self.slots[c as usize].invalidate {
            Some(k) => Opcode::SendInvalidate(k),
            None => Opcode::Send,
        };
        Ok(SendOp {
            wr_id: Work::Send(c).wr_id(),
            op,
            sge,
            signaled: true,
        })
    }
}
