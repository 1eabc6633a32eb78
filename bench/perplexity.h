// File: bench/perplexity.h
//
// Teacher-forced perplexity of a model's last layer over a token stream, on
// the path serving runs: the prompt-style cached forward pass of
// LlamaModel::Forward with a KvCache (the fused CPU kernels at the model's
// weight format, activation rounding included), so a quantized format is
// measured as users run it, not through the eager reference.
//
// Sliding window over the model's context (the convention of Hugging Face's
// "perplexity of fixed-length models"): windows of `window` positions start
// every `stride` tokens; each window is a fresh sequence (KV slot emptied),
// and scores only the tokens no earlier window scored, each predicted from at
// least window - stride tokens of context once the first window is past.
// Every token after the first is scored exactly once:
//
//   for begin = 0, stride, 2 stride, ...:
//     end = min(begin + window, N)
//     run stream[begin, end) through the model (chunks of `chunk` rows)
//     score targets i in [max(prev_end, begin + 1), end):
//       -log softmax(logits at i - 1)[stream[i]]
//     prev_end = end; stop when end == N
//
// NLL is summed in double precision; perplexity = exp(sum / tokens).
#ifndef LEDE_BENCH_PERPLEXITY_H_
#define LEDE_BENCH_PERPLEXITY_H_

#include <cstdint>
#include <vector>

#include "shared/model/llama.h"
#include "shared/status/status.h"

namespace lede::bench {

struct PerplexityOptions {
  int64_t window = 0;      // positions per window; 0 = the model's max_seq_len
  int64_t stride = 0;      // tokens between window starts; 0 = window / 2 (at least 1)
  int64_t chunk = 64;      // rows per forward call within a window (bounds logits memory: chunk x V floats)
  int64_t max_tokens = 0;  // score at most this many tokens (the stream's first max_tokens + 1); 0 = all
};

struct PerplexityResult {
  int64_t tokens = 0;    // targets scored: min(N, max_tokens + 1) - 1
  int64_t windows = 0;   // forward windows run
  int64_t positions = 0; // positions run through the model, summed over windows (cost: >= tokens + 1)
  double nll = 0.0;      // summed negative log-likelihood of the targets, nats
  double perplexity = 0.0;  // exp(nll / tokens)
  int64_t top1_correct = 0;  // targets that were the argmax of their logits
};

// Teacher-forced perplexity of `model`'s last layer over `stream` (token ids,
// typically BOS + document + EOS concatenated), windows as in the file
// comment. Runs on one KV slot of a private pool of `window` positions
// created here (float32); threads: the calling thread's decode threads
// (SetDecodeThreads).
// Errors (kInvalidArgument, naming the field): fewer than 2 tokens in the
// stream (after max_tokens), an id outside [0, vocab_size) (its index),
// window < 2 or above the model's max_seq_len ("window"), stride < 1 or
// > window - 1 ("stride": a window must predict at least one token from
// context it did not score), chunk < 1, max_tokens < 0; kInternal /
// kResourceExhausted from libtorch (the torch boundary).
// Thread-safety: as LlamaModel's const methods (one KV pool per call).
StatusOr<PerplexityResult> ComputePerplexity(const model::LlamaModel& model, const std::vector<int32_t>& stream,
                                             const PerplexityOptions& options);

}  // namespace lede::bench

#endif  // LEDE_BENCH_PERPLEXITY_H_
