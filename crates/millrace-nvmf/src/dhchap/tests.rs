//! Known answers from `tests/data/dhchap_vectors.py` (Python's hashlib, hmac, base64 and zlib,
//! independent of this code), and the parser's refusals.

use super::*;

const VECTORS: &str = include_str!("../../tests/data/dhchap_vectors.txt");
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
const SUB: &str = "nqn.2024-01.io.millrace:tank.vol1";

fn vector(a: &str, b: &str) -> String {
    VECTORS
        .lines()
        .find_map(|l| {
            let mut w = l.split(' ');
            (w.next() == Some(a) && w.next() == Some(b)).then(|| w.next().unwrap().to_string())
        })
        .unwrap_or_else(|| panic!("no vector {a} {b}"))
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn secrets_parse_encode_and_transform_as_the_vectors_say() {
    for (id, len) in [(0u8, 32usize), (1, 32), (2, 48), (3, 64)] {
        let text = vector("secret", &id.to_string());
        let s = Secret::parse(&format!("{text}\n")).unwrap();
        assert_eq!(s.key, (0..len as u8).collect::<Vec<_>>());
        assert_eq!(s.transform.map_or(0, Hash::id), id);
        assert_eq!(s.encode(), text);
        assert_eq!(
            *s.transformed(HOST),
            hex(&vector("transformed", &id.to_string()))
        );
        assert!(!format!("{s:?}").contains(&text[10..20]));
    }
}

#[test]
fn malformed_secrets_are_refused_with_a_sentence() {
    let good = vector("secret", "1");
    let mut bad_crc = good.clone().into_bytes();
    bad_crc[12] = if bad_crc[12] == b'A' { b'B' } else { b'A' };
    let short = Secret::new(vec![1; 16], None).err().unwrap();
    for bad in [
        String::new(),
        "DHHC-1:01:".into(),
        good.replace("DHHC-1", "DHHC-2"),
        good.replace(":01:", ":04:"),
        good.trim_end_matches(':').to_string(),
        format!("{good}x:"),
        good.replace("AAEC", "!!EC"),
        String::from_utf8(bad_crc).unwrap(),
        "DHHC-1:00:AAECAw==:".into(),
    ] {
        let e = Secret::parse(&bad).unwrap_err();
        assert!(e.starts_with("a DH-HMAC-CHAP"), "{bad}: {e}");
    }
    assert!(short.contains("32, 48 or 64"));
}

#[test]
fn responses_and_augmented_challenges_match_the_vectors() {
    let key = Secret::parse(&vector("secret", "1"))
        .unwrap()
        .transformed(HOST);
    let r1 = response(
        Hash::Sha256,
        &key,
        &[0xa5; 32],
        7,
        0x1234,
        Role::Host,
        HOST,
        SUB,
    );
    assert_eq!(r1, hex(&vector("host-response", "sha256")));
    let r2 = response(
        Hash::Sha512,
        &key,
        &[0x5a; 64],
        9,
        0x0102,
        Role::Controller,
        HOST,
        SUB,
    );
    assert_eq!(r2, hex(&vector("ctrl-response", "sha512")));
    // Any change of an input changes the response.
    assert_ne!(
        r1,
        response(
            Hash::Sha256,
            &key,
            &[0xa5; 32],
            8,
            0x1234,
            Role::Host,
            HOST,
            SUB
        )
    );
    assert_ne!(
        r1,
        response(
            Hash::Sha256,
            &key,
            &[0xa5; 32],
            7,
            0x1234,
            Role::Controller,
            HOST,
            SUB
        )
    );

    let a = ffdhe::with_exponent(DhGroup::Ffdhe2048, 0x1234567);
    let b = ffdhe::with_exponent(DhGroup::Ffdhe2048, 0x89ABCDEF);
    assert_eq!(a.public, hex(&vector("dh2048", "gx")));
    let s1 = a.shared(&b.public).unwrap();
    assert_eq!(s1, b.shared(&a.public).unwrap());
    assert_eq!(
        augment(Hash::Sha256, Some(&s1), &[0xa5; 32]),
        hex(&vector("dh2048", "augmented-sha256"))
    );
    assert_eq!(augment(Hash::Sha256, None, &[7; 32]), vec![7; 32]);
}

#[test]
fn dh_values_outside_the_group_are_refused() {
    let a = ffdhe::KeyPair::new(DhGroup::Ffdhe2048).unwrap();
    assert!(a.shared(&[0; 256]).is_err());
    let mut one = vec![0; 256];
    one[255] = 1;
    assert!(a.shared(&one).is_err());
    assert!(a.shared(&[0xff; 256]).is_err());
    assert!(a.shared(&[2; 255]).is_err());
    let p = num_bigint::BigUint::from_bytes_be(&ffdhe::prime_bytes(DhGroup::Ffdhe2048).unwrap());
    let pm1 = (p - num_bigint::BigUint::from(1u8)).to_bytes_be();
    assert!(a.shared(&pm1).is_err());
}

#[test]
fn the_groups_primes_have_rfc_7919s_shape() {
    use num_bigint::BigUint;
    for g in DhGroup::ALL.into_iter().skip(1) {
        let p = BigUint::from_bytes_be(&ffdhe::prime_bytes(g).unwrap());
        assert_eq!(p.bits() as usize, g.bytes() * 8, "{g:?}");
        let b = p.to_bytes_be();
        // The top and bottom 64 bits are ones; after the top 64 bits come e's (ADF85458...).
        assert!(b[..8].iter().chain(&b[b.len() - 8..]).all(|&x| x == 0xff));
        assert_eq!(&b[8..12], &[0xad, 0xf8, 0x54, 0x58]);
    }
    // Fermat's test of the smallest in full: 2^(p-1) = 1 mod p.
    let p = &BigUint::from_bytes_be(&ffdhe::prime_bytes(DhGroup::Ffdhe2048).unwrap());
    let one = BigUint::from(1u8);
    assert_eq!(BigUint::from(2u8).modpow(&(p - &one), p), one);
    assert!(ffdhe::prime(DhGroup::Null).is_none());
}

#[test]
fn messages_round_trip_and_short_ones_are_refused() {
    use super::msg::*;
    let all = [
        Msg::Negotiate(Negotiate {
            tid: 3,
            sc_c: 0,
            hashes: vec![1, 3],
            groups: vec![0, 1, 5],
        }),
        Msg::Challenge(Challenge {
            tid: 4,
            hash: Hash::Sha384,
            group: DhGroup::Ffdhe2048,
            seqnum: 0xdead_beef,
            c1: vec![9; 48],
            dhv: vec![8; 256],
        }),
        Msg::Reply(Reply {
            tid: 5,
            r1: vec![1; 32],
            c2: Some(vec![2; 32]),
            seqnum: 77,
            dhv: vec![],
        }),
        Msg::Reply(Reply {
            tid: 5,
            r1: vec![1; 64],
            c2: None,
            seqnum: 0,
            dhv: vec![3; 384],
        }),
        Msg::Success1 {
            tid: 6,
            r2: Some(vec![4; 32]),
        },
        Msg::Success2 { tid: 7 },
        Msg::Failure {
            tid: 8,
            first: true,
            why: why::INCORRECT_MESSAGE,
        },
        Msg::Failure {
            tid: 9,
            first: false,
            why: why::FAILED,
        },
    ];
    for m in all {
        let b = m.encode();
        assert_eq!(Msg::decode(&b), Ok(m.clone()));
        if !matches!(m, Msg::Success2 { .. } | Msg::Failure { .. }) {
            assert!(Msg::decode(&b[..b.len() - 1]).is_err(), "{m:?}");
        }
    }
    // Field positions the host relies on: HL at 6, hash at 8, group at 9, DHVLEN at 10.
    let c = Msg::Challenge(Challenge {
        tid: 0x0102,
        hash: Hash::Sha512,
        group: DhGroup::Null,
        seqnum: 1,
        c1: vec![0; 64],
        dhv: vec![],
    })
    .encode();
    assert_eq!(&c[..16], &[1, 1, 0, 0, 2, 1, 64, 0, 3, 0, 0, 0, 1, 0, 0, 0]);
    for n in 0..8 {
        assert!(Msg::decode(&vec![1u8; n]).is_err());
    }
}

#[test]
fn secrets_written_by_nvme_cli_parse_and_round_trip() {
    let text = include_str!("../../tests/data/nvme-cli-keys.txt");
    let keys: Vec<&str> = text.lines().filter(|l| l.starts_with("DHHC-1:")).collect();
    assert_eq!(keys.len(), 6);
    for k in keys {
        let s = Secret::parse(k).unwrap_or_else(|e| panic!("{k}: {e}"));
        assert_eq!(s.encode(), k);
        // One flipped base64 character breaks the CRC (or the base64).
        let mut b = k.as_bytes().to_vec();
        b[15] = if b[15] == b'A' { b'B' } else { b'A' };
        assert!(Secret::parse(std::str::from_utf8(&b).unwrap()).is_err());
    }
}

/// The constant-time exponentiation agrees with an independent big-number library
/// (num-bigint's modpow) on random 512-bit exponents and peer values in every group.
#[test]
fn public_and_shared_values_equal_an_independent_modpow() {
    use num_bigint::BigUint;
    for g in DhGroup::ALL.into_iter().skip(1) {
        let p = BigUint::from_bytes_be(&ffdhe::prime_bytes(g).unwrap());
        let (xa, xb) = (super::random_bytes(64), super::random_bytes(64));
        let a = ffdhe::with_exponent_bytes(g, &xa);
        let b = ffdhe::with_exponent_bytes(g, &xb);
        let (ga, gb) = (BigUint::from_bytes_be(&xa), BigUint::from_bytes_be(&xb));
        let two = BigUint::from(2u8);
        let want_a = two.modpow(&ga, &p);
        assert_eq!(BigUint::from_bytes_be(&a.public), want_a, "{g:?}");
        assert_eq!(a.public.len(), g.bytes(), "{g:?}");
        let shared = a.shared(&b.public).unwrap();
        assert_eq!(shared.len(), g.bytes(), "{g:?}");
        assert_eq!(
            BigUint::from_bytes_be(&shared),
            want_a.modpow(&gb, &p),
            "{g:?}"
        );
    }
}
