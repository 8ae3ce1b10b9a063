#!/usr/bin/env python3
"""Independent derivation of the DH-HMAC-CHAP test vectors used by
crates/millrace-nvmf/src/dhchap (unit tests) and the ffdhe primes it embeds.

Only Python's standard library (hashlib, hmac, base64, zlib) is used, so the
values do not come from the Rust code they check.

    python3 crates/millrace-nvmf/tests/data/dhchap_vectors.py primes   # the RFC 7919 primes, checked
    python3 crates/millrace-nvmf/tests/data/dhchap_vectors.py vectors  # the known answers
"""
import base64, hashlib, hmac, random, struct, sys, zlib

# RFC 7919, appendix A: p = 2^b - 2^(b-64) + ([2^(b-130) e] + X) * 2^64 - 1, g = 2.
GROUPS = {2048: 560316, 3072: 2625351, 4096: 5736041, 6144: 15705020, 8192: 10965728}


def e_fixed(bits):
    """floor(e * 2^bits), from the series sum 1/k! in integer arithmetic."""
    guard = 64
    one = 1 << (bits + guard)
    total, term, k = 0, one, 0
    while term:
        total += term
        k += 1
        term //= k
    return total >> guard


def is_probable_prime(n, rounds=24):
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    rng = random.Random(7919)
    for _ in range(rounds):
        a = rng.randrange(2, n - 2)
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True


def ffdhe(b):
    return (1 << b) - (1 << (b - 64)) + (e_fixed(b - 130) + GROUPS[b]) * (1 << 64) - 1


def primes():
    for b in GROUPS:
        p = ffdhe(b)
        assert p.bit_length() == b
        assert is_probable_prime(p) and is_probable_prime((p - 1) // 2), b
        print(f"ffdhe{b} {p:X}")


H = {1: hashlib.sha256, 2: hashlib.sha384, 3: hashlib.sha512}


def secret(key, hmac_id):
    crc = struct.pack("<I", zlib.crc32(key) & 0xFFFFFFFF)
    return "DHHC-1:%02d:%s:" % (hmac_id, base64.b64encode(key + crc).decode())


def transform(key, hmac_id, nqn):
    if hmac_id == 0:
        return key
    return hmac.new(key, nqn.encode() + b"NVMe-over-Fabrics", H[hmac_id]).digest()


def response(hash_id, key, chal, seq, tid, role, first, second):
    msg = chal + struct.pack("<IH", seq, tid) + b"\x00" + role + first.encode() + b"\x00" + second.encode()
    return hmac.new(key, msg, H[hash_id]).digest()


def augment(hash_id, shared, chal):
    return hmac.new(H[hash_id](shared).digest(), chal, H[hash_id]).digest()


def vectors():
    host = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001"
    sub = "nqn.2024-01.io.millrace:tank.vol1"
    for hid, n in ((0, 32), (1, 32), (2, 48), (3, 64)):
        key = bytes(range(n))
        print(f"secret {hid} {secret(key, hid)}")
        print(f"transformed {hid} {transform(key, hid, host).hex()}")
    key = transform(bytes(range(32)), 1, host)
    chal = bytes([0xA5] * 32)
    print("host-response sha256", response(1, key, chal, 7, 0x1234, b"HostHost", host, sub).hex())
    chal64 = bytes([0x5A] * 64)
    print("ctrl-response sha512", response(3, key, chal64, 9, 0x0102, b"Controller", sub, host).hex())
    p = ffdhe(2048)
    x, y = 0x1234567, 0x89ABCDEF
    gx, gy = pow(2, x, p), pow(2, y, p)
    shared = pow(gx, y, p).to_bytes(256, "big")
    print("dh2048 gx", gx.to_bytes(256, "big").hex())
    print("dh2048 augmented-sha256", augment(1, shared, chal).hex())


if __name__ == "__main__":
    {"primes": primes, "vectors": vectors}[sys.argv[1]]()
