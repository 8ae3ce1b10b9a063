//! Kernel TLS: the traffic keys of a finished TLS 1.3 handshake installed on the socket
//! (`setsockopt` TCP_ULP "tls", then SOL_TLS TLS_TX and TLS_RX), so that plain reads and writes
//! on it carry application-data records from then on.

use super::psk::{expand_label, Suite};
use std::io;
use std::os::fd::AsRawFd;
use zeroize::Zeroize;

/// Whether the kernel lists the `tls` upper-layer protocol (the module is loaded or built in).
/// A kernel that loads it on demand lists it only afterwards, so this is a hint for status
/// pages; `install` is the test that counts.
pub(crate) fn listed() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .is_ok_and(|s| s.split_whitespace().any(|w| w == "tls"))
}

fn setsockopt<T>(fd: i32, level: i32, name: i32, v: &T) -> io::Result<()> {
    let len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `v` points to `len` readable bytes for the duration of the call.
    let r = unsafe { libc::setsockopt(fd, level, name, (v as *const T).cast(), len) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Puts the socket under kernel TLS: records sent with the server's traffic secret, received
/// with the client's, both from sequence 0. The error is a sentence that says what to do.
pub(crate) fn install(
    sock: &impl AsRawFd,
    suite: Suite,
    server_secret: &[u8],
    client_secret: &[u8],
) -> Result<(), String> {
    let fd = sock.as_raw_fd();
    setsockopt(fd, libc::SOL_TCP, libc::TCP_ULP, b"tls").map_err(|e| {
        format!("this kernel has no kernel TLS ({e}): load the tls module (modprobe tls; CONFIG_TLS) to serve NVMe/TCP with TLS")
    })?;
    for (dir, secret, what) in [
        (libc::TLS_TX, server_secret, "sending"),
        (libc::TLS_RX, client_secret, "receiving"),
    ] {
        let r = match suite {
            Suite::Aes128Sha256 => {
                let mut c: libc::tls12_crypto_info_aes_gcm_128 = unsafe { std::mem::zeroed() };
                fill(
                    suite,
                    secret,
                    &mut c.info,
                    &mut c.key,
                    &mut c.salt,
                    &mut c.iv,
                );
                let r = setsockopt(fd, libc::SOL_TLS, dir, &c);
                c.key.zeroize();
                r
            }
            Suite::Aes256Sha384 => {
                let mut c: libc::tls12_crypto_info_aes_gcm_256 = unsafe { std::mem::zeroed() };
                fill(
                    suite,
                    secret,
                    &mut c.info,
                    &mut c.key,
                    &mut c.salt,
                    &mut c.iv,
                );
                let r = setsockopt(fd, libc::SOL_TLS, dir, &c);
                c.key.zeroize();
                r
            }
        };
        r.map_err(|e| format!("the kernel refused the TLS keys for {what} ({e}): its tls module lacks {} (CONFIG_TLS with AES-GCM)", suite.name()))?;
    }
    Ok(())
}

/// The kernel's crypto info from a traffic secret: key = HKDF-Expand-Label(secret, "key"),
/// and the 12-byte IV split as the kernel wants it for TLS 1.3 (its first 4 bytes the
/// "salt", the other 8 the "iv"); the record sequence stays 0.
fn fill(
    suite: Suite,
    secret: &[u8],
    info: &mut libc::tls_crypto_info,
    key: &mut [u8],
    salt: &mut [u8; 4],
    iv: &mut [u8; 8],
) {
    info.version = libc::TLS_1_3_VERSION;
    info.cipher_type = match suite {
        Suite::Aes128Sha256 => libc::TLS_CIPHER_AES_GCM_128,
        Suite::Aes256Sha384 => libc::TLS_CIPHER_AES_GCM_256,
    };
    let h = suite.hash();
    let k = expand_label(h, secret, "key", key.len());
    key.copy_from_slice(&k);
    let v = expand_label(h, secret, "iv", 12);
    salt.copy_from_slice(&v[..4]);
    iv.copy_from_slice(&v[4..]);
}
