//! NVMe/TCP's secure channel (TP 8011): TLS 1.3 with a pre-shared key, negotiated right after
//! the TCP connection opens and before the ICReq, then carried by the kernel.
//!
//! Why this shape:
//! - The handshake runs in user space with OpenSSL (`handshake`). rustls has no external PSK
//!   (it resumes only its own tickets), and NVMe/TCP's PSKs are external ones. OpenSSL's
//!   simple PSK server callback assumes SHA-256 under TLS 1.3, so the key is handed over as a
//!   session through the find-session callback (one path for both suites, as SPDK does).
//!   Session tickets are off: after its Finished the server sends no record at all, so the
//!   kernel takes over both directions at record sequence 0.
//! - The records are then sealed and opened by kernel TLS (`ktls`), with the traffic keys
//!   derived from the secrets OpenSSL reports through its key-log callback. The NVMe/TCP data
//!   path (tokio socket halves, vectored writes, payloads received into pool buffers) stays
//!   as it is: it reads and writes plain bytes on the same socket. Debian's OpenSSL 3.0 is
//!   built without its own kTLS, so the keys are installed here.
//! - A kernel without kTLS (no `tls` module) cannot carry such a connection: it is closed
//!   with a logged sentence that says so, never served in the clear.
//!
//! `psk` holds the keys, identities and derivations, which the CLI and the service use too.

mod handshake;
mod ktls;
pub mod psk;
#[cfg(test)]
mod tests;

pub(crate) use handshake::{accept, Lookup};
pub use psk::{Identity, Psk, Suite};

/// Whether this kernel lists kernel TLS among its TCP upper-layer protocols (a kernel that
/// loads the module on demand lists it only once a connection asked for it).
pub fn kernel_tls_listed() -> bool {
    ktls::listed()
}

/// Whether a listener requires the secure channel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain NVMe/TCP (the discovery log says: no security, not required).
    #[default]
    None,
    /// Every connection starts with a TLS 1.3 PSK handshake; one that does not is closed.
    Required,
}

impl TlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            TlsMode::None => "none",
            TlsMode::Required => "required",
        }
    }
    /// `none` or `required`; the error is a sentence.
    pub fn parse(s: &str) -> Result<TlsMode, String> {
        match s {
            "none" => Ok(TlsMode::None),
            "required" => Ok(TlsMode::Required),
            _ => Err(format!(
                "the NVMe/TCP TLS mode is none or required, not {s:?}"
            )),
        }
    }
}
