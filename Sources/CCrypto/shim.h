#ifndef REPLICA_CCRYPTO_SHIM_H
#define REPLICA_CCRYPTO_SHIM_H
// OpenSSL's libcrypto, for SHA-256 only (EVP digests use the CPU's SHA extensions; see Specs/external-storage.md).
#include <openssl/evp.h>
#endif
