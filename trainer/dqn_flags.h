// File: trainer/dqn_flags.h
//
// The one group of DQN training flags (trainer/dqn.h DqnOptions) for every
// trainer binary: lede-train (n-step TD on logged transitions, plain and
// --once/--watch) and lede-train-counterfactual (DQN inside Dinkelbach
// iteration). Each flag is declared here once, with one help text and, for
// --lr, one default for every binary and mode.
//
//   scope kCore: --seed --epochs --hidden --batch-size --lr --threads
//   scope kTd:   kCore plus --gamma --n-step --huber-delta --max-grad-norm
//                --target-update --target-update-every --polyak-tau
//                --heldout-fraction (the TD update's own knobs)
//
// --lr defaults to 1e-3 (DqnOptions::lr): every shipped policy records
// training_options.lr = 0.001 in its policy.json (docs/training.md: the
// shipped policies come from lede-train-counterfactual), and retraining on
// served traffic fine-tunes with the same rate; a warm-started candidate
// that a higher rate spoils is refused by the publish gate (published only
// when it beats the serving policy on held-out data), not by a lower rate.
//
// Example:
//   lede::trainer::DqnFlags dqn(lede::trainer::DqnOptions{});
//   lede::flags::FlagSet f;
//   AddDqnFlags(f, &dqn, DqnFlagScope::kTd);
//   ... f.Parse(args) ...
//   DqnOptions o;
//   if (Status s = ApplyDqnFlags(dqn, DqnFlagScope::kTd, &o); !s.ok()) ...usage error, exit 2...
//
// Thread-safety: none needed (flag parsing happens once, in main).
#ifndef LEDE_TRAINER_DQN_FLAGS_H_
#define LEDE_TRAINER_DQN_FLAGS_H_

#include <cstdint>
#include <string>

#include "shared/flags/flags.h"
#include "shared/status/status.h"
#include "trainer/dqn.h"

namespace lede::trainer {

enum class DqnFlagScope {
  kCore,  // every DQN trainer
  kTd,    // kCore plus the n-step TD update's flags
};

// The flags' values, in the types FlagSet parses (int64_t, double, string).
struct DqnFlags {
  // Every value starts from `defaults` except lr, which is always
  // DqnOptions{}.lr (the one default; see the file comment).
  explicit DqnFlags(const DqnOptions& defaults);

  int64_t seed, epochs, hidden, batch_size, threads;
  double lr;
  // kTd only.
  double gamma, huber_delta, max_grad_norm, polyak_tau, heldout_fraction;
  int64_t n_step, target_update_every;
  std::string target_update;  // "hard" or "polyak"
};

// Declares the flags of `scope` on `flags`, each bound to its field of
// `values` (borrowed; must outlive the parse).
void AddDqnFlags(flags::FlagSet& flags, DqnFlags* values, DqnFlagScope scope);

// Writes the parsed values of `scope` into `options` (fields outside the
// scope are left as they are) and checks them with ValidateDqnOptions.
// Errors: kInvalidArgument naming the flag: "--target-update must be hard or
// polyak", "--lr must be > 0", "--threads must be >= 1", ... (a value out of
// range, or one too large for its field).
Status ApplyDqnFlags(const DqnFlags& values, DqnFlagScope scope, DqnOptions* options);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_DQN_FLAGS_H_
