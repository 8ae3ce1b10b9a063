/*
 * Preloaded into SPDK v24.01's bdevperf by tests/guest/nvme-tls.sh (and used to record
 * crates/millrace-nvmf/tests/data/tls_psk_vectors.txt): SPDK derives NVMe/TCP's retained and
 * TLS PSKs with HKDF and an empty salt given as (NULL, 0), which OpenSSL 3.0 (Debian bookworm)
 * refuses ("Unable to set salt for HKDF!"), so SPDK's TLS host cannot connect at all. This
 * passes a non-NULL pointer of length 0 instead: the same empty salt, which HKDF treats as
 * HashLen zero bytes either way (RFC 5869). Build: cc -shared -fPIC -o salt.so THIS.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
int EVP_PKEY_CTX_set1_hkdf_salt(EVP_PKEY_CTX *ctx, const unsigned char *salt, int saltlen)
{
	static const unsigned char empty[1];
	int (*real)(EVP_PKEY_CTX *, const unsigned char *, int) = dlsym(RTLD_NEXT, "EVP_PKEY_CTX_set1_hkdf_salt");
	return real(ctx, salt == NULL && saltlen == 0 ? empty : salt, saltlen);
}
