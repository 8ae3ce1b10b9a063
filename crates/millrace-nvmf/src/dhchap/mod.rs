//! In-band authentication of NVMe over Fabrics hosts and controllers: DH-HMAC-CHAP, as the
//! NVMe Base Specification (2.x) defines it, with the finite-field Diffie-Hellman groups of
//! RFC 7919.
//!
//! - [`Secret`]: a `DHHC-1:XX:BASE64:` secret as `nvme gen-dhchap-key` writes it (the key, its
//!   CRC-32, and the hash that transforms it with an NQN before use).
//! - [`Hash`], [`DhGroup`], [`response`], [`augment`]: the computations both sides make.
//! - `msg`: the messages carried by Authentication Send and Receive (Fabrics types 05h, 06h).
//! - `txn`: the controller's side of one queue's transaction; the host's side is in
//!   `crate::initiator::auth`.
//! - `ffdhe`: the groups' primes and the exchange.
//!
//! Secrets never appear in `Debug` output or in any error sentence.

pub(crate) mod ffdhe;
pub mod msg;
pub(crate) mod txn;

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use std::fmt;

/// The hash functions DH-HMAC-CHAP negotiates (HashID values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hash {
    Sha256 = 1,
    Sha384 = 2,
    Sha512 = 3,
}

impl Hash {
    pub const ALL: [Hash; 3] = [Hash::Sha256, Hash::Sha384, Hash::Sha512];

    pub fn from_id(id: u8) -> Option<Hash> {
        Hash::ALL.into_iter().find(|h| *h as u8 == id)
    }
    pub fn id(self) -> u8 {
        self as u8
    }
    /// The digest's length in bytes (HL in the messages).
    pub fn bytes(self) -> usize {
        match self {
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Hash::Sha256 => "SHA-256",
            Hash::Sha384 => "SHA-384",
            Hash::Sha512 => "SHA-512",
        }
    }
    /// HMAC with this hash of the concatenation of `parts`, keyed with `key`.
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        fn run<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            // HMAC takes keys of any length: this cannot fail.
            let mut m = <M as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
            for p in parts {
                m.update(p);
            }
            m.finalize().into_bytes().to_vec()
        }
        match self {
            Hash::Sha256 => run::<Hmac<sha2::Sha256>>(key, parts),
            Hash::Sha384 => run::<Hmac<sha2::Sha384>>(key, parts),
            Hash::Sha512 => run::<Hmac<sha2::Sha512>>(key, parts),
        }
    }
    /// The plain digest of `data`.
    pub fn digest(self, data: &[u8]) -> Vec<u8> {
        use sha2::Digest;
        match self {
            Hash::Sha256 => sha2::Sha256::digest(data).to_vec(),
            Hash::Sha384 => sha2::Sha384::digest(data).to_vec(),
            Hash::Sha512 => sha2::Sha512::digest(data).to_vec(),
        }
    }
}

/// The Diffie-Hellman groups (DH Group ID values): none, or an RFC 7919 group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DhGroup {
    Null = 0,
    Ffdhe2048 = 1,
    Ffdhe3072 = 2,
    Ffdhe4096 = 3,
    Ffdhe6144 = 4,
    Ffdhe8192 = 5,
}

impl DhGroup {
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];
    pub fn from_id(id: u8) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| *g as u8 == id)
    }
    pub fn id(self) -> u8 {
        self as u8
    }
    /// The length of a public value and of the shared secret, in bytes (0 for the null group).
    pub fn bytes(self) -> usize {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 256,
            DhGroup::Ffdhe3072 => 384,
            DhGroup::Ffdhe4096 => 512,
            DhGroup::Ffdhe6144 => 768,
            DhGroup::Ffdhe8192 => 1024,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }
}

/// A DH-HMAC-CHAP secret: the key and the hash (if any) that transforms it with an NQN.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
    transform: Option<Hash>,
}

// Keys do not outlive their use in memory that is freed and handed out again.
impl Drop for Secret {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.key);
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret {{ {} bytes, hidden }}", self.key.len())
    }
}

impl Secret {
    /// A secret from its key (32, 48 or 64 bytes) and the hash transforming it (None: used
    /// as it is).
    pub fn new(key: Vec<u8>, transform: Option<Hash>) -> Result<Secret, String> {
        if ![32, 48, 64].contains(&key.len()) {
            return Err(format!(
                "a DH-HMAC-CHAP key is 32, 48 or 64 bytes long, not {}",
                key.len()
            ));
        }
        Ok(Secret { key, transform })
    }

    /// Parses `DHHC-1:XX:BASE64:` (XX: 00 no transformation, 01 SHA-256, 02 SHA-384,
    /// 03 SHA-512; BASE64: the key followed by its CRC-32, little-endian). Surrounding white
    /// space (a file's newline) is ignored. Errors are sentences that never quote the secret.
    pub fn parse(s: &str) -> Result<Secret, String> {
        let s = s.trim();
        let mut parts = s.split(':');
        let (Some("DHHC-1"), Some(xx), Some(b64), Some(""), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err("a DH-HMAC-CHAP secret has the form DHHC-1:XX:BASE64: (as nvme gen-dhchap-key writes it)".into());
        };
        let transform = match xx {
            "00" => None,
            "01" => Some(Hash::Sha256),
            "02" => Some(Hash::Sha384),
            "03" => Some(Hash::Sha512),
            _ => return Err("a DH-HMAC-CHAP secret's transformation is 00, 01, 02 or 03".into()),
        };
        let raw = zeroize::Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| "a DH-HMAC-CHAP secret's key is not valid base64".to_string())?,
        );
        if raw.len() < 4 {
            return Err("a DH-HMAC-CHAP secret's key is too short".into());
        }
        let (key, crc) = raw.split_at(raw.len() - 4);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err("a DH-HMAC-CHAP secret's checksum does not match its key (a damaged or mistyped secret)".into());
        }
        Secret::new(key.to_vec(), transform)
    }

    /// The secret in the `DHHC-1` form.
    pub fn encode(&self) -> String {
        let mut raw = zeroize::Zeroizing::new(self.key.clone());
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        format!(
            "DHHC-1:{:02}:{}:",
            self.transform.map_or(0, Hash::id),
            base64::engine::general_purpose::STANDARD.encode(&raw)
        )
    }

    /// A fresh random secret of `len` bytes (32, 48 or 64).
    pub fn generate(len: usize, transform: Option<Hash>) -> Result<Secret, String> {
        let mut key = vec![0u8; len];
        rand::Rng::fill(&mut rand::rng(), &mut key[..]);
        Secret::new(key, transform)
    }

    /// The key as used in responses: transformed with `nqn` (HMAC over the NQN and
    /// "NVMe-over-Fabrics") when the secret asks for it. A host key is transformed with the
    /// host's NQN, a controller key with the subsystem's.
    pub fn transformed(&self, nqn: &str) -> zeroize::Zeroizing<Vec<u8>> {
        zeroize::Zeroizing::new(match self.transform {
            None => self.key.clone(),
            Some(h) => h.hmac(&self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        })
    }
}

/// A host's secrets on one subsystem: its own, and the controller's for bidirectional
/// authentication.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostKeys {
    pub host: Secret,
    pub ctrl: Option<Secret>,
}

/// A subsystem's secrets, per host NQN, and its authentication counters.
#[derive(Default)]
pub(crate) struct SubsystemAuth {
    pub keys: parking_lot::RwLock<std::collections::HashMap<String, HostKeys>>,
    pub succeeded: std::sync::atomic::AtomicU64,
    pub failed: std::sync::atomic::AtomicU64,
}

impl SubsystemAuth {
    pub fn keys_of(&self, hostnqn: &str) -> Option<HostKeys> {
        self.keys.read().get(hostnqn).cloned()
    }
}

/// A subsystem's authentication as the API and `/metrics` see it: which hosts must
/// authenticate (and whether the controller proves itself to them), never the secrets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthInfo {
    pub nqn: String,
    /// Each host with a secret, and whether a controller secret is set too (bidirectional).
    pub hosts: Vec<(String, bool)>,
    pub succeeded: u64,
    pub failed: u64,
}

/// Which side a response proves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// R1, the host's response: "HostHost", then the host NQN, then the subsystem NQN.
    Host,
    /// R2, the controller's response: "Controller", then the subsystem NQN, then the host NQN.
    Controller,
}

/// A response: HMAC(key, challenge || seqnum (LE32) || transaction id (LE16) || SC_C (one
/// byte, 0) || role || first NQN || 00h || second NQN). `challenge` is the augmented one when
/// a DH group is in use. `key` is the transformed key.
#[allow(clippy::too_many_arguments)]
pub fn response(
    hash: Hash,
    key: &[u8],
    challenge: &[u8],
    seqnum: u32,
    tid: u16,
    role: Role,
    hostnqn: &str,
    subnqn: &str,
) -> Vec<u8> {
    let (label, first, second): (&[u8], &str, &str) = match role {
        Role::Host => (b"HostHost", hostnqn, subnqn),
        Role::Controller => (b"Controller", subnqn, hostnqn),
    };
    hash.hmac(
        key,
        &[
            challenge,
            &seqnum.to_le_bytes(),
            &tid.to_le_bytes(),
            &[0],
            label,
            first.as_bytes(),
            &[0],
            second.as_bytes(),
        ],
    )
}

/// The augmented challenge: HMAC keyed with the hash of the DH shared secret, over the
/// challenge. With the null group the challenge is used as it is (no shared secret).
pub fn augment(hash: Hash, shared: Option<&[u8]>, challenge: &[u8]) -> Vec<u8> {
    match shared {
        None => challenge.to_vec(),
        Some(s) => hash.hmac(&zeroize::Zeroizing::new(hash.digest(s)), &[challenge]),
    }
}

/// Compares two responses in constant time.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// `n` random bytes (challenges).
pub(crate) fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::Rng::fill(&mut rand::rng(), &mut v[..]);
    v
}

#[cfg(test)]
mod tests;
