#include "trainer/dqn.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include <ATen/Parallel.h>
#include <ATen/core/Reduction.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/huber_loss.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/relu.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/types.h>  // clip_grad.h relies on it
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>

#include "shared/model/torch_boundary.h"
#include "shared/status/status_macros.h"

namespace lede::trainer {
namespace {

using Clock = std::chrono::steady_clock;
using experience::Transition;
using policy::dqn::QNetwork;
using policy::dqn::QNetworkWeights;
constexpr int kIn = speculation::kExitFeatureDim;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using EpisodeKey = std::pair<std::string, int64_t>;  // (request_id, round_index)
using Episodes = std::map<EpisodeKey, std::vector<size_t>>;

// Groups transitions[i] for i in `rows` into episodes, each ordered by
// decision_index (ties keep input order).
Episodes GroupEpisodes(const std::vector<Transition>& ts, const std::vector<size_t>& rows) {
  Episodes episodes;
  for (size_t i : rows) episodes[{ts[i].request_id, ts[i].round_index}].push_back(i);
  for (auto& [key, e] : episodes) {
    std::stable_sort(e.begin(), e.end(),
                     [&ts](size_t a, size_t b) { return ts[a].decision_index < ts[b].decision_index; });
  }
  return episodes;
}

// A random network whose weights on the deployment and request features
// (the load, the cost profile and the temperature, the last inputs of
// speculation::ExitFeatures from index speculation::kLoadFeature) start at
// zero: it begins blind to them and learns a dependence on them only where
// the targets differ between loads, cost profiles or temperatures. With
// random weights there, transitions that differ only in their load (the
// same replay priced alike at loads 1 and 16) left the greedy policies far
// apart: 1.67x at load 1 and 1.33x at load 16 on the training traces.
QNetwork LoadBlindRandom(int32_t hidden, uint64_t seed) {
  QNetworkWeights w = QNetwork::Random(hidden, seed).weights();
  for (int32_t r = 0; r < hidden; ++r) {
    for (int c = speculation::kLoadFeature; c < kIn; ++c) w.fc1_weight[static_cast<size_t>(r) * kIn + c] = 0.0f;
  }
  return *QNetwork::Create(std::move(w));
}

std::vector<size_t> AllRows(size_t n) {
  std::vector<size_t> rows(n);
  for (size_t i = 0; i < n; ++i) rows[i] = i;
  return rows;
}

// Uniform integer in [0, n) from a 64-bit draw; the modulo bias (< n / 2^64)
// is negligible, and unlike std::uniform_int_distribution the result is the
// same with every standard library.
uint64_t Below(std::mt19937_64& rng, uint64_t n) { return rng() % n; }

template <typename T>
void Shuffle(std::vector<T>& v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[Below(rng, i)]);
}

bool Finite(const std::array<float, kIn>& a) {
  for (float x : a) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// --- the network as libtorch tensors ----------------------------------------------

struct TorchNet {
  at::Tensor w1, b1, w2, b2, w3, b3;

  std::vector<at::Tensor> params() const { return {w1, b1, w2, b2, w3, b3}; }
  // x [B, 8] float32 -> q [B, 2]
  at::Tensor Forward(const at::Tensor& x) const {
    return at::linear(at::relu(at::linear(at::relu(at::linear(x, w1, b1)), w2, b2)), w3, b3);
  }
};

at::Tensor ToTensor(const std::vector<float>& v, std::vector<int64_t> shape) {
  at::Tensor t = at::empty(shape, at::kFloat);
  std::memcpy(t.data_ptr<float>(), v.data(), v.size() * sizeof(float));
  return t;
}

std::vector<float> FromTensor(const at::Tensor& t) {
  const at::Tensor c = t.detach().contiguous();
  const float* p = c.data_ptr<float>();
  return std::vector<float>(p, p + c.numel());
}

TorchNet MakeTorchNet(const QNetworkWeights& w, bool requires_grad) {
  const int64_t h = w.hidden;
  TorchNet n{ToTensor(w.fc1_weight, {h, kIn}), ToTensor(w.fc1_bias, {h}),
             ToTensor(w.fc2_weight, {h, h}),   ToTensor(w.fc2_bias, {h}),
             ToTensor(w.fc3_weight, {policy::dqn::kNumActions, h}),
             ToTensor(w.fc3_bias, {policy::dqn::kNumActions})};
  if (requires_grad) {
    for (at::Tensor* p : {&n.w1, &n.b1, &n.w2, &n.b2, &n.w3, &n.b3}) p->requires_grad_(true);
  }
  return n;
}

QNetworkWeights ToWeights(const TorchNet& n, int32_t hidden) {
  QNetworkWeights w;
  w.hidden = hidden;
  w.fc1_weight = FromTensor(n.w1);
  w.fc1_bias = FromTensor(n.b1);
  w.fc2_weight = FromTensor(n.w2);
  w.fc2_bias = FromTensor(n.b2);
  w.fc3_weight = FromTensor(n.w3);
  w.fc3_bias = FromTensor(n.b3);
  return w;
}

// theta' <- tau theta + (1 - tau) theta'  (tau = 1: a hard copy).
void UpdateTarget(TorchNet& target, const TorchNet& online, double tau) {
  c10::NoGradGuard no_grad;
  const std::vector<at::Tensor> dst = target.params(), src = online.params();
  for (size_t i = 0; i < dst.size(); ++i) {
    if (tau >= 1.0) {
      dst[i].copy_(src[i]);
    } else {
      dst[i].mul_(1.0 - tau).add_(src[i], tau);
    }
  }
}

// --- data --------------------------------------------------------------------------

// Tensors of a set of transitions (rows into the transition vector).
struct DataSet {
  std::vector<size_t> rows;
  at::Tensor states;      // [N, 8] float32
  at::Tensor actions;     // [N] int64
  at::Tensor reward_sum;  // [N] float32, n-step discounted reward sum
  at::Tensor discount;    // [N] float32, gamma^k or 0
  at::Tensor bootstrap;   // [N, 8] float32, s_{t+k}
  std::vector<bool> phase2;  // per row
};

DataSet MakeDataSet(const std::vector<Transition>& ts, const std::vector<NStepTarget>& targets,
                    std::vector<size_t> rows) {
  const int64_t n = static_cast<int64_t>(rows.size());
  DataSet d;
  d.states = at::empty({n, kIn}, at::kFloat);
  d.actions = at::empty({n}, at::kLong);
  d.reward_sum = at::empty({n}, at::kFloat);
  d.discount = at::empty({n}, at::kFloat);
  d.bootstrap = at::empty({n, kIn}, at::kFloat);
  float* s = d.states.data_ptr<float>();
  int64_t* a = d.actions.data_ptr<int64_t>();
  float* r = d.reward_sum.data_ptr<float>();
  float* g = d.discount.data_ptr<float>();
  float* b = d.bootstrap.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const Transition& t = ts[rows[i]];
    const NStepTarget& y = targets[rows[i]];
    std::memcpy(s + i * kIn, t.state.data(), sizeof(float) * kIn);
    std::memcpy(b + i * kIn, y.bootstrap_state.data(), sizeof(float) * kIn);
    a[i] = t.action == speculation::Action::kExit ? 1 : 0;
    r[i] = static_cast<float>(y.reward_sum);
    g[i] = static_cast<float>(y.bootstrap_discount);
    d.phase2.push_back(t.phase == speculation::Phase::kDraftLength);
  }
  d.rows = std::move(rows);
  return d;
}

// TD targets of a (mini)batch: reward_sum + discount * max_a Q_target(s_{t+k}, a).
at::Tensor Targets(const TorchNet& target, const at::Tensor& reward_sum, const at::Tensor& discount,
                   const at::Tensor& bootstrap) {
  c10::NoGradGuard no_grad;
  const at::Tensor max_q = std::get<0>(target.Forward(bootstrap).max(1));
  return reward_sum + discount * max_q;
}

at::Tensor ChosenQ(const at::Tensor& q, const at::Tensor& actions) {
  return q.gather(1, actions.unsqueeze(1)).squeeze(1);
}

// Metrics of the greedy policy of `online` on `d` (NaN rates and means
// when `d` is empty).
OfflinePolicyMetrics Evaluate(const TorchNet& online, const TorchNet& target, const DataSet& d,
                    const std::vector<Transition>& ts, double huber_delta) {
  OfflinePolicyMetrics m;
  const size_t n = d.rows.size();
  if (n == 0) return m;
  m.n_transitions = static_cast<int64_t>(n);
  c10::NoGradGuard no_grad;
  const at::Tensor q = online.Forward(d.states);
  const at::Tensor y = Targets(target, d.reward_sum, d.discount, d.bootstrap);
  m.td_loss = at::huber_loss(ChosenQ(q, d.actions), y, at::Reduction::Mean, huber_delta).item<double>();
  m.mean_max_q = std::get<0>(q.max(1)).mean().item<double>();
  const at::Tensor qc = q.contiguous();
  const float* qp = qc.data_ptr<float>();
  const int64_t* ap = d.actions.data_ptr<int64_t>();

  std::vector<char> greedy_matches(ts.size(), 0);  // row -> greedy == logged
  int64_t n1 = 0, n2 = 0, exit1 = 0, exit2 = 0, agree = 0;
  double reward = 0, matched_reward = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t greedy = qp[2 * i + 1] > qp[2 * i] ? 1 : 0;  // ties -> kContinue, as GreedyAction
    if (d.phase2[i]) {
      ++n2;
      exit2 += greedy;
    } else {
      ++n1;
      exit1 += greedy;
    }
    const bool match = greedy == ap[i];
    greedy_matches[d.rows[i]] = match;
    const double r = ts[d.rows[i]].reward;
    reward += r;
    if (match) {
      ++agree;
      matched_reward += r;
    }
  }
  m.exit_fraction_phase1 = n1 ? static_cast<double>(exit1) / n1 : kNaN;
  m.exit_fraction_phase2 = n2 ? static_cast<double>(exit2) / n2 : kNaN;
  m.action_agreement = static_cast<double>(agree) / n;
  m.behaviour_reward = reward / n;
  m.matched_reward = agree ? matched_reward / agree : kNaN;

  // Per-episode returns: all episodes, and those the greedy policy reproduces.
  const Episodes episodes = GroupEpisodes(ts, d.rows);
  m.n_episodes = static_cast<int64_t>(episodes.size());
  double ret_all = 0, ret_matched = 0;
  for (const auto& [key, e] : episodes) {
    double ret = 0;
    bool all_match = true;
    for (size_t row : e) {
      ret += ts[row].reward;
      all_match = all_match && greedy_matches[row];
    }
    ret_all += ret;
    if (all_match) {
      ret_matched += ret;
      ++m.matched_episodes;
    }
  }
  m.behaviour_return = ret_all / episodes.size();
  m.matched_return = m.matched_episodes ? ret_matched / m.matched_episodes : kNaN;
  return m;
}

// Restores libtorch's intra-op thread count on scope exit.
class ThreadCountGuard {
 public:
  explicit ThreadCountGuard(int n) : previous_(at::get_num_threads()) { at::set_num_threads(n); }
  ~ThreadCountGuard() { at::set_num_threads(previous_); }

 private:
  int previous_;
};

// The transitions that can be trained on: finite state, next_state and
// reward, and each decision (request_id, round_index, decision_index) once
// (the first). Returns `all` itself when every transition is usable (the
// usual case: no copy, which would double the peak memory of a large
// training set), else a filtered copy held in *storage. The set of seen
// decisions is freed before returning.
const std::vector<Transition>& Usable(const std::vector<Transition>& all, std::vector<Transition>* storage,
                                      int64_t* dropped, int64_t* duplicates) {
  std::vector<bool> keep(all.size(), false);
  {
    std::set<std::tuple<std::string, int64_t, int32_t>> seen;  // (request_id, round_index, decision_index)
    for (size_t i = 0; i < all.size(); ++i) {
      const Transition& t = all[i];
      if (!Finite(t.state) || !Finite(t.next_state) || !std::isfinite(t.reward)) {
        ++*dropped;
      } else if (!seen.emplace(t.request_id, t.round_index, t.decision_index).second) {
        ++*duplicates;  // the same decision logged twice (e.g. a re-uploaded shard)
      } else {
        keep[i] = true;
      }
    }
  }
  if (*dropped == 0 && *duplicates == 0) return all;
  storage->clear();
  storage->reserve(all.size() - static_cast<size_t>(*dropped + *duplicates));
  for (size_t i = 0; i < all.size(); ++i) {
    if (keep[i]) storage->push_back(all[i]);
  }
  return *storage;
}

// The held-out split: whole requests (with >= 10 requests) or whole
// episodes, `fraction` of them (at least one when there are two or more,
// never all), drawn with `rng`.
struct HeldOutSplit {
  std::vector<size_t> train_rows, held_rows;
  int64_t n_train_episodes = 0, n_heldout_episodes = 0, n_requests = 0;
  std::vector<std::string> behaviour_versions;  // sorted
};

HeldOutSplit SplitHeldOut(const std::vector<Transition>& ts, const Episodes& episodes, double fraction,
                          std::mt19937_64& rng) {
  std::set<std::string> request_set;
  std::set<std::string> versions;
  for (const Transition& t : ts) {
    request_set.insert(t.request_id);
    versions.insert(t.policy_version);
  }
  const bool by_request = request_set.size() >= 10;
  std::vector<std::string> units_req(request_set.begin(), request_set.end());
  std::vector<EpisodeKey> units_ep;
  for (const auto& [key, e] : episodes) units_ep.push_back(key);
  const size_t n_units = by_request ? units_req.size() : units_ep.size();
  size_t n_hold = static_cast<size_t>(std::floor(fraction * n_units + 0.5));
  if (fraction > 0 && n_units >= 2) n_hold = std::max<size_t>(n_hold, 1);
  if (n_hold >= n_units) n_hold = n_units - 1;  // keep something to train on

  std::set<std::string> held_req;
  std::set<EpisodeKey> held_ep;
  if (by_request) {
    Shuffle(units_req, rng);
    held_req.insert(units_req.begin(), units_req.begin() + n_hold);
  } else {
    Shuffle(units_ep, rng);
    held_ep.insert(units_ep.begin(), units_ep.begin() + n_hold);
  }
  HeldOutSplit split;
  for (const auto& [key, e] : episodes) {
    const bool held = by_request ? held_req.count(key.first) > 0 : held_ep.count(key) > 0;
    std::vector<size_t>& dst = held ? split.held_rows : split.train_rows;
    dst.insert(dst.end(), e.begin(), e.end());
    ++(held ? split.n_heldout_episodes : split.n_train_episodes);
  }
  split.n_requests = static_cast<int64_t>(request_set.size());
  split.behaviour_versions.assign(versions.begin(), versions.end());
  return split;
}

StatusOr<DqnResult> TrainDqnImpl(const std::vector<Transition>& all, const DqnOptions& o,
                                 const DqnEpochCallback& on_epoch) {
  const auto start = Clock::now();
  LEDE_RETURN_IF_ERROR(ValidateDqnOptions(o));

  // Drop transitions that would poison the regression.
  int64_t dropped = 0, duplicates = 0;
  std::vector<Transition> storage;
  const std::vector<Transition>& ts = Usable(all, &storage, &dropped, &duplicates);
  if (ts.empty()) {
    return InvalidArgumentError("TrainDqn: no usable transitions (" + std::to_string(all.size()) + " given, " +
                                std::to_string(dropped) + " non-finite)");
  }

  // Held-out split by request (>= 10 requests) or by episode.
  const Episodes episodes = GroupEpisodes(ts, AllRows(ts.size()));
  std::mt19937_64 rng(o.seed);
  const HeldOutSplit split = SplitHeldOut(ts, episodes, o.heldout_fraction, rng);
  const std::vector<size_t>& train_rows = split.train_rows;
  const std::vector<size_t>& held_rows = split.held_rows;

  const std::vector<NStepTarget> targets = ComputeNStepTargets(ts, o.gamma, o.n_step);
  ThreadCountGuard threads(o.num_threads);
  const DataSet train = MakeDataSet(ts, targets, train_rows);
  const DataSet held = MakeDataSet(ts, targets, held_rows);

  const QNetwork init = o.initial_network != nullptr ? *o.initial_network : LoadBlindRandom(o.hidden, o.seed);
  TorchNet online = MakeTorchNet(init.weights(), /*requires_grad=*/true);
  TorchNet target = MakeTorchNet(init.weights(), /*requires_grad=*/false);
  torch::optim::Adam adam(online.params(), torch::optim::AdamOptions(o.lr));

  DqnResult result(init);
  int64_t steps = 0;
  const int64_t n_train = static_cast<int64_t>(train.rows.size());
  std::vector<int64_t> perm(static_cast<size_t>(n_train));
  for (int64_t i = 0; i < n_train; ++i) perm[i] = i;
  for (int64_t epoch = 1; epoch <= o.epochs; ++epoch) {
    Shuffle(perm, rng);
    double loss_sum = 0;
    for (int64_t begin = 0; begin < n_train; begin += o.batch_size) {
      const int64_t b = std::min(o.batch_size, n_train - begin);
      at::Tensor idx = at::empty({b}, at::kLong);
      std::memcpy(idx.data_ptr<int64_t>(), perm.data() + begin, sizeof(int64_t) * b);
      const at::Tensor s = train.states.index_select(0, idx);
      const at::Tensor a = train.actions.index_select(0, idx);
      const at::Tensor y = Targets(target, train.reward_sum.index_select(0, idx),
                                   train.discount.index_select(0, idx), train.bootstrap.index_select(0, idx));
      at::Tensor loss = at::huber_loss(ChosenQ(online.Forward(s), a), y, at::Reduction::Mean, o.huber_delta);
      adam.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(online.params(), o.max_grad_norm);
      adam.step();
      ++steps;
      if (o.target_update == TargetUpdate::kPolyak) {
        UpdateTarget(target, online, o.polyak_tau);
      } else if (steps % o.target_update_every == 0) {
        UpdateTarget(target, online, 1.0);
      }
      loss_sum += loss.item<double>() * b;
    }
    DqnEpochReport r;
    r.train = Evaluate(online, target, train, ts, o.huber_delta);
    r.heldout = Evaluate(online, target, held, ts, o.huber_delta);
    r.epoch = epoch;
    r.steps = steps;
    r.td_loss = n_train ? loss_sum / n_train : kNaN;
    r.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    result.epochs.push_back(r);
    if (on_epoch) on_epoch(r);
  }

  StatusOr<QNetwork> net = QNetwork::Create(ToWeights(online, o.hidden));
  if (!net.ok()) {
    return InternalError("TrainDqn: training diverged: " + std::string(net.status().message()));
  }
  result.network = std::move(*net);
  result.n_transitions = static_cast<int64_t>(ts.size());
  result.n_dropped = dropped;
  result.n_duplicates = duplicates;
  result.n_episodes = static_cast<int64_t>(episodes.size());
  result.n_requests = split.n_requests;
  result.n_train_transitions = n_train;
  result.n_heldout_transitions = static_cast<int64_t>(held.rows.size());
  result.n_train_episodes = split.n_train_episodes;
  result.n_heldout_episodes = split.n_heldout_episodes;
  result.behaviour_versions = split.behaviour_versions;
  return result;
}

}  // namespace

Status ValidateDqnOptions(const DqnOptions& o) {
  auto bad = [](const std::string& what) { return InvalidArgumentError("DqnOptions." + what); };
  if (o.hidden < 1 || o.hidden > policy::dqn::kMaxHidden) {
    return bad("hidden must be in [1, " + std::to_string(policy::dqn::kMaxHidden) + "]");
  }
  if (!(o.gamma >= 0 && o.gamma <= 1)) return bad("gamma must be in [0, 1]");
  if (o.n_step < 1) return bad("n_step must be >= 1");
  if (o.epochs < 0) return bad("epochs must be >= 0");
  if (o.batch_size < 1) return bad("batch_size must be >= 1");
  if (!(o.lr > 0)) return bad("lr must be > 0");
  if (!(o.huber_delta > 0)) return bad("huber_delta must be > 0");
  if (!(o.max_grad_norm > 0)) return bad("max_grad_norm must be > 0");
  if (o.target_update_every < 1) return bad("target_update_every must be >= 1");
  if (!(o.polyak_tau > 0 && o.polyak_tau <= 1)) return bad("polyak_tau must be in (0, 1]");
  if (!(o.heldout_fraction >= 0 && o.heldout_fraction < 1)) return bad("heldout_fraction must be in [0, 1)");
  if (o.num_threads < 1) return bad("num_threads must be >= 1");
  if (o.initial_network != nullptr && o.initial_network->hidden() != o.hidden) {
    return bad("initial_network has hidden width " + std::to_string(o.initial_network->hidden()) +
               ", hidden is " + std::to_string(o.hidden));
  }
  return OkStatus();
}

std::vector<NStepTarget> ComputeNStepTargets(const std::vector<Transition>& ts, double gamma, int32_t n) {
  std::vector<NStepTarget> out(ts.size());
  const Episodes episodes = GroupEpisodes(ts, AllRows(ts.size()));
  for (const auto& [key, e] : episodes) {
    for (size_t p = 0; p < e.size(); ++p) {
      NStepTarget& y = out[e[p]];
      double sum = 0, discount = 1;
      int32_t k = 0;
      size_t last = e[p];
      bool terminal = false;
      for (size_t q = p; q < e.size() && k < n; ++q) {
        if (q > p && ts[e[q]].decision_index != ts[e[q - 1]].decision_index + 1) break;  // a gap
        const Transition& t = ts[e[q]];
        sum += discount * t.reward;
        discount *= gamma;
        ++k;
        last = e[q];
        if (t.done) {
          terminal = true;
          break;
        }
      }
      y.reward_sum = sum;
      y.steps = k;
      if (terminal) {
        y.bootstrap_discount = 0;
        y.bootstrap_state.fill(0.0f);
      } else {
        y.bootstrap_discount = discount;
        y.bootstrap_state = ts[last].next_state;
      }
    }
  }
  return out;
}

std::vector<double> TdTargets(const std::vector<NStepTarget>& targets, const QNetwork& target_network) {
  std::vector<double> out;
  out.reserve(targets.size());
  for (const NStepTarget& y : targets) {
    double g = y.reward_sum;
    if (y.bootstrap_discount != 0) {
      float q[policy::dqn::kNumActions];
      target_network.Forward(y.bootstrap_state.data(), q);
      g += y.bootstrap_discount * std::max(q[0], q[1]);
    }
    out.push_back(g);
  }
  return out;
}

std::map<std::string, double> DqnResult::OfflineMetrics() const {
  std::map<std::string, double> m;
  if (epochs.empty()) return m;
  const DqnEpochReport& r = epochs.back();
  m["epochs"] = static_cast<double>(r.epoch);
  m["steps"] = static_cast<double>(r.steps);
  m["td_loss"] = r.td_loss;  // the minibatches'; the training set's own metrics follow
  m["mean_max_q"] = r.train.mean_max_q;
  m["exit_fraction_phase1"] = r.train.exit_fraction_phase1;
  m["exit_fraction_phase2"] = r.train.exit_fraction_phase2;
  m["action_agreement"] = r.train.action_agreement;
  AddOfflineMetrics(r.heldout, "heldout_", &m);
  return m;
}

StatusOr<OfflinePolicyMetrics> EvaluateOffline(const QNetwork& network, const std::vector<Transition>& transitions,
                                               const DqnOptions& options) {
  DqnOptions o = options;
  o.initial_network = nullptr;
  LEDE_RETURN_IF_ERROR(ValidateDqnOptions(o));
  return model::TorchBoundary("EvaluateOffline", [&]() -> StatusOr<OfflinePolicyMetrics> {
    int64_t dropped = 0, duplicates = 0;
    std::vector<Transition> storage;
    const std::vector<Transition>& ts = Usable(transitions, &storage, &dropped, &duplicates);
    if (ts.empty()) return InvalidArgumentError("EvaluateOffline: no usable transitions");
    ThreadCountGuard threads(o.num_threads);
    const DataSet d = MakeDataSet(ts, ComputeNStepTargets(ts, o.gamma, o.n_step), AllRows(ts.size()));
    const TorchNet net = MakeTorchNet(network.weights(), /*requires_grad=*/false);
    return Evaluate(net, net, d, ts, o.huber_delta);
  });
}

StatusOr<DqnResult> TrainDqn(const std::vector<Transition>& transitions, const DqnOptions& options,
                             const DqnEpochCallback& on_epoch) {
  return model::TorchBoundary("TrainDqn", [&]() -> StatusOr<DqnResult> {
    return TrainDqnImpl(transitions, options, on_epoch);
  });
}

policy::dqn::Artifact MakeArtifact(const DqnResult& result, const DqnOptions& o,
                                   policy::dqn::PolicyMetadata m) {
  m.gamma = o.gamma;
  m.n_step = o.n_step;
  m.seed = o.seed;
  // Added beside the caller's own (a Dinkelbach trainer's rho, margins,
  // sampling): an assignment here dropped those from every policy.json.
  m.training_options.insert({{"hidden", o.hidden},
                             {"epochs", static_cast<double>(o.epochs)},
                             {"batch_size", static_cast<double>(o.batch_size)},
                             {"lr", o.lr},
                             {"huber_delta", o.huber_delta},
                             {"max_grad_norm", o.max_grad_norm},
                             {"target_update_polyak", o.target_update == TargetUpdate::kPolyak ? 1.0 : 0.0},
                             {"target_update_every", static_cast<double>(o.target_update_every)},
                             {"polyak_tau", o.polyak_tau},
                             {"heldout_fraction", o.heldout_fraction},
                             {"warm_start", o.initial_network != nullptr ? 1.0 : 0.0}});
  policy::dqn::TrainingDataInfo& d = m.training_data;
  d.n_transitions = result.n_transitions;
  d.n_episodes = result.n_episodes;
  d.n_requests = result.n_requests;
  d.n_train_transitions = result.n_train_transitions;
  d.n_heldout_transitions = result.n_heldout_transitions;
  d.n_train_episodes = result.n_train_episodes;
  d.n_heldout_episodes = result.n_heldout_episodes;
  d.behaviour_versions = result.behaviour_versions;
  m.offline_metrics = result.OfflineMetrics();
  m.offline_metrics["n_dropped_transitions"] = static_cast<double>(result.n_dropped);
  m.offline_metrics["n_duplicate_transitions"] = static_cast<double>(result.n_duplicates);
  return policy::dqn::Artifact{std::move(m), result.network};
}

}  // namespace lede::trainer
