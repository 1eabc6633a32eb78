// lede-pretrain: LayerSkip-style pretraining of a Llama model with early exits.
// Parses flags, then calls lede::trainer::Pretrain (trainer/pretrain.h).
#include <cstdio>
#include <string>
#include <vector>

#include "shared/flags/flags.h"
#include "trainer/pretrain.h"

int main(int argc, char** argv) {
  lede::trainer::PretrainOptions o;
  o.config.dim = 192;
  o.config.hidden_dim = 512;
  o.config.n_layers = 12;
  o.config.n_heads = 6;
  o.config.n_kv_heads = 2;
  o.config.max_seq_len = 512;
  int64_t threads = 0, seed = 1;
  std::string mixture;
  lede::flags::FlagSet f;
  f.Add("data", &o.data_dir, "corpus directory from scripts/build_corpus.py", true);
  f.Add("tokenizer", &o.tokenizer, "SentencePiece tokenizer.model", true);
  f.Add("out", &o.out_dir, "output model directory (Hugging Face layout)", true);
  f.Add("checkpoint-dir", &o.checkpoint_dir, "resumable state (default: OUT.ckpt)");
  f.Add("dim", &o.config.dim, "model dimension d");
  f.Add("hidden-dim", &o.config.hidden_dim, "FFN dimension");
  f.Add("layers", &o.config.n_layers, "decoder layers L");
  f.Add("heads", &o.config.n_heads, "query heads");
  f.Add("kv-heads", &o.config.n_kv_heads, "key/value heads");
  f.Add("max-seq-len", &o.config.max_seq_len, "context window in tokens");
  f.Add("batch-size", &o.batch_size, "sequences per step");
  f.Add("seq-len", &o.seq_len, "tokens per training sequence");
  f.Add("steps", &o.steps, "optimizer steps");
  f.Add("lr", &o.lr, "peak learning rate");
  f.Add("warmup-steps", &o.warmup_steps, "linear warm-up steps");
  f.Add("weight-decay", &o.weight_decay, "AdamW weight decay (matrices only)");
  f.Add("layer-dropout", &o.layer_dropout_max, "layer dropout rate at the last layer");
  f.Add("exit-scale", &o.exit_scale, "weight of the early-exit losses");
  f.Add("curriculum-period", &o.curriculum_period, "rotational early-exit curriculum period");
  f.Add("exit-always", &o.exit_always, "early exits 1..N get the loss at every step");
  f.Add("exit-distill", &o.exit_distill, "weight in [0, 1] of self-distillation (last layer) in the early-exit loss");
  f.Add("init-from", &o.init_from, "start from this model's weights (continued pretraining; default: random init)");
  f.Add("mixture", &mixture, "domain mixture weights, e.g. stories=0.5,tales=0.15,drama=0.1,code=0.25");
  f.Add("checkpoint-every", &o.checkpoint_every, "steps between checkpoints");
  f.Add("seed", &seed, "random seed");
  f.Add("threads", &threads, "intra-op threads (0 = default)");
  lede::Status s = f.Parse(std::vector<std::string>(argv + 1, argv + argc));
  if (!s.ok()) {
    std::fprintf(stderr, "lede-pretrain: %s\nflags:\n%s", std::string(s.message()).c_str(), f.Usage().c_str());
    return 2;
  }
  if (!mixture.empty()) {
    lede::StatusOr<std::map<std::string, double>> parsed = lede::trainer::ParseMixture(mixture);
    if (!parsed.ok()) {
      std::fprintf(stderr, "lede-pretrain: --mixture: %s\n", std::string(parsed.status().message()).c_str());
      return 2;
    }
    o.mixture = *parsed;
  }
  o.seed = static_cast<uint64_t>(seed);
  o.threads = static_cast<int>(threads);
  s = lede::trainer::Pretrain(o);
  if (!s.ok()) {
    std::fprintf(stderr, "lede-pretrain: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
