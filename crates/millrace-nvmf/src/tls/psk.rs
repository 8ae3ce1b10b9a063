//! Pre-shared keys for NVMe/TCP's secure channel (NVMe/TCP transport specification, TP 8011),
//! as SPDK v24.01 and Linux 6.7+ compute them:
//!
//! - the configured PSK, in the interchange form `NVMeTLSkey-1:HH:BASE64:` (HH: 00 the key is
//!   used as it is, 01 SHA-256, 02 SHA-384; BASE64: the key, 32 or 48 bytes, and its CRC-32,
//!   little-endian);
//! - the retained PSK: HKDF(hash, key, info = len, "tls13 HostNQN", host NQN), or the
//!   configured key itself under 00;
//! - the PSK identity `NVMe0RHH <host NQN> <subsystem NQN>` (HH: 01 for TLS_AES_128_GCM_SHA256,
//!   02 for TLS_AES_256_GCM_SHA384, chosen by the key's length);
//! - the TLS PSK: HKDF(suite's hash, retained, info = len, "tls13 nvme-tls-psk", identity).
//!
//! Both HKDFs are extract-then-expand with an empty salt and one block of output, and the
//! length in their info is the input key's (as SPDK and Linux put it). Keys never appear in
//! `Debug` output or in an error sentence.

use crate::dhchap::Hash;
use base64::Engine;
use std::fmt;
use zeroize::Zeroizing;

/// The two cipher suites NVMe/TCP allows, each with its hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// TLS_AES_128_GCM_SHA256 (identity digits 01).
    Aes128Sha256,
    /// TLS_AES_256_GCM_SHA384 (identity digits 02).
    Aes256Sha384,
}

impl Suite {
    pub fn hash(self) -> Hash {
        match self {
            Suite::Aes128Sha256 => Hash::Sha256,
            Suite::Aes256Sha384 => Hash::Sha384,
        }
    }
    /// The digits of the PSK identity.
    pub fn id(self) -> u8 {
        match self {
            Suite::Aes128Sha256 => 1,
            Suite::Aes256Sha384 => 2,
        }
    }
    /// The suite's IANA name, as OpenSSL knows it.
    pub fn name(self) -> &'static str {
        match self {
            Suite::Aes128Sha256 => "TLS_AES_128_GCM_SHA256",
            Suite::Aes256Sha384 => "TLS_AES_256_GCM_SHA384",
        }
    }
    /// The suite's two bytes on the wire (RFC 8446, B.4).
    pub fn code(self) -> [u8; 2] {
        match self {
            Suite::Aes128Sha256 => [0x13, 0x01],
            Suite::Aes256Sha384 => [0x13, 0x02],
        }
    }
    /// The AEAD key length in bytes.
    pub fn key_bytes(self) -> usize {
        match self {
            Suite::Aes128Sha256 => 16,
            Suite::Aes256Sha384 => 32,
        }
    }
}

/// A configured PSK: the key (32 or 48 bytes) and the hash (if any) that makes it a retained
/// PSK for a host.
#[derive(Clone, PartialEq, Eq)]
pub struct Psk {
    key: Zeroizing<Vec<u8>>,
    transform: Option<Hash>,
}

impl fmt::Debug for Psk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psk {{ {} bytes, hidden }}", self.key.len())
    }
}

impl Psk {
    /// Parses `NVMeTLSkey-1:HH:BASE64:` (as `nvme gen-tls-key` writes it). Surrounding white
    /// space (a file's newline) is ignored. Errors are sentences that never quote the key.
    pub fn parse(s: &str) -> Result<Psk, String> {
        let mut parts = s.trim().split(':');
        let (Some("NVMeTLSkey-1"), Some(hh), Some(b64), Some(""), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err("a TLS PSK has the form NVMeTLSkey-1:HH:BASE64: (as nvme gen-tls-key writes it); give the file nvme gen-tls-key or SPDK wrote".into());
        };
        let (transform, len) = match hh {
            "00" => (None, None),
            "01" => (Some(Hash::Sha256), Some(32)),
            "02" => (Some(Hash::Sha384), Some(48)),
            _ => return Err("a TLS PSK's hash is 00 (none), 01 (SHA-256) or 02 (SHA-384)".into()),
        };
        let raw = Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| "a TLS PSK's key is not valid base64".to_string())?,
        );
        let key_len = raw.len().saturating_sub(4);
        if raw.len() < 4 || ![32, 48].contains(&key_len) || len.is_some_and(|l| l != key_len) {
            return Err(format!(
                "a TLS PSK's key is 32 bytes (hash 00 or 01) or 48 bytes (hash 00 or 02), not {key_len}"
            ));
        }
        let (key, crc) = raw.split_at(key_len);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(
                "a TLS PSK's checksum does not match its key (a damaged or mistyped key)".into(),
            );
        }
        Ok(Psk {
            key: Zeroizing::new(key.to_vec()),
            transform,
        })
    }

    /// The suite this key is used with: its length decides (32 bytes: AES-128/SHA-256).
    pub fn suite(&self) -> Suite {
        if self.key.len() == 48 {
            Suite::Aes256Sha384
        } else {
            Suite::Aes128Sha256
        }
    }

    /// The retained PSK for `hostnqn`.
    pub fn retained(&self, hostnqn: &str) -> Zeroizing<Vec<u8>> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => hkdf(h, &self.key, "tls13 HostNQN", hostnqn.as_bytes()),
        }
    }

    /// The TLS PSK a handshake under `identity` uses, for `hostnqn`; None for an identity
    /// over 255 bytes, which the derivation cannot hold (SPDK refuses those too).
    pub fn tls_key(&self, hostnqn: &str, identity: &str) -> Option<Zeroizing<Vec<u8>>> {
        if identity.len() > 255 {
            return None;
        }
        let retained = self.retained(hostnqn);
        Some(hkdf(
            self.suite().hash(),
            &retained,
            "tls13 nvme-tls-psk",
            identity.as_bytes(),
        ))
    }
}

/// The PSK identity of `hostnqn` reaching `subnqn` under `suite`.
pub fn identity(suite: Suite, hostnqn: &str, subnqn: &str) -> String {
    format!("NVMe0R{:02} {hostnqn} {subnqn}", suite.id())
}

/// A PSK identity a host sent, taken apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub suite: Suite,
    pub hostnqn: String,
    pub subnqn: String,
}

impl Identity {
    /// `NVMe0RHH <host NQN> <subsystem NQN>`, or None for anything else (a host's bytes:
    /// never trusted, never a panic).
    pub fn parse(b: &[u8]) -> Option<Identity> {
        let s = std::str::from_utf8(b).ok()?;
        let mut w = s.split(' ');
        let suite = match w.next()? {
            "NVMe0R01" => Suite::Aes128Sha256,
            "NVMe0R02" => Suite::Aes256Sha384,
            _ => return None,
        };
        let (hostnqn, subnqn) = (w.next()?, w.next()?);
        let max = crate::cmd::NQN_MAX;
        if w.next().is_some()
            || b.len() > 255
            || hostnqn.is_empty()
            || subnqn.is_empty()
            || hostnqn.len() > max
            || subnqn.len() > max
        {
            return None;
        }
        Some(Identity {
            suite,
            hostnqn: hostnqn.into(),
            subnqn: subnqn.into(),
        })
    }
}

/// HKDF-Extract (empty salt) then one block of HKDF-Expand with the info NVMe/TCP uses:
/// the input key's length (2 bytes), the label and the context, each after its length byte.
fn hkdf(h: Hash, key: &[u8], label: &str, context: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut info = Vec::with_capacity(4 + label.len() + context.len());
    // Keys are 32 or 48 bytes, labels are ours, a host NQN at most 223 bytes and an identity
    // at most 255 (`tls_key`): every length fits its field.
    info.extend_from_slice(&(key.len() as u16).to_be_bytes());
    info.push(label.len() as u8);
    info.extend_from_slice(label.as_bytes());
    info.push(context.len() as u8);
    info.extend_from_slice(context);
    let prk = Zeroizing::new(h.hmac(&[], &[key]));
    Zeroizing::new(h.hmac(&prk, &[&info, &[1]]))
}

/// TLS 1.3's HKDF-Expand-Label (RFC 8446, 7.1) with an empty context, `len` at most one
/// block: the traffic key and IV from a traffic secret.
pub(crate) fn expand_label(h: Hash, secret: &[u8], label: &str, len: usize) -> Zeroizing<Vec<u8>> {
    let full = format!("tls13 {label}");
    let mut info = Vec::with_capacity(4 + full.len());
    info.extend_from_slice(&(len as u16).to_be_bytes());
    info.push(full.len() as u8);
    info.extend_from_slice(full.as_bytes());
    info.push(0);
    let mut out = Zeroizing::new(h.hmac(secret, &[&info, &[1]]));
    out.truncate(len);
    out
}
