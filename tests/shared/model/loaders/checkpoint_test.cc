// File: tests/shared/model/loaders/checkpoint_test.cc
//
// Tests for shared/model/loaders/checkpoint.h and model_config.h: the two real
// llama2.c models in testdata/models, HF and llama2.c round trips, and
// malformed files (each must give a Status, never a crash).
//
// The real models are found under lede::testing::TestDataDir()
// (tests/testing/test_data.h).
#include "shared/model/loaders/checkpoint.h"

#include <ATen/ATen.h>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/checkpoint/model_config.h"
#include "tests/testing/test_data.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::model::loaders {
namespace {

namespace fs = std::filesystem;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::lede::testing::TempDir;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using TensorMap = std::map<std::string, at::Tensor>;

std::string Stories260K() {
  return lede::testing::Stories260KDir() + "/stories260K.bin";
}
std::string BabyLlama() {
  return lede::testing::BabyLlamaDir() + "/model5000.bin";
}

// The path of `name` inside the temporary directory `dir`; under /nonexistent
// if mkdtemp failed (already a test failure), so that nothing is written to
// the working directory.
std::string PathIn(const TempDir& dir, const std::string& name) {
  const fs::path root = dir.path().empty() ? "/nonexistent" : dir.path();
  return (root / name).string();
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string Le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A safetensors file with the given JSON header and data region; the length
// field is the header's size unless `header_len` overrides it.
void WriteRawSafetensors(const std::string& path, const std::string& header,
                         const std::string& data,
                         std::optional<uint64_t> header_len = std::nullopt) {
  WriteBytes(path, Le64(header_len.value_or(header.size())) + header + data);
}

std::string Floats(std::initializer_list<float> values) {
  std::string s(values.size() * sizeof(float), '\0');
  std::memcpy(s.data(), values.begin(), s.size());
  return s;
}

// A small GQA config: d 16, ffn 24, 2 layers, 4 heads / 2 kv heads, V 11.
checkpoint::ModelConfig TinyConfig(bool tied) {
  checkpoint::ModelConfig c;
  c.dim = 16;
  c.hidden_dim = 24;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 11;
  c.max_seq_len = 32;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  c.bos_id = 1;
  c.eos_ids = {2};
  return c;
}

// The documented name -> shape table of checkpoint.h.
std::map<std::string, std::vector<int64_t>> ExpectedShapes(
    const checkpoint::ModelConfig& c) {
  const int64_t d = c.dim, hd = c.dim / c.n_heads, f = c.hidden_dim;
  const int64_t q = c.n_heads * hd, kv = c.n_kv_heads * hd;
  std::map<std::string, std::vector<int64_t>> s;
  s["model.embed_tokens.weight"] = {c.vocab_size, d};
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    s[p + "input_layernorm.weight"] = {d};
    s[p + "self_attn.q_proj.weight"] = {q, d};
    s[p + "self_attn.k_proj.weight"] = {kv, d};
    s[p + "self_attn.v_proj.weight"] = {kv, d};
    s[p + "self_attn.o_proj.weight"] = {d, q};
    s[p + "post_attention_layernorm.weight"] = {d};
    s[p + "mlp.gate_proj.weight"] = {f, d};
    s[p + "mlp.up_proj.weight"] = {f, d};
    s[p + "mlp.down_proj.weight"] = {d, f};
  }
  s["model.norm.weight"] = {d};
  if (!c.tie_word_embeddings) s["lm_head.weight"] = {c.vocab_size, d};
  return s;
}

TensorMap RandomTensors(const checkpoint::ModelConfig& c, uint64_t seed) {
  at::manual_seed(seed);
  TensorMap t;
  for (const auto& [name, shape] : ExpectedShapes(c))
    t[name] = at::randn(shape);
  return t;
}

void ExpectShapesAsDocumented(const Checkpoint& ckpt) {
  const auto expected = ExpectedShapes(ckpt.config);
  EXPECT_EQ(ckpt.tensors.size(), expected.size());
  for (const auto& [name, shape] : expected) {
    auto it = ckpt.tensors.find(name);
    ASSERT_NE(it, ckpt.tensors.end()) << name;
    EXPECT_EQ(it->second.sizes().vec(), shape) << name;
    EXPECT_EQ(it->second.scalar_type(), at::kFloat) << name;
    EXPECT_TRUE(it->second.device().is_cpu()) << name;
  }
}

void ExpectSameTensors(const TensorMap& actual, const TensorMap& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, t] : expected) {
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << name;
    EXPECT_TRUE(at::equal(it->second, t)) << name;
  }
}

void ExpectSameConfig(const checkpoint::ModelConfig& a, const checkpoint::ModelConfig& b) {
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.hidden_dim, b.hidden_dim);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_seq_len, b.max_seq_len);
  EXPECT_DOUBLE_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_DOUBLE_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.bos_id, b.bos_id);
  EXPECT_EQ(a.eos_ids, b.eos_ids);
  EXPECT_EQ(a.ArchitectureFingerprint(), b.ArchitectureFingerprint());
}

// An HF directory: config.json from `config` and model.safetensors.
void WriteHfDir(const std::string& dir, const std::string& config_json,
                const TensorMap& tensors) {
  fs::create_directories(dir);
  WriteBytes(dir + "/config.json", config_json);
  ASSERT_THAT(WriteSafetensors(dir + "/model.safetensors", tensors), IsOk());
}

// --- the real models -------------------------------------------------------

// stories260K loads with its documented config and every tensor shape.
TEST(CheckpointTest, Stories260KLoadsWithDocumentedShapes) {
  ASSERT_TRUE(fs::exists(Stories260K())) << Stories260K();
  auto ckpt = LoadCheckpoint(Stories260K());
  ASSERT_THAT(ckpt, IsOk());
  const checkpoint::ModelConfig& c = ckpt->config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_style, checkpoint::RopeStyle::kAdjacentPairs);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_THAT(c.eos_ids, ElementsAre(2));
  EXPECT_EQ(ckpt->source, Stories260K());
  EXPECT_EQ(ckpt->tensors.count("lm_head.weight"), 0u);
  ExpectShapesAsDocumented(*ckpt);
  EXPECT_EQ(ckpt->tensors.at("model.layers.0.self_attn.k_proj.weight").sizes(),
            (std::vector<int64_t>{32, 64}));
}

// babyllama-tok105 loads with its documented config and every tensor shape.
TEST(CheckpointTest, BabyLlamaLoadsWithDocumentedShapes) {
  ASSERT_TRUE(fs::exists(BabyLlama())) << BabyLlama();
  auto ckpt = LoadLlama2cCheckpoint(BabyLlama());
  ASSERT_THAT(ckpt, IsOk());
  const checkpoint::ModelConfig& c = ckpt->config;
  EXPECT_EQ(c.dim, 128);
  EXPECT_EQ(c.hidden_dim, 352);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 105);
  EXPECT_EQ(c.max_seq_len, 256);
  EXPECT_TRUE(c.tie_word_embeddings);
  ExpectShapesAsDocumented(*ckpt);
}

// llama2.c tensors hold the file's floats at the documented offsets.
TEST(CheckpointTest, Llama2cTensorsMatchRawFileFloats) {
  const std::string bytes = ReadBytes(Stories260K());
  ASSERT_EQ(bytes.size(), 1056540u);
  auto raw = [&](int64_t float_index) {
    float v;
    std::memcpy(&v, bytes.data() + 28 + 4 * float_index, sizeof(v));
    return v;
  };
  auto ckpt = LoadLlama2cCheckpoint(Stories260K());
  ASSERT_THAT(ckpt, IsOk());
  const TensorMap& t = ckpt->tensors;
  // token_embedding starts right after the header.
  EXPECT_EQ(t.at("model.embed_tokens.weight")[0][1].item<float>(), raw(1));
  EXPECT_EQ(t.at("model.embed_tokens.weight")[511][63].item<float>(),
            raw(512 * 64 - 1));
  // wq of layer 1: after emb (32768), rms_att (5*64) and layer 0's wq (4096).
  EXPECT_EQ(t.at("model.layers.1.self_attn.q_proj.weight")[2][3].item<float>(),
            raw(32768 + 320 + 4096 + 2 * 64 + 3));
  // w2 (down_proj) follows w1: emb, rms_att, wq, wk, wv, wo, rms_ffn, w1.
  const int64_t w2 = 32768 + 320 + 20480 + 10240 + 10240 + 20480 + 320 + 55040;
  EXPECT_EQ(t.at("model.layers.0.mlp.down_proj.weight")[1][0].item<float>(),
            raw(w2 + 172));
  // rms_final sits just before the two freq_cis tables (2 * 512 * 4 floats).
  EXPECT_EQ(t.at("model.norm.weight")[63].item<float>(),
            raw(264128 - 4096 - 1));
}

// A directory holding one model .bin (tokenizer tok*.bin skipped) loads.
TEST(CheckpointTest, LoadCheckpointAcceptsModelDirectory) {
  for (const std::string& file : {Stories260K(), BabyLlama()}) {
    auto by_dir = LoadCheckpoint(fs::path(file).parent_path().string());
    ASSERT_THAT(by_dir, IsOk()) << file;
    auto by_file = LoadCheckpoint(file);
    ASSERT_THAT(by_file, IsOk()) << file;
    ExpectSameConfig(by_dir->config, by_file->config);
    ExpectSameTensors(by_dir->tensors, by_file->tensors);
  }
}

// Loaded (memory-mapped) tensors stay valid after the Checkpoint is gone.
TEST(CheckpointTest, LoadedTensorsOutliveTheCheckpoint) {
  at::Tensor emb, copy;
  {
    auto ckpt = LoadCheckpoint(Stories260K());
    ASSERT_THAT(ckpt, IsOk());
    emb = ckpt->tensors.at("model.embed_tokens.weight");
    copy = emb.clone();
  }
  EXPECT_TRUE(at::equal(emb, copy));
}

// The file mapping is released once the last tensor using it is gone
// (checked through /proc/self/maps, so Linux only).
TEST(CheckpointTest, MappingIsReleasedWithTheLastTensor) {
  TempDir tmp;
  const std::string file = PathIn(tmp, "mapped.safetensors");
  ASSERT_THAT(WriteSafetensors(file, {{"w", at::ones({1024})}}), IsOk());
  auto mapped = [&] {
    return ReadBytes("/proc/self/maps").find(file) != std::string::npos;
  };
  {
    auto loaded = ReadSafetensors(file);
    ASSERT_THAT(loaded, IsOk());
    at::Tensor w = loaded->at("w");
    loaded = InternalError("dropped");
    EXPECT_TRUE(mapped());
    EXPECT_EQ(w.sum().item<float>(), 1024.0f);
  }
  EXPECT_FALSE(mapped());
}

// A real model converted to HF (wq/wk to rotate-half) and back is unchanged.
TEST(CheckpointTest, RealModelSurvivesHfConversion) {
  TempDir tmp;
  auto ckpt = LoadLlama2cCheckpoint(Stories260K());
  ASSERT_THAT(ckpt, IsOk());
  const checkpoint::ModelConfig& c = ckpt->config;
  TensorMap hf = ckpt->tensors;
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".self_attn.";
    hf[p + "q_proj.weight"] =
        PermuteRopeRows(hf[p + "q_proj.weight"], c.n_heads, true);
    hf[p + "k_proj.weight"] =
        PermuteRopeRows(hf[p + "k_proj.weight"], c.n_kv_heads, true);
  }
  ASSERT_THAT(WriteHfCheckpoint(PathIn(tmp, "hf"), c, hf), IsOk());
  auto back = LoadCheckpoint(PathIn(tmp, "hf"));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->config.rope_style, checkpoint::RopeStyle::kRotateHalf);
  ExpectSameTensors(back->tensors, hf);
  const at::Tensor q0 = PermuteRopeRows(
      back->tensors.at("model.layers.0.self_attn.q_proj.weight"), c.n_heads,
      false);
  EXPECT_TRUE(at::equal(
      q0, ckpt->tensors.at("model.layers.0.self_attn.q_proj.weight")));
}

// --- round trips -------------------------------------------------------------

// Random tensors written as an HF checkpoint load back identical (tied and
// untied), with the same config.
TEST(CheckpointTest, HfRoundTripPreservesTensorsAndConfig) {
  for (bool tied : {true, false}) {
    TempDir tmp;
    checkpoint::ModelConfig config = TinyConfig(tied);
    config.rope_theta = 500000.0;
    config.eos_ids = {2, 7};
    const TensorMap tensors = RandomTensors(config, 1);
    ASSERT_THAT(WriteHfCheckpoint(PathIn(tmp, "ckpt"), config, tensors),
                IsOk());
    EXPECT_TRUE(fs::exists(PathIn(tmp, "ckpt/config.json")));
    auto loaded = LoadHfCheckpoint(PathIn(tmp, "ckpt"));
    ASSERT_THAT(loaded, IsOk());
    ExpectSameConfig(loaded->config, config);
    EXPECT_EQ(loaded->config.rope_style, checkpoint::RopeStyle::kRotateHalf);
    ExpectSameTensors(loaded->tensors, tensors);
    EXPECT_EQ(loaded->tensors.count("lm_head.weight"), tied ? 0u : 1u);
    EXPECT_EQ(loaded->source, PathIn(tmp, "ckpt"));
  }
}

// A tied checkpoint that also stores lm_head.weight loads without it.
TEST(CheckpointTest, TiedCheckpointDropsStoredLmHead) {
  TempDir tmp;
  const checkpoint::ModelConfig config = TinyConfig(/*tied=*/true);
  TensorMap tensors = RandomTensors(config, 2);
  tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"];
  WriteHfDir(PathIn(tmp, "ckpt"), checkpoint::ToHfConfigJson(config), tensors);
  auto loaded = LoadCheckpoint(PathIn(tmp, "ckpt"));
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(loaded->tensors.count("lm_head.weight"), 0u);
}

// generation_config.json's eos list (Llama-3.1: 128001, 128008, 128009)
// replaces config.json's single eos id; a bad id is kInvalidArgument.
TEST(CheckpointTest, GenerationConfigEosListWins) {
  TempDir tmp;
  const checkpoint::ModelConfig config = TinyConfig(/*tied=*/true);
  WriteHfDir(PathIn(tmp, "ckpt"), checkpoint::ToHfConfigJson(config), RandomTensors(config, 3));
  std::ofstream(PathIn(tmp, "ckpt") + "/generation_config.json") << R"({"bos_token_id": 0, "eos_token_id": [2, 5, 7]})";
  auto loaded = LoadCheckpoint(PathIn(tmp, "ckpt"));
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(loaded->config.bos_id, 0);
  EXPECT_EQ(loaded->config.eos_ids, (std::vector<int32_t>{2, 5, 7}));
  std::ofstream(PathIn(tmp, "ckpt") + "/generation_config.json") << R"({"eos_token_id": "x"})";
  EXPECT_THAT(LoadCheckpoint(PathIn(tmp, "ckpt")), StatusIs(StatusCode::kInvalidArgument));
}

// F16 safetensors load as float32 equal to the F16-rounded values.
TEST(CheckpointTest, F16SafetensorsConvertToFloat32) {
  TempDir tmp;
  at::manual_seed(3);
  const TensorMap tensors = {{"a", at::randn({5, 7})}, {"b", at::randn({3})}};
  ASSERT_THAT(WriteSafetensors(PathIn(tmp, "h.safetensors"), tensors, "F16"),
              IsOk());
  const std::string bytes = ReadBytes(PathIn(tmp, "h.safetensors"));
  EXPECT_THAT(bytes, HasSubstr("\"F16\""));
  auto loaded = ReadSafetensors(PathIn(tmp, "h.safetensors"));
  ASSERT_THAT(loaded, IsOk());
  for (const auto& [name, t] : tensors) {
    const at::Tensor& got = loaded->at(name);
    EXPECT_EQ(got.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(got, t.to(at::kHalf).to(at::kFloat))) << name;
  }
  // Exactly representable values survive unchanged: 1.5 is 0x3E00 in F16.
  WriteRawSafetensors(
      PathIn(tmp, "x.safetensors"),
      R"({"x":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})",
      std::string("\x00\x3e\x00\xc0", 4));
  auto x = ReadSafetensors(PathIn(tmp, "x.safetensors"));
  ASSERT_THAT(x, IsOk());
  EXPECT_EQ(x->at("x")[0].item<float>(), 1.5f);
  EXPECT_EQ(x->at("x")[1].item<float>(), -2.0f);
}

// BF16 safetensors load as float32 equal to the BF16-rounded values.
TEST(CheckpointTest, Bf16SafetensorsConvertToFloat32) {
  TempDir tmp;
  at::manual_seed(4);
  const TensorMap tensors = {{"w", at::randn({4, 6})}};
  ASSERT_THAT(WriteSafetensors(PathIn(tmp, "b.safetensors"), tensors, "BF16"),
              IsOk());
  auto loaded = ReadSafetensors(PathIn(tmp, "b.safetensors"));
  ASSERT_THAT(loaded, IsOk());
  EXPECT_TRUE(at::equal(loaded->at("w"),
                        tensors.at("w").to(at::kBFloat16).to(at::kFloat)));
  // 1.0 is 0x3F80 and -3.0 is 0xC040 in BF16; odd data offset (unaligned).
  WriteRawSafetensors(
      PathIn(tmp, "x.safetensors"),
      R"({"x":{"dtype":"BF16","shape":[2],"data_offsets":[1,5]}})",
      std::string("\x00\x80\x3f\x40\xc0", 5));
  auto x = ReadSafetensors(PathIn(tmp, "x.safetensors"));
  ASSERT_THAT(x, IsOk());
  EXPECT_EQ(x->at("x")[0].item<float>(), 1.0f);
  EXPECT_EQ(x->at("x")[1].item<float>(), -3.0f);
}

// F32 tensors are views of one mapping of the file (zero copy): their data
// pointers are as far apart as their data_offsets.
TEST(CheckpointTest, F32TensorsAreMappedNotCopied) {
  TempDir tmp;
  WriteRawSafetensors(
      PathIn(tmp, "m.safetensors"),
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
      Floats({1, 2, 3, 4}));
  auto loaded = ReadSafetensors(PathIn(tmp, "m.safetensors"));
  ASSERT_THAT(loaded, IsOk());
  const auto* a = static_cast<const char*>(loaded->at("a").data_ptr());
  const auto* b = static_cast<const char*>(loaded->at("b").data_ptr());
  EXPECT_EQ(b - a, 8);
  EXPECT_EQ(loaded->at("b")[1].item<float>(), 4.0f);
}

// The header length of a written file is a multiple of 8 (space padded).
TEST(CheckpointTest, WriteSafetensorsPadsHeaderToEightBytes) {
  TempDir tmp;
  for (int n = 1; n <= 8; ++n) {
    const TensorMap tensors = {{std::string(n, 'x'), at::ones({1})}};
    ASSERT_THAT(WriteSafetensors(PathIn(tmp, "p.safetensors"), tensors),
                IsOk());
    const std::string bytes = ReadBytes(PathIn(tmp, "p.safetensors"));
    ASSERT_GE(bytes.size(), 8u);
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i)
      len = (len << 8) | static_cast<uint8_t>(bytes[i]);
    EXPECT_EQ(len % 8, 0u);
    ASSERT_EQ(bytes.size(), 8 + len + 4);
    const std::string header = bytes.substr(8, len);
    const size_t last = header.find_last_not_of(' ');
    ASSERT_NE(last, std::string::npos);
    EXPECT_EQ(header[last], '}');  // JSON, then only spaces
    EXPECT_LT(len - 1 - last, 8u);
  }
  // Nothing but the destination is left behind (the temp file was renamed).
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()),
                          fs::directory_iterator()),
            1);
}

// A sharded checkpoint loads through model.safetensors.index.json.
TEST(CheckpointTest, ShardedCheckpointLoadsThroughIndex) {
  TempDir tmp;
  const checkpoint::ModelConfig config = TinyConfig(/*tied=*/false);
  const TensorMap tensors = RandomTensors(config, 5);
  TensorMap shard1, shard2;
  std::string weight_map;
  for (const auto& [name, t] : tensors) {
    const bool first = name.find("layers.1.") == std::string::npos;
    (first ? shard1 : shard2)[name] = t;
    weight_map += std::string(weight_map.empty() ? "" : ",") + "\"" + name +
                  "\":\"" +
                  (first ? "model-00001-of-00002.safetensors"
                         : "model-00002-of-00002.safetensors") +
                  "\"";
  }
  const std::string dir = PathIn(tmp, "sharded");
  fs::create_directories(dir);
  WriteBytes(dir + "/config.json", checkpoint::ToHfConfigJson(config));
  ASSERT_THAT(
      WriteSafetensors(dir + "/model-00001-of-00002.safetensors", shard1),
      IsOk());
  ASSERT_THAT(
      WriteSafetensors(dir + "/model-00002-of-00002.safetensors", shard2),
      IsOk());
  WriteBytes(
      dir + "/model.safetensors.index.json",
      R"({"metadata":{"total_size":0},"weight_map":{)" + weight_map + "}}");
  auto loaded = LoadCheckpoint(dir);
  ASSERT_THAT(loaded, IsOk());
  ExpectSameTensors(loaded->tensors, tensors);
}

// WriteLlama2cCheckpoint -> LoadLlama2cCheckpoint is exact, tied and untied;
// untied heads are stored with a negative vocab_size.
TEST(CheckpointTest, Llama2cRoundTripTiedAndUntied) {
  for (bool tied : {true, false}) {
    TempDir tmp;
    const checkpoint::ModelConfig config = TinyConfig(tied);
    const TensorMap tensors = RandomTensors(config, 6);
    const std::string file = PathIn(tmp, "model.bin");
    ASSERT_THAT(WriteLlama2cCheckpoint(file, config, tensors), IsOk());
    const std::string bytes = ReadBytes(file);
    int32_t header[7];
    ASSERT_GE(bytes.size(), sizeof(header));
    std::memcpy(header, bytes.data(), sizeof(header));
    EXPECT_EQ(header[5], tied ? 11 : -11);
    auto loaded = LoadLlama2cCheckpoint(file);
    ASSERT_THAT(loaded, IsOk());
    checkpoint::ModelConfig expected = config;
    expected.rope_style = checkpoint::RopeStyle::kAdjacentPairs;
    ExpectSameConfig(loaded->config, expected);
    EXPECT_EQ(loaded->config.rope_style, checkpoint::RopeStyle::kAdjacentPairs);
    ExpectSameTensors(loaded->tensors, tensors);
  }
}

// Rewriting a real model as llama2.c reproduces the original file bytes,
// except the legacy freq_cis tables, which are written as zeros.
TEST(CheckpointTest, Llama2cRewriteOfRealModelMatchesFile) {
  TempDir tmp;
  auto ckpt = LoadLlama2cCheckpoint(Stories260K());
  ASSERT_THAT(ckpt, IsOk());
  ASSERT_THAT(
      WriteLlama2cCheckpoint(PathIn(tmp, "s.bin"), ckpt->config, ckpt->tensors),
      IsOk());
  const std::string original = ReadBytes(Stories260K());
  const std::string rewritten = ReadBytes(PathIn(tmp, "s.bin"));
  ASSERT_EQ(rewritten.size(), original.size());
  const size_t freq_bytes = 2 * 512 * 4 * sizeof(float);
  const size_t body = original.size() - freq_bytes;
  EXPECT_EQ(rewritten.compare(0, body, original, 0, body), 0);
  EXPECT_EQ(rewritten.substr(body), std::string(freq_bytes, '\0'));
}

// PermuteRopeRows there and back is the identity, in both directions.
TEST(CheckpointTest, PermuteRopeRowsRoundTripIsIdentity) {
  at::manual_seed(7);
  const at::Tensor w = at::randn({4 * 8, 5});
  const at::Tensor rh = PermuteRopeRows(w, 4, /*to_rotate_half=*/true);
  ASSERT_TRUE(rh.defined());
  EXPECT_FALSE(at::equal(rh, w));
  EXPECT_TRUE(at::equal(PermuteRopeRows(rh, 4, false), w));
  EXPECT_TRUE(
      at::equal(PermuteRopeRows(PermuteRopeRows(w, 4, false), 4, true), w));
}

// Adjacent-pair rows (2i, 2i+1) of each head become rotate-half rows
// (i, i + head_dim/2): 2 heads of head_dim 4, each row holding its index.
TEST(CheckpointTest, PermuteRopeRowsMovesRowsAsDocumented) {
  const at::Tensor w =
      at::arange(8, at::kFloat).unsqueeze(1).repeat({1, 3});  // [8, 3]
  const at::Tensor rh = PermuteRopeRows(w, /*n_heads=*/2, true);
  ASSERT_TRUE(rh.defined());
  // head 0: rows 0,1,2,3 (pairs (0,1),(2,3)) -> 0,2,1,3; head 1 likewise.
  const std::vector<float> expected = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_EQ(rh[r][0].item<float>(), expected[r]) << "row " << r;
    EXPECT_EQ(rh[r][2].item<float>(), expected[r]) << "row " << r;
  }
  // Odd head_dim or rows not divisible by heads: undefined result, no throw.
  EXPECT_FALSE(PermuteRopeRows(at::zeros({6, 2}), 2, true).defined());
  EXPECT_FALSE(PermuteRopeRows(at::zeros({8, 2}), 3, true).defined());
  EXPECT_FALSE(PermuteRopeRows(at::Tensor(), 2, true).defined());
}

// --- malformed files ---------------------------------------------------------

// A truncated llama2.c .bin names the file and expected vs actual sizes.
TEST(CheckpointTest, TruncatedBinIsInvalidArgument) {
  TempDir tmp;
  const std::string bytes = ReadBytes(Stories260K());
  const std::string file = PathIn(tmp, "cut.bin");
  WriteBytes(file, bytes.substr(0, bytes.size() - 100));
  auto r = LoadCheckpoint(file);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(
      std::string(r.status().message()),
      AllOf(HasSubstr(file), HasSubstr("1056540"), HasSubstr("1056440")));
  WriteBytes(file, bytes.substr(0, 10));  // shorter than the header
  EXPECT_THAT(LoadCheckpoint(file), StatusIs(StatusCode::kInvalidArgument));
  WriteBytes(file, bytes + "x");  // trailing bytes
  EXPECT_THAT(LoadCheckpoint(file), StatusIs(StatusCode::kInvalidArgument));
}

// Absurd or inconsistent llama2.c header values are rejected.
TEST(CheckpointTest, AbsurdLlama2cHeaderIsInvalidArgument) {
  TempDir tmp;
  const std::vector<std::vector<int32_t>> headers = {
      {-64, 172, 5, 8, 4, 512, 512},                // negative dim
      {64, 172, 5, 8, 4, 0, 512},                   // zero vocab
      {1 << 30, 1 << 30, 1 << 20, 8, 4, 512, 512},  // huge
      {64, 172, 5, 7, 7, 512, 512},                 // dim % n_heads
      {64, 172, 5, 8, 3, 512, 512},                 // n_heads % n_kv_heads
      {64, 172, 5, 8, 4, INT32_MIN, 512},           // |INT32_MIN| overflow
  };
  for (const auto& h : headers) {
    std::string bytes(reinterpret_cast<const char*>(h.data()), 28);
    bytes += std::string(4096, '\0');
    WriteBytes(PathIn(tmp, "bad.bin"), bytes);
    EXPECT_THAT(LoadLlama2cCheckpoint(PathIn(tmp, "bad.bin")),
                StatusIs(StatusCode::kInvalidArgument))
        << h[0] << " " << h[3] << " " << h[4] << " " << h[5];
  }
}

// A safetensors file shorter than its 8-byte length field is rejected.
TEST(CheckpointTest, SafetensorsShorterThanEightBytesIsInvalidArgument) {
  TempDir tmp;
  for (const std::string& bytes : {std::string(), std::string("\x10\0\0", 3)}) {
    WriteBytes(PathIn(tmp, "s.safetensors"), bytes);
    EXPECT_THAT(ReadSafetensors(PathIn(tmp, "s.safetensors")),
                StatusIs(StatusCode::kInvalidArgument));
  }
}

// A safetensors file cut inside its data region is rejected.
TEST(CheckpointTest, TruncatedSafetensorsIsInvalidArgument) {
  TempDir tmp;
  ASSERT_THAT(
      WriteSafetensors(PathIn(tmp, "s.safetensors"),
                       {{"w", at::ones({16, 16})}}),
      IsOk());
  const std::string bytes = ReadBytes(PathIn(tmp, "s.safetensors"));
  WriteBytes(PathIn(tmp, "s.safetensors"), bytes.substr(0, bytes.size() - 10));
  EXPECT_THAT(ReadSafetensors(PathIn(tmp, "s.safetensors")),
              StatusIs(StatusCode::kInvalidArgument));
}

// A header length past the end of the file is rejected.
TEST(CheckpointTest, HeaderLengthPastEndIsInvalidArgument) {
  TempDir tmp;
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  for (uint64_t len : {uint64_t{4096}, ~uint64_t{0}}) {
    WriteRawSafetensors(PathIn(tmp, "s.safetensors"), header, Floats({1}), len);
    auto r = ReadSafetensors(PathIn(tmp, "s.safetensors"));
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("header length"));
  }
}

// A header that is not JSON (or not an object) is rejected.
TEST(CheckpointTest, BadJsonHeaderIsInvalidArgument) {
  TempDir tmp;
  for (const std::string header :
       {R"({"w":{"dtype":"F32","shape":[1],)", "[1, 2]", "\xff\xfe garbage"}) {
    WriteRawSafetensors(PathIn(tmp, "s.safetensors"), header, Floats({1}));
    EXPECT_THAT(ReadSafetensors(PathIn(tmp, "s.safetensors")),
                StatusIs(StatusCode::kInvalidArgument))
        << header;
  }
}

// An unknown dtype is rejected and named.
TEST(CheckpointTest, UnknownDtypeIsInvalidArgument) {
  TempDir tmp;
  WriteRawSafetensors(
      PathIn(tmp, "s.safetensors"),
      R"({"w":{"dtype":"Q7X","shape":[1],"data_offsets":[0,4]}})", Floats({1}));
  auto r = ReadSafetensors(PathIn(tmp, "s.safetensors"));
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("Q7X"));
}

// Data offsets past the data region are rejected.
TEST(CheckpointTest, OffsetsOutOfRangeIsInvalidArgument) {
  TempDir tmp;
  WriteRawSafetensors(
      PathIn(tmp, "s.safetensors"),
      R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      Floats({1, 2}));
  EXPECT_THAT(ReadSafetensors(PathIn(tmp, "s.safetensors")),
              StatusIs(StatusCode::kInvalidArgument));
  WriteRawSafetensors(  // begin > end
      PathIn(tmp, "s.safetensors"),
      R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})",
      Floats({1, 2}));
  EXPECT_THAT(ReadSafetensors(PathIn(tmp, "s.safetensors")),
              StatusIs(StatusCode::kInvalidArgument));
}

// Two tensors whose byte ranges overlap are rejected.
TEST(CheckpointTest, OverlappingOffsetsIsInvalidArgument) {
  TempDir tmp;
  WriteRawSafetensors(
      PathIn(tmp, "s.safetensors"),
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      Floats({1, 2, 3}));
  auto r = ReadSafetensors(PathIn(tmp, "s.safetensors"));
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("overlap"));
}

// A shape whose byte size disagrees with data_offsets is rejected.
TEST(CheckpointTest, ShapeByteLengthMismatchIsInvalidArgument) {
  TempDir tmp;
  for (
      const char* header :
      {R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
       R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})",
       R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})",
       R"({"w":{"dtype":"F32","data_offsets":[0,8]}})"}) {
    WriteRawSafetensors(PathIn(tmp, "s.safetensors"), header, Floats({1, 2}));
    EXPECT_THAT(ReadSafetensors(PathIn(tmp, "s.safetensors")),
                StatusIs(StatusCode::kInvalidArgument))
        << header;
  }
}

// A tensor the config needs but the checkpoint lacks is named.
TEST(CheckpointTest, MissingTensorIsNamed) {
  TempDir tmp;
  const checkpoint::ModelConfig config = TinyConfig(/*tied=*/true);
  TensorMap tensors = RandomTensors(config, 8);
  tensors.erase("model.layers.1.mlp.up_proj.weight");
  WriteHfDir(PathIn(tmp, "ckpt"), checkpoint::ToHfConfigJson(config), tensors);
  auto r = LoadCheckpoint(PathIn(tmp, "ckpt"));
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("model.layers.1.mlp.up_proj.weight"));
}

// An untied config without lm_head.weight is rejected, naming lm_head.
TEST(CheckpointTest, UntiedWithoutLmHeadIsInvalidArgument) {
  TempDir tmp;
  const checkpoint::ModelConfig config = TinyConfig(/*tied=*/false);
  TensorMap tensors = RandomTensors(config, 9);
  tensors.erase("lm_head.weight");
  WriteHfDir(PathIn(tmp, "ckpt"), checkpoint::ToHfConfigJson(config), tensors);
  auto r = LoadHfCheckpoint(PathIn(tmp, "ckpt"));
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("lm_head.weight"));
  // The writers refuse the same incomplete set.
  EXPECT_THAT(WriteHfCheckpoint(PathIn(tmp, "w"), config, tensors),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(WriteLlama2cCheckpoint(PathIn(tmp, "w.bin"), config, tensors),
              StatusIs(StatusCode::kInvalidArgument));
}

// A tensor listed in the shard index but absent from its shard is named.
TEST(CheckpointTest, ShardIndexListingMissingTensorIsNamed) {
  TempDir tmp;
  const checkpoint::ModelConfig config = TinyConfig(/*tied=*/true);
  TensorMap tensors = RandomTensors(config, 10);
  const std::string dir = PathIn(tmp, "sharded");
  fs::create_directories(dir);
  WriteBytes(dir + "/config.json", checkpoint::ToHfConfigJson(config));
  std::string weight_map = "\"model.ghost.weight\":\"a.safetensors\"";
  for (const auto& item : tensors) {
    weight_map += ",\"" + item.first + "\":\"a.safetensors\"";
  }
  ASSERT_THAT(WriteSafetensors(dir + "/a.safetensors", tensors), IsOk());
  WriteBytes(dir + "/model.safetensors.index.json",
             R"({"weight_map":{)" + weight_map + "}}");
  auto r = LoadCheckpoint(dir);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("model.ghost.weight"));
}

// A tensor shape that disagrees with config.json names the tensor and both
// shapes.
TEST(CheckpointTest, ShapeDisagreeingWithConfigIsInvalidArgument) {
  TempDir tmp;
  checkpoint::ModelConfig config = TinyConfig(/*tied=*/true);
  const TensorMap tensors = RandomTensors(config, 11);
  config.hidden_dim = 20;  // the file's FFN matrices are [24, 16]
  WriteHfDir(PathIn(tmp, "ckpt"), checkpoint::ToHfConfigJson(config), tensors);
  auto r = LoadCheckpoint(PathIn(tmp, "ckpt"));
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("model.layers.0.mlp.gate_proj.weight"),
                    HasSubstr("[24, 16]"), HasSubstr("[20, 16]")));
}

// config.json with bad JSON, a missing field or a mistyped field is rejected,
// naming the file and the field.
TEST(CheckpointTest, BadConfigJsonIsInvalidArgument) {
  TempDir tmp;
  const checkpoint::ModelConfig config = TinyConfig(/*tied=*/true);
  const TensorMap tensors = RandomTensors(config, 12);
  const std::string good = checkpoint::ToHfConfigJson(config);
  struct Case {
    std::string json;
    std::string named;
  };
  std::string missing = good;
  missing.replace(missing.find("\"hidden_size\""), 13, "\"hidden_sizeX\"");
  std::string mistyped = good;
  mistyped.replace(mistyped.find("\"num_hidden_layers\": 2"), 22,
                   "\"num_hidden_layers\": \"2\"");
  const std::vector<Case> cases = {
      {"{\"hidden_size\": 16,", "config.json"},
      {missing, "hidden_size"},
      {mistyped, "num_hidden_layers"},
      {"[]", "config.json"},
  };
  for (const Case& c : cases) {
    WriteHfDir(PathIn(tmp, "ckpt"), c.json, tensors);
    auto r = LoadCheckpoint(PathIn(tmp, "ckpt"));
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument)) << c.json;
    EXPECT_THAT(std::string(r.status().message()),
                AllOf(HasSubstr("config.json"), HasSubstr(c.named)));
  }
}

// Missing paths are kNotFound for every loader.
TEST(CheckpointTest, MissingPathIsNotFound) {
  TempDir tmp;
  const std::string missing = PathIn(tmp, "nope");
  EXPECT_THAT(LoadCheckpoint(missing), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(LoadCheckpoint(missing + ".bin"),
              StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(LoadHfCheckpoint(missing), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(LoadLlama2cCheckpoint(missing + ".bin"),
              StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(ReadSafetensors(missing + ".safetensors"),
              StatusIs(StatusCode::kNotFound));
  // config.json present but no weights.
  fs::create_directories(PathIn(tmp, "empty"));
  WriteBytes(PathIn(tmp, "empty/config.json"),
             checkpoint::ToHfConfigJson(TinyConfig(true)));
  EXPECT_THAT(LoadCheckpoint(PathIn(tmp, "empty")),
              StatusIs(StatusCode::kNotFound));
}

// Directory dispatch: only tokenizer .bin files -> kNotFound; two model .bin
// files -> kInvalidArgument; an unknown file type -> kInvalidArgument.
TEST(CheckpointTest, LoadCheckpointDispatchRejectsAmbiguousPaths) {
  TempDir tmp;
  fs::create_directories(PathIn(tmp, "toks"));
  WriteBytes(PathIn(tmp, "toks/tok512.bin"), "xxxx");
  EXPECT_THAT(LoadCheckpoint(PathIn(tmp, "toks")),
              StatusIs(StatusCode::kNotFound));
  fs::create_directories(PathIn(tmp, "two"));
  WriteBytes(PathIn(tmp, "two/a.bin"), "xxxx");
  WriteBytes(PathIn(tmp, "two/b.bin"), "xxxx");
  EXPECT_THAT(LoadCheckpoint(PathIn(tmp, "two")),
              StatusIs(StatusCode::kInvalidArgument));
  WriteBytes(PathIn(tmp, "weights.txt"), "xxxx");
  EXPECT_THAT(LoadCheckpoint(PathIn(tmp, "weights.txt")),
              StatusIs(StatusCode::kInvalidArgument));
}

// Writers reject unsupported dtypes and configs llama2.c cannot express.
TEST(CheckpointTest, WritersRejectUnsupportedRequests) {
  TempDir tmp;
  EXPECT_THAT(WriteSafetensors(PathIn(tmp, "a.safetensors"),
                               {{"w", at::ones({2})}}, "F64X"),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(WriteSafetensors(PathIn(tmp, "a.safetensors"),
                               {{"w", at::ones({2}, at::kLong)}}),
              StatusIs(StatusCode::kInvalidArgument));
  checkpoint::ModelConfig config = TinyConfig(/*tied=*/true);
  config.rope_theta = 500000.0;
  EXPECT_THAT(WriteLlama2cCheckpoint(PathIn(tmp, "m.bin"), config,
                                     RandomTensors(config, 13)),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_FALSE(fs::exists(PathIn(tmp, "a.safetensors")));
  EXPECT_FALSE(fs::exists(PathIn(tmp, "m.bin")));
}

// --- config.json
// --------------------------------------------------------------

// A Llama-3.2 style config (llama3 rope scaling, list of eos ids, GQA) parses.
TEST(CheckpointTest, ParseHfConfigReadsLlama3Config) {
  const std::string json = R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 8192, "max_position_embeddings": 131072,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
                     "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192,
                     "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "vocab_size": 128256})";
  auto c = checkpoint::ParseHfConfig(json, "llama3/config.json");
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->dim, 2048);
  EXPECT_EQ(c->hidden_dim, 8192);
  EXPECT_EQ(c->n_layers, 16);
  EXPECT_EQ(c->n_heads, 32);
  EXPECT_EQ(c->n_kv_heads, 8);
  EXPECT_EQ(c->head_dim(), 64);
  EXPECT_EQ(c->kv_dim(), 512);
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->max_seq_len, 131072);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, checkpoint::RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->rope_style, checkpoint::RopeStyle::kRotateHalf);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_id, 128000);
  EXPECT_THAT(c->eos_ids, ElementsAre(128001, 128008, 128009));
}

// Optional fields take Hugging Face defaults; "type" is read like
// "rope_type"; an integer eos id becomes a one-element list.
TEST(CheckpointTest, ParseHfConfigAppliesDefaults) {
  auto c = checkpoint::ParseHfConfig(
      R"({"hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 5,
          "num_attention_heads": 8, "vocab_size": 512,
          "max_position_embeddings": 512, "eos_token_id": 3,
          "rope_scaling": {"type": "linear", "factor": 2}})",
      "config.json");
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->n_kv_heads, 8);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope_scaling.type, checkpoint::RopeScaling::Type::kLinear);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 2.0);
  EXPECT_EQ(c->bos_id, 1);
  EXPECT_THAT(c->eos_ids, ElementsAre(3));
}

// Unknown rope types, unsupported activations and inconsistent head counts
// are rejected.
TEST(CheckpointTest, ParseHfConfigRejectsUnsupportedFields) {
  const std::string base =
      R"("hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 5,
         "num_attention_heads": 8, "vocab_size": 512,
         "max_position_embeddings": 512)";
  for (const std::string extra :
       {R"("rope_scaling": {"rope_type": "yarn", "factor": 4})",
        R"("rope_scaling": {"rope_type": "llama3", "factor": 8})",
        R"("hidden_act": "gelu")", R"("num_key_value_heads": 3)",
        R"("head_dim": 16)", R"("eos_token_id": [2, "x"])",
        R"("rms_norm_eps": "small")", R"("tie_word_embeddings": 1)"}) {
    auto c = checkpoint::ParseHfConfig("{" + base + ", " + extra + "}", "cfg.json");
    EXPECT_THAT(c, StatusIs(StatusCode::kInvalidArgument)) << extra;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("cfg.json"));
  }
}

// ToHfConfigJson output parses back to the same config.
TEST(CheckpointTest, ToHfConfigJsonRoundTrips) {
  checkpoint::ModelConfig config = TinyConfig(/*tied=*/false);
  config.rope_scaling.type = checkpoint::RopeScaling::Type::kLlama3;
  config.rope_scaling.factor = 8.0;
  config.rope_scaling.original_max_position_embeddings = 16;
  config.eos_ids = {5, 6};
  config.bos_id = 4;
  config.rms_norm_eps = 1e-6;
  const std::string json = checkpoint::ToHfConfigJson(config);
  EXPECT_THAT(json, AllOf(HasSubstr("LlamaForCausalLM"), HasSubstr("\"llama\""),
                          HasSubstr("float32")));
  auto back = checkpoint::ParseHfConfig(json, "config.json");
  ASSERT_THAT(back, IsOk());
  ExpectSameConfig(*back, config);
  EXPECT_DOUBLE_EQ(back->rope_scaling.factor, 8.0);
  EXPECT_EQ(back->rope_scaling.original_max_position_embeddings, 16);
}

// Validate names the first bad field.
TEST(CheckpointTest, ValidateRejectsInconsistentConfigs) {
  EXPECT_THAT(TinyConfig(true).Validate(), IsOk());
  checkpoint::ModelConfig c = TinyConfig(true);
  c.n_kv_heads = 3;
  EXPECT_THAT(c.Validate(), StatusIs(StatusCode::kInvalidArgument));
  c = TinyConfig(true);
  c.dim = 18;  // not divisible by 4 heads
  EXPECT_THAT(c.Validate(), StatusIs(StatusCode::kInvalidArgument));
  c = TinyConfig(true);
  c.dim = 12;  // head_dim 3 is odd
  EXPECT_THAT(c.Validate(), StatusIs(StatusCode::kInvalidArgument));
  c = TinyConfig(true);
  c.vocab_size = 0;
  EXPECT_THAT(c.Validate(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("vocab_size"));
}

// The fingerprint is stable, ignores the RoPE storage convention and the
// token ids, and changes with any architecture field.
TEST(CheckpointTest, ArchitectureFingerprintIsStableAndSensitive) {
  const checkpoint::ModelConfig a = TinyConfig(true);
  const std::string fp = a.ArchitectureFingerprint();
  EXPECT_EQ(fp.size(), 16u);
  EXPECT_EQ(fp, TinyConfig(true).ArchitectureFingerprint());
  checkpoint::ModelConfig b = a;
  b.rope_style = checkpoint::RopeStyle::kAdjacentPairs;
  b.eos_ids = {9};
  EXPECT_EQ(b.ArchitectureFingerprint(), fp);
  b = a;
  b.n_kv_heads = 4;
  EXPECT_NE(b.ArchitectureFingerprint(), fp);
  b = a;
  b.rope_theta = 500000.0;
  EXPECT_NE(b.ArchitectureFingerprint(), fp);
  EXPECT_NE(TinyConfig(false).ArchitectureFingerprint(), fp);
}

}  // namespace
}  // namespace lede::model::loaders
