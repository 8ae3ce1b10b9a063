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
