#include "trainer/pretrain.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>
#include <torch/types.h>  // clip_grad.h relies on it
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include "shared/model/llama.h"
#include "shared/tokenizer/tokenizer.h"
#include "shared/file/file.h"
#include "shared/model/torch_boundary.h"
#include "shared/status/status_macros.h"
#include "trainer/corpus.h"
#include "trainer/exit_eval.h"

namespace lede::trainer {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

StatusOr<std::vector<int32_t>> EncodeCorpusFile(const tokenizer::Tokenizer& tok, const std::string& path) {
  LEDE_ASSIGN_OR_RETURN(std::vector<std::string> docs, ReadDocuments(path));
  return EncodeDocuments(tok, docs);
}

struct Domain {
  std::string name;
  double weight = 0;
  std::vector<int32_t> train, val;
};

double LearningRate(const PretrainOptions& o, int64_t step) {
  if (step < o.warmup_steps) return o.lr * (step + 1) / o.warmup_steps;
  const double progress = static_cast<double>(step - o.warmup_steps) /
                          std::max<int64_t>(1, o.steps - o.warmup_steps);
  const double min_lr = o.lr * o.min_lr_ratio;
  return min_lr + (o.lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

at::Tensor CrossEntropy(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

std::string FormatDuration(double seconds) {
  char buf[32];
  const int s = static_cast<int>(seconds);
  std::snprintf(buf, sizeof(buf), "%dh%02dm%02ds", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

Status CheckOptions(const PretrainOptions& o) {
  if (o.batch_size < 1 || o.seq_len < 2 || o.steps < 1 || o.curriculum_period < 1) {
    return InvalidArgumentError("batch_size, seq_len, steps and curriculum_period must be positive");
  }
  if (o.exit_distill < 0 || o.exit_distill > 1) return InvalidArgumentError("exit_distill must be in [0, 1]");
  if (o.exit_always < 0) return InvalidArgumentError("exit_always must be >= 0");
  return OkStatus();
}

// AdamW (betas 0.9/0.95), weight decay on the matrices only.
torch::optim::AdamW MakeOptimizer(const PretrainOptions& o, const std::vector<at::Tensor>& decay,
                                  const std::vector<at::Tensor>& no_decay) {
  auto opts = torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).eps(1e-8);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(opts).weight_decay(o.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(opts).weight_decay(0.0)));
  return torch::optim::AdamW(groups, opts);
}

// The corpus domains of the mixture, encoded (train and validation splits).
StatusOr<std::vector<Domain>> LoadDomains(const PretrainOptions& o, const tokenizer::Tokenizer& tokenizer) {
  std::vector<Domain> domains;
  double total_weight = 0;
  for (const auto& [name, weight] : o.mixture) {
    Domain d;
    d.name = name;
    d.weight = weight;
    LEDE_ASSIGN_OR_RETURN(d.train, EncodeCorpusFile(tokenizer, o.data_dir + "/" + name + ".train.txt"));
    LEDE_ASSIGN_OR_RETURN(d.val, EncodeCorpusFile(tokenizer, o.data_dir + "/" + name + ".val.txt"));
    if (static_cast<int64_t>(d.train.size()) <= o.seq_len + 1) {
      return InvalidArgumentError("domain " + name + " has too few training tokens");
    }
    std::fprintf(stderr, "domain %-8s weight %.2f  train %8zu tokens  val %7zu tokens\n", name.c_str(), weight,
                 d.train.size(), d.val.size());
    total_weight += weight;
    domains.push_back(std::move(d));
  }
  if (domains.empty() || total_weight <= 0) return InvalidArgumentError("empty mixture");
  return domains;
}

// One batch: B windows of T+1 tokens, each from a domain drawn by mixture weight.
std::vector<int64_t> SampleBatch(const std::vector<Domain>& domains, double total_weight, int64_t B, int64_t T,
                                 std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<int64_t> batch;
  batch.reserve(B * (T + 1));
  for (int64_t b = 0; b < B; ++b) {
    double u = uniform(rng) * total_weight;
    const Domain* d = &domains.back();
    for (const Domain& cand : domains) {
      if (u < cand.weight) {
        d = &cand;
        break;
      }
      u -= cand.weight;
    }
    std::uniform_int_distribution<int64_t> pick(0, static_cast<int64_t>(d->train.size()) - T - 2);
    const int64_t s = pick(rng);
    batch.insert(batch.end(), d->train.begin() + s, d->train.begin() + s + T + 1);
  }
  return batch;
}

// The LayerSkip-style training loss of one batch: the last layer's cross
// entropy plus, at the exits the curriculum activates this step, early-exit
// cross entropy and self-distillation from the last layer, with layer
// dropout rising linearly with depth. `final_loss`: the last layer's term.
at::Tensor TrainingLoss(model::LlamaModel& m, const PretrainOptions& o, const at::Tensor& inp, const at::Tensor& tgt,
                        int64_t step, std::mt19937_64& rng, at::Tensor* final_loss) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const int64_t L = m.config().n_layers;
  at::Tensor h = m.Embed(inp);
  std::vector<at::Tensor> exit_hidden;  // outputs of the blocks whose exits get a loss
  for (int64_t l = 0; l < L; ++l) {
    const double p_drop = L > 1 ? o.layer_dropout_max * l / (L - 1) : 0.0;
    if (uniform(rng) >= p_drop) h = m.Block(l, h, 0, nullptr, 0);
    const int64_t exit_layer = l + 1;
    const bool active = (exit_layer + step) % o.curriculum_period == 0 || exit_layer <= o.exit_always;
    if (exit_layer < L && active && o.exit_scale > 0) exit_hidden.push_back(h);
  }
  at::Tensor final_logits = m.ExitLogits(h);
  *final_loss = CrossEntropy(final_logits, tgt);
  at::Tensor teacher;  // p_L, detached: [B, T, V]
  if (o.exit_distill > 0 && !exit_hidden.empty()) teacher = at::softmax(final_logits.detach(), -1);
  at::Tensor early = at::zeros({}, at::kFloat);
  for (const at::Tensor& eh : exit_hidden) {
    at::Tensor logits = m.ExitLogits(eh);
    if (o.exit_distill < 1) early = early + (1 - o.exit_distill) * CrossEntropy(logits, tgt);
    if (teacher.defined()) {
      at::Tensor sce = -(teacher * at::log_softmax(logits, -1)).sum(-1).mean();
      early = early + o.exit_distill * sce;
    }
  }
  const int64_t n_active = static_cast<int64_t>(exit_hidden.size());
  return n_active > 0 ? *final_loss + early * (o.exit_scale / n_active) : *final_loss;
}

// The progress line (stderr, rewritten in place).
void PrintProgress(const PretrainOptions& o, int64_t step, double tok_s, double eta_s, double ema_loss,
                   double ema_final, double lr) {
  const int width = 24, filled = static_cast<int>(width * (step + 1) / o.steps);
  std::fprintf(stderr, "\r[%s%s] step %lld/%lld loss %.3f (last layer %.3f, ppl %.1f) lr %.2e %.0f tok/s ETA %s   ",
               std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
               static_cast<long long>(step + 1), static_cast<long long>(o.steps), ema_loss, ema_final,
               std::exp(ema_final), lr, tok_s, FormatDuration(eta_s).c_str());
  std::fflush(stderr);
}

// report.json: the run, its options, and each domain's held-out loss by exit layer.
StatusOr<nlohmann::json> Report(const PretrainOptions& o, model::LlamaModel& m, const std::vector<Domain>& domains,
                                double train_s, int64_t n_params) {
  const int64_t B = o.batch_size, T = o.seq_len;
  nlohmann::json report;
  report["training_seconds"] = train_s;
  report["steps"] = o.steps;
  report["tokens_seen"] = o.steps * B * T;
  report["parameters"] = n_params;
  report["options"] = {{"batch_size", B}, {"seq_len", T}, {"lr", o.lr}, {"min_lr_ratio", o.min_lr_ratio},
                       {"warmup_steps", o.warmup_steps}, {"weight_decay", o.weight_decay},
                       {"grad_clip", o.grad_clip}, {"layer_dropout_max", o.layer_dropout_max},
                       {"exit_scale", o.exit_scale}, {"curriculum_period", o.curriculum_period},
                       {"exit_always", o.exit_always}, {"exit_distill", o.exit_distill},
                       {"init_from", o.init_from},
                       {"seed", o.seed}, {"threads", at::get_num_threads()}};
  for (const Domain& d : domains) {
    report["mixture"][d.name] = d.weight;
    report["train_tokens"][d.name] = d.train.size();
    std::fprintf(stderr, "\nevaluating %s ...", d.name.c_str());
    LEDE_ASSIGN_OR_RETURN(report["held_out"][d.name], EvaluateLayers(m, d.val, T, o.eval_tokens));
  }
  return report;
}

}  // namespace

StatusOr<std::map<std::string, double>> ParseMixture(const std::string& text) {
  std::map<std::string, double> mixture;
  double total = 0;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(entry, absl::MaxSplits('=', 1));
    double weight = 0;
    if (kv.first.empty() || !absl::SimpleAtod(kv.second, &weight) || !(weight >= 0) || std::isinf(weight)) {
      return InvalidArgumentError("mixture: want name=weight with weight >= 0, got '" + std::string(entry) + "'");
    }
    if (!mixture.emplace(kv.first, weight).second) {
      return InvalidArgumentError("mixture: domain '" + kv.first + "' given twice");
    }
    total += weight;
  }
  if (total <= 0) return InvalidArgumentError("mixture: no domain has a positive weight in '" + text + "'");
  return mixture;
}

namespace {

// Where a run starts: its model, config and step. The model is the
// checkpoint's when resuming (ckpt_dir/state.json exists), else init_from's
// weights (continued pretraining), else a random init of o.config; the
// config's vocabulary and special tokens are the tokenizer's.
struct StartPoint {
  std::unique_ptr<model::LlamaModel> model;
  checkpoint::ModelConfig config;
  int64_t step = 0;
  double elapsed_s = 0;  // training time before this run (s)
};

StatusOr<StartPoint> LoadStartPoint(const PretrainOptions& o, const tokenizer::Tokenizer& tokenizer,
                                    const std::string& ckpt_dir) {
  const std::string state_path = ckpt_dir + "/state.json";
  const bool resuming = fs::exists(state_path);
  model::ModelOptions writable;
  writable.writable_weights = true;  // the optimizer updates them in place
  writable.weights = model::loaders::WeightFormat::kF32;  // trained in float32, whatever the file stores
  StartPoint start;
  std::unique_ptr<model::LlamaModel>& m = start.model;
  const std::string start_dir = resuming ? ckpt_dir + "/model" : o.init_from;
  if (!start_dir.empty()) {
    LEDE_ASSIGN_OR_RETURN(m, model::LlamaModel::Load(start_dir, writable));
    if (m->config().vocab_size != tokenizer.vocab_size()) {
      return InvalidArgumentError((resuming ? "checkpoint: " : "init_from: ") + start_dir + " has vocab_size " +
                                  std::to_string(m->config().vocab_size) + ", the tokenizer " +
                                  std::to_string(tokenizer.vocab_size()));
    }
  }
  checkpoint::ModelConfig& config = start.config;
  config = m ? m->config() : o.config;
  config.vocab_size = tokenizer.vocab_size();
  config.bos_id = tokenizer.bos_id();
  config.eos_ids = {tokenizer.eos_id()};
  LEDE_RETURN_IF_ERROR(config.Validate());
  if (o.seq_len > config.max_seq_len) return InvalidArgumentError("seq_len exceeds max_seq_len");

  fs::create_directories(ckpt_dir);
  if (resuming) {
    LEDE_ASSIGN_OR_RETURN(std::string state_text, file::ReadFile(state_path));
    nlohmann::json state = nlohmann::json::parse(state_text);
    start.step = state.at("step").get<int64_t>();
    start.elapsed_s = state.at("elapsed_s").get<double>();
    std::fprintf(stderr, "resuming from %s at step %lld\n", ckpt_dir.c_str(), static_cast<long long>(start.step));
  } else if (m) {
    std::fprintf(stderr, "starting from the weights of %s\n", o.init_from.c_str());
  } else {
    LEDE_ASSIGN_OR_RETURN(m, model::LlamaModel::RandomInit(config, o.seed, model::ModelOptions{}));
  }
  return start;
}

}  // namespace

Status Pretrain(const PretrainOptions& o) {
  return model::TorchBoundary("pretrain", [&]() -> Status {
    if (o.threads > 0) at::set_num_threads(o.threads);
    LEDE_RETURN_IF_ERROR(CheckOptions(o));
    LEDE_ASSIGN_OR_RETURN(auto tokenizer, tokenizer::LoadTokenizer(o.tokenizer));
    const std::string ckpt_dir = o.checkpoint_dir.empty() ? o.out_dir + ".ckpt" : o.checkpoint_dir;
    const std::string state_path = ckpt_dir + "/state.json";
    LEDE_ASSIGN_OR_RETURN(StartPoint start, LoadStartPoint(o, *tokenizer, ckpt_dir));
    std::unique_ptr<model::LlamaModel>& m = start.model;
    const checkpoint::ModelConfig& config = start.config;
    const int64_t start_step = start.step;
    const double elapsed_before = start.elapsed_s;

    LEDE_ASSIGN_OR_RETURN(std::vector<Domain> domains, LoadDomains(o, *tokenizer));
    double total_weight = 0;
    for (const Domain& d : domains) total_weight += d.weight;

    std::vector<at::Tensor> params = m->Parameters();
    std::vector<at::Tensor> decay, no_decay;
    int64_t n_params = 0;
    for (at::Tensor& p : params) {
      p.requires_grad_(true);
      (p.dim() >= 2 ? decay : no_decay).push_back(p);
      n_params += p.numel();
    }
    torch::optim::AdamW optimizer = MakeOptimizer(o, decay, no_decay);
    if (start_step > 0) torch::load(optimizer, ckpt_dir + "/optimizer.pt");

    const int64_t L = config.n_layers, B = o.batch_size, T = o.seq_len;
    std::fprintf(stderr, "model: %lld layers, d=%lld, %lld heads (%lld kv), ffn %lld, vocab %lld: %.2fM parameters\n",
                 static_cast<long long>(L), static_cast<long long>(config.dim), static_cast<long long>(config.n_heads),
                 static_cast<long long>(config.n_kv_heads), static_cast<long long>(config.hidden_dim),
                 static_cast<long long>(config.vocab_size), n_params / 1e6);

    auto save_checkpoint = [&](int64_t step, double elapsed) -> Status {
      LEDE_RETURN_IF_ERROR(m->SaveHf(ckpt_dir + "/model"));
      std::ostringstream optimizer_bytes;
      torch::save(optimizer, optimizer_bytes);
      LEDE_RETURN_IF_ERROR(file::WriteFileAtomically(ckpt_dir + "/optimizer.pt", optimizer_bytes.str()));
      nlohmann::json state = {{"step", step}, {"elapsed_s", elapsed}};
      return file::WriteFileAtomically(state_path, state.dump(2));
    };

    auto t0 = Clock::now();
    double ema_loss = 0, ema_final = 0;
    for (int64_t step = start_step; step < o.steps; ++step) {
      std::mt19937_64 rng(o.seed * 1000003ULL + static_cast<uint64_t>(step));
      const std::vector<int64_t> batch = SampleBatch(domains, total_weight, B, T, rng);
      at::Tensor tokens = at::tensor(batch, at::kLong).view({B, T + 1});
      at::Tensor inp = tokens.narrow(1, 0, T), tgt = tokens.narrow(1, 1, T);

      const double lr = LearningRate(o, step);
      for (auto& g : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
      optimizer.zero_grad();
      at::Tensor final_loss;
      at::Tensor loss = TrainingLoss(*m, o, inp, tgt, step, rng, &final_loss);
      loss.backward();
      torch::nn::utils::clip_grad_norm_(params, o.grad_clip);
      optimizer.step();

      const double lv = loss.item<double>(), fv = final_loss.item<double>();
      ema_loss = step == start_step ? lv : 0.95 * ema_loss + 0.05 * lv;
      ema_final = step == start_step ? fv : 0.95 * ema_final + 0.05 * fv;
      const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
      const int64_t done = step + 1 - start_step;
      if (done % 5 == 0 || step + 1 == o.steps) {
        PrintProgress(o, step, done * B * T / elapsed, elapsed / done * (o.steps - step - 1), ema_loss, ema_final, lr);
      }
      if ((step + 1) % o.checkpoint_every == 0 || step + 1 == o.steps) {
        LEDE_RETURN_IF_ERROR(save_checkpoint(step + 1, elapsed_before + elapsed));
        std::fprintf(stderr, "\n  checkpoint at step %lld (%s)\n", static_cast<long long>(step + 1),
                     FormatDuration(elapsed_before + elapsed).c_str());
      }
    }
    const double train_s = elapsed_before + std::chrono::duration<double>(Clock::now() - t0).count();

    // Final model, tokenizer and report.
    for (at::Tensor& p : params) p.requires_grad_(false);
    LEDE_RETURN_IF_ERROR(m->SaveHf(o.out_dir));
    // tokenizer.model (SentencePiece) or tokenizer.bin (llama2.c), as given.
    fs::copy_file(o.tokenizer, o.out_dir + "/tokenizer" + fs::path(o.tokenizer).extension().string(),
                  fs::copy_options::overwrite_existing);
    LEDE_ASSIGN_OR_RETURN(const nlohmann::json report, Report(o, *m, domains, train_s, n_params));
    std::ofstream(o.out_dir + "/report.json") << report.dump(2) << "\n";
    std::fprintf(stderr, "\nwrote %s (trained %s)\n", o.out_dir.c_str(), FormatDuration(train_s).c_str());
    return OkStatus();
  });
}

}  // namespace lede::trainer
