//! The server's side of the TLS 1.3 PSK handshake, with OpenSSL, on a tokio socket: OpenSSL
//! reads and writes the socket without blocking, and the task waits for readiness in between.
//! Then the traffic keys go to the kernel (`super::ktls`).

use super::psk::{Identity, Psk};
use foreign_types::ForeignTypeRef;
use openssl::ex_data::Index;
use openssl::ssl::{
    ErrorCode, HandshakeError, Ssl, SslContext, SslMethod, SslOptions, SslRef, SslVersion,
};
use std::io::{self, Read, Write};
use std::sync::{Arc, OnceLock};
use tokio::net::TcpStream;
use zeroize::Zeroizing;

/// Finds the configured PSK of a host on a subsystem (None: that host has none there).
pub(crate) type Lookup = Arc<dyn Fn(&Identity) -> Option<Psk> + Send + Sync>;

/// One handshake's state, reached from OpenSSL's callbacks through the connection's ex data.
struct State {
    lookup: Lookup,
    chosen: parking_lot::Mutex<Option<Identity>>,
    /// CLIENT_TRAFFIC_SECRET_0 and SERVER_TRAFFIC_SECRET_0, from the key-log callback.
    secrets: parking_lot::Mutex<[Option<Zeroizing<Vec<u8>>>; 2]>,
}

struct Shared {
    ctx: SslContext,
    idx: Index<Ssl, Arc<State>>,
}

static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();

fn shared() -> Result<&'static Shared, String> {
    SHARED
        .get_or_init(|| {
            build().map_err(|e| format!("OpenSSL cannot set up TLS 1.3 with PSKs: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn build() -> Result<Shared, openssl::error::ErrorStack> {
    let idx = Ssl::new_ex_index::<Arc<State>>()?;
    let mut b = SslContext::builder(SslMethod::tls_server())?;
    b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384")?;
    // No tickets: nothing is sent after the server's Finished, so kTLS starts at sequence 0
    // in both directions and no record sits in OpenSSL's buffers.
    b.set_num_tickets(0)?;
    b.set_options(SslOptions::NO_TICKET);
    b.set_keylog_callback(move |ssl: &SslRef, line: &str| {
        let Some(st) = SHARED_IDX.get().and_then(|i| ssl.ex_data(*i)) else {
            return;
        };
        let mut w = line.split(' ');
        let slot = match w.next() {
            Some("CLIENT_TRAFFIC_SECRET_0") => 0,
            Some("SERVER_TRAFFIC_SECRET_0") => 1,
            _ => return,
        };
        if let (Some(_random), Some(hex)) = (w.next(), w.next()) {
            st.secrets.lock()[slot] = unhex(hex).map(Zeroizing::new);
        }
    });
    let _ = SHARED_IDX.set(idx);
    // SAFETY: the callback has the signature OpenSSL expects and outlives the context.
    unsafe { SSL_CTX_set_psk_find_session_callback(b.as_ptr(), Some(find_session)) };
    Ok(Shared {
        ctx: b.build(),
        idx,
    })
}

/// The ex-data index, for the callbacks (set before any connection exists).
static SHARED_IDX: OnceLock<Index<Ssl, Arc<State>>> = OnceLock::new();

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

// OpenSSL 1.1.1+ functions the `openssl-sys` crate does not bind (libssl is linked by it).
extern "C" {
    fn SSL_CTX_set_psk_find_session_callback(
        ctx: *mut openssl_sys::SSL_CTX,
        cb: Option<FindSession>,
    );
    fn SSL_SESSION_new() -> *mut openssl_sys::SSL_SESSION;
    fn SSL_SESSION_set1_master_key(
        s: *mut openssl_sys::SSL_SESSION,
        key: *const u8,
        len: usize,
    ) -> libc::c_int;
    fn SSL_CIPHER_find(
        ssl: *mut openssl_sys::SSL,
        code: *const u8,
    ) -> *const openssl_sys::SSL_CIPHER;
    fn SSL_SESSION_set_cipher(
        s: *mut openssl_sys::SSL_SESSION,
        c: *const openssl_sys::SSL_CIPHER,
    ) -> libc::c_int;
    fn SSL_SESSION_set_protocol_version(
        s: *mut openssl_sys::SSL_SESSION,
        v: libc::c_int,
    ) -> libc::c_int;
}

type FindSession = unsafe extern "C" fn(
    *mut openssl_sys::SSL,
    *const u8,
    usize,
    *mut *mut openssl_sys::SSL_SESSION,
) -> libc::c_int;

/// OpenSSL asks for the PSK of the identity the host offered: a session carrying the TLS PSK
/// and the suite, or none (1 with no session: the handshake then fails for want of a key,
/// as it does for an unknown identity). Never unwinds into C.
unsafe extern "C" fn find_session(
    ssl: *mut openssl_sys::SSL,
    id: *const u8,
    id_len: usize,
    out: *mut *mut openssl_sys::SSL_SESSION,
) -> libc::c_int {
    *out = std::ptr::null_mut();
    let r = std::panic::catch_unwind(|| {
        // SAFETY: OpenSSL passes the connection and `id_len` readable identity bytes.
        let ssl_ref = unsafe { SslRef::from_ptr(ssl) };
        let st = SHARED_IDX.get().and_then(|i| ssl_ref.ex_data(*i))?;
        let id = unsafe { std::slice::from_raw_parts(id, id_len) };
        let ident = Identity::parse(id)?;
        let psk = (st.lookup)(&ident).filter(|p| p.suite() == ident.suite)?;
        let key = psk.tls_key(&ident.hostnqn, std::str::from_utf8(id).ok()?)?;
        *st.chosen.lock() = Some(ident.clone());
        Some((key, ident.suite))
    });
    let Ok(Some((key, suite))) = r else {
        return 1;
    };
    let s = SSL_SESSION_new();
    if s.is_null() {
        return 0;
    }
    let cipher = SSL_CIPHER_find(ssl, suite.code().as_ptr());
    if cipher.is_null()
        || SSL_SESSION_set1_master_key(s, key.as_ptr(), key.len()) != 1
        || SSL_SESSION_set_cipher(s, cipher) != 1
        || SSL_SESSION_set_protocol_version(s, openssl_sys::TLS1_3_VERSION) != 1
    {
        openssl_sys::SSL_SESSION_free(s);
        return 0;
    }
    *out = s;
    1
}

/// The socket as OpenSSL's stream: reads and writes that never block (WouldBlock instead).
struct Io<'a>(&'a TcpStream);

impl Read for Io<'_> {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(b)
    }
}

impl Write for Io<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.try_write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Runs the server's handshake on `sock`, then hands its records to the kernel: the identity
/// the host proved, or a sentence saying why not. The caller bounds it in time.
pub(crate) async fn accept(sock: &TcpStream, lookup: Lookup) -> Result<Identity, String> {
    let sh = shared()?;
    let st = Arc::new(State {
        lookup,
        chosen: Default::default(),
        secrets: Default::default(),
    });
    let mut ssl =
        Ssl::new(&sh.ctx).map_err(|e| format!("OpenSSL cannot start a handshake: {e}"))?;
    ssl.set_ex_data(sh.idx, st.clone());
    let mut r = ssl.accept(Io(sock));
    let stream = loop {
        match r {
            Ok(s) => break s,
            Err(HandshakeError::WouldBlock(mid)) => {
                let wait = match mid.error().code() {
                    ErrorCode::WANT_WRITE => sock.writable().await,
                    _ => sock.readable().await,
                };
                wait.map_err(|e| format!("the connection failed during the TLS handshake: {e}"))?;
                r = mid.handshake();
            }
            Err(HandshakeError::SetupFailure(e)) => {
                return Err(format!("OpenSSL cannot start a handshake: {e}"))
            }
            Err(HandshakeError::Failure(mid)) => {
                let who = st.chosen.lock().clone();
                let code = mid.error().code();
                return Err(match who {
                    _ if code == ErrorCode::SYSCALL || code == ErrorCode::ZERO_RETURN => {
                        "the host closed the connection during the TLS handshake".to_string()
                    }
                    Some(_) => format!("the TLS handshake failed ({}): the host's PSK differs from the one configured for it", mid.error()),
                    None => "the TLS handshake failed: the host offered no PSK identity this target knows (NVMe0R01/02 <host NQN> <subsystem NQN> with a key set by `millrace export nvme host set-key --tls-psk`)".to_string(),
                });
            }
        }
    };
    let ident = st
        .chosen
        .lock()
        .clone()
        .ok_or("the TLS handshake finished without a PSK")?;
    let [client, server] = std::mem::take(&mut *st.secrets.lock());
    let (Some(client), Some(server)) = (client, server) else {
        return Err("OpenSSL reported no traffic secrets for the TLS connection".into());
    };
    // The handshake leaves nothing buffered (no read-ahead, no tickets); dropping the stream
    // sends nothing (no close_notify without a shutdown).
    drop(stream);
    super::ktls::install(sock, ident.suite, &server, &client)?;
    Ok(ident)
}
