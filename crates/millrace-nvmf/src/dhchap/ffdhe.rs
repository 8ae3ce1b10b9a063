//! The finite-field Diffie-Hellman groups of RFC 7919 (generator 2). The primes are in
//! `ffdhe.txt`, written by `tests/data/dhchap_vectors.py primes`, which derives each from the
//! RFC's formula and checks that p and (p-1)/2 are prime.
//!
//! The exponentiations are crypto-bigint's Montgomery forms, whose time does not depend on the
//! exponent's value (a peer timing its handshakes learns nothing of our ephemeral exponent), and
//! the exponent and every shared value are wiped from memory when dropped.

use super::DhGroup;
use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use std::sync::OnceLock;
use zeroize::{Zeroize, Zeroizing};

const PRIMES: &str = include_str!("ffdhe.txt");

/// The prime of `g` as Montgomery parameters (None for the null group).
pub(crate) fn prime(g: DhGroup) -> Option<&'static BoxedMontyParams> {
    static P: OnceLock<Vec<(DhGroup, BoxedMontyParams)>> = OnceLock::new();
    let all = P.get_or_init(|| {
        PRIMES
            .lines()
            .filter_map(|l| {
                let (name, hex) = l.split_once(' ')?;
                let g = DhGroup::ALL.into_iter().find(|g| g.name() == name)?;
                let bytes = decode_hex(hex.trim())?;
                let p = BoxedUint::from_be_slice(&bytes, bits(g)).ok()?;
                let p: Option<Odd<BoxedUint>> = Odd::new(p).into();
                Some((g, BoxedMontyParams::new(p?)))
            })
            .collect()
    });
    all.iter().find(|(x, _)| *x == g).map(|(_, p)| p)
}

/// The group's size in bits: its primes' and its values' precision.
fn bits(g: DhGroup) -> u32 {
    (g.bytes() * 8) as u32
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// One side's ephemeral exponent and its public value (g^x mod p, big-endian, the group's
/// length).
pub(crate) struct KeyPair {
    group: DhGroup,
    x: BoxedUint,
    pub public: Vec<u8>,
}

impl Drop for KeyPair {
    fn drop(&mut self) {
        self.x.zeroize();
    }
}

/// Bits of the random exponent: above RFC 7919's advice for every group (225 to 400 bits).
const EXPONENT_BYTES: usize = 64;

impl KeyPair {
    /// A fresh key pair in `g`; None for the null group.
    pub(crate) fn new(g: DhGroup) -> Option<KeyPair> {
        let p = prime(g)?;
        let mut bytes = Zeroizing::new(super::random_bytes(EXPONENT_BYTES));
        // An exponent of 0 or 1 would give a public value the peer refuses.
        bytes[0] |= 0x80;
        let x = BoxedUint::from_be_slice(&bytes, (EXPONENT_BYTES * 8) as u32).ok()?;
        Some(KeyPair::with_exponent(g, p, x))
    }

    fn with_exponent(group: DhGroup, p: &BoxedMontyParams, x: BoxedUint) -> KeyPair {
        let two = BoxedUint::from_be_slice(&[2], bits(group)).expect("2 fits any group");
        let public = power(BoxedMontyForm::new(two, p.clone()), &x, group.bytes());
        KeyPair {
            group,
            x,
            public: public.to_vec(),
        }
    }

    /// The shared secret with the peer's public value, big-endian, the group's length; a
    /// value of the wrong length or outside 2..p-2 is refused (a sentence).
    pub(crate) fn shared(&self, peer: &[u8]) -> Result<Zeroizing<Vec<u8>>, &'static str> {
        let p = prime(self.group).ok_or("no group")?;
        if peer.len() != self.group.bytes() {
            return Err("its DH value is not the group's length");
        }
        let bits = bits(self.group);
        let y = BoxedUint::from_be_slice(peer, bits)
            .map_err(|_| "its DH value does not fit the group")?;
        // The peer's value is public: comparing it in variable time gives nothing away.
        let one = BoxedUint::one_with_precision(bits);
        let p_minus_1 = p.modulus().as_ref().wrapping_sub(&one);
        if y <= one || y >= p_minus_1 {
            return Err("its DH value is outside the group");
        }
        Ok(power(
            BoxedMontyForm::new(y, p.clone()),
            &self.x,
            self.group.bytes(),
        ))
    }
}

/// base^x, big-endian and `len` bytes long, wiped when dropped.
fn power(base: BoxedMontyForm, x: &BoxedUint, len: usize) -> Zeroizing<Vec<u8>> {
    let mut v = base.pow(x).retrieve();
    let b = Zeroizing::new(v.to_be_bytes());
    v.zeroize();
    // to_be_bytes gives the value's precision, which is the group's: no padding to add.
    let mut out = Zeroizing::new(vec![0u8; len.saturating_sub(b.len())]);
    out.extend_from_slice(&b[b.len().saturating_sub(len)..]);
    out
}

#[cfg(test)]
pub(crate) fn with_exponent(g: DhGroup, x: u64) -> KeyPair {
    let x = BoxedUint::from_be_slice(&x.to_be_bytes(), 64).unwrap();
    KeyPair::with_exponent(g, prime(g).unwrap(), x)
}

/// The prime of `g`, big-endian (tests compare with an independent big-number library).
#[cfg(test)]
pub(crate) fn prime_bytes(g: DhGroup) -> Option<Vec<u8>> {
    Some(prime(g)?.modulus().as_ref().to_be_bytes().to_vec())
}

/// A key pair from a given exponent (big-endian bytes), for tests.
#[cfg(test)]
pub(crate) fn with_exponent_bytes(g: DhGroup, x: &[u8]) -> KeyPair {
    let x = BoxedUint::from_be_slice(x, (x.len() * 8) as u32).unwrap();
    KeyPair::with_exponent(g, prime(g).unwrap(), x)
}
