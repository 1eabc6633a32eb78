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
//   loss = CE_L + exit_scale * sum_{l in A(s)} CE_l / |A(s)|
// where CE_l is the next-token cross entropy of the exit at layer l and
// A(s) = { l in [1, L-1] : (l + s) mod curriculum_period == 0 } rotates the
// early exits that get a loss. The early exits are weighted equally (LayerSkip
// scales them up with depth; drafting needs the shallow exits most). Block l (0-based) is skipped with probability
// p_l = layer_dropout_max * l / (L - 1) for the whole batch (stochastic depth;
// the skipped block costs nothing).
//
// Thread-safety: single-threaded driver; libtorch parallelizes each op.
#ifndef LEDE_TRAINER_PRETRAIN_H_
#define LEDE_TRAINER_PRETRAIN_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "shared/model/model_config.h"
#include "shared/status/status.h"

namespace lede::trainer {

struct PretrainOptions {
  std::string data_dir;         // holds <domain>.{train,val}.txt
  std::string tokenizer;        // SentencePiece .model (copied into the output)
  std::string out_dir;          // final model (HF layout) + report.json
  std::string checkpoint_dir;   // resumable state; default <out_dir>/../<name>.ckpt
  // Mixture weights per domain (normalized); domains absent from data_dir are an error.
  std::map<std::string, double> mixture = {{"stories", 0.5}, {"tales", 0.15}, {"drama", 0.1}, {"code", 0.25}};
  model::ModelConfig config;    // vocab_size is taken from the tokenizer
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
  uint64_t seed = 1;
  int64_t checkpoint_every = 200;  // steps between resumable checkpoints
  int64_t eval_tokens = 16384;  // held-out tokens per domain in the final report
  int threads = 0;              // intra-op threads (0 = libtorch default)
  // Example: PretrainOptions o; o.data_dir = "out/corpus"; o.steps = 3000;
};

// Runs (or resumes) pretraining and writes the model to out_dir in Hugging
// Face layout with tokenizer.model and report.json (per-domain, per-layer
// held-out perplexity and top-1 agreement with the last layer, training time,
// options). Progress goes to stderr.
// Errors: kInvalidArgument for bad options or data; kNotFound for missing
// files; kInternal for libtorch failures.
Status Pretrain(const PretrainOptions& options);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_PRETRAIN_H_
