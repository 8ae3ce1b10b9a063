//! Device contexts, protection domains and registered memory.

use crate::error::{Error, Result};
use crate::ffi::{self, Fd};
use rdma_mummy_sys as sys;
use std::alloc::Layout;
use std::ffi::CStr;
use std::sync::Arc;
use tokio::io::unix::AsyncFd;

/// A device context opened by librdmacm (it lives as long as the process).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Context(*mut sys::ibv_context);

// SAFETY: verbs calls on a context are thread-safe; librdmacm never closes it while ids use it.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

/// The limits of a device that the transport sizes its queues by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceAttr {
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cqe: u32,
    /// RDMA READs a QP may have outstanding as the target of them.
    pub max_qp_rd_atom: u8,
    /// RDMA READs a QP may issue and have outstanding.
    pub max_qp_init_rd_atom: u8,
    pub max_mr_size: u64,
}

impl Context {
    /// # Safety
    /// `p` is a device context that outlives every use of the value.
    pub(crate) unsafe fn from_raw(p: *mut sys::ibv_context) -> Context {
        Context(p)
    }
    pub fn name(&self) -> String {
        // SAFETY: a live context has a device with a NUL-terminated name.
        unsafe {
            let n = sys::ibv_get_device_name((*self.0).device);
            if n.is_null() {
                return String::new();
            }
            CStr::from_ptr(n).to_string_lossy().into_owned()
        }
    }
    pub fn query(&self) -> Result<DeviceAttr> {
        // SAFETY: zeroed attributes are valid output space.
        let mut a: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is live.
        let rc = unsafe { sys::ibv_query_device(self.0, &mut a) };
        if rc != 0 {
            return Err(Error::code("ibv_query_device", rc));
        }
        let u = |x: i32| x.max(0) as u32;
        Ok(DeviceAttr {
            max_qp_wr: u(a.max_qp_wr),
            max_sge: u(a.max_sge),
            max_cqe: u(a.max_cqe),
            max_qp_rd_atom: a.max_qp_rd_atom.clamp(0, 255) as u8,
            max_qp_init_rd_atom: a.max_qp_init_rd_atom.clamp(0, 255) as u8,
            max_mr_size: a.max_mr_size,
        })
    }
    pub fn alloc_pd(&self) -> Result<Arc<ProtectionDomain>> {
        // SAFETY: the context is live.
        let pd = unsafe { sys::ibv_alloc_pd(self.0) };
        if pd.is_null() {
            return Err(Error::last("ibv_alloc_pd"));
        }
        Ok(Arc::new(ProtectionDomain { pd, ctx: *self }))
    }
}

/// A protection domain: memory registered in it is reachable by its queue pairs.
pub struct ProtectionDomain {
    pd: *mut sys::ibv_pd,
    ctx: Context,
}

// SAFETY: verbs calls on a PD are thread-safe; it is freed only in Drop, after its users (they
// hold an Arc).
unsafe impl Send for ProtectionDomain {}
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    pub(crate) fn raw(&self) -> *mut sys::ibv_pd {
        self.pd
    }
    pub fn context(&self) -> Context {
        self.ctx
    }

    /// Registers memory this process owns for local access and for the peer's RDMA READ and
    /// WRITE (the keys go to the peer only inside work requests we post, never in advance).
    ///
    /// # Safety
    /// `ptr..ptr+len` stays allocated and is not unmapped until the region is dropped: `owner`
    /// is kept alive by the region for that purpose.
    pub unsafe fn register_raw(
        self: &Arc<Self>,
        ptr: *mut u8,
        len: usize,
        owner: Arc<dyn Send + Sync>,
    ) -> Result<MemoryRegion> {
        let access = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
            | sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        let mr = sys::ibv_reg_mr(self.pd, ptr as *mut _, len, access as i32);
        if mr.is_null() {
            return Err(Error::last("ibv_reg_mr"));
        }
        Ok(MemoryRegion {
            mr,
            _owner: owner,
            _pd: self.clone(),
        })
    }

    /// Allocates `len` bytes aligned to 4 KiB, zeroed once, and registers them.
    pub fn register_new(self: &Arc<Self>, len: usize) -> Result<MemoryRegion> {
        let mem = Arc::new(Aligned::new(len)?);
        let p = mem.ptr;
        // SAFETY: the allocation is owned by the region through `mem`.
        unsafe { self.register_raw(p, len, mem) }
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every QP and MR of this PD holds an Arc to it, so none is left.
        unsafe { sys::ibv_dealloc_pd(self.pd) };
    }
}

/// Page-aligned memory from the global allocator.
struct Aligned {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: plain memory; access is coordinated by the region's users.
unsafe impl Send for Aligned {}
unsafe impl Sync for Aligned {}

impl Aligned {
    fn new(len: usize) -> Result<Aligned> {
        let layout = Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| Error::Invalid(format!("cannot lay out {len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::Invalid(format!("cannot allocate {len} bytes")));
        }
        Ok(Aligned { ptr, layout })
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in new with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Registered memory: its local key for our work requests, its remote key for the peer's.
pub struct MemoryRegion {
    mr: *mut sys::ibv_mr,
    _owner: Arc<dyn Send + Sync>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: the region is immutable once registered; dereg happens only in Drop.
unsafe impl Send for MemoryRegion {}
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    pub fn addr(&self) -> *mut u8 {
        // SAFETY: the region is live.
        unsafe { (*self.mr).addr as *mut u8 }
    }
    pub fn len(&self) -> usize {
        // SAFETY: the region is live.
        unsafe { (*self.mr).length }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn lkey(&self) -> u32 {
        // SAFETY: the region is live.
        unsafe { (*self.mr).lkey }
    }
    pub fn rkey(&self) -> u32 {
        // SAFETY: the region is live.
        unsafe { (*self.mr).rkey }
    }
    /// A scatter/gather element for `len` bytes at `off` into the region, if it fits.
    pub fn sge(&self, off: usize, len: usize) -> Option<Sge> {
        let end = off.checked_add(len)?;
        (end <= self.len() && len <= u32::MAX as usize).then(|| Sge {
            addr: self.addr() as u64 + off as u64,
            len: len as u32,
            lkey: self.lkey(),
        })
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered in register_raw; the memory (owner) is still alive here.
        unsafe { sys::ibv_dereg_mr(self.mr) };
    }
}

/// A local buffer in registered memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

impl Sge {
    fn raw(&self) -> sys::ibv_sge {
        sys::ibv_sge {
            addr: self.addr,
            length: self.len,
            lkey: self.lkey,
        }
    }
}

pub(crate) fn sge_raw(s: &Sge) -> sys::ibv_sge {
    s.raw()
}

pub(crate) fn cq_channel(ctx: Context) -> Result<(*mut sys::ibv_comp_channel, AsyncFd<Fd>)> {
    // SAFETY: the context is live.
    let ch = unsafe { sys::ibv_create_comp_channel(ctx.0) };
    if ch.is_null() {
        return Err(Error::last("ibv_create_comp_channel"));
    }
    // SAFETY: ch is live.
    let fd = unsafe { (*ch).fd };
    // SAFETY: the CQ's owner drops the AsyncFd before destroying the channel.
    let afd = unsafe { ffi::watch(fd, "registering the completion channel with tokio") }
        .inspect_err(|_| {
            // SAFETY: nothing uses the channel yet.
            unsafe { sys::ibv_destroy_comp_channel(ch) };
        })?;
    Ok((ch, afd))
}

pub(crate) fn ctx_raw(c: Context) -> *mut sys::ibv_context {
    c.0
}
