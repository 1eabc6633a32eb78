// GGUF checkpoints end to end: a checkpoint exported with
// WriteGgufCheckpoint at f32 loads back and generates exactly the greedy ids
// of the source (lede-tiny, stories260K's llama2.c .bin, babyllama's
// SentencePiece checkpoint), with a tokenizer from the GGUF metadata that
// encodes as the source's does; bf16 / q8_0 exports dequantize within their
// formats' error and keep their stored bytes reachable; and a GGUF written
// independently with llama.cpp's conventions (its own byte writer below:
// Q/K rows permuted by an explicit index loop, alignment 64, keys in another
// order, integer keys of other widths, no llama.vocab_size) loads and gives
// the safetensors checkpoint's greedy ids.
#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/checkpoint/gguf.h"
#include "shared/model/loaders/checkpoint.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/status/status_macros.h"
#include "shared/tokenizer/gguf_tokenizer.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/testing/test_data.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::model::loaders {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;

constexpr char kLedeTiny[] = "models/lede-tiny";  // relative to the repository root (ctest's working directory)

// Exports `source` (with its own tokenizer) as GGUF at `weights`.
Status Export(const std::string& source, const std::string& out, checkpoint::GgmlType weights) {
  LEDE_ASSIGN_OR_RETURN(Checkpoint ckpt, LoadCheckpoint(source));
  LEDE_ASSIGN_OR_RETURN(std::string tok, tokenizer::FindTokenizerFile(source));
  LEDE_ASSIGN_OR_RETURN(tokenizer::GgufVocab vocab, tokenizer::ReadVocabForGguf(tok));
  checkpoint::GgufWriter writer;
  tokenizer::AddGgufTokenizerMetadata(vocab, ckpt.config.bos_id, ckpt.config.eos_ids[0], &writer);
  return WriteGgufCheckpoint(out, ckpt.config, ckpt.tensors, weights, &writer);
}

// Greedy ids of `model_path` on `prompt_ids`, autoregressive, 32 tokens.
std::vector<int32_t> Greedy(const std::string& model_path, const std::vector<int32_t>& prompt_ids) {
  auto m = LlamaModel::Load(model_path, ModelOptions{});
  EXPECT_THAT(m, IsOk());
  if (!m.ok()) return {};
  auto engine = Engine::Create(std::shared_ptr<const LlamaModel>(std::move(*m)), KvCacheOptions{});
  EXPECT_THAT(engine, IsOk());
  GenerateOptions o;
  o.max_new_tokens = 32;
  auto r = (*engine)->Generate(prompt_ids, o);
  EXPECT_THAT(r, IsOk());
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

std::vector<std::string> Sources() {
  std::vector<std::string> s = {kLedeTiny, testing::Stories260KDir() + "/stories260K.bin"};
#if LEDE_HAVE_SENTENCEPIECE
  s.push_back(testing::BabyLlamaDir());
#endif
  return s;
}

TEST(GgufCheckpointTest, F32ExportRoundTripsGreedyIdsAndTokenizer) {
  testing::TempDir tmp;
  for (const std::string& source : Sources()) {
    SCOPED_TRACE(source);
    const std::string gguf = (tmp.path() / "m.gguf").string();
    ASSERT_THAT(Export(source, gguf, checkpoint::GgmlType::kF32), IsOk());
    // The tensors are the source's, bit for bit (q/k in the other row order).
    auto a = LoadCheckpoint(source);
    auto b = LoadCheckpoint(gguf);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ(b->config.rope_style, checkpoint::RopeStyle::kAdjacentPairs);
    EXPECT_EQ(a->tensors.size(), b->tensors.size());
    for (const auto& [name, t] : a->tensors) {
      ASSERT_TRUE(b->tensors.count(name)) << name;
      at::Tensor got = b->tensors.at(name);
      const bool q = name.find("q_proj") != std::string::npos, k = name.find("k_proj") != std::string::npos;
      if ((q || k) && a->config.rope_style == checkpoint::RopeStyle::kRotateHalf) {
        got = PermuteRopeRows(got, q ? a->config.n_heads : a->config.n_kv_heads, /*to_rotate_half=*/true);
      }
      EXPECT_TRUE(at::equal(got, t)) << name;
      ASSERT_TRUE(b->stored.count(name)) << name;
      EXPECT_EQ(b->stored.at(name)->type, checkpoint::GgmlType::kF32) << name;
    }
    // The GGUF's tokenizer encodes as the source's own.
    auto src_tok = tokenizer::LoadTokenizer(*tokenizer::FindTokenizerFile(source));
    ASSERT_THAT(src_tok, IsOk());
    ASSERT_EQ(*tokenizer::FindTokenizerFile(gguf), gguf);
    auto gguf_tok = tokenizer::LoadTokenizer(gguf);
    ASSERT_THAT(gguf_tok, IsOk());
    EXPECT_EQ((*gguf_tok)->bos_id(), (*src_tok)->bos_id());
    EXPECT_EQ((*gguf_tok)->eos_id(), (*src_tok)->eos_id());
    for (const char* text : {"Once upon a time, there was a little cat.", "Lily said: \"Hi!\"\n  x = 42 + y",
                             "  two  spaces and a tab\there", "\xC3\xA9t\xC3\xA9 \xE2\x82\xAC 1"}) {
      // babyllama's SentencePiece model collapses runs of spaces
      // (remove_extra_whitespaces), which GGUF's llama vocabulary (and
      // llama.cpp) does not express: its texts here have none.
      if (source.find("babyllama") != std::string::npos && std::string(text).find("  ") != std::string::npos) continue;
      auto x = (*src_tok)->Encode(text, true, false);
      auto y = (*gguf_tok)->Encode(text, true, false);
      ASSERT_THAT(x, IsOk());
      ASSERT_THAT(y, IsOk());
      EXPECT_EQ(*x, *y) << text;
      EXPECT_EQ((*gguf_tok)->Decode(*y), (*src_tok)->Decode(*x)) << text;
    }
    auto prompt = (*src_tok)->Encode("Once upon a time", true, false);
    ASSERT_THAT(prompt, IsOk());
    const std::vector<int32_t> want = Greedy(source, *prompt);
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(Greedy(gguf, *prompt), want);
  }
}

// bf16 and q8_0 exports: matrices stored in the format, dequantized within
// its rounding error; norms stay F32; the Q8_0 blocks are reachable as they
// are in the file.
TEST(GgufCheckpointTest, Bf16AndQ8_0ExportsDequantizeWithinTheirError) {
  testing::TempDir tmp;
  auto src = LoadCheckpoint(kLedeTiny);
  ASSERT_THAT(src, IsOk());
  for (auto type : {checkpoint::GgmlType::kBF16, checkpoint::GgmlType::kQ8_0}) {
    SCOPED_TRACE(checkpoint::GgmlTypeName(type));
    const std::string gguf = (tmp.path() / "m.gguf").string();
    ASSERT_THAT(Export(kLedeTiny, gguf, type), IsOk());
    auto b = LoadCheckpoint(gguf);
    ASSERT_THAT(b, IsOk());
    // --weights auto keeps the file's storage; Q8_0 matrices come as blocks.
    EXPECT_EQ(b->storage, type == checkpoint::GgmlType::kQ8_0 ? WeightFormat::kQ8_0 : WeightFormat::kBf16);
    if (type == checkpoint::GgmlType::kQ8_0) {
      const int64_t n_matrices = 7 * b->config.n_layers + 2;  // + embedding and head
      EXPECT_EQ(static_cast<int64_t>(b->q8_0_blocks.size()), n_matrices);
      const at::Tensor& q = b->q8_0_blocks.at("model.layers.0.mlp.down_proj.weight");
      EXPECT_EQ(q.sizes().vec(), (std::vector<int64_t>{b->config.dim, b->config.hidden_dim / 32 * 34}));
      EXPECT_EQ(q.data_ptr(), static_cast<const void*>(b->stored.at("model.layers.0.mlp.down_proj.weight")->data));
    } else {
      EXPECT_TRUE(b->q8_0_blocks.empty());
    }
    for (const auto& [name, t] : src->tensors) {
      if (name.find("q_proj") != std::string::npos || name.find("k_proj") != std::string::npos) continue;
      const checkpoint::GgufTensor* stored = b->stored.at(name);
      at::Tensor got = b->tensors.at(name);
      if (t.dim() == 1) {
        EXPECT_EQ(stored->type, checkpoint::GgmlType::kF32) << name;
        EXPECT_TRUE(at::equal(got, t)) << name;
        continue;
      }
      EXPECT_EQ(stored->type, type) << name;
      const double amax = t.abs().max().item<double>();
      const double err = (got - t).abs().max().item<double>();
      if (type == checkpoint::GgmlType::kBF16) {
        EXPECT_LE(err, amax / 256.0) << name;
        EXPECT_TRUE(at::allclose(got, t, /*rtol=*/1.0 / 256, /*atol=*/1e-30)) << name;
      } else {
        EXPECT_EQ(stored->nbytes, static_cast<size_t>(t.numel() / 32 * 34)) << name;
        EXPECT_LE(err, amax / 127.0 * 0.57) << name;  // half a step of the largest scale, + its f16 rounding (127 x 2^-11)
        EXPECT_GT(err, 0.0) << name;
        // The first block's scale is the f16 of the first 32 weights' max / 127.
        uint16_t dh;
        std::memcpy(&dh, stored->data, 2);
        const double block_max = t.flatten().slice(0, 0, 32).abs().max().item<double>();
        EXPECT_NEAR(checkpoint::HalfToFloat(dh), block_max / 127.0, block_max / 127.0 / 1000.0) << name;
      }
    }
  }
}

// Llama-3 RoPE scaling is exported as llama.cpp's rope_freqs.weight and read
// back as the same scaling: lede-tiny given Llama-3.1-style scaling (which
// changes its RoPE beyond 2048 positions of wavelength) generates the same
// greedy ids from the GGUF as from the checkpoint in memory.
TEST(GgufCheckpointTest, Llama3RopeScalingRoundTrips) {
  testing::TempDir tmp;
  auto src = LoadCheckpoint(kLedeTiny);
  ASSERT_THAT(src, IsOk());
  src->config.rope_scaling.type = checkpoint::RopeScaling::Type::kLlama3;
  src->config.rope_scaling.factor = 8.0;
  src->config.rope_scaling.low_freq_factor = 1.0;
  src->config.rope_scaling.high_freq_factor = 4.0;
  src->config.rope_scaling.original_max_position_embeddings = 8192;
  const std::string gguf = (tmp.path() / "m.gguf").string();
  checkpoint::GgufWriter writer;
  auto vocab = tokenizer::ReadVocabForGguf(*tokenizer::FindTokenizerFile(kLedeTiny));
  ASSERT_THAT(vocab, IsOk());
  tokenizer::AddGgufTokenizerMetadata(*vocab, 1, 2, &writer);
  ASSERT_THAT(WriteGgufCheckpoint(gguf, src->config, src->tensors, checkpoint::GgmlType::kF32, &writer), IsOk());
  auto back = LoadCheckpoint(gguf);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->config.ArchitectureFingerprint(), src->config.ArchitectureFingerprint());
  auto a = LlamaModel::FromCheckpoint(*src, ModelOptions{});
  ASSERT_THAT(a, IsOk());
  auto ea = Engine::Create(std::shared_ptr<const LlamaModel>(std::move(*a)), KvCacheOptions{});
  ASSERT_THAT(ea, IsOk());
  GenerateOptions o;
  o.max_new_tokens = 32;
  const std::vector<int32_t> prompt = {1, 739, 554, 263, 499};
  auto want = (*ea)->Generate(prompt, o);
  ASSERT_THAT(want, IsOk());
  EXPECT_EQ(Greedy(gguf, prompt), want->tokens);
}

// A GGUF re-exported from a GGUF (its tokenizer keys copied, q/k rows kept
// in llama.cpp's order, not permuted twice) is the same model.
TEST(GgufCheckpointTest, ReExportsAGguf) {
  testing::TempDir tmp;
  const std::string first = (tmp.path() / "a.gguf").string(), second = (tmp.path() / "b.gguf").string();
  ASSERT_THAT(Export(kLedeTiny, first, checkpoint::GgmlType::kF32), IsOk());
  ASSERT_THAT(Export(first, second, checkpoint::GgmlType::kF32), IsOk());
  auto a = LoadCheckpoint(first);
  auto b = LoadCheckpoint(second);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  for (const auto& [name, t] : a->tensors) EXPECT_TRUE(at::equal(b->tensors.at(name), t)) << name;
  auto ta = tokenizer::LoadTokenizer(first);
  auto tb = tokenizer::LoadTokenizer(second);
  ASSERT_THAT(ta, IsOk());
  ASSERT_THAT(tb, IsOk());
  auto ids = (*ta)->Encode("Once upon a time, Tom said \"hi\".", true, false);
  ASSERT_THAT(ids, IsOk());
  EXPECT_EQ(*(*tb)->Encode("Once upon a time, Tom said \"hi\".", true, false), *ids);
  EXPECT_EQ(Greedy(second, *ids), Greedy(first, *ids));
}

// A q8_0 GGUF served as it is (--weights auto: the file's blocks, q/k block
// rows permuted with the float rows) decodes exactly like the same weights
// quantized again at load from their dequantized values (Q8_0 quantization
// is idempotent): the blocks reach the kernels in the right rows.
TEST(GgufCheckpointTest, Q8_0FileServesItsBlocksAsTheyAre) {
  testing::TempDir tmp;
  const std::string gguf = (tmp.path() / "m.gguf").string();
  ASSERT_THAT(Export(kLedeTiny, gguf, checkpoint::GgmlType::kQ8_0), IsOk());
  auto with_blocks = LoadCheckpoint(gguf);
  ASSERT_THAT(with_blocks, IsOk());
  ASSERT_FALSE(with_blocks->q8_0_blocks.empty());
  Checkpoint requantized = *with_blocks;
  requantized.q8_0_blocks.clear();
  ModelOptions q8;
  q8.weights = WeightFormat::kQ8_0;
  auto a = LlamaModel::FromCheckpoint(*with_blocks, ModelOptions{});  // auto: the file's Q8_0
  auto b = LlamaModel::FromCheckpoint(requantized, q8);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  auto ea = Engine::Create(std::shared_ptr<const LlamaModel>(std::move(*a)), KvCacheOptions{});
  auto eb = Engine::Create(std::shared_ptr<const LlamaModel>(std::move(*b)), KvCacheOptions{});
  ASSERT_THAT(ea, IsOk());
  ASSERT_THAT(eb, IsOk());
  GenerateOptions o;
  o.max_new_tokens = 32;
  const std::vector<int32_t> prompt = {1, 739, 554, 263, 499};
  auto ra = (*ea)->Generate(prompt, o);
  auto rb = (*eb)->Generate(prompt, o);
  ASSERT_THAT(ra, IsOk());
  ASSERT_THAT(rb, IsOk());
  EXPECT_EQ(ra->tokens, rb->tokens);
}

// --- A GGUF written the way llama.cpp's converter writes one --------------------

class RawGguf {
 public:
  void Kv(const std::string& key, uint32_t type, const std::string& payload) {
    kv_ += Str(key) + Pod<uint32_t>(type) + payload;
    ++n_kv_;
  }
  void Tensor(const std::string& name, const at::Tensor& t) {  // F32, dims reversed
    infos_ += Str(name) + Pod<uint32_t>(static_cast<uint32_t>(t.dim()));
    for (int64_t d = t.dim() - 1; d >= 0; --d) infos_ += Pod<uint64_t>(static_cast<uint64_t>(t.size(d)));
    data_.resize((data_.size() + 63) / 64 * 64, '\0');
    infos_ += Pod<uint32_t>(0) + Pod<uint64_t>(data_.size());
    at::Tensor c = t.contiguous();
    data_.append(reinterpret_cast<const char*>(c.data_ptr<float>()), static_cast<size_t>(c.numel()) * 4);
    ++n_tensors_;
  }
  void Write(const std::string& path) const {
    std::string head = "GGUF" + Pod<uint32_t>(3) + Pod<uint64_t>(n_tensors_) + Pod<uint64_t>(n_kv_) + kv_ + infos_;
    head.resize((head.size() + 63) / 64 * 64, '\0');
    std::ofstream(path, std::ios::binary) << head << data_;
  }
  template <typename T>
  static std::string Pod(T v) {
    return std::string(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  static std::string Str(const std::string& s) { return Pod<uint64_t>(s.size()) + s; }

 private:
  std::string kv_, infos_, data_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
};

// llama.cpp's converter: within each head, rotate-half row j*half + i goes to
// row 2i + j.
at::Tensor LlamaCppRowOrder(const at::Tensor& w, int64_t heads) {
  const int64_t hd = w.size(0) / heads, half = hd / 2;
  at::Tensor out = at::empty_like(w);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t i = 0; i < half; ++i) out[h * hd + 2 * i + j] = w[h * hd + j * half + i];
    }
  }
  return out;
}

TEST(GgufCheckpointTest, LoadsAFileWrittenWithLlamaCppConventions) {
  testing::TempDir tmp;
  auto src = LoadCheckpoint(kLedeTiny);
  ASSERT_THAT(src, IsOk());
  const checkpoint::ModelConfig& c = src->config;
  auto vocab = tokenizer::ReadVocabForGguf(*tokenizer::FindTokenizerFile(kLedeTiny));
  ASSERT_THAT(vocab, IsOk());
  RawGguf g;
  auto u32 = [](uint32_t v) { return RawGguf::Pod<uint32_t>(v); };
  g.Kv("general.architecture", 8, RawGguf::Str("llama"));
  g.Kv("general.alignment", 4, u32(64));
  g.Kv("general.name", 8, RawGguf::Str("lede-tiny by another writer"));
  g.Kv("llama.block_count", 4, u32(static_cast<uint32_t>(c.n_layers)));
  g.Kv("llama.context_length", 10, RawGguf::Pod<uint64_t>(static_cast<uint64_t>(c.max_seq_len)));  // uint64
  g.Kv("llama.embedding_length", 5, RawGguf::Pod<int32_t>(static_cast<int32_t>(c.dim)));             // int32
  g.Kv("llama.feed_forward_length", 4, u32(static_cast<uint32_t>(c.hidden_dim)));
  g.Kv("llama.attention.head_count", 4, u32(static_cast<uint32_t>(c.n_heads)));
  g.Kv("llama.attention.head_count_kv", 4, u32(static_cast<uint32_t>(c.n_kv_heads)));
  g.Kv("llama.rope.freq_base", 6, RawGguf::Pod<float>(static_cast<float>(c.rope_theta)));
  g.Kv("llama.attention.layer_norm_rms_epsilon", 6, RawGguf::Pod<float>(static_cast<float>(c.rms_norm_eps)));
  g.Kv("llama.rope.dimension_count", 4, u32(static_cast<uint32_t>(c.head_dim())));
  g.Kv("general.file_type", 4, u32(0));
  g.Kv("tokenizer.ggml.model", 8, RawGguf::Str("llama"));
  std::string tokens = u32(8) + RawGguf::Pod<uint64_t>(vocab->tokens.size()), scores = u32(6) + RawGguf::Pod<uint64_t>(vocab->tokens.size()),
              types = u32(5) + RawGguf::Pod<uint64_t>(vocab->tokens.size());
  for (size_t i = 0; i < vocab->tokens.size(); ++i) {
    tokens += RawGguf::Str(vocab->tokens[i]);
    scores += RawGguf::Pod<float>(vocab->scores[i]);
    types += RawGguf::Pod<int32_t>(vocab->token_types[i]);
  }
  g.Kv("tokenizer.ggml.tokens", 9, tokens);
  g.Kv("tokenizer.ggml.scores", 9, scores);
  g.Kv("tokenizer.ggml.token_type", 9, types);
  g.Kv("tokenizer.ggml.bos_token_id", 4, u32(static_cast<uint32_t>(c.bos_id)));
  g.Kv("tokenizer.ggml.eos_token_id", 4, u32(static_cast<uint32_t>(c.eos_ids[0])));
  const auto& t = src->tensors;
  g.Tensor("output.weight", t.at("lm_head.weight"));  // head first: order is free
  g.Tensor("token_embd.weight", t.at("model.embed_tokens.weight"));
  g.Tensor("output_norm.weight", t.at("model.norm.weight"));
  for (int64_t i = c.n_layers - 1; i >= 0; --i) {
    const std::string hf = "model.layers." + std::to_string(i) + ".", b = "blk." + std::to_string(i) + ".";
    g.Tensor(b + "attn_q.weight", LlamaCppRowOrder(t.at(hf + "self_attn.q_proj.weight"), c.n_heads));
    g.Tensor(b + "attn_k.weight", LlamaCppRowOrder(t.at(hf + "self_attn.k_proj.weight"), c.n_kv_heads));
    g.Tensor(b + "attn_v.weight", t.at(hf + "self_attn.v_proj.weight"));
    g.Tensor(b + "attn_output.weight", t.at(hf + "self_attn.o_proj.weight"));
    g.Tensor(b + "ffn_gate.weight", t.at(hf + "mlp.gate_proj.weight"));
    g.Tensor(b + "ffn_up.weight", t.at(hf + "mlp.up_proj.weight"));
    g.Tensor(b + "ffn_down.weight", t.at(hf + "mlp.down_proj.weight"));
    g.Tensor(b + "attn_norm.weight", t.at(hf + "input_layernorm.weight"));
    g.Tensor(b + "ffn_norm.weight", t.at(hf + "post_attention_layernorm.weight"));
  }
  const std::string path = (tmp.path() / "third_party.gguf").string();
  g.Write(path);

  auto tok = tokenizer::LoadTokenizer(path);
  ASSERT_THAT(tok, IsOk());
  auto prompt = (*tok)->Encode("Once upon a time, there was a", true, false);
  ASSERT_THAT(prompt, IsOk());
  const std::vector<int32_t> want = Greedy(kLedeTiny, *prompt);
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(Greedy(path, *prompt), want);
  EXPECT_EQ((*tok)->Decode(Greedy(path, *prompt)), (*tok)->Decode(want));
}

// A checkpoint whose eps is not the shortest decimal of a float32 (a
// widened checkpoint's eps * d/D) keeps its architecture fingerprint
// through a GGUF export (policies are matched by it); an exact key that
// contradicts llama.cpp's float32 key is refused naming it.
TEST(GgufCheckpointTest, ExportKeepsTheFingerprintOfAnInexactEps) {
  testing::TempDir tmp;
  auto src = LoadCheckpoint(kLedeTiny);
  ASSERT_THAT(src, IsOk());
  checkpoint::ModelConfig config = src->config;
  config.rms_norm_eps = 1e-5 * 192 / 960;  // 2.0000000000000003e-06, as `lede widen --factor 5` computes it
  ASSERT_NE(config.rms_norm_eps, 2e-6);
  auto vocab = tokenizer::ReadVocabForGguf(*tokenizer::FindTokenizerFile(kLedeTiny));
  ASSERT_THAT(vocab, IsOk());
  const std::string gguf = (tmp.path() / "eps.gguf").string();
  checkpoint::GgufWriter writer;
  tokenizer::AddGgufTokenizerMetadata(*vocab, config.bos_id, config.eos_ids[0], &writer);
  ASSERT_THAT(WriteGgufCheckpoint(gguf, config, src->tensors, checkpoint::GgmlType::kF32, &writer), IsOk());
  auto back = LoadCheckpoint(gguf);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->config.rms_norm_eps, config.rms_norm_eps);
  EXPECT_EQ(back->config.ArchitectureFingerprint(), config.ArchitectureFingerprint());

  // The same file with the exact key changed to another float32 value.
  std::ifstream in(gguf, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const std::string key = checkpoint::kExactRmsNormEpsKey;
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  const double other = 3e-6;
  std::memcpy(&bytes[at + key.size() + 4], &other, sizeof(other));  // after the key: uint32 type, then the value
  const std::string bad = (tmp.path() / "bad.gguf").string();
  std::ofstream(bad, std::ios::binary) << bytes;
  EXPECT_THAT(LoadCheckpoint(bad), StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr(key)));
}

// A GGUF whose q/k rows were left in rotate-half order (no permutation) is
// a different model: the test above would catch a loader that forgot it.
TEST(GgufCheckpointTest, UnpermutedQkRowsChangeTheOutput) {
  auto src = LoadCheckpoint(kLedeTiny);
  ASSERT_THAT(src, IsOk());
  Checkpoint wrong = *src;
  wrong.config.rope_style = checkpoint::RopeStyle::kAdjacentPairs;  // claims llama.cpp order, holds HF order
  auto a = LlamaModel::FromCheckpoint(*src, ModelOptions{});
  auto b = LlamaModel::FromCheckpoint(wrong, ModelOptions{});
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  auto ea = Engine::Create(std::shared_ptr<const LlamaModel>(std::move(*a)), KvCacheOptions{});
  auto eb = Engine::Create(std::shared_ptr<const LlamaModel>(std::move(*b)), KvCacheOptions{});
  GenerateOptions o;
  o.max_new_tokens = 24;
  auto ra = (*ea)->Generate({1, 739, 554, 263, 499}, o);
  auto rb = (*eb)->Generate({1, 739, 554, 263, 499}, o);
  ASSERT_THAT(ra, IsOk());
  ASSERT_THAT(rb, IsOk());
  EXPECT_NE(ra->tokens, rb->tokens);
}

TEST(GgufCheckpointTest, RefusesTruncatedTensorDataNamingTheTensor) {
  testing::TempDir tmp;
  const std::string gguf = (tmp.path() / "m.gguf").string();
  ASSERT_THAT(Export(kLedeTiny, gguf, checkpoint::GgmlType::kQ8_0), IsOk());
  std::ifstream in(gguf, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const std::string cut = (tmp.path() / "cut.gguf").string();
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() - 1000);
  EXPECT_THAT(LoadCheckpoint(cut), StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("output.weight")));
  EXPECT_THAT(LlamaModel::Load(cut, ModelOptions{}), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace lede::model::loaders
