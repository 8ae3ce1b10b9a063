//! The RDMA connection manager (librdmacm) on tokio: a listener whose connect requests carry the
//! initiator's private data, and per-connection ids that accept or reject with private data of
//! their own, report their events, and own their queue pair.
//!
//! Each accepted id is moved onto an event channel of its own (`rdma_migrate_id`), so a
//! connection's task waits for its own events and nothing routes events between tasks. A
//! channel's descriptor is registered with the reactor of the runtime that first waits on it,
//! so a connection accepted on one runtime and served on another (a core of the data path)
//! takes its events where it runs.

use crate::error::{Error, Result};
use crate::ffi::{self, Fd, RawAddr};
use crate::verbs::{CompletionQueue, Context, ProtectionDomain, QueuePair};
use rdma_mummy_sys as sys;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::unix::AsyncFd;

/// Most bytes of private data a connect request or reply carries over RC on RoCE and IB (the CM
/// REQ's 92 bytes less rdma_cm's own header); longer private data is refused by the library.
pub const MAX_PRIVATE_DATA: usize = 56;

/// An event channel: the descriptor CM events arrive on.
struct Channel {
    ch: *mut sys::rdma_event_channel,
    /// Registered on the first wait; taken out (deregistered) in Drop before the channel
    /// closes its descriptor.
    afd: tokio::sync::OnceCell<AsyncFd<Fd>>,
}

// SAFETY: librdmacm's calls on a channel are thread-safe; the pointer is only freed in Drop.
unsafe impl Send for Channel {}
unsafe impl Sync for Channel {}

impl Channel {
    fn new() -> Result<Arc<Channel>> {
        ffi::check_available()?;
        // SAFETY: plain constructor; checked for NULL.
        let ch = unsafe { sys::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(Error::last("rdma_create_event_channel"));
        }
        // SAFETY: ch is a live channel.
        let fd = unsafe { (*ch).fd };
        if let Err(e) = ffi::set_nonblocking(fd) {
            // SAFETY: nothing else uses the channel yet.
            unsafe { sys::rdma_destroy_event_channel(ch) };
            return Err(e);
        }
        Ok(Arc::new(Channel {
            ch,
            afd: tokio::sync::OnceCell::new(),
        }))
    }

    /// The channel's descriptor in the reactor of the runtime that first waits on it.
    async fn watched(&self) -> Result<&AsyncFd<Fd>> {
        (self.afd)
            .get_or_try_init(|| async {
                // SAFETY: ch is a live channel; the channel (and so fd) outlives the AsyncFd:
                // Drop takes it out first.
                unsafe { ffi::watch((*self.ch).fd, "registering the CM channel with tokio") }
            })
            .await
    }

    /// The next event, copied out and acknowledged (so ids can always be destroyed).
    async fn next(&self) -> Result<CmEvent> {
        loop {
            let afd = self.watched().await?;
            let mut guard = afd.readable().await.map_err(|e| Error::Call {
                call: "waiting for CM events",
                source: e,
            })?;
            let mut ev: *mut sys::rdma_cm_event = std::ptr::null_mut();
            // SAFETY: ch is live; ev receives an event we acknowledge below.
            let rc = unsafe { sys::rdma_get_cm_event(self.ch, &mut ev) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::WouldBlock {
                    guard.clear_ready();
                    continue;
                }
                return Err(Error::Call {
                    call: "rdma_get_cm_event",
                    source: e,
                });
            }
            // SAFETY: ev is a valid event until acknowledged.
            let out = unsafe { CmEvent::copy(ev) };
            // SAFETY: each event is acknowledged exactly once, after it was copied.
            unsafe { sys::rdma_ack_cm_event(ev) };
            return Ok(out);
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        drop(self.afd.take());
        // SAFETY: every id on this channel holds an Arc to it, so none is left.
        unsafe { sys::rdma_destroy_event_channel(self.ch) }
    }
}

/// What happened to a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    ConnectRequest,
    Established,
    Disconnected,
    TimewaitExit,
    DeviceRemoval,
    /// Rejected, unreachable, connect error, address change: the connection is unusable.
    Failed(u32),
    Other(u32),
}

impl EventKind {
    fn of(t: sys::rdma_cm_event_type::Type) -> EventKind {
        use sys::rdma_cm_event_type::*;
        match t {
            RDMA_CM_EVENT_CONNECT_REQUEST => EventKind::ConnectRequest,
            RDMA_CM_EVENT_ESTABLISHED => EventKind::Established,
            RDMA_CM_EVENT_DISCONNECTED => EventKind::Disconnected,
            RDMA_CM_EVENT_TIMEWAIT_EXIT => EventKind::TimewaitExit,
            RDMA_CM_EVENT_DEVICE_REMOVAL => EventKind::DeviceRemoval,
            RDMA_CM_EVENT_REJECTED
            | RDMA_CM_EVENT_UNREACHABLE
            | RDMA_CM_EVENT_CONNECT_ERROR
            | RDMA_CM_EVENT_ADDR_CHANGE => EventKind::Failed(t),
            t => EventKind::Other(t),
        }
    }
}

/// A CM event, copied out of the library's memory.
#[derive(Debug)]
pub struct CmEvent {
    pub kind: EventKind,
    pub status: i32,
    id: *mut sys::rdma_cm_id,
    /// The peer's private data (connect requests and replies), padded by the transport.
    pub private_data: Vec<u8>,
    /// What the peer lets us have outstanding: RDMA READs we may issue to it (from its
    /// responder resources) and READs it may issue to us (its initiator depth).
    pub initiator_depth: u8,
    pub responder_resources: u8,
}

impl CmEvent {
    /// # Safety
    /// `ev` is a live, unacknowledged event.
    unsafe fn copy(ev: *const sys::rdma_cm_event) -> CmEvent {
        let e = &*ev;
        let conn = &e.param.conn;
        let private_data = if conn.private_data.is_null() {
            Vec::new()
        } else {
            std::slice::from_raw_parts(
                conn.private_data as *const u8,
                conn.private_data_len as usize,
            )
            .to_vec()
        };
        CmEvent {
            kind: EventKind::of(e.event),
            status: e.status,
            id: e.id,
            private_data,
            initiator_depth: conn.initiator_depth,
            responder_resources: conn.responder_resources,
        }
    }
}

/// Listens for RDMA connections (RC, the TCP port space) on one address.
pub struct Listener {
    id: *mut sys::rdma_cm_id,
    chan: Arc<Channel>,
    addr: SocketAddr,
}

// SAFETY: the id is used through thread-safe librdmacm calls and freed only in Drop.
unsafe impl Send for Listener {}
unsafe impl Sync for Listener {}

impl Listener {
    /// Binds and listens. Must run inside a tokio runtime. Fails with a sentence where the host
    /// has no rdma-core, no RDMA device, or no RDMA device with this address.
    pub fn bind(addr: SocketAddr, backlog: i32) -> Result<Listener> {
        let chan = Channel::new()?;
        let mut id = std::ptr::null_mut();
        // SAFETY: chan is live; id receives a new cm id that we own.
        let rc = unsafe {
            sys::rdma_create_id(
                chan.ch,
                &mut id,
                std::ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(Error::code("rdma_create_id", rc));
        }
        let mut l = Listener { id, chan, addr };
        let mut raw = RawAddr::new(&addr);
        // SAFETY: id is ours; raw outlives the call.
        if unsafe { sys::rdma_bind_addr(id, raw.as_mut_ptr()) } != 0 {
            return Err(Error::NoDeviceForAddress {
                addr,
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: as above.
        if unsafe { sys::rdma_listen(id, backlog) } != 0 {
            return Err(Error::last("rdma_listen"));
        }
        // SAFETY: a bound id has its source address filled in.
        if let Some(a) = unsafe { src_addr(id) } {
            l.addr = a;
        }
        Ok(l)
    }

    /// The address listened on (the port chosen, where 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The next connect request. Other events on the listening id are logged and skipped;
    /// a removed device ends the listener with an error. A request that cannot be taken (no
    /// descriptor left for its channel, say) is rejected and reported as [`Error::Request`],
    /// after which the listener may go on.
    pub async fn accept(&self) -> Result<ConnectRequest> {
        loop {
            let ev = self.chan.next().await?;
            match ev.kind {
                EventKind::ConnectRequest => return ConnectRequest::new(ev),
                EventKind::DeviceRemoval => {
                    return Err(Error::Invalid(format!(
                        "the RDMA device under {} was removed; the listener stops",
                        self.addr
                    )))
                }
                k => tracing::debug!(addr = %self.addr, "CM event {k:?} on the listener ignored"),
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // SAFETY: the listening id is ours and its events are all acknowledged.
        unsafe { sys::rdma_destroy_id(self.id) };
    }
}

/// # Safety
/// `id` is a live cm id.
unsafe fn src_addr(id: *mut sys::rdma_cm_id) -> Option<SocketAddr> {
    let a = &(*id).route.addr.src_addr_union.src_storage;
    ffi::from_sockaddr(a as *const _ as *const libc::sockaddr)
}

/// # Safety
/// `id` is a live cm id.
unsafe fn dst_addr(id: *mut sys::rdma_cm_id) -> Option<SocketAddr> {
    let a = &(*id).route.addr.dst_addr_union.dst_storage;
    ffi::from_sockaddr(a as *const _ as *const libc::sockaddr)
}

/// An incoming connection not yet accepted or rejected. Dropping it rejects it.
pub struct ConnectRequest {
    pub id: CmId,
    /// The initiator's private data (zero-padded by the transport past what it sent).
    pub private_data: Vec<u8>,
    /// RDMA READs we may have outstanding to the initiator (its responder resources).
    pub initiator_depth: u8,
    /// RDMA READs the initiator wants outstanding to us.
    pub responder_resources: u8,
}

impl ConnectRequest {
    fn new(ev: CmEvent) -> Result<ConnectRequest> {
        // The request's id is new and ours; it moves to a channel of its own.
        let chan = match Channel::new() {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: the id is live and ours, its only event acknowledged; it is not
                // used again (destroying it also frees what the kernel holds for it).
                unsafe {
                    sys::rdma_reject(ev.id, std::ptr::null(), 0);
                    sys::rdma_destroy_id(ev.id);
                }
                return Err(Error::Request(Box::new(e)));
            }
        };
        // SAFETY: the id is live, its only event so far was acknowledged.
        if unsafe { sys::rdma_migrate_id(ev.id, chan.ch) } != 0 {
            let e = Error::last("rdma_migrate_id");
            // SAFETY: as above; the id stays on the listener's channel, whose events are all
            // acknowledged.
            unsafe {
                sys::rdma_reject(ev.id, std::ptr::null(), 0);
                sys::rdma_destroy_id(ev.id);
            }
            return Err(Error::Request(Box::new(e)));
        }
        let id = CmId {
            id: ev.id,
            chan,
            has_qp: false,
        };
        Ok(ConnectRequest {
            id,
            private_data: ev.private_data,
            initiator_depth: ev.initiator_depth,
            responder_resources: ev.responder_resources,
        })
    }
}

/// What an accept tells the initiator.
#[derive(Clone, Debug, Default)]
pub struct AcceptParams<'a> {
    pub private_data: &'a [u8],
    pub initiator_depth: u8,
    pub responder_resources: u8,
}

/// What an outgoing connect asks of the target (the initiator's side, used by tests and tools
/// that play an NVMe/RDMA host).
#[derive(Clone, Debug, Default)]
pub struct ConnectParams<'a> {
    pub private_data: &'a [u8],
    /// RDMA READs we issue to the target at once.
    pub initiator_depth: u8,
    /// RDMA READs the target may issue to us at once.
    pub responder_resources: u8,
    /// Transport retries of the target's requests and of ours (0 to 7).
    pub retry_count: u8,
    /// Receiver-not-ready retries the target makes for its SENDs to us (7: for ever, as the
    /// Linux host asks).
    pub rnr_retry_count: u8,
}

/// One connection's CM id: owns its event channel and, once created, its queue pair.
pub struct CmId {
    id: *mut sys::rdma_cm_id,
    chan: Arc<Channel>,
    has_qp: bool,
}

// SAFETY: librdmacm calls on an id are thread-safe; the pointer is freed only in Drop.
unsafe impl Send for CmId {}
unsafe impl Sync for CmId {}

impl CmId {
    /// The device the connection arrived on.
    pub fn context(&self) -> Context {
        // SAFETY: an id that carried a connect request is bound to a device.
        unsafe { Context::from_raw((*self.id).verbs) }
    }
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is live.
        unsafe { src_addr(self.id) }
    }
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is live.
        unsafe { dst_addr(self.id) }
    }

    /// Creates the connection's reliable-connected queue pair with one completion queue for
    /// sends and receives. The queue pair lives as long as this id.
    pub fn create_qp(
        &mut self,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        caps: crate::verbs::QpCaps,
    ) -> Result<QueuePair> {
        if self.has_qp {
            return Err(Error::Invalid(
                "this connection already has a queue pair".into(),
            ));
        }
        // SAFETY: zeroed init attributes are valid; the fields that matter are set below.
        let mut attr: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq.raw();
        attr.recv_cq = cq.raw();
        attr.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        attr.cap.max_send_wr = caps.max_send_wr;
        attr.cap.max_recv_wr = caps.max_recv_wr;
        attr.cap.max_send_sge = caps.max_send_sge;
        attr.cap.max_recv_sge = caps.max_recv_sge;
        attr.cap.max_inline_data = caps.max_inline_data;
        // SAFETY: id, pd and cq are live; the QP is destroyed in Drop before the id, and the
        // caller keeps cq and pd alive at least as long as this id.
        let rc = unsafe { sys::rdma_create_qp(self.id, pd.raw(), &mut attr) };
        if rc != 0 {
            return Err(Error::code("rdma_create_qp", rc));
        }
        self.has_qp = true;
        // SAFETY: rdma_create_qp succeeded, so id->qp is set.
        Ok(unsafe { QueuePair::from_raw((*self.id).qp) })
    }

    pub fn accept(&self, p: &AcceptParams) -> Result<()> {
        if p.private_data.len() > MAX_PRIVATE_DATA {
            return Err(Error::Invalid(format!(
                "{} bytes of private data exceed the {MAX_PRIVATE_DATA} an accept carries",
                p.private_data.len()
            )));
        }
        // SAFETY: zeroed connection parameters are valid; private data outlives the call.
        let mut cp: sys::rdma_conn_param = unsafe { std::mem::zeroed() };
        cp.private_data = p.private_data.as_ptr() as *const _;
        cp.private_data_len = p.private_data.len() as u8;
        cp.initiator_depth = p.initiator_depth;
        cp.responder_resources = p.responder_resources;
        cp.flow_control = 1;
        // Receiver-not-ready: retry for ever, the initiator reposts receives as it completes.
        cp.rnr_retry_count = 7;
        // SAFETY: the id is live.
        let rc = unsafe { sys::rdma_accept(self.id, &mut cp) };
        if rc != 0 {
            return Err(Error::code("rdma_accept", rc));
        }
        Ok(())
    }

    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let n = private_data.len().min(MAX_PRIVATE_DATA);
        // SAFETY: the id is live; the data outlives the call.
        let rc = unsafe { sys::rdma_reject(self.id, private_data.as_ptr() as *const _, n as u8) };
        if rc != 0 {
            return Err(Error::code("rdma_reject", rc));
        }
        Ok(())
    }

    pub fn disconnect(&self) -> Result<()> {
        // SAFETY: the id is live.
        if unsafe { sys::rdma_disconnect(self.id) } != 0 {
            return Err(Error::last("rdma_disconnect"));
        }
        Ok(())
    }

    /// The next event of this connection.
    pub async fn next_event(&self) -> Result<CmEvent> {
        self.chan.next().await
    }

    /// A new id for a connection to `dst`, its address and route resolved within `timeout_ms`
    /// each (its device is then known: create its queue pair, then [`CmId::connect`]).
    pub async fn resolve(dst: SocketAddr, timeout_ms: i32) -> Result<CmId> {
        use sys::rdma_cm_event_type::{RDMA_CM_EVENT_ADDR_RESOLVED, RDMA_CM_EVENT_ROUTE_RESOLVED};
        let chan = Channel::new()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: chan is live; raw receives a new cm id that we own from here on.
        let rc = unsafe {
            sys::rdma_create_id(
                chan.ch,
                &mut raw,
                std::ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(Error::code("rdma_create_id", rc));
        }
        let id = CmId {
            id: raw,
            chan,
            has_qp: false,
        };
        let mut to = RawAddr::new(&dst);
        // SAFETY: the id is ours; the address outlives the call.
        let rc = unsafe {
            sys::rdma_resolve_addr(id.id, std::ptr::null_mut(), to.as_mut_ptr(), timeout_ms)
        };
        if rc != 0 {
            return Err(Error::last("rdma_resolve_addr"));
        }
        id.expect(RDMA_CM_EVENT_ADDR_RESOLVED, "resolving the address")
            .await?;
        // SAFETY: the id is ours and its address resolved.
        if unsafe { sys::rdma_resolve_route(id.id, timeout_ms) } != 0 {
            return Err(Error::last("rdma_resolve_route"));
        }
        id.expect(RDMA_CM_EVENT_ROUTE_RESOLVED, "resolving the route")
            .await?;
        Ok(id)
    }

    async fn expect(&self, want: u32, what: &str) -> Result<CmEvent> {
        let ev = self.next_event().await?;
        match ev.kind {
            EventKind::Other(t) if t == want => Ok(ev),
            k => Err(Error::Invalid(format!(
                "{what} ended with CM event {k:?} (status {})",
                ev.status
            ))),
        }
    }

    /// Connects a resolved id whose queue pair exists; the target's accept private data, or
    /// an error that carries the reject's status.
    pub async fn connect(&self, p: &ConnectParams<'_>) -> Result<Vec<u8>> {
        if p.private_data.len() > MAX_PRIVATE_DATA {
            return Err(Error::Invalid(format!(
                "{} bytes of private data exceed the {MAX_PRIVATE_DATA} a connect carries",
                p.private_data.len()
            )));
        }
        // SAFETY: zeroed connection parameters are valid; private data outlives the call.
        let mut cp: sys::rdma_conn_param = unsafe { std::mem::zeroed() };
        cp.private_data = p.private_data.as_ptr() as *const _;
        cp.private_data_len = p.private_data.len() as u8;
        cp.initiator_depth = p.initiator_depth;
        cp.responder_resources = p.responder_resources;
        cp.flow_control = 1;
        cp.retry_count = p.retry_count.min(7);
        cp.rnr_retry_count = p.rnr_retry_count.min(7);
        // SAFETY: the id is live and resolved.
        let rc = unsafe { sys::rdma_connect(self.id, &mut cp) };
        if rc != 0 {
            return Err(Error::code("rdma_connect", rc));
        }
        let ev = self.next_event().await?;
        match ev.kind {
            EventKind::Established => Ok(ev.private_data),
            k => Err(Error::Invalid(format!(
                "the connection was not established: CM event {k:?}, status {}, private data {:02x?}",
                ev.status,
                &ev.private_data[..ev.private_data.len().min(4)]
            ))),
        }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the id is ours; its QP (if any) goes first; every event was acknowledged.
        unsafe {
            if self.has_qp {
                sys::rdma_destroy_qp(self.id);
            }
            sys::rdma_destroy_id(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn binding_without_rdma_fails_with_a_sentence() {
        if crate::devices::any() && ffi::library_loaded() {
            eprintln!("this host has RDMA; the refusal path is tested where it has none");
            return;
        }
        let e = Listener::bind("127.0.0.1:0".parse().unwrap(), 16)
            .err()
            .expect("binding with no RDMA must fail");
        let s = e.to_string();
        assert!(
            matches!(e, Error::NoDevice | Error::NoLibrary),
            "unexpected error: {s}"
        );
        assert!(s.contains("RDMA"), "{s}");
    }
}
