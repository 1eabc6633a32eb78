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
#include <optional>
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

// A failure and the exit status it ends the run with (2: the user's input,
// 1: anything else).
struct Failure {
  lede::Status status;
  int code = 1;
};

struct Flags {
  std::string models, data, weights = "f32", json;
  int64_t window = 0, stride = 0, chunk = 64, max_tokens = 0, threads = 1;
};

// What the flags name, read and checked before any model loads.
struct Inputs {
  std::vector<lede::model::loaders::WeightFormat> formats;
  std::vector<std::string> models, data;
  std::vector<std::vector<std::string>> documents;  // per data file
};

std::optional<Failure> ReadInputs(const Flags& fl, Inputs* in) {
  using lede::InvalidArgumentError;
  for (const std::string& w : lede::flags::SplitList(fl.weights)) {
    auto parsed = lede::model::loaders::ParseWeightFormat(w);
    if (!parsed.ok()) return Failure{InvalidArgumentError("--" + std::string(parsed.status().message())), 2};
    in->formats.push_back(*parsed);
  }
  if (in->formats.empty()) return Failure{InvalidArgumentError("--weights: empty"), 2};
  in->models = lede::flags::SplitList(fl.models);
  in->data = lede::flags::SplitList(fl.data);
  if (in->models.empty()) return Failure{InvalidArgumentError("--models: empty"), 2};
  if (in->data.empty()) return Failure{InvalidArgumentError("--data: empty"), 2};
  for (const std::string& file : in->data) {
    auto docs = lede::trainer::ReadDocuments(file);
    if (!docs.ok()) return Failure{InvalidArgumentError("--data: " + std::string(docs.status().message())), 2};
    if (docs->empty()) return Failure{InvalidArgumentError("--data: " + file + " holds no document"), 2};
    in->documents.push_back(std::move(*docs));
  }
  for (const std::string& model_path : in->models) {
    if (!std::filesystem::exists(model_path)) {
      return Failure{InvalidArgumentError("--models: " + model_path + ": no such file or directory"), 2};
    }
  }
  return std::nullopt;
}

// A bad --window / --stride / --chunk / --max-tokens is the user's flag:
// named as typed, exit 2; any other scoring error exits 1.
Failure ScoringFailure(const lede::Status& s) {
  const std::string msg(s.message());
  for (const char* field : {"window", "stride", "chunk", "max_tokens"}) {
    if (msg.rfind(std::string(field) + ":", 0) == 0) {
      std::string flag = field;
      if (flag == "max_tokens") flag = "max-tokens";
      return Failure{lede::InvalidArgumentError("--" + flag + msg.substr(std::string(field).size())), 2};
    }
  }
  return Failure{s, 1};
}

// One model at one weight format on every data file: a row each, printed
// and appended to report["rows"].
std::optional<Failure> ScoreModel(const std::string& model_path, lede::model::loaders::WeightFormat format,
                                  const Inputs& in, const std::vector<std::vector<int32_t>>& streams,
                                  const lede::bench::PerplexityOptions& po, nlohmann::json* report) {
  using namespace lede;
  model::ModelOptions options;
  options.weights = format;
  std::shared_ptr<const model::LlamaModel> m = model::loaders::LoadModelOrExit("lede-perplexity", model_path, options);
  const auto& c = m->config();
  const char* weights = model::loaders::WeightFormatName(m->weight_format());
  for (size_t d = 0; d < in.data.size(); ++d) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = bench::ComputePerplexity(*m, streams[d], po);
    if (!r.ok()) return ScoringFailure(r.status());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string domain = std::filesystem::path(in.data[d]).stem().stem().string();
    const double top1 = static_cast<double>(r->top1_correct) / static_cast<double>(r->tokens);
    (*report)["rows"].push_back({{"model", model_path},
                                 {"weights", weights},
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
    std::printf("%-40s %-7s %-22s %7lld %11.4f %8.4f %7.1f\n", model_path.c_str(), weights, domain.c_str(),
                static_cast<long long>(r->tokens), r->perplexity, top1, seconds);
    std::fflush(stdout);
  }
  return std::nullopt;
}

// Every model (its tokenizer's streams of the data) at every format.
std::optional<Failure> ScoreAll(const Inputs& in, const lede::bench::PerplexityOptions& po, nlohmann::json* report) {
  using namespace lede;
  for (const std::string& model_path : in.models) {
    auto tok_path = tokenizer::FindTokenizerFile(model_path);
    if (!tok_path.ok()) return Failure{tok_path.status(), 2};
    auto tok = tokenizer::LoadTokenizer(*tok_path);
    if (!tok.ok()) return Failure{tok.status(), 2};
    std::vector<std::vector<int32_t>> streams;
    for (const auto& docs : in.documents) {
      auto stream = trainer::EncodeDocuments(**tok, docs);
      if (!stream.ok()) return Failure{stream.status(), 2};
      streams.push_back(std::move(*stream));
    }
    for (model::loaders::WeightFormat format : in.formats) {
      if (auto failed = ScoreModel(model_path, format, in, streams, po, report)) return failed;
    }
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lede;
  Flags fl;
  flags::FlagSet f;
  f.Add("models", &fl.models, "checkpoints (directories or .gguf files), comma-separated", true);
  f.Add("data", &fl.data, "held-out text files (<|doc|>-separated), comma-separated", true);
  f.Add("weights", &fl.weights, "weight formats, comma-separated (auto, f32, bf16, q8_0, q4_0, q4_k_m, gguf)");
  f.Add("window", &fl.window, "positions per window (0: the model's context)");
  f.Add("stride", &fl.stride, "tokens between window starts (0: window / 2)");
  f.Add("chunk", &fl.chunk, "rows per forward call within a window");
  f.Add("max-tokens", &fl.max_tokens, "tokens scored per file (0: all)");
  f.Add("threads", &fl.threads, "decode threads (0: every CPU the process may use)");
  f.Add("json", &fl.json, "write the JSON report here");
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (flags::WantsHelp(args)) {
    std::printf("usage: lede-perplexity --models M[,M2] --data FILE[,FILE2] [flags]\nflags:\n%s", f.Usage().c_str());
    return 0;
  }
  if (Status s = f.Parse(args); !s.ok()) {
    std::fprintf(stderr, "lede-perplexity: %s\nflags:\n%s", std::string(s.message()).c_str(), f.Usage().c_str());
    return 2;
  }
  if (auto t = model::loaders::ApplyThreadsFlag(fl.threads); !t.ok()) return Fail(t.status(), 2);
  Inputs in;
  if (auto failed = ReadInputs(fl, &in)) return Fail(failed->status, failed->code);
  bench::PerplexityOptions po;
  po.window = fl.window;
  po.stride = fl.stride;
  po.chunk = fl.chunk;
  po.max_tokens = fl.max_tokens;
  nlohmann::json report = {{"benchmark", "perplexity"}, {"window", fl.window}, {"stride", fl.stride},
                           {"threads", fl.threads}, {"rows", nlohmann::json::array()}};
  for (const std::string& file : in.data) {
    report["data"][std::filesystem::path(file).stem().stem().string()] = file;
  }
  std::printf("%-40s %-7s %-22s %7s %11s %8s %7s\n", "model", "weights", "data", "tokens", "perplexity", "top-1",
              "s");
  if (auto failed = ScoreAll(in, po, &report)) return Fail(failed->status, failed->code);
  if (!fl.json.empty()) {
    std::ofstream out(fl.json);
    out << report.dump(1) << "\n";
    if (!out) return Fail(InvalidArgumentError("--json: cannot write " + fl.json), 1);
  }
  return 0;
}
