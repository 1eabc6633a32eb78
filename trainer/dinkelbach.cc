#include "trainer/dinkelbach.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include "policy/controllers.h"
#include "policy/dqn/dqn_exit_controller.h"
#include "shared/status/status_macros.h"
#include "trainer/calibrated_rule.h"

namespace lede::trainer {

StatusOr<StaticChoice> BestStatic(const std::vector<ShadowTrace>& traces, int32_t max_draft_len,
                                  const model::cost::CostModel& cost, const std::vector<int32_t>& exit_layers) {
  if (traces.empty()) return InvalidArgumentError("traces: empty");
  StaticChoice best;
  const int32_t L = traces.front().n_layers;
  for (int32_t e = 1; e < L; ++e) {
    if (!exit_layers.empty() && std::find(exit_layers.begin(), exit_layers.end(), e) == exit_layers.end()) continue;
    for (int32_t d = 1; d <= max_draft_len; ++d) {
      SimulatedMethod m;
      m.mode = speculation::SpeculationMode::kStatic;
      m.exit_layer = e;
      m.draft_len = d;
      LEDE_ASSIGN_OR_RETURN(std::vector<speculation::RoundRecord> rounds, SimulatedRounds(traces, m));
      const double s = cost.PredictedSpeedup(rounds);
      if (s > best.speedup) best = StaticChoice{e, d, s};
    }
  }
  return best;
}

namespace {

using policy::EpsilonGreedyController;
using policy::StaticExitController;
using policy::ThresholdExitController;

// An ε-greedy wrapper that owns its behaviour controller.
class OwningExplorer : public speculation::ExitController {
 public:
  OwningExplorer(std::unique_ptr<speculation::ExitController> inner, double epsilon, uint64_t seed)
      : inner_(std::move(inner)), explore_(*inner_, epsilon, seed) {}
  std::string name() const override { return explore_.name(); }
  speculation::Action Decide(const speculation::ExitState& s) override { return explore_.Decide(s); }

 private:
  std::unique_ptr<speculation::ExitController> inner_;
  EpsilonGreedyController explore_;
};

// Follows pi and counts, per kind of decision (round start, phase 1, phase
// 2), how often `candidate` would have taken pi's action on pi's states.
class AgreementProbe : public speculation::ExitController {
 public:
  AgreementProbe(std::unique_ptr<speculation::ExitController> pi, std::unique_ptr<speculation::ExitController> candidate,
                 std::array<int64_t, 3>* decisions, std::array<int64_t, 3>* agreed)
      : pi_(std::move(pi)), candidate_(std::move(candidate)), decisions_(decisions), agreed_(agreed) {}
  std::string name() const override { return pi_->name(); }
  speculation::Action Decide(const speculation::ExitState& s) override {
    const speculation::Action a = pi_->Decide(s);
    const int kind = s.layer == 0 ? 0 : s.phase == speculation::Phase::kExitLayer ? 1 : 2;
    ++(*decisions_)[kind];
    if (candidate_->Decide(s) == a) ++(*agreed_)[kind];
    return a;
  }
  // Phase 1 starts where either would start it, so that the candidate is
  // also asked at the candidate layers pi skips (and pi answers there).
  int32_t FirstProbeLayer(const speculation::ExitState& round_start) override {
    return std::min(pi_->FirstProbeLayer(round_start), candidate_->FirstProbeLayer(round_start));
  }

 private:
  std::unique_ptr<speculation::ExitController> pi_, candidate_;
  std::array<int64_t, 3>* decisions_;
  std::array<int64_t, 3>* agreed_;
};

// The exploring behaviours of one iteration (see the header).
std::vector<ControllerMaker> Behaviours(const DinkelbachOptions& o, int32_t n_layers,
                                        std::shared_ptr<const policy::dqn::QNetwork> current, int32_t iteration) {
  std::vector<ControllerMaker> out;
  const double eps = o.behaviour_epsilon;
  const uint64_t base = o.seed * 1000003ULL + static_cast<uint64_t>(iteration) * 7919ULL;
  auto explorer = [eps, base](std::function<std::unique_ptr<speculation::ExitController>()> inner, uint64_t salt) {
    return [inner, eps, base, salt](int64_t i) -> std::unique_ptr<speculation::ExitController> {
      return std::make_unique<OwningExplorer>(inner(), eps, base + salt * 104729ULL + static_cast<uint64_t>(i));
    };
  };
  uint64_t salt = 1;
  for (float lambda : {0.3f, 0.5f, 0.7f, 0.9f}) {
    for (float tau : {0.3f, 0.5f, 0.7f, 0.9f}) {
      out.push_back(explorer([lambda, tau] { return std::make_unique<ThresholdExitController>(lambda, tau); },
                             salt++));
    }
  }
  for (int32_t e : o.spec.candidate_layers) {
    if (e >= n_layers) continue;
    for (int32_t d : {1, 2, 3, o.spec.max_draft_len}) {
      out.push_back(explorer([e, d] { return std::make_unique<StaticExitController>(e, d); }, salt++));
    }
  }
  // Uniform random actions (ε = 1) around any behaviour.
  out.push_back([base](int64_t i) -> std::unique_ptr<speculation::ExitController> {
    return std::make_unique<OwningExplorer>(std::make_unique<ThresholdExitController>(0.5f, 0.5f), 1.0,
                                            base + 99991ULL + static_cast<uint64_t>(i));
  });
  if (current) {
    for (double e : {0.05, 0.1, 0.2}) {
      out.push_back([current, e, base, salt](int64_t i) -> std::unique_ptr<speculation::ExitController> {
        return std::make_unique<OwningExplorer>(std::make_unique<policy::dqn::DqnExitController>(current, "current"),
                                                e, base + salt * 15485863ULL + static_cast<uint64_t>(i));
      });
      ++salt;
    }
  }
  return out;
}

// Replays a scripted prefix of a round's actions, then one forced action,
// then the policy's own (a rollout of Q^pi(s_k, a)). The prefix must meet
// the decision points of the round it came from: phase 1 starts where that
// round's started (`first_probe_layer`, the layer of its first phase-1
// decision; 0 when it made none, then the policy's own choice), not where
// the policy would start it. A policy that skips candidates
// (ExitController::FirstProbeLayer, e.g. the calibrated rule at E) would
// otherwise replay a behaviour's round from other decision points, force
// its actions on the wrong states, and leave the states below its start
// without targets that the policy's own actions there define.
class ForcedController : public speculation::ExitController {
 public:
  ForcedController(std::vector<speculation::Action> prefix, speculation::ExitController& policy, int32_t first_probe_layer)
      : prefix_(std::move(prefix)), policy_(policy), first_probe_layer_(first_probe_layer) {}
  std::string name() const override { return "forced:" + policy_.name(); }
  speculation::Action Decide(const speculation::ExitState& s) override {
    const speculation::Action own = policy_.Decide(s);  // keeps the policy's own state advancing
    own_.push_back(own);
    return index_ < prefix_.size() ? prefix_[index_++] : own;
  }
  // The policy's own choice at each decision so far.
  const std::vector<speculation::Action>& own() const { return own_; }
  int32_t FirstProbeLayer(const speculation::ExitState& s) override {
    const int32_t own = policy_.FirstProbeLayer(s);  // called for the policy's own state, as in its rounds
    return first_probe_layer_ > 0 ? first_probe_layer_ : own;
  }

 private:
  std::vector<speculation::Action> prefix_;
  speculation::ExitController& policy_;
  int32_t first_probe_layer_;
  size_t index_ = 0;
  std::vector<speculation::Action> own_;
};

// The layer of a round's first phase-1 decision (0 if it made none).
int32_t FirstPhaseOneLayer(const std::vector<speculation::Decision>& decisions) {
  for (const speculation::Decision& d : decisions) {
    if (d.state.phase == speculation::Phase::kExitLayer) return d.state.layer;
  }
  return 0;
}

}  // namespace

// Q^pi targets of every decision of every round that `sources` visit on
// `traces` (see DinkelbachOptions::rollout_targets), as terminal
// transitions: reward = the return of the rest of the round.
StatusOr<std::vector<experience::Transition>> RolloutTransitions(const std::vector<ShadowTrace>& traces,
                                                             const speculation::DecisionSpec& spec,
                                                             const ControllerMaker& policy,
                                                             const std::vector<ControllerMaker>& sources,
                                                             const experience::RewardSpec& rewards,
                                                             const std::string& fingerprint,
                                                             double conservative_margin) {
  std::vector<experience::Transition> out;
  for (size_t i = 0; i < traces.size(); ++i) {
    const ShadowTrace& trace = traces[i];
    for (size_t src = 0; src < sources.size(); ++src) {
      std::unique_ptr<speculation::ExitController> behaviour = sources[src](static_cast<int64_t>(i));
      SimulatedMethod m;
      m.mode = speculation::SpeculationMode::kAdaptive;
      m.controller = behaviour.get();
      m.spec = spec;
      LEDE_ASSIGN_OR_RETURN(speculation::GenerationResult sim, Simulate(trace, m, /*record_traces=*/true));
      const std::vector<RoundContext> contexts = RoundContexts(trace, sim);
      const std::string request_id = trace.id + "#" + std::to_string(src);
      for (size_t r = 0; r < sim.traces.size() && r < contexts.size(); ++r) {
        const auto& decisions = sim.traces[r].decisions;
        const int32_t first_probe_layer = FirstPhaseOneLayer(decisions);
        std::vector<speculation::Action> prefix;
        for (size_t k = 0; k < decisions.size(); ++k) {
          const size_t first = out.size();
          speculation::Action pi_action = speculation::Action::kContinue;  // pi's own choice at decision k
          for (speculation::Action a : {speculation::Action::kContinue, speculation::Action::kExit}) {
            std::vector<speculation::Action> forced = prefix;
            forced.push_back(a);
            std::unique_ptr<speculation::ExitController> pi = policy(static_cast<int64_t>(i));
            ForcedController ctl(std::move(forced), *pi, first_probe_layer);
            LEDE_ASSIGN_OR_RETURN(SimulatedRound round, SimulateRound(trace, spec, ctl, contexts[r]));
            if (round.trace.decisions.size() <= k) continue;  // the round ended before k (cannot happen)
            const speculation::ExitState& replayed = round.trace.decisions[k].state;
            if (replayed.phase != decisions[k].state.phase || replayed.layer != decisions[k].state.layer ||
                replayed.draft_pos != decisions[k].state.draft_pos) {
              return InternalError("rollout: the replay of round " + std::to_string(r) + " of " + trace.id +
                                   " met another decision point at decision " + std::to_string(k));
            }
            if (ctl.own().size() > k) pi_action = ctl.own()[k];
            std::vector<experience::Transition> ts =
                experience::ToTransitions(round.trace, rewards, request_id, behaviour->name(), fingerprint);
            double ret = 0;
            for (size_t j = k; j < ts.size(); ++j) ret += ts[j].reward;
            experience::Transition t = ts[k];
            t.reward = static_cast<float>(ret);
            t.done = true;
            t.next_state = {};
            t.round_index = contexts[r].round_index;
            t.decision_index = static_cast<int32_t>(2 * k + (a == speculation::Action::kExit ? 1 : 0));
            out.push_back(std::move(t));
          }
          // Both actions' returns share the state's future: centering them on
          // their mean removes the state's value from the regression targets
          // (the greedy policy depends only on their difference, which the
          // network then fits without the variance of the state value).
          if (out.size() == first + 2) {
            const float mean = 0.5f * (out[first].reward + out[first + 1].reward);
            out[first].reward -= mean;
            out[first + 1].reward -= mean;
            // Conservative improvement: pi's own action is preferred by the margin.
            const float half = static_cast<float>(0.5 * conservative_margin);
            for (size_t j = first; j < first + 2; ++j) out[j].reward += out[j].action == pi_action ? half : -half;
          }
          prefix.push_back(decisions[k].action);
        }
      }
    }
  }
  return out;
}

Status ValidateDinkelbachOptions(const DinkelbachOptions& o) {
  if (o.max_iterations < 1) return InvalidArgumentError("max_iterations: must be >= 1");
  if (!(o.behaviour_epsilon >= 0 && o.behaviour_epsilon <= 1)) {
    return InvalidArgumentError("behaviour_epsilon: outside [0, 1]");
  }
  if (!(o.conservative_margin >= 0 && o.conservative_margin < 1e3)) {
    return InvalidArgumentError("conservative_margin: must be in [0, 1000) tokens per round");
  }
  if (!(o.max_group_slowdown >= 0 && o.max_group_slowdown < 1)) {
    return InvalidArgumentError("max_group_slowdown: outside [0, 1)");
  }
  if (o.initial_policy != "static" && o.initial_policy != "calibrated") {
    return InvalidArgumentError("initial_policy: \"" + o.initial_policy + "\" is not static or calibrated");
  }
  if (o.initial_policy == "calibrated" && !o.rollout_targets) {
    return InvalidArgumentError("initial_policy: calibrated needs rollout targets");
  }
  for (size_t i = 0; i < o.loads.size(); ++i) {
    if (o.loads[i] < 1 || std::count(o.loads.begin(), o.loads.end(), o.loads[i]) > 1) {
      return InvalidArgumentError("loads: want distinct loads >= 1");
    }
  }
  if (!o.loads.empty() && !o.cost_at_load) return InvalidArgumentError("loads: given without cost_at_load");
  if (!o.loads.empty() && o.initial_policy != "static") {
    return InvalidArgumentError("loads: only with the static initial policy");
  }
  for (size_t i = 0; i < o.cost_profiles.size(); ++i) {
    const DinkelbachOptions::CostProfile& p = o.cost_profiles[i];
    if (p.cost == nullptr) return InvalidArgumentError("cost_profiles: \"" + p.name + "\" has no cost model");
    for (size_t j = 0; j < i; ++j) {
      if (o.cost_profiles[j].features == p.features) {
        return InvalidArgumentError("cost_profiles: \"" + o.cost_profiles[j].name + "\" and \"" + p.name +
                                    "\" have the same features (a policy could not tell them apart)");
      }
    }
  }
  if (!o.cost_profiles.empty() && !o.loads.empty()) {
    return InvalidArgumentError("cost_profiles: not with loads (train at one or the other)");
  }
  if (o.warm_start && o.initial_policy != "static") {
    return InvalidArgumentError("warm_start: only with the static initial policy");
  }
  if (o.warm_start && o.warm_start->hidden() != o.dqn.hidden) {
    return InvalidArgumentError("warm_start: hidden width " + std::to_string(o.warm_start->hidden()) +
                                ", the training's is " + std::to_string(o.dqn.hidden));
  }
  return ValidateDqnOptions(o.dqn);
}

namespace {

// Decodes autoregressively: declines to speculate at every round start.
class AutoregressiveController : public speculation::ExitController {
 public:
  std::string name() const override { return "autoregressive"; }
  speculation::Action Decide(const speculation::ExitState&) override { return speculation::Action::kContinue; }
};

// Which group of the training a state belongs to: its load and cost
// profile (each group replays every trace at one of them) and whether its
// request is sampled. Groups are keyed sampled only where
// DinkelbachOptions::rho_per_sampling split them; a sampled state of a
// group left whole finds it as the nearest key below its own.
struct GroupKey {
  int32_t load = 1;
  speculation::CostFeatures cost;
  bool sampled = false;
  bool operator<(const GroupKey& o) const {
    if (load != o.load) return load < o.load;
    if (!(cost == o.cost)) return cost < o.cost;
    return sampled < o.sampled;
  }
};
GroupKey KeyOf(const speculation::ExitState& s) { return GroupKey{s.load, s.cost, s.temperature > 0}; }

// pi_0 with several loads or cost profiles: the controller of the state's
// group (for a load between the trained ones, that of the load nearest
// below; the smallest for less).
class PerGroupController : public speculation::ExitController {
 public:
  explicit PerGroupController(std::map<GroupKey, std::unique_ptr<speculation::ExitController>> by_group)
      : by_group_(std::move(by_group)) {}
  std::string name() const override { return "per load or cost profile"; }
  speculation::Action Decide(const speculation::ExitState& s) override { return For(s).Decide(s); }
  int32_t FirstProbeLayer(const speculation::ExitState& s) override { return For(s).FirstProbeLayer(s); }

 private:
  speculation::ExitController& For(const speculation::ExitState& s) {
    auto it = by_group_.upper_bound(KeyOf(s));
    if (it != by_group_.begin()) --it;
    return *it->second;
  }
  std::map<GroupKey, std::unique_ptr<speculation::ExitController>> by_group_;
};

// One load or cost profile of the training: its traces, its price and its
// rho.
struct LoadGroup {
  int32_t load = 1;
  speculation::CostFeatures features;  // ShadowTrace::cost of its traces
  bool sampled = false;                // its traces are the sampled ones (DinkelbachOptions::rho_per_sampling)
  std::string name;                    // in reports: "B=<load>" or the profile's name (+ " greedy"/" sampled")
  GroupKey key() const { return GroupKey{load, features, sampled}; }
  const model::cost::CostModel* cost = nullptr;
  std::unique_ptr<model::cost::CostModel> owned;
  std::vector<ShadowTrace> train, selection;
  StaticChoice best_static;  // over every exit layer (reported)
  StaticChoice start;        // pi_0 at this load: at a candidate layer; exit_layer 0 = autoregressive
  bool start_warm = false;   // pi_0 at this load is DinkelbachOptions::warm_start's greedy policy
  double rho = 0;
};

// Whether the options name their groups (loads or cost profiles): then pi_0,
// the reports and the per-group speed-ups are per group, however many there
// are (one profile is a group too: DinkelbachIteration::load_rho has one
// entry).
bool Grouped(const DinkelbachOptions& o) {
  return !o.loads.empty() || !o.cost_profiles.empty() || o.rho_per_sampling;
}

std::vector<ShadowTrace> AtLoad(const std::vector<ShadowTrace>& traces, int32_t load) {
  std::vector<ShadowTrace> out = traces;
  for (ShadowTrace& t : out) t.load = load;
  return out;
}

std::vector<ShadowTrace> UnderProfile(const std::vector<ShadowTrace>& traces, const speculation::CostFeatures& f) {
  std::vector<ShadowTrace> out = traces;
  for (ShadowTrace& t : out) t.cost = f;
  return out;
}

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
}

std::string Describe(const StaticChoice& c) {
  if (c.exit_layer == 0) return "autoregressive";
  return "E=" + std::to_string(c.exit_layer) + " D=" + std::to_string(c.draft_len);
}

// Whether `traces` hold greedy and sampled ones.
bool HasBothKinds(const std::vector<ShadowTrace>& traces) {
  const auto sampled = [](const ShadowTrace& t) { return t.sampled(); };
  return std::any_of(traces.begin(), traces.end(), sampled) && !std::all_of(traces.begin(), traces.end(), sampled);
}

// Moves `traces` into their greedy ([0]) and sampled ([1]) ones, in order.
std::array<std::vector<ShadowTrace>, 2> ByKind(std::vector<ShadowTrace>&& traces) {
  std::array<std::vector<ShadowTrace>, 2> out;
  for (ShadowTrace& t : traces) out[t.sampled() ? 1 : 0].push_back(std::move(t));
  return out;
}

// DinkelbachOptions::rho_per_sampling: each group whose training and
// selection traces hold both kinds becomes a greedy and a sampled group;
// the others stay whole (GroupKey::sampled false: a state finds them by
// PerGroupController's nearest key below).
std::vector<LoadGroup> BySampling(std::vector<LoadGroup> groups) {
  std::vector<LoadGroup> out;
  for (LoadGroup& g : groups) {
    if (!HasBothKinds(g.train) || !HasBothKinds(g.selection)) {
      out.push_back(std::move(g));
      continue;
    }
    std::array<std::vector<ShadowTrace>, 2> train = ByKind(std::move(g.train));
    std::array<std::vector<ShadowTrace>, 2> selection = ByKind(std::move(g.selection));
    for (bool sampled : {false, true}) {
      LoadGroup k;
      k.load = g.load;
      k.features = g.features;
      k.sampled = sampled;
      k.name = g.name + (sampled ? " sampled" : " greedy");
      k.cost = g.cost;
      k.train = std::move(train[sampled]);
      k.selection = std::move(selection[sampled]);
      out.push_back(std::move(k));
    }
    // A load's cost model is owned by its group: the split groups share it.
    if (g.owned) out.back().owned = std::move(g.owned);
  }
  return out;
}

// The loads and their prices: one group at the traces' own load without
// options.loads.
StatusOr<std::vector<LoadGroup>> MakeLoadGroups(const std::vector<ShadowTrace>& train_traces,
                                                const std::vector<ShadowTrace>& selection_traces,
                                                const model::cost::CostModel& cost, const DinkelbachOptions& o) {
  std::vector<LoadGroup> groups;
  if (!o.cost_profiles.empty()) {
    for (const DinkelbachOptions::CostProfile& p : o.cost_profiles) {
      LoadGroup g;
      g.load = train_traces.front().load;
      g.features = p.features;
      g.name = p.name;
      g.cost = p.cost.get();
      g.train = UnderProfile(train_traces, p.features);
      g.selection = UnderProfile(selection_traces, p.features);
      groups.push_back(std::move(g));
    }
  } else if (o.loads.empty()) {
    LoadGroup g;
    g.load = train_traces.front().load;
    g.features = train_traces.front().cost;
    g.name = "B=" + std::to_string(g.load);
    g.cost = &cost;
    g.train = train_traces;
    g.selection = selection_traces;
    groups.push_back(std::move(g));
  } else {
    for (int32_t load : o.loads) {
      LoadGroup g;
      g.load = load;
      g.name = "B=" + std::to_string(load);
      LEDE_ASSIGN_OR_RETURN(g.owned, o.cost_at_load(load));
      g.cost = g.owned.get();
      g.train = AtLoad(train_traces, load);
      g.selection = AtLoad(selection_traces, load);
      groups.push_back(std::move(g));
    }
  }
  return o.rho_per_sampling ? BySampling(std::move(groups)) : std::move(groups);
}

// The best static setting over every exit layer (reported), and pi_0:
// the best one the policy can express, at a candidate exit layer (a
// static exit layer outside the candidates is no policy of the round's
// decisions: rolled out as one it never exits, and the iteration learned
// from autoregressive steps; measured: 1.07x on the training traces
// against 1.26x for static E=7, candidates 1-6). With loads, where no
// static setting beats autoregressive decoding at a load, pi_0 decodes
// autoregressively there. Returns pi_0's speed-up at each load.
StatusOr<std::vector<double>> ChooseStarts(const DinkelbachOptions& o, const std::vector<int32_t>& expressible,
                                           const ControllerMaker& warm_policy, std::vector<LoadGroup>* groups) {
  std::vector<double> start_speedups;
  for (LoadGroup& g : *groups) {
    LEDE_ASSIGN_OR_RETURN(g.best_static, BestStatic(g.train, o.spec.max_draft_len, *g.cost));
    LEDE_ASSIGN_OR_RETURN(g.start, BestStatic(g.train, o.spec.max_draft_len, *g.cost, expressible));
    if (Grouped(o) && g.start.speedup < 1.0) g.start = StaticChoice{0, 0, 1.0};
    double start = g.start.speedup;
    if (o.warm_start) {
      LEDE_ASSIGN_OR_RETURN(double s, SimulatedSpeedup(g.train, o.spec, warm_policy, *g.cost));
      g.start_warm = s > start;
      start = std::max(start, s);
    }
    start_speedups.push_back(start);
  }
  return start_speedups;
}

// pi_0: per load (or cost profile) a static setting, autoregressive
// decoding or the warm start; or (initial_policy "calibrated") the
// calibrated rule tuned under each group's prices, or the group's static
// start where that beats the rule.
struct InitialPolicy {
  std::map<GroupKey, std::shared_ptr<const CalibratedRule>> rules;
  std::map<GroupKey, StaticChoice> start_by_group;
  std::set<GroupKey> warm_groups;
  std::string description;
  std::vector<double> speedups;  // on the training traces, per group
  double train_speedup = 0;      // their mean
};

StatusOr<InitialPolicy> MakeInitialPolicy(const std::vector<LoadGroup>& groups, const DinkelbachOptions& o,
                                          std::vector<double> start_speedups) {
  InitialPolicy initial;
  for (const LoadGroup& g : groups) {
    initial.start_by_group[g.key()] = g.start;
    if (g.start_warm) initial.warm_groups.insert(g.key());
  }
  auto describe_start = [](const LoadGroup& g) { return g.start_warm ? std::string("warm start") : Describe(g.start); };
  const std::string per_group = o.cost_profiles.empty() ? "per load:" : "per cost profile:";
  const bool grouped = Grouped(o);
  initial.description = !grouped ? (groups[0].start_warm ? "" : "static ") + describe_start(groups[0]) : per_group;
  if (o.initial_policy == "calibrated") {
    initial.description = grouped ? per_group : "";
    start_speedups.clear();
    for (const LoadGroup& g : groups) {
      LEDE_ASSIGN_OR_RETURN(CalibratedRule tuned, TuneCalibratedRule(g.train, o.spec, *g.cost));
      // Where the group's static start (its best static setting, or with
      // several groups autoregressive decoding where none beats that) beats
      // the tuned rule, pi_0 is that start. Measured on sampled traces
      // (temperature 0.8, the 5x widening at q8_0's calibration): static
      // E=2 D=3 1.678x against the rule's 1.643x, and the iterates from the
      // rule stayed below static (1.654x).
      if (tuned.speedup < g.start.speedup) {
        start_speedups.push_back(g.start.speedup);
        initial.description += (grouped ? " " + g.name + " " : "static ") + Describe(g.start);
        continue;
      }
      start_speedups.push_back(tuned.speedup);
      initial.description += (grouped ? " " + g.name + " " : "") + tuned.Describe();
      initial.rules[g.key()] = std::make_shared<const CalibratedRule>(std::move(tuned));
    }
  } else if (grouped) {
    for (const LoadGroup& g : groups) initial.description += " " + g.name + " " + describe_start(g);
  }
  initial.train_speedup = Mean(start_speedups);
  initial.speedups = std::move(start_speedups);
  return initial;
}

// pi: the last adopted iterate's greedy policy (`current`), or pi_0.
ControllerMaker CurrentPolicy(std::shared_ptr<const policy::dqn::QNetwork> current, const InitialPolicy& initial,
                              const ControllerMaker& warm_policy, const speculation::DecisionSpec& spec) {
  return [current, start_by_group = initial.start_by_group, warm_groups = initial.warm_groups, warm_policy,
          rules = initial.rules, spec](int64_t i) -> std::unique_ptr<speculation::ExitController> {
    if (current) return std::make_unique<policy::dqn::DqnExitController>(current, "pi");
    std::map<GroupKey, std::unique_ptr<speculation::ExitController>> by_group;
    for (const auto& [key, rule] : rules) by_group[key] = rule->Make(spec);
    for (const auto& [key, c] : start_by_group) {
      if (by_group.count(key) > 0) continue;  // the group's calibrated rule
      if (warm_groups.count(key) > 0) {
        by_group[key] = warm_policy(i);
      } else if (c.exit_layer == 0) {
        by_group[key] = std::make_unique<AutoregressiveController>();
      } else {
        by_group[key] = std::make_unique<StaticExitController>(c.exit_layer, c.draft_len);
      }
    }
    if (by_group.size() == 1) return std::move(by_group.begin()->second);
    return std::make_unique<PerGroupController>(std::move(by_group));
  };
}

// The states the transitions come from: with rollout targets pi, ε-greedy
// variants of it and of threshold behaviours; otherwise the exploring
// behaviours. The same at every load.
std::vector<ControllerMaker> TransitionSources(const DinkelbachOptions& o, int32_t n_layers, const ControllerMaker& pi,
                                               std::shared_ptr<const policy::dqn::QNetwork> current,
                                               int32_t iteration) {
  if (!o.rollout_targets) return Behaviours(o, n_layers, std::move(current), iteration);
  std::vector<ControllerMaker> sources;
  const double eps = o.behaviour_epsilon;
  const uint64_t base = o.seed * 7777ULL + static_cast<uint64_t>(iteration) * 131ULL;
  sources.push_back(pi);
  for (double e : {0.5 * eps, eps}) {
    sources.push_back([pi, e, base](int64_t i) -> std::unique_ptr<speculation::ExitController> {
      return std::make_unique<OwningExplorer>(pi(i), e, base + static_cast<uint64_t>(i) * 31ULL +
                                                             static_cast<uint64_t>(e * 1000));
    });
  }
  for (auto [lambda, tau] : std::vector<std::pair<float, float>>{{0.3f, 0.3f}, {0.7f, 0.6f}, {0.9f, 0.9f}}) {
    sources.push_back([lambda, tau, eps, base](int64_t i) -> std::unique_ptr<speculation::ExitController> {
      return std::make_unique<OwningExplorer>(std::make_unique<ThresholdExitController>(lambda, tau), eps,
                                              base + 17ULL + static_cast<uint64_t>(i) * 37ULL);
    });
  }
  return sources;
}

// The transitions of one iteration, every load's in turn, each rewarded at
// its load's price and rho.
StatusOr<std::vector<experience::Transition>> CollectTransitions(const std::vector<LoadGroup>& groups,
                                                             const DinkelbachOptions& o, int32_t n_layers,
                                                             const ControllerMaker& pi,
                                                             const std::vector<ControllerMaker>& sources) {
  std::vector<experience::Transition> transitions;
  for (const LoadGroup& g : groups) {
    const experience::RewardSpec rewards = o.paper_rewards ? experience::RewardSpec::Paper(n_layers)
                                                       : DinkelbachRewards(*g.cost, n_layers, o.spec.max_draft_len, g.rho);
    std::vector<experience::Transition> ts;
    if (o.rollout_targets) {
      LEDE_ASSIGN_OR_RETURN(ts, RolloutTransitions(g.train, o.spec, pi, sources, rewards, o.model_fingerprint,
                                                   o.conservative_margin));
    } else {
      LEDE_ASSIGN_OR_RETURN(ts, CounterfactualTransitions(g.train, o.spec, sources, rewards, o.model_fingerprint));
    }
    if (transitions.empty()) {
      transitions = std::move(ts);  // one load (the usual case): no second copy
    } else {
      transitions.insert(transitions.end(), std::make_move_iterator(ts.begin()), std::make_move_iterator(ts.end()));
    }
  }
  return transitions;
}

// Agreement of the new greedy policy with pi on pi's own decisions, per
// kind (DinkelbachIteration::agreement).
StatusOr<std::array<double, 3>> Agreement(const std::vector<LoadGroup>& groups, const DinkelbachOptions& o,
                                          const ControllerMaker& pi, const ControllerMaker& greedy) {
  std::array<int64_t, 3> decisions{}, agreed{};
  auto probe = [&](int64_t i) -> std::unique_ptr<speculation::ExitController> {
    return std::make_unique<AgreementProbe>(pi(i), greedy(i), &decisions, &agreed);
  };
  for (const LoadGroup& g : groups) {
    LEDE_RETURN_IF_ERROR(SimulatedSpeedup(g.train, o.spec, probe, *g.cost).status());
  }
  std::array<double, 3> agreement{};
  for (int k = 0; k < 3; ++k) {
    agreement[k] = decisions[k] > 0 ? static_cast<double>(agreed[k]) / decisions[k] : 1.0;
  }
  return agreement;
}

// The greedy policy's speed-ups at every load into `rep` (means, and per
// load with options.loads); *train gets the training ones per load.
Status MeasureIterate(const std::vector<LoadGroup>& groups, const DinkelbachOptions& o, const ControllerMaker& greedy,
                      DinkelbachIteration* rep, std::vector<double>* train) {
  std::vector<double> rhos, selection;  // per load
  for (const LoadGroup& g : groups) {
    rhos.push_back(g.rho);
    LEDE_ASSIGN_OR_RETURN(double t, SimulatedSpeedup(g.train, o.spec, greedy, *g.cost));
    LEDE_ASSIGN_OR_RETURN(double s, SimulatedSpeedup(g.selection, o.spec, greedy, *g.cost));
    train->push_back(t);
    selection.push_back(s);
  }
  rep->rho = Mean(rhos);
  rep->train_speedup = Mean(*train);
  rep->selection_speedup = Mean(selection);
  if (Grouped(o)) {
    rep->load_rho = rhos, rep->load_train_speedup = *train, rep->load_selection_speedup = selection;
    for (const LoadGroup& g : groups) rep->group_names.push_back(g.name);
  }
  return OkStatus();
}

// The result around the selected iterate's training result.
DinkelbachResult MakeResult(DqnResult best, std::vector<DinkelbachIteration> iterations, int32_t selected,
                            const std::vector<LoadGroup>& groups, const DinkelbachOptions& o,
                            const InitialPolicy& initial) {
  DinkelbachResult out(std::move(best));
  out.iterations = std::move(iterations);
  out.selected_iteration = selected;
  out.best_static_train_speedup = groups[0].best_static.speedup;
  out.best_static = Describe(groups[0].best_static);
  if (Grouped(o)) {
    for (const LoadGroup& g : groups) {
      char speed[32];
      std::snprintf(speed, sizeof(speed), " %.3fx", g.best_static.speedup);
      out.load_best_static.push_back(g.name + ": " + Describe(g.best_static) + speed);
    }
  }
  out.initial_policy = initial.description;
  out.initial_train_speedup = initial.train_speedup;
  return out;
}

}  // namespace

bool AdoptsIterate(const std::vector<double>& iterate, const std::vector<double>& current,
                   double max_group_slowdown) {
  if (iterate.size() != current.size() || iterate.empty() || !(Mean(iterate) > Mean(current))) return false;
  for (size_t i = 0; i < iterate.size(); ++i) {
    if (iterate[i] < (1.0 - max_group_slowdown) * current[i]) return false;
  }
  return true;
}

StatusOr<DinkelbachResult> TrainDinkelbach(const std::vector<ShadowTrace>& train_traces,
                                           const std::vector<ShadowTrace>& selection_traces,
                                           const model::cost::CostModel& cost, const DinkelbachOptions& o,
                                           const DinkelbachCallback& on_iteration) {
  if (train_traces.empty()) return InvalidArgumentError("training traces: empty");
  if (selection_traces.empty()) return InvalidArgumentError("selection traces: empty");
  LEDE_RETURN_IF_ERROR(ValidateDinkelbachOptions(o));
  const int32_t L = train_traces.front().n_layers;
  std::vector<int32_t> expressible;
  for (int32_t l : o.spec.candidate_layers) {
    if (l >= 1 && l < L) expressible.push_back(l);
  }
  if (expressible.empty()) return InvalidArgumentError("spec.candidate_layers: no exit layer in [1, L)");
  LEDE_ASSIGN_OR_RETURN(std::vector<LoadGroup> groups, MakeLoadGroups(train_traces, selection_traces, cost, o));
  const std::shared_ptr<const policy::dqn::QNetwork> warm = o.warm_start;
  const ControllerMaker warm_policy = [warm](int64_t) -> std::unique_ptr<speculation::ExitController> {
    return std::make_unique<policy::dqn::DqnExitController>(warm, "warm start");
  };
  LEDE_ASSIGN_OR_RETURN(std::vector<double> start_speedups, ChooseStarts(o, expressible, warm_policy, &groups));
  LEDE_ASSIGN_OR_RETURN(const InitialPolicy initial, MakeInitialPolicy(groups, o, std::move(start_speedups)));
  std::vector<double> current_train = initial.speedups;  // pi's, per load (profile)
  for (size_t i = 0; i < groups.size(); ++i) groups[i].rho = o.initial_rho > 0 ? o.initial_rho : initial.speedups[i];

  std::shared_ptr<const policy::dqn::QNetwork> current;
  std::unique_ptr<DqnResult> best;
  std::vector<DinkelbachIteration> iterations;
  double best_selection = -1;
  bool best_adopted = false;
  int32_t selected = 0;
  for (int32_t it = 1; it <= o.max_iterations; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    const ControllerMaker pi = CurrentPolicy(current, initial, warm_policy, o.spec);
    const std::vector<ControllerMaker> sources = TransitionSources(o, L, pi, current, it);
    LEDE_ASSIGN_OR_RETURN(std::vector<experience::Transition> transitions, CollectTransitions(groups, o, L, pi, sources));
    DqnOptions dqn = o.dqn;
    dqn.initial_network = current ? current : warm;
    LEDE_ASSIGN_OR_RETURN(DqnResult r, TrainDqn(transitions, dqn));
    auto network = std::make_shared<const policy::dqn::QNetwork>(r.network);
    auto greedy = [network](int64_t) -> std::unique_ptr<speculation::ExitController> {
      return std::make_unique<policy::dqn::DqnExitController>(network, "candidate");
    };
    DinkelbachIteration rep;
    LEDE_ASSIGN_OR_RETURN(rep.agreement, Agreement(groups, o, pi, greedy));
    rep.iteration = it;
    rep.transitions = static_cast<int64_t>(transitions.size());
    std::vector<double> train;  // per load
    LEDE_RETURN_IF_ERROR(MeasureIterate(groups, o, greedy, &rep, &train));
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rep.adopted = AdoptsIterate(train, current_train, o.max_group_slowdown);
    rep.group_slowed = !rep.adopted && rep.train_speedup > Mean(current_train);
    iterations.push_back(rep);
    if (on_iteration) on_iteration(rep);
    // Adopted iterates compete on the selection traces; a rejected one only
    // while nothing was adopted (so that a result always exists).
    const bool better = rep.selection_speedup > best_selection;
    if (rep.adopted ? (!best_adopted || better) : (!best_adopted && better)) {
      best_selection = rep.selection_speedup;
      selected = it;
      best = std::make_unique<DqnResult>(std::move(r));
      best_adopted = rep.adopted;
    }
    if (!rep.adopted) continue;  // pi and rho stay; the next iteration explores with new seeds
    current = network;
    current_train = train;
    // rho settles before the policy does in the first iterations of policy
    // iteration (it starts from static), so at least three run.
    bool converged = it >= 3;
    for (size_t i = 0; i < groups.size(); ++i) {
      converged = converged && std::abs(train[i] - groups[i].rho) < o.rho_tolerance;
      groups[i].rho = train[i];
    }
    if (converged) break;
  }
  return MakeResult(std::move(*best), std::move(iterations), selected, groups, o, initial);
}

}  // namespace lede::trainer
