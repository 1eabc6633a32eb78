// shared/rpc/security.h without servers: API keys from a file and the
// environment, the Bearer check, the constant-time comparison's results,
// and the TLS options' errors (each naming its flag, never a key).
#include "shared/rpc/security.h"

#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace lede::rpc {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string WriteTemp(const std::string& text) {
  char path[] = "/tmp/lede-keys-XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << text;
  return path;
}

// Keys come from the file (comments, blank lines and CRLF ignored) and the
// comma-separated environment value, in that order.
TEST(ApiKeysTest, LoadsFileAndEnvironment) {
  const std::string file = WriteTemp("# team keys\nsk-one\r\n\n  sk-two  \n");
  auto keys = ApiKeys::Load(file, "sk-three, sk-four,,");
  ASSERT_THAT(keys, IsOk());
  EXPECT_THAT(keys->keys(), ElementsAre("sk-one", "sk-two", "sk-three", "sk-four"));
  unlink(file.c_str());
  auto none = ApiKeys::Load("", "");
  ASSERT_THAT(none, IsOk());
  EXPECT_TRUE(none->empty());
}

// Bad key sources are errors that name the source and never the key.
TEST(ApiKeysTest, BadSourcesNameTheSourceNotTheKey) {
  EXPECT_THAT(ApiKeys::Load("/nonexistent/keys", ""), StatusIs(StatusCode::kNotFound));
  const std::string empty = WriteTemp("# nothing here\n\n");
  EXPECT_THAT(ApiKeys::Load(empty, ""), StatusIs(StatusCode::kInvalidArgument));
  unlink(empty.c_str());
  const std::string spaced = WriteTemp("sk-secret part\n");
  auto bad = ApiKeys::Load(spaced, "");
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("line 1"));
  EXPECT_THAT(std::string(bad.status().message()), Not(HasSubstr("sk-secret")));
  unlink(spaced.c_str());
}

// Only "Bearer <one of the keys>" passes; no keys means no authentication.
TEST(ApiKeysTest, AllowsOnlyABearerKey) {
  const ApiKeys keys({"sk-one", "sk-two"});
  EXPECT_TRUE(keys.Allows("Bearer sk-one"));
  EXPECT_TRUE(keys.Allows("bearer sk-two"));
  EXPECT_FALSE(keys.Allows(""));
  EXPECT_FALSE(keys.Allows("sk-one"));
  EXPECT_FALSE(keys.Allows("Bearer "));
  EXPECT_FALSE(keys.Allows("Bearer sk-on"));
  EXPECT_FALSE(keys.Allows("Bearer sk-one2"));
  EXPECT_FALSE(keys.Allows("Basic sk-one"));
  EXPECT_TRUE(ApiKeys().Allows(""));
}

// ConstantTimeEquals is plain equality in its results.
TEST(ApiKeysTest, ConstantTimeEqualsIsEquality) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", ""));
}

// TLS options: plaintext when empty; half a pair or a missing file is an
// error naming the flag.
TEST(TlsOptionsTest, ErrorsNameTheFlag) {
  EXPECT_THAT(MakeServerCredentials({}), IsOk());
  EXPECT_THAT(MakeChannelCredentials({}), IsOk());
  ServerTlsOptions cert_only;
  cert_only.cert_path = "/tmp/x.pem";
  auto half = MakeServerCredentials(cert_only);
  EXPECT_THAT(half, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(half.status().message()), HasSubstr("tls-key"));
  ServerTlsOptions missing{"/nonexistent/cert.pem", "/nonexistent/key.pem", ""};
  auto absent = MakeServerCredentials(missing);
  EXPECT_THAT(absent, StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(std::string(absent.status().message()), HasSubstr("tls-cert"));
  ChannelTlsOptions client_half;
  client_half.cert_path = "/tmp/c.pem";
  EXPECT_THAT(MakeChannelCredentials(client_half), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace lede::rpc
