// lede-perplexity: held-out perplexity of models at several weight formats,
// on the path serving runs (bench/perplexity.h: sliding window over the
// model's context, the fused kernels at the format, KV cache). Prints a
// table and writes JSON for bench/record.py; asserts nothing.
//
// usage: lede-perplexity --models DIR_OR_GGUF[,...] --data FILE[,...]
//          [--weights f32,bf16,q8_0,q4_0,q4_k_m] [--window 0] [--stride 0]
//          [--chunk 64] [--max-tokens 0] [--threads 1] [--json FILE]
//   --models   checkpoints (a Hugging Face directory or a .gguf file), each
//              run at every --weights (a GGUF file's own blocks: auto)
//   --data     held-out text, documents separated by lines holding only
//              <|doc|>; each document is BOS + text + EOS in one stream per
//              file (as lede-pretrain evaluates); domain = the file's stem
//   --window   positions per window (0: the model's context); --stride
//              tokens between windows (0: window / 2)
//   --max-tokens  tokens scored per file (0: all)
// JSON: {"benchmark": "perplexity", "window", "stride", "data": {domain:
// file}, "rows": [{model, weights (resolved), dim, n_layers, parameters,
// weight_bytes, data, tokens, windows, positions, nll, perplexity,
// top1_accuracy, seconds}]}.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/perplexity.h"
#include "shared/flags/flags.h"
#include "shared/model/llama.h"
#include "shared/model/loaders/load_or_exit.h"
#include "shared/model/loaders/model_load_flags.h"
#include "shared/model/loaders/weight_format.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "trainer/corpus.h"

namespace {

int Fail(const lede::Status& s, int code) {
  std::fprintf(stderr, "lede-perplexity: %s\n", lede::model::loaders::OneLineMessage(s).c_str());
  return code;
}

int64_t Parameters(const lede::checkpoint::ModelConfig& c) {
  const int64_t head_dim = c.dim / c.n_heads;
  const int64_t attn = c.dim * c.dim * 2 + 2 * c.dim * c.n_kv_heads * head_dim;
  const int64_t ffn = 3 * c.dim * c.hidden_dim;
  const int64_t per_layer = attn + ffn + 2 * c.dim;
  return c.n_layers * per_layer + c.vocab_size * c.dim * (c.tie_word_embeddings ? 1 : 2) + c.dim;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lede;
  std::string models_flag, data_flag, weights_flag = "f32", json_path;
  int64_t window = 0, stride = 0, chunk = 64, max_tokens = 0, threads = 1;
  flags::FlagSet f;
  f.Add("models", &models_flag, "checkpoints (directories or .gguf files), comma-separated", true);
  f.Add("data", &data_flag, "held-out text files (<|doc|>-separated), comma-separated", true);
  f.Add("weights", &weights_flag, "weight formats, comma-separated (auto, f32, bf16, q8_0, q4_0, q4_k_m, gguf)");
  f.Add("window", &window, "positions per window (0: the model's context)");
  f.Add("stride", &stride, "tokens between window starts (0: window / 2)");
  f.Add("chunk", &chunk, "rows per forward call within a window");
  f.Add("max-tokens", &max_tokens, "tokens scored per file (0: all)");
  f.Add("threads", &threads, "decode threads (0: every CPU the process may use)");
  f.Add("json", &json_path, "write the JSON report here");
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (flags::WantsHelp(args)) {
    std::printf("usage: lede-perplexity --models M[,M2] --data FILE[,FILE2] [flags]\nflags:\n%s", f.Usage().c_str());
    return 0;
  }
  if (Status s = f.Parse(args); !s.ok()) {
    std::fprintf(stderr, "lede-perplexity: %s\nflags:\n%s", std::string(s.message()).c_str(), f.Usage().c_str());
    return 2;
  }
  if (auto t = model::loaders::ApplyThreadsFlag(threads); !t.ok()) return Fail(t.status(), 2);
  std::vector<model::loaders::WeightFormat> formats;
  for (const std::string& w : flags::SplitList(weights_flag)) {
    auto parsed = model::loaders::ParseWeightFormat(w);
    if (!parsed.ok()) return Fail(InvalidArgumentError("--" + std::string(parsed.status().message())), 2);
    formats.push_back(*parsed);
  }
  if (formats.empty()) return Fail(InvalidArgumentError("--weights: empty"), 2);
  const std::vector<std::string> models = flags::SplitList(models_flag);
  const std::vector<std::string> data = flags::SplitList(data_flag);
  if (models.empty()) return Fail(InvalidArgumentError("--models: empty"), 2);
  if (data.empty()) return Fail(InvalidArgumentError("--data: empty"), 2);
  std::vector<std::vector<std::string>> documents;
  for (const std::string& file : data) {
    auto docs = trainer::ReadDocuments(file);
    if (!docs.ok()) return Fail(InvalidArgumentError("--data: " + std::string(docs.status().message())), 2);
    if (docs->empty()) return Fail(InvalidArgumentError("--data: " + file + " holds no document"), 2);
    documents.push_back(std::move(*docs));
  }

  bench::PerplexityOptions po;
  po.window = window;
  po.stride = stride;
  po.chunk = chunk;
  po.max_tokens = max_tokens;
  nlohmann::json report = {{"benchmark", "perplexity"}, {"window", window}, {"stride", stride},
                           {"threads", threads}, {"rows", nlohmann::json::array()}};
  for (const std::string& file : data) {
    report["data"][std::filesystem::path(file).stem().stem().string()] = file;
  }
  std::printf("%-40s %-7s %-22s %7s %11s %8s %7s\n", "model", "weights", "data", "tokens", "perplexity", "top-1",
              "s");
  for (const std::string& model_path : models) {
    if (!std::filesystem::exists(model_path)) {
      return Fail(InvalidArgumentError("--models: " + model_path + ": no such file or directory"), 2);
    }
  }
  for (const std::string& model_path : models) {
    auto tok_path = tokenizer::FindTokenizerFile(model_path);
    if (!tok_path.ok()) return Fail(tok_path.status(), 2);
    auto tokenizer = tokenizer::LoadTokenizer(*tok_path);
    if (!tokenizer.ok()) return Fail(tokenizer.status(), 2);
    std::vector<std::vector<int32_t>> streams;
    for (const auto& docs : documents) {
      auto stream = trainer::EncodeDocuments(**tokenizer, docs);
      if (!stream.ok()) return Fail(stream.status(), 2);
      streams.push_back(std::move(*stream));
    }
    for (model::loaders::WeightFormat format : formats) {
      model::ModelOptions options;
      options.weights = format;
      std::shared_ptr<const model::LlamaModel> m = model::loaders::LoadModelOrExit("lede-perplexity", model_path, options);
      const auto& c = m->config();
      for (size_t d = 0; d < data.size(); ++d) {
        const auto t0 = std::chrono::steady_clock::now();
        auto r = bench::ComputePerplexity(*m, streams[d], po);
        if (!r.ok()) {
          // A bad --window / --stride / --chunk / --max-tokens is the user's flag: name it as typed.
          const std::string msg(r.status().message());
          for (const char* field : {"window", "stride", "chunk", "max_tokens"}) {
            if (msg.rfind(std::string(field) + ":", 0) == 0) {
              std::string flag = field;
              if (flag == "max_tokens") flag = "max-tokens";
              return Fail(InvalidArgumentError("--" + flag + msg.substr(std::string(field).size())), 2);
            }
          }
          return Fail(r.status(), 1);
        }
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const std::string domain = std::filesystem::path(data[d]).stem().stem().string();
        const double top1 = static_cast<double>(r->top1_correct) / static_cast<double>(r->tokens);
        report["rows"].push_back({{"model", model_path},
                                  {"weights", model::loaders::WeightFormatName(m->weight_format())},
                                  {"requested_weights", model::loaders::WeightFormatName(format)},
                                  {"dim", c.dim},
                                  {"n_layers", c.n_layers},
                                  {"context", c.max_seq_len},
                                  {"parameters", Parameters(c)},
                                  {"weight_bytes", m->packed_weight_bytes()},
                                  {"data", domain},
                                  {"tokens", r->tokens},
                                  {"windows", r->windows},
                                  {"positions", r->positions},
                                  {"nll", r->nll},
                                  {"perplexity", r->perplexity},
                                  {"top1_accuracy", top1},
                                  {"seconds", seconds}});
        std::printf("%-40s %-7s %-22s %7lld %11.4f %8.4f %7.1f\n", model_path.c_str(),
                    model::loaders::WeightFormatName(m->weight_format()), domain.c_str(), static_cast<long long>(r->tokens),
                    r->perplexity, top1, seconds);
        std::fflush(stdout);
      }
    }
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << report.dump(1) << "\n";
    if (!out) return Fail(InvalidArgumentError("--json: cannot write " + json_path), 1);
  }
  return 0;
}
