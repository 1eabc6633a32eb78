// libFuzzer target: the experience shard reader (shared/experience/
// experience.h, DecodeShard). The input is a whole shard. Decoding reports
// bad records in the ShardReport and never crashes; every transition it
// returns converts to its wire record and back. Random bytes rarely pass the
// per-record CRC-32, so the input is also decoded as the payload of one
// correctly framed record (magic, length, crc32, payload): that reaches the
// protobuf parse and FromProto()'s checks.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <google/protobuf/stubs/logging.h>
#include <zlib.h>

#include "proto/lede/v1/experience.pb.h"
#include "shared/experience/experience.h"
#include "tests/fuzz/testing/fuzz_util.h"

namespace {

void PutUint32Le(uint32_t v, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void DecodeAndCheck(std::string_view shard) {
  using lede::fuzz::Check;
  std::vector<lede::experience::Transition> out;
  const lede::experience::ShardReport report = lede::experience::DecodeShard(shard, "fuzz.lexp", &out);
  Check(report.records >= 0 && static_cast<size_t>(report.records) == out.size(),
        "records disagrees with the transitions returned");
  for (const lede::experience::Transition& t : out) {
    lede::v1::Transition wire;
    lede::experience::ToProto(t, &wire);
    Check(lede::experience::FromProto(wire).ok(), "a decoded transition does not survive ToProto/FromProto");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Invalid UTF-8 in a string field is an expected parse failure; protobuf
  // would log each one.
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  DecodeAndCheck(input);
  std::string framed(lede::experience::kShardMagic, lede::experience::kShardMagicSize);
  PutUint32Le(static_cast<uint32_t>(size), &framed);
  PutUint32Le(static_cast<uint32_t>(::crc32(0L, data, static_cast<uInt>(size))), &framed);
  framed.append(input);
  DecodeAndCheck(framed);
  return 0;
}
