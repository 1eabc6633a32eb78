#include "shared/model/cost_model.h"

#include <algorithm>
#include <chrono>
#include <functional>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "shared/file/file.h"
#include "shared/model/exit_signals.h"
#include "shared/model/torch_boundary.h"
#include "shared/status/status_macros.h"

namespace lede::model {
namespace {

constexpr int64_t kMaxCalibratedPositions = 16;

class AcceleratorCostModel : public CostModel {
 public:
  explicit AcceleratorCostModel(const ModelConfig& c)
      : L_(static_cast<double>(c.n_layers)), h_(HeadLayerEquivalents(c)) {}
  std::string name() const override { return "accelerator"; }
  double DraftToken(int64_t l) const override { return (l + h_) / L_; }
  double Verify(int64_t, int64_t) const override { return 1.0; }
  double Probe() const override { return h_ / L_; }

 private:
  double L_, h_;
};

class MeasuredCostModel : public CostModel {
 public:
  explicit MeasuredCostModel(Calibration c) : c_(std::move(c)) {}
  std::string name() const override { return "measured"; }
  double DraftToken(int64_t l) const override {
    return (l * Block(1) + Head(1)) / c_.step_us;
  }
  double Verify(int64_t e, int64_t k) const override {
    return (e * Block(1) + (c_.n_layers - e) * Block(k + 1) + Head(k + 1)) / c_.step_us;
  }
  double Probe() const override { return Head(1) / c_.step_us; }
  double Decision() const override { return c_.decision_us / c_.step_us; }

 private:
  static double At(const std::vector<double>& v, int64_t t) {
    const int64_t n = static_cast<int64_t>(v.size());
    if (t <= n) return v[t - 1];
    const double slope = n >= 2 ? v[n - 1] - v[n - 2] : 0.0;  // linear beyond the table
    return v[n - 1] + slope * (t - n);
  }
  double Block(int64_t t) const { return At(c_.block_us, t); }
  double Head(int64_t t) const { return At(c_.head_us, t); }
  Calibration c_;
};

// Times several measurements interleaved: each repetition runs every one of
// them once, in order, so that a change of load on the machine (other
// processes, frequency) during calibration shifts all of them alike instead
// of distorting their ratios, which is what the cost model uses. Returns
// each measurement's median in microseconds.
std::vector<double> InterleavedMedianMicros(int repeats, const std::vector<std::function<void()>>& fns) {
  std::vector<std::vector<double>> us(fns.size());
  for (const auto& fn : fns) fn();  // warm-up
  for (int i = 0; i < repeats; ++i) {
    for (size_t j = 0; j < fns.size(); ++j) {
      auto t0 = std::chrono::steady_clock::now();
      fns[j]();
      us[j].push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::vector<double> out;
  for (auto& v : us) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    out.push_back(v[v.size() / 2]);
  }
  return out;
}

}  // namespace

double CostModel::RoundCost(const RoundRecord& r) const {
  const double probes = r.n_probes * Probe() + r.n_decisions * Decision();
  if (r.n_drafted == 0) return Step() + probes;
  return r.n_drafted * DraftToken(r.exit_layer) + Verify(r.exit_layer, r.n_drafted) + probes;
}

double CostModel::PredictedSpeedup(const std::vector<RoundRecord>& rounds) const {
  double cost = 0.0, tokens = 0.0;
  for (const RoundRecord& r : rounds) {
    cost += RoundCost(r);
    tokens += r.n_emitted;
  }
  return cost > 0 ? tokens / cost : 1.0;
}

double HeadLayerEquivalents(const ModelConfig& c) {
  const double hd = static_cast<double>(c.head_dim());
  const double block = c.dim * (c.n_heads * hd + 2.0 * c.n_kv_heads * hd)  // wq, wk, wv
                       + c.n_heads * hd * c.dim                            // wo
                       + 3.0 * c.dim * c.hidden_dim;                       // w1, w2, w3
  return static_cast<double>(c.vocab_size) * c.dim / block;
}

std::unique_ptr<CostModel> MakeAcceleratorCostModel(const ModelConfig& config) {
  return std::make_unique<AcceleratorCostModel>(config);
}

std::unique_ptr<CostModel> MakeMeasuredCostModel(const Calibration& calibration) {
  return std::make_unique<MeasuredCostModel>(calibration);
}

StatusOr<Calibration> Calibrate(const LlamaModel& model, int repeats, const std::function<void()>& decide) {
  return TorchBoundary("calibrate", [&]() -> StatusOr<Calibration> {
    c10::InferenceMode guard;
    const ModelConfig& c = model.config();
    KvCacheOptions ko;
    ko.capacity = std::min<int64_t>(c.max_seq_len, 256);
    ko.device = model.options().device;
    ko.dtype = model.options().dtype;
    LEDE_ASSIGN_OR_RETURN(KvCache cache, KvCache::Create(c, ko));
    const int64_t start = std::min<int64_t>(64, ko.capacity - kMaxCalibratedPositions - 1);
    auto opts = at::TensorOptions().device(ko.device).dtype(ko.dtype);
    const bool cuda = ko.device.is_cuda();
    auto sync = [&]() {
      if (cuda) at::zeros({1}, opts).cpu();  // waits for queued kernels
    };
    Calibration cal;
    cal.model_fingerprint = c.ArchitectureFingerprint();
    cal.device = ko.device.str();
    cal.n_layers = c.n_layers;
    cal.threads = at::get_num_threads();
    // A block is timed as a pass through all L blocks divided by L, so that
    // each block's weights come from where they live during decoding (a
    // single block timed in a loop would keep its weights in L2 and look
    // cheaper than it is).
    std::vector<at::Tensor> hidden;
    for (int64_t t = 1; t <= kMaxCalibratedPositions; ++t) hidden.push_back(at::randn({1, t, c.dim}, opts));
    at::Tensor token = at::full({1, 1}, c.bos_id, at::TensorOptions().dtype(at::kLong).device(ko.device));
    at::Tensor logits = model.ExitLogits(at::randn({1, 1, c.dim}, opts)).view({-1});
    volatile float sink = 0;
    std::vector<std::function<void()>> fns;
    for (const at::Tensor& h : hidden) {
      fns.push_back([&, h] {
        model.Forward(h, 0, c.n_layers, start, &cache, 0);
        sync();
      });
      fns.push_back([&, h] {
        model.ExitLogits(h);
        sync();
      });
    }
    fns.push_back([&] {
      at::Tensor h = model.Forward(model.Embed(token), 0, c.n_layers, start, &cache, 0);
      model.ExitLogits(h).argmax().item<int64_t>();
    });
    fns.push_back([&] {
      sink = sink + ComputeExitSignals(logits, 4).entropy;
      if (decide) decide();
    });
    const std::vector<double> us = InterleavedMedianMicros(repeats, fns);
    for (int64_t t = 0; t < kMaxCalibratedPositions; ++t) {
      cal.block_us.push_back(us[2 * t] / c.n_layers);
      cal.head_us.push_back(us[2 * t + 1]);
    }
    cal.step_us = us[2 * kMaxCalibratedPositions];
    cal.decision_us = us[2 * kMaxCalibratedPositions + 1];
    return cal;
  });
}

std::string CalibrationToJson(const Calibration& c) {
  nlohmann::json j;
  j["model_fingerprint"] = c.model_fingerprint;
  j["device"] = c.device;
  j["n_layers"] = c.n_layers;
  j["threads"] = c.threads;
  j["block_us"] = c.block_us;
  j["head_us"] = c.head_us;
  j["step_us"] = c.step_us;
  j["decision_us"] = c.decision_us;
  j["units"] = "microseconds; block_us[i] and head_us[i] are for i+1 positions";
  return j.dump(2) + "\n";
}

StatusOr<Calibration> CalibrationFromJson(const std::string& text) {
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    Calibration c;
    c.model_fingerprint = j.at("model_fingerprint").get<std::string>();
    c.device = j.at("device").get<std::string>();
    c.n_layers = j.at("n_layers").get<int64_t>();
    c.threads = j.value("threads", int64_t{0});
    c.block_us = j.at("block_us").get<std::vector<double>>();
    c.head_us = j.at("head_us").get<std::vector<double>>();
    c.step_us = j.at("step_us").get<double>();
    c.decision_us = j.value("decision_us", 0.0);
    if (c.block_us.empty() || c.head_us.empty() || c.step_us <= 0 || c.n_layers <= 0) {
      return InvalidArgumentError("calibration: empty tables or non-positive step_us/n_layers");
    }
    return c;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("calibration JSON: ") + e.what());
  }
}

StatusOr<Calibration> ReadCalibrationFile(const std::string& path) {
  LEDE_ASSIGN_OR_RETURN(std::string text, file::ReadFile(path));
  return CalibrationFromJson(text);
}

}  // namespace lede::model
