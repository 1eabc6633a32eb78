// Tests for shared/checkpoint/safetensors.h: the torch-free safetensors
// reader and writer round-trip values and shapes, widen F16/BF16/F64 to
// float32 exactly, and refuse malformed files and tensors with
// kInvalidArgument.
#include "shared/checkpoint/safetensors.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::checkpoint {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

// A file of one header (JSON text) and `data`, as the format lays it out.
std::string FileOf(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

// Written tensors read back with their dtype, shape and bytes.
TEST(SafetensorsTest, RoundTripsShapesAndValues) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string path = (tmp.path() / "w.safetensors").string();
  const std::vector<float> a = {1.5f, -2.0f, 0.25f, 3.0f, 0.0f, -0.5f};
  const std::vector<uint16_t> b = {0x3f80, 0xc000};  // BF16 1.0, -2.0
  std::map<std::string, TensorBytes> tensors = {
      {"a", {Dtype::kF32, {2, 3}, a.data(), a.size() * sizeof(float)}},
      {"b", {Dtype::kBF16, {2}, b.data(), b.size() * sizeof(uint16_t)}},
      {"empty", {Dtype::kF32, {0, 4}, nullptr, 0}}};
  ASSERT_THAT(WriteSafetensors(path, tensors), IsOk());

  auto file = SafetensorsFile::Open(path);
  ASSERT_THAT(file, IsOk());
  ASSERT_EQ((*file)->tensors().size(), 3u);
  const TensorView& va = (*file)->tensors().at("a");
  EXPECT_EQ(va.dtype, Dtype::kF32);
  EXPECT_EQ(va.shape, (std::vector<int64_t>{2, 3}));
  auto fa = ToFloat32(va);
  ASSERT_THAT(fa, IsOk());
  EXPECT_EQ(*fa, a);
  auto fb = ToFloat32((*file)->tensors().at("b"));
  ASSERT_THAT(fb, IsOk());
  EXPECT_EQ(*fb, (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ((*file)->tensors().at("empty").shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ((*file)->tensors().at("empty").numel(), 0);
}

// F16 (normal, subnormal, zero, infinity) and F64 convert exactly to float32.
TEST(SafetensorsTest, WidensHalfAndNarrowsDouble) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string path = (tmp.path() / "h.safetensors").string();
  const uint16_t half[5] = {0x3c00, 0xc500, 0x0001, 0x8000, 0x7c00};  // 1, -5, 2^-24, -0, inf
  const double dbl[2] = {0.125, -3.0};
  std::string data(reinterpret_cast<const char*>(half), sizeof(half));
  data.append(6, '\0');  // F64 data starts at byte 16
  data.append(reinterpret_cast<const char*>(dbl), sizeof(dbl));
  WriteBytes(path, FileOf(R"({"h":{"dtype":"F16","shape":[5],"data_offsets":[0,10]},)"
                          R"("d":{"dtype":"F64","shape":[2],"data_offsets":[16,32]}})",
                          data));
  auto file = SafetensorsFile::Open(path);
  ASSERT_THAT(file, IsOk());
  auto h = ToFloat32((*file)->tensors().at("h"));
  ASSERT_THAT(h, IsOk());
  EXPECT_EQ((*h)[0], 1.0f);
  EXPECT_EQ((*h)[1], -5.0f);
  EXPECT_EQ((*h)[2], 1.0f / 16777216.0f);
  EXPECT_EQ((*h)[3], 0.0f);
  EXPECT_TRUE(std::signbit((*h)[3]));
  EXPECT_TRUE(std::isinf((*h)[4]));
  auto d = ToFloat32((*file)->tensors().at("d"));
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ(*d, (std::vector<float>{0.125f, -3.0f}));
}

// Malformed files are kInvalidArgument; a missing one is kNotFound.
TEST(SafetensorsTest, RejectsMalformedFiles) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string path = (tmp.path() / "bad.safetensors").string();
  const std::string four(16, '\0');
  for (const std::string& bytes : {
           std::string("abc"),                                                        // truncated
           FileOf("{}", "").substr(0, 8) + "x",                                       // header past the end
           FileOf("not json", ""),                                                    // bad JSON
           FileOf(R"({"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}})", four),  // unknown dtype
           FileOf(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", four), // size mismatch
           FileOf(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,40]}})", four),  // out of range
           FileOf(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  four),  // overlapping
       }) {
    WriteBytes(path, bytes);
    EXPECT_THAT(SafetensorsFile::Open(path), StatusIs(StatusCode::kInvalidArgument)) << bytes.substr(8);
  }
  EXPECT_THAT(SafetensorsFile::Open((tmp.path() / "none").string()), StatusIs(StatusCode::kNotFound));
}

// The writer refuses reserved names, F64 and byte counts that disagree with
// the shape, and leaves no file behind.
TEST(SafetensorsTest, WriterRejectsBadTensors) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string path = (tmp.path() / "w.safetensors").string();
  const float v[2] = {1, 2};
  for (const auto& tensors : std::vector<std::map<std::string, TensorBytes>>{
           {{"__metadata__", {Dtype::kF32, {2}, v, 8}}},
           {{"", {Dtype::kF32, {2}, v, 8}}},
           {{"a", {Dtype::kF64, {1}, v, 8}}},
           {{"a", {Dtype::kF32, {3}, v, 8}}}}) {
    EXPECT_THAT(WriteSafetensors(path, tensors), StatusIs(StatusCode::kInvalidArgument));
  }
  EXPECT_FALSE(std::ifstream(path).good());
}

}  // namespace
}  // namespace lede::checkpoint
