// The model-loading flag group (shared/flags/model_flags.h): which flags a
// binary registers, their one help text, --threads resolution and the
// memory sizes of --kv-memory.
#include "shared/flags/model_flags.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/flags/flags.h"
#include "tests/testing/status_matchers.h"

namespace lede::flags {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

// A binary gets exactly the flags it asks for, parsed into the group.
TEST(ModelLoadFlagsTest, RegistersOnlyTheChosenFlags) {
  ModelLoadFlags v;
  FlagSet f;
  AddModelLoadFlags(&f, &v, kModelPath | kThreads | kWeights);
  ASSERT_THAT(f.Parse({"--model", "m.gguf", "--threads", "3", "--weights=bf16"}), IsOk());
  EXPECT_EQ(v.model, "m.gguf");
  EXPECT_EQ(v.threads, 3);
  EXPECT_EQ(v.weights, "bf16");
  EXPECT_EQ(v.dtype, "float32");
  EXPECT_THAT(f.Parse({"--model", "m", "--dtype", "bfloat16"}), StatusIs(StatusCode::kInvalidArgument));
  const std::string usage = f.Usage();
  EXPECT_THAT(usage, HasSubstr("--weights"));
  EXPECT_THAT(usage, Not(HasSubstr("--kernels")));
  EXPECT_THAT(usage, Not(HasSubstr("--device")));
}

// --model is required unless the binary gave it a default.
TEST(ModelLoadFlagsTest, ModelIsRequiredWithoutADefault) {
  ModelLoadFlags v;
  FlagSet f;
  AddModelLoadFlags(&f, &v);
  EXPECT_THAT(f.Parse({}), StatusIs(StatusCode::kInvalidArgument));
  ModelLoadFlags with_default;
  with_default.model = "models/lede-tiny";
  FlagSet g;
  AddModelLoadFlags(&g, &with_default);
  EXPECT_THAT(g.Parse({}), IsOk());
  EXPECT_EQ(with_default.model, "models/lede-tiny");
}

// Every binary prints the same help line for a flag of the group: the
// registration in two sets gives identical usage, and it is the whole text.
TEST(ModelLoadFlagsTest, OneHelpTextPerFlag) {
  ModelLoadFlags a, b;
  b.threads = 1;  // a binary's own default changes only "(default: ...)"
  FlagSet fa, fb;
  AddModelLoadFlags(&fa, &a, kWeights | kThreads);
  AddModelLoadFlags(&fb, &b, kThreads);
  AddModelLoadFlags(&fb, &b, kWeights);
  std::string ua = fa.Usage();
  const size_t at = ua.find("(default: 0)");
  ASSERT_NE(at, std::string::npos);
  ua.replace(at, 12, "(default: 1)");
  EXPECT_EQ(ua, fb.Usage());
  EXPECT_THAT(fa.Usage(), HasSubstr("0 = every CPU this process may use"));
}

// --threads 0 is every CPU the process may use; negative or absurd counts
// are refused naming the flag.
TEST(ModelLoadFlagsTest, ThreadsZeroIsEveryUsableCpu) {
  EXPECT_GE(UsableCpus(), 1);
  StatusOr<int> all = ResolveThreads(0);
  ASSERT_THAT(all, IsOk());
  EXPECT_EQ(*all, UsableCpus());
  StatusOr<int> three = ResolveThreads(3);
  ASSERT_THAT(three, IsOk());
  EXPECT_EQ(*three, 3);
  StatusOr<int> negative = ResolveThreads(-1);
  EXPECT_THAT(negative, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(negative.status().message()), HasSubstr("--threads"));
  EXPECT_THAT(ResolveThreads(100000), StatusIs(StatusCode::kInvalidArgument));
}

// In a container the CPU quota and the memory limit cap what the host
// shows (cgroup v2 cpu.max, memory.max / memory.current).
TEST(ModelLoadFlagsTest, ContainerLimitsCapCpusAndMemory) {
  EXPECT_EQ(CpusUnderQuota(16, "max 100000"), 16);
  EXPECT_EQ(CpusUnderQuota(16, "200000 100000"), 2);
  EXPECT_EQ(CpusUnderQuota(16, "150000 100000"), 2);
  EXPECT_EQ(CpusUnderQuota(16, "50000 100000"), 1);
  EXPECT_EQ(CpusUnderQuota(2, "800000 100000"), 2);
  EXPECT_EQ(CpusUnderQuota(4, ""), 4);
  const int64_t gib = int64_t{1} << 30;
  EXPECT_EQ(AvailableUnderLimit(20 * gib, "max", "123"), 20 * gib);
  EXPECT_EQ(AvailableUnderLimit(20 * gib, "", ""), 20 * gib);
  EXPECT_EQ(AvailableUnderLimit(20 * gib, std::to_string(8 * gib), std::to_string(3 * gib)), 5 * gib);
  EXPECT_EQ(AvailableUnderLimit(2 * gib, std::to_string(8 * gib), std::to_string(3 * gib)), 2 * gib);
}

// Sizes: binary units, decimal units, plain bytes, fractions and a
// percentage of the available memory.
TEST(ModelLoadFlagsTest, MemorySizes) {
  const int64_t gib = int64_t{1} << 30;
  EXPECT_EQ(ParseMemorySize("kv-memory", "4GiB", 0).value(), 4 * gib);
  EXPECT_EQ(ParseMemorySize("kv-memory", "4G", 0).value(), 4 * gib);
  EXPECT_EQ(ParseMemorySize("kv-memory", "512MiB", 0).value(), 512 * (int64_t{1} << 20));
  EXPECT_EQ(ParseMemorySize("kv-memory", "2GB", 0).value(), 2000000000);
  EXPECT_EQ(ParseMemorySize("kv-memory", "1.5gib", 0).value(), 3 * gib / 2);
  EXPECT_EQ(ParseMemorySize("kv-memory", "1048576", 0).value(), 1048576);
  EXPECT_EQ(ParseMemorySize("kv-memory", "25%", 8 * gib).value(), 2 * gib);
  EXPECT_EQ(ParseMemorySize("kv-memory", " 100 % ", 8 * gib).value(), 8 * gib);
}

// A bad size is kInvalidArgument naming the flag.
TEST(ModelLoadFlagsTest, BadMemorySizesNameTheFlag) {
  for (const std::string bad : {"", "lots", "4 parsecs", "-1GiB", "0", "0%", "150%", "nan"}) {
    StatusOr<int64_t> parsed = ParseMemorySize("kv-memory", bad, int64_t{1} << 30);
    EXPECT_THAT(parsed, StatusIs(StatusCode::kInvalidArgument)) << bad;
    if (!parsed.ok()) {
      EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("--kv-memory")) << bad;
    }
  }
}

// MemAvailable is read from /proc/meminfo (Linux).
TEST(ModelLoadFlagsTest, MemAvailableIsPositive) {
  StatusOr<int64_t> available = MemAvailableBytes();
  ASSERT_THAT(available, IsOk());
  EXPECT_GT(*available, 0);
  EXPECT_EQ(FormatBytes(int64_t{3} << 30), "3.00 GiB");
}

}  // namespace
}  // namespace lede::flags
