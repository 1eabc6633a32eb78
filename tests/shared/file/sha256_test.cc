// Sha256Hex against the FIPS 180-4 / NIST test vectors.
#include "shared/file/sha256.h"

#include <string>

#include "gtest/gtest.h"

namespace lede::file {
namespace {

// The empty string, one block, a two-block message and a million-byte input.
TEST(Sha256Test, MatchesKnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Binary input (embedded zero bytes) is hashed in full, not up to the first NUL.
TEST(Sha256Test, HashesEmbeddedZeros) {
  EXPECT_NE(Sha256Hex(std::string("a\0b", 3)), Sha256Hex("a"));
  EXPECT_EQ(Sha256Hex(std::string("a\0b", 3)).size(), 64u);
}

}  // namespace
}  // namespace lede::file
