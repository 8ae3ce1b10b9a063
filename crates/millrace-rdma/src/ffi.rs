//! Small conversions between Rust and the C side: socket addresses, non-blocking descriptors
//! that tokio can wait on, and whether rdma-core's libraries were found at all.

use crate::error::{Error, Result};
use rdma_mummy_sys as sys;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};
use tokio::io::unix::AsyncFd;

/// Whether libibverbs was loaded. The shim answers every call with EOPNOTSUPP when the
/// library was missing at start-up, so one harmless call tells.
pub(crate) fn library_loaded() -> bool {
    let mut n = 0;
    // SAFETY: ibv_get_device_list only writes the count; the list it returns is freed below.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return std::io::Error::last_os_error().raw_os_error() != Some(libc::EOPNOTSUPP);
    }
    // SAFETY: the list came from ibv_get_device_list and is freed once.
    unsafe { sys::ibv_free_device_list(list) };
    true
}

/// Fails with the sentence for a host without rdma-core or without any RDMA device.
pub(crate) fn check_available() -> Result<()> {
    if !library_loaded() {
        return Err(Error::NoLibrary);
    }
    if !crate::devices::any() {
        return Err(Error::NoDevice);
    }
    Ok(())
}

/// A socket address laid out as `struct sockaddr_in` / `sockaddr_in6`.
pub(crate) struct RawAddr(libc::sockaddr_storage);

impl RawAddr {
    pub fn new(a: &SocketAddr) -> RawAddr {
        // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
        let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        match a {
            SocketAddr::V4(v4) => {
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                let sin = unsafe { &mut *(&mut st as *mut _ as *mut libc::sockaddr_in) };
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = v4.port().to_be();
                sin.sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
            }
            SocketAddr::V6(v6) => {
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
                let sin6 = unsafe { &mut *(&mut st as *mut _ as *mut libc::sockaddr_in6) };
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = v6.port().to_be();
                sin6.sin6_addr.s6_addr = v6.ip().octets();
                sin6.sin6_flowinfo = v6.flowinfo();
                sin6.sin6_scope_id = v6.scope_id();
            }
        }
        RawAddr(st)
    }
    pub fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        &mut self.0 as *mut _ as *mut libc::sockaddr
    }
}

/// Reads an IPv4 or IPv6 address out of a `struct sockaddr` (None for other families).
///
/// # Safety
/// `p` points to a readable sockaddr whose storage is as large as its family says.
pub(crate) unsafe fn from_sockaddr(p: *const libc::sockaddr) -> Option<SocketAddr> {
    if p.is_null() {
        return None;
    }
    match (*p).sa_family as i32 {
        libc::AF_INET => {
            let sin = &*(p as *const libc::sockaddr_in);
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            let sin6 = &*(p as *const libc::sockaddr_in6);
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            // An IPv4 peer of a dual-stack listener shows as ::ffff:a.b.c.d.
            if let Some(v4) = ip.to_ipv4_mapped() {
                return Some(SocketAddr::new(
                    IpAddr::V4(v4),
                    u16::from_be(sin6.sin6_port),
                ));
            }
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// A descriptor tokio's `AsyncFd` can watch; it does not own (close) it: the channel it belongs
/// to does.
pub(crate) struct Fd(pub RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Makes `fd` non-blocking and registers it with tokio's reactor.
///
/// # Safety
/// `fd` stays open until the returned `AsyncFd` is dropped.
pub(crate) unsafe fn watch(fd: RawFd, what: &'static str) -> Result<AsyncFd<Fd>> {
    set_nonblocking(fd)?;
    AsyncFd::register(Fd(fd)).map_err(|e| Error::Call {
        call: what,
        source: e.into_parts().1,
    })
}

pub(crate) fn set_nonblocking(fd: RawFd) -> Result<()> {
    // SAFETY: fcntl on a descriptor we were handed; flags only.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 {
        return Err(Error::last("fcntl(F_GETFL)"));
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
        return Err(Error::last("fcntl(F_SETFL, O_NONBLOCK)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip_through_sockaddr() {
        for a in [
            "198.18.0.1:4420",
            "0.0.0.0:0",
            "[fe80::1%3]:20049",
            "[2001:db8::7]:4420",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            let mut r = RawAddr::new(&a);
            // SAFETY: r holds a sockaddr_in or sockaddr_in6 in sockaddr_storage.
            let back = unsafe { from_sockaddr(r.as_mut_ptr() as *const libc::sockaddr) };
            assert_eq!(back, Some(a));
        }
    }

    #[test]
    fn v4_mapped_peers_read_as_v4() {
        let a: SocketAddr = "[::ffff:198.18.0.2]:5000".parse().unwrap();
        let mut r = RawAddr::new(&a);
        // SAFETY: as above.
        let back = unsafe { from_sockaddr(r.as_mut_ptr() as *const libc::sockaddr) };
        assert_eq!(back, Some("198.18.0.2:5000".parse().unwrap()));
    }
}
