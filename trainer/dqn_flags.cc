#include "trainer/dqn_flags.h"

#include <cctype>
#include <limits>
#include <utility>

namespace lede::trainer {
namespace {

constexpr char kLrHelp[] =
    "Adam learning rate, for every trainer and mode: 1e-3 is what every shipped policy was trained "
    "with (policy.json training_options.lr); retraining fine-tunes at the same rate because the "
    "publish gate, not a lower rate, keeps a worse candidate from serving";

// The field a flag fills, by the DqnOptions field name ValidateDqnOptions
// reports, so its errors can name the flag.
struct FlagName {
  const char* field;
  const char* flag;
};
constexpr FlagName kFlagNames[] = {
    {"n_step", "--n-step"},          {"epochs", "--epochs"},
    {"batch_size", "--batch-size"},  {"lr", "--lr"},
    {"huber_delta", "--huber-delta"}, {"max_grad_norm", "--max-grad-norm"},
    {"target_update_every", "--target-update-every"}, {"polyak_tau", "--polyak-tau"},
    {"heldout_fraction", "--heldout-fraction"}, {"num_threads", "--threads"},
    {"hidden", "--hidden"},          {"gamma", "--gamma"},
};

// "DqnOptions: lr must be > 0" -> "--lr must be > 0".
Status NameTheFlag(const Status& s) {
  const std::string message(s.message());
  for (const FlagName& n : kFlagNames) {
    const std::string field = n.field;
    const size_t at = message.find(field + " ");
    if (at == std::string::npos) continue;
    if (at > 0 && (message[at - 1] == '_' || std::isalnum(static_cast<unsigned char>(message[at - 1])))) continue;
    return InvalidArgumentError(n.flag + message.substr(at + field.size()));
  }
  return InvalidArgumentError(message);
}

Status ToInt32(const char* flag, int64_t value, int32_t* out) {
  if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
    return InvalidArgumentError(std::string(flag) + " is out of range: " + std::to_string(value));
  }
  *out = static_cast<int32_t>(value);
  return OkStatus();
}

}  // namespace

DqnFlags::DqnFlags(const DqnOptions& d)
    : seed(static_cast<int64_t>(d.seed)),
      epochs(d.epochs),
      hidden(d.hidden),
      batch_size(d.batch_size),
      threads(d.num_threads),
      lr(DqnOptions{}.lr),
      gamma(d.gamma),
      huber_delta(d.huber_delta),
      max_grad_norm(d.max_grad_norm),
      polyak_tau(d.polyak_tau),
      heldout_fraction(d.heldout_fraction),
      n_step(d.n_step),
      target_update_every(d.target_update_every),
      target_update(d.target_update == TargetUpdate::kPolyak ? "polyak" : "hard") {}

void AddDqnFlags(flags::FlagSet& f, DqnFlags* v, DqnFlagScope scope) {
  f.Add("seed", &v->seed, "training seed (splits, minibatches, initial weights)");
  f.Add("epochs", &v->epochs, "DQN passes over the training data (per Dinkelbach iteration where there are several)");
  f.Add("hidden", &v->hidden, "hidden width H of the Q-network");
  f.Add("batch-size", &v->batch_size, "transitions per DQN minibatch");
  f.Add("lr", &v->lr, kLrHelp);
  f.Add("threads", &v->threads,
        "CPU threads: libtorch's while training and, where the trainer runs the model (tracing), its kernels");
  if (scope != DqnFlagScope::kTd) return;
  f.Add("gamma", &v->gamma, "discount of the TD targets");
  f.Add("n-step", &v->n_step, "n of the n-step TD targets");
  f.Add("huber-delta", &v->huber_delta, "Huber loss threshold (reward units)");
  f.Add("max-grad-norm", &v->max_grad_norm, "global gradient-norm clip");
  f.Add("target-update", &v->target_update, "target network update: hard or polyak");
  f.Add("target-update-every", &v->target_update_every, "optimizer steps between hard target copies");
  f.Add("polyak-tau", &v->polyak_tau, "Polyak rate per step (--target-update polyak)");
  f.Add("heldout-fraction", &v->heldout_fraction, "share of episodes/requests held out");
}

Status ApplyDqnFlags(const DqnFlags& v, DqnFlagScope scope, DqnOptions* o) {
  DqnOptions out = *o;
  if (v.seed < 0) return InvalidArgumentError("--seed must be >= 0");
  out.seed = static_cast<uint64_t>(v.seed);
  out.epochs = v.epochs;
  if (Status s = ToInt32("--hidden", v.hidden, &out.hidden); !s.ok()) return s;
  out.batch_size = v.batch_size;
  out.lr = v.lr;
  if (Status s = ToInt32("--threads", v.threads, &out.num_threads); !s.ok()) return s;
  if (scope == DqnFlagScope::kTd) {
    if (v.target_update != "hard" && v.target_update != "polyak") {
      return InvalidArgumentError("--target-update must be hard or polyak, not '" + v.target_update + "'");
    }
    out.target_update = v.target_update == "polyak" ? TargetUpdate::kPolyak : TargetUpdate::kHard;
    out.gamma = v.gamma;
    if (Status s = ToInt32("--n-step", v.n_step, &out.n_step); !s.ok()) return s;
    out.huber_delta = v.huber_delta;
    out.max_grad_norm = v.max_grad_norm;
    out.target_update_every = v.target_update_every;
    out.polyak_tau = v.polyak_tau;
    out.heldout_fraction = v.heldout_fraction;
  }
  if (Status s = ValidateDqnOptions(out); !s.ok()) return NameTheFlag(s);
  *o = std::move(out);
  return OkStatus();
}

}  // namespace lede::trainer
