// Tests of shared/checkpoint/widen.h and `lede widen`: the widened
// checkpoint computes the source's logits (within 1e-4) and greedy ids, on a
// small random GQA model with non-unit norms (tied and untied) and on
// models/lede-tiny's held-out prompts; the output is byte-identical run to
// run; sources that cannot be embedded exactly are refused naming the field.
#include "shared/checkpoint/widen.h"

#include <cmath>
#include <functional>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "gtest/gtest.h"
#include "services/cli/commands.h"
#include "shared/checkpoint/model_config.h"
#include "shared/checkpoint/safetensors.h"
#include "shared/file/file.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::model {
namespace {
namespace fs = std::filesystem;
using ::lede::testing::IsOk;
using Json = nlohmann::json;

constexpr char kLedeTiny[] = "models/lede-tiny";  // relative to the repository root (ctest's working directory)

checkpoint::ModelConfig SmallGqaConfig(bool tied) {
  checkpoint::ModelConfig c;
  c.dim = 32;
  c.n_heads = 4;
  c.n_kv_heads = 2;  // head_dim 8, groups of 2
  c.hidden_dim = 48;
  c.n_layers = 3;
  c.vocab_size = 97;
  c.max_seq_len = 64;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = tied;
  return c;
}

// A random Llama checkpoint written with the project's safetensors writer:
// weights ~ N(0, 0.3^2), norm weights in [0.5, 1.5] (so the norm scaling is
// exercised), plus `extra` tensors (for refusal tests).
void WriteRandomCheckpoint(const fs::path& dir, const checkpoint::ModelConfig& c, uint32_t seed,
                           const std::vector<std::string>& extra = {}) {
  fs::create_directories(dir);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  std::uniform_real_distribution<float> uniform(0.5f, 1.5f);
  std::map<std::string, std::vector<int64_t>> shapes;
  const int64_t d = c.dim, q = c.n_heads * c.head_dim(), kv = c.kv_dim();
  shapes["model.embed_tokens.weight"] = {c.vocab_size, d};
  shapes["model.norm.weight"] = {d};
  if (!c.tie_word_embeddings) shapes["lm_head.weight"] = {c.vocab_size, d};
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    shapes[p + "input_layernorm.weight"] = {d};
    shapes[p + "post_attention_layernorm.weight"] = {d};
    shapes[p + "self_attn.q_proj.weight"] = {q, d};
    shapes[p + "self_attn.k_proj.weight"] = {kv, d};
    shapes[p + "self_attn.v_proj.weight"] = {kv, d};
    shapes[p + "self_attn.o_proj.weight"] = {d, q};
    shapes[p + "mlp.gate_proj.weight"] = {c.hidden_dim, d};
    shapes[p + "mlp.up_proj.weight"] = {c.hidden_dim, d};
    shapes[p + "mlp.down_proj.weight"] = {d, c.hidden_dim};
  }
  for (const std::string& name : extra) shapes[name] = {d};
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, checkpoint::TensorBytes> tensors;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<float>& v = values[name];
    const bool norm = name.find("norm") != std::string::npos;
    for (int64_t i = 0; i < n; ++i) v.push_back(norm ? uniform(rng) : normal(rng));
    tensors[name] = {checkpoint::Dtype::kF32, shape, v.data(), v.size() * sizeof(float)};
  }
  ASSERT_THAT(checkpoint::WriteSafetensors((dir / "model.safetensors").string(), tensors), IsOk());
  std::ofstream(dir / "config.json") << checkpoint::ToHfConfigJson(c);
  std::ofstream(dir / "generation_config.json") << "{\"bos_token_id\": 1, \"eos_token_id\": 2}\n";
}

// Full-sequence logits [T, V] of `ids` (no cache: the eager causal forward).
at::Tensor SequenceLogits(const LlamaModel& m, const std::vector<int32_t>& ids) {
  std::vector<int64_t> ids64(ids.begin(), ids.end());
  at::Tensor tokens = at::tensor(ids64, at::kLong).unsqueeze(0);
  at::Tensor hidden = m.Forward(m.Embed(tokens), 0, m.n_layers(), 0, nullptr, 0);
  return m.ExitLogits(hidden).squeeze(0);
}

// Greedy ids of `wide` equal those of `source` (a divergence only at a
// numerical near-tie of the source, DESIGN's rule), autoregressive and
// static E=1 D=3 on the widened model.
void ExpectSameGreedyIds(const std::shared_ptr<const LlamaModel>& source,
                         const std::shared_ptr<const LlamaModel>& wide, const std::vector<int32_t>& prompt,
                         int64_t new_tokens, const std::string& what) {
  auto src_engine = Engine::Create(source, KvCacheOptions{});
  auto wide_engine = Engine::Create(wide, KvCacheOptions{});
  ASSERT_THAT(src_engine, IsOk());
  ASSERT_THAT(wide_engine, IsOk());
  GenerateOptions ar;
  ar.max_new_tokens = new_tokens;
  ar.record_margins = true;
  ar.stop_at_eos = false;
  auto reference = (*src_engine)->Generate(prompt, ar);
  ASSERT_THAT(reference, IsOk());
  GenerateOptions st = ar;
  st.mode = SpeculationMode::kStatic;
  st.exit_layer = 1;
  st.draft_len = 3;
  for (const GenerateOptions& o : {ar, st}) {
    auto got = (*wide_engine)->Generate(prompt, o);
    ASSERT_THAT(got, IsOk());
    ASSERT_EQ(got->tokens.size(), reference->tokens.size()) << what;
    size_t i = 0;
    while (i < got->tokens.size() && got->tokens[i] == reference->tokens[i]) ++i;
    if (i < reference->tokens.size()) {
      EXPECT_LE(reference->margins[i], 1e-4) << what << ": ids differ at " << i << " without a near-tie";
    }
  }
}

std::shared_ptr<const LlamaModel> LoadOrDie(const std::string& dir) {
  auto m = LlamaModel::Load(dir, ModelOptions{});
  EXPECT_THAT(m, IsOk()) << dir;
  if (!m.ok()) return nullptr;
  return std::shared_ptr<const LlamaModel>(std::move(*m));
}

void ExpectFunctionExact(bool tied) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const fs::path src = tmp.path() / "src", out = tmp.path() / "wide";
  WriteRandomCheckpoint(src, SmallGqaConfig(tied), tied ? 11 : 7);
  checkpoint::WidenOptions options;
  options.factor = 3;
  options.ffn_factor = 2;
  auto widened = checkpoint::WidenCheckpoint(src.string(), out.string(), options);
  ASSERT_THAT(widened, IsOk());
  EXPECT_EQ(widened->widened.dim, 96);
  EXPECT_EQ(widened->widened.n_heads, 12);
  EXPECT_EQ(widened->widened.n_kv_heads, 6);
  EXPECT_EQ(widened->widened.head_dim(), 8);
  EXPECT_EQ(widened->widened.hidden_dim, 96);
  EXPECT_EQ(widened->copied_files, std::vector<std::string>{"generation_config.json"});
  auto source = LoadOrDie(src.string());
  auto wide = LoadOrDie(out.string());
  ASSERT_TRUE(source && wide);
  EXPECT_EQ(wide->config().dim, 96);
  EXPECT_NEAR(wide->config().rms_norm_eps, 1e-5 / 3, 1e-12);
  std::mt19937 rng(3);
  for (int p = 0; p < 4; ++p) {
    std::vector<int32_t> prompt = {1};
    for (int i = 0; i < 5 + 3 * p; ++i) prompt.push_back(static_cast<int32_t>(3 + rng() % 90));
    at::Tensor a = SequenceLogits(*source, prompt), b = SequenceLogits(*wide, prompt);
    ASSERT_EQ(a.sizes(), b.sizes());
    EXPECT_LE((a - b).abs().max().item<float>(), 1e-4) << "prompt " << p;
    EXPECT_GT(a.abs().max().item<float>(), 0.1f) << "the logits are not trivially zero";
    ExpectSameGreedyIds(source, wide, prompt, 24, "small model prompt " + std::to_string(p));
  }
}

TEST(WidenTest, SmallGqaModelIsFunctionExact) { ExpectFunctionExact(/*tied=*/false); }
TEST(WidenTest, TiedSmallGqaModelIsFunctionExact) { ExpectFunctionExact(/*tied=*/true); }

// The zero-padding really is padding: the source block is kept, the rest is
// zero, and norms carry sqrt(d/D).
TEST(WidenTest, WeightsArePaddedAndNormsScaled) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  WriteRandomCheckpoint(tmp.path() / "src", SmallGqaConfig(false), 5);
  checkpoint::WidenOptions options;
  options.factor = 4;
  ASSERT_THAT(checkpoint::WidenCheckpoint((tmp.path() / "src").string(), (tmp.path() / "w").string(), options),
              IsOk());
  auto a = checkpoint::SafetensorsFile::Open((tmp.path() / "src" / "model.safetensors").string());
  auto b = checkpoint::SafetensorsFile::Open((tmp.path() / "w" / "model.safetensors").string());
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  const auto& norm_a = (*a)->tensors().at("model.layers.1.input_layernorm.weight");
  const auto& norm_b = (*b)->tensors().at("model.layers.1.input_layernorm.weight");
  auto va = checkpoint::ToFloat32(norm_a), vb = checkpoint::ToFloat32(norm_b);
  ASSERT_EQ(vb->size(), 128u);
  for (size_t i = 0; i < 32; ++i) EXPECT_FLOAT_EQ((*vb)[i], (*va)[i] * 0.5f) << i;  // sqrt(32/128)
  for (size_t i = 32; i < 128; ++i) EXPECT_EQ((*vb)[i], 0.0f) << i;
  const auto& down = (*b)->tensors().at("model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(down.shape, (std::vector<int64_t>{128, 192}));
  auto vd = checkpoint::ToFloat32(down);
  auto vs = checkpoint::ToFloat32((*a)->tensors().at("model.layers.0.mlp.down_proj.weight"));
  EXPECT_EQ((*vd)[5 * 192 + 7], (*vs)[5 * 48 + 7]);
  EXPECT_EQ((*vd)[5 * 192 + 50], 0.0f);
  EXPECT_EQ((*vd)[40 * 192 + 7], 0.0f);
}

// Same input, same bytes: every output file of two runs is identical.
TEST(WidenTest, OutputIsByteIdenticalRunToRun) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  WriteRandomCheckpoint(tmp.path() / "src", SmallGqaConfig(false), 9);
  checkpoint::WidenOptions options;
  options.factor = 2;
  options.ffn_factor = 3;
  for (const char* out : {"a", "b"}) {
    ASSERT_THAT(checkpoint::WidenCheckpoint((tmp.path() / "src").string(), (tmp.path() / out).string(), options),
                IsOk());
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp.path() / "a")) names.push_back(e.path().filename().string());
  EXPECT_EQ(names.size(), 3u);  // config.json, generation_config.json, model.safetensors
  for (const std::string& name : names) {
    auto x = file::ReadFile((tmp.path() / "a" / name).string());
    auto y = file::ReadFile((tmp.path() / "b" / name).string());
    ASSERT_THAT(x, IsOk());
    ASSERT_THAT(y, IsOk()) << name;
    EXPECT_TRUE(*x == *y) << name << " differs between runs";
  }
  // A second run into the same directory needs overwrite.
  auto again = checkpoint::WidenCheckpoint((tmp.path() / "src").string(), (tmp.path() / "a").string(), options);
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  // With overwrite: a calibration of this shape stays, one of another shape goes.
  options.overwrite = true;
  for (bool same_shape : {true, false}) {
    const std::string other = "0123456789abcdef";  // another shape's fingerprint
    auto widened = checkpoint::WidenCheckpoint((tmp.path() / "src").string(), (tmp.path() / "a").string(), options);
    ASSERT_THAT(widened, IsOk());
    const std::string mine = widened->widened.ArchitectureFingerprint();
    std::ofstream(tmp.path() / "a" / "calibration-cpu.json")
        << "{\"model_fingerprint\": \"" << (same_shape ? mine : other) << "\"}";
    auto rerun = checkpoint::WidenCheckpoint((tmp.path() / "src").string(), (tmp.path() / "a").string(), options);
    ASSERT_THAT(rerun, IsOk());
    EXPECT_EQ(fs::exists(tmp.path() / "a" / "calibration-cpu.json"), same_shape);
    EXPECT_EQ(rerun->removed_files.size(), same_shape ? 0u : 1u);
  }
}

// The policies shipped under source/widened/<widened fingerprint>/policy are
// installed byte for byte into out/policy; another shape's are not.
TEST(WidenTest, InstallsThePoliciesShippedForTheWidenedShapeOnly) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  WriteRandomCheckpoint(tmp.path() / "src", SmallGqaConfig(false), 3);
  checkpoint::WidenOptions options;
  options.factor = 2;
  auto first = checkpoint::WidenCheckpoint((tmp.path() / "src").string(), (tmp.path() / "a").string(), options);
  ASSERT_THAT(first, IsOk());
  EXPECT_TRUE(first->installed_policies.empty());
  EXPECT_FALSE(fs::exists(tmp.path() / "a" / "policy"));
  const fs::path shipped = tmp.path() / "src" / "widened" / first->widened.ArchitectureFingerprint() / "policy";
  fs::create_directories(shipped / "measured-v1");
  std::ofstream(shipped / "SERVING") << "measured-v1\n";
  std::ofstream(shipped / "measured-v1" / "policy.json") << "{\"version\": \"measured-v1\"}\n";
  options.overwrite = true;
  auto second = checkpoint::WidenCheckpoint((tmp.path() / "src").string(), (tmp.path() / "a").string(), options);
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->installed_policies, std::vector<std::string>{"measured-v1"});
  for (const char* name : {"SERVING", "measured-v1/policy.json"}) {
    auto x = file::ReadFile((shipped / name).string());
    auto y = file::ReadFile((tmp.path() / "a" / "policy" / name).string());
    ASSERT_THAT(x, IsOk());
    ASSERT_THAT(y, IsOk()) << name;
    EXPECT_EQ(*x, *y) << name;
  }
  options.factor = 3;  // another shape: nothing installed
  auto other = checkpoint::WidenCheckpoint((tmp.path() / "src").string(), (tmp.path() / "b").string(), options);
  ASSERT_THAT(other, IsOk());
  EXPECT_TRUE(other->installed_policies.empty());
  EXPECT_FALSE(fs::exists(tmp.path() / "b" / "policy"));
}

// A source the padding cannot keep exact is refused, the message naming the
// config field (or tensor) responsible.
TEST(WidenTest, RefusesWhatItCannotEmbedNamingTheField) {
  struct Case {
    std::string field;  // expected in the message
    std::function<void(Json&)> edit;
    std::vector<std::string> extra_tensors;
  };
  const std::vector<Case> cases = {
      {"architectures", [](Json& j) { j["architectures"] = {"MistralForCausalLM"}; }, {}},
      {"model_type", [](Json& j) { j["model_type"] = "gpt2"; }, {}},
      {"attention_bias", [](Json& j) { j["attention_bias"] = true; }, {}},
      {"mlp_bias", [](Json& j) { j["mlp_bias"] = true; }, {}},
      {"quantization_config", [](Json& j) { j["quantization_config"] = {{"bits", 4}}; }, {}},
      {"head_dim", [](Json& j) { j["head_dim"] = 16; }, {}},
      {"hidden_act", [](Json& j) { j["hidden_act"] = "gelu"; }, {}},
      {"model.layers.0.self_attn.q_proj.bias", [](Json&) {}, {"model.layers.0.self_attn.q_proj.bias"}},
      {"num_attention_heads", [](Json& j) { j["num_attention_heads"] = 5; }, {}},      // 32 % 5: no whole head_dim
      {"num_key_value_heads", [](Json& j) { j["num_key_value_heads"] = 3; }, {}},  // 4 % 3: no GQA groups
  };
  for (const Case& c : cases) {
    ::lede::testing::TempDir tmp;
    ASSERT_FALSE(tmp.path().empty());
    const fs::path src = tmp.path() / "src";
    WriteRandomCheckpoint(src, SmallGqaConfig(false), 1, c.extra_tensors);
    Json j = Json::parse(*file::ReadFile((src / "config.json").string()));
    c.edit(j);
    std::ofstream(src / "config.json") << j.dump(2);
    checkpoint::WidenOptions options;
    options.factor = 2;
    auto r = checkpoint::WidenCheckpoint(src.string(), (tmp.path() / "out").string(), options);
    ASSERT_FALSE(r.ok()) << c.field;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.field << ": " << r.status();
    EXPECT_NE(std::string(r.status().message()).find(c.field), std::string::npos) << r.status();
    EXPECT_FALSE(fs::exists(tmp.path() / "out" / "config.json")) << c.field;
  }
  // The CLI: exit 2 and the field on stderr; a bad factor names --factor.
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  WriteRandomCheckpoint(tmp.path() / "src", SmallGqaConfig(false), 1);
  Json j = Json::parse(*file::ReadFile((tmp.path() / "src" / "config.json").string()));
  j["attention_bias"] = true;
  std::ofstream(tmp.path() / "src" / "config.json") << j.dump(2);
  std::ostringstream out, err;
  EXPECT_EQ(cli::RunWiden({"--model", (tmp.path() / "src").string(), "--factor", "2", "--out",
                           (tmp.path() / "o").string()},
                          out, err),
            2);
  EXPECT_NE(err.str().find("attention_bias"), std::string::npos) << err.str();
  std::ostringstream out2, err2;
  EXPECT_EQ(cli::RunWiden({"--model", (tmp.path() / "src").string(), "--factor", "0", "--out",
                           (tmp.path() / "o").string()},
                          out2, err2),
            2);
  EXPECT_NE(err2.str().find("--factor"), std::string::npos) << err2.str();
}

// lede-tiny through `lede widen` (factor 2, FFN factor 3): the tokenizer and
// config travel, and 8 held-out prompts (the first 4 of the story and code
// evaluation sets) give the source's greedy ids and logits within 1e-4.
TEST(WidenTest, LedeTinyHeldOutPromptsGiveTheSourceGreedyIds) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string out_dir = (tmp.path() / "lede-tiny-w2").string();
  std::ostringstream out, err;
  ASSERT_EQ(cli::RunWiden({"--model", kLedeTiny, "--factor", "2", "--ffn-factor", "3", "--out", out_dir}, out, err),
            0)
      << err.str();
  EXPECT_NE(err.str().find("tokenizer.model"), std::string::npos) << err.str();
  auto tok = tokenizer::LoadTokenizer(*tokenizer::FindTokenizerFile(out_dir));
  ASSERT_THAT(tok, IsOk());
  auto source = LoadOrDie(kLedeTiny);
  auto wide = LoadOrDie(out_dir);
  ASSERT_TRUE(source && wide);
  EXPECT_EQ(wide->config().dim, 2 * source->config().dim);
  EXPECT_EQ(wide->config().hidden_dim, 3 * source->config().hidden_dim);
  int n = 0;
  for (const char* set : {"story", "code"}) {
    std::ifstream f(std::string(kLedeTiny) + "/prompts/" + set + ".jsonl");
    std::string line;
    for (int i = 0; i < 4 && std::getline(f, line); ++i) {
      auto ids = (*tok)->Encode(Json::parse(line)["prompt"].get<std::string>(), true, false);
      ASSERT_THAT(ids, IsOk());
      at::Tensor a = SequenceLogits(*source, *ids), b = SequenceLogits(*wide, *ids);
      EXPECT_LE((a - b).abs().max().item<float>(), 1e-4) << set << " prompt " << i;
      ExpectSameGreedyIds(source, wide, *ids, 32, std::string(set) + " prompt " + std::to_string(i));
      ++n;
    }
  }
  EXPECT_EQ(n, 8);
}

}  // namespace
}  // namespace lede::model
