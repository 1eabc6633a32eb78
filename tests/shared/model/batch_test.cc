// Tests of the batched verification step (shared/model/batch.h):
// a batch that mixes verification rounds of different exit layers and draft
// lengths (with and without the drafter's ready row), autoregressive steps
// and prefill chunks of different lengths, with sessions arriving at
// different iterations, gives every sequence exactly its solo results
// (greedy ids identical, logits within 1e-4), on lede-tiny and a random GQA
// model; seeded sampling gives the same tokens batched or solo; bad items
// fail alone. Batched drafting (RunDrafterBatch): sessions at different
// phases, exit layers and rows draft in one pass with their solo logits
// (bitwise on the fused path), drafts, K/V and scratch rows.
#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "gtest/gtest.h"
#include "shared/model/batch.h"
#include "shared/model/cpu/cpu_kernels.h"
#include "shared/model/decoding.h"
#include "shared/model/kv_cache.h"
#include "shared/model/llama.h"
#include "shared/model/sampling.h"
#include "tests/shared/model/model_fixtures.h"
#include "tests/testing/status_matchers.h"

namespace lede::model {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;

constexpr float kLogitTolerance = 1e-4f;  // batched and solo logits within 1e-4 (fp32)
constexpr char kLedeTinyDir[] = "models/lede-tiny";

struct Pools {
  std::unique_ptr<KvCache> solo, batch;
};

Pools MakePools(const LlamaModel& m, int64_t n_slots, int64_t max_draft_len) {
  KvCacheOptions o;
  o.n_slots = n_slots;
  o.max_draft_len = max_draft_len;
  auto a = KvCache::Create(m.config(), o);
  auto b = KvCache::Create(m.config(), o);
  EXPECT_THAT(a, IsOk());
  EXPECT_THAT(b, IsOk());
  return {std::make_unique<KvCache>(std::move(*a)), std::make_unique<KvCache>(std::move(*b))};
}

// One sequence of the property test.
struct Seq {
  int64_t slot = 0;
  int64_t arrival = 0;     // iteration of its first prefill chunk
  int64_t chunk = 0;       // prefill chunk length of the batched side
  std::vector<int32_t> prompt;
  speculation::SessionOptions options;
  int64_t prefilled = 0;   // prompt positions the batched side has run
  bool open = false;       // prefill done on both sides
  int32_t pending = 0;
  std::vector<int32_t> out_solo, out_batch;
};

// A round's shape: K drafts at exit layer E, with or without the ready row
// (K == 0 and ready: a full-depth step resumed at E; K == 0 and not ready:
// a plain step).
struct Shape {
  int64_t exit_layer = 0, k = 0;
  bool ready = false;
};

Shape RandomShape(std::mt19937& rng, int64_t L, int64_t max_k) {
  Shape s;
  switch (rng() % 4) {
    case 0:
      return s;  // autoregressive step
    case 1:
      s.exit_layer = 1 + rng() % L;  // resumed full-depth step (ready_layer = E)
      s.ready = true;
      return s;
    default:
      s.exit_layer = 1 + rng() % L;
      s.k = 1 + rng() % max_k;
      s.ready = rng() % 2 == 0 && s.k < max_k;
      return s;
  }
}

// Drafts a round on one pool (the drafter's work, identical on both
// pools): K greedy drafts at E, plus the ready row when asked. Returns the
// Draft the verifier gets.
speculation::Draft DraftOn(const LlamaModel& m, KvCache& cache, int64_t slot, int32_t pending, const Shape& s) {
  Drafter drafter(m, cache);
  speculation::Draft d;
  if (s.k == 0 && !s.ready) return d;
  if (s.k == 0) {  // the pending token through [0, E) into scratch row 0
    auto l = drafter.DraftStep(slot, 0, pending, s.exit_layer);
    EXPECT_THAT(l, IsOk());
    d.ready_layer = static_cast<int32_t>(s.exit_layer);
    return d;
  }
  d.exit_layer = static_cast<int32_t>(s.exit_layer);
  int32_t token = pending;
  for (int64_t i = 0; i < s.k; ++i) {
    auto l = drafter.DraftStep(slot, i, token, s.exit_layer);
    EXPECT_THAT(l, IsOk());
    token = static_cast<int32_t>(l->argmax().item<int64_t>());
    d.tokens.push_back(token);
  }
  if (s.ready) {
    EXPECT_THAT(drafter.DraftStep(slot, s.k, token, s.exit_layer), IsOk());
    d.ready_layer = d.exit_layer;
  }
  return d;
}

void ExpectLogitsNear(const at::Tensor& solo, const at::Tensor& batch, const char* what) {
  ASSERT_TRUE(solo.defined() && batch.defined()) << what;
  ASSERT_EQ(solo.sizes(), batch.sizes()) << what;
  const float diff = (solo - batch).abs().max().item<float>();
  EXPECT_LE(diff, kLogitTolerance) << what;
  EXPECT_TRUE(at::equal(solo.argmax(-1), batch.argmax(-1))) << what;
}

// Runs `seqs` to `n_rounds` rounds each: the solo side through the Verifier
// methods one sequence at a time, the batched side through one
// RunVerifierBatch per iteration over every sequence that is ready (prefill
// chunks of its own length after its arrival, then one round per
// iteration). Checks the logits of every prefill, step and verification and
// the greedy tokens.
void RunLogitsProperty(const LlamaModel& m, std::vector<Seq> seqs, int64_t n_rounds, int64_t max_k,
                       uint32_t seed) {
  c10::InferenceMode guard;
  const int64_t L = m.n_layers();
  Pools pools = MakePools(m, static_cast<int64_t>(seqs.size()) + 1, max_k);
  std::mt19937 rng(seed);
  Verifier solo(m, *pools.solo);
  std::vector<int64_t> rounds(seqs.size(), 0);
  int64_t max_batch_seen = 0;
  for (int64_t iter = 0; iter < 200; ++iter) {
    std::vector<VerifierWork> work;
    std::vector<size_t> who;
    std::vector<at::Tensor> solo_logits;
    std::vector<speculation::Draft> drafts;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& q = seqs[i];
      if (iter < q.arrival || rounds[i] >= n_rounds) continue;
      VerifierWork w;
      w.slot = q.slot;
      speculation::Draft d;
      if (!q.open) {  // the next prefill chunk; the solo side prefills in one call at the end
        const int64_t P = static_cast<int64_t>(q.prompt.size());
        const int64_t len = std::min(q.chunk, P - q.prefilled);
        w.kind = VerifierWork::Kind::kPrefillChunk;
        w.tokens.assign(q.prompt.begin() + q.prefilled, q.prompt.begin() + q.prefilled + len);
        w.start_pos = q.prefilled;
        w.want_logits = q.prefilled + len == P;
        q.prefilled += len;
        auto l = w.want_logits ? solo.Prefill(q.slot, q.prompt) : StatusOr<at::Tensor>(at::Tensor());
        ASSERT_THAT(l, IsOk());
        solo_logits.push_back(*l);
      } else {
        const Shape s = RandomShape(rng, L, max_k);
        d = DraftOn(m, *pools.solo, q.slot, q.pending, s);
        EXPECT_EQ(DraftOn(m, *pools.batch, q.slot, q.pending, s).tokens, d.tokens);
        if (s.k == 0 && !s.ready) {
          w.kind = VerifierWork::Kind::kStep;
          w.tokens = {q.pending};
          auto l = solo.Step(q.slot, q.pending);
          ASSERT_THAT(l, IsOk());
          solo_logits.push_back(*l);
        } else {
          w.kind = VerifierWork::Kind::kVerify;
          w.tokens = d.tokens;
          w.exit_layer = s.exit_layer;
          w.last_row_ready = s.ready;
          auto l = solo.Verify(q.slot, s.exit_layer, d.tokens, s.ready);
          ASSERT_THAT(l, IsOk());
          solo_logits.push_back(*l);
        }
      }
      work.push_back(std::move(w));
      drafts.push_back(std::move(d));
      who.push_back(i);
    }
    if (work.empty()) break;
    max_batch_seen = std::max<int64_t>(max_batch_seen, static_cast<int64_t>(work.size()));
    // Arrival order differs from slot order: run the batch in a shuffled order.
    std::vector<size_t> order(work.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<VerifierWork> shuffled;
    for (size_t k : order) shuffled.push_back(work[k]);
    std::vector<StatusOr<at::Tensor>> got = RunVerifierBatch(m, *pools.batch, shuffled);
    for (size_t j = 0; j < order.size(); ++j) {
      const size_t k = order[j];
      Seq& q = seqs[who[k]];
      ASSERT_THAT(got[j], IsOk());
      const VerifierWork& w = work[k];
      if (w.kind == VerifierWork::Kind::kPrefillChunk) {
        if (!w.want_logits) {
          EXPECT_FALSE(got[j]->defined());
          continue;
        }
        ExpectLogitsNear(solo_logits[k], *got[j], "prefill");
        q.pending = static_cast<int32_t>(solo_logits[k].argmax().item<int64_t>());
        q.open = true;
      } else if (w.kind == VerifierWork::Kind::kStep) {
        ExpectLogitsNear(solo_logits[k], *got[j], "step");
        q.out_solo.push_back(q.pending);
        q.out_batch.push_back(q.pending);
        q.pending = static_cast<int32_t>(solo_logits[k].argmax().item<int64_t>());
        ++rounds[who[k]];
      } else {
        ExpectLogitsNear(solo_logits[k], *got[j], "verify");
        AcceptResult a = AcceptGreedy(drafts[k].tokens, solo_logits[k]);
        AcceptResult b = AcceptGreedy(drafts[k].tokens, *got[j]);
        EXPECT_EQ(a.n_accepted, b.n_accepted);
        EXPECT_EQ(a.next_token, b.next_token);
        ASSERT_THAT(solo.Accept(q.slot, a.n_accepted), IsOk());
        ASSERT_THAT(pools.batch->Commit(q.slot, pools.batch->length(q.slot) + b.n_accepted + 1), IsOk());
        q.pending = a.next_token;
        ++rounds[who[k]];
      }
      EXPECT_EQ(pools.solo->length(q.slot), pools.batch->length(q.slot));
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(rounds[i], n_rounds) << "sequence " << i;
  EXPECT_GE(max_batch_seen, static_cast<int64_t>(seqs.size()) - 1);  // they did run together
}

std::vector<Seq> MakeSeqs(int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  // Prompt lengths from 1 to past the sgemm threshold, chunks from 1 to
  // whole-prompt, arrivals staggered, slots not in arrival order.
  const int64_t lengths[] = {1, 5, 23, 40, 13, 8};
  const int64_t chunks[] = {64, 2, 7, 64, 4, 3};
  const int64_t arrivals[] = {0, 0, 1, 3, 2, 5};
  const int64_t slots[] = {3, 0, 5, 1, 4, 2};
  std::vector<Seq> seqs;
  for (int i = 0; i < 6; ++i) {
    Seq q;
    q.slot = slots[i];
    q.arrival = arrivals[i];
    q.chunk = chunks[i];
    for (int64_t t = 0; t < lengths[i]; ++t) q.prompt.push_back(static_cast<int32_t>(1 + rng() % (vocab - 1)));
    seqs.push_back(std::move(q));
  }
  return seqs;
}

checkpoint::ModelConfig RandomGqaConfig() {
  checkpoint::ModelConfig c = testing::TinyConfig();
  c.dim = 48;
  c.hidden_dim = 100;
  c.n_layers = 5;
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.vocab_size = 61;
  c.max_seq_len = 320;
  return c;
}

// lede-tiny: every sequence's prefill, steps and verifications in a mixed
// batch have their solo logits (1e-4) and greedy ids.
TEST(BatchTest, MixedBatchMatchesSoloOnLedeTiny) {
  std::unique_ptr<LlamaModel> m = testing::LoadOrDie(kLedeTinyDir);
  ASSERT_NE(m, nullptr);
  RunLogitsProperty(*m, MakeSeqs(m->config().vocab_size, 1), /*n_rounds=*/8, /*max_k=*/6, 11);
}

// The same on a random GQA model (5 layers, 6/2 heads), longer drafts.
TEST(BatchTest, MixedBatchMatchesSoloOnRandomGqa) {
  auto m = LlamaModel::RandomInit(RandomGqaConfig(), 3, ModelOptions{}, 0.3);
  ASSERT_THAT(m, IsOk());
  RunLogitsProperty(**m, MakeSeqs(61, 2), /*n_rounds=*/12, /*max_k=*/14, 12);
}

// The eager reference path batches to the same logits too.
TEST(BatchTest, MixedBatchMatchesSoloOnEagerKernels) {
  ModelOptions eager;
  eager.kernels = Kernels::kEager;
  auto m = LlamaModel::RandomInit(RandomGqaConfig(), 4, eager, 0.3);
  ASSERT_THAT(m, IsOk());
  RunLogitsProperty(**m, MakeSeqs(61, 3), /*n_rounds=*/5, /*max_k=*/5, 13);
}

// Round granularity (RunBatch vs PrefillSession / VerifyRound): greedy and
// seeded-sampling sessions in one batch emit exactly their solo tokens, with
// the same nll records.
void RunRoundProperty(const LlamaModel& m, double temperature, uint32_t seed) {
  c10::InferenceMode guard;
  const int64_t L = m.n_layers(), max_k = 5;
  std::vector<Seq> seqs = MakeSeqs(m.config().vocab_size, seed);
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].options.sampling.temperature = i % 2 == 0 ? temperature : 0.0;
    seqs[i].options.sampling.top_p = 0.9;
    seqs[i].options.sampling.seed = 100 + i;
    seqs[i].options.record_nll = true;
  }
  Pools pools = MakePools(m, static_cast<int64_t>(seqs.size()), max_k);
  Verifier solo(m, *pools.solo);
  std::mt19937 rng(seed);
  std::vector<int64_t> rounds(seqs.size(), 0);
  const int64_t n_rounds = 10;
  for (int64_t iter = 0; iter < 200; ++iter) {
    std::vector<BatchItem> items;
    std::vector<size_t> who;
    std::vector<speculation::Verdict> solo_verdicts;
    std::vector<int32_t> solo_first;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& q = seqs[i];
      if (iter < q.arrival || rounds[i] >= n_rounds) continue;
      BatchItem it;
      it.slot = q.slot;
      it.options = q.options;
      if (!q.open) {
        const int64_t P = static_cast<int64_t>(q.prompt.size());
        it.kind = BatchItem::Kind::kPrefill;
        it.prompt = &q.prompt;
        it.chunk_start = q.prefilled;
        it.chunk_len = std::min(q.chunk, P - q.prefilled);
        q.prefilled += it.chunk_len;
        int32_t first = -1;
        if (q.prefilled == P) {
          auto p = PrefillSession(solo, q.slot, q.prompt, q.options);
          ASSERT_THAT(p, IsOk());
          first = p->token;
        }
        solo_first.push_back(first);
        solo_verdicts.emplace_back();
      } else {
        const Shape s = RandomShape(rng, L, max_k);
        // Sampling needs the draft distributions: greedy drafts with their
        // softmax as q (any valid q keeps the rule exact).
        speculation::Draft d = DraftOn(m, *pools.solo, q.slot, q.pending, s);
        DraftOn(m, *pools.batch, q.slot, q.pending, s);
        at::Tensor probs;
        if (!d.tokens.empty()) {
          probs = at::full({static_cast<int64_t>(d.tokens.size()), m.config().vocab_size},
                           1.0 / m.config().vocab_size, at::TensorOptions().dtype(at::kFloat));
        }
        auto v = VerifyRound(solo, *pools.solo, q.slot, q.pending, d, probs, q.options);
        ASSERT_THAT(v, IsOk());
        solo_verdicts.push_back(*v);
        solo_first.push_back(-1);
        it.kind = BatchItem::Kind::kRound;
        it.pending_token = q.pending;
        it.draft = d;
        it.draft_probs = probs;
      }
      items.push_back(std::move(it));
      who.push_back(i);
    }
    if (items.empty()) break;
    std::vector<BatchResult> got = RunBatch(m, *pools.batch, items);
    for (size_t k = 0; k < items.size(); ++k) {
      Seq& q = seqs[who[k]];
      ASSERT_THAT(got[k].status, IsOk());
      if (items[k].kind == BatchItem::Kind::kPrefill) {
        EXPECT_EQ(got[k].prefilled, solo_first[k] >= 0);
        if (!got[k].prefilled) continue;
        EXPECT_EQ(got[k].first.token, solo_first[k]);
        q.pending = solo_first[k];
        q.open = true;
        continue;
      }
      const speculation::Verdict& a = solo_verdicts[k];
      const speculation::Verdict& b = got[k].verdict;
      EXPECT_EQ(a.tokens, b.tokens) << "sequence " << who[k] << " round " << rounds[who[k]];
      EXPECT_EQ(a.n_accepted, b.n_accepted);
      ASSERT_EQ(a.nll.size(), b.nll.size());
      for (size_t t = 0; t < a.nll.size(); ++t) EXPECT_NEAR(a.nll[t], b.nll[t], 1e-4);
      EXPECT_EQ(pools.solo->length(q.slot), pools.batch->length(q.slot));
      q.out_solo.insert(q.out_solo.end(), a.tokens.begin(), a.tokens.end());
      q.pending = a.tokens.back();
      ++rounds[who[k]];
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(rounds[i], n_rounds);
    EXPECT_GE(seqs[i].out_solo.size(), static_cast<size_t>(n_rounds));
  }
}

// Greedy sessions: identical tokens batched or solo (lede-tiny).
TEST(BatchTest, RoundsMatchSoloGreedyOnLedeTiny) {
  std::unique_ptr<LlamaModel> m = testing::LoadOrDie(kLedeTinyDir);
  ASSERT_NE(m, nullptr);
  RunRoundProperty(*m, 0.0, 21);
}

// Seeded sampling (half the sessions at temperature 0.9, half greedy):
// identical tokens batched or solo (lede-tiny and the random GQA model).
TEST(BatchTest, SeededSamplingMatchesSolo) {
  std::unique_ptr<LlamaModel> m = testing::LoadOrDie(kLedeTinyDir);
  ASSERT_NE(m, nullptr);
  RunRoundProperty(*m, 0.9, 22);
  auto r = LlamaModel::RandomInit(RandomGqaConfig(), 5, ModelOptions{}, 0.3);
  ASSERT_THAT(r, IsOk());
  RunRoundProperty(**r, 0.9, 23);
}

// The row kernel computes every row as it computes that row alone (bitwise),
// for any number of rows and any column split at multiples of 4: what makes
// a session's batched results its solo ones.
TEST(BatchTest, RowKernelRowsDoNotDependOnTheOtherRows) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t out : {4, 7, 33}) {
    for (int64_t in : {5, 8, 19, 64}) {
      for (int64_t n : {1, 2, 3, 4, 5, 7, 12}) {  // every mix of the kernel's 3-, 2- and 1-row groups
        std::vector<float> w(out * in), x(n * in), y(n * out), y1(out), yc(n * out);
        for (float& v : w) v = normal(rng);
        for (float& v : x) v = normal(rng);
        cpu::MatMulRows(x.data(), n, in, w.data(), out, y.data(), false);
        const int64_t split = (out / 2) / 4 * 4;  // two column parts at a multiple of 4
        cpu::MatMulRowsStrided(x.data(), n, in, w.data(), split, yc.data(), out, false);
        cpu::MatMulRowsStrided(x.data(), n, in, w.data() + split * in, out - split, yc.data() + split, out, false);
        for (int64_t r = 0; r < n; ++r) {
          cpu::MatMulRows(x.data() + r * in, 1, in, w.data(), out, y1.data(), false);
          for (int64_t o = 0; o < out; ++o) {
            EXPECT_EQ(y[r * out + o], y1[o]) << out << "x" << in << " n=" << n << " row " << r;
            EXPECT_EQ(yc[r * out + o], y1[o]) << out << "x" << in << " n=" << n << " row " << r << " split";
          }
        }
      }
    }
  }
}

// Two kernel threads (SetFusedThreads: row-kernel products split by output
// columns, attention by rows) give bitwise the logits of one thread for
// segments of the row kernel (<= 12 rows); a longer prefill chunk goes
// through OpenBLAS sgemm, whose own threading changes the rounding, within
// the 1e-4 tolerance.
TEST(BatchTest, KernelThreadsDoNotChangeResults) {
  std::unique_ptr<LlamaModel> m = testing::LoadOrDie(kLedeTinyDir);
  ASSERT_NE(m, nullptr);
  c10::InferenceMode guard;
  auto run = [&](int threads) {
    const int before = at::get_num_threads();
    at::set_num_threads(threads);
    SetFusedThreads(threads);
    // The threads really run (a build without OpenMP ran them serially).
    EXPECT_EQ(FusedThreadsInUse(), threads);
    Pools pools = MakePools(*m, 4, 4);
    std::vector<VerifierWork> work(3);
    for (int s = 0; s < 3; ++s) {
      work[s].kind = VerifierWork::Kind::kPrefillChunk;
      work[s].slot = s;
      const int len = s == 2 ? 23 : 5 + 7 * s;  // 5 and 12 rows: row kernel; 23: sgemm
      for (int t = 0; t < len; ++t) work[s].tokens.push_back(1 + (t * 31 + s) % 2000);
      work[s].want_logits = true;
    }
    std::vector<at::Tensor> out;
    for (auto& r : RunVerifierBatch(*m, *pools.batch, work)) out.push_back(r.ok() ? *r : at::Tensor());
    for (int s = 0; s < 3; ++s) {
      work[s].kind = VerifierWork::Kind::kStep;
      work[s].tokens = {7 + s};
    }
    for (auto& r : RunVerifierBatch(*m, *pools.batch, work)) out.push_back(r.ok() ? *r : at::Tensor());
    SetFusedThreads(1);
    at::set_num_threads(before);
    return out;
  };
  std::vector<at::Tensor> one = run(1), two = run(2);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    ASSERT_TRUE(one[i].defined() && two[i].defined()) << i;
    if (i % 3 != 2) {
      EXPECT_TRUE(at::equal(one[i], two[i])) << i;
    } else {  // slot 2's prefill went through sgemm
      ExpectLogitsNear(one[i], two[i], "sgemm chunk");
    }
  }
}

// A bad item fails on its own with its Verifier method's code; the others run.
TEST(BatchTest, BadItemsFailAlone) {
  auto r = LlamaModel::RandomInit(RandomGqaConfig(), 6, ModelOptions{}, 0.3);
  ASSERT_THAT(r, IsOk());
  const LlamaModel& m = **r;
  c10::InferenceMode guard;
  Pools pools = MakePools(m, 3, 4);
  KvCache& cache = *pools.batch;
  std::vector<VerifierWork> work(6);
  work[0].kind = VerifierWork::Kind::kPrefillChunk;  // good
  work[0].slot = 0;
  work[0].tokens = {1, 2, 3};
  work[0].want_logits = true;
  work[1].kind = VerifierWork::Kind::kStep;  // id outside [0, V)
  work[1].slot = 1;
  work[1].tokens = {61};
  work[2].kind = VerifierWork::Kind::kVerify;  // exit layer outside [1, L]
  work[2].slot = 2;
  work[2].tokens = {1};
  work[2].exit_layer = 9;
  work[3] = work[0];  // slot 0 twice
  work[4].kind = VerifierWork::Kind::kPrefillChunk;  // not at the committed length
  work[4].slot = 1;
  work[4].tokens = {4};
  work[4].start_pos = 5;
  work[5].kind = VerifierWork::Kind::kVerify;  // K == 0 without the ready row
  work[5].slot = 2;
  work[5].exit_layer = 2;
  std::vector<StatusOr<at::Tensor>> got = RunVerifierBatch(m, cache, work);
  ASSERT_THAT(got[0], IsOk());
  EXPECT_EQ(got[0]->sizes(), at::IntArrayRef({61}));
  EXPECT_THAT(got[1], StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(got[2], StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(got[3], StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(got[4], StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(got[5], StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(cache.length(0), 3);
  EXPECT_EQ(cache.length(1), 0);
}

// ---------------------------------------------------------------------------
// Batched drafting (RunDrafterBatch): sessions probe and draft in one pass
// per block, each leaving the batch at its own exit layer.

// One session's drafting in a round: phase-1 probes of the pending token at
// ascending layers (the last is its exit layer l*), then n_drafts draft
// steps at l* (scratch rows 1..n_drafts).
struct DraftPlan {
  int64_t slot = 0;
  std::vector<int32_t> prompt;
  std::vector<int64_t> probes;
  int64_t n_drafts = 0;
  // Per step of the plan (probes, then drafts): its exit logits.
  std::vector<at::Tensor> logits_solo, logits_batch;
  std::vector<int32_t> drafts_solo, drafts_batch;
};

std::vector<DraftPlan> MakeDraftPlans(std::mt19937& rng, int64_t n, int64_t L, int64_t V, int64_t max_rows) {
  std::vector<DraftPlan> plans(n);
  for (int64_t i = 0; i < n; ++i) {
    DraftPlan& p = plans[i];
    p.slot = i;
    const int64_t P = 3 + rng() % 40;
    for (int64_t t = 0; t < P; ++t) p.prompt.push_back(static_cast<int32_t>(rng() % V));
    const int64_t exit_layer = 1 + rng() % L;
    std::set<int64_t> layers = {exit_layer};
    for (int k = rng() % 3; k > 0; --k) layers.insert(1 + rng() % exit_layer);
    p.probes.assign(layers.begin(), layers.end());
    p.n_drafts = rng() % max_rows;  // rows 1..n_drafts, row 0 is the pending token
  }
  return plans;
}

int32_t ArgmaxId(const at::Tensor& logits) { return static_cast<int32_t>(logits.argmax().item<int64_t>()); }

// Every plan drafted alone (Drafter) and all of them in lock-step batches
// (RunDrafterBatch: at each step the sessions are at different phases,
// block ranges and rows, and the batch shrinks as plans end) on two pools
// with the same prompts: the same exit logits (within `tolerance`, 0 =
// bitwise), the same greedy drafts, and the K/V and scratch rows the
// verifier reads give the same verification logits.
void RunDraftProperty(const LlamaModel& m, uint32_t seed, int64_t n_sessions, float tolerance) {
  c10::InferenceMode guard;
  std::mt19937 rng(seed);
  const int64_t L = m.n_layers(), V = m.config().vocab_size, max_rows = 8;
  Pools pools = MakePools(m, n_sessions, max_rows);
  std::vector<DraftPlan> plans = MakeDraftPlans(rng, n_sessions, L, V, max_rows);
  std::vector<int32_t> pending(n_sessions);
  for (DraftPlan& p : plans) {
    auto a = Verifier(m, *pools.solo).Prefill(p.slot, p.prompt);
    auto b = Verifier(m, *pools.batch).Prefill(p.slot, p.prompt);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    pending[p.slot] = ArgmaxId(*a);
  }
  // Alone.
  for (DraftPlan& p : plans) {
    Drafter drafter(m, *pools.solo);
    at::Tensor h = m.Embed(at::tensor({static_cast<int64_t>(pending[p.slot])}, at::kLong).view({1, 1}));
    int64_t done = 0;
    for (int64_t layer : p.probes) {
      auto r = drafter.ProbeLayers(p.slot, h, done, layer);
      ASSERT_THAT(r, IsOk());
      h = r->hidden;
      done = layer;
      p.logits_solo.push_back(r->exit_logits);
    }
    int32_t token = ArgmaxId(p.logits_solo.back());
    for (int64_t row = 1; row <= p.n_drafts; ++row) {
      p.drafts_solo.push_back(token);
      auto l = drafter.DraftStep(p.slot, row, token, p.probes.back());
      ASSERT_THAT(l, IsOk());
      p.logits_solo.push_back(*l);
      token = ArgmaxId(*l);
    }
  }
  // Together.
  std::vector<at::Tensor> h(n_sessions);
  std::vector<int64_t> done(n_sessions, 0);
  std::vector<int32_t> token(n_sessions, 0);
  size_t max_batch = 0;
  for (size_t step = 0;; ++step) {
    std::vector<DraftWork> work;
    std::vector<DraftPlan*> who;
    for (DraftPlan& p : plans) {
      if (step >= p.probes.size() + p.n_drafts) continue;
      DraftWork w;
      w.slot = p.slot;
      if (step < p.probes.size()) {
        if (step == 0) h[p.slot] = m.Embed(at::tensor({static_cast<int64_t>(pending[p.slot])}, at::kLong).view({1, 1}));
        w.hidden = h[p.slot];
        w.first = done[p.slot];
        w.last = p.probes[step];
      } else {
        w.row = static_cast<int64_t>(step - p.probes.size()) + 1;
        w.token = token[p.slot];
        w.last = p.probes.back();
        p.drafts_batch.push_back(token[p.slot]);
      }
      work.push_back(w);
      who.push_back(&p);
    }
    if (work.empty()) break;
    max_batch = std::max(max_batch, work.size());
    std::vector<StatusOr<DraftStepResult>> got = RunDrafterBatch(m, *pools.batch, work);
    for (size_t k = 0; k < work.size(); ++k) {
      ASSERT_THAT(got[k], IsOk());
      DraftPlan& p = *who[k];
      EXPECT_EQ(got[k]->hidden.sizes(), at::IntArrayRef({1, 1, m.config().dim}));
      h[p.slot] = got[k]->hidden;
      done[p.slot] = work[k].last;
      token[p.slot] = ArgmaxId(got[k]->exit_logits);
      p.logits_batch.push_back(got[k]->exit_logits);
    }
  }
  EXPECT_EQ(max_batch, static_cast<size_t>(n_sessions));
  for (DraftPlan& p : plans) {
    ASSERT_EQ(p.logits_batch.size(), p.logits_solo.size()) << "slot " << p.slot;
    for (size_t j = 0; j < p.logits_solo.size(); ++j) {
      const float diff = (p.logits_solo[j] - p.logits_batch[j]).abs().max().item<float>();
      EXPECT_LE(diff, tolerance) << "slot " << p.slot << " step " << j;
    }
    EXPECT_EQ(p.drafts_batch, p.drafts_solo) << "slot " << p.slot;
    // The verifier reads what the drafting left: the drafts' K/V below l* and
    // scratch rows 0..K at l* (the last one ready).
    auto a = Verifier(m, *pools.solo).Verify(p.slot, p.probes.back(), p.drafts_solo, true);
    auto b = Verifier(m, *pools.batch).Verify(p.slot, p.probes.back(), p.drafts_batch, true);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    EXPECT_LE((*a - *b).abs().max().item<float>(), tolerance) << "slot " << p.slot;
  }
}

TEST(DraftBatchTest, BatchedDraftingIsBitwiseSoloOnLedeTiny) {
  std::unique_ptr<LlamaModel> m = testing::LoadOrDie(kLedeTinyDir);
  ASSERT_NE(m, nullptr);
  for (uint32_t seed : {1u, 2u}) RunDraftProperty(*m, seed, 6, 0.0f);
}

TEST(DraftBatchTest, BatchedDraftingIsBitwiseSoloOnRandomGqa) {
  auto m = LlamaModel::RandomInit(RandomGqaConfig(), 7, ModelOptions{}, 0.3);
  ASSERT_THAT(m, IsOk());
  for (uint32_t seed : {3u, 4u, 5u}) RunDraftProperty(**m, seed, 5, 0.0f);
}

TEST(DraftBatchTest, BatchedDraftingMatchesSoloOnEagerKernels) {
  ModelOptions eager;
  eager.kernels = Kernels::kEager;
  auto m = LlamaModel::RandomInit(RandomGqaConfig(), 8, eager, 0.3);
  ASSERT_THAT(m, IsOk());
  RunDraftProperty(**m, 6, 4, kLogitTolerance);
}

// A Drafter whose steps go through a runner (the drafter service's batch
// scheduler, here RunDrafterBatch of one step) drafts what the plain one
// drafts, phase-1 probes included.
TEST(DraftBatchTest, DrafterWithARunnerDraftsWhatItDraftsAlone) {
  auto r = LlamaModel::RandomInit(RandomGqaConfig(), 9, ModelOptions{}, 0.3);
  ASSERT_THAT(r, IsOk());
  const LlamaModel& m = **r;
  c10::InferenceMode guard;
  Pools pools = MakePools(m, 1, 8);
  int calls = 0;
  Drafter plain(m, *pools.solo);
  Drafter routed(m, *pools.batch, [&](const DraftWork& w) -> StatusOr<DraftStepResult> {
    ++calls;
    return std::move(RunDrafterBatch(m, *pools.batch, {w})[0]);
  });
  const std::vector<int32_t> prompt = {5, 9, 2, 33, 17};
  ASSERT_THAT(Verifier(m, *pools.solo).Prefill(0, prompt), IsOk());
  ASSERT_THAT(Verifier(m, *pools.batch).Prefill(0, prompt), IsOk());
  at::Tensor h = m.Embed(at::tensor({int64_t{7}}, at::kLong).view({1, 1}));
  auto a1 = plain.ProbeLayers(0, h, 0, 2);
  auto b1 = routed.ProbeLayers(0, h, 0, 2);
  ASSERT_THAT(a1, IsOk());
  ASSERT_THAT(b1, IsOk());
  auto a2 = plain.ProbeLayers(0, a1->hidden, 2, 4);
  auto b2 = routed.ProbeLayers(0, b1->hidden, 2, 4);
  ASSERT_THAT(a2, IsOk());
  ASSERT_THAT(b2, IsOk());
  EXPECT_TRUE(at::equal(a2->exit_logits, b2->exit_logits));
  auto a3 = plain.DraftStep(0, 1, ArgmaxId(a2->exit_logits), 4);
  auto b3 = routed.DraftStep(0, 1, ArgmaxId(b2->exit_logits), 4);
  ASSERT_THAT(a3, IsOk());
  ASSERT_THAT(b3, IsOk());
  EXPECT_TRUE(at::equal(*a3, *b3));
  EXPECT_EQ(calls, 3);
  // The checks run before the runner: a bad step never reaches it.
  EXPECT_THAT(routed.DraftStep(0, 8, 1, 4), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(routed.ProbeLayers(0, h, 3, 3), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(calls, 3);
}

TEST(DraftBatchTest, BadDraftStepsFailAlone) {
  auto r = LlamaModel::RandomInit(RandomGqaConfig(), 10, ModelOptions{}, 0.3);
  ASSERT_THAT(r, IsOk());
  const LlamaModel& m = **r;
  c10::InferenceMode guard;
  Pools pools = MakePools(m, 4, 4);
  KvCache& cache = *pools.batch;
  ASSERT_THAT(Verifier(m, cache).Prefill(0, {1, 2, 3}), IsOk());
  std::vector<DraftWork> work(7);
  work[0].slot = 0;  // good: a draft token through [0, 2)
  work[0].token = 4;
  work[0].last = 2;
  work[1].slot = 1;  // token outside [0, V)
  work[1].token = 61;
  work[1].last = 2;
  work[2].slot = 2;  // blocks past L
  work[2].last = 6;
  work[3].slot = 3;  // first == last
  work[3].first = 2;
  work[3].last = 2;
  work[4] = work[0];  // slot 0 twice
  work[5].slot = 3;  // row outside [0, max_draft_len)
  work[5].row = 4;
  work[5].last = 1;
  work[6].slot = 2;  // a hidden state of the wrong width
  work[6].hidden = at::zeros({1, 1, 7});
  work[6].first = 1;
  work[6].last = 3;
  std::vector<StatusOr<DraftStepResult>> got = RunDrafterBatch(m, cache, work);
  ASSERT_THAT(got[0], IsOk());
  EXPECT_EQ(got[0]->exit_logits.sizes(), at::IntArrayRef({61}));
  for (int i = 1; i < 7; ++i) EXPECT_THAT(got[i], StatusIs(StatusCode::kInvalidArgument)) << "step " << i;
  EXPECT_EQ(cache.length(0), 3);  // drafting commits nothing
}

// A step that passes its checks but fails inside the shared pass (here a
// hidden state of the right width in float64, which the float32 kernels
// refuse) fails alone: the others' drafts come back, equal to their solo
// steps. (Before, one such step failed every session in its batch with
// kInternal: a session cancelled at the verifier mid-step failed the other
// greedy requests of its draft batch, E2eCancelStormTest.)
TEST(DraftBatchTest, AStepThatFailsInThePassFailsAlone) {
  auto r = LlamaModel::RandomInit(RandomGqaConfig(), 10, ModelOptions{}, 0.3);
  ASSERT_THAT(r, IsOk());
  const LlamaModel& m = **r;
  c10::InferenceMode guard;
  Pools pools = MakePools(m, 4, 4);
  for (KvCache* c : {&*pools.solo, &*pools.batch}) {
    for (int64_t s = 0; s < 3; ++s) ASSERT_THAT(Verifier(m, *c).Prefill(s, {1, 2, 3 + static_cast<int32_t>(s)}), IsOk());
  }
  std::vector<DraftWork> work(3);
  for (int64_t s = 0; s < 3; ++s) {
    work[s].slot = s;
    work[s].token = 4 + static_cast<int32_t>(s);
    work[s].last = 2;
  }
  work[1].hidden = at::zeros({1, 1, m.config().dim}, at::kDouble);
  work[1].first = 1;
  work[1].last = 3;
  std::vector<StatusOr<DraftStepResult>> got = RunDrafterBatch(m, *pools.batch, work);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_THAT(got[1], StatusIs(StatusCode::kInternal));
  for (int64_t s : {0, 2}) {
    ASSERT_THAT(got[s], IsOk()) << "step " << s;
    auto solo = RunDraftStep(m, *pools.solo, work[s]);
    ASSERT_THAT(solo, IsOk());
    EXPECT_TRUE(at::equal(got[s]->exit_logits, solo->exit_logits)) << "step " << s;
  }
}

}  // namespace
}  // namespace lede::model
