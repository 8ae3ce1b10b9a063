//! Known answers from `tests/data/tls_psk_vectors.c` (SPDK v24.01's own derivation
//! functions, independent of this code), and the parser's refusals.

use super::psk::{expand_label, identity, Identity, Psk, Suite};
use crate::dhchap::Hash;

const VECTORS: &str = include_str!("../../tests/data/tls_psk_vectors.txt");
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
const SUB: &str = "nqn.2024-01.io.millrace:tank.vol1";

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn derivations_match_spdk() {
    let mut n = 0;
    for l in VECTORS.lines() {
        let w: Vec<&str> = l.split(' ').collect();
        let [key, digits, _configured, retained, tls] = w[..] else {
            panic!("a vector line has five words: {l}");
        };
        let psk = Psk::parse(key).unwrap();
        assert_eq!(format!("{:02}", psk.suite().id()), digits);
        assert_eq!(&psk.retained(HOST)[..], &hex(retained)[..], "{key}");
        let id = identity(psk.suite(), HOST, SUB);
        assert_eq!(id, format!("NVMe0R{digits} {HOST} {SUB}"));
        assert_eq!(&psk.tls_key(HOST, &id).unwrap()[..], &hex(tls)[..], "{key}");
        // Another identity gives another key (and, for a key with a hash, another host NQN).
        let other = identity(psk.suite(), "nqn.x", SUB);
        assert_ne!(&psk.tls_key(HOST, &other).unwrap()[..], &hex(tls)[..]);
        if !key.contains(":00:") {
            assert_ne!(&psk.retained("nqn.x")[..], &hex(retained)[..]);
        }
        n += 1;
    }
    assert_eq!(n, 3, "the three vectors: hash 01, 02 and 00");
}

#[test]
fn expand_label_matches_rfc8448() {
    // RFC 8448 (TLS 1.3 traces), "Simple 1-RTT Handshake": the server's handshake traffic
    // secret and the key and IV it gives.
    let secret = hex("b67b7d690cc16c4e75e54213cb2d37b4e9c912bcded9105d42befd59d391ad38");
    let key = expand_label(Hash::Sha256, &secret, "key", 16);
    let iv = expand_label(Hash::Sha256, &secret, "iv", 12);
    assert_eq!(&key[..], &hex("3fce516009c21727d0f2e4e86ee403bc")[..]);
    assert_eq!(&iv[..], &hex("5d313eb2671276ee13000b30")[..]);
}

#[test]
fn bad_keys_are_refused_with_sentences() {
    let good = VECTORS.lines().next().unwrap().split(' ').next().unwrap();
    assert!(
        Psk::parse(&format!("{good}\n")).is_ok(),
        "a file's newline is fine"
    );
    let mut flipped = good.to_string().into_bytes();
    flipped[20] = if flipped[20] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    let wrong_hash = good.replace(":01:", ":02:");
    let bad_hash = good.replace(":01:", ":07:");
    for (bad, says) in [
        ("", "form"),
        ("NVMeTLSkey-1:01:", "form"),
        ("DHHC-1:01:AAAA:", "form"),
        (&good[..good.len() - 1], "form"),
        ("NVMeTLSkey-1:01:!!!!:", "base64"),
        ("NVMeTLSkey-1:01:AAAA:", "32 bytes"),
        (&flipped, "checksum"),
        (&wrong_hash, "48 bytes"),
        (&bad_hash, "00 (none)"),
        ("NVMeTLSkey-1:01:\u{fffd}\u{fffd}:", "base64"),
    ] {
        let e = Psk::parse(bad).unwrap_err();
        assert!(e.contains(says), "{bad:?}: {e}");
        assert!(!e.contains("EBES"), "the key is never quoted: {e}");
    }
    let p = Psk::parse(good).unwrap();
    assert!(!format!("{p:?}").contains("EBES"));
}

#[test]
fn identities_are_parsed_strictly() {
    let id = identity(Suite::Aes256Sha384, HOST, SUB);
    let i = Identity::parse(id.as_bytes()).unwrap();
    assert_eq!(
        (i.suite, &i.hostnqn[..], &i.subnqn[..]),
        (Suite::Aes256Sha384, HOST, SUB)
    );
    for bad in [
        &b""[..],
        b"NVMe0R03 a b",
        b"NVMe1R01 a b",
        b"NVMe0R01 a",
        b"NVMe0R01 a b c",
        b"NVMe0R01  b",
        b"NVMe0R01 \xff b",
    ] {
        assert_eq!(Identity::parse(bad), None, "{bad:?}");
    }
    let long = format!("NVMe0R01 {} {}", "h".repeat(200), "s".repeat(100));
    assert_eq!(Identity::parse(long.as_bytes()), None, "over 255 bytes");
}

proptest::proptest! {
    #[test]
    fn parsers_never_panic(s in ".{0,120}", b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
        let _ = Psk::parse(&s);
        let _ = Psk::parse(&format!("NVMeTLSkey-1:01:{s}:"));
        let _ = Identity::parse(&b);
    }
}
