//! The finite-field Diffie-Hellman groups of RFC 7919 (generator 2). The primes are in
//! `ffdhe.txt`, written by `tests/data/dhchap_vectors.py primes`, which derives each from the
//! RFC's formula and checks that p and (p-1)/2 are prime.

use super::DhGroup;
use num_bigint::BigUint;
use std::sync::OnceLock;

const PRIMES: &str = include_str!("ffdhe.txt");

/// The prime of `g` (None for the null group).
pub(crate) fn prime(g: DhGroup) -> Option<&'static BigUint> {
    static P: OnceLock<Vec<(DhGroup, BigUint)>> = OnceLock::new();
    let all = P.get_or_init(|| {
        PRIMES
            .lines()
            .filter_map(|l| {
                let (name, hex) = l.split_once(' ')?;
                let g = DhGroup::ALL.into_iter().find(|g| g.name() == name)?;
                Some((g, BigUint::parse_bytes(hex.trim().as_bytes(), 16)?))
            })
            .collect()
    });
    all.iter().find(|(x, _)| *x == g).map(|(_, p)| p)
}

/// One side's ephemeral exponent and its public value (g^x mod p, big-endian, the group's
/// length).
pub(crate) struct KeyPair {
    group: DhGroup,
    x: BigUint,
    pub public: Vec<u8>,
}

/// Bits of the random exponent: above RFC 7919's advice for every group (225 to 400 bits).
const EXPONENT_BYTES: usize = 64;

impl KeyPair {
    /// A fresh key pair in `g`; None for the null group.
    pub(crate) fn new(g: DhGroup) -> Option<KeyPair> {
        let p = prime(g)?;
        let mut x = BigUint::from_bytes_be(&super::random_bytes(EXPONENT_BYTES));
        // An exponent of 0 or 1 would give a public value the peer refuses.
        x |= BigUint::from(1u8) << (EXPONENT_BYTES * 8 - 1);
        Some(KeyPair::with_exponent(g, p, x))
    }

    fn with_exponent(group: DhGroup, p: &BigUint, x: BigUint) -> KeyPair {
        let public = pad(&BigUint::from(2u8).modpow(&x, p), group.bytes());
        KeyPair { group, x, public }
    }

    /// The shared secret with the peer's public value, big-endian, the group's length; a
    /// value of the wrong length or outside 2..p-2 is refused (a sentence).
    pub(crate) fn shared(&self, peer: &[u8]) -> Result<Vec<u8>, &'static str> {
        let p = prime(self.group).ok_or("no group")?;
        if peer.len() != self.group.bytes() {
            return Err("its DH value is not the group's length");
        }
        let y = BigUint::from_bytes_be(peer);
        let one = BigUint::from(1u8);
        if y <= one || y >= p - &one {
            return Err("its DH value is outside the group");
        }
        Ok(pad(&y.modpow(&self.x, p), self.group.bytes()))
    }
}

fn pad(v: &BigUint, len: usize) -> Vec<u8> {
    let b = v.to_bytes_be();
    let mut out = vec![0u8; len.saturating_sub(b.len())];
    out.extend_from_slice(&b);
    out
}

#[cfg(test)]
pub(crate) fn with_exponent(g: DhGroup, x: u64) -> KeyPair {
    KeyPair::with_exponent(g, prime(g).unwrap(), BigUint::from(x))
}
