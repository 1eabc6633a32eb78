// File: shared/file/sha256.h
//
// SHA-256 (FIPS 180-4) of a byte string, on OpenSSL's EVP digest API: the
// one implementation behind policy-artifact checksums and S3 request signing
// (x-amz-content-sha256).
//
// Full build only: sha256.cc is compiled into lede::file only when
// LEDE_ENGINE_ONLY is OFF, so the engine-only build keeps needing nothing but
// libtorch and nlohmann-json (it has no user of SHA-256).
//
// Example: Sha256Hex("abc") ==
//   "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
// Thread-safety: stateless; safe from any thread.
#ifndef LEDE_SHARED_FILE_SHA256_H_
#define LEDE_SHARED_FILE_SHA256_H_

#include <string>
#include <string_view>

namespace lede::file {

// The 32-byte digest of `bytes` as 64 lowercase hex characters.
std::string Sha256Hex(std::string_view bytes);

}  // namespace lede::file

#endif  // LEDE_SHARED_FILE_SHA256_H_
