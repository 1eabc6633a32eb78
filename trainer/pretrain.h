// File: trainer/pretrain.h
//
// LayerSkip-style pretraining of a Llama model with early exits
// (Elhoushi et al., "LayerSkip", arXiv 2404.16710, §3): layer dropout whose
// rate rises with depth, and an early-exit loss through the model's own final
// RMSNorm + LM head, with a rotational curriculum that keeps its cost down.
// The model is lede::model::LlamaModel itself, so the architecture has one
// source of truth for training and serving.
//
// Data: per-domain text files <domain>.train.txt / <domain>.val.txt in which
// documents are separated by a line "<|doc|>" (scripts/build_corpus.py). Each
// document is encoded as BOS + ids + EOS and the documents are concatenated
// into one token stream per domain; batches are windows of T+1 tokens drawn
// from the domains with the given mixture weights.
//
// Loss at step s (tokens [B, T], targets shifted by one):
//   loss = CE_L + exit_scale * sum_{l in A(s)} E_l / |A(s)|
//   E_l  = (1 - exit_distill) * CE_l + exit_distill * SCE(p_L, p_l)
// where CE_l is the next-token cross entropy of the exit at layer l, and
// SCE(p_L, p_l) = -sum_v p_L(v) log p_l(v) the cross entropy of the exit
// against the last layer's distribution p_L (detached: a self-distillation
// target, as in the draft heads of Kangaroo / EAGLE; it trains the exit
// toward what verification accepts, top-1 agreement with the last layer).
// A(s) = { l in [1, L-1] : (l + s) mod curriculum_period == 0 or l <= exit_always }
// rotates the early exits that get a loss; the exits up to exit_always (the
// cheap drafting layers) get it at every step. The early exits are weighted
// equally (LayerSkip scales them up with depth; drafting needs the shallow
// exits most). Block l (0-based) is skipped with probability
// p_l = layer_dropout_max * l / (L - 1) for the whole batch (stochastic depth;
// the skipped block costs nothing).
//
// Continued pretraining: with init_from, a run without a checkpoint starts
// from that model's weights (its architecture; a fresh optimizer and
// schedule) instead of a random initialization.
//
// Thread-safety: single-threaded driver; libtorch parallelizes each op.
#ifndef LEDE_TRAINER_PRETRAIN_H_
#define LEDE_TRAINER_PRETRAIN_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "shared/checkpoint/model_config.h"
#include "shared/status/status.h"

namespace lede::trainer {

struct PretrainOptions {
  std::string data_dir;         // holds <domain>.{train,val}.txt
  std::string tokenizer;        // SentencePiece .model (copied into the output)
  std::string out_dir;          // final model (HF layout) + report.json
  std::string checkpoint_dir;   // resumable state; default <out_dir>/../<name>.ckpt
  // Mixture weights per domain (normalized); domains absent from data_dir are an error.
  std::map<std::string, double> mixture = {{"stories", 0.5}, {"tales", 0.15}, {"drama", 0.1}, {"code", 0.25}};
  checkpoint::ModelConfig config;    // vocab_size is taken from the tokenizer; ignored with init_from or a checkpoint
  std::string init_from;        // model directory to start from (continued pretraining); empty: random
  int64_t batch_size = 16;      // B sequences per step
  int64_t seq_len = 256;        // T tokens per sequence
  int64_t steps = 2000;         // optimizer steps in the whole run
  double lr = 2e-3;             // peak learning rate (AdamW)
  double min_lr_ratio = 0.1;    // cosine decays to lr * min_lr_ratio
  int64_t warmup_steps = 100;   // linear warm-up
  double weight_decay = 0.1;
  double grad_clip = 1.0;       // global L2 norm
  double layer_dropout_max = 0.1;  // p at the last layer, 0 at the first
  double exit_scale = 1.0;      // weight of the early-exit losses
  int64_t curriculum_period = 3;   // every period-th early layer is active per step
  int64_t exit_always = 0;      // early exits 1..exit_always get the loss at every step
  double exit_distill = 0.0;    // in [0, 1]: weight of self-distillation in the early-exit loss
  uint64_t seed = 1;
  int64_t checkpoint_every = 200;  // steps between resumable checkpoints
  int64_t eval_tokens = 16384;  // held-out tokens per domain in the final report
  int threads = 0;              // intra-op threads (0 = libtorch default)
  // Example: PretrainOptions o; o.data_dir = "out/corpus"; o.steps = 3000;
};

// Parses a domain mixture "name=weight,name=weight" (weights >= 0, at least
// one > 0), e.g. "stories=0.7,code=0.15,tales=0.1,drama=0.05".
// Errors: kInvalidArgument naming the bad entry.
StatusOr<std::map<std::string, double>> ParseMixture(const std::string& text);

// Runs (or resumes) pretraining and writes the model to out_dir in Hugging
// Face layout with tokenizer.model and report.json (per-domain, per-layer
// held-out perplexity and top-1 agreement with the last layer, training time,
// options). Progress goes to stderr.
// Errors: kInvalidArgument for bad options or data; kNotFound for missing
// files; kInternal for libtorch failures.
Status Pretrain(const PretrainOptions& options);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_PRETRAIN_H_
