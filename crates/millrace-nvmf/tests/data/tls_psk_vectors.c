/*
 * Known answers for crates/millrace-nvmf/src/tls (unit tests), computed by SPDK v24.01's own
 * functions (include/spdk_internal/nvme_tcp.h: nvme_tcp_parse_interchange_psk,
 * nvme_tcp_generate_psk_identity, nvme_tcp_derive_retained_psk, nvme_tcp_derive_tls_psk), so
 * the values do not come from the Rust code they check. Build and run (SPDK built at $S):
 *
 *   gcc -I$S/include -I$S/build/include tls_psk_vectors.c stub.c -o vec -Wl,--start-group \
 *     $S/build/lib/libspdk_util.a $S/build/lib/libspdk_log.a $S/isa-l/.libs/libisal.a \
 *     -Wl,--end-group -lssl -lcrypto -luuid
 *   (stub.c: long spdk_sock_recv(){return 0;} long spdk_sock_readv(){return 0;}
 *    void spdk_sock_writev_async(){})
 *   LD_PRELOAD=salt.so ./vec KEY... > tls_psk_vectors.txt (salt.so: tests/guest/spdk-hkdf-salt.c)
 *
 * With OpenSSL 3.0 (Debian bookworm) SPDK v24.01's derivations fail ("Unable to set salt for
 * HKDF!": 3.0 refuses a NULL salt): tests/guest/spdk-hkdf-salt.c, preloaded, passes an empty
 * salt instead, which HKDF treats the same.
 */
#include "spdk/stdinc.h"
#include "spdk/nvmf.h"
#include "spdk/string.h"
#include "spdk/crc32.h"
#include "spdk/endian.h"
#include "spdk/base64.h"
#include "spdk/log.h"
#include "spdk_internal/nvme_tcp.h"

static void
hex(const uint8_t *b, int n)
{
	printf(" ");
	for (int i = 0; i < n; i++) {
		printf("%02x", b[i]);
	}
}

int
main(int argc, char **argv)
{
	const char *host = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
	const char *sub = "nqn.2024-01.io.millrace:tank.vol1";

	for (int i = 1; i < argc; i++) {
		uint8_t conf[64], ret[64], tls[64];
		uint64_t conf_len;
		uint8_t h;
		int rl, tl;
		char id[600];

		if (nvme_tcp_parse_interchange_psk(argv[i], conf, sizeof conf, &conf_len, &h) != 0) {
			return 1;
		}
		enum nvme_tcp_cipher_suite cs = conf_len == 32 ? NVME_TCP_CIPHER_AES_128_GCM_SHA256 :
						NVME_TCP_CIPHER_AES_256_GCM_SHA384;
		nvme_tcp_generate_psk_identity(id, sizeof id, host, sub, cs);
		if (h == 0) {
			memcpy(ret, conf, conf_len);
			rl = conf_len;
		} else {
			rl = nvme_tcp_derive_retained_psk(conf, conf_len, host, ret, sizeof ret, h);
		}
		tl = nvme_tcp_derive_tls_psk(ret, rl, id, tls, sizeof tls, cs);
		if (rl < 0 || tl < 0) {
			return 1;
		}
		/* interchange, identity's suite digits, configured, retained, TLS PSK */
		printf("%s %.2s", argv[i], id + 6);
		hex(conf, conf_len);
		hex(ret, rl);
		hex(tls, tl);
		printf("\n");
	}
	return 0;
}
